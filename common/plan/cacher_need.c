/*
 * cacher_need: the slot need of every L at once (cacher.h, Capacity:
 * cacher_needs) and lookahead = auto's choice from it (cacher_auto).  A
 * pass over the plans' distinct keys; nothing of a cacher_t is needed
 * (cacher_need, the reference that runs the decisions, stays in cacher.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cacher.h"
#include "table.h"
#include "u64map.h"

#define NOT_USED UINT32_MAX /* a key's last use before its first */

/* Each key's last use so far (its batch's index in plans) sits in an
 * array indexed by table and row when the tables' rows are few against
 * the keys (no hashing, a few MB), else in a u64map; cnt[b % (max_l + 1)]
 * counts the keys whose last use so far is b, for the max_l + 1 latest b;
 * after batch x, the slots L needs then are the keys of cnt[x - L .. x]. */
int cacher_needs(const plan_t *plans, size_t n, uint32_t max_l, uint64_t *need) {
  size_t R = (size_t)max_l + 1;
  for (size_t d = 0; d < R; d++) need[d] = 0;
  if (n == 0) return 0;
  if (n >= NOT_USED) return -EINVAL;
  /* check the plans; each table's largest row */
  size_t n_keys = 0;
  uint32_t n_tab = 0;
  for (size_t x = 0; x < n; x++) {
    const plan_t *p = &plans[x];
    if (p->iteration != plans[0].iteration + x || (p->n_unique && !p->ukeys)) return -EINVAL;
    for (size_t i = 1; i < p->n_unique; i++) /* distinct: a key counts once per batch */
      if (p->ukeys[i - 1] >= p->ukeys[i]) return -EINVAL;
    if (p->n_unique && TABLE_ID(p->ukeys[p->n_unique - 1]) + 1 > n_tab) n_tab = TABLE_ID(p->ukeys[p->n_unique - 1]) + 1;
    n_keys += p->n_unique;
  }
  uint64_t *off = calloc((size_t)n_tab + 1, sizeof *off); /* first: each table's rows + 1, then offsets */
  uint64_t *cnt = calloc(R, sizeof *cnt);
  if (!off || !cnt) {
    free(off);
    free(cnt);
    return -ENOMEM;
  }
  for (size_t x = 0; x < n; x++)
    for (size_t i = 0; i < plans[x].n_unique; i++) {
      uint64_t k = plans[x].ukeys[i];
      if (TABLE_ROW(k) + 1 > off[TABLE_ID(k)]) off[TABLE_ID(k)] = TABLE_ROW(k) + 1;
    }
  uint64_t rows = 0;
  for (uint32_t t = 0; t <= n_tab; t++) {
    uint64_t r = off[t];
    off[t] = rows;
    rows += t < n_tab ? r : 0;
  }
  uint32_t *last = NULL; /* dense: last use by off[table] + row; else the map */
  if (rows <= 4 * (uint64_t)n_keys + 4096 && rows <= ((uint64_t)1 << 28) && (last = malloc(rows * sizeof *last)))
    memset(last, 0xff, rows * sizeof *last); /* NOT_USED */
  u64map_t map = {0};
  int rc = last ? 0 : u64map_init(&map, plans[0].n_unique * 4 + 1024);
  for (size_t x = 0; x < n && !rc; x++) {
    const plan_t *p = &plans[x];
    cnt[x % R] = 0; /* it counted batch x - R, no longer needed */
    for (size_t i = 0; i < p->n_unique; i++) {
      uint64_t k = p->ukeys[i];
      uint32_t *lu;
      if (last) {
        lu = &last[off[TABLE_ID(k)] + TABLE_ROW(k)];
      } else if ((rc = u64map_insert(&map, k, NOT_USED, &lu)) < 0) {
        break;
      }
      rc = 0;
      if (*lu != NOT_USED && x - *lu < R) cnt[*lu % R]--;
      *lu = (uint32_t)x;
    }
    if (rc) break;
    cnt[x % R] += p->n_unique;
    uint64_t s = 0;
    for (size_t d = 0; d < R; d++) {
      if (d <= x) s += cnt[(x - d) % R]; /* (before the first batch: nothing) */
      if (s > need[d]) need[d] = s;
    }
  }
  free(last);
  free(off);
  free(cnt);
  u64map_close(&map);
  return rc;
}

int cacher_auto(const plan_t *plans, size_t n, uint32_t P, uint64_t cache_rows, uint32_t max_l, int lrpp,
                uint32_t *l, uint64_t *need) {
  (void)P; /* the need depends on neither: every key cached takes one slot */
  (void)lrpp;
  uint64_t *nd = malloc(((size_t)max_l + 1) * sizeof *nd);
  if (!nd) return -ENOMEM;
  int rc = cacher_needs(plans, n, max_l, nd);
  if (rc) {
    free(nd);
    return rc;
  }
  /* the need grows with L: the largest L that fits, else L = 0 (*need then says by how much it does not) */
  *l = 0;
  *need = nd[0];
  for (uint32_t L = max_l + 1; L-- > 0;)
    if (nd[L] <= cache_rows) {
      *l = L;
      *need = nd[L];
      break;
    }
  free(nd);
  return 0;
}
