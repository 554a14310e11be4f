/* shard: see shard.h. */
#include "shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
