/*
 * metrics: counters, gauges and histograms, exported to Prometheus.
 *
 * A daemon creates one registry with a prefix ("chanter_embedding"),
 * registers its metrics at start-up, updates them from any thread with
 * plain C11 atomics (no lock on the update path), and serves them with
 * metrics_http_start() at GET /metrics in the Prometheus text exposition
 * format 0.0.4; GET /healthz answers "ok"; a daemon may add GET routes of
 * its own (metrics_http_route: the oracle's status page) and serve it all
 * over TLS (metrics_http_tls).  Metric names are appended to
 * the prefix: metrics_counter(r, "lookups_total", ...) in a registry made
 * with "chanter_embedding" is exported as chanter_embedding_lookups_total.
 * The same name may be registered several times with different labels; all
 * of them are rendered under one # HELP / # TYPE header.
 *
 * Every render also sets two process metrics: <prefix>_up 1 and
 * process_start_time_seconds (Unix time the process started).
 *
 * The registry owns every metric it hands out: the pointers stay valid until
 * metrics_registry_destroy().  Update functions accept NULL and do nothing,
 * so a daemon can keep running when registration failed for lack of memory.
 */
#ifndef CHANTER_METRICS_H
#define CHANTER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "sbuf.h"

typedef struct metrics_registry_s metrics_registry_t;
typedef struct metrics_counter_s metrics_counter_t; /* monotonic uint64 */
typedef struct metrics_gauge_s metrics_gauge_t;     /* double, set/add */
typedef struct metrics_hist_s metrics_hist_t;       /* fixed buckets */

/* Creates a registry.  prefix: [a-zA-Z_:][a-zA-Z0-9_:]*, copied.
 * 0, -EINVAL (bad prefix) or -ENOMEM. */
int metrics_registry_create(const char *prefix, metrics_registry_t **out);
/* Frees the registry and every metric in it.  Stop its HTTP server first. */
void metrics_registry_destroy(metrics_registry_t *r);

/* Registration, meant for start-up; it takes the registry lock, so it is
 * safe against a concurrent render, but not meant for hot paths.
 *   name:   appended to "<prefix>_", [a-zA-Z0-9_:]+ (copied).
 *   labels: NULL or a string rendered verbatim inside {}, e.g.
 *           "shard=\"0\",table=\"3\"" (copied).
 *   help:   one line of help text (copied; NULL for none).
 * Registering the same name and labels again returns the existing metric.
 * Returns NULL (and logs) on a bad name, a name already registered with
 * another type (or, for histograms, other bounds) or out of memory. */
metrics_counter_t *metrics_counter(metrics_registry_t *r, const char *name,
                                   const char *labels, const char *help);
metrics_gauge_t *metrics_gauge(metrics_registry_t *r, const char *name,
                               const char *labels, const char *help);
/* bounds: n_bounds >= 1 strictly ascending finite upper bounds (copied); the
 * +Inf bucket is implicit.  An observation v falls in the first bucket with
 * v <= bound. */
metrics_hist_t *metrics_histogram(metrics_registry_t *r, const char *name,
                                  const char *labels, const char *help,
                                  const double *bounds, size_t n_bounds);

/* Latency buckets in seconds, 100 us .. 10 s (1-2.5-5 steps). */
extern const double metrics_latency_bounds[];
extern const size_t metrics_latency_n;

/* Updates: any thread, lock-free, NULL is a no-op. */
void metrics_counter_add(metrics_counter_t *c, uint64_t v);
void metrics_counter_inc(metrics_counter_t *c);
void metrics_gauge_set(metrics_gauge_t *g, double v);
void metrics_gauge_add(metrics_gauge_t *g, double v);
void metrics_hist_observe(metrics_hist_t *h, double v);

/* Reads (any thread; 0 for NULL), for tests and summaries. */
uint64_t metrics_counter_value(const metrics_counter_t *c);
double metrics_gauge_value(const metrics_gauge_t *g);
uint64_t metrics_hist_count(const metrics_hist_t *h);
double metrics_hist_sum(const metrics_hist_t *h);

/* The value of the metric registered as name (without the prefix) and
 * labels (NULL: none), read by name (a reader that did not register it,
 * e.g. a status page): a counter's or a gauge's value, a histogram's
 * count.  0, -ENOENT when there is none (*v untouched), or -ENOMEM.  Any
 * thread; it takes the registry lock (not inside a collect callback). */
int metrics_read(metrics_registry_t *r, const char *name, const char *labels, double *v);

/* Adds a callback run at the start of every render, under the registry
 * lock, on the rendering thread (the HTTP server's thread when served):
 * use it to refresh gauges from a stats struct.  It must not register
 * metrics or render.  Up to METRICS_MAX_COLLECT, run in the order added
 * (the daemon's own, then its service's); cb NULL removes them all. */
#define METRICS_MAX_COLLECT 4
void metrics_registry_on_collect(metrics_registry_t *r, void (*cb)(void *ud),
                                 void *ud);

/* Renders every metric in the text exposition format 0.0.4, in order of
 * first registration of each name.  Returns a malloc'd NUL-terminated
 * string the caller frees, or NULL on out of memory.  Any thread. */
char *metrics_render(metrics_registry_t *r);

/* An extra GET route of the registry's HTTP endpoint (a daemon's own
 * pages: the oracle's status page).  cb appends the body to body (sbuf.h),
 * may set *content_type (a string that outlives the reply; default
 * text/plain) and returns the HTTP status (200, or e.g. 404 / 503 with a
 * sentence); a status outside 100..599, or a body that ran out of memory,
 * answers 500.  cb runs on the HTTP server's thread with the registry's
 * route lock held (so keep it short: copy a snapshot the daemon's own
 * thread published; and it must not add or remove routes).  path: starts
 * with '/', shorter than METRICS_ROUTE_PATH_MAX, neither /metrics nor
 * /healthz; matched exactly (no query string: MHD strips it).  Adding a
 * path again replaces its callback; cb NULL removes the route, and once
 * that returns the old callback is not running and will not run again.
 * Any thread, before or after metrics_http_start.  0, -EINVAL (bad path)
 * or -ENOSPC (METRICS_MAX_ROUTES routes already). */
#define METRICS_MAX_ROUTES 8
#define METRICS_ROUTE_PATH_MAX 64
typedef int (*metrics_route_cb)(void *ud, sbuf_t *body, const char **content_type);
int metrics_http_route(metrics_registry_t *r, const char *path, metrics_route_cb cb, void *ud);

/* Serves the registry's endpoint over TLS (HTTPS) from the next
 * metrics_http_start on: cert_file and key_file, PEM, are read now (the
 * daemon's certificate: a scraper then needs https and the job's CA).
 * Clients are not asked for a certificate.  cert_file NULL: plain HTTP
 * again.  Before metrics_http_start, never while a server of r runs.  0, -ENOTSUP (libmicrohttpd built without TLS) or the error
 * reading a file, with a sentence in err. */
int metrics_http_tls(metrics_registry_t *r, const char *cert_file, const char *key_file, char *err,
                     size_t err_len);
/* With TLS on, asks every client for a certificate (optional) and verifies
 * it against the CA in ca_file: a verified certificate's role
 * (URI:chanter://role/ROLE, authz.h) is the caller's role for actions.
 * Before metrics_http_start.  0, or the error reading the file. */
int metrics_http_tls_trust(metrics_registry_t *r, const char *ca_file, char *err, size_t err_len);

/* An action: POST path (at most METRICS_MAX_ACTIONS), run only for a
 * caller over TLS whose verified certificate has the role `role`; anyone
 * else gets 403 with a sentence saying which role the certificate had, and
 * every try is logged with the caller's role.  cb(ud, role, arg, body):
 * arg is the query's "arg" value (or ""); it returns the HTTP status
 * (202: accepted) with a sentence in body.  On the HTTP thread: it must
 * only hand the action to its owner's thread.  cb NULL removes it. */
#define METRICS_MAX_ACTIONS 4
typedef int (*metrics_action_cb)(void *ud, const char *role, const char *arg, sbuf_t *body);
int metrics_http_action(metrics_registry_t *r, const char *path, const char *role, metrics_action_cb cb, void *ud);

/* The HTTP endpoint (libmicrohttpd, its own thread):
 *   GET /metrics  200, Content-Type: text/plain; version=0.0.4
 *   GET /healthz  200 "ok\n"
 *   the routes added with metrics_http_route (GET and HEAD)
 *   other paths   404; other methods on these paths 405.
 * bind_addr: an IPv4 or IPv6 literal; NULL means "127.0.0.1".  port: 0
 * picks a free port (see metrics_http_port()).  The registry must outlive
 * the server.  0, -EINVAL (bad address or port), -ENOMEM, or the negative
 * errno of the failed bind (e.g. -EADDRINUSE; -EIO if unknown). */
typedef struct metrics_http_s metrics_http_t;
int metrics_http_start(metrics_registry_t *r, const char *bind_addr, int port,
                       metrics_http_t **out);
/* The port actually bound. */
int metrics_http_port(const metrics_http_t *h);
/* Stops the server (waits for its thread) and frees h.  NULL is a no-op. */
void metrics_http_stop(metrics_http_t *h);

#endif
