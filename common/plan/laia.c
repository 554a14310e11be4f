/* oracle_laia: see laia.h. */
#include "laia.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

#define HOLD_NONE 0u          /* empty map entry */
#define HOLD_SHARED UINT32_MAX /* last used from several trainers */
/* else holder = trainer + 1 */

typedef struct ent_s {
  uint64_t key;
  uint32_t last;   /* batch of the last use (mod 2^32) */
  uint32_t holder; /* HOLD_* or trainer + 1 */
} ent_t;

struct laia_s {
  laia_opts_t o;
  ent_t *tab;
  size_t cap, mask, count;
  int started;
  uint64_t next_x;
  /* per batch / per sample scratch */
  uint32_t *room;     /* P: samples trainer t may still take */
  uint32_t *open;     /* trainers with room, n_open of them */
  uint32_t *open_pos; /* P: position of t in open */
  uint32_t n_open;
  uint32_t *score;    /* P, zero between samples */
  uint32_t *touched;  /* trainers with a score, this sample */
  uint32_t *ties;
  uint64_t *keys;     /* one sample's keys ... */
  size_t *homes;      /* ... and where their probes start */
  size_t per_cap;
  laia_stats_t st;
  /* the profile: per table, ids seen and ids that found a held row; then
   * which tables are scored (NULL until the first batch gives n_tables) */
  uint32_t n_tables;
  uint64_t *t_ids, *t_hits;
  uint8_t *t_on;
  int profiled;
};

static inline int live(const laia_t *l, const ent_t *e, uint32_t x) {
  return e->holder != HOLD_NONE && (uint32_t)(x - e->last) <= l->o.window;
}

static int rehash(laia_t *l, size_t cap, uint32_t x) {
  ent_t *t = calloc(cap, sizeof *t);
  if (!t) return -ENOMEM;
  size_t mask = cap - 1, n = 0;
  for (size_t i = 0; i < l->cap; i++) {
    const ent_t *e = &l->tab[i];
    if (!live(l, e, x)) continue;
    size_t h = (size_t)table_mix64(e->key) & mask;
    while (t[h].holder != HOLD_NONE) h = (h + 1) & mask;
    t[h] = *e;
    n++;
  }
  free(l->tab);
  l->tab = t;
  l->cap = cap;
  l->mask = mask;
  l->count = n;
  return 0;
}

/* Room for `add` more entries at load <= 1/2: first drop the expired
 * ones, then grow. */
static int reserve(laia_t *l, size_t add, uint32_t x) {
  if ((l->count + add) * 2 <= l->cap) return 0;
  size_t live_n = 0;
  for (size_t i = 0; i < l->cap; i++) live_n += live(l, &l->tab[i], x);
  size_t cap = l->cap ? l->cap : 1024;
  while ((live_n + add) * 4 > cap) cap *= 2; /* load <= 1/4 after a rebuild: rebuilds stay rare */
  return rehash(l, cap, x);
}

/* The entry of key; if absent, inserted as held by nobody and expired
 * (capacity reserved). */
static inline ent_t *entry_at(laia_t *l, uint64_t key, size_t h, uint32_t x) {
  for (;;) {
    ent_t *e = &l->tab[h];
    if (e->holder == HOLD_NONE) {
      e->key = key;
      e->holder = HOLD_SHARED;
      e->last = x - l->o.window - 1;
      l->count++;
      return e;
    }
    if (e->key == key) return e;
    h = (h + 1) & l->mask;
  }
}

/* Where key's probe starts. */
static inline size_t home(const laia_t *l, uint64_t key) { return (size_t)table_mix64(key) & l->mask; }

#define AHEAD 16 /* ids whose map entries are prefetched ahead of their probe (the map is far larger than the caches) */

int laia_create(const laia_opts_t *o, laia_t **out) {
  *out = NULL;
  if (!o->trainers || !o->window || o->window > LAIA_WINDOW_MAX || !(o->min_share >= 0 && o->min_share <= 1))
    return -EINVAL;
  laia_t *l = calloc(1, sizeof *l);
  if (!l) return -ENOMEM;
  l->o = *o;
  uint32_t P = o->trainers;
  l->room = calloc(P, sizeof *l->room);
  l->open = calloc(P, sizeof *l->open);
  l->open_pos = calloc(P, sizeof *l->open_pos);
  l->score = calloc(P, sizeof *l->score);
  l->touched = calloc(P, sizeof *l->touched);
  l->ties = calloc(P, sizeof *l->ties);
  if (!l->room || !l->open || !l->open_pos || !l->score || !l->touched || !l->ties) {
    laia_destroy(l);
    return -ENOMEM;
  }
  *out = l;
  return 0;
}

void laia_destroy(laia_t *l) {
  if (!l) return;
  free(l->tab);
  free(l->room);
  free(l->open);
  free(l->open_pos);
  free(l->score);
  free(l->touched);
  free(l->ties);
  free(l->keys);
  free(l->homes);
  free(l->t_ids);
  free(l->t_hits);
  free(l->t_on);
  free(l);
}

void laia_stats(const laia_t *l, laia_stats_t *out) {
  *out = l->st;
  out->rows_held = l->count;
  out->tables = l->n_tables;
  out->tables_scored = 0;
  for (uint32_t t = 0; t < l->n_tables; t++) out->tables_scored += l->t_on[t];
}

int laia_profiled(const laia_t *l) { return l->profiled; }

int laia_table_scored(const laia_t *l, uint32_t t) { return t < l->n_tables && l->t_on[t]; }

double laia_table_share(const laia_t *l, uint32_t t) {
  if (!l->profiled || t >= l->n_tables || !l->t_ids[t]) return NAN;
  return (double)l->t_hits[t] / (double)l->t_ids[t];
}

/* After the profile's last batch: keep the tables that decide something
 * (at least one, the best, so that laia stays laia). */
static void end_profile(laia_t *l) {
  uint32_t best = 0, kept = 0;
  double best_share = -1;
  for (uint32_t t = 0; t < l->n_tables; t++) {
    double sh = l->t_ids[t] ? (double)l->t_hits[t] / (double)l->t_ids[t] : 0;
    l->t_on[t] = sh >= l->o.min_share && l->t_hits[t] > 0;
    kept += l->t_on[t];
    if (sh > best_share) {
      best_share = sh;
      best = t;
    }
  }
  if (!kept && l->n_tables) l->t_on[best] = 1;
  l->profiled = 1;
}

static void close_trainer(laia_t *l, uint32_t t) {
  uint32_t pos = l->open_pos[t], last = l->open[--l->n_open];
  l->open[pos] = last;
  l->open_pos[last] = pos;
}

int laia_assign(laia_t *l, const data_batch_t *b, uint32_t *owner) {
  if (l->started && b->iteration != l->next_x) return -EINVAL;
  if (!l->t_on) {
    l->t_ids = calloc(b->n_tables + 1, sizeof *l->t_ids);
    l->t_hits = calloc(b->n_tables + 1, sizeof *l->t_hits);
    l->t_on = malloc(b->n_tables + 1);
    if (!l->t_ids || !l->t_hits || !l->t_on) {
      free(l->t_ids), free(l->t_hits), free(l->t_on);
      l->t_ids = l->t_hits = NULL;
      l->t_on = NULL;
      return -ENOMEM;
    }
    memset(l->t_on, 1, b->n_tables + 1);
    l->n_tables = b->n_tables;
  } else if (b->n_tables != l->n_tables) {
    return -EINVAL;
  }
  const int profiling = !l->profiled && l->o.profile > 0;
  const uint32_t P = l->o.trainers, B = b->n, x = (uint32_t)b->iteration;
  size_t per = 0; /* ids per sample */
  for (uint32_t t = 0; t < b->n_tables; t++) per += b->hotness[t];
  if (per > l->per_cap) {
    uint64_t *k = realloc(l->keys, per * sizeof *k);
    if (k) l->keys = k;
    size_t *h = realloc(l->homes, per * sizeof *h);
    if (h) l->homes = h;
    if (!k || !h) return -ENOMEM;
    l->per_cap = per;
  }
  if (reserve(l, (size_t)B * per, x) != 0) return -ENOMEM;
  l->n_open = 0;
  for (uint32_t t = 0; t < P; t++) {
    l->room[t] = B / P + (t < B % P);
    if (l->room[t]) {
      l->open_pos[t] = l->n_open;
      l->open[l->n_open++] = t;
    }
  }
  const uint64_t rs = table_mix64(l->o.seed ^ table_mix64(b->iteration ^ UINT64_C(0x6c61696131)));
  /* 1: place every sample, scored against the holdings after the batch before */
  for (uint32_t i = 0; i < B; i++) {
    uint32_t n_touched = 0;
    /* the sample's keys and their homes, prefetched together */
    size_t k = 0;
    for (uint32_t t = 0; t < b->n_tables; t++) {
      if (!l->t_on[t]) continue;
      uint32_t hot = b->hotness[t];
      const uint64_t *ids = b->ids + b->ids_off[t] + (size_t)i * hot;
      for (uint32_t h = 0; h < hot; h++, k++) {
        l->keys[k] = TABLE_KEY(t, ids[h]);
        l->homes[k] = home(l, l->keys[k]);
        __builtin_prefetch(&l->tab[l->homes[k]]);
      }
    }
    for (size_t a = 0; a < k; a++) {
      const ent_t *e = entry_at(l, l->keys[a], l->homes[a], x);
      if (e->holder == HOLD_SHARED || !live(l, e, x)) continue;
      uint32_t q = e->holder - 1;
      if (profiling) l->t_hits[TABLE_ID(l->keys[a])]++;
      if (!l->score[q]++) l->touched[n_touched++] = q;
    }
    uint32_t best = 0, n_ties = 0;
    for (uint32_t j = 0; j < n_touched; j++) {
      uint32_t q = l->touched[j], s = l->score[q];
      l->score[q] = 0;
      if (!l->room[q] || s < best) continue;
      if (s > best) {
        best = s;
        n_ties = 0;
      }
      l->ties[n_ties++] = q;
    }
    uint64_t r = table_mix64(rs + i);
    uint32_t q;
    if (n_ties) {
      /* the candidates in trainer order, so the draw does not depend on the ids' order */
      for (uint32_t a = 1; a < n_ties; a++)
        for (uint32_t c = a; c > 0 && l->ties[c - 1] > l->ties[c]; c--) {
          uint32_t tmp = l->ties[c];
          l->ties[c] = l->ties[c - 1];
          l->ties[c - 1] = tmp;
        }
      q = l->ties[(uint32_t)(((unsigned __int128)r * n_ties) >> 64)];
    } else {
      q = l->open[(uint32_t)(((unsigned __int128)r * l->n_open) >> 64)];
    }
    l->st.scored += n_touched > 0;
    l->st.best += n_ties > 0;
    owner[i] = q;
    if (!--l->room[q]) close_trainer(l, q);
  }
  /* 2: the batch's rows are now held by their one trainer, or by nobody if several used them */
  for (uint32_t t = 0; t < b->n_tables; t++) {
    if (!l->t_on[t]) continue;
    uint32_t hot = b->hotness[t];
    if (profiling) l->t_ids[t] += (uint64_t)B * hot;
    const uint64_t *ids = b->ids + b->ids_off[t];
    size_t n_ids = (size_t)B * hot;
    for (size_t a = 0; a < n_ids && a < AHEAD; a++) __builtin_prefetch(&l->tab[home(l, TABLE_KEY(t, ids[a]))]);
    for (size_t a = 0; a < n_ids; a++) {
      if (a + AHEAD < n_ids) __builtin_prefetch(&l->tab[home(l, TABLE_KEY(t, ids[a + AHEAD]))]);
      uint32_t q = owner[a / hot] + 1;
      uint64_t key = TABLE_KEY(t, ids[a]);
      ent_t *e = entry_at(l, key, home(l, key), x);
      if (e->last != x) { /* first use in this batch (entries inserted expired never have last == x) */
        e->holder = q;
        e->last = x;
      } else if (e->holder != q) {
        e->holder = HOLD_SHARED;
      }
    }
  }
  l->st.batches++;
  l->st.samples += B;
  if (profiling && l->st.batches >= l->o.profile) end_profile(l);
  l->started = 1;
  l->next_x = b->iteration + 1;
  return 0;
}
