/*
 * embedding_service: the chanter.embedding.v1.Embedding RPC handlers.
 *
 * Handlers run on the daemon's loop thread, check what can be checked
 * cheaply (payload shapes, layout fingerprint) and hand the storage work to
 * libuv's worker pool; the reply is sent from the after-work callback, back
 * on the loop thread.  Nothing here blocks the loop on RocksDB.
 */
#ifndef CHANTER_EMBEDDING_SERVICE_H
#define CHANTER_EMBEDDING_SERVICE_H

#include <uv.h>

#include "store.h"
#include "metrics.h"
#include "rpc.h"

typedef struct embedding_service_s embedding_service_t;

/* Registers the Embedding service's handlers on server and its metrics on
 * reg (required).  The store and registry stay the caller's and must
 * outlive the service.  Loop thread. */
int embedding_service_create(uv_loop_t *loop, rpc_server_t *server, store_t *store,
                       const table_layout_t *layout, uint32_t shard, uint32_t n_shards,
                       metrics_registry_t *reg, embedding_service_t **out);
void embedding_service_destroy(embedding_service_t *svc);

/* This process's incarnation: random, non-zero, drawn by
 * embedding_service_create (Stats and Fence return it).  Any thread. */
uint64_t embedding_service_incarnation(const embedding_service_t *svc);

#endif
