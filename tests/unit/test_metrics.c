/*
 * test_metrics: the metrics registry, its text rendering and its HTTP
 * endpoint.  Updates from several threads must add up exactly; the
 * rendering is compared line by line with the exposition format we expect;
 * metrics_read finds a metric by name and labels without registering one;
 * the endpoint is fetched with a small HTTP/1.0 client on plain sockets:
 * /metrics, /healthz, and the extra routes (metrics_http_route: served
 * with their status and content type, GET and HEAD only, replaced and
 * removed, at most METRICS_MAX_ROUTES, and a removal waits for a request
 * still running the route's callback), and over TLS (metrics_http_tls:
 * a self-signed certificate from openssl, fetched with curl; skipped
 * without them).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

/* ---- helpers */

/* Splits s into lines (without the '\n'); s must end in '\n'.  Returns the
 * count; lines point into a copy the caller frees via *store. */
static size_t split_lines(const char *s, char ***lines, char **store) {
  size_t n = 0, len = strlen(s);
  assert_true(len > 0);
  assert_int_equal(s[len - 1], '\n');
  for (size_t i = 0; i < len; i++) n += s[i] == '\n';
  *store = strdup(s);
  *lines = calloc(n, sizeof **lines);
  assert_non_null(*store);
  assert_non_null(*lines);
  char *p = *store;
  for (size_t i = 0; i < n; i++) {
    char *nl = strchr(p, '\n');
    *nl = '\0';
    (*lines)[i] = p;
    p = nl + 1;
  }
  return n;
}

/* How many lines start with prefix. */
static size_t count_prefix(char **lines, size_t n, const char *prefix) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    c += strncmp(lines[i], prefix, strlen(prefix)) == 0;
  return c;
}

/* ---- 4 threads, exact totals */

#define THREADS 4
#define ITERS 100000

struct shared {
  metrics_counter_t *c;
  metrics_gauge_t *g;
  metrics_hist_t *h;
};

static void *worker(void *arg) {
  struct shared *s = arg;
  for (int i = 0; i < ITERS; i++) {
    metrics_counter_inc(s->c);
    metrics_gauge_add(s->g, 0.5);
    metrics_hist_observe(s->h, (double)(i % 6)); /* 0..5 */
  }
  return NULL;
}

static void test_threads_exact(void **state) {
  (void)state;
  static const double bounds[] = {1, 2, 4};
  metrics_registry_t *r;
  assert_int_equal(metrics_registry_create("t", &r), 0);
  struct shared s = {
      .c = metrics_counter(r, "ops_total", NULL, "Operations."),
      .g = metrics_gauge(r, "level", NULL, "Level."),
      .h = metrics_histogram(r, "val", NULL, "Values.", bounds, 3),
  };
  assert_non_null(s.c);
  assert_non_null(s.g);
  assert_non_null(s.h);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&th[i], NULL, worker, &s), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);

  const uint64_t total = (uint64_t)THREADS * ITERS;
  assert_int_equal(metrics_counter_value(s.c), total);
  assert_true(metrics_gauge_value(s.g) == 0.5 * (double)total);
  assert_int_equal(metrics_hist_count(s.h), total);
  /* per thread: ITERS/6 full cycles of 0..5 (sum 15) plus a partial one */
  uint64_t per[6] = {0};
  double sum = 0;
  for (int i = 0; i < ITERS; i++) {
    per[i % 6]++;
    sum += i % 6;
  }
  assert_true(metrics_hist_sum(s.h) == sum * THREADS);

  char *text = metrics_render(r);
  assert_non_null(text);
  char **lines, *store;
  size_t n = split_lines(text, &lines, &store);
  char want[128];
  const uint64_t cum[4] = {
      (per[0] + per[1]) * THREADS, (per[0] + per[1] + per[2]) * THREADS,
      (per[0] + per[1] + per[2] + per[3] + per[4]) * THREADS, total};
  const char *le[4] = {"1", "2", "4", "+Inf"};
  size_t found = 0;
  for (int b = 0; b < 4; b++) {
    snprintf(want, sizeof want, "t_val_bucket{le=\"%s\"} %llu", le[b],
             (unsigned long long)cum[b]);
    for (size_t i = 0; i < n; i++) found += strcmp(lines[i], want) == 0;
  }
  snprintf(want, sizeof want, "t_ops_total %llu", (unsigned long long)total);
  for (size_t i = 0; i < n; i++) found += strcmp(lines[i], want) == 0;
  snprintf(want, sizeof want, "t_level %llu", (unsigned long long)total / 2);
  for (size_t i = 0; i < n; i++) found += strcmp(lines[i], want) == 0;
  snprintf(want, sizeof want, "t_val_sum %.0f", sum * THREADS);
  for (size_t i = 0; i < n; i++) found += strcmp(lines[i], want) == 0;
  snprintf(want, sizeof want, "t_val_count %llu", (unsigned long long)total);
  for (size_t i = 0; i < n; i++) found += strcmp(lines[i], want) == 0;
  assert_int_equal(found, 8);

  free(lines);
  free(store);
  free(text);
  metrics_registry_destroy(r);
}

/* ---- exact rendering */

struct collect_state {
  metrics_gauge_t *g;
  int calls;
};

static void on_collect(void *ud) {
  struct collect_state *cs = ud;
  cs->calls++;
  metrics_gauge_set(cs->g, 40 + cs->calls);
}

static void test_render_exact(void **state) {
  (void)state;
  static const double bounds[] = {0.125, 0.5, 1};
  metrics_registry_t *r;
  assert_int_equal(metrics_registry_create("bad-prefix", &r), -EINVAL);
  assert_null(r);
  assert_int_equal(metrics_registry_create("chanter_test", &r), 0);

  metrics_counter_t *c0 = metrics_counter(r, "requests_total", "shard=\"0\"",
                                          "Requests served.");
  metrics_gauge_t *temp =
      metrics_gauge(r, "temp", NULL, "A \\ backslash\nand a newline.");
  metrics_counter_t *c1 = metrics_counter(r, "requests_total", "shard=\"1\"",
                                          "Requests served.");
  metrics_hist_t *h = metrics_histogram(r, "latency_seconds", "op=\"get\"",
                                        "Latency.", bounds, 3);
  metrics_hist_t *h2 = metrics_histogram(r, "latency_seconds", "op=\"put\"",
                                         "Latency.", bounds, 3);
  metrics_gauge_t *refreshed = metrics_gauge(r, "refreshed", "", NULL);
  metrics_hist_t *plain = metrics_histogram(
      r, "wait_seconds", NULL, "Wait.", metrics_latency_bounds,
      metrics_latency_n);
  assert_non_null(c0);
  assert_non_null(c1);
  assert_non_null(temp);
  assert_non_null(h);
  assert_non_null(h2);
  assert_non_null(refreshed);
  assert_non_null(plain);
  assert_ptr_not_equal(c0, c1);
  /* same name and labels: the same metric */
  assert_ptr_equal(metrics_counter(r, "requests_total", "shard=\"0\"", "x"), c0);
  /* misuse is refused, not fatal */
  assert_null(metrics_gauge(r, "requests_total", "shard=\"2\"", "x"));
  assert_null(metrics_histogram(r, "latency_seconds", "op=\"del\"", "x",
                                metrics_latency_bounds, metrics_latency_n));
  assert_null(metrics_counter(r, "bad name", NULL, NULL));
  static const double unsorted[] = {1, 0.5};
  assert_null(metrics_histogram(r, "u", NULL, NULL, unsorted, 2));
  /* NULL metrics are no-ops */
  metrics_counter_add(NULL, 1);
  metrics_gauge_set(NULL, 1);
  metrics_hist_observe(NULL, 1);

  metrics_counter_add(c0, 7);
  metrics_counter_add(c1, 18446744073709551615ull - 1);
  metrics_counter_inc(c1);
  metrics_gauge_set(temp, -2.5);
  metrics_hist_observe(h, 0.0625);
  metrics_hist_observe(h, 0.125); /* on the bound: in le="0.125" */
  metrics_hist_observe(h, 0.25);
  metrics_hist_observe(h, 2);
  metrics_hist_observe(plain, 0.00006103515625); /* 2^-14 */
  metrics_hist_observe(plain, 0.00390625);       /* 2^-8 */
  metrics_hist_observe(plain, 20);
  struct collect_state cs = {.g = refreshed};
  metrics_registry_on_collect(r, on_collect, &cs);

  char *text = metrics_render(r);
  assert_non_null(text);
  assert_int_equal(cs.calls, 1);
  char **lines, *store;
  size_t n = split_lines(text, &lines, &store);

  static const char *const want[] = {
      "# HELP chanter_test_up 1 while the process serves metrics.",
      "# TYPE chanter_test_up gauge",
      "chanter_test_up 1",
      "# HELP process_start_time_seconds Start time of the process since unix "
      "epoch in seconds.",
      "# TYPE process_start_time_seconds gauge",
      NULL, /* process_start_time_seconds <now-ish>, checked below */
      "# HELP chanter_test_requests_total Requests served.",
      "# TYPE chanter_test_requests_total counter",
      "chanter_test_requests_total{shard=\"0\"} 7",
      "chanter_test_requests_total{shard=\"1\"} 18446744073709551615",
      "# HELP chanter_test_temp A \\\\ backslash\\nand a newline.",
      "# TYPE chanter_test_temp gauge",
      "chanter_test_temp -2.5",
      "# HELP chanter_test_latency_seconds Latency.",
      "# TYPE chanter_test_latency_seconds histogram",
      "chanter_test_latency_seconds_bucket{op=\"get\",le=\"0.125\"} 2",
      "chanter_test_latency_seconds_bucket{op=\"get\",le=\"0.5\"} 3",
      "chanter_test_latency_seconds_bucket{op=\"get\",le=\"1\"} 3",
      "chanter_test_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 4",
      "chanter_test_latency_seconds_sum{op=\"get\"} 2.4375",
      "chanter_test_latency_seconds_count{op=\"get\"} 4",
      "chanter_test_latency_seconds_bucket{op=\"put\",le=\"0.125\"} 0",
      "chanter_test_latency_seconds_bucket{op=\"put\",le=\"0.5\"} 0",
      "chanter_test_latency_seconds_bucket{op=\"put\",le=\"1\"} 0",
      "chanter_test_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 0",
      "chanter_test_latency_seconds_sum{op=\"put\"} 0",
      "chanter_test_latency_seconds_count{op=\"put\"} 0",
      "# TYPE chanter_test_refreshed gauge",
      "chanter_test_refreshed 41",
      "# HELP chanter_test_wait_seconds Wait.",
      "# TYPE chanter_test_wait_seconds histogram",
      "chanter_test_wait_seconds_bucket{le=\"0.0001\"} 1",
      "chanter_test_wait_seconds_bucket{le=\"0.00025\"} 1",
      "chanter_test_wait_seconds_bucket{le=\"0.0005\"} 1",
      "chanter_test_wait_seconds_bucket{le=\"0.001\"} 1",
      "chanter_test_wait_seconds_bucket{le=\"0.0025\"} 1",
      "chanter_test_wait_seconds_bucket{le=\"0.005\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.01\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.025\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.05\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.1\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.25\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"0.5\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"1\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"2.5\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"5\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"10\"} 2",
      "chanter_test_wait_seconds_bucket{le=\"+Inf\"} 3",
      "chanter_test_wait_seconds_sum 20.00396728515625",
      "chanter_test_wait_seconds_count 3",
  };
  size_t n_want = sizeof want / sizeof want[0];
  for (size_t i = 0; i < n && i < n_want; i++) {
    if (want[i] && strcmp(lines[i], want[i]) != 0)
      fail_msg("line %zu: got '%s' want '%s'", i + 1, lines[i], want[i]);
  }
  assert_int_equal(n, n_want);

  /* process start: a plausible Unix time, not after now */
  double start = 0;
  assert_int_equal(sscanf(lines[5], "process_start_time_seconds %lf", &start),
                   1);
  time_t now = time(NULL);
  assert_true(start > (double)now - 86400.0 * 365);
  assert_true(start <= (double)now + 1);

  /* one header per name */
  assert_int_equal(count_prefix(lines, n, "# TYPE chanter_test_requests_total "), 1);
  assert_int_equal(count_prefix(lines, n, "# HELP chanter_test_requests_total "), 1);
  assert_int_equal(count_prefix(lines, n, "# TYPE chanter_test_latency_seconds "), 1);
  assert_int_equal(count_prefix(lines, n, "# HELP chanter_test_latency_seconds "), 1);

  /* a second render runs the callback again */
  free(text);
  text = metrics_render(r);
  assert_int_equal(cs.calls, 2);
  assert_non_null(strstr(text, "\nchanter_test_refreshed 42\n"));
  metrics_registry_on_collect(r, NULL, NULL);
  free(text);
  text = metrics_render(r);
  assert_int_equal(cs.calls, 2);

  free(lines);
  free(store);
  free(text);
  metrics_registry_destroy(r);
}

static void test_special_values(void **state) {
  (void)state;
  metrics_registry_t *r;
  assert_int_equal(metrics_registry_create("s", &r), 0);
  metrics_gauge_t *a = metrics_gauge(r, "a", NULL, NULL);
  metrics_gauge_t *b = metrics_gauge(r, "b", NULL, NULL);
  metrics_gauge_t *c = metrics_gauge(r, "c", NULL, NULL);
  metrics_gauge_t *d = metrics_gauge(r, "d", NULL, NULL);
  metrics_gauge_set(a, NAN);
  metrics_gauge_set(b, -INFINITY);
  metrics_gauge_set(c, 0.1);
  metrics_gauge_set(d, 1e21);
  metrics_gauge_add(d, 1e21);
  char *text = metrics_render(r);
  assert_non_null(strstr(text, "\ns_a NaN\n"));
  assert_non_null(strstr(text, "\ns_b -Inf\n"));
  assert_non_null(strstr(text, "\ns_c 0.1\n"));
  assert_non_null(strstr(text, "\ns_d 2e+21\n"));
  free(text);
  metrics_registry_destroy(r);
}

/* metrics_read: a metric's value by name, without registering it */
static void test_read(void **state) {
  (void)state;
  metrics_registry_t *r;
  assert_int_equal(metrics_registry_create("rd", &r), 0);
  metrics_gauge_set(metrics_gauge(r, "g", NULL, NULL), 2.5);
  metrics_counter_add(metrics_counter(r, "c_total", "k=\"1\"", NULL), 7);
  static const double b[] = {1, 2};
  metrics_hist_t *h = metrics_histogram(r, "h", NULL, NULL, b, 2);
  metrics_hist_observe(h, 0.5);
  metrics_hist_observe(h, 5);
  double v = -1;
  assert_int_equal(metrics_read(r, "g", NULL, &v), 0);
  assert_true(v == 2.5);
  assert_int_equal(metrics_read(r, "c_total", "k=\"1\"", &v), 0);
  assert_true(v == 7);
  assert_int_equal(metrics_read(r, "h", "", &v), 0);
  assert_true(v == 2);
  v = -1;
  assert_int_equal(metrics_read(r, "c_total", NULL, &v), -ENOENT); /* other labels */
  assert_int_equal(metrics_read(r, "nope", NULL, &v), -ENOENT);
  assert_true(v == -1);
  char *text = metrics_render(r); /* reading registered nothing */
  assert_null(strstr(text, "rd_nope"));
  free(text);
  metrics_registry_destroy(r);
}

/* ---- HTTP */

struct http_resp {
  int status;
  char ctype[128];
  char *body; /* malloc'd */
};

/* One request over a fresh connection; HTTP/1.0 so the server closes. */
static void http_do(int port, const char *method, const char *path,
                    struct http_resp *out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[256];
  int n = snprintf(req, sizeof req,
                   "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
                   method, path);
  assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
  size_t len = 0, cap = 4096;
  char *buf = malloc(cap);
  for (;;) {
    if (cap - len < 1024) buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    assert_true(k >= 0);
    if (k == 0) break;
    len += (size_t)k;
  }
  close(fd);
  buf[len] = '\0';

  char *eoh = strstr(buf, "\r\n\r\n");
  assert_non_null(eoh);
  *eoh = '\0';
  assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &out->status), 1);
  out->ctype[0] = '\0';
  for (char *line = strstr(buf, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
    if (strncasecmp(line + 2, "Content-Type: ", 14) == 0) {
      char *e = strstr(line + 2, "\r\n");
      size_t l = e ? (size_t)(e - (line + 16)) : strlen(line + 16);
      assert_true(l < sizeof out->ctype);
      memcpy(out->ctype, line + 16, l);
      out->ctype[l] = '\0';
    }
  }
  out->body = strdup(eoh + 4);
  free(buf);
}

static void test_http(void **state) {
  (void)state;
  metrics_registry_t *r;
  assert_int_equal(metrics_registry_create("chanter_http", &r), 0);
  metrics_counter_t *c = metrics_counter(r, "hits_total", "path=\"/x\"", "Hits.");
  metrics_counter_add(c, 3);

  metrics_http_t *h = NULL;
  assert_int_equal(metrics_http_start(r, "not-an-address", 0, &h), -EINVAL);
  assert_null(h);
  assert_int_equal(metrics_http_start(r, NULL, 70000, &h), -EINVAL);
  assert_int_equal(metrics_http_start(r, "127.0.0.1", 0, &h), 0);
  int port = metrics_http_port(h);
  assert_true(port > 0 && port < 65536);

  /* the port is taken now */
  metrics_http_t *h2 = NULL;
  assert_int_equal(metrics_http_start(r, "127.0.0.1", port, &h2), -EADDRINUSE);
  assert_null(h2);

  struct http_resp resp;
  http_do(port, "GET", "/metrics", &resp);
  assert_int_equal(resp.status, 200);
  assert_true(strncmp(resp.ctype, "text/plain; version=0.0.4", 25) == 0);
  char *local = metrics_render(r);
  assert_string_equal(resp.body, local);
  assert_non_null(strstr(resp.body, "\nchanter_http_hits_total{path=\"/x\"} 3\n"));
  assert_non_null(strstr(resp.body, "\nchanter_http_up 1\n"));
  free(local);
  free(resp.body);

  http_do(port, "GET", "/healthz", &resp);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "ok\n");
  free(resp.body);

  http_do(port, "HEAD", "/healthz", &resp);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "");
  free(resp.body);

  http_do(port, "GET", "/nope", &resp);
  assert_int_equal(resp.status, 404);
  free(resp.body);

  http_do(port, "GET", "/metrics/extra", &resp);
  assert_int_equal(resp.status, 404);
  free(resp.body);

  http_do(port, "POST", "/metrics", &resp);
  assert_int_equal(resp.status, 405);
  free(resp.body);

  /* updates show up on the next scrape */
  metrics_counter_add(c, 2);
  http_do(port, "GET", "/metrics", &resp);
  assert_int_equal(resp.status, 200);
  assert_non_null(strstr(resp.body, "\nchanter_http_hits_total{path=\"/x\"} 5\n"));
  free(resp.body);

  metrics_http_stop(h);
  metrics_http_stop(NULL);
  metrics_registry_destroy(r);
}

/* ---- extra routes (metrics_http_route) */

struct page {
  int calls;
  _Atomic int running, finished; /* the slow route's */
};

static int page_json(void *ud, sbuf_t *body, const char **ctype) {
  struct page *p = ud;
  p->calls++;
  sb_printf(body, "{\"calls\": %d}\n", p->calls);
  *ctype = "application/json";
  return 200;
}

static int page_unavailable(void *ud, sbuf_t *body, const char **ctype) {
  (void)ud, (void)ctype;
  sb_printf(body, "not yet\n");
  return 503;
}

static int page_broken(void *ud, sbuf_t *body, const char **ctype) {
  (void)ud, (void)body, (void)ctype;
  return -1;
}

static int page_slow(void *ud, sbuf_t *body, const char **ctype) {
  struct page *p = ud;
  (void)ctype;
  atomic_store(&p->running, 1);
  usleep(200 * 1000);
  sb_printf(body, "slow\n");
  atomic_store(&p->finished, 1);
  return 200;
}

struct fetch_arg {
  int port;
  struct http_resp resp;
};

static void *fetch_slow(void *arg) {
  struct fetch_arg *a = arg;
  http_do(a->port, "GET", "/slow", &a->resp);
  return NULL;
}

static void test_http_routes(void **state) {
  (void)state;
  metrics_registry_t *r;
  struct page pg = {0};
  assert_int_equal(metrics_registry_create("chanter_routes", &r), 0);
  /* bad paths, the built-in ones included */
  assert_int_equal(metrics_http_route(r, "status", page_json, &pg), -EINVAL);
  assert_int_equal(metrics_http_route(r, "/metrics", page_json, &pg), -EINVAL);
  assert_int_equal(metrics_http_route(r, "/healthz", page_json, &pg), -EINVAL);
  assert_int_equal(metrics_http_route(r, NULL, page_json, &pg), -EINVAL);
  /* a route added before the server starts is served */
  assert_int_equal(metrics_http_route(r, "/status.json", page_json, &pg), 0);
  metrics_http_t *h = NULL;
  assert_int_equal(metrics_http_start(r, "127.0.0.1", 0, &h), 0);
  int port = metrics_http_port(h);
  assert_int_equal(metrics_http_route(r, "/busy", page_unavailable, NULL), 0);
  assert_int_equal(metrics_http_route(r, "/broken", page_broken, NULL), 0);

  struct http_resp resp;
  http_do(port, "GET", "/status.json", &resp);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.ctype, "application/json");
  assert_string_equal(resp.body, "{\"calls\": 1}\n");
  free(resp.body);
  http_do(port, "GET", "/status.json?x=1", &resp); /* the query is not part of the path */
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "{\"calls\": 2}\n");
  free(resp.body);
  http_do(port, "HEAD", "/status.json", &resp);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "");
  free(resp.body);
  http_do(port, "POST", "/status.json", &resp); /* read-only: GET and HEAD */
  assert_int_equal(resp.status, 405);
  free(resp.body);
  assert_int_equal(pg.calls, 3);
  http_do(port, "GET", "/busy", &resp);
  assert_int_equal(resp.status, 503);
  assert_true(strncmp(resp.ctype, "text/plain", 10) == 0);
  assert_string_equal(resp.body, "not yet\n");
  free(resp.body);
  http_do(port, "GET", "/broken", &resp);
  assert_int_equal(resp.status, 500);
  free(resp.body);
  http_do(port, "GET", "/status", &resp); /* exact paths only */
  assert_int_equal(resp.status, 404);
  free(resp.body);
  /* the built-in paths are unchanged */
  http_do(port, "GET", "/healthz", &resp);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "ok\n");
  free(resp.body);

  /* replaced, then removed */
  assert_int_equal(metrics_http_route(r, "/busy", page_json, &pg), 0);
  http_do(port, "GET", "/busy", &resp);
  assert_int_equal(resp.status, 200);
  free(resp.body);
  assert_int_equal(metrics_http_route(r, "/busy", NULL, NULL), 0);
  http_do(port, "GET", "/busy", &resp);
  assert_int_equal(resp.status, 404);
  free(resp.body);
  assert_int_equal(metrics_http_route(r, "/never-added", NULL, NULL), 0);

  /* at most METRICS_MAX_ROUTES */
  char path[32];
  int i;
  for (i = 0; i < 2 * METRICS_MAX_ROUTES; i++) {
    snprintf(path, sizeof path, "/r%d", i);
    if (metrics_http_route(r, path, page_json, &pg) != 0) break;
  }
  assert_int_equal(i, METRICS_MAX_ROUTES - 2); /* /status.json and /broken hold two */
  assert_int_equal(metrics_http_route(r, path, page_json, &pg), -ENOSPC);

  /* removing a route waits for a request running it: after the removal
   * the callback's data may be freed */
  assert_int_equal(metrics_http_route(r, "/r0", NULL, NULL), 0);
  assert_int_equal(metrics_http_route(r, "/slow", page_slow, &pg), 0);
  struct fetch_arg fa = {.port = port};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fetch_slow, &fa), 0);
  while (!atomic_load(&pg.running)) usleep(1000);
  assert_int_equal(metrics_http_route(r, "/slow", NULL, NULL), 0);
  assert_int_equal(atomic_load(&pg.finished), 1);
  pthread_join(th, NULL);
  assert_int_equal(fa.resp.status, 200);
  assert_string_equal(fa.resp.body, "slow\n");
  free(fa.resp.body);

  metrics_http_stop(h);
  metrics_registry_destroy(r);
}

/* metrics_http_tls: the endpoint over HTTPS, fetched with curl; a
 * self-signed certificate made with openssl (skipped without either). */
static void test_http_tls(void **state) {
  (void)state;
  if (system("command -v openssl >/dev/null 2>&1 && command -v curl >/dev/null 2>&1") != 0) {
    skip();
    return;
  }
  char dir[] = "/tmp/test_metrics_tls_XXXXXX", cmd[1024], cert[128], key[128];
  assert_non_null(mkdtemp(dir));
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(key, sizeof key, "%s/key.pem", dir);
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost "
           "-addext subjectAltName=IP:127.0.0.1 -keyout %s -out %s >/dev/null 2>&1",
           key, cert);
  assert_int_equal(system(cmd), 0);
  metrics_registry_t *r;
  struct page pg = {0};
  char err[256];
  assert_int_equal(metrics_registry_create("chanter_tls", &r), 0);
  assert_int_equal(metrics_http_tls(r, "/nonexistent/cert.pem", key, err, sizeof err), -ENOENT);
  assert_non_null(strstr(err, "/nonexistent/cert.pem"));
  assert_int_equal(metrics_http_tls(r, cert, key, err, sizeof err), 0);
  assert_int_equal(metrics_http_route(r, "/status.json", page_json, &pg), 0);
  metrics_http_t *h = NULL;
  assert_int_equal(metrics_http_start(r, "127.0.0.1", 0, &h), 0);
  int port = metrics_http_port(h);
  /* https with the certificate as CA: the route and /metrics */
  char out[4096];
  snprintf(cmd, sizeof cmd, "curl -sS --max-time 5 --cacert %s https://127.0.0.1:%d/status.json", cert, port);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  assert_int_equal(pclose(f), 0);
  assert_string_equal(out, "{\"calls\": 1}\n");
  snprintf(cmd, sizeof cmd, "curl -sS --max-time 5 --cacert %s https://127.0.0.1:%d/metrics", cert, port);
  f = popen(cmd, "r");
  n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  assert_int_equal(pclose(f), 0);
  assert_non_null(strstr(out, "\nchanter_tls_up 1\n"));
  /* plain HTTP on the TLS port gets no page */
  snprintf(cmd, sizeof cmd, "curl -s --max-time 5 -o /dev/null http://127.0.0.1:%d/metrics", port);
  assert_true(system(cmd) != 0);
  metrics_http_stop(h);
  /* cert_file NULL: plain HTTP again */
  assert_int_equal(metrics_http_tls(r, NULL, NULL, err, sizeof err), 0);
  assert_int_equal(metrics_http_start(r, "127.0.0.1", 0, &h), 0);
  struct http_resp resp;
  http_do(metrics_http_port(h), "GET", "/healthz", &resp);
  assert_int_equal(resp.status, 200);
  free(resp.body);
  metrics_http_stop(h);
  metrics_registry_destroy(r);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_exact),
      cmocka_unit_test(test_render_exact),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_read),
      cmocka_unit_test(test_http),
      cmocka_unit_test(test_http_routes),
      cmocka_unit_test(test_http_tls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
