/*
 * oracle_ckpt: whole-job checkpoints and the job's start (DESIGN.md
 * section 5; oracle_job_internal.h says how the stages share a job).
 *
 * A checkpoint at iteration c holds the model as synchronous training has
 * it after c.  Its parts, in order:
 *  1. Choosing c.  Asked once per batch when its planning is queued
 *     (oracle_ckpt__wanted): after every checkpoint_every iterations,
 *     when checkpoint_seconds have passed since the last one, on demand
 *     (chanter checkpoint: the next batch planned), and after the last
 *     iteration.  With allocation = laia the planning work saves laia's
 *     state right after it allocated c (laia runs ahead of training).
 *  2. Deciding c.  Right after the cacher decided c, and before it
 *     decides c + 1, cacher_flush lists for every trainer the rows it
 *     holds newer than the servers' copy and writes back (each row once).
 *  3. The trainers.  After Step c and the evaluations due after c, each
 *     trainer gets CheckpointWork: it waits for c's background work,
 *     writes its flush rows back without evicting them, rank 0 stores the
 *     dense state (parameters and dense optimizer state) as a blob on
 *     server 0, and it answers CheckpointDone.  Dispatch holds Step c + 1
 *     back until the checkpoint is complete: so no write-back of c + 1
 *     can reach a server before its checkpoint of c.
 *  4. The servers (worker pool, once every trainer answered and the
 *     evaluations due are scored): the oracle's state as a blob on server
 *     0 (c, the evaluation record, the summary's counters, laia), a
 *     RocksDB checkpoint on every server, then the MANIFEST sealed into
 *     every server's checkpoint and copied to oracle.state_dir.  A
 *     checkpoint is complete, and listed as usable, only once sealed on
 *     every server.  Then the oldest beyond checkpoint_keep go.
 *
 * The start: once every trainer is attached the servers are checked.
 * Servers that hold nothing get the job's stamp (a blob "job") and the job
 * begins at 0.  Servers holding anything -- rows, blobs, checkpoints --
 * hold another job's state (or this job's, stopped): the job is HELD,
 * saying what it found, until chanter train --resume (restore every
 * server to a complete checkpoint, load the oracle's state, and tell the
 * trainers with ResumeWork where to go on) or --fresh (clear them).
 *
 * The manifest is text, one key=value a line, ending with sha256= over
 * the lines before it.  The oracle's state blob is binary (little-endian,
 * "CHORACL1", SHA-256 trailer).  Everything here runs on the loop thread
 * except the *_work functions, which run on the worker pool and read only
 * their own work struct and the immutable job shape.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "log.h"
#include "manifest.h"
#include "oracle_job_internal.h"
#include "table.h"

#define EMB_DESC(x) (&chanter__embedding__v1__##x##__descriptor)
#define ORACLE_MAGIC "CHORACL1"
#define JOB_BLOB "job"

/* ------------------------------------------------------------ bytes */

typedef struct bw_s {
  uint8_t *p;
  size_t n, cap;
  int oom;
} bw_t;

static void bw_put(bw_t *b, const void *src, size_t len) {
  if (b->oom) return;
  if (b->n + len > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->n + len) nc *= 2;
    uint8_t *q = realloc(b->p, nc);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = nc;
  }
  if (len) memcpy(b->p + b->n, src, len);
  b->n += len;
}
static void bw_u64(bw_t *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  bw_put(b, x, 8);
}
static void bw_f64(bw_t *b, double d) {
  uint64_t v;
  memcpy(&v, &d, 8);
  bw_u64(b, v);
}

typedef struct br_s {
  const uint8_t *p;
  size_t n, off;
  int bad;
} br_t;

static uint64_t br_u64(br_t *b) {
  if (b->bad || b->n - b->off < 8) {
    b->bad = 1;
    return 0;
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b->p[b->off + i] << (8 * i);
  b->off += 8;
  return v;
}
static double br_f64(br_t *b) {
  uint64_t v = br_u64(b);
  double d;
  memcpy(&d, &v, 8);
  return d;
}
static const uint8_t *br_take(br_t *b, size_t len) {
  if (b->bad || b->n - b->off < len) {
    b->bad = 1;
    return NULL;
  }
  const uint8_t *p = b->p + b->off;
  b->off += len;
  return p;
}

static void sha_hex(const void *p, size_t n, char out[65]) {
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(p, n, h, &hl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* ------------------------------------------------------------ the servers (worker pool) */

/* One unary admin call to server s; *resp freed by the caller.  0 or an
 * error with err naming the server. */
static int srv_call(embc_t *c, uint32_t s, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *d, ProtobufCMessage **resp, char *err, size_t err_len) {
  char why[1024] = "";
  *resp = NULL;
  int rc = embc_call(c, s, method, req, d, resp, why, sizeof why);
  if (rc) err_set(err, err_len, rc, "embedding server %u (%s): %s: %s", s, embc_address(c, s), method, why);
  return rc;
}

static int srv_put_blob(embc_t *c, uint32_t s, const char *name, const void *data, size_t len, char *err,
                        size_t err_len) {
  Chanter__Embedding__V1__PutBlobRequest req = CHANTER__EMBEDDING__V1__PUT_BLOB_REQUEST__INIT;
  req.name = (char *)name;
  req.data.data = (uint8_t *)data;
  req.data.len = len;
  ProtobufCMessage *resp;
  int rc = srv_call(c, s, "PutBlob", &req.base, EMB_DESC(put_blob_response), &resp, err, err_len);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

/* A blob, or ERR_NOTFOUND (err says so). */
static int srv_get_blob(embc_t *c, uint32_t s, const char *name, uint8_t **data, size_t *len, char *err,
                        size_t err_len) {
  Chanter__Embedding__V1__GetBlobRequest req = CHANTER__EMBEDDING__V1__GET_BLOB_REQUEST__INIT;
  req.name = (char *)name;
  ProtobufCMessage *resp;
  int rc = srv_call(c, s, "GetBlob", &req.base, EMB_DESC(get_blob_response), &resp, err, err_len);
  if (rc) return rc;
  const Chanter__Embedding__V1__GetBlobResponse *g = (const void *)resp;
  *len = g->data.len;
  *data = malloc(*len ? *len : 1);
  if (*data && *len) memcpy(*data, g->data.data, *len);
  protobuf_c_message_free_unpacked(resp, NULL);
  return *data ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------ the manifest (manifest.h) */

static void model_shape(const cfg_t *cfg, char *out, size_t n) {
  snprintf(out, n, "bottom_mlp=%s;top_mlp=%s;deep_mlp=%s;cross_layers=%lld;n_dense=%lld", cfg_str(cfg, "model.bottom_mlp"),
           cfg_str(cfg, "model.top_mlp"), cfg_str(cfg, "model.deep_mlp"), (long long)cfg_int(cfg, "model.cross_layers"),
           (long long)cfg_int(cfg, "n_dense"));
}

static uint64_t g_layout_hash, g_schema_hash; /* this job's (oracle_ckpt__init; one job per process) */

/* This job's fingerprint as a manifest (the per-checkpoint fields empty). */
static void manifest_of_job(const oracle_job_t *j, manifest_t *m) {
  const cfg_t *cfg = j->cfg;
  memset(m, 0, sizeof *m);
  snprintf(m->job_id, sizeof m->job_id, "%s", j->job_id);
  snprintf(m->model, sizeof m->model, "%s", cfg_str(cfg, "model"));
  model_shape(cfg, m->model_shape, sizeof m->model_shape);
  snprintf(m->optimizer, sizeof m->optimizer, "%s", cfg_str(cfg, "optimizer"));
  snprintf(m->embedding_optimizer, sizeof m->embedding_optimizer, "%s", cfg_str(cfg, "embedding_optimizer"));
  snprintf(m->dataset, sizeof m->dataset, "%s", cfg_str(cfg, "dataset"));
  snprintf(m->allocation, sizeof m->allocation, "%s", j->allocation);
  snprintf(m->lookahead, sizeof m->lookahead, "%s", j->ideal ? "0" : j->lookahead_cfg);
  m->layout_hash = g_layout_hash;
  m->schema_hash = g_schema_hash;
  m->seed = j->seed;
  m->batch_size = j->B;
  m->trainers = j->P;
  m->servers = j->ckpt.S;
  m->iterations = j->iterations;
  m->cache_rows = j->pipe.cache_rows;
}

/* Refuses a checkpoint this job cannot go on from, naming the field;
 * warns (into warn) for changes that keep the model only up to summation
 * order.  0 or ERR_CONFIG. */
static int manifest_check(const oracle_job_t *j, const manifest_t *m, char *err, size_t err_len, char *warn,
                          size_t warn_len) {
  manifest_t me;
  manifest_of_job(j, &me);
  const char *id = m->id;
#define DIFF_S(field, name, what)                                                                                    \
  if (strcmp(m->field, me.field))                                                                                    \
    return err_set(err, err_len, ERR_CONFIG,                                                                         \
                   "checkpoint %s is of another " what ": its " name " is %s, this job's is %s; resume it with the " \
                   "job file it was taken with, or start over with --fresh",                                        \
                   id, m->field, me.field);
#define DIFF_U(field, name, what)                                                                                    \
  if (m->field != me.field)                                                                                          \
    return err_set(err, err_len, ERR_CONFIG,                                                                         \
                   "checkpoint %s is of another " what ": its " name " is %" PRIu64 ", this job's is %" PRIu64      \
                   "; resume it with the job file it was taken with, or start over with --fresh",                   \
                   id, m->field, me.field);
  DIFF_S(model, "model", "model")
  DIFF_S(model_shape, "model shape (model.*, n_dense)", "model")
  if (m->layout_hash != g_layout_hash)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s is of another table layout (table_rows, embedding_dim, table_dims or "
                   "embedding_optimizer: layout hash %016" PRIx64 ", this job's %016" PRIx64
                   "); resume it with the job file it was taken with, or start over with --fresh",
                   id, m->layout_hash, g_layout_hash);
  if (m->schema_hash != g_schema_hash)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s is of another data schema (n_dense, table_hotness: schema hash %016" PRIx64
                   ", this job's %016" PRIx64 "); resume it with the job file it was taken with, or start over with "
                   "--fresh",
                   id, m->schema_hash, g_schema_hash);
  DIFF_S(optimizer, "optimizer", "optimizer")
  DIFF_S(embedding_optimizer, "embedding_optimizer", "optimizer")
  DIFF_S(dataset, "dataset", "dataset")
  DIFF_U(seed, "seed", "data order")
  DIFF_U(batch_size, "batch_size", "data order")
#undef DIFF_S
#undef DIFF_U
  if (m->servers != me.servers)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s was taken on %" PRIu64 " embedding servers and this job has %" PRIu64
                   "; resharding a checkpoint onto another server count is not implemented yet: resume with "
                   "embedding_servers = %" PRIu64,
                   id, m->servers, me.servers, m->servers);
  if (m->iteration + 1 >= j->iterations)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s holds the model after iteration %" PRIu64 ": this job's iterations = %" PRIu64
                   " are all done; raise iterations to go on training",
                   id, m->iteration, j->iterations);
  warn[0] = 0;
  size_t o = 0;
  if (strcmp(m->allocation, me.allocation) && o < warn_len)
    o += (size_t)snprintf(warn + o, warn_len - o,
                          "the checkpoint was taken with allocation = %s and this job uses %s: the model is the same "
                          "only up to floating-point summation order",
                          m->allocation, me.allocation);
  if (m->trainers != me.trainers && o < warn_len)
    snprintf(warn + o, warn_len - o,
             "%sthe checkpoint was taken with trainers = %" PRIu64 " and this job has %" PRIu64
             ": the model is the same only up to floating-point summation order",
             o ? "; " : "", m->trainers, me.trainers);
  return 0;
}

/* ------------------------------------------------------------ the oracle's state */

/* The state after c that the rest of the job depends on or reports
 * (report's counters, the evaluation record, laia). */
static int oracle_state_encode(const oracle_job_t *j, const oracle_cp_t *cp, uint8_t **out, size_t *len) {
  const oracle_report_t *rp = &j->report;
  const oracle_pipe_t *pp = &j->pipe;
  bw_t b = {0};
  bw_put(&b, ORACLE_MAGIC, 8);
  bw_u64(&b, cp->iteration);
  bw_u64(&b, j->P);
  bw_u64(&b, rp->evals_done);
  uint64_t first = rp->n_evals > ORACLE_EVAL_HISTORY ? rp->n_evals - ORACLE_EVAL_HISTORY : 0;
  bw_u64(&b, rp->n_evals);
  bw_u64(&b, rp->n_evals - first);
  for (uint64_t i = first; i < rp->n_evals; i++) {
    const oracle_eval_rec_t *e = &rp->evals[i % ORACLE_EVAL_HISTORY];
    bw_u64(&b, e->round);
    bw_u64(&b, e->after);
    bw_f64(&b, e->logloss);
    bw_f64(&b, e->auc);
  }
  bw_f64(&b, rp->last_test_logloss);
  bw_f64(&b, rp->last_test_auc);
  bw_f64(&b, rp->loss_last);
  bw_f64(&b, rp->tail_loss_sum);
  bw_u64(&b, rp->tail_n);
  uint64_t k = rp->done < ORACLE_LOSS_RING ? rp->done : ORACLE_LOSS_RING;
  bw_u64(&b, k);
  for (uint64_t i = rp->done - k; i < rp->done; i++) bw_f64(&b, rp->loss_ring[i % ORACLE_LOSS_RING]);
  bw_f64(&b, rp->sum_rows_fetched);
  bw_f64(&b, rp->sum_rows_synced);
  bw_f64(&b, rp->sum_rows_synced_delayed);
  bw_f64(&b, rp->sum_rows_replicated);
  bw_f64(&b, rp->sum_rows_written_back);
  bw_f64(&b, rp->sum_cache_hits);
  bw_u64(&b, PHASE_N_REPORT);
  for (int i = 0; i < PHASE_N_REPORT; i++) bw_f64(&b, rp->sum_t[i]);
  for (int i = 0; i < PHASE_N_REPORT; i++) bw_f64(&b, rp->first_t[i]);
  bw_f64(&b, rp->seconds_before + (rp->t_last - rp->t_start));
  bw_u64(&b, pp->L_start);
  bw_u64(&b, j->ckpt.n_done + 1);
  bw_f64(&b, j->ckpt.stall_sum);
  bw_f64(&b, j->ckpt.total_sum);
  bw_u64(&b, cp->laia_len);
  bw_put(&b, cp->laia_state, cp->laia_len);
  uint8_t h[32];
  unsigned hl = 0;
  if (!b.oom) EVP_Digest(b.p, b.n, h, &hl, EVP_sha256(), NULL);
  bw_put(&b, h, 32);
  if (b.oom) {
    free(b.p);
    return -ENOMEM;
  }
  *out = b.p;
  *len = b.n;
  return 0;
}

/* The oracle's state decoded (laia points into the buffer). */
typedef struct ostate_s {
  uint64_t iteration, P, evals_done, n_evals, n_hist, tail_n, n_loss, l_start, n_done;
  oracle_eval_rec_t hist[ORACLE_EVAL_HISTORY];
  double last_ll, last_auc, loss_last, tail_sum, loss[ORACLE_LOSS_RING];
  double sums[6], sum_t[PHASE_N_REPORT], first_t[PHASE_N_REPORT], seconds, stall_sum, total_sum;
  const uint8_t *laia;
  size_t laia_len;
} ostate_t;

static int oracle_state_decode(const uint8_t *p, size_t n, ostate_t *o, char *err, size_t err_len) {
  memset(o, 0, sizeof *o);
  if (n < 8 + 32 || memcmp(p, ORACLE_MAGIC, 8))
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob (%zu bytes) is not one chanter wrote", n);
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(p, n - 32, h, &hl, EVP_sha256(), NULL);
  if (memcmp(h, p + n - 32, 32))
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob is damaged: its SHA-256 does not match");
  br_t b = {.p = p, .n = n - 32, .off = 8};
  o->iteration = br_u64(&b);
  o->P = br_u64(&b);
  o->evals_done = br_u64(&b);
  o->n_evals = br_u64(&b);
  o->n_hist = br_u64(&b);
  if (o->n_hist > ORACLE_EVAL_HISTORY) b.bad = 1;
  for (uint64_t i = 0; i < o->n_hist && !b.bad; i++) {
    o->hist[i].round = br_u64(&b);
    o->hist[i].after = br_u64(&b);
    o->hist[i].logloss = br_f64(&b);
    o->hist[i].auc = br_f64(&b);
  }
  o->last_ll = br_f64(&b);
  o->last_auc = br_f64(&b);
  o->loss_last = br_f64(&b);
  o->tail_sum = br_f64(&b);
  o->tail_n = br_u64(&b);
  o->n_loss = br_u64(&b);
  if (o->n_loss > ORACLE_LOSS_RING) b.bad = 1;
  for (uint64_t i = 0; i < o->n_loss && !b.bad; i++) o->loss[i] = br_f64(&b);
  for (int i = 0; i < 6; i++) o->sums[i] = br_f64(&b);
  if (br_u64(&b) != PHASE_N_REPORT) b.bad = 1;
  for (int i = 0; i < PHASE_N_REPORT && !b.bad; i++) o->sum_t[i] = br_f64(&b);
  for (int i = 0; i < PHASE_N_REPORT && !b.bad; i++) o->first_t[i] = br_f64(&b);
  o->seconds = br_f64(&b);
  o->l_start = br_u64(&b);
  o->n_done = br_u64(&b);
  o->stall_sum = br_f64(&b);
  o->total_sum = br_f64(&b);
  o->laia_len = br_u64(&b);
  o->laia = br_take(&b, o->laia_len);
  if (b.bad || b.off != b.n)
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob is malformed (at byte %zu of %zu)", b.off, n);
  return 0;
}

/* Puts the decoded state into the job: every stage starts at c + 1. */
static int oracle_state_apply(oracle_job_t *j, const ostate_t *o, char *err, size_t err_len) {
  oracle_report_t *rp = &j->report;
  oracle_pipe_t *pp = &j->pipe;
  uint64_t s = o->iteration + 1;
  if (pp->laia) {
    laia_t *l = NULL;
    laia_opts_t lo = {.trainers = j->P,
                      .window = pp->laia_window,
                      .seed = j->seed,
                      .profile = pp->laia_profile,
                      .min_share = pp->laia_min_share};
    if (o->laia_len && o->P == j->P) {
      char why[512] = "";
      int rc = laia_load(&lo, o->laia, o->laia_len, &l, why, sizeof why);
      if (rc) return err_set(err, err_len, rc, "laia's state in the checkpoint: %s", why);
    } else {
      /* another allocation or trainer count: laia starts over from c + 1 (warned: summation order) */
      int rc = laia_create(&lo, &l);
      if (rc || (rc = laia_start_at(l, s)) != 0) {
        laia_destroy(l);
        return err_set(err, err_len, rc, "allocation = laia: %s", err_str(rc));
      }
    }
    laia_destroy(pp->laia);
    pp->laia = l;
  }
  pp->laia_next = s;
  pp->next = pp->reaped = pp->push_next = pp->decide_next = s;
  j->fetch.q_head = j->fetch.start = s;
  for (uint32_t p = 0; p < j->P; p++) {
    j->dispatch.rank[p].next_step = s;
    j->dispatch.rank[p].evals_sent = oracle_report__rounds_upto(j, o->iteration);
    rp->rank[p].reported = s;
  }
  rp->done = rp->start = s;
  rp->evals_done = o->evals_done;
  rp->n_evals = o->n_evals;
  uint64_t first = o->n_evals - o->n_hist;
  for (uint64_t i = 0; i < o->n_hist; i++) rp->evals[(first + i) % ORACLE_EVAL_HISTORY] = o->hist[i];
  rp->last_test_logloss = o->last_ll;
  rp->last_test_auc = o->last_auc;
  rp->loss_last = o->loss_last;
  rp->tail_loss_sum = o->tail_sum;
  rp->tail_n = o->tail_n;
  for (uint64_t i = 0; i < o->n_loss; i++) rp->loss_ring[(s - o->n_loss + i) % ORACLE_LOSS_RING] = o->loss[i];
  rp->sum_rows_fetched = o->sums[0];
  rp->sum_rows_synced = o->sums[1];
  rp->sum_rows_synced_delayed = o->sums[2];
  rp->sum_rows_replicated = o->sums[3];
  rp->sum_rows_written_back = o->sums[4];
  rp->sum_cache_hits = o->sums[5];
  memcpy(rp->sum_t, o->sum_t, sizeof rp->sum_t);
  memcpy(rp->first_t, o->first_t, sizeof rp->first_t);
  rp->seconds_before = o->seconds;
  j->ckpt.n_done = o->n_done;
  j->ckpt.stall_sum = o->stall_sum;
  j->ckpt.total_sum = o->total_sum;
  j->ckpt.start = s;
  return 0;
}

/* ------------------------------------------------------------ worker-pool work */

enum { W_PREFLIGHT, W_FRESH, W_RESUME, W_SERVERS };

typedef struct ck_work_s {
  uv_work_t req;
  oracle_job_t *j;
  int kind;
  int rc;
  char err[2048], warn[1024];
  /* preflight: what the servers hold */
  int empty;
  char found[1024];
  /* resume */
  char want[96];
  manifest_t m;
  uint8_t *ostate;
  size_t ostate_len;
  /* servers */
  oracle_cp_t *cp;
  uint8_t *oblob;
  size_t oblob_len;
  uint64_t *bytes;
  manifest_t job;
  double secs;
  char pruned[512];
} ck_work_t;

/* The job's stamp on every server: its id and what it is. */
static int stamp(ck_work_t *w) {
  oracle_job_t *j = w->j;
  char txt[512];
  int n = snprintf(txt, sizeof txt, "job_id=%s\nmodel=%s\nseed=%" PRIu64 "\n", j->job_id, w->job.model, j->seed);
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    int rc = srv_put_blob(j->ckpt.embc, s, JOB_BLOB, txt, (size_t)n, w->err, sizeof w->err);
    if (rc) return rc;
  }
  return 0;
}

/* Every server's checkpoints (list[s], n[s]). */
static int list_all(ck_work_t *w, Chanter__Embedding__V1__ListCheckpointsResponse **lists) {
  oracle_job_t *j = w->j;
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    Chanter__Embedding__V1__ListCheckpointsRequest req = CHANTER__EMBEDDING__V1__LIST_CHECKPOINTS_REQUEST__INIT;
    ProtobufCMessage *resp;
    int rc = srv_call(j->ckpt.embc, s, "ListCheckpoints", &req.base, EMB_DESC(list_checkpoints_response), &resp, w->err,
                      sizeof w->err);
    if (rc) return rc;
    lists[s] = (void *)resp;
  }
  return 0;
}

static void free_lists(Chanter__Embedding__V1__ListCheckpointsResponse **lists, uint32_t S) {
  for (uint32_t s = 0; s < S; s++)
    if (lists[s]) protobuf_c_message_free_unpacked(&lists[s]->base, NULL);
}

static const Chanter__Embedding__V1__CheckpointInfo *find_cp(const Chanter__Embedding__V1__ListCheckpointsResponse *l,
                                                            const char *id) {
  for (size_t i = 0; l && i < l->n_checkpoints; i++)
    if (!strcmp(l->checkpoints[i]->id, id)) return l->checkpoints[i];
  return NULL;
}

static int get_manifest(ck_work_t *w, uint32_t s, const char *id, manifest_t *m) {
  Chanter__Embedding__V1__GetManifestRequest req = CHANTER__EMBEDDING__V1__GET_MANIFEST_REQUEST__INIT;
  req.id = (char *)id;
  ProtobufCMessage *resp;
  int rc = srv_call(w->j->ckpt.embc, s, "GetManifest", &req.base, EMB_DESC(get_manifest_response), &resp, w->err,
                    sizeof w->err);
  if (rc) return rc;
  const Chanter__Embedding__V1__GetManifestResponse *g = (const void *)resp;
  char why[512];
  rc = manifest_parse((const char *)g->manifest.data, g->manifest.len, m, why, sizeof why);
  manifest_free(m); /* (the per-server sizes are the CLI's to list) */
  protobuf_c_message_free_unpacked(resp, NULL);
  if (rc) err_set(w->err, sizeof w->err, rc, "checkpoint %s on embedding server %u: %s", id, s, why);
  return rc;
}

static void preflight_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  uint64_t rows = 0, blobs = 0, cps = 0;
  char other_job[160] = "";
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists) {
    w->rc = -ENOMEM;
    return;
  }
  if ((w->rc = list_all(w, lists)) != 0) goto out;
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
    ProtobufCMessage *resp;
    if ((w->rc = srv_call(j->ckpt.embc, s, "Stats", &req.base, EMB_DESC(stats_response), &resp, w->err,
                          sizeof w->err)) != 0)
      goto out;
    const Chanter__Embedding__V1__StatsResponse *st = (const void *)resp;
    rows += st->has_rows;
    blobs += st->has_blobs;
    protobuf_c_message_free_unpacked(resp, NULL);
    if (s == 0) cps = lists[0]->n_checkpoints;
    uint8_t *data = NULL;
    size_t len = 0;
    char e2[256];
    if (!other_job[0] && srv_get_blob(j->ckpt.embc, s, JOB_BLOB, &data, &len, e2, sizeof e2) == 0) {
      const char *p = strstr((const char *)data, "job_id=");
      if (p && len < 512) sscanf(p + 7, "%95[^\n]", other_job);
      free(data);
    }
  }
  w->empty = !rows && !blobs && !cps;
  if (!w->empty) {
    /* the latest complete checkpoint, for the message */
    const Chanter__Embedding__V1__CheckpointInfo *best = NULL;
    manifest_t m, bm;
    for (size_t i = 0; i < lists[0]->n_checkpoints; i++) {
      const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
      if (!ci->sealed || get_manifest(w, 0, ci->id, &m) != 0) continue;
      if (!best || m.iteration > bm.iteration) {
        best = ci;
        bm = m;
      }
    }
    size_t o = (size_t)snprintf(w->found, sizeof w->found,
                                "the embedding servers hold another job's state (%s%s%s: rows on %" PRIu64 " of %u "
                                "servers, %" PRIu64 " checkpoints",
                                other_job[0] ? "job " : "no job stamp", other_job, "", rows, S, cps);
    if (best && o < sizeof w->found)
      o += (size_t)snprintf(w->found + o, sizeof w->found - o, "; the latest complete one, %s, holds the model after "
                                                                "iteration %" PRIu64,
                            bm.id, bm.iteration);
    if (o < sizeof w->found)
      snprintf(w->found + o, sizeof w->found - o,
               "); run `chanter train --resume` to go on from %s, or `chanter train --fresh` to clear the servers and "
               "start over",
               best ? "its latest complete checkpoint" : "a checkpoint (none is complete)");
  }
  w->rc = 0;
out:
  free_lists(lists, S);
  free(lists);
}

static void fresh_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    Chanter__Embedding__V1__ClearRequest req = CHANTER__EMBEDDING__V1__CLEAR_REQUEST__INIT;
    ProtobufCMessage *resp;
    if ((w->rc = srv_call(j->ckpt.embc, s, "Clear", &req.base, EMB_DESC(clear_response), &resp, w->err,
                          sizeof w->err)) != 0)
      return;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  w->rc = stamp(w);
}

/* Finds the checkpoint to resume (w->want: "latest" or an id), checks it
 * against this job BEFORE anything is restored, then restores every
 * server and reads the oracle's state. */
static void resume_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists) {
    w->rc = -ENOMEM;
    return;
  }
  if ((w->rc = list_all(w, lists)) != 0) goto out;
  /* complete: sealed on every server; the latest by iteration */
  int latest = !strcmp(w->want, "latest") || !w->want[0];
  int found = 0;
  char skipped[512] = "";
  size_t so = 0;
  for (size_t i = 0; i < lists[0]->n_checkpoints; i++) {
    const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
    if (!latest && strcmp(ci->id, w->want)) continue;
    int complete = ci->sealed;
    for (uint32_t s = 1; s < S && complete; s++) {
      const Chanter__Embedding__V1__CheckpointInfo *o = find_cp(lists[s], ci->id);
      complete = o && o->sealed;
    }
    if (!complete) {
      if (!latest) {
        w->rc = err_set(w->err, sizeof w->err, ERR_NOTFOUND,
                        "checkpoint %s is not complete (it is not sealed on every embedding server: it was "
                        "interrupted); resume from another one (`chanter checkpoints` lists them)",
                        ci->id);
        goto out;
      }
      if (so < sizeof skipped) so += (size_t)snprintf(skipped + so, sizeof skipped - so, "%s%s", so ? ", " : "", ci->id);
      continue;
    }
    manifest_t m;
    if ((w->rc = get_manifest(w, 0, ci->id, &m)) != 0) goto out;
    if (!found || m.iteration > w->m.iteration) w->m = m;
    found = 1;
  }
  if (!found) {
    w->rc = err_set(w->err, sizeof w->err, ERR_NOTFOUND, "%s%s%s%s%s",
                    latest ? "there is no complete checkpoint on the embedding servers" : "there is no checkpoint ",
                    latest ? "" : w->want, latest ? "" : " on the embedding servers",
                    so ? "; incomplete (interrupted) ones: " : "", skipped);
    goto out;
  }
  if (so) log_warn("incomplete checkpoints are skipped (interrupted while being taken): %s", skipped);
  if ((w->rc = manifest_check(j, &w->m, w->err, sizeof w->err, w->warn, sizeof w->warn)) != 0) goto out;
  /* from here the servers change */
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__RestoreRequest req = CHANTER__EMBEDDING__V1__RESTORE_REQUEST__INIT;
    req.id = w->m.id;
    ProtobufCMessage *resp;
    if ((w->rc = srv_call(j->ckpt.embc, s, "Restore", &req.base, EMB_DESC(restore_response), &resp, w->err,
                          sizeof w->err)) != 0) {
      if (s) {
        size_t l = strlen(w->err);
        snprintf(w->err + l, sizeof w->err - l, " (servers 0..%u were restored already; run --resume again)", s - 1);
      }
      goto out;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  if ((w->rc = srv_get_blob(j->ckpt.embc, 0, w->m.oracle_blob, &w->ostate, &w->ostate_len, w->err, sizeof w->err)) != 0)
    goto out;
  char h[65];
  sha_hex(w->ostate, w->ostate_len, h);
  if (strcmp(h, w->m.oracle_sha256)) {
    w->rc = err_set(w->err, sizeof w->err, ERR_BADMSG,
                    "checkpoint %s: the oracle's state blob does not match the manifest's oracle_sha256", w->m.id);
    goto out;
  }
  /* the job goes on under the checkpoint's job id, with its stamp */
  snprintf(j->job_id, sizeof j->job_id, "%s", w->m.job_id);
  w->rc = stamp(w);
out:
  free_lists(lists, S);
  free(lists);
}

static int write_state_dir(const char *dir, const char *id, const char *text, size_t len, char *err, size_t err_len) {
  char d[4096], path[4300], tmp[4310];
  snprintf(d, sizeof d, "%s/checkpoints", dir);
  mkdir(dir, 0755);
  mkdir(d, 0755);
  snprintf(path, sizeof path, "%s/%s.manifest", d, id);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f || fwrite(text, 1, len, f) != len || fflush(f) || fsync(fileno(f)) || fclose(f)) {
    int e = errno;
    if (f) fclose(f);
    return err_set(err, err_len, -e, "cannot write %s: %s", tmp, strerror(e));
  }
  if (rename(tmp, path)) return err_set(err, err_len, -errno, "cannot rename %s: %s", tmp, strerror(errno));
  return 0;
}

/* Removes the checkpoints of this job beyond the newest `keep` complete
 * ones, and incomplete ones older than the newest complete one. */
static void prune(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists || list_all(w, lists) != 0) goto out;
  /* ids of this job sort by iteration (zero-padded): walk server 0's from the newest */
  size_t n = lists[0]->n_checkpoints, kept = 0, o = 0;
  size_t plen = strlen(j->job_id);
  for (size_t i = n; i-- > 0;) {
    const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
    if (strncmp(ci->id, j->job_id, plen) || ci->id[plen] != '-') continue;
    if (ci->sealed && kept < j->ckpt.keep) {
      kept++;
      continue;
    }
    if (!ci->sealed && !kept) continue; /* newer than every complete one: maybe being taken */
    for (uint32_t s = 0; s < S; s++) {
      Chanter__Embedding__V1__DeleteCheckpointRequest req = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
      req.id = ci->id;
      ProtobufCMessage *resp;
      char e2[512];
      if (srv_call(j->ckpt.embc, s, "DeleteCheckpoint", &req.base, EMB_DESC(delete_checkpoint_response), &resp, e2,
                   sizeof e2) == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
      else if (!strstr(e2, "no checkpoint") && !strstr(e2, "not found"))
        log_warn("cannot remove an old checkpoint: %s", e2);
    }
    if (j->ckpt.state_dir[0]) {
      char path[4400];
      snprintf(path, sizeof path, "%s/checkpoints/%s.manifest", j->ckpt.state_dir, ci->id);
      unlink(path);
    }
    if (o < sizeof w->pruned) o += (size_t)snprintf(w->pruned + o, sizeof w->pruned - o, "%s%s", o ? "," : "", ci->id);
  }
out:
  if (lists) free_lists(lists, S);
  free(lists);
}

static void servers_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  oracle_cp_t *cp = w->cp;
  uint32_t S = j->ckpt.S;
  double t0 = oracle_job__now();
  char name[160];
  snprintf(name, sizeof name, "ckpt.%s.oracle", cp->id);
  if ((w->rc = srv_put_blob(j->ckpt.embc, 0, name, w->oblob, w->oblob_len, w->err, sizeof w->err)) != 0) return;
  /* fault injection for the tests (README): CHANTER_FAULT_CHECKPOINT_PAUSE=K:MS pauses the K-th checkpoint of
   * this oracle MS ms after server 0 took its part, so that a test can kill a server in the middle */
  static int nth;
  unsigned fk = 0, fms = 0;
  const char *fault = getenv("CHANTER_FAULT_CHECKPOINT_PAUSE");
  int pause = ++nth && fault && sscanf(fault, "%u:%u", &fk, &fms) == 2 && (int)fk == nth;
  for (uint32_t s = 0; s < S; s++) {
    /* a resumed job retakes the ids of the run it went back from: that run's later checkpoints are replaced */
    Chanter__Embedding__V1__DeleteCheckpointRequest del = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
    del.id = cp->id;
    ProtobufCMessage *dresp = NULL;
    char e2[512];
    if (j->ckpt.resumed && embc_call(j->ckpt.embc, s, "DeleteCheckpoint", &del.base, EMB_DESC(delete_checkpoint_response),
                                     &dresp, e2, sizeof e2) == 0) {
      protobuf_c_message_free_unpacked(dresp, NULL);
      log_info("checkpoint %s of the run this job went back from replaced on server %u", cp->id, s);
    }
    Chanter__Embedding__V1__CheckpointRequest req = CHANTER__EMBEDDING__V1__CHECKPOINT_REQUEST__INIT;
    req.id = cp->id;
    ProtobufCMessage *resp;
    if ((w->rc = srv_call(j->ckpt.embc, s, "Checkpoint", &req.base, EMB_DESC(checkpoint_response), &resp, w->err,
                          sizeof w->err)) != 0)
      return;
    const Chanter__Embedding__V1__CheckpointResponse *r = (const void *)resp;
    w->bytes[s] = r->checkpoint ? r->checkpoint->bytes : 0;
    protobuf_c_message_free_unpacked(resp, NULL);
    if (pause && s == 0) {
      log_warn("checkpoint %s: pausing %u ms after server 0's part (CHANTER_FAULT_CHECKPOINT_PAUSE)", cp->id, fms);
      usleep((useconds_t)fms * 1000);
    }
  }
  manifest_t m = w->job;
  snprintf(m.id, sizeof m.id, "%s", cp->id);
  m.iteration = cp->iteration;
  m.created_unix = (uint64_t)time(NULL);
  m.dense_server = 0;
  snprintf(m.dense_blob, sizeof m.dense_blob, "ckpt.%s.dense", cp->id);
  snprintf(m.oracle_blob, sizeof m.oracle_blob, "ckpt.%s.oracle", cp->id);
  sha_hex(w->oblob, w->oblob_len, m.oracle_sha256);
  m.rows_flushed = cp->rows_flushed;
  m.server_bytes = w->bytes;
  size_t len = 0;
  char *text = manifest_format(&m, &len);
  if (!text) {
    w->rc = -ENOMEM;
    return;
  }
  for (uint32_t s = 0; s < S && !w->rc; s++) {
    Chanter__Embedding__V1__SealCheckpointRequest req = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_REQUEST__INIT;
    req.id = cp->id;
    req.manifest.data = (uint8_t *)text;
    req.manifest.len = len;
    ProtobufCMessage *resp;
    if ((w->rc = srv_call(j->ckpt.embc, s, "SealCheckpoint", &req.base, EMB_DESC(seal_checkpoint_response), &resp,
                          w->err, sizeof w->err)) == 0)
      protobuf_c_message_free_unpacked(resp, NULL);
  }
  if (!w->rc && j->ckpt.state_dir[0]) {
    char e2[512];
    if (write_state_dir(j->ckpt.state_dir, cp->id, text, len, e2, sizeof e2))
      log_warn("checkpoint %s: the manifest's copy in oracle.state_dir failed (the servers hold it): %s", cp->id, e2);
  }
  free(text);
  w->secs = oracle_job__now() - t0;
  if (!w->rc) prune(w);
}

static void ck_work(uv_work_t *req) {
  ck_work_t *w = req->data;
  switch (w->kind) {
  case W_PREFLIGHT: preflight_work(w); break;
  case W_FRESH: fresh_work(w); break;
  case W_RESUME: resume_work(w); break;
  case W_SERVERS: servers_work(w); break;
  }
}

/* ------------------------------------------------------------ on the loop */

static void begin(oracle_job_t *j);

static void cp_free(oracle_cp_t *cp, uint32_t P) {
  if (!cp) return;
  if (cp->flush) cacher_flush_free(cp->flush, P);
  free(cp->flush);
  free(cp->laia_state);
  free(cp->sent);
  free(cp);
}

static void hold(oracle_job_t *j, const char *why) {
  j->state = ORACLE_HELD;
  metrics_gauge_set(j->m.state, j->state);
  snprintf(j->message, sizeof j->message, "%s", why);
  snprintf(j->ckpt.held_why, sizeof j->ckpt.held_why, "%s", why);
  log_warn("job held: %s", why);
}

static void ck_done(uv_work_t *req, int status) {
  ck_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_ckpt_t *ck = &j->ckpt;
  ck->running--;
  if (status == UV_ECANCELED && !w->rc) w->rc = ERR_SHUTDOWN;
  if (j->destroying || oracle_job__over(j)) goto out;
  switch (w->kind) {
  case W_PREFLIGHT:
    ck->start_pending = 0;
    if (w->rc) {
      oracle_job__error(j, w->rc, "checking the embedding servers before the job starts: %s", w->err);
    } else if (!w->empty) {
      hold(j, w->found);
    } else {
      /* nothing there: this job's stamp, then training (stamped on the pool) */
      ck_work_t *w2 = calloc(1, sizeof *w2);
      if (!w2) {
        oracle_job__error(j, -ENOMEM, "out of memory starting the job");
        break;
      }
      w2->j = j;
      w2->kind = W_FRESH;
      w2->job = w->job;
      w2->req.data = w2;
      w2->empty = 1; /* (nothing to clear: Clear on empty servers is cheap and harmless) */
      if (uv_queue_work(j->loop, &w2->req, ck_work, ck_done)) {
        free(w2);
        oracle_job__error(j, -EIO, "cannot queue the job's start");
        break;
      }
      ck->running++;
    }
    break;
  case W_FRESH:
    if (w->rc) {
      oracle_job__error(j, w->rc, "starting the job on cleared embedding servers: %s", w->err);
    } else {
      if (!w->empty) log_info("embedding servers cleared (--fresh); the job starts at iteration 0 job_id=%s", j->job_id);
      begin(j);
    }
    break;
  case W_RESUME: {
    if (w->rc) {
      /* the servers are as they were (unless the message says otherwise): held again */
      char why[1200];
      snprintf(why, sizeof why, "resume refused: %.1150s", w->err);
      hold(j, why);
      break;
    }
    ostate_t *o = malloc(sizeof *o);
    char err[1024];
    int rc = o ? oracle_state_decode(w->ostate, w->ostate_len, o, err, sizeof err) : -ENOMEM;
    if (!rc) rc = oracle_state_apply(j, o, err, sizeof err);
    free(o);
    if (rc) {
      oracle_job__error(j, rc, "resuming from checkpoint %s: %s", w->m.id, err);
      break;
    }
    if (w->warn[0]) {
      log_warn("resume: %s", w->warn);
      oracle_fetch__warn(j, w->warn);
    }
    ck->resumed = 1;
    snprintf(ck->resume_id, sizeof ck->resume_id, "%s", w->m.id);
    log_info("resumed job_id=%s from checkpoint=%s: the model after iteration %" PRIu64 "; going on at %" PRIu64,
             j->job_id, w->m.id, w->m.iteration, w->m.iteration + 1);
    begin(j);
    break;
  }
  case W_SERVERS: {
    oracle_cp_t *cp = w->cp;
    cp->running = 0;
    if (w->rc) {
      oracle_job__error(j, w->rc,
                        "checkpoint %s (after iteration %" PRIu64 ") failed: %s; it is not listed as complete, and "
                        "a resume uses the last complete one",
                        cp->id, cp->iteration, w->err);
      break;
    }
    double now = oracle_job__now();
    oracle_cp_report_t *r = &ck->last;
    snprintf(r->id, sizeof r->id, "%s", cp->id);
    r->iteration = cp->iteration;
    r->rows_flushed = cp->rows_flushed;
    r->dense_bytes = cp->dense_bytes;
    r->stall = now - (cp->t_reported ? cp->t_reported : cp->t_first_sent);
    r->total = now - cp->t_first_sent;
    r->server_secs = w->secs;
    r->unix_time = (double)time(NULL);
    r->bytes_total = 0;
    for (uint32_t s = 0; s < ck->S; s++) r->bytes_total += (r->bytes[s] = w->bytes[s]);
    ck->n_done++;
    ck->stall_sum += r->stall;
    ck->total_sum += r->total;
    metrics_counter_inc(ck->m_count);
    metrics_gauge_set(ck->m_stall, r->stall);
    metrics_gauge_set(ck->m_total, r->total);
    metrics_gauge_set(ck->m_bytes, (double)r->bytes_total);
    metrics_gauge_set(ck->m_iteration, (double)(r->iteration + 1));
    log_info("checkpoint complete id=%s iteration=%" PRIu64 " stall_ms=%.1f total_ms=%.1f servers_ms=%.1f "
             "rows_flushed=%" PRIu64 " dense_bytes=%" PRIu64 " bytes=%" PRIu64 " servers=%u%s%s",
             cp->id, cp->iteration, 1e3 * r->stall, 1e3 * r->total, 1e3 * w->secs, cp->rows_flushed, cp->dense_bytes,
             r->bytes_total, ck->S, w->pruned[0] ? " removed=" : "", w->pruned);
    ck->head = cp->next;
    if (!ck->head) ck->tail = NULL;
    cp_free(cp, j->P);
    break;
  }
  }
out:
  free(w->ostate);
  free(w->oblob);
  free(w->bytes);
  free(w);
  oracle_job__advance(j);
}

static int queue(oracle_job_t *j, ck_work_t *w) {
  w->req.data = w;
  w->j = j;
  manifest_of_job(j, &w->job);
  int rc = uv_queue_work(j->loop, &w->req, ck_work, ck_done);
  if (rc) return rc;
  j->ckpt.running++;
  return 0;
}

/* Training begins at ckpt.start (every trainer still attached: else the
 * job waits for them again, and their return checks the servers anew). */
static void begin(oracle_job_t *j) {
  if (j->attached < j->P) {
    j->state = ORACLE_WAITING;
    metrics_gauge_set(j->m.state, j->state);
    snprintf(j->message, sizeof j->message, "a trainer left before the start; waiting for %u of %u", j->P - j->attached,
             j->P);
    log_warn("%s", j->message);
    return;
  }
  j->message[0] = 0;
  oracle_job__begin(j);
}

void oracle_ckpt__attached(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled) {
    begin(j);
    return;
  }
  ck_work_t *w = calloc(1, sizeof *w);
  if (!w) {
    oracle_job__error(j, -ENOMEM, "out of memory starting the job");
    return;
  }
  w->kind = W_PREFLIGHT;
  if (queue(j, w)) {
    free(w);
    oracle_job__error(j, -EIO, "cannot queue the check of the embedding servers");
    return;
  }
  ck->start_pending = 1;
  snprintf(j->message, sizeof j->message, "checking the embedding servers");
}

int oracle_job_start_request(oracle_job_t *j, const char *resume, int fresh, char *msg, size_t msg_len) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job has no embedding servers to resume or clear (mode = ideal, or cluster.embedding is empty)");
  if (j->state != ORACLE_HELD) {
    if (j->state == ORACLE_WAITING)
      return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is waiting (%s); ask again once it is held",
                     j->message[0] ? j->message : "for its trainers");
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s, not held: %s%s", oracle_state_name(j->state),
                   j->ckpt.resumed ? "it was resumed from " : (j->state == ORACLE_TRAINING ? "it started at iteration 0 on empty servers" : ""),
                   j->ckpt.resumed ? j->ckpt.resume_id : "");
  }
  ck_work_t *w = calloc(1, sizeof *w);
  if (!w) return err_set(msg, msg_len, -ENOMEM, "out of memory");
  w->kind = fresh ? W_FRESH : W_RESUME;
  snprintf(w->want, sizeof w->want, "%s", resume && *resume ? resume : "latest");
  if (queue(j, w)) {
    free(w);
    return err_set(msg, msg_len, -EIO, "cannot queue the start");
  }
  j->state = ORACLE_WAITING;
  metrics_gauge_set(j->m.state, j->state);
  if (fresh) snprintf(j->message, sizeof j->message, "clearing the embedding servers (--fresh)");
  else snprintf(j->message, sizeof j->message, "restoring checkpoint %s", w->want);
  snprintf(msg, msg_len, "%s", j->message);
  log_info("start requested: %s", j->message);
  return 0;
}

int oracle_job_checkpoint_request(oracle_job_t *j, char *id, size_t id_len, uint64_t *iteration, char *msg,
                                  size_t msg_len) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job takes no checkpoints (mode = ideal, or cluster.embedding is empty)");
  if (j->state != ORACLE_TRAINING)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s; checkpoints are taken while it trains",
                   oracle_state_name(j->state));
  uint64_t x = j->pipe.next; /* the next batch whose planning is queued */
  if (x >= j->iterations) x = j->iterations - 1; /* the end's checkpoint, already due */
  else if (ck->asap_at == UINT64_MAX || ck->asap_at < x) ck->asap_at = x;
  else x = ck->asap_at;
  *iteration = x;
  snprintf(id, id_len, "%.60s-%012" PRIu64, j->job_id, x + 1);
  log_info("checkpoint requested: it will hold the model after iteration %" PRIu64 " id=%s", x, id);
  return 0;
}

int oracle_ckpt__wanted(oracle_job_t *j, uint64_t x) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled) return 0;
  int want = x + 1 == j->iterations || (ck->every && (x + 1) % ck->every == 0) || x == ck->asap_at;
  double now = oracle_job__now();
  if (!want && ck->seconds && now - ck->t_last >= (double)ck->seconds) want = 1;
  if (want) {
    ck->t_last = now;
    if (x == ck->asap_at) ck->asap_at = UINT64_MAX;
  }
  return want;
}

int oracle_ckpt__decided(oracle_job_t *j, oracle_entry_t *s, cacher_t *cache) {
  oracle_ckpt_t *ck = &j->ckpt;
  oracle_cp_t *cp = calloc(1, sizeof *cp);
  if (!cp || !(cp->flush = calloc(j->P, sizeof *cp->flush)) || !(cp->sent = calloc(j->P, 1))) {
    cp_free(cp, j->P);
    return oracle_job__error(j, -ENOMEM, "out of memory for the checkpoint after batch %llu",
                             (unsigned long long)s->iteration);
  }
  int rc = cacher_flush(cache, cp->flush);
  if (rc) {
    free(cp->flush);
    cp->flush = NULL;
    cp_free(cp, j->P);
    return oracle_job__error(j, rc, "listing the cached rows for the checkpoint after batch %llu: %s",
                             (unsigned long long)s->iteration, err_str(rc));
  }
  cp->iteration = s->iteration;
  snprintf(cp->id, sizeof cp->id, "%.60s-%012" PRIu64, j->job_id, s->iteration + 1);
  cp->laia_state = s->laia_state;
  cp->laia_len = s->laia_len;
  s->laia_state = NULL;
  s->laia_len = 0;
  for (uint32_t p = 0; p < j->P; p++) cp->rows_flushed += cp->flush[p].n;
  if (ck->tail) ck->tail->next = cp;
  else ck->head = cp;
  ck->tail = cp;
  return 0;
}

static int send_checkpoint(oracle_job_t *j, uint32_t p, oracle_cp_t *cp) {
  Chanter__Oracle__V1__CheckpointWork cw = CHANTER__ORACLE__V1__CHECKPOINT_WORK__INIT;
  char blob[160];
  snprintf(blob, sizeof blob, "ckpt.%s.dense", cp->id);
  cw.id = cp->id;
  cw.iteration = cp->iteration;
  cw.flush_keys.data = (uint8_t *)cp->flush[p].keys;
  cw.flush_keys.len = cp->flush[p].n * sizeof(uint64_t);
  cw.flush_slots.data = (uint8_t *)cp->flush[p].slots;
  cw.flush_slots.len = cp->flush[p].n * sizeof(uint32_t);
  cw.dense_blob = p == 0 ? blob : "";
  cw.dense_server = 0;
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_CHECKPOINT;
  w.checkpoint = &cw;
  return rpc_call_send(j->tr[p].call, &w.base);
}

static int send_resume(oracle_job_t *j, uint32_t p) {
  Chanter__Oracle__V1__ResumeWork rw = CHANTER__ORACLE__V1__RESUME_WORK__INIT;
  char blob[160];
  snprintf(blob, sizeof blob, "ckpt.%s.dense", j->ckpt.resume_id);
  rw.id = j->ckpt.resume_id;
  rw.start_iteration = j->ckpt.start;
  rw.dense_blob = blob;
  rw.dense_server = 0;
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_RESUME;
  w.resume = &rw;
  return rpc_call_send(j->tr[p].call, &w.base);
}

int oracle_ckpt__dispatch(oracle_job_t *j, uint32_t p, uint64_t x) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (ck->resumed && !ck->resume_sent[p]) {
    if (send_resume(j, p) != 0) return -1;
    ck->resume_sent[p] = 1;
    return 1;
  }
  oracle_cp_t *cp = ck->head;
  if (!cp || x <= cp->iteration) return 0; /* Step x comes before the oldest checkpoint's */
  if (!cp->sent[p]) {
    if (send_checkpoint(j, p, cp) != 0) return -1;
    cp->sent[p] = 1;
    if (cp->t_first_sent == 0) cp->t_first_sent = oracle_job__now();
    return 1;
  }
  return -1; /* Step c + 1 waits for the checkpoint of c */
}

int oracle_ckpt__message(oracle_job_t *j, uint32_t p, const Chanter__Oracle__V1__CheckpointDone *m, char *why,
                         size_t why_len) {
  oracle_cp_t *cp = j->ckpt.head;
  if (!cp || !cp->sent[p] || strcmp(m->id ? m->id : "", cp->id)) {
    snprintf(why, why_len, "CheckpointDone for %s, which is not the checkpoint this rank was asked for (%s)",
             m->id ? m->id : "(none)", cp && cp->sent[p] ? cp->id : "none");
    return -EINVAL;
  }
  cp->acks++;
  cp->dense_bytes += m->dense_bytes;
  if (cp->acks == j->P) cp->t_acked = oracle_job__now();
  return 0;
}

int oracle_ckpt__run(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  oracle_cp_t *cp = ck->head;
  if (cp && !cp->t_reported && j->report.done > cp->iteration) cp->t_reported = oracle_job__now();
  if (!cp || cp->running || cp->acks < j->P) return 0;
  /* the evaluations due after c are scored: the oracle's state holds them */
  oracle_report_t *rp = &j->report;
  if (rp->evals_running || rp->evals_done < oracle_report__rounds_upto(j, cp->iteration)) return 0;
  ck_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->bytes = calloc(ck->S, sizeof *w->bytes))) {
    free(w);
    return oracle_job__error(j, -ENOMEM, "out of memory for checkpoint %s", cp->id);
  }
  int rc = oracle_state_encode(j, cp, &w->oblob, &w->oblob_len);
  if (rc) {
    free(w->bytes);
    free(w);
    return oracle_job__error(j, rc, "out of memory encoding the oracle's state for checkpoint %s", cp->id);
  }
  w->kind = W_SERVERS;
  w->cp = cp;
  if ((rc = queue(j, w)) != 0) {
    free(w->oblob);
    free(w->bytes);
    free(w);
    return oracle_job__error(j, rc, "cannot queue checkpoint %s", cp->id);
  }
  cp->running = 1;
  return 0;
}

int oracle_ckpt__busy(const oracle_job_t *j) { return j->ckpt.head != NULL; }

void oracle_ckpt__summary(const oracle_job_t *j, char *out, size_t cap) {
  const oracle_ckpt_t *ck = &j->ckpt;
  const oracle_cp_report_t *r = &ck->last;
  size_t o = (size_t)snprintf(out, cap, "\"checkpoints\": %llu, ", (unsigned long long)ck->n_done);
  if (o < cap)
    o += (size_t)snprintf(out + o, cap - o, "\"resumed_from\": \"%s\", \"start_iteration\": %llu, ", ck->resume_id,
                          (unsigned long long)ck->start);
  if (!r->id[0]) {
    if (o < cap) snprintf(out + o, cap - o, "\"checkpoint\": null");
    return;
  }
  if (o < cap)
    o += (size_t)snprintf(out + o, cap - o,
                          "\"checkpoint\": {\"id\": \"%s\", \"iteration\": %llu, \"stall_seconds\": %.6f, "
                          "\"total_seconds\": %.6f, \"servers_seconds\": %.6f, \"rows_flushed\": %llu, "
                          "\"dense_bytes\": %llu, \"bytes\": %llu, \"bytes_per_server\": [",
                          r->id, (unsigned long long)r->iteration, r->stall, r->total, r->server_secs,
                          (unsigned long long)r->rows_flushed, (unsigned long long)r->dense_bytes,
                          (unsigned long long)r->bytes_total);
  for (uint32_t s = 0; s < ck->S && o < cap; s++)
    o += (size_t)snprintf(out + o, cap - o, "%s%llu", s ? ", " : "", (unsigned long long)r->bytes[s]);
  if (o < cap)
    snprintf(out + o, cap - o, "], \"stall_seconds_mean\": %.6f, \"total_seconds_mean\": %.6f}",
             ck->n_done ? ck->stall_sum / (double)ck->n_done : 0.0, ck->n_done ? ck->total_sum / (double)ck->n_done : 0.0);
}

int oracle_ckpt__init(oracle_job_t *j, metrics_registry_t *reg, char *err, size_t err_len) {
  oracle_ckpt_t *ck = &j->ckpt;
  const cfg_t *cfg = j->cfg;
  ck->open = 1;
  ck->asap_at = UINT64_MAX;
  ck->every = (uint64_t)cfg_int(cfg, "checkpoint_every");
  ck->seconds = (uint64_t)cfg_int(cfg, "checkpoint_seconds");
  ck->keep = (uint64_t)cfg_int(cfg, "checkpoint_keep");
  ck->state_dir = cfg_str(cfg, "oracle.state_dir");
  ck->t_last = oracle_job__now();
  if (!(ck->resume_sent = calloc(j->P, 1))) return -ENOMEM;
  data_schema_t sc;
  table_layout_t lay;
  int rc = data_schema_from_cfg(cfg, &sc, err, err_len);
  if (rc) return rc;
  g_schema_hash = dpc_schema_hash(&sc);
  data_schema_close(&sc);
  if ((rc = cfg_layout(cfg, &lay, err, err_len)) != 0) return rc;
  g_layout_hash = table_layout_hash(&lay);
  table_layout_close(&lay);
  char **hosts = NULL;
  size_t n_hosts = 0;
  if (cfg_list(cfg, "cluster.embedding", &hosts, &n_hosts) == 0) cfg_list_free(hosts, n_hosts);
  if (!j->ideal && n_hosts > 0) {
    if ((rc = embc_create(cfg, &ck->embc, err, err_len)) != 0) return rc;
    ck->S = embc_servers(ck->embc);
    ck->enabled = 1;
    if (!(ck->last.bytes = calloc(ck->S, sizeof *ck->last.bytes))) return -ENOMEM;
  } else {
    log_info("checkpoints off: %s", j->ideal ? "mode = ideal keeps every row in the trainers" : "cluster.embedding is empty");
  }
  ck->m_count = metrics_counter(reg, "checkpoints_total", NULL, "whole-job checkpoints completed");
  ck->m_stall = metrics_gauge(reg, "checkpoint_stall_seconds", NULL,
                              "the last checkpoint: training held from its first item to its end");
  ck->m_total = metrics_gauge(reg, "checkpoint_seconds", NULL, "the last checkpoint: time it took in all");
  ck->m_bytes = metrics_gauge(reg, "checkpoint_bytes", NULL, "the last checkpoint: bytes on all servers");
  ck->m_iteration = metrics_gauge(reg, "checkpoint_iteration", NULL, "the last checkpoint: iterations it holds");
  return 0;
}

void oracle_ckpt__close(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->open) return;
  while (ck->head) {
    oracle_cp_t *cp = ck->head;
    ck->head = cp->next;
    cp_free(cp, j->P);
  }
  embc_destroy(ck->embc);
  free(ck->resume_sent);
  free(ck->last.bytes);
  ck->open = 0;
}
