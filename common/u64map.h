/*
 * u64map: a hash map from a uint64 key to a uint32 value -- the one the
 * trainer's cache view (key -> slot) and its ideal-mode row store (key ->
 * row index) share, so that the probing and the deletion live in one place
 * and are tested once (tests/unit/test_u64map.c).
 *
 * Open addressing with linear probing in a power-of-two table, grown (x2,
 * rehashed) to keep the load factor at most 1/2; erase shifts the rest of
 * the probe run back over the hole (backward-shift deletion), so there are
 * no tombstones and lookups never slow down with churn.  A key's home entry
 * is the top log2(cap) bits of table_mix64(key) (u64map_home).  Each entry
 * carries its own "full" flag (in what would be padding), so no key value
 * is reserved: every uint64 key and every uint32 value is valid.  Not
 * thread-safe; one owner at a time.
 */
#ifndef CHANTER_U64MAP_H
#define CHANTER_U64MAP_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef struct u64map_ent_s {
  uint64_t key;
  uint32_t val;
  uint32_t full; /* 1 when the entry holds a key */
} u64map_ent_t;

typedef struct u64map_s {
  u64map_ent_t *tab; /* cap entries */
  size_t cap;        /* a power of two, >= 16 */
  size_t n;          /* keys held */
  int shift;         /* 64 - log2(cap) */
} u64map_t;

/* An empty map with room for at least `keys` keys before it first grows.
 * 0 or -ENOMEM (m is then zeroed: u64map_close is still safe). */
int u64map_init(u64map_t *m, size_t keys);
/* Frees the table; safe on a zeroed map. */
void u64map_close(u64map_t *m);

static inline size_t u64map_count(const u64map_t *m) { return m->n; }

/* The entry where key's probe run starts. */
static inline size_t u64map_home(const u64map_t *m, uint64_t key) {
  return (size_t)(table_mix64(key) >> m->shift);
}

/* 1 if key is present (its value in *val, when val is given), else 0. */
int u64map_find(const u64map_t *m, uint64_t key, uint32_t *val);

/* Insert-or-find.  1: key was absent and now maps to val; 0: key was
 * present and keeps its value; -ENOMEM: absent and the table could not
 * grow (the map is unchanged).  On 0 or 1, *at (when at is given) points at
 * key's stored value, which the caller may overwrite; the pointer is valid
 * until the next u64map_insert or u64map_erase. */
int u64map_insert(u64map_t *m, uint64_t key, uint32_t val, uint32_t **at);

/* 1 if key was present and is now gone (its value in *val, when val is
 * given), else 0.  Never fails, never shrinks the table. */
int u64map_erase(u64map_t *m, uint64_t key, uint32_t *val);

#endif
