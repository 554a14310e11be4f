/* shard: see shard.h. */
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

int shard_map_init(shard_map_t *m, const table_layout_t *l, uint32_t n_servers,
                   uint64_t table_wise_max_rows) {
  memset(m, 0, sizeof *m);
  if (n_servers == 0) return -EINVAL;
  m->table_server = calloc(l->n_tables ? l->n_tables : 1, sizeof *m->table_server);
  uint64_t *load = calloc(n_servers, sizeof *load);
  if (!m->table_server || !load) {
    free(m->table_server);
    free(load);
    m->table_server = NULL;
    return -ENOMEM;
  }
  m->n_servers = n_servers;
  m->n_tables = l->n_tables;
  /* Row-wise tables load every server evenly; count them first. */
  for (uint32_t t = 0; t < l->n_tables; t++) {
    uint64_t bytes = l->tables[t].rows * (uint64_t)table_row_floats(l, t);
    if (n_servers == 1 || l->tables[t].rows > table_wise_max_rows) {
      m->table_server[t] = n_servers == 1 ? 0 : SHARD_ROWWISE;
      for (uint32_t s = 0; s < n_servers; s++) load[s] += bytes / n_servers;
    }
  }
  /* Table-wise tables: each to the least loaded server, in table order, so
   * the plan is a pure function of (layout, servers, threshold). */
  for (uint32_t t = 0; t < l->n_tables; t++) {
    if (n_servers == 1 || l->tables[t].rows > table_wise_max_rows) continue;
    uint32_t best = 0;
    for (uint32_t s = 1; s < n_servers; s++)
      if (load[s] < load[best]) best = s;
    m->table_server[t] = best;
    load[best] += l->tables[t].rows * (uint64_t)table_row_floats(l, t);
  }
  free(load);
  return 0;
}

void shard_map_close(shard_map_t *m) {
  free(m->table_server);
  memset(m, 0, sizeof *m);
}

int shard_map_from_cfg(shard_map_t *m, const cfg_t *cfg, const table_layout_t *l, uint32_t n_servers, char *err,
                       size_t err_len) {
  int rc = shard_map_init(m, l, n_servers, (uint64_t)cfg_int(cfg, "shard.table_wise_max_rows"));
  if (rc) {
    snprintf(err, err_len, rc == -EINVAL ? "no embedding servers" : "out of memory planning the shard map");
    return rc;
  }
  m->modulo = !strcmp(cfg_str(cfg, "shard.rowwise"), "modulo");
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
