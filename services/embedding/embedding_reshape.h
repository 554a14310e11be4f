/*
 * embedding_reshape: the embedding server's Reshape (embedding.proto): a
 * running job's rows onto another count of servers, server to server, and
 * the check of the rows a WriteBack carries (what a peer sends goes
 * through it like any client's).
 */
#ifndef CHANTER_EMBEDDING_RESHAPE_H
#define CHANTER_EMBEDDING_RESHAPE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "embedding.pb-c.h"
#include "store.h"

typedef struct embedding_reshape_result_s {
  uint64_t rows_moved, bytes_moved, rows_kept;
  double seconds;
} embedding_reshape_result_t;

/* The server's write epoch and its lock (embedding_service.c): a move
 * goes on only in the epoch it began in.  A Restore or a Clear of a later
 * epoch (an oracle that took the job over, rolling back) waits for the
 * batch in flight, and the move stops before the next one; its writes
 * carry its epoch, so a peer cleared in a later one refuses them. */
typedef struct embedding_reshape_fence_s {
  pthread_rwlock_t *lock;
  _Atomic uint64_t *epoch;
} embedding_reshape_fence_t;

/* One Reshape's work, on a worker thread: checks req (servers >= 1, one
 * peer address per server), places the tables on req->servers servers as
 * every client does (shard_map_from_cfg with cfg, the server's job
 * configuration), gives the store that map with this server's index
 * `shard`, and with req->move sends every row the store no longer owns to
 * its owner (a client of the peers built from cfg: its TLS, limits and
 * rpc.timeout_ms) and deletes it here, batch by batch, so a call cut short
 * and made again goes on; each batch under fence (NULL: none).  0, or an error with why naming the peer or the
 * entry. */
int embedding_reshape_run(const cfg_t *cfg, store_t *store, uint32_t shard, const embedding_reshape_fence_t *fence,
                          const Chanter__Embedding__V1__ReshapeRequest *req, embedding_reshape_result_t *res, char *why,
                          size_t why_len);

/* Whether every float of a WriteBack's rows is finite: 0, or -EINVAL with
 * why naming the first bad key, its index and position.  Reads the message
 * in place; stops at a key of no table (the store refuses it anyway). */
int embedding_rows_finite(const table_layout_t *l, const Chanter__Embedding__V1__WriteBackRequest *r, char *why,
                          size_t why_len);

#endif
