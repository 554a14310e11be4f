/*
 * dataproc_service: the chanter.dataproc.v1.DataProc RPC handlers.
 *
 * GetBatch and Info are unary; StreamBatches serves ranges of batches in
 * order with backpressure: a stream keeps at most max(DATAPROC_STREAM_WINDOW,
 * build threads) batches between "build queued" and "taken by the
 * transport", so with several build threads the next batches of one stream
 * build in parallel (each a pure function, so the bytes sent are the same
 * whatever the thread count) and go out in order.  Building a batch
 * (parsing, hashing, generating) runs on libuv's worker pool, sized to
 * dataproc.build_threads by main.c (UV_THREADPOOL_SIZE, before the pool's
 * first use); replies are sent from the loop thread.  A cancelled stream's
 * builds not yet started are cancelled, those running are dropped when
 * they end.  Nothing is cached: a batch is a pure function of
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

/* Threads that build batches: dataproc.build_threads, or when it is 0 the
 * CPUs this process may use, at most DATAPROC_MAX_AUTO_THREADS; >= 1. */
#define DATAPROC_MAX_AUTO_THREADS 8u
uint32_t dataproc_build_threads(const cfg_t *cfg);

/* Every request the processor accepts is small (a batch number, a size,
 * ranges): the server's gRPC receive limit. */
#define DATAPROC_MAX_REQUEST (1u << 20)

/* Registers the handlers on server and metrics on reg; requests for more
 * than max_batch samples are refused; build_threads (the worker pool's
 * size) sets how many batches a stream builds ahead.  src stays the
 * caller's and must outlive the service.  Loop thread. */
int dataproc_service_create(uv_loop_t *loop, rpc_server_t *server, data_source_t *src, const char *dataset,
                            uint32_t max_batch, uint32_t build_threads, metrics_registry_t *reg,
                            dataproc_service_t **out);
void dataproc_service_destroy(dataproc_service_t *svc);

#endif
