/*
 * trainer_rows: mode = ideal's trainer-local row store (see
 * trainer_rows.h): a u64map from key to a row index in one growing array,
 * rows initialized on first use as an embedding server would, and the
 * "fetch" that fills trainer_step's row array from it.
 */
#include "trainer_rows.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "u64map.h"

struct trainer_rows_s {
  table_layout_t layout;
  uint32_t rf;  /* floats per row */
  u64map_t map; /* key -> row index into rows */
  size_t n;     /* rows held */
  float *rows;  /* n_cap rows of rf floats */
  size_t n_cap;
};

int trainer_rows_create(const table_layout_t *layout, trainer_rows_t **out) {
  if (!layout->n_tables) return -EINVAL;
  uint32_t rf = table_row_floats(layout, 0);
  for (uint32_t t = 1; t < layout->n_tables; t++)
    if (table_row_floats(layout, t) != rf) return -EINVAL;
  trainer_rows_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->rf = rf;
  int rc = table_layout_copy(&s->layout, layout);
  if (!rc) rc = u64map_init(&s->map, 512);
  if (rc) {
    trainer_rows_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

void trainer_rows_destroy(trainer_rows_t *s) {
  if (!s) return;
  u64map_close(&s->map);
  free(s->rows);
  table_layout_close(&s->layout);
  free(s);
}

size_t trainer_rows_count(const trainer_rows_t *s) { return s->n; }

/* The row of key, inserted (initialized) when new; NULL on -ENOMEM / bad
 * key (*rc says which). */
static float *row_of(trainer_rows_t *s, uint64_t key, int *rc, char *why, size_t why_len) {
  uint32_t i;
  if (u64map_find(&s->map, key, &i)) return s->rows + (size_t)i * s->rf;
  if ((*rc = table_check_key(&s->layout, key, why, why_len)) != 0) return NULL;
  *rc = -ENOMEM;
  if (s->n > UINT32_MAX) return NULL; /* a row index is a uint32 */
  if (s->n == s->n_cap) {
    size_t nc = s->n_cap ? 2 * s->n_cap : 1024;
    float *r = realloc(s->rows, nc * s->rf * sizeof(float));
    if (!r) return NULL;
    s->rows = r;
    s->n_cap = nc;
  }
  if (u64map_insert(&s->map, key, (uint32_t)s->n, NULL) < 0) return NULL;
  *rc = 0;
  float *row = s->rows + s->n * s->rf;
  table_init_row(&s->layout, key, row);
  s->n++;
  return row;
}

int trainer_rows_gather(trainer_rows_t *s, const uint64_t *keys, size_t n, float *out, char *why, size_t why_len) {
  for (size_t i = 0; i < n; i++) {
    int rc = 0;
    const float *row = row_of(s, keys[i], &rc, why, why_len);
    if (!row) return rc;
    memcpy(out + i * s->rf, row, s->rf * sizeof(float));
  }
  return 0;
}

int trainer_rows_scatter(trainer_rows_t *s, const uint64_t *keys, size_t n, const float *rows, char *why, size_t why_len) {
  for (size_t i = 0; i < n; i++) {
    int rc = 0;
    float *row = row_of(s, keys[i], &rc, why, why_len);
    if (!row) return rc;
    memcpy(row, rows + i * s->rf, s->rf * sizeof(float));
  }
  return 0;
}

int trainer_rows_fetch(trainer_rows_t *s, trainer_step_t *ts, const uint64_t *keys, size_t n, char *err, size_t err_len) {
  float *rows;
  int rc = trainer_step_set_keys(ts, keys, n, &rows, err, err_len);
  if (rc || !n) return rc;
  char why[256] = "";
  rc = trainer_rows_gather(s, trainer_step_keys(ts), n, rows, why, sizeof why);
  if (rc) err_set(err, err_len, rc, "local rows: %s", why[0] ? why : err_str(rc));
  return rc;
}
