/* Unit tests of table (key layout, lazy init) and shard (routing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <string.h>

#include "shard.h"
#include "table.h"

static void make_layout(table_layout_t *l, uint64_t seed) {
  assert_int_equal(table_layout_init(l, 3, seed), 0);
  l->tables[0] = (table_info_t){.rows = 100, .dim = 4, .state_floats = 0};
  l->tables[1] = (table_info_t){.rows = 1000000, .dim = 8, .state_floats = 1};
  l->tables[2] = (table_info_t){.rows = 50, .dim = 16, .state_floats = 16};
}

static void test_keys(void **st) {
  table_layout_t l;
  make_layout(&l, 7);
  char why[200];
  assert_int_equal(TABLE_ID(TABLE_KEY(2, 49)), 2);
  assert_int_equal(TABLE_ROW(TABLE_KEY(2, 49)), 49);
  assert_int_equal(table_check_key(&l, TABLE_KEY(2, 49), why, sizeof why), 0);
  assert_int_equal(table_check_key(&l, TABLE_KEY(2, 50), why, sizeof why), -ERANGE);
  assert_non_null(strstr(why, "row 50 of table 2, which has 50 rows"));
  assert_int_equal(table_check_key(&l, TABLE_KEY(3, 0), why, sizeof why), -ENOENT);
  assert_non_null(strstr(why, "table 3 but the layout has 3 tables"));
  assert_int_equal(table_row_floats(&l, 2), 32);
  assert_int_equal(table_max_row_floats(&l), 32);
  table_layout_close(&l);
}

static void test_init_row(void **st) {
  table_layout_t a, b;
  make_layout(&a, 7);
  make_layout(&b, 8);
  float x[32], y[32], z[32];
  table_init_row(&a, TABLE_KEY(2, 5), x);
  table_init_row(&a, TABLE_KEY(2, 5), y);
  assert_memory_equal(x, y, sizeof x);
  table_init_row(&b, TABLE_KEY(2, 5), z); /* other seed, other row */
  assert_memory_not_equal(x, z, 16 * sizeof(float));
  table_init_row(&a, TABLE_KEY(2, 6), z); /* other key, other row */
  assert_memory_not_equal(x, z, 16 * sizeof(float));
  double bound = 1.0 / sqrt(50.0), sum = 0;
  for (int i = 0; i < 16; i++) {
    assert_true(fabs(x[i]) <= bound);
    sum += fabs(x[i]);
  }
  assert_true(sum > 0);
  for (int i = 16; i < 32; i++) assert_true(x[i] == 0.0f); /* optimizer state starts at 0 */
  assert_int_not_equal(table_layout_hash(&a), table_layout_hash(&b));
  table_layout_t c;
  assert_int_equal(table_layout_copy(&c, &a), 0);
  assert_int_equal(table_layout_hash(&a), table_layout_hash(&c));
  c.tables[1].dim = 9;
  assert_int_not_equal(table_layout_hash(&a), table_layout_hash(&c));
  table_layout_close(&a);
  table_layout_close(&b);
  table_layout_close(&c);
}

static void test_shard_map(void **st) {
  table_layout_t l;
  make_layout(&l, 7);
  shard_map_t m;
  assert_int_equal(shard_map_init(&m, &l, 0, 1000), -EINVAL);
  assert_int_equal(shard_map_init(&m, &l, 3, 1000), 0);
  /* tables 0 and 2 are small: whole on one server; table 1 row-wise */
  assert_true(m.table_server[0] < 3);
  assert_true(m.table_server[2] < 3);
  assert_int_equal(m.table_server[1], SHARD_ROWWISE);
  for (uint64_t r = 0; r < 100; r++) assert_int_equal(shard_of(&m, TABLE_KEY(0, r)), m.table_server[0]);
  unsigned count[3] = {0};
  for (uint64_t r = 0; r < 30000; r++) count[shard_of(&m, TABLE_KEY(1, r))]++;
  for (int s = 0; s < 3; s++) assert_true(count[s] > 9000 && count[s] < 11000);
  /* the plan is a pure function of its inputs */
  shard_map_t m2;
  assert_int_equal(shard_map_init(&m2, &l, 3, 1000), 0);
  assert_memory_equal(m.table_server, m2.table_server, 3 * sizeof(uint32_t));
  shard_map_close(&m2);
  shard_map_close(&m);
  assert_int_equal(shard_map_init(&m, &l, 1, 1000), 0);
  assert_int_equal(shard_of(&m, TABLE_KEY(1, 12345)), 0);
  shard_map_close(&m);
  table_layout_close(&l);
}

/* Row-wise by jump consistent hash: even over the servers; from n to
 * n + 1 servers about 1/(n + 1) of the keys move, every one of them to the
 * new server, and back from n + 1 to n only the last server's move; the
 * modulo rule moves about n/(n + 1). */
static void test_shard_jump(void **st) {
  (void)st;
  table_layout_t l;
  make_layout(&l, 7);
  enum { KEYS = 60000 };
  for (uint32_t n = 1; n <= 6; n++) {
    shard_map_t a, b, ma, mb;
    assert_int_equal(shard_map_init(&a, &l, n, 1000), 0);
    assert_int_equal(shard_map_init(&b, &l, n + 1, 1000), 0);
    assert_int_equal(shard_map_init_rule(&ma, &l, n, 1000, 1), 0);
    assert_int_equal(shard_map_init_rule(&mb, &l, n + 1, 1000, 1), 0);
    unsigned moved = 0, moved_mod = 0, count[8] = {0};
    for (uint64_t r = 0; r < KEYS; r++) {
      uint64_t k = TABLE_KEY(1, r);
      uint32_t x = shard_of(&a, k), y = shard_of(&b, k);
      assert_true(x < n && y < n + 1);
      if (x != y) {
        moved++;
        assert_int_equal(y, n); /* only to the new server */
      }
      count[y]++;
      moved_mod += shard_of(&ma, k) != shard_of(&mb, k);
    }
    double want = (double)KEYS / (n + 1);
    if (fabs(moved - want) > 0.05 * want) fail_msg("%u -> %u servers: %u keys moved, about %.0f wanted", n, n + 1, moved, want);
    for (uint32_t s = 0; s <= n; s++) assert_true(fabs(count[s] - want) < 0.05 * want);
    if (n > 1) assert_true(moved_mod > 0.9 * KEYS * n / (n + 1)); /* modulo moves most of them */
    assert_string_equal(shard_rule_name(&a), "consistent");
    assert_string_equal(shard_rule_name(&ma), "modulo");
    shard_map_close(&a), shard_map_close(&b), shard_map_close(&ma), shard_map_close(&mb);
  }
  table_layout_close(&l);
}

/* Whole tables by the consistent rule: from n to n + 1 servers only tables
 * onto the new server move (and so back from n + 1 to n only its tables),
 * and the loads stay within the biggest table of the mean. */
static void test_shard_whole(void **st) {
  (void)st;
  enum { T = 26 };
  table_layout_t l;
  assert_int_equal(table_layout_init(&l, T, 3), 0);
  uint64_t x = 12345, total = 0, biggest = 0;
  for (int t = 0; t < T; t++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    l.tables[t] = (table_info_t){.rows = 10 + (x >> 40) % 5000, .dim = 16, .state_floats = 1};
    uint64_t b = l.tables[t].rows * (uint64_t)table_row_floats(&l, t);
    total += b;
    if (b > biggest) biggest = b;
  }
  for (uint32_t n = 1; n <= 7; n++) {
    shard_map_t a, b;
    assert_int_equal(shard_map_init(&a, &l, n, 1u << 20), 0);
    assert_int_equal(shard_map_init(&b, &l, n + 1, 1u << 20), 0);
    uint64_t load[8] = {0};
    for (int t = 0; t < T; t++) {
      assert_true(a.table_server[t] < n);
      if (a.table_server[t] != b.table_server[t]) assert_int_equal(b.table_server[t], n);
      load[b.table_server[t]] += l.tables[t].rows * (uint64_t)table_row_floats(&l, t);
    }
    for (uint32_t s = 0; s <= n; s++) assert_true(load[s] <= total / (n + 1) + biggest);
    shard_map_close(&a), shard_map_close(&b);
  }
  table_layout_close(&l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shard_whole),
      cmocka_unit_test(test_shard_jump),
      cmocka_unit_test(test_keys),
      cmocka_unit_test(test_init_row),
      cmocka_unit_test(test_shard_map),
  };
  return cmocka_run_group_tests_name("table", tests, NULL, NULL);
}
