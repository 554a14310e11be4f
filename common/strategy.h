/*
 * strategy: how each embedding table's rows move -- its strategy (the job's
 * table_strategy, tuned by the strategy.* keys; papers/embrace.txt section
 * 4, hybrid communication).  (tstrat_ = "table strategy"; NOTES-h7.md
 * plans one name for the module.)
 *
 *   cache      the lookahead cache (DESIGN.md 3-4): rows are fetched into
 *              every trainer that uses them, synchronized, written back;
 *   partition  the table's rows live on one trainer for the whole run
 *              (table-wise): it pools them for the whole global batch, the
 *              pooled embeddings go to the trainers that own the samples by
 *              AlltoAll, their gradients come back the same way, and the
 *              owner updates the rows and writes them back at checkpoints,
 *              evaluations and the end (services/trainer/trainer_partition.h);
 *   partition_rows
 *              the table's rows are spread over every trainer (row-wise:
 *              trainer p holds the rows r with r mod P = p): each trainer
 *              pools its rows for the whole global batch into partial sums,
 *              the AlltoAll gives every trainer the partial sums of its
 *              samples from every trainer, added in rank order, and every
 *              trainer gets the gradients of the whole batch back to update
 *              its rows.  For a table too large for one trainer, or too
 *              much work for one;
 *   auto       the oracle chooses cache, partition or partition_rows per
 *              table at the start of the run, from the traffic of its
 *              measured batches (oracle.measure_batches), within
 *              strategy.partition_mb (common/plan/strategy_auto.h).
 *
 * A partitioned table is one whose strategy is partition or
 * partition_rows: its rows live on the trainers, outside the cache.
 *
 * table_strategy is one word for every table, or a comma-separated list of
 * one word per table.  Placement of the partition tables on the trainers
 * is table-wise and deterministic: the partition_rows tables' work is
 * shared by all, then the partition tables in decreasing order of their
 * per-batch work (hotness x dim; ties: more rows first, then the lower
 * index) each go to the trainer with the least work so far (ties: the
 * lower rank).  Pure functions; any thread.
 */
#ifndef CHANTER_STRATEGY_H
#define CHANTER_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "data.h"
#include "table.h"

enum { STRATEGY_CACHE = 0, STRATEGY_PARTITION = 1, STRATEGY_AUTO = 2, STRATEGY_PARTITION_ROWS = 3 };
/* The owner of a table (strategy_place; Step.partition_owner on the wire, whose
 * comment in proto/oracle.proto says the same): a rank for a partition
 * table, or one of these. */
#define STRATEGY_OWNER_NONE UINT32_MAX       /* 0xFFFFFFFF: a cached table (not partitioned) */
#define STRATEGY_OWNER_ALL (UINT32_MAX - 1) /* 0xFFFFFFFE: a partition_rows table: every trainer, rows r mod P */

/* "cache" / "partition" / "auto" / "partition_rows" */
const char *strategy_name(int s);

/* The words of a table_strategy value v (one, or comma-separated), the
 * first cap of them into out (NULL: none kept), their count in *n.  0, or
 * ERR_CONFIG with why naming the entry that is not cache, partition,
 * partition_rows or auto.  cfg.c checks a value with it when it is set. */
int strategy_words(const char *v, uint8_t *out, uint32_t cap, uint32_t *n, char *why, size_t why_len);

/* cfg's table_strategy for n_tables tables into out[n_tables].
 * 0, or ERR_CONFIG with err naming the word, its position and the key's
 * origin (a list of another length than table_rows, an unknown word). */
int strategy_parse(const cfg_t *cfg, uint32_t n_tables, uint8_t *out, char *err, size_t err_len);

/* 1 if any of strat[0..n) is not cache. */
int strategy_any_partitioned(const uint8_t *strat, uint32_t n);

/* Places the tables with strat[t] == STRATEGY_PARTITION on P trainers
 * (above): owner[t] = its trainer, STRATEGY_OWNER_ALL for partition_rows,
 * STRATEGY_OWNER_NONE for every other table. */
void strategy_place(const uint8_t *strat, const data_schema_t *schema, const table_layout_t *layout, uint32_t P,
                  uint32_t *owner);

/* Does trainer `rank` hold rows of a table with this owner?  Which local
 * index is row r there (a table-wise owner: r; partition_rows: r / P), and
 * how many rows does it hold of a table of `rows`? */
static inline int strategy_holds(uint32_t owner, uint32_t rank) { return owner == rank || owner == STRATEGY_OWNER_ALL; }
static inline int strategy_holds_row(uint32_t owner, uint32_t rank, uint32_t P, uint64_t r) {
  return owner == rank || (owner == STRATEGY_OWNER_ALL && r % P == rank);
}
static inline uint64_t strategy_local_rows(uint32_t owner, uint32_t rank, uint32_t P, uint64_t rows) {
  return owner == rank ? rows : owner == STRATEGY_OWNER_ALL ? (rows > rank ? (rows - rank + P - 1) / P : 0) : 0;
}

#endif
