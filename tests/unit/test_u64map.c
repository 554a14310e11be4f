/*
 * u64map: the uint64 -> uint32 linear-probing map of common/u64map.h.
 *
 *  - random insert / find / erase (300k operations in three rounds, each
 *    from an empty 16-entry table grown to 32k entries and drained again)
 *    against a brute-force reference (a value and a present flag per key of
 *    a fixed universe), the pointer insert returns used to overwrite values.
 *    The universe mixes random keys, consecutive TABLE_KEY keys, the extreme
 *    keys 0 and UINT64_MAX, and three clusters of 600 keys that share the
 *    top 12 bits of their hash: one home entry while the table is small, a
 *    few adjacent ones later, so probe runs are hundreds long, one of them
 *    wraps from the end of the table to its start and runs into another.
 *    Every 100 operations the table is checked for its invariant (no empty
 *    entry between any key's home and its entry), every 5000 every key of
 *    the universe is looked up: a deletion that broke a probe chain fails.
 *  - every order of erasing seven keys whose runs wrap around a 16-entry
 *    table (after three insertion orders), checking every key after each
 *    erase (the cyclic case of backward-shift deletion).
 *  - edges: keys 0 and UINT64_MAX, values 0 and UINT32_MAX, absent keys,
 *    insert of a present key, the size hint, close twice.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "table.h"
#include "u64map.h"

/* Every key's home lies in its own run: no empty entry between the two;
 * and the map's count is the number of full entries. */
static void check_runs(const u64map_t *m) {
  size_t mask = m->cap - 1, e0 = 0, n = 0;
  while (e0 < m->cap && m->tab[e0].full) e0++;
  assert_true(e0 < m->cap); /* never full */
  size_t run = 1;           /* offset from e0 of the current run's start */
  for (size_t d = 1; d < m->cap; d++) {
    size_t j = (e0 + d) & mask;
    if (!m->tab[j].full) {
      run = d + 1;
      continue;
    }
    n++;
    size_t back = (j - u64map_home(m, m->tab[j].key)) & mask;
    assert_true(back <= d - run);
  }
  assert_int_equal(n, m->n);
}

/* ---- random operations against a reference ---- */

#define N_RANDOM 6000
#define N_SEQ 2000 /* per table, 3 tables */
#define N_CLUSTER 600
#define N_CLUSTERS 3
#define N_SPECIAL 4
#define N_CL (N_CLUSTERS * N_CLUSTER)
#define N_KEYS (N_CL + N_RANDOM + 3 * N_SEQ + N_SPECIAL)

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* keys[0..N_CL) are the clusters, the rest the others; all distinct. */
static void make_universe(uint64_t *keys) {
  static const size_t top[N_CLUSTERS] = {0xfff, 0x000, 0x7ff};
  const u64map_t by12 = {.shift = 52}; /* home in a 4096-entry table */
  size_t got[N_CLUSTERS] = {0}, k = 0;
  for (uint64_t i = 0; k < N_CL; i++) {
    uint64_t key = TABLE_KEY(100, i);
    size_t h = u64map_home(&by12, key);
    for (int c = 0; c < N_CLUSTERS; c++)
      if (h == top[c] && got[c] < N_CLUSTER) {
        keys[c * N_CLUSTER + got[c]++] = key;
        k++;
      }
  }
  uint64_t r = 99;
  for (int i = 0; i < N_RANDOM; i++) keys[k++] = r = table_mix64(r);
  for (uint32_t t = 0; t < 3; t++)
    for (uint64_t row = 0; row < N_SEQ; row++) keys[k++] = TABLE_KEY(t, row);
  keys[k++] = TABLE_KEY(65535, 0); /* (0 is TABLE_KEY(0, 0), above) */
  keys[k++] = UINT64_MAX;
  keys[k++] = UINT64_MAX - 1;
  keys[k++] = UINT64_C(1) << 63;
  assert_int_equal(k, N_KEYS);
  uint64_t *sorted = malloc(N_KEYS * sizeof *sorted);
  memcpy(sorted, keys, N_KEYS * sizeof *sorted);
  qsort(sorted, N_KEYS, sizeof *sorted, cmp_u64);
  for (size_t i = 1; i < N_KEYS; i++) assert_true(sorted[i] != sorted[i - 1]);
  free(sorted);
}

typedef struct ref_s {
  uint32_t val[N_KEYS];
  uint8_t has[N_KEYS];
  size_t n;
} ref_t;

static void check_all(const u64map_t *m, const uint64_t *keys, const ref_t *ref) {
  for (size_t i = 0; i < N_KEYS; i++) {
    uint32_t v = 0;
    assert_int_equal(u64map_find(m, keys[i], &v), ref->has[i]);
    if (ref->has[i]) assert_int_equal(v, ref->val[i]);
  }
  assert_int_equal(u64map_count(m), ref->n);
}

static void one_op(u64map_t *m, const uint64_t *keys, ref_t *ref, uint64_t r, int filling) {
  size_t i = (r & 1) ? (size_t)((r >> 1) % N_CL) : (size_t)((r >> 1) % N_KEYS);
  uint32_t v = (uint32_t)(r >> 32), got = 0;
  if ((r >> 24) % 7 == 0) v = (r >> 27) & 1 ? UINT32_MAX : 0;
  unsigned die = (unsigned)((r >> 16) % 100);
  unsigned p_insert = filling ? 65 : 20, p_erase = filling ? 20 : 65;
  if (die < p_insert) {
    uint32_t *at = NULL;
    assert_int_equal(u64map_insert(m, keys[i], v, &at), !ref->has[i]);
    assert_non_null(at);
    if (!ref->has[i]) {
      ref->has[i] = 1;
      ref->val[i] = v;
      ref->n++;
    }
    assert_int_equal(*at, ref->val[i]);
    if ((r >> 28) & 1) *at = ref->val[i] = v ^ 0x5a5a5a5a; /* overwrite through at */
  } else if (die < p_insert + p_erase) {
    assert_int_equal(u64map_erase(m, keys[i], &got), ref->has[i]);
    if (ref->has[i]) {
      assert_int_equal(got, ref->val[i]);
      ref->has[i] = 0;
      ref->n--;
    }
    assert_int_equal(u64map_find(m, keys[i], NULL), 0);
  } else {
    assert_int_equal(u64map_find(m, keys[i], &got), ref->has[i]);
    if (ref->has[i]) assert_int_equal(got, ref->val[i]);
  }
  assert_int_equal(u64map_count(m), ref->n);
}

static void test_random_ops(void **state) {
  (void)state;
  uint64_t *keys = malloc(N_KEYS * sizeof *keys);
  ref_t *ref = malloc(sizeof *ref);
  make_universe(keys);
  uint64_t r = 12345;
  for (int round = 0; round < 3; round++) {
    u64map_t m;
    assert_int_equal(u64map_init(&m, 0), 0);
    assert_int_equal(m.cap, 16);
    memset(ref, 0, sizeof *ref);
    size_t max_cap = 0;
    for (int op = 0; op < 100000; op++) {
      r = table_mix64(r);
      one_op(&m, keys, ref, r, op < 50000);
      if (m.cap > max_cap) max_cap = m.cap;
      if (op % 100 == 0) check_runs(&m);
      if (op % 5000 == 0) check_all(&m, keys, ref);
    }
    assert_true(max_cap >= 16384); /* grew at least 10 times */
    check_runs(&m);
    check_all(&m, keys, ref);
    for (size_t i = 0; i < N_KEYS; i++) /* drain: clusters first, then the rest */
      assert_int_equal(u64map_erase(&m, keys[i], NULL), ref->has[i]);
    assert_int_equal(u64map_count(&m), 0);
    for (size_t j = 0; j < m.cap; j++) assert_int_equal(m.tab[j].full, 0);
    u64map_close(&m);
  }
  free(ref);
  free(keys);
}

/* ---- every erase order of runs that wrap around a small table ---- */

#define N_WRAP 7

/* The next permutation of a[0..n) in lexicographic order; 0 (and a back
 * at the first, ascending) after the last. */
static int next_perm(int *a, int n) {
  int i = n - 2, t;
  while (i >= 0 && a[i] >= a[i + 1]) i--;
  if (i >= 0) {
    int j = n - 1;
    while (a[j] <= a[i]) j--;
    t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  for (int lo = i + 1, hi = n - 1; lo < hi; lo++, hi--) {
    t = a[lo];
    a[lo] = a[hi];
    a[hi] = t;
  }
  return i >= 0;
}

static void test_wrap_erase_orders(void **state) {
  (void)state;
  /* homes in a 16-entry table: 14, 15 x4, 0 x2 -- entries 14..15, 0..4 */
  static const size_t want[N_WRAP] = {14, 15, 15, 15, 15, 0, 0};
  u64map_t m;
  assert_int_equal(u64map_init(&m, 0), 0);
  assert_int_equal(m.cap, 16);
  uint64_t keys[N_WRAP];
  int found = 0;
  for (uint64_t c = 1; found < N_WRAP; c++) /* keys[i]: home want[i], all distinct */
    if (u64map_home(&m, c) == want[found]) keys[found++] = c;
  /* a few insertion orders (different layouts), each with every erase order */
  static const int ins[3][N_WRAP] = {{0, 1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1, 0}, {5, 1, 6, 2, 0, 3, 4}};
  int perm[N_WRAP];
  for (int i = 0; i < N_WRAP; i++) perm[i] = i;
  size_t orders = 0;
  for (int o = 0; o < 3; o++) {
    do {
      for (int i = 0; i < N_WRAP; i++)
        assert_int_equal(u64map_insert(&m, keys[ins[o][i]], (uint32_t)ins[o][i], NULL), 1);
      assert_int_equal(m.cap, 16);
      check_runs(&m);
      uint8_t gone[N_WRAP] = {0};
      for (int e = 0; e < N_WRAP; e++) {
        uint32_t v;
        assert_int_equal(u64map_erase(&m, keys[perm[e]], &v), 1);
        assert_int_equal(v, (uint32_t)perm[e]);
        gone[perm[e]] = 1;
        check_runs(&m);
        for (int i = 0; i < N_WRAP; i++) {
          assert_int_equal(u64map_find(&m, keys[i], &v), !gone[i]);
          if (!gone[i]) assert_int_equal(v, (uint32_t)i);
        }
      }
      assert_int_equal(u64map_count(&m), 0);
      orders++;
    } while (next_perm(perm, N_WRAP)); /* ends back at the identity */
  }
  assert_int_equal(orders, 3 * 5040);
  u64map_close(&m);
}

/* ---- edges ---- */

static void test_edges(void **state) {
  (void)state;
  u64map_t m;
  assert_int_equal(u64map_init(&m, 0), 0);
  uint32_t v = 7, *at = NULL;
  assert_int_equal(u64map_find(&m, 0, &v), 0);
  assert_int_equal(v, 7); /* untouched when absent */
  assert_int_equal(u64map_erase(&m, UINT64_MAX, &v), 0);
  assert_int_equal(u64map_insert(&m, 0, UINT32_MAX, NULL), 1);
  assert_int_equal(u64map_insert(&m, UINT64_MAX, 0, &at), 1);
  assert_int_equal(*at, 0);
  assert_int_equal(u64map_insert(&m, UINT64_MAX, 5, &at), 0); /* present: keeps 0 */
  assert_int_equal(*at, 0);
  *at = 6;
  assert_int_equal(u64map_find(&m, UINT64_MAX, &v), 1);
  assert_int_equal(v, 6);
  assert_int_equal(u64map_find(&m, 0, &v), 1);
  assert_int_equal(v, UINT32_MAX);
  assert_int_equal(u64map_count(&m), 2);
  assert_int_equal(u64map_erase(&m, 0, &v), 1);
  assert_int_equal(v, UINT32_MAX);
  assert_int_equal(u64map_find(&m, 0, NULL), 0);
  assert_int_equal(u64map_find(&m, UINT64_MAX, NULL), 1);
  assert_int_equal(u64map_count(&m), 1);
  u64map_close(&m);
  u64map_close(&m); /* zeroed: safe */

  /* room for the hinted keys without growing */
  assert_int_equal(u64map_init(&m, 1000), 0);
  size_t cap = m.cap;
  assert_true(cap >= 2000);
  for (uint64_t k = 0; k < 1000; k++) assert_int_equal(u64map_insert(&m, TABLE_KEY(1, k), (uint32_t)k, NULL), 1);
  assert_int_equal(m.cap, cap);
  for (uint64_t k = 0; k < 1000; k++) {
    assert_int_equal(u64map_find(&m, TABLE_KEY(1, k), &v), 1);
    assert_int_equal(v, (uint32_t)k);
  }
  check_runs(&m);
  u64map_close(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_ops),
      cmocka_unit_test(test_wrap_erase_orders),
      cmocka_unit_test(test_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
