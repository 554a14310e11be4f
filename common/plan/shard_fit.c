/*
 * shard_fit: the dataset's parser, the split, the fit and its errors
 * (contract in shard_fit.h; the model itself in shard_cost.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "fsio.h"
#include "sbuf.h"
#include "shard_cost_internal.h"
#include "shard_fit.h"
#include "table.h"

#define DATA_MAGIC "# chanter bench tables v1"
#define MINIBATCH 32
#define ADD_TERMS 5

/* ---- the dataset */

void shard_fit_data_close(shard_data_t *d) {
  for (size_t i = 0; i < d->n; i++) free(d->sets[i].tables);
  free(d->sets);
  free(d->coll);
  memset(d, 0, sizeof *d);
}

typedef struct pos_s {
  const char *name;
  unsigned line;
  char *err;
  size_t err_len;
} pos_t;

/* "name:line: field F[ of table T] is 'V', not WHAT" */
static int field_err(const pos_t *p, const char *field, uint32_t table, const char *v, const char *what) {
  char tab[32] = "";
  if (table) snprintf(tab, sizeof tab, " of table %u", table);
  if (!v) return err_set(p->err, p->err_len, ERR_CONFIG, "%s:%u: field '%s'%s is missing (%s expected)", p->name, p->line, field, tab, what);
  return err_set(p->err, p->err_len, ERR_CONFIG, "%s:%u: field '%s'%s is '%.40s', not %s", p->name, p->line, field, tab, v, what);
}

static int get_u64(const pos_t *p, char **save, const char *field, uint32_t table, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *t = strtok_r(NULL, " \t", save), *end;
  char what[64];
  snprintf(what, sizeof what, "an integer in [%llu, %llu]", (unsigned long long)lo, (unsigned long long)hi);
  if (!t || t[0] == '-') return field_err(p, field, table, t, what);
  errno = 0;
  unsigned long long v = strtoull(t, &end, 10);
  if (*end || errno || v < lo || v > hi) return field_err(p, field, table, t, what);
  *out = v;
  return 0;
}

static int get_num(const pos_t *p, char **save, const char *field, uint32_t table, double lo, double hi, const char *what, double *out) {
  char *t = strtok_r(NULL, " \t", save), *end;
  if (!t) return field_err(p, field, table, t, what);
  errno = 0;
  double v = strtod(t, &end);
  if (*end || errno || !isfinite(v) || v < lo || v > hi) return field_err(p, field, table, t, what);
  *out = v;
  return 0;
}

/* One set's line (its first word already read into kind_word). */
static int parse_set(const pos_t *p, const char *kind_word, char **save, shard_set_t *s) {
  uint64_t v;
  int rc;
  s->line = p->line;
  if ((s->kind = shard_kind_parse(kind_word)) < 0) return field_err(p, "kind", 0, kind_word, "trainer or server");
  if ((rc = get_u64(p, save, "batch", 0, 1, 1u << 30, &v))) return rc;
  s->batch = (uint32_t)v;
  if ((rc = get_num(p, save, "cost_us", 0, 1e-6, 1e12, "a number of microseconds > 0", &s->cost_us))) return rc;
  if ((rc = get_u64(p, save, "n", 0, 1, SHARD_SET_MAX, &v))) return rc;
  s->n = (uint32_t)v;
  if (!(s->tables = calloc(s->n, sizeof *s->tables))) return err_set(p->err, p->err_len, -ENOMEM, "%s: out of memory", p->name);
  for (uint32_t i = 0; i < s->n; i++) {
    shard_table_t *t = &s->tables[i];
    if ((rc = get_u64(p, save, "rows", i + 1, 1, UINT64_C(1) << 48, &t->rows))) return rc;
    if ((rc = get_u64(p, save, "dim", i + 1, 1, 65536, &v))) return rc;
    t->dim = (uint32_t)v;
    if ((rc = get_num(p, save, "hotness", i + 1, 1e-9, 1e6, "a number of ids per sample > 0", &t->hotness))) return rc;
    if ((rc = get_num(p, save, "alpha", i + 1, 0, 10, "a Zipf exponent in [0, 10]", &t->alpha))) return rc;
    char *o = strtok_r(NULL, " \t", save);
    if (!o || (t->opt = shard_opt_parse(o)) < 0) return field_err(p, "opt", i + 1, o, "sgd or adagrad");
  }
  char *extra = strtok_r(NULL, " \t", save);
  if (extra)
    return err_set(p->err, p->err_len, ERR_CONFIG, "%s:%u: '%.40s' after the %u tables the line announces (n)", p->name, p->line,
                   extra, s->n);
  return 0;
}

/* "coll <op> <ranks> <bytes> <cost_us>" (the word coll read). */
static int parse_coll(const pos_t *p, char **save, shard_data_t *d, size_t *cap) {
  if (d->n_coll == *cap) {
    size_t nc = *cap ? 2 * *cap : 32;
    shard_coll_point_t *nv = realloc(d->coll, nc * sizeof *nv);
    if (!nv) return err_set(p->err, p->err_len, -ENOMEM, "%s: out of memory", p->name);
    d->coll = nv, *cap = nc;
  }
  shard_coll_point_t *c = &d->coll[d->n_coll];
  char *o = strtok_r(NULL, " \t", save);
  uint64_t v;
  int rc;
  c->line = p->line;
  if (!o || (c->op = shard_coll_parse(o)) < 0) return field_err(p, "op", 0, o, "allreduce or alltoall");
  if ((rc = get_u64(p, save, "ranks", 0, 2, 65536, &v))) return rc;
  c->ranks = (uint32_t)v;
  if ((rc = get_num(p, save, "bytes", 0, 0, 1e15, "a number of bytes >= 0", &c->bytes))) return rc;
  if ((rc = get_num(p, save, "cost_us", 0, 1e-6, 1e12, "a number of microseconds > 0", &c->cost_us))) return rc;
  char *extra = strtok_r(NULL, " \t", save);
  if (extra) return err_set(p->err, p->err_len, ERR_CONFIG, "%s:%u: '%.40s' after a coll line's 4 fields", p->name, p->line, extra);
  d->n_coll++;
  return 0;
}

int shard_fit_parse_data(const char *text, const char *name, shard_data_t *d, char *err, size_t err_len) {
  memset(d, 0, sizeof *d);
  pos_t p = {name, 0, err, err_len};
  char *copy = strdup(text), *next, *line;
  size_t cap = 0, ccap = 0;
  int rc = 0;
  if (!copy) return err_set(err, err_len, -ENOMEM, "%s: out of memory", name);
  for (line = copy; line && !rc; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    p.line++;
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[--l] = 0;
    if (p.line == 1) {
      if (strcmp(line, DATA_MAGIC))
        rc = err_set(err, err_len, ERR_CONFIG, "%s:1: not a `chanter bench tables` dataset: the first line must be '%s', not '%.60s'",
                     name, DATA_MAGIC, line);
      continue;
    }
    if (line[0] == '#') {
      if (!strncmp(line, "# cpu:", 6)) snprintf(d->cpu, sizeof d->cpu, "%s", line + 6 + strspn(line + 6, " \t"));
      continue;
    }
    char *save = NULL, *w = strtok_r(line, " \t", &save);
    if (!w) continue;
    if (!strcmp(w, "coll")) {
      rc = parse_coll(&p, &save, d, &ccap);
      continue;
    }
    if (d->n == cap) {
      size_t nc = cap ? 2 * cap : 256;
      shard_set_t *ns = realloc(d->sets, nc * sizeof *ns);
      if (!ns) {
        rc = err_set(err, err_len, -ENOMEM, "%s: out of memory", name);
        break;
      }
      d->sets = ns, cap = nc;
    }
    memset(&d->sets[d->n], 0, sizeof d->sets[d->n]);
    rc = parse_set(&p, w, &save, &d->sets[d->n]);
    d->n++;
  }
  if (!rc && p.line == 0) rc = err_set(err, err_len, ERR_CONFIG, "%s: empty file, not a `chanter bench tables` dataset", name);
  free(copy);
  return rc;
}

int shard_fit_load_data(const char *path, shard_data_t *d, char *err, size_t err_len) {
  char *text = NULL;
  memset(d, 0, sizeof *d);
  int rc = fsio_read_all(path, (size_t)1 << 30, &text, NULL, err, err_len);
  if (rc) return rc;
  rc = shard_fit_parse_data(text, path, d, err, err_len);
  free(text);
  return rc;
}

/* ---- the split and the errors */


void shard_fit_split(const shard_data_t *d, double holdout, uint64_t seed, uint8_t *held) {
  size_t *idx = malloc((d->n ? d->n : 1) * sizeof *idx);
  ASSERT(idx);
  memset(held, 0, d->n);
  for (int k = 0; k < SHARD_KINDS; k++) {
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++)
      if (d->sets[i].kind == k) idx[n++] = i;
    uint64_t s = seed ^ (UINT64_C(0x5348415244) + (uint64_t)k);
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
      size_t j = (size_t)(table_rng_next(&s) % i), t = idx[i - 1];
      idx[i - 1] = idx[j], idx[j] = t;
    }
    size_t h = (size_t)floor(holdout * (double)n + 0.5);
    if (n < 4) h = 0;
    else if (h > n - 3) h = n - 3; /* keep three to fit */
    for (size_t i = 0; i < h; i++) held[idx[i]] = 1;
  }
  free(idx);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
/* The q-quantile of sorted v[n], linear between the closest ranks. */
static double quantile(const double *v, size_t n, double q) {
  double pos = q * (double)(n - 1);
  size_t i = (size_t)pos;
  return i + 1 < n ? v[i] + (v[i + 1] - v[i]) * (pos - (double)i) : v[n - 1];
}
static void errors_of(const double *pred, const double *y, size_t n, shard_fit_err_t *e) {
  memset(e, 0, sizeof *e);
  e->n = n;
  if (!n) {
    e->mean_abs = e->med_abs = e->p90_abs = e->med_rel = e->p90_rel = NAN;
    return;
  }
  double *a = malloc(2 * n * sizeof *a), *r = a + n;
  ASSERT(a);
  for (size_t i = 0; i < n; i++) {
    a[i] = fabs(pred[i] - y[i]);
    r[i] = a[i] / y[i];
    e->mean_abs += a[i] / (double)n;
  }
  qsort(a, n, sizeof *a, cmp_dbl);
  qsort(r, n, sizeof *r, cmp_dbl);
  e->med_abs = quantile(a, n, 0.5), e->p90_abs = quantile(a, n, 0.9);
  e->med_rel = quantile(r, n, 0.5), e->p90_rel = quantile(r, n, 0.9);
  free(a);
}

void shard_fit_errors(const shard_cost_t *m, const shard_data_t *d, int kind, const uint8_t *held, int which, shard_fit_err_t *e) {
  double *pred = malloc((d->n ? d->n : 1) * 2 * sizeof *pred), *y = pred + (d->n ? d->n : 1);
  size_t n = 0;
  ASSERT(pred);
  for (size_t i = 0; i < d->n; i++) {
    const shard_set_t *s = &d->sets[i];
    if (s->kind != kind || (held && held[i] != which)) continue;
    pred[n] = shard_cost_predict(m, kind, s->tables, s->n, s->batch);
    y[n++] = s->cost_us;
  }
  errors_of(pred, y, n, e);
  free(pred);
}

/* ---- the additive baseline */

/* A table's work terms: 1, draws x dim, distinct x dim, distinct x dim if
 * adagrad (its state), rows x row floats (bytes / 4). */
static void add_terms(const shard_table_t *t, uint32_t batch, double g[ADD_TERMS]) {
  double f[SHARD_FEATURES];
  shard_cost_features(t, batch, f);
  double distinct = expm1(f[7]);
  g[0] = 1;
  g[1] = (double)batch * t->hotness * t->dim;
  g[2] = distinct * t->dim;
  g[3] = t->opt == SHARD_OPT_ADAGRAD ? distinct * t->dim : 0;
  g[4] = exp(f[5]) / 4;
}

/* Solves a[n][n] x = b by Gaussian elimination with partial pivoting (a, b
 * are overwritten).  -1 when singular. */
static int solve(double *a, double *b, int n, double *x) {
  for (int c = 0; c < n; c++) {
    int piv = c;
    for (int r = c + 1; r < n; r++)
      if (fabs(a[r * n + c]) > fabs(a[piv * n + c])) piv = r;
    if (fabs(a[piv * n + c]) < 1e-300) return -1;
    for (int k = 0; k < n; k++) {
      double t = a[c * n + k];
      a[c * n + k] = a[piv * n + k], a[piv * n + k] = t;
    }
    double t = b[c];
    b[c] = b[piv], b[piv] = t;
    for (int r = c + 1; r < n; r++) {
      double f = a[r * n + c] / a[c * n + c];
      for (int k = c; k < n; k++) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  for (int r = n - 1; r >= 0; r--) {
    double s = b[r];
    for (int k = r + 1; k < n; k++) s -= a[r * n + k] * x[k];
    x[r] = s / a[r * n + r];
  }
  return 0;
}

/* Fits the baseline on kind's fitted sets and fills its errors. */
static void additive(const shard_data_t *d, int kind, const uint8_t *held, shard_fit_report_t *rep) {
  double (*G)[ADD_TERMS] = calloc(d->n ? d->n : 1, sizeof *G), scale[ADD_TERMS] = {0}, A[ADD_TERMS * ADD_TERMS] = {0},
                          b[ADD_TERMS] = {0}, w[ADD_TERMS] = {0};
  ASSERT(G);
  size_t nfit = 0;
  for (size_t i = 0; i < d->n; i++) {
    const shard_set_t *s = &d->sets[i];
    if (s->kind != kind) continue;
    for (uint32_t t = 0; t < s->n; t++) {
      double g[ADD_TERMS];
      add_terms(&s->tables[t], s->batch, g);
      for (int j = 0; j < ADD_TERMS; j++) G[i][j] += g[j];
    }
    if (!held[i]) {
      nfit++;
      for (int j = 0; j < ADD_TERMS; j++) scale[j] += G[i][j];
    }
  }
  for (int j = 0; j < ADD_TERMS; j++) scale[j] = scale[j] > 0 ? scale[j] / (double)nfit : 1;
  for (size_t i = 0; i < d->n; i++) { /* least squares of (w . G / y - 1) */
    const shard_set_t *s = &d->sets[i];
    if (s->kind != kind || held[i]) continue;
    double a[ADD_TERMS];
    for (int j = 0; j < ADD_TERMS; j++) a[j] = G[i][j] / scale[j] / s->cost_us;
    for (int j = 0; j < ADD_TERMS; j++) {
      b[j] += a[j];
      for (int k = 0; k < ADD_TERMS; k++) A[j * ADD_TERMS + k] += a[j] * a[k];
    }
  }
  double ridge = 0;
  for (int j = 0; j < ADD_TERMS; j++) ridge += A[j * ADD_TERMS + j] * 1e-9 / ADD_TERMS;
  for (int j = 0; j < ADD_TERMS; j++) A[j * ADD_TERMS + j] += ridge + 1e-300;
  if (solve(A, b, ADD_TERMS, w)) memset(w, 0, sizeof w);
  double *pred = malloc((d->n ? d->n : 1) * 2 * sizeof *pred), *y = pred + (d->n ? d->n : 1);
  ASSERT(pred);
  for (int which = 0; which < 2; which++) {
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++) {
      if (d->sets[i].kind != kind || held[i] != which) continue;
      double p = 0;
      for (int j = 0; j < ADD_TERMS; j++) p += w[j] * G[i][j] / scale[j];
      pred[n] = p, y[n++] = d->sets[i].cost_us;
    }
    errors_of(pred, y, n, which ? &rep->kind[kind].add_held : &rep->kind[kind].add_fit);
  }
  for (int j = 0; j < ADD_TERMS; j++) rep->kind[kind].add_w[j] = w[j] / scale[j];
  free(pred);
  free(G);
}

/* ---- the network's fit */

typedef struct fit_s {
  shard_net_t *net;
  size_t nsets;
  const shard_set_t **sets; /* the fitted sets of the kind */
  double **xs;              /* per set: its tables' standardized features, n x F */
  double *y;                /* per set: standardized log cost */
  double *grad, *m, *v;     /* size P */
  double *a1, *rep;         /* scratch: max n x h1, max n x e */
} fit_t;

/* Adds the gradient of (out - y)^2 * scale for set i into f->grad;
 * returns the squared error. */
static double set_grad(fit_t *f, size_t i, double scale) {
  const shard_net_t *n = f->net;
  const shard_set_t *s = f->sets[i];
  uint32_t h1 = n->h1, e = n->e, h2 = n->h2;
  double sum[SHARD_NET_MAX] = {0}, z[SHARD_NET_MAX], a3[SHARD_NET_MAX];
  for (uint32_t t = 0; t < s->n; t++) {
    double *rep = f->rep + (size_t)t * e;
    shard_net_phi(n, f->xs[i] + (size_t)t * SHARD_FEATURES, f->a1 + (size_t)t * h1, rep);
    for (uint32_t k = 0; k < e; k++) sum[k] += rep[k];
  }
  double add, out = shard_net_rho(n, sum, z, a3, &add), diff = out - f->y[i], dout = 2 * diff * scale;
  const double *p = n->p;
  double *g = f->grad;
  size_t oW1 = shard_net_off(n, NET_W1), oB1 = shard_net_off(n, NET_B1), oW2 = shard_net_off(n, NET_W2),
         oB2 = shard_net_off(n, NET_B2), oS = shard_net_off(n, NET_S), oOM = shard_net_off(n, NET_OM),
         oW3 = shard_net_off(n, NET_W3), oB3 = shard_net_off(n, NET_B3), oW4 = shard_net_off(n, NET_W4),
         oV = shard_net_off(n, NET_V), oB4 = shard_net_off(n, NET_B4);
  double dz[SHARD_NET_MAX], ds[SHARD_NET_MAX];
  g[oB4] += dout;
  for (uint32_t k = 0; k < e; k++) {
    double w = exp(p[oOM + k]) / add; /* d log(add) / d sum_k */
    g[oOM + k] += dout * w * sum[k];
    g[oV + k] += dout * z[k];
    dz[k] = dout * p[oV + k];
    ds[k] = dout * w;
  }
  for (uint32_t j = 0; j < h2; j++) {
    g[oW4 + j] += dout * a3[j];
    double dp = dout * p[oW4 + j] * (1 - a3[j] * a3[j]);
    g[oB3 + j] += dp;
    for (uint32_t k = 0; k < e; k++) {
      g[oW3 + (size_t)j * e + k] += dp * z[k];
      dz[k] += dp * p[oW3 + (size_t)j * e + k];
    }
  }
  for (uint32_t k = 0; k < e; k++) ds[k] += dz[k] / sum[k];
  for (uint32_t t = 0; t < s->n; t++) {
    const double *a1 = f->a1 + (size_t)t * h1, *rep = f->rep + (size_t)t * e, *xs = f->xs[i] + (size_t)t * SHARD_FEATURES;
    double da1[SHARD_NET_MAX] = {0};
    for (uint32_t k = 0; k < e; k++) {
      if (rep[k] >= exp(SHARD_NET_UMAX)) continue; /* capped: no gradient */
      double du = ds[k] * rep[k]; /* exp' = exp */
      g[oB2 + k] += du;
      for (int q = 0; q < SHARD_FEATURES; q++) g[oS + (size_t)k * SHARD_FEATURES + q] += du * xs[q];
      for (uint32_t j = 0; j < h1; j++) {
        g[oW2 + (size_t)k * h1 + j] += du * a1[j];
        da1[j] += du * p[oW2 + (size_t)k * h1 + j];
      }
    }
    for (uint32_t j = 0; j < h1; j++) {
      double dp = da1[j] * (1 - a1[j] * a1[j]);
      g[oB1 + j] += dp;
      for (int q = 0; q < SHARD_FEATURES; q++) g[oW1 + (size_t)j * SHARD_FEATURES + q] += dp * xs[q];
    }
  }
  return diff * diff;
}

/* Xavier-uniform weights from the seed, zero biases. */
static void net_init(shard_net_t *n, uint64_t seed) {
  uint64_t s = seed;
  size_t fan[NET_PARTS][2] = {{SHARD_FEATURES, n->h1}, {0, 0}, {n->h1, n->e}, {SHARD_FEATURES, n->e}, {0, 0}, {0, 0}, {n->e, n->h2}, {0, 0}, {n->h2, 1}, {n->e, 1}, {0, 0}};
  for (int part = 0; part < NET_PARTS; part++) {
    double *w = n->p + shard_net_off(n, part), r = fan[part][0] ? sqrt(6.0 / (double)(fan[part][0] + fan[part][1])) : 0;
    for (size_t i = 0; i < shard_net_part_len(n, part); i++) w[i] = r ? (2 * table_rng_unit(&s) - 1) * r : 0;
  }
}

/* Standardization and inputs of kind's fitted sets. */
static int fit_prepare(fit_t *f, const shard_data_t *d, int kind, const uint8_t *held) {
  shard_net_t *n = f->net;
  size_t ntab = 0, maxn = 1;
  double mean[SHARD_FEATURES] = {0}, sq[SHARD_FEATURES] = {0}, ym = 0;
  for (size_t i = 0; i < d->n; i++)
    if (d->sets[i].kind == kind && !held[i]) f->nsets++;
  f->sets = calloc(f->nsets, sizeof *f->sets);
  f->xs = calloc(f->nsets, sizeof *f->xs);
  f->y = calloc(f->nsets, sizeof *f->y);
  if (!f->sets || !f->xs || !f->y) return -ENOMEM;
  size_t j = 0;
  for (size_t i = 0; i < d->n; i++) {
    const shard_set_t *s = &d->sets[i];
    if (s->kind != kind || held[i]) continue;
    f->sets[j] = s;
    if (!(f->xs[j] = malloc((size_t)s->n * SHARD_FEATURES * sizeof(double)))) return -ENOMEM;
    for (uint32_t t = 0; t < s->n; t++) {
      double *x = f->xs[j] + (size_t)t * SHARD_FEATURES;
      shard_cost_features(&s->tables[t], s->batch, x);
      for (int q = 0; q < SHARD_FEATURES; q++) mean[q] += x[q], sq[q] += x[q] * x[q];
    }
    ntab += s->n, maxn = s->n > maxn ? s->n : maxn;
    f->y[j] = log(s->cost_us);
    ym += f->y[j];
    j++;
  }
  for (int q = 0; q < SHARD_FEATURES; q++) {
    n->mean[q] = mean[q] / (double)ntab;
    double var = sq[q] / (double)ntab - n->mean[q] * n->mean[q];
    /* a feature constant over the dataset (one batch size, say; rounding
     * leaves a variance of ~1e-12 of its square) teaches nothing: a huge sd
     * makes its input 0 for every table, measured or not, rather than an
     * untrained weight times a deviation the fit never saw */
    n->sd[q] = var > 1e-9 * (n->mean[q] * n->mean[q] + 1) ? sqrt(var) : 1e300;
  }
  /* start at the mean log cost (phi starts near 1 per channel and table) */
  n->p[shard_net_off(n, NET_B4)] = ym / (double)f->nsets - log((double)n->e * (double)ntab / (double)f->nsets);
  for (j = 0; j < f->nsets; j++) {
    for (uint32_t t = 0; t < f->sets[j]->n; t++)
      for (int q = 0; q < SHARD_FEATURES; q++) {
        double *x = f->xs[j] + (size_t)t * SHARD_FEATURES + q;
        *x = (*x - n->mean[q]) / n->sd[q];
      }
  }
  size_t P = shard_net_size(n);
  f->grad = calloc(P, sizeof *f->grad), f->m = calloc(P, sizeof *f->m), f->v = calloc(P, sizeof *f->v);
  f->a1 = calloc(maxn * n->h1, sizeof *f->a1), f->rep = calloc(maxn * n->e, sizeof *f->rep);
  return f->grad && f->m && f->v && f->a1 && f->rep ? 0 : -ENOMEM;
}

static void fit_free(fit_t *f) {
  for (size_t j = 0; f->xs && j < f->nsets; j++) free(f->xs[j]);
  free(f->xs), free(f->sets), free(f->y), free(f->grad), free(f->m), free(f->v), free(f->a1), free(f->rep);
}

/* Adam over seeded minibatches of the fitted sets. */
static void fit_train(fit_t *f, uint32_t steps, double lr0, double wd, uint64_t seed) {
  shard_net_t *n = f->net;
  size_t P = shard_net_size(n), nb = f->nsets < MINIBATCH ? f->nsets : MINIBATCH, pos = f->nsets;
  size_t *order = malloc(f->nsets * sizeof *order);
  ASSERT(order);
  for (size_t i = 0; i < f->nsets; i++) order[i] = i;
  uint64_t s = seed ^ UINT64_C(0x6f726465720a);
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr_min = lr0 / 30;
  double b1t = 1, b2t = 1;
  for (uint32_t step = 0; step < steps; step++) {
    memset(f->grad, 0, P * sizeof *f->grad);
    for (size_t q = 0; q < nb; q++) {
      if (pos == f->nsets) { /* a new pass: reshuffle */
        for (size_t i = f->nsets; i > 1; i--) {
          size_t j = (size_t)(table_rng_next(&s) % i), t = order[i - 1];
          order[i - 1] = order[j], order[j] = t;
        }
        pos = 0;
      }
      set_grad(f, order[pos++], 1.0 / (double)nb);
    }
    double lr = lr_min + 0.5 * (lr0 - lr_min) * (1 + cos(M_PI * step / steps));
    b1t *= b1, b2t *= b2;
    for (size_t i = 0; i < P; i++) {
      f->m[i] = b1 * f->m[i] + (1 - b1) * f->grad[i];
      f->v[i] = b2 * f->v[i] + (1 - b2) * f->grad[i] * f->grad[i];
      n->p[i] -= lr * ((f->m[i] / (1 - b1t)) / (sqrt(f->v[i] / (1 - b2t)) + eps) + wd * n->p[i]);
    }
  }
  free(order);
}

/* The whole loss (mean squared error of the standardized log cost over
 * the fitted sets) and its gradient into f->grad. */
static double full_loss(fit_t *f) {
  memset(f->grad, 0, shard_net_size(f->net) * sizeof *f->grad);
  double l = 0;
  for (size_t i = 0; i < f->nsets; i++) l += set_grad(f, i, 1.0 / (double)f->nsets) / (double)f->nsets;
  return l;
}

double shard_fit__grad_check(const shard_data_t *d, int kind, uint64_t seed) {
  shard_net_t n = {.h1 = 5, .e = 4, .h2 = 3};
  uint8_t *held = calloc(d->n ? d->n : 1, 1);
  double worst = 0;
  n.p = calloc(shard_net_size(&n), sizeof *n.p);
  fit_t f = {.net = &n};
  ASSERT(held && n.p);
  if (fit_prepare(&f, d, kind, held) == 0 && f.nsets) {
    net_init(&n, seed);
    uint64_t s = seed;
    for (size_t i = 0; i < shard_net_size(&n); i++) n.p[i] += 0.3 * (2 * table_rng_unit(&s) - 1); /* biases too */
    full_loss(&f);
    size_t P = shard_net_size(&n);
    double *g = malloc(P * sizeof *g);
    ASSERT(g);
    memcpy(g, f.grad, P * sizeof *g);
    for (size_t i = 0; i < P; i++) {
      double keep = n.p[i], h = 1e-5;
      n.p[i] = keep + h;
      double lp = full_loss(&f);
      n.p[i] = keep - h;
      double lm = full_loss(&f);
      n.p[i] = keep;
      double fd = (lp - lm) / (2 * h), diff = fabs(fd - g[i]) / (fabs(fd) + fabs(g[i]) + 1e-6);
      if (diff > worst) worst = diff;
    }
    free(g);
  } else {
    worst = NAN;
  }
  fit_free(&f);
  free(n.p);
  free(held);
  return worst;
}

/* The weight decays tried when the options give none. */
static const double wd_try[] = {0.02, 0.1, 0.5};
#define N_WD (sizeof wd_try / sizeof wd_try[0])

/* Chooses the weight decay of kind k: each of wd_try fitted on the
 * fitted sets less a fifth of them (a seeded split), scored by the
 * median relative error on that fifth; the lowest wins (ties: the
 * earlier, smaller one).  How much to hold a network back depends on how
 * noisy the measurements are, which only held-back sets can tell: a
 * quiet dataset wants little, one measured on a busy machine much more.
 * 0 or -ENOMEM. */
static int choose_wd(const shard_data_t *d, int k, const uint8_t *held, const shard_net_t *shape, uint32_t steps,
                     double lr, uint64_t seed, double *wd, double *score) {
  uint8_t *val = malloc(d->n ? d->n : 1), *out = malloc(d->n ? d->n : 1);
  shard_cost_t *m = calloc(1, sizeof *m);
  int rc = val && out && m ? 0 : -ENOMEM;
  if (!rc) {
    shard_fit_split(d, 0.2, seed ^ UINT64_C(0x7764766c), val);
    for (size_t i = 0; i < d->n; i++) val[i] = val[i] && !held[i], out[i] = held[i] || val[i];
  }
  *wd = wd_try[0], *score = INFINITY;
  for (size_t c = 0; c < N_WD && !rc; c++) {
    shard_net_t *n = &m->net[k];
    *n = (shard_net_t){.h1 = shape->h1, .e = shape->e, .h2 = shape->h2};
    if (!(n->p = calloc(shard_net_size(n), sizeof *n->p))) {
      rc = -ENOMEM;
      break;
    }
    net_init(n, seed + 1000003u * (uint64_t)(k + 1));
    fit_t f = {.net = n};
    if ((rc = fit_prepare(&f, d, k, out)) == 0) fit_train(&f, steps, lr, wd_try[c], seed + (uint64_t)k);
    fit_free(&f);
    if (!rc) {
      n->present = 1;
      shard_fit_err_t e;
      shard_fit_errors(m, d, k, val, 1, &e);
      if (e.n && e.med_rel < *score) *score = e.med_rel, *wd = wd_try[c];
    }
    free(n->p), n->p = NULL;
  }
  free(val), free(out), free(m);
  return rc;
}

/* Each collective's line through its timed calls: weighted least squares
 * with weights 1 / cost^2, i.e. the smallest squared RELATIVE error (a
 * 4 KiB call's error counts as much as a 4 MiB one's), slope and intercept
 * kept >= 0.  Every call of one collective must have the same ranks. */
static int fit_coll(const shard_data_t *d, shard_cost_t *m, shard_fit_report_t *rep, char *err, size_t err_len) {
  for (int op = 0; op < SHARD_COLLS; op++) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    uint32_t n = 0, ranks = 0;
    for (size_t i = 0; i < d->n_coll; i++) {
      const shard_coll_point_t *c = &d->coll[i];
      if (c->op != op) continue;
      if (ranks && c->ranks != ranks)
        return err_set(err, err_len, ERR_CONFIG, "line %u: coll %s timed with %u ranks, an earlier line with %u: one "
                       "dataset holds one group size", c->line, shard_coll_name(op), c->ranks, ranks);
      ranks = c->ranks;
      double w = 1 / (c->cost_us * c->cost_us), x = c->bytes / (1 << 20);
      sw += w, sx += w * x, sy += w * c->cost_us, sxx += w * x * x, sxy += w * x * c->cost_us, n++;
    }
    if (n < 2) continue;
    double den = sw * sxx - sx * sx;
    double b = den > 0 ? (sw * sxy - sx * sy) / den : 0;
    if (b < 0) b = 0;
    double a = (sy - b * sx) / sw;
    if (a < 0) { /* through the origin */
      a = 0;
      b = sxx > 0 ? sxy / sxx : 0;
    }
    double *rel = malloc(n * sizeof *rel);
    if (!rel) return err_set(err, err_len, -ENOMEM, "out of memory");
    uint32_t k = 0;
    for (size_t i = 0; i < d->n_coll; i++)
      if (d->coll[i].op == op)
        rel[k++] = fabs(a + b * d->coll[i].bytes / (1 << 20) - d->coll[i].cost_us) / d->coll[i].cost_us;
    qsort(rel, n, sizeof *rel, cmp_dbl);
    shard_coll_t line = {.present = 1, .ranks = ranks, .points = n, .alpha_us = a, .us_per_mb = b,
                         .med_rel = n % 2 ? rel[n / 2] : (rel[n / 2 - 1] + rel[n / 2]) / 2};
    free(rel);
    shard_cost_set_coll(m, op, &line);
    rep->coll[op] = line;
  }
  return 0;
}

int shard_fit(const shard_data_t *d, const shard_fit_opts_t *o, shard_cost_t **out, shard_fit_report_t *rep, char *err,
              size_t err_len) {
  *out = NULL;
  memset(rep, 0, sizeof *rep);
  uint32_t h1 = o->h1 ? o->h1 : 16, e = o->e ? o->e : 8, h2 = o->h2 ? o->h2 : 16, steps = o->steps ? o->steps : 6000;
  double lr = o->lr > 0 ? o->lr : 0.01;
  if (!(o->holdout >= 0 && o->holdout <= 0.9)) return err_set(err, err_len, -EINVAL, "holdout %g is not in [0, 0.9]", o->holdout);
  if (h1 > SHARD_NET_MAX || e > SHARD_NET_MAX || h2 > SHARD_NET_MAX)
    return err_set(err, err_len, -EINVAL, "layer sizes %u %u %u: at most %d each", h1, e, h2, SHARD_NET_MAX);
  uint8_t *held = malloc(d->n ? d->n : 1);
  shard_cost_t *m = calloc(1, sizeof *m);
  int rc = 0, fitted = 0;
  if (!held || !m) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory");
    goto out;
  }
  shard_fit_split(d, o->holdout, o->seed, held);
  for (int k = 0; k < SHARD_KINDS && !rc; k++) {
    size_t nk = 0;
    for (size_t i = 0; i < d->n; i++) nk += d->sets[i].kind == k;
    if (nk < 4) continue;
    shard_net_t *n = &m->net[k];
    n->h1 = h1, n->e = e, n->h2 = h2;
    if (!(n->p = calloc(shard_net_size(n), sizeof *n->p))) {
      rc = err_set(err, err_len, -ENOMEM, "out of memory");
      break;
    }
    net_init(n, o->seed + 1000003u * (uint64_t)(k + 1));
    double wd = o->wd, score = NAN;
    if (!(wd > 0) && (rc = choose_wd(d, k, held, n, steps, lr, o->seed, &wd, &score)) != 0) {
      rc = err_set(err, err_len, rc, "out of memory choosing the weight decay of the %s sets", shard_kind_name(k));
      break;
    }
    rep->kind[k].wd = wd, rep->kind[k].wd_score = score;
    fit_t f = {.net = n};
    if ((rc = fit_prepare(&f, d, k, held)) == 0) fit_train(&f, steps, lr, wd, o->seed + (uint64_t)k);
    fit_free(&f);
    if (rc) {
      rc = err_set(err, err_len, rc, "out of memory fitting the %s sets", shard_kind_name(k));
      break;
    }
    n->present = 1, fitted++;
    rep->kind[k].sets_fit = f.nsets, rep->kind[k].sets_held = nk - f.nsets;
    shard_fit_errors(m, d, k, held, 0, &rep->kind[k].fit);
    shard_fit_errors(m, d, k, held, 1, &rep->kind[k].held);
    additive(d, k, held, rep);
    n->sets_fit = f.nsets, n->sets_held = nk - f.nsets;
    n->held_med_rel = rep->kind[k].held.med_rel, n->held_p90_rel = rep->kind[k].held.p90_rel;
  }
  if (!rc && !fitted) rc = err_set(err, err_len, -EINVAL, "no kind has 4 sets to fit (the dataset holds %zu sets)", d->n);
  if (!rc) rc = fit_coll(d, m, rep, err, err_len);
  if (!rc) {
    if (o->label) snprintf(m->label, sizeof m->label, "%s", o->label);
    else {
      char part[2][96] = {"", ""};
      for (int k = 0; k < SHARD_KINDS; k++)
        if (m->net[k].present)
          snprintf(part[k], sizeof part[k], "; %s: %zu sets, held-out median relative error %.1f%%", shard_kind_name(k),
                   rep->kind[k].sets_fit + rep->kind[k].sets_held, 100 * rep->kind[k].held.med_rel);
      snprintf(m->label, sizeof m->label, "measured on %s%s%s", d->cpu[0] ? d->cpu : "an unnamed machine", part[0], part[1]);
    }
    for (char *c = m->label; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' ';
  }
out:
  free(held);
  if (rc) shard_cost_destroy(m), m = NULL;
  *out = m;
  return rc;
}

/* ---- a synthetic dataset */

void shard_fit_draw_table(uint64_t *s, shard_table_t *t) {
  static const uint32_t dims[] = {8, 16, 32, 64, 128};
  static const double alphas[] = {0, 0.6, 0.9, 1.05, 1.2};
  t->rows = (uint64_t)exp(log(1e3) + table_rng_unit(s) * (log(1e7) - log(1e3)));
  t->dim = dims[table_rng_next(s) % 5];
  t->hotness = (double)(1 + table_rng_next(s) % 40);
  t->alpha = alphas[table_rng_next(s) % 5];
  t->opt = (int)(table_rng_next(s) % 2);
}

double shard_fit_synthetic_cost(int kind, const shard_table_t *t, uint32_t n, uint32_t batch) {
  double work = 0, touched = 0, mx = 0;
  for (uint32_t i = 0; i < n; i++) {
    double st = t[i].opt == SHARD_OPT_ADAGRAD ? 2 : 1, dist = shard_cost_distinct(t[i].rows, t[i].alpha, batch * t[i].hotness);
    work += 3 + 1e-3 * batch * t[i].hotness * t[i].dim + 4e-3 * dist * t[i].dim * st;
    touched += dist * t[i].dim * 4 * st;
    mx = fmax(mx, dist * t[i].dim * st);
  }
  if (kind == SHARD_KIND_TRAINER) return 10 + work * (1 + 0.8 * fmax(0, log2(touched / (8 << 20))));
  return 30 + 2e-3 * touched + 6e-3 * mx;
}

char *shard_fit_synthetic_text(size_t n_trainer, size_t n_server, uint64_t seed) {
  sbuf_t b = {0};
  uint64_t s = seed;
  sb_printf(&b, "# chanter bench tables v1\n# cpu: none (synthetic costs: shard_fit_synthetic_cost)\n");
  for (size_t i = 0; i < n_trainer + n_server; i++) {
    int kind = i < n_trainer ? SHARD_KIND_TRAINER : SHARD_KIND_SERVER;
    uint32_t n = 1 + (uint32_t)(table_rng_next(&s) % 8), batch = table_rng_next(&s) % 2 ? 4096 : 1024;
    shard_table_t t[8];
    for (uint32_t j = 0; j < n; j++) shard_fit_draw_table(&s, &t[j]);
    double c = shard_fit_synthetic_cost(kind, t, n, batch) * (1 + 0.04 * (table_rng_unit(&s) - 0.5));
    sb_printf(&b, "%s %u %.6g %u", shard_kind_name(kind), batch, c, n);
    for (uint32_t j = 0; j < n; j++)
      sb_printf(&b, " %llu %u %g %g %s", (unsigned long long)t[j].rows, t[j].dim, t[j].hotness, t[j].alpha, shard_opt_name(t[j].opt));
    sb_printf(&b, "\n");
  }
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}
