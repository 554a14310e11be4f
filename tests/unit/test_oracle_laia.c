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
 * contiguous allocation.  A checkpoint's laia_save / laia_load must give
 * an allocator that goes on exactly as the saved one (owners, statistics,
 * the state's very bytes), from any batch (before the first, during and
 * after the profile); other options, truncated and corrupt states are
 * refused with a sentence, never crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "err.h"

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

/* ------------------------------------------------------------ save, load */

#define SL_N 40 /* batches */

/* What A showed after a batch, to compare B with. */
typedef struct shown_s {
  laia_stats_t st;
  uint64_t next;
  int profiled, scored[MAXT + 1];
  double share[MAXT + 1];
} shown_t;

static void show(const laia_t *l, shown_t *s) {
  laia_stats(l, &s->st);
  s->next = laia_next_iteration(l);
  s->profiled = laia_profiled(l);
  for (uint32_t t = 0; t < MAXT + 1; t++) {
    s->scored[t] = laia_table_scored(l, t);
    s->share[t] = laia_table_share(l, t);
  }
}

static void assert_same_shown(const shown_t *a, const laia_t *l, const char *what, size_t k) {
  shown_t b;
  show(l, &b);
  const laia_stats_t sa = a->st, sb = b.st;
  if (sa.batches != sb.batches || sa.samples != sb.samples || sa.scored != sb.scored || sa.best != sb.best ||
      sa.rows_held != sb.rows_held || sa.tables != sb.tables || sa.tables_scored != sb.tables_scored)
    fail_msg("%s, saved after %zu batches: statistics differ (batches %llu/%llu scored %llu/%llu best %llu/%llu rows held "
             "%zu/%zu tables scored %u/%u)",
             what, k, (unsigned long long)sa.batches, (unsigned long long)sb.batches, (unsigned long long)sa.scored,
             (unsigned long long)sb.scored, (unsigned long long)sa.best, (unsigned long long)sb.best, sa.rows_held,
             sb.rows_held, sa.tables_scored, sb.tables_scored);
  assert_int_equal(a->next, b.next);
  assert_int_equal(a->profiled, b.profiled);
  for (uint32_t t = 0; t < MAXT + 1; t++) {
    if (a->scored[t] != b.scored[t]) fail_msg("%s, saved after %zu batches: table %u scored %d/%d", what, k, t, a->scored[t], b.scored[t]);
    double x = a->share[t], y = b.share[t];
    assert_true((isnan(x) && isnan(y)) || x == y);
  }
}

/* Allocator A runs over SL_N batches and is saved after k of them, for
 * every k; B, loaded from each, runs the rest: the same owners bit for bit
 * and the same statistics after every batch, and at the end the same
 * state to the byte.  Over P, window (1: rows expire and the map drops
 * them), a profile that ends at batch 6 (and drops table 3, whose ids are
 * all new) or none, a stream starting at 0 or at 7, and batches smaller
 * than P. */
static void test_save_load(void **state) {
  (void)state;
  static const uint64_t rows[MAXT] = {3000, 300, 40, UINT64_C(1) << 50};
  const uint32_t Ps[] = {1, 2, 3, 5}, windows[] = {1, 4, 30}, profiles[] = {0, 6};
  int loads = 0;
  for (size_t pi = 0; pi < sizeof Ps / sizeof *Ps; pi++)
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++)
      for (size_t fi = 0; fi < sizeof profiles / sizeof *profiles; fi++) {
        uint32_t P = Ps[pi];
        laia_opts_t o = {.trainers = P, .window = windows[wi], .seed = 40 + P, .profile = profiles[fi], .min_share = 0.02};
        uint64_t x0 = (pi + wi) % 2 ? 7 : 0;
        data_batch_t b[SL_N];
        sm_state = 500 + pi * 100 + wi * 10 + fi;
        for (uint64_t x = 0; x < SL_N; x++) {
          uint32_t B = (uint32_t)(x % 9 == 4 ? 2 : 20 + x % 13);
          random_batch(&b[x], x0 + x, B, 4, 1 + (uint32_t)(x % 2), rows);
        }
        /* A, saved after every batch */
        uint8_t *buf[SL_N + 1];
        size_t len[SL_N + 1];
        uint32_t owner_a[SL_N][64];
        shown_t shown_a[SL_N];
        laia_t *a;
        assert_int_equal(laia_create(&o, &a), 0);
        for (size_t x = 0; x <= SL_N; x++) {
          assert_int_equal(laia_save(a, &buf[x], &len[x]), 0);
          if (x == SL_N) break;
          assert_int_equal(laia_assign(a, &b[x], owner_a[x]), 0);
          assert_int_equal(laia_next_iteration(a), x0 + x + 1);
          show(a, &shown_a[x]);
        }
        if (o.profile) { /* the profile ended and dropped a table */
          assert_true(laia_profiled(a));
          assert_false(laia_table_scored(a, 3));
          assert_true(laia_table_scored(a, 1));
        }
        /* B from each: the rest of the stream as A did it */
        for (size_t k = 0; k <= SL_N; k++) {
          char why[256];
          laia_t *l;
          int rc = laia_load(&o, buf[k], len[k], &l, why, sizeof why);
          if (rc) fail_msg("P=%u window=%u profile=%u: load after %zu batches: %s", P, o.window, o.profile, k, why);
          uint8_t *again;
          size_t again_len;
          assert_int_equal(laia_save(l, &again, &again_len), 0); /* loaded = saved, to the byte */
          assert_int_equal(again_len, len[k]);
          assert_memory_equal(again, buf[k], len[k]);
          free(again);
          assert_int_equal(laia_next_iteration(l), k ? x0 + k : 0);
          for (size_t x = k; x < SL_N; x++) {
            uint32_t got[64];
            assert_int_equal(laia_assign(l, &b[x], got), 0);
            for (uint32_t i = 0; i < b[x].n; i++)
              if (got[i] != owner_a[x][i])
                fail_msg("P=%u window=%u profile=%u, saved after %zu batches: batch %zu sample %u goes to %u, "
                         "uninterrupted to %u",
                         P, o.window, o.profile, k, x, i, got[i], owner_a[x][i]);
            assert_same_shown(&shown_a[x], l, "statistics", k);
          }
          assert_int_equal(laia_save(l, &again, &again_len), 0);
          assert_int_equal(again_len, len[SL_N]);
          assert_memory_equal(again, buf[SL_N], len[SL_N]);
          free(again);
          laia_destroy(l);
          loads++;
        }
        laia_destroy(a);
        for (size_t x = 0; x <= SL_N; x++) free(buf[x]);
        for (uint64_t x = 0; x < SL_N; x++) data_batch_free(&b[x]);
      }
  assert_int_equal(loads, 4 * 3 * 2 * (SL_N + 1));
}

/* A state made with other options is refused, naming the field and both
 * values; truncated at any length, any bit flipped, or contents no
 * allocator could have left (under a valid checksum): -EBADMSG with a
 * sentence, never a crash. */
static void test_load_refused(void **state) {
  (void)state;
  static const uint64_t rows[MAXT] = {300, 40, 0, 0};
  laia_opts_t o = {.trainers = 2, .window = 8, .seed = 9, .profile = 3, .min_share = 0.25};
  laia_t *l;
  assert_int_equal(laia_create(&o, &l), 0);
  sm_state = 5;
  for (uint64_t x = 0; x < 6; x++) {
    data_batch_t b;
    uint32_t owner[16];
    random_batch(&b, x, 16, 2, 1, rows);
    assert_int_equal(laia_assign(l, &b, owner), 0);
    data_batch_free(&b);
  }
  uint8_t *buf;
  size_t len;
  assert_int_equal(laia_save(l, &buf, &len), 0);
  laia_destroy(l);
  char why[512];
  laia_t *out = (laia_t *)1;
  assert_int_equal(laia_load(&o, buf, len, &out, why, sizeof why), 0);
  laia_destroy(out);
  /* other options */
  struct {
    laia_opts_t o;
    const char *saved, *now;
  } other[] = {
      {{.trainers = 3, .window = 8, .seed = 9, .profile = 3, .min_share = 0.25}, "trainers = 2", "trainers = 3"},
      {{.trainers = 2, .window = 16, .seed = 9, .profile = 3, .min_share = 0.25}, "window = 8", "window = 16"},
      {{.trainers = 2, .window = 8, .seed = 10, .profile = 3, .min_share = 0.25}, "seed = 9", "seed = 10"},
      {{.trainers = 2, .window = 8, .seed = 9, .profile = 0, .min_share = 0.25}, "profile = 3", "profile = 0"},
      {{.trainers = 2, .window = 8, .seed = 9, .profile = 3, .min_share = 0.5}, "min_share = 0.25", "min_share = 0.5"},
  };
  for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
    out = (laia_t *)1;
    assert_int_equal(laia_load(&other[i].o, buf, len, &out, why, sizeof why), ERR_CONFIG);
    assert_null(out);
    if (!strstr(why, other[i].saved) || !strstr(why, other[i].now))
      fail_msg("other options: \"%s\" should name %s and %s", why, other[i].saved, other[i].now);
  }
  print_message("e.g.: %s\n", why);
  laia_opts_t bad = o;
  bad.trainers = 0;
  assert_int_equal(laia_load(&bad, buf, len, &out, why, sizeof why), -EINVAL);
  assert_true(why[0] != 0);
  /* laia_start_at: a fresh allocator made to start at 4 refuses 3, takes 4,
   * and no longer moves */
  assert_int_equal(laia_create(&o, &l), 0);
  assert_int_equal(laia_next_iteration(l), 0);
  assert_int_equal(laia_start_at(l, 4), 0);
  assert_int_equal(laia_next_iteration(l), 4);
  uint8_t *sbuf;
  size_t slen;
  assert_int_equal(laia_save(l, &sbuf, &slen), 0); /* saved so, it loads so */
  laia_destroy(l);
  assert_int_equal(laia_load(&o, sbuf, slen, &l, why, sizeof why), 0);
  free(sbuf);
  assert_int_equal(laia_next_iteration(l), 4);
  data_batch_t b4;
  uint32_t owner4[16];
  random_batch(&b4, 3, 16, 2, 1, rows);
  assert_int_equal(laia_assign(l, &b4, owner4), -EINVAL);
  b4.iteration = 4;
  assert_int_equal(laia_assign(l, &b4, owner4), 0);
  assert_int_equal(laia_next_iteration(l), 5);
  assert_int_equal(laia_start_at(l, 9), -EINVAL);
  data_batch_free(&b4);
  laia_destroy(l);
  /* truncated: every length */
  for (size_t n = 0; n < len; n++) {
    uint8_t *cut = malloc(n + 1); /* its own allocation: a read past n shows under ASan */
    memcpy(cut, buf, n);
    out = (laia_t *)1;
    why[0] = 0;
    assert_int_equal(laia_load(&o, cut, n, &out, why, sizeof why), -EBADMSG);
    assert_null(out);
    assert_true(why[0] != 0);
    free(cut);
  }
  /* one bit flipped, anywhere */
  uint8_t *flip = malloc(len);
  for (size_t i = 0; i < len; i++)
    for (int bit = 0; bit < 8; bit += 3) {
      memcpy(flip, buf, len);
      flip[i] ^= (uint8_t)(1u << bit);
      why[0] = 0;
      int rc = laia_load(&o, flip, len, &out, why, sizeof why);
      if (rc != -EBADMSG) fail_msg("byte %zu bit %d flipped: %d (%s)", i, bit, rc, why);
      assert_true(why[0] != 0);
    }
  assert_non_null(strstr(why, "checksum"));
  /* valid checksums over what no allocator leaves: an unknown version, a
   * holder that is no trainer, an entry moved out of its probe's reach */
  const size_t hdr = 104 + 17 * 2; /* the format of laia.c: header, two tables' counters */
  uint64_t n_ent = 0;
  for (int i = 0; i < 8; i++) n_ent |= (uint64_t)buf[96 + i] << (8 * i);
  assert_true(n_ent >= 2);
  assert_int_equal(len, hdr + 24 * n_ent + 8);
  for (int c = 0; c < 3; c++) {
    memcpy(flip, buf, len);
    if (c == 0) flip[8] = 2;              /* version 2 */
    if (c == 1) flip[hdr + 20] = 3;       /* the first entry's holder: trainer 2 of 2 */
    if (c == 2) {                         /* the last entry one place further (or back to 0) */
      uint8_t *e = flip + hdr + 24 * (n_ent - 1);
      uint64_t at = 0, cap = 0;
      for (int i = 0; i < 8; i++) at |= (uint64_t)e[i] << (8 * i), cap |= (uint64_t)flip[88 + i] << (8 * i);
      at = (at + 1) % cap;
      for (int i = 0; i < 8; i++) e[i] = (uint8_t)(at >> (8 * i));
    }
    uint64_t sum = XXH3_64bits(flip, len - 8);
    for (int i = 0; i < 8; i++) flip[len - 8 + i] = (uint8_t)(sum >> (8 * i));
    out = (laia_t *)1;
    assert_int_equal(laia_load(&o, flip, len, &out, why, sizeof why), -EBADMSG);
    assert_null(out);
    print_message("corrupt %d: %s\n", c, why);
    assert_non_null(strstr(why, c == 0 ? "version" : c == 1 ? "out of range" : "corrupt"));
  }
  free(flip);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_adaptive),
      cmocka_unit_test(test_fewer_rows_moved),
      cmocka_unit_test(test_save_load),
      cmocka_unit_test(test_load_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
