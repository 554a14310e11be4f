/*
 * trainer_eval: an Eval item -- forward only over the oracle's test
 * samples with the model as it is after the iteration just trained, the
 * logits and labels back in an EvalResult.
 *
 * With the cache, the conductor first waits for this trainer's background
 * work (trainer_pipeline_bg_wait), then trainer_eval_sync writes the rows
 * only this trainer holds current (the ones it owns, LRPP) to the
 * embedding servers and meets every trainer at a barrier, after which
 * every write-back is durable and every trainer has finished the same
 * iterations (the conductor advances the gate); trainer_eval_answer then
 * takes the rows that are cached from the cache (newer than the servers')
 * and fetches the others.  In ideal mode the rows come from the local
 * store and there is nothing to synchronize.
 *
 * Owns t->eval.  Training thread.  0 or a negative code with err.
 */
#ifndef CHANTER_TRAINER_EVAL_H
#define CHANTER_TRAINER_EVAL_H

#include <stddef.h>

#include "trainer_loop.h"
#include "trainer_work.h"

typedef struct trainer_eval_s {
  float *logits; /* the answer's logits */
  size_t cap;
} trainer_eval_t;

void trainer_eval_close(trainer_t *t);

/* Warns when the model is not the one w asks for (it is evaluated
 * anyway); with the cache, the owned rows to the servers and the barrier.
 * err: the bare sentence (the caller names the round). */
int trainer_eval_sync(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len);

/* The rows of w's samples, the forward, the EvalResult (a failed send sets
 * t->write_failed), the metric. */
int trainer_eval_answer(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len);

#endif
