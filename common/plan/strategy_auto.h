/*
 * strategy_auto: table_strategy = auto -- the oracle's choice, per table,
 * between the lookahead cache and partitioning (strategy.h), from the
 * measured batches: the first oracle.measure_batches of the run (PLAN_KEYS
 * plans, before any table was dropped).
 *
 * Traffic per batch, in bytes, for each table t (B samples, P trainers,
 * dim d, row r floats with the optimizer state, window L):
 *   cache      new(t) x 2 x 4r   rows first used inside the window (not
 *                                in the L batches before): fetched from
 *                                the servers and later written back,
 *            + shared(t) x 2 x 4d  rows several trainers use in the batch:
 *                                their gradients all-reduced;
 *              weighted by cache_weight (strategy.cache_weight): what
 *              a byte the cache moves (the servers' reads and inserts,
 *              the hand-overs, the ordered all-reduces) costs against a
 *              byte of AlltoAll between trainers -- chanter bench e2e
 *              measures both (README, "Table strategies")
 *   partition  2 x B x (P-1)/P x 4d  the pooled embeddings of the samples
 *                                other trainers own, and their gradients.
 * Each mechanism also costs something every step it runs at all, whatever
 * its bytes (the cache: its critical all-reduce, hand-overs, background
 * work and server calls; partition: its two AlltoAlls): step_bytes each
 * (strategy.step_kb), in AlltoAll bytes.  So the auto tables go, as a
 * whole, to whichever of three assignments costs least -- each table to
 * its cheaper mechanism, all of them partitioned, all of them cached (ties
 * in that order) -- with the fixed tables' bytes and mechanisms counted in
 * every one.  A table
 * then stays partitioned only while its rows fit the trainers' budget
 * (strategy.partition_mb each, after placing them: o->place, the job's
 * shard.placement, or strategy_place): while a trainer is over
 * it, the auto table with the most rows there is spread over every trainer
 * instead (partition_rows: the same bytes a batch, 1/P of the rows each),
 * and when only spread ones are left to move, the biggest goes back to the
 * cache.  Nothing here is timed, so the same job and data always give the
 * same choice -- and so the same model bits, on every run and every
 * resume (a choice that depended on a timing would not).
 *
 * Pure; any thread.
 */
#ifndef CHANTER_STRATEGY_AUTO_H
#define CHANTER_STRATEGY_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "plan.h"
#include "table.h"

typedef struct strategy_auto_opts_s {
  uint32_t P, L, B;
  double cache_weight;   /* >= 0 */
  double step_bytes;     /* what running a mechanism costs a step, in AlltoAll bytes (>= 0) */
  uint64_t budget_bytes; /* partitioned rows one trainer may hold */
  /* where the partitioned tables go (shard_place_trainers); NULL: strategy_place */
  int (*place)(void *ctx, const uint8_t *strat, uint32_t *owner);
  void *place_ctx;
} strategy_auto_opts_t;

typedef struct strategy_auto_table_s {
  double new_rows, shared_rows; /* per batch (the mean over the batches after the first) */
  double cache_bytes, part_bytes; /* per batch, cache_bytes weighted */
  int choice;                   /* STRATEGY_CACHE, STRATEGY_PARTITION or STRATEGY_PARTITION_ROWS (the budget) */
  char why[240];                /* for the log and summary.json */
} strategy_auto_table_t;

/* Resolves every strat[t] == STRATEGY_AUTO into out[t] (other entries are
 * copied) from plans[0..n) (consecutive PLAN_KEYS plans of one job, n >=
 * 1), filling tab[t] for every table (fixed ones: their traffic too, why
 * says "fixed").  0, -EINVAL (n = 0, a plan without keys), -ENOMEM. */
int strategy_auto_choose(const plan_t *plans, size_t n, const uint8_t *strat, const data_schema_t *schema,
                     const table_layout_t *layout, const strategy_auto_opts_t *o, uint8_t *out, strategy_auto_table_t *tab);

#endif
