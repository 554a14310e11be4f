/*
 * rpc_server_internal: what rpc_server.c (the completion queue, accepting
 * and receiving, the server's life) and rpc_call.c (what a handler sends
 * back: replies, stream messages, statuses) share and nobody else uses:
 * the server and call structures and the call's sending primitives.  All
 * of it runs on the server's loop thread.
 */
#ifndef CHANTER_RPC_SERVER_INTERNAL_H
#define CHANTER_RPC_SERVER_INTERNAL_H

#include "rpc_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

typedef struct method_s {
  char *path;
  const ProtobufCMessageDescriptor *input;
  void *handle; /* from grpc_server_register_method */
  rpc_unary_cb unary;
  const rpc_stream_handlers_t *stream;
  void *ud;
} method_t;

typedef struct event_s {
  rpc__tag_t *tag; /* NULL: the queue has shut down */
  int ok;
} event_t;

typedef struct sendq_s {
  struct sendq_s *next;
  grpc_byte_buffer *bb;
} sendq_t;

enum { S_CREATED, S_RUNNING, S_SHUTTING, S_DOWN };

struct rpc_server_s {
  uv_loop_t *loop;
  grpc_server *server;
  grpc_completion_queue *cq;
  grpc_server_credentials *creds; /* until start */
  char *listen;
  int tls;
  int authorize; /* check each call's role (authz.h) against its method */
  _Atomic uint64_t denied;
  uint64_t denied_logged, last_deny_log_ms; /* loop only: the refusals' log is rate-limited */
  int port;
  int state;
  int cq_shut;  /* grpc_completion_queue_shutdown called: no more batches */
  int notified; /* shutdown tag arrived */
  int shutdown_called;
  int done_pending; /* done_cb owed without a real drain */
  uv_async_t async;
  uv_timer_t grace;
  uv_timer_t settle;           /* delivers half-closes that were not cancels */
  rpc_call_t *hc_head, *hc_tail; /* streams waiting for it, oldest first */
  int open_handles;
  uv_thread_t poller;
  int poller_started;

  pthread_mutex_t mu; /* guards evs/n_evs/cap_evs */
  event_t *evs;
  size_t n_evs, cap_evs;
  event_t *work; /* loop only: the batch being processed */
  size_t cap_work;

  method_t *methods;
  size_t n_methods;
  rpc_call_t *calls; /* accepted and not yet freed */
  _Atomic uint64_t inflight;

  rpc__tag_t tag_shutdown;
  void (*done_cb)(rpc_server_t *, void *);
  void *done_ud;
};

struct rpc_call_s {
  rpc_server_t *srv; /* NULL once the server is destroyed (orphaned unary call) */
  method_t *m;       /* NULL: requested generically, an unknown method */
  rpc_call_t *prev, *next;
  rpc_call_t *hc_next; /* in srv's half-close list */
  uint64_t hc_due;     /* uv_now() when the half-close is delivered */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array req_md;
  grpc_call_details details; /* generic requests only */
  grpc_byte_buffer *payload; /* unary request, then each streamed message */
  ProtobufCMessage *req;     /* unpacked unary request */
  char *peer;
  char *path; /* malloc'd for generic calls, else m->path */
  void *data;
  int refs;
  int close_cancelled; /* written by RECV_CLOSE_ON_SERVER */
  unsigned accepted : 1, generic : 1, app_done : 1, cancelled : 1, send_busy : 1, md_sent : 1,
      finish_req : 1, status_started : 1, hc_pending : 1;
  int status_code;
  grpc_slice status_msg;
  grpc_byte_buffer *send_bb; /* in flight */
  sendq_t *q_head, *q_tail;
  uint32_t queued; /* stream messages queued or in flight */
  rpc__tag_t tag_req, tag_close, tag_recv, tag_send;
};

/* Frees c: unlinks it from its server's calls, releases the grpc_call and
 * everything the call still holds. */
void rpc__call_free(rpc_call_t *c);
/* Drops one reference (a batch's, or the handler's); the last frees c. */
void rpc__call_unref(rpc_call_t *c);
/* Starts a batch on c with tag; takes a reference for it.  0,
 * ERR_SHUTDOWN (the call or the queue is gone) or ERR_RPC. */
int rpc__call_start_batch(rpc_call_t *c, const grpc_op *ops, size_t n, rpc__tag_t *tag);
/* Frees the stream messages still queued. */
void rpc__call_drop_queue(rpc_call_t *c);
/* Sends [initial metadata,] [message bb, taken,] status: the last batch. */
void rpc__call_start_final(rpc_call_t *c, grpc_byte_buffer *bb, int code, const char *msg);
/* Streams: starts the next queued message, or the status once the queue
 * is empty and the handler has finished. */
void rpc__call_pump(rpc_call_t *c);
/* The tag_send completion. */
void rpc__call_on_send(rpc__tag_t *t, int ok);

#endif
