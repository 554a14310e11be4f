/*
 * Unit tests of a running store onto another count of servers
 * (store_reshape.c): the shard map replaced, the rows it no longer owns
 * read out in key order (in batches, a buffer too small for one row), and
 * deleted; a store whose shard is past the new count owns nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "shard.h"
#include "store.h"
#include "table.h"
#include "testutil.h"

#define NKEYS 3000

typedef struct fx_s {
  char dir[64];
  table_layout_t layout;
  shard_map_t m2, m3, m1;
  store_t *s;
  uint64_t keys[NKEYS]; /* written, all owned by server 0 of 2 */
  size_t n;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(testutil_tmpdir(f->dir, sizeof f->dir, "reshape"), 0);
  assert_int_equal(table_layout_init(&f->layout, 3, 42), 0);
  f->layout.tables[0] = (table_info_t){.rows = 200, .dim = 4, .state_floats = 1};      /* whole: greedy */
  f->layout.tables[1] = (table_info_t){.rows = 100000, .dim = 8, .state_floats = 0};   /* row-wise */
  f->layout.tables[2] = (table_info_t){.rows = 50000, .dim = 2, .state_floats = 2};    /* row-wise */
  assert_int_equal(shard_map_init(&f->m2, &f->layout, 2, 1000), 0);
  assert_int_equal(shard_map_init(&f->m3, &f->layout, 3, 1000), 0);
  assert_int_equal(shard_map_init(&f->m1, &f->layout, 1, 1000), 0);
  store_opts_t o = {.data_dir = f->dir, .layout = &f->layout, .shard_map = &f->m2, .shard = 0,
                    .hot_bytes = 1u << 20, .block_cache_bytes = 8u << 20};
  char why[512] = "";
  assert_int_equal(store_open(&o, &f->s, why, sizeof why), 0);
  /* rows of server 0 of 2, written */
  for (uint64_t i = 0; f->n < NKEYS; i++) {
    uint64_t k = TABLE_KEY(1 + i % 2, (i * 7919) % 50000);
    if (shard_of(&f->m2, k) != 0) continue;
    int dup = 0;
    for (size_t j = 0; j < f->n && !dup; j++) dup = f->keys[j] == k;
    if (!dup) f->keys[f->n++] = k;
  }
  size_t bytes = 0;
  assert_int_equal(store_rows_bytes(f->s, f->keys, f->n, &bytes, why, sizeof why), 0);
  float *rows = malloc(bytes);
  for (size_t i = 0; i < bytes / 4; i++) rows[i] = (float)i * 0.25f;
  assert_int_equal(store_write(f->s, f->keys, f->n, rows, bytes, 0, why, sizeof why), 0);
  free(rows);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  store_close(f->s);
  shard_map_close(&f->m1);
  shard_map_close(&f->m2);
  shard_map_close(&f->m3);
  table_layout_close(&f->layout);
  testutil_rmtree(f->dir);
  free(f);
  return 0;
}

static uint64_t stored(store_t *s) {
  uint64_t n = 0;
  assert_int_equal(store_digest(s, NULL, NULL, &n), 0);
  return n;
}

/* Every foreign row, batch by batch of `max` into cap bytes, deleted as
 * the server does; returns how many, checking each against the map. */
static size_t drain(fx_t *f, const shard_map_t *m, uint32_t shard, size_t max, size_t cap, uint64_t *owned) {
  uint64_t *keys = calloc(max, sizeof *keys), from = 0, last = 0;
  size_t *lens = calloc(max, sizeof *lens), total = 0;
  uint8_t *buf = malloc(cap);
  char why[512];
  *owned = 0;
  while (from != STORE_SCAN_END) {
    size_t used = 0;
    uint64_t o = 0;
    int n = store_foreign_rows(f->s, &from, keys, buf, cap, lens, max, &used, &o);
    *owned += o;
    assert_true(n >= 0);
    if (n == 0) break;
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
      assert_true(shard >= m->n_servers || shard_of(m, keys[i]) != shard);
      assert_true(total + (size_t)i == 0 || keys[i] > last); /* key order, each once */
      last = keys[i];
      assert_int_equal(lens[i], table_row_bytes(&f->layout, TABLE_ID(keys[i])));
      sum += lens[i];
    }
    assert_int_equal(used, sum);
    assert_int_equal(store_delete_rows(f->s, keys, (size_t)n, why, sizeof why), 0);
    total += (size_t)n;
  }
  free(keys);
  free(lens);
  free(buf);
  return total;
}

static void test_two_to_three(void **state) {
  fx_t *f = *state;
  char why[512] = "";
  size_t want = 0;
  for (size_t i = 0; i < f->n; i++) want += shard_of(&f->m3, f->keys[i]) != 0;
  /* before: server 0 of 2 owns them all */
  uint64_t owned = 0;
  assert_int_equal(drain(f, &f->m2, 0, 64, 1 << 16, &owned), 0);
  assert_int_equal(owned, f->n);
  assert_int_equal(store_set_shard_map(f->s, &f->m3, 0, why, sizeof why), 0);
  size_t moved = drain(f, &f->m3, 0, 100, 1 << 16, &owned);
  assert_true(want > 0 && want < f->n);
  assert_int_equal(moved, want);
  assert_int_equal(owned, f->n - want);
  assert_int_equal(stored(f->s), f->n - want);
  /* the new map checks keys: its own are written, another server's refused */
  uint64_t mine = 0, other = 0;
  for (uint64_t r = 0; !mine || !other; r++) {
    uint64_t k = TABLE_KEY(1, r);
    if (shard_of(&f->m3, k) == 0) mine = k;
    else other = k;
  }
  float row[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(store_write(f->s, &mine, 1, row, sizeof row, 0, why, sizeof why), 0);
  assert_int_equal(store_write(f->s, &other, 1, row, sizeof row, 0, why, sizeof why), ERR_WRONGSHARD);
  assert_non_null(strstr(why, "of 3"));
}

static void test_past_the_count(void **state) {
  fx_t *f = *state;
  char why[512] = "";
  assert_int_equal(store_set_shard_map(f->s, &f->m1, 1, why, sizeof why), 0); /* server 1 of 1: owns nothing */
  uint64_t owned = 0;
  assert_int_equal(drain(f, &f->m1, 1, 7, 1 << 12, &owned), f->n);
  assert_int_equal(owned, 0);
  assert_int_equal(stored(f->s), 0);
}

static void test_small_buffer_and_bad_map(void **state) {
  fx_t *f = *state;
  char why[512] = "";
  assert_int_equal(store_set_shard_map(f->s, &f->m1, 1, why, sizeof why), 0);
  uint64_t keys[4];
  size_t lens[4], used = 0;
  uint8_t buf[8];
  uint64_t from = 0;
  assert_int_equal(store_foreign_rows(f->s, &from, keys, buf, sizeof buf, lens, 4, &used, NULL), -ENOBUFS);
  assert_true(used > sizeof buf); /* the size the next row needs; nothing consumed */
  assert_int_equal(stored(f->s), f->n);
  shard_map_t bad = f->m3;
  bad.n_tables = 2;
  assert_int_equal(store_set_shard_map(f->s, &bad, 0, why, sizeof why), -EINVAL);
  assert_non_null(strstr(why, "does not fit a layout of 3 tables"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_to_three, setup, teardown),
      cmocka_unit_test_setup_teardown(test_past_the_count, setup, teardown),
      cmocka_unit_test_setup_teardown(test_small_buffer_and_bad_map, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
