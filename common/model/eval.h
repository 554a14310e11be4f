/*
 * eval: metrics of a binary classifier from logits (or any monotone score
 * for AUC): logloss, accuracy and exact ROC AUC.  An eval_acc_t gathers
 * them over many batches (held-out evaluation in a trainer).  Pure
 * functions are thread-safe; an accumulator is used by one thread.
 */
#ifndef CHANTER_EVAL_H
#define CHANTER_EVAL_H

#include <stddef.h>
#include <stdint.h>

/* Mean binary cross-entropy of the logits (numerically stable); 0 when n=0. */
double eval_logloss(const float *logits, const float *labels, size_t n);
/* Fraction with (logit > 0) == (label > 0.5); 0 when n = 0. */
double eval_accuracy(const float *logits, const float *labels, size_t n);
/* Exact ROC AUC: the probability that a random positive scores above a
 * random negative, ties counting 1/2 (Mann-Whitney U with average ranks),
 * O(n log n); a NaN score ranks lowest, tied with -inf.  Writes *auc (NaN
 * when either class is absent).  Allocates
 * scratch: 0 or -ENOMEM. */
int eval_auc(const float *scores, const float *labels, size_t n, double *auc);

typedef struct eval_acc_s {
  double loss_sum;   /* sum of BCE losses */
  size_t n, correct;
  float *scores, *labels;  /* every logit and label seen, for the AUC */
  size_t cap;
} eval_acc_t;
void eval_acc_init(eval_acc_t *a);
/* Adds a batch; 0 or -ENOMEM. */
int eval_acc_add(eval_acc_t *a, const float *logits, const float *labels,
                 size_t n);
/* Logloss, accuracy and AUC of everything added; 0 or -ENOMEM. */
int eval_acc_result(const eval_acc_t *a, double *logloss, double *accuracy,
                    double *auc);
void eval_acc_reset(eval_acc_t *a);
void eval_acc_close(eval_acc_t *a);

#endif
