/*
 * rpc_call: the sending side of a server call (see rpc_server.c for the
 * receiving side and the server).  What a handler calls to answer --
 * rpc_call_reply, rpc_call_fail, rpc_call_send, rpc_call_finish -- the
 * batches that carry a stream's messages one at a time and then the
 * status, and a call's reference count (rpc_server.c's header says who
 * holds references).  Loop thread only, like the rest of the server.
 */
#include "rpc_server_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rpc__call_free(rpc_call_t *c) {
  rpc_server_t *s = c->srv;
  if (s && c->accepted) {
    if (c->prev) c->prev->next = c->next;
    else s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_relaxed);
  }
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->req_md);
  if (c->generic) grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  while (c->q_head) {
    sendq_t *q = c->q_head;
    c->q_head = q->next;
    grpc_byte_buffer_destroy(q->bb);
    free(q);
  }
  if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
  grpc_slice_unref(c->status_msg);
  free(c->peer);
  if (c->generic) gpr_free(c->path);
  free(c);
}

void rpc__call_unref(rpc_call_t *c) {
  ASSERT(c->refs > 0);
  if (--c->refs == 0) rpc__call_free(c);
}

/* A batch may start only while the call and the queue can still take it. */
static int can_send(const rpc_call_t *c) {
  return c->srv && !c->srv->cq_shut && c->call && !c->cancelled;
}

int rpc__call_start_batch(rpc_call_t *c, const grpc_op *ops, size_t n, rpc__tag_t *tag) {
  if (!c->srv || c->srv->cq_shut || !c->call) return ERR_SHUTDOWN;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK) {
    log_error("rpc: grpc_call_start_batch failed method=%s err=%d", c->path, (int)e);
    return ERR_RPC;
  }
  c->refs++;
  return 0;
}

void rpc__call_drop_queue(rpc_call_t *c) {
  while (c->q_head) {
    sendq_t *q = c->q_head;
    c->q_head = q->next;
    grpc_byte_buffer_destroy(q->bb);
    free(q);
  }
  c->q_tail = NULL;
}

/* Sends [initial metadata,] [message,] status: the last batch of a call. */
void rpc__call_start_final(rpc_call_t *c, grpc_byte_buffer *bb, int code, const char *msg) {
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    c->md_sent = 1;
  }
  if (bb) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
  }
  if (msg && *msg) {
    grpc_slice_unref(c->status_msg);
    c->status_msg = grpc_slice_from_copied_string(msg);
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)code;
  ops[n].data.send_status_from_server.status_details = &c->status_msg;
  n++;
  c->status_started = 1;
  c->send_bb = bb;
  if (rpc__call_start_batch(c, ops, n, &c->tag_send) == 0) c->send_busy = 1;
  else {
    c->send_bb = NULL;
    if (bb) grpc_byte_buffer_destroy(bb);
  }
}

/* Streams: start the next queued write, or the status once the queue is
 * empty and the handler has finished. */
void rpc__call_pump(rpc_call_t *c) {
  if (c->send_busy || c->status_started) return;
  if (!can_send(c)) {
    rpc__call_drop_queue(c);
    return;
  }
  if (c->q_head) {
    sendq_t *q = c->q_head;
    grpc_op ops[2];
    size_t n = 0;
    c->q_head = q->next;
    if (!c->q_head) c->q_tail = NULL;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
      ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
      c->md_sent = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = q->bb;
    n++;
    c->send_bb = q->bb;
    free(q);
    if (rpc__call_start_batch(c, ops, n, &c->tag_send) == 0) c->send_busy = 1;
    else {
      grpc_byte_buffer_destroy(c->send_bb);
      c->send_bb = NULL;
      rpc__call_drop_queue(c);
    }
  } else if (c->finish_req) {
    rpc__call_start_final(c, NULL, c->status_code, NULL);
  }
}

void rpc__call_on_send(rpc__tag_t *t, int ok) {
  rpc_call_t *c = rpc__container_of(t, rpc_call_t, tag_send);
  int was_msg = c->send_bb != NULL && !c->status_started; /* a stream message, not the status */
  c->send_busy = 0;
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  c->send_bb = NULL;
  if (was_msg && c->queued) c->queued--;
  if (!ok) {
    rpc__call_drop_queue(c);
    c->queued = 0;
  } else {
    rpc__call_pump(c);
    /* backpressure: tell a producing handler there is room again */
    if (was_msg && c->m && c->m->stream && c->m->stream->on_sent && !c->app_done && !c->cancelled)
      c->m->stream->on_sent(c, c->m->ud);
  }
  rpc__call_unref(c);
}

void rpc_call_reply(rpc_call_t *c, const ProtobufCMessage *resp) {
  if (c->app_done) {
    log_error("rpc: second answer to one call ignored method=%s", c->path);
    return;
  }
  if (c->m && c->m->stream) {
    log_error("rpc: rpc_call_reply on a stream method=%s; use rpc_call_send/finish", c->path);
    rpc_call_send(c, resp);
    rpc_call_finish(c, 0, NULL);
    return;
  }
  c->app_done = 1;
  /* pack first: resp often points into the request */
  if (can_send(c)) rpc__call_start_final(c, rpc__pack(resp), GRPC_STATUS_OK, NULL);
  if (c->req) { /* the handler is done with it */
    protobuf_c_message_free_unpacked(c->req, NULL);
    c->req = NULL;
  }
  rpc__call_unref(c);
}

void rpc_call_fail(rpc_call_t *c, int err, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  int code = err_grpc_status(err);
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (code == GRPC_STATUS_OK) code = GRPC_STATUS_UNKNOWN; /* a failure must not read as OK */
  if (c->m && c->m->stream) {
    rpc_call_finish(c, err ? err : ERR_RPC, buf);
    return;
  }
  if (c->app_done) {
    log_error("rpc: second answer to one call ignored method=%s", c->path);
    return;
  }
  c->app_done = 1;
  if (c->req) {
    protobuf_c_message_free_unpacked(c->req, NULL);
    c->req = NULL;
  }
  log_debug("rpc call failed method=%s peer=%s code=%d msg=\"%s\"", c->path, c->peer, code, buf);
  if (can_send(c)) rpc__call_start_final(c, NULL, code, buf);
  rpc__call_unref(c);
}

size_t rpc_call_queued(const rpc_call_t *c) { return c->queued; }

int rpc_call_send(rpc_call_t *c, const ProtobufCMessage *msg) {
  if (c->app_done || c->finish_req || !can_send(c)) return -EPIPE;
  sendq_t *q = malloc(sizeof *q);
  if (!q) return -ENOMEM;
  q->bb = rpc__pack(msg);
  q->next = NULL;
  c->queued++;
  if (c->q_tail) c->q_tail->next = q;
  else c->q_head = q;
  c->q_tail = q;
  rpc__call_pump(c);
  return 0;
}

void rpc_call_finish(rpc_call_t *c, int err, const char *msg) {
  if (c->app_done) {
    log_error("rpc: second finish of one call ignored method=%s", c->path);
    return;
  }
  if (c->m && c->m->unary) {
    if (err == 0) {
      log_error("rpc: rpc_call_finish(OK) on unary method=%s; use rpc_call_reply", c->path);
      err = ERR_RPC;
    }
    rpc_call_fail(c, err, "%s", msg ? msg : err_str(err));
    return;
  }
  c->app_done = 1;
  c->finish_req = 1;
  c->status_code = err ? err_grpc_status(err) : GRPC_STATUS_OK;
  if (err && c->status_code == GRPC_STATUS_OK) c->status_code = GRPC_STATUS_UNKNOWN;
  if (msg && *msg) {
    grpc_slice_unref(c->status_msg);
    c->status_msg = grpc_slice_from_copied_string(msg);
  }
  rpc__call_pump(c);
  rpc__call_unref(c);
}

const char *rpc_call_method(const rpc_call_t *c) { return c->path ? c->path : ""; }
const char *rpc_call_peer(const rpc_call_t *c) { return c->peer ? c->peer : ""; }
void *rpc_call_get_data(rpc_call_t *c) { return c->data; }
void rpc_call_set_data(rpc_call_t *c, void *p) { c->data = p; }

int64_t rpc_call_deadline_ms(const rpc_call_t *c) {
  if (c->deadline.tv_sec == INT64_MAX || c->deadline.clock_type == GPR_TIMESPAN) return INT64_MAX;
  gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
  return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}
