/* embc: see embc.h. */
#include "clock.h"
#include "embc.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embedding.pb-c.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "proc.h"

struct embc_s {
  table_layout_t layout;
  uint64_t layout_hash;
  shard_map_t map;
  uint32_t n;
  char **addrs;
  size_t n_addrs;
  rpc_channel_t **ch;
  int64_t timeout_ms;
  int64_t disk_full_ms; /* embedding.disk_full_timeout_s: how long a full disk is waited for */
  size_t max_lookup, max_write; /* keys per call: embedding.max_lookup_keys, max_write_keys */
  const char *p_lookup, *p_write;
  volatile int abort; /* embc_abort: retries give up */
  _Atomic unsigned long long write_epoch; /* embc_set_write_epoch: every WriteBack's */
};

/* addrs (n_addrs of them, the caller's, copied) or, when NULL, cluster.embedding. */
static int create(const cfg_t *cfg, uint32_t n, const char *const *addrs, size_t n_addrs, embc_t **out, char *err,
                  size_t err_len) {
  embc_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  int rc = cfg_layout(cfg, &c->layout, err, err_len);
  if (rc) goto fail;
  c->layout_hash = table_layout_hash(&c->layout);
  c->n = n;
  if (addrs) {
    if (!(c->addrs = calloc(n_addrs ? n_addrs : 1, sizeof *c->addrs))) {
      rc = -ENOMEM;
      goto fail;
    }
    for (c->n_addrs = 0; c->n_addrs < n_addrs; c->n_addrs++)
      if (!(c->addrs[c->n_addrs] = strdup(addrs[c->n_addrs]))) {
        rc = -ENOMEM;
        goto fail;
      }
  } else if ((rc = cfg_list(cfg, "cluster.embedding", &c->addrs, &c->n_addrs)) != 0) {
    goto fail;
  }
  if (c->n_addrs != c->n || c->n == 0) {
    rc = err_set(err, err_len, ERR_CONFIG, "%s%s%s lists %zu addresses but there are %u embedding servers",
                 addrs ? "the peer list" : "cluster.embedding (from ", addrs ? "" : cfg_origin(cfg, "cluster.embedding"),
                 addrs ? "" : ")", c->n_addrs, c->n);
    goto fail;
  }
  if ((rc = shard_map_from_cfg(&c->map, cfg, &c->layout, c->n, err, err_len)) != 0) goto fail;
  c->timeout_ms = cfg_int(cfg, "rpc.timeout_ms");
  c->disk_full_ms = cfg_int(cfg, "embedding.disk_full_timeout_s") * 1000 + EMBC_DISK_FULL_GRACE_MS;
  c->max_lookup = (size_t)cfg_int(cfg, "embedding.max_lookup_keys");
  c->max_write = (size_t)cfg_int(cfg, "embedding.max_write_keys");
  c->ch = calloc(c->n, sizeof *c->ch);
  if (!c->ch) { rc = -ENOMEM; goto fail; }
  if ((rc = rpc_global_init()) != 0) goto fail;
  rpc_tls_t tls;
  daemon_tls(cfg, &tls, 0);
  for (uint32_t i = 0; i < c->n; i++) {
    rc = rpc_channel_create(c->addrs[i], tls.ca_file ? &tls : NULL, (size_t)cfg_int(cfg, "rpc.max_message_mb") << 20,
                            &c->ch[i]);
    if (rc) {
      err_set(err, err_len, rc, "cannot create a channel to embedding server %u at %s: %s", i, c->addrs[i],
              err_str(rc));
      goto fail;
    }
  }
  c->p_lookup = rpc_method_path(&chanter__embedding__v1__embedding__descriptor, "Lookup");
  c->p_write = rpc_method_path(&chanter__embedding__v1__embedding__descriptor, "WriteBack");
  *out = c;
  return 0;
fail:
  embc_destroy(c);
  return rc;
}

int embc_create(const cfg_t *cfg, embc_t **out, char *err, size_t err_len) {
  return create(cfg, (uint32_t)cfg_int(cfg, "embedding_servers"), NULL, 0, out, err, err_len);
}

int embc_create_peers(const cfg_t *cfg, uint32_t n, const char *const *addrs, embc_t **out, char *err,
                      size_t err_len) {
  return create(cfg, n, addrs, n, out, err, err_len);
}

void embc_destroy(embc_t *c) {
  if (!c) return;
  int had_rpc = c->ch != NULL && c->p_lookup != NULL;
  for (uint32_t i = 0; c->ch && i < c->n; i++)
    if (c->ch[i]) rpc_channel_destroy(c->ch[i]);
  free(c->ch);
  cfg_list_free(c->addrs, c->n_addrs);
  shard_map_close(&c->map);
  table_layout_close(&c->layout);
  free(c);
  if (had_rpc) rpc_global_shutdown();
}

const table_layout_t *embc_layout(const embc_t *c) { return &c->layout; }
const shard_map_t *embc_shard_map(const embc_t *c) { return &c->map; }
uint32_t embc_servers(const embc_t *c) { return c->n; }
const char *embc_address(const embc_t *c, uint32_t s) { return s < c->n ? c->addrs[s] : "?"; }

int embc_rows_bytes(const embc_t *c, const uint64_t *keys, size_t n, size_t *bytes, char *err, size_t err_len) {
  size_t b = 0;
  for (size_t i = 0; i < n; i++) {
    char why[256];
    int rc = table_check_key(&c->layout, keys[i], why, sizeof why);
    if (rc) return err_set(err, err_len, rc, "key index %zu: %s", i, why);
    b += table_row_bytes(&c->layout, TABLE_ID(keys[i]));
  }
  *bytes = b;
  return 0;
}

/* A server's answer that its data dir is full (embedding_service.c):
 * RESOURCE_EXHAUSTED with strerror(ENOSPC) in its sentence; other
 * RESOURCE_EXHAUSTED answers (a message over gRPC's limit, the server out
 * of memory) are errors as before. */
static int is_disk_full(int rc, const rpc_status_t *st) {
  return rc && st && st->code == 8 /* GRPC_STATUS_RESOURCE_EXHAUSTED */ &&
         strstr(st->message, strerror(ENOSPC)) != NULL;
}

/* Sleeps ms, waking every 100 ms to see embc_abort: 0, or ERR_CANCELLED. */
static int nap(embc_t *c, int64_t ms) {
  for (int64_t left = ms; left > 0; left -= 100) {
    if (__atomic_load_n(&c->abort, __ATOMIC_ACQUIRE)) return ERR_CANCELLED;
    struct timespec ts = {0, (left < 100 ? left : 100) * 1000000L};
    nanosleep(&ts, NULL);
  }
  return __atomic_load_n(&c->abort, __ATOMIC_ACQUIRE) ? ERR_CANCELLED : 0;
}

/* A blocking unary call, retried while the server is unavailable (up to
 * rpc.timeout_ms) and while its disk is full (up to
 * embedding.disk_full_timeout_s and EMBC_DISK_FULL_GRACE_MS from the first
 * such answer: nothing of a refused call was written, so the retry is
 * safe).  Past that, -ENOSPC
 * with err naming the server (the server's sentence names its data dir
 * and free space). */
static int call_retry(embc_t *c, uint32_t s, const char *path, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp, char *err, size_t err_len) {
  rpc_status_t st;
  double since = 0;
  int64_t backoff = 200;
  for (;;) {
    int rc = rpc_unary_retry_abortable(c->ch[s], path, req, rd, c->timeout_ms, resp, &st, &c->abort);
    double now = clock_mono_s();
    if (!is_disk_full(rc, &st)) {
      if (since && !rc)
        log_info("embedding server %u (%s) takes writes again after %.1f s without disk space", s, c->addrs[s],
                 now - since);
      if (rc)
        err_set(err, err_len, rc, "embedding server %u (%s): %s%s%s", s, c->addrs[s], err_str(rc),
                st.message[0] ? ": " : "", st.message);
      return rc;
    }
    if (!since) {
      since = now;
      log_warn("embedding server %u (%s) is out of disk space; retrying for up to %lld s "
               "(embedding.disk_full_timeout_s): %s",
               s, c->addrs[s], (long long)((c->disk_full_ms - EMBC_DISK_FULL_GRACE_MS) / 1000), st.message);
    }
    int64_t left = c->disk_full_ms - (int64_t)((now - since) * 1000);
    if (left <= 0)
      return err_set(err, err_len, -ENOSPC,
                     "embedding server %u (%s) has had no disk space for %.0f s (embedding.disk_full_timeout_s = "
                     "%lld): %s",
                     s, c->addrs[s], now - since, (long long)((c->disk_full_ms - EMBC_DISK_FULL_GRACE_MS) / 1000),
                     st.message);
    if (nap(c, backoff < left ? backoff : left)) {
      err_set(err, err_len, ERR_CANCELLED, "embedding server %u (%s): given up: this daemon is stopping "
              "(the server's disk was full: %s)", s, c->addrs[s], st.message);
      return ERR_CANCELLED;
    }
    if (backoff < 2000) backoff *= 2;
  }
}

void embc_abort(embc_t *c) {
  if (c) __atomic_store_n(&c->abort, 1, __ATOMIC_RELEASE);
}

void embc_unabort(embc_t *c) {
  if (c) __atomic_store_n(&c->abort, 0, __ATOMIC_RELEASE);
}

void embc_set_write_epoch(embc_t *c, uint64_t epoch) {
  if (c) atomic_store(&c->write_epoch, epoch);
}

static int embc_call(embc_t *c, uint32_t server, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, char *err, size_t err_len) {
  if (server >= c->n) return err_set(err, err_len, -EINVAL, "no embedding server %u (there are %u)", server, c->n);
  return call_retry(c, server, rpc_method_path(&chanter__embedding__v1__embedding__descriptor, method), req, resp_desc,
                    resp, err, err_len);
}

#define EMBC_DEFINE_CALL(lower, Camel)                                                                          \
  int embc_##lower(embc_t *c, uint32_t server, const Chanter__Embedding__V1__##Camel##Request *req,            \
                   Chanter__Embedding__V1__##Camel##Response **resp, char *err, size_t err_len) {             \
    return embc_call(c, server, #Camel, &req->base, &chanter__embedding__v1__##lower##_response__descriptor,  \
                     (ProtobufCMessage **)resp, err, err_len);                                                 \
  }
EMBC_ADMIN_CALLS(EMBC_DEFINE_CALL)
#undef EMBC_DEFINE_CALL

/* Per-server slice of a batched operation. */
typedef struct part_s {
  size_t n;          /* keys for this server */
  size_t *idx;       /* their positions in the caller's array */
  uint64_t *keys;
  float *rows;       /* write: packed rows for this server */
  size_t rows_bytes;
  ProtobufCMessage *resp;
  int rc;
  int disk_full; /* fan-out: the server said its disk is full (retried below) */
  char err[512];
  uint64_t done; /* write: the rows' iteration tag (WriteBackRequest.done) */
} part_t;

typedef struct job_s {
  embc_t *c;
  part_t *parts;
  int write;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending;
} job_t;

typedef struct task_s {
  job_t *job;
  uint32_t s;
  rpc_async_t *h; /* the call, to cancel on embc_abort */
} task_t;

static void pack_req(embc_t *c, part_t *p, int write, Chanter__Embedding__V1__LookupRequest *lr,
                     Chanter__Embedding__V1__WriteBackRequest *wr) {
  if (write) {
    chanter__embedding__v1__write_back_request__init(wr);
    wr->keys.data = (uint8_t *)p->keys;
    wr->keys.len = p->n * 8;
    wr->rows.data = (uint8_t *)p->rows;
    wr->rows.len = p->rows_bytes;
    wr->layout_hash = c->layout_hash;
    wr->done = p->done;
    wr->write_epoch = atomic_load(&c->write_epoch);
  } else {
    chanter__embedding__v1__lookup_request__init(lr);
    lr->keys.data = (uint8_t *)p->keys;
    lr->keys.len = p->n * 8;
    lr->layout_hash = c->layout_hash;
  }
}

static void run_part(embc_t *c, part_t *p, uint32_t s, int write) {
  Chanter__Embedding__V1__LookupRequest lr;
  Chanter__Embedding__V1__WriteBackRequest wr;
  pack_req(c, p, write, &lr, &wr);
  p->rc = call_retry(c, s, write ? c->p_write : c->p_lookup, write ? &wr.base : &lr.base,
                     write ? &chanter__embedding__v1__write_back_response__descriptor
                           : &chanter__embedding__v1__lookup_response__descriptor,
                     &p->resp, p->err, sizeof p->err);
}

static void async_done(int rc, ProtobufCMessage *resp, const rpc_status_t *st, void *ud) {
  task_t *t = ud;
  job_t *j = t->job;
  part_t *p = &j->parts[t->s];
  p->resp = resp;
  p->rc = rc;
  p->disk_full = is_disk_full(rc, st);
  if (rc)
    err_set(p->err, sizeof p->err, rc, "embedding server %u (%s): %s%s%s", t->s, j->c->addrs[t->s], err_str(rc),
            st && st->message[0] ? ": " : "", st ? st->message : "");
  pthread_mutex_lock(&j->mu);
  if (--j->pending == 0) pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

static int batched(embc_t *c, const uint64_t *keys, size_t n, float *out, const float *in, int write, uint64_t done,
                   char *err, size_t err_len) {
  if (n == 0) return 0;
  part_t *parts = calloc(c->n, sizeof *parts);
  for (uint32_t s = 0; parts && s < c->n; s++) parts[s].done = done;
  size_t *off = malloc(n * sizeof *off); /* float offset of each key's row */
  uint32_t *owner = malloc(n * sizeof *owner);
  task_t *tasks = calloc(c->n, sizeof *tasks);
  int rc = 0;
  if (!parts || !off || !owner || !tasks) { rc = -ENOMEM; goto out; }
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    char why[256];
    if ((rc = table_check_key(&c->layout, keys[i], why, sizeof why)) != 0) {
      err_set(err, err_len, rc, "key index %zu: %s", i, why);
      goto out;
    }
    off[i] = total;
    total += table_row_floats(&c->layout, TABLE_ID(keys[i]));
    owner[i] = shard_of(&c->map, keys[i]);
    parts[owner[i]].n++;
  }
  for (uint32_t s = 0; s < c->n; s++) {
    part_t *p = &parts[s];
    if (!p->n) continue;
    p->idx = malloc(p->n * sizeof *p->idx);
    p->keys = malloc(p->n * sizeof *p->keys);
    if (!p->idx || !p->keys) { rc = -ENOMEM; goto out; }
    p->n = 0;
  }
  for (size_t i = 0; i < n; i++) {
    part_t *p = &parts[owner[i]];
    p->idx[p->n] = i;
    p->keys[p->n++] = keys[i];
    if (write) p->rows_bytes += table_row_bytes(&c->layout, TABLE_ID(keys[i]));
  }
  if (write) {
    for (uint32_t s = 0; s < c->n; s++) {
      part_t *p = &parts[s];
      if (!p->n) continue;
      if (!(p->rows = malloc(p->rows_bytes))) { rc = -ENOMEM; goto out; }
      size_t o = 0;
      for (size_t k = 0; k < p->n; k++) {
        uint32_t f = table_row_floats(&c->layout, TABLE_ID(p->keys[k]));
        memcpy(p->rows + o, in + off[p->idx[k]], f * sizeof(float));
        o += f;
      }
    }
  }
  uint32_t used = 0, last = 0;
  for (uint32_t s = 0; s < c->n; s++)
    if (parts[s].n) used++, last = s;
  if (used == 1) {
    run_part(c, &parts[last], last, write);
  } else {
    /* fan out: every server at once; a part that fails UNAVAILABLE is
     * retried below, synchronously, with backoff */
    job_t j = {.c = c, .parts = parts, .write = write, .pending = 0};
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    Chanter__Embedding__V1__LookupRequest *lr = calloc(c->n, sizeof *lr);
    Chanter__Embedding__V1__WriteBackRequest *wr = calloc(c->n, sizeof *wr);
    if (!lr || !wr) {
      free(lr);
      free(wr);
      rc = -ENOMEM;
      goto out;
    }
    j.pending = (int)used;
    for (uint32_t s = 0; s < c->n; s++) {
      if (!parts[s].n) continue;
      tasks[s] = (task_t){.job = &j, .s = s};
      pack_req(c, &parts[s], write, &lr[s], &wr[s]);
      int e = rpc_unary_async_h(c->ch[s], write ? c->p_write : c->p_lookup, write ? &wr[s].base : &lr[s].base,
                                write ? &chanter__embedding__v1__write_back_response__descriptor
                                      : &chanter__embedding__v1__lookup_response__descriptor,
                                c->timeout_ms, async_done, &tasks[s], &tasks[s].h);
      if (e) async_done(e, NULL, NULL, &tasks[s]);
    }
    /* embc_abort cancels the calls out (a write-back a fenced server holds
     * for a checkpoint that will never come must not hold a stopping
     * trainer for the whole deadline) */
    pthread_mutex_lock(&j.mu);
    int cancelled = 0;
    while (j.pending > 0) {
      struct timespec ts = clock_deadline_rt(100);
      pthread_cond_timedwait(&j.cv, &j.mu, &ts);
      if (!cancelled && __atomic_load_n(&c->abort, __ATOMIC_ACQUIRE)) {
        cancelled = 1;
        for (uint32_t s = 0; s < c->n; s++) rpc_async_cancel(tasks[s].h);
      }
    }
    pthread_mutex_unlock(&j.mu);
    for (uint32_t s = 0; s < c->n; s++) rpc_async_release(tasks[s].h);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
    free(lr);
    free(wr);
    for (uint32_t s = 0; s < c->n; s++)
      if (parts[s].n && (parts[s].rc == ERR_UNAVAILABLE || parts[s].disk_full)) run_part(c, &parts[s], s, write);
  }
  for (uint32_t s = 0; s < c->n; s++) {
    part_t *p = &parts[s];
    if (!p->n) continue;
    if (p->rc) {
      rc = err_set(err, err_len, p->rc, "%s", p->err);
      goto out;
    }
    if (write) continue;
    Chanter__Embedding__V1__LookupResponse *r = (void *)p->resp;
    size_t want = 0;
    for (size_t k = 0; k < p->n; k++) want += table_row_bytes(&c->layout, TABLE_ID(p->keys[k]));
    if (r->rows.len != want) {
      rc = err_set(err, err_len, ERR_BADMSG,
                   "embedding server %u (%s) returned %zu bytes of rows for %zu keys; expected %zu", s, c->addrs[s],
                   r->rows.len, p->n, want);
      goto out;
    }
    size_t o = 0;
    for (size_t k = 0; k < p->n; k++) {
      uint32_t f = table_row_floats(&c->layout, TABLE_ID(p->keys[k]));
      memcpy(out + off[p->idx[k]], r->rows.data + o, f * sizeof(float));
      o += f * sizeof(float);
    }
  }
out:
  for (uint32_t s = 0; parts && s < c->n; s++) {
    free(parts[s].idx);
    free(parts[s].keys);
    free(parts[s].rows);
    if (parts[s].resp) protobuf_c_message_free_unpacked(parts[s].resp, NULL);
  }
  free(parts);
  free(off);
  free(owner);
  free(tasks);
  return rc;
}

/* batched() in calls of at most the servers' keys per call (every part of
 * a chunk is within the limit); rows advance by each key's row floats. */
static int chunked(embc_t *c, const uint64_t *keys, size_t n, float *out, const float *in, int write, uint64_t done,
                   char *err, size_t err_len) {
  size_t max = write ? c->max_write : c->max_lookup;
  if (!max || n <= max) return batched(c, keys, n, out, in, write, done, err, err_len);
  size_t f = 0; /* floats before this chunk */
  for (size_t i = 0; i < n; i += max) {
    size_t m = n - i < max ? n - i : max, cf = 0;
    for (size_t k = i; k < i + m; k++)
      if (TABLE_ID(keys[k]) < c->layout.n_tables) cf += table_row_floats(&c->layout, TABLE_ID(keys[k]));
    int rc = batched(c, keys + i, m, out ? out + f : NULL, in ? in + f : NULL, write, done, err, err_len);
    if (rc) return rc;
    f += cf;
  }
  return 0;
}

int embc_lookup(embc_t *c, const uint64_t *keys, size_t n, float *out, char *err, size_t err_len) {
  return chunked(c, keys, n, out, NULL, 0, 0, err, err_len);
}

int embc_write(embc_t *c, const uint64_t *keys, size_t n, const float *rows, char *err, size_t err_len) {
  return chunked(c, keys, n, NULL, rows, 1, 0, err, err_len);
}

int embc_write_done(embc_t *c, const uint64_t *keys, size_t n, const float *rows, uint64_t done, char *err,
                    size_t err_len) {
  return chunked(c, keys, n, NULL, rows, 1, done, err, err_len);
}

int embc_probe(embc_t *c, uint32_t server, embc_probe_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  if (server >= c->n) return err_set(err, err_len, -EINVAL, "no embedding server %u (there are %u)", server, c->n);
  Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
  req.brief = 1;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = {.code = 0, .message = ""};
  int64_t t = c->timeout_ms > 0 && c->timeout_ms < EMBC_PROBE_TIMEOUT_MS ? c->timeout_ms : EMBC_PROBE_TIMEOUT_MS;
  int rc = rpc_unary(c->ch[server], rpc_method_path(&chanter__embedding__v1__embedding__descriptor, "Stats"),
                     &req.base, &chanter__embedding__v1__stats_response__descriptor, t, &resp, &st);
  if (rc)
    return err_set(err, err_len, rc, "embedding server %u (%s): %s%s%s", server, c->addrs[server], err_str(rc),
                   st.message[0] ? ": " : "", st.message);
  const Chanter__Embedding__V1__StatsResponse *r = (const void *)resp;
  out->incarnation = r->incarnation;
  out->lost_disk = r->lost_disk;
  snprintf(out->restored, sizeof out->restored, "%s", r->restored_checkpoint ? r->restored_checkpoint : "");
  out->disk_full = r->disk_full;
  out->disk_full_since = r->disk_full_since;
  out->disk_free_bytes = r->disk_free_bytes;
  out->disk_total_bytes = r->disk_total_bytes;
  snprintf(out->data_dir, sizeof out->data_dir, "%s", r->data_dir ? r->data_dir : "");
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

int embc_incarnation(embc_t *c, uint32_t server, uint64_t *incarnation, char *err, size_t err_len) {
  embc_probe_t p;
  int rc = embc_probe(c, server, &p, err, err_len);
  *incarnation = p.incarnation;
  return rc;
}

/* One server's move (embc_reshape_all's phase 2), on a thread of its own. */
typedef struct move_one_s {
  embc_t *c;
  uint32_t s, n;
  uint64_t write_epoch;
  embc_reshape_stats_t st;
  int rc;
  char err[1024];
} move_one_t;

static void *move_one(void *arg) {
  proc_name_thread("embc-move");
  move_one_t *m = arg;
  Chanter__Embedding__V1__ReshapeRequest req = CHANTER__EMBEDDING__V1__RESHAPE_REQUEST__INIT;
  req.servers = m->n;
  req.n_peers = m->n;
  req.peers = m->c->addrs;
  req.move = 1;
  req.write_epoch = m->write_epoch;
  Chanter__Embedding__V1__ReshapeResponse *r = NULL;
  if ((m->rc = embc_reshape(m->c, m->s, &req, &r, m->err, sizeof m->err)) != 0) return NULL;
  m->st = (embc_reshape_stats_t){r->rows_moved, r->bytes_moved, r->rows_kept, r->seconds};
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return NULL;
}

#define RESHAPE_PARALLEL 32 /* servers moving at once */

int embc_reshape_all(embc_t *c, uint32_t n, uint64_t write_epoch, embc_reshape_stats_t *per, embc_reshape_stats_t *st,
                     char *err, size_t err_len) {
  double t0 = clock_mono_s();
  memset(st, 0, sizeof *st);
  if (n < 1 || n > c->n)
    return err_set(err, err_len, -EINVAL, "%u servers: the client knows %u (give every old and new address)", n, c->n);
  int rc = 0;
  for (uint32_t s = 0; s < c->n && !rc; s++) { /* every server takes the map first: then no row goes astray */
    Chanter__Embedding__V1__ReshapeRequest req = CHANTER__EMBEDDING__V1__RESHAPE_REQUEST__INIT;
    req.servers = n;
    req.n_peers = n;
    req.peers = c->addrs;
    req.write_epoch = write_epoch;
    Chanter__Embedding__V1__ReshapeResponse *r = NULL;
    if ((rc = embc_reshape(c, s, &req, &r, err, err_len)) == 0) protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  move_one_t *m = rc ? NULL : calloc(c->n, sizeof *m);
  if (!rc && !m) rc = err_set(err, err_len, -ENOMEM, "out of memory for %u moves", c->n);
  for (uint32_t first = 0; !rc && first < c->n; first += RESHAPE_PARALLEL) { /* then they move at once */
    uint32_t k = c->n - first < RESHAPE_PARALLEL ? c->n - first : RESHAPE_PARALLEL;
    pthread_t th[RESHAPE_PARALLEL];
    int started[RESHAPE_PARALLEL] = {0};
    for (uint32_t i = 0; i < k; i++) {
      m[first + i] = (move_one_t){.c = c, .s = first + i, .n = n, .write_epoch = write_epoch};
      started[i] = pthread_create(&th[i], NULL, move_one, &m[first + i]) == 0;
      if (!started[i]) move_one(&m[first + i]); /* (no thread: here) */
    }
    for (uint32_t i = 0; i < k; i++)
      if (started[i]) pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < k && !rc; i++)
      if ((rc = m[first + i].rc) != 0) snprintf(err, err_len, "%s", m[first + i].err);
  }
  for (uint32_t s = 0; m && s < c->n; s++) {
    if (per) per[s] = m[s].st;
    st->rows_moved += m[s].st.rows_moved;
    st->bytes_moved += m[s].st.bytes_moved;
    st->rows_kept += m[s].st.rows_kept;
  }
  free(m);
  st->seconds = clock_mono_s() - t0;
  return rc;
}
