/*
 * metrics: see metrics.h.
 *
 * A registry is a list of families (one per full metric name: type, help,
 * histogram bounds), each with a list of metrics (one per label set).  The
 * lists only grow, under the registry mutex, which rendering also takes.
 * Values are C11 atomics updated with relaxed ordering: a render is a
 * snapshot of each value, not of the whole registry.  Doubles (gauges,
 * histogram sums) are stored as their bit patterns in an atomic uint64 and
 * added with a compare-and-swap loop.  Histogram buckets hold per-bucket
 * counts; the render makes them cumulative and derives _count from them, so
 * the +Inf bucket always equals _count.  Each metric gets its own cache
 * line(s) so that threads updating different metrics do not contend.
 */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "authz.h"
#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "log.h"
#include "sbuf.h"

#define CACHE_LINE 64

enum mtype { MT_COUNTER, MT_GAUGE, MT_HIST };
static const char *const type_name[] = {"counter", "gauge", "histogram"};

struct mbase {
  struct mbase *next; /* next metric of the same family */
  char *labels;       /* NULL or non-empty */
};

struct metrics_counter_s {
  struct mbase b;
  _Atomic uint64_t v;
};

struct metrics_gauge_s {
  struct mbase b;
  _Atomic uint64_t bits; /* a double */
};

struct metrics_hist_s {
  struct mbase b;
  const double *bounds; /* the family's */
  size_t n;             /* bounds; buckets has n + 1 (last is +Inf) */
  _Atomic uint64_t sum_bits;
  _Atomic uint64_t buckets[];
};

struct family {
  struct family *next;
  char *name; /* full name, prefix included */
  char *help; /* NULL if none */
  enum mtype type;
  double *bounds; /* histograms */
  size_t n_bounds;
  struct mbase *head, *tail;
};

struct metrics_registry_s {
  pthread_mutex_t lock;
  char *prefix;
  struct family *families, *last;
  struct {
    void (*cb)(void *ud);
    void *ud;
  } collect[METRICS_MAX_COLLECT];
  int n_collect;
  metrics_gauge_t *up;
  metrics_gauge_t *start_time;
  /* the extra GET routes (metrics_http_route); route_lock is held while
   * one runs, so that removing a route waits for it */
  pthread_mutex_t route_lock;
  struct {
    char path[METRICS_ROUTE_PATH_MAX];
    metrics_route_cb cb;
    void *ud;
  } routes[METRICS_MAX_ROUTES];
  int n_routes;
  char *tls_cert, *tls_key; /* PEM (metrics_http_tls), or NULL: plain HTTP */
  char *tls_trust;          /* PEM CA (metrics_http_tls_trust): clients' certificates checked */
  struct {
    char path[METRICS_ROUTE_PATH_MAX], role[16];
    metrics_action_cb cb;
    void *ud;
  } actions[METRICS_MAX_ACTIONS];
  int n_actions;
};

const double metrics_latency_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,     2.5,   5,    10};
const size_t metrics_latency_n =
    sizeof metrics_latency_bounds / sizeof metrics_latency_bounds[0];

/* ---- doubles in atomics */

static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static double bitsd(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

static void atomic_dadd(_Atomic uint64_t *a, double v) {
  uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v),
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

/* ---- updates and reads */

void metrics_counter_add(metrics_counter_t *c, uint64_t v) {
  if (c) atomic_fetch_add_explicit(&c->v, v, memory_order_relaxed);
}

void metrics_counter_inc(metrics_counter_t *c) { metrics_counter_add(c, 1); }

void metrics_gauge_set(metrics_gauge_t *g, double v) {
  if (g) atomic_store_explicit(&g->bits, dbits(v), memory_order_relaxed);
}

void metrics_gauge_add(metrics_gauge_t *g, double v) {
  if (g) atomic_dadd(&g->bits, v);
}

void metrics_hist_observe(metrics_hist_t *h, double v) {
  if (!h) return;
  size_t lo = 0, hi = h->n; /* first i with v <= bounds[i], else n (+Inf) */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v <= h->bounds[mid])
      hi = mid;
    else
      lo = mid + 1;
  }
  atomic_fetch_add_explicit(&h->buckets[lo], 1, memory_order_relaxed);
  atomic_dadd(&h->sum_bits, v);
}

uint64_t metrics_counter_value(const metrics_counter_t *c) {
  return c ? atomic_load_explicit(&c->v, memory_order_relaxed) : 0;
}

double metrics_gauge_value(const metrics_gauge_t *g) {
  return g ? bitsd(atomic_load_explicit(&g->bits, memory_order_relaxed)) : 0;
}

uint64_t metrics_hist_count(const metrics_hist_t *h) {
  uint64_t n = 0;
  if (h)
    for (size_t i = 0; i <= h->n; i++)
      n += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
  return n;
}

double metrics_hist_sum(const metrics_hist_t *h) {
  return h ? bitsd(atomic_load_explicit(&h->sum_bits, memory_order_relaxed)) : 0;
}

/* ---- registration */

static bool name_ok(const char *s, bool first_rule) {
  if (!s || !*s) return false;
  for (const char *p = s; *p; p++) {
    char c = *p;
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 c == ':';
    bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && !(first_rule && p == s))) return false;
  }
  return true;
}

static bool labels_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

/* Process start as Unix time: /proc/self/stat starttime (clock ticks after
 * boot) plus /proc/stat btime; now if either cannot be read. */
static double process_start_time(void) {
  double now = clock_wall_s();
  char buf[1024];
  unsigned long long btime = 0, start = 0;
  bool have_b = false, have_s = false;

  FILE *f = fopen("/proc/stat", "r");
  if (f) {
    while (fgets(buf, sizeof buf, f))
      if (sscanf(buf, "btime %llu", &btime) == 1) {
        have_b = true;
        break;
      }
    fclose(f);
  }
  f = fopen("/proc/self/stat", "r");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    char *p = strrchr(buf, ')'); /* comm may hold spaces */
    /* after ')': state is field 3, starttime field 22 */
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    if (p && sscanf(p + 1, "%llu", &start) == 1) have_s = true;
  }
  long hz = sysconf(_SC_CLK_TCK);
  if (!have_b || !have_s || hz <= 0) return now;
  return (double)btime + (double)start / (double)hz;
}

static void family_free(struct family *f) {
  struct mbase *m = f->head;
  while (m) {
    struct mbase *next = m->next;
    free(m->labels);
    free(m);
    m = next;
  }
  free(f->name);
  free(f->help);
  free(f->bounds);
  free(f);
}

/* Finds or adds the family and the metric for labels; size is the size of
 * the metric struct to allocate.  Called with the lock held. */
static struct mbase *reg_locked(metrics_registry_t *r, const char *full,
                                const char *labels, const char *help,
                                enum mtype type, const double *bounds,
                                size_t n_bounds, size_t size) {
  if (labels && !*labels) labels = NULL;
  struct family *f = r->families;
  while (f && strcmp(f->name, full) != 0) f = f->next;
  if (f) {
    if (f->type != type) {
      log_error("metric registered with two types name=%s types=%s,%s", full,
                type_name[f->type], type_name[type]);
      return NULL;
    }
    if (type == MT_HIST &&
        (f->n_bounds != n_bounds ||
         memcmp(f->bounds, bounds, n_bounds * sizeof *bounds) != 0)) {
      log_error("histogram registered with two bucket layouts name=%s", full);
      return NULL;
    }
    for (struct mbase *m = f->head; m; m = m->next)
      if (labels_eq(m->labels, labels)) return m;
  }

  bool new_family = f == NULL;
  struct mbase *m = NULL;
  char *lab = NULL;
  if (new_family) {
    f = calloc(1, sizeof *f);
    if (!f) goto oom;
    f->type = type;
    f->name = strdup(full);
    f->help = help ? strdup(help) : NULL;
    if (!f->name || (help && !f->help)) goto oom;
    if (type == MT_HIST) {
      f->bounds = malloc(n_bounds * sizeof *bounds);
      if (!f->bounds) goto oom;
      memcpy(f->bounds, bounds, n_bounds * sizeof *bounds);
      f->n_bounds = n_bounds;
    }
  }
  if (labels && !(lab = strdup(labels))) goto oom;
  size_t asize = (size + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
  m = aligned_alloc(CACHE_LINE, asize);
  if (!m) goto oom;
  memset(m, 0, asize);
  m->labels = lab;
  if (type == MT_HIST) {
    metrics_hist_t *h = (metrics_hist_t *)m;
    h->bounds = f->bounds;
    h->n = f->n_bounds;
    for (size_t i = 0; i <= h->n; i++) atomic_init(&h->buckets[i], 0);
    atomic_init(&h->sum_bits, dbits(0.0));
  } else if (type == MT_GAUGE) {
    atomic_init(&((metrics_gauge_t *)m)->bits, dbits(0.0));
  } else {
    atomic_init(&((metrics_counter_t *)m)->v, 0);
  }
  if (f->tail)
    f->tail->next = m;
  else
    f->head = m;
  f->tail = m;
  if (new_family) {
    if (r->last)
      r->last->next = f;
    else
      r->families = f;
    r->last = f;
  }
  return m;

oom:
  log_error("metric registration failed name=%s err=%s", full,
            err_str(-ENOMEM));
  free(lab);
  if (new_family && f) family_free(f);
  return NULL;
}

static struct mbase *reg(metrics_registry_t *r, const char *name,
                         const char *labels, const char *help, enum mtype type,
                         const double *bounds, size_t n_bounds, size_t size) {
  ASSERT(r != NULL);
  if (!name_ok(name, false)) {
    log_error("bad metric name name=%s", name ? name : "(null)");
    return NULL;
  }
  char *full = NULL;
  if (asprintf(&full, "%s_%s", r->prefix, name) < 0) {
    log_error("metric registration failed name=%s err=%s", name,
              err_str(-ENOMEM));
    return NULL;
  }
  pthread_mutex_lock(&r->lock);
  struct mbase *m =
      reg_locked(r, full, labels, help, type, bounds, n_bounds, size);
  pthread_mutex_unlock(&r->lock);
  free(full);
  return m;
}

metrics_counter_t *metrics_counter(metrics_registry_t *r, const char *name,
                                   const char *labels, const char *help) {
  return (metrics_counter_t *)reg(r, name, labels, help, MT_COUNTER, NULL, 0,
                                  sizeof(metrics_counter_t));
}

metrics_gauge_t *metrics_gauge(metrics_registry_t *r, const char *name,
                               const char *labels, const char *help) {
  return (metrics_gauge_t *)reg(r, name, labels, help, MT_GAUGE, NULL, 0,
                                sizeof(metrics_gauge_t));
}

metrics_hist_t *metrics_histogram(metrics_registry_t *r, const char *name,
                                  const char *labels, const char *help,
                                  const double *bounds, size_t n_bounds) {
  bool ok = bounds != NULL && n_bounds > 0;
  for (size_t i = 0; ok && i < n_bounds; i++)
    ok = isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]);
  if (!ok) {
    log_error("bad histogram bounds name=%s n=%zu", name ? name : "(null)",
              n_bounds);
    return NULL;
  }
  return (metrics_hist_t *)reg(
      r, name, labels, help, MT_HIST, bounds, n_bounds,
      sizeof(metrics_hist_t) + (n_bounds + 1) * sizeof(_Atomic uint64_t));
}

int metrics_read(metrics_registry_t *r, const char *name, const char *labels, double *v) {
  char *full = NULL;
  int rc = -ENOENT;
  if (labels && !*labels) labels = NULL;
  if (asprintf(&full, "%s_%s", r->prefix, name) < 0) return -ENOMEM;
  pthread_mutex_lock(&r->lock);
  const struct family *f = r->families;
  while (f && strcmp(f->name, full) != 0) f = f->next;
  for (const struct mbase *m = f ? f->head : NULL; m && rc; m = m->next) {
    if (!labels_eq(m->labels, labels)) continue;
    if (f->type == MT_COUNTER) *v = (double)metrics_counter_value((const metrics_counter_t *)m);
    else if (f->type == MT_GAUGE) *v = metrics_gauge_value((const metrics_gauge_t *)m);
    else *v = (double)metrics_hist_count((const metrics_hist_t *)m);
    rc = 0;
  }
  pthread_mutex_unlock(&r->lock);
  free(full);
  return rc;
}

int metrics_registry_create(const char *prefix, metrics_registry_t **out) {
  int rc = 0;
  metrics_registry_t *r = NULL;
  *out = NULL;
  if (!name_ok(prefix, true)) {
    rc = -EINVAL;
    goto out;
  }
  r = calloc(1, sizeof *r);
  if (!r || !(r->prefix = strdup(prefix))) {
    rc = -ENOMEM;
    goto out;
  }
  pthread_mutex_init(&r->lock, NULL);
  pthread_mutex_init(&r->route_lock, NULL);
  r->up = metrics_gauge(r, "up", NULL, "1 while the process serves metrics.");
  pthread_mutex_lock(&r->lock);
  r->start_time = (metrics_gauge_t *)reg_locked(
      r, "process_start_time_seconds", NULL,
      "Start time of the process since unix epoch in seconds.", MT_GAUGE, NULL,
      0, sizeof(metrics_gauge_t));
  pthread_mutex_unlock(&r->lock);
  if (!r->up || !r->start_time) {
    rc = -ENOMEM;
    goto out;
  }
  metrics_gauge_set(r->start_time, process_start_time());
  *out = r;
  r = NULL;
out:
  if (r) metrics_registry_destroy(r);
  return rc;
}

void metrics_registry_destroy(metrics_registry_t *r) {
  if (!r) return;
  struct family *f = r->families;
  while (f) {
    struct family *next = f->next;
    family_free(f);
    f = next;
  }
  free(r->tls_cert);
  free(r->tls_key);
  free(r->tls_trust);
  if (r->prefix) {
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->route_lock);
  }
  free(r->prefix);
  free(r);
}

void metrics_registry_on_collect(metrics_registry_t *r, void (*cb)(void *ud),
                                 void *ud) {
  pthread_mutex_lock(&r->lock);
  if (!cb) r->n_collect = 0;
  else if (r->n_collect < METRICS_MAX_COLLECT) {
    r->collect[r->n_collect].cb = cb;
    r->collect[r->n_collect++].ud = ud;
  }
  else fprintf(stderr, "metrics: more than %d collect callbacks; one ignored\n", METRICS_MAX_COLLECT);
  pthread_mutex_unlock(&r->lock);
}

int metrics_http_route(metrics_registry_t *r, const char *path, metrics_route_cb cb, void *ud) {
  if (!path || path[0] != '/' || strlen(path) >= METRICS_ROUTE_PATH_MAX || !strcmp(path, "/metrics") ||
      !strcmp(path, "/healthz"))
    return -EINVAL;
  int rc = 0, i;
  pthread_mutex_lock(&r->route_lock);
  for (i = 0; i < r->n_routes && strcmp(r->routes[i].path, path) != 0; i++) {
  }
  if (!cb) { /* removal: the last route moves into its place */
    if (i < r->n_routes) r->routes[i] = r->routes[--r->n_routes];
  } else if (i == METRICS_MAX_ROUTES) {
    rc = -ENOSPC;
  } else {
    if (i == r->n_routes) r->n_routes++;
    snprintf(r->routes[i].path, sizeof r->routes[i].path, "%s", path);
    r->routes[i].cb = cb;
    r->routes[i].ud = ud;
  }
  pthread_mutex_unlock(&r->route_lock);
  return rc;
}

int metrics_http_tls(metrics_registry_t *r, const char *cert_file, const char *key_file, char *err,
                     size_t err_len) {
  char *cert = NULL, *key = NULL;
  size_t n;
  int rc = 0;
  if (!cert_file || !key_file) {
    pthread_mutex_lock(&r->route_lock);
    free(r->tls_cert);
    free(r->tls_key);
    r->tls_cert = r->tls_key = NULL;
    pthread_mutex_unlock(&r->route_lock);
    return 0;
  }
  if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
    snprintf(err, err_len, "this libmicrohttpd has no TLS: the metrics endpoint cannot serve HTTPS");
    return -ENOTSUP;
  }
  if ((rc = fsio_read_all(cert_file, 1 << 20, &cert, &n, err, err_len)) != 0 ||
      (rc = fsio_read_all(key_file, 1 << 20, &key, &n, err, err_len)) != 0) {
    free(cert);
    free(key);
    return rc;
  }
  pthread_mutex_lock(&r->route_lock);
  free(r->tls_cert);
  free(r->tls_key);
  r->tls_cert = cert;
  r->tls_key = key;
  pthread_mutex_unlock(&r->route_lock);
  return 0;
}

int metrics_http_tls_trust(metrics_registry_t *r, const char *ca_file, char *err, size_t err_len) {
  char *ca = NULL;
  int rc = ca_file ? fsio_read_all(ca_file, 1 << 20, &ca, NULL, err, err_len) : 0;
  if (rc) return rc;
  pthread_mutex_lock(&r->route_lock);
  free(r->tls_trust);
  r->tls_trust = ca;
  pthread_mutex_unlock(&r->route_lock);
  return 0;
}

int metrics_http_action(metrics_registry_t *r, const char *path, const char *role, metrics_action_cb cb, void *ud) {
  if (!path || path[0] != '/' || strlen(path) >= METRICS_ROUTE_PATH_MAX || (cb && (!role || strlen(role) >= 16)))
    return -EINVAL;
  int rc = 0, i;
  pthread_mutex_lock(&r->route_lock);
  for (i = 0; i < r->n_actions && strcmp(r->actions[i].path, path) != 0; i++) {
  }
  if (!cb) {
    if (i < r->n_actions) r->actions[i] = r->actions[--r->n_actions];
  } else if (i == METRICS_MAX_ACTIONS) {
    rc = -ENOSPC;
  } else {
    if (i == r->n_actions) r->n_actions++;
    snprintf(r->actions[i].path, sizeof r->actions[i].path, "%s", path);
    snprintf(r->actions[i].role, sizeof r->actions[i].role, "%s", role);
    r->actions[i].cb = cb;
    r->actions[i].ud = ud;
  }
  pthread_mutex_unlock(&r->route_lock);
  return rc;
}

/* The caller's role: that of its client certificate when the TLS session
 * verified it against the trust CA, else "" (none, or not verified). */
static void caller_role(struct MHD_Connection *c, char *role, size_t n) {
  role[0] = 0;
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (!ci || !ci->tls_session) return;
  gnutls_session_t s = (gnutls_session_t)ci->tls_session;
  unsigned status = 0, nc = 0;
  if (gnutls_certificate_verify_peers2(s, &status) != GNUTLS_E_SUCCESS || status != 0) return;
  const gnutls_datum_t *certs = gnutls_certificate_get_peers(s, &nc);
  gnutls_x509_crt_t crt;
  if (!certs || nc == 0 || gnutls_x509_crt_init(&crt) < 0) return;
  if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) >= 0)
    for (unsigned i = 0;; i++) {
      char uri[256];
      size_t sz = sizeof uri - 1;
      unsigned critical = 0;
      int t = gnutls_x509_crt_get_subject_alt_name(crt, i, uri, &sz, &critical);
      if (t < 0) break;
      if (t != GNUTLS_SAN_URI) continue;
      uri[sz] = 0;
      unsigned bit = authz_role_of_uri(uri);
      if (bit) {
        snprintf(role, n, "%s", authz_role_name(bit));
        break;
      }
    }
  gnutls_x509_crt_deinit(crt);
}

/* POST path: its action run for the caller, or 0 when there is none. */
static int action_run(metrics_registry_t *r, struct MHD_Connection *c, const char *path, sbuf_t *body) {
  int status = 0;
  char role[32];
  caller_role(c, role, sizeof role);
  const char *arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "arg");
  pthread_mutex_lock(&r->route_lock);
  for (int i = 0; i < r->n_actions; i++) {
    if (strcmp(r->actions[i].path, path)) continue;
    if (strcmp(role, r->actions[i].role) != 0) {
      if (role[0]) sb_printf(body, "%s needs the role %s; the caller's certificate says %s\n", path, r->actions[i].role, role);
      else sb_printf(body, "%s needs the role %s; the caller presented no verified client certificate (over HTTPS: metrics.tls)\n", path, r->actions[i].role);
      log_warn("metrics http action refused path=%s role=%s needs=%s", path, role[0] ? role : "none",
               r->actions[i].role);
      status = 403;
    } else {
      status = r->actions[i].cb(r->actions[i].ud, role, arg ? arg : "", body);
      if (status < 100 || status > 599 || body->oom) status = 500;
      log_info("metrics http action path=%s arg=%s role=%s status=%d", path, arg ? arg : "", role, status);
    }
    break;
  }
  pthread_mutex_unlock(&r->route_lock);
  return status;
}

/* Runs path's route into body: its status (0: no such route, -1: the
 * callback failed or ran out of memory) and content type. */
static int route_run(metrics_registry_t *r, const char *path, sbuf_t *body, const char **ctype) {
  int status = 0;
  pthread_mutex_lock(&r->route_lock);
  for (int i = 0; i < r->n_routes; i++)
    if (!strcmp(r->routes[i].path, path)) {
      status = r->routes[i].cb(r->routes[i].ud, body, ctype);
      if (status < 100 || status > 599 || body->oom) status = -1;
      break;
    }
  pthread_mutex_unlock(&r->route_lock);
  return status;
}

static bool route_exists(metrics_registry_t *r, const char *path) {
  bool found = false;
  pthread_mutex_lock(&r->route_lock);
  for (int i = 0; i < r->n_routes && !found; i++)
    found = !strcmp(r->routes[i].path, path);
  pthread_mutex_unlock(&r->route_lock);
  return found;
}

/* ---- rendering */

/* The shortest of %.15g, %.16g, %.17g that reads back exactly, and Go's
 * spellings of the non-finite values, which Prometheus parses. */
static const char *fmt_double(char out[40], double v) {
  if (isnan(v)) return "NaN";
  if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(out, 40, "%.*g", prec, v);
    if (strtod(out, NULL) == v) break;
  }
  return out;
}

/* HELP text escapes backslash and newline. */
static void sb_help(sbuf_t *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\\')
      sb_printf(b, "\\\\");
    else if (*s == '\n')
      sb_printf(b, "\\n");
    else
      sb_printf(b, "%c", *s);
  }
}

static void render_family(sbuf_t *b, const struct family *f) {
  char num[40], le[40];
  if (f->help) {
    sb_printf(b, "# HELP %s ", f->name);
    sb_help(b, f->help);
    sb_printf(b, "\n");
  }
  sb_printf(b, "# TYPE %s %s\n", f->name, type_name[f->type]);
  for (const struct mbase *m = f->head; m; m = m->next) {
    const char *lab = m->labels;
    if (f->type == MT_COUNTER) {
      uint64_t v = metrics_counter_value((const metrics_counter_t *)m);
      if (lab)
        sb_printf(b, "%s{%s} %llu\n", f->name, lab, (unsigned long long)v);
      else
        sb_printf(b, "%s %llu\n", f->name, (unsigned long long)v);
    } else if (f->type == MT_GAUGE) {
      const char *v =
          fmt_double(num, metrics_gauge_value((const metrics_gauge_t *)m));
      if (lab)
        sb_printf(b, "%s{%s} %s\n", f->name, lab, v);
      else
        sb_printf(b, "%s %s\n", f->name, v);
    } else {
      const metrics_hist_t *h = (const metrics_hist_t *)m;
      const char *sep = lab ? "," : "";
      if (!lab) lab = "";
      uint64_t cum = 0;
      for (size_t i = 0; i <= h->n; i++) {
        cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        const char *l = i < h->n ? fmt_double(le, h->bounds[i]) : "+Inf";
        sb_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", f->name, lab, sep, l,
                  (unsigned long long)cum);
      }
      const char *s = fmt_double(num, metrics_hist_sum(h));
      if (*lab) {
        sb_printf(b, "%s_sum{%s} %s\n", f->name, lab, s);
        sb_printf(b, "%s_count{%s} %llu\n", f->name, lab,
                  (unsigned long long)cum);
      } else {
        sb_printf(b, "%s_sum %s\n", f->name, s);
        sb_printf(b, "%s_count %llu\n", f->name, (unsigned long long)cum);
      }
    }
  }
}

char *metrics_render(metrics_registry_t *r) {
  sbuf_t b = {0};
  sb_printf(&b, "%s", ""); /* an empty registry renders "" */
  pthread_mutex_lock(&r->lock);
  for (int i = 0; i < r->n_collect; i++) r->collect[i].cb(r->collect[i].ud);
  metrics_gauge_set(r->up, 1);
  for (const struct family *f = r->families; f; f = f->next)
    render_family(&b, f);
  pthread_mutex_unlock(&r->lock);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}

/* ---- HTTP */

struct metrics_http_s {
  struct MHD_Daemon *d;
  metrics_registry_t *r;
  int port;
  bool tls;
};

static const char ctype_metrics[] = "text/plain; version=0.0.4; charset=utf-8";

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = strlen(buf);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
  log_warn("metrics http msg=\"%s\"", buf);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const char *ctype, char *body, bool owned,
                             const char *allow) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      strlen(body), body,
      owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    if (owned) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result rc = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload_data,
                              size_t *upload_data_size, void **req_cls) {
  (void)version, (void)upload_data;
  metrics_http_t *h = cls;
  static const char text[] = "text/plain; charset=utf-8";
  if (strcmp(method, MHD_HTTP_METHOD_POST) == 0) {
    static int started;
    if (!*req_cls) { /* the headers: the body (ignored) comes next */
      *req_cls = &started;
      return MHD_YES;
    }
    if (*upload_data_size) {
      *upload_data_size = 0;
      return MHD_YES;
    }
    sbuf_t body = {0};
    int status = action_run(h->r, c, url, &body);
    if (status) return reply(c, (unsigned)status, text, body.s ? body.s : (char *)"", body.s != NULL, NULL);
    free(body.s);
  }
  bool is_metrics = strcmp(url, "/metrics") == 0;
  bool is_health = strcmp(url, "/healthz") == 0;
  bool is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!is_metrics && !is_health) {
    sbuf_t body = {0};
    const char *ctype = NULL;
    int status = is_get ? route_run(h->r, url, &body, &ctype) : 0;
    if (!is_get && route_exists(h->r, url)) /* a route answers GET only */
      return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text,
                   (char *)"method not allowed\n", false, "GET, HEAD");
    if (status == 0) {
      free(body.s);
      return reply(c, MHD_HTTP_NOT_FOUND, text, (char *)"not found\n", false,
                   NULL);
    }
    if (status < 0) {
      free(body.s);
      return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text,
                   (char *)"the page could not be made\n", false, NULL);
    }
    if (!body.s) return reply(c, (unsigned)status, ctype ? ctype : text, (char *)"", false, NULL);
    return reply(c, (unsigned)status, ctype ? ctype : text, body.s, true, NULL);
  }
  if (!is_get)
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text,
                 (char *)"method not allowed\n", false, "GET, HEAD");
  if (is_health) return reply(c, MHD_HTTP_OK, text, (char *)"ok\n", false, NULL);
  char *body = metrics_render(h->r);
  if (!body)
    return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text,
                 (char *)"out of memory\n", false, NULL);
  return reply(c, MHD_HTTP_OK, ctype_metrics, body, true, NULL);
}

int metrics_http_start(metrics_registry_t *r, const char *bind_addr, int port,
                       metrics_http_t **out) {
  int rc = 0;
  metrics_http_t *h = NULL;
  struct sockaddr_in a4;
  struct sockaddr_in6 a6;
  struct sockaddr *sa;
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  *out = NULL;
  if (!bind_addr) bind_addr = "127.0.0.1";
  if (port < 0 || port > 65535) {
    rc = -EINVAL;
    goto out;
  }
  memset(&a4, 0, sizeof a4);
  memset(&a6, 0, sizeof a6);
  if (inet_pton(AF_INET, bind_addr, &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)port);
    sa = (struct sockaddr *)&a4;
  } else if (inet_pton(AF_INET6, bind_addr, &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons((uint16_t)port);
    sa = (struct sockaddr *)&a6;
    flags |= MHD_USE_IPv6;
  } else {
    rc = -EINVAL;
    goto out;
  }
  h = calloc(1, sizeof *h);
  if (!h) {
    rc = -ENOMEM;
    goto out;
  }
  h->r = r;
  errno = 0;
  pthread_mutex_lock(&r->route_lock); /* the PEM is copied by MHD at start */
  if (r->tls_cert) {
    h->tls = true;
    h->d = MHD_start_daemon(
        flags | MHD_USE_TLS, (uint16_t)port, NULL, NULL, handle, h,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
        MHD_OPTION_HTTPS_MEM_CERT, r->tls_cert,
        MHD_OPTION_HTTPS_MEM_KEY, r->tls_key,
        r->tls_trust ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, r->tls_trust, MHD_OPTION_END);
  } else {
    h->d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, handle, h,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first, or MHD complains */
        MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
  }
  pthread_mutex_unlock(&r->route_lock);
  if (!h->d) {
    rc = errno > 0 ? -errno : -EIO;
    goto out;
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? (int)info->port : port;
  log_info("metrics http listening addr=%s port=%d%s", bind_addr, h->port,
           h->tls ? " tls=on" : "");
  *out = h;
  h = NULL;
out:
  if (rc < 0)
    log_error("metrics http start failed addr=%s port=%d err=%s", bind_addr,
              port, err_str(rc));
  free(h);
  return rc;
}

int metrics_http_port(const metrics_http_t *h) { return h->port; }

void metrics_http_stop(metrics_http_t *h) {
  if (!h) return;
  MHD_stop_daemon(h->d);
  free(h);
}
