/*
 * eval: logloss, accuracy and exact ROC AUC (see eval.h).
 *
 * AUC is the Mann-Whitney statistic: sort by score, give tied scores their
 * average rank, AUC = (sum of positive ranks - P(P+1)/2) / (P N).  Sums are
 * in double; ranks are exact in double up to 2^53 samples.  A NaN score
 * ranks lowest, tied with -inf.
 */
#include "eval.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline double bce1(float z, float t) {
  double zd = z;
  return (zd > 0.0 ? zd : 0.0) - zd * (double)t + log1p(exp(-fabs(zd)));
}

double eval_logloss(const float *logits, const float *labels, size_t n) {
  if (n == 0) return 0.0;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += bce1(logits[i], labels[i]);
  return s / (double)n;
}

static size_t count_correct(const float *logits, const float *labels, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += (logits[i] > 0.0f) == (labels[i] > 0.5f);
  return c;
}

double eval_accuracy(const float *logits, const float *labels, size_t n) {
  return n ? (double)count_correct(logits, labels, n) / (double)n : 0.0;
}

typedef struct scored_s {
  float score;
  float label;
} scored_t;

static int cmp_score(const void *a, const void *b) {
  float x = ((const scored_t *)a)->score, y = ((const scored_t *)b)->score;
  return (x > y) - (x < y);
}

int eval_auc(const float *scores, const float *labels, size_t n, double *auc) {
  *auc = NAN;
  if (n == 0) return 0;
  scored_t *s = malloc(n * sizeof(*s));
  if (!s) return -ENOMEM;
  /* a NaN score ranks lowest, tied with -inf: NaN compares unequal to
   * everything, so left as is it would have no place in the order and the
   * tie loop below would never advance past it */
  for (size_t i = 0; i < n; i++) {
    s[i].score = isnan(scores[i]) ? -INFINITY : scores[i];
    s[i].label = labels[i];
  }
  qsort(s, n, sizeof(*s), cmp_score);
  double pos = 0.0, rank_sum = 0.0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double p = 0.0;
    while (j < n && s[j].score == s[i].score) p += s[j++].label > 0.5f;
    /* ranks i+1 .. j share the average (i+1+j)/2 */
    rank_sum += p * ((double)(i + 1) + (double)j) / 2.0;
    pos += p;
    i = j;
  }
  free(s);
  double neg = (double)n - pos;
  if (pos > 0.0 && neg > 0.0) *auc = (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg);
  return 0;
}

void eval_acc_init(eval_acc_t *a) { memset(a, 0, sizeof(*a)); }

int eval_acc_add(eval_acc_t *a, const float *logits, const float *labels, size_t n) {
  if (a->n + n > a->cap) {
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->n + n) cap *= 2;
    float *s = realloc(a->scores, cap * sizeof(float));
    if (!s) return -ENOMEM;
    a->scores = s;
    float *l = realloc(a->labels, cap * sizeof(float));
    if (!l) return -ENOMEM;
    a->labels = l;
    a->cap = cap;
  }
  memcpy(a->scores + a->n, logits, n * sizeof(float));
  memcpy(a->labels + a->n, labels, n * sizeof(float));
  for (size_t i = 0; i < n; i++) a->loss_sum += bce1(logits[i], labels[i]);
  a->correct += count_correct(logits, labels, n);
  a->n += n;
  return 0;
}

int eval_acc_result(const eval_acc_t *a, double *logloss, double *accuracy,
                    double *auc) {
  if (logloss) *logloss = a->n ? a->loss_sum / (double)a->n : 0.0;
  if (accuracy) *accuracy = a->n ? (double)a->correct / (double)a->n : 0.0;
  if (auc) return eval_auc(a->scores, a->labels, a->n, auc);
  return 0;
}

void eval_acc_reset(eval_acc_t *a) {
  a->loss_sum = 0.0;
  a->n = a->correct = 0;
}

void eval_acc_close(eval_acc_t *a) {
  free(a->scores);
  free(a->labels);
  memset(a, 0, sizeof(*a));
}
