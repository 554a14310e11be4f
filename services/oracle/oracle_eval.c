/* oracle_eval: see oracle_eval.h. */
#include "oracle_eval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
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

uint64_t oracle_eval_samples(uint64_t eval_batches, uint32_t batch_size, uint64_t test_samples) {
  uint64_t want = batch_size && eval_batches > UINT64_MAX / batch_size ? UINT64_MAX : eval_batches * batch_size;
  return test_samples && want > test_samples ? test_samples : want;
}

uint64_t oracle_train_tail(uint64_t iterations) {
  uint64_t k = iterations / 10;
  return k ? k : (iterations ? 1 : 0);
}

void oracle_train_logloss_definition(uint64_t iterations, char *out, size_t n) {
  snprintf(out, n,
           "mean of the per-iteration training logloss over the last 10%% of iterations, at least one: the last %llu "
           "of %llu",
           (unsigned long long)oracle_train_tail(iterations), (unsigned long long)iterations);
}

/* "5.7" copies; two decimals just above one, where one would say "1.0" */
static void copies(uint32_t batch, uint64_t split, char *out, size_t n) {
  double r = (double)batch / (double)split;
  snprintf(out, n, "%.*f", r < 1.1 ? 2 : 1, r);
}

int oracle_batch_notes(uint32_t batch_size, uint64_t train_samples, uint64_t test_samples, uint64_t eval_batches,
                       int strict, char notes[2][ORACLE_NOTE_MAX]) {
  int k = 0;
  char c[32];
  unsigned long long tr = (unsigned long long)train_samples, te = (unsigned long long)test_samples;
  if (train_samples && batch_size > train_samples) {
    copies(batch_size, train_samples, c, sizeof c);
    if (strict)
      snprintf(notes[k], ORACLE_NOTE_MAX,
               "strict = true refuses batch_size = %u: it is larger than the train split (%llu samples), each batch "
               "would hold %s copies of the training set; lower batch_size to at most %llu, use more data, or set "
               "strict = false",
               batch_size, tr, c, tr);
    else
      snprintf(notes[k], ORACLE_NOTE_MAX,
               "batch_size = %u is larger than the train split (%llu samples): each batch holds %s copies of the "
               "training set; lower batch_size to at most %llu or use more data (strict = true refuses this)",
               batch_size, tr, c, tr);
    k++;
  }
  if (eval_batches && test_samples && batch_size > test_samples) {
    copies(batch_size, test_samples, c, sizeof c);
    if (strict)
      snprintf(notes[k], ORACLE_NOTE_MAX,
               "strict = true refuses batch_size = %u: it is larger than the test split (%llu samples), a test batch "
               "would hold %s copies of it; lower batch_size to at most %llu, raise test_fraction, set "
               "eval_batches = 0, or set strict = false",
               batch_size, te, c, te);
    else
      snprintf(notes[k], ORACLE_NOTE_MAX,
               "batch_size = %u is larger than the test split (%llu samples): a test batch holds %s copies of it; "
               "each evaluation scores the %llu test samples once (strict = true refuses this)",
               batch_size, te, c, te);
    k++;
  }
  return k;
}
