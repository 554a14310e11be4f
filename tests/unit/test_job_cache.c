/*
 * The guarantee of the lookahead cache, in one process: the oracle's
 * decisions (oracle_plan + oracle_cache) executed by P simulated trainers
 * (trainer_step in cache mode, each with its owner slot array) against an
 * in-memory "embedding server" end with BIT-identical parameters -- dense
 * and every table row -- for L = 0 (the baseline), small L, large L and
 * auto, with LRPP and delayed synchronization on and off, for P = 1, 2, 3.
 * And a checkpoint (DESIGN.md 5) taken mid-run with the cacher's flush
 * lists leaves the server with the baseline's bits after that batch.
 *
 * The simulation keeps the real system's orderings, so that a wrong
 * decision shows up as a different digest rather than passing by luck:
 *  - the prefetch of batch z runs as EARLY as its gate allows (once every
 *    batch < gate is finished, write-backs included), i.e. while batches
 *    z-L .. z-1 are still to be trained, exactly as the trainers' prefetch
 *    threads do; a slot handed out too early would be overwritten before
 *    its last use, a row prefetched before its write-back would be stale;
 *  - the background work of batch x (delayed synchronization, delayed
 *    updates, write-backs) runs only after batch x+1's forward, as it
 *    overlaps it in the trainers; a row wrongly classified as delayed
 *    would be read by that forward before its update;
 *  - gradients are summed over trainers in rank order (what the trainers'
 *    all-reduce gives for P <= 2, and the rank-ordered sum for any P).
 * Sums are formed in the same order in every configuration, so equality is
 * exact, not within a tolerance.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "cfg.h"
#include "data.h"
#include "err.h"
#include "model.h"
#include "cacher.h"
#include "laia.h"
#include "plan.h"
#include "table.h"
#include "trainer_step.h"

#define NB 40 /* batches */
#define BATCH_SIZE 48 /* the global batch size */
#define MAXP 3

static cfg_t *g_cfg;
static data_schema_t g_schema;
static table_layout_t g_layout;
static data_batch_t g_batches[NB];

static int setup(void **state) {
  (void)state;
  static const char *sets[] = {
      "model=dlrm",      "n_dense=3",          "table_rows=40,3000,12",   "table_hotness=1,2,1",
      "embedding_dim=4", "model.bottom_mlp=8", "model.top_mlp=8",         "batch_size=48",
      "seed=11",         "optimizer=adagrad",  "embedding_optimizer=rowwise_adagrad", "learning_rate=0.05",
  };
  char err[512];
  if (cfg_create(&g_cfg)) return -1;
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    if (cfg_set(g_cfg, sets[i], "test", err, sizeof err)) {
      fprintf(stderr, "%s: %s\n", sets[i], err);
      return -1;
    }
  if (data_schema_from_cfg(g_cfg, &g_schema, err, sizeof err) || cfg_layout(g_cfg, &g_layout, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  /* skewed ids: a few hot rows shared by the trainers and kept in the
   * cache, a long tail used once (owned, evicted at once) */
  uint64_t s = 99;
  for (uint64_t x = 0; x < NB; x++) {
    data_batch_t *b = &g_batches[x];
    memset(b, 0, sizeof *b);
    b->iteration = x;
    b->n = BATCH_SIZE;
    b->n_dense = 3;
    b->n_tables = 3;
    b->hotness = malloc(3 * sizeof *b->hotness);
    b->ids_off = malloc(4 * sizeof *b->ids_off);
    b->labels = malloc(BATCH_SIZE * sizeof(float));
    b->dense = malloc(BATCH_SIZE * 3 * sizeof(float));
    b->ids_off[0] = 0;
    for (uint32_t t = 0; t < 3; t++) {
      b->hotness[t] = g_schema.hotness[t];
      b->ids_off[t + 1] = b->ids_off[t] + (size_t)BATCH_SIZE * b->hotness[t];
    }
    b->ids = malloc(b->ids_off[3] * sizeof *b->ids);
    for (uint32_t i = 0; i < BATCH_SIZE; i++) {
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
        double u = (double)(s >> 11) / 9007199254740992.0;
        b->ids[k] = (uint64_t)((double)g_layout.tables[t].rows * u * u * u) % g_layout.tables[t].rows;
      }
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int x = 0; x < NB; x++) data_batch_free(&g_batches[x]);
  data_schema_close(&g_schema);
  table_layout_close(&g_layout);
  cfg_destroy(g_cfg);
  return 0;
}

/* ------------------------------------------------------------ the server */

typedef struct server_s {
  float *t[3];
  uint32_t rf;
} server_t;

static void server_open(server_t *sv) {
  sv->rf = table_row_floats(&g_layout, 0);
  for (uint32_t t = 0; t < 3; t++) {
    sv->t[t] = malloc(g_layout.tables[t].rows * sv->rf * sizeof(float));
    for (uint64_t r = 0; r < g_layout.tables[t].rows; r++) table_init_row(&g_layout, TABLE_KEY(t, r), sv->t[t] + r * sv->rf);
  }
}

static float *srow(server_t *sv, uint64_t k) { return sv->t[TABLE_ID(k)] + TABLE_ROW(k) * sv->rf; }

/* ------------------------------------------------------------ one run */

typedef struct run_opts_s {
  uint32_t P;
  int lookahead; /* -1: auto */
  int lrpp, delayed;
  int laia;            /* allocation = laia (else contiguous) */
  uint64_t cache_rows; /* 0: what L needs */
  int checkpoints;     /* take a checkpoint after the batches IS_CHECKPOINT names */
} run_opts_t;

/* The batches a run with checkpoints takes one after: the first two, and
 * a few in the middle and at the end (not every batch: the background
 * work of the others keeps overlapping the next forward). */
#define IS_CHECKPOINT(x) ((x) <= 1 || (x) % 7 == 5 || (x) == NB - 1)

/* The plans of the NB batches for P trainers, contiguous or laia. */
static void build_plans(uint32_t P, int laia, plan_t *plans) {
  laia_t *l = NULL;
  laia_opts_t lo = {.trainers = P, .window = 8, .seed = 5};
  if (laia) assert_int_equal(laia_create(&lo, &l), 0);
  for (int x = 0; x < NB; x++) {
    if (!laia) {
      assert_int_equal(plan_build(&g_batches[x], P, PLAN_ALLOC_CONTIGUOUS, 5, PLAN_KEYS, &plans[x]), 0);
      continue;
    }
    uint32_t *owner = malloc((g_batches[x].n + 1) * sizeof *owner);
    assert_int_equal(laia_assign(l, &g_batches[x], owner), 0);
    assert_int_equal(plan_build_owned(&g_batches[x], P, owner, PLAN_KEYS, &plans[x]), 0);
    free(owner);
  }
  laia_destroy(l);
}

typedef struct bg_s {
  int pending;
  uint64_t iteration;
  size_t n_del;
  uint32_t *del;          /* slots */
  float *dsum;            /* their summed gradients */
  float *pgrad[MAXP];
} bg_t;

static void sum_over(uint32_t P, float *const *v, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) {
    float s = v[0][i];
    for (uint32_t p = 1; p < P; p++) s += v[p][i];
    out[i] = s;
  }
}

/* the background work of batch x: delayed sync + updates, then write-backs */
static void run_bg(uint32_t P, trainer_step_t **ts, server_t *sv, const cacher_dec_t *d, bg_t *bg) {
  if (!bg->pending) return;
  uint32_t dim = trainer_step_dim(ts[0]), rf = trainer_step_row_floats(ts[0]);
  sum_over(P, bg->pgrad, bg->n_del * dim, bg->dsum);
  for (uint32_t p = 0; p < P; p++) trainer_step_cache_update_rows(ts[p], bg->del, bg->n_del, bg->dsum);
  for (uint32_t p = 0; p < P; p++) {
    const cacher_tr_t *t = &d->tr[p];
    float *rows = malloc((t->n_write_back + 1) * rf * sizeof(float));
    trainer_step_cache_gather(ts[p], t->write_back_slots, t->n_write_back, rows);
    for (size_t i = 0; i < t->n_write_back; i++) memcpy(srow(sv, t->write_back_keys[i]), rows + i * rf, rf * sizeof(float));
    free(rows);
  }
  free(bg->del);
  free(bg->dsum);
  for (uint32_t p = 0; p < P; p++) free(bg->pgrad[p]);
  memset(bg, 0, sizeof *bg);
}

static void prefetch(uint32_t P, trainer_step_t **ts, server_t *sv, const cacher_dec_t *d) {
  uint32_t rf = trainer_step_row_floats(ts[0]);
  for (uint32_t p = 0; p < P; p++) {
    const cacher_tr_t *t = &d->tr[p];
    float *rows = malloc((t->n_fetch + 1) * rf * sizeof(float));
    for (size_t i = 0; i < t->n_fetch; i++) memcpy(rows + i * rf, srow(sv, t->fetch_keys[i]), rf * sizeof(float));
    trainer_step_cache_scatter(ts[p], t->fetch_slots, t->n_fetch, rows);
    free(rows);
  }
}

typedef struct result_s {
  uint8_t digest[32];
  uint32_t min_l, max_l;
  size_t fetched, synced, delayed, hits, replicated;
  float *snap[NB];    /* with checkpoints: the server's three tables, one after another, as the checkpoint after x left them */
  size_t flushed[NB]; /* ... and the rows it wrote back */
} result_t;

static size_t server_floats(const server_t *sv) {
  size_t n = 0;
  for (uint32_t t = 0; t < 3; t++) n += g_layout.tables[t].rows * sv->rf;
  return n;
}

static void result_free(result_t *res) {
  for (int x = 0; x < NB; x++) free(res->snap[x]);
  memset(res->snap, 0, sizeof res->snap);
}

/* A checkpoint after batch x, which every trainer finished, its
 * background work included: each trainer writes the rows of its flush
 * list to the server from their slots, evicting nothing (the run goes on
 * with the same caches); the server's tables are kept in res. */
static void checkpoint(uint32_t P, trainer_step_t **ts, server_t *sv, const cacher_flush_t *fl, int x,
                       result_t *res) {
  uint32_t rf = trainer_step_row_floats(ts[0]);
  uint8_t *seen[3]; /* each row by one trainer at most */
  for (uint32_t t = 0; t < 3; t++) seen[t] = calloc(g_layout.tables[t].rows, 1);
  for (uint32_t p = 0; p < P; p++) {
    float *rows = malloc((fl[p].n + 1) * rf * sizeof(float));
    trainer_step_cache_gather(ts[p], fl[p].slots, fl[p].n, rows);
    for (size_t i = 0; i < fl[p].n; i++) {
      uint64_t k = fl[p].keys[i];
      if (i) assert_true(fl[p].keys[i - 1] < k);
      if (seen[TABLE_ID(k)][TABLE_ROW(k)]++) fail_msg("batch %d: key %#" PRIx64 " in two trainers' flush lists", x, k);
      memcpy(srow(sv, k), rows + i * rf, rf * sizeof(float));
    }
    free(rows);
    res->flushed[x] += fl[p].n;
  }
  for (uint32_t t = 0; t < 3; t++) free(seen[t]);
  float *snap = malloc(server_floats(sv) * sizeof(float)), *o = snap;
  for (uint32_t t = 0; t < 3; t++) {
    size_t n = g_layout.tables[t].rows * sv->rf;
    memcpy(o, sv->t[t], n * sizeof(float));
    o += n;
  }
  res->snap[x] = snap;
}

static void run(const run_opts_t *o, result_t *res) {
  uint32_t P = o->P;
  memset(res, 0, sizeof *res);
  res->min_l = UINT32_MAX;
  plan_t plans[NB];
  build_plans(P, o->laia, plans);
  uint32_t L = (uint32_t)o->lookahead;
  uint64_t need;
  uint64_t cache_rows = o->cache_rows;
  if (o->lookahead < 0) {
    /* auto: a cache between what L = 0 and L = 16 need */
    uint64_t n0, n16;
    assert_int_equal(cacher_need(plans, NB, P, 0, o->lrpp, &n0), 0);
    assert_int_equal(cacher_need(plans, NB, P, 16, o->lrpp, &n16), 0);
    cache_rows = (n0 + n16) / 2;
    assert_int_equal(cacher_auto(plans, NB, P, cache_rows, 64, o->lrpp, &L, &need), 0);
    assert_true(L >= 1 && L < 16);
    assert_true(need <= cache_rows);
  } else {
    assert_int_equal(cacher_need(plans, NB, P, L, o->lrpp, &need), 0);
  }
  if (!cache_rows) cache_rows = need;
  cacher_opts_t co = {.trainers = P, .lookahead = L, .cache_rows = cache_rows, .lrpp = o->lrpp, .delayed = o->delayed};
  cacher_t *c;
  assert_int_equal(cacher_create(&co, &c), 0);
  static cacher_dec_t dec[NB];
  static cacher_flush_t fl[NB][MAXP]; /* cacher_flush between deciding x and x + 1 */
  memset(fl, 0, sizeof fl);
  char err[512];
  int n_dec = 0;
  for (int x = 0; x < NB; x++) {
    assert_int_equal(cacher_push(c, &plans[x]), 0);
    if (x + 1 == NB) cacher_end(c);
    while (cacher_ready(c)) {
      int rc = cacher_decide(c, &dec[n_dec], err, sizeof err);
      if (rc) fail_msg("decide: %s", err);
      if (o->checkpoints && IS_CHECKPOINT(n_dec)) assert_int_equal(cacher_flush(c, fl[n_dec]), 0);
      n_dec++;
    }
  }
  assert_int_equal(n_dec, NB);
  assert_int_equal(cacher_cached(c), 0);
  cacher_destroy(c);

  /* trainers and the server */
  trainer_step_t *ts[MAXP];
  for (uint32_t p = 0; p < P; p++) {
    assert_int_equal(trainer_step_create(g_cfg, &g_schema, &g_layout, BATCH_SIZE, &ts[p], err, sizeof err), 0);
    assert_int_equal(trainer_step_cache_init(ts[p], cache_rows, err, sizeof err), 0);
    /* poison the cache: a row used without being fetched shows */
    float *cr = trainer_step_cache_rows(ts[p]);
    for (size_t i = 0; i < cache_rows * trainer_step_row_floats(ts[p]); i++) cr[i] = 1e30f;
  }
  server_t sv;
  server_open(&sv);
  uint32_t dim = trainer_step_dim(ts[0]);
  size_t np = model_n_params(trainer_step_model(ts[0]));
  float *dsum = malloc(np * sizeof(float));
  float *dg[MAXP];
  bg_t bg = {0};
  uint64_t done = 0;       /* batches < done are finished, background work included */
  int prefetched = 0;      /* batches < prefetched have been prefetched */
  for (int x = 0; x < NB; x++) {
    /* prefetch all that the gates allow, in order */
    while (prefetched < NB && dec[prefetched].gate <= done) prefetch(P, ts, &sv, &dec[prefetched++]);
    if (prefetched <= x) { /* L = 0: the gate is x itself: finish x - 1 first */
      run_bg(P, ts, &sv, x ? &dec[x - 1] : NULL, &bg);
      done = (uint64_t)x;
      while (prefetched < NB && dec[prefetched].gate <= done) prefetch(P, ts, &sv, &dec[prefetched++]);
    }
    assert_true(prefetched > x);
    const cacher_dec_t *d = &dec[x];
    if (d->lookahead < res->min_l) res->min_l = d->lookahead;
    if (d->lookahead > res->max_l) res->max_l = d->lookahead;
    double loss = 0;
    for (uint32_t p = 0; p < P; p++) {
      const data_batch_t *b = &plans[x].shares[p].batch;
      if (trainer_step_cache_forward(ts[p], b, d->tr[p].slots, err, sizeof err)) fail_msg("forward: %s", err);
      res->fetched += d->tr[p].n_fetch;
      res->hits += d->tr[p].n_hits;
    }
    /* the background work of x - 1 overlaps x's forward: it runs after it */
    run_bg(P, ts, &sv, x ? &dec[x - 1] : NULL, &bg);
    done = (uint64_t)x;
    while (prefetched < NB && dec[prefetched].gate <= done) prefetch(P, ts, &sv, &dec[prefetched++]);
    for (uint32_t p = 0; p < P; p++) {
      const data_batch_t *b = &plans[x].shares[p].batch;
      loss += trainer_step_backward(ts[p], b, BATCH_SIZE);
      dg[p] = model_grads(trainer_step_model(ts[p]));
    }
    assert_true(loss == loss);
    sum_over(P, dg, np, dsum);
    for (uint32_t p = 0; p < P; p++) memcpy(model_grads(trainer_step_model(ts[p])), dsum, np * sizeof(float));
    /* critical rows */
    size_t nc = d->n_critical;
    float *cg[MAXP], *csum = malloc((nc + 1) * dim * sizeof(float));
    for (uint32_t p = 0; p < P; p++) {
      cg[p] = malloc((nc + 1) * dim * sizeof(float));
      trainer_step_cache_pack(ts[p], d->critical, nc, cg[p]);
    }
    sum_over(P, cg, nc * dim, csum);
    for (uint32_t p = 0; p < P; p++) {
      trainer_step_cache_unpack(ts[p], d->critical, nc, csum);
      free(cg[p]);
    }
    free(csum);
    /* delayed rows: gradients packed now, summed and applied in the background */
    bg.pending = 1;
    bg.iteration = (uint64_t)x;
    bg.n_del = d->n_delayed;
    bg.del = malloc((d->n_delayed + 1) * sizeof *bg.del);
    memcpy(bg.del, d->delayed, d->n_delayed * sizeof *bg.del);
    bg.dsum = malloc((d->n_delayed + 1) * dim * sizeof(float));
    for (uint32_t p = 0; p < P; p++) {
      bg.pgrad[p] = malloc((d->n_delayed + 1) * dim * sizeof(float));
      trainer_step_cache_pack(ts[p], d->delayed, d->n_delayed, bg.pgrad[p]);
      trainer_step_cache_update(ts[p], d->delayed, d->n_delayed);
    }
    /* ownership: rows x + 1 lets another trainer use (listed in x + 1's
     * decision) go from their owner to every trainer after x's update
     * (bytes copied, as the allgather) */
    if (x + 1 < NB) {
      const cacher_dec_t *dn = &dec[x + 1];
      uint32_t rf = trainer_step_row_floats(ts[0]);
      float *row = malloc(rf * sizeof(float));
      for (size_t i = 0; i < dn->n_replicate; i++) {
        trainer_step_cache_gather(ts[dn->replicate_owners[i]], &dn->replicate_slots[i], 1, row);
        for (uint32_t p = 0; p < P; p++)
          if (p != dn->replicate_owners[i]) trainer_step_cache_scatter(ts[p], &dn->replicate_slots[i], 1, row);
      }
      free(row);
      res->replicated += dn->n_replicate;
    }
    res->synced += nc + d->n_delayed;
    res->delayed += d->n_delayed;
    if (o->checkpoints && IS_CHECKPOINT(x)) { /* x finished everywhere first, as DESIGN.md 5 asks */
      run_bg(P, ts, &sv, d, &bg);
      done = (uint64_t)x + 1;
      checkpoint(P, ts, &sv, fl[x], x, res);
    }
  }
  run_bg(P, ts, &sv, &dec[NB - 1], &bg);

  /* every trainer holds the same dense parameters; digest = dense + server */
  for (uint32_t p = 1; p < P; p++)
    assert_memory_equal(model_params(trainer_step_model(ts[0])), model_params(trainer_step_model(ts[p])), np * sizeof(float));
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, model_params(trainer_step_model(ts[0])), np * sizeof(float));
  for (uint32_t t = 0; t < 3; t++) EVP_DigestUpdate(md, sv.t[t], g_layout.tables[t].rows * sv.rf * sizeof(float));
  unsigned len;
  EVP_DigestFinal_ex(md, res->digest, &len);
  EVP_MD_CTX_free(md);
  /* a row never written back would still be 1e30 in a cache, but the
   * server never sees it: check the server has no poison */
  for (uint32_t t = 0; t < 3; t++)
    for (uint64_t i = 0; i < g_layout.tables[t].rows * sv.rf; i++) assert_true(sv.t[t][i] < 1e29f);

  free(dsum);
  for (uint32_t t = 0; t < 3; t++) free(sv.t[t]);
  for (uint32_t p = 0; p < P; p++) trainer_step_destroy(ts[p]);
  for (int x = 0; x < NB; x++) {
    cacher_dec_free(&dec[x]);
    cacher_flush_free(fl[x], P);
    plan_close(&plans[x]);
  }
}

static void hex(const uint8_t *d, char *out) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_bit_identical_across_l(void **state) {
  (void)state;
  for (uint32_t P = 1; P <= MAXP; P++) {
    result_t base;
    run_opts_t bo = {.P = P, .lookahead = 0, .lrpp = 1, .delayed = 1};
    run(&bo, &base);
    char hb[65];
    hex(base.digest, hb);
    const int ls[] = {0, 1, 2, 5, 16, -1};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
      for (int lrpp = 0; lrpp <= 1; lrpp++)
        for (int delayed = 0; delayed <= 1; delayed++) {
          run_opts_t o = {.P = P, .lookahead = ls[i], .lrpp = lrpp, .delayed = delayed};
          result_t r;
          run(&o, &r);
          char hr[65];
          hex(r.digest, hr);
          if (memcmp(r.digest, base.digest, 32))
            fail_msg("P=%u L=%d lrpp=%d delayed=%d: digest %s, baseline %s", P, ls[i], lrpp, delayed, hr, hb);
          if (ls[i] >= 2 && lrpp) {
            /* the cache does its job: fewer rows moved than the baseline */
            assert_true(r.fetched < base.fetched);
            assert_true(r.hits > 0);
          }
          if (ls[i] >= 1 && delayed && P > 1) assert_true(r.delayed > 0);
          if (ls[i] >= 1 && lrpp && P > 1) assert_true(r.replicated > 0); /* owned rows changed hands */
          if (ls[i] < 0) assert_true(r.max_l >= 1);
        }
    print_message("P=%u: digest %s identical for L in {0,1,2,5,16,auto} x lrpp x delayed\n", P, hb);
  }
}

/* allocation = laia: the allocation depends on the batches alone, so any L
 * gives the baseline's bits with it too; more rows stay with one trainer,
 * so fewer are synchronized than with contiguous allocation. */
static void test_laia_across_l(void **state) {
  (void)state;
  for (uint32_t P = 2; P <= MAXP; P++) {
    result_t base, cont;
    run_opts_t bo = {.P = P, .lookahead = 0, .lrpp = 1, .delayed = 1, .laia = 1};
    run(&bo, &base);
    const int ls[] = {1, 5, 16, -1};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
      run_opts_t o = {.P = P, .lookahead = ls[i], .lrpp = 1, .delayed = 1, .laia = 1};
      result_t r;
      run(&o, &r);
      if (memcmp(r.digest, base.digest, 32)) fail_msg("laia P=%u L=%d: digest differs from L = 0's", P, ls[i]);
      if (ls[i] == 16) {
        run_opts_t co = {.P = P, .lookahead = 16, .lrpp = 1, .delayed = 1};
        run(&co, &cont);
        print_message("P=%u L=16: rows synchronized contiguous %zu, laia %zu\n", P, cont.synced, r.synced);
        assert_true(r.synced < cont.synced);
      }
    }
  }
}

/* A cache one row too small for the chosen L: the cacher lowers L during
 * the run and the model is still the same. */
static void test_lowered_l_same_model(void **state) {
  (void)state;
  for (uint32_t P = 1; P <= 2; P++) {
    result_t base, r;
    run_opts_t bo = {.P = P, .lookahead = 0, .lrpp = 1, .delayed = 1};
    run(&bo, &base);
    plan_t plans[NB];
    build_plans(P, 0, plans);
    uint64_t n0, n8;
    assert_int_equal(cacher_need(plans, NB, P, 0, 1, &n0), 0);
    assert_int_equal(cacher_need(plans, NB, P, 8, 1, &n8), 0);
    for (int x = 0; x < NB; x++) plan_close(&plans[x]);
    assert_true(n8 > n0);
    run_opts_t o = {.P = P, .lookahead = 8, .lrpp = 1, .delayed = 1, .cache_rows = (n0 + n8) / 2};
    run(&o, &r);
    assert_true(r.min_l < 8);
    assert_memory_equal(r.digest, base.digest, 32);
  }
}

/* Checkpoints (cacher_flush): after batch x, the rows each trainer's
 * flush list names, written from its cache to the server without evicting
 * anything, leave the server -- every row of every table -- with the bits
 * synchronous training (L = 0, where nothing stays cached) has after x;
 * and the run goes on to the baseline's digest. */
static void test_checkpoint_flush(void **state) {
  (void)state;
  int runs = 0;
  for (uint32_t P = 1; P <= MAXP; P++) {
    result_t base;
    run_opts_t bo = {.P = P, .lookahead = 0, .lrpp = 1, .delayed = 1, .checkpoints = 1};
    run(&bo, &base);
    size_t nf = server_floats(&(server_t){.rf = table_row_floats(&g_layout, 0)});
    const int ls[] = {0, 1, 4, 16};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
      for (int lrpp = 0; lrpp <= 1; lrpp++)
        for (int delayed = 0; delayed <= 1; delayed++) {
          run_opts_t o = {.P = P, .lookahead = ls[i], .lrpp = lrpp, .delayed = delayed, .checkpoints = 1};
          result_t r;
          run(&o, &r);
          size_t flushed = 0;
          for (int x = 0; x < NB; x++) {
            if (!IS_CHECKPOINT(x)) {
              assert_null(r.snap[x]);
              continue;
            }
            assert_non_null(r.snap[x]);
            assert_int_equal(base.flushed[x], 0); /* L = 0: nothing stays cached */
            flushed += r.flushed[x];
            for (size_t f = 0; f < nf; f++)
              if (memcmp(&r.snap[x][f], &base.snap[x][f], sizeof(float)))
                fail_msg("P=%u L=%d lrpp=%d delayed=%d: checkpoint after batch %d: float %zu of the server is %.9g, "
                         "synchronous training has %.9g",
                         P, ls[i], lrpp, delayed, x, f, (double)r.snap[x][f], (double)base.snap[x][f]);
          }
          if (ls[i] == 0) assert_int_equal(flushed, 0);
          else assert_true(flushed > 0);
          assert_memory_equal(r.digest, base.digest, 32);
          result_free(&r);
          runs++;
        }
    result_free(&base);
  }
  print_message("%d runs: every checkpoint's server identical to synchronous training's\n", runs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bit_identical_across_l),
      cmocka_unit_test(test_lowered_l_same_model),
      cmocka_unit_test(test_laia_across_l),
      cmocka_unit_test(test_checkpoint_flush),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
