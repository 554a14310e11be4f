/* oracle_eval: see oracle_eval.h. */
#include "oracle_eval.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

double oracle_logloss(const float *logits, const float *labels, size_t n) {
  if (n == 0) return 0;
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    double z = logits[i], y = labels[i] > 0.5f ? 1.0 : 0.0;
    s += (z > 0 ? z : 0) - z * y + log1p(exp(-fabs(z)));
  }
  return s / (double)n;
}

typedef struct scored_s {
  float score;
  int pos;
} scored_t;

static int by_score(const void *a, const void *b) {
  float x = ((const scored_t *)a)->score, y = ((const scored_t *)b)->score;
  return (x > y) - (x < y);
}

int oracle_auc(const float *scores, const float *labels, size_t n, double *auc) {
  *auc = NAN;
  scored_t *v = malloc((n ? n : 1) * sizeof *v);
  if (!v) return -ENOMEM;
  double npos = 0, nneg = 0;
  for (size_t i = 0; i < n; i++) {
    v[i].score = isnan(scores[i]) ? -INFINITY : scores[i];
    v[i].pos = labels[i] > 0.5f;
    if (v[i].pos) npos++;
    else nneg++;
  }
  if (npos == 0 || nneg == 0) {
    free(v);
    return 0;
  }
  qsort(v, n, sizeof *v, by_score);
  double rank_sum = 0; /* sum of the (1-based, tie-averaged) ranks of the positives */
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double pos = 0;
    while (j < n && v[j].score == v[i].score) pos += v[j++].pos;
    double avg = ((double)(i + 1) + (double)j) / 2.0; /* mean of ranks i+1 .. j */
    rank_sum += pos * avg;
    i = j;
  }
  *auc = (rank_sum - npos * (npos + 1) / 2.0) / (npos * nneg);
  free(v);
  return 0;
}
