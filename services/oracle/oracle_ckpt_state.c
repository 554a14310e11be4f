/*
 * oracle_ckpt_state: what a checkpoint says about the job (oracle_ckpt.c
 * has the whole story): the job's fingerprint as a manifest and the check
 * of a checkpoint's manifest against it (a resume refused with the field
 * that differs), and the oracle's own state -- c, the evaluation record,
 * the summary's counters, laia -- as a blob ("CHORACLV" and a u32
 * version first, little-endian, SHA-256 trailer), decoded back into an
 * oracle_ostate_t that every stage restores its own part of
 * (oracle_<stage>__restore) to go on at c + 1.  A blob of another version is refused naming both versions;
 * version 1 is the unversioned layout older chanters wrote ("CHORACL1",
 * then the same fields), told apart by its magic and still read.  Loop
 * thread, except the pure codecs, which the worker pool may call.
 */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "le.h"
#include "log.h"
#include "manifest.h"
#include "oracle_job_internal.h"
#include "table.h"
#include "strategy.h"

#define ORACLE_MAGIC "CHORACLV"        /* then the version, u32 */
#define ORACLE_MAGIC_V1 "CHORACL1"     /* version 1: no version field, the fields at once */
/* The layout after the header; a change of it (a field added, moved or
 * reinterpreted) takes a new version, and the decoder refuses the others. */
#define ORACLE_STATE_VERSION 2u

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
  put_le64(x, v);
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
  uint64_t v = get_le64(b->p + b->off);
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


/* ------------------------------------------------------------ the manifest (manifest.h) */

static void model_shape(const cfg_t *cfg, char *out, size_t n) {
  snprintf(out, n, "bottom_mlp=%s;top_mlp=%s;deep_mlp=%s;cross_layers=%lld;n_dense=%lld", cfg_str(cfg, "model.bottom_mlp"),
           cfg_str(cfg, "model.top_mlp"), cfg_str(cfg, "model.deep_mlp"), (long long)cfg_int(cfg, "model.cross_layers"),
           (long long)cfg_int(cfg, "n_dense"));
  /* appended only when set, so that the shapes of checkpoints written before
   * the key existed read the same */
  size_t o = strlen(out);
  if (cfg_int(cfg, "model.cross_rank") && o < n)
    snprintf(out + o, n - o, ";cross_rank=%lld", (long long)cfg_int(cfg, "model.cross_rank"));
}


/* This job's fingerprint as a manifest (the per-checkpoint fields empty). */
void oracle_ckpt__job_manifest(const oracle_job_t *j, manifest_t *m) {
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
  m->layout_hash = j->ckpt.layout_hash;
  m->schema_hash = j->ckpt.schema_hash;
  m->seed = j->seed;
  m->batch_size = j->B;
  m->trainers = j->P;
  m->servers = j->ckpt.S;
  m->iterations = j->iterations;
  m->cache_rows = j->pipe.cache_rows;
  snprintf(m->shard_rule, sizeof m->shard_rule, "%s", cfg_str(cfg, "shard.rule"));
}

/* Refuses a checkpoint this job cannot go on from, naming the field;
 * warns (into warn) for changes that keep the model only up to summation
 * order.  0 or ERR_CONFIG. */
int oracle_ckpt__check_manifest(const oracle_job_t *j, const manifest_t *m, char *err, size_t err_len, char *warn,
                          size_t warn_len) {
  manifest_t me;
  oracle_ckpt__job_manifest(j, &me);
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
  if (m->layout_hash != j->ckpt.layout_hash)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s is of another table layout (table_rows, embedding_dim, table_dims or "
                   "embedding_optimizer: layout hash %016" PRIx64 ", this job's %016" PRIx64
                   "); resume it with the job file it was taken with, or start over with --fresh",
                   id, m->layout_hash, j->ckpt.layout_hash);
  if (m->schema_hash != j->ckpt.schema_hash)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s is of another data schema (n_dense, table_hotness: schema hash %016" PRIx64
                   ", this job's %016" PRIx64 "); resume it with the job file it was taken with, or start over with "
                   "--fresh",
                   id, m->schema_hash, j->ckpt.schema_hash);
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
                   ": it must be resharded first, which `chanter train --resume` does when it can read the old "
                   "servers' data dirs (--old-data-dirs PATTERN; with --workdir W it looks in W/embedding-%%i)",
                   id, m->servers, me.servers);
  if (strcmp(m->shard_rule, me.shard_rule) && m->servers > 1)
    return err_set(err, err_len, ERR_CONFIG,
                   "checkpoint %s placed its rows on its servers by shard.rule = %s, and this job by %s: the rows "
                   "would be looked for on other servers; set shard.rule = %s to resume it",
                   id, m->shard_rule, me.shard_rule, m->shard_rule);
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
int oracle_ckpt__state_encode(const oracle_job_t *j, const oracle_cp_t *cp, uint8_t **out, size_t *len) {
  const oracle_report_t *rp = &j->report;
  const oracle_pipe_t *pp = &j->pipe;
  bw_t b = {0};
  uint8_t ver[4];
  put_le32(ver, ORACLE_STATE_VERSION);
  bw_put(&b, ORACLE_MAGIC, 8);
  bw_put(&b, ver, 4);
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
  /* the tables' strategies as chosen (table_strategy = auto): a resumed or
   * recovered job keeps them, and so the model's bits */
  bw_u64(&b, j->strat_pending ? 0 : j->n_tables);
  for (uint32_t t = 0; !j->strat_pending && t < j->n_tables; t++) {
    uint32_t o = j->partition_owner[t];
    bw_u64(&b, o == STRATEGY_OWNER_NONE ? STRATEGY_CACHE : o == STRATEGY_OWNER_ALL ? STRATEGY_PARTITION_ROWS : STRATEGY_PARTITION);
  }
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

static int oracle_state_decode(const uint8_t *p, size_t n, oracle_ostate_t *o, char *err, size_t err_len) {
  memset(o, 0, sizeof *o);
  size_t hdr;
  if (n >= 8 && !memcmp(p, ORACLE_MAGIC_V1, 8)) {
    hdr = 8; /* version 1: the same fields, no version */
  } else if (n >= 8 && !memcmp(p, ORACLE_MAGIC, 8)) {
    if (n < 12)
      return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob is truncated: %zu bytes, not even its version",
                     n);
    /* before the checksum: another version may end otherwise */
    uint32_t v = get_le32(p + 8);
    if (v != ORACLE_STATE_VERSION)
      return err_set(err, err_len, ERR_CONFIG,
                     "the oracle's state blob is version %" PRIu32 " and this chanter reads version %u (and the "
                     "unversioned version 1): the checkpoint was written by another chanter; resume it with that "
                     "one, or start over with --fresh",
                     v, ORACLE_STATE_VERSION);
    hdr = 12;
  } else {
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob (%zu bytes) is not one chanter wrote", n);
  }
  if (n < hdr + 32)
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob is truncated: %zu bytes, less than its checksum",
                   n);
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(p, n - 32, h, &hl, EVP_sha256(), NULL);
  if (memcmp(h, p + n - 32, 32))
    return err_set(err, err_len, ERR_BADMSG,
                   "the oracle's state blob is damaged or truncated (%zu bytes): its SHA-256 does not match", n);
  br_t b = {.p = p, .n = n - 32, .off = hdr};
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
  o->n_strat = br_u64(&b);
  if (o->n_strat > TABLE_MAX) b.bad = 1;
  for (uint64_t t = 0; t < o->n_strat && !b.bad; t++) { /* 0 cache, 1 partition, 3 partition_rows */
    uint64_t v = br_u64(&b);
    if (v != STRATEGY_CACHE && v != STRATEGY_PARTITION && v != STRATEGY_PARTITION_ROWS) b.bad = 1;
    o->strat[t] = (uint8_t)v;
  }
  if (b.bad || b.off != b.n)
    return err_set(err, err_len, ERR_BADMSG, "the oracle's state blob is malformed (at byte %zu of %zu)", b.off, n);
  return 0;
}

/* Puts the decoded state into the job: every stage restores its own part
 * and starts at c + 1 (laia first: the one that may refuse, before
 * anything changed). */
static int state_apply(oracle_job_t *j, const oracle_ostate_t *o, char *err, size_t err_len) {
  int rc = oracle_pipeline__restore(j, o, err, err_len);
  if (rc) return rc;
  oracle_fetch__restore(j, o);
  oracle_dispatch__restore(j, o);
  oracle_report__restore(j, o);
  oracle_ckpt__restore(j, o);
  return oracle_job__strategy_restore(j, o, err, err_len);
}

int oracle_ckpt__state_load(oracle_job_t *j, const uint8_t *p, size_t n, char *err, size_t err_len) {
  oracle_ostate_t *o = malloc(sizeof *o);
  if (!o) return err_set(err, err_len, -ENOMEM, "out of memory reading the oracle's state");
  int rc = oracle_state_decode(p, n, o, err, err_len);
  if (!rc) rc = state_apply(j, o, err, err_len);
  free(o);
  return rc;
}
