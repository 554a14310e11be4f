/*
 * embedding_hot: the embedding server's memory tier.
 *
 * A bounded in-memory cache key -> row in front of RocksDB (see
 * store.h).  It is a hash table split into STORE_HOT_STRIPES stripes,
 * each with its own mutex, chained buckets, CLOCK ring and a byte budget of
 * capacity / STORE_HOT_STRIPES, so worker threads touching different stripes
 * never wait for each other.  Every entry is charged its key, its row and
 * STORE_HOT_ENTRY_OVERHEAD bytes (links, malloc header, bucket slots), so the
 * tier never holds more than its capacity.  Eviction is CLOCK (second
 * chance): a hit sets the entry's reference bit; the hand clears set bits and
 * evicts the first entry whose bit is clear.
 *
 * The tier caches the logical value of a row; RocksDB is the truth.  To keep
 * a slow reader from re-inserting a value older than a concurrent write, each
 * stripe keeps version counters (hashed by key) that every upsert or drop
 * bumps: a miss returns the version it saw, and store_hot_fill() inserts only if
 * that version is unchanged and the key is still absent.
 *
 * Every function is thread-safe.
 */
#ifndef CHANTER_STORE_HOT_H
#define CHANTER_STORE_HOT_H

#include <stddef.h>
#include <stdint.h>

#define STORE_HOT_STRIPES 64

typedef struct store_hot_s store_hot_t;

typedef struct store_hot_stats_s {
  uint64_t rows, bytes, capacity_bytes, evictions;
} store_hot_stats_t;

/* The bytes one cached row of nfloats floats is charged. */
size_t store_hot_entry_bytes(uint32_t nfloats);

/* A tier of capacity_bytes (> 0).  *out is the caller's; 0 or -ENOMEM. */
int store_hot_create(size_t capacity_bytes, store_hot_t **out);
void store_hot_destroy(store_hot_t *h);

/* On a hit copies the row (nfloats floats) to out, marks it referenced and
 * returns 1.  On a miss returns 0 and sets *version to the token
 * store_hot_fill() needs. */
int store_hot_get(store_hot_t *h, uint64_t key, float *out, uint32_t nfloats, uint32_t *version);

/* Batched store_hot_get() for a whole request: for each i < n, on a hit
 * copies the row of keys[i] (nfloats[i] floats) to out + off[i] and sets
 * hit[i] = 1; on a miss sets hit[i] = 0 and version[i].  Takes each stripe's
 * lock once and prefetches the hash chains ahead, which is what makes the
 * tier memory-latency-bound rather than lock-bound.  Returns the hits. */
size_t store_hot_get_many(store_hot_t *h, const uint64_t *keys, size_t n, float *out, const size_t *off,
                        const uint32_t *nfloats, uint8_t *hit, uint32_t *version);

/* Insert-if-absent for a value read from RocksDB or lazily initialized after
 * a miss that returned `version`: does nothing if the key was upserted or
 * dropped since (the value may be stale) or is already present. */
void store_hot_fill(store_hot_t *h, uint64_t key, const float *row, uint32_t nfloats, uint32_t version);

/* Insert-or-replace after a successful write (evicting as needed).  A row
 * larger than a stripe's budget is not cached (any old copy is dropped). */
void store_hot_upsert(store_hot_t *h, uint64_t key, const float *row, uint32_t nfloats);

/* Removes the key if cached (and invalidates in-flight fills of it). */
void store_hot_drop(store_hot_t *h, uint64_t key);

/* Removes everything (and invalidates every in-flight fill). */
void store_hot_clear(store_hot_t *h);

void store_hot_stats(store_hot_t *h, store_hot_stats_t *st);

#endif
