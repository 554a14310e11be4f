/*
 * oracle_cache: see cacher.h.
 *
 * State: one open-addressing hash map (linear probing, backward-shift
 * deletion, no tombstones) from key to a 16-byte entry -- last use in the
 * window and slot (when cached); the window (pointers to the caller's
 * plans); the freed slots in a FIFO tagged with the batch after which they
 * were freed (so the front holds the slots reusable soonest).
 *
 * Speed.  The map holds every key cached or in the window (millions with a
 * long lookahead), so each access is a cache miss: the loops over a
 * batch's keys prefetch the buckets PF keys ahead, the map is backed by
 * huge pages when large, and the per-batch work avoids it where it can --
 * which keys batch x + 1 uses comes from merging the two batches' sorted
 * key lists, each evicted entry leaves the map while pass 1 holds it, and
 * each id is mapped to its slot through a small per-table table of the
 * batch's own distinct keys (hashed, or indexed by row when the rows are
 * few; it fits in the CPU cache), not through the map.
 */
#include "cacher.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "err.h"
#include "table.h"

#define EMPTY UINT64_MAX
#define NOSLOT UINT32_MAX
#define SHARED UINT32_MAX

typedef struct ent_s {
  uint64_t key;   /* EMPTY: free */
  uint32_t slot;  /* NOSLOT: not cached */
  uint16_t last;  /* last use among the batches that entered, mod 2^16: every key in the map is
                     cached or in the window, so its last use is in [x, x + window], and the
                     window stays below 2^16 batches (cacher_push), so equality with x is exact */
  uint16_t owner; /* cached: the one trainer whose copy is current (LRPP), or OWNER_SHARED */
} ent_t; /* 16 bytes: four to a cache line */

#define OWNER_SHARED 0xffffu
#define OWNER(e) ((e)->owner == OWNER_SHARED ? SHARED : (uint32_t)(e)->owner)
#define SET_OWNER(e, v) ((e)->owner = (v) == SHARED ? (uint16_t)OWNER_SHARED : (uint16_t)(v))
#define WINDOW_MAX 60000u /* batches pushed and not decided (see last) */

/* An entry of the per-table table of a batch's distinct keys (map_ids). */
typedef struct lent_s {
  uint64_t key; /* EMPTY: free */
  uint32_t slot;
  uint32_t tag; /* bit 0: a hit; above: trainer + 1 that last counted it */
} lent_t;

#define PF 16                        /* keys looked ahead: their map buckets are prefetched */
#define HUGE_BYTES ((size_t)2 << 20) /* maps this large or more sit on (transparent) huge pages */

/* per distinct key of the batch being decided */
enum {
  C_FETCH_ONE = 1,
  C_FETCH_ALL = 2,
  C_EVICT = 4,
  C_OWNED = 8, /* owned by one trainer: no synchronization */
  C_CRITICAL = 16,
  C_DELAYED = 32,
  C_HIT = 64,
  C_KEEP_OWNED = 128 /* takes an owner at x and stays cached: the owner marks it, the others' copies go stale */
};

struct cacher_s {
  cacher_opts_t o;
  uint32_t L;
  /* map */
  ent_t *tab;
  size_t cap, n;
  int shift;
  /* window: plans x = next_decide .. next_push - 1 */
  const plan_t **win;
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
  size_t cap_u;
  lent_t *lh;      /* per-table table of the batch's distinct keys */
  size_t cap_lh;
  size_t *cnt_fetch, *cnt_write_back, *soff, *cnt_owned;
  /* replication found while deciding x (keys of x owned by a trainer
   * that is not x's only user: handed over after x - 1) */
  uint32_t *replicate_slot, *replicate_owner;
  uint64_t *replicate_key;
  size_t n_replicate, cap_replicate;
};

static inline size_t nz(size_t n) { return n ? n : 1; }

/* ------------------------------------------------------------------ map */

static inline size_t home(const cacher_t *c, uint64_t key) {
  return (size_t)((table_mix64(key) * UINT64_C(0x9e3779b97f4a7c15)) >> c->shift);
}

/* A macro: GCC finds a function holding only a prefetch side-effect free and drops its calls. */
#define map_prefetch(c, key) __builtin_prefetch(&(c)->tab[home((c), (key))])

static int map_init(cacher_t *c, size_t cap) {
  int bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  cap = (size_t)1 << bits;
  size_t bytes = cap * sizeof(ent_t);
  ent_t *t;
  if (bytes >= HUGE_BYTES) { /* on huge pages: fewer TLB misses on random access */
    size_t rounded = (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES; /* aligned_alloc wants a multiple */
    t = aligned_alloc(HUGE_BYTES, rounded);
    if (t) madvise(t, rounded, MADV_HUGEPAGE);
  } else {
    t = malloc(bytes);
  }
  if (!t) return -ENOMEM;
  for (size_t i = 0; i < cap; i++) t[i].key = EMPTY;
  c->tab = t;
  c->cap = cap;
  c->shift = 64 - bits;
  c->n = 0;
  return 0;
}

static ent_t *map_find(const cacher_t *c, uint64_t key) {
  size_t mask = c->cap - 1;
  for (size_t i = home(c, key);; i = (i + 1) & mask) {
    ent_t *e = &c->tab[i];
    if (e->key == key) return e;
    if (e->key == EMPTY) return NULL;
  }
}

static int map_grow(cacher_t *c) {
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

/* The entry of key, created (slot NOSLOT) when absent.  The caller made
 * room (the load stays <= 1/2). */
static ent_t *map_upsert(cacher_t *c, uint64_t key) {
  size_t mask = c->cap - 1;
  for (size_t i = home(c, key);; i = (i + 1) & mask) {
    ent_t *e = &c->tab[i];
    if (e->key == key) return e;
    if (e->key == EMPTY) {
      e->key = key;
      e->last = 0;
      e->slot = NOSLOT;
      e->owner = OWNER_SHARED;
      c->n++;
      return e;
    }
  }
}

/* Backward-shift deletion: later entries of the probe run move up so that
 * every entry stays reachable from its home without tombstones. */
static void map_erase(cacher_t *c, ent_t *e) {
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

int cacher_create(const cacher_opts_t *o, cacher_t **out) {
  *out = NULL;
  if (!o || o->trainers == 0) return -EINVAL;
  cacher_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->o = *o;
  c->L = o->lookahead;
  c->next_push = c->next_decide = o->first; /* a resumed job's first batch (its cache starts empty) */
  c->win_cap = 8;
  c->win = calloc(c->win_cap, sizeof *c->win);
  c->cnt_fetch = calloc(o->trainers, sizeof *c->cnt_fetch);
  c->cnt_write_back = calloc(o->trainers, sizeof *c->cnt_write_back);
  c->soff = calloc(o->trainers, sizeof *c->soff);
  c->cnt_owned = calloc(o->trainers, sizeof *c->cnt_owned);
  /* load <= 1/2 (cacher_push); a hint too large for memory falls back to growing */
  size_t cap0 = o->expect_keys > 512 && o->expect_keys < ((uint64_t)1 << 40) ? (size_t)o->expect_keys * 2 : 1024;
  if (cap0 > 1024 && map_init(c, cap0) != 0) cap0 = 1024;
  if (!c->win || !c->cnt_fetch || !c->cnt_write_back || !c->soff || !c->cnt_owned ||
      (cap0 == 1024 && map_init(c, 1024) != 0)) {
    cacher_destroy(c);
    return -ENOMEM;
  }
  *out = c;
  return 0;
}

void cacher_destroy(cacher_t *c) {
  if (!c) return;
  free(c->tab);
  free(c->win);
  free(c->fq);
  free(c->fq_y);
  free(c->cls);
  free(c->uslot);
  free(c->lh);
  free(c->cnt_fetch);
  free(c->cnt_write_back);
  free(c->soff);
  free(c->cnt_owned);
  free(c->replicate_slot);
  free(c->replicate_owner);
  free(c->replicate_key);
  free(c);
}

size_t cacher_window(const cacher_t *c) { return (size_t)(c->next_push - c->next_decide); }
uint32_t cacher_lookahead(const cacher_t *c) { return c->L; }
size_t cacher_cached(const cacher_t *c) { return c->cached; }
uint64_t cacher_slots_peak(const cacher_t *c) { return c->fresh; }

/* Freed slots usable by a key first used at x: a prefix of the FIFO, which
 * is in the order of the batches that freed them (binary search). */
static size_t fq_usable(const cacher_t *c, uint64_t x) {
  size_t lo = 0, hi = c->fq_n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->fq_y[(c->fq_head + mid) % c->fq_cap] + c->L + 1 <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* slots holding a key or waiting to be usable by the next batch decided */
uint64_t cacher_slots_used(const cacher_t *c) { return c->fresh - fq_usable(c, c->next_decide); }

static const plan_t *win_at(const cacher_t *c, uint64_t x) { return c->win[x % c->win_cap]; }

int cacher_push(cacher_t *c, const plan_t *p) {
  if (c->failed || c->ended) return -EINVAL;
  if (!p || p->iteration != c->next_push || p->trainers != c->o.trainers || (p->n_unique && (!p->ukeys || !p->users)))
    return -EINVAL;
  if (cacher_window(c) + 1 >= WINDOW_MAX) return -EINVAL; /* the 16-bit last use */
  for (size_t i = 1; i < p->n_unique; i++) /* the merges below need the keys ascending and distinct */
    if (p->ukeys[i - 1] >= p->ukeys[i]) return -EINVAL;
  while ((c->n + p->n_unique) * 2 > c->cap) /* room for every key at once: no growth in the loop */
    if (map_grow(c) != 0) return -ENOMEM;
  if (cacher_window(c) + 1 > c->win_cap) { /* re-seat the ring at double size */
    size_t nc = c->win_cap * 2;
    const plan_t **w = calloc(nc, sizeof *w);
    if (!w) return -ENOMEM;
    for (uint64_t x = c->next_decide; x < c->next_push; x++) w[x % nc] = win_at(c, x);
    free(c->win);
    c->win = w;
    c->win_cap = nc;
  }
  for (size_t i = 0; i < p->n_unique; i++) {
    if (i + PF < p->n_unique) map_prefetch(c, p->ukeys[i + PF]);
    map_upsert(c, p->ukeys[i])->last = (uint16_t)p->iteration;
  }
  c->win[p->iteration % c->win_cap] = p;
  c->next_push++;
  return 0;
}

void cacher_end(cacher_t *c) { c->ended = 1; }

int cacher_ready(const cacher_t *c) {
  size_t w = cacher_window(c);
  return !c->failed && w > 0 && (c->ended || w >= (size_t)c->L + 1);
}

/* ------------------------------------------------------------------ slots */

static int fq_push(cacher_t *c, uint32_t slot, uint64_t y) {
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
static uint32_t slot_alloc(cacher_t *c, uint64_t x) {
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

static int grow_scratch(cacher_t *c, size_t n) {
  if (n <= c->cap_u) return 0;
  size_t nc = c->cap_u ? c->cap_u : 1024;
  while (nc < n) nc *= 2;
  uint8_t *cls = realloc(c->cls, nc);
  if (cls) c->cls = cls;
  uint32_t *us = realloc(c->uslot, nc * sizeof *us);
  if (us) c->uslot = us;
  if (!cls || !us) return -ENOMEM;
  c->cap_u = nc;
  return 0;
}

static inline size_t lh_home(uint64_t key, int shift) {
  return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> shift);
}

/* Maps every id of table tb in every share to its slot through a table of
 * the batch's distinct keys of tb (ukeys[lo..hi), small enough to stay in
 * the CPU cache; one entry holds all an id needs): indexed by row when the
 * largest row is below 4x the hash's size, else hashed.  Counts each
 * trainer's distinct keys and hits.  -EINVAL (with err) for an id that is
 * not among the keys. */
static int map_ids(cacher_t *c, const plan_t *p, cacher_dec_t *d, uint32_t tb, size_t lo, size_t hi,
                   char *err, size_t err_len) {
  if (p->partitioned && p->partitioned[tb]) { /* a table outside the cache (plan_drop_tables): its ids get no slot */
    for (uint32_t q = 0; q < p->trainers; q++) {
      size_t o = c->soff[q], m = (size_t)p->shares[q].batch.n * p->hotness[tb];
      for (size_t j = 0; j < m; j++) d->tr[q].slots[o + j] = CACHER_NO_SLOT;
      c->soff[q] = o + m;
    }
    return 0;
  }
  int bits = 1;
  while (((size_t)1 << bits) < 2 * (hi - lo)) bits++;
  size_t cap = (size_t)1 << bits, mask = cap - 1;
  int shift = 64 - bits;
  /* rows 0 .. max_row: small enough to index directly, no hashing */
  uint64_t max_row = hi > lo ? TABLE_ROW(p->ukeys[hi - 1]) : 0;
  int dense = max_row < 4 * (uint64_t)cap;
  size_t n_ent = dense ? (size_t)max_row + 1 : cap;
  if (n_ent > c->cap_lh) {
    lent_t *lh = realloc(c->lh, n_ent * sizeof *lh);
    if (!lh) return -ENOMEM;
    c->lh = lh;
    c->cap_lh = n_ent;
  }
  lent_t *lh = c->lh;
  memset(lh, 0xff, n_ent * sizeof *lh); /* every key EMPTY */
  for (size_t i = lo; i < hi; i++) {
    size_t h = dense ? (size_t)TABLE_ROW(p->ukeys[i]) : lh_home(p->ukeys[i], shift);
    while (lh[h].key != EMPTY) h = (h + 1) & mask;
    lh[h].key = p->ukeys[i];
    lh[h].slot = c->uslot[i];
    lh[h].tag = (c->cls[i] & C_HIT) != 0;
  }
  for (uint32_t q = 0; q < p->trainers; q++) {
    const data_batch_t *sh = &p->shares[q].batch;
    cacher_tr_t *t = &d->tr[q];
    size_t o = c->soff[q], m = (size_t)sh->n * p->hotness[tb], nk = 0, nh = 0;
    const uint64_t *ids = sh->ids + o;
    uint32_t *slots = t->slots + o, seen = (q + 1) << 1;
    for (size_t j = 0; j < m; j++) {
      uint64_t key = TABLE_KEY(tb, ids[j]);
      lent_t *e;
      if (dense) {
        e = &lh[TABLE_ROW(key) <= max_row ? TABLE_ROW(key) : 0];
        if (e->key != key) goto missing;
      } else {
        size_t h = lh_home(key, shift);
        while (lh[h].key != key) {
          if (lh[h].key == EMPTY) goto missing;
          h = (h + 1) & mask;
        }
        e = &lh[h];
      }
      slots[j] = e->slot;
      uint32_t tag = e->tag, fresh = (tag & ~1u) != seen; /* first id of this key in q's share */
      nk += fresh;
      nh += fresh & tag;
      e->tag = seen | (tag & 1);
      continue;
    missing:
      snprintf(err, err_len, "batch %" PRIu64 ": trainer %u's id %zu (table %u row %" PRIu64 ") is not among its keys",
               p->iteration, q, o + j, tb, ids[j]);
      return -EINVAL;
    }
    t->n_keys += nk;
    t->n_hits += nh;
    c->soff[q] = o + m;
  }
  return 0;
}

void cacher_dec_free(cacher_dec_t *d) {
  if (!d) return;
  for (uint32_t p = 0; d->tr && p < d->trainers; p++) {
    cacher_tr_t *t = &d->tr[p];
    free(t->slots);
    free(t->fetch_keys);
    free(t->fetch_slots);
    free(t->write_back_keys);
    free(t->write_back_slots);
    free(t->owned_slots);
    free(t->stale_slots);
  }
  free(d->tr);
  free(d->replicate_slots);
  free(d->replicate_owners);
  free(d->replicate_keys);
  free(d->critical);
  free(d->delayed);
  free(d->critical_keys);
  free(d->delayed_keys);
  memset(d, 0, sizeof *d);
}

static int dec_alloc(cacher_dec_t *d, const plan_t *p, const size_t *nf, const size_t *nw, size_t ncrit,
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
    cacher_tr_t *t = &d->tr[q];
    t->n_ids = data_batch_n_ids(&p->shares[q].batch);
    t->slots = malloc(nz(t->n_ids) * sizeof *t->slots);
    t->fetch_keys = malloc(nz(nf[q]) * sizeof *t->fetch_keys);
    t->fetch_slots = malloc(nz(nf[q]) * sizeof *t->fetch_slots);
    t->write_back_keys = malloc(nz(nw[q]) * sizeof *t->write_back_keys);
    t->write_back_slots = malloc(nz(nw[q]) * sizeof *t->write_back_slots);
    if (!t->slots || !t->fetch_keys || !t->fetch_slots || !t->write_back_keys || !t->write_back_slots) return -ENOMEM;
  }
  return 0;
}

/* Lists e for replication before the batch being decided (after the one
 * before it); e is SHARED from then on.  0 or -ENOMEM. */
static int add_replicate(cacher_t *c, ent_t *e) {
  if (c->n_replicate == c->cap_replicate) {
    size_t nc = c->cap_replicate ? c->cap_replicate * 2 : 1024;
    uint32_t *rs = realloc(c->replicate_slot, nc * sizeof *rs);
    if (rs) c->replicate_slot = rs;
    uint32_t *ro = realloc(c->replicate_owner, nc * sizeof *ro);
    if (ro) c->replicate_owner = ro;
    uint64_t *rk = realloc(c->replicate_key, nc * sizeof *rk);
    if (rk) c->replicate_key = rk;
    if (!rs || !ro || !rk) return -ENOMEM;
    c->cap_replicate = nc;
  }
  c->replicate_slot[c->n_replicate] = e->slot;
  c->replicate_owner[c->n_replicate] = OWNER(e);
  c->replicate_key[c->n_replicate++] = e->key;
  e->owner = OWNER_SHARED;
  return 0;
}

/* Pass 1's counts (decide). */
typedef struct pass1_s {
  size_t ncrit, ndel, n_new, n_evict, n_trans, n_fetch_all;
} pass1_t;

/* Pass 1 of deciding batch x (plan p): classifies each of its keys into
 * c->cls, allocates the new ones a slot (c->uslot), lists the rows to
 * replicate, evicts what x uses last, and counts per trainer what pass 2
 * lists (c->cnt_*) and in all (r).  0, or the error with err set. */
static int classify(cacher_t *c, uint64_t x, const plan_t *p, pass1_t *r, char *err, size_t err_len) {
  uint32_t P = c->o.trainers;
  size_t U = p->n_unique;
  int rc;
  /* which keys batch x + 1 uses (the critical ones among x's shared keys):
   * both key lists are ascending, so a merge tells */
  int have_next = x + 1 < c->next_push;
  int split = c->o.delayed && c->L >= 1 && have_next;
  const plan_t *n1 = have_next ? win_at(c, x + 1) : NULL;
  const uint64_t *nk = have_next ? n1->ukeys : NULL;
  size_t nn = have_next ? n1->n_unique : 0, j1 = 0;
  c->n_replicate = 0; /* the rows x needs replicated after x - 1 (found below) */

  memset(r, 0, sizeof *r);
  memset(c->cnt_owned, 0, P * sizeof *c->cnt_owned);
  memset(c->cnt_fetch, 0, P * sizeof *c->cnt_fetch);
  memset(c->cnt_write_back, 0, P * sizeof *c->cnt_write_back);
  for (size_t i = 0; i < U; i++) {
    uint64_t k = p->ukeys[i];
    uint32_t user = p->users[i];
    if (i + PF < U) map_prefetch(c, p->ukeys[i + PF]);
    ent_t *e = map_find(c, k);
    if (!e) { /* pushed keys are always there: a bug, not bad input */
      snprintf(err, err_len, "batch %" PRIu64 ": key %#" PRIx64 " is not in the window", x, k);
      return -EINVAL;
    }
    uint8_t f = 0;
    /* with L = 0 every key leaves after its batch, whatever later batch
     * already entered the window; its next use is then >= x + L + 1, as
     * consistency needs */
    int evict = e->last == (uint16_t)x || c->L == 0;
    /* LRPP: a row one trainer uses is owned by it (fetched, updated and
     * written back by it alone, never synchronized) -- while it stays
     * cached too, until another trainer needs it (replication below) */
    int owned = c->o.lrpp && user != SHARED;
    if (e->slot != NOSLOT) {
      f |= C_HIT;
      /* owned by one trainer, used at x by another or by several: its
       * owner's copy goes to every trainer after x - 1 (replicate_*) */
      if (OWNER(e) != SHARED && OWNER(e) != user && (rc = add_replicate(c, e)) != 0) return rc;
      if (owned && OWNER(e) == SHARED) { /* every copy is current: one trainer takes it over */
        SET_OWNER(e, user);
        if (!evict) {
          f |= C_KEEP_OWNED;
          c->cnt_owned[user]++;
          r->n_trans++;
        }
      }
    } else {
      uint32_t s = slot_alloc(c, x);
      if (s == NOSLOT) {
        snprintf(err, err_len,
                 "cache_rows = %" PRIu64 " is too small: batch %" PRIu64 " needs more slots even at lookahead 0 "
                 "(%zu distinct rows in the batch, %zu cached across it); raise cache_rows",
                 c->o.cache_rows, x, U, c->cached + r->n_evict);
        return ERR_CONFIG;
      }
      e->slot = s;
      SET_OWNER(e, owned ? user : SHARED);
      if (owned && !evict) {
        f |= C_KEEP_OWNED;
        c->cnt_owned[user]++;
      }
      c->cached++;
      r->n_new++;
      f |= owned ? C_FETCH_ONE : C_FETCH_ALL;
      if (owned) c->cnt_fetch[user]++;
      else r->n_fetch_all++;
    }
    int next = 0;
    if (have_next) {
      while (j1 < nn && nk[j1] < k) j1++;
      next = j1 < nn && nk[j1] == k;
    }
    if (owned) {
      f |= C_OWNED;
    } else if (split && !next) {
      f |= C_DELAYED;
      r->ndel++;
    } else {
      f |= C_CRITICAL;
      r->ncrit++;
    }
    c->uslot[i] = e->slot;
    if (evict) { /* its slot waits L batches in the FIFO; the entry leaves the map (nothing below reads it) */
      f |= C_EVICT;
      r->n_evict++;
      uint32_t owner = owned ? user : (uint32_t)(table_mix64(k) % P);
      c->cnt_write_back[owner]++;
      if ((rc = fq_push(c, e->slot, x)) != 0) return rc;
      if (e->last == (uint16_t)x) {
        map_erase(c, e);
      } else { /* a batch in the window uses it later (L = 0): it stays, uncached */
        e->slot = NOSLOT;
        e->owner = OWNER_SHARED;
      }
      c->cached--;
    }
    c->cls[i] = f;
  }
  if (split && c->L == 0) { /* L fell to 0 while allocating: every shared key is critical (cacher.h) */
    for (size_t i = 0; i < U; i++)
      if (c->cls[i] & C_DELAYED) c->cls[i] = (uint8_t)((c->cls[i] & ~C_DELAYED) | C_CRITICAL);
    r->ncrit += r->ndel;
    r->ndel = 0;
  }
  return 0;
}

/* d's lists allocated to pass 1's counts, the replication lists copied and
 * the batch's totals.  0 or -ENOMEM (the caller frees d). */
static int dec_prepare(cacher_t *c, cacher_dec_t *d, uint64_t x, const plan_t *p, const pass1_t *r) {
  uint32_t P = c->o.trainers;
  int rc;
  memset(d, 0, sizeof *d);
  for (uint32_t q = 0; q < P; q++) c->cnt_fetch[q] += r->n_fetch_all;
  if ((rc = dec_alloc(d, p, c->cnt_fetch, c->cnt_write_back, r->ncrit, r->ndel)) != 0) return rc;
  for (uint32_t q = 0; q < P; q++) {
    cacher_tr_t *t = &d->tr[q];
    t->owned_slots = malloc(nz(c->cnt_owned[q]) * sizeof *t->owned_slots);
    t->stale_slots = malloc(nz(r->n_trans) * sizeof *t->stale_slots);
    if (!t->owned_slots || !t->stale_slots) return -ENOMEM;
  }
  d->replicate_slots = malloc(nz(c->n_replicate) * sizeof *d->replicate_slots);
  d->replicate_owners = malloc(nz(c->n_replicate) * sizeof *d->replicate_owners);
  d->replicate_keys = malloc(nz(c->n_replicate) * sizeof *d->replicate_keys);
  if (!d->replicate_slots || !d->replicate_owners || !d->replicate_keys) return -ENOMEM;
  if (c->n_replicate) { /* (the lists may still be NULL: memcpy wants a valid source even for 0 bytes) */
    memcpy(d->replicate_slots, c->replicate_slot, c->n_replicate * sizeof *d->replicate_slots);
    memcpy(d->replicate_owners, c->replicate_owner, c->n_replicate * sizeof *d->replicate_owners);
    memcpy(d->replicate_keys, c->replicate_key, c->n_replicate * sizeof *d->replicate_keys);
  }
  d->n_replicate = c->n_replicate;
  d->iteration = x;
  d->n_unique = p->n_unique;
  d->n_new = r->n_new;
  d->n_evicted = r->n_evict;
  return 0;
}

/* Pass 2: each trainer's fetch, owned, stale and write-back lists and the
 * critical and delayed lists, in ascending key order. */
static void dec_lists(cacher_t *c, cacher_dec_t *d, const plan_t *p) {
  uint32_t P = c->o.trainers;
  size_t U = p->n_unique;
  for (size_t i = 0; i < U; i++) {
    uint64_t k = p->ukeys[i];
    uint32_t s = c->uslot[i], user = p->users[i];
    uint8_t f = c->cls[i];
    if (f & C_FETCH_ALL) {
      for (uint32_t q = 0; q < P; q++) {
        cacher_tr_t *t = &d->tr[q];
        t->fetch_keys[t->n_fetch] = k;
        t->fetch_slots[t->n_fetch++] = s;
      }
    } else if (f & C_FETCH_ONE) {
      cacher_tr_t *t = &d->tr[user];
      t->fetch_keys[t->n_fetch] = k;
      t->fetch_slots[t->n_fetch++] = s;
    }
    if (f & C_OWNED) d->tr[user].n_owned++;
    if (f & C_KEEP_OWNED) {
      cacher_tr_t *t = &d->tr[user];
      t->owned_slots[t->n_owned_slots++] = s;
      if (f & C_HIT) /* taken over from every trainer: their copies go stale */
        for (uint32_t q = 0; q < P; q++)
          if (q != user) d->tr[q].stale_slots[d->tr[q].n_stale++] = s;
    }
    if (f & C_CRITICAL) {
      d->critical_keys[d->n_critical] = k;
      d->critical[d->n_critical++] = s;
    } else if (f & C_DELAYED) {
      d->delayed_keys[d->n_delayed] = k;
      d->delayed[d->n_delayed++] = s;
    }
    if (f & C_EVICT) {
      cacher_tr_t *t = &d->tr[(f & C_OWNED) ? user : (uint32_t)(table_mix64(k) % P)];
      t->write_back_keys[t->n_write_back] = k;
      t->write_back_slots[t->n_write_back++] = s;
    }
  }
}

/* Each id of d's batch -> its slot, and each trainer's distinct keys and
 * hits (map_ids).  0, or -EINVAL with err set. */
static int dec_map_ids(cacher_t *c, cacher_dec_t *d, const plan_t *p, char *err, size_t err_len) {
  uint32_t P = c->o.trainers;
  size_t U = p->n_unique;
  int rc;
  /* each id -> its slot; each trainer's distinct keys and hits; table
   * by table (a table's keys are a run of ukeys, its ids a run of each
   * share's) */
  memset(c->soff, 0, P * sizeof *c->soff);
  size_t lo = 0;
  for (uint32_t tb = 0; tb < p->n_tables; tb++) {
    size_t hi = lo;
    while (hi < U && TABLE_ID(p->ukeys[hi]) == tb) hi++;
    if ((rc = map_ids(c, p, d, tb, lo, hi, err, err_len)) != 0) return rc;
    lo = hi;
  }
  return 0;
}

/* d == NULL: decisions only (cacher_need). */
static int decide(cacher_t *c, cacher_dec_t *d, char *err, size_t err_len) {
  if (c->failed) return -EINVAL;
  if (!cacher_ready(c)) return -EAGAIN;
  uint64_t x = c->next_decide;
  const plan_t *p = win_at(c, x);
  pass1_t r;
  int rc;
  if ((rc = grow_scratch(c, p->n_unique + 1)) != 0) goto fail;
  if ((rc = classify(c, x, p, &r, err, err_len)) != 0) goto fail;
  if (d) {
    if ((rc = dec_prepare(c, d, x, p, &r)) != 0) goto fail_dec;
    dec_lists(c, d, p);
    if ((rc = dec_map_ids(c, d, p, err, err_len)) != 0) goto fail_dec;
  }

  c->win[x % c->win_cap] = NULL;
  c->next_decide++;
  if (d) {
    d->lookahead = c->L;
    d->gate = x > c->L ? x - c->L : 0;
    d->slots_used = cacher_slots_used(c); /* held or waiting, after x (not the peak, c->fresh) */
  }
  return 0;

fail_dec:
  if (d) cacher_dec_free(d);
fail:
  c->failed = 1;
  if (rc == -ENOMEM && err_len) snprintf(err, err_len, "out of memory deciding batch %" PRIu64, x);
  return rc;
}

int cacher_decide(cacher_t *c, cacher_dec_t *d, char *err, size_t err_len) {
  if (err_len) err[0] = 0;
  return decide(c, d, err, err_len);
}

/* ------------------------------------------------------------------ flush */

typedef struct fent_s {
  uint64_t key;
  uint32_t slot, q; /* q: the trainer that writes it back */
} fent_t;

static int fent_cmp(const void *a, const void *b) {
  uint64_t x = ((const fent_t *)a)->key, y = ((const fent_t *)b)->key;
  return (x > y) - (x < y);
}

void cacher_flush_free(cacher_flush_t *fl, uint32_t P) {
  if (!fl) return;
  for (uint32_t q = 0; q < P; q++) {
    free(fl[q].keys);
    free(fl[q].slots);
    memset(&fl[q], 0, sizeof fl[q]);
  }
}

int cacher_flush(const cacher_t *c, cacher_flush_t *fl) {
  uint32_t P = c->o.trainers;
  memset(fl, 0, P * sizeof *fl);
  if (c->failed) return -EINVAL;
  /* the map holds every row cached after the last decision (a slot) and
   * the window's rows not cached yet (NOSLOT: on the servers already);
   * its owner field is already the one after that decision */
  fent_t *all = malloc(nz(c->cached) * sizeof *all);
  if (!all) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < c->cap; i++) {
    const ent_t *e = &c->tab[i];
    if (e->key == EMPTY || e->slot == NOSLOT) continue;
    ASSERT_OP(n, <, c->cached);
    uint32_t q = OWNER(e) == SHARED ? (uint32_t)(table_mix64(e->key) % P) : OWNER(e);
    ASSERT_OP(q, <, P);
    all[n++] = (fent_t){.key = e->key, .slot = e->slot, .q = q};
  }
  ASSERT_OP(n, ==, c->cached);
  qsort(all, n, sizeof *all, fent_cmp);
  for (size_t i = 0; i < n; i++) fl[all[i].q].n++;
  int rc = 0;
  for (uint32_t q = 0; q < P; q++) {
    fl[q].keys = malloc(nz(fl[q].n) * sizeof *fl[q].keys);
    fl[q].slots = malloc(nz(fl[q].n) * sizeof *fl[q].slots);
    if (!fl[q].keys || !fl[q].slots) rc = -ENOMEM;
    fl[q].n = 0;
  }
  if (rc) {
    cacher_flush_free(fl, P);
    goto out;
  }
  for (size_t i = 0; i < n; i++) { /* in key order: each list ascending */
    cacher_flush_t *f = &fl[all[i].q];
    f->keys[f->n] = all[i].key;
    f->slots[f->n++] = all[i].slot;
  }
out:
  free(all);
  return rc;
}

/* ------------------------------------------------------------------ need, auto */

int cacher_need(const plan_t *plans, size_t n, uint32_t P, uint32_t L, int lrpp, uint64_t *need) {
  cacher_opts_t o = {
      .trainers = P, .lookahead = L, .cache_rows = 0, .lrpp = lrpp, .delayed = 0, .first = n ? plans[0].iteration : 0};
  cacher_t *c;
  int rc = cacher_create(&o, &c);
  if (rc) return rc;
  char err[256];
  for (size_t i = 0; i < n && !rc; i++) {
    if ((rc = cacher_push(c, &plans[i])) != 0) break;
    if (i + 1 == n) cacher_end(c);
    while (!rc && cacher_ready(c)) rc = decide(c, NULL, err, sizeof err);
  }
  *need = c->fresh;
  cacher_destroy(c);
  return rc;
}
