/*
 * oracle_cache: see oracle_cache.h.
 *
 * State: one open-addressing hash map (linear probing, backward-shift
 * deletion, no tombstones) from key to its entry -- last use in the window,
 * slot (when cached), the batch that fetched it, whether batch x+1 uses it,
 * and a per-(batch, trainer) stamp for counting each trainer's distinct
 * keys; the window (pointers to the caller's plans); the freed slots in a
 * FIFO tagged with the batch after which they were freed (so the front
 * holds the slots reusable soonest).
 */
#include "oracle_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "table.h"

#define EMPTY UINT64_MAX
#define NOSLOT UINT32_MAX
#define SHARED UINT32_MAX

typedef struct ent_s {
  uint64_t key;   /* EMPTY: free */
  uint64_t last;  /* last use among the batches that entered */
  uint64_t since; /* batch that fetched it (valid when slot != NOSLOT) */
  uint64_t next;  /* x + 1 when batch x + 1 uses it (set while deciding x) */
  uint64_t seen;  /* x * P + p + 1: counted for trainer p in batch x */
  uint32_t slot;
  uint32_t pad;
} ent_t;

/* per distinct key of the batch being decided */
enum { C_FETCH_ONE = 1, C_FETCH_ALL = 2, C_EVICT = 4, C_PRIVATE = 8, C_CRITICAL = 16, C_DELAYED = 32, C_HIT = 64 };

struct ocache_s {
  ocache_opts_t o;
  uint32_t L;
  /* map */
  ent_t *tab;
  size_t cap, n;
  int shift;
  /* window: plans x = next_decide .. next_push - 1 */
  const oracle_plan_t **win;
  size_t win_cap;
  uint64_t next_push, next_decide;
  int ended, failed;
  /* slots */
  uint64_t fresh;      /* slots ever handed out: 0 .. fresh-1 */
  uint32_t *fq;        /* freed slots, FIFO ring */
  uint64_t *fq_y;      /* ... freed after this batch */
  size_t fq_cap, fq_head, fq_n;
  size_t cached;
  /* scratch for one decision */
  uint8_t *cls;
  uint32_t *uslot;
  ent_t **uent;
  size_t cap_u;
  size_t *cnt_fetch, *cnt_wb;
};

static inline size_t nz(size_t n) { return n ? n : 1; }

/* ------------------------------------------------------------------ map */

static inline size_t home(const ocache_t *c, uint64_t key) {
  return (size_t)((tbl_mix64(key) * UINT64_C(0x9e3779b97f4a7c15)) >> c->shift);
}

static int map_init(ocache_t *c, size_t cap) {
  int bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  cap = (size_t)1 << bits;
  ent_t *t = malloc(cap * sizeof *t);
  if (!t) return -ENOMEM;
  for (size_t i = 0; i < cap; i++) t[i].key = EMPTY;
  c->tab = t;
  c->cap = cap;
  c->shift = 64 - bits;
  c->n = 0;
  return 0;
}

static ent_t *map_find(const ocache_t *c, uint64_t key) {
  size_t mask = c->cap - 1;
  for (size_t i = home(c, key);; i = (i + 1) & mask) {
    ent_t *e = &c->tab[i];
    if (e->key == key) return e;
    if (e->key == EMPTY) return NULL;
  }
}

static int map_grow(ocache_t *c) {
  ent_t *old = c->tab;
  size_t oc = c->cap;
  if (map_init(c, oc * 2) != 0) {
    c->tab = old;
    c->cap = oc;
    int bits = 0;
    while (((size_t)1 << bits) < oc) bits++;
    c->shift = 64 - bits;
    return -ENOMEM;
  }
  size_t mask = c->cap - 1;
  for (size_t j = 0; j < oc; j++) {
    if (old[j].key == EMPTY) continue;
    size_t i = home(c, old[j].key);
    while (c->tab[i].key != EMPTY) i = (i + 1) & mask;
    c->tab[i] = old[j];
    c->n++;
  }
  free(old);
  return 0;
}

/* The entry of key, created (slot NOSLOT) when absent. */
static ent_t *map_upsert(ocache_t *c, uint64_t key) {
  if ((c->n + 1) * 2 > c->cap && map_grow(c) != 0) return NULL;
  size_t mask = c->cap - 1;
  for (size_t i = home(c, key);; i = (i + 1) & mask) {
    ent_t *e = &c->tab[i];
    if (e->key == key) return e;
    if (e->key == EMPTY) {
      memset(e, 0, sizeof *e);
      e->key = key;
      e->slot = NOSLOT;
      e->next = UINT64_MAX;
      c->n++;
      return e;
    }
  }
}

/* Backward-shift deletion: later entries of the probe run move up so that
 * every entry stays reachable from its home without tombstones. */
static void map_erase(ocache_t *c, ent_t *e) {
  size_t mask = c->cap - 1, i = (size_t)(e - c->tab), j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (c->tab[j].key == EMPTY) break;
    size_t h = home(c, c->tab[j].key);
    /* may the entry at j move to i?  yes when its home is not in (i, j] */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      c->tab[i] = c->tab[j];
      i = j;
    }
  }
  c->tab[i].key = EMPTY;
  c->n--;
}

/* ------------------------------------------------------------------ create */

int ocache_create(const ocache_opts_t *o, ocache_t **out) {
  *out = NULL;
  if (!o || o->trainers == 0) return -EINVAL;
  ocache_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->o = *o;
  c->L = o->lookahead;
  c->win_cap = 8;
  c->win = calloc(c->win_cap, sizeof *c->win);
  c->cnt_fetch = calloc(o->trainers, sizeof *c->cnt_fetch);
  c->cnt_wb = calloc(o->trainers, sizeof *c->cnt_wb);
  if (!c->win || !c->cnt_fetch || !c->cnt_wb || map_init(c, 1024) != 0) {
    ocache_destroy(c);
    return -ENOMEM;
  }
  *out = c;
  return 0;
}

void ocache_destroy(ocache_t *c) {
  if (!c) return;
  free(c->tab);
  free(c->win);
  free(c->fq);
  free(c->fq_y);
  free(c->cls);
  free(c->uslot);
  free(c->uent);
  free(c->cnt_fetch);
  free(c->cnt_wb);
  free(c);
}

size_t ocache_window(const ocache_t *c) { return (size_t)(c->next_push - c->next_decide); }
uint32_t ocache_lookahead(const ocache_t *c) { return c->L; }
size_t ocache_cached(const ocache_t *c) { return c->cached; }
uint64_t ocache_slots_peak(const ocache_t *c) { return c->fresh; }

/* slots usable now by a key first used at x: none waiting */
uint64_t ocache_slots_used(const ocache_t *c) {
  uint64_t x = c->next_decide, usable = 0;
  for (size_t k = 0; k < c->fq_n; k++) {
    size_t i = (c->fq_head + k) % c->fq_cap;
    if (c->fq_y[i] + c->L + 1 > x) break;
    usable++;
  }
  return c->fresh - usable;
}

static const oracle_plan_t *win_at(const ocache_t *c, uint64_t x) { return c->win[x % c->win_cap]; }

int ocache_push(ocache_t *c, const oracle_plan_t *p) {
  if (c->failed || c->ended) return -EINVAL;
  if (!p || p->x != c->next_push || p->trainers != c->o.trainers || (p->n_unique && (!p->ukeys || !p->users)))
    return -EINVAL;
  if (ocache_window(c) + 1 > c->win_cap) { /* re-seat the ring at double size */
    size_t nc = c->win_cap * 2;
    const oracle_plan_t **w = calloc(nc, sizeof *w);
    if (!w) return -ENOMEM;
    for (uint64_t x = c->next_decide; x < c->next_push; x++) w[x % nc] = win_at(c, x);
    free(c->win);
    c->win = w;
    c->win_cap = nc;
  }
  for (size_t i = 0; i < p->n_unique; i++) {
    ent_t *e = map_upsert(c, p->ukeys[i]);
    if (!e) return -ENOMEM;
    e->last = p->x;
  }
  c->win[p->x % c->win_cap] = p;
  c->next_push++;
  return 0;
}

void ocache_end(ocache_t *c) { c->ended = 1; }

int ocache_ready(const ocache_t *c) {
  size_t w = ocache_window(c);
  return !c->failed && w > 0 && (c->ended || w >= (size_t)c->L + 1);
}

/* ------------------------------------------------------------------ slots */

static int fq_push(ocache_t *c, uint32_t slot, uint64_t y) {
  if (c->fq_n == c->fq_cap) {
    size_t nc = c->fq_cap ? c->fq_cap * 2 : 1024;
    uint32_t *s = malloc(nc * sizeof *s);
    uint64_t *yy = malloc(nc * sizeof *yy);
    if (!s || !yy) {
      free(s);
      free(yy);
      return -ENOMEM;
    }
    for (size_t k = 0; k < c->fq_n; k++) {
      size_t i = (c->fq_head + k) % c->fq_cap;
      s[k] = c->fq[i];
      yy[k] = c->fq_y[i];
    }
    free(c->fq);
    free(c->fq_y);
    c->fq = s;
    c->fq_y = yy;
    c->fq_cap = nc;
    c->fq_head = 0;
  }
  size_t i = (c->fq_head + c->fq_n) % c->fq_cap;
  c->fq[i] = slot;
  c->fq_y[i] = y;
  c->fq_n++;
  return 0;
}

/* A slot for a key first used at x: the oldest freed slot if it has waited
 * out L batches, else a fresh one, else (cache full) lower L until a freed
 * slot qualifies.  NOSLOT when nothing fits even at L = 0. */
static uint32_t slot_alloc(ocache_t *c, uint64_t x) {
  for (;;) {
    if (c->fq_n && c->fq_y[c->fq_head] + c->L + 1 <= x) {
      uint32_t s = c->fq[c->fq_head];
      c->fq_head = (c->fq_head + 1) % c->fq_cap;
      c->fq_n--;
      return s;
    }
    if (!c->o.cache_rows || c->fresh < c->o.cache_rows) {
      if (c->fresh >= NOSLOT) return NOSLOT;
      return (uint32_t)c->fresh++;
    }
    if (c->L == 0) return NOSLOT;
    c->L--;
  }
}

/* ------------------------------------------------------------------ decide */

static int grow_scratch(ocache_t *c, size_t n) {
  if (n <= c->cap_u) return 0;
  size_t nc = c->cap_u ? c->cap_u : 1024;
  while (nc < n) nc *= 2;
  uint8_t *cls = realloc(c->cls, nc);
  if (cls) c->cls = cls;
  uint32_t *us = realloc(c->uslot, nc * sizeof *us);
  if (us) c->uslot = us;
  ent_t **ue = realloc(c->uent, nc * sizeof *ue);
  if (ue) c->uent = ue;
  if (!cls || !us || !ue) return -ENOMEM;
  c->cap_u = nc;
  return 0;
}

void ocache_dec_free(ocache_dec_t *d) {
  if (!d) return;
  for (uint32_t p = 0; d->tr && p < d->trainers; p++) {
    ocache_tr_t *t = &d->tr[p];
    free(t->slots);
    free(t->fetch_keys);
    free(t->fetch_slots);
    free(t->wb_keys);
    free(t->wb_slots);
  }
  free(d->tr);
  free(d->critical);
  free(d->delayed);
  free(d->critical_keys);
  free(d->delayed_keys);
  memset(d, 0, sizeof *d);
}

static int dec_alloc(ocache_dec_t *d, const oracle_plan_t *p, const size_t *nf, const size_t *nw, size_t ncrit,
                     size_t ndel) {
  uint32_t P = p->trainers;
  d->trainers = P;
  d->tr = calloc(P, sizeof *d->tr);
  d->critical = malloc(nz(ncrit) * sizeof *d->critical);
  d->critical_keys = malloc(nz(ncrit) * sizeof *d->critical_keys);
  d->delayed = malloc(nz(ndel) * sizeof *d->delayed);
  d->delayed_keys = malloc(nz(ndel) * sizeof *d->delayed_keys);
  if (!d->tr || !d->critical || !d->critical_keys || !d->delayed || !d->delayed_keys) return -ENOMEM;
  for (uint32_t q = 0; q < P; q++) {
    ocache_tr_t *t = &d->tr[q];
    t->n_ids = p->shares[q].n_ids;
    t->slots = malloc(nz(t->n_ids) * sizeof *t->slots);
    t->fetch_keys = malloc(nz(nf[q]) * sizeof *t->fetch_keys);
    t->fetch_slots = malloc(nz(nf[q]) * sizeof *t->fetch_slots);
    t->wb_keys = malloc(nz(nw[q]) * sizeof *t->wb_keys);
    t->wb_slots = malloc(nz(nw[q]) * sizeof *t->wb_slots);
    if (!t->slots || !t->fetch_keys || !t->fetch_slots || !t->wb_keys || !t->wb_slots) return -ENOMEM;
  }
  return 0;
}

/* d == NULL: decisions only (ocache_need). */
static int decide(ocache_t *c, ocache_dec_t *d, char *err, size_t err_len) {
  if (c->failed) return -EINVAL;
  if (!ocache_ready(c)) return -EAGAIN;
  uint64_t x = c->next_decide;
  const oracle_plan_t *p = win_at(c, x);
  uint32_t P = c->o.trainers;
  size_t U = p->n_unique;
  int rc;
  if ((rc = grow_scratch(c, U + 1)) != 0) goto fail;

  /* which keys batch x + 1 uses (the critical ones among x's shared keys) */
  int split = c->o.delayed && c->L >= 1 && x + 1 < c->next_push;
  if (split) {
    const oracle_plan_t *n1 = win_at(c, x + 1);
    for (size_t i = 0; i < n1->n_unique; i++) {
      ent_t *e = map_find(c, n1->ukeys[i]);
      if (e) e->next = x + 1;
    }
  }

  /* pass 1: classify, allocate slots */
  size_t ncrit = 0, ndel = 0, n_new = 0, n_evict = 0;
  memset(c->cnt_fetch, 0, P * sizeof *c->cnt_fetch);
  memset(c->cnt_wb, 0, P * sizeof *c->cnt_wb);
  size_t n_fetch_all = 0;
  for (size_t i = 0; i < U; i++) {
    uint64_t k = p->ukeys[i];
    uint32_t user = p->users[i];
    ent_t *e = map_find(c, k);
    if (!e) { /* pushed keys are always there: a bug, not bad input */
      snprintf(err, err_len, "batch %" PRIu64 ": key %#" PRIx64 " is not in the window", x, k);
      rc = -EINVAL;
      goto fail;
    }
    uint8_t f = 0;
    int evict = e->last == x;
    int priv = c->o.lrpp && user != SHARED && evict;
    if (e->slot == NOSLOT) {
      uint32_t s = slot_alloc(c, x);
      if (s == NOSLOT) {
        snprintf(err, err_len,
                 "cache_rows = %" PRIu64 " is too small: batch %" PRIu64 " needs more slots even at lookahead 0 "
                 "(%zu distinct rows in the batch, %zu cached across it); raise cache_rows",
                 c->o.cache_rows, x, U, c->cached);
        rc = ERR_CONFIG;
        goto fail;
      }
      e->slot = s;
      e->since = x;
      c->cached++;
      n_new++;
      f |= priv ? C_FETCH_ONE : C_FETCH_ALL;
      if (priv) c->cnt_fetch[user]++;
      else n_fetch_all++;
    }
    if (priv) {
      f |= C_PRIVATE;
    } else if (split && e->next != x + 1) {
      f |= C_DELAYED;
      ndel++;
    } else {
      f |= C_CRITICAL;
      ncrit++;
    }
    if (evict) {
      f |= C_EVICT;
      n_evict++;
      uint32_t owner = priv ? user : (uint32_t)(tbl_mix64(k) % P);
      c->cnt_wb[owner]++;
    }
    c->cls[i] = f;
    c->uslot[i] = e->slot;
    c->uent[i] = e;
  }

  if (d) {
    memset(d, 0, sizeof *d);
    for (uint32_t q = 0; q < P; q++) c->cnt_fetch[q] += n_fetch_all;
    if ((rc = dec_alloc(d, p, c->cnt_fetch, c->cnt_wb, ncrit, ndel)) != 0) goto fail_dec;
    d->x = x;
    d->n_unique = U;
    d->n_new = n_new;
    d->n_evicted = n_evict;
    /* pass 2: the lists, in ascending key order */
    for (size_t i = 0; i < U; i++) {
      uint64_t k = p->ukeys[i];
      uint32_t s = c->uslot[i], user = p->users[i];
      uint8_t f = c->cls[i];
      if (f & C_FETCH_ALL) {
        for (uint32_t q = 0; q < P; q++) {
          ocache_tr_t *t = &d->tr[q];
          t->fetch_keys[t->n_fetch] = k;
          t->fetch_slots[t->n_fetch++] = s;
        }
      } else if (f & C_FETCH_ONE) {
        ocache_tr_t *t = &d->tr[user];
        t->fetch_keys[t->n_fetch] = k;
        t->fetch_slots[t->n_fetch++] = s;
      }
      if (f & C_PRIVATE) d->tr[user].n_private++;
      if (f & C_CRITICAL) {
        d->critical_keys[d->n_critical] = k;
        d->critical[d->n_critical++] = s;
      } else if (f & C_DELAYED) {
        d->delayed_keys[d->n_delayed] = k;
        d->delayed[d->n_delayed++] = s;
      }
      if (f & C_EVICT) {
        ocache_tr_t *t = &d->tr[(f & C_PRIVATE) ? user : (uint32_t)(tbl_mix64(k) % P)];
        t->wb_keys[t->n_wb] = k;
        t->wb_slots[t->n_wb++] = s;
      }
    }
    /* each id -> its slot; each trainer's distinct keys and hits */
    for (uint32_t q = 0; q < P; q++) {
      const oracle_share_t *sh = &p->shares[q];
      ocache_tr_t *t = &d->tr[q];
      uint64_t stamp = x * P + q + 1;
      size_t o = 0;
      for (uint32_t tb = 0; tb < p->n_tables; tb++) {
        size_t m = (size_t)sh->n * p->hotness[tb];
        for (size_t j = 0; j < m; j++) {
          ent_t *e = map_find(c, TBL_KEY(tb, sh->ids[o + j]));
          if (!e || e->slot == NOSLOT) {
            snprintf(err, err_len, "batch %" PRIu64 ": trainer %u's id %zu (table %u row %" PRIu64 ") has no slot",
                     x, q, o + j, tb, sh->ids[o + j]);
            rc = -EINVAL;
            goto fail_dec;
          }
          t->slots[o + j] = e->slot;
          if (e->seen != stamp) {
            e->seen = stamp;
            t->n_keys++;
            if (e->since < x) t->n_hits++;
          }
        }
        o += m;
      }
    }
  }

  /* evictions: slots wait L batches in the FIFO, entries leave the map
   * (erasing moves entries, so by key, after every use of uent) */
  for (size_t i = 0; i < U; i++) {
    if (!(c->cls[i] & C_EVICT)) continue;
    if ((rc = fq_push(c, c->uslot[i], x)) != 0) goto fail_dec;
    ent_t *e = map_find(c, p->ukeys[i]);
    map_erase(c, e);
    c->cached--;
  }
  if (d) {
    d->lookahead = c->L;
    d->gate = x > c->L ? x - c->L : 0;
    d->slots_used = c->fresh;
  }
  c->win[x % c->win_cap] = NULL;
  c->next_decide++;
  return 0;

fail_dec:
  if (d) ocache_dec_free(d);
fail:
  c->failed = 1;
  if (rc == -ENOMEM && err_len) snprintf(err, err_len, "out of memory deciding batch %" PRIu64, x);
  return rc;
}

int ocache_decide(ocache_t *c, ocache_dec_t *d, char *err, size_t err_len) {
  if (err_len) err[0] = 0;
  return decide(c, d, err, err_len);
}

/* ------------------------------------------------------------------ need, auto */

int ocache_need(const oracle_plan_t *plans, size_t n, uint32_t P, uint32_t L, int lrpp, uint64_t *need) {
  ocache_opts_t o = {.trainers = P, .lookahead = L, .cache_rows = 0, .lrpp = lrpp, .delayed = 0};
  ocache_t *c;
  int rc = ocache_create(&o, &c);
  if (rc) return rc;
  char err[256];
  for (size_t i = 0; i < n && !rc; i++) {
    if ((rc = ocache_push(c, &plans[i])) != 0) break;
    if (i + 1 == n) ocache_end(c);
    while (!rc && ocache_ready(c)) rc = decide(c, NULL, err, sizeof err);
  }
  *need = c->fresh;
  ocache_destroy(c);
  return rc;
}

int ocache_auto(const oracle_plan_t *plans, size_t n, uint32_t P, uint64_t cache_rows, uint32_t max_l, int lrpp,
                uint32_t *l, uint64_t *need) {
  uint64_t nd;
  int rc = ocache_need(plans, n, P, 0, lrpp, &nd);
  if (rc) return rc;
  *l = 0;
  *need = nd;
  if (nd > cache_rows) return 0;
  uint32_t lo = 0, hi = max_l; /* need(lo) fits */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo + 1) / 2;
    if ((rc = ocache_need(plans, n, P, mid, lrpp, &nd)) != 0) return rc;
    if (nd <= cache_rows) {
      lo = mid;
      *need = nd;
    } else {
      hi = mid - 1;
    }
  }
  *l = lo;
  return 0;
}
