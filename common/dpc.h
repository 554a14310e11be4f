/*
 * dpc: the client side of the data processors, shared by the oracle, the
 * CLI and the tests (the batch <-> message conversion: batch_pb.h).
 *
 * Batch x is a pure function of (dataset, split, x, batch size), so any
 * processor can serve it: dpc sends batch x to processor x mod P and, when
 * that one is unavailable (killed, restarting), to the next one, retrying
 * with backoff until rpc.timeout_ms.  Every request carries the schema
 * fingerprint, so a processor configured for another schema refuses.
 * Thread-safe.
 */
#ifndef CHANTER_DPC_H
#define CHANTER_DPC_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "data.h"
#include "dataproc.pb-c.h"

/* 64-bit fingerprint of a schema (never 0). */
uint64_t dpc_schema_hash(const data_schema_t *s);

/* SHA-256 (hex, 65 bytes) over a batch's labels, dense and ids. */
void dpc_batch_digest(const data_batch_t *b, char hex[65]);

typedef struct dpc_s dpc_t;
/* Channels to cluster.dataproc; the schema comes from cfg. */
int dpc_create(const cfg_t *cfg, dpc_t **out, char *err, size_t err_len);
void dpc_destroy(dpc_t *c);
uint32_t dpc_servers(const dpc_t *c);

/* Batch x of split at batch size batch_size, from processor x mod P or, failing
 * that, the others. */
int dpc_get_batch(dpc_t *c, int split, uint64_t iteration, uint32_t batch_size, data_batch_t *out, char *err, size_t err_len);

/* Streams batches [first, first + count) of split from one processor,
 * calling cb for each in order (cb returns 0 to go on).  When the stream
 * breaks (processor killed or restarting), it reopens one -- the same or
 * another -- from the first batch not yet delivered, until rpc.timeout_ms
 * passes without progress.  *restarts counts the reopenings. */
typedef int (*dpc_batch_cb)(const data_batch_t *b, void *ud);
int dpc_stream(dpc_t *c, int split, uint64_t first, uint64_t count, uint32_t batch_size, dpc_batch_cb cb, void *ud,
               uint32_t *restarts, char *err, size_t err_len);

/* Info of processor i (caller frees with protobuf_c_message_free_unpacked). */
int dpc_info(dpc_t *c, uint32_t i, Chanter__Dataproc__V1__InfoResponse **out, char *err, size_t err_len);

#endif
