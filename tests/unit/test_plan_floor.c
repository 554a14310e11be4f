/*
 * Unit tests for plan_floor: the traffic floor counted batch by batch from
 * PLAN_KEYS plans, as the oracle does, against answers worked out by hand,
 * against a naive count that never forgets a key (with the map swept
 * often, and L lowered mid-stream), and against data_floor, the offline
 * count `chanter bench e2e` runs over the same data.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch_util.h"
#include "data.h"
#include "plan.h"
#include "plan_floor.h"
#include "testutil.h"

/* Floors of batches[0..n) at window L; per-batch counts into fu / sh when given. */
static void count(const data_batch_t *b, size_t n, uint32_t P, uint32_t L, plan_floor_t *f, uint64_t *fu,
                  uint64_t *sh) {
  assert_int_equal(plan_floor_init(f, 0), 0);
  for (size_t i = 0; i < n; i++) {
    plan_t p;
    assert_int_equal(plan_build(&b[i], P, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &p), 0);
    assert_int_equal(plan_floor_add(f, &p, L, fu ? &fu[i] : NULL, sh ? &sh[i] : NULL), 0);
    plan_close(&p);
  }
}

/* The example of data_floor's own test (test_data_gen.c), as plans: batch
 * 4 over 2 trainers, one table: batch 0 = t0 {a, b}, t1 {a, c}; batch 1 =
 * t0 {a, d}, t1 {e, e}; batch 2 = t0 {b, b}, t1 {f, b}. */
static void test_by_hand(void **st) {
  (void)st;
  enum { a = 1, b_ = 2, c = 3, d = 4, e = 5, f_ = 6 };
  const uint64_t ids[3][4] = {{a, b_, a, c}, {a, d, e, e}, {b_, b_, f_, b_}};
  const uint32_t hot[1] = {1};
  data_batch_t b[3];
  for (int x = 0; x < 3; x++) make_batch(&b[x], (uint64_t)x, 4, 1, hot, ids[x]);
  plan_floor_t f;
  uint64_t fu[3], sh[3];
  /* L = 1: first uses a b c | d e | b f (b last used 2 batches ago); shared a | - | b */
  count(b, 3, 2, 1, &f, fu, sh);
  assert_int_equal(fu[0], 3), assert_int_equal(fu[1], 2), assert_int_equal(fu[2], 2);
  assert_int_equal(sh[0], 1), assert_int_equal(sh[1], 0), assert_int_equal(sh[2], 1);
  assert_int_equal(f.batches, 3);
  assert_int_equal(f.first_use, 7);
  assert_int_equal(f.shared, 2);
  assert_true(plan_floor_per_iteration(&f) == 3.0);
  plan_floor_close(&f);
  /* L = 2: b is still in the window at batch 2 */
  count(b, 3, 2, 2, &f, fu, NULL);
  assert_int_equal(fu[2], 1);
  assert_int_equal(f.first_use, 6);
  plan_floor_close(&f);
  /* L = 0: every batch's keys come from the servers: 3 + 3 + 2 */
  count(b, 3, 2, 0, &f, NULL, NULL);
  assert_int_equal(f.first_use, 8);
  plan_floor_close(&f);
  /* one trainer: nothing is shared */
  count(b, 3, 1, 1, &f, NULL, NULL);
  assert_int_equal(f.shared, 0);
  plan_floor_close(&f);
  for (int x = 0; x < 3; x++) data_batch_free(&b[x]);
}

/* Only the keys the plan holds count: a partitioned table's keys leave the
 * plan (plan_drop_tables) and so the floor. */
static void test_partitioned_tables_left_out(void **st) {
  (void)st;
  const uint32_t hot[2] = {1, 1};
  /* 2 samples, 2 tables: table 0 ids {7, 7} (shared by both trainers), table 1 ids {8, 9} */
  const uint64_t ids[4] = {7, 7, 8, 9};
  data_batch_t b;
  make_batch(&b, 0, 2, 2, hot, ids);
  plan_t p;
  plan_floor_t f;
  uint64_t fu, sh;
  assert_int_equal(plan_build(&b, 2, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &p), 0);
  assert_int_equal(plan_floor_init(&f, 0), 0);
  assert_int_equal(plan_floor_add(&f, &p, 4, &fu, &sh), 0);
  assert_int_equal(fu, 3), assert_int_equal(sh, 1);
  plan_floor_close(&f);
  const uint8_t part[2] = {1, 0}; /* table 0 partitioned */
  assert_int_equal(plan_drop_tables(&p, part), 0);
  assert_int_equal(plan_floor_init(&f, 0), 0);
  assert_int_equal(plan_floor_add(&f, &p, 4, &fu, &sh), 0);
  assert_int_equal(fu, 2), assert_int_equal(sh, 0);
  plan_floor_close(&f);
  /* a plan without key lists is refused */
  plan_t bare = p;
  bare.ukeys = NULL;
  assert_int_equal(plan_floor_init(&f, 0), 0);
  assert_int_equal(plan_floor_add(&f, &bare, 4, NULL, NULL), -EINVAL);
  assert_int_equal(f.batches, 0);
  plan_floor_close(&f);
  plan_close(&p);
  data_batch_free(&b);
}

/* A long stream with a small map (swept often) and L lowered mid-stream
 * against a count that never forgets: the same floors, batch by batch,
 * and the map stays bounded. */
static void test_sweep_keeps_counts(void **st) {
  (void)st;
  enum { KEYS = 4000, N = 400, B = 64, P = 4 };
  const uint32_t hot[1] = {1};
  uint32_t *last = calloc(KEYS, sizeof *last); /* the reference: batch + 1 of the last use, never forgotten */
  uint8_t *seen = calloc(KEYS, 1);
  plan_floor_t f;
  assert_int_equal(plan_floor_init(&f, 64), 0);
  sm_state = 42;
  size_t most = 0;
  for (uint64_t x = 0; x < N; x++) {
    uint32_t L = x < N / 2 ? 8 : 3;
    uint64_t ids[B];
    for (int i = 0; i < B; i++) { /* a hot head and a long tail */
      double u = unif();
      ids[i] = u < 0.5 ? splitmix() % 50 : splitmix() % KEYS;
    }
    data_batch_t b;
    make_batch(&b, x, B, 1, hot, ids);
    /* the reference: distinct keys, their users, their last use */
    uint64_t rfu = 0, rsh = 0;
    memset(seen, 0, KEYS);
    for (int i = 0; i < B; i++) { /* seen: 1 + the trainer, or 255 once a second one uses it */
      uint8_t who = (uint8_t)(1 + (uint32_t)i * P / B);
      if (!seen[ids[i]]) seen[ids[i]] = who;
      else if (seen[ids[i]] != who) seen[ids[i]] = 255;
    }
    for (uint64_t k = 0; k < KEYS; k++) {
      if (!seen[k]) continue;
      rsh += seen[k] == 255;
      rfu += !last[k] || x - (last[k] - 1) > L;
      last[k] = (uint32_t)x + 1;
    }
    plan_t p;
    uint64_t fu, sh;
    assert_int_equal(plan_build(&b, P, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &p), 0);
    assert_int_equal(plan_floor_add(&f, &p, L, &fu, &sh), 0);
    assert_int_equal(fu, rfu);
    assert_int_equal(sh, rsh);
    if (u64map_count(&f.last) > most) most = u64map_count(&f.last);
    plan_close(&p);
    data_batch_free(&b);
  }
  assert_true(f.sweeps > 10);
  /* the keys of the last L + 1 batches at most, doubled before a sweep, plus one batch's */
  assert_true(most <= 2 * (9 * B) + B);
  plan_floor_close(&f);
  free(last);
  free(seen);
}

/* The oracle's online count and bench e2e's offline one agree on the same
 * data (contiguous allocation, B a multiple of P). */
static void test_matches_data_floor(void **st) {
  (void)st;
  enum { B = 512, P = 4, N = 40, L = 4 };
  cfg_t *c = testutil_cfg("synthetic.samples=40000", NULL);
  char err[256];
  data_source_t *d;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  data_floor_t ref;
  assert_int_equal(data_floor(d, B, P, L, N, &ref, err, sizeof err), 0);
  assert_int_equal(ref.batches, N);
  plan_floor_t f;
  assert_int_equal(plan_floor_init(&f, 1024), 0); /* small: swept on the way */
  for (uint64_t x = 0; x < N; x++) {
    data_batch_t b;
    plan_t p;
    assert_int_equal(data_read_batch(d, DATA_TRAIN, x, B, &b, err, sizeof err), 0);
    assert_int_equal(plan_build(&b, P, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &p), 0);
    assert_int_equal(plan_floor_add(&f, &p, L, NULL, NULL), 0);
    plan_close(&p);
    data_batch_free(&b);
  }
  assert_int_equal(f.batches, ref.batches);
  assert_int_equal(f.first_use, ref.first_use);
  assert_int_equal(f.shared, ref.shared);
  assert_true(plan_floor_per_iteration(&f) == ref.per_iteration);
  assert_true(ref.first_use > 0 && ref.shared > 0);
  print_message("floor: %.1f rows per iteration (%llu first uses, %llu shared over %u batches), %llu sweeps\n",
                ref.per_iteration, (unsigned long long)ref.first_use, (unsigned long long)ref.shared, ref.batches,
                (unsigned long long)f.sweeps);
  plan_floor_close(&f);
  data_close(d);
  cfg_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_partitioned_tables_left_out),
      cmocka_unit_test(test_sweep_keeps_counts),
      cmocka_unit_test(test_matches_data_floor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
