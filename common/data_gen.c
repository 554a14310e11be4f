/*
 * data_gen: the synthetic dataset (dataset = synthetic) and `chanter data
 * gen`, which writes the same samples to a file.
 *
 * Sample i is a pure function of (job seed, i, schema, synthetic.*): a
 * counter-based generator seeded from (seed, i) draws it, so any sample can
 * be produced alone (random access, like a mapped file) and the file that
 * `chanter data gen` writes reads back as exactly the batches that
 * dataset = synthetic serves.  Nothing depends on synthetic.samples but the
 * sample count (and with it the train/test split).
 *
 * A sample, in draw order:
 *   - n_dense integer counts: missing (an empty TSV field, 0) with
 *     probability 0.1, else floor(expm1(g)) with g uniform in [0, 6): heavy
 *     tailed, 0 .. 402, so log(1 + x) is roughly uniform like Criteo's;
 *   - for each table t, hotness[t] values: a popularity rank r in
 *     [0, table_rows[t]) (rank 0 the hottest) drawn from
 *       * synthetic.hot_share = p > 0: with probability p/100 uniform among
 *         the hottest ceil(1% of rows) ranks, else uniform among the rest;
 *       * else Zipf(alpha_t) over the ranks: P(r) ~ 1/(r+1)^alpha_t, with
 *         alpha_t table t's entry of synthetic.table_alpha, or
 *         synthetic.alpha for every table when that key is empty (the
 *         default: the same bytes as before the key existed); sampled in
 *         O(1) by rejection-inversion (Hoermann and Derflinger 1996, as in
 *         Apache Commons RNG); alpha_t = 0 is uniform.
 *     The rank goes through a fixed bijection of the 32-bit space (64-bit
 *     for tables above 2^32 rows), keyed by (seed, t), to the raw value,
 *     written as 8 (16) lowercase hex digits: hot values are spread over
 *     the id space, and the raw text hashes (data_hash64) like any Criteo
 *     value, so TSV read back is identical to binary written directly.
 *     Distinct ranks can still meet in one row through the hash modulo
 *     table_rows, as real data does.
 *   - the label, Bernoulli(sigmoid(z)) with the planted logit
 *       z = signal * (w . dense + sum over t, k of v_t(row_tk) + b)
 *     w_j and v_t(row) uniform in [-c, c], deterministic from the seed
 *     (v from (seed, t, row): the row, not the raw value, so an embedding
 *     row can learn it), scaled so that with signal = 1 the dense part has
 *     variance ~1 and the categorical part ~2, b sets the click rate.
 *
 * synthetic.preset = sessions (independent, the default, is all of the
 * above and nothing else) adds users, as a time-ordered log has them:
 * synthetic.active_users users are in a session at any moment, and their
 * impressions interleave.  Sample i belongs to one of those slots (a pure
 * function of (seed, i)); each slot's timeline is cut into sessions of
 * active_users * session_mean samples of the whole log (so a session holds
 * session_mean of its user's samples on average, spread over that span),
 * the cuts staggered per slot.  A session's user is a Zipf(user_alpha)
 * rank over synthetic.users drawn from (seed, slot, session), rank 0 the
 * heaviest user.  Random access is kept: O(1) per sample.  In each user
 * table (synthetic.user_tables) the sample takes the user's own values
 * instead of drawing them: in the first user table the user id itself
 * (rank = user mod rows), in the others ranks drawn as above from (seed,
 * user, table) -- demographics, device: hot values shared by many users.
 * Everything else (dense, other tables, the label's draw) is drawn per
 * sample exactly as in independent, and the planted logit covers the user
 * rows too.
 *
 * What a model can reach: the planted logit is the Bayes-optimal predictor.
 * With the default job (Criteo shape, alpha 1.05, signal 1, seed 42) it
 * gives AUC 0.83 and log loss 0.435 at a click rate of 0.28 (logit sd 1.6;
 * measured on the first 200k samples); signal = 2 gives AUC 0.94, log loss
 * 0.26.  A model that learns w and every row's v reaches that and none can
 * beat it in expectation; rows seen rarely cannot be learned, so a real
 * model ends somewhat below (test_data_gen.c: a logistic regression on a
 * small schema gets 0.80 where the planted logit gets 0.83).  signal = 0
 * makes labels coin flips (AUC 0.5).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_internal.h"
#include "err.h"
#include "fsio.h"

#define DENSE_MISSING 0.1
#define DENSE_GMAX 6.0
#define DENSE_MEAN 2.55 /* E[log1p(x)] of the counts above, about */
#define DENSE_VAR 3.5   /* and its variance */
#define VAR_DENSE_PART 1.0
#define VAR_CAT_PART 2.0
#define BIAS (-1.2)

typedef struct tgen_s {
  uint64_t rows, hot;   /* hot: ranks in the hottest 1% (hot_share) */
  double alpha;         /* the table's Zipf exponent (data_table_alpha) */
  uint64_t key;         /* bijection key */
  int wide;             /* rows > 2^32: 64-bit raw values */
  /* rejection-inversion constants */
  double hx1, hn, s;
} tgen_t;


struct data_synth_s {
  data_schema_t s;
  /* synthetic.preset = sessions */
  int sessions;
  uint64_t users, sess_key, user_key;
  uint64_t active, span; /* users in a session at once; a session's span of the log, in samples */
  double user_alpha;
  tgen_t utab;          /* Zipf over users */
  uint8_t *user_tab;    /* n_tables: 1 = fixed per user */
  uint32_t id_table;    /* the first user table: the user id */
  uint64_t seed, seed_key, v_seed;
  uint64_t *tseed;
  uint32_t ids;
  size_t record_bytes;
  double hot_p, signal, c_v, bias;
  int criteo;
  tgen_t *tab;
  double *w;
};

/* ---- randomness ---- */

typedef struct rng_s {
  uint64_t s;
} rng_t;

static inline uint64_t rng_next(rng_t *r) {
  r->s += UINT64_C(0x9e3779b97f4a7c15);
  return table_mix64(r->s);
}
static inline double rng_unif(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }
static inline uint64_t rng_below(rng_t *r, uint64_t n) {
  uint64_t x = (uint64_t)(rng_unif(r) * (double)n);
  return x < n ? x : n - 1;
}
/* uniform in [-1, 1) from a key */
static inline double unit_of(uint64_t key) { return (double)(table_mix64(key) >> 11) * 0x1p-52 - 1.0; }

/* ---- Zipf by rejection-inversion ---- */

static double helper1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
static double helper2(double x) {
  return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
static double h_int(double x, double a) {
  double lx = log(x);
  return helper2((1 - a) * lx) * lx;
}
static double h_fn(double x, double a) { return exp(-a * log(x)); }
static double h_int_inv(double x, double a) {
  double t = x * (1 - a);
  if (t < -1) t = -1;
  return exp(helper1(t) * x);
}

static void zipf_init(tgen_t *t, double a) {
  t->hx1 = h_int(1.5, a) - 1;
  t->hn = h_int((double)t->rows + 0.5, a);
  t->s = 2 - h_int_inv(h_int(2.5, a) - h_fn(2, a), a);
}

/* k in [1, rows] with P(k) ~ k^-a */
static uint64_t zipf_sample(const tgen_t *t, double a, rng_t *r) {
  for (;;) {
    double u = t->hn + rng_unif(r) * (t->hx1 - t->hn);
    double x = h_int_inv(u, a);
    double kd = floor(x + 0.5);
    uint64_t k = kd < 1 ? 1 : kd > (double)t->rows ? t->rows : (uint64_t)kd;
    if ((double)k - x <= t->s || u >= h_int((double)k + 0.5, a) - h_fn((double)k, a)) return k;
  }
}

void data_zipf_init(data_zipf_t *z, uint64_t rows, double alpha) {
  tgen_t t = {.rows = rows ? rows : 1, .alpha = alpha};
  if (alpha > 0) zipf_init(&t, alpha);
  *z = (data_zipf_t){.rows = t.rows, .alpha = alpha, .hx1 = t.hx1, .hn = t.hn, .s = t.s};
}

uint64_t data_zipf_rank(const data_zipf_t *z, uint64_t *state) {
  rng_t r = {*state};
  uint64_t k;
  if (z->alpha == 0) {
    k = rng_below(&r, z->rows);
  } else {
    tgen_t t = {.rows = z->rows, .alpha = z->alpha, .hx1 = z->hx1, .hn = z->hn, .s = z->s};
    k = zipf_sample(&t, z->alpha, &r) - 1;
  }
  *state = r.s;
  return k;
}

static uint64_t draw_rank(const data_synth_t *g, const tgen_t *t, rng_t *r) {
  if (g->hot_p > 0) {
    if (t->hot >= t->rows) return rng_below(r, t->rows);
    if (rng_unif(r) < g->hot_p) return rng_below(r, t->hot);
    return t->hot + rng_below(r, t->rows - t->hot);
  }
  if (t->alpha == 0) return rng_below(r, t->rows);
  return zipf_sample(t, t->alpha, r) - 1;
}

/* ---- sessions ---- */

/* i's session: its slot (*slot) and the first sample of the log its
 * session spans (*start); returns the session's key. */
static uint64_t session_of(const data_synth_t *g, uint64_t i, uint64_t *slot, uint64_t *start) {
  uint64_t k = table_mix64(g->sess_key ^ table_mix64(i)) % g->active;
  uint64_t phase = table_mix64(g->sess_key + 3 + table_mix64(k)) % g->span;
  uint64_t n = (i + phase) / g->span;
  if (slot) *slot = k;
  if (start) *start = n * g->span > phase ? n * g->span - phase : 0;
  return table_mix64(g->sess_key + 1 + table_mix64(k) + table_mix64(n ^ UINT64_C(0x5e55)));
}

/* The user of a session (its key): a rank, 0 the heaviest. */
static uint64_t session_user(const data_synth_t *g, uint64_t key) {
  rng_t r = {key};
  if (g->user_alpha == 0) return rng_below(&r, g->users);
  return zipf_sample(&g->utab, g->user_alpha, &r) - 1;
}

uint64_t data__synth_user(const data_synth_t *g, uint64_t i, uint64_t *slot, uint64_t *start) {
  if (!g->sessions) {
    if (slot) *slot = 0;
    if (start) *start = 0;
    return 0;
  }
  return session_user(g, session_of(g, i, slot, start));
}

/* rank -> raw value: bijections of [0, 2^32) and [0, 2^64) */
static uint32_t perm32(uint32_t x, uint64_t key) {
  x ^= (uint32_t)key;
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  x += (uint32_t)(key >> 32);
  x *= 0x85ebca77u;
  x ^= x >> 13;
  x *= 0xc2b2ae3du;
  x ^= x >> 16;
  return x;
}
static uint64_t perm64(uint64_t x, uint64_t key) { return table_mix64(table_mix64(x ^ key) + key); }

static const char hexd[16] = "0123456789abcdef";

static size_t put_hex(char *o, uint64_t v, int digits) {
  for (int i = digits - 1; i >= 0; i--, v >>= 4) o[i] = hexd[v & 15];
  return (size_t)digits;
}

static size_t put_uint(char *o, uint64_t v) {
  char tmp[24];
  size_t n = 0;
  do tmp[n++] = (char)('0' + v % 10), v /= 10;
  while (v);
  for (size_t i = 0; i < n; i++) o[i] = tmp[n - 1 - i];
  return n;
}

/* ---- one sample ---- */

static double gen(const data_synth_t *g, uint64_t i, uint8_t *rec, char *tsv, size_t *tsv_len) {
  rng_t r = {table_mix64(g->seed_key ^ table_mix64(i))};
  const data_schema_t *s = &g->s;
  uint64_t user = g->sessions ? session_user(g, session_of(g, i, NULL, NULL)) : 0;
  size_t o = 2; /* the label goes first, once known */
  double z = g->bias;
  uint8_t *dp = rec + 4, *hp = rec + 4 + 4 * (size_t)s->n_dense;
  for (uint32_t j = 0; j < s->n_dense; j++) {
    double u = rng_unif(&r);
    uint64_t x = 0;
    int missing = u < DENSE_MISSING;
    if (!missing) x = (uint64_t)floor(expm1((u - DENSE_MISSING) / (1 - DENSE_MISSING) * DENSE_GMAX));
    float f = data_norm_int((double)x);
    memcpy(dp + 4 * (size_t)j, &f, 4);
    z += g->w[j] * (double)f;
    if (tsv) {
      if (!missing) o += put_uint(tsv + o, x);
      tsv[o++] = '\t';
    }
  }
  for (uint32_t t = 0; t < s->n_tables; t++) {
    const tgen_t *tg = &g->tab[t];
    int fixed = g->sessions && g->user_tab[t];
    rng_t ur = {fixed ? table_mix64(g->user_key ^ table_mix64(user) ^ table_mix64(UINT64_C(0x7573657200) + t)) : 0};
    for (uint32_t k = 0; k < s->hotness[t]; k++, hp += 8) {
      uint64_t rank;
      if (!fixed) rank = draw_rank(g, tg, &r);
      else if (t == g->id_table && k == 0) rank = user % tg->rows;
      else rank = draw_rank(g, tg, &ur);
      char raw[16];
      size_t rl = tg->wide ? put_hex(raw, perm64(rank, tg->key), 16) : put_hex(raw, perm32((uint32_t)rank, tg->key), 8);
      uint64_t h = data__hash(g->tseed[t], raw, rl);
      memcpy(hp, &h, 8);
      z += g->c_v * unit_of(g->v_seed ^ table_mix64(TABLE_KEY(t, h % tg->rows)));
      if (tsv) {
        memcpy(tsv + o, raw, rl);
        o += rl;
        tsv[o++] = '\t';
      }
    }
  }
  z *= g->signal;
  float label = rng_unif(&r) < 1.0 / (1.0 + exp(-z)) ? 1.0f : 0.0f;
  memcpy(rec, &label, 4);
  if (tsv) {
    tsv[0] = label != 0 ? '1' : '0';
    tsv[1] = '\t';
    tsv[o - 1] = '\n'; /* the last tab */
    *tsv_len = o;
  }
  return z;
}

void data__synth_sample(const data_synth_t *g, uint64_t i, uint8_t *rec, char *tsv, size_t *tsv_len) {
  gen(g, i, rec, g->criteo ? tsv : NULL, tsv_len);
}

double data__synth_logit(const data_synth_t *g, uint64_t i) {
  uint8_t stackrec[1024], *rec = g->record_bytes <= sizeof stackrec ? stackrec : malloc(g->record_bytes);
  if (!rec) return 0;
  double z = gen(g, i, rec, NULL, NULL);
  if (rec != stackrec) free(rec);
  return z;
}

/* ---- setup ---- */

static int is_criteo(const data_schema_t *s) {
  if (s->n_dense != 13 || s->n_tables != 26) return 0;
  for (uint32_t t = 0; t < s->n_tables; t++)
    if (s->hotness[t] != 1) return 0;
  return 1;
}

void data__synth_destroy(data_synth_t *g) {
  if (!g) return;
  data_schema_close(&g->s);
  free(g->tseed);
  free(g->user_tab);
  free(g->tab);
  free(g->w);
  free(g);
}

/* synthetic.preset = sessions: users, sessions, user tables.  0 or ERR_CONFIG / -ENOMEM. */
static int sessions_setup(data_synth_t *g, const cfg_t *cfg, char *err, size_t err_len) {
  const data_schema_t *s = &g->s;
  g->sessions = 1;
  g->users = (uint64_t)cfg_int(cfg, "synthetic.users");
  g->user_alpha = cfg_float(cfg, "synthetic.user_alpha");
  g->active = (uint64_t)cfg_int(cfg, "synthetic.active_users");
  double span = cfg_float(cfg, "synthetic.session_mean") * (double)g->active;
  g->span = span < 1 ? 1 : (uint64_t)span;
  g->sess_key = table_mix64(g->seed_key ^ UINT64_C(0x73657373696f6e73));
  g->user_key = table_mix64(g->sess_key + 7);
  g->utab.rows = g->users;
  if (g->user_alpha > 0) zipf_init(&g->utab, g->user_alpha);
  if (!(g->user_tab = calloc(s->n_tables ? s->n_tables : 1, 1))) return -ENOMEM;
  const char *list = cfg_str(cfg, "synthetic.user_tables");
  if (!*list) {
    uint32_t n = (uint32_t)((s->n_tables * 5 + 11) / 22); /* round(n_tables * 5 / 22) */
    if (n < 1) n = 1;
    if (n > s->n_tables) n = s->n_tables;
    for (uint32_t t = 0; t < n; t++) g->user_tab[t] = 1;
  } else {
    for (const char *q = list; *q;) {
      char *end;
      unsigned long long t = strtoull(q, &end, 10);
      if (t >= s->n_tables)
        return err_set(err, err_len, ERR_CONFIG, "synthetic.user_tables (from %s) names table %llu, but the job has %u tables",
                       cfg_origin(cfg, "synthetic.user_tables"), t, s->n_tables);
      g->user_tab[t] = 1;
      q = *end == ',' ? end + 1 : end;
    }
  }
  g->id_table = 0;
  while (g->id_table < s->n_tables && !g->user_tab[g->id_table]) g->id_table++;
  return 0;
}

int data__synth_create(const cfg_t *cfg, const data_schema_t *s, data_synth_t **out, char *err, size_t err_len) {
  data_synth_t *g = calloc(1, sizeof *g);
  if (!g) return -ENOMEM;
  if (data__schema_copy(&g->s, s)) {
    free(g);
    return -ENOMEM;
  }
  g->seed = (uint64_t)cfg_int(cfg, "seed");
  g->seed_key = table_mix64(g->seed ^ UINT64_C(0x73796e7468657469));
  g->v_seed = table_mix64(g->seed_key + 1);
  g->ids = data__ids(s);
  g->record_bytes = data__record_bytes(s, g->ids);
  g->hot_p = cfg_float(cfg, "synthetic.hot_share") / 100.0;
  g->signal = cfg_float(cfg, "synthetic.signal");
  g->criteo = is_criteo(s);
  g->tseed = data__table_seeds(s);
  g->tab = calloc(s->n_tables, sizeof *g->tab);
  g->w = calloc(s->n_dense + 1, sizeof *g->w);
  double *alpha = calloc(s->n_tables ? s->n_tables : 1, sizeof *alpha);
  if (!g->tseed || !g->tab || !g->w || !alpha) {
    free(alpha);
    data__synth_destroy(g);
    return -ENOMEM;
  }
  /* each table's exponent: synthetic.table_alpha, else synthetic.alpha for all */
  int rc = data_table_alpha(cfg, s->n_tables, alpha, err, err_len);
  if (rc) {
    free(alpha);
    data__synth_destroy(g);
    return rc;
  }
  for (uint32_t t = 0; t < s->n_tables; t++) {
    tgen_t *tg = &g->tab[t];
    tg->rows = s->table_rows[t];
    tg->hot = (tg->rows + 99) / 100;
    tg->key = table_mix64(g->seed_key + 2 + t);
    tg->wide = tg->rows > UINT64_C(0xffffffff);
    tg->alpha = alpha[t];
    if (tg->alpha > 0) zipf_init(tg, tg->alpha);
  }
  free(alpha);
  /* uniform weights on [-c, c] have variance c^2 / 3 */
  double cw = s->n_dense ? sqrt(3.0 * VAR_DENSE_PART / (s->n_dense * DENSE_VAR)) : 0;
  g->bias = BIAS;
  for (uint32_t j = 0; j < s->n_dense; j++) {
    g->w[j] = cw * unit_of(g->seed_key + 1000003 * (j + 1));
    g->bias -= g->w[j] * DENSE_MEAN;
  }
  g->c_v = sqrt(3.0 * VAR_CAT_PART / g->ids);
  if (!strcmp(cfg_str(cfg, "synthetic.preset"), "sessions")) {
    rc = sessions_setup(g, cfg, err, err_len);
    if (rc) {
      if (rc == -ENOMEM) err_set(err, err_len, rc, "out of memory");
      data__synth_destroy(g);
      return rc;
    }
  }
  *out = g;
  return 0;
}

/* ---- the synthetic source ---- */

static int synth_rec(data_source_t *d, uint64_t i, uint8_t *scratch, const uint8_t **rec, char *err, size_t err_len) {
  (void)err;
  (void)err_len;
  gen(d->impl, i, scratch, NULL, NULL);
  *rec = scratch;
  return 0;
}

static void synth_close(data_source_t *d) {
  data__synth_destroy(d->impl);
  d->impl = NULL;
}

static const data_ops_t synth_ops = {synth_rec, synth_close};

int data__open_synthetic(data_source_t *d, const cfg_t *cfg, char *err, size_t err_len) {
  d->ops = &synth_ops;
  int rc = data__synth_create(cfg, &d->schema, (data_synth_t **)&d->impl, err, err_len);
  if (rc) return rc;
  d->samples = (uint64_t)cfg_int(cfg, "synthetic.samples");
  return 0;
}

/* ---- chanter data gen ---- */

static int gen_tsv(const data_synth_t *g, const char *out, uint64_t samples, char *err, size_t err_len) {
  size_t cap = 1 << 20, used = 0;
  char *buf = malloc(cap);
  uint8_t *rec = malloc(g->record_bytes);
  fsio_tmp_t t;
  int rc = 0, fd;
  if (!buf || !rec) {
    rc = -ENOMEM;
    goto out;
  }
  if ((rc = fsio_replace_open(&t, out, 0644, err, err_len)) != 0) goto out;
  fd = fileno(t.f); /* written with write(2): nothing goes through t.f's buffer */
  for (uint64_t i = 0; i < samples && !rc; i++) {
    if (cap - used < DATA_SYNTH_TSV_MAX) {
      rc = data__write_all(fd, buf, used);
      used = 0;
    }
    size_t n = 0;
    gen(g, i, rec, buf + used, &n);
    used += n;
  }
  if (!rc) rc = data__write_all(fd, buf, used);
  if (rc) err_set(err, err_len, rc, "%s: write failed: %s", t.tmp, strerror(-rc));
  int crc = fsio_replace_commit(&t, rc == 0, rc ? NULL : err, rc ? 0 : err_len); /* removes the temporary on failure */
  if (!rc) rc = crc;
out:
  free(buf);
  free(rec);
  return rc;
}

static int gen_binary(const data_synth_t *g, const char *out, uint64_t samples, char *err, size_t err_len) {
  data_writer_t *w;
  uint8_t *rec = malloc(g->record_bytes);
  if (!rec) return -ENOMEM;
  int rc = data__writer_open(out, &g->s, &w, err, err_len);
  for (uint64_t i = 0; i < samples && !rc; i++) {
    gen(g, i, rec, NULL, NULL);
    if ((rc = data__writer_add(w, rec)) != 0) {
      err_set(err, err_len, rc, "%s: write failed: %s", out, strerror(-rc));
      data__writer_abort(w);
    }
  }
  if (!rc) rc = data__writer_finish(w, 0, err, err_len);
  free(rec);
  return rc;
}

int data_gen(const cfg_t *cfg, const char *out, int format, uint64_t samples, char *err, size_t err_len) {
  data_schema_t s;
  data_synth_t *g = NULL;
  int rc = data_schema_from_cfg(cfg, &s, err, err_len);
  if (rc) return rc;
  if (!samples) samples = (uint64_t)cfg_int(cfg, "synthetic.samples");
  if ((rc = data__synth_create(cfg, &s, &g, err, err_len)) != 0) goto out;
  if (format == DATA_FMT_CRITEO) {
    if (!g->criteo) {
      rc = err_set(err, err_len, ERR_CONFIG,
                "Criteo TSV holds 13 integers and 26 one-hot categoricals, but the job has n_dense = %u (from %s) and "
                "%u tables (table_rows from %s)%s: use --format binary for this schema",
                s.n_dense, cfg_origin(cfg, "n_dense"), s.n_tables, cfg_origin(cfg, "table_rows"),
                data__ids(&s) != s.n_tables ? ", multi-hot (table_hotness)" : "");
      goto out;
    }
    rc = gen_tsv(g, out, samples, err, err_len);
  } else if (format == DATA_FMT_BINARY) {
    rc = gen_binary(g, out, samples, err, err_len);
  } else {
    rc = err_set(err, err_len, -EINVAL, "data gen writes criteo (tsv) or binary, not %s", data_format_name(format));
  }
out:
  data__synth_destroy(g);
  data_schema_close(&s);
  return rc;
}

int data_table_alpha(const cfg_t *cfg, uint32_t n_tables, double *out, char *err, size_t err_len) {
  char **v = NULL;
  size_t n = 0;
  int rc = cfg_list(cfg, "synthetic.table_alpha", &v, &n);
  if (rc) return err_set(err, err_len, rc, "synthetic.table_alpha: cannot read it");
  if (n && n != n_tables) {
    cfg_list_free(v, n);
    return err_set(err, err_len, ERR_CONFIG, "synthetic.table_alpha (%s): %zu values for %u tables (table_rows)",
                   cfg_origin(cfg, "synthetic.table_alpha"), n, n_tables);
  }
  for (uint32_t t = 0; t < n_tables && !rc; t++) {
    char *end;
    double a = n ? strtod(v[t], &end) : cfg_float(cfg, "synthetic.alpha");
    if (n && (end == v[t] || *end || !(a >= 0 && a <= 10)))
      rc = err_set(err, err_len, ERR_CONFIG, "synthetic.table_alpha (%s): entry %u is '%s', not a number in [0, 10]",
                   cfg_origin(cfg, "synthetic.table_alpha"), t + 1, v[t]);
    out[t] = a;
  }
  cfg_list_free(v, n);
  return rc;
}
