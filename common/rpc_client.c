/*
 * rpc_client: the client half of rpc.h.
 *
 * Blocking calls and streams each get their own pluck completion queue,
 * so they work from any thread without a poller.  Asynchronous unary calls
 * share one process-wide completion queue drained by one poller thread,
 * started by the first rpc_unary_async and stopped when the last channel
 * is destroyed (after the calls still in flight have completed).
 */
#include "rpc_internal.h"

#include "clock.h"
#include "err.h"
#include "log.h"
#include "proc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RPC_RECONNECT_MAX_MS 4000

struct rpc_channel_s {
  grpc_channel *ch;
  char *target;
};

/* ------------------------------------------------ the shared poller */

static pthread_mutex_t c_mu = PTHREAD_MUTEX_INITIALIZER;
static int c_channels;
static int c_running;
static grpc_completion_queue *c_cq;
static pthread_t c_thread;

static void *client_poller(void *arg) {
  proc_name_thread("rpc-client-cq");
  grpc_completion_queue *cq = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE) {
      rpc__tag_t *t = ev.tag;
      t->fn(t, ev.success);
    }
  }
  return NULL;
}

static grpc_completion_queue *client_cq(void) {
  grpc_completion_queue *cq = NULL;
  pthread_mutex_lock(&c_mu);
  if (!c_running) {
    c_cq = grpc_completion_queue_create_for_next(NULL);
    if (pthread_create(&c_thread, NULL, client_poller, c_cq) != 0) {
      log_error("rpc: cannot start the client poller thread");
      grpc_completion_queue_shutdown(c_cq);
      grpc_completion_queue_destroy(c_cq);
      c_cq = NULL;
      goto out;
    }
    c_running = 1;
  }
  cq = c_cq;
out:
  pthread_mutex_unlock(&c_mu);
  return cq;
}

static void poller_stop_locked(void) {
  if (!c_running) return;
  /* Destroying the last channel from an async callback would join the
   * thread we are on. */
  ASSERT(!pthread_equal(pthread_self(), c_thread));
  grpc_completion_queue_shutdown(c_cq); /* next() says SHUTDOWN once calls in flight are done */
  pthread_join(c_thread, NULL);
  grpc_completion_queue_destroy(c_cq);
  c_cq = NULL;
  c_running = 0;
}

void rpc__client_poller_stop(void) {
  pthread_mutex_lock(&c_mu);
  poller_stop_locked();
  pthread_mutex_unlock(&c_mu);
}

/* ---------------------------------------------------------- channel */

int rpc_channel_create(const char *target, const rpc_tls_t *tls, size_t max_message_bytes,
                       rpc_channel_t **out) {
  rpc_channel_t *ch = NULL;
  grpc_channel_credentials *creds = NULL;
  char *ca = NULL, *cert = NULL, *key = NULL;
  int err = 0, use_tls;
  *out = NULL;
  rpc_global_init();
  use_tls = tls && (tls->ca_file || tls->cert_file || tls->key_file || tls->server_name_override);
  if (!use_tls) {
    creds = grpc_insecure_credentials_create();
  } else {
    if (!tls->cert_file != !tls->key_file) {
      log_error("rpc: a TLS client certificate needs both cert_file and key_file target=%s",
                target);
      err = -EINVAL;
      goto out;
    }
    if (tls->ca_file && (err = rpc__read_pem("CA", tls->ca_file, &ca)) < 0) goto out;
    if (tls->cert_file && (err = rpc__read_pem("certificate", tls->cert_file, &cert)) < 0) goto out;
    if (tls->key_file && (err = rpc__read_pem("private key", tls->key_file, &key)) < 0) goto out;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!creds) {
      log_error("rpc: TLS client credentials rejected target=%s", target);
      err = ERR_TLS;
      goto out;
    }
  }
  int max = rpc__max_msg(max_message_bytes);
  grpc_arg args[8] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = max}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = max}},
      /* while calls are open, ping every 20 s so a peer that vanished
       * without closing the connection fails them within ~30 s */
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 20000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 10000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
      /* a peer cut off for a while (a restart, a link down) is tried again at
       * most RPC_RECONNECT_MAX_MS apart: gRPC's own backoff (1 s, x1.6, up to
       * 120 s) left a trainer cut off for 6 s rejoining 30 s later */
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = RPC_RECONNECT_MAX_MS}},
  };
  size_t nargs = 6;
  if (use_tls && tls->server_name_override) {
    args[nargs].type = GRPC_ARG_STRING;
    args[nargs].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[nargs].value.string = (char *)tls->server_name_override;
    nargs++;
  }
  grpc_channel_args cargs = {nargs, args};
  ch = calloc(1, sizeof *ch);
  if (!ch || !(ch->target = strdup(target))) {
    err = -ENOMEM;
    goto out;
  }
  ch->ch = grpc_channel_create(target, creds, &cargs);
  pthread_mutex_lock(&c_mu);
  c_channels++;
  pthread_mutex_unlock(&c_mu);
  *out = ch;
  ch = NULL;
out:
  if (creds) grpc_channel_credentials_release(creds);
  if (ch) free(ch->target);
  free(ch);
  free(ca);
  free(cert);
  if (key) {
    memset(key, 0, strlen(key));
    free(key);
  }
  if (err) rpc_global_shutdown();
  return err;
}

void rpc_channel_destroy(rpc_channel_t *ch) {
  if (!ch) return;
  grpc_channel_destroy(ch->ch);
  free(ch->target);
  free(ch);
  pthread_mutex_lock(&c_mu);
  if (--c_channels == 0) poller_stop_locked();
  pthread_mutex_unlock(&c_mu);
  rpc_global_shutdown();
}

/* ------------------------------------------------------------ unary */

typedef struct ucall_s {
  rpc__tag_t tag;
  grpc_call *call;
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array init_md, trail_md;
  grpc_status_code status;
  grpc_slice details;
  const ProtobufCMessageDescriptor *resp_desc;
  const char *path;
  rpc_unary_done_cb cb;
  void *ud;
} ucall_t;

static void ucall_init(ucall_t *u, const char *path, grpc_byte_buffer *bb,
                       const ProtobufCMessageDescriptor *resp_desc) {
  memset(u, 0, sizeof *u);
  u->path = path;
  u->send_bb = bb;
  u->resp_desc = resp_desc;
  u->details = grpc_empty_slice();
  grpc_metadata_array_init(&u->init_md);
  grpc_metadata_array_init(&u->trail_md);
}

static void ucall_cleanup(ucall_t *u) {
  if (u->call) grpc_call_unref(u->call);
  if (u->send_bb) grpc_byte_buffer_destroy(u->send_bb);
  if (u->recv_bb) grpc_byte_buffer_destroy(u->recv_bb);
  grpc_metadata_array_destroy(&u->init_md);
  grpc_metadata_array_destroy(&u->trail_md);
  grpc_slice_unref(u->details);
}

static grpc_call *create_call(rpc_channel_t *ch, grpc_completion_queue *cq, const char *path,
                              gpr_timespec deadline) {
  grpc_slice method = grpc_slice_from_copied_string(path);
  grpc_call *call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method,
                                             NULL, deadline, NULL);
  grpc_slice_unref(method);
  return call;
}

/* Creates a unary call and starts its single batch; 0 or a negative code
 * (st set, when given).  ref (may be NULL): a
 * reference of the caller's own to the call, taken before the batch
 * starts (its completion may free u at once). */
static int ucall_start(rpc_channel_t *ch, grpc_completion_queue *cq, ucall_t *u, int64_t timeout_ms,
                       rpc_status_t *st, grpc_call **ref) {
  grpc_op ops[6];
  if (!u->path || u->path[0] != '/') {
    rpc__set_status_str(st, GRPC_STATUS_INVALID_ARGUMENT, "method path must be \"/pkg.Service/Method\"");
    return -EINVAL;
  }
  if (timeout_ms <= 0) timeout_ms = RPC__DEFAULT_UNARY_TIMEOUT_MS;
  u->call = create_call(ch, cq, u->path, rpc__deadline(timeout_ms));
  if (!u->call) {
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, "cannot create call");
    return ERR_RPC;
  }
  if (ref) {
    grpc_call_ref(u->call);
    *ref = u->call;
  }
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = u->send_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->init_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &u->recv_bb;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &u->trail_md;
  ops[5].data.recv_status_on_client.status = &u->status;
  ops[5].data.recv_status_on_client.status_details = &u->details;
  grpc_call_error e = grpc_call_start_batch(u->call, ops, 6, &u->tag, NULL);
  if (e != GRPC_CALL_OK) {
    log_error("rpc: grpc_call_start_batch failed method=%s err=%d", u->path, (int)e);
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, "cannot start call");
    if (ref) {
      grpc_call_unref(*ref);
      *ref = NULL;
    }
    return ERR_RPC;
  }
  return 0;
}

/* The outcome of a completed unary batch. */
static int ucall_result(ucall_t *u, int ok, ProtobufCMessage **resp, rpc_status_t *st) {
  char buf[256];
  *resp = NULL;
  if (!ok) { /* does not happen for a batch with RECV_STATUS_ON_CLIENT */
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, "call batch failed");
    return ERR_RPC;
  }
  rpc__set_status(st, u->status, &u->details);
  if (u->status != GRPC_STATUS_OK) return err_from_grpc_status(u->status);
  if (!u->recv_bb) {
    snprintf(buf, sizeof buf, "%s answered OK without a message", u->path);
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, buf);
    return ERR_BADMSG;
  }
  size_t n = 0;
  *resp = rpc__unpack(u->resp_desc, u->recv_bb, &n);
  if (!*resp) {
    snprintf(buf, sizeof buf, "cannot parse the response of %s as %s (%zu bytes)", u->path,
             u->resp_desc->name, n);
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, buf);
    return ERR_BADMSG;
  }
  return 0;
}

/* A blocking unary call of an already packed request (owned: freed here). */
/* abort (may be NULL): checked every 100 ms while the call is out; once
 * set, the call is cancelled (a write-back a fenced server holds for a
 * checkpoint that will never come must not keep a stopping daemon
 * waiting for the whole deadline). */
static int unary_blocking(rpc_channel_t *ch, const char *path, grpc_byte_buffer *req,
                          const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                          ProtobufCMessage **resp, rpc_status_t *st, const volatile int *abort) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  ucall_t u;
  ucall_init(&u, path, req, resp_desc);
  *resp = NULL;
  int err = ucall_start(ch, cq, &u, timeout_ms, st, NULL);
  if (err == 0) {
    grpc_event ev;
    int cancelled = 0;
    for (;;) {
      gpr_timespec until = abort && !cancelled ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(100, GPR_TIMESPAN))
                                               : gpr_inf_future(GPR_CLOCK_REALTIME);
      ev = grpc_completion_queue_pluck(cq, &u.tag, until, NULL);
      if (ev.type != GRPC_QUEUE_TIMEOUT) break;
      if (*abort) {
        grpc_call_cancel(u.call, NULL);
        cancelled = 1;
      }
    }
    err = ucall_result(&u, ev.success, resp, st);
    if (cancelled && st) snprintf(st->message, sizeof st->message, "given up: this daemon is stopping");
  }
  ucall_cleanup(&u);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, &u.tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return err;
}

int rpc_unary_raw(rpc_channel_t *ch, const char *path, const void *req_bytes, size_t len,
                  const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                  ProtobufCMessage **resp, rpc_status_t *st) {
  return unary_blocking(ch, path, rpc__bytes(req_bytes, len), resp_desc, timeout_ms, resp, st, NULL);
}

int rpc_unary(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
              ProtobufCMessage **resp, rpc_status_t *st) {
  return unary_blocking(ch, path, rpc__pack(req), resp_desc, timeout_ms, resp, st, NULL);
}

int rpc_unary_retry(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, ProtobufCMessage **resp,
                    rpc_status_t *st) {
  return rpc_unary_retry_abortable(ch, path, req, resp_desc, timeout_ms, resp, st, NULL);
}

int rpc_unary_retry_abortable(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, ProtobufCMessage **resp,
                              rpc_status_t *st, const volatile int *abort) {
  int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 30000), backoff = 20;
  for (;;) {
    if (abort && *abort) {
      if (st) snprintf(st->message, sizeof st->message, "given up: this daemon is stopping");
      return ERR_CANCELLED;
    }
    int64_t left = deadline - clock_mono_ms();
    if (st) memset(st, 0, sizeof *st);
    int rc = unary_blocking(ch, path, rpc__pack(req), resp_desc, left > 1 ? left : 1, resp, st, abort);
    if (abort && *abort && rc) {
      if (st) snprintf(st->message, sizeof st->message, "given up: this daemon is stopping");
      return ERR_CANCELLED;
    }
    if (rc != ERR_UNAVAILABLE || clock_mono_ms() + backoff >= deadline) return rc;
    struct timespec ts = {backoff / 1000, (backoff % 1000) * 1000000};
    nanosleep(&ts, NULL);
    if (backoff < 1000) backoff *= 2;
  }
}

static void async_done(rpc__tag_t *t, int ok) {
  ucall_t *u = rpc__container_of(t, ucall_t, tag);
  rpc_status_t st;
  ProtobufCMessage *resp = NULL;
  int err = ucall_result(u, ok, &resp, &st);
  u->cb(err, resp, &st, u->ud);
  ucall_cleanup(u);
  free(u);
}

int rpc_unary_async_h(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, rpc_unary_done_cb cb, void *ud,
                      rpc_async_t **h) {
  if (h) *h = NULL;
  grpc_completion_queue *cq = client_cq();
  if (!cq) return -EAGAIN;
  ucall_t *u = malloc(sizeof *u);
  if (!u) return -ENOMEM;
  ucall_init(u, path, rpc__pack(req), resp_desc);
  u->tag.fn = async_done;
  u->cb = cb;
  u->ud = ud;
  grpc_call *call = NULL;
  int err = ucall_start(ch, cq, u, timeout_ms, NULL, h ? &call : NULL);
  if (err) {
    ucall_cleanup(u);
    free(u);
    return err;
  }
  if (h) *h = (rpc_async_t *)call; /* our reference: the call outlives u */
  return 0;
}

int rpc_unary_async(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                    rpc_unary_done_cb cb, void *ud) {
  return rpc_unary_async_h(ch, path, req, resp_desc, timeout_ms, cb, ud, NULL);
}

void rpc_async_cancel(rpc_async_t *h) {
  if (h) grpc_call_cancel((grpc_call *)h, NULL);
}

void rpc_async_release(rpc_async_t *h) {
  if (h) grpc_call_unref((grpc_call *)h);
}

/* ---------------------------------------------------------- streams */

struct rpc_stream_s {
  grpc_call *call;
  grpc_completion_queue *cq;
  const ProtobufCMessageDescriptor *resp_desc;
  char *path;
  rpc__tag_t t_md, t_write, t_read, t_status; /* plucked, fn unused */
  grpc_metadata_array init_md, trail_md;
  int got_init_md;
  int writes_closed;
  int read_ended;
  grpc_status_code status;
  grpc_slice details;
  pthread_mutex_t status_mu; /* reader and finish may both wait for the status */
  int status_started, status_done;
};

static grpc_event pluck(rpc_stream_t *s, rpc__tag_t *t) {
  return grpc_completion_queue_pluck(s->cq, t, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

static void wait_status(rpc_stream_t *s) {
  pthread_mutex_lock(&s->status_mu);
  if (s->status_started && !s->status_done) {
    pluck(s, &s->t_status);
    s->status_done = 1;
  }
  pthread_mutex_unlock(&s->status_mu);
}

static int status_err(const rpc_stream_t *s) {
  if (!s->status_done) return ERR_RPC;
  return err_from_grpc_status(s->status);
}

int rpc_stream_open(rpc_channel_t *ch, const char *path, const ProtobufCMessageDescriptor *resp_desc,
                    int64_t timeout_ms, rpc_stream_t **out) {
  grpc_op op;
  int err = 0;
  rpc_stream_t *s = NULL;
  *out = NULL;
  if (!path || path[0] != '/') return -EINVAL;
  s = calloc(1, sizeof *s);
  if (!s || !(s->path = strdup(path))) {
    free(s);
    return -ENOMEM;
  }
  s->resp_desc = resp_desc;
  s->details = grpc_empty_slice();
  grpc_metadata_array_init(&s->init_md);
  grpc_metadata_array_init(&s->trail_md);
  pthread_mutex_init(&s->status_mu, NULL);
  s->cq = grpc_completion_queue_create_for_pluck(NULL);
  s->call = create_call(ch, s->cq, path, rpc__deadline(timeout_ms));
  if (!s->call) {
    err = ERR_RPC;
    goto out;
  }
  /* The status is received for the whole life of the call. */
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &s->trail_md;
  op.data.recv_status_on_client.status = &s->status;
  op.data.recv_status_on_client.status_details = &s->details;
  if (grpc_call_start_batch(s->call, &op, 1, &s->t_status, NULL) != GRPC_CALL_OK) {
    err = ERR_RPC;
    goto out;
  }
  s->status_started = 1;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  if (grpc_call_start_batch(s->call, &op, 1, &s->t_md, NULL) != GRPC_CALL_OK) {
    err = ERR_RPC;
    goto out;
  }
  if (!pluck(s, &s->t_md).success) {
    wait_status(s);
    err = status_err(s);
    if (!err) err = ERR_RPC;
    log_debug("rpc: stream open failed method=%s code=%d", path, (int)s->status);
    goto out;
  }
  *out = s;
  s = NULL;
out:
  if (s) rpc_stream_destroy(s);
  return err;
}

int rpc_stream_write(rpc_stream_t *s, const ProtobufCMessage *msg) {
  grpc_op op;
  if (s->writes_closed) return -EPIPE;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = rpc__pack(msg);
  int err = 0;
  if (grpc_call_start_batch(s->call, &op, 1, &s->t_write, NULL) != GRPC_CALL_OK) err = -EPIPE;
  else if (!pluck(s, &s->t_write).success) err = -EPIPE;
  grpc_byte_buffer_destroy(op.data.send_message.send_message);
  return err;
}

int rpc_stream_writes_done(rpc_stream_t *s) {
  grpc_op op;
  if (s->writes_closed) return -EPIPE;
  s->writes_closed = 1;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (grpc_call_start_batch(s->call, &op, 1, &s->t_write, NULL) != GRPC_CALL_OK) return -EPIPE;
  return pluck(s, &s->t_write).success ? 0 : -EPIPE;
}

int rpc_stream_read(rpc_stream_t *s, ProtobufCMessage **msg) {
  grpc_op ops[2];
  grpc_byte_buffer *bb = NULL;
  size_t n = 0;
  *msg = NULL;
  if (!s->read_ended) {
    memset(ops, 0, sizeof ops);
    if (!s->got_init_md) {
      ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
      ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
      n++;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &bb;
    n++;
    if (grpc_call_start_batch(s->call, ops, n, &s->t_read, NULL) != GRPC_CALL_OK) {
      s->read_ended = 1;
    } else {
      int ok = pluck(s, &s->t_read).success;
      s->got_init_md = 1;
      if (!ok || !bb) s->read_ended = 1;
    }
  }
  if (s->read_ended) {
    if (bb) grpc_byte_buffer_destroy(bb);
    /* the server's end of messages comes with its status */
    wait_status(s);
    int err = status_err(s);
    return err ? err : 1;
  }
  size_t len = 0;
  *msg = rpc__unpack(s->resp_desc, bb, &len);
  grpc_byte_buffer_destroy(bb);
  if (!*msg) {
    log_warn("rpc: cannot parse a stream message method=%s type=%s bytes=%zu", s->path,
             s->resp_desc->name, len);
    return ERR_BADMSG;
  }
  return 0;
}

int rpc_stream_finish(rpc_stream_t *s, rpc_status_t *st) {
  wait_status(s);
  if (!s->status_done) {
    rpc__set_status_str(st, GRPC_STATUS_INTERNAL, "stream never started");
    return ERR_RPC;
  }
  rpc__set_status(st, s->status, &s->details);
  return status_err(s);
}

void rpc_stream_cancel(rpc_stream_t *s) {
  if (s->call) grpc_call_cancel(s->call, NULL);
}

void rpc_stream_destroy(rpc_stream_t *s) {
  if (!s) return;
  if (s->call) {
    if (!s->status_done) grpc_call_cancel(s->call, NULL);
    wait_status(s);
    grpc_call_unref(s->call);
  }
  grpc_completion_queue_shutdown(s->cq);
  while (pluck(s, &s->t_md).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(s->cq);
  grpc_metadata_array_destroy(&s->init_md);
  grpc_metadata_array_destroy(&s->trail_md);
  grpc_slice_unref(s->details);
  pthread_mutex_destroy(&s->status_mu);
  free(s->path);
  free(s);
}
