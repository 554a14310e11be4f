/*
 * trainer_exec: the training steps of chanter-trainer, phase by phase, on
 * a decoded Step (trainer_work.h): the math of trainer_step.h plus the
 * communication that belongs to the step itself (the dense all-reduce,
 * the critical rows' all-reduce, the replication of owned rows (LRPP)), and
 * the Report to the oracle.
 *
 * A step with the cache is cut where the other threads meet it, and the
 * conductor (trainer_loop.c) runs the pieces in order with the pipeline's
 * calls between them:
 *   trainer_exec_forward        a. forward over the cached rows
 *   [pipeline: wait for the background work of x-1]
 *   trainer_exec_backward       c. the key map learns x's rows; backward
 *                                  with the dense all-reduce overlapped
 *   [pipeline: gate advances to x]
 *   trainer_exec_sync_critical  d. the critical rows' all-reduce
 *   [pipeline: room for the background work]
 *   trainer_exec_update         e. updates (delayed rows' gradients packed
 *                                  for the background), ownership
 *   [pipeline: x handed to the background (waited for after the last)]
 *   trainer_exec_report         g. the Report, metrics, progress line
 * mode = ideal is one call, trainer_exec_step_ideal, then the report.
 * Each piece records its phase times and counts in the step record
 * (trainer_exec_step_t, the conductor's), which the report sends.
 *
 * Owns t->exec.  Training thread; errors are 0 or a negative code with a
 * sentence naming the iteration.
 */
#ifndef CHANTER_TRAINER_EXEC_H
#define CHANTER_TRAINER_EXEC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "phase.h"
#include "trainer_loop.h"
#include "trainer_work.h"

typedef struct trainer_exec_s {
  atomic_ullong last_done; /* last finished iteration + 1 (0: none); any thread reads it */
  float *crit_buf;         /* the critical rows' gradients, packed */
  size_t cap_crit;
} trainer_exec_t;

/* What one step moved, for the Report, the metrics and the log. */
typedef struct trainer_exec_counts_s {
  size_t fetched, synced, synced_delayed, replicated, written_back, hits;
  double dense_comm, prefetch_wait, sync_wait, sync_critical, replicate;
  double alltoall;      /* the partitioned tables' pooling and AlltoAlls (trainer_partition.h) */
  double part_compute;  /* of alltoall, the work on this trainer's own tables (trainer_partition_t.t_compute) */
  size_t part_updated;  /* rows of partitioned tables this trainer updated */
  uint32_t lookahead;
} trainer_exec_counts_t;

/* One step in flight.  The conductor reads x and adds its waits for the
 * background to c.sync_wait; the rest is trainer_exec's.  After
 * trainer_exec_update it no longer needs the Step (it may go to the
 * background). */
typedef struct trainer_exec_step_s {
  const trainer_work_t *w;
  uint64_t iteration;
  uint32_t n;       /* samples */
  int cache;        /* the cache path: the hand-off phase ends when the report starts */
  double loss;
  double t_wait;    /* the wait for the item */
  double t0, t_end; /* the step's start; the end of its last phase measured */
  double ph[PHASE_N_STEP]; /* the step's phases (phase.h: the Report's t_*, the last_phase_seconds gauge) */
  trainer_exec_counts_t c;
} trainer_exec_step_t;

/* Registers the trainer's metrics in reg (may be NULL) into t->m. */
void trainer_exec_metrics(trainer_t *t, metrics_registry_t *reg);
void trainer_exec_close(trainer_t *t);

/* mode = ideal: step w (iteration expect) whole: rows from the local
 * store, forward, backward with the dense all-reduce, update, rows back.
 * t_wait: the wait for the item. */
int trainer_exec_step_ideal(trainer_t *t, const trainer_work_t *w, uint64_t expect, double t_wait,
                            trainer_exec_step_t *s, char *err, size_t err_len);

/* The cache path, in this order (header comment).  t_prefetch: the part of
 * t_wait spent on this step's own rows (trainer_pipeline_next).
 * delayed_grads: room from trainer_pipeline_bg_reserve. */
int trainer_exec_forward(trainer_t *t, const trainer_work_t *w, uint64_t expect, double t_wait, double t_prefetch,
                         trainer_exec_step_t *s, char *err, size_t err_len);
int trainer_exec_backward(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len);
int trainer_exec_sync_critical(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len);
int trainer_exec_update(trainer_t *t, trainer_exec_step_t *s, float *delayed_grads, char *err, size_t err_len);

/* Sends the Report of s (a GPU failure during the step is reported as the
 * step's error instead), then last_done = x + 1, the metrics, the
 * progress line; after the last iteration the dense digest (and
 * --save-dense).  A failed send sets t->write_failed. */
int trainer_exec_report(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len);

#endif
