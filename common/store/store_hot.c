/* embedding_hot: see store_hot.h. */
#include "store_hot.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

#define HOT_VERSIONS 1024   /* version slots per stripe (64 Ki in all) */
#define HOT_MIN_BUCKETS 16

typedef struct hot_entry_s {
  struct hot_entry_s *hnext;        /* hash chain */
  struct hot_entry_s *prev, *next;  /* CLOCK ring */
  uint64_t key;
  uint32_t nfloats;
  uint8_t ref;                      /* CLOCK reference bit */
  float row[];
} hot_entry_t;

/* Charged per entry beyond key+row: the links, the malloc header and up to
 * two bucket slots (the table doubles when entries outnumber buckets). */
#define STORE_HOT_ENTRY_OVERHEAD (sizeof(hot_entry_t) - sizeof(uint64_t) + 16 + 2 * sizeof(void *))

typedef struct hot_stripe_s {
  _Alignas(64) pthread_mutex_t mu;
  hot_entry_t **buckets;
  size_t nbuckets, count;
  hot_entry_t *hand;    /* CLOCK hand; NULL when empty */
  size_t bytes, cap;
  uint64_t evictions;
  uint32_t ver[HOT_VERSIONS];
} hot_stripe_t;

struct store_hot_s {
  hot_stripe_t *stripes;
  size_t capacity;
};

size_t store_hot_entry_bytes(uint32_t nfloats) {
  return sizeof(uint64_t) + (size_t)nfloats * sizeof(float) + STORE_HOT_ENTRY_OVERHEAD;
}

static inline uint64_t key_hash(uint64_t key) { return table_mix64(key ^ UINT64_C(0x686f74)); }
static inline hot_stripe_t *stripe_of(store_hot_t *h, uint64_t hash) {
  return &h->stripes[hash % STORE_HOT_STRIPES];
}
static inline uint32_t *ver_of(hot_stripe_t *st, uint64_t hash) {
  return &st->ver[(hash >> 6) % HOT_VERSIONS];
}
static inline size_t bucket_of(const hot_stripe_t *st, uint64_t hash) {
  return (size_t)(hash >> 16) & (st->nbuckets - 1);
}

int store_hot_create(size_t capacity_bytes, store_hot_t **out) {
  *out = NULL;
  store_hot_t *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->stripes = aligned_alloc(64, STORE_HOT_STRIPES * sizeof *h->stripes);
  if (!h->stripes) {
    free(h);
    return -ENOMEM;
  }
  memset(h->stripes, 0, STORE_HOT_STRIPES * sizeof *h->stripes);
  h->capacity = capacity_bytes;
  for (int i = 0; i < STORE_HOT_STRIPES; i++) {
    hot_stripe_t *st = &h->stripes[i];
    pthread_mutex_init(&st->mu, NULL);
    st->cap = capacity_bytes / STORE_HOT_STRIPES;
    st->nbuckets = HOT_MIN_BUCKETS;
    st->buckets = calloc(st->nbuckets, sizeof *st->buckets);
    if (!st->buckets) {
      for (int j = 0; j <= i; j++) {
        free(h->stripes[j].buckets);
        pthread_mutex_destroy(&h->stripes[j].mu);
      }
      free(h->stripes);
      free(h);
      return -ENOMEM;
    }
  }
  *out = h;
  return 0;
}

static void stripe_free_entries(hot_stripe_t *st) {
  for (size_t b = 0; b < st->nbuckets; b++) {
    hot_entry_t *e = st->buckets[b];
    while (e) {
      hot_entry_t *nx = e->hnext;
      free(e);
      e = nx;
    }
    st->buckets[b] = NULL;
  }
  st->count = 0;
  st->bytes = 0;
  st->hand = NULL;
}

void store_hot_destroy(store_hot_t *h) {
  if (!h) return;
  for (int i = 0; i < STORE_HOT_STRIPES; i++) {
    stripe_free_entries(&h->stripes[i]);
    free(h->stripes[i].buckets);
    pthread_mutex_destroy(&h->stripes[i].mu);
  }
  free(h->stripes);
  free(h);
}

/* ---- stripe internals; the caller holds st->mu */

static hot_entry_t *find(hot_stripe_t *st, uint64_t hash, uint64_t key) {
  for (hot_entry_t *e = st->buckets[bucket_of(st, hash)]; e; e = e->hnext)
    if (e->key == key) return e;
  return NULL;
}

static void unlink_entry(hot_stripe_t *st, hot_entry_t *e) {
  hot_entry_t **pp = &st->buckets[bucket_of(st, key_hash(e->key))];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  if (e->next == e) {
    st->hand = NULL;
  } else {
    e->prev->next = e->next;
    e->next->prev = e->prev;
    if (st->hand == e) st->hand = e->next;
  }
  st->count--;
  st->bytes -= store_hot_entry_bytes(e->nfloats);
  free(e);
}

/* CLOCK: evict until `need` more bytes fit.  Each pass over a referenced
 * entry clears its bit, so this ends within two turns of the ring. */
static void make_room(hot_stripe_t *st, size_t need) {
  while (st->hand && st->bytes + need > st->cap) {
    hot_entry_t *e = st->hand;
    if (e->ref) {
      e->ref = 0;
      st->hand = e->next;
    } else {
      unlink_entry(st, e);
      st->evictions++;
    }
  }
}

static void grow(hot_stripe_t *st) {
  size_t nb = st->nbuckets * 2;
  hot_entry_t **b = calloc(nb, sizeof *b);
  if (!b) return; /* longer chains, still correct */
  for (size_t i = 0; i < st->nbuckets; i++) {
    hot_entry_t *e = st->buckets[i];
    while (e) {
      hot_entry_t *nx = e->hnext;
      size_t j = (size_t)(key_hash(e->key) >> 16) & (nb - 1);
      e->hnext = b[j];
      b[j] = e;
      e = nx;
    }
  }
  free(st->buckets);
  st->buckets = b;
  st->nbuckets = nb;
}

/* Inserts a new entry (key absent) just behind the hand, so it is the last
 * the hand examines; its bit starts clear, so a row read once and never
 * again goes before rows that were hit (scan resistance). */
static void insert_new(hot_stripe_t *st, uint64_t hash, uint64_t key, const float *row,
                       uint32_t nfloats) {
  size_t eb = store_hot_entry_bytes(nfloats);
  if (eb > st->cap) return;
  make_room(st, eb);
  hot_entry_t *e = malloc(sizeof *e + (size_t)nfloats * sizeof(float));
  if (!e) return; /* a cache: dropping an insert is always correct */
  e->key = key;
  e->nfloats = nfloats;
  e->ref = 0;
  memcpy(e->row, row, (size_t)nfloats * sizeof(float));
  if (st->count >= st->nbuckets) grow(st);
  size_t b = bucket_of(st, hash);
  e->hnext = st->buckets[b];
  st->buckets[b] = e;
  if (!st->hand) {
    e->prev = e->next = e;
    st->hand = e;
  } else {
    e->next = st->hand;
    e->prev = st->hand->prev;
    e->prev->next = e;
    st->hand->prev = e;
  }
  st->count++;
  st->bytes += eb;
}

/* ---- public */

int store_hot_get(store_hot_t *h, uint64_t key, float *out, uint32_t nfloats, uint32_t *version) {
  uint64_t hash = key_hash(key);
  hot_stripe_t *st = stripe_of(h, hash);
  int hit = 0;
  pthread_mutex_lock(&st->mu);
  hot_entry_t *e = find(st, hash, key);
  if (e && e->nfloats == nfloats) {
    memcpy(out, e->row, (size_t)nfloats * sizeof(float));
    e->ref = 1;
    hit = 1;
  } else {
    *version = *ver_of(st, hash);
  }
  pthread_mutex_unlock(&st->mu);
  return hit;
}

size_t store_hot_get_many(store_hot_t *h, const uint64_t *keys, size_t n, float *out, const size_t *off,
                        const uint32_t *nfloats, uint8_t *hit, uint32_t *version) {
  enum { AHEAD = 8 };
  uint64_t *hash = malloc((n ? n : 1) * sizeof *hash);
  uint32_t *order = malloc((n ? n : 1) * sizeof *order);
  size_t start[STORE_HOT_STRIPES + 1] = {0}, hits = 0;
  if (!hash || !order) { /* no memory for the batch: one key at a time */
    free(hash);
    free(order);
    for (size_t i = 0; i < n; i++) {
      hit[i] = (uint8_t)store_hot_get(h, keys[i], out + off[i], nfloats[i], &version[i]);
      hits += hit[i];
    }
    return hits;
  }
  /* counting sort of the request by stripe */
  for (size_t i = 0; i < n; i++) {
    hash[i] = key_hash(keys[i]);
    start[hash[i] % STORE_HOT_STRIPES + 1]++;
  }
  for (int s = 0; s < STORE_HOT_STRIPES; s++) start[s + 1] += start[s];
  size_t fill[STORE_HOT_STRIPES];
  memcpy(fill, start, sizeof fill);
  for (size_t i = 0; i < n; i++) order[fill[hash[i] % STORE_HOT_STRIPES]++] = (uint32_t)i;
  for (int s = 0; s < STORE_HOT_STRIPES; s++) {
    size_t a = start[s], b = start[s + 1];
    if (a == b) continue;
    hot_stripe_t *st = &h->stripes[s];
    pthread_mutex_lock(&st->mu);
    /* two-stage prefetch: the bucket slot AHEAD keys ahead, then the chain
     * head it points to AHEAD/2 keys ahead */
    for (size_t j = a; j < b && j < a + AHEAD; j++) __builtin_prefetch(&st->buckets[bucket_of(st, hash[order[j]])]);
    for (size_t j = a; j < b; j++) {
      if (j + AHEAD < b) __builtin_prefetch(&st->buckets[bucket_of(st, hash[order[j + AHEAD]])]);
      if (j + AHEAD / 2 < b) __builtin_prefetch(st->buckets[bucket_of(st, hash[order[j + AHEAD / 2]])]);
      size_t i = order[j];
      hot_entry_t *e = find(st, hash[i], keys[i]);
      if (e && e->nfloats == nfloats[i]) {
        memcpy(out + off[i], e->row, (size_t)nfloats[i] * sizeof(float));
        e->ref = 1;
        hit[i] = 1;
        hits++;
      } else {
        hit[i] = 0;
        version[i] = *ver_of(st, hash[i]);
      }
    }
    pthread_mutex_unlock(&st->mu);
  }
  free(hash);
  free(order);
  return hits;
}

void store_hot_fill(store_hot_t *h, uint64_t key, const float *row, uint32_t nfloats,
                  uint32_t version) {
  uint64_t hash = key_hash(key);
  hot_stripe_t *st = stripe_of(h, hash);
  pthread_mutex_lock(&st->mu);
  if (*ver_of(st, hash) == version && !find(st, hash, key))
    insert_new(st, hash, key, row, nfloats);
  pthread_mutex_unlock(&st->mu);
}

void store_hot_upsert(store_hot_t *h, uint64_t key, const float *row, uint32_t nfloats) {
  uint64_t hash = key_hash(key);
  hot_stripe_t *st = stripe_of(h, hash);
  pthread_mutex_lock(&st->mu);
  (*ver_of(st, hash))++;
  hot_entry_t *e = find(st, hash, key);
  if (e && e->nfloats == nfloats) {
    memcpy(e->row, row, (size_t)nfloats * sizeof(float));
    e->ref = 1; /* just written: the trainer that evicted it may want it back */
  } else {
    if (e) unlink_entry(st, e);
    insert_new(st, hash, key, row, nfloats);
  }
  pthread_mutex_unlock(&st->mu);
}

void store_hot_drop(store_hot_t *h, uint64_t key) {
  uint64_t hash = key_hash(key);
  hot_stripe_t *st = stripe_of(h, hash);
  pthread_mutex_lock(&st->mu);
  (*ver_of(st, hash))++;
  hot_entry_t *e = find(st, hash, key);
  if (e) unlink_entry(st, e);
  pthread_mutex_unlock(&st->mu);
}

void store_hot_clear(store_hot_t *h) {
  for (int i = 0; i < STORE_HOT_STRIPES; i++) {
    hot_stripe_t *st = &h->stripes[i];
    pthread_mutex_lock(&st->mu);
    stripe_free_entries(st);
    for (int v = 0; v < HOT_VERSIONS; v++) st->ver[v]++;
    pthread_mutex_unlock(&st->mu);
  }
}

void store_hot_stats(store_hot_t *h, store_hot_stats_t *out) {
  memset(out, 0, sizeof *out);
  out->capacity_bytes = h->capacity;
  for (int i = 0; i < STORE_HOT_STRIPES; i++) {
    hot_stripe_t *st = &h->stripes[i];
    pthread_mutex_lock(&st->mu);
    out->rows += st->count;
    out->bytes += st->bytes;
    out->evictions += st->evictions;
    pthread_mutex_unlock(&st->mu);
  }
}
