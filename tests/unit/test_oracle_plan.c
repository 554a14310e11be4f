/*
 * test_oracle_plan: the oracle's pure decisions (common/plan/plan.c,
 * common/model/eval.c, common/jobrule.c): sample allocation, the
 * per-trainer fetch / sync / write-back key lists of L = 0, the
 * partitioned tables' keys left out (plan_build_skip = plan_build +
 * plan_drop_tables), the radix
 * sort, the evaluation metrics, each against a hand-computed case or a
 * brute-force reference, and what a job reports about its data (the
 * evaluation set's size, the train logloss's iterations, a batch larger
 * than a split: the exact text).  Prints (does not assert) how long
 * planning a Criteo-sized batch takes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval.h"
#include "jobrule.h"
#include "plan.h"
#include "proc.h"
#include "table.h"

/* ---- helpers */

static uint64_t rng_state = 1;
static uint64_t rnd(void) { return table_mix64(rng_state++); }

/* A batch of n samples; rows of table t drawn by gen (or given). */
static void make_batch(data_batch_t *b, uint64_t x, uint32_t n, uint32_t n_dense, uint32_t n_tables,
                       const uint32_t *hotness, const uint64_t *ids_or_null, uint64_t rows) {
  memset(b, 0, sizeof *b);
  b->iteration = x;
  b->n = n;
  b->n_dense = n_dense;
  b->n_tables = n_tables;
  b->hotness = malloc((n_tables + 1) * sizeof *b->hotness);
  memcpy(b->hotness, hotness, n_tables * sizeof *hotness);
  b->ids_off = malloc((n_tables + 1) * sizeof *b->ids_off);
  b->ids_off[0] = 0;
  for (uint32_t t = 0; t < n_tables; t++) b->ids_off[t + 1] = b->ids_off[t] + (size_t)n * hotness[t];
  size_t ni = b->ids_off[n_tables];
  b->labels = malloc((n + 1) * sizeof(float));
  b->dense = malloc(((size_t)n * n_dense + 1) * sizeof(float));
  b->ids = malloc((ni + 1) * sizeof(uint64_t));
  for (uint32_t i = 0; i < n; i++) {
    b->labels[i] = (float)(i % 2);
    for (uint32_t k = 0; k < n_dense; k++) b->dense[(size_t)i * n_dense + k] = (float)i + 0.01f * (float)k;
  }
  for (size_t i = 0; i < ni; i++) {
    if (ids_or_null) {
      b->ids[i] = ids_or_null[i];
    } else { /* skewed: small rows are popular, so keys repeat across trainers */
      uint64_t r = rnd() % rows;
      b->ids[i] = (rnd() & 1) ? r % 17 : r;
    }
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static int contains(const uint64_t *v, size_t n, uint64_t k) { return bsearch(&k, v, n, sizeof k, cmp_u64) != NULL; }

static void assert_sorted_unique(const uint64_t *v, size_t n) {
  for (size_t i = 1; i < n; i++) assert_true(v[i - 1] < v[i]);
}

/* Sorted distinct keys of the samples of b owned by p (p = UINT32_MAX: all). */
static uint64_t *keys_of(const data_batch_t *b, const uint32_t *owner, uint32_t p, size_t *n) {
  uint64_t *v = malloc((b->ids_off[b->n_tables] + 1) * sizeof *v);
  size_t m = 0;
  for (uint32_t t = 0; t < b->n_tables; t++)
    for (uint32_t i = 0; i < b->n; i++)
      if (p == UINT32_MAX || owner[i] == p)
        for (uint32_t h = 0; h < b->hotness[t]; h++)
          v[m++] = TABLE_KEY(t, b->ids[b->ids_off[t] + (size_t)i * b->hotness[t] + h]);
  qsort(v, m, sizeof *v, cmp_u64);
  size_t u = 0;
  for (size_t i = 0; i < m; i++)
    if (u == 0 || v[u - 1] != v[i]) v[u++] = v[i];
  *n = u;
  return v;
}

/* Checks every property of a plan of b against a brute-force reference. */
static void check_plan(const data_batch_t *b, uint32_t P, int policy, uint64_t seed, const plan_t *pl) {
  uint32_t *owner = malloc((b->n + 1) * sizeof *owner);
  assert_int_equal(plan_alloc(policy, seed, b->iteration, b->n, P, owner), 0);
  assert_int_equal(pl->trainers, P);
  assert_int_equal(pl->batch, b->n);
  /* samples: each share holds its samples in batch order, in the batch layout */
  uint32_t total = 0;
  for (uint32_t p = 0; p < P; p++) {
    const data_batch_t *s = &pl->shares[p].batch;
    uint32_t j = 0;
    size_t hot_sum = 0;
    for (uint32_t t = 0; t < b->n_tables; t++) hot_sum += b->hotness[t];
    assert_int_equal(data_batch_n_ids(s), (size_t)s->n * hot_sum);
    for (uint32_t i = 0; i < b->n; i++) {
      if (owner[i] != p) continue;
      assert_true(j < s->n);
      assert_true(s->labels[j] == b->labels[i]);
      assert_memory_equal(s->dense + (size_t)j * b->n_dense, b->dense + (size_t)i * b->n_dense,
                          b->n_dense * sizeof(float));
      size_t o = 0;
      for (uint32_t t = 0; t < b->n_tables; t++) {
        uint32_t h = b->hotness[t];
        assert_memory_equal(s->ids + o + (size_t)j * h, b->ids + b->ids_off[t] + (size_t)i * h, h * sizeof(uint64_t));
        o += (size_t)s->n * h;
      }
      j++;
    }
    assert_int_equal(j, s->n);
    total += s->n;
  }
  assert_int_equal(total, b->n);
  /* keys: shared = in >= 2 trainers' sets */
  size_t nall;
  uint64_t *all = keys_of(b, owner, UINT32_MAX, &nall);
  assert_int_equal(pl->n_unique, nall);
  size_t *nk = calloc(P, sizeof *nk);
  uint64_t **kp = calloc(P, sizeof *kp);
  for (uint32_t p = 0; p < P; p++) kp[p] = keys_of(b, owner, p, &nk[p]);
  size_t n_shared = 0;
  uint32_t *write_back_count = calloc(nall + 1, sizeof *write_back_count);
  for (size_t i = 0; i < nall; i++) {
    int users = 0;
    for (uint32_t p = 0; p < P; p++) users += contains(kp[p], nk[p], all[i]);
    assert_true(users >= 1);
    if (users >= 2) {
      assert_true(n_shared < pl->n_sync);
      assert_true(pl->sync[n_shared] == all[i]); /* the sync list is exactly the shared keys, sorted */
      n_shared++;
    }
  }
  assert_int_equal(n_shared, pl->n_sync);
  for (uint32_t p = 0; p < P; p++) {
    const plan_share_t *s = &pl->shares[p];
    assert_sorted_unique(s->fetch, s->n_fetch);
    assert_sorted_unique(s->write_back, s->n_write_back);
    /* fetch = K_p U shared */
    size_t owned = 0;
    for (size_t i = 0; i < nk[p]; i++) {
      assert_true(contains(s->fetch, s->n_fetch, kp[p][i])); /* covers every id of its samples */
      owned += !contains(pl->sync, pl->n_sync, kp[p][i]);
    }
    for (size_t i = 0; i < pl->n_sync; i++) assert_true(contains(s->fetch, s->n_fetch, pl->sync[i]));
    assert_int_equal(s->n_fetch, owned + pl->n_sync);
    assert_int_equal(s->n_owned, owned);
    /* write-back: only rows it fetched; shared ones by the key's hash */
    for (size_t i = 0; i < s->n_write_back; i++) {
      uint64_t k = s->write_back[i];
      assert_true(contains(s->fetch, s->n_fetch, k));
      if (contains(pl->sync, pl->n_sync, k)) assert_int_equal(table_mix64(k) % P, p);
      else assert_true(contains(kp[p], nk[p], k));
      uint64_t *f = bsearch(&k, all, nall, sizeof k, cmp_u64);
      assert_non_null(f);
      write_back_count[f - all]++;
    }
  }
  for (size_t i = 0; i < nall; i++) assert_int_equal(write_back_count[i], 1); /* every touched key, exactly once */
  for (uint32_t p = 0; p < P; p++) free(kp[p]);
  free(kp);
  free(nk);
  free(all);
  free(write_back_count);
  free(owner);
}

/* ---- allocation */

static void test_alloc_contiguous(void **state) {
  (void)state;
  uint32_t o[10];
  assert_int_equal(plan_alloc(PLAN_ALLOC_CONTIGUOUS, 1, 0, 10, 3, o), 0);
  const uint32_t want[10] = {0, 0, 0, 0, 1, 1, 1, 2, 2, 2}; /* i*3/10 */
  assert_memory_equal(o, want, sizeof want);
  /* fewer samples than trainers: trainers 1 and 3 get none */
  assert_int_equal(plan_alloc(PLAN_ALLOC_CONTIGUOUS, 1, 0, 2, 4, o), 0);
  assert_int_equal(o[0], 0);
  assert_int_equal(o[1], 2);
  assert_int_equal(plan_alloc(PLAN_ALLOC_CONTIGUOUS, 1, 0, 10, 0, o), -EINVAL);
  assert_int_equal(plan_alloc(7, 1, 0, 10, 2, o), -EINVAL);
  assert_int_equal(plan_alloc_parse("contiguous"), PLAN_ALLOC_CONTIGUOUS);
  assert_int_equal(plan_alloc_parse("random"), PLAN_ALLOC_RANDOM);
  assert_int_equal(plan_alloc_parse("laia"), PLAN_ALLOC_LAIA); /* through laia.h: test_oracle_laia */
  assert_int_equal(plan_alloc_parse("herald"), -EINVAL);
}

static void test_alloc_random(void **state) {
  (void)state;
  enum { B = 257, P = 4 };
  uint32_t a[B], b[B], c[B], d[B], cont[B];
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 42, 7, B, P, a), 0);
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 42, 7, B, P, b), 0);
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 42, 8, B, P, c), 0);
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 43, 7, B, P, d), 0);
  assert_int_equal(plan_alloc(PLAN_ALLOC_CONTIGUOUS, 42, 7, B, P, cont), 0);
  assert_memory_equal(a, b, sizeof a); /* deterministic in (seed, x) */
  assert_memory_not_equal(a, c, sizeof a);
  assert_memory_not_equal(a, d, sizeof a);
  assert_memory_not_equal(a, cont, sizeof a);
  /* a permutation followed by contiguous chunks: the same share sizes */
  uint32_t na[P] = {0}, nc[P] = {0};
  for (int i = 0; i < B; i++) {
    assert_true(a[i] < P);
    na[a[i]]++;
    nc[cont[i]]++;
  }
  assert_memory_equal(na, nc, sizeof na);
  /* P = 1: everything to trainer 0 */
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 42, 7, B, 1, a), 0);
  for (int i = 0; i < B; i++) assert_int_equal(a[i], 0);
  assert_int_equal(plan_alloc(PLAN_ALLOC_RANDOM, 42, 7, 0, 2, a), 0);
}

/* ---- sorting */

static void test_sort(void **state) {
  (void)state;
  size_t sizes[] = {0, 1, 5, 63, 64, 65, 1000, 100000};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n = sizes[s];
    uint64_t *v = malloc((n + 1) * 8), *w = malloc((n + 1) * 8);
    for (size_t i = 0; i < n; i++) {
      /* keys as the oracle sees them: few tables, rows of various widths, duplicates */
      uint64_t r = rnd();
      v[i] = (i % 3 == 0) ? TABLE_KEY(r % 26, (r >> 8) % 200000) : (i % 3 == 1 ? r : TABLE_KEY(3, r % 50));
      w[i] = v[i];
    }
    assert_int_equal(plan_sort_u64(v, n, NULL), 0);
    qsort(w, n, 8, cmp_u64);
    if (n) assert_memory_equal(v, w, n * 8);
    free(v);
    free(w);
  }
}

/* ---- key lists on a hand-made batch */

static void test_plan_by_hand(void **state) {
  (void)state;
  /* 4 samples, 2 tables (hotness 1 and 2), P = 2 contiguous: samples 0,1 -> trainer 0, 2,3 -> trainer 1.
   * table 0: rows 5 5 | 7 8          table 1: rows [1 2] [2 3] | [3 4] [4 4] */
  const uint32_t hot[2] = {1, 2};
  const uint64_t ids[] = {5, 5, 7, 8, /* table 1 */ 1, 2, 2, 3, 3, 4, 4, 4};
  data_batch_t b;
  make_batch(&b, 3, 4, 2, 2, hot, ids, 0);
  plan_t pl;
  assert_int_equal(plan_build(&b, 2, PLAN_ALLOC_CONTIGUOUS, 0, 0, &pl), 0);
  assert_int_equal(pl.iteration, 3);
  assert_int_equal(pl.n_unique, 7);
  assert_int_equal(pl.n_sync, 1);
  assert_true(pl.sync[0] == TABLE_KEY(1, 3)); /* the only row both trainers use */
  const uint64_t f0[] = {TABLE_KEY(0, 5), TABLE_KEY(1, 1), TABLE_KEY(1, 2), TABLE_KEY(1, 3)};
  const uint64_t f1[] = {TABLE_KEY(0, 7), TABLE_KEY(0, 8), TABLE_KEY(1, 3), TABLE_KEY(1, 4)};
  assert_int_equal(pl.shares[0].n_fetch, 4);
  assert_memory_equal(pl.shares[0].fetch, f0, sizeof f0);
  assert_int_equal(pl.shares[1].n_fetch, 4);
  assert_memory_equal(pl.shares[1].fetch, f1, sizeof f1);
  assert_int_equal(pl.shares[0].n_owned, 3);
  assert_int_equal(pl.shares[1].n_owned, 3);
  /* the shared row is written back by its hash owner, the owned ones by their trainer */
  uint32_t owner = (uint32_t)(table_mix64(TABLE_KEY(1, 3)) % 2);
  assert_int_equal(pl.shares[owner].n_write_back, 4);
  assert_int_equal(pl.shares[1 - owner].n_write_back, 3);
  assert_memory_equal(pl.shares[owner].write_back, owner ? f1 : f0, 4 * 8);
  /* samples in the batch layout: trainer 0 has table 0 [5 5], table 1 [1 2 2 3] */
  const uint64_t s0[] = {5, 5, 1, 2, 2, 3};
  assert_int_equal(pl.shares[0].batch.n, 2);
  assert_int_equal(data_batch_n_ids(&pl.shares[0].batch), 6);
  assert_memory_equal(pl.shares[0].batch.ids, s0, sizeof s0);
  assert_true(pl.shares[1].batch.labels[0] == b.labels[2] && pl.shares[1].batch.labels[1] == b.labels[3]);
  assert_true(pl.shares[1].batch.dense[0] == b.dense[2 * 2]);
  check_plan(&b, 2, PLAN_ALLOC_CONTIGUOUS, 0, &pl);
  plan_close(&pl);
  data_batch_free(&b);
}

static void test_plan_properties(void **state) {
  (void)state;
  const uint32_t hot[4] = {1, 3, 1, 2};
  const uint32_t Ps[] = {1, 2, 3, 8};
  for (int pol = 0; pol < 2; pol++)
    for (size_t k = 0; k < sizeof Ps / sizeof *Ps; k++)
      for (uint64_t x = 0; x < 3; x++) {
        data_batch_t b;
        make_batch(&b, x, 200, 3, 4, hot, NULL, 300);
        plan_t pl;
        assert_int_equal(plan_build(&b, Ps[k], pol, 9, 0, &pl), 0);
        check_plan(&b, Ps[k], pol, 9, &pl);
        if (Ps[k] == 1) { /* one trainer: nothing shared, it fetches and writes back everything */
          assert_int_equal(pl.n_sync, 0);
          assert_int_equal(pl.shares[0].n_fetch, pl.n_unique);
          assert_int_equal(pl.shares[0].n_write_back, pl.n_unique);
        } else {
          assert_true(pl.n_sync > 0); /* the skew makes rows 0..16 common */
        }
        plan_close(&pl);
        data_batch_free(&b);
      }
}

/* plan_build_skip leaves the skipped tables' keys out from the start: the
 * very plan plan_build + plan_drop_tables gives (keys, users, the mask, the
 * shares' batches), for each allocation, trainer count and mask (none,
 * some, every table), and with owners given. */
static void test_plan_skip(void **state) {
  (void)state;
  const uint32_t hot[4] = {1, 3, 1, 2};
  const uint8_t masks[4][4] = {{0, 0, 0, 0}, {1, 0, 1, 0}, {0, 1, 0, 0}, {1, 1, 1, 1}};
  const uint32_t Ps[] = {1, 2, 3};
  for (int pol = 0; pol < 2; pol++)
    for (size_t k = 0; k < sizeof Ps / sizeof *Ps; k++)
      for (int m = 0; m < 4; m++) {
        data_batch_t b;
        make_batch(&b, (uint64_t)m, 150, 2, 4, hot, NULL, 500);
        plan_t whole, skip;
        assert_int_equal(plan_build(&b, Ps[k], pol, 5, PLAN_KEYS, &whole), 0);
        assert_int_equal(plan_drop_tables(&whole, masks[m]), 0);
        assert_int_equal(plan_build_skip(&b, Ps[k], pol, 5, NULL, PLAN_KEYS, masks[m], &skip), 0);
        assert_int_equal(skip.n_unique, whole.n_unique);
        if (whole.n_unique) {
          assert_memory_equal(skip.ukeys, whole.ukeys, whole.n_unique * sizeof *whole.ukeys);
          assert_memory_equal(skip.users, whole.users, whole.n_unique * sizeof *whole.users);
        }
        assert_int_equal(skip.partitioned != NULL, whole.partitioned != NULL);
        if (whole.partitioned) assert_memory_equal(skip.partitioned, whole.partitioned, 4);
        for (uint32_t q = 0; q < Ps[k]; q++) {
          assert_int_equal(skip.shares[q].batch.n, whole.shares[q].batch.n);
          size_t ni = skip.shares[q].batch.ids_off[4];
          if (ni) assert_memory_equal(skip.shares[q].batch.ids, whole.shares[q].batch.ids, ni * sizeof(uint64_t));
        }
        plan_close(&skip);
        /* owners given (laia's path): the same */
        uint32_t own[150];
        for (uint32_t i = 0; i < 150; i++) own[i] = (uint32_t)(rnd() % Ps[k]);
        plan_close(&whole);
        assert_int_equal(plan_build_owned(&b, Ps[k], own, PLAN_KEYS, &whole), 0);
        assert_int_equal(plan_drop_tables(&whole, masks[m]), 0);
        assert_int_equal(plan_build_skip(&b, Ps[k], pol, 5, own, PLAN_KEYS, masks[m], &skip), 0);
        assert_int_equal(skip.n_unique, whole.n_unique);
        if (whole.n_unique) assert_memory_equal(skip.ukeys, whole.ukeys, whole.n_unique * sizeof *whole.ukeys);
        plan_close(&skip);
        plan_close(&whole);
        data_batch_free(&b);
      }
}

static void test_plan_empty_shares(void **state) {
  (void)state;
  const uint32_t hot[2] = {1, 1};
  data_batch_t b;
  make_batch(&b, 0, 3, 2, 2, hot, NULL, 10);
  plan_t pl;
  assert_int_equal(plan_build(&b, 5, PLAN_ALLOC_CONTIGUOUS, 0, 0, &pl), 0);
  check_plan(&b, 5, PLAN_ALLOC_CONTIGUOUS, 0, &pl);
  uint32_t empty = 0;
  for (uint32_t p = 0; p < 5; p++)
    if (pl.shares[p].batch.n == 0) {
      empty++;
      /* no samples, but it still holds every shared row and may own some write-backs */
      assert_int_equal(data_batch_n_ids(&pl.shares[p].batch), 0);
      assert_int_equal(pl.shares[p].n_fetch, pl.n_sync);
      assert_int_equal(pl.shares[p].n_owned, 0);
    }
  assert_int_equal(empty, 2);
  plan_close(&pl);
  /* a batch of 0 samples */
  data_batch_t z;
  make_batch(&z, 0, 0, 2, 2, hot, NULL, 10);
  assert_int_equal(plan_build(&z, 2, PLAN_ALLOC_RANDOM, 0, 0, &pl), 0);
  assert_int_equal(pl.n_unique, 0);
  assert_int_equal(pl.shares[0].batch.n, 0);
  assert_int_equal(pl.shares[1].n_fetch, 0);
  plan_close(&pl);
  assert_int_equal(plan_build(&z, 0, PLAN_ALLOC_RANDOM, 0, 0, &pl), -EINVAL);
  data_batch_free(&z);
  data_batch_free(&b);
}

static void test_plan_ideal_and_eval(void **state) {
  (void)state;
  const uint32_t hot[3] = {1, 2, 1};
  data_batch_t b;
  make_batch(&b, 0, 100, 2, 3, hot, NULL, 60);
  plan_t pl;
  assert_int_equal(plan_build(&b, 3, PLAN_ALLOC_CONTIGUOUS, 0, PLAN_IDEAL, &pl), 0);
  uint32_t n = 0;
  for (uint32_t p = 0; p < 3; p++) {
    assert_int_equal(pl.shares[p].n_fetch, 0);
    assert_int_equal(pl.shares[p].n_write_back, 0);
    n += pl.shares[p].batch.n;
  }
  assert_int_equal(pl.n_sync, 0);
  assert_int_equal(n, 100); /* samples still go out */
  plan_close(&pl);
  /* eval: each trainer fetches exactly the rows its samples use */
  uint32_t owner[100];
  plan_alloc(PLAN_ALLOC_CONTIGUOUS, 0, 0, 100, 3, owner);
  assert_int_equal(plan_build(&b, 3, PLAN_ALLOC_CONTIGUOUS, 0, PLAN_EVAL, &pl), 0);
  assert_int_equal(pl.n_sync, 0);
  for (uint32_t p = 0; p < 3; p++) {
    size_t nk;
    uint64_t *k = keys_of(&b, owner, p, &nk);
    assert_int_equal(pl.shares[p].n_fetch, nk);
    assert_memory_equal(pl.shares[p].fetch, k, nk * 8);
    assert_int_equal(pl.shares[p].n_write_back, 0);
    free(k);
  }
  plan_close(&pl);
  data_batch_free(&b);
}

static void test_concat(void **state) {
  (void)state;
  const uint32_t hot[2] = {2, 1};
  data_batch_t parts[3], all;
  for (int i = 0; i < 3; i++) make_batch(&parts[i], 10 + i, 5 + i, 2, 2, hot, NULL, 1000);
  assert_int_equal(plan_batch_concat(parts, 3, &all), 0);
  assert_int_equal(all.n, 18);
  assert_int_equal(all.iteration, 10);
  assert_true(all.labels[5] == parts[1].labels[0]);
  assert_true(all.dense[2 * 11] == parts[2].dense[0]);
  /* table 1 of sample 5 (= sample 0 of part 1) */
  assert_true(all.ids[all.ids_off[1] + 5] == parts[1].ids[parts[1].ids_off[1]]);
  assert_true(all.ids[all.ids_off[0] + 2 * 11 + 1] == parts[2].ids[1]);
  data_batch_free(&all);
  parts[2].n_dense = 3;
  assert_int_equal(plan_batch_concat(parts, 3, &all), -EINVAL);
  parts[2].n_dense = 2;
  for (int i = 0; i < 3; i++) data_batch_free(&parts[i]);
}

/* the first m samples, alone: what the evaluation set's last batch is cut to */
static void test_batch_head(void **state) {
  (void)state;
  const uint32_t hot[3] = {2, 1, 3};
  data_batch_t b, h, want;
  make_batch(&b, 7, 9, 2, 3, hot, NULL, 1000);
  assert_int_equal(plan_batch_head(&b, 4, &h), 0);
  /* by hand: each table's first 4 samples' ids, in the layout of a 4-sample batch */
  make_batch(&want, 7, 4, 2, 3, hot, NULL, 1000);
  for (uint32_t t = 0; t < 3; t++)
    memcpy(want.ids + want.ids_off[t], b.ids + b.ids_off[t], (size_t)4 * hot[t] * sizeof(uint64_t));
  assert_int_equal(h.n, 4);
  assert_int_equal(h.iteration, 7);
  for (uint32_t t = 0; t <= 3; t++) assert_int_equal(h.ids_off[t], want.ids_off[t]);
  assert_memory_equal(h.ids, want.ids, want.ids_off[3] * sizeof(uint64_t));
  assert_memory_equal(h.labels, b.labels, 4 * sizeof(float));
  assert_memory_equal(h.dense, b.dense, 4 * 2 * sizeof(float));
  data_batch_free(&h);
  assert_int_equal(plan_batch_head(&b, 9, &h), 0); /* all of it: a copy */
  assert_memory_equal(h.ids, b.ids, b.ids_off[3] * sizeof(uint64_t));
  data_batch_free(&h);
  assert_int_equal(plan_batch_head(&b, 10, &h), -EINVAL);
  data_batch_free(&want);
  data_batch_free(&b);
}

/* ---- what a job reports about its data */

static void test_eval_samples(void **state) {
  (void)state;
  assert_int_equal(jobrule_eval_samples(8, 1024, 100000), 8192);  /* a large test split: unchanged */
  assert_int_equal(jobrule_eval_samples(8, 1024, 8192), 8192);
  assert_int_equal(jobrule_eval_samples(8, 1024, 20), 20);        /* 200-line file: each test sample once */
  assert_int_equal(jobrule_eval_samples(40, 256, 5000), 5000);    /* 20 batches, the last one cut to 136 */
  assert_int_equal(jobrule_eval_samples(0, 1024, 20), 0);
  assert_int_equal(jobrule_eval_samples(8, 1024, 0), 8192);       /* empty split: the reader says so */
  assert_true(jobrule_eval_samples(UINT64_MAX / 2, 1u << 24, 0) == UINT64_MAX); /* saturates */
}

static void test_train_tail(void **state) {
  (void)state;
  assert_int_equal(jobrule_train_tail(0), 0);
  assert_int_equal(jobrule_train_tail(1), 1);
  assert_int_equal(jobrule_train_tail(9), 1);
  assert_int_equal(jobrule_train_tail(10), 1);
  assert_int_equal(jobrule_train_tail(19), 1);
  assert_int_equal(jobrule_train_tail(20), 2);
  assert_int_equal(jobrule_train_tail(400), 40);
  char d[256];
  jobrule_train_logloss_definition(400, d, sizeof d);
  assert_string_equal(d, "mean of the per-iteration training logloss over the last 10% of iterations, at least "
                         "one: the last 40 of 400");
  jobrule_train_logloss_definition(5, d, sizeof d);
  assert_string_equal(d, "mean of the per-iteration training logloss over the last 10% of iterations, at least "
                         "one: the last 1 of 5");
}

static void test_batch_notes(void **state) {
  (void)state;
  char n[2][JOBRULE_NOTE_MAX];
  /* the defaults on a 200-line file: 180 train, 20 test samples */
  assert_int_equal(jobrule_batch_notes(1024, 180, 20, 8, 0, n), 2);
  assert_string_equal(n[0], "batch_size = 1024 is larger than the train split (180 samples): each batch holds 5.7 "
                            "copies of the training set; lower batch_size to at most 180 or use more data (strict = "
                            "true refuses this)");
  assert_string_equal(n[1], "batch_size = 1024 is larger than the test split (20 samples): a test batch holds 51.2 "
                            "copies of it; each evaluation scores the 20 test samples once (strict = true refuses "
                            "this)");
  assert_int_equal(jobrule_batch_notes(1024, 180, 20, 8, 1, n), 2);
  assert_string_equal(n[0], "strict = true refuses batch_size = 1024: it is larger than the train split (180 "
                            "samples), each batch would hold 5.7 copies of the training set; lower batch_size to at "
                            "most 180, use more data, or set strict = false");
  assert_string_equal(n[1], "strict = true refuses batch_size = 1024: it is larger than the test split (20 samples), "
                            "a test batch would hold 51.2 copies of it; lower batch_size to at most 20, raise "
                            "test_fraction, set eval_batches = 0, or set strict = false");
  /* no evaluation: the test split does not matter */
  assert_int_equal(jobrule_batch_notes(1024, 180, 20, 0, 0, n), 1);
  assert_non_null(strstr(n[0], "train split (180 samples): each batch holds 5.7 copies"));
  /* only the test split is too small */
  assert_int_equal(jobrule_batch_notes(64, 180, 20, 8, 0, n), 1);
  assert_non_null(strstr(n[0], "test split (20 samples): a test batch holds 3.2 copies"));
  /* just above one copy: two decimals */
  assert_int_equal(jobrule_batch_notes(101, 100, 1000, 8, 0, n), 1);
  assert_non_null(strstr(n[0], "holds 1.01 copies"));
  /* fits, exactly fits, empty splits (the reader's error): nothing */
  assert_int_equal(jobrule_batch_notes(256, 180000, 20000, 8, 1, n), 0);
  assert_int_equal(jobrule_batch_notes(180, 180, 180, 8, 1, n), 0);
  assert_int_equal(jobrule_batch_notes(1024, 0, 0, 8, 1, n), 0);
}

/* ---- evaluation metrics */

static double auc_brute(const float *s, const float *y, size_t n) {
  double num = 0, pairs = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++)
      if (y[i] > 0.5f && y[j] <= 0.5f) {
        pairs++;
        num += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
      }
  return num / pairs;
}

static void test_auc_and_logloss(void **state) {
  (void)state;
  enum { N = 997 };
  float s[N], y[N];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) {
      y[i] = (float)(rnd() % 3 == 0);
      /* few distinct scores: many ties; correlated with the label */
      s[i] = (float)((int)(rnd() % 7) + (y[i] > 0.5f ? 2 : 0)) * 0.5f - 2.0f;
    }
    double auc;
    assert_int_equal(eval_auc(s, y, N, &auc), 0);
    assert_true(fabs(auc - auc_brute(s, y, N)) < 1e-12);
    assert_true(auc > 0.5);
  }
  /* perfect, inverted, all tied */
  const float ys[4] = {0, 1, 0, 1}, good[4] = {-1, 2, 0, 3}, bad[4] = {3, 0, 2, -1}, tie[4] = {1, 1, 1, 1};
  double a;
  eval_auc(good, ys, 4, &a);
  assert_true(a == 1.0);
  eval_auc(bad, ys, 4, &a);
  assert_true(a == 0.0);
  eval_auc(tie, ys, 4, &a);
  assert_true(a == 0.5);
  const float ones[3] = {1, 1, 1};
  eval_auc(good, ones, 3, &a);
  assert_true(isnan(a)); /* one class only */
  /* logloss of logits = BCE of sigmoid */
  double want = 0;
  const float z[4] = {-3.0f, 0.5f, 2.0f, -0.25f};
  for (int i = 0; i < 4; i++) {
    double p = 1 / (1 + exp(-(double)z[i]));
    want += ys[i] > 0.5f ? -log(p) : -log(1 - p);
  }
  assert_true(fabs(eval_logloss(z, ys, 4) - want / 4) < 1e-12);
  assert_true(eval_logloss(z, ys, 0) == 0);
  const float big[2] = {80.0f, -80.0f}, yb[2] = {0, 1}; /* confidently wrong: stays finite */
  assert_true(fabs(eval_logloss(big, yb, 2) - 80.0) < 1e-9);
}

/* ---- how fast: a Criteo-shaped batch, printed for the report */

static void test_plan_timing(void **state) {
  (void)state;
  uint32_t hot[26];
  for (int t = 0; t < 26; t++) hot[t] = 1;
  const uint32_t Bs[] = {1024, 4096, 16384};
  for (size_t k = 0; k < sizeof Bs / sizeof *Bs; k++) {
    data_batch_t b;
    make_batch(&b, 0, Bs[k], 13, 26, hot, NULL, 200000);
    for (uint32_t P = 2; P <= 8; P *= 4) {
      plan_t pl;
      double best = 1e9;
      for (int r = 0; r < 7; r++) { /* best of 7: the build machines are shared */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_int_equal(plan_build(&b, P, PLAN_ALLOC_RANDOM, 1, 0, &pl), 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms < best) best = ms;
        if (r < 6) plan_close(&pl);
      }
      double ms = best;
      printf("# plan B=%u tables=26 P=%u: %.3f ms (%.1f M ids/s), %zu unique keys, %zu shared\n", Bs[k], P, ms,
             (double)Bs[k] * 26 / ms / 1e3, pl.n_unique, pl.n_sync);
      plan_close(&pl);
    }
    data_batch_free(&b);
  }
}

int main(void) {
  proc_init("test_oracle_plan"); /* the daemon's malloc tuning, for the timing */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_contiguous),  cmocka_unit_test(test_alloc_random),
      cmocka_unit_test(test_sort),              cmocka_unit_test(test_plan_by_hand),
      cmocka_unit_test(test_plan_properties),   cmocka_unit_test(test_plan_skip),
      cmocka_unit_test(test_plan_empty_shares),
      cmocka_unit_test(test_plan_ideal_and_eval), cmocka_unit_test(test_concat),
      cmocka_unit_test(test_batch_head),        cmocka_unit_test(test_eval_samples),
      cmocka_unit_test(test_train_tail),        cmocka_unit_test(test_batch_notes),
      cmocka_unit_test(test_auc_and_logloss),   cmocka_unit_test(test_plan_timing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
