/*
 * strategy_auto: table_strategy = auto (contract in strategy_auto.h).
 */
#include "strategy_auto.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategy.h"
#include "u64map.h"

/* A table's rows are counted in a dense array indexed by row while it is
 * at most this many times the table's keys over the measured batches (else
 * a hash map of its keys): the counts are the same either way. */
#define DENSE_PER_KEY 8

/* The counts of table t over plans[0..n): ukeys ascend, so table t's keys
 * of plan i start at cur[i] (advanced past them here).  A row is new in
 * batch i when not used in the L batches before; shared when several
 * trainers use it.  0 or -ENOMEM. */
static int traffic_table(const plan_t *plans, size_t n, uint32_t L, uint32_t t, size_t *cur, double *cn,
                         double *cs) {
  size_t keys = 0;
  uint64_t rows = 0; /* the largest row seen + 1 */
  for (size_t i = 0; i < n; i++) {
    const plan_t *p = &plans[i];
    size_t a = cur[i], b = a;
    while (b < p->n_unique && TABLE_ID(p->ukeys[b]) == t) b++;
    if (b > a && TABLE_ROW(p->ukeys[b - 1]) + 1 > rows) rows = TABLE_ROW(p->ukeys[b - 1]) + 1;
    keys += b - a;
  }
  if (!keys) return 0;
  /* the batch + 1 that used each row last (0: none yet) */
  int dense = rows / DENSE_PER_KEY <= keys;
  uint32_t *last = dense ? calloc((size_t)rows, sizeof *last) : NULL;
  u64map_t map;
  if (dense ? !last : u64map_init(&map, keys) != 0) return -ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    const plan_t *p = &plans[i];
    int count = n == 1 || i > 0; /* the first batch is all new: a cold start, not the steady state */
    for (; cur[i] < p->n_unique && TABLE_ID(p->ukeys[cur[i]]) == t; cur[i]++) {
      size_t k = cur[i];
      uint32_t *at, was;
      if (dense) {
        at = &last[TABLE_ROW(p->ukeys[k])];
        was = *at;
      } else {
        int r = u64map_insert(&map, p->ukeys[k], 0, &at);
        if (r < 0) {
          rc = r;
          break;
        }
        was = *at;
      }
      if (count && (was == 0 || (was - 1) + L < i)) *cn += 1; /* not used in the L batches before */
      if (count && p->users && p->users[k] == UINT32_MAX) *cs += 1;
      *at = (uint32_t)i + 1;
    }
  }
  if (dense) free(last);
  else u64map_close(&map);
  return rc;
}

/* new / shared rows per batch of every table over plans[0..n), table by
 * table (each table's rows in a small array, not every row of the job in
 * one map). */
static int traffic(const plan_t *plans, size_t n, uint32_t L, uint32_t T, double *nw, double *sh) {
  double *cn = calloc(T, sizeof *cn), *cs = calloc(T, sizeof *cs);
  size_t *cur = calloc(n, sizeof *cur);
  int rc = cn && cs && cur ? 0 : -ENOMEM;
  size_t counted = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!plans[i].ukeys && plans[i].n_unique) rc = -EINVAL;
    counted += n == 1 || i > 0;
  }
  for (uint32_t t = 0; t < T && !rc; t++) rc = traffic_table(plans, n, L, t, cur, &cn[t], &cs[t]);
  for (uint32_t t = 0; t < T && !rc; t++) {
    nw[t] = counted ? cn[t] / (double)counted : 0;
    sh[t] = counted ? cs[t] / (double)counted : 0;
  }
  free(cn), free(cs), free(cur);
  return rc;
}

int strategy_auto_model_ok(const shard_cost_t *m, char *why, size_t why_len) {
  const char *miss = !m                                          ? "no cost model"
                     : !shard_cost_has(m, SHARD_KIND_TRAINER)    ? "the cost model has no trainer part"
                     : !shard_cost_has(m, SHARD_KIND_SERVER)     ? "the cost model has no server part"
                     : !shard_cost_coll_line(m, SHARD_COLL_ALLREDUCE) ? "the cost model has no allreduce line"
                     : !shard_cost_coll_line(m, SHARD_COLL_ALLTOALL)  ? "the cost model has no alltoall line"
                                                                 : NULL;
  if (miss && why_len) snprintf(why, why_len, "%s", miss);
  return !miss;
}

/* The predicted microseconds a batch of table t under each mechanism
 * (strategy_auto.h). */
static void predict(const strategy_auto_opts_t *o, const shard_table_t *tt, double new_rows, double shared_rows,
                    uint32_t P, strategy_auto_table_t *x) {
  const shard_cost_t *m = o->cost;
  double d = tt->dim, B = o->B;
  uint32_t local = (o->B + P - 1) / P;
  double distinct = shard_cost_distinct(tt->rows, tt->alpha, B * tt->hotness);
  double share = distinct > 0 ? new_rows / distinct : 0;
  if (share > 1) share = 1;
  const shard_coll_t *ar = shard_cost_coll_line(m, SHARD_COLL_ALLREDUCE), *a2a = shard_cost_coll_line(m, SHARD_COLL_ALLTOALL);
  x->cache_us = shard_cost_predict(m, SHARD_KIND_TRAINER, tt, 1, local ? local : 1) +
                shard_cost_predict(m, SHARD_KIND_SERVER, tt, 1, o->B) * share +
                shared_rows * 4 * d * ar->us_per_mb / (1 << 20);
  x->part_us = shard_cost_predict(m, SHARD_KIND_TRAINER, tt, 1, o->B) +
               2.0 * B * (P - 1) / P * 4 * d * a2a->us_per_mb / (1 << 20);
}

int strategy_auto_choose(const plan_t *plans, size_t n, const uint8_t *strat, const data_schema_t *schema,
                     const table_layout_t *layout, const strategy_auto_opts_t *o, uint8_t *out, strategy_auto_table_t *tab) {
  uint32_t T = schema->n_tables, P = o->P ? o->P : 1;
  if (!n) return -EINVAL;
  double *nw = calloc(T, sizeof *nw), *sh = calloc(T, sizeof *sh);
  uint32_t *owner = malloc(T * sizeof *owner);
  uint64_t *held = calloc(P, sizeof *held);
  int rc = nw && sh && owner && held ? traffic(plans, n, o->L, T, nw, sh) : -ENOMEM;
  for (uint32_t t = 0; t < T && !rc; t++) {
    double d = layout->tables[t].dim, r = table_row_floats(layout, t);
    strategy_auto_table_t *x = &tab[t];
    memset(x, 0, sizeof *x);
    x->new_rows = nw[t];
    x->shared_rows = sh[t];
    x->cache_bytes = o->cache_weight * (nw[t] * 2 * 4 * r + sh[t] * 2 * 4 * d);
    x->part_bytes = 2.0 * o->B * (P - 1) / P * 4 * d;
    x->cache_us = x->part_us = NAN;
    if (o->cost) predict(o, &o->tables[t], nw[t], sh[t], P, x);
    /* what the choice compares: predicted microseconds, or weighted bytes */
    x->cache_cost = o->cost ? x->cache_us : x->cache_bytes;
    x->part_cost = o->cost ? x->part_us : x->part_bytes;
  }
  const int us = o->cost != NULL;
  double step[2] = {o->step_bytes, o->step_bytes}; /* [cache, partition] */
  if (us) {
    step[0] = shard_cost_coll_line(o->cost, SHARD_COLL_ALLREDUCE)->alpha_us;
    step[1] = 2 * shard_cost_coll_line(o->cost, SHARD_COLL_ALLTOALL)->alpha_us;
  }
  /* the three assignments of the auto tables, each with the fixed ones:
   * [0] each to its cheaper mechanism, [1] all partitioned, [2] all cached */
  double cost[3] = {0, 0, 0};
  int uses[3][2] = {{0, 0}, {0, 0}, {0, 0}}; /* [cache, partition] in use */
  for (uint32_t t = 0; t < T && !rc; t++)
    for (int a = 0; a < 3; a++) {
      int part = strat[t] == STRATEGY_AUTO ? (a == 0 ? tab[t].part_cost < tab[t].cache_cost : a == 1)
                                         : strat[t] == STRATEGY_PARTITION;
      cost[a] += part ? tab[t].part_cost : tab[t].cache_cost;
      uses[a][part] = 1;
    }
  int best = 0;
  for (int a = 0; a < 3; a++) {
    cost[a] += step[0] * uses[a][0] + step[1] * uses[a][1];
    if (cost[a] < cost[best]) best = a;
  }
  static const char *const plan[3] = {"each table to its cheaper mechanism", "every auto table partitioned",
                                      "every auto table cached"};
  for (uint32_t t = 0; t < T && !rc; t++) {
    strategy_auto_table_t *x = &tab[t];
    out[t] = strat[t];
    if (strat[t] != STRATEGY_AUTO) {
      snprintf(x->why, sizeof x->why, "fixed by table_strategy");
      continue;
    }
    int part = best == 0 ? x->part_cost < x->cache_cost : best == 1;
    out[t] = part ? STRATEGY_PARTITION : STRATEGY_CACHE;
    if (us)
      snprintf(x->why, sizeof x->why,
               "auto: %s (predicted: partition %.0f us a batch, the cache %.0f: %.0f rows new in the window, %.0f "
               "shared; %s: %.0f us with %.0f / %.0f us a step for the cache / partition)",
               part ? "partition" : "the cache", x->part_us, x->cache_us, nw[t], sh[t], plan[best], cost[best], step[0],
               step[1]);
    else
      snprintf(x->why, sizeof x->why,
               "auto: %s (partition moves %.0f KB a batch, the cache %.0f: %.0f rows new in the window, %.0f shared, "
               "cache bytes x %.1f; %s: %.0f KB with %.0f KB a step per mechanism)",
               part ? "partition" : "the cache", x->part_bytes / 1e3, x->cache_bytes / 1e3, nw[t], sh[t],
               o->cache_weight, plan[best], cost[best] / 1e3, o->step_bytes / 1e3);
  }
  /* the budget: while a trainer holds more than budget_bytes, the auto
   * table with the most rows there is spread over every trainer
   * (partition_rows, the same bytes a batch) -- or, when only spread auto
   * tables are left to move, the biggest of those goes back to the cache */
  while (!rc) {
    if (!o->place)
      strategy_place(out, schema, layout, P, owner);
    else if ((rc = o->place(o->place_ctx, out, owner)) != 0)
      break;
    memset(held, 0, P * sizeof *held);
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t q = 0; q < P; q++)
        held[q] += strategy_local_rows(owner[t], q, P, schema->table_rows[t]) * table_row_floats(layout, t) * 4;
    int over = -1;
    for (uint32_t q = 0; q < P && over < 0; q++)
      if (held[q] > o->budget_bytes) over = (int)q;
    if (over < 0) break;
    int big = -1, spread = -1;
    for (uint32_t t = 0; t < T; t++) {
      if (strat[t] != STRATEGY_AUTO) continue;
      if (owner[t] == (uint32_t)over && (big < 0 || schema->table_rows[t] > schema->table_rows[big])) big = (int)t;
      if (owner[t] == STRATEGY_OWNER_ALL && (spread < 0 || schema->table_rows[t] > schema->table_rows[spread]))
        spread = (int)t;
    }
    if (big >= 0 && P > 1) {
      out[big] = STRATEGY_PARTITION_ROWS;
      snprintf(tab[big].why, sizeof tab[big].why,
               "auto: partition_rows (partition moves %.0f KB a batch, the cache %.0f, but its %llu rows do not fit "
               "strategy.partition_mb on trainer %d: spread over all %u)",
               tab[big].part_bytes / 1e3, tab[big].cache_bytes / 1e3, (unsigned long long)schema->table_rows[big],
               over, P);
      continue;
    }
    int back = big >= 0 ? big : spread;
    if (back < 0) break; /* only fixed tables left there: the user's choice */
    out[back] = STRATEGY_CACHE;
    snprintf(tab[back].why, sizeof tab[back].why,
             "auto: the cache (partition moves %.0f KB a batch, the cache %.0f, but its %llu rows do not fit "
             "strategy.partition_mb, even spread over %u trainers)",
             tab[back].part_bytes / 1e3, tab[back].cache_bytes / 1e3, (unsigned long long)schema->table_rows[back], P);
  }
  for (uint32_t t = 0; t < T && !rc; t++) tab[t].choice = out[t];
  free(nw), free(sh), free(owner), free(held);
  return rc;
}
