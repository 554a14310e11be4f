/* trainer_kmap: see trainer_kmap.h. */
#include "trainer_kmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

#define EMPTY UINT64_MAX

typedef struct kent_s {
  uint64_t key;
  uint32_t slot;
} kent_t;

struct kmap_s {
  uint64_t *slot_key; /* slots */
  uint8_t *owned;     /* slots */
  uint64_t n_slots;
  size_t n_owned;
  kent_t *tab;
  size_t cap, n;
  int shift;
};

static size_t home(const kmap_t *m, uint64_t key) {
  return (size_t)((tbl_mix64(key) * UINT64_C(0x9e3779b97f4a7c15)) >> m->shift);
}

static int tab_alloc(kmap_t *m, size_t cap) {
  int bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  kent_t *t = malloc(((size_t)1 << bits) * sizeof *t);
  if (!t) return -ENOMEM;
  for (size_t i = 0; i < ((size_t)1 << bits); i++) t[i].key = EMPTY;
  m->tab = t;
  m->cap = (size_t)1 << bits;
  m->shift = 64 - bits;
  m->n = 0;
  return 0;
}

int kmap_create(uint64_t slots, kmap_t **out) {
  *out = NULL;
  kmap_t *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  m->n_slots = slots;
  m->slot_key = malloc((slots ? slots : 1) * sizeof *m->slot_key);
  m->owned = calloc(slots ? slots : 1, 1);
  if (!m->slot_key || !m->owned || tab_alloc(m, 1024) != 0) {
    kmap_destroy(m);
    return -ENOMEM;
  }
  for (uint64_t i = 0; i < slots; i++) m->slot_key[i] = EMPTY;
  *out = m;
  return 0;
}

void kmap_destroy(kmap_t *m) {
  if (!m) return;
  free(m->slot_key);
  free(m->owned);
  free(m->tab);
  free(m);
}

size_t kmap_count(const kmap_t *m) { return m->n; }

static kent_t *find(const kmap_t *m, uint64_t key) {
  for (size_t i = home(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (m->tab[i].key == key) return &m->tab[i];
    if (m->tab[i].key == EMPTY) return NULL;
  }
}

int64_t kmap_find(const kmap_t *m, uint64_t key) {
  const kent_t *e = find(m, key);
  return e ? (int64_t)e->slot : -1;
}

static void erase(kmap_t *m, kent_t *e) {
  size_t mask = m->cap - 1, i = (size_t)(e - m->tab), j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (m->tab[j].key == EMPTY) break;
    size_t h = home(m, m->tab[j].key);
    if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
      m->tab[i] = m->tab[j];
      i = j;
    }
  }
  m->tab[i].key = EMPTY;
  m->n--;
}

static int grow(kmap_t *m) {
  kent_t *old = m->tab;
  size_t oc = m->cap;
  if (tab_alloc(m, oc * 2) != 0) {
    m->tab = old;
    m->cap = oc;
    int bits = 0;
    while (((size_t)1 << bits) < oc) bits++;
    m->shift = 64 - bits;
    return -ENOMEM;
  }
  for (size_t j = 0; j < oc; j++) {
    if (old[j].key == EMPTY) continue;
    size_t i = home(m, old[j].key);
    while (m->tab[i].key != EMPTY) i = (i + 1) & (m->cap - 1);
    m->tab[i] = old[j];
    m->n++;
  }
  free(old);
  return 0;
}

void kmap_set_owned(kmap_t *m, uint32_t slot, int owned) {
  if (slot >= m->n_slots || m->slot_key[slot] == EMPTY || m->owned[slot] == (owned != 0)) return;
  m->owned[slot] = owned != 0;
  if (owned) m->n_owned++;
  else m->n_owned--;
}

size_t kmap_owned(const kmap_t *m, uint32_t *slots, uint64_t *keys, size_t cap) {
  if (!cap) return m->n_owned;
  size_t k = 0;
  for (uint64_t s = 0; s < m->n_slots && k < cap; s++)
    if (m->owned[s]) {
      slots[k] = (uint32_t)s;
      keys[k++] = m->slot_key[s];
    }
  return m->n_owned;
}

void kmap_clear(kmap_t *m, uint32_t slot) {
  if (slot >= m->n_slots || m->slot_key[slot] == EMPTY) return;
  kmap_set_owned(m, slot, 0);
  kent_t *e = find(m, m->slot_key[slot]);
  if (e && e->slot == slot) erase(m, e);
  m->slot_key[slot] = EMPTY;
}

int kmap_set(kmap_t *m, uint32_t slot, uint64_t key) {
  if (slot >= m->n_slots) return -EINVAL;
  kmap_clear(m, slot);
  kent_t *e = find(m, key);
  if (e) { /* the key moved: its old slot no longer holds it */
    kmap_set_owned(m, e->slot, 0);
    m->slot_key[e->slot] = EMPTY;
    e->slot = slot;
    m->slot_key[slot] = key;
    return 0;
  }
  if ((m->n + 1) * 2 > m->cap && grow(m) != 0) return -ENOMEM;
  size_t i = home(m, key);
  while (m->tab[i].key != EMPTY) i = (i + 1) & (m->cap - 1);
  m->tab[i].key = key;
  m->tab[i].slot = slot;
  m->n++;
  m->slot_key[slot] = key;
  return 0;
}
