/*
 * test_rpc: the rpc layer against real servers on loopback.
 *
 * A test server runs its uv loop on a background thread and serves
 * chanter.testing.v1.Testing: Echo (answered at once), Sleep (answered from
 * a uv timer: an asynchronous completion) and Chat (bidi: each request is
 * answered by `repeat` responses numbered by seq; OK when the client
 * half-closes).  The "server gone" test runs a server in a child process
 * (this binary re-executed with --child-server) and SIGKILLs it mid-call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "rpc.h"
#include "testing.pb-c.h"

extern char **environ;

typedef Chanter__Testing__V1__EchoRequest EchoReq;
typedef Chanter__Testing__V1__EchoResponse EchoResp;
typedef Chanter__Testing__V1__SleepRequest SleepReq;
typedef Chanter__Testing__V1__SleepResponse SleepResp;
#define SVC (&chanter__testing__v1__testing__descriptor)
#define ECHO_RESP_DESC (&chanter__testing__v1__echo_response__descriptor)
#define SLEEP_RESP_DESC (&chanter__testing__v1__sleep_response__descriptor)

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------- test server */

typedef struct sleep_s sleep_t;
typedef struct tserver_s {
  uv_loop_t loop;
  uv_thread_t thread;
  uv_async_t cmd; /* asks the loop to shut the server down */
  rpc_server_t *srv;
  int port;
  int grace_ms;
  sleep_t *sleeps; /* Sleep calls not answered yet (loop thread only) */
  atomic_int chat_cancels;
  atomic_int chat_max_queued; /* most stream messages ever queued at once */
  atomic_int done;
} tserver_t;

struct sleep_s {
  uv_timer_t timer;
  rpc_call_t *call;
  uint32_t ms;
  tserver_t *ts;
  sleep_t *prev, *next;
};

static void echo_cb(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  const EchoReq *req = (const EchoReq *)m;
  EchoResp resp = CHANTER__TESTING__V1__ECHO_RESPONSE__INIT;
  if (strcmp(req->text, "!notfound") == 0) {
    rpc_call_fail(call, ERR_NOTFOUND, "no row %u in table %s", 42u, "users");
    return;
  }
  if (strcmp(req->text, "!whoami") == 0) { /* what the handler sees of its call */
    int64_t left = rpc_call_deadline_ms(call);
    resp.text = (char *)rpc_call_peer(call);
    resp.payload.data = (uint8_t *)rpc_call_method(call);
    resp.payload.len = strlen(rpc_call_method(call));
    resp.seq = left == INT64_MAX ? UINT64_MAX : (uint64_t)(left < 0 ? 0 : left);
    rpc_call_reply(call, &resp.base);
    return;
  }
  resp.payload = req->payload;
  resp.text = req->text;
  resp.seq = req->repeat;
  rpc_call_reply(call, &resp.base);
}

static void sleep_closed(uv_handle_t *h) { free(h->data); }

static void sleep_answer(sleep_t *sl) {
  SleepResp resp = CHANTER__TESTING__V1__SLEEP_RESPONSE__INIT;
  resp.slept_ms = sl->ms;
  if (sl->prev) sl->prev->next = sl->next;
  else sl->ts->sleeps = sl->next;
  if (sl->next) sl->next->prev = sl->prev;
  rpc_call_reply(sl->call, &resp.base);
  uv_timer_stop(&sl->timer);
  uv_close((uv_handle_t *)&sl->timer, sleep_closed);
}

static void sleep_fire(uv_timer_t *t) { sleep_answer(t->data); }

static void sleep_cb(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  tserver_t *ts = ud;
  const SleepReq *req = (const SleepReq *)m;
  sleep_t *sl = calloc(1, sizeof *sl);
  sl->call = call;
  sl->ms = req->delay_ms;
  sl->ts = ts;
  sl->next = ts->sleeps;
  if (ts->sleeps) ts->sleeps->prev = sl;
  ts->sleeps = sl;
  uv_timer_init(&ts->loop, &sl->timer);
  sl->timer.data = sl;
  uv_timer_start(&sl->timer, sleep_fire, req->delay_ms, 0);
}

/* Chat answers each request with `repeat` responses, produced with
 * backpressure: at most CHAT_WINDOW queued at a time, the rest produced from
 * on_sent as the transport drains. */
#define CHAT_WINDOW 4
typedef struct chat_req_s {
  struct chat_req_s *next;
  uint32_t remaining;     /* responses still to produce for this request */
  char *text;
  ProtobufCBinaryData payload;
} chat_req_t;
typedef struct chat_s {
  uint64_t seq;
  chat_req_t *head, *tail; /* requests not fully answered, in order */
  int half_closed;
} chat_t;

static void chat_open(rpc_call_t *call, void *ud) { rpc_call_set_data(call, calloc(1, sizeof(chat_t))); }

static void chat_pop(chat_t *st) {
  chat_req_t *r = st->head;
  st->head = r->next;
  if (!st->head) st->tail = NULL;
  free(r->text);
  free(r->payload.data);
  free(r);
}

static void chat_free(chat_t *st) {
  if (!st) return;
  while (st->head) chat_pop(st);
  free(st);
}

static void chat_produce(rpc_call_t *call, tserver_t *ts) {
  chat_t *st = rpc_call_get_data(call);
  while (st->head && rpc_call_queued(call) < CHAT_WINDOW) {
    chat_req_t *r = st->head;
    if (r->remaining == 0) {
      chat_pop(st);
      continue;
    }
    EchoResp resp = CHANTER__TESTING__V1__ECHO_RESPONSE__INIT;
    resp.text = r->text;
    resp.payload = r->payload;
    resp.seq = st->seq++;
    if (rpc_call_send(call, &resp.base) != 0) break;
    r->remaining--;
    int q = (int)rpc_call_queued(call);
    if (q > atomic_load(&ts->chat_max_queued)) atomic_store(&ts->chat_max_queued, q);
  }
  while (st->head && st->head->remaining == 0) chat_pop(st);
  if (!st->head && st->half_closed) {
    chat_free(st);
    rpc_call_set_data(call, NULL);
    rpc_call_finish(call, 0, NULL);
  }
}

static void chat_message(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  const EchoReq *req = (const EchoReq *)m;
  chat_t *st = rpc_call_get_data(call);
  chat_req_t *r = calloc(1, sizeof *r);
  r->text = strdup(req->text ? req->text : "");
  r->remaining = req->repeat;
  r->payload.len = req->payload.len;
  r->payload.data = malloc(req->payload.len ? req->payload.len : 1);
  if (req->payload.len) memcpy(r->payload.data, req->payload.data, req->payload.len);
  if (st->tail) st->tail->next = r;
  else st->head = r;
  st->tail = r;
  chat_produce(call, ud);
}

static void chat_half_close(rpc_call_t *call, void *ud) {
  chat_t *st = rpc_call_get_data(call);
  st->half_closed = 1;
  chat_produce(call, ud);
}

static void chat_sent(rpc_call_t *call, void *ud) { chat_produce(call, ud); }

static void chat_cancel(rpc_call_t *call, void *ud) {
  tserver_t *ts = ud;
  chat_free(rpc_call_get_data(call));
  atomic_fetch_add(&ts->chat_cancels, 1);
}

static const rpc_stream_handlers_t chat_handlers = {chat_open, chat_message, chat_half_close,
                                                    chat_cancel, chat_sent};

static void server_done(rpc_server_t *s, void *ud) {
  tserver_t *ts = ud;
  atomic_store(&ts->done, 1);
  rpc_server_destroy(s);
  ts->srv = NULL;
  /* Sleeps whose call was cancelled: answering an orphaned call only frees it. */
  while (ts->sleeps) sleep_answer(ts->sleeps);
}

static void on_cmd(uv_async_t *h) {
  tserver_t *ts = h->data;
  rpc_server_shutdown(ts->srv, ts->grace_ms, server_done, ts);
  uv_close((uv_handle_t *)h, NULL);
}

static void loop_main(void *arg) {
  tserver_t *ts = arg;
  uv_run(&ts->loop, UV_RUN_DEFAULT);
}

/* all_methods: Echo, Sleep, Chat; else Echo only. */
static tserver_t *tserver_start(const rpc_tls_t *tls, int all_methods) {
  tserver_t *ts = calloc(1, sizeof *ts);
  rpc_server_opts_t o = {.listen = "127.0.0.1:0"};
  rpc_method_t methods[] = {
      {.name = "Echo", .unary = echo_cb, .ud = ts},
      {.name = "Sleep", .unary = sleep_cb, .ud = ts},
      {.name = "Chat", .stream = &chat_handlers, .ud = ts},
  };
  if (tls) o.tls = *tls;
  assert_int_equal(uv_loop_init(&ts->loop), 0);
  assert_int_equal(uv_async_init(&ts->loop, &ts->cmd, on_cmd), 0);
  ts->cmd.data = ts;
  assert_int_equal(rpc_server_create(&ts->loop, &o, &ts->srv), 0);
  assert_int_equal(rpc_server_add_service(ts->srv, SVC, methods, all_methods ? 3 : 1), 0);
  assert_int_equal(rpc_server_start(ts->srv), 0);
  ts->port = rpc_server_port(ts->srv);
  assert_true(ts->port > 0);
  assert_int_equal(uv_thread_create(&ts->thread, loop_main, ts), 0);
  return ts;
}

/* Graceful shutdown from the loop; returns once the loop has ended. */
static void tserver_stop(tserver_t *ts, int grace_ms) {
  ts->grace_ms = grace_ms;
  uv_async_send(&ts->cmd);
  uv_thread_join(&ts->thread);
  assert_true(atomic_load(&ts->done));
  assert_int_equal(uv_loop_close(&ts->loop), 0);
  free(ts);
}

static void target_of(int port, char *buf, size_t n) { snprintf(buf, n, "127.0.0.1:%d", port); }

/* ------------------------------------------------------------ fixture */

static tserver_t *g_ts;
static rpc_channel_t *g_ch;
static const char *g_echo, *g_sleep, *g_chat;

static int group_setup(void **state) {
  char target[64];
  rpc_global_init();
  g_echo = rpc_method_path(SVC, "Echo");
  g_sleep = rpc_method_path(SVC, "Sleep");
  g_chat = rpc_method_path(SVC, "Chat");
  g_ts = tserver_start(NULL, 1);
  target_of(g_ts->port, target, sizeof target);
  return rpc_channel_create(target, NULL, 0, &g_ch);
}

static int group_teardown(void **state) {
  rpc_channel_destroy(g_ch);
  tserver_stop(g_ts, 1000);
  rpc_global_shutdown();
  return 0;
}

static int echo(rpc_channel_t *ch, const char *text, const void *p, size_t n, EchoResp **out,
                rpc_status_t *st, int64_t timeout_ms) {
  EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
  req.text = (char *)text;
  req.payload.data = (uint8_t *)p;
  req.payload.len = n;
  return rpc_unary(ch, g_echo, &req.base, ECHO_RESP_DESC, timeout_ms, (ProtobufCMessage **)out, st);
}

/* ------------------------------------------------------------- tests */

static void test_round_trip(void **state) {
  EchoResp *resp = NULL;
  rpc_status_t st;
  const char payload[] = "\x00\x01\x02 binary \xff";
  assert_int_equal(echo(g_ch, "hello", payload, sizeof payload, &resp, &st, 5000), 0);
  assert_int_equal(st.code, 0);
  assert_string_equal(resp->text, "hello");
  assert_int_equal(resp->payload.len, sizeof payload);
  assert_memory_equal(resp->payload.data, payload, sizeof payload);
  protobuf_c_message_free_unpacked(&resp->base, NULL);

  /* an empty message is a message */
  assert_int_equal(echo(g_ch, "", NULL, 0, &resp, NULL, 5000), 0);
  assert_string_equal(resp->text, "");
  assert_int_equal(resp->payload.len, 0);
  protobuf_c_message_free_unpacked(&resp->base, NULL);

  /* a handler's failure arrives as its status and message */
  assert_int_equal(echo(g_ch, "!notfound", NULL, 0, &resp, &st, 5000), ERR_NOTFOUND);
  assert_null(resp);
  assert_int_equal(st.code, 5);
  assert_string_equal(st.message, "no row 42 in table users");

  /* the handler's view: peer, method, time left */
  assert_int_equal(echo(g_ch, "!whoami", NULL, 0, &resp, &st, 5000), 0);
  assert_true(strncmp(resp->text, "ipv4:127.0.0.1:", 15) == 0);
  assert_int_equal(resp->payload.len, strlen(g_echo));
  assert_memory_equal(resp->payload.data, g_echo, strlen(g_echo));
  /* 5000 ms, give or take gRPC's rounding of the grpc-timeout header */
  assert_true(resp->seq > 3000 && resp->seq <= 5500);
  protobuf_c_message_free_unpacked(&resp->base, NULL);

  /* a port already taken: start fails, the server can still be destroyed */
  uv_loop_t loop;
  rpc_server_t *srv;
  char addr[64];
  target_of(g_ts->port, addr, sizeof addr);
  rpc_server_opts_t o = {.listen = addr};
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(rpc_server_create(&loop, &o, &srv), 0);
  assert_int_equal(rpc_server_start(srv), ERR_UNAVAILABLE);
  rpc_server_destroy(srv);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);

  /* paths are interned */
  assert_string_equal(g_echo, "/chanter.testing.v1.Testing/Echo");
  assert_ptr_equal(rpc_method_path(SVC, "Echo"), g_echo);
  assert_null(rpc_method_path(SVC, "Nope"));
}

#define N_THREADS 4
#define N_PER_THREAD 200
#define N_ASYNC 500

static atomic_int conc_bad, async_ok, async_bad, async_count;
static pthread_mutex_t async_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t async_cv = PTHREAD_COND_INITIALIZER;

static void *conc_thread(void *arg) {
  int id = (int)(intptr_t)arg;
  for (int i = 0; i < N_PER_THREAD; i++) {
    char text[64];
    uint32_t payload[4] = {(uint32_t)id, (uint32_t)i, 0xdeadbeef, (uint32_t)(id * 1000 + i)};
    EchoResp *resp = NULL;
    snprintf(text, sizeof text, "thread %d call %d", id, i);
    if (echo(g_ch, text, payload, sizeof payload, &resp, NULL, 10000) != 0) {
      atomic_fetch_add(&conc_bad, 1);
      continue;
    }
    if (strcmp(resp->text, text) != 0 || resp->payload.len != sizeof payload ||
        memcmp(resp->payload.data, payload, sizeof payload) != 0)
      atomic_fetch_add(&conc_bad, 1);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  return NULL;
}

static void async_cb(int err, ProtobufCMessage *m, const rpc_status_t *st, void *ud) {
  int i = (int)(intptr_t)ud;
  EchoResp *resp = (EchoResp *)m;
  char text[32];
  snprintf(text, sizeof text, "async %d", i);
  if (err == 0 && st->code == 0 && strcmp(resp->text, text) == 0 && resp->seq == (uint64_t)i)
    atomic_fetch_add(&async_ok, 1);
  else
    atomic_fetch_add(&async_bad, 1);
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  pthread_mutex_lock(&async_mu);
  atomic_fetch_add(&async_count, 1);
  pthread_cond_signal(&async_cv);
  pthread_mutex_unlock(&async_mu);
}

static void test_concurrent(void **state) {
  pthread_t th[N_THREADS];
  for (int i = 0; i < N_ASYNC; i++) {
    EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
    char text[32];
    snprintf(text, sizeof text, "async %d", i);
    req.text = text;
    req.repeat = (uint32_t)i;
    assert_int_equal(rpc_unary_async(g_ch, g_echo, &req.base, ECHO_RESP_DESC, 20000, async_cb,
                                     (void *)(intptr_t)i),
                     0);
  }
  for (int t = 0; t < N_THREADS; t++)
    assert_int_equal(pthread_create(&th[t], NULL, conc_thread, (void *)(intptr_t)t), 0);
  for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
  pthread_mutex_lock(&async_mu);
  while (atomic_load(&async_count) < N_ASYNC) pthread_cond_wait(&async_cv, &async_mu);
  pthread_mutex_unlock(&async_mu);
  assert_int_equal(atomic_load(&conc_bad), 0);
  assert_int_equal(atomic_load(&async_bad), 0);
  assert_int_equal(atomic_load(&async_ok), N_ASYNC);
}

static void test_large_payload(void **state) {
  size_t n = (size_t)64 << 20;
  uint8_t *p = malloc(n);
  EchoResp *resp = NULL;
  rpc_status_t st;
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u) >> 13);
  int err = echo(g_ch, "big", p, n, &resp, &st, 60000);
  if (err) fprintf(stderr, "64 MiB echo failed: %d %s\n", st.code, st.message);
  assert_int_equal(err, 0);
  assert_int_equal(resp->payload.len, n);
  assert_true(memcmp(resp->payload.data, p, n) == 0);
  protobuf_c_message_free_unpacked(&resp->base, NULL);

  /* the limit is a channel argument: 2 MiB past a 1 MiB channel is refused */
  rpc_channel_t *small;
  char target[64];
  target_of(g_ts->port, target, sizeof target);
  assert_int_equal(rpc_channel_create(target, NULL, 1 << 20, &small), 0);
  assert_int_equal(echo(small, "too big", p, 2 << 20, &resp, &st, 5000), -ENOMEM);
  assert_int_equal(st.code, 8); /* RESOURCE_EXHAUSTED */
  rpc_channel_destroy(small);
  free(p);
}

static void test_deadline(void **state) {
  SleepReq req = CHANTER__TESTING__V1__SLEEP_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st;
  req.delay_ms = 2000;
  int64_t t0 = now_ms();
  assert_int_equal(rpc_unary(g_ch, g_sleep, &req.base, SLEEP_RESP_DESC, 100, &resp, &st), ERR_DEADLINE);
  int64_t dt = now_ms() - t0;
  assert_null(resp);
  assert_int_equal(st.code, 4);
  assert_true(dt >= 90);
  assert_true(dt < 1500);

  /* and a sleep inside its deadline answers */
  req.delay_ms = 50;
  assert_int_equal(rpc_unary(g_ch, g_sleep, &req.base, SLEEP_RESP_DESC, 5000, &resp, &st), 0);
  assert_int_equal(((SleepResp *)resp)->slept_ms, 50);
  protobuf_c_message_free_unpacked(resp, NULL);
}

/* -- server gone: a server in a child process, SIGKILLed mid-call */

static int child_server(void) {
  rpc_server_t *s = NULL;
  rpc_server_opts_t o = {.listen = "127.0.0.1:0"};
  rpc_method_t methods[] = {
      {.name = "Echo", .unary = echo_cb},
      {.name = "Sleep", .unary = sleep_cb},
  };
  tserver_t ts; /* sleep_cb wants one, for its loop */
  memset(&ts, 0, sizeof ts);
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
  uv_loop_init(&ts.loop);
  methods[1].ud = &ts;
  if (rpc_server_create(&ts.loop, &o, &s) || rpc_server_add_service(s, SVC, methods, 2) ||
      rpc_server_start(s))
    return 1;
  printf("%d\n", rpc_server_port(s));
  fflush(stdout);
  uv_run(&ts.loop, UV_RUN_DEFAULT);
  return 0;
}

typedef struct gone_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, err, code;
  int64_t at;
} gone_t;

static void gone_cb(int err, ProtobufCMessage *m, const rpc_status_t *st, void *ud) {
  gone_t *g = ud;
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  pthread_mutex_lock(&g->mu);
  g->err = err;
  g->code = st->code;
  g->at = now_ms();
  g->done = 1;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void test_server_gone(void **state) {
  char exe[4096], target[64], line[32] = {0};
  int pfd[2];
  pid_t pid;
  posix_spawn_file_actions_t fa;
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(len > 0);
  exe[len] = '\0';
  char *argv[] = {exe, "--child-server", NULL};
  assert_int_equal(pipe(pfd), 0);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pfd[0]);
  /* posix_spawn, not fork: this process runs gRPC threads */
  assert_int_equal(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(pfd[1]);
  struct pollfd pf = {pfd[0], POLLIN, 0};
  assert_int_equal(poll(&pf, 1, 10000), 1);
  assert_true(read(pfd[0], line, sizeof line - 1) > 0);
  close(pfd[0]);
  int port = atoi(line);
  assert_true(port > 0);

  rpc_channel_t *ch;
  target_of(port, target, sizeof target);
  assert_int_equal(rpc_channel_create(target, NULL, 0, &ch), 0);
  EchoResp *eresp = NULL;
  assert_int_equal(echo(ch, "up?", NULL, 0, &eresp, NULL, 5000), 0);
  protobuf_c_message_free_unpacked(&eresp->base, NULL);

  gone_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
  SleepReq req = CHANTER__TESTING__V1__SLEEP_REQUEST__INIT;
  req.delay_ms = 10000;
  assert_int_equal(rpc_unary_async(ch, g_sleep, &req.base, SLEEP_RESP_DESC, 20000, gone_cb, &g), 0);
  usleep(300 * 1000); /* let the call reach the child */
  int64_t t0 = now_ms();
  assert_int_equal(kill(pid, SIGKILL), 0);
  assert_int_equal(waitpid(pid, NULL, 0), pid);

  pthread_mutex_lock(&g.mu);
  while (!g.done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    if (pthread_cond_timedwait(&g.cv, &g.mu, &ts) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&g.mu);
  assert_true(g.done);
  assert_int_equal(g.err, ERR_UNAVAILABLE);
  assert_int_equal(g.code, 14);
  assert_true(g.at - t0 < 3000);

  /* new calls to the dead server fail fast too */
  rpc_status_t st;
  t0 = now_ms();
  assert_int_equal(echo(ch, "anyone?", NULL, 0, &eresp, &st, 5000), ERR_UNAVAILABLE);
  assert_true(now_ms() - t0 < 3000);
  rpc_channel_destroy(ch);
}

static void test_garbage(void **state) {
  /* field 1 (bytes) claims 127 bytes, 3 follow: protobuf-c must refuse it */
  static const uint8_t junk[] = {0x0a, 0x7f, 'a', 'b', 'c'};
  ProtobufCMessage *resp = NULL;
  rpc_status_t st;
  assert_int_equal(rpc_unary_raw(g_ch, g_echo, junk, sizeof junk, ECHO_RESP_DESC, 5000, &resp, &st),
                   -EINVAL);
  assert_null(resp);
  assert_int_equal(st.code, 3);
  assert_non_null(strstr(st.message, "/chanter.testing.v1.Testing/Echo"));
  assert_non_null(strstr(st.message, "5 bytes"));
  /* the server is still fine */
  EchoResp *eresp = NULL;
  assert_int_equal(echo(g_ch, "still here", NULL, 0, &eresp, NULL, 5000), 0);
  assert_string_equal(eresp->text, "still here");
  protobuf_c_message_free_unpacked(&eresp->base, NULL);

  /* a response that does not parse as what the caller expects */
  EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
  req.text = "x";
  req.payload.data = (uint8_t *)"yz";
  req.payload.len = 2;
  assert_int_equal(rpc_unary(g_ch, g_echo, &req.base, SLEEP_RESP_DESC, 5000, &resp, &st), ERR_BADMSG);
  assert_null(resp);
  assert_non_null(strstr(st.message, "cannot parse"));

  /* a stream message that does not parse: INVALID_ARGUMENT, handler hears on_cancel */
  int before = atomic_load(&g_ts->chat_cancels);
  rpc_stream_t *s;
  SleepReq wrong = CHANTER__TESTING__V1__SLEEP_REQUEST__INIT; /* field 1 is a varint, not bytes */
  wrong.delay_ms = 5;
  assert_int_equal(rpc_stream_open(g_ch, g_chat, ECHO_RESP_DESC, 5000, &s), 0);
  assert_int_equal(rpc_stream_write(s, &wrong.base), 0);
  assert_int_equal(rpc_stream_read(s, &resp), -EINVAL);
  assert_int_equal(rpc_stream_finish(s, &st), -EINVAL);
  assert_int_equal(st.code, 3);
  assert_non_null(strstr(st.message, g_chat));
  rpc_stream_destroy(s);
  assert_int_equal(atomic_load(&g_ts->chat_cancels), before + 1);
}

static void test_unknown_method(void **state) {
  EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st;
  const char *paths[] = {"/chanter.testing.v1.Testing/Nope", "/no.such.Service/Echo"};
  for (int i = 0; i < 2; i++) {
    int64_t t0 = now_ms();
    assert_int_equal(rpc_unary(g_ch, paths[i], &req.base, ECHO_RESP_DESC, 5000, &resp, &st), ERR_RPC);
    assert_true(now_ms() - t0 < 2000);
    assert_int_equal(st.code, 12);
    assert_non_null(strstr(st.message, paths[i]));
  }
}

static void test_stream(void **state) {
  rpc_stream_t *s = NULL;
  ProtobufCMessage *m = NULL;
  rpc_status_t st;
  const char *texts[] = {"one", "two", "three"};
  assert_int_equal(rpc_stream_open(g_ch, g_chat, ECHO_RESP_DESC, 10000, &s), 0);
  for (int i = 0; i < 3; i++) {
    EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
    req.text = (char *)texts[i];
    req.repeat = 2;
    assert_int_equal(rpc_stream_write(s, &req.base), 0);
  }
  for (int i = 0; i < 6; i++) {
    assert_int_equal(rpc_stream_read(s, &m), 0);
    EchoResp *r = (EchoResp *)m;
    assert_int_equal(r->seq, (uint64_t)i);
    assert_string_equal(r->text, texts[i / 2]);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  assert_int_equal(rpc_stream_writes_done(s), 0);
  assert_int_equal(rpc_stream_read(s, &m), 1);
  assert_null(m);
  assert_int_equal(rpc_stream_finish(s, &st), 0);
  assert_int_equal(st.code, 0);
  rpc_stream_destroy(s);

  /* backpressure: 400 responses of 64 KiB to one request; the server never
   * has more than CHAT_WINDOW queued, producing the rest from on_sent */
  assert_int_equal(rpc_stream_open(g_ch, g_chat, ECHO_RESP_DESC, 20000, &s), 0);
  {
    EchoReq big = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
    uint8_t *pl = malloc(65536);
    for (int i = 0; i < 65536; i++) pl[i] = (uint8_t)(i * 7);
    big.text = "bulk";
    big.payload.data = pl;
    big.payload.len = 65536;
    big.repeat = 400;
    assert_int_equal(rpc_stream_write(s, &big.base), 0);
    assert_int_equal(rpc_stream_writes_done(s), 0);
    for (int i = 0; i < 400; i++) {
      assert_int_equal(rpc_stream_read(s, &m), 0);
      EchoResp *r = (EchoResp *)m;
      assert_int_equal(r->seq, (uint64_t)i); /* seq is per call */
      assert_int_equal(r->payload.len, 65536);
      assert_memory_equal(r->payload.data, pl, 65536);
      protobuf_c_message_free_unpacked(m, NULL);
    }
    free(pl);
  }
  assert_int_equal(rpc_stream_read(s, &m), 1);
  assert_int_equal(rpc_stream_finish(s, &st), 0);
  rpc_stream_destroy(s);
  assert_true(atomic_load(&g_ts->chat_max_queued) <= CHAT_WINDOW);
  assert_true(atomic_load(&g_ts->chat_max_queued) >= 1);

  /* a stream the client abandons: the server hears on_cancel */
  int before = atomic_load(&g_ts->chat_cancels);
  assert_int_equal(rpc_stream_open(g_ch, g_chat, ECHO_RESP_DESC, 0, &s), 0);
  EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
  req.text = "x";
  req.repeat = 1;
  assert_int_equal(rpc_stream_write(s, &req.base), 0);
  assert_int_equal(rpc_stream_read(s, &m), 0);
  protobuf_c_message_free_unpacked(m, NULL);
  rpc_stream_cancel(s);
  assert_true(rpc_stream_read(s, &m) < 0);
  assert_int_equal(rpc_stream_finish(s, &st), ERR_CANCELLED);
  assert_int_equal(st.code, 1);
  rpc_stream_destroy(s);
  for (int i = 0; i < 200 && atomic_load(&g_ts->chat_cancels) == before; i++) usleep(10 * 1000);
  assert_int_equal(atomic_load(&g_ts->chat_cancels), before + 1);
}

/* -- TLS */

static char g_tmp[64];

static void path_in(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", g_tmp, file); }

static void make_certs(void) {
  char cmd[4096];
  snprintf(g_tmp, sizeof g_tmp, "/tmp/chanter-test-rpc-XXXXXX");
  assert_non_null(mkdtemp(g_tmp));
  snprintf(cmd, sizeof cmd,
           "cd '%s' && ( set -e; "
           "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'; "
           "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext; "
           "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
           "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=chanter-test-ca; "
           "openssl req -x509 $K -keyout ca2.key -out ca2.pem -days 2 -subj /CN=chanter-other-ca; "
           "openssl req $K -keyout server.key -out server.csr -subj /CN=localhost; "
           "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
           "  -out server.pem -days 2 -extfile server.ext; "
           "openssl req $K -keyout client.key -out client.csr -subj /CN=chanter-client; "
           "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
           "  -out client.pem -days 2 -extfile client.ext; "
           "openssl req $K -keyout evil.key -out evil.csr -subj /CN=chanter-client; "
           "openssl x509 -req -in evil.csr -CA ca2.pem -CAkey ca2.key -CAcreateserial "
           "  -out evil.pem -days 2 -extfile client.ext "
           ") >openssl.log 2>&1",
           g_tmp);
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "openssl failed; see %s/openssl.log\n", g_tmp);
  assert_int_equal(rc, 0);
}

static void test_tls(void **state) {
  char ca[128], srv_cert[128], srv_key[128], cli_cert[128], cli_key[128], evil_cert[128],
      evil_key[128], target[64], missing[128];
  rpc_channel_t *ch;
  EchoResp *resp = NULL;
  rpc_status_t st;
  make_certs();
  path_in(ca, sizeof ca, "ca.pem");
  path_in(srv_cert, sizeof srv_cert, "server.pem");
  path_in(srv_key, sizeof srv_key, "server.key");
  path_in(cli_cert, sizeof cli_cert, "client.pem");
  path_in(cli_key, sizeof cli_key, "client.key");
  path_in(evil_cert, sizeof evil_cert, "evil.pem");
  path_in(evil_key, sizeof evil_key, "evil.key");
  path_in(missing, sizeof missing, "missing.pem");

  /* a missing PEM file is an error naming it, not a crash */
  rpc_tls_t bad = {.ca_file = missing, .server_name_override = "localhost"};
  ch = (rpc_channel_t *)1;
  assert_int_equal(rpc_channel_create("127.0.0.1:1", &bad, 0, &ch), -ENOENT);
  assert_null(ch);
  uv_loop_t loop;
  rpc_server_t *srv = (rpc_server_t *)1;
  rpc_server_opts_t bo = {.listen = "127.0.0.1:0",
                          .tls = {.cert_file = srv_cert, .key_file = missing}};
  uv_loop_init(&loop);
  assert_int_equal(rpc_server_create(&loop, &bo, &srv), -ENOENT);
  assert_null(srv);
  assert_int_equal(uv_loop_close(&loop), 0);

  /* mutual TLS server serving only Echo */
  rpc_tls_t stls = {.ca_file = ca, .cert_file = srv_cert, .key_file = srv_key,
                    .require_client_cert = 1};
  tserver_t *ts = tserver_start(&stls, 0);
  target_of(ts->port, target, sizeof target);

  /* a client with a certificate from our CA gets in */
  rpc_tls_t good = {.ca_file = ca, .cert_file = cli_cert, .key_file = cli_key,
                    .server_name_override = "localhost"};
  assert_int_equal(rpc_channel_create(target, &good, 0, &ch), 0);
  assert_int_equal(echo(ch, "secret", "x", 1, &resp, &st, 5000), 0);
  assert_string_equal(resp->text, "secret");
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  /* a method of the service without a handler */
  SleepReq sreq = CHANTER__TESTING__V1__SLEEP_REQUEST__INIT;
  ProtobufCMessage *sresp = NULL;
  assert_int_equal(rpc_unary(ch, g_sleep, &sreq.base, SLEEP_RESP_DESC, 5000, &sresp, &st), ERR_RPC);
  assert_int_equal(st.code, 12);
  rpc_channel_destroy(ch);

  /* refused: no client certificate; a certificate from another CA; plaintext */
  rpc_tls_t nocert = {.ca_file = ca, .server_name_override = "localhost"};
  rpc_tls_t evil = {.ca_file = ca, .cert_file = evil_cert, .key_file = evil_key,
                    .server_name_override = "localhost"};
  const rpc_tls_t *refused[] = {&nocert, &evil, NULL};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(rpc_channel_create(target, refused[i], 0, &ch), 0);
    int64_t t0 = now_ms();
    int err = echo(ch, "let me in", NULL, 0, &resp, &st, 5000);
    assert_true(err < 0);
    assert_null(resp);
    assert_int_not_equal(st.code, 0);
    assert_true(now_ms() - t0 < 4000);
    rpc_channel_destroy(ch);
  }
  tserver_stop(ts, 500);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  assert_int_equal(system(cmd), 0);
}

/* -- graceful shutdown */

typedef struct sleeper_s {
  rpc_channel_t *ch;
  uint32_t ms;
  int err, code;
  uint32_t slept;
  int64_t took;
} sleeper_t;

static void *sleeper(void *arg) {
  sleeper_t *sl = arg;
  SleepReq req = CHANTER__TESTING__V1__SLEEP_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st;
  req.delay_ms = sl->ms;
  int64_t t0 = now_ms();
  sl->err = rpc_unary(sl->ch, g_sleep, &req.base, SLEEP_RESP_DESC, 10000, &resp, &st);
  sl->took = now_ms() - t0;
  sl->code = st.code;
  if (resp) {
    sl->slept = ((SleepResp *)resp)->slept_ms;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return NULL;
}

static void wait_inflight(tserver_t *ts, uint64_t n) {
  for (int i = 0; i < 500 && rpc_server_inflight(ts->srv) < n; i++) usleep(10 * 1000);
  assert_true(rpc_server_inflight(ts->srv) >= n);
}

static void test_graceful_shutdown(void **state) {
  char target[64];
  pthread_t th;

  /* within the grace period: the call in flight completes OK */
  tserver_t *ts = tserver_start(NULL, 1);
  target_of(ts->port, target, sizeof target);
  sleeper_t sl = {.ms = 600};
  assert_int_equal(rpc_channel_create(target, NULL, 0, &sl.ch), 0);
  assert_int_equal(pthread_create(&th, NULL, sleeper, &sl), 0);
  wait_inflight(ts, 1);
  int64_t t0 = now_ms();
  tserver_stop(ts, 2000);
  int64_t took = now_ms() - t0;
  pthread_join(th, NULL);
  assert_int_equal(sl.err, 0);
  assert_int_equal(sl.slept, 600);
  assert_true(took < 1900); /* ended when the call did, not at the end of the grace */
  /* and the server is gone */
  EchoResp *resp = NULL;
  assert_int_equal(echo(sl.ch, "hello?", NULL, 0, &resp, NULL, 2000), ERR_UNAVAILABLE);
  rpc_channel_destroy(sl.ch);

  /* past the grace period: calls are cancelled, streams hear on_cancel */
  ts = tserver_start(NULL, 1);
  target_of(ts->port, target, sizeof target);
  sleeper_t sl2 = {.ms = 5000};
  assert_int_equal(rpc_channel_create(target, NULL, 0, &sl2.ch), 0);
  assert_int_equal(pthread_create(&th, NULL, sleeper, &sl2), 0);
  rpc_stream_t *s;
  ProtobufCMessage *m = NULL;
  EchoReq req = CHANTER__TESTING__V1__ECHO_REQUEST__INIT;
  req.text = "hi";
  req.repeat = 1;
  assert_int_equal(rpc_stream_open(sl2.ch, g_chat, ECHO_RESP_DESC, 0, &s), 0);
  assert_int_equal(rpc_stream_write(s, &req.base), 0);
  assert_int_equal(rpc_stream_read(s, &m), 0);
  protobuf_c_message_free_unpacked(m, NULL);
  wait_inflight(ts, 2);
  t0 = now_ms();
  ts->grace_ms = 200;
  uv_async_send(&ts->cmd);
  uv_thread_join(&ts->thread);
  took = now_ms() - t0;
  assert_true(atomic_load(&ts->done));
  assert_int_equal(atomic_load(&ts->chat_cancels), 1);
  assert_int_equal(uv_loop_close(&ts->loop), 0);
  free(ts);
  pthread_join(th, NULL);
  assert_true(sl2.err < 0);
  assert_int_not_equal(sl2.code, 0);
  assert_true(sl2.took < 3000);
  assert_true(took < 3000);
  assert_true(rpc_stream_read(s, &m) < 0);
  assert_int_not_equal(rpc_stream_finish(s, NULL), 0);
  rpc_stream_destroy(s);
  rpc_channel_destroy(sl2.ch);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child-server") == 0) return child_server();
  log_level = LOG_WARN;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_large_payload), cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_server_gone),  cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_unknown_method), cmocka_unit_test(test_stream),
      cmocka_unit_test(test_tls),          cmocka_unit_test(test_graceful_shutdown),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
