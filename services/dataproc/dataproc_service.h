/*
 * dataproc_service: the chanter.dataproc.v1.DataProc RPC handlers.
 *
 * GetBatch and Info are unary; StreamBatches serves ranges of batches in
 * order with backpressure (at most DATAPROC_STREAM_WINDOW batches queued per
 * stream; the next is built when the transport has taken one).  Building a
 * batch (parsing, hashing) runs on libuv's worker pool; replies are sent
 * from the loop thread.  Nothing is cached: a batch is a pure function of
 * (dataset, split, index, batch size), rebuilt on demand.
 */
#ifndef CHANTER_DATAPROC_SERVICE_H
#define CHANTER_DATAPROC_SERVICE_H

#include <uv.h>

#include "cfg.h"
#include "data.h"
#include "metrics.h"
#include "rpc.h"

#define DATAPROC_STREAM_WINDOW 4
#define DATAPROC_MAX_COUNT 1024
#define DATAPROC_MAX_BATCH (1u << 22)

typedef struct dataproc_service_s dataproc_service_t;

/* The samples one request may ask for: dataproc.max_batch_samples, or when
 * it is 0 the job's batch_size (at least DATAPROC_MIN_LIMIT, what the
 * benchmarks ask for), never more than DATAPROC_MAX_BATCH. */
#define DATAPROC_MIN_LIMIT 16384u
uint32_t dataproc_max_batch(const cfg_t *cfg);

/* Every request the processor accepts is small (a batch number, a size,
 * ranges): the server's gRPC receive limit. */
#define DATAPROC_MAX_REQUEST (1u << 20)

/* Registers the handlers on server and metrics on reg; requests for more
 * than max_batch samples are refused.  src stays the caller's and must
 * outlive the service.  Loop thread. */
int dataproc_service_create(uv_loop_t *loop, rpc_server_t *server, data_source_t *src, const char *dataset,
                            uint32_t max_batch, metrics_registry_t *reg, dataproc_service_t **out);
void dataproc_service_destroy(dataproc_service_t *svc);

#endif
