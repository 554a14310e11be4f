/*
 * embedding_service: see embedding_service.h.
 *
 * Every request is checked on the loop thread, on the decoded message,
 * before anything is allocated in proportion to it: packed keys must be a
 * multiple of 8 bytes, packed rows a multiple of 4, the key count within
 * embedding.max_lookup_keys / max_write_keys, a blob within
 * embedding.max_blob_mb, every written float finite, and the client's
 * layout fingerprint present (never 0) and equal to ours.  What is larger
 * than any request within these limits never reaches us: the server's gRPC
 * receive limit is set from them (embedding_limits_max_request), and gRPC
 * refuses a message from its length.  Key-level checks
 * (unknown table, row out of range, wrong shard, row length) are done by the
 * store, which writes nothing of a request it rejects.  Errors are gRPC
 * statuses whose message names the request field, index and key.
 *
 * The fence lives in two places: here, in memory, where the loop thread
 * decides on each write-back whether it waits (parked), and in the store
 * (data_dir/FENCE), durably, so that a server killed before its checkpoint
 * comes back with it.  A Fence parks from the moment it arrives, and is
 * answered once the store has it on disk; a Checkpoint of its id, Clear or
 * Restore lift it in the store (worker thread) and then here.  At start the
 * fence is read back from the store.  Every process also draws a random
 * incarnation, returned by Stats and Fence, so that a prober can tell a
 * restarted server from one that kept running.
 */
#include "embedding_service.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "embedding.pb-c.h"
#include "err.h"
#include "log.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");

enum { M_LOOKUP, M_WRITE_BACK, M_CHECKPOINT, M_LIST, M_RESTORE, M_PUTBLOB, M_GETBLOB, M_DIGEST, M_STATS, M_SEAL,
       M_GETMANIFEST, M_DELETE, M_CLEAR, M_FENCE, M_COUNT };
static const char *method_names[M_COUNT] = {"Lookup", "WriteBack", "Checkpoint", "ListCheckpoints", "Restore",
                                            "PutBlob", "GetBlob", "Digest", "Stats", "SealCheckpoint",
                                            "GetManifest", "DeleteCheckpoint", "Clear", "Fence"};

struct embedding_service_s {
  uv_loop_t *loop;
  store_t *store;
  table_layout_t layout;
  uint64_t layout_hash;
  embedding_limits_t lim;
  uint32_t shard, n_shards;
  metrics_registry_t *reg;
  metrics_counter_t *calls[M_COUNT], *errors[M_COUNT];
  metrics_hist_t *latency[M_COUNT];
  metrics_counter_t *rows_read, *rows_written, *hot_hits, *kv_reads, *lazy_inits;
  metrics_gauge_t *hot_rows, *hot_bytes, *hot_capacity, *stored_rows, *evictions;
  uint64_t rejected;
  uint64_t incarnation; /* random, drawn at create: Stats, Fence */
  /* the write epoch (RestoreRequest.epoch): write-backs of earlier epochs
   * are refused.  Checked and written under epoch_lock (read: a
   * write-back's check and store_write; write: a Restore's or Clear's
   * raise and its work), so that no write of a rolled-back run lands after
   * the roll-back; kept in data_dir/EPOCH across restarts. */
  pthread_rwlock_t epoch_lock;
  _Atomic uint64_t epoch;
  /* the fence (Fence): write-backs with done > fence_done wait in parked
   * until Checkpoint(fence_id) is taken (0: no fence) */
  uint64_t fence_done;
  char fence_id[128];
  struct work_s *parked, *parked_tail;
  uint64_t n_parked;
};

/* One unit of storage work: runs on a worker thread, answered on the loop. */
typedef struct work_s {
  struct work_s *next; /* parked behind the fence */
  uv_work_t req;
  embedding_service_t *svc;
  rpc_call_t *call;
  int method;
  const ProtobufCMessage *in;
  struct timespec t0;
  int rc;
  char why[512];
  /* results */
  void *buf;          /* rows / blob data / manifest */
  size_t buf_len;
  store_lookup_info_t info;
  uint64_t count;
  uint8_t sha[32], set_sha[32];
  store_stats_t stats;
  int has_rows, has_blobs;
  store_checkpoint_info_t cp;
  store_checkpoint_info_t *cps;
  size_t n_cps;
} work_t;

static void fence_lift(embedding_service_t *svc, const char *why);
static void fence_from_store(embedding_service_t *svc, const char *why);

static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Copies packed keys into aligned memory (protobuf-c gives no alignment). */
static uint64_t *keys_of(const ProtobufCBinaryData *b, size_t *n) {
  *n = b->len / 8;
  uint64_t *k = malloc(*n ? *n * 8 : 8);
  if (k && *n) memcpy(k, b->data, *n * 8);
  return k;
}

/* ---- the write epoch, in data_dir/EPOCH ("epoch=N\n") */

static int epoch_path(embedding_service_t *svc, char *out, size_t n) {
  return snprintf(out, n, "%s/EPOCH", store_dir(svc->store)) >= (int)n ? -ENAMETOOLONG : 0;
}

/* Raises the epoch to e (durably first) when e is later; under the write
 * lock.  0 or an error with why. */
static int epoch_raise(embedding_service_t *svc, uint64_t e, char *why, size_t why_len) {
  if (!e || e <= atomic_load(&svc->epoch)) return 0;
  char path[4200], tmp[4300];
  if (epoch_path(svc, path, sizeof path)) return err_set(why, why_len, -ENAMETOOLONG, "the data dir's path is too long");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "epoch=%" PRIu64 "\n", e) < 0 || fflush(f) || fsync(fileno(f))) {
    int er = errno ? errno : EIO;
    if (f) fclose(f);
    return err_set(why, why_len, -er, "cannot store the write epoch in %s: %s", tmp, strerror(er));
  }
  if (fclose(f) || rename(tmp, path))
    return err_set(why, why_len, -errno, "cannot store the write epoch in %s: %s", path, strerror(errno));
  log_info("write epoch raised from %" PRIu64 " to %" PRIu64 ": write-backs of earlier epochs are refused from now on",
           (uint64_t)atomic_load(&svc->epoch), e);
  atomic_store(&svc->epoch, e);
  return 0;
}

/* At start: the stored epoch (0 when none).  0, or ERR_BADMSG when the
 * file is damaged (the log says which and what to do). */
static int epoch_load(embedding_service_t *svc) {
  char path[4200];
  if (epoch_path(svc, path, sizeof path)) return -ENAMETOOLONG;
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  uint64_t e = 0;
  int ok = fscanf(f, "epoch=%" SCNu64, &e) == 1;
  fclose(f);
  if (!ok) {
    log_error("%s is damaged (expected one line \"epoch=N\"): the server cannot tell which job run may write; "
              "remove it only if no job is running on this server",
              path);
    return ERR_BADMSG;
  }
  atomic_store(&svc->epoch, e);
  if (e) log_info("write epoch %" PRIu64 " (from %s)", e, path);
  return 0;
}

static void work_cb(uv_work_t *req) {
  work_t *w = req->data;
  store_t *st = w->svc->store;
  switch (w->method) {
  case M_LOOKUP: {
    const Chanter__Embedding__V1__LookupRequest *r = (const void *)w->in;
    size_t n, bytes = 0;
    uint64_t *keys = keys_of(&r->keys, &n);
    if (!keys) { w->rc = -ENOMEM; break; }
    w->rc = store_rows_bytes(st, keys, n, &bytes, w->why, sizeof w->why);
    if (w->rc == 0) {
      w->buf = malloc(bytes ? bytes : 1);
      w->buf_len = bytes;
      w->rc = w->buf ? store_lookup(st, keys, n, w->buf, bytes, 0, &w->info, w->why, sizeof w->why) : -ENOMEM;
    }
    w->count = n;
    free(keys);
    break;
  }
  case M_WRITE_BACK: {
    const Chanter__Embedding__V1__WriteBackRequest *r = (const void *)w->in;
    size_t n;
    uint64_t *keys = keys_of(&r->keys, &n);
    float *rows = malloc(r->rows.len ? r->rows.len : 1);
    if (!keys || !rows) {
      w->rc = -ENOMEM;
    } else {
      if (r->rows.len) memcpy(rows, r->rows.data, r->rows.len);
      pthread_rwlock_rdlock(&w->svc->epoch_lock);
      uint64_t e = atomic_load(&w->svc->epoch);
      if (r->epoch && r->epoch < e)
        w->rc = err_set(w->why, sizeof w->why, ERR_PRECONDITION,
                        "a write-back of epoch %" PRIu64 ", but this server is at epoch %" PRIu64
                        ": its run of the job was rolled back (a trainer of an earlier generation)",
                        r->epoch, e);
      else
        w->rc = store_write(st, keys, n, rows, r->rows.len, 0, w->why, sizeof w->why);
      pthread_rwlock_unlock(&w->svc->epoch_lock);
    }
    w->count = n;
    free(keys);
    free(rows);
    break;
  }
  case M_CHECKPOINT: {
    const Chanter__Embedding__V1__CheckpointRequest *r = (const void *)w->in;
    w->rc = store_checkpoint(st, r->id, &w->cp, w->why, sizeof w->why);
    break;
  }
  case M_LIST:
    w->rc = store_list_checkpoints(st, &w->cps, &w->n_cps);
    break;
  case M_RESTORE: {
    const Chanter__Embedding__V1__RestoreRequest *r = (const void *)w->in;
    pthread_rwlock_wrlock(&w->svc->epoch_lock);
    w->rc = epoch_raise(w->svc, r->epoch, w->why, sizeof w->why);
    if (!w->rc) w->rc = store_restore(st, r->id, w->why, sizeof w->why);
    pthread_rwlock_unlock(&w->svc->epoch_lock);
    break;
  }
  case M_PUTBLOB: {
    const Chanter__Embedding__V1__PutBlobRequest *r = (const void *)w->in;
    w->rc = store_put_blob(st, r->name, r->data.data, r->data.len, w->why, sizeof w->why);
    break;
  }
  case M_GETBLOB: {
    const Chanter__Embedding__V1__GetBlobRequest *r = (const void *)w->in;
    w->rc = store_get_blob(st, r->name, &w->buf, &w->buf_len);
    if (w->rc == ERR_NOTFOUND) snprintf(w->why, sizeof w->why, "no blob named '%s' on this server", r->name);
    break;
  }
  case M_DIGEST:
    w->rc = store_digest(st, w->sha, w->set_sha, &w->count);
    break;
  case M_STATS:
    /* here, not on the loop: the seeks behind has_rows read RocksDB, and
     * both wait while a restore or a clear holds the store */
    store_stats(st, &w->stats);
    w->rc = store_has_rows(st, &w->has_rows, &w->has_blobs);
    if (w->rc) snprintf(w->why, sizeof w->why, "cannot tell whether rows are stored: %s", err_str(w->rc));
    break;
  case M_SEAL: {
    const Chanter__Embedding__V1__SealCheckpointRequest *r = (const void *)w->in;
    w->rc = store_seal_checkpoint(st, r->id, r->manifest.data, r->manifest.len, w->why, sizeof w->why);
    break;
  }
  case M_GETMANIFEST: {
    const Chanter__Embedding__V1__GetManifestRequest *r = (const void *)w->in;
    w->rc = store_get_manifest(st, r->id, &w->buf, &w->buf_len);
    if (w->rc == ERR_NOTFOUND)
      snprintf(w->why, sizeof w->why, "no sealed checkpoint '%s' on this server (it does not exist or has no manifest)",
               r->id);
    else if (w->rc == -EINVAL)
      snprintf(w->why, sizeof w->why, "checkpoint id '%.80s' is not valid: use 1 to 64 characters from A-Z a-z 0-9 . _ -",
               r->id);
    break;
  }
  case M_DELETE: {
    const Chanter__Embedding__V1__DeleteCheckpointRequest *r = (const void *)w->in;
    w->rc = store_delete_checkpoint(st, r->id, w->why, sizeof w->why);
    break;
  }
  case M_CLEAR: {
    const Chanter__Embedding__V1__ClearRequest *r = (const void *)w->in;
    pthread_rwlock_wrlock(&w->svc->epoch_lock);
    w->rc = epoch_raise(w->svc, r->epoch, w->why, sizeof w->why);
    if (!w->rc) w->rc = store_clear(st, r->keep_checkpoints, w->why, sizeof w->why);
    pthread_rwlock_unlock(&w->svc->epoch_lock);
    break;
  }
  case M_FENCE: {
    const Chanter__Embedding__V1__FenceRequest *r = (const void *)w->in;
    w->rc = store_fence_set(st, r->id, r->iteration, w->why, sizeof w->why);
    break;
  }
  }
}

/* Who this server is, for Stats (brief or not): no storage work. */
static void stats_identity(embedding_service_t *svc, Chanter__Embedding__V1__StatsResponse *r) {
  r->shard = svc->shard;
  r->shards = svc->n_shards;
  r->layout_hash = svc->layout_hash;
  r->data_dir = (char *)store_dir(svc->store);
  r->incarnation = svc->incarnation;
  r->fence_id = svc->fence_done ? svc->fence_id : "";
  r->fence_iteration = svc->fence_done ? svc->fence_done - 1 : 0;
  r->fence_held = svc->n_parked;
  r->epoch = atomic_load(&svc->epoch);
}

static void fill_cp(Chanter__Embedding__V1__CheckpointInfo *o, store_checkpoint_info_t *c) {
  chanter__embedding__v1__checkpoint_info__init(o);
  o->id = c->id;
  o->path = c->path;
  o->created_unix = c->created_unix;
  o->bytes = c->bytes;
  o->sealed = c->sealed != 0;
}

static void after_cb(uv_work_t *req, int status) {
  work_t *w = req->data;
  embedding_service_t *svc = w->svc;
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  /* a fence the store could not keep is no fence: back to the stored one */
  if (w->method == M_FENCE && w->rc) fence_from_store(svc, "the fence could not be stored");
  /* a key naming no table or no row is a bad argument, not a missing thing */
  if ((w->method == M_LOOKUP || w->method == M_WRITE_BACK) && (w->rc == -ENOENT || w->rc == -ERANGE)) w->rc = -EINVAL;
  if (w->rc) {
    metrics_counter_inc(svc->errors[w->method]);
    if (!w->why[0]) snprintf(w->why, sizeof w->why, "%s", err_str(w->rc));
    log_warn("rpc failed method=%s peer=%s err=\"%s\" why=\"%s\"", method_names[w->method], rpc_call_peer(w->call),
             err_str(w->rc), w->why);
    rpc_call_fail(w->call, w->rc, "%s: %s", method_names[w->method], w->why);
    goto out;
  }
  switch (w->method) {
  case M_LOOKUP: {
    Chanter__Embedding__V1__LookupResponse r = CHANTER__EMBEDDING__V1__LOOKUP_RESPONSE__INIT;
    r.rows.data = w->buf;
    r.rows.len = w->buf_len;
    r.hot_hits = w->info.hot_hits;
    r.lazy_inits = w->info.lazy_inits;
    metrics_counter_add(svc->rows_read, w->count);
    metrics_counter_add(svc->hot_hits, w->info.hot_hits);
    metrics_counter_add(svc->kv_reads, w->info.kv_reads);
    metrics_counter_add(svc->lazy_inits, w->info.lazy_inits);
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_WRITE_BACK: {
    Chanter__Embedding__V1__WriteBackResponse r = CHANTER__EMBEDDING__V1__WRITE_BACK_RESPONSE__INIT;
    r.rows_written = w->count;
    metrics_counter_add(svc->rows_written, w->count);
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_CHECKPOINT: {
    Chanter__Embedding__V1__CheckpointResponse r = CHANTER__EMBEDDING__V1__CHECKPOINT_RESPONSE__INIT;
    Chanter__Embedding__V1__CheckpointInfo ci;
    fill_cp(&ci, &w->cp);
    r.checkpoint = &ci;
    if (w->cp.retried)
      log_info("checkpoint already taken id=%s path=%s bytes=%llu: answered a retried call with it", w->cp.id,
               w->cp.path, (unsigned long long)w->cp.bytes);
    else
      log_info("checkpoint taken id=%s path=%s bytes=%llu", w->cp.id, w->cp.path, (unsigned long long)w->cp.bytes);
    rpc_call_reply(w->call, &r.base);
    if (svc->fence_done && !strcmp(svc->fence_id, w->cp.id)) fence_lift(svc, "its checkpoint was taken");
    break;
  }
  case M_LIST: {
    Chanter__Embedding__V1__ListCheckpointsResponse r = CHANTER__EMBEDDING__V1__LIST_CHECKPOINTS_RESPONSE__INIT;
    Chanter__Embedding__V1__CheckpointInfo *ci = calloc(w->n_cps ? w->n_cps : 1, sizeof *ci);
    Chanter__Embedding__V1__CheckpointInfo **cp = calloc(w->n_cps ? w->n_cps : 1, sizeof *cp);
    if (!ci || !cp) {
      rpc_call_fail(w->call, -ENOMEM, "ListCheckpoints: out of memory");
    } else {
      for (size_t i = 0; i < w->n_cps; i++) {
        fill_cp(&ci[i], &w->cps[i]);
        cp[i] = &ci[i];
      }
      r.n_checkpoints = w->n_cps;
      r.checkpoints = cp;
      rpc_call_reply(w->call, &r.base);
    }
    free(ci);
    free(cp);
    break;
  }
  case M_RESTORE: {
    Chanter__Embedding__V1__RestoreResponse r = CHANTER__EMBEDDING__V1__RESTORE_RESPONSE__INIT;
    log_info("restored checkpoint id=%s", ((const Chanter__Embedding__V1__RestoreRequest *)w->in)->id);
    rpc_call_reply(w->call, &r.base);
    fence_lift(svc, "the server was restored");
    break;
  }
  case M_PUTBLOB: {
    Chanter__Embedding__V1__PutBlobResponse r = CHANTER__EMBEDDING__V1__PUT_BLOB_RESPONSE__INIT;
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_GETBLOB: {
    Chanter__Embedding__V1__GetBlobResponse r = CHANTER__EMBEDDING__V1__GET_BLOB_RESPONSE__INIT;
    r.data.data = w->buf;
    r.data.len = w->buf_len;
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_DIGEST: {
    Chanter__Embedding__V1__DigestResponse r = CHANTER__EMBEDDING__V1__DIGEST_RESPONSE__INIT;
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", w->sha[i]);
    r.sha256.data = w->sha;
    r.sha256.len = 32;
    r.set_sha256.data = w->set_sha;
    r.set_sha256.len = 32;
    r.hex = hex;
    r.rows = w->count;
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_STATS: {
    const store_stats_t *s = &w->stats;
    Chanter__Embedding__V1__StatsResponse r = CHANTER__EMBEDDING__V1__STATS_RESPONSE__INIT;
    stats_identity(svc, &r);
    r.hot_rows = s->hot_rows;
    r.hot_bytes = s->hot_bytes;
    r.hot_capacity_bytes = s->hot_capacity_bytes;
    r.lookup_calls = s->lookup_calls;
    r.lookup_rows = s->lookup_rows;
    r.hot_hits = s->hot_hits;
    r.kv_reads = s->kv_reads;
    r.lazy_inits = s->lazy_inits;
    r.write_back_calls = s->write_calls;
    r.write_back_rows = s->write_rows;
    r.rejected_calls = svc->rejected;
    r.stored_rows_estimate = s->stored_rows_estimate;
    r.hot_evictions = s->hot_evictions;
    r.has_rows = w->has_rows != 0;
    r.has_blobs = w->has_blobs != 0;
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_SEAL: {
    const Chanter__Embedding__V1__SealCheckpointRequest *in = (const void *)w->in;
    Chanter__Embedding__V1__SealCheckpointResponse r = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_RESPONSE__INIT;
    log_info("sealed checkpoint id=%s manifest_bytes=%zu", in->id, in->manifest.len);
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_GETMANIFEST: {
    Chanter__Embedding__V1__GetManifestResponse r = CHANTER__EMBEDDING__V1__GET_MANIFEST_RESPONSE__INIT;
    r.manifest.data = w->buf;
    r.manifest.len = w->buf_len;
    log_info("sent manifest id=%s bytes=%zu peer=%s", ((const Chanter__Embedding__V1__GetManifestRequest *)w->in)->id,
             w->buf_len, rpc_call_peer(w->call));
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_DELETE: {
    Chanter__Embedding__V1__DeleteCheckpointResponse r = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_RESPONSE__INIT;
    log_info("deleted checkpoint id=%s", ((const Chanter__Embedding__V1__DeleteCheckpointRequest *)w->in)->id);
    rpc_call_reply(w->call, &r.base);
    break;
  }
  case M_CLEAR: {
    Chanter__Embedding__V1__ClearResponse r = CHANTER__EMBEDDING__V1__CLEAR_RESPONSE__INIT;
    if (((const Chanter__Embedding__V1__ClearRequest *)w->in)->keep_checkpoints)
      log_info("cleared every row and blob, kept the checkpoints peer=%s", rpc_call_peer(w->call));
    else
      log_info("cleared every row, blob and checkpoint peer=%s", rpc_call_peer(w->call));
    rpc_call_reply(w->call, &r.base);
    fence_lift(svc, "the server was cleared");
    break;
  }
  case M_FENCE: {
    const Chanter__Embedding__V1__FenceRequest *in = (const void *)w->in;
    Chanter__Embedding__V1__FenceResponse r = CHANTER__EMBEDDING__V1__FENCE_RESPONSE__INIT;
    log_info("fence set id=%s iteration=%llu: later write-backs wait for this checkpoint (stored in %s/FENCE)",
             in->id, (unsigned long long)in->iteration, store_dir(svc->store));
    r.held = svc->n_parked;
    r.incarnation = svc->incarnation;
    rpc_call_reply(w->call, &r.base);
    break;
  }
  }
out:
  metrics_hist_observe(svc->latency[w->method], since(&w->t0));
  free(w->buf);
  free(w->cps);
  free(w);
}

static int method_index(rpc_call_t *call) {
  const char *m = rpc_call_method(call);
  const char *slash = m ? strrchr(m, '/') : NULL;
  const char *name = slash ? slash + 1 : m;
  for (int i = 0; i < M_COUNT; i++)
    if (name && !strcmp(name, method_names[i])) return i;
  return -1;
}

/* Shape checks that need no storage; 0 or an error already sent. */
static int reject(embedding_service_t *svc, rpc_call_t *call, int m, int err, const char *fmt, const char *field,
                  size_t len, unsigned mult) {
  svc->rejected++;
  metrics_counter_inc(svc->errors[m]);
  log_warn("rpc rejected method=%s peer=%s field=%s bytes=%zu", method_names[m], rpc_call_peer(call), field, len);
  rpc_call_fail(call, err, fmt, method_names[m], field, len, mult);
  return -1;
}

static int check_layout(embedding_service_t *svc, rpc_call_t *call, int m, uint64_t client_hash) {
  if (client_hash == svc->layout_hash) return 0;
  svc->rejected++;
  if (client_hash == 0) {
    metrics_counter_inc(svc->errors[m]);
    log_warn("rpc rejected method=%s peer=%s reason=layout_hash_0", method_names[m], rpc_call_peer(call));
    rpc_call_fail(call, -EINVAL,
                  "%s: layout_hash 0: every client sends its table layout's fingerprint (this server's is %016llx)",
                  method_names[m], (unsigned long long)svc->layout_hash);
    return -1;
  }
  metrics_counter_inc(svc->errors[m]);
  log_warn("rpc rejected method=%s peer=%s reason=layout client_hash=%016llx server_hash=%016llx", method_names[m],
           rpc_call_peer(call), (unsigned long long)client_hash, (unsigned long long)svc->layout_hash);
  rpc_call_fail(call, ERR_LAYOUT,
                "%s: the client's table layout (hash %016llx) differs from this server's (%016llx): "
                "check that both read the same job configuration (table_rows, embedding_dim, "
                "embedding_optimizer, seed)",
                method_names[m], (unsigned long long)client_hash, (unsigned long long)svc->layout_hash);
  return -1;
}

static const char *SHAPE_MSG = "%s: %s has %zu bytes, not a multiple of %u";

/* A count past its limit; 0 when within it, else -1 with the error sent. */
static int check_limit(embedding_service_t *svc, rpc_call_t *call, int m, const char *what, uint64_t n,
                       uint64_t limit, const char *key) {
  if (n <= limit) return 0;
  svc->rejected++;
  metrics_counter_inc(svc->errors[m]);
  log_warn("rpc rejected method=%s peer=%s reason=limit %s=%" PRIu64 " %s=%" PRIu64, method_names[m],
           rpc_call_peer(call), what, n, key, limit);
  rpc_call_fail(call, -E2BIG, "%s: %" PRIu64 " %s, more than %s = %" PRIu64 " allows: %s", method_names[m], n, what,
                key, limit, m == M_PUTBLOB ? "raise it in the job file" : "split the call");
  return -1;
}

/* Every float of a WriteBack's rows is finite; 0, or -1 with the error
 * naming the first bad key and position sent.  Reads the message in place
 * (no copy); stops at a key the store will refuse anyway. */
static int check_finite(embedding_service_t *svc, rpc_call_t *call, const Chanter__Embedding__V1__WriteBackRequest *r) {
  size_t n = r->keys.len / 8, nf = r->rows.len / 4, o = 0;
  for (size_t i = 0; i < n && o < nf; i++) {
    uint64_t k;
    memcpy(&k, r->keys.data + 8 * i, 8);
    if (TABLE_ID(k) >= svc->layout.n_tables) return 0;
    uint32_t f = table_row_floats(&svc->layout, TABLE_ID(k));
    for (uint32_t j = 0; j < f && o + j < nf; j++) {
      float v;
      memcpy(&v, r->rows.data + 4 * (o + j), 4);
      if (isfinite(v)) continue;
      svc->rejected++;
      metrics_counter_inc(svc->errors[M_WRITE_BACK]);
      log_warn("rpc rejected method=WriteBack peer=%s reason=not_finite key_index=%zu key=%u:%llu float=%u",
               rpc_call_peer(call), i, (unsigned)TABLE_ID(k), (unsigned long long)TABLE_ROW(k), j);
      rpc_call_fail(call, -EINVAL,
                    "WriteBack: rows hold %s at key index %zu (key %u:%llu), float %u of its row (%s): nothing was "
                    "written",
                    isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", i, (unsigned)TABLE_ID(k),
                    (unsigned long long)TABLE_ROW(k), j, j < svc->layout.tables[TABLE_ID(k)].dim ? "vector" : "optimizer state");
      return -1;
    }
    o += f;
  }
  return 0;
}

static void queue_work(work_t *w);

/* The fence is lifted (its checkpoint was taken, or Clear / Restore): the
 * write-backs it held go to the worker pool, in arrival order. */
static void fence_lift(embedding_service_t *svc, const char *why) {
  if (!svc->fence_done && !svc->parked) return;
  log_info("fence lifted id=%s released=%llu (%s)", svc->fence_id, (unsigned long long)svc->n_parked, why);
  svc->fence_done = 0;
  svc->fence_id[0] = 0;
  work_t *w = svc->parked;
  svc->parked = svc->parked_tail = NULL;
  svc->n_parked = 0;
  while (w) {
    work_t *n = w->next;
    w->next = NULL;
    queue_work(w);
    w = n;
  }
}

/* The fence as the store keeps it (at start, or after a Fence the store
 * could not keep); write-backs it no longer holds are released. */
static void fence_from_store(embedding_service_t *svc, const char *why) {
  store_fence_t f;
  store_fence_get(svc->store, &f);
  if (!f.set) {
    fence_lift(svc, why);
    return;
  }
  svc->fence_done = f.iteration + 1;
  snprintf(svc->fence_id, sizeof svc->fence_id, "%s", f.id);
}

static void handle(rpc_call_t *call, const ProtobufCMessage *req, void *ud) {
  embedding_service_t *svc = ud;
  int m = method_index(call);
  ASSERT(m >= 0);
  metrics_counter_inc(svc->calls[m]);
  if (m == M_LOOKUP) {
    const Chanter__Embedding__V1__LookupRequest *r = (const void *)req;
    if (r->keys.len % 8) {
      reject(svc, call, m, -EINVAL, SHAPE_MSG, "keys (packed uint64)", r->keys.len, 8);
      return;
    }
    if (check_layout(svc, call, m, r->layout_hash)) return;
    if (check_limit(svc, call, m, "keys", r->keys.len / 8, svc->lim.lookup_keys, "embedding.max_lookup_keys")) return;
  } else if (m == M_WRITE_BACK) {
    const Chanter__Embedding__V1__WriteBackRequest *r = (const void *)req;
    if (r->keys.len % 8) {
      reject(svc, call, m, -EINVAL, SHAPE_MSG, "keys (packed uint64)", r->keys.len, 8);
      return;
    }
    if (r->rows.len % 4) {
      reject(svc, call, m, -EINVAL, SHAPE_MSG, "rows (packed float32)", r->rows.len, 4);
      return;
    }
    if (check_layout(svc, call, m, r->layout_hash)) return;
    if (check_limit(svc, call, m, "keys", r->keys.len / 8, svc->lim.write_keys, "embedding.max_write_keys")) return;
    if (check_finite(svc, call, r)) return;
    uint64_t e = atomic_load(&svc->epoch);
    if (r->epoch && r->epoch < e) { /* (and again under the lock when it runs) */
      svc->rejected++;
      metrics_counter_inc(svc->errors[m]);
      log_warn("rpc rejected method=WriteBack peer=%s reason=epoch epoch=%" PRIu64 " server_epoch=%" PRIu64,
               rpc_call_peer(call), r->epoch, e);
      rpc_call_fail(call, ERR_PRECONDITION,
                    "WriteBack: epoch %" PRIu64 ", but this server is at epoch %" PRIu64
                    ": its run of the job was rolled back (a trainer of an earlier generation)",
                    r->epoch, e);
      return;
    }
  } else if (m == M_PUTBLOB) {
    const Chanter__Embedding__V1__PutBlobRequest *r = (const void *)req;
    if (check_limit(svc, call, m, "MiB of blob (rounded up)", (r->data.len + (1u << 20) - 1) >> 20,
                    svc->lim.blob_bytes >> 20, "embedding.max_blob_mb"))
      return;
  }
  work_t *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_fail(call, -ENOMEM, "%s: out of memory", method_names[m]);
    return;
  }
  w->svc = svc;
  w->call = call;
  w->method = m;
  w->in = req;
  w->req.data = w;
  clock_gettime(CLOCK_MONOTONIC, &w->t0);
  if (m == M_STATS && ((const Chanter__Embedding__V1__StatsRequest *)req)->brief) { /* a probe: now */
    Chanter__Embedding__V1__StatsResponse r = CHANTER__EMBEDDING__V1__STATS_RESPONSE__INIT;
    stats_identity(svc, &r);
    rpc_call_reply(call, &r.base);
    metrics_hist_observe(svc->latency[m], since(&w->t0));
    free(w);
    return;
  }
  if (m == M_FENCE) {
    const Chanter__Embedding__V1__FenceRequest *r = (const void *)req;
    if (!r->id || !*r->id) {
      rpc_call_fail(call, -EINVAL, "Fence: no checkpoint id");
      free(w);
      return;
    }
    /* later write-backs wait from now on; answered once the store has it on disk */
    svc->fence_done = r->iteration + 1;
    snprintf(svc->fence_id, sizeof svc->fence_id, "%s", r->id);
  }
  if (m == M_WRITE_BACK && svc->fence_done && ((const Chanter__Embedding__V1__WriteBackRequest *)req)->done > svc->fence_done) {
    /* a write of a later iteration than the checkpoint being taken: held, without a worker thread */
    if (svc->parked_tail) svc->parked_tail->next = w;
    else svc->parked = w;
    svc->parked_tail = w;
    svc->n_parked++;
    return;
  }
  queue_work(w);
}

static void queue_work(work_t *w) {
  int rc = uv_queue_work(w->svc->loop, &w->req, work_cb, after_cb);
  if (rc) {
    rpc_call_fail(w->call, ERR_SHUTDOWN, "%s: cannot queue work: %s", method_names[w->method], uv_strerror(rc));
    free(w);
  }
}

static void collect(void *ud) {
  embedding_service_t *svc = ud;
  store_stats_t s;
  store_stats(svc->store, &s);
  metrics_gauge_set(svc->hot_rows, (double)s.hot_rows);
  metrics_gauge_set(svc->hot_bytes, (double)s.hot_bytes);
  metrics_gauge_set(svc->hot_capacity, (double)s.hot_capacity_bytes);
  metrics_gauge_set(svc->stored_rows, (double)s.stored_rows_estimate);
  metrics_gauge_set(svc->evictions, (double)s.hot_evictions);
}

void embedding_limits_from_cfg(const cfg_t *cfg, embedding_limits_t *out) {
  out->lookup_keys = (uint64_t)cfg_int(cfg, "embedding.max_lookup_keys");
  out->write_keys = (uint64_t)cfg_int(cfg, "embedding.max_write_keys");
  out->blob_bytes = (uint64_t)cfg_int(cfg, "embedding.max_blob_mb") << 20;
}

size_t embedding_limits_max_request(const embedding_limits_t *lim, const table_layout_t *layout) {
  uint64_t lookup = lim->lookup_keys * 8;
  uint64_t write = lim->write_keys * (8 + (uint64_t)table_max_row_floats(layout) * 4);
  uint64_t m = lookup > write ? lookup : write;
  if (lim->blob_bytes > m) m = lim->blob_bytes;
  m += 1u << 20; /* names, ids, a manifest, protobuf framing */
  return m > SIZE_MAX ? SIZE_MAX : (size_t)m;
}

int embedding_service_create(uv_loop_t *loop, rpc_server_t *server, store_t *store, const table_layout_t *layout,
                             const embedding_limits_t *limits, uint32_t shard, uint32_t n_shards,
                             metrics_registry_t *reg, embedding_service_t **out) {
  embedding_service_t *svc = calloc(1, sizeof *svc);
  if (!svc) return -ENOMEM;
  int rc = table_layout_copy(&svc->layout, layout);
  if (rc) {
    free(svc);
    return rc;
  }
  svc->loop = loop;
  svc->store = store;
  svc->layout_hash = table_layout_hash(layout);
  svc->lim = *limits;
  svc->shard = shard;
  svc->n_shards = n_shards;
  svc->reg = reg;
  do { /* never 0: a prober reads 0 as "a server without incarnations" */
    if (getrandom(&svc->incarnation, sizeof svc->incarnation, 0) != (ssize_t)sizeof svc->incarnation) {
      struct timespec t;
      clock_gettime(CLOCK_REALTIME, &t);
      svc->incarnation = table_mix64((uint64_t)t.tv_sec * 1000000007u ^ (uint64_t)t.tv_nsec ^ (uint64_t)getpid() << 32);
    }
  } while (svc->incarnation == 0);
  fence_from_store(svc, "no fence was stored"); /* the store logged it at open */
  pthread_rwlock_init(&svc->epoch_lock, NULL);
  if ((rc = epoch_load(svc)) != 0) {
    pthread_rwlock_destroy(&svc->epoch_lock);
    table_layout_close(&svc->layout);
    free(svc);
    return rc;
  }
  if (reg) {
    for (int i = 0; i < M_COUNT; i++) {
      char labels[64];
      snprintf(labels, sizeof labels, "method=\"%s\"", method_names[i]);
      svc->calls[i] = metrics_counter(reg, "rpc_calls_total", labels, "RPC calls received, by method");
      svc->errors[i] = metrics_counter(reg, "rpc_errors_total", labels, "RPC calls answered with an error, by method");
      svc->latency[i] = metrics_histogram(reg, "rpc_seconds", labels, "RPC handling time, by method",
                                          metrics_latency_bounds, metrics_latency_n);
    }
    svc->rows_read = metrics_counter(reg, "rows_looked_up_total", NULL, "rows returned by Lookup");
    svc->rows_written = metrics_counter(reg, "rows_written_total", NULL, "rows made durable by WriteBack");
    svc->hot_hits = metrics_counter(reg, "hot_hits_total", NULL, "rows served from the memory tier");
    svc->kv_reads = metrics_counter(reg, "kv_reads_total", NULL, "rows read from RocksDB");
    svc->lazy_inits = metrics_counter(reg, "lazy_inits_total", NULL, "rows initialized because never written");
    svc->hot_rows = metrics_gauge(reg, "hot_rows", NULL, "rows in the memory tier");
    svc->hot_bytes = metrics_gauge(reg, "hot_bytes", NULL, "bytes used by the memory tier");
    svc->hot_capacity = metrics_gauge(reg, "hot_capacity_bytes", NULL, "memory tier budget");
    svc->stored_rows = metrics_gauge(reg, "stored_rows_estimate", NULL, "rows stored in RocksDB (estimate)");
    svc->evictions = metrics_gauge(reg, "hot_evictions", NULL, "rows evicted from the memory tier so far");
    metrics_registry_on_collect(reg, collect, svc);
  }
  rpc_method_t methods[M_COUNT];
  for (int i = 0; i < M_COUNT; i++) methods[i] = (rpc_method_t){.name = method_names[i], .unary = handle, .ud = svc};
  rc = rpc_server_add_service(server, &chanter__embedding__v1__embedding__descriptor, methods, M_COUNT);
  if (rc) {
    embedding_service_destroy(svc);
    return rc;
  }
  *out = svc;
  return 0;
}

uint64_t embedding_service_incarnation(const embedding_service_t *svc) { return svc->incarnation; }

void embedding_service_destroy(embedding_service_t *svc) {
  if (!svc) return;
  /* write-backs still held by a fence whose checkpoint never came: answered (the answer frees the call) */
  for (work_t *w = svc->parked, *n; w; w = n) {
    n = w->next;
    rpc_call_fail(w->call, ERR_SHUTDOWN, "WriteBack: the server stopped while the write waited for checkpoint %s",
                  svc->fence_id);
    free(w);
  }
  svc->parked = NULL;
  table_layout_close(&svc->layout);
  pthread_rwlock_destroy(&svc->epoch_lock);
  free(svc);
}
