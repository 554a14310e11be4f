/* table: see table.h. */
#include "table.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int table_layout_init(table_layout_t *l, uint32_t n_tables, uint64_t seed) {
  memset(l, 0, sizeof *l);
  if (n_tables == 0 || n_tables > TABLE_MAX) return -EINVAL;
  l->tables = calloc(n_tables, sizeof *l->tables);
  if (!l->tables) return -ENOMEM;
  l->n_tables = n_tables;
  l->seed = seed;
  return 0;
}

void table_layout_close(table_layout_t *l) {
  free(l->tables);
  memset(l, 0, sizeof *l);
}

int table_layout_copy(table_layout_t *dst, const table_layout_t *src) {
  int rc = table_layout_init(dst, src->n_tables, src->seed);
  if (rc == 0) memcpy(dst->tables, src->tables, src->n_tables * sizeof *src->tables);
  return rc;
}

uint32_t table_max_row_floats(const table_layout_t *l) {
  uint32_t m = 0;
  for (uint32_t t = 0; t < l->n_tables; t++)
    if (table_row_floats(l, t) > m) m = table_row_floats(l, t);
  return m;
}

int table_check_key(const table_layout_t *l, uint64_t key, char *why, size_t why_len) {
  uint32_t t = TABLE_ID(key);
  uint64_t r = TABLE_ROW(key);
  if (t >= l->n_tables) {
    if (why) snprintf(why, why_len, "key %llu names table %u but the layout has %u tables",
                      (unsigned long long)key, t, l->n_tables);
    return -ENOENT;
  }
  if (r >= l->tables[t].rows) {
    if (why) snprintf(why, why_len, "key %llu names row %llu of table %u, which has %llu rows",
                      (unsigned long long)key, (unsigned long long)r, t,
                      (unsigned long long)l->tables[t].rows);
    return -ERANGE;
  }
  return 0;
}

void table_init_row(const table_layout_t *l, uint64_t key, float *out) {
  const table_info_t *t = &l->tables[TABLE_ID(key)];
  double scale = 1.0 / sqrt((double)(t->rows ? t->rows : 1));
  uint64_t s = table_mix64(l->seed ^ table_mix64(key));
  for (uint32_t i = 0; i < t->dim; i++) {
    s = table_mix64(s);
    /* 24 random bits -> [0,1) exactly representable; map to [-scale, scale) */
    double u = (double)(s >> 40) * (1.0 / 16777216.0);
    out[i] = (float)((2.0 * u - 1.0) * scale);
  }
  for (uint32_t i = 0; i < t->state_floats; i++) out[t->dim + i] = 0.0f;
}

uint64_t table_layout_hash(const table_layout_t *l) {
  uint64_t h = table_mix64(UINT64_C(0x6368616e746572) ^ l->n_tables);
  h = table_mix64(h ^ l->seed);
  for (uint32_t t = 0; t < l->n_tables; t++) {
    h = table_mix64(h ^ l->tables[t].rows);
    h = table_mix64(h ^ ((uint64_t)l->tables[t].dim << 32 | l->tables[t].state_floats));
  }
  return h ? h : 1; /* 0 means "do not check" on the wire */
}
