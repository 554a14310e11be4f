/* table: see table.h. */
#include "table.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tbl_layout_init(tbl_layout_t *l, uint32_t n_tables, uint64_t seed) {
  memset(l, 0, sizeof *l);
  if (n_tables == 0 || n_tables > TBL_MAX_TABLES) return -EINVAL;
  l->tables = calloc(n_tables, sizeof *l->tables);
  if (!l->tables) return -ENOMEM;
  l->n_tables = n_tables;
  l->seed = seed;
  return 0;
}

void tbl_layout_close(tbl_layout_t *l) {
  free(l->tables);
  memset(l, 0, sizeof *l);
}

int tbl_layout_copy(tbl_layout_t *dst, const tbl_layout_t *src) {
  int rc = tbl_layout_init(dst, src->n_tables, src->seed);
  if (rc == 0) memcpy(dst->tables, src->tables, src->n_tables * sizeof *src->tables);
  return rc;
}

uint32_t tbl_max_row_floats(const tbl_layout_t *l) {
  uint32_t m = 0;
  for (uint32_t t = 0; t < l->n_tables; t++)
    if (tbl_row_floats(l, t) > m) m = tbl_row_floats(l, t);
  return m;
}

int tbl_check_key(const tbl_layout_t *l, uint64_t key, char *why, size_t why_len) {
  uint32_t t = TBL_TABLE(key);
  uint64_t r = TBL_ROW(key);
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

void tbl_init_row(const tbl_layout_t *l, uint64_t key, float *out) {
  const tbl_table_t *t = &l->tables[TBL_TABLE(key)];
  double scale = 1.0 / sqrt((double)(t->rows ? t->rows : 1));
  uint64_t s = tbl_mix64(l->seed ^ tbl_mix64(key));
  for (uint32_t i = 0; i < t->dim; i++) {
    s = tbl_mix64(s);
    /* 24 random bits -> [0,1) exactly representable; map to [-scale, scale) */
    double u = (double)(s >> 40) * (1.0 / 16777216.0);
    out[i] = (float)((2.0 * u - 1.0) * scale);
  }
  for (uint32_t i = 0; i < t->state_floats; i++) out[t->dim + i] = 0.0f;
}

uint64_t tbl_layout_hash(const tbl_layout_t *l) {
  uint64_t h = tbl_mix64(UINT64_C(0x6368616e746572) ^ l->n_tables);
  h = tbl_mix64(h ^ l->seed);
  for (uint32_t t = 0; t < l->n_tables; t++) {
    h = tbl_mix64(h ^ l->tables[t].rows);
    h = tbl_mix64(h ^ ((uint64_t)l->tables[t].dim << 32 | l->tables[t].state_floats));
  }
  return h ? h : 1; /* 0 means "do not check" on the wire */
}
