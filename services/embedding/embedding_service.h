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

#include "embedding_backup.h"
#include "store.h"
#include "cfg.h"
#include "metrics.h"
#include "rpc.h"

typedef struct embedding_service_s embedding_service_t;

/* What one request may carry (embedding.max_lookup_keys,
 * embedding.max_write_keys, embedding.max_blob_mb): checked on the decoded
 * message before anything is allocated in proportion to it. */
typedef struct embedding_limits_s {
  uint64_t lookup_keys;
  uint64_t write_keys;
  uint64_t blob_bytes;
} embedding_limits_t;

/* Registers the Embedding service's handlers on server and its metrics on
 * reg (required).  The store and registry stay the caller's and must
 * outlive the service; limits is copied.  Loop thread. */
int embedding_service_create(uv_loop_t *loop, rpc_server_t *server, store_t *store,
                       const table_layout_t *layout, const embedding_limits_t *limits, uint32_t shard,
                       uint32_t n_shards, metrics_registry_t *reg, embedding_service_t **out);
/* Closes the service's timer (the full disk's check): after the loop ran,
 * before daemon_close's last run of it (which completes the close).  Loop
 * thread; NULL is a no-op. */
void embedding_service_stop(embedding_service_t *svc);
void embedding_service_destroy(embedding_service_t *svc);

/* This process's incarnation: random, non-zero, drawn by
 * embedding_service_create (Stats and Fence return it).  Any thread. */
uint64_t embedding_service_incarnation(const embedding_service_t *svc);

/* The server's backups and lost-disk state (NULL: off); it must outlive
 * the service.  Before the server serves; loop thread. */
void embedding_service_set_backup(embedding_service_t *svc, embedding_backup_t *b);

/* The job configuration a Reshape builds its shard map and its client of
 * the peers from (embedding_reshape.h); it must outlive the service.
 * Before the server serves; loop thread. */
void embedding_service_set_cfg(embedding_service_t *svc, const cfg_t *cfg);

#endif
