/*
 * shard_cost: the cost model's features, its evaluation and its file
 * (contract in shard_cost.h; fitting in shard_fit.c).
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

/* The default model, built into the binary by the Makefile from
 * deploy/shard/cost_model.txt (empty when the tree has none). */
extern const char shard_cost_default_text[];
extern const size_t shard_cost_default_len;
#define SHARD_COST_DEFAULT_PATH "deploy/shard/cost_model.txt"

#define MAGIC "chanter shard cost model v1"
#define EXACT_RANKS 1024 /* ranks summed exactly; the rest by quadrature */
#define QUAD_STEPS 256   /* Simpson intervals over log(rank) (even) */

const char *shard_kind_name(int kind) { return kind == SHARD_KIND_TRAINER ? "trainer" : kind == SHARD_KIND_SERVER ? "server" : "?"; }
int shard_kind_parse(const char *s) { return !strcmp(s, "trainer") ? SHARD_KIND_TRAINER : !strcmp(s, "server") ? SHARD_KIND_SERVER : -1; }
const char *shard_coll_name(int op) { return op == SHARD_COLL_ALLREDUCE ? "allreduce" : op == SHARD_COLL_ALLTOALL ? "alltoall" : "?"; }
int shard_coll_parse(const char *s) { return !strcmp(s, "allreduce") ? SHARD_COLL_ALLREDUCE : !strcmp(s, "alltoall") ? SHARD_COLL_ALLTOALL : -1; }
const char *shard_opt_name(int opt) {
  return opt == SHARD_OPT_SGD ? "sgd" : opt == SHARD_OPT_ADAGRAD ? "adagrad" : opt == SHARD_OPT_ROWWISE_ADAGRAD ? "rowwise_adagrad" : "?";
}
int shard_opt_parse(const char *s) {
  return !strcmp(s, "sgd")               ? SHARD_OPT_SGD
         : !strcmp(s, "adagrad")         ? SHARD_OPT_ADAGRAD
         : !strcmp(s, "rowwise_adagrad") ? SHARD_OPT_ROWWISE_ADAGRAD
                                         : -1;
}

/* ---- Zipf sums */

/* The integral of x^-a over [x0, x1]. */
static double pow_integral(double x0, double x1, double a) {
  double b = 1 - a, l0 = log(x0), l1 = log(x1);
  if (fabs(b) < 1e-12) return l1 - l0;
  return exp(b * l0) * expm1(b * (l1 - l0)) / b;
}

/* The sum over r = 1..k of r^-a: exact up to EXACT_RANKS (prefix[] holds
 * those partial sums), then the midpoint rule's integral (its error is
 * below a^2 k^-a-2 / 24 per term there). */
typedef struct zipf_s {
  double a;
  double prefix[EXACT_RANKS + 1];
} zipf_t;
static void zipf_init(zipf_t *z, double a) {
  z->a = a;
  z->prefix[0] = 0;
  for (int r = 1; r <= EXACT_RANKS; r++) z->prefix[r] = z->prefix[r - 1] + pow((double)r, -a);
}
static double zipf_h(const zipf_t *z, uint64_t k) {
  if (k <= EXACT_RANKS) return z->prefix[k];
  return z->prefix[EXACT_RANKS] + pow_integral(EXACT_RANKS + 0.5, (double)k + 0.5, z->a);
}

/* 1 - (1 - p)^n: the chance a row of probability p is hit by n draws. */
static double hit(double p, double n) { return p >= 1 ? 1 : -expm1(n * log1p(-p)); }

static double distinct_z(const zipf_t *z, uint64_t rows, double draws) {
  if (!rows || draws <= 0) return 0;
  if (z->a == 0) return (double)rows * hit(1.0 / (double)rows, draws);
  double h = zipf_h(z, rows), s = 0;
  uint64_t m = rows < EXACT_RANKS ? rows : EXACT_RANKS;
  for (uint64_t r = 1; r <= m; r++) s += hit((z->prefix[r] - z->prefix[r - 1]) / h, draws);
  if (rows > m) { /* Simpson over u = log x of x * hit(x^-a / h) */
    double u0 = log((double)m + 0.5), u1 = log((double)rows + 0.5), du = (u1 - u0) / QUAD_STEPS, q = 0;
    for (int i = 0; i <= QUAD_STEPS; i++) {
      double u = u0 + du * i, x = exp(u);
      double f = x * hit(exp(-z->a * u) / h, draws);
      q += f * (i == 0 || i == QUAD_STEPS ? 1 : i % 2 ? 4 : 2);
    }
    s += q * du / 3;
  }
  return s < (double)rows ? s : (double)rows;
}

int shard_cost_have_default(void) { return shard_cost_default_len > 0; }

double shard_cost_distinct(uint64_t rows, double alpha, double draws) {
  zipf_t z;
  zipf_init(&z, alpha);
  return distinct_z(&z, rows, draws);
}

static double top_share_z(const zipf_t *z, uint64_t rows, uint64_t k) {
  if (!rows || !k) return 0;
  if (k >= rows) return 1;
  if (z->a == 0) return (double)k / (double)rows;
  return zipf_h(z, k) / zipf_h(z, rows);
}

double shard_cost_top_share(uint64_t rows, double alpha, uint64_t k) {
  zipf_t z;
  zipf_init(&z, alpha);
  return top_share_z(&z, rows, k);
}

static const char *const feature_names[SHARD_FEATURES] = {
    "log rows",          "dim",           "log2 dim",           "hotness",        "log(1+hotness)",
    "log bytes",         "alpha",         "log(1+distinct)",    "distinct/draws", "distinct/rows",
    "top 1% share",      "top 10% share", "log(1+draws*dim)",   "log(1+distinct*row floats)",
    "share of rows hit >= 16 times", "log batch", "sgd", "adagrad"};
const char *shard_cost_feature_name(int i) { return i >= 0 && i < SHARD_FEATURES ? feature_names[i] : "?"; }

void shard_cost_features(const shard_table_t *t, uint32_t batch, double out[SHARD_FEATURES]) {
  zipf_t z;
  zipf_init(&z, t->alpha);
  double rows = (double)(t->rows ? t->rows : 1), dim = t->dim ? t->dim : 1;
  double row_floats = t->opt == SHARD_OPT_ADAGRAD ? 2.0 * dim : t->opt == SHARD_OPT_ROWWISE_ADAGRAD ? dim + 1.0 : dim;
  double draws = (double)batch * t->hotness;
  double distinct = distinct_z(&z, t->rows, draws);
  /* rows expected to be drawn at least 16 times in a batch: the reuse a
   * batch's own gradients fold into one row update */
  double hot16 = 0;
  if (t->alpha == 0) hot16 = draws / rows >= 16 ? 1 : 0;
  else if (draws > 0) {
    double k = pow(draws / (16 * zipf_h(&z, t->rows)), 1 / t->alpha);
    hot16 = top_share_z(&z, t->rows, k >= rows ? t->rows : (uint64_t)k);
  }
  out[0] = log(rows);
  out[1] = dim;
  out[2] = log2(dim);
  out[3] = t->hotness;
  out[4] = log1p(t->hotness);
  out[5] = log(rows * row_floats * 4);
  out[6] = t->alpha;
  out[7] = log1p(distinct);
  out[8] = draws > 0 ? distinct / draws : 0;
  out[9] = distinct / rows;
  out[10] = top_share_z(&z, t->rows, (uint64_t)ceil(rows * 0.01));
  out[11] = top_share_z(&z, t->rows, (uint64_t)ceil(rows * 0.10));
  out[12] = log1p(draws * dim);
  out[13] = log1p(distinct * row_floats);
  out[14] = hot16;
  out[15] = log(batch ? batch : 1);
  out[16] = t->opt == SHARD_OPT_SGD;
  out[17] = t->opt == SHARD_OPT_ADAGRAD;
}

/* ---- the network */

const char *const shard_net_part_name[NET_PARTS] = {"w1", "b1", "w2", "s", "b2", "om", "w3", "b3", "w4", "v", "b4"};

size_t shard_net_part_len(const shard_net_t *n, int part) {
  switch (part) {
  case NET_W1: return (size_t)n->h1 * SHARD_FEATURES;
  case NET_B1: return n->h1;
  case NET_W2: return (size_t)n->e * n->h1;
  case NET_S: return (size_t)n->e * SHARD_FEATURES;
  case NET_B2: return n->e;
  case NET_W3: return (size_t)n->h2 * n->e;
  case NET_B3: return n->h2;
  case NET_W4: return n->h2;
  case NET_V: return n->e;
  case NET_OM: return n->e;
  default: return 1;
  }
}
size_t shard_net_off(const shard_net_t *n, int part) {
  size_t o = 0;
  for (int i = 0; i < part; i++) o += shard_net_part_len(n, i);
  return o;
}
size_t shard_net_size(const shard_net_t *n) { return shard_net_off(n, NET_PARTS); }

void shard_net_inputs(const shard_net_t *n, const shard_table_t *t, uint32_t batch, double *xs) {
  double raw[SHARD_FEATURES];
  shard_cost_features(t, batch, raw);
  for (int i = 0; i < SHARD_FEATURES; i++) xs[i] = (raw[i] - n->mean[i]) / n->sd[i];
}

void shard_net_phi(const shard_net_t *n, const double *xs, double *a1, double *rep) {
  double a1_s[SHARD_NET_MAX];
  if (!a1) a1 = a1_s;
  const double *w1 = n->p + shard_net_off(n, NET_W1), *b1 = n->p + shard_net_off(n, NET_B1);
  const double *w2 = n->p + shard_net_off(n, NET_W2), *b2 = n->p + shard_net_off(n, NET_B2);
  const double *sk = n->p + shard_net_off(n, NET_S);
  for (uint32_t j = 0; j < n->h1; j++) {
    double s = b1[j];
    for (int i = 0; i < SHARD_FEATURES; i++) s += w1[(size_t)j * SHARD_FEATURES + i] * xs[i];
    a1[j] = tanh(s);
  }
  for (uint32_t k = 0; k < n->e; k++) {
    double s = b2[k];
    for (uint32_t j = 0; j < n->h1; j++) s += w2[(size_t)k * n->h1 + j] * a1[j];
    for (int i = 0; i < SHARD_FEATURES; i++) s += sk[(size_t)k * SHARD_FEATURES + i] * xs[i];
    rep[k] = exp(s < SHARD_NET_UMAX ? s : SHARD_NET_UMAX);
  }
}

double shard_net_rho(const shard_net_t *n, const double *s, double *z, double *a3, double *add) {
  double z_s[SHARD_NET_MAX], a3_s[SHARD_NET_MAX];
  if (!z) z = z_s;
  if (!a3) a3 = a3_s;
  const double *w3 = n->p + shard_net_off(n, NET_W3), *b3 = n->p + shard_net_off(n, NET_B3);
  const double *w4 = n->p + shard_net_off(n, NET_W4), *v = n->p + shard_net_off(n, NET_V);
  const double *om = n->p + shard_net_off(n, NET_OM);
  double out = n->p[shard_net_off(n, NET_B4)], a = 0;
  for (uint32_t k = 0; k < n->e; k++) {
    z[k] = log(s[k]);
    out += v[k] * z[k];
    a += exp(om[k]) * s[k];
  }
  if (add) *add = a;
  out += log(a);
  for (uint32_t j = 0; j < n->h2; j++) {
    double h = b3[j];
    for (uint32_t k = 0; k < n->e; k++) h += w3[(size_t)j * n->e + k] * z[k];
    a3[j] = tanh(h);
    out += w4[j] * a3[j];
  }
  return out;
}

int shard_cost_has(const shard_cost_t *m, int kind) { return m && kind >= 0 && kind < SHARD_KINDS && m->net[kind].present; }
const char *shard_cost_label(const shard_cost_t *m) { return m->label; }
void shard_cost_set_label(shard_cost_t *m, const char *label) {
  snprintf(m->label, sizeof m->label, "%s", label);
  for (char *c = m->label; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
}
uint32_t shard_cost_width(const shard_cost_t *m, int kind) { return shard_cost_has(m, kind) ? m->net[kind].e : 0; }

void shard_cost_embed(const shard_cost_t *m, int kind, const shard_table_t *t, uint32_t batch, double *rep) {
  const shard_net_t *n = &m->net[kind];
  double xs[SHARD_FEATURES];
  shard_net_inputs(n, t, batch, xs);
  shard_net_phi(n, xs, NULL, rep);
}

double shard_cost_readout(const shard_cost_t *m, int kind, const double *sum) {
  const shard_net_t *n = &m->net[kind];
  int any = 0;
  for (uint32_t k = 0; k < n->e; k++) any |= sum[k] > 0;
  if (!any) return 0;
  return exp(shard_net_rho(n, sum, NULL, NULL, NULL));
}

double shard_cost_predict(const shard_cost_t *m, int kind, const shard_table_t *t, uint32_t n, uint32_t batch) {
  if (!shard_cost_has(m, kind)) return NAN;
  if (!n) return 0;
  uint32_t e = m->net[kind].e;
  double sum[SHARD_NET_MAX] = {0}, rep[SHARD_NET_MAX];
  for (uint32_t i = 0; i < n; i++) {
    shard_cost_embed(m, kind, &t[i], batch, rep);
    for (uint32_t k = 0; k < e; k++) sum[k] += rep[k];
  }
  return shard_cost_readout(m, kind, sum);
}

double shard_cost_coll(const shard_cost_t *m, int op, double bytes) {
  if (op < 0 || op >= SHARD_COLLS || !m->coll[op].present) return NAN;
  return m->coll[op].alpha_us + bytes * m->coll[op].us_per_mb / (1 << 20);
}

const shard_coll_t *shard_cost_coll_line(const shard_cost_t *m, int op) {
  return op >= 0 && op < SHARD_COLLS && m->coll[op].present ? &m->coll[op] : NULL;
}

void shard_cost_set_coll(shard_cost_t *m, int op, const shard_coll_t *line) {
  if (op < 0 || op >= SHARD_COLLS) return;
  m->coll[op] = *line;
  m->coll[op].present = 1;
}

shard_cost_t *shard_cost_share(shard_cost_t *m) {
  if (m) m->extra_owners++;
  return m;
}

void shard_cost_destroy(shard_cost_t *m) {
  if (!m) return;
  if (m->extra_owners) {
    m->extra_owners--;
    return;
  }
  for (int k = 0; k < SHARD_KINDS; k++) free(m->net[k].p);
  free(m);
}

/* ---- the file */

static void put_nums(sbuf_t *b, const char *name, const double *v, size_t n) {
  sb_printf(b, "%s %zu", name, n);
  for (size_t i = 0; i < n; i++) sb_printf(b, " %.17g", v[i]);
  sb_printf(b, "\n");
}

int shard_cost_save(const shard_cost_t *m, const char *path, char *err, size_t err_len) {
  sbuf_t b = {0};
  sb_printf(&b, "%s\nlabel %s\nfeatures %d\n", MAGIC, m->label, SHARD_FEATURES);
  for (int k = 0; k < SHARD_KINDS; k++) {
    const shard_net_t *n = &m->net[k];
    if (!n->present) continue;
    sb_printf(&b, "kind %s\nshape %u %u %u\nfitted %llu %llu %.17g %.17g\n", shard_kind_name(k), n->h1, n->e, n->h2,
              (unsigned long long)n->sets_fit, (unsigned long long)n->sets_held, n->held_med_rel, n->held_p90_rel);
    put_nums(&b, "mean", n->mean, SHARD_FEATURES);
    put_nums(&b, "sd", n->sd, SHARD_FEATURES);
    for (int p = 0; p < NET_PARTS; p++) put_nums(&b, shard_net_part_name[p], n->p + shard_net_off(n, p), shard_net_part_len(n, p));
    sb_printf(&b, "end\n");
  }
  for (int op = 0; op < SHARD_COLLS; op++)
    if (m->coll[op].present)
      sb_printf(&b, "coll %s %u %u %.17g %.17g %.17g\n", shard_coll_name(op), m->coll[op].ranks, m->coll[op].points,
                m->coll[op].alpha_us, m->coll[op].us_per_mb, m->coll[op].med_rel);
  if (b.oom) {
    free(b.s);
    return err_set(err, err_len, -ENOMEM, "%s: out of memory writing the model", path);
  }
  int rc = fsio_replace(path, b.s, b.n, 0644, err, err_len);
  free(b.s);
  return rc;
}

/* The parser's state: where it is, for messages. */
typedef struct rd_s {
  const char *name;
  unsigned line;
  char *err;
  size_t err_len;
} rd_t;

static int bad(rd_t *r, const char *fmt, const char *a, const char *b) {
  char what[400];
  snprintf(what, sizeof what, fmt, a, b);
  return err_set(r->err, r->err_len, ERR_CONFIG, "%s:%u: %s", r->name, r->line, what);
}

/* "COUNT v..." after the name into out[want]: exactly want numbers. */
static int get_nums(rd_t *r, char **save, const char *name, double *out, size_t want) {
  char *tok = strtok_r(NULL, " \t", save), *end;
  char cnt[32];
  snprintf(cnt, sizeof cnt, "%zu", want);
  if (!tok || strtoull(tok, &end, 10) != want || *end) return bad(r, "'%s' must give its count %s first", name, cnt);
  for (size_t i = 0; i < want; i++) {
    tok = strtok_r(NULL, " \t", save);
    if (!tok) return bad(r, "'%s' has fewer than %s numbers", name, cnt);
    errno = 0;
    out[i] = strtod(tok, &end);
    if (*end || errno || !isfinite(out[i])) return bad(r, "'%s': '%s' is not a finite number", name, tok);
  }
  if (strtok_r(NULL, " \t", save)) return bad(r, "'%s' has more than %s numbers", name, cnt);
  return 0;
}

/* One "name ..." line of a kind's section. */
static int kind_line(rd_t *r, shard_net_t *n, const char *w, char **save, uint32_t *have) {
  if (!strcmp(w, "shape")) {
    unsigned v[3];
    for (int i = 0; i < 3; i++) {
      char *t = strtok_r(NULL, " \t", save), *end;
      unsigned long x = t ? strtoul(t, &end, 10) : 0;
      if (!t || *end || x < 1 || x > SHARD_NET_MAX) return bad(r, "shape needs three sizes in [1, 256]%s%s", "", "");
      v[i] = (unsigned)x;
    }
    n->h1 = v[0], n->e = v[1], n->h2 = v[2];
    free(n->p);
    n->p = calloc(shard_net_size(n), sizeof *n->p);
    if (!n->p) return err_set(r->err, r->err_len, -ENOMEM, "%s: out of memory", r->name);
    *have |= 1u << 16;
    return 0;
  }
  if (!strcmp(w, "fitted")) {
    double v[4];
    char *t1 = strtok_r(NULL, " \t", save), *t2 = strtok_r(NULL, " \t", save), *t3 = strtok_r(NULL, " \t", save),
         *t4 = strtok_r(NULL, " \t", save);
    if (!t4) return bad(r, "fitted needs: sets fitted, sets held out, their median and p90 relative error%s%s", "", "");
    v[0] = strtod(t1, NULL), v[1] = strtod(t2, NULL), v[2] = strtod(t3, NULL), v[3] = strtod(t4, NULL);
    n->sets_fit = (uint64_t)v[0], n->sets_held = (uint64_t)v[1], n->held_med_rel = v[2], n->held_p90_rel = v[3];
    return 0;
  }
  if (!strcmp(w, "mean")) return (*have |= 1u << 17), get_nums(r, save, w, n->mean, SHARD_FEATURES);
  if (!strcmp(w, "sd")) {
    *have |= 1u << 18;
    int rc = get_nums(r, save, w, n->sd, SHARD_FEATURES);
    for (int i = 0; !rc && i < SHARD_FEATURES; i++)
      if (!(n->sd[i] > 0)) rc = bad(r, "sd of feature '%s' is not positive%s", shard_cost_feature_name(i), "");
    return rc;
  }
  for (int p = 0; p < NET_PARTS; p++)
    if (!strcmp(w, shard_net_part_name[p])) {
      if (!n->p) return bad(r, "'%s' before 'shape'%s", w, "");
      *have |= 1u << p;
      return get_nums(r, save, w, n->p + shard_net_off(n, p), shard_net_part_len(n, p));
    }
  return bad(r, "unknown entry '%s'%s", w, "");
}

/* "coll OP RANKS POINTS ALPHA_US US_PER_MB MED_REL" (the word coll read). */
static int coll_line(rd_t *r, shard_cost_t *m, char **save) {
  char *t = strtok_r(NULL, " \t", save), *end;
  int op = t ? shard_coll_parse(t) : -1;
  if (op < 0) return bad(r, "coll '%s' is not allreduce or alltoall%s", t ? t : "", "");
  if (m->coll[op].present) return bad(r, "coll %s appears twice%s", t, "");
  shard_coll_t c = {.present = 1};
  unsigned long v[2];
  for (int i = 0; i < 2; i++) {
    char *u = strtok_r(NULL, " \t", save);
    v[i] = u ? strtoul(u, &end, 10) : 0;
    if (!u || *end || v[i] < 2 || v[i] > 1000000)
      return bad(r, "coll %s needs RANKS (>= 2) and POINTS (>= 2) first%s", shard_coll_name(op), "");
  }
  c.ranks = (uint32_t)v[0], c.points = (uint32_t)v[1];
  double *d[3] = {&c.alpha_us, &c.us_per_mb, &c.med_rel};
  for (int i = 0; i < 3; i++) {
    char *u = strtok_r(NULL, " \t", save);
    errno = 0;
    *d[i] = u ? strtod(u, &end) : NAN;
    if (!u || *end || errno || !isfinite(*d[i]) || *d[i] < 0)
      return bad(r, "coll %s: ALPHA_US, US_PER_MB and MED_REL must be finite numbers >= 0 ('%s')", shard_coll_name(op),
                 u ? u : "missing");
  }
  if (strtok_r(NULL, " \t", save)) return bad(r, "coll %s has more than 5 numbers%s", shard_coll_name(op), "");
  m->coll[op] = c;
  return 0;
}

int shard_cost_parse(const char *text, const char *name, shard_cost_t **out, char *err, size_t err_len) {
  rd_t r = {name, 0, err, err_len};
  shard_cost_t *m = calloc(1, sizeof *m);
  char *copy = strdup(text), *save_line = NULL, *line;
  int rc = 0, kind = -1, saw_features = 0;
  uint32_t have = 0;
  const uint32_t all = ((1u << NET_PARTS) - 1) | (0x7u << 16);
  if (!m || !copy) {
    rc = err_set(err, err_len, -ENOMEM, "%s: out of memory", name);
    goto out;
  }
  /* strtok_r would skip empty lines and lose the count: split by hand */
  for (line = copy; line && !rc; line = save_line) {
    save_line = strchr(line, '\n');
    if (save_line) *save_line++ = 0;
    r.line++;
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[--l] = 0;
    if (r.line == 1) {
      if (strcmp(line, MAGIC)) rc = bad(&r, "not a cost model file: the first line must be '" MAGIC "', not '%.60s'%s", line, "");
      continue;
    }
    if (!strncmp(line, "label ", 6) || !strcmp(line, "label")) {
      snprintf(m->label, sizeof m->label, "%s", line + (l > 6 ? 6 : l));
      continue;
    }
    char *save = NULL, *w = strtok_r(line, " \t", &save);
    if (!w || w[0] == '#') continue;
    if (!strcmp(w, "features")) {
      char *t = strtok_r(NULL, " \t", &save);
      if (!t || atoi(t) != SHARD_FEATURES)
        rc = bad(&r, "the model has %s features; this build computes 18 (a model of another version: fit it again)%s",
                 t ? t : "no", "");
      saw_features = 1;
    } else if (!strcmp(w, "kind")) {
      char *t = strtok_r(NULL, " \t", &save);
      if (kind >= 0) rc = bad(&r, "'kind' inside kind %s: 'end' is missing%s", shard_kind_name(kind), "");
      else if (!saw_features) rc = bad(&r, "'kind' before 'features'%s%s", "", "");
      else if (!t || (kind = shard_kind_parse(t)) < 0) rc = bad(&r, "kind '%s' is not trainer or server%s", t ? t : "", "");
      else if (m->net[kind].present) rc = bad(&r, "kind %s appears twice%s", t, "");
      else have = 0;
    } else if (!strcmp(w, "end")) {
      if (kind < 0) rc = bad(&r, "'end' outside a kind%s%s", "", "");
      else if ((have & all) != all) rc = bad(&r, "kind %s lacks some of shape, mean, sd, w1..b4%s", shard_kind_name(kind), "");
      else m->net[kind].present = 1, kind = -1;
    } else if (!strcmp(w, "coll") && kind < 0) {
      rc = coll_line(&r, m, &save);
    } else if (kind < 0) {
      rc = bad(&r, "'%s' outside a kind section%s", w, "");
    } else {
      rc = kind_line(&r, &m->net[kind], w, &save, &have);
    }
  }
  if (!rc && kind >= 0) rc = bad(&r, "the file ends inside kind %s ('end' is missing)%s", shard_kind_name(kind), "");
  if (!rc && !m->net[0].present && !m->net[1].present) rc = bad(&r, "no kind (trainer or server) in the file%s%s", "", "");
out:
  free(copy);
  if (rc) shard_cost_destroy(m), m = NULL;
  *out = m;
  return rc;
}

int shard_cost_load(const char *path, shard_cost_t **out, char *err, size_t err_len) {
  *out = NULL;
  if (!path || !*path) {
    if (!shard_cost_default_len)
      return err_set(err, err_len, ERR_NOTFOUND,
                     "no default cost model in this build (the tree had no " SHARD_COST_DEFAULT_PATH
                     "): measure this machine with `chanter bench tables`, fit a model with `chanter shard fit --data "
                     "FILE --out MODEL` and name it with shard.cost_model or --model");
    return shard_cost_parse(shard_cost_default_text, SHARD_COST_DEFAULT_PATH " (built in)", out, err, err_len);
  }
  char *text = NULL;
  int rc = fsio_read_all(path, 64u << 20, &text, NULL, err, err_len);
  if (rc) return rc;
  rc = shard_cost_parse(text, path, out, err, err_len);
  free(text);
  return rc;
}
