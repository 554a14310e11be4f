/*
 * jobrule: the sizes and definitions behind what a training job reports,
 * shared by the oracle (a job on a cluster) and `chanter train --local`
 * (a job in one process) so that both say the same thing: how many test
 * samples an evaluation scores, which iterations "train logloss" averages,
 * and what a batch larger than its split means.
 *
 * Tested in tests/unit/test_oracle_plan.c.  Pure functions, any thread.
 */
#ifndef CHANTER_JOBRULE_H
#define CHANTER_JOBRULE_H

#include <stddef.h>
#include <stdint.h>

/* Test samples one evaluation scores: eval_batches batches of batch_size
 * from the start of the test split, where each sample counts at most once:
 * min(eval_batches * batch_size, test_samples) (the product saturates).
 * The batches to read are ceil(that / batch_size), the last one cut to
 * fit.  With test_samples = 0 it is eval_batches * batch_size, uncut: the
 * reader then says that the split is empty. */
uint64_t jobrule_eval_samples(uint64_t eval_batches, uint32_t batch_size, uint64_t test_samples);

/* Iterations the reported train logloss averages: the last 10% of
 * `iterations`, at least one (0 when iterations = 0).  The train logloss
 * is the mean of the per-iteration training logloss (the mean BCE over
 * the iteration's global batch) over them. */
uint64_t jobrule_train_tail(uint64_t iterations);
/* That definition in words, as summary.json's train_logloss_definition
 * and both `chanter train` printouts give it (NUL-terminated, cut to n). */
void jobrule_train_logloss_definition(uint64_t iterations, char *out, size_t n);

/* What a batch of batch_size samples means for a dataset with
 * train_samples / test_samples in its splits: a batch larger than the
 * train split holds batch_size / train_samples copies of it, and one
 * larger than the test split (checked only when eval_batches > 0) as
 * many of that.  Writes one message per such split into notes (each
 * JOBRULE_NOTE_MAX bytes, NUL-terminated), saying how many copies; with
 * strict the message is worded as the refusal.  Returns the number of
 * messages, 0..2.  An empty split is left to the reader's own error. */
#define JOBRULE_NOTE_MAX 400
int jobrule_batch_notes(uint32_t batch_size, uint64_t train_samples, uint64_t test_samples, uint64_t eval_batches,
                        int strict, char notes[2][JOBRULE_NOTE_MAX]);

#endif
