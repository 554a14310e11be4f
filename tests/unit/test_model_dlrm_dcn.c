/*
 * model = dlrm_dcn (common/model/model_dlrm_dcn.c, nn_cross2_* in nn.c):
 * the DCNv2 cross layer against a plain-loop reference, whole-model
 * gradients against finite differences (full and low rank, with and
 * without dense features, no cross layer), the parameter layout and
 * accounting, one optimizer step lowering the loss, and determinism (same
 * seed, any thread count: the same bits).
 *
 * Finite differences as tests/unit/test_trainer_model.c: L = sum of BCE
 * losses, central differences with e = 1e-3 on float32 forwards, per
 * element |a - n| <= 2e-3 + 2e-2 |n|, up to 1% of the elements (at least
 * 1) may miss it where a ReLU kink is crossed, and the whole vector must
 * agree to 1e-2 in relative L2 norm.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cfg.h"
#include "model.h"
#include "nn.h"
#include "opt.h"
#include "table.h"
#include "model_fd.h"
#include "testutil.h"

/* ------------------------------------------------------- the layer itself */

/* nn_cross2_fwd / _bwd against the formula written out in plain loops. */
static void check_layer(uint32_t r) {
  enum { N = 3, D = 5 };
  uint32_t R = r ? r : D;
  float x0[N * D], x[N * D], w[D * D], v[D * D], b[D], t[N * D], z[N * D], y[N * D];
  rng_state = 7 + r;
  for (int i = 0; i < N * D; i++) x0[i] = urand(), x[i] = urand();
  for (int i = 0; i < D * D; i++) w[i] = urand(), v[i] = urand();
  for (int i = 0; i < D; i++) b[i] = urand();
  nn_cross2_fwd(x0, x, N, D, r, w, v, b, t, z, y);
  double ref_z[N][D];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      double s = b[j];
      if (r) {
        for (uint32_t k = 0; k < r; k++) {
          double tk = 0;
          for (int c = 0; c < D; c++) tk += (double)v[k * D + c] * x[i * D + c];
          s += (double)w[j * r + k] * tk;
        }
      } else {
        for (int c = 0; c < D; c++) s += (double)w[j * D + c] * x[i * D + c];
      }
      ref_z[i][j] = s;
      assert_near(z[i * D + j], s, 1e-5);
      assert_near(y[i * D + j], x0[i * D + j] * s + x[i * D + j], 1e-5);
    }
  /* backward of L = sum(gy * y) */
  float gy[N * D], g[N * D], dz[N * D], dt[N * D], dw[D * D], dv[D * D], db[D], dx0[N * D];
  for (int i = 0; i < N * D; i++) gy[i] = urand(), dx0[i] = 1.0f;
  memcpy(g, gy, sizeof g);
  nn_cross2_bwd(x0, x, t, z, N, D, r, w, v, g, dz, dt, dw, dv, db, dx0);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      assert_near(dx0[i * D + j], 1.0 + gy[i * D + j] * ref_z[i][j], 1e-5); /* added to */
    }
  for (int j = 0; j < D; j++) {
    double s = 0;
    for (int i = 0; i < N; i++) s += (double)gy[i * D + j] * x0[i * D + j];
    assert_near(db[j], s, 1e-5);
  }
  /* dx = gy + (W or U V)^T dz */
  for (int i = 0; i < N; i++)
    for (int c = 0; c < D; c++) {
      double s = gy[i * D + c];
      for (int j = 0; j < D; j++) {
        double m_jc = 0; /* the effective matrix M = U V or W */
        if (r)
          for (uint32_t k = 0; k < r; k++) m_jc += (double)w[j * r + k] * v[k * D + c];
        else
          m_jc = w[j * D + c];
        s += m_jc * gy[i * D + j] * x0[i * D + j];
      }
      assert_near(g[i * D + c], s, 1e-4);
    }
  (void)R;
}

static void test_layer(void **state) {
  (void)state;
  check_layer(0);
  check_layer(1);
  check_layer(2);
}

/* ------------------------------------------------------- gradient checks */

static void test_grad_full_rank(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm_dcn", "model.bottom_mlp=6", "model.top_mlp=7,5", "model.cross_layers=2",
                        "model.cross_rank=0", NULL};
  model_fd_check(sets, 3, 3, 4, 5);
}

static void test_grad_low_rank(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm_dcn", "model.bottom_mlp=6", "model.top_mlp=7,5", "model.cross_layers=3",
                        "model.cross_rank=3", NULL};
  model_fd_check(sets, 3, 3, 4, 5);
  const char *rank1[] = {"model=dlrm_dcn", "model.bottom_mlp=", "model.top_mlp=6", "model.cross_layers=2",
                         "model.cross_rank=1", NULL};
  model_fd_check(rank1, 2, 2, 3, 5);
}

static void test_grad_edges(void **state) {
  (void)state;
  const char *no_dense[] = {"model=dlrm_dcn", "model.top_mlp=6", "model.cross_layers=2", "model.cross_rank=2",
                            NULL};
  model_fd_check(no_dense, 0, 3, 3, 5); /* x0 = the embeddings alone */
  const char *no_cross[] = {"model=dlrm_dcn", "model.bottom_mlp=5", "model.top_mlp=6", "model.cross_layers=0",
                            NULL};
  model_fd_check(no_cross, 2, 2, 3, 5); /* top MLP straight on x0 */
}

/* ------------------------------------------------------- shape, accounting */

static void test_shape(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm_dcn", "model.bottom_mlp=512,256", "model.top_mlp=1024,512",
                        "model.cross_layers=3", "model.cross_rank=64", NULL};
  model_t *m = make_model(sets, 13, 26, 16, 64);
  const char *d = model_describe(m);
  assert_non_null(strstr(d, "dlrm_dcn bottom=13-512-256-16 x0=432 cross=3x64 top=432-1024-512-1"));
  size_t bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 16 + 16;
  size_t cross = 3 * (64 * 432 + 432 * 64 + 432);
  size_t top = 432 * 1024 + 1024 + 1024 * 512 + 512 + 512 + 1;
  assert_int_equal(model_n_params(m), bottom + cross + top);
  /* bottom: 3 + 2 x 3 GEMMs (the first layer has no dx); cross: 6 per
   * layer; top 3 x 3 */
  model_gemm_t g[64];
  assert_int_equal(model_gemms(m, 100, g, 64), 8 + 18 + 9);
  assert_true(g[8].m == 100 && g[8].n == 64 && g[8].k == 432); /* t = x V^T */
  assert_true(g[11].m == 100 && g[11].n == 432 && g[11].k == 64); /* z = t U^T */
  double f = 2.0 * 3 * (13 * 512 + 512 * 256 + 256 * 16) - 2.0 * 13 * 512 + 3 * (2.0 * 3 * 2 * 432 * 64) +
             2.0 * 3 * (432 * 1024 + 1024 * 512 + 512);
  assert_near(model_gemm_flops_per_sample(m), f, 0);
  model_destroy(m);

  const char *full[] = {"model=dlrm_dcn", "model.bottom_mlp=", "model.top_mlp=", "model.cross_layers=2", NULL};
  m = make_model(full, 0, 3, 4, 8);
  assert_non_null(strstr(model_describe(m), "x0=12 cross=2xfull top=12-1"));
  assert_int_equal(model_n_params(m), 2 * (12 * 12 + 12) + 13);
  model_destroy(m);
}

static void test_bad_config(void **state) {
  (void)state;
  cfg_t *c = NULL;
  char err[256];
  assert_int_equal(cfg_create(&c), 0);
  /* out of the keys' bounds: refused by the configuration itself */
  assert_int_not_equal(cfg_set(c, "model.cross_rank=-1", "test", err, sizeof err), 0);
  assert_int_not_equal(cfg_set(c, "model.cross_layers=65", "test", err, sizeof err), 0);
  assert_int_equal(cfg_set(c, "model=dlrm_dcn", "test", err, sizeof err), 0);
  cfg_destroy(c);
  model_kind_t k;
  assert_int_equal(model_kind_parse("dlrm_dcn", &k), 0);
  assert_int_equal(k, MODEL_DLRM_DCN);
  assert_string_equal(model_kind_name(MODEL_DLRM_DCN), "dlrm_dcn");
}

/* ------------------------------------------------------- a step, determinism */

enum { B = 96, ND = 4, NT = 3, DIM = 8 };

static void fill_batch(float *dense, float *emb, float *labels) {
  rng_state = 5;
  for (int i = 0; i < B * ND; i++) dense[i] = urand();
  for (int i = 0; i < B * NT * DIM; i++) emb[i] = urand();
  for (int i = 0; i < B; i++) labels[i] = dense[i * ND] + emb[i * NT * DIM] > 0.0f ? 1.0f : 0.0f;
}

static const char *step_sets[] = {"model=dlrm_dcn", "model.bottom_mlp=16", "model.top_mlp=16,8",
                                  "model.cross_layers=2", "model.cross_rank=4", NULL};

/* Runs k Adagrad steps on the fixed batch with T threads; returns the
 * first and last losses, leaves the model's parameters in params. */
static void run_steps(uint32_t threads, int k, double *first, double *last, float *params_out) {
  model_t *m = make_model(step_sets, ND, NT, DIM, B);
  assert_int_equal(model_set_threads(m, threads), 0);
  model_init(m, 77);
  opt_hparams_t hp = {.lr = 0.05f, .eps = 1e-8f};
  opt_t *o = NULL;
  assert_int_equal(opt_create_kind(OPT_ADAGRAD, &hp, model_n_params(m), &o), 0);
  static float dense[B * ND], emb[B * NT * DIM], labels[B], logits[B], d_emb[B * NT * DIM];
  fill_batch(dense, emb, labels);
  for (int s = 0; s < k; s++) {
    model_forward(m, B, dense, emb, logits);
    double l = model_backward(m, B, labels, 1.0f / B, d_emb) / B;
    if (s == 0) *first = l;
    *last = l;
    opt_step(o, model_params(m), model_grads(m));
  }
  memcpy(params_out, model_params(m), model_n_params(m) * sizeof(float));
  opt_destroy(o);
  model_destroy(m);
}

static void test_step_lowers_loss(void **state) {
  (void)state;
  double first, last;
  float *p = malloc(1 << 20);
  run_steps(1, 20, &first, &last, p);
  print_message("  loss %.4f -> %.4f after 20 Adagrad steps\n", first, last);
  assert_true(last < 0.8 * first);
  free(p);
}

static void test_determinism(void **state) {
  (void)state;
  double f1, l1, f4, l4, f1b, l1b;
  float *p1 = malloc(1 << 20), *p4 = malloc(1 << 20), *p1b = malloc(1 << 20);
  run_steps(1, 3, &f1, &l1, p1);
  run_steps(1, 3, &f1b, &l1b, p1b);
  run_steps(4, 3, &f4, &l4, p4);
  model_t *m = make_model(step_sets, ND, NT, DIM, B);
  size_t np = model_n_params(m);
  model_destroy(m);
  assert_memory_equal(p1, p1b, np * sizeof(float)); /* run to run */
  assert_memory_equal(p1, p4, np * sizeof(float));  /* 1 thread or 4 */
  assert_true(f1 == f4 && l1 == l4);
  free(p1);
  free(p4);
  free(p1b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layer),          cmocka_unit_test(test_grad_full_rank),
      cmocka_unit_test(test_grad_low_rank),  cmocka_unit_test(test_grad_edges),
      cmocka_unit_test(test_shape),          cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_step_lowers_loss), cmocka_unit_test(test_determinism),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
