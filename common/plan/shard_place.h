/*
 * shard_place: where a job's partitioned tables live on its trainers
 * (strategy.h's owner[] of each table), by the job's shard.placement:
 *
 *   autoshard      the AutoShard planner (shard_plan.h) on the cost model
 *                  (shard.cost_model, or the default built into the
 *                  binary): the partition tables placed to minimize the
 *                  predicted maximum per-trainer cost, each trainer holding
 *                  at most strategy.partition_mb; partition_rows tables
 *                  are spread over every trainer and load each alike;
 *   lookup_greedy  strategy_place's rule (hotness x dim, greedy), which
 *                  ignores memory; the placement before AutoShard;
 *   size_greedy, random   the planner's other baselines (for comparison).
 *
 * When the partition tables do not fit the trainers' memory under any
 * placement the planner finds, they are placed without the limit (as
 * strategy_place does) and the caller's own budget check decides what to
 * spread or cache (strategy_auto.h); the note says so.
 *
 * The placement changes which trainer pools and updates a table, never
 * what it computes: the owner pools the whole global batch and folds the
 * gradients in global sample order whichever trainer it is
 * (trainer_partition.h), so every placement gives the same model bits.
 * It is a pure function of the configuration and the model file, decided
 * when the job starts and again, the same, on every resume.
 *
 * Not thread safe per object (the oracle's loop thread, or its worker
 * pool for table_strategy = auto, one at a time).
 */
#ifndef CHANTER_SHARD_PLACE_H
#define CHANTER_SHARD_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "data.h"
#include "shard_plan.h"
#include "table.h"

typedef struct shard_place_s {
  int algo;                  /* SHARD_ALGO_*, or -1: lookup_greedy by strategy_place */
  shard_cost_t *model;       /* autoshard's (owned), else NULL */
  const data_schema_t *schema;
  const table_layout_t *layout;
  shard_table_t *tables;     /* n_tables: each table as the model sees it (shard_job_tables) */
  uint64_t *bytes;           /* n_tables: its rows' bytes with the optimizer state */
  uint32_t batch, P;
  uint64_t mem_limit;        /* strategy.partition_mb, bytes per trainer */
  uint64_t seed;
  /* the last placement's figures, for the log and summary.json */
  double predicted_max_us, predicted_balance, baseline_max_us, baseline_balance;
  char note[200];
} shard_place_t;

/* Every table of the job as the cost model sees it -- rows, dim, hotness,
 * its Zipf exponent (data_table_alpha), the embedding_optimizer (sgd when
 * the model has no such optimizer) -- into tables[n_tables], and its
 * rows' bytes with the optimizer state into bytes[n_tables] (either may
 * be NULL).  0, or ERR_CONFIG / -ENOMEM with err. */
int shard_job_tables(const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                     shard_table_t *tables, uint64_t *bytes, char *err, size_t err_len);

/* From the job's configuration (schema and layout must outlive it).
 * Loads the model for autoshard.  0, or ERR_CONFIG / -errno with err
 * naming the key, the file and line. */
int shard_place_init(shard_place_t *pl, const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                     uint32_t P, char *err, size_t err_len);
void shard_place_close(shard_place_t *pl);

/* owner[t] for every table of strat (no auto entry): a rank for a
 * partition table, STRATEGY_OWNER_ALL for partition_rows, else
 * STRATEGY_OWNER_NONE.  Fills the figures above (the baseline:
 * lookup_greedy's placement, predicted by the same model; NAN without a
 * model).  0, or -ENOMEM. */
int shard_place_trainers(shard_place_t *pl, const uint8_t *strat, uint32_t *owner);

/* The name of the placement in force ("autoshard", "lookup_greedy", ...). */
const char *shard_place_name(const shard_place_t *pl);

#endif
