/*
 * The per-step math of chanter-trainer (services/trainer/trainer_step.h)
 * without daemons, against a single-process reference that is the
 * arithmetic of `chanter train --local` (tools/chanter/cmd_train.c: tables
 * in memory initialized with table_init_row, gather, forward, backward with
 * scale 1/B, dense optimizer, per-table coalesced row gradients and the row
 * optimizer), on a tiny DLRM with a multi-hot table, Adagrad on the dense
 * parameters and on the rows, several steps.
 *
 *  - P = 1: fetch every key of the batch, no shared rows, write every row
 *    back: dense parameters and every table row BIT-identical to the
 *    reference.
 *  - P = 2, one trainer with all the samples and one with none: the empty
 *    trainer contributes exact zeros, so again bit-identical.
 *  - P = 2, the batch split as the oracle's contiguous allocation does, in
 *    one process: dense gradients and the shared rows' gradients summed by
 *    hand in the collective's order (for two ranks Gloo's ring adds x0 + x1,
 *    one correctly rounded add: coll.h), owned rows kept local, each
 *    trainer writing back its own rows and half of the shared ones.  Both
 *    trainers end with bit-identical dense parameters and shared rows, and
 *    the result equals the single trainer's within |a - b| <= 1e-5 (values
 *    O(0.1..1); summation order changes rounding by ~1e-7 per step and
 *    Adagrad's g / sqrt(h) keeps that small).
 *  - the same P = 2 step over a real Gloo group (two threads, the
 *    file-backed rendezvous store) is bit-identical to the hand-summed one.
 *  - errors: a sample row that was not fetched, unsorted fetch keys, a
 *    sync key that is not a slot, malformed Samples.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfg.h"
#include "coll.h"
#include "data.h"
#include "err.h"
#include "model.h"
#include "nn.h"
#include "opt.h"
#include "table.h"
#include "trainer_ckpt.h"
#include "trainer_rows.h"
#include "trainer_step.h"
#include "trainer_work.h"

#define B 8     /* global batch */
#define STEPS 4
#define TOL 1e-5

/* ------------------------------------------------------------------ the job */

typedef struct job_s {
  cfg_t *cfg;
  data_schema_t schema;
  table_layout_t layout;
} job_t;

static void job_open(job_t *j) {
  static const char *sets[] = {
      "model=dlrm",          "n_dense=3",         "table_rows=7,5,9",        "table_hotness=1,2,1",
      "embedding_dim=4",     "model.bottom_mlp=8", "model.top_mlp=8",          "batch_size=8",
      "seed=7",              "optimizer=adagrad", "embedding_optimizer=adagrad", "learning_rate=0.1",
  };
  char err[512];
  assert_int_equal(cfg_create(&j->cfg), 0);
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    if (cfg_set(j->cfg, sets[i], "test", err, sizeof err)) fail_msg("cfg_set %s: %s", sets[i], err);
  if (data_schema_from_cfg(j->cfg, &j->schema, err, sizeof err)) fail_msg("schema: %s", err);
  if (cfg_layout(j->cfg, &j->layout, err, sizeof err)) fail_msg("layout: %s", err);
}

static void job_close(job_t *j) {
  data_schema_close(&j->schema);
  table_layout_close(&j->layout);
  cfg_destroy(j->cfg);
}

/* ------------------------------------------------------------------ batches */

typedef struct batch_s {
  uint32_t n;
  float labels[B], dense[B * 3];
  uint64_t ids[B * 4]; /* hotness 1 + 2 + 1 */
  size_t ids_off[4];
  data_batch_t view;
} batch_t;

static void batch_view(const job_t *j, batch_t *b) {
  b->ids_off[0] = 0;
  for (uint32_t t = 0; t < 3; t++) b->ids_off[t + 1] = b->ids_off[t] + (size_t)b->n * j->schema.hotness[t];
  b->view = (data_batch_t){.n = b->n, .n_dense = 3, .n_tables = 3, .hotness = j->schema.hotness, .labels = b->labels,
                           .dense = b->dense, .ids = b->ids, .ids_off = b->ids_off};
}

/* Batch x: skewed row ids (many repeats, so trainers share rows). */
static void make_batch(const job_t *j, uint64_t x, batch_t *b) {
  memset(b, 0, sizeof *b);
  b->n = B;
  batch_view(j, b);
  uint64_t s = table_mix64(1000 + x);
  for (uint32_t i = 0; i < B; i++) {
    s = table_mix64(s);
    b->labels[i] = (float)(s & 1);
    for (int d = 0; d < 3; d++) {
      s = table_mix64(s);
      b->dense[i * 3 + d] = (float)((double)(s >> 40) / 16777216.0);
    }
  }
  for (uint32_t t = 0; t < 3; t++)
    for (size_t k = b->ids_off[t]; k < b->ids_off[t + 1]; k++) {
      s = table_mix64(s);
      uint64_t r = s % j->layout.tables[t].rows;
      b->ids[k] = (s >> 32) % 3 ? r % 3 : r; /* 2/3 of the ids hit rows 0..2 */
    }
}

/* Samples [i0, i0 + m) of full. */
static void sub_batch(const job_t *j, const batch_t *full, uint32_t i0, uint32_t m, batch_t *out) {
  memset(out, 0, sizeof *out);
  out->n = m;
  batch_view(j, out);
  memcpy(out->labels, full->labels + i0, m * sizeof(float));
  memcpy(out->dense, full->dense + i0 * 3, m * 3 * sizeof(float));
  for (uint32_t t = 0; t < 3; t++) {
    uint32_t h = j->schema.hotness[t];
    memcpy(out->ids + out->ids_off[t], full->ids + full->ids_off[t] + (size_t)i0 * h, (size_t)m * h * 8);
  }
}

/* ------------------------------------------------------------------ the tables ("embedding servers") */

typedef struct tables_s {
  float *t[3];
  uint32_t rf;
} tables_t;

static void tables_init(const job_t *j, tables_t *s) {
  s->rf = table_row_floats(&j->layout, 0);
  for (uint32_t t = 0; t < 3; t++) {
    s->t[t] = malloc(j->layout.tables[t].rows * s->rf * sizeof(float));
    for (uint64_t r = 0; r < j->layout.tables[t].rows; r++)
      table_init_row(&j->layout, TABLE_KEY(t, r), s->t[t] + r * s->rf);
  }
}
static void tables_close(tables_t *s) {
  for (int t = 0; t < 3; t++) free(s->t[t]);
}
static float *row_ptr(tables_t *s, uint64_t key) { return s->t[TABLE_ID(key)] + TABLE_ROW(key) * s->rf; }
static void lookup(tables_t *s, const uint64_t *keys, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) memcpy(out + i * s->rf, row_ptr(s, keys[i]), s->rf * sizeof(float));
}
static void write_back(tables_t *s, const uint64_t *keys, size_t n, const float *rows) {
  for (size_t i = 0; i < n; i++) memcpy(row_ptr(s, keys[i]), rows + i * s->rf, s->rf * sizeof(float));
}

/* ------------------------------------------------------------------ the reference: train --local's step */

typedef struct ref_s {
  model_t *model;
  opt_t *opt;
  opt_kind_t kind;
  opt_hparams_t hp;
  tables_t tab;
  float emb[B * 12], d_emb[B * 12], logits[B], grad[B * 2 * 4];
  uint64_t uniq[B * 2];
  void *work;
} ref_t;

static void ref_open(const job_t *j, ref_t *r) {
  char err[512];
  memset(r, 0, sizeof *r);
  if (model_create(j->cfg, 3, 3, 4, B, &r->model, err, sizeof err)) fail_msg("model: %s", err);
  model_init(r->model, 7);
  assert_int_equal(opt_create(j->cfg, model_n_params(r->model), &r->opt), 0);
  assert_int_equal(opt_kind_parse("adagrad", &r->kind), 0);
  opt_hparams_from_cfg(j->cfg, r->kind, &r->hp);
  tables_init(j, &r->tab);
  r->work = malloc(nn_embedding_bag_bwd_work_size(B, 2));
}

static void ref_close(ref_t *r) {
  model_destroy(r->model);
  opt_destroy(r->opt);
  tables_close(&r->tab);
  free(r->work);
}

static double ref_step(const job_t *j, ref_t *r, const batch_t *b) {
  size_t width = 12;
  for (uint32_t t = 0; t < 3; t++)
    nn_embedding_bag_fwd(r->tab.t[t], r->tab.rf, b->ids + b->ids_off[t], b->n, j->schema.hotness[t], 4, r->emb + t * 4,
                         width);
  model_forward(r->model, b->n, b->dense, r->emb, r->logits);
  double loss = model_backward(r->model, b->n, b->labels, 1.0f / (float)b->n, r->d_emb);
  opt_step(r->opt, model_params(r->model), model_grads(r->model));
  for (uint32_t t = 0; t < 3; t++) {
    uint32_t u = nn_embedding_bag_bwd(r->d_emb + t * 4, width, b->ids + b->ids_off[t], b->n, j->schema.hotness[t], 4,
                                      r->uniq, r->grad, 4, r->work);
    for (uint32_t k = 0; k < u; k++)
      opt_row_update(r->kind, &r->hp, r->tab.t[t] + r->uniq[k] * r->tab.rf, 4, r->grad + k * 4);
  }
  return loss;
}

/* ------------------------------------------------------------------ helpers */

static trainer_step_t *new_trainer(const job_t *j) {
  trainer_step_t *ts = NULL;
  char err[512];
  if (trainer_step_create(j->cfg, &j->schema, &j->layout, B, &ts, err, sizeof err)) fail_msg("trainer_step_create: %s", err);
  return ts;
}

/* sorted unique keys of b into keys (returns the count) */
static size_t keys_of(trainer_step_t *ts, const batch_t *b, uint64_t *keys) {
  const uint64_t *k;
  size_t n;
  assert_int_equal(trainer_step_batch_keys(ts, &b->view, &k, &n), 0);
  memcpy(keys, k, n * 8);
  return n;
}

/* fetch keys into the trainer from the tables */
static void fetch(trainer_step_t *ts, tables_t *tab, const uint64_t *keys, size_t n) {
  float *rows;
  char err[512];
  if (trainer_step_set_keys(ts, keys, n, &rows, err, sizeof err)) fail_msg("set_keys: %s", err);
  lookup(tab, trainer_step_keys(ts), n, rows);
}

static double max_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d > m || d != d) m = d != d ? INFINITY : d;
  }
  return m;
}

static void check_tables(const job_t *j, tables_t *got, tables_t *want, double tol) {
  for (uint32_t t = 0; t < 3; t++) {
    size_t n = j->layout.tables[t].rows * got->rf;
    if (tol == 0) {
      if (memcmp(got->t[t], want->t[t], n * sizeof(float)) != 0) fail_msg("table %u differs from the reference", t);
    } else {
      double d = max_diff(got->t[t], want->t[t], n);
      if (d > tol) fail_msg("table %u: max |difference| %.3g > %.3g", t, d, tol);
    }
  }
}

/* ------------------------------------------------------------------ P = 1 */

static void test_p1_exact(void **state) {
  (void)state;
  job_t j;
  job_open(&j);
  ref_t r;
  ref_open(&j, &r);
  tables_t srv;
  tables_init(&j, &srv);
  trainer_step_t *ts = new_trainer(&j);
  assert_memory_equal(model_params(trainer_step_model(ts)), model_params(r.model), model_n_params(r.model) * sizeof(float));
  char err[512];
  for (uint64_t x = 0; x < STEPS; x++) {
    batch_t b;
    make_batch(&j, x, &b);
    uint64_t keys[B * 4];
    size_t nk = keys_of(ts, &b, keys);
    fetch(ts, &srv, keys, nk);
    if (trainer_step_forward(ts, &b.view, err, sizeof err)) fail_msg("forward: %s", err);
    double loss = trainer_step_backward(ts, &b.view, B);
    /* all-reduce over one trainer: nothing; no shared rows */
    assert_int_equal(trainer_step_update(ts), nk);
    write_back(&srv, keys, nk, trainer_step_key_rows(ts)); /* the rows are the keys', in order */

    double rloss = ref_step(&j, &r, &b);
    assert_true(loss == rloss);
    assert_memory_equal(trainer_step_logits(ts), r.logits, B * sizeof(float));
    assert_memory_equal(model_params(trainer_step_model(ts)), model_params(r.model), model_n_params(r.model) * sizeof(float));
    check_tables(&j, &srv, &r.tab, 0);
  }
  /* the dense digest is SHA-256 of exactly these bytes */
  uint8_t h1[32], h2[32];
  trainer_step_dense_sha256(ts, h1);
  trainer_step_dense_sha256(ts, h2);
  assert_memory_equal(h1, h2, 32);
  trainer_step_destroy(ts);
  tables_close(&srv);
  ref_close(&r);
  job_close(&j);
}

/* ------------------------------------------------------------------ P = 2 in one process */

/* Keys in both sorted lists a and b (the rows the oracle would sync). */
static size_t intersect(const uint64_t *a, size_t na, const uint64_t *b, size_t nb, uint64_t *out) {
  size_t i = 0, k = 0, n = 0;
  while (i < na && k < nb) {
    if (a[i] < b[k]) i++;
    else if (a[i] > b[k]) k++;
    else {
      out[n++] = a[i];
      i++;
      k++;
    }
  }
  return n;
}

/* Trainer `me`'s write-back list: its keys that are not shared, plus the
 * shared keys at even (me = 0) / odd (me = 1) positions. */
static size_t owned(const uint64_t *keys, size_t n, const uint64_t *shared, size_t ns, int me, uint64_t *out) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    size_t pos = ns;
    for (size_t s = 0; s < ns; s++)
      if (shared[s] == keys[i]) pos = s;
    if (pos == ns || (int)(pos % 2) == me) out[m++] = keys[i];
  }
  return m;
}

#define PAIR_SLOTS (2 * B * 4) /* the cache: room for every key of a batch */

typedef struct pair_s {
  trainer_step_t *ts[2];
  batch_t part[2];
  uint64_t keys[2][B * 4], shared[B * 4];
  size_t nk[2], ns;
  /* the slots, as a cacher gives them: key i of the batch's union (sorted)
   * sits at slot i on both trainers, so a shared row has one slot */
  uint64_t ukeys[PAIR_SLOTS];
  size_t nu;
  uint32_t sh_slots[B * 4];
  float sbuf[2][B * 4 * 4]; /* the shared rows' gradients, packed (dim 4) */
  int cache_ready[2];
} pair_t;

static uint32_t pair_slot(const pair_t *p, uint64_t key) {
  size_t lo = 0, hi = p->nu;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->ukeys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  ASSERT(lo < p->nu && p->ukeys[lo] == key);
  return (uint32_t)lo;
}

/* Everything of one step up to (not including) the all-reduces. */
static void pair_prepare(const job_t *j, pair_t *p, tables_t *srv, const batch_t *full, uint32_t split) {
  char err[512];
  sub_batch(j, full, 0, split, &p->part[0]);
  sub_batch(j, full, split, B - split, &p->part[1]);
  for (int i = 0; i < 2; i++) p->nk[i] = keys_of(p->ts[i], &p->part[i], p->keys[i]);
  p->ns = intersect(p->keys[0], p->nk[0], p->keys[1], p->nk[1], p->shared);
  /* the union of both key lists, merged */
  size_t a = 0, b = 0;
  p->nu = 0;
  while (a < p->nk[0] || b < p->nk[1]) {
    uint64_t ka = a < p->nk[0] ? p->keys[0][a] : UINT64_MAX, kb = b < p->nk[1] ? p->keys[1][b] : UINT64_MAX;
    p->ukeys[p->nu++] = ka < kb ? ka : kb;
    a += ka <= kb;
    b += kb <= ka;
  }
  for (size_t k = 0; k < p->ns; k++) p->sh_slots[k] = pair_slot(p, p->shared[k]);
  for (int i = 0; i < 2; i++) {
    if (!p->cache_ready[i]) {
      if (trainer_step_cache_init(p->ts[i], PAIR_SLOTS, err, sizeof err)) fail_msg("cache_init: %s", err);
      p->cache_ready[i] = 1;
    }
    /* fetch: this trainer's rows into their slots */
    uint32_t sl[B * 4];
    float rows[B * 4 * 8];
    ASSERT_OP(p->nk[i] * trainer_step_row_floats(p->ts[i]), <=, sizeof rows / sizeof *rows);
    for (size_t k = 0; k < p->nk[i]; k++) sl[k] = pair_slot(p, p->keys[i][k]);
    lookup(srv, p->keys[i], p->nk[i], rows);
    trainer_step_cache_scatter(p->ts[i], sl, p->nk[i], rows);
    /* the samples' ids as slots */
    const data_batch_t *v = &p->part[i].view;
    uint32_t ids[B * 4];
    for (uint32_t t = 0; t < 3; t++)
      for (size_t e = v->ids_off[t]; e < v->ids_off[t + 1]; e++) ids[e] = pair_slot(p, TABLE_KEY(t, v->ids[e]));
    if (trainer_step_cache_forward(p->ts[i], v, ids, err, sizeof err)) fail_msg("forward %d: %s", i, err);
    trainer_step_backward(p->ts[i], v, B);
  }
  /* what goes into the all-reduce of the shared rows, in the oracle's order */
  for (int i = 0; i < 2; i++) trainer_step_cache_pack(p->ts[i], p->sh_slots, p->ns, p->sbuf[i]);
}

/* After the all-reduces: update and write back. */
static void pair_finish(pair_t *p, tables_t *srv) {
  uint32_t rf = trainer_step_row_floats(p->ts[0]);
  for (int i = 0; i < 2; i++) {
    trainer_step_cache_unpack(p->ts[i], p->sh_slots, p->ns, p->sbuf[i]);
    trainer_step_cache_update(p->ts[i], NULL, 0);
  }
  /* every copy of a shared row is the same after the update */
  for (size_t s = 0; s < p->ns; s++) {
    float r0[8], r1[8];
    trainer_step_cache_gather(p->ts[0], &p->sh_slots[s], 1, r0);
    trainer_step_cache_gather(p->ts[1], &p->sh_slots[s], 1, r1);
    assert_memory_equal(r0, r1, rf * sizeof(float));
  }
  assert_memory_equal(trainer_step_params(p->ts[0]), trainer_step_params(p->ts[1]), trainer_step_n_params(p->ts[0]) * sizeof(float));
  for (int i = 0; i < 2; i++) {
    uint64_t keys[B * 4];
    uint32_t sl[B * 4];
    float rows[B * 4 * 8];
    size_t nw = owned(p->keys[i], p->nk[i], p->shared, p->ns, i, keys);
    for (size_t k = 0; k < nw; k++) sl[k] = pair_slot(p, keys[k]);
    trainer_step_cache_gather(p->ts[i], sl, nw, rows);
    write_back(srv, keys, nw, rows);
  }
}

/* The hand-made all-reduce: x0 + x1 into both (Gloo's order for 2 ranks). */
static void pair_allreduce_by_hand(pair_t *p) {
  float *g0 = trainer_step_grads(p->ts[0]), *g1 = trainer_step_grads(p->ts[1]);
  for (size_t k = 0; k < trainer_step_n_params(p->ts[0]); k++) g0[k] = g1[k] = g0[k] + g1[k];
  for (size_t k = 0; k < p->ns * 4; k++) p->sbuf[0][k] = p->sbuf[1][k] = p->sbuf[0][k] + p->sbuf[1][k];
}

static void run_p2(uint32_t split, double tol, size_t *shared_total) {
  job_t j;
  job_open(&j);
  ref_t r;
  ref_open(&j, &r);
  tables_t srv;
  tables_init(&j, &srv);
  pair_t p;
  memset(&p, 0, sizeof p);
  p.ts[0] = new_trainer(&j);
  p.ts[1] = new_trainer(&j);
  *shared_total = 0;
  for (uint64_t x = 0; x < STEPS; x++) {
    batch_t b;
    make_batch(&j, x, &b);
    pair_prepare(&j, &p, &srv, &b, split);
    pair_allreduce_by_hand(&p);
    pair_finish(&p, &srv);
    *shared_total += p.ns;
    ref_step(&j, &r, &b);
  }
  size_t np = model_n_params(r.model);
  if (tol == 0) {
    assert_memory_equal(model_params(trainer_step_model(p.ts[0])), model_params(r.model), np * sizeof(float));
  } else {
    double d = max_diff(model_params(trainer_step_model(p.ts[0])), model_params(r.model), np);
    if (d > tol) fail_msg("dense parameters: max |difference| %.3g > %.3g", d, tol);
    print_message("P = 2, split %u/%u: dense max |diff| %.3g vs one trainer\n", split, B - split, d);
  }
  check_tables(&j, &srv, &r.tab, tol);
  trainer_step_destroy(p.ts[0]);
  trainer_step_destroy(p.ts[1]);
  tables_close(&srv);
  ref_close(&r);
  job_close(&j);
}

static void test_p2_split_close(void **state) {
  (void)state;
  size_t shared;
  run_p2(B / 2, TOL, &shared);
  assert_true(shared > 0); /* the batches do exercise row synchronization */
}

static void test_p2_empty_trainer_exact(void **state) {
  (void)state;
  size_t shared;
  run_p2(B, 0, &shared); /* trainer 1 gets n = 0 */
  assert_int_equal(shared, 0);
}

/* ------------------------------------------------------------------ P = 2 over Gloo */

typedef struct peer_s {
  int rank;
  char dir[256];
  trainer_step_t *ts;
  float *grads, *sync;
  size_t n_grads, n_sync;
  int rc;
} peer_t;

static void *peer_main(void *arg) {
  peer_t *pe = arg;
  coll_store_t st;
  coll_t *c = NULL;
  char err[512];
  pe->rc = coll_file_store_init(&st, pe->dir);
  coll_opts_t o = {.rank = pe->rank, .size = 2, .backend = "gloo", .prefix = "test", .timeout_ms = 20000};
  if (!pe->rc) pe->rc = coll_create(&o, &st, &c, err, sizeof err);
  if (!pe->rc) pe->rc = coll_allreduce_sum_f32(c, pe->grads, pe->n_grads);
  if (!pe->rc && pe->n_sync) pe->rc = coll_allreduce_sum_f32(c, pe->sync, pe->n_sync);
  if (!pe->rc) pe->rc = coll_barrier(c);
  coll_destroy(c);
  coll_file_store_close(&st);
  return NULL;
}

static void test_p2_gloo_matches_hand_sum(void **state) {
  (void)state;
  job_t j;
  job_open(&j);
  tables_t srv_a, srv_b;
  tables_init(&j, &srv_a);
  tables_init(&j, &srv_b);
  pair_t a, g;
  memset(&a, 0, sizeof a);
  memset(&g, 0, sizeof g);
  for (int i = 0; i < 2; i++) {
    a.ts[i] = new_trainer(&j);
    g.ts[i] = new_trainer(&j);
  }
  char dir[] = "/tmp/chanter-test-step-XXXXXX";
  assert_non_null(mkdtemp(dir));
  batch_t b;
  make_batch(&j, 0, &b);
  /* by hand */
  pair_prepare(&j, &a, &srv_a, &b, 3);
  pair_allreduce_by_hand(&a);
  pair_finish(&a, &srv_a);
  /* through Gloo, one thread per rank */
  pair_prepare(&j, &g, &srv_b, &b, 3);
  peer_t pe[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&pe[i], 0, sizeof pe[i]);
    pe[i].rank = i;
    snprintf(pe[i].dir, sizeof pe[i].dir, "%s", dir);
    pe[i].ts = g.ts[i];
    pe[i].grads = trainer_step_grads(g.ts[i]);
    pe[i].n_grads = trainer_step_n_params(g.ts[i]);
    pe[i].sync = g.sbuf[i];
    pe[i].n_sync = g.ns * 4;
    assert_int_equal(pthread_create(&th[i], NULL, peer_main, &pe[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    if (pe[i].rc) fail_msg("rank %d: collective failed: %s", i, err_str(pe[i].rc));
  }
  pair_finish(&g, &srv_b);
  model_t *ma = trainer_step_model(a.ts[0]), *mg = trainer_step_model(g.ts[0]);
  assert_memory_equal(model_params(ma), model_params(mg), model_n_params(ma) * sizeof(float));
  check_tables(&j, &srv_b, &srv_a, 0);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  for (int i = 0; i < 2; i++) {
    trainer_step_destroy(a.ts[i]);
    trainer_step_destroy(g.ts[i]);
  }
  tables_close(&srv_a);
  tables_close(&srv_b);
  job_close(&j);
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void **state) {
  (void)state;
  job_t j;
  job_open(&j);
  tables_t srv;
  tables_init(&j, &srv);
  trainer_step_t *ts = new_trainer(&j);
  char err[512] = "";
  batch_t b;
  make_batch(&j, 0, &b);
  uint64_t keys[B * 4];
  size_t nk = keys_of(ts, &b, keys);
  assert_true(nk > 1);

  /* a row of the batch was not fetched: the error names the key */
  uint64_t missing = keys[nk - 1];
  fetch(ts, &srv, keys, nk - 1);
  assert_int_equal(trainer_step_forward(ts, &b.view, err, sizeof err), -ENOENT);
  char want[64];
  snprintf(want, sizeof want, "key %#llx", (unsigned long long)missing);
  if (!strstr(err, want) || !strstr(err, "not among")) fail_msg("unexpected message: %s", err);

  /* unsorted fetch keys */
  uint64_t bad[2] = {keys[1], keys[0]};
  float *rows;
  assert_int_equal(trainer_step_set_keys(ts, bad, 2, &rows, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "ascending"));


  /* Samples messages */
  Chanter__Oracle__V1__Samples s = CHANTER__ORACLE__V1__SAMPLES__INIT;
  uint32_t hot[3] = {1, 2, 1};
  s.n = 2;
  s.n_dense = 3;
  s.n_tables = 3;
  s.n_hotness = 3;
  s.hotness = hot;
  s.labels.data = (uint8_t *)b.labels;
  s.labels.len = 2 * 4;
  s.dense.data = (uint8_t *)b.dense;
  s.dense.len = 2 * 3 * 4;
  uint64_t ids[8];
  s.ids.data = (uint8_t *)ids;
  s.ids.len = 8 * 8;
  data_batch_t v;
  trainer_work_limits_t lim = {.schema = &j.schema, .max_batch = B};
  trainer_work_t w;
  for (int i = 0; i < 8; i++) ids[i] = (uint64_t)i % 5;
  assert_int_equal(trainer_work_decode_samples(&s, &lim, 0, &w, err, sizeof err), 0);
  v = w.batch;
  assert_int_equal(v.n, 2);
  assert_int_equal(v.ids_off[1], 2);
  assert_int_equal(v.ids_off[2], 6);
  assert_int_equal(v.ids[7], 2);
  trainer_work_close(&w);
  s.ids.len = 7 * 8;
  assert_int_equal(trainer_work_decode_samples(&s, &lim, 0, &w, err, sizeof err), ERR_BADMSG);
  s.ids.len = 8 * 8;
  hot[1] = 1;
  assert_int_equal(trainer_work_decode_samples(&s, &lim, 0, &w, err, sizeof err), ERR_BADMSG);
  assert_non_null(strstr(err, "hotness"));
  hot[1] = 2;
  s.n = B + 1;
  assert_int_equal(trainer_work_decode_samples(&s, &lim, 0, &w, err, sizeof err), ERR_BADMSG);
  assert_int_equal(trainer_work_decode_samples(NULL, &lim, 0, &w, err, sizeof err), 0);
  v = w.batch;
  assert_int_equal(v.n, 0);
  trainer_work_close(&w);

  trainer_step_destroy(ts);
  tables_close(&srv);
  job_close(&j);
}

/* ------------------------------------------------------------------ ideal mode's local rows */

static void test_local_rows(void **state) {
  (void)state;
  job_t j;
  job_open(&j);
  trainer_rows_t *s;
  assert_int_equal(trainer_rows_create(&j.layout, &s), 0);
  uint32_t rf = table_row_floats(&j.layout, 0);
  /* every row of every table, twice: first use initializes as a server would */
  uint64_t keys[21];
  size_t n = 0;
  for (uint32_t t = 0; t < 3; t++)
    for (uint64_t r = 0; r < j.layout.tables[t].rows; r++) keys[n++] = TABLE_KEY(t, r);
  float *got = malloc(n * rf * sizeof(float)), *want = malloc(rf * sizeof(float));
  char why[256];
  assert_int_equal(trainer_rows_gather(s, keys, n, got, why, sizeof why), 0);
  for (size_t i = 0; i < n; i++) {
    table_init_row(&j.layout, keys[i], want);
    assert_memory_equal(got + i * rf, want, rf * sizeof(float));
  }
  assert_int_equal(trainer_rows_count(s), n);
  for (size_t i = 0; i < n * rf; i++) got[i] = (float)i;
  assert_int_equal(trainer_rows_scatter(s, keys, n, got, why, sizeof why), 0);
  memset(got, 0, n * rf * sizeof(float));
  assert_int_equal(trainer_rows_gather(s, keys, n, got, why, sizeof why), 0);
  for (size_t i = 0; i < n * rf; i++) assert_true(got[i] == (float)i);
  assert_int_equal(trainer_rows_count(s), n);
  uint64_t bad = TABLE_KEY(1, 5);
  assert_int_equal(trainer_rows_gather(s, &bad, 1, got, why, sizeof why), -ERANGE);
  free(got);
  free(want);
  trainer_rows_destroy(s);
  job_close(&j);
}

/* The dense state of a checkpoint (trainer_ckpt.h): the round trip is
 * exact -- parameters, the optimizer's state and step count -- and a
 * damaged, cut or foreign blob is refused with a sentence, leaving the
 * trainer as it was. */
static void test_dense_state(void **state) {
  (void)state;
  job_t j;
  job_open(&j);
  trainer_step_t *ts = new_trainer(&j);
  opt_t *o = trainer_step_dense_opt(ts);
  size_t np = trainer_step_n_params(ts), ns = opt_state_floats(o);
  assert_true(ns > 0); /* Adagrad: one accumulator per parameter */
  float *p = trainer_step_params(ts), *st = opt_state(o);
  for (size_t i = 0; i < np; i++) p[i] = (float)i * 0.25f - 3.0f;
  for (size_t i = 0; i < ns; i++) st[i] = (float)i * 0.5f;
  opt_set_steps(o, 17);
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(trainer_ckpt_dense_encode(ts, &buf, &len), 0);
  float *want_p = malloc(np * sizeof *want_p), *want_s = malloc(ns * sizeof *want_s);
  memcpy(want_p, p, np * sizeof *p);
  memcpy(want_s, st, ns * sizeof *st);
  /* into a fresh trainer: exactly the state */
  trainer_step_t *t2 = new_trainer(&j);
  char err[512] = "";
  assert_int_equal(trainer_ckpt_dense_decode(t2, buf, len, err, sizeof err), 0);
  assert_memory_equal(trainer_step_params(t2), want_p, np * sizeof *want_p);
  assert_memory_equal(opt_state(trainer_step_dense_opt(t2)), want_s, ns * sizeof *want_s);
  assert_int_equal(opt_steps(trainer_step_dense_opt(t2)), 17);
  /* a flipped byte anywhere, or a cut: refused, nothing loaded */
  float *before = malloc(np * sizeof *before);
  memcpy(before, trainer_step_params(t2), np * sizeof *before);
  for (size_t i = 0; i < len; i += len / 97 + 1) {
    buf[i] ^= 0x10;
    assert_int_equal(trainer_ckpt_dense_decode(t2, buf, len, err, sizeof err), ERR_BADMSG);
    assert_true(strstr(err, "damaged") || strstr(err, "not one chanter wrote"));
    buf[i] ^= 0x10;
  }
  assert_int_equal(trainer_ckpt_dense_decode(t2, buf, len / 2, err, sizeof err), ERR_BADMSG);
  assert_int_equal(trainer_ckpt_dense_decode(t2, buf, 7, err, sizeof err), ERR_BADMSG);
  assert_memory_equal(trainer_step_params(t2), before, np * sizeof *before);
  trainer_step_destroy(t2);
  /* a trainer with another dense optimizer: refused, naming both */
  char e2[256];
  assert_int_equal(cfg_set(j.cfg, "optimizer=adam", "test", e2, sizeof e2), 0);
  trainer_step_t *t3 = new_trainer(&j);
  assert_int_equal(trainer_ckpt_dense_decode(t3, buf, len, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "adagrad"));
  assert_non_null(strstr(err, "adam"));
  trainer_step_destroy(t3);
  free(before);
  free(want_p);
  free(want_s);
  free(buf);
  trainer_step_destroy(ts);
  job_close(&j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p1_exact),
      cmocka_unit_test(test_p2_empty_trainer_exact),
      cmocka_unit_test(test_p2_split_close),
      cmocka_unit_test(test_p2_gloo_matches_hand_sum),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_local_rows),
      cmocka_unit_test(test_dense_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
