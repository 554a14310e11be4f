/*
 * oracle_eval: the held-out metrics the oracle computes from the trainers'
 * EvalResults: mean logloss of logits and exact ROC AUC; and the sizes and
 * definitions behind what a job reports, which `chanter train --local`
 * uses too so that both say the same thing: how many test samples an
 * evaluation scores, which iterations "train logloss" averages, and what
 * a batch larger than its split means.
 *
 * The trainer library has its own metrics (services/trainer/eval.c), but
 * the oracle does not link the trainer; these are small and tested against
 * a brute-force reference in tests/unit/test_oracle_plan.c.  Pure
 * functions, any thread.
 */
#ifndef CHANTER_ORACLE_EVAL_H
#define CHANTER_ORACLE_EVAL_H

#include <stddef.h>
#include <stdint.h>

/* Mean binary cross-entropy of logits against 0/1 labels, computed stably
 * as max(z, 0) - z*y + log1p(exp(-|z|)).  0 when n = 0. */
double oracle_logloss(const float *logits, const float *labels, size_t n);

/* Exact ROC AUC of scores against 0/1 labels (label > 0.5 is positive):
 * the probability that a random positive scores above a random negative,
 * ties counting one half (Mann-Whitney U with average ranks), O(n log n).
 * NaN scores rank lowest.  Writes *auc (NaN when a class is absent).
 * 0 or -ENOMEM. */
int oracle_auc(const float *scores, const float *labels, size_t n, double *auc);

/* Test samples one evaluation scores: eval_batches batches of batch_size
 * from the start of the test split, where each sample counts at most once:
 * min(eval_batches * batch_size, test_samples) (the product saturates).
 * The batches to read are ceil(that / batch_size), the last one cut to
 * fit.  With test_samples = 0 it is eval_batches * batch_size, uncut: the
 * reader then says that the split is empty. */
uint64_t oracle_eval_samples(uint64_t eval_batches, uint32_t batch_size, uint64_t test_samples);

/* Iterations the reported train logloss averages: the last 10% of
 * `iterations`, at least one (0 when iterations = 0).  The train logloss
 * is the mean of the per-iteration training logloss (the mean BCE over
 * the iteration's global batch) over them. */
uint64_t oracle_train_tail(uint64_t iterations);
/* That definition in words, as summary.json's train_logloss_definition
 * and both `chanter train` printouts give it (NUL-terminated, cut to n). */
void oracle_train_logloss_definition(uint64_t iterations, char *out, size_t n);

/* What a batch of batch_size samples means for a dataset with
 * train_samples / test_samples in its splits: a batch larger than the
 * train split holds batch_size / train_samples copies of it, and one
 * larger than the test split (checked only when eval_batches > 0) as
 * many of that.  Writes one message per such split into notes (each
 * ORACLE_NOTE_MAX bytes, NUL-terminated), saying how many copies; with
 * strict the message is worded as the refusal.  Returns the number of
 * messages, 0..2.  An empty split is left to the reader's own error. */
#define ORACLE_NOTE_MAX 400
int oracle_batch_notes(uint32_t batch_size, uint64_t train_samples, uint64_t test_samples, uint64_t eval_batches,
                       int strict, char notes[2][ORACLE_NOTE_MAX]);

#endif
