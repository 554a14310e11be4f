/*
 * plan_floor: the traffic floor of a cached job counted online, batch by
 * batch, from its PLAN_KEYS plans -- the oracle's running count of what
 * `chanter bench e2e` measures offline from the data (data_floor, data.h).
 *
 * For each batch x, with window L (the job's lookahead when x is decided):
 *   first_use  the distinct keys of x that no trainer used in batches
 *              x - L .. x - 1: whatever the cache, they come from the
 *              embedding servers (and go back to them);
 *   shared     the keys of x that two or more trainers use (plan users ==
 *              UINT32_MAX): they travel between trainers (synchronized).
 * Their sum over the batches counted, over the batches, is the floor per
 * iteration: the rows a perfect cache of the last L batches would still
 * move.  Only the keys the plan holds count: a plan the partitioned tables
 * were dropped from (plan_drop_tables) counts the cached tables alone,
 * whose rows are the only ones that move through the cache.
 *
 * State: a hash map key -> the batch that used it last, bounded: once it
 * holds more than twice the keys it kept at its last sweep (and more than
 * min_keys), the keys last used more than L batches ago are dropped (one
 * pass, amortized over the growth).  Cost per batch: one map insert per
 * distinct key of the plan.
 *
 * Not thread-safe; one owner (the oracle's loop).  Pure otherwise.
 */
#ifndef CHANTER_PLAN_FLOOR_H
#define CHANTER_PLAN_FLOOR_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "u64map.h"

typedef struct plan_floor_s {
  u64map_t last;      /* key -> (the batch that used it last + 1) mod 2^32 */
  size_t min_keys;    /* no sweep below this many keys */
  size_t kept;        /* keys the last sweep kept */
  uint64_t swept_at;  /* the batch of the last sweep (a sweep at least every 2^31 batches keeps ages exact) */
  uint64_t batches;   /* batches counted */
  uint64_t first_use; /* summed over them */
  uint64_t shared;
  uint64_t sweeps;    /* sweeps done (tests read it) */
} plan_floor_t;

/* An empty count whose map has room for min_keys keys before it grows and
 * is swept (0: 65536).  0 or -ENOMEM. */
int plan_floor_init(plan_floor_t *f, size_t min_keys);
/* Frees the map; safe on a zeroed or failed one. */
void plan_floor_close(plan_floor_t *f);

/* Counts batch p->iteration against the L batches before it.  Batches
 * come in increasing order (the floor of a batch depends on those before
 * it).  *first_use and *shared (either may be NULL) get this batch's
 * counts; the totals grow by them.  0, -EINVAL (a plan with keys but no
 * key list: not a PLAN_KEYS plan) or -ENOMEM (the count is then unchanged
 * up to the keys already entered). */
int plan_floor_add(plan_floor_t *f, const plan_t *p, uint32_t L, uint64_t *first_use, uint64_t *shared);

/* (first_use + shared) / batches, 0 before any batch. */
double plan_floor_per_iteration(const plan_floor_t *f);

#endif
