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
 * With a cost model (strategy.auto_cost = model, the default: o->cost, the
 * job's shard.cost_model with its trainer, server and collective parts),
 * the same comparison is made in predicted microseconds a batch instead of
 * weighted bytes, each term from what `chanter bench tables` timed on the
 * machine (shard_cost.h):
 *   cache      the trainer's pool, fold and update of t for its B/P
 *              samples (every trainer alike, in parallel)
 *            + the servers' Lookup and WriteBack of t's rows new in the
 *              window (the server model of t's batch, times the share of
 *              its distinct rows that are new)
 *            + shared(t) x 4d bytes more in the gradients' all-reduce
 *              (the allreduce line's slope)
 *   partition  the owner's pool, fold and update of t for all B samples
 *            + 2 x B x (P-1)/P x 4d bytes more in the AlltoAlls (the
 *              alltoall line's slope; forward and backward)
 * and a mechanism's cost a step is its collectives' fixed cost (the
 * lines' intercepts: one all-reduce; two AlltoAlls).  The model is a file,
 * fitted once, so the choice is still a pure function of the job.
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
#include "shard_cost.h"
#include "table.h"

typedef struct strategy_auto_opts_s {
  uint32_t P, L, B;
  double cache_weight;   /* >= 0 */
  double step_bytes;     /* what running a mechanism costs a step, in AlltoAll bytes (>= 0) */
  uint64_t budget_bytes; /* partitioned rows one trainer may hold */
  /* where the partitioned tables go (shard_place_trainers); NULL: strategy_place */
  int (*place)(void *ctx, const uint8_t *strat, uint32_t *owner);
  void *place_ctx;
  /* predicted costs: a model with trainer, server and both collectives'
   * parameters (strategy_auto_model_ok), and every table as it sees them
   * (shard_job_tables); NULL: weighted bytes */
  const shard_cost_t *cost;
  const shard_table_t *tables;
} strategy_auto_opts_t;

/* Whether m can price the choice; if not, why (for the log). */
int strategy_auto_model_ok(const shard_cost_t *m, char *why, size_t why_len);

typedef struct strategy_auto_table_s {
  double new_rows, shared_rows; /* per batch (the mean over the batches after the first) */
  double cache_bytes, part_bytes; /* per batch, cache_bytes weighted */
  double cache_us, part_us;       /* predicted per batch (NAN without a model) */
  double cache_cost, part_cost;   /* what the choice compares: the _us with a model, else the _bytes */
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
