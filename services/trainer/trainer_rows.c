/* trainer_rows: see trainer_rows.h. */
#include "trainer_rows.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define EMPTY UINT64_MAX /* not a valid key: no table has 2^48 rows */

struct trows_s {
  tbl_layout_t layout;
  uint32_t rf;      /* floats per row */
  uint64_t *keys;   /* hash slots: key or EMPTY */
  uint64_t *index;  /* hash slots: row index into rows */
  size_t cap;       /* hash slots, a power of two */
  size_t n;         /* rows held */
  float *rows;      /* n_cap rows of rf floats */
  size_t n_cap;
};

static size_t hash_of(uint64_t key, size_t cap) { return (size_t)tbl_mix64(key) & (cap - 1); }

static int rehash(trows_t *s, size_t cap) {
  uint64_t *keys = malloc(cap * sizeof *keys), *index = malloc(cap * sizeof *index);
  if (!keys || !index) {
    free(keys);
    free(index);
    return -ENOMEM;
  }
  for (size_t i = 0; i < cap; i++) keys[i] = EMPTY;
  for (size_t i = 0; i < s->cap; i++) {
    if (s->keys[i] == EMPTY) continue;
    size_t h = hash_of(s->keys[i], cap);
    while (keys[h] != EMPTY) h = (h + 1) & (cap - 1);
    keys[h] = s->keys[i];
    index[h] = s->index[i];
  }
  free(s->keys);
  free(s->index);
  s->keys = keys;
  s->index = index;
  s->cap = cap;
  return 0;
}

int trows_create(const tbl_layout_t *layout, trows_t **out) {
  if (!layout->n_tables) return -EINVAL;
  uint32_t rf = tbl_row_floats(layout, 0);
  for (uint32_t t = 1; t < layout->n_tables; t++)
    if (tbl_row_floats(layout, t) != rf) return -EINVAL;
  trows_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->rf = rf;
  int rc = tbl_layout_copy(&s->layout, layout);
  if (!rc) rc = rehash(s, 1024);
  if (rc) {
    trows_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

void trows_destroy(trows_t *s) {
  if (!s) return;
  free(s->keys);
  free(s->index);
  free(s->rows);
  tbl_layout_close(&s->layout);
  free(s);
}

size_t trows_count(const trows_t *s) { return s->n; }

/* The row of key, inserted (initialized) when new; NULL on -ENOMEM / bad
 * key (*rc says which). */
static float *row_of(trows_t *s, uint64_t key, int *rc, char *why, size_t why_len) {
  size_t h = hash_of(key, s->cap);
  while (s->keys[h] != EMPTY) {
    if (s->keys[h] == key) return s->rows + s->index[h] * s->rf;
    h = (h + 1) & (s->cap - 1);
  }
  if ((*rc = tbl_check_key(&s->layout, key, why, why_len)) != 0) return NULL;
  if (2 * (s->n + 1) > s->cap) { /* load factor at most 1/2 */
    if ((*rc = rehash(s, 2 * s->cap)) != 0) return NULL;
    h = hash_of(key, s->cap);
    while (s->keys[h] != EMPTY) h = (h + 1) & (s->cap - 1);
  }
  if (s->n == s->n_cap) {
    size_t nc = s->n_cap ? 2 * s->n_cap : 1024;
    float *r = realloc(s->rows, nc * s->rf * sizeof(float));
    if (!r) {
      *rc = -ENOMEM;
      return NULL;
    }
    s->rows = r;
    s->n_cap = nc;
  }
  s->keys[h] = key;
  s->index[h] = s->n;
  float *row = s->rows + s->n * s->rf;
  tbl_init_row(&s->layout, key, row);
  s->n++;
  return row;
}

int trows_gather(trows_t *s, const uint64_t *keys, size_t n, float *out, char *why, size_t why_len) {
  for (size_t i = 0; i < n; i++) {
    int rc = 0;
    const float *row = row_of(s, keys[i], &rc, why, why_len);
    if (!row) return rc;
    memcpy(out + i * s->rf, row, s->rf * sizeof(float));
  }
  return 0;
}

int trows_scatter(trows_t *s, const uint64_t *keys, size_t n, const float *rows, char *why, size_t why_len) {
  for (size_t i = 0; i < n; i++) {
    int rc = 0;
    float *row = row_of(s, keys[i], &rc, why, why_len);
    if (!row) return rc;
    memcpy(row, rows + i * s->rf, s->rf * sizeof(float));
  }
  return 0;
}
