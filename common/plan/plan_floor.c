/* plan_floor: see plan_floor.h. */
#include "plan_floor.h"

#include <errno.h>
#include <string.h>

#define DEFAULT_MIN_KEYS ((size_t)1 << 16)
#define SWEEP_EVERY_BATCHES (UINT64_C(1) << 31) /* ages are kept mod 2^32 */

int plan_floor_init(plan_floor_t *f, size_t min_keys) {
  memset(f, 0, sizeof *f);
  f->min_keys = min_keys ? min_keys : DEFAULT_MIN_KEYS;
  return u64map_init(&f->last, f->min_keys);
}

void plan_floor_close(plan_floor_t *f) {
  u64map_close(&f->last);
  memset(f, 0, sizeof *f);
}

/* Batches between x and a stored (batch + 1) mod 2^32. */
static inline uint32_t age(uint64_t x, uint32_t stored) { return (uint32_t)(x + 1) - stored; }

/* Keeps the keys used in batches x - L .. x only: a new map with them
 * replaces the old one.  Out of memory: the old one stays (the counts stay
 * exact; only the bound is missed until the next try). */
static void sweep(plan_floor_t *f, uint64_t x, uint32_t L) {
  const u64map_t *m = &f->last;
  size_t keep = 0;
  for (size_t i = 0; i < m->cap; i++) keep += m->tab[i].full && age(x, m->tab[i].val) <= L;
  u64map_t n;
  if (u64map_init(&n, keep > f->min_keys ? keep : f->min_keys) != 0) return;
  for (size_t i = 0; i < m->cap; i++)
    if (m->tab[i].full && age(x, m->tab[i].val) <= L && u64map_insert(&n, m->tab[i].key, m->tab[i].val, NULL) < 0) {
      u64map_close(&n);
      return;
    }
  u64map_close(&f->last);
  f->last = n;
  f->kept = keep;
  f->swept_at = x;
  f->sweeps++;
}

int plan_floor_add(plan_floor_t *f, const plan_t *p, uint32_t L, uint64_t *first_use, uint64_t *shared) {
  uint64_t x = p->iteration, fu = 0, sh = 0;
  if (p->n_unique && !p->ukeys) return -EINVAL;
  int rc = 0;
  for (size_t k = 0; k < p->n_unique; k++) {
    uint32_t *at;
    int fresh = u64map_insert(&f->last, p->ukeys[k], 0, &at);
    if (fresh < 0) {
      rc = fresh;
      break;
    }
    /* not used in the L batches before x (an entry of x itself cannot be: the keys are distinct) */
    if (fresh || age(x, *at) > L) fu++;
    if (p->users && p->users[k] == UINT32_MAX) sh++;
    *at = (uint32_t)(x + 1);
  }
  if (rc) return rc;
  f->batches++;
  f->first_use += fu;
  f->shared += sh;
  if (first_use) *first_use = fu;
  if (shared) *shared = sh;
  size_t n = u64map_count(&f->last);
  if ((n > f->min_keys && n > 2 * f->kept) || x - f->swept_at >= SWEEP_EVERY_BATCHES) sweep(f, x, L);
  return 0;
}

double plan_floor_per_iteration(const plan_floor_t *f) {
  return f->batches ? (double)(f->first_use + f->shared) / (double)f->batches : 0;
}
