/*
 * model_fd: the finite-difference check of a model's gradients, shared by
 * the model tests (test_trainer_model.c, test_model_dlrm_dcn.c): each
 * parameter nudged by +-FD_EPS, the loss's central difference against the
 * analytic gradient; at most 1% of the elements (at least one) may be off
 * by more than 2e-3 + 2% and the relative L2 error must stay under 1e-2
 * (float32 forward passes).  Include after cmocka.h.
 */
#ifndef CHANTER_TEST_MODEL_FD_H
#define CHANTER_TEST_MODEL_FD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "nn.h"

#define FD_EPS 1e-3f

typedef struct fd_s {
  model_t *m;
  uint32_t n;
  float *dense, *emb, *labels, *logits;
} fd_t;

static double loss_of(fd_t *f) {
  model_forward(f->m, f->n, f->dense, f->emb, f->logits);
  return nn_bce_logits_fwd(f->logits, f->labels, f->n);
}

static void fd_compare(const char *what, fd_t *f, float *p, size_t n, const float *analytic) {
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

#endif
