/*
 * rpc_server: the server half of rpc.h.
 *
 * One completion queue per server, drained by a poller thread that only
 * moves (tag, ok) pairs onto a mutex-protected queue and wakes the loop
 * with uv_async_send.  Everything else -- accepting calls, running
 * handlers, starting batches, freeing calls -- happens on the loop thread,
 * so no call state needs a lock.
 *
 * A call is reference counted: one reference per batch in flight plus one
 * for the handler until it answers (reply/fail/finish) or is told the call
 * was cancelled.  The last reference unrefs the grpc_call and frees it.
 *
 * This file holds the receiving side (the poller, accepting a call,
 * authorizing it, its messages and half-close) and the server's life;
 * rpc_call.c the sending side (what a handler answers with, and the
 * reference count); rpc_server_internal.h the structures both use.
 */
#include "rpc_server_internal.h"

#include "authz.h"
#include "err.h"
#include "log.h"
#include "proc.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Calls requested ahead per method: this many can arrive at once without
 * waiting for the loop to re-request; more simply queue inside gRPC. */
#define REQUESTS_PER_METHOD 16
#define REQUESTS_GENERIC 2

/* On a server stream, gRPC core reports a client's cancel (RST_STREAM,
 * deadline, cancel_all_calls) exactly like a half-close: RECV_MESSAGE
 * completes OK with no message, and RECV_CLOSE_ON_SERVER says "cancelled"
 * a moment later (both come from one transport event).  So an end of
 * messages waits this long for the cancel before it is reported as
 * on_half_close: the handler then hears on_cancel instead of taking a
 * cancelled stream for a completed one. */
#define HALF_CLOSE_SETTLE_MS 5

static void on_request(rpc__tag_t *t, int ok);
static void on_close(rpc__tag_t *t, int ok);
static void on_recv(rpc__tag_t *t, int ok);
static void on_shutdown(rpc__tag_t *t, int ok);
static void hc_deliver(rpc_call_t *c, int cancel);

/* ---------------------------------------------------------------- poller */

static void post(rpc_server_t *s, rpc__tag_t *tag, int ok) {
  pthread_mutex_lock(&s->mu);
  if (s->n_evs == s->cap_evs) {
    size_t ncap = s->cap_evs ? s->cap_evs * 2 : 256;
    event_t *n = realloc(s->evs, ncap * sizeof *n);
    ASSERT(n != NULL); /* losing a completion would leak or hang a call */
    s->evs = n;
    s->cap_evs = ncap;
  }
  s->evs[s->n_evs++] = (event_t){tag, ok};
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->async);
}

static void poller_main(void *arg) {
  proc_name_thread("rpc-server-cq");
  rpc_server_t *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) {
      post(s, NULL, 0);
      return;
    }
    if (ev.type == GRPC_OP_COMPLETE) post(s, ev.tag, ev.success);
  }
}

static void finish_shutdown(rpc_server_t *s) {
  /* the server is gone: streams still settling were not going to finish */
  while (s->hc_head) hc_deliver(s->hc_head, 1);
  uv_timer_stop(&s->settle);
  uv_thread_join(&s->poller);
  s->poller_started = 0;
  grpc_server_destroy(s->server);
  s->server = NULL;
  grpc_completion_queue_destroy(s->cq);
  s->cq = NULL;
  s->state = S_DOWN;
  log_info("rpc server stopped port=%d", s->port);
  if (s->done_cb) s->done_cb(s, s->done_ud);
}

/* Runs on the loop for every uv_async_send (coalesced): takes everything
 * the poller has queued so far and dispatches it in order.  Whatever is
 * posted meanwhile comes with its own uv_async_send, hence a new call. */
static void on_async(uv_async_t *h) {
  rpc_server_t *s = h->data;
  pthread_mutex_lock(&s->mu);
  event_t *evs = s->evs;
  size_t n = s->n_evs, cap = s->cap_evs;
  s->evs = s->work;
  s->cap_evs = s->cap_work;
  s->n_evs = 0;
  s->work = evs;
  s->cap_work = cap;
  pthread_mutex_unlock(&s->mu);
  for (size_t i = 0; i < n; i++) {
    if (!evs[i].tag) {
      finish_shutdown(s); /* the last event this queue will ever give */
      return;
    }
    evs[i].tag->fn(evs[i].tag, evs[i].ok);
  }
  if (s->done_pending) { /* shutdown of a server that never ran */
    s->done_pending = 0;
    if (s->done_cb) s->done_cb(s, s->done_ud);
  }
}

/* ----------------------------------------------------------------- calls */

static void start_recv(rpc_call_t *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  rpc__call_start_batch(c, &op, 1, &c->tag_recv);
}

/* The layer ends a stream itself (a message that does not parse): the
 * handler hears on_cancel, the client gets the status. */
static void stream_abort(rpc_call_t *c, int code, const char *msg) {
  c->app_done = 1;
  if (c->m->stream->on_cancel) c->m->stream->on_cancel(c, c->m->ud);
  c->finish_req = 1;
  c->status_code = code;
  grpc_slice_unref(c->status_msg);
  c->status_msg = grpc_slice_from_copied_string(msg);
  rpc__call_pump(c);
  rpc__call_unref(c); /* the handler's reference */
}

/* The roles the caller's certificate names: each subjectAltName URI
 * chanter://role/<role> (authz.h); 0 for none, or no certificate. */
static unsigned call_roles(grpc_call *call) {
  grpc_auth_context *ctx = grpc_call_auth_context(call);
  if (!ctx) return 0;
  unsigned roles = 0;
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_SAN_PROPERTY_NAME);
  const grpc_auth_property *p;
  char buf[128];
  while ((p = grpc_auth_property_iterator_next(&it)) != NULL) {
    if (!p->value || p->value_length >= sizeof buf) continue;
    memcpy(buf, p->value, p->value_length);
    buf[p->value_length] = 0;
    roles |= authz_role_of_uri(buf);
  }
  grpc_auth_context_release(ctx);
  return roles;
}

/* 0 when the caller may call c's method; else the call is answered
 * PERMISSION_DENIED with the sentence authz_check wrote, counted, and
 * logged (at most once a second, with the number left out). */
static int deny_call(rpc_call_t *c) {
  rpc_server_t *s = c->srv;
  char why[256], role[64];
  unsigned roles = call_roles(c->call);
  if (authz_check(c->path, roles, why, sizeof why) == 0) return 0;
  uint64_t n = atomic_fetch_add_explicit(&s->denied, 1, memory_order_relaxed) + 1;
  uint64_t now = uv_now(s->loop);
  if (n == 1 || now - s->last_deny_log_ms >= 1000) {
    authz_roles_str(roles, role, sizeof role);
    log_warn("refused a call (PERMISSION_DENIED) method=%s peer=%s role=%s: %s; refused so far=%" PRIu64
             " (%" PRIu64 " not logged)",
             c->path, c->peer, roles ? role : "none", why, n, n - 1 - s->denied_logged);
    s->denied_logged = n;
    s->last_deny_log_ms = now;
  }
  c->app_done = 1;
  rpc__call_start_final(c, NULL, GRPC_STATUS_PERMISSION_DENIED, why);
  return 1;
}

/* Decodes c->payload (consumed) and runs the unary handler, or answers
 * why not. */
static void run_unary(rpc_call_t *c) {
  size_t n = 0;
  if (!c->payload) {
    rpc_call_fail(c, ERR_BADMSG, "no request message for %s", c->path);
    return;
  }
  c->req = rpc__unpack(c->m->input, c->payload, &n);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  if (!c->req)
    rpc_call_fail(c, ERR_BADMSG, "cannot parse the request of %s as %s (%zu bytes)", c->path, c->m->input->name, n);
  else
    c->m->unary(c, c->req, c->m->ud);
}

static void accept_call(rpc_call_t *c) {
  rpc_server_t *s = c->srv;
  grpc_op op;
  char buf[512];

  c->accepted = 1;
  c->next = s->calls;
  if (s->calls) s->calls->prev = c;
  s->calls = c;
  atomic_fetch_add_explicit(&s->inflight, 1, memory_order_relaxed);
  c->refs = 2; /* the handler's, and ours until this function returns */
  char *p = grpc_call_get_peer(c->call);
  c->peer = strdup(p ? p : "unknown");
  gpr_free(p);
  if (c->generic) {
    c->path = grpc_slice_to_c_string(c->details.method);
    c->deadline = c->details.deadline;
  } else {
    c->path = c->m->path;
  }

  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  rpc__call_start_batch(c, &op, 1, &c->tag_close);

  if (!c->generic && s->authorize && deny_call(c)) {
    rpc__call_unref(c); /* the handler's reference: no handler runs */
  } else if (c->generic) {
    snprintf(buf, sizeof buf, "unknown method %s on this server", c->path ? c->path : "?");
    c->app_done = 1;
    rpc__call_start_final(c, NULL, GRPC_STATUS_UNIMPLEMENTED, buf);
    rpc__call_unref(c);
  } else if (c->m->unary && s->authorize) {
    start_recv(c); /* read only now that the caller may call it: on_recv runs it */
  } else if (c->m->unary) {
    run_unary(c);
  } else {
    if (c->m->stream->on_open) c->m->stream->on_open(c, c->m->ud);
    if (!c->app_done) start_recv(c);
  }
  rpc__call_unref(c);
}

static void request_one(rpc_server_t *s, method_t *m) {
  rpc_call_t *c = calloc(1, sizeof *c);
  grpc_call_error e;
  if (!c) {
    log_error("rpc: out of memory requesting a call");
    return;
  }
  c->srv = s;
  c->m = m;
  c->generic = m == NULL;
  c->status_msg = grpc_empty_slice();
  c->tag_req.fn = on_request;
  c->tag_close.fn = on_close;
  c->tag_recv.fn = on_recv;
  c->tag_send.fn = rpc__call_on_send;
  grpc_metadata_array_init(&c->req_md);
  if (m) {
    e = grpc_server_request_registered_call(s->server, m->handle, &c->call, &c->deadline, &c->req_md,
                                            m->unary && !s->authorize ? &c->payload : NULL, s->cq, s->cq,
                                            &c->tag_req);
  } else {
    grpc_call_details_init(&c->details);
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->req_md, s->cq, s->cq,
                                 &c->tag_req);
  }
  if (e != GRPC_CALL_OK) {
    log_error("rpc: cannot request a call method=%s err=%d", m ? m->path : "*", (int)e);
    rpc__call_free(c);
  }
}

static void on_request(rpc__tag_t *t, int ok) {
  rpc_call_t *c = rpc__container_of(t, rpc_call_t, tag_req);
  rpc_server_t *s = c->srv;
  if (!ok) { /* the server is shutting down: the request was never matched */
    rpc__call_free(c);
    return;
  }
  if (s->state == S_RUNNING) request_one(s, c->m);
  accept_call(c);
}

static void on_close(rpc__tag_t *t, int ok) {
  rpc_call_t *c = rpc__container_of(t, rpc_call_t, tag_close);
  if (!ok || c->close_cancelled) {
    c->cancelled = 1;
    if (!c->send_busy) rpc__call_drop_queue(c);
    if (c->hc_pending) {
      hc_deliver(c, 1);
    } else if (!c->app_done && c->m && c->m->stream) {
      c->app_done = 1;
      if (c->m->stream->on_cancel) c->m->stream->on_cancel(c, c->m->ud);
      rpc__call_unref(c); /* the handler's reference */
    } else if (!c->app_done && c->m && c->m->unary) {
      /* The handler is still working on a call nobody waits for.  Let the
       * grpc_call go now so that shutdown need not wait for the handler;
       * its reply will be dropped. */
      grpc_call_unref(c->call);
      c->call = NULL;
    }
  }
  rpc__call_unref(c);
}

static void hc_remove(rpc_server_t *s, rpc_call_t *c) {
  rpc_call_t **pp = &s->hc_head, *prev = NULL;
  while (*pp && *pp != c) {
    prev = *pp;
    pp = &(*pp)->hc_next;
  }
  ASSERT(*pp == c);
  *pp = c->hc_next;
  if (s->hc_tail == c) s->hc_tail = prev;
  c->hc_next = NULL;
  c->hc_pending = 0;
}

/* Takes the half-close of c out of the settle list: delivers it as a
 * half-close (cancel = 0) or a cancel, and drops the recv reference. */
static void hc_deliver(rpc_call_t *c, int cancel) {
  hc_remove(c->srv, c);
  if (!c->app_done) {
    if (cancel || c->cancelled) {
      c->app_done = 1;
      if (c->m->stream->on_cancel) c->m->stream->on_cancel(c, c->m->ud);
      rpc__call_unref(c); /* the handler's reference */
    } else if (c->m->stream->on_half_close) {
      c->m->stream->on_half_close(c, c->m->ud);
    }
  }
  rpc__call_unref(c); /* the recv reference */
}

static void settle_cb(uv_timer_t *t) {
  rpc_server_t *s = t->data;
  uint64_t now = uv_now(s->loop);
  while (s->hc_head && s->hc_head->hc_due <= now) hc_deliver(s->hc_head, 0);
  if (s->hc_head) uv_timer_start(&s->settle, settle_cb, s->hc_head->hc_due - now, 0);
}

static void on_recv(rpc__tag_t *t, int ok) {
  rpc_call_t *c = rpc__container_of(t, rpc_call_t, tag_recv);
  grpc_byte_buffer *bb = c->payload;
  const rpc_stream_handlers_t *h = c->m->stream;
  if (c->m->unary) { /* the request of an authorized unary call (accept_call) */
    if (ok && !c->cancelled && c->call) {
      run_unary(c);
    } else {
      if (bb) grpc_byte_buffer_destroy(bb);
      c->payload = NULL;
      c->app_done = 1;
      rpc__call_unref(c); /* the handler's reference: no handler runs */
    }
    rpc__call_unref(c);
    return;
  }
  c->payload = NULL;
  if (!ok || c->app_done || c->cancelled) {
    /* call over (cancelled, or the handler already finished) */
  } else if (!bb) {
    /* a half-close, or a cancel on its way: keep the recv reference until
     * settle_cb or on_close decides */
    rpc_server_t *s = c->srv;
    c->hc_pending = 1;
    c->hc_due = uv_now(s->loop) + HALF_CLOSE_SETTLE_MS;
    if (s->hc_tail) s->hc_tail->hc_next = c;
    else s->hc_head = c;
    s->hc_tail = c;
    if (!uv_is_active((uv_handle_t *)&s->settle))
      uv_timer_start(&s->settle, settle_cb, HALF_CLOSE_SETTLE_MS, 0);
    return;
  } else {
    size_t n = 0;
    ProtobufCMessage *msg = rpc__unpack(c->m->input, bb, &n);
    if (!msg) {
      char buf[512];
      snprintf(buf, sizeof buf, "cannot parse a message of %s as %s (%zu bytes)", c->path,
               c->m->input->name, n);
      stream_abort(c, GRPC_STATUS_INVALID_ARGUMENT, buf);
    } else {
      if (h->on_message) h->on_message(c, msg, c->m->ud);
      protobuf_c_message_free_unpacked(msg, NULL);
      if (!c->app_done && !c->cancelled) start_recv(c);
    }
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  rpc__call_unref(c);
}

/* -------------------------------------------------------------- server */

static void free_server(rpc_server_t *s) {
  for (size_t i = 0; i < s->n_methods; i++) free(s->methods[i].path);
  free(s->methods);
  free(s->listen);
  free(s->evs);
  free(s->work);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static int make_creds(const rpc_tls_t *tls, grpc_server_credentials **out, int *is_tls) {
  char *ca = NULL, *cert = NULL, *key = NULL;
  int err = 0;
  *out = NULL;
  *is_tls = 0;
  if (!tls->ca_file && !tls->cert_file && !tls->key_file && !tls->require_client_cert) {
    *out = grpc_insecure_server_credentials_create();
    goto out;
  }
  if (!tls->cert_file || !tls->key_file) {
    log_error("rpc: a TLS server needs both cert_file and key_file cert_file=%s key_file=%s",
              tls->cert_file ? tls->cert_file : "(none)", tls->key_file ? tls->key_file : "(none)");
    err = -EINVAL;
    goto out;
  }
  if (tls->require_client_cert && !tls->ca_file) {
    log_error("rpc: require_client_cert needs ca_file to verify client certificates");
    err = -EINVAL;
    goto out;
  }
  if ((err = rpc__read_pem("certificate", tls->cert_file, &cert)) < 0) goto out;
  if ((err = rpc__read_pem("private key", tls->key_file, &key)) < 0) goto out;
  if (tls->ca_file && (err = rpc__read_pem("CA", tls->ca_file, &ca)) < 0) goto out;
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  *out = grpc_ssl_server_credentials_create_ex(
      ca, &pair, 1,
      tls->require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  if (!*out) {
    log_error("rpc: TLS server credentials rejected cert_file=%s key_file=%s", tls->cert_file,
              tls->key_file);
    err = ERR_TLS;
    goto out;
  }
  *is_tls = 1;
out:
  free(ca);
  free(cert);
  if (key) {
    memset(key, 0, strlen(key));
    free(key);
  }
  return err;
}

static void on_grace(uv_timer_t *t) {
  rpc_server_t *s = t->data;
  if (s->notified || s->state != S_SHUTTING) return;
  log_warn("rpc server grace period over, cancelling calls port=%d inflight=%" PRIu64, s->port,
           rpc_server_inflight(s));
  grpc_server_cancel_all_calls(s->server);
}

int rpc_server_create(uv_loop_t *loop, const rpc_server_opts_t *opts, rpc_server_t **out) {
  rpc_server_t *s = NULL;
  int err = 0;
  *out = NULL;
  if (!opts || !opts->listen) return -EINVAL;
  rpc_global_init();
  s = calloc(1, sizeof *s);
  if (!s || !(s->listen = strdup(opts->listen))) {
    err = -ENOMEM;
    goto out;
  }
  pthread_mutex_init(&s->mu, NULL);
  s->loop = loop;
  s->state = S_CREATED;
  s->tag_shutdown.fn = on_shutdown;
  if ((err = make_creds(&opts->tls, &s->creds, &s->tls)) < 0) goto out;
  if (opts->authorize && !(s->tls && opts->tls.require_client_cert)) {
    log_error("rpc: authorization by role needs mutual TLS (a certificate, a CA and require_client_cert) listen=%s",
              opts->listen);
    err = -EINVAL;
    goto out;
  }
  s->authorize = opts->authorize;

  int max = rpc__max_msg(opts->max_message_bytes);
  int max_rx = opts->max_receive_bytes ? rpc__max_msg(opts->max_receive_bytes) : max;
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = max_rx}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = max}},
      /* notice clients that vanished without closing their connection */
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 30000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 10000}},
      /* accept the clients' keepalive pings (rpc_client.c pings every 20 s) */
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, {.integer = 10000}},
      /* no SO_REUSEPORT: a second daemon on a taken port must fail to
       * start, not silently share the port's connections */
      {GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
  };
  grpc_channel_args cargs = {sizeof args / sizeof args[0], args};
  s->server = grpc_server_create(&cargs, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);

  uv_async_init(loop, &s->async, on_async);
  s->async.data = s;
  uv_timer_init(loop, &s->grace);
  s->grace.data = s;
  uv_timer_init(loop, &s->settle);
  s->settle.data = s;
  s->open_handles = 3;
  *out = s;
  s = NULL;
out:
  if (s) {
    if (s->creds) grpc_server_credentials_release(s->creds);
    if (s->listen) pthread_mutex_destroy(&s->mu);
    free(s->listen);
    free(s);
  }
  if (err) rpc_global_shutdown();
  return err;
}

int rpc_server_add_service(rpc_server_t *s, const ProtobufCServiceDescriptor *desc,
                           const rpc_method_t *methods, size_t n_methods) {
  ASSERT(s->state == S_CREATED);
  for (size_t i = 0; i < n_methods; i++) {
    const rpc_method_t *rm = &methods[i];
    const ProtobufCMethodDescriptor *md = NULL;
    for (unsigned j = 0; j < desc->n_methods; j++)
      if (strcmp(desc->methods[j].name, rm->name) == 0) md = &desc->methods[j];
    if (!md) {
      log_error("rpc: service %s has no method %s", desc->name, rm->name);
      return -EINVAL;
    }
    if (!rm->unary == !rm->stream) {
      log_error("rpc: method %s.%s needs exactly one of unary / stream", desc->name, rm->name);
      return -EINVAL;
    }
    method_t *nm = realloc(s->methods, (s->n_methods + 1) * sizeof *nm);
    if (!nm) return -ENOMEM;
    s->methods = nm;
    method_t *m = &s->methods[s->n_methods];
    memset(m, 0, sizeof *m);
    size_t plen = strlen(desc->name) + strlen(md->name) + 3;
    if (!(m->path = malloc(plen))) return -ENOMEM;
    snprintf(m->path, plen, "/%s/%s", desc->name, md->name);
    m->input = md->input;
    m->unary = rm->unary;
    m->stream = rm->stream;
    m->ud = rm->ud;
    m->handle = grpc_server_register_method(
        s->server, m->path, NULL,
        /* with authorization, a unary request is read after the caller's
         * role is checked (accept_call): a caller who may not call the
         * method is refused before gRPC reads more than its window */
        rm->unary && !s->authorize ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER : GRPC_SRM_PAYLOAD_NONE, 0);
    if (!m->handle) {
      log_error("rpc: cannot register method=%s (registered twice?)", m->path);
      free(m->path);
      return -EEXIST;
    }
    s->n_methods++;
  }
  return 0;
}

int rpc_server_start(rpc_server_t *s) {
  ASSERT(s->state == S_CREATED);
  s->port = grpc_server_add_http2_port(s->server, s->listen, s->creds);
  grpc_server_credentials_release(s->creds);
  s->creds = NULL;
  if (s->port <= 0) {
    log_error("rpc: cannot listen on addr=%s (in use, or not a local address?)", s->listen);
    s->port = 0;
    return ERR_UNAVAILABLE;
  }
  grpc_server_start(s->server);
  if (uv_thread_create(&s->poller, poller_main, s) != 0) {
    log_error("rpc: cannot start the server poller thread");
    /* still needs a shutdown to be destroyed: leave it RUNNING */
    s->state = S_RUNNING;
    return -EAGAIN;
  }
  s->poller_started = 1;
  s->state = S_RUNNING;
  for (size_t i = 0; i < s->n_methods; i++)
    for (int k = 0; k < REQUESTS_PER_METHOD; k++) request_one(s, &s->methods[i]);
  for (int k = 0; k < REQUESTS_GENERIC; k++) request_one(s, NULL);
  log_info("rpc server listening addr=%s port=%d tls=%s authz=%s methods=%zu", s->listen, s->port,
           s->tls ? "on" : "off", s->authorize ? "roles" : "off", s->n_methods);
  return 0;
}

int rpc_server_port(const rpc_server_t *s) { return s->port; }

uint64_t rpc_server_denied(const rpc_server_t *s) {
  return atomic_load_explicit(&((rpc_server_t *)s)->denied, memory_order_relaxed);
}

uint64_t rpc_server_inflight(const rpc_server_t *s) {
  return atomic_load_explicit(&((rpc_server_t *)s)->inflight, memory_order_relaxed);
}

static void on_shutdown(rpc__tag_t *t, int ok) {
  rpc_server_t *s = rpc__container_of(t, rpc_server_t, tag_shutdown);
  s->notified = 1;
  uv_timer_stop(&s->grace);
  /* Every call has ended on the wire; once the batches still in the queue
   * drain, next() says SHUTDOWN and the poller posts the final event. */
  s->cq_shut = 1;
  grpc_completion_queue_shutdown(s->cq);
}

void rpc_server_shutdown(rpc_server_t *s, int grace_ms, void (*done_cb)(rpc_server_t *, void *),
                         void *ud) {
  ASSERT(s->state == S_CREATED || s->state == S_RUNNING);
  s->done_cb = done_cb;
  s->done_ud = ud;
  if (!s->poller_started) {
    /* never started (or its poller failed to): nothing to drain here,
     * rpc_server_destroy() cleans up; answer from the loop all the same */
    s->state = S_DOWN;
    s->done_pending = 1;
    uv_async_send(&s->async);
    return;
  }
  s->state = S_SHUTTING;
  log_info("rpc server draining port=%d inflight=%" PRIu64 " grace_ms=%d", s->port,
           rpc_server_inflight(s), grace_ms);
  s->shutdown_called = 1;
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->tag_shutdown);
  if (grace_ms <= 0) grpc_server_cancel_all_calls(s->server);
  else uv_timer_start(&s->grace, on_grace, (uint64_t)grace_ms, 0);
}

static void on_handle_closed(uv_handle_t *h) {
  rpc_server_t *s = h->data;
  if (--s->open_handles == 0) free_server(s);
}

void rpc_server_destroy(rpc_server_t *s) {
  if (!s) return;
  ASSERT(s->state == S_CREATED || s->state == S_DOWN);
  ASSERT(!s->poller_started);
  if (s->server) {
    /* never started, or failed to start: no poller owns the queue */
    if (s->port > 0 && !s->shutdown_called) {
      s->shutdown_called = 1;
      grpc_server_shutdown_and_notify(s->server, s->cq, &s->tag_shutdown);
      grpc_server_cancel_all_calls(s->server);
    }
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    s->server = NULL;
    s->cq = NULL;
  }
  if (s->creds) grpc_server_credentials_release(s->creds);
  s->creds = NULL;
  /* Unary calls whose handler still has not answered: their grpc_call is
   * gone already (on_close), the answer will only free them. */
  for (rpc_call_t *c = s->calls; c; c = c->next) c->srv = NULL;
  s->calls = NULL;
  uv_close((uv_handle_t *)&s->async, on_handle_closed);
  uv_close((uv_handle_t *)&s->grace, on_handle_closed);
  uv_close((uv_handle_t *)&s->settle, on_handle_closed);
  rpc_global_shutdown();
}
