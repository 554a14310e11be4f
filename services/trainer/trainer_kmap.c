/*
 * trainer_kmap: the trainer's own view of its cache, slot -> key and key
 * -> slot, with an owned bit per slot (see trainer_kmap.h).  The training
 * thread keeps it: trainer_exec.c as rows are fetched, owned, replicated
 * or go stale, trainer_pipeline.c's background wait as they are evicted;
 * trainer_eval.c reads it.
 */
#include "trainer_kmap.h"

#include <errno.h>
#include <stdlib.h>

#include "u64map.h"

/* Per-slot state bits (a flag, not a reserved key, marks a free slot, so
 * every uint64 key is valid). */
#define FULL 1  /* the slot holds slot_key[slot] */
#define OWNED 2 /* ... and this trainer owns that row */

/* Invariant: state[s] & FULL  <=>  map holds slot_key[s] -> s. */
struct trainer_kmap_s {
  uint64_t *slot_key; /* slots */
  uint8_t *state;     /* slots: FULL | OWNED */
  uint64_t n_slots;
  size_t n_owned;
  u64map_t map; /* key -> slot */
};

int trainer_kmap_create(uint64_t slots, trainer_kmap_t **out) {
  *out = NULL;
  trainer_kmap_t *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  m->n_slots = slots;
  m->slot_key = malloc((slots ? slots : 1) * sizeof *m->slot_key);
  m->state = calloc(slots ? slots : 1, 1);
  if (!m->slot_key || !m->state || u64map_init(&m->map, 512) != 0) {
    trainer_kmap_destroy(m);
    return -ENOMEM;
  }
  *out = m;
  return 0;
}

void trainer_kmap_destroy(trainer_kmap_t *m) {
  if (!m) return;
  free(m->slot_key);
  free(m->state);
  u64map_close(&m->map);
  free(m);
}

size_t trainer_kmap_count(const trainer_kmap_t *m) { return u64map_count(&m->map); }

int64_t trainer_kmap_find(const trainer_kmap_t *m, uint64_t key) {
  uint32_t slot;
  return u64map_find(&m->map, key, &slot) ? (int64_t)slot : -1;
}

static int is_full(const trainer_kmap_t *m, uint32_t slot) { return slot < m->n_slots && (m->state[slot] & FULL); }

void trainer_kmap_set_owned(trainer_kmap_t *m, uint32_t slot, int owned) {
  if (!is_full(m, slot) || ((m->state[slot] & OWNED) != 0) == (owned != 0)) return;
  m->state[slot] ^= OWNED;
  if (owned) m->n_owned++;
  else m->n_owned--;
}

size_t trainer_kmap_owned(const trainer_kmap_t *m, uint32_t *slots, uint64_t *keys, size_t cap) {
  if (!cap) return m->n_owned;
  size_t k = 0;
  for (uint64_t s = 0; s < m->n_slots && k < cap; s++)
    if (m->state[s] & OWNED) {
      slots[k] = (uint32_t)s;
      keys[k++] = m->slot_key[s];
    }
  return m->n_owned;
}

/* slot forgets its key (the map is the caller's business). */
static void empty(trainer_kmap_t *m, uint32_t slot) {
  trainer_kmap_set_owned(m, slot, 0);
  m->state[slot] = 0;
}

void trainer_kmap_clear(trainer_kmap_t *m, uint32_t slot) {
  if (!is_full(m, slot)) return;
  u64map_erase(&m->map, m->slot_key[slot], NULL); /* maps to slot: the invariant */
  empty(m, slot);
}

int trainer_kmap_set(trainer_kmap_t *m, uint32_t slot, uint64_t key) {
  if (slot >= m->n_slots) return -EINVAL;
  trainer_kmap_clear(m, slot);
  uint32_t *at;
  int rc = u64map_insert(&m->map, key, slot, &at);
  if (rc < 0) return rc;
  if (rc == 0) { /* the key moved: its old slot no longer holds it */
    empty(m, *at);
    *at = slot;
  }
  m->slot_key[slot] = key;
  m->state[slot] = FULL;
  return 0;
}
