/*
 * Metrics of common/model/eval.h: exact AUC against a brute-force
 * pairwise count on random scores with many ties, logloss and accuracy
 * against direct formulas, and the batch accumulator against one call.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eval.h"
#include "table.h"
#include "testutil.h"

/* P(score_pos > score_neg) + 1/2 P(equal), over all pairs: O(n^2). */
static double auc_brute(const float *s, const float *y, size_t n) {
  double num = 0.0, pairs = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (y[i] < 0.5f) continue;
    for (size_t j = 0; j < n; j++) {
      if (y[j] > 0.5f) continue;
      pairs += 1.0;
      num += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
    }
  }
  return num / pairs;
}

static void test_auc_small(void **state) {
  (void)state;
  double auc;
  float s1[4] = {0.1f, 0.4f, 0.35f, 0.8f}, y1[4] = {0, 0, 1, 1};
  assert_int_equal(eval_auc(s1, y1, 4, &auc), 0);
  assert_near(auc, 0.75, 1e-15); /* sklearn's roc_auc_score example */
  float s2[4] = {1, 1, 1, 1}, y2[4] = {0, 1, 0, 1};
  assert_int_equal(eval_auc(s2, y2, 4, &auc), 0);
  assert_near(auc, 0.5, 1e-15); /* all tied */
  float s3[3] = {3, 2, 1}, y3[3] = {0, 0, 0};
  assert_int_equal(eval_auc(s3, y3, 3, &auc), 0);
  assert_true(isnan(auc)); /* one class only */
  float s4[4] = {-1, -2, 5, 6}, y4[4] = {1, 1, 0, 0};
  assert_int_equal(eval_auc(s4, y4, 4, &auc), 0);
  assert_near(auc, 0.0, 1e-15);
}

/* A NaN score ranks lowest, tied with -inf (the oracle's old AUC).  Before
 * that rule the tie loop never advanced past a NaN (NaN != NaN): alarm()
 * turns such a hang into a failure. */
static void test_auc_nan(void **state) {
  (void)state;
  double auc;
  alarm(10);
  float s1[5] = {NAN, 0.5f, NAN, 0.9f, 0.1f}, y1[5] = {1, 1, 0, 1, 0};
  float r1[5] = {-INFINITY, 0.5f, -INFINITY, 0.9f, 0.1f};
  assert_int_equal(eval_auc(s1, y1, 5, &auc), 0);
  assert_near(auc, auc_brute(r1, y1, 5), 1e-15);
  assert_near(auc, 4.5 / 6.0, 1e-15);
  float s2[4] = {NAN, NAN, NAN, NAN}, y2[4] = {0, 1, 0, 1};
  assert_int_equal(eval_auc(s2, y2, 4, &auc), 0);
  assert_near(auc, 0.5, 1e-15); /* all tied */
  float s3[4] = {NAN, -INFINITY, 1, 2}, y3[4] = {1, 0, 0, 1};
  assert_int_equal(eval_auc(s3, y3, 4, &auc), 0);
  assert_near(auc, 2.5 / 4.0, 1e-15); /* NaN ties with -inf */
  alarm(0);
}

static void test_auc_random_ties(void **state) {
  (void)state;
  enum { N = 3000 };
  float *s = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
  uint64_t r = 3;
  for (int trial = 0; trial < 4; trial++) {
    int levels = trial == 0 ? 5 : trial == 1 ? 50 : trial == 2 ? 1000 : 1 << 24;
    for (int i = 0; i < N; i++) {
      r = table_mix64(r);
      int q = (int)(r % (uint64_t)levels);
      r = table_mix64(r);
      /* labels correlated with the score, with a different positive rate
       * per trial */
      double p = 0.2 + 0.6 * q / levels;
      y[i] = (double)(r >> 11) / 9007199254740992.0 < p ? 1.0f : 0.0f;
      s[i] = (float)q / (float)levels - 0.3f;
    }
    double auc;
    assert_int_equal(eval_auc(s, y, N, &auc), 0);
    assert_near(auc, auc_brute(s, y, N), 1e-12);
    assert_true(auc > 0.55); /* the planted correlation shows */
  }
  free(s);
  free(y);
}

static void test_logloss_accuracy(void **state) {
  (void)state;
  float z[5] = {0.0f, 2.0f, -3.0f, 40.0f, -1.0f}, y[5] = {1, 1, 0, 0, 1};
  double want = 0.0;
  for (int i = 0; i < 5; i++) {
    /* -log(sigmoid(z)) and -log(1 - sigmoid(z)), in double */
    want += y[i] > 0.5f ? log1p(exp(-(double)z[i])) : log1p(exp((double)z[i]));
  }
  assert_near(eval_logloss(z, y, 5), want / 5, 1e-9);
  /* logit 0 predicts negative: correct are 2.0/1, -3/0 */
  assert_near(eval_accuracy(z, y, 5), 2.0 / 5.0, 0);
  assert_near(eval_logloss(z, y, 0), 0.0, 0);
}

static void test_accumulator(void **state) {
  (void)state;
  enum { N = 10000 };
  float *s = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
  uint64_t r = 77;
  for (int i = 0; i < N; i++) {
    r = table_mix64(r);
    s[i] = (float)((double)(r >> 40) / 8388608.0 - 1.0) * 4.0f;
    y[i] = (r & 1) ? 1.0f : 0.0f;
  }
  eval_acc_t a;
  eval_acc_init(&a);
  for (int i = 0; i < N; i += 999) {
    int k = N - i < 999 ? N - i : 999;
    assert_int_equal(eval_acc_add(&a, s + i, y + i, (size_t)k), 0);
  }
  double ll, acc, auc, auc1;
  assert_int_equal(eval_acc_result(&a, &ll, &acc, &auc), 0);
  assert_int_equal(eval_auc(s, y, N, &auc1), 0);
  assert_near(ll, eval_logloss(s, y, N), 1e-12);
  assert_near(acc, eval_accuracy(s, y, N), 0);
  assert_near(auc, auc1, 0);
  eval_acc_reset(&a);
  assert_int_equal(eval_acc_add(&a, s, y, 10), 0);
  assert_int_equal(eval_acc_result(&a, &ll, NULL, NULL), 0);
  assert_near(ll, eval_logloss(s, y, 10), 1e-12);
  eval_acc_close(&a);
  free(s);
  free(y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auc_small),
      cmocka_unit_test(test_auc_nan),
      cmocka_unit_test(test_auc_random_ties),
      cmocka_unit_test(test_logloss_accuracy),
      cmocka_unit_test(test_accumulator),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
