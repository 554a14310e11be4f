/*
 * trainer_kmap: which key each cache slot of a trainer holds, and the slot
 * of a key -- the trainer's own view of its cache (the oracle sends slots,
 * not keys, for training).  Used to evaluate with the cached rows (they are
 * newer than the embedding servers' copies) and, later, to hand the cache
 * contents to a restarted oracle.
 *
 * An array slot -> key (with a per-slot free flag) plus a hash map key ->
 * slot (common/u64map.h: linear probing, backward-shift deletion).  Insert
 * when a fetched row lands in its slot, erase when the oracle evicts the
 * slot.  One thread.
 */
#ifndef CHANTER_TRAINER_KMAP_H
#define CHANTER_TRAINER_KMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct trainer_kmap_s trainer_kmap_t;

/* 0, -ENOMEM. */
int trainer_kmap_create(uint64_t slots, trainer_kmap_t **out);
void trainer_kmap_destroy(trainer_kmap_t *m);
/* slot now holds key (replacing whatever it held).  0 or -ENOMEM. */
int trainer_kmap_set(trainer_kmap_t *m, uint32_t slot, uint64_t key);
/* slot holds nothing (no-op if it held nothing). */
void trainer_kmap_clear(trainer_kmap_t *m, uint32_t slot);
/* The row at slot is owned by this trainer (LRPP: only its copy is
 * current) or no longer (0).  No-op for an empty slot. */
void trainer_kmap_set_owned(trainer_kmap_t *m, uint32_t slot, int owned);
/* Up to cap (slot, key) pairs of the owned rows, in slot order; returns how
 * many there are (call with cap 0 to count). */
size_t trainer_kmap_owned(const trainer_kmap_t *m, uint32_t *slots, uint64_t *keys, size_t cap);
/* The slot holding key, or -1. */
int64_t trainer_kmap_find(const trainer_kmap_t *m, uint64_t key);
size_t trainer_kmap_count(const trainer_kmap_t *m);

#endif
