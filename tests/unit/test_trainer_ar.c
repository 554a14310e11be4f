/*
 * trainer_ar: the bucketed dense all-reduce over a real Gloo group (ranks
 * are threads of this process, meeting through a file store in a temp
 * directory, talking TCP over loopback).
 *
 * What is checked: whatever the bucket size and however the backward's
 * suffixes arrive (one at a time, several buckets at once, none before
 * trainer_ar_finish), the result is bit-identical to one all-reduce of the whole
 * array -- for P = 2 that is the single rounded x0 + x1 per element, so
 * compared bitwise with it --; a step can follow a step; a rank whose peer
 * is gone gets an error from trainer_ar_finish, not a hang.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

#include "coll.h"
#include "trainer_ar.h"
#include "trainer_sched.h"
#include "testutil.h"

static char g_dir[256];
static int g_seq;

static float val(int rank, size_t i) {
  uint64_t x = (uint64_t)rank * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 12345;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 3.0f;
}

typedef struct rank_s {
  int rank, size;
  char prefix[64];
  size_t n, bucket;
  int mode;     /* 0: suffixes one float-range at a time; 1: all at once; 2: none (finish only) */
  int steps;
  int die;      /* this rank leaves after creating the group */
  int sched;    /* the buckets go through a trainer_sched queue (comm_schedule = priority) */
  float *g;
  int rc;       /* of trainer_ar_finish in the last step */
} rank_t;

static void *rank_main(void *arg) {
  rank_t *r = arg;
  coll_store_t s;
  coll_t *c = NULL;
  char err[256];
  if (coll_file_store_init(&s, g_dir) < 0) {
    r->rc = -1000;
    return NULL;
  }
  coll_opts_t o = {.rank = r->rank, .size = r->size, .prefix = r->prefix, .timeout_ms = 5000};
  if ((r->rc = coll_create(&o, &s, &c, err, sizeof err)) != 0) {
    fprintf(stderr, "rank %d: %s\n", r->rank, err);
    coll_file_store_close(&s);
    return NULL;
  }
  if (r->die) {
    coll_destroy(c);
    coll_file_store_close(&s);
    return NULL;
  }
  trainer_ar_t *a;
  trainer_sched_t *sched = NULL;
  if (r->sched && (r->rc = trainer_sched_create(c, NULL, NULL, &sched)) != 0) goto out;
  if ((r->rc = trainer_ar_create(c, sched, r->g, r->n, r->bucket, &a)) != 0) goto out;
  for (int step = 0; step < r->steps; step++) {
    for (size_t i = 0; i < r->n; i++) r->g[i] = val(r->rank + step, i);
    trainer_ar_begin(a, (uint64_t)step);
    if (r->mode == 0) {
      /* a backward of uneven layers: suffixes shrinking by 1000, 7, 30011 ... floats */
      static const size_t step_sz[] = {1000, 7, 30011, 1, 4096, 999};
      size_t lo = r->n;
      for (size_t k = 0; lo > 0; k++) {
        size_t d = step_sz[k % 6];
        lo = lo > d ? lo - d : 0;
        trainer_ar_ready(a, lo);
      }
    } else if (r->mode == 1) {
      trainer_ar_ready(a, 0);
    }
    r->rc = trainer_ar_finish(a, NULL);
    if (r->rc) break;
  }
  trainer_sched_destroy(sched);
  trainer_ar_destroy(a);
out:
  coll_destroy(c);
  coll_file_store_close(&s);
  return NULL;
}

static int g_sched; /* the runs below go through the scheduler */

static void run(int P, size_t n, size_t bucket, int mode, int steps, rank_t *rk) {
  pthread_t th[4];
  g_seq++;
  for (int r = 0; r < P; r++) {
    rk[r] = (rank_t){.rank = r, .size = P, .n = n, .bucket = bucket, .mode = mode, .steps = steps, .sched = g_sched};
    snprintf(rk[r].prefix, sizeof rk[r].prefix, "ar-test/%d", g_seq);
    rk[r].g = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(rk[r].g);
  }
  for (int r = 0; r < P; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &rk[r]), 0);
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
}

static void test_bitwise(void **state) {
  (void)state;
  const size_t n = 100003;
  const size_t buckets[] = {0, 999, 4096, 65536, 100003, 1 << 20};
  rank_t rk[2];
  for (int mode = 0; mode < 3; mode++)
    for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
      run(2, n, buckets[b], mode, 2, rk);
      for (int r = 0; r < 2; r++) {
        assert_int_equal(rk[r].rc, 0);
        for (size_t i = 0; i < n; i++) {
          float want = val(0 + 1, i) + val(1 + 1, i); /* step 1: ranks' values of rank + 1 */
          if (memcmp(&rk[r].g[i], &want, sizeof want)) {
            fail_msg("mode %d bucket %zu rank %d element %zu: %a != %a", mode, buckets[b], r, i,
                     (double)rk[r].g[i], (double)want);
          }
        }
        free(rk[r].g);
      }
    }
}

static void test_one_rank(void **state) {
  (void)state;
  rank_t rk[1];
  run(1, 5000, 1024, 0, 1, rk);
  assert_int_equal(rk[0].rc, 0);
  for (size_t i = 0; i < 5000; i++) assert_true(rk[0].g[i] == val(0, i));
  free(rk[0].g);
}

static void test_peer_gone(void **state) {
  (void)state;
  rank_t rk[2];
  pthread_t th[2];
  g_seq++;
  for (int r = 0; r < 2; r++) {
    rk[r] = (rank_t){
        .rank = r, .size = 2, .n = 300000, .bucket = 8192, .mode = 0, .steps = 1, .die = r == 1, .sched = g_sched};
    snprintf(rk[r].prefix, sizeof rk[r].prefix, "ar-test/%d", g_seq);
    rk[r].g = malloc(rk[r].n * sizeof(float));
  }
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &rk[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  assert_int_equal(rk[1].rc, 0);
  assert_true(rk[0].rc < 0); /* an error, within the 5 s timeout, not a hang */
  for (int r = 0; r < 2; r++) free(rk[r].g);
}

static int setup(void **state) {
  (void)state;
  return testutil_tmpdir(g_dir, sizeof g_dir, "test-ar") ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  return testutil_rmtree(g_dir);
}

/* the same through the collectives' scheduler (trainer_sched.h) */
static void test_sched_bitwise(void **state) {
  g_sched = 1;
  test_bitwise(state);
  g_sched = 0;
}

static void test_sched_one_rank(void **state) {
  g_sched = 1;
  test_one_rank(state);
  g_sched = 0;
}

static void test_sched_peer_gone(void **state) {
  g_sched = 1;
  test_peer_gone(state);
  g_sched = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bitwise),        cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_peer_gone),      cmocka_unit_test(test_sched_bitwise),
      cmocka_unit_test(test_sched_one_rank), cmocka_unit_test(test_sched_peer_gone),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
