/*
 * model_fd: the finite-difference check of a model's gradients, shared by
 * the model tests (test_trainer_model.c, test_model_dlrm_dcn.c): each
 * parameter nudged by +-FD_EPS, the loss's central difference against the
 * analytic gradient; at most 1% of the elements (at least one) may be off
 * by more than 2e-3 + 2% and the relative L2 error must stay under 1e-2
 * (float32 forward passes); the stream, the model maker and the whole
 * check those tests run on each model (model_fd_check).  Include after
 * cmocka.h.
 */
#ifndef CHANTER_TEST_MODEL_FD_H
#define CHANTER_TEST_MODEL_FD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "model.h"
#include "nn.h"
#include "table.h"
#include "testutil.h"

#define FD_EPS 1e-3f

typedef struct fd_s {
  model_t *m;
  uint32_t n;
  float *dense, *emb, *labels, *logits;
} fd_t;

static inline double loss_of(fd_t *f) {
  model_forward(f->m, f->n, f->dense, f->emb, f->logits);
  return nn_bce_logits_fwd(f->logits, f->labels, f->n);
}

static inline void fd_compare(const char *what, fd_t *f, float *p, size_t n, const float *analytic) {
  size_t bad = 0;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < n; i++) {
    float saved = p[i];
    p[i] = saved + FD_EPS;
    double lp = loss_of(f);
    p[i] = saved - FD_EPS;
    double lm = loss_of(f);
    p[i] = saved;
    double num = (lp - lm) / (2.0 * FD_EPS), a = analytic[i];
    diff2 += (a - num) * (a - num);
    ref2 += num * num;
    if (fabs(a - num) > 2e-3 + 2e-2 * fabs(num)) {
      if (bad < 5) print_message("  %s[%zu]: analytic %.6g numeric %.6g\n", what, i, a, num);
      bad++;
    }
  }
  double rel = sqrt(diff2) / (sqrt(ref2) + 1e-12);
  size_t allowed = n / 100 > 1 ? n / 100 : 1;
  if (bad > allowed || rel > 1e-2) {
    print_error("%s: %zu of %zu elements off (allowed %zu), relative L2 error %.3g\n", what,
                bad, n, allowed, rel);
    fail();
  }
  assert_true(ref2 > 0.0); /* the check saw a gradient at all */
}

/* The tests' stream: uniform in [-1, 1). */
static uint64_t rng_state;
static inline float urand(void) {
  rng_state = table_mix64(rng_state);
  return (float)((double)(rng_state >> 40) / 8388608.0 - 1.0);
}

static inline model_t *make_model(const char *const *sets, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                                  uint32_t max_batch) {
  cfg_t *c = testutil_cfg_of(sets);
  model_t *m = NULL;
  char err[256];
  int rc = model_create(c, n_dense, n_tables, dim, max_batch, &m, err, sizeof(err));
  if (rc) print_error("model_create: %s\n", err);
  assert_int_equal(rc, 0);
  cfg_destroy(c);
  return m;
}

/* The model of sets checked at n (<= 8) samples, at a generic point (the
 * zero-initialized parameters given small random values): the loss of
 * model_backward is the forward's, every parameter's and embedding input's
 * gradient is the finite difference's (fd_compare), and scale multiplies
 * every gradient exactly (a power of two). */
static inline void model_fd_check(const char *const *sets, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                                  uint32_t n) {
  enum { MAX_N = 8 };
  assert_true(n >= 1 && n <= MAX_N && n_dense <= 8 && (size_t)n_tables * dim <= 64);
  model_t *m = make_model(sets, n_dense, n_tables, dim, 8);
  model_init(m, 1234);
  size_t np = model_n_params(m);
  float *params = model_params(m);
  rng_state = 99;
  for (size_t i = 0; i < np; i++)
    if (params[i] == 0.0f) params[i] = 0.1f * urand();
  size_t ew = (size_t)n_tables * dim;
  float dense[MAX_N * 8], emb[MAX_N * 64], labels[MAX_N], logits[MAX_N], d_emb[MAX_N * 64];
  for (size_t i = 0; i < n * (size_t)n_dense; i++) dense[i] = urand();
  for (size_t i = 0; i < n * ew; i++) emb[i] = urand();
  for (uint32_t i = 0; i < n; i++) labels[i] = (float)(i & 1);
  fd_t f = {m, n, dense, emb, labels, logits};
  double l0 = loss_of(&f);
  double l1 = model_backward(m, n, labels, 1.0f, d_emb);
  assert_near(l1, l0, 1e-12);
  float *grads = malloc(np * sizeof(float));
  memcpy(grads, model_grads(m), np * sizeof(float));
  print_message("  %s\n", model_describe(m));
  fd_compare("params", &f, params, np, grads);
  if (ew) fd_compare("d_emb", &f, emb, n * ew, d_emb);
  float d_emb2[MAX_N * 64];
  loss_of(&f);
  model_backward(m, n, labels, 0.25f, d_emb2);
  for (size_t i = 0; i < np; i++) assert_true(model_grads(m)[i] == 0.25f * grads[i]);
  for (size_t i = 0; i < n * ew; i++) assert_true(d_emb2[i] == 0.25f * d_emb[i]);
  free(grads);
  model_destroy(m);
}

#endif
