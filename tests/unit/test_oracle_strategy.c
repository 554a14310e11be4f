/*
 * test_oracle_strategy: table_strategy -- parsing (strategy_parse), the
 * table-wise placement (strategy_place), taking tables out of a plan
 * (plan_drop_tables) and the cacher's slots for them, and auto's choice
 * (strategy_auto_choose) on streams built by hand; its measured traffic
 * (new and shared rows per batch) equal to a brute-force count, for tables
 * counted in a dense array and in a hash map.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch_util.h"
#include "cacher.h"
#include "cfg.h"
#include "err.h"
#include "plan.h"
#include "shard_fit.h"
#include "strategy_auto.h"
#include "strategy.h"

static cfg_t *job(const char *strategy, uint32_t tables) {
  cfg_t *c;
  char err[256], kv[512];
  assert_int_equal(cfg_create(&c), 0);
  int o = snprintf(kv, sizeof kv, "table_rows=");
  for (uint32_t t = 0; t < tables; t++) o += snprintf(kv + o, sizeof kv - (size_t)o, "%s1000", t ? "," : "");
  assert_int_equal(cfg_set(c, kv, "test", err, sizeof err), 0);
  snprintf(kv, sizeof kv, "table_strategy=%s", strategy);
  assert_int_equal(cfg_set(c, kv, "test", err, sizeof err), 0);
  return c;
}

static void test_parse(void **state) {
  (void)state;
  uint8_t s[4];
  char err[512];
  cfg_t *c = job("partition", 4);
  assert_int_equal(strategy_parse(c, 4, s, err, sizeof err), 0);
  for (int t = 0; t < 4; t++) assert_int_equal(s[t], STRATEGY_PARTITION);
  assert_true(strategy_any_partitioned(s, 4));
  cfg_destroy(c);
  c = job("cache, partition ,auto,cache", 4);
  assert_int_equal(strategy_parse(c, 4, s, err, sizeof err), 0);
  assert_int_equal(s[0], STRATEGY_CACHE);
  assert_int_equal(s[1], STRATEGY_PARTITION);
  assert_int_equal(s[2], STRATEGY_AUTO);
  assert_int_equal(s[3], STRATEGY_CACHE);
  cfg_destroy(c);
  c = job("cache,partition", 4); /* another length than table_rows */
  assert_int_equal(strategy_parse(c, 4, s, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "lists 2 entries but table_rows has 4 tables"));
  cfg_destroy(c);
  c = job("cache", 4);
  assert_int_equal(strategy_parse(c, 4, s, err, sizeof err), 0);
  assert_false(strategy_any_partitioned(s, 4));
  /* an unknown word never gets in */
  assert_int_not_equal(cfg_set(c, "table_strategy=cache,rowwise", "test", err, sizeof err), 0);
  assert_non_null(strstr(err, "'rowwise' is not cache, partition, partition_rows or auto"));
  cfg_destroy(c);
  c = job("partition_rows,cache,partition,partition_rows", 4);
  assert_int_equal(strategy_parse(c, 4, s, err, sizeof err), 0);
  assert_int_equal(s[0], STRATEGY_PARTITION_ROWS);
  assert_int_equal(s[3], STRATEGY_PARTITION_ROWS);
  assert_string_equal(strategy_name(s[0]), "partition_rows");
  cfg_destroy(c);
}

/* partition_rows: every trainer holds rows r mod P, and its local count */
static void test_rows(void **state) {
  (void)state;
  uint64_t total = 0;
  for (uint32_t P = 1; P <= 3; P++)
    for (uint64_t rows = 0; rows < 9; rows++) {
      total = 0;
      for (uint32_t q = 0; q < P; q++) {
        uint64_t held = 0;
        for (uint64_t r = 0; r < rows; r++) held += strategy_holds_row(STRATEGY_OWNER_ALL, q, P, r);
        assert_int_equal(strategy_local_rows(STRATEGY_OWNER_ALL, q, P, rows), held);
        assert_true(strategy_holds(STRATEGY_OWNER_ALL, q));
        total += held;
      }
      assert_int_equal(total, rows);
    }
  assert_int_equal(strategy_local_rows(1, 1, 2, 10), 10);
  assert_int_equal(strategy_local_rows(1, 0, 2, 10), 0);
  assert_false(strategy_holds(STRATEGY_OWNER_NONE, 0));
}

static void test_place(void **state) {
  (void)state;
  data_schema_t sc = {0};
  uint32_t hot[5] = {1, 4, 1, 2, 1};
  uint64_t rows[5] = {10, 10, 50, 10, 10};
  sc.n_tables = 5;
  sc.hotness = hot;
  sc.table_rows = rows;
  table_layout_t lay = {0};
  table_info_t defs[5];
  for (int t = 0; t < 5; t++) defs[t] = (table_info_t){.rows = rows[t], .dim = 8};
  lay.n_tables = 5;
  lay.tables = defs;
  uint8_t s[5] = {STRATEGY_PARTITION, STRATEGY_PARTITION, STRATEGY_PARTITION, STRATEGY_PARTITION, STRATEGY_CACHE};
  uint32_t own[5];
  strategy_place(s, &sc, &lay, 2, own);
  /* work = hotness x dim: table 1 (32) first to rank 0, table 3 (16) to 1,
   * then tables 2 (8, more rows) and 0 (8) to rank 1 (16 < 32) */
  assert_int_equal(own[1], 0);
  assert_int_equal(own[3], 1);
  assert_int_equal(own[2], 1);
  assert_int_equal(own[0], 1);
  assert_int_equal(own[4], STRATEGY_OWNER_NONE);
  uint32_t again[5];
  strategy_place(s, &sc, &lay, 2, again);
  assert_memory_equal(own, again, sizeof own);
  /* a partition_rows table is everyone's, its work shared: table 1 (32)
   * rows-wise adds 16 to both, then 3 (16) to rank 0, 2 (8) to rank 1, 0 (8)
   * to rank 1 (24 < 32) */
  s[1] = STRATEGY_PARTITION_ROWS;
  strategy_place(s, &sc, &lay, 2, own);
  assert_int_equal(own[1], STRATEGY_OWNER_ALL);
  assert_int_equal(own[3], 0);
  assert_int_equal(own[2], 1);
  assert_int_equal(own[0], 1);
  assert_int_equal(own[4], STRATEGY_OWNER_NONE);
}

/* n batches of B samples, 2 tables of hotness 1: table 0 draws from a huge
 * range (every id new), table 1 always the same few rows. */
static void stream(plan_t *pl, size_t n, uint32_t B, uint32_t P) {
  uint32_t hot[2] = {1, 1};
  uint64_t *ids = malloc(2 * B * sizeof *ids);
  sm_state = 7;
  for (size_t x = 0; x < n; x++) {
    for (uint32_t i = 0; i < B; i++) {
      ids[i] = splitmix() % 1000000;
      ids[B + i] = splitmix() % 4;
    }
    data_batch_t b;
    make_batch(&b, x, B, 2, hot, ids);
    assert_int_equal(plan_build(&b, P, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &pl[x]), 0);
    data_batch_free(&b);
  }
  free(ids);
}

/* strategy_auto_choose's new / shared rows per batch against a brute-force
 * count over the same plans: table 0 sparse (a hash map), table 1 a few
 * hundred rows (a dense array), table 2 two hot rows; hotness 2 on table 1
 * (ids repeat within a sample). */
static void test_auto_counts(void **state) {
  (void)state;
  enum { N = 20, B = 64, P = 3, T = 3, L = 3 };
  uint32_t hot[T] = {1, 2, 1};
  uint64_t rows[T] = {UINT64_C(1) << 40, 300, 2};
  plan_t pl[N];
  uint64_t *ids = malloc(4 * B * sizeof *ids);
  sm_state = 11;
  for (size_t x = 0; x < N; x++) {
    for (uint32_t i = 0; i < B; i++) {
      ids[i] = splitmix() % rows[0];
      ids[B + 2 * i] = splitmix() % rows[1];
      ids[B + 2 * i + 1] = splitmix() % rows[1];
      ids[3 * B + i] = splitmix() % rows[2];
    }
    data_batch_t b;
    make_batch(&b, x, B, T, hot, ids);
    assert_int_equal(plan_build(&b, P, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &pl[x]), 0);
    data_batch_free(&b);
  }
  free(ids);
  data_schema_t sc = {0};
  sc.n_tables = T;
  sc.hotness = hot;
  sc.table_rows = rows;
  table_info_t defs[T] = {{.rows = rows[0], .dim = 4}, {.rows = rows[1], .dim = 4}, {.rows = rows[2], .dim = 4}};
  table_layout_t lay = {.n_tables = T, .tables = defs};
  strategy_auto_opts_t o = {.P = P, .L = L, .B = B, .cache_weight = 1, .budget_bytes = UINT64_C(1) << 40};
  uint8_t in[T] = {STRATEGY_AUTO, STRATEGY_AUTO, STRATEGY_AUTO}, out[T];
  strategy_auto_table_t tab[T];
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, tab), 0);
  double nw[T] = {0}, sh[T] = {0};
  for (size_t i = 1; i < N; i++) /* the first batch is not counted */
    for (size_t k = 0; k < pl[i].n_unique; k++) {
      uint64_t key = pl[i].ukeys[k];
      int seen = 0;
      for (size_t j = i > L ? i - L : 0; j < i && !seen; j++)
        for (size_t m = 0; m < pl[j].n_unique && !seen; m++) seen = pl[j].ukeys[m] == key;
      nw[TABLE_ID(key)] += !seen;
      sh[TABLE_ID(key)] += pl[i].users[k] == UINT32_MAX;
    }
  for (uint32_t t = 0; t < T; t++) {
    assert_true(tab[t].new_rows == nw[t] / (N - 1));
    assert_true(tab[t].shared_rows == sh[t] / (N - 1));
  }
  assert_true(nw[0] > 0.9 * B * (N - 1) && nw[1] > 0 && nw[2] == 0 && sh[2] > 0); /* the three cases occur */
  for (size_t x = 0; x < N; x++) plan_close(&pl[x]);
}

static void test_auto(void **state) {
  (void)state;
  enum { N = 12, B = 256, P = 2 };
  plan_t pl[N];
  stream(pl, N, B, P);
  data_schema_t sc = {0};
  uint32_t hot[2] = {1, 1};
  uint64_t rows[2] = {1000000, 1000};
  sc.n_tables = 2;
  sc.hotness = hot;
  sc.table_rows = rows;
  table_info_t defs[2] = {{.rows = rows[0], .dim = 16}, {.rows = rows[1], .dim = 16}};
  table_layout_t lay = {.n_tables = 2, .tables = defs};
  strategy_auto_opts_t o = {.P = P, .L = 8, .B = B, .cache_weight = 1, .budget_bytes = UINT64_C(1) << 40};
  uint8_t in[2] = {STRATEGY_AUTO, STRATEGY_AUTO}, out[2];
  strategy_auto_table_t tab[2];
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, tab), 0);
  /* table 0: every id new each batch (~B rows fetched and written back);
   * table 1: 4 rows, always cached */
  assert_true(tab[0].new_rows > 0.9 * B);
  assert_true(tab[1].new_rows < 1);
  assert_int_equal(out[0], STRATEGY_PARTITION);
  assert_int_equal(out[1], STRATEGY_CACHE);
  assert_non_null(strstr(tab[0].why, "auto: partition ("));
  assert_non_null(strstr(tab[1].why, "auto: the cache ("));
  assert_non_null(strstr(tab[1].why, "each table to its cheaper mechanism"));
  /* the same inputs, the same choice */
  uint8_t out2[2];
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out2, tab), 0);
  assert_memory_equal(out, out2, 2);
  /* what each mechanism costs a step whatever its bytes: running one
   * instead of both pays (table 1 partitioned moves less than table 0
   * cached) */
  o.step_bytes = 1e9;
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, tab), 0);
  assert_int_equal(out[0], STRATEGY_PARTITION);
  assert_int_equal(out[1], STRATEGY_PARTITION);
  assert_non_null(strstr(tab[1].why, "every auto table partitioned"));
  o.step_bytes = 0;
  /* a fixed entry stays; a budget one trainer cannot meet but two can
   * spreads the big table (partition_rows), one too small even spread
   * sends it back to the cache */
  uint8_t fixed[2] = {STRATEGY_AUTO, STRATEGY_PARTITION};
  o.budget_bytes = 40u << 20; /* table 0 needs 1M x 16 x 4 = 64 MB: 32 MB a trainer spread */
  assert_int_equal(strategy_auto_choose(pl, N, fixed, &sc, &lay, &o, out, tab), 0);
  assert_int_equal(out[0], STRATEGY_PARTITION_ROWS);
  assert_int_equal(out[1], STRATEGY_PARTITION);
  assert_int_equal(tab[0].choice, STRATEGY_PARTITION_ROWS);
  assert_non_null(strstr(tab[0].why, "auto: partition_rows ("));
  assert_non_null(strstr(tab[0].why, "spread over all 2"));
  o.budget_bytes = 1 << 20;
  assert_int_equal(strategy_auto_choose(pl, N, fixed, &sc, &lay, &o, out, tab), 0);
  assert_int_equal(out[0], STRATEGY_CACHE);
  assert_int_equal(out[1], STRATEGY_PARTITION);
  assert_non_null(strstr(tab[0].why, "do not fit strategy.partition_mb, even spread over 2 trainers"));
  assert_string_equal(tab[1].why, "fixed by table_strategy");

  /* plan_drop_tables: table 0 leaves the keys, the cacher gives its ids no slot */
  plan_t *p = &pl[0];
  size_t before = p->n_unique;
  uint8_t partitioned[2] = {1, 0};
  assert_int_equal(plan_drop_tables(p, partitioned), 0);
  assert_true(p->n_unique < before && p->n_unique <= 4);
  for (size_t k = 0; k < p->n_unique; k++) assert_int_equal(TABLE_ID(p->ukeys[k]), 1);
  cacher_t *c;
  cacher_opts_t co = {.trainers = P, .lookahead = 0, .cache_rows = 1000, .lrpp = 1, .delayed = 1};
  assert_int_equal(cacher_create(&co, &c), 0);
  assert_int_equal(cacher_push(c, p), 0);
  cacher_end(c);
  cacher_dec_t d;
  char err[256];
  assert_int_equal(cacher_decide(c, &d, err, sizeof err), 0);
  for (uint32_t q = 0; q < P; q++) {
    const cacher_tr_t *t = &d.tr[q];
    uint32_t n = p->shares[q].batch.n;
    for (uint32_t i = 0; i < n; i++) {
      assert_int_equal(t->slots[i], CACHER_NO_SLOT); /* table 0's ids come first */
      assert_true(t->slots[n + i] < 1000);
    }
    for (size_t k = 0; k < t->n_fetch; k++) assert_int_equal(TABLE_ID(t->fetch_keys[k]), 1);
  }
  cacher_dec_free(&d);
  cacher_destroy(c);
  for (size_t x = 0; x < N; x++) plan_close(&pl[x]);
}

/* strategy.auto_cost = model: the choice in predicted microseconds.  The
 * trainer and server parts come from a small fit to the synthetic
 * dataset; the collectives' lines are set by hand, so each term can be
 * checked: the slopes add exactly their bytes' worth, the intercepts are
 * what running a mechanism costs a step. */
static void test_auto_model(void **state) {
  (void)state;
  enum { N = 12, B = 256, P = 2, D = 16 };
  plan_t pl[N];
  stream(pl, N, B, P);
  uint32_t hot[2] = {1, 1};
  uint64_t rows[2] = {1000000, 1000};
  data_schema_t sc = {.n_tables = 2, .hotness = hot, .table_rows = rows};
  table_info_t defs[2] = {{.rows = rows[0], .dim = D}, {.rows = rows[1], .dim = D}};
  table_layout_t lay = {.n_tables = 2, .tables = defs};
  shard_table_t tt[2] = {{rows[0], D, 1, 0, SHARD_OPT_SGD}, {rows[1], D, 1, 0, SHARD_OPT_SGD}};
  char *text = shard_fit_synthetic_text(120, 60, 3), why[256];
  shard_data_t d;
  shard_fit_opts_t fo = {.holdout = 0, .seed = 1, .steps = 300, .wd = 0.1, .label = "test"};
  shard_fit_report_t rep;
  shard_cost_t *m = NULL;
  assert_int_equal(shard_fit_parse_data(text, "synthetic", &d, why, sizeof why), 0);
  assert_int_equal(shard_fit(&d, &fo, &m, &rep, why, sizeof why), 0);
  shard_fit_data_close(&d);
  free(text);
  /* without the collectives' lines the model cannot price the choice */
  assert_false(strategy_auto_model_ok(NULL, why, sizeof why));
  assert_false(strategy_auto_model_ok(m, why, sizeof why));
  assert_non_null(strstr(why, "no allreduce line"));
  shard_coll_t ar = {.ranks = 2, .points = 5, .alpha_us = 100, .us_per_mb = 0},
               a2a = {.ranks = 2, .points = 5, .alpha_us = 150, .us_per_mb = 0};
  shard_cost_set_coll(m, SHARD_COLL_ALLREDUCE, &ar);
  shard_cost_set_coll(m, SHARD_COLL_ALLTOALL, &a2a);
  assert_true(strategy_auto_model_ok(m, why, sizeof why));
  strategy_auto_opts_t o = {.P = P, .L = 8, .B = B, .budget_bytes = UINT64_C(1) << 40, .cost = m, .tables = tt};
  uint8_t in[2] = {STRATEGY_AUTO, STRATEGY_AUTO}, out[2];
  strategy_auto_table_t t0[2], t1[2];
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, t0), 0);
  for (int t = 0; t < 2; t++) {
    assert_true(isfinite(t0[t].cache_us) && t0[t].cache_us > 0 && isfinite(t0[t].part_us) && t0[t].part_us > 0);
    assert_non_null(strstr(t0[t].why, "(predicted: partition "));
    /* each table went to the mechanism its prediction favours, or all to one */
    int part = out[t] == STRATEGY_PARTITION;
    assert_true(part == (t0[t].part_us < t0[t].cache_us) || strstr(t0[t].why, "every auto table"));
  }
  /* table 1's rows are never new: no server term */
  assert_true(t0[1].new_rows < 1);
  /* the slopes: exactly their bytes' worth */
  ar.us_per_mb = 300, a2a.us_per_mb = 700;
  shard_cost_set_coll(m, SHARD_COLL_ALLREDUCE, &ar);
  shard_cost_set_coll(m, SHARD_COLL_ALLTOALL, &a2a);
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, t1), 0);
  for (int t = 0; t < 2; t++) {
    double dp = 2.0 * B * (P - 1) / P * 4 * D * 700 / (1 << 20), dc = t0[t].shared_rows * 4 * D * 300 / (1 << 20);
    assert_true(fabs(t1[t].part_us - t0[t].part_us - dp) <= 1e-9 * t1[t].part_us);
    assert_true(fabs(t1[t].cache_us - t0[t].cache_us - dc) <= 1e-9 * t1[t].cache_us + 1e-12);
  }
  assert_true(t0[1].shared_rows > 0); /* table 1's four rows: every trainer uses them */
  /* the intercepts: a mechanism that costs a second a step is not run */
  a2a.alpha_us = 1e6;
  shard_cost_set_coll(m, SHARD_COLL_ALLTOALL, &a2a);
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, t1), 0);
  assert_int_equal(out[0], STRATEGY_CACHE);
  assert_int_equal(out[1], STRATEGY_CACHE);
  a2a.alpha_us = 150, ar.alpha_us = 1e6;
  shard_cost_set_coll(m, SHARD_COLL_ALLTOALL, &a2a);
  shard_cost_set_coll(m, SHARD_COLL_ALLREDUCE, &ar);
  assert_int_equal(strategy_auto_choose(pl, N, in, &sc, &lay, &o, out, t1), 0);
  assert_int_equal(out[0], STRATEGY_PARTITION);
  assert_int_equal(out[1], STRATEGY_PARTITION);
  assert_non_null(strstr(t1[1].why, "every auto table partitioned"));
  shard_cost_destroy(m);
  for (size_t x = 0; x < N; x++) plan_close(&pl[x]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_place),
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_auto),
      cmocka_unit_test(test_auto_counts),
      cmocka_unit_test(test_auto_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
