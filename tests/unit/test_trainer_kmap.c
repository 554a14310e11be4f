/*
 * trainer_kmap: the trainer's owned view of its cache (slot -> key, key ->
 * slot, owned flags), which evaluation relies on to read cached rows.
 * Random operations against a plain reference (an array per slot and a
 * linear search), enough of them to grow the hash table several times and
 * to exercise backward-shift deletion in long probe runs; plus the edge
 * cases: a key moving to another slot, clearing an empty slot, slots out
 * of range, owned rows listed in slot order and forgotten when cleared.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "table.h"
#include "trainer_kmap.h"

#define SLOTS 5000
#define NONE UINT64_MAX

static void check_against(const trainer_kmap_t *m, const uint64_t *ref, const uint8_t *owned) {
  size_t n = 0, n_owned = 0;
  for (uint32_t s = 0; s < SLOTS; s++) {
    if (ref[s] == NONE) continue;
    n++;
    n_owned += owned[s];
    assert_int_equal(trainer_kmap_find(m, ref[s]), (int64_t)s);
  }
  assert_int_equal(trainer_kmap_count(m), n);
  assert_int_equal(trainer_kmap_owned(m, NULL, NULL, 0), n_owned);
  uint32_t *os = malloc((n_owned + 1) * sizeof *os);
  uint64_t *ok = malloc((n_owned + 1) * sizeof *ok);
  assert_int_equal(trainer_kmap_owned(m, os, ok, n_owned + 1), n_owned);
  size_t k = 0;
  for (uint32_t s = 0; s < SLOTS; s++)
    if (ref[s] != NONE && owned[s]) {
      assert_int_equal(os[k], s);
      assert_int_equal(ok[k], ref[s]);
      k++;
    }
  free(os);
  free(ok);
}

static void test_random_ops(void **state) {
  (void)state;
  trainer_kmap_t *m;
  assert_int_equal(trainer_kmap_create(SLOTS, &m), 0);
  uint64_t *ref = malloc(SLOTS * sizeof *ref);
  uint8_t *owned = calloc(SLOTS, 1);
  for (uint32_t s = 0; s < SLOTS; s++) ref[s] = NONE;
  uint64_t r = 12345;
  for (int op = 0; op < 200000; op++) {
    r = table_mix64(r);
    uint32_t s = (uint32_t)(r % SLOTS);
    uint64_t key = TABLE_KEY((r >> 20) % 3, (r >> 24) % 6000); /* keys collide with slots' keys often */
    switch ((r >> 40) % 4) {
    case 0:
    case 1: { /* set: the key leaves any other slot */
      for (uint32_t q = 0; q < SLOTS; q++)
        if (ref[q] == key) {
          ref[q] = NONE;
          owned[q] = 0;
        }
      ref[s] = key;
      owned[s] = 0;
      assert_int_equal(trainer_kmap_set(m, s, key), 0);
      break;
    }
    case 2:
      ref[s] = NONE;
      owned[s] = 0;
      trainer_kmap_clear(m, s);
      break;
    case 3:
      if (ref[s] != NONE) owned[s] = (r >> 50) & 1;
      trainer_kmap_set_owned(m, s, (int)((r >> 50) & 1));
      break;
    }
    if (op % 20000 == 0) check_against(m, ref, owned);
  }
  check_against(m, ref, owned);
  /* keys never set are absent */
  assert_int_equal(trainer_kmap_find(m, TABLE_KEY(7, 1)), -1);
  free(ref);
  free(owned);
  trainer_kmap_destroy(m);
}

static void test_edges(void **state) {
  (void)state;
  trainer_kmap_t *m;
  assert_int_equal(trainer_kmap_create(4, &m), 0);
  assert_int_equal(trainer_kmap_set(m, 4, 9), -22); /* -EINVAL: beyond the cache */
  trainer_kmap_clear(m, 2);                          /* empty: nothing happens */
  trainer_kmap_set_owned(m, 2, 1);                   /* empty: not owned */
  assert_int_equal(trainer_kmap_owned(m, NULL, NULL, 0), 0);
  assert_int_equal(trainer_kmap_set(m, 1, 77), 0);
  trainer_kmap_set_owned(m, 1, 1);
  assert_int_equal(trainer_kmap_set(m, 3, 77), 0); /* moved: slot 1 is empty, and no longer owned */
  assert_int_equal(trainer_kmap_find(m, 77), 3);
  assert_int_equal(trainer_kmap_owned(m, NULL, NULL, 0), 0);
  assert_int_equal(trainer_kmap_count(m), 1);
  assert_int_equal(trainer_kmap_set(m, 3, 78), 0); /* replaced in its slot */
  assert_int_equal(trainer_kmap_find(m, 77), -1);
  assert_int_equal(trainer_kmap_find(m, 78), 3);
  trainer_kmap_set_owned(m, 3, 1);
  trainer_kmap_clear(m, 3);
  assert_int_equal(trainer_kmap_owned(m, NULL, NULL, 0), 0);
  assert_int_equal(trainer_kmap_count(m), 0);
  trainer_kmap_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_ops),
      cmocka_unit_test(test_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
