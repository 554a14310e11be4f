/*
 * rpc: protobuf-c messages over the gRPC core C API, integrated with libuv.
 *
 * Every daemon serves and calls RPCs through this module; nothing else in
 * the tree includes grpc/grpc.h, and every grpc_call_error / status shape is
 * converted to the project's error codes (err.h) here.
 *
 * Threading.
 *  - Server: one completion queue per server and one poller thread that
 *    blocks in grpc_completion_queue_next() and hands each completed tag to
 *    the server's uv loop (mutex-protected queue + uv_async_send, drained
 *    whole because uv_async_send coalesces).  Every handler runs on the loop
 *    thread, and every rpc_call_* / rpc_server_* function except
 *    rpc_server_port() and rpc_server_inflight() must be called on the loop
 *    thread (rpc_server_create/add_service/start may instead be called
 *    before the loop starts running, e.g. before its thread is created).
 *    Handlers that do
 *    slow work hand it to a worker (uv_queue_work) and reply from the
 *    after_work_cb, which runs on the loop thread.
 *  - Client: channels are thread-safe.  Blocking calls (rpc_unary,
 *    rpc_stream_*) may be made from any thread except a server's loop
 *    thread (they would block the loop); each uses its own pluck queue.
 *    Asynchronous calls (rpc_unary_async) complete on one process-wide
 *    client poller thread, started on first use and stopped when the last
 *    channel is destroyed; keep their callbacks short (post to your own
 *    loop with uv_async_send if there is work to do).
 *  - rpc_global_init()/rpc_global_shutdown() are refcounted and may be
 *    called from any thread; create/destroy every server and channel
 *    between a matching pair.
 *
 * Errors: functions return 0 or a negative errno / project code.  A status
 * received from a peer becomes err_from_grpc_status(code) (ERR_DEADLINE,
 * ERR_UNAVAILABLE, -EINVAL, ...); a status we send is err_grpc_status(err).
 */
#ifndef CHANTER_RPC_H
#define CHANTER_RPC_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* TLS settings for a server or a channel.  All NULL/0 = plaintext.  The
 * strings are read during rpc_server_create / rpc_channel_create and not
 * kept. */
typedef struct rpc_tls_s {
  const char *ca_file;              /* PEM roots used to verify the peer */
  const char *cert_file;            /* our certificate chain (PEM) */
  const char *key_file;             /* our private key (PEM) */
  int require_client_cert;          /* server: mutual TLS, refuse clients without a valid cert */
  const char *server_name_override; /* client: expected name in server cert (tests use "localhost") */
} rpc_tls_t;

/* grpc_init() on the first call (refcounted).  Returns 0.  Any thread. */
int rpc_global_init(void);
/* Drops one reference; the last one stops the client poller thread (if
 * still running) and calls grpc_shutdown().  Any thread, but not while a
 * server or channel still exists. */
void rpc_global_shutdown(void);

/* ------------------------------------------------------------------ */
/* Server                                                              */
/* ------------------------------------------------------------------ */

typedef struct rpc_server_s rpc_server_t;
typedef struct rpc_call_s rpc_call_t;

/* Unary handler: runs on the loop thread.  `req` is owned by the call and
 * freed after the reply is sent.  Must eventually call rpc_call_reply() or
 * rpc_call_fail() exactly once, possibly later (asynchronously, e.g. from a
 * uv_queue_work after_work_cb) -- always on the loop thread.  If the client
 * goes away first, the reply is simply discarded; the call stays valid
 * until it is answered. */
typedef void (*rpc_unary_cb)(rpc_call_t *call, const ProtobufCMessage *req, void *ud);

/* Streaming (bidi) handlers, all on the loop thread: on_open when the call
 * arrives, on_message for each client message (msg freed after the callback
 * returns), on_half_close when the client is done sending, on_cancel when
 * the client went away / the deadline passed / the server is shutting down
 * past its grace / a client message failed to unpack (the layer then
 * answers INVALID_ARGUMENT itself).  After on_cancel the call is dead: do
 * not use it; it is freed by the layer.
 * After the handler calls rpc_call_finish() no further handler runs (not
 * even on_cancel) and the layer frees the call once the status is sent.
 * So exactly one of "the handler called rpc_call_finish" and "on_cancel
 * ran" happens to every call: free per-call state (rpc_call_set_data) at
 * that point.
 * gRPC core reports a client's cancel like a half-close followed by the
 * cancel; the layer holds an end of messages back for a few milliseconds
 * (HALF_CLOSE_SETTLE_MS in rpc_server.c) so that such a cancel arrives as
 * on_cancel, not as on_half_close.
 * Any handler may be NULL. */
typedef struct rpc_stream_handlers_s {
  void (*on_open)(rpc_call_t *call, void *ud);
  void (*on_message)(rpc_call_t *call, const ProtobufCMessage *msg, void *ud);
  void (*on_half_close)(rpc_call_t *call, void *ud);
  void (*on_cancel)(rpc_call_t *call, void *ud);
  /* Optional: a queued message was written to the transport (one call per
   * message).  With rpc_call_queued() this is the backpressure of a
   * producing handler: keep a few messages queued, produce more here. */
  void (*on_sent)(rpc_call_t *call, void *ud);
} rpc_stream_handlers_t;

typedef struct rpc_method_s {
  const char *name;                   /* method name as in the .proto, e.g. "Lookup" */
  rpc_unary_cb unary;                 /* exactly one of unary / stream */
  const rpc_stream_handlers_t *stream; /* kept by pointer: must outlive the server */
  void *ud;
} rpc_method_t;

typedef struct rpc_server_opts_s {
  const char *listen;       /* "127.0.0.1:0" => pick a free port */
  rpc_tls_t tls;
  size_t max_message_bytes; /* 0 => 256 MiB; both directions */
  /* the largest request this server accepts (0 => max_message_bytes): gRPC
   * refuses a larger message (RESOURCE_EXHAUSTED) from its length prefix,
   * before the handler runs */
  size_t max_receive_bytes;
  /* check every call's role against its method (authz.h): the role is the
   * chanter://role/<role> URI in the client's certificate; a call the
   * table does not allow is answered PERMISSION_DENIED before any handler
   * or decoding runs.  Needs mutual TLS (-EINVAL otherwise). */
  int authorize;
} rpc_server_opts_t;

/* Creates a server whose handlers run on `loop`.  Reads the TLS files now:
 * a missing or unreadable PEM file is logged with its name and returns
 * -errno of the open (-ENOENT, -EACCES), ERR_TLS for a file without a PEM
 * block, -EINVAL for an incomplete rpc_tls_t (cert without key, mutual TLS
 * without ca_file).  On success 0 and *out, which the caller destroys with
 * rpc_server_destroy().  The server's uv handles keep the loop alive until
 * then.  Loop thread, or before the loop runs. */
int rpc_server_create(uv_loop_t *loop, const rpc_server_opts_t *opts, rpc_server_t **out);

/* Registers every method of a protobuf-c service descriptor (paths
 * "/<desc->name>/<method>").  methods[] lists handlers by name (copied; the
 * strings need not outlive the call); a method of the service without a
 * handler answers UNIMPLEMENTED; a handler naming no method of the service
 * is -EINVAL.  Before rpc_server_start() only.  Returns 0 or -errno. */
int rpc_server_add_service(rpc_server_t *s, const ProtobufCServiceDescriptor *desc,
                           const rpc_method_t *methods, size_t n_methods);

/* Binds the listen address, starts the server and its poller thread and
 * requests the first calls.  Returns 0, or ERR_UNAVAILABLE when the address
 * cannot be bound (then shut down / destroy it as usual).  Loop thread, or
 * before the loop runs. */
int rpc_server_start(rpc_server_t *s);

/* The bound port (after rpc_server_start), 0 before.  Any thread. */
int rpc_server_port(const rpc_server_t *s);
/* Calls refused by authorization so far.  Any thread. */
uint64_t rpc_server_denied(const rpc_server_t *s);

/* Graceful shutdown: stop accepting, let in-flight calls finish (up to
 * grace_ms, then cancel them: streams get on_cancel, late unary replies are
 * discarded), then done_cb(s, ud) on the loop thread; after that
 * rpc_server_destroy().  The loop must keep running until done_cb.
 * Loop thread; once only. */
void rpc_server_shutdown(rpc_server_t *s, int grace_ms, void (*done_cb)(rpc_server_t *, void *),
                         void *ud);

/* Frees the server.  After done_cb of rpc_server_shutdown() (done_cb itself
 * may call it), or on a server that was never started.  Closes the
 * server's uv handles (their close callbacks need one more turn of the
 * loop before the loop can be closed; the memory itself is freed by those
 * callbacks).  A unary handler still holding a call after this may still
 * answer it: the answer only frees the call.  Loop thread. */
void rpc_server_destroy(rpc_server_t *s);

/* Calls accepted and not yet finished.  Any thread (a relaxed read). */
uint64_t rpc_server_inflight(const rpc_server_t *s);

/* ---- On a call (loop thread only) ---- */

/* Unary: answers OK + resp (packed now; resp stays the caller's). */
void rpc_call_reply(rpc_call_t *call, const ProtobufCMessage *resp);

/* Unary or stream: answers with a non-OK status.  err is a project code or
 * negative errno, mapped with err_grpc_status(); the printf message should
 * say what a person can do about it.  For a stream this is
 * rpc_call_finish(call, err, message). */
void rpc_call_fail(rpc_call_t *call, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Stream: queues a message (packed now; msg stays the caller's).  Writes go
 * out one at a time, in order.  Returns 0, -EPIPE after finish/cancel, or
 * -ENOMEM. */
int rpc_call_send(rpc_call_t *call, const ProtobufCMessage *msg);

/* Stream: messages queued by rpc_call_send() and not yet written to the
 * transport (including the one in flight).  Loop thread. */
size_t rpc_call_queued(const rpc_call_t *call);

/* Stream: ends the call with status err (0 = OK; else mapped with
 * err_grpc_status()) and an optional message, after the queued sends flush.
 * Once only. */
void rpc_call_finish(rpc_call_t *call, int err, const char *msg);

/* "/chanter.testing.v1.Testing/Echo"; owned by the call. */
const char *rpc_call_method(const rpc_call_t *call);
/* "ipv4:127.0.0.1:5555"; owned by the call. */
const char *rpc_call_peer(const rpc_call_t *call);
/* Milliseconds left before the client's deadline (may be <= 0), INT64_MAX
 * if the client set none. */
int64_t rpc_call_deadline_ms(const rpc_call_t *call);
/* One pointer of handler state per call (NULL at first). */
void *rpc_call_get_data(rpc_call_t *call);
void rpc_call_set_data(rpc_call_t *call, void *p);

/* ------------------------------------------------------------------ */
/* Client                                                              */
/* ------------------------------------------------------------------ */

typedef struct rpc_channel_s rpc_channel_t;
typedef struct rpc_status_s {
  int code;          /* grpc_status_code */
  char message[512]; /* the peer's (or gRPC's) status message, NUL-terminated */
} rpc_status_t;

/* A channel to target ("host:port"); tls NULL or all-zero = plaintext
 * (TLS with ca_file NULL verifies against the system roots).
 * max_message_bytes 0 => 256 MiB, both directions.  Connects lazily; calls
 * made while the peer is unreachable fail fast with ERR_UNAVAILABLE.
 * Returns 0 and *out (free with rpc_channel_destroy), -errno (-ENOENT...) /
 * ERR_TLS for a missing / bad PEM file (logged with its name).  Any
 * thread. */
int rpc_channel_create(const char *target, const rpc_tls_t *tls, size_t max_message_bytes,
                       rpc_channel_t **out);
/* Frees the channel.  Its streams must be destroyed and its blocking calls
 * returned.  Async calls still in flight complete and run their callbacks;
 * destroying the last channel stops the client poller thread, waiting for
 * those callbacks first.  Any thread but the client poller (i.e. not from
 * an rpc_unary_done_cb). */
void rpc_channel_destroy(rpc_channel_t *ch);

/* Blocking unary call on any thread.  path = "/chanter.embedding.v1.Embedding/Lookup"
 * (rpc_method_path(desc, "Lookup") builds it).  timeout_ms <= 0 means 30 s.
 * On success returns 0 and *resp (caller frees with
 * protobuf_c_message_free_unpacked(*resp, NULL)).  On failure returns a
 * negative project code (err_from_grpc_status of the status: ERR_DEADLINE,
 * ERR_UNAVAILABLE, ...; ERR_BADMSG for a response that failed to unpack)
 * and fills *st (may be NULL) with the gRPC code and message; -EINVAL for
 * a path that does not start with '/'. */
int rpc_unary(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
              ProtobufCMessage **resp, rpc_status_t *st);

/* rpc_unary, retried with backoff (20 ms doubling to 1 s) while the peer is
 * unavailable (restarting, not yet listening), until timeout_ms has passed
 * in all.  Other errors return at once.  Lookups, idempotent write-backs
 * and coordinator calls use it so that a daemon restart is not an error. */
int rpc_unary_retry(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, ProtobufCMessage **resp,
                    rpc_status_t *st);
/* The same, giving up (ERR_CANCELLED) once *abort is non-zero: before the
 * next try, and within 100 ms for the call out (it is cancelled) -- a
 * daemon that stops, or a trainer leaving a generation, must not wait out
 * the deadline for a peer that is gone or a write-back a fenced server
 * holds.  abort may be NULL. */
int rpc_unary_retry_abortable(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, ProtobufCMessage **resp,
                              rpc_status_t *st, const volatile int *abort);

/* Like rpc_unary with the request already packed (tests send garbage). */
int rpc_unary_raw(rpc_channel_t *ch, const char *path, const void *req_bytes, size_t len,
                  const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                  ProtobufCMessage **resp, rpc_status_t *st);

/* Async unary: returns 0 immediately (or a negative code, and then cb never
 * runs); cb runs once on the process-wide client poller thread -- possibly
 * before rpc_unary_async returns -- with err (as rpc_unary would return),
 * resp (NULL on error; cb owns it) and the status (valid during cb only).
 * req is packed before the call returns.  Any thread. */
typedef void (*rpc_unary_done_cb)(int err, ProtobufCMessage *resp, const rpc_status_t *st,
                                  void *ud);
/* An async call's handle (rpc_unary_async_h): it may be cancelled while
 * it is out -- cb then runs with ERR_CANCELLED -- and must be released
 * once cb has run. */
typedef struct rpc_async_s rpc_async_t;
void rpc_async_cancel(rpc_async_t *h);
void rpc_async_release(rpc_async_t *h);
int rpc_unary_async(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                    rpc_unary_done_cb cb, void *ud);
/* The same, with a handle in *h (NULL when it returns an error). */
int rpc_unary_async_h(rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms, rpc_unary_done_cb cb, void *ud,
                      rpc_async_t **h);

/* "/<desc->name>/<method>", interned: the string lives until the process
 * exits, and equal inputs give the same pointer.  Returns NULL if the
 * service has no such method.  Any thread. */
const char *rpc_method_path(const ProtobufCServiceDescriptor *desc, const char *method);

/* Bidirectional stream, blocking API: one thread may read while another
 * writes (but not two readers or two writers at once). */
typedef struct rpc_stream_s rpc_stream_t;

/* Starts a call; timeout_ms is a whole-stream deadline, <= 0 none.  Returns
 * 0 and *out (free with rpc_stream_destroy) or a negative code. */
int rpc_stream_open(rpc_channel_t *ch, const char *path, const ProtobufCMessageDescriptor *resp_desc,
                    int64_t timeout_ms, rpc_stream_t **out);
/* Sends one message (packed now; msg stays the caller's), blocking until
 * gRPC has taken it (flow control applies).  Returns 0, or -EPIPE when the
 * stream has ended (rpc_stream_read/finish tell why). */
int rpc_stream_write(rpc_stream_t *s, const ProtobufCMessage *msg);
/* Half-closes: no more writes.  Returns 0 or -EPIPE. */
int rpc_stream_writes_done(rpc_stream_t *s);
/* Next message: 0 + *msg (caller frees with protobuf_c_message_free_unpacked),
 * 1 at the clean end of the stream (status OK; then call finish), or < 0:
 * the mapped status when the stream ended with an error (ERR_DEADLINE,
 * ERR_UNAVAILABLE, ERR_CANCELLED...), ERR_BADMSG for a message that failed
 * to unpack.  Blocks until a message or the end arrives. */
int rpc_stream_read(rpc_stream_t *s, ProtobufCMessage **msg);
/* Waits for the final status and fills *st (may be NULL).  Returns 0 or the
 * mapped error.  Call after the read side reached the end (or after
 * rpc_stream_cancel): before that it blocks until the server finishes. */
int rpc_stream_finish(rpc_stream_t *s, rpc_status_t *st);
/* Cancels the call; pending and later reads/writes fail.  Any thread. */
void rpc_stream_cancel(rpc_stream_t *s);
/* Frees the stream (cancelling it if it has not finished).  No other thread
 * may be using it. */
void rpc_stream_destroy(rpc_stream_t *s);

#endif
