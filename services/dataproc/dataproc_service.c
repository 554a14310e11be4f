/*
 * dataproc_service: see dataproc_service.h.
 *
 * A request is checked before any sample is read: batch_size within
 * [1, max_batch] (dataproc.max_batch_samples), the schema fingerprint
 * present (never 0) and equal to ours.  The messages themselves are small;
 * the server's gRPC receive limit (DATAPROC_MAX_REQUEST) refuses anything
 * larger from its length.
 */
#include "dataproc_service.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "batch_pb.h"
#include "clock.h"
#include "dataproc.pb-c.h"
#include "dpc.h"
#include "err.h"
#include "log.h"
#include "proc.h"

struct dataproc_service_s {
  uv_loop_t *loop;
  data_source_t *src;
  char *dataset;
  uint64_t schema_hash;
  uint32_t max_batch;
  uint32_t depth; /* batches a stream keeps between build and transport */
  uint64_t served;
  metrics_counter_t *batches, *samples, *errors, *streams;
  metrics_hist_t *build_seconds;
  metrics_gauge_t *open_streams;
};

static int split_of(Chanter__Dataproc__V1__Split s) { return s == CHANTER__DATAPROC__V1__SPLIT__TEST ? DATA_TEST : DATA_TRAIN; }

/* Checks what every batch request carries; 0 or -EINVAL/ERR_LAYOUT + why. */
static int check_req(dataproc_service_t *svc, uint32_t batch_size, uint64_t schema_hash, char *why, size_t n) {
  if (batch_size == 0) {
    snprintf(why, n, "batch_size %u is outside [1, %u]", batch_size, svc->max_batch);
    return -EINVAL;
  }
  if (batch_size > svc->max_batch) {
    snprintf(why, n,
             "batch_size %u is more than dataproc.max_batch_samples = %u allows (0 there means the job's "
             "batch_size, at least %u)",
             batch_size, svc->max_batch, DATAPROC_MIN_LIMIT);
    return -E2BIG;
  }
  if (schema_hash == 0) {
    snprintf(why, n, "schema_hash 0: every client sends its data schema's fingerprint (this processor's is %016llx)",
             (unsigned long long)svc->schema_hash);
    return -EINVAL;
  }
  if (schema_hash != svc->schema_hash) {
    snprintf(why, n,
             "the client's data schema (hash %016llx) differs from this processor's (%016llx): check that both "
             "read the same job configuration (n_dense, table_rows, table_hotness, hash_seed)",
             (unsigned long long)schema_hash, (unsigned long long)svc->schema_hash);
    return ERR_LAYOUT;
  }
  return 0;
}

/* ---- one batch built on the worker pool */

typedef struct build_s {
  uv_work_t req;
  dataproc_service_t *svc;
  int split;
  uint64_t iteration;
  uint32_t batch_size;
  data_batch_t batch;
  int rc;
  char why[512];
  double t0; /* clock_mono_s() when the build was created */
  /* who waits: a unary call, or a stream */
  rpc_call_t *call;
  struct stream_s *stream;
  struct build_s *next; /* the stream's next build, in batch order */
  int finished;         /* its done callback came */
} build_t;

static void build_work(uv_work_t *req) {
  proc_name_thread("dataproc-build"); /* a libuv pool thread: named by its last work */
  build_t *b = req->data;
  b->rc = data_read_batch(b->svc->src, b->split, b->iteration, b->batch_size, &b->batch, b->why, sizeof b->why);
}

static void count_served(dataproc_service_t *svc, build_t *b) {
  svc->served++;
  metrics_counter_inc(svc->batches);
  metrics_counter_add(svc->samples, b->batch.n);
  metrics_hist_observe(svc->build_seconds, clock_mono_s() - b->t0);
}

static build_t *build_new(dataproc_service_t *svc, int split, uint64_t x, uint32_t batch_size) {
  build_t *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->svc = svc;
  b->split = split;
  b->iteration = x;
  b->batch_size = batch_size;
  b->req.data = b;
  b->t0 = clock_mono_s();
  return b;
}

/* ---- GetBatch */

static void get_done(uv_work_t *req, int status) {
  build_t *b = req->data;
  if (status == UV_ECANCELED) b->rc = ERR_SHUTDOWN;
  if (b->rc) {
    metrics_counter_inc(b->svc->errors);
    log_warn("GetBatch failed batch=%llu peer=%s why=\"%s\"", (unsigned long long)b->iteration, rpc_call_peer(b->call), b->why);
    rpc_call_fail(b->call, b->rc, "GetBatch %llu: %s", (unsigned long long)b->iteration, b->why[0] ? b->why : err_str(b->rc));
  } else {
    Chanter__Dataproc__V1__Batch pb;
    batch_pb_encode_batch(&b->batch, &pb);
    count_served(b->svc, b);
    rpc_call_reply(b->call, &pb.base);
  }
  data_batch_free(&b->batch);
  free(b);
}

static void on_get(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  dataproc_service_t *svc = ud;
  const Chanter__Dataproc__V1__GetBatchRequest *r = (const void *)m;
  char why[512];
  int rc = check_req(svc, r->batch_size, r->schema_hash, why, sizeof why);
  if (rc) {
    metrics_counter_inc(svc->errors);
    rpc_call_fail(call, rc, "GetBatch: %s", why);
    return;
  }
  build_t *b = build_new(svc, split_of(r->split), r->iteration, r->batch_size);
  if (!b) {
    rpc_call_fail(call, -ENOMEM, "GetBatch: out of memory");
    return;
  }
  b->call = call;
  if ((rc = uv_queue_work(svc->loop, &b->req, build_work, get_done)) != 0) {
    rpc_call_fail(call, ERR_SHUTDOWN, "GetBatch: cannot queue work: %s", uv_strerror(rc));
    free(b);
  }
}

/* ---- StreamBatches */

typedef struct range_s {
  struct range_s *next;
  int split;
  uint64_t next_x, end;
  uint32_t batch_size;
} range_t;

/* A stream's builds, in batch order (bhead is the next to send): up to
 * svc->depth batches are between "build queued" and "taken by the
 * transport" at once, so several build in parallel while memory stays at
 * depth batches per stream.  A build that finishes early waits in the list
 * for those before it: batches go out in order. */
typedef struct stream_s {
  dataproc_service_t *svc;
  rpc_call_t *call;   /* NULL once the call is over (cancelled, failed, finished) */
  range_t *head, *tail;
  build_t *bhead, *btail;
  uint32_t n_builds;  /* in the list: queued, building or built */
  int half_closed;
  int failed;
} stream_t;

static void stream_free(stream_t *st) {
  while (st->head) {
    range_t *r = st->head;
    st->head = r->next;
    free(r);
  }
  metrics_gauge_add(st->svc->open_streams, -1);
  free(st);
}

/* The call is over: builds not yet started are cancelled (their done
 * callbacks still come, with UV_ECANCELED); the stream is freed once the
 * last build has come back. */
static void stream_drop(stream_t *st) {
  st->call = NULL;
  for (build_t *b = st->bhead; b; b = b->next)
    if (!b->finished) uv_cancel((uv_req_t *)&b->req);
  if (!st->bhead) stream_free(st);
}

static void stream_pump(stream_t *st);

static void stream_done(uv_work_t *req, int status) {
  build_t *b = req->data;
  stream_t *st = b->stream;
  b->finished = 1;
  if (status == UV_ECANCELED) b->rc = ERR_SHUTDOWN;
  /* send what is ready, in order */
  while (st->bhead && st->bhead->finished) {
    b = st->bhead;
    st->bhead = b->next;
    if (!st->bhead) st->btail = NULL;
    st->n_builds--;
    if (st->call && b->rc) {
      metrics_counter_inc(st->svc->errors);
      log_warn("StreamBatches failed batch=%llu peer=%s why=\"%s\"", (unsigned long long)b->iteration,
               rpc_call_peer(st->call), b->why);
      char msg[600];
      snprintf(msg, sizeof msg, "StreamBatches, batch %llu: %s", (unsigned long long)b->iteration,
               b->why[0] ? b->why : err_str(b->rc));
      st->failed = 1;
      rpc_call_finish(st->call, b->rc, msg);
      st->call = NULL;
      for (build_t *o = st->bhead; o; o = o->next)
        if (!o->finished) uv_cancel((uv_req_t *)&o->req);
    } else if (st->call) {
      Chanter__Dataproc__V1__Batch pb;
      batch_pb_encode_batch(&b->batch, &pb);
      count_served(st->svc, b);
      rpc_call_send(st->call, &pb.base); /* packed now: the batch can go */
    }
    data_batch_free(&b->batch);
    free(b);
  }
  if (!st->call) {
    if (!st->bhead) stream_free(st);
    return;
  }
  stream_pump(st);
}

/* Queues builds while the stream has room (svc->depth batches between
 * queued and sent); finishes the stream when the client is done asking and
 * everything was sent. */
static void stream_pump(stream_t *st) {
  if (!st->call || st->failed) return;
  for (;;) {
    while (st->head && st->head->next_x >= st->head->end) {
      range_t *r = st->head;
      st->head = r->next;
      if (!st->head) st->tail = NULL;
      free(r);
    }
    if (!st->head) {
      if (st->half_closed && !st->bhead) {
        rpc_call_finish(st->call, 0, NULL);
        st->call = NULL;
        stream_free(st);
      }
      return;
    }
    if (st->n_builds + rpc_call_queued(st->call) >= st->svc->depth) return; /* stream_done / on_sent call back */
    range_t *r = st->head;
    build_t *b = build_new(st->svc, r->split, r->next_x, r->batch_size);
    if (!b) return;
    b->stream = st;
    if (uv_queue_work(st->svc->loop, &b->req, build_work, stream_done) != 0) {
      free(b);
      return;
    }
    r->next_x++;
    if (st->btail) st->btail->next = b;
    else st->bhead = b;
    st->btail = b;
    st->n_builds++;
  }
}

static void s_open(rpc_call_t *call, void *ud) {
  dataproc_service_t *svc = ud;
  stream_t *st = calloc(1, sizeof *st);
  if (!st) {
    rpc_call_finish(call, -ENOMEM, "StreamBatches: out of memory");
    return;
  }
  st->svc = svc;
  st->call = call;
  metrics_counter_inc(svc->streams);
  metrics_gauge_add(svc->open_streams, 1);
  rpc_call_set_data(call, st);
}

static void s_message(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  dataproc_service_t *svc = ud;
  stream_t *st = rpc_call_get_data(call);
  if (!st || st->failed) return;
  const Chanter__Dataproc__V1__StreamRequest *r = (const void *)m;
  char why[512];
  int rc = check_req(svc, r->batch_size, r->schema_hash, why, sizeof why);
  if (!rc && (r->count == 0 || r->count > DATAPROC_MAX_COUNT)) {
    snprintf(why, sizeof why, "count %u is outside [1, %u]", r->count, DATAPROC_MAX_COUNT);
    rc = -EINVAL;
  }
  if (rc) {
    metrics_counter_inc(svc->errors);
    char msg[600];
    snprintf(msg, sizeof msg, "StreamBatches: %s", why);
    st->failed = 1;
    rpc_call_finish(call, rc, msg);
    stream_drop(st);
    return;
  }
  range_t *q = calloc(1, sizeof *q);
  if (!q) return;
  q->split = split_of(r->split);
  q->next_x = r->first;
  q->end = r->first + r->count;
  q->batch_size = r->batch_size;
  if (st->tail) st->tail->next = q;
  else st->head = q;
  st->tail = q;
  stream_pump(st);
}

static void s_half_close(rpc_call_t *call, void *ud) {
  stream_t *st = rpc_call_get_data(call);
  if (!st) return;
  st->half_closed = 1;
  stream_pump(st);
}

static void s_sent(rpc_call_t *call, void *ud) {
  stream_t *st = rpc_call_get_data(call);
  if (st) stream_pump(st);
}

static void s_cancel(rpc_call_t *call, void *ud) {
  stream_t *st = rpc_call_get_data(call);
  if (!st) return;
  stream_drop(st);
}

static const rpc_stream_handlers_t stream_handlers = {s_open, s_message, s_half_close, s_cancel, s_sent};

/* ---- Info */

static void on_info(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  dataproc_service_t *svc = ud;
  const data_schema_t *s = data_schema(svc->src);
  data_stats_t ds;
  data_stats(svc->src, &ds);
  Chanter__Dataproc__V1__InfoResponse r = CHANTER__DATAPROC__V1__INFO_RESPONSE__INIT;
  r.dataset = svc->dataset;
  r.format = (char *)data_format_name(ds.format);
  r.samples = ds.samples;
  r.train_samples = ds.train_samples;
  r.test_samples = ds.test_samples;
  r.bad_records = ds.bad_records;
  r.n_dense = s->n_dense;
  r.n_tables = s->n_tables;
  r.n_table_rows = s->n_tables;
  r.table_rows = s->table_rows;
  r.n_hotness = s->n_tables;
  r.hotness = s->hotness;
  r.schema_hash = svc->schema_hash;
  r.batches_served = svc->served;
  rpc_call_reply(call, &r.base);
}

uint32_t dataproc_max_batch(const cfg_t *cfg) {
  int64_t m = cfg_int(cfg, "dataproc.max_batch_samples");
  if (m == 0) {
    m = cfg_int(cfg, "batch_size");
    if (m < DATAPROC_MIN_LIMIT) m = DATAPROC_MIN_LIMIT;
  }
  return m > DATAPROC_MAX_BATCH ? DATAPROC_MAX_BATCH : (uint32_t)m;
}

uint32_t dataproc_build_threads(const cfg_t *cfg) {
  int64_t n = cfg_int(cfg, "dataproc.build_threads");
  if (n == 0) {
    n = (int64_t)uv_available_parallelism();
    if (n > DATAPROC_MAX_AUTO_THREADS) n = DATAPROC_MAX_AUTO_THREADS;
  }
  return n < 1 ? 1 : (uint32_t)n;
}

int dataproc_service_create(uv_loop_t *loop, rpc_server_t *server, data_source_t *src, const char *dataset,
                            uint32_t max_batch, uint32_t build_threads, metrics_registry_t *reg,
                            dataproc_service_t **out) {
  dataproc_service_t *svc = calloc(1, sizeof *svc);
  if (!svc) return -ENOMEM;
  svc->loop = loop;
  svc->src = src;
  svc->max_batch = max_batch ? max_batch : 1;
  svc->depth = build_threads > DATAPROC_STREAM_WINDOW ? build_threads : DATAPROC_STREAM_WINDOW;
  svc->dataset = strdup(dataset);
  svc->schema_hash = dpc_schema_hash(data_schema(src));
  svc->batches = metrics_counter(reg, "batches_served_total", NULL, "batches sent to clients");
  svc->samples = metrics_counter(reg, "samples_served_total", NULL, "samples sent to clients");
  svc->errors = metrics_counter(reg, "errors_total", NULL, "requests answered with an error");
  svc->streams = metrics_counter(reg, "streams_total", NULL, "StreamBatches calls opened");
  svc->open_streams = metrics_gauge(reg, "open_streams", NULL, "StreamBatches calls open now");
  svc->build_seconds = metrics_histogram(reg, "batch_build_seconds", NULL, "time to read and decode one batch",
                                         metrics_latency_bounds, metrics_latency_n);
  rpc_method_t methods[] = {
      {.name = "GetBatch", .unary = on_get, .ud = svc},
      {.name = "StreamBatches", .stream = &stream_handlers, .ud = svc},
      {.name = "Info", .unary = on_info, .ud = svc},
  };
  int rc = rpc_server_add_service(server, &chanter__dataproc__v1__data_proc__descriptor, methods, 3);
  if (rc) {
    dataproc_service_destroy(svc);
    return rc;
  }
  *out = svc;
  return 0;
}

void dataproc_service_destroy(dataproc_service_t *svc) {
  if (!svc) return;
  free(svc->dataset);
  free(svc);
}
