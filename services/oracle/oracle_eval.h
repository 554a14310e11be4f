/*
 * oracle_eval: the held-out metrics the oracle computes from the trainers'
 * EvalResults: mean logloss of logits and exact ROC AUC.
 *
 * The trainer library has its own (services/trainer/eval.c), but the
 * oracle does not link the trainer; these are small and tested against a
 * brute-force reference in tests/unit/test_oracle_plan.c.  Pure functions,
 * any thread.
 */
#ifndef CHANTER_ORACLE_EVAL_H
#define CHANTER_ORACLE_EVAL_H

#include <stddef.h>

/* Mean binary cross-entropy of logits against 0/1 labels, computed stably
 * as max(z, 0) - z*y + log1p(exp(-|z|)).  0 when n = 0. */
double oracle_logloss(const float *logits, const float *labels, size_t n);

/* Exact ROC AUC of scores against 0/1 labels (label > 0.5 is positive):
 * the probability that a random positive scores above a random negative,
 * ties counting one half (Mann-Whitney U with average ranks), O(n log n).
 * NaN scores rank lowest.  Writes *auc (NaN when a class is absent).
 * 0 or -ENOMEM. */
int oracle_auc(const float *scores, const float *labels, size_t n, double *auc);

#endif
