/*
 * strategy: table_strategy, parsed and placed (contract in strategy.h).
 */
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

const char *strategy_name(int s) {
  return s == STRATEGY_PARTITION ? "partition" : s == STRATEGY_AUTO ? "auto" : s == STRATEGY_PARTITION_ROWS ? "partition_rows" : "cache";
}

static int word(const char *w, size_t n) {
  if (n == 5 && !strncmp(w, "cache", 5)) return STRATEGY_CACHE;
  if (n == 9 && !strncmp(w, "partition", 9)) return STRATEGY_PARTITION;
  if (n == 4 && !strncmp(w, "auto", 4)) return STRATEGY_AUTO;
  if (n == 14 && !strncmp(w, "partition_rows", 14)) return STRATEGY_PARTITION_ROWS;
  return -1;
}

int strategy_words(const char *v, uint8_t *out, uint32_t cap, uint32_t *n_out, char *why, size_t why_len) {
  uint32_t n = 0;
  for (const char *p = v;; p++) {
    while (*p == ' ' || *p == '\t') p++;
    const char *e = p;
    while (*e && *e != ',' && *e != ' ' && *e != '\t') e++;
    int s = word(p, (size_t)(e - p));
    if (s < 0)
      return err_set(why, why_len, ERR_CONFIG, "entry %u '%.*s' is not cache, partition, partition_rows or auto", n + 1, (int)(e - p), p);
    if (out && n < cap) out[n] = (uint8_t)s;
    n++;
    while (*e == ' ' || *e == '\t') e++;
    if (*e != ',') {
      if (*e) return err_set(why, why_len, ERR_CONFIG, "unexpected '%s' after entry %u", e, n);
      break;
    }
    p = e;
  }
  *n_out = n;
  return 0;
}

int strategy_parse(const cfg_t *cfg, uint32_t n_tables, uint8_t *out, char *err, size_t err_len) {
  char why[256];
  uint32_t n;
  if (strategy_words(cfg_str(cfg, "table_strategy"), out, n_tables, &n, why, sizeof why) != 0)
    return err_set(err, err_len, ERR_CONFIG, "table_strategy (from %s): %s", cfg_origin(cfg, "table_strategy"), why);
  if (n == 1) {
    for (uint32_t t = 1; t < n_tables; t++) out[t] = out[0];
    return 0;
  }
  if (n != n_tables)
    return err_set(err, err_len, ERR_CONFIG,
                   "table_strategy (from %s) lists %u entries but table_rows has %u tables: give one word for every "
                   "table, or one per table",
                   cfg_origin(cfg, "table_strategy"), n, n_tables);
  return 0;
}

int strategy_any_partitioned(const uint8_t *strat, uint32_t n) {
  for (uint32_t t = 0; t < n; t++)
    if (strat[t] != STRATEGY_CACHE) return 1;
  return 0;
}

typedef struct item_s {
  uint64_t work, rows;
  uint32_t t;
} item_t;

static int by_work(const void *a, const void *b) {
  const item_t *x = a, *y = b;
  if (x->work != y->work) return x->work > y->work ? -1 : 1;
  if (x->rows != y->rows) return x->rows > y->rows ? -1 : 1;
  return x->t < y->t ? -1 : x->t > y->t;
}

void strategy_place(const uint8_t *strat, const data_schema_t *schema, const table_layout_t *layout, uint32_t P,
                  uint32_t *owner) {
  uint32_t T = schema->n_tables, n = 0;
  item_t *it = malloc((T ? T : 1) * sizeof *it);
  uint64_t *load = calloc(P ? P : 1, sizeof *load);
  for (uint32_t t = 0; t < T; t++) owner[t] = STRATEGY_OWNER_NONE;
  ASSERT(it && load); /* a few hundred bytes */
  for (uint32_t t = 0; t < T; t++)
    if (strat[t] == STRATEGY_PARTITION_ROWS) {
      owner[t] = STRATEGY_OWNER_ALL;
      for (uint32_t q = 0; q < P; q++) load[q] += (uint64_t)schema->hotness[t] * layout->tables[t].dim / (P ? P : 1);
    }
  for (uint32_t t = 0; t < T; t++)
    if (strat[t] == STRATEGY_PARTITION)
      it[n++] = (item_t){(uint64_t)schema->hotness[t] * layout->tables[t].dim, schema->table_rows[t], t};
  qsort(it, n, sizeof *it, by_work);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t best = 0;
    for (uint32_t q = 1; q < P; q++)
      if (load[q] < load[best]) best = q;
    owner[it[i].t] = best;
    load[best] += it[i].work;
  }
  free(it);
  free(load);
}
