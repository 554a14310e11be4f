/*
 * shard: which embedding server owns which key.
 *
 * Every client (trainers, the CLI, benchmarks) and every server route with
 * this one function, so they always agree.  Small tables are placed whole on
 * one server (table-wise: fewer servers per lookup, greedy balance of rows);
 * large tables are spread row-wise by a hash of the key.  The threshold comes
 * from the job configuration (`shard.table_wise_max_rows`).
 *
 * shard.rule = consistent (the default) keeps rows where they are when
 * the server count changes, as far as balance allows -- what a live scale
 * of the embedding servers wants:
 *   - row-wise, a key goes to the server its hash picks by jump consistent
 *     hashing (Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash
 *     Algorithm", 2014): from n to n + 1 servers 1/(n + 1) of the keys
 *     move, all of them to the new server;
 *   - whole tables are placed for n servers by taking the placement for
 *     n - 1 and moving tables onto server n - 1, each time the biggest
 *     table of the most loaded server that still lowers the larger of the
 *     two loads, until none does (all on server 0 for one server): from n
 *     to n + 1 only tables onto the new server move, and back from n + 1
 *     to n only the last server's.
 * shard.rule = modulo is the rule before: the hash modulo the count (moves
 * n/(n + 1) of the keys) and whole tables greedily from scratch.
 * Checkpoints record which rule placed their rows (manifest.h) and a
 * resume under the other is refused.  The cost-model
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
  int modulo; /* shard.rule = modulo (the rule before); 0: consistent */
  uint32_t *table_server; /* per table: owning server, or SHARD_ROWWISE */
} shard_map_t;

/* Plans the map by shard.rule = consistent (shard_map_init) or by
 * modulo (shard_map_init_rule with modulo = 1).  0, -EINVAL (no servers)
 * or -ENOMEM. */
int shard_map_init(shard_map_t *m, const table_layout_t *l, uint32_t n_servers,
                   uint64_t table_wise_max_rows);
int shard_map_init_rule(shard_map_t *m, const table_layout_t *l, uint32_t n_servers, uint64_t table_wise_max_rows,
                        int modulo);
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

/* Jump consistent hash: the bucket in [0, n) of h.  Walks the buckets h
 * would jump to as n grows, each jump drawn from a 64-bit LCG seeded by h,
 * and returns the last one below n: expected ln(n) + 1 steps. */
static inline uint32_t shard_jump(uint64_t h, uint32_t n) {
  int64_t b = -1, j = 0;
  while (j < (int64_t)n) {
    b = j;
    h = h * UINT64_C(2862933555777941757) + 1;
    j = (int64_t)((double)(b + 1) * ((double)(INT64_C(1) << 31) / (double)((h >> 33) + 1)));
  }
  return (uint32_t)b;
}

/* The server index (0..n_servers-1) that owns key.  Any thread. */
static inline uint32_t shard_of(const shard_map_t *m, uint64_t key) {
  uint32_t t = TABLE_ID(key);
  uint32_t s = t < m->n_tables ? m->table_server[t] : SHARD_ROWWISE;
  if (s != SHARD_ROWWISE) return s;
  uint64_t h = table_mix64(key ^ UINT64_C(0x5348415244));
  return m->modulo ? (uint32_t)(h % m->n_servers) : shard_jump(h, m->n_servers);
}

/* "consistent" or "modulo": the rule of m (manifest.h's shard_rule). */
static inline const char *shard_rule_name(const shard_map_t *m) { return m->modulo ? "modulo" : "consistent"; }

#endif
