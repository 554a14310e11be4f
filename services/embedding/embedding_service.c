/*
 * embedding_service: see embedding_service.h.
 *
 * The service is a table of its methods (methods[], below): one row per
 * RPC with its check (on the loop thread, on the decoded message), its work
 * (on a worker thread, against the store) and its reply (back on the loop)
 * side by side, and, where a failed work must be undone on the loop, what
 * undoes it.  handle() and after_cb() are the same for every method; adding
 * a method is a row and its functions.
 *
 * Every request is checked on the loop thread, on the decoded message,
 * before anything is allocated in proportion to it: packed keys must be a
 * multiple of 8 bytes, packed rows a multiple of 4, the key count within
 * embedding.max_lookup_keys / max_write_keys, a blob within
 * embedding.max_blob_mb, every written float finite, and the client's
 * layout fingerprint present (never 0) and equal to ours.  What is larger
 * than any request within these limits never reaches us: the server's gRPC
 * receive limit is set from them (main.c: limits_max_request), and gRPC
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
 *
 * A full disk is not the caller's failure: any call whose work met
 * -ENOSPC is answered RESOURCE_EXHAUSTED with a sentence naming this
 * server, its data dir and the free space, and Stats says the server is
 * disk-full until the store takes writes again (embedding_disk.h).
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
#include <unistd.h>

#include "clock.h"
#include "embedding.pb-c.h"
#include "embedding_backup.h"
#include "embedding_disk.h"
#include "embedding_epoch.h"
#include "embedding_reshape.h"
#include "err.h"
#include "log.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");

/* A method's metrics (NULL without a registry). */
typedef struct method_metrics_s {
  metrics_counter_t *calls, *errors;
  metrics_hist_t *latency;
} method_metrics_t;

struct embedding_service_s {
  uv_loop_t *loop;
  store_t *store;
  table_layout_t layout;
  uint64_t layout_hash;
  embedding_limits_t lim;
  uint32_t shard, n_shards;
  metrics_registry_t *reg;
  method_metrics_t *mm; /* per method, by its row in methods[] */
  metrics_counter_t *rows_read, *rows_written, *hot_hits, *kv_reads, *lazy_inits;
  metrics_gauge_t *hot_rows, *hot_bytes, *hot_capacity, *stored_rows, *evictions;
  uint64_t rejected;
  uint64_t incarnation; /* random, drawn at create: Stats, Fence */
  embedding_backup_t *backup; /* NULL: checkpoint.backup_dir is off */
  /* the write epoch (RestoreRequest.write_epoch): write-backs of earlier epochs
   * are refused.  Checked and written under epoch_lock (read: a
   * write-back's check and store_write; write: a Restore's or Clear's
   * raise and its work), so that no write of a rolled-back run lands after
   * the roll-back; kept in data_dir/EPOCH across restarts. */
  pthread_rwlock_t epoch_lock;
  _Atomic uint64_t write_epoch;
  /* the fence (Fence): write-backs with done > fence_done wait in parked
   * until Checkpoint(fence_id) is taken (0: no fence) */
  uint64_t fence_done;
  char fence_id[128];
  struct work_s *parked, *parked_tail;
  uint64_t n_parked;
  embedding_disk_t disk; /* a full disk (embedding_disk.h) */
  const cfg_t *cfg;      /* the job configuration (Reshape's); NULL: Reshape refused */
};

/* One call: checked on the loop, its storage work run on a worker thread,
 * answered on the loop. */
typedef struct work_s {
  struct work_s *next; /* parked behind the fence */
  uv_work_t req;
  embedding_service_t *svc;
  rpc_call_t *call;
  int m;           /* its row in methods[] */
  const char *name; /* the method's */
  const ProtobufCMessage *in;
  double t0; /* clock_mono_s() on arrival */
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
  embedding_reshape_result_t reshape;
} work_t;

/* What a check decided. */
enum {
  CHECK_WORK,     /* queue the work */
  CHECK_ANSWERED, /* the call is answered (an error, or a reply that needs no work) */
  CHECK_PARK,     /* a write-back the fence holds: parked until it is lifted */
};

/* One row of the method table.  check (NULL: nothing to check) runs on
 * the loop when the call arrives; work on a worker thread, setting w->rc
 * (and w->why); reply on the loop when w->rc is 0; failed (NULL: nothing)
 * on the loop when it is not, before the error is sent. */
typedef struct method_s {
  const char *name;
  int (*check)(work_t *w);
  void (*work)(work_t *w);
  void (*reply)(work_t *w);
  void (*failed)(work_t *w);
  int live; /* serves the job's live rows: refused (UNAVAILABLE) while the disk is lost */
} method_t;

static void fence_lift(embedding_service_t *svc, const char *why);
static void fence_from_store(embedding_service_t *svc, const char *why);

/* Copies packed keys into aligned memory (protobuf-c gives no alignment). */
static uint64_t *keys_of(const ProtobufCBinaryData *b, size_t *n) {
  *n = b->len / 8;
  uint64_t *k = malloc(*n ? *n * 8 : 8);
  if (k && *n) memcpy(k, b->data, *n * 8);
  return k;
}

/* Raises the epoch to e (durably first) when e is later; under the write
 * lock.  0 or an error with why. */
static int epoch_raise(embedding_service_t *svc, uint64_t e, char *why, size_t why_len) {
  if (!e || e <= atomic_load(&svc->write_epoch)) return 0;
  int rc = embedding_epoch_store(store_dir(svc->store), e, why, why_len);
  if (rc) return rc;
  log_info("write epoch raised from %" PRIu64 " to %" PRIu64 ": write-backs of earlier epochs are refused from now on",
           (uint64_t)atomic_load(&svc->write_epoch), e);
  atomic_store(&svc->write_epoch, e);
  return 0;
}

/* ---- checks shared by the methods: each answers the call when it refuses it */

static const char *SHAPE_MSG = "%s: %s has %zu bytes, not a multiple of %u";

/* A packed field whose length is not a multiple of mult: CHECK_ANSWERED,
 * with the error sent. */
static int reject_shape(work_t *w, const char *field, size_t len, unsigned mult) {
  w->svc->rejected++;
  metrics_counter_inc(w->svc->mm[w->m].errors);
  log_warn("rpc rejected method=%s peer=%s field=%s bytes=%zu", w->name, rpc_call_peer(w->call), field, len);
  rpc_call_fail(w->call, -EINVAL, SHAPE_MSG, w->name, field, len, mult);
  return CHECK_ANSWERED;
}

/* The client's layout fingerprint is ours: CHECK_WORK, else CHECK_ANSWERED
 * with the error sent. */
static int check_layout(work_t *w, uint64_t client_hash) {
  embedding_service_t *svc = w->svc;
  if (client_hash == svc->layout_hash) return CHECK_WORK;
  svc->rejected++;
  metrics_counter_inc(svc->mm[w->m].errors);
  if (client_hash == 0) {
    log_warn("rpc rejected method=%s peer=%s reason=layout_hash_0", w->name, rpc_call_peer(w->call));
    rpc_call_fail(w->call, -EINVAL,
                  "%s: layout_hash 0: every client sends its table layout's fingerprint (this server's is %016llx)",
                  w->name, (unsigned long long)svc->layout_hash);
    return CHECK_ANSWERED;
  }
  log_warn("rpc rejected method=%s peer=%s reason=layout client_hash=%016llx server_hash=%016llx", w->name,
           rpc_call_peer(w->call), (unsigned long long)client_hash, (unsigned long long)svc->layout_hash);
  rpc_call_fail(w->call, ERR_LAYOUT,
                "%s: the client's table layout (hash %016llx) differs from this server's (%016llx): "
                "check that both read the same job configuration (table_rows, embedding_dim, "
                "embedding_optimizer, seed)",
                w->name, (unsigned long long)client_hash, (unsigned long long)svc->layout_hash);
  return CHECK_ANSWERED;
}

/* A count past its limit (key, in the job file); CHECK_WORK when within
 * it, else CHECK_ANSWERED with the error sent, saying what to do. */
static int check_limit(work_t *w, const char *what, uint64_t n, uint64_t limit, const char *key, const char *advice) {
  if (n <= limit) return CHECK_WORK;
  w->svc->rejected++;
  metrics_counter_inc(w->svc->mm[w->m].errors);
  log_warn("rpc rejected method=%s peer=%s reason=limit %s=%" PRIu64 " %s=%" PRIu64, w->name, rpc_call_peer(w->call),
           what, n, key, limit);
  rpc_call_fail(w->call, -E2BIG, "%s: %" PRIu64 " %s, more than %s = %" PRIu64 " allows: %s", w->name, n, what, key,
                limit, advice);
  return CHECK_ANSWERED;
}

/* Every written float is finite (embedding_rows_finite): CHECK_WORK, else CHECK_ANSWERED, the error sent. */
static int check_finite(work_t *w, const Chanter__Embedding__V1__WriteBackRequest *r) {
  if (!embedding_rows_finite(&w->svc->layout, r, w->why, sizeof w->why)) return CHECK_WORK;
  w->svc->rejected++;
  metrics_counter_inc(w->svc->mm[w->m].errors);
  log_warn("rpc rejected method=WriteBack peer=%s reason=not_finite: %s", rpc_call_peer(w->call), w->why);
  rpc_call_fail(w->call, -EINVAL, "WriteBack: %s", w->why);
  return CHECK_ANSWERED;
}

/* A key naming no table or no row is a bad argument, not a missing thing. */
static int key_rc(int rc) { return rc == -ENOENT || rc == -ERANGE ? -EINVAL : rc; }

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
  r->write_epoch = atomic_load(&svc->write_epoch);
  const char *restored = "";
  r->lost_disk = embedding_backup_lost(svc->backup, &restored);
  r->restored_checkpoint = (char *)restored;
  r->disk_full = svc->disk.full_since > 0;
  r->disk_full_since = svc->disk.full_since;
  r->disk_free_bytes = svc->disk.space.free_bytes;
  r->disk_total_bytes = svc->disk.space.total_bytes;
}

static void fill_cp(Chanter__Embedding__V1__CheckpointInfo *o, store_checkpoint_info_t *c) {
  chanter__embedding__v1__checkpoint_info__init(o);
  o->id = c->id;
  o->path = c->path;
  o->created_unix = c->created_unix;
  o->bytes = c->bytes;
  o->sealed = c->sealed != 0;
  o->backed_up = c->backed_up != 0;
}

/* ---- the methods: each one's check, work and reply, side by side */

/* Lookup */

static int check_lookup(work_t *w) {
  const Chanter__Embedding__V1__LookupRequest *r = (const void *)w->in;
  if (r->keys.len % 8) return reject_shape(w, "keys (packed uint64)", r->keys.len, 8);
  if (check_layout(w, r->layout_hash)) return CHECK_ANSWERED;
  return check_limit(w, "keys", r->keys.len / 8, w->svc->lim.lookup_keys, "embedding.max_lookup_keys",
                     "split the call");
}

static void work_lookup(work_t *w) {
  const Chanter__Embedding__V1__LookupRequest *r = (const void *)w->in;
  store_t *st = w->svc->store;
  size_t n, bytes = 0;
  uint64_t *keys = keys_of(&r->keys, &n);
  if (!keys) {
    w->rc = -ENOMEM;
    return;
  }
  w->rc = store_rows_bytes(st, keys, n, &bytes, w->why, sizeof w->why);
  if (w->rc == 0) {
    w->buf = malloc(bytes ? bytes : 1);
    w->buf_len = bytes;
    w->rc = w->buf ? store_lookup(st, keys, n, w->buf, bytes, 0, &w->info, w->why, sizeof w->why) : -ENOMEM;
  }
  w->rc = key_rc(w->rc);
  w->count = n;
  free(keys);
}

static void reply_lookup(work_t *w) {
  embedding_service_t *svc = w->svc;
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
}

/* WriteBack */

static int check_write_back(work_t *w) {
  const Chanter__Embedding__V1__WriteBackRequest *r = (const void *)w->in;
  embedding_service_t *svc = w->svc;
  if (r->keys.len % 8) return reject_shape(w, "keys (packed uint64)", r->keys.len, 8);
  if (r->rows.len % 4) return reject_shape(w, "rows (packed float32)", r->rows.len, 4);
  if (check_layout(w, r->layout_hash)) return CHECK_ANSWERED;
  if (check_limit(w, "keys", r->keys.len / 8, svc->lim.write_keys, "embedding.max_write_keys", "split the call"))
    return CHECK_ANSWERED;
  if (check_finite(w, r)) return CHECK_ANSWERED;
  uint64_t e = atomic_load(&svc->write_epoch);
  if (r->write_epoch && r->write_epoch < e) { /* (and again under the lock when it runs) */
    svc->rejected++;
    metrics_counter_inc(svc->mm[w->m].errors);
    log_warn("rpc rejected method=WriteBack peer=%s reason=epoch epoch=%" PRIu64 " server_epoch=%" PRIu64,
             rpc_call_peer(w->call), r->write_epoch, e);
    rpc_call_fail(w->call, ERR_PRECONDITION,
                  "WriteBack: epoch %" PRIu64 ", but this server is at epoch %" PRIu64
                  ": its run of the job was rolled back (a trainer of an earlier generation)",
                  r->write_epoch, e);
    return CHECK_ANSWERED;
  }
  /* a write of a later iteration than the checkpoint being taken: held, without a worker thread */
  return svc->fence_done && r->done > svc->fence_done ? CHECK_PARK : CHECK_WORK;
}

static void work_write_back(work_t *w) {
  const Chanter__Embedding__V1__WriteBackRequest *r = (const void *)w->in;
  embedding_service_t *svc = w->svc;
  size_t n;
  uint64_t *keys = keys_of(&r->keys, &n);
  float *rows = malloc(r->rows.len ? r->rows.len : 1);
  if (!keys || !rows) {
    w->rc = -ENOMEM;
  } else {
    if (r->rows.len) memcpy(rows, r->rows.data, r->rows.len);
    pthread_rwlock_rdlock(&svc->epoch_lock);
    uint64_t e = atomic_load(&svc->write_epoch);
    if (r->write_epoch && r->write_epoch < e)
      w->rc = err_set(w->why, sizeof w->why, ERR_PRECONDITION,
                      "a write-back of epoch %" PRIu64 ", but this server is at epoch %" PRIu64
                      ": its run of the job was rolled back (a trainer of an earlier generation)",
                      r->write_epoch, e);
    else
      w->rc = store_write(svc->store, keys, n, rows, r->rows.len, 0, w->why, sizeof w->why);
    pthread_rwlock_unlock(&svc->epoch_lock);
  }
  w->rc = key_rc(w->rc);
  w->count = n;
  free(keys);
  free(rows);
}

static void reply_write_back(work_t *w) {
  Chanter__Embedding__V1__WriteBackResponse r = CHANTER__EMBEDDING__V1__WRITE_BACK_RESPONSE__INIT;
  r.rows_written = w->count;
  metrics_counter_add(w->svc->rows_written, w->count);
  rpc_call_reply(w->call, &r.base);
}

/* Checkpoint */

static void work_checkpoint(work_t *w) {
  const Chanter__Embedding__V1__CheckpointRequest *r = (const void *)w->in;
  w->rc = store_checkpoint(w->svc->store, r->id, &w->cp, w->why, sizeof w->why);
}

static void reply_checkpoint(work_t *w) {
  embedding_service_t *svc = w->svc;
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
}

/* ListCheckpoints */

static void work_list(work_t *w) {
  w->rc = store_list_checkpoints(w->svc->store, &w->cps, &w->n_cps);
  for (size_t i = 0; !w->rc && i < w->n_cps; i++) w->cps[i].backed_up = embedding_backup_has(w->svc->backup, w->cps[i].id);
}

static void reply_list(work_t *w) {
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
}

/* Restore */

static void work_restore(work_t *w) {
  const Chanter__Embedding__V1__RestoreRequest *r = (const void *)w->in;
  pthread_rwlock_wrlock(&w->svc->epoch_lock);
  w->rc = epoch_raise(w->svc, r->write_epoch, w->why, sizeof w->why);
  if (!w->rc) w->rc = store_restore(w->svc->store, r->id, w->why, sizeof w->why);
  if (!w->rc) embedding_backup_recovered(w->svc->backup, "was rolled back (Restore)");
  pthread_rwlock_unlock(&w->svc->epoch_lock);
}

static void reply_restore(work_t *w) {
  Chanter__Embedding__V1__RestoreResponse r = CHANTER__EMBEDDING__V1__RESTORE_RESPONSE__INIT;
  log_info("restored checkpoint id=%s", ((const Chanter__Embedding__V1__RestoreRequest *)w->in)->id);
  rpc_call_reply(w->call, &r.base);
  fence_lift(w->svc, "the server was restored");
}

/* PutBlob */

static int check_put_blob(work_t *w) {
  const Chanter__Embedding__V1__PutBlobRequest *r = (const void *)w->in;
  return check_limit(w, "MiB of blob (rounded up)", (r->data.len + (1u << 20) - 1) >> 20,
                     w->svc->lim.blob_bytes >> 20, "embedding.max_blob_mb", "raise it in the job file");
}

static void work_put_blob(work_t *w) {
  const Chanter__Embedding__V1__PutBlobRequest *r = (const void *)w->in;
  w->rc = store_put_blob(w->svc->store, r->name, r->data.data, r->data.len, w->why, sizeof w->why);
}

static void reply_put_blob(work_t *w) {
  Chanter__Embedding__V1__PutBlobResponse r = CHANTER__EMBEDDING__V1__PUT_BLOB_RESPONSE__INIT;
  rpc_call_reply(w->call, &r.base);
}

/* GetBlob */

static void work_get_blob(work_t *w) {
  const Chanter__Embedding__V1__GetBlobRequest *r = (const void *)w->in;
  w->rc = store_get_blob(w->svc->store, r->name, &w->buf, &w->buf_len);
  if (w->rc == ERR_NOTFOUND) snprintf(w->why, sizeof w->why, "no blob named '%s' on this server", r->name);
}

static void reply_get_blob(work_t *w) {
  Chanter__Embedding__V1__GetBlobResponse r = CHANTER__EMBEDDING__V1__GET_BLOB_RESPONSE__INIT;
  r.data.data = w->buf;
  r.data.len = w->buf_len;
  rpc_call_reply(w->call, &r.base);
}

/* Digest */

static void work_digest(work_t *w) { w->rc = store_digest(w->svc->store, w->sha, w->set_sha, &w->count); }

static void reply_digest(work_t *w) {
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
}

/* Stats */

/* A brief Stats (a probe) is answered at once, with no storage work. */
static int check_stats(work_t *w) {
  if (!((const Chanter__Embedding__V1__StatsRequest *)w->in)->brief) return CHECK_WORK;
  Chanter__Embedding__V1__StatsResponse r = CHANTER__EMBEDDING__V1__STATS_RESPONSE__INIT;
  stats_identity(w->svc, &r);
  rpc_call_reply(w->call, &r.base);
  metrics_hist_observe(w->svc->mm[w->m].latency, clock_mono_s() - w->t0);
  return CHECK_ANSWERED;
}

static void work_stats(work_t *w) {
  store_t *st = w->svc->store;
  /* here, not on the loop: the seeks behind has_rows read RocksDB, and
   * both wait while a restore or a clear holds the store */
  store_stats(st, &w->stats);
  w->rc = store_has_rows(st, &w->has_rows, &w->has_blobs);
  if (w->rc) snprintf(w->why, sizeof w->why, "cannot tell whether rows are stored: %s", err_str(w->rc));
}

static void reply_stats(work_t *w) {
  embedding_service_t *svc = w->svc;
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
}

/* SealCheckpoint */

static void work_seal(work_t *w) {
  const Chanter__Embedding__V1__SealCheckpointRequest *r = (const void *)w->in;
  w->rc = store_seal_checkpoint(w->svc->store, r->id, r->manifest.data, r->manifest.len, w->why, sizeof w->why);
}

static void reply_seal(work_t *w) {
  const Chanter__Embedding__V1__SealCheckpointRequest *in = (const void *)w->in;
  Chanter__Embedding__V1__SealCheckpointResponse r = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_RESPONSE__INIT;
  log_info("sealed checkpoint id=%s manifest_bytes=%zu", in->id, in->manifest.len);
  embedding_backup_sealed(w->svc->backup, in->id); /* queued (before the reply frees in): nothing waits for it */
  rpc_call_reply(w->call, &r.base);
}

/* GetManifest */

static void work_get_manifest(work_t *w) {
  const Chanter__Embedding__V1__GetManifestRequest *r = (const void *)w->in;
  w->rc = store_get_manifest(w->svc->store, r->id, &w->buf, &w->buf_len);
  if (w->rc == ERR_NOTFOUND)
    snprintf(w->why, sizeof w->why, "no sealed checkpoint '%s' on this server (it does not exist or has no manifest)",
             r->id);
  else if (w->rc == -EINVAL)
    snprintf(w->why, sizeof w->why, "checkpoint id '%.80s' is not valid: use 1 to 64 characters from A-Z a-z 0-9 . _ -",
             r->id);
}

static void reply_get_manifest(work_t *w) {
  Chanter__Embedding__V1__GetManifestResponse r = CHANTER__EMBEDDING__V1__GET_MANIFEST_RESPONSE__INIT;
  r.manifest.data = w->buf;
  r.manifest.len = w->buf_len;
  log_info("sent manifest id=%s bytes=%zu peer=%s", ((const Chanter__Embedding__V1__GetManifestRequest *)w->in)->id,
           w->buf_len, rpc_call_peer(w->call));
  rpc_call_reply(w->call, &r.base);
}

/* DeleteCheckpoint */

static void work_delete(work_t *w) {
  const Chanter__Embedding__V1__DeleteCheckpointRequest *r = (const void *)w->in;
  w->rc = store_delete_checkpoint(w->svc->store, r->id, w->why, sizeof w->why);
}

static void reply_delete(work_t *w) {
  Chanter__Embedding__V1__DeleteCheckpointResponse r = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_RESPONSE__INIT;
  log_info("deleted checkpoint id=%s", ((const Chanter__Embedding__V1__DeleteCheckpointRequest *)w->in)->id);
  embedding_backup_deleted(w->svc->backup, ((const Chanter__Embedding__V1__DeleteCheckpointRequest *)w->in)->id);
  rpc_call_reply(w->call, &r.base);
}

/* Clear */

static void work_clear(work_t *w) {
  const Chanter__Embedding__V1__ClearRequest *r = (const void *)w->in;
  pthread_rwlock_wrlock(&w->svc->epoch_lock);
  w->rc = epoch_raise(w->svc, r->write_epoch, w->why, sizeof w->why);
  if (!w->rc) w->rc = store_clear(w->svc->store, r->keep_checkpoints, w->why, sizeof w->why);
  if (!w->rc) embedding_backup_recovered(w->svc->backup, "was cleared (Clear)");
  if (!w->rc && !r->keep_checkpoints) embedding_backup_cleared(w->svc->backup);
  pthread_rwlock_unlock(&w->svc->epoch_lock);
}

static void reply_clear(work_t *w) {
  Chanter__Embedding__V1__ClearResponse r = CHANTER__EMBEDDING__V1__CLEAR_RESPONSE__INIT;
  if (((const Chanter__Embedding__V1__ClearRequest *)w->in)->keep_checkpoints)
    log_info("cleared every row and blob, kept the checkpoints peer=%s", rpc_call_peer(w->call));
  else
    log_info("cleared every row, blob and checkpoint peer=%s", rpc_call_peer(w->call));
  rpc_call_reply(w->call, &r.base);
  fence_lift(w->svc, "the server was cleared");
}

/* Fence */

/* Later write-backs wait from the moment the Fence arrives; it is answered
 * once the store has it on disk. */
static int check_fence(work_t *w) {
  const Chanter__Embedding__V1__FenceRequest *r = (const void *)w->in;
  if (!r->id || !*r->id) {
    rpc_call_fail(w->call, -EINVAL, "Fence: no checkpoint id");
    return CHECK_ANSWERED;
  }
  w->svc->fence_done = r->iteration + 1;
  snprintf(w->svc->fence_id, sizeof w->svc->fence_id, "%s", r->id);
  return CHECK_WORK;
}

static void work_fence(work_t *w) {
  const Chanter__Embedding__V1__FenceRequest *r = (const void *)w->in;
  w->rc = store_fence_set(w->svc->store, r->id, r->iteration, w->why, sizeof w->why);
}

static void reply_fence(work_t *w) {
  const Chanter__Embedding__V1__FenceRequest *in = (const void *)w->in;
  Chanter__Embedding__V1__FenceResponse r = CHANTER__EMBEDDING__V1__FENCE_RESPONSE__INIT;
  log_info("fence set id=%s iteration=%llu: later write-backs wait for this checkpoint (stored in %s/FENCE)", in->id,
           (unsigned long long)in->iteration, store_dir(w->svc->store));
  r.held = w->svc->n_parked;
  r.incarnation = w->svc->incarnation;
  rpc_call_reply(w->call, &r.base);
}

/* A fence the store could not keep is no fence: back to the stored one. */
static void failed_fence(work_t *w) { fence_from_store(w->svc, "the fence could not be stored"); }

/* Reshape */

static void work_reshape(work_t *w) {
  embedding_reshape_fence_t fence = {.lock = &w->svc->epoch_lock, .epoch = &w->svc->write_epoch};
  w->rc = embedding_reshape_run(w->svc->cfg, w->svc->store, w->svc->shard, &fence, (const void *)w->in, &w->reshape, w->why,
                                sizeof w->why);
}

static void reply_reshape(work_t *w) {
  Chanter__Embedding__V1__ReshapeResponse r = CHANTER__EMBEDDING__V1__RESHAPE_RESPONSE__INIT;
  w->svc->n_shards = ((const Chanter__Embedding__V1__ReshapeRequest *)w->in)->servers;
  r.rows_moved = w->reshape.rows_moved, r.bytes_moved = w->reshape.bytes_moved;
  r.rows_kept = w->reshape.rows_kept, r.seconds = w->reshape.seconds;
  rpc_call_reply(w->call, &r.base);
}

/* ---- the table */

static const method_t methods[] = {
    /* name              check             work               reply               failed        live */
    {"Lookup",           check_lookup,     work_lookup,       reply_lookup,       NULL,         1},
    {"WriteBack",        check_write_back, work_write_back,   reply_write_back,   NULL,         1},
    {"Checkpoint",       NULL,             work_checkpoint,   reply_checkpoint,   NULL,         1},
    {"ListCheckpoints",  NULL,             work_list,         reply_list,         NULL,         0},
    {"Restore",          NULL,             work_restore,      reply_restore,      NULL,         0},
    {"PutBlob",          check_put_blob,   work_put_blob,     reply_put_blob,     NULL,         1},
    {"GetBlob",          NULL,             work_get_blob,     reply_get_blob,     NULL,         0},
    {"Digest",           NULL,             work_digest,       reply_digest,       NULL,         1},
    {"Stats",            check_stats,      work_stats,        reply_stats,        NULL,         0},
    {"SealCheckpoint",   NULL,             work_seal,         reply_seal,         NULL,         1},
    {"GetManifest",      NULL,             work_get_manifest, reply_get_manifest, NULL,         0},
    {"DeleteCheckpoint", NULL,             work_delete,       reply_delete,       NULL,         0},
    {"Clear",            NULL,             work_clear,        reply_clear,        NULL,         0},
    {"Fence",            check_fence,      work_fence,        reply_fence,        failed_fence, 0},
    {"Reshape",          NULL,             work_reshape,      reply_reshape,      NULL,         1},
};
#define N_METHODS ((int)(sizeof methods / sizeof methods[0]))

void embedding_service_stop(embedding_service_t *svc) {
  if (svc) embedding_disk_stop(&svc->disk);
}

/* ---- the conductor of a call: the same for every method */

static void work_cb(uv_work_t *req) {
  work_t *w = req->data;
  methods[w->m].work(w);
}

static void after_cb(uv_work_t *req, int status) {
  work_t *w = req->data;
  embedding_service_t *svc = w->svc;
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  if (w->rc) {
    if (methods[w->m].failed) methods[w->m].failed(w);
    metrics_counter_inc(svc->mm[w->m].errors);
    if (!w->why[0]) snprintf(w->why, sizeof w->why, "%s", err_str(w->rc));
    /* a full disk: the sentence every caller gets; refusals are said once, when it filled */
    int known = w->rc == -ENOSPC && embedding_disk_full(&svc->disk, w->name, w->why, sizeof w->why);
    if (!known)
      log_warn("rpc failed method=%s peer=%s err=\"%s\" why=\"%s\"", w->name, rpc_call_peer(w->call),
               err_str(w->rc), w->why);
    rpc_call_fail(w->call, w->rc, "%s: %s", w->name, w->why);
  } else {
    methods[w->m].reply(w);
  }
  metrics_hist_observe(svc->mm[w->m].latency, clock_mono_s() - w->t0);
  free(w->buf);
  free(w->cps);
  free(w);
}

static int method_index(rpc_call_t *call) {
  const char *m = rpc_call_method(call);
  const char *slash = m ? strrchr(m, '/') : NULL;
  const char *name = slash ? slash + 1 : m;
  for (int i = 0; i < N_METHODS; i++)
    if (name && !strcmp(name, methods[i].name)) return i;
  return -1;
}

static void queue_work(work_t *w) {
  int rc = uv_queue_work(w->svc->loop, &w->req, work_cb, after_cb);
  if (rc) {
    rpc_call_fail(w->call, ERR_SHUTDOWN, "%s: cannot queue work: %s", w->name, uv_strerror(rc));
    free(w);
  }
}

static void handle(rpc_call_t *call, const ProtobufCMessage *req, void *ud) {
  embedding_service_t *svc = ud;
  int m = method_index(call);
  ASSERT(m >= 0);
  metrics_counter_inc(svc->mm[m].calls);
  work_t *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_fail(call, -ENOMEM, "%s: out of memory", methods[m].name);
    return;
  }
  w->svc = svc;
  w->call = call;
  w->m = m;
  w->name = methods[m].name;
  w->in = req;
  w->req.data = w;
  w->t0 = clock_mono_s();
  const char *restored = "";
  if (methods[m].live && embedding_backup_lost(svc->backup, &restored)) { /* the job rolls back first */
    metrics_counter_inc(svc->mm[m].errors);
    rpc_call_fail(call, ERR_UNAVAILABLE, "%s: this server started on a lost disk (checkpoint %s restored from backup) "
                  "and holds none of the job's live rows until the oracle rolls the job back", w->name,
                  restored[0] ? restored : "none");
    free(w);
    return;
  }
  switch (methods[m].check ? methods[m].check(w) : CHECK_WORK) {
  case CHECK_ANSWERED:
    free(w);
    return;
  case CHECK_PARK:
    if (svc->parked_tail) svc->parked_tail->next = w;
    else svc->parked = w;
    svc->parked_tail = w;
    svc->n_parked++;
    return;
  default:
    queue_work(w);
  }
}

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

int embedding_service_create(uv_loop_t *loop, rpc_server_t *server, store_t *store, const table_layout_t *layout,
                             const embedding_limits_t *limits, uint32_t shard, uint32_t n_shards,
                             metrics_registry_t *reg, embedding_service_t **out) {
  embedding_service_t *svc = calloc(1, sizeof *svc);
  if (!svc) return -ENOMEM;
  if (!(svc->mm = calloc(N_METHODS, sizeof *svc->mm))) {
    free(svc);
    return -ENOMEM;
  }
  int rc = table_layout_copy(&svc->layout, layout);
  if (rc) {
    free(svc->mm);
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
    if (getrandom(&svc->incarnation, sizeof svc->incarnation, 0) != (ssize_t)sizeof svc->incarnation)
      svc->incarnation = table_mix64((uint64_t)(clock_wall_s() * 1e6) * 1000000007u ^ (uint64_t)clock_mono_ns() ^
                                     (uint64_t)getpid() << 32);
  } while (svc->incarnation == 0);
  fence_from_store(svc, "no fence was stored"); /* the store logged it at open */
  pthread_rwlock_init(&svc->epoch_lock, NULL);
  uint64_t e = 0;
  if ((rc = embedding_epoch_load(store_dir(store), &e)) != 0) {
    pthread_rwlock_destroy(&svc->epoch_lock);
    table_layout_close(&svc->layout);
    free(svc->mm);
    free(svc);
    return rc;
  }
  atomic_store(&svc->write_epoch, e);
  if (reg) {
    for (int i = 0; i < N_METHODS; i++) {
      char labels[64];
      snprintf(labels, sizeof labels, "method=\"%s\"", methods[i].name);
      svc->mm[i].calls = metrics_counter(reg, "rpc_calls_total", labels, "RPC calls received, by method");
      svc->mm[i].errors = metrics_counter(reg, "rpc_errors_total", labels, "RPC calls answered with an error, by method");
      svc->mm[i].latency = metrics_histogram(reg, "rpc_seconds", labels, "RPC handling time, by method",
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
  rpc_method_t rm[N_METHODS];
  for (int i = 0; i < N_METHODS; i++) rm[i] = (rpc_method_t){.name = methods[i].name, .unary = handle, .ud = svc};
  rc = rpc_server_add_service(server, &chanter__embedding__v1__embedding__descriptor, rm, N_METHODS);
  if (rc) {
    embedding_service_destroy(svc);
    return rc;
  }
  embedding_disk_init(&svc->disk, loop, store, shard, reg); /* (its timer: once nothing can fail) */
  *out = svc;
  return 0;
}

uint64_t embedding_service_incarnation(const embedding_service_t *svc) { return svc->incarnation; }

void embedding_service_set_backup(embedding_service_t *svc, embedding_backup_t *b) { svc->backup = b; }

void embedding_service_set_cfg(embedding_service_t *svc, const cfg_t *cfg) { svc->cfg = cfg; }

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
  free(svc->mm);
  free(svc);
}
