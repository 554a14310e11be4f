/* u64map: see u64map.h. */
#include "u64map.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MIN_CAP 16

/* m takes a zeroed table of cap entries (a power of two).  0 or -ENOMEM. */
static int tab_alloc(u64map_t *m, size_t cap) {
  u64map_ent_t *tab = calloc(cap, sizeof *tab);
  if (!tab) return -ENOMEM;
  int bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  m->tab = tab;
  m->cap = cap;
  m->shift = 64 - bits;
  m->n = 0;
  return 0;
}

int u64map_init(u64map_t *m, size_t keys) {
  memset(m, 0, sizeof *m);
  size_t cap = MIN_CAP;
  while (cap / 2 < keys && cap <= SIZE_MAX / 4) cap *= 2; /* load <= 1/2 */
  return tab_alloc(m, cap);
}

void u64map_close(u64map_t *m) {
  free(m->tab);
  memset(m, 0, sizeof *m);
}

/* The entry holding key, or the empty entry that ends its probe run (there
 * is always one: the table is at most half full). */
static size_t probe(const u64map_t *m, uint64_t key) {
  size_t mask = m->cap - 1, i = u64map_home(m, key);
  while (m->tab[i].full && m->tab[i].key != key) i = (i + 1) & mask;
  return i;
}

/* Doubles the table and reinserts every key; unchanged on -ENOMEM. */
static int grow(u64map_t *m) {
  u64map_t g;
  if (tab_alloc(&g, 2 * m->cap) != 0) return -ENOMEM;
  for (size_t j = 0; j < m->cap; j++)
    if (m->tab[j].full) g.tab[probe(&g, m->tab[j].key)] = m->tab[j];
  g.n = m->n;
  free(m->tab);
  *m = g;
  return 0;
}

int u64map_find(const u64map_t *m, uint64_t key, uint32_t *val) {
  const u64map_ent_t *e = &m->tab[probe(m, key)];
  if (!e->full) return 0;
  if (val) *val = e->val;
  return 1;
}

int u64map_insert(u64map_t *m, uint64_t key, uint32_t val, uint32_t **at) {
  size_t i = probe(m, key);
  int inserted = !m->tab[i].full;
  if (inserted) {
    if (2 * (m->n + 1) > m->cap) {
      if (grow(m) != 0) return -ENOMEM;
      i = probe(m, key);
    }
    m->tab[i] = (u64map_ent_t){.key = key, .val = val, .full = 1};
    m->n++;
  }
  if (at) *at = &m->tab[i].val;
  return inserted;
}

int u64map_erase(u64map_t *m, uint64_t key, uint32_t *val) {
  size_t mask = m->cap - 1, i = probe(m, key);
  if (!m->tab[i].full) return 0;
  if (val) *val = m->tab[i].val;
  /* i is a hole.  Walk the rest of the run: an entry at j whose probe path
   * (home h .. j, cyclically) passes over the hole moves into it, and its
   * old place becomes the hole.  The run then stays unbroken for every key
   * still in it. */
  for (size_t j = (i + 1) & mask; m->tab[j].full; j = (j + 1) & mask) {
    size_t h = u64map_home(m, m->tab[j].key);
    if (((j - h) & mask) >= ((j - i) & mask)) {
      m->tab[i] = m->tab[j];
      i = j;
    }
  }
  m->tab[i].full = 0;
  m->n--;
  return 1;
}
