/*
 * test_oracle_laia: locality-aware sample allocation
 * (common/plan/laia.c).
 *
 * Why: the allocation decides which rows stay on one trainer (owned, never
 * synchronized) and which travel; it must give every trainer its equal
 * share whatever the data, depend on nothing but the batches, P, window
 * and seed (runs with any lookahead must be comparable bit for bit), and
 * actually gather a row's samples.  Checked against a reference written
 * the plain way (a dense array per row, scores recomputed from scratch),
 * over random skewed streams with small windows (rows expire, the map
 * drops and grows), by hand on small cases (held rows attract, rows used
 * by two trainers in a batch attract nobody, expired rows attract
 * nobody), and by the result that matters: fewer rows shared between
 * trainers per batch, and fewer rows changing hands between batches, than
 * contiguous allocation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "laia.h"
#include "plan.h"
#include "table.h"

#include "batch_util.h"

/* ------------------------------------------------------------ reference */

#define MAXT 4
#define MAXROWS 4096

typedef struct ref_s {
  uint32_t P, window;
  uint64_t seed;
  int64_t last[MAXT][MAXROWS]; /* -1: never used */
  uint32_t holder[MAXT][MAXROWS]; /* trainer + 1, or UINT32_MAX: several */
  uint8_t on[MAXT];               /* tables scored */
} ref_t;

static void ref_init(ref_t *r, uint32_t P, uint32_t window, uint64_t seed) {
  memset(r, 0, sizeof *r);
  r->P = P;
  r->window = window;
  r->seed = seed;
  for (int t = 0; t < MAXT; t++) {
    r->on[t] = 1;
    for (int i = 0; i < MAXROWS; i++) r->last[t][i] = -1;
  }
}

/* No trainer holds a row of sample i: the draw over the trainers with
 * room, listed as laia.c keeps them (in trainer order at first; a
 * trainer that fills up is replaced by the last of the list), which is
 * replayed from the samples placed before i. */
static uint32_t open_pick(const uint32_t *owner, uint32_t i, uint32_t B, uint32_t P, uint64_t rr) {
  uint32_t rm[64], open[64], pos[64], n_open = 0;
  for (uint32_t t = 0; t < P; t++) {
    rm[t] = B / P + (t < B % P);
    if (rm[t]) {
      pos[t] = n_open;
      open[n_open++] = t;
    }
  }
  for (uint32_t j = 0; j < i; j++)
    if (!--rm[owner[j]]) {
      uint32_t p = pos[owner[j]], last = open[--n_open];
      open[p] = last;
      pos[last] = p;
    }
  return open[(uint32_t)(((unsigned __int128)rr * n_open) >> 64)];
}

static void ref_assign(ref_t *r, const data_batch_t *b, uint32_t *owner) {
  uint32_t P = r->P, B = b->n;
  int64_t x = (int64_t)b->iteration;
  uint32_t room[64], score[64];
  for (uint32_t t = 0; t < P; t++) room[t] = B / P + (t < B % P);
  uint64_t rs = table_mix64(r->seed ^ table_mix64(b->iteration ^ UINT64_C(0x6c61696131)));
  for (uint32_t i = 0; i < B; i++) {
    memset(score, 0, sizeof score);
    for (uint32_t t = 0; t < b->n_tables; t++)
      for (uint32_t h = 0; h < b->hotness[t] && r->on[t]; h++) {
        uint64_t row = b->ids[b->ids_off[t] + (size_t)i * b->hotness[t] + h];
        if (r->last[t][row] < 0 || x - r->last[t][row] > r->window || r->holder[t][row] == UINT32_MAX) continue;
        score[r->holder[t][row] - 1]++;
      }
    uint32_t best = 0, cand[64], nc = 0;
    for (uint32_t q = 0; q < P; q++) {
      if (!room[q] || !score[q] || score[q] < best) continue;
      if (score[q] > best) {
        best = score[q];
        nc = 0;
      }
      cand[nc++] = q;
    }
    uint64_t rr = table_mix64(rs + i);
    uint32_t q = nc ? cand[(uint32_t)(((unsigned __int128)rr * nc) >> 64)] : open_pick(owner, i, B, P, rr);
    owner[i] = q;
    room[q]--;
  }
  /* then the holdings take the batch in */
  for (uint32_t i = 0; i < B; i++)
    for (uint32_t t = 0; t < b->n_tables; t++)
      for (uint32_t h = 0; h < b->hotness[t] && r->on[t]; h++) {
        uint64_t row = b->ids[b->ids_off[t] + (size_t)i * b->hotness[t] + h];
        if (r->last[t][row] != x) {
          r->last[t][row] = x;
          r->holder[t][row] = owner[i] + 1;
        } else if (r->holder[t][row] != owner[i] + 1) {
          r->holder[t][row] = UINT32_MAX;
        }
      }
}

/* ------------------------------------------------------------ streams */

/* batch x of B samples over n_tables tables, ids skewed (rows * u^3) */
static void random_batch(data_batch_t *b, uint64_t x, uint32_t B, uint32_t n_tables, uint32_t hot, const uint64_t *rows) {
  uint32_t hotness[MAXT];
  uint64_t *ids = malloc(((size_t)B * hot * n_tables + 1) * sizeof *ids);
  size_t o = 0;
  for (uint32_t t = 0; t < n_tables; t++) {
    hotness[t] = hot;
    for (uint32_t i = 0; i < B * hot; i++) {
      double u = unif();
      ids[o++] = (uint64_t)((double)rows[t] * u * u * u);
    }
  }
  make_batch(b, x, B, n_tables, hotness, ids);
  free(ids);
}

static void check_shares(const uint32_t *owner, uint32_t B, uint32_t P) {
  uint32_t cnt[64] = {0};
  for (uint32_t i = 0; i < B; i++) {
    assert_true(owner[i] < P);
    cnt[owner[i]]++;
  }
  for (uint32_t t = 0; t < P; t++) assert_int_equal(cnt[t], B / P + (t < B % P));
}

/* ------------------------------------------------------------ tests */

static void test_matches_reference(void **state) {
  (void)state;
  static const uint64_t rows[MAXT] = {4000, 300, 40, 1500};
  static ref_t ref;
  const uint32_t Ps[] = {1, 2, 3, 5};
  const uint32_t windows[] = {1, 3, 40};
  for (size_t pi = 0; pi < sizeof Ps / sizeof *Ps; pi++)
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
      uint32_t P = Ps[pi], W = windows[wi];
      sm_state = 1000 + P * 31 + W;
      laia_t *l;
      laia_opts_t o = {.trainers = P, .window = W, .seed = 11 + P};
      assert_int_equal(laia_create(&o, &l), 0);
      ref_init(&ref, P, W, o.seed);
      uint64_t x0 = 5; /* the first batch may be any */
      for (uint64_t x = x0; x < x0 + 60; x++) {
        data_batch_t b;
        uint32_t B = (uint32_t)(x % 7 == 0 ? 2 : 37 + x % 11); /* sometimes B < P */
        random_batch(&b, x, B, 4, 1 + (uint32_t)(x % 2), rows);
        uint32_t got[64], want[64];
        assert_int_equal(laia_assign(l, &b, got), 0);
        ref_assign(&ref, &b, want);
        for (uint32_t i = 0; i < B; i++) assert_int_equal(got[i], want[i]);
        check_shares(got, B, P);
        data_batch_free(&b);
      }
      laia_stats_t st;
      laia_stats(l, &st);
      assert_int_equal(st.batches, 60);
      assert_true(st.scored > 0);
      assert_true(st.best <= st.scored);
      if (P == 1) assert_int_equal(st.best, st.scored);
      if (W == 1) assert_true(st.rows_held <= 2 * (4000 + 300 + 40 + 1500)); /* expired rows dropped */
      laia_destroy(l);
    }
}

/* P = 2, one table, one id a sample, by hand */
static void test_by_hand(void **state) {
  (void)state;
  const uint32_t hot = 1;
  laia_t *l;
  laia_opts_t o = {.trainers = 2, .window = 2, .seed = 3};
  assert_int_equal(laia_create(&o, &l), 0);
  data_batch_t b;
  uint32_t owner[8];
  /* batch 0: rows 1..4, all new: placed by the draw, two each */
  uint64_t ids0[] = {1, 2, 3, 4};
  make_batch(&b, 0, 4, 1, &hot, ids0);
  assert_int_equal(laia_assign(l, &b, owner), 0);
  check_shares(owner, 4, 2);
  uint32_t o0[5];
  for (int i = 0; i < 4; i++) o0[i + 1] = owner[i]; /* o0[row] = holder */
  data_batch_free(&b);
  /* batch 1: the same rows in reverse: each follows its holder */
  uint64_t ids1[] = {4, 3, 2, 1};
  make_batch(&b, 1, 4, 1, &hot, ids1);
  assert_int_equal(laia_assign(l, &b, owner), 0);
  for (int i = 0; i < 4; i++) assert_int_equal(owner[i], o0[ids1[i]]);
  data_batch_free(&b);
  /* batch 2: row 9 twice: equal shares put one sample on each trainer */
  uint64_t ids2[] = {9, 9};
  make_batch(&b, 2, 2, 1, &hot, ids2);
  assert_int_equal(laia_assign(l, &b, owner), 0);
  assert_int_not_equal(owner[0], owner[1]); /* shares force it apart: row 9 is now used by both */
  data_batch_free(&b);
  /* batch 3: row 9 attracts nobody (shared at 2); rows 1..4 last used at 1 (window 2: still held) */
  uint64_t ids3[] = {9, 1, 2, 3, 4, 9};
  make_batch(&b, 3, 6, 1, &hot, ids3);
  assert_int_equal(laia_assign(l, &b, owner), 0);
  check_shares(owner, 6, 2);
  for (int i = 1; i < 5; i++) assert_int_equal(owner[i], o0[ids3[i]]);
  data_batch_free(&b);
  /* batches 4..6 without rows 1..4; at 7 their last use (3) is 4 batches back: expired, they attract nobody,
   * so the allocation equals that of a fresh allocator (same seed) given only batch 7 */
  for (uint64_t x = 4; x <= 6; x++) {
    uint64_t ids[] = {100 + x, 200 + x};
    make_batch(&b, x, 2, 1, &hot, ids);
    assert_int_equal(laia_assign(l, &b, owner), 0);
    data_batch_free(&b);
  }
  uint64_t ids7[] = {1, 2, 3, 4};
  make_batch(&b, 7, 4, 1, &hot, ids7);
  assert_int_equal(laia_assign(l, &b, owner), 0);
  laia_t *fresh;
  uint32_t owner2[4];
  assert_int_equal(laia_create(&o, &fresh), 0);
  assert_int_equal(laia_assign(fresh, &b, owner2), 0);
  for (int i = 0; i < 4; i++) assert_int_equal(owner[i], owner2[i]);
  laia_destroy(fresh);
  /* out of order */
  b.iteration = 9;
  assert_int_equal(laia_assign(l, &b, owner), -EINVAL);
  b.iteration = 7;
  assert_int_equal(laia_assign(l, &b, owner), -EINVAL);
  data_batch_free(&b);
  laia_destroy(l);
}

static void test_bad_options(void **state) {
  (void)state;
  laia_t *l = (laia_t *)1;
  laia_opts_t o = {.trainers = 0, .window = 4};
  assert_int_equal(laia_create(&o, &l), -EINVAL);
  assert_null(l);
  o.trainers = 2;
  o.window = 0;
  assert_int_equal(laia_create(&o, &l), -EINVAL);
  o.window = LAIA_WINDOW_MAX + 1;
  assert_int_equal(laia_create(&o, &l), -EINVAL);
  assert_int_equal(plan_alloc_parse("laia"), PLAN_ALLOC_LAIA);
  uint32_t owner[4];
  assert_int_equal(plan_alloc(PLAN_ALLOC_LAIA, 1, 0, 4, 2, owner), -EINVAL); /* needs the history */
}

/* Adaptive: a profile of 6 batches over three tables -- table 0 of 2 rows
 * (every trainer uses them: never held), table 1 of 300 rows skewed (rows
 * held), table 2 whose every id is new (never held) -- keeps table 1
 * alone; from then on the allocation is the reference's scoring table 1
 * only (and before, all three). */
static void test_adaptive(void **state) {
  (void)state;
  static ref_t ref;
  const uint32_t P = 2, W = 8, PROF = 6, hot[3] = {1, 1, 1};
  laia_t *l;
  laia_opts_t o = {.trainers = P, .window = W, .seed = 4, .profile = PROF, .min_share = 0.01};
  assert_int_equal(laia_create(&o, &l), 0);
  ref_init(&ref, P, W, o.seed);
  sm_state = 321;
  uint64_t fresh = 0;
  for (uint64_t x = 0; x < 40; x++) {
    const uint32_t B = 48;
    uint64_t ids[3 * 48];
    for (uint32_t i = 0; i < B; i++) {
      ids[i] = splitmix() % 2;
      double u = unif();
      ids[B + i] = (uint64_t)(300.0 * u * u);
      ids[2 * B + i] = fresh++ % MAXROWS;
    }
    data_batch_t b;
    make_batch(&b, x, B, 3, hot, ids);
    uint32_t got[64], want[64];
    assert_int_equal(laia_assign(l, &b, got), 0);
    ref_assign(&ref, &b, want);
    for (uint32_t i = 0; i < B; i++)
      if (got[i] != want[i]) fail_msg("batch %llu sample %u: laia %u, reference %u", (unsigned long long)x, i, got[i], want[i]);
    check_shares(got, B, P);
    if (x + 1 == PROF) {
      /* the profile just ended */
      assert_false(laia_table_scored(l, 0));
      assert_true(laia_table_scored(l, 1));
      assert_false(laia_table_scored(l, 2));
      print_message("profile: shares %.4f %.4f %.4f\n", laia_table_share(l, 0), laia_table_share(l, 1),
                    laia_table_share(l, 2));
      assert_true(laia_table_share(l, 1) >= 0.01);
      assert_true(laia_table_share(l, 2) == 0.0);
      for (uint32_t t = 0; t < 3; t++) ref.on[t] = (uint8_t)laia_table_scored(l, t);
    }
    data_batch_free(&b);
  }
  laia_stats_t st;
  laia_stats(l, &st);
  assert_int_equal(st.tables, 3);
  assert_int_equal(st.tables_scored, 1);
  laia_destroy(l);
  /* a min_share nobody reaches keeps the best table */
  o.min_share = 1.0;
  assert_int_equal(laia_create(&o, &l), 0);
  sm_state = 321;
  for (uint64_t x = 0; x < PROF; x++) {
    uint64_t ids[3 * 16];
    for (uint32_t i = 0; i < 16; i++) {
      ids[i] = splitmix() % 2;
      ids[16 + i] = splitmix() % 40;
      ids[32 + i] = 1000 + x * 16 + i;
    }
    data_batch_t b;
    uint32_t owner[16];
    make_batch(&b, x, 16, 3, hot, ids);
    assert_int_equal(laia_assign(l, &b, owner), 0);
    data_batch_free(&b);
  }
  laia_stats(l, &st);
  assert_int_equal(st.tables_scored, 1);
  assert_true(laia_table_scored(l, 1));
  laia_destroy(l);
  o.min_share = 1.5;
  assert_int_equal(laia_create(&o, &l), -EINVAL);
}

/* Rows that move between trainers over a stream of plans: shared in a
 * batch (all-reduced), or used by another trainer than the one that alone
 * used them last, within `window` batches (replicated). */
typedef struct moves_s {
  size_t shared, replicated;
} moves_t;

static void count_moves(const plan_t *p, uint32_t window, int64_t *last, uint32_t *user, moves_t *m) {
  for (size_t i = 0; i < p->n_unique; i++) {
    uint64_t k = p->ukeys[i];
    size_t at = (size_t)TABLE_ID(k) * MAXROWS + (k & TABLE_ROW_MASK);
    uint32_t u = p->users[i];
    if (u == UINT32_MAX) m->shared++;
    if (last[at] >= 0 && (int64_t)p->iteration - last[at] <= window && user[at] != UINT32_MAX && user[at] != u) m->replicated++;
    last[at] = (int64_t)p->iteration;
    user[at] = u;
  }
}

/* The point of it: fewer rows replicated from trainer to trainer than
 * contiguous allocation, and no more shared, on the same skewed stream
 * (and the same seed: not a lucky draw, the stream is fixed). */
static void test_fewer_rows_moved(void **state) {
  (void)state;
  static const uint64_t rows[MAXT] = {4000, 2000, 800, 300};
  static int64_t last_l[MAXT * MAXROWS], last_c[MAXT * MAXROWS];
  static uint32_t user_l[MAXT * MAXROWS], user_c[MAXT * MAXROWS];
  for (size_t i = 0; i < MAXT * MAXROWS; i++) last_l[i] = last_c[i] = -1;
  const uint32_t P = 2, B = 64, W = 16;
  laia_t *l;
  laia_opts_t o = {.trainers = P, .window = W, .seed = 5};
  assert_int_equal(laia_create(&o, &l), 0);
  sm_state = 77;
  moves_t ml = {0}, mc = {0};
  for (uint64_t x = 0; x < 200; x++) {
    data_batch_t b;
    random_batch(&b, x, B, 4, 1, rows);
    uint32_t owner[64];
    assert_int_equal(laia_assign(l, &b, owner), 0);
    plan_t pl, pc;
    assert_int_equal(plan_build_owned(&b, P, owner, PLAN_KEYS, &pl), 0);
    assert_int_equal(plan_build(&b, P, PLAN_ALLOC_CONTIGUOUS, 5, PLAN_KEYS, &pc), 0);
    assert_int_equal(pl.n_unique, pc.n_unique);
    count_moves(&pl, W, last_l, user_l, &ml);
    count_moves(&pc, W, last_c, user_c, &mc);
    plan_close(&pl);
    plan_close(&pc);
    data_batch_free(&b);
  }
  print_message("over 200 batches: shared contiguous %zu laia %zu; replicated contiguous %zu laia %zu\n", mc.shared,
                ml.shared, mc.replicated, ml.replicated);
  assert_true(ml.replicated * 10 < mc.replicated * 8); /* at least 20% fewer */
  assert_true(ml.shared <= mc.shared + mc.shared / 20);
  laia_destroy(l);
  /* an owner out of range is refused */
  data_batch_t b;
  random_batch(&b, 0, 4, 1, 1, rows);
  uint32_t bad[4] = {0, 1, 2, 0};
  plan_t p;
  assert_int_equal(plan_build_owned(&b, P, bad, 0, &p), -EINVAL);
  data_batch_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_adaptive),
      cmocka_unit_test(test_fewer_rows_moved),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
