/* shard: see shard.h. */
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Whole tables by the consistent rule (shard.h): load[] counts whole
 * tables' bytes only (row-wise ones load every server alike). */
static void place_whole_consistent(shard_map_t *m, const table_layout_t *l, uint32_t n, const uint8_t *whole,
                                   uint64_t *load) {
  for (uint32_t t = 0; t < l->n_tables; t++)
    if (whole[t]) {
      m->table_server[t] = 0;
      load[0] += l->tables[t].rows * (uint64_t)table_row_floats(l, t);
    }
  for (uint32_t k = 1; k < n; k++)
    for (;;) { /* server k joins: each move lowers the sum of squared loads, so this ends */
      uint32_t s = 0;
      for (uint32_t i = 1; i < k; i++)
        if (load[i] > load[s]) s = i;
      int best = -1;
      uint64_t bb = 0;
      for (uint32_t t = 0; t < l->n_tables; t++) {
        uint64_t b = l->tables[t].rows * (uint64_t)table_row_floats(l, t);
        if (whole[t] && m->table_server[t] == s && load[k] + b < load[s] && (best < 0 || b > bb)) best = (int)t, bb = b;
      }
      if (best < 0) break;
      m->table_server[best] = k;
      load[s] -= bb;
      load[k] += bb;
    }
}

int shard_map_init(shard_map_t *m, const table_layout_t *l, uint32_t n_servers, uint64_t table_wise_max_rows) {
  return shard_map_init_rule(m, l, n_servers, table_wise_max_rows, 0);
}

int shard_map_init_rule(shard_map_t *m, const table_layout_t *l, uint32_t n_servers, uint64_t table_wise_max_rows,
                        int modulo) {
  memset(m, 0, sizeof *m);
  if (n_servers == 0) return -EINVAL;
  m->table_server = calloc(l->n_tables ? l->n_tables : 1, sizeof *m->table_server);
  uint64_t *load = calloc(n_servers, sizeof *load);
  uint8_t *whole = calloc(l->n_tables ? l->n_tables : 1, 1);
  if (!m->table_server || !load || !whole) {
    free(m->table_server);
    free(load);
    free(whole);
    m->table_server = NULL;
    return -ENOMEM;
  }
  m->n_servers = n_servers;
  m->n_tables = l->n_tables;
  m->modulo = modulo;
  for (uint32_t t = 0; t < l->n_tables; t++) whole[t] = n_servers == 1 || l->tables[t].rows <= table_wise_max_rows;
  /* Row-wise tables load every server evenly; count them first. */
  for (uint32_t t = 0; t < l->n_tables; t++) {
    if (whole[t]) continue;
    m->table_server[t] = SHARD_ROWWISE;
    uint64_t bytes = l->tables[t].rows * (uint64_t)table_row_floats(l, t);
    for (uint32_t s = 0; s < n_servers; s++) load[s] += bytes / n_servers;
  }
  if (!modulo) {
    memset(load, 0, n_servers * sizeof *load);
    place_whole_consistent(m, l, n_servers, whole, load);
  } else {
    /* Table-wise tables: each to the least loaded server, in table order, so
     * the plan is a pure function of (layout, servers, threshold). */
    for (uint32_t t = 0; t < l->n_tables; t++) {
      if (!whole[t]) continue;
      uint32_t best = 0;
      for (uint32_t s = 1; s < n_servers; s++)
        if (load[s] < load[best]) best = s;
      m->table_server[t] = best;
      load[best] += l->tables[t].rows * (uint64_t)table_row_floats(l, t);
    }
  }
  free(load);
  free(whole);
  return 0;
}

void shard_map_close(shard_map_t *m) {
  free(m->table_server);
  memset(m, 0, sizeof *m);
}

int shard_map_from_cfg(shard_map_t *m, const cfg_t *cfg, const table_layout_t *l, uint32_t n_servers, char *err,
                       size_t err_len) {
  int rc = shard_map_init_rule(m, l, n_servers, (uint64_t)cfg_int(cfg, "shard.table_wise_max_rows"),
                               !strcmp(cfg_str(cfg, "shard.rule"), "modulo"));
  if (rc) {
    snprintf(err, err_len, rc == -EINVAL ? "no embedding servers" : "out of memory planning the shard map");
    return rc;
  }
  char **v = NULL;
  size_t n = 0;
  if ((rc = cfg_list(cfg, "shard.table_servers", &v, &n)) != 0) {
    snprintf(err, err_len, "shard.table_servers: cannot read it");
    shard_map_close(m);
    return rc;
  }
  if (n && n != l->n_tables) {
    snprintf(err, err_len, "shard.table_servers (from %s) lists %zu entries for %u tables (table_rows)",
             cfg_origin(cfg, "shard.table_servers"), n, l->n_tables);
    rc = ERR_CONFIG;
  }
  for (size_t t = 0; t < n && !rc; t++) {
    char *end;
    unsigned long s = strtoul(v[t], &end, 10);
    if (!strcmp(v[t], "rows")) {
      m->table_server[t] = n_servers == 1 ? 0 : SHARD_ROWWISE;
    } else if (end != v[t] && !*end && v[t][0] != '-' && s < n_servers) {
      m->table_server[t] = (uint32_t)s;
    } else {
      snprintf(err, err_len,
               "shard.table_servers (from %s): entry %zu is '%s', not a server index below %u (embedding_servers) or "
               "'rows'",
               cfg_origin(cfg, "shard.table_servers"), t + 1, v[t], n_servers);
      rc = ERR_CONFIG;
    }
  }
  cfg_list_free(v, n);
  if (rc) shard_map_close(m);
  return rc;
}
