/*
 * The fork-join pool of common/model/pool.h: every thread runs the
 * function once per run with its own tid, runs do not overlap, and a pool
 * of one thread runs on the caller.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pool.h"

typedef struct hits_s {
  uint32_t seen[8];
  uint32_t nt;
  uint64_t sum[8];
} hits_t;

static void mark(void *arg, uint32_t tid, uint32_t nt) {
  hits_t *h = arg;
  h->seen[tid]++;
  h->nt = nt;
  /* a share that depends on tid only: sum of its slice of 0..9999 */
  uint64_t s = 0;
  for (uint32_t i = tid; i < 10000; i += nt) s += i;
  h->sum[tid] = s;
}

static void test_pool_runs(void **state) {
  (void)state;
  for (uint32_t n = 1; n <= 4; n++) {
    pool_t *p;
    assert_int_equal(pool_create(n, &p), 0);
    assert_int_equal(pool_threads(p), n);
    hits_t h;
    memset(&h, 0, sizeof(h));
    for (int r = 0; r < 100; r++) pool_run(p, mark, &h);
    assert_int_equal(h.nt, n);
    uint64_t total = 0;
    for (uint32_t t = 0; t < n; t++) {
      assert_int_equal(h.seen[t], 100);
      total += h.sum[t];
    }
    for (uint32_t t = n; t < 8; t++) assert_int_equal(h.seen[t], 0);
    assert_int_equal(total, 10000ull * 9999 / 2);
    pool_destroy(p);
  }
  assert_true(pool_default_threads() >= 1);
  hits_t h;
  memset(&h, 0, sizeof(h));
  pool_run(NULL, mark, &h); /* no pool: the caller alone */
  assert_int_equal(h.seen[0], 1);
  assert_int_equal(h.nt, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
