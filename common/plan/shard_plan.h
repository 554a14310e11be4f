/*
 * shard_plan: which device holds which embedding table -- AutoShard's
 * planner (papers/autoshard.txt) on the cost model of shard_cost.h, and
 * the heuristics it is measured against.  Devices are trainers
 * (partitioned tables, strategy.h) or embedding servers (table-wise
 * tables, shard.h); the model's kind says which.
 *
 * The input is the tables (each as the model sees it, plus its bytes with
 * the optimizer state), D devices, a memory limit per device, the model,
 * kind and global batch.  A table may be SPREAD: its rows are split over
 * every device (partition_rows on trainers, a server's row-wise tables),
 * so every device holds 1/D of its rows and bytes and serves 1/D of its
 * ids: the model sees it on each device as a table of rows/D rows and
 * hotness/D.  Spread tables are not placed; they load every device alike.
 *
 * Algorithms (shard_plan_run):
 *   autoshard      greedy on predicted cost: tables by decreasing
 *                  predicted cost alone, each to the device whose predicted
 *                  cost with it is lowest (ties: the lower device) among
 *                  those it fits; then local search: moves of a table off
 *                  the most costly device and swaps of one of its tables
 *                  with one elsewhere, taking each round the change that
 *                  lowers the predicted maximum cost most (ties: the sum of
 *                  squared costs), until none does or the evaluation
 *                  budget is spent.  The budget counts model readouts, not
 *                  seconds, so the plan is a pure function of the input
 *                  and the model: every run gives the same placement (and
 *                  the same model digest);
 *   lookup_greedy  tables by decreasing hotness x dim (ties: more rows,
 *                  then the lower index) each to the device with the least
 *                  hotness x dim so far (ties: the lower device), spread
 *                  tables counted as floor(hotness x dim / D) on each:
 *                  strategy_place's rule (common/strategy.c), the same
 *                  owners when no memory limit binds;
 *   size_greedy    the same by bytes;
 *   random         each table to a device drawn from the seed among those
 *                  it fits.
 * All respect the memory limit: a table goes only where it fits, and one
 * that fits nowhere is an error naming it, its size and the room left.
 * Pure functions; any thread.
 */
#ifndef CHANTER_SHARD_PLAN_H
#define CHANTER_SHARD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "shard_cost.h"

enum { SHARD_ALGO_AUTOSHARD = 0, SHARD_ALGO_LOOKUP_GREEDY, SHARD_ALGO_SIZE_GREEDY, SHARD_ALGO_RANDOM, SHARD_ALGOS };
#define SHARD_PLAN_SPREAD UINT32_MAX   /* owner of a spread table */
#define SHARD_PLAN_BUDGET 2000000      /* default evaluations of the local search */

/* "autoshard", "lookup_greedy", "size_greedy", "random"; and back (-1). */
const char *shard_algo_name(int algo);
int shard_algo_parse(const char *s);

typedef struct shard_plan_in_s {
  const shard_table_t *tables;
  const uint64_t *bytes;   /* per table: rows x (dim + optimizer state) x 4 */
  const uint8_t *spread;   /* per table: 1 = its rows over every device (NULL: none) */
  uint32_t n;              /* tables */
  uint32_t devices;        /* D >= 1 */
  uint64_t mem_limit;      /* bytes per device (0: no limit) */
  const shard_cost_t *model;
  int kind;                /* SHARD_KIND_* (the model must have it) */
  uint32_t batch;          /* global batch */
  uint64_t seed;           /* random */
  uint64_t budget;         /* autoshard's evaluations (0: SHARD_PLAN_BUDGET) */
} shard_plan_in_t;

typedef struct shard_plan_s {
  uint32_t n, devices;
  uint32_t *owner;   /* per table: its device, or SHARD_PLAN_SPREAD */
  double *cost;      /* per device: predicted microseconds per iteration */
  uint64_t *bytes;   /* per device: bytes held (spread tables' shares included) */
  uint32_t *count;   /* per device: tables placed on it (spread ones not counted) */
  double max_cost, min_cost;
  double balance;    /* min_cost / max_cost (1 when max is 0) */
  uint64_t evals;    /* model readouts the algorithm used */
} shard_plan_t;

/* Places the tables of in by algo into *out (allocated here; free with
 * shard_plan_close).  0, or -EINVAL (no devices, a model without kind),
 * ERR_CONFIG with err naming the table that fits on no device and the
 * room left, -ENOMEM. */
int shard_plan_run(const shard_plan_in_t *in, int algo, shard_plan_t *out, char *err, size_t err_len);

/* The predicted per-device cost, bytes and balance of a given placement
 * (owner per table; SHARD_PLAN_SPREAD for the spread ones) into *out,
 * which copies owner.  0, -EINVAL with err (an owner past the devices, a
 * spread table given an owner), -ENOMEM.  The memory limit is not
 * checked: out->bytes says what each device would hold. */
int shard_plan_eval(const shard_plan_in_t *in, const uint32_t *owner, shard_plan_t *out, char *err, size_t err_len);

void shard_plan_close(shard_plan_t *p);

#endif
