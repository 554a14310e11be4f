/*
 * shard: which embedding server owns which key.
 *
 * Every client (trainers, the CLI, benchmarks) and every server route with
 * this one function, so they always agree.  Small tables are placed whole on
 * one server (table-wise: fewer servers per lookup, greedy balance of rows);
 * large tables are spread row-wise by a hash of the key.  The threshold comes
 * from the job configuration (`shard.table_wise_max_rows`).  The cost-model
 * planner of the sharding issue will fill the same table_server[] map.
 */
#ifndef CHANTER_SHARD_H
#define CHANTER_SHARD_H

#include <stdint.h>

#include "cfg.h"
#include "table.h"

#define SHARD_ROWWISE UINT32_MAX

typedef struct shard_map_s {
  uint32_t n_servers;
  uint32_t n_tables;
  uint32_t *table_server; /* per table: owning server, or SHARD_ROWWISE */
} shard_map_t;

/* Plans the map.  0, -EINVAL (no servers) or -ENOMEM. */
int shard_map_init(shard_map_t *m, const table_layout_t *l, uint32_t n_servers,
                   uint64_t table_wise_max_rows);
/* The job's map: shard.table_servers when it is set (one entry per table:
 * the server index that holds it whole, or "rows" for row-wise by key
 * hash; `chanter shard plan` prints the cost model's), else shard_map_init
 * with shard.table_wise_max_rows.  Every client and server calls this with
 * the same configuration, so they agree.  0, ERR_CONFIG with err naming
 * the entry (a list of another length than table_rows, a server past
 * n_servers, a word that is neither), -EINVAL, -ENOMEM. */
int shard_map_from_cfg(shard_map_t *m, const cfg_t *cfg, const table_layout_t *l, uint32_t n_servers, char *err,
                       size_t err_len);
void shard_map_close(shard_map_t *m);

/* The server index (0..n_servers-1) that owns key.  Any thread. */
static inline uint32_t shard_of(const shard_map_t *m, uint64_t key) {
  uint32_t t = TABLE_ID(key);
  uint32_t s = t < m->n_tables ? m->table_server[t] : SHARD_ROWWISE;
  if (s != SHARD_ROWWISE) return s;
  return (uint32_t)(table_mix64(key ^ UINT64_C(0x5348415244)) % m->n_servers);
}

#endif
