/*
 * Optimizers of common/model/opt.h against values computed by hand
 * (the arithmetic is in the comments), and the embedding-row state layout:
 * the state sits right after the vector, matches cfg_state_floats, and a
 * row can be copied out (to a server) and back between updates without
 * changing the result.  Tolerances are a few float32 ulps of the values.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cfg.h"
#include "opt.h"
#include "pool.h"
#include "table.h"
#include "testutil.h"

static void test_dense_sgd(void **state) {
  (void)state;
  opt_hparams_t hp = {.lr = 0.1f};
  opt_t *o;
  assert_int_equal(opt_create_kind(OPT_SGD, &hp, 2, &o), 0);
  assert_int_equal(opt_state_floats(o), 0);
  float w[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f};
  opt_step(o, w, g);
  /* 1 - 0.1*0.5 = 0.95; -2 - 0.1*0.25 = -2.025 */
  assert_near(w[0], 0.95, 1e-7);
  assert_near(w[1], -2.025, 1e-7);
  assert_int_equal(opt_steps(o), 1);
  opt_destroy(o);
}

static void test_dense_adagrad(void **state) {
  (void)state;
  opt_hparams_t hp = {.lr = 0.1f, .eps = 0.0f, .adagrad_init = 0.0f};
  opt_t *o;
  assert_int_equal(opt_create_kind(OPT_ADAGRAD, &hp, 2, &o), 0);
  assert_int_equal(opt_state_floats(o), 2);
  float w[2] = {1.0f, 2.0f}, g1[2] = {3.0f, 4.0f}, g2[2] = {4.0f, 3.0f};
  opt_step(o, w, g1);
  /* h = (9, 16); w -= 0.1 * (3/3, 4/4) = (0.9, 1.9) */
  assert_near(opt_state(o)[0], 9.0, 0);
  assert_near(opt_state(o)[1], 16.0, 0);
  assert_near(w[0], 0.9, 1e-7);
  assert_near(w[1], 1.9, 1e-7);
  opt_step(o, w, g2);
  /* h = (25, 25); w -= 0.1 * (4/5, 3/5) = (0.82, 1.84) */
  assert_near(w[0], 0.82, 1e-6);
  assert_near(w[1], 1.84, 1e-6);
  opt_destroy(o);
  /* adagrad_init seeds the accumulator: h = 7 + 9 = 16, w -= 0.1*3/4 */
  hp.adagrad_init = 7.0f;
  assert_int_equal(opt_create_kind(OPT_ADAGRAD, &hp, 1, &o), 0);
  float w1 = 1.0f, gg = 3.0f;
  opt_step(o, &w1, &gg);
  assert_near(w1, 0.925, 1e-7);
  opt_destroy(o);
}

static void test_dense_adam(void **state) {
  (void)state;
  opt_hparams_t hp = {.lr = 0.001f, .eps = 1e-8f, .beta1 = 0.9f, .beta2 = 0.999f};
  opt_t *o;
  assert_int_equal(opt_create_kind(OPT_ADAM, &hp, 1, &o), 0);
  assert_int_equal(opt_state_floats(o), 2);
  float w = 0.5f;
  float g[3] = {1.0f, 2.0f, -0.5f};
  /* step 1: m = 0.1, v = 0.001, mhat = 1, vhat = 1: w = 0.5 - 0.001 = 0.499
   * step 2: m = 0.29, v = 0.004999, mhat = 0.29/0.19 = 1.5263158,
   *         vhat = 0.004999/0.001999 = 2.5007504, sqrt = 1.5813761:
   *         w = 0.499 - 0.001 * 0.9651820 = 0.4980348
   * step 3: m = 0.211, v = 0.005244001, mhat = 0.211/0.271 = 0.7785978,
   *         vhat = 0.005244001/0.002997001 = 1.7497495, sqrt = 1.3227810:
   *         w = 0.4980348 - 0.001 * 0.5886067 = 0.4974462 */
  double want[3] = {0.49900000001, 0.49803481799028165, 0.49744621126200234};
  for (int t = 0; t < 3; t++) {
    opt_step(o, &w, &g[t]);
    assert_near(w, want[t], 2e-7);
  }
  assert_near(opt_state(o)[0], 0.211, 1e-7);      /* m */
  /* v: 0.999f is 0.99900001287 in float, so 1 - beta2 is off by 1.3e-5
   * relative from the decimal hand computation */
  assert_near(opt_state(o)[1], 0.005244001, 2e-5 * 0.005244001);
  assert_int_equal(opt_steps(o), 3);
  opt_destroy(o);
}

static void test_create_from_cfg(void **state) {
  (void)state;
  cfg_t *c;
  char err[256];
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_set(c, "optimizer=adam", "test", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(c, "learning_rate=0.25", "test", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(c, "adam_eps=0.001", "test", err, sizeof(err)), 0);
  opt_t *o;
  assert_int_equal(opt_create(c, 10, &o), 0);
  assert_int_equal(opt_kind(o), OPT_ADAM);
  assert_int_equal(opt_state_floats(o), 20);
  for (int i = 0; i < 20; i++) assert_true(opt_state(o)[i] == 0.0f);
  opt_destroy(o);
  opt_hparams_t hp;
  opt_hparams_from_cfg(c, OPT_ADAM, &hp);
  assert_near(hp.lr, 0.25, 0);
  assert_near(hp.eps, 0.001, 1e-10);
  opt_hparams_from_cfg(c, OPT_ROWWISE_ADAGRAD, &hp);
  assert_near(hp.eps, 1e-8, 1e-15); /* adagrad_eps default */
  opt_kind_t k;
  assert_int_equal(opt_kind_parse("rowwise_adagrad", &k), 0);
  assert_int_equal(k, OPT_ROWWISE_ADAGRAD);
  assert_int_equal(opt_kind_parse("lamb", &k), -EINVAL);
  /* rowwise_adagrad is rows-only */
  assert_int_equal(cfg_set(c, "optimizer=sgd", "test", err, sizeof(err)), 0);
  hp.lr = 0.1f;
  assert_int_equal(opt_create_kind(OPT_ROWWISE_ADAGRAD, &hp, 4, &o), -EINVAL);
  cfg_destroy(c);
}

static void test_row_sgd_adagrad(void **state) {
  (void)state;
  opt_hparams_t hp = {.lr = 0.1f, .eps = 0.0f};
  /* sgd: no state; the next row (at stride dim) is untouched */
  float rows[4] = {1.0f, 2.0f, 7.0f, 7.0f}, g[2] = {3.0f, 4.0f};
  assert_int_equal(opt_row_state_floats(OPT_SGD, 2), 0);
  opt_row_update(OPT_SGD, &hp, rows, 2, g);
  assert_near(rows[0], 0.7, 1e-7);
  assert_near(rows[1], 1.6, 1e-7);
  assert_true(rows[2] == 7.0f && rows[3] == 7.0f);
  /* adagrad: state = dim floats after the vector */
  assert_int_equal(opt_row_state_floats(OPT_ADAGRAD, 2), 2);
  float r2[5] = {1.0f, 2.0f, 0.0f, 0.0f, 7.0f};
  opt_row_update(OPT_ADAGRAD, &hp, r2, 2, g);
  /* h = (9, 16); w = (1 - 0.1, 2 - 0.1) */
  assert_near(r2[0], 0.9, 1e-7);
  assert_near(r2[1], 1.9, 1e-7);
  assert_true(r2[2] == 9.0f && r2[3] == 16.0f && r2[4] == 7.0f);
}

static void test_row_rowwise_adagrad(void **state) {
  (void)state;
  opt_hparams_t hp = {.lr = 0.1f, .eps = 0.0f};
  assert_int_equal(opt_row_state_floats(OPT_ROWWISE_ADAGRAD, 2), 1);
  float r[4] = {1.0f, 2.0f, 0.0f, 7.0f}, g1[2] = {3.0f, 4.0f}, g2[2] = {1.0f, 1.0f};
  opt_row_update(OPT_ROWWISE_ADAGRAD, &hp, r, 2, g1);
  /* h = (9 + 16) / 2 = 12.5; w -= 0.1 * g / sqrt(12.5) */
  assert_true(r[2] == 12.5f);
  assert_near(r[0], 0.9151471862576143, 2e-7);
  assert_near(r[1], 1.8868629150101524, 2e-7);
  assert_true(r[3] == 7.0f);
  opt_row_update(OPT_ROWWISE_ADAGRAD, &hp, r, 2, g2);
  /* h = 12.5 + 1 = 13.5; w0 -= 0.1 / sqrt(13.5) */
  assert_true(r[2] == 13.5f);
  assert_near(r[0], 0.8879306335600234, 2e-7);
}

/* A row of the real table layout (table_init_row, state from
 * cfg_state_floats) updated in place equals the same row shipped out to a
 * byte buffer and back between updates, bit for bit, and the state it
 * carries is the running mean-square sum. */
static void test_row_state_round_trip(void **state) {
  (void)state;
  enum { DIM = 8, STEPS = 5 };
  table_layout_t l;
  assert_int_equal(table_layout_init(&l, 1, 42), 0);
  l.tables[0].rows = 1000;
  l.tables[0].dim = DIM;
  l.tables[0].state_floats = (uint32_t)cfg_state_floats("rowwise_adagrad", DIM);
  assert_int_equal(l.tables[0].state_floats, opt_row_state_floats(OPT_ROWWISE_ADAGRAD, DIM));
  uint32_t rf = table_row_floats(&l, 0);
  assert_int_equal(rf, DIM + 1);
  float a[DIM + 1], b[DIM + 1];
  table_init_row(&l, TABLE_KEY(0, 17), a);
  assert_true(a[DIM] == 0.0f); /* fresh state */
  memcpy(b, a, sizeof(a));
  unsigned char wire[sizeof(a)];
  opt_hparams_t hp = {.lr = 0.05f, .eps = 1e-8f};
  double h = 0.0;
  for (int s = 0; s < STEPS; s++) {
    float g[DIM];
    double ss = 0.0;
    for (int d = 0; d < DIM; d++) {
      g[d] = 0.1f * (float)(d + 1) * (s % 2 ? -1.0f : 1.0f);
      ss += (double)g[d] * g[d];
    }
    h += ss / DIM;
    opt_row_update(OPT_ROWWISE_ADAGRAD, &hp, a, DIM, g);
    memcpy(wire, b, sizeof(b)); /* to the server ... */
    memset(b, 0, sizeof(b));
    memcpy(b, wire, sizeof(b)); /* ... and back */
    opt_row_update(OPT_ROWWISE_ADAGRAD, &hp, b, DIM, g);
    assert_memory_equal(a, b, sizeof(a));
    assert_near(a[DIM], h, 1e-6 * h);
  }
  table_layout_close(&l);
}

/* The pooled step is the plain step, bit for bit, for every optimizer. */
static void test_step_pool(void **state) {
  (void)state;
  enum { N = 1001 };
  opt_hparams_t hp = {.lr = 0.01f, .eps = 1e-8f, .beta1 = 0.9f, .beta2 = 0.999f, .adagrad_init = 0.1f};
  pool_t *pool;
  assert_int_equal(pool_create(3, &pool), 0);
  static float w1[N], w2[N], g[N];
  opt_kind_t kinds[3] = {OPT_SGD, OPT_ADAGRAD, OPT_ADAM};
  for (int k = 0; k < 3; k++) {
    opt_t *a, *b;
    assert_int_equal(opt_create_kind(kinds[k], &hp, N, &a), 0);
    assert_int_equal(opt_create_kind(kinds[k], &hp, N, &b), 0);
    uint64_t r = 9;
    for (int i = 0; i < N; i++) {
      r = table_mix64(r);
      w1[i] = w2[i] = (float)(r >> 40) / 16777216.0f - 0.5f;
    }
    for (int s = 0; s < 5; s++) {
      for (int i = 0; i < N; i++) {
        r = table_mix64(r);
        g[i] = (float)(r >> 40) / 16777216.0f - 0.5f;
      }
      opt_step(a, w1, g);
      opt_step_pool(b, w2, g, pool);
    }
    assert_memory_equal(w1, w2, sizeof(w1));
    assert_int_equal(opt_steps(b), 5);
    if (opt_state_floats(a))
      assert_memory_equal(opt_state(a), opt_state(b), opt_state_floats(a) * sizeof(float));
    opt_destroy(a);
    opt_destroy(b);
  }
  pool_destroy(pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_sgd),
      cmocka_unit_test(test_dense_adagrad),
      cmocka_unit_test(test_dense_adam),
      cmocka_unit_test(test_create_from_cfg),
      cmocka_unit_test(test_row_sgd_adagrad),
      cmocka_unit_test(test_row_rowwise_adagrad),
      cmocka_unit_test(test_row_state_round_trip),
      cmocka_unit_test(test_step_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
