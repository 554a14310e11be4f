/*
 * chanter bench tables: the micro-benchmark that AutoShard's cost model is
 * fitted to (papers/autoshard.txt section 4.1 and appendix B.1;
 * docs/autoshard.md).  It draws SETS of 1 to 8 embedding tables from a
 * seed and times, on this machine, what one iteration of those tables
 * costs on the device that holds them:
 *
 *   trainer   a partitioned table's owner (trainer_partition.h): embag_fwd
 *             pools the set's tables for the whole global batch, then
 *             embag_bwd_each folds the pooled gradients per row in sample
 *             order and applies the row optimizer (opt_row_update, as
 *             trainer_step_row_update does) and the dirty mark, on a pool
 *             of pool_default_threads() threads as the CPU model's
 *             (model_set_threads(0)).  The AlltoAll of the pooled
 *             embeddings and gradients is not part of it.  One dim and one
 *             row optimizer per set, as a trainer has (one embag per
 *             owner, one embedding_optimizer per job).
 *   server    an embedding server holding the set (one RocksDB store in a
 *             temporary directory, opened as chanter-embedding opens it,
 *             every row written once): the Lookup of the distinct keys of
 *             one batch (store_rows_bytes + store_lookup) and the WriteBack
 *             of those rows (store_write), in calls of at most
 *             embedding.max_lookup_keys / max_write_keys keys, as the
 *             service's handlers run them -- in process: the gRPC
 *             transport is not included.  Dims per table (table_dims).
 *
 * Each set: two warm-up iterations (server: one per batch, so the memory
 * tier holds the batches' rows as in a steady state), then at least 5
 * timed iterations (3 with --quick), more while they add up to under
 * 0.25 s, at most 25; the cost is their median.  Iterations cycle over 4
 * batches of ids drawn per table with the synthetic generator's Zipf
 * (data_zipf_rank, the table's alpha) and hashed onto its rows, as the
 * synthetic data lands on rows.
 *
 * The dataset (docs/autoshard.md, "The micro-benchmark"): text, '#'
 * comments first (`# chanter bench tables v1`, cpu, threads, date, ...),
 * then one line per set:
 *   <kind> <batch> <cost_us> <n> then n groups <rows> <dim> <hotness> <alpha> <opt>
 * opt is the row optimizer's name (sgd, adagrad, rowwise_adagrad).  Then
 * the collectives (bench_tables_coll.c, --coll-ranks, 2 by default):
 *   coll <allreduce|alltoall> <ranks> <bytes> <cost_us>
 * The
 * file is replaced whole (fsio_replace) every 10 sets and at the end, so
 * it never appears half written and a long run stopped early keeps what
 * it measured.  Nothing here is a threshold: it measures and prints.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_tables_coll.h"
#include "bench_util.h"
#include "cli.h"
#include "clock.h"
#include "data.h"
#include "embag.h"
#include "fsio.h"
#include "log.h"
#include "opt.h"
#include "pool.h"
#include "sbuf.h"
#include "store.h"
#include "table.h"

#define SET_MAX 8       /* tables in a set */
#define N_BATCHES 4     /* batches of ids the iterations cycle over */
#define MIN_REPS 5
#define MAX_REPS 25
#define REP_SECONDS 0.25 /* timed iterations go on (to MAX_REPS) while under this */
#define SAVE_EVERY 10   /* sets between two replaces of the dataset */
#define QUIET_CPUS 0.1  /* other processes using more CPUs than this during a round: it is timed again */
#define TRIES 5         /* rounds at most */

enum { KIND_TRAINER, KIND_SERVER, KINDS };
static const char *const kind_name[KINDS] = {"trainer", "server"};
static const uint32_t dims[] = {8, 16, 32, 64, 128};
static const opt_kind_t opts[] = {OPT_SGD, OPT_ADAGRAD, OPT_ROWWISE_ADAGRAD};

typedef struct btab_s {
  uint64_t rows;
  uint32_t dim, hot;
  double alpha;
  opt_kind_t opt;
} btab_t;

typedef struct bset_s {
  int kind;
  uint32_t n;
  btab_t t[SET_MAX];
} bset_t;

/* what a run draws from, and its results */
typedef struct run_s {
  cfg_t *cfg;
  pool_t *pool;
  uint32_t batch;
  uint64_t seed, first; /* sets first, first + 1, ... of each kind */
  int quick;
  uint64_t rows_lo, rows_hi[KINDS]; /* rows per table, log-uniform */
  size_t set_bytes[KINDS];          /* a set's rows (vectors + state) at most */
  const char *out;
  char tmp[64];                     /* the server stores' directory */
  sbuf_t head, body, coll;          /* the dataset so far: its first comments, its sets, the collectives */
  double *cost[KINDS];              /* microseconds of each set measured */
  double *others[KINDS];            /* CPUs other processes used while it was timed (NAN: unknown) */
  size_t done[KINDS];
  double secs[KINDS];
} run_t;

/* ---- drawing the sets: a pure function of (seed, kind, set index) */

static uint64_t rnd(uint64_t *s) {
  *s += UINT64_C(0x9e3779b97f4a7c15);
  return table_mix64(*s);
}
static double unif(uint64_t *s) { return (double)(rnd(s) >> 11) * 0x1p-53; }
static uint32_t below(uint64_t *s, uint32_t n) { return (uint32_t)(unif(s) * n) % n; }

static size_t row_bytes(const btab_t *t) {
  return (size_t)(t->dim + opt_row_state_floats(t->opt, t->dim)) * sizeof(float);
}

static void draw_set(const run_t *r, int kind, uint64_t index, bset_t *set) {
  uint64_t s = table_mix64(r->seed ^ table_mix64(((uint64_t)kind << 40) + index + 1));
  set->kind = kind;
  set->n = 1 + below(&s, SET_MAX);
  uint32_t dim = dims[below(&s, sizeof dims / sizeof dims[0])];
  opt_kind_t opt = opts[below(&s, sizeof opts / sizeof opts[0])];
  double lo = log((double)r->rows_lo), hi = log((double)r->rows_hi[kind]);
  size_t bytes = 0;
  for (uint32_t k = 0; k < set->n; k++) {
    btab_t *t = &set->t[k];
    t->rows = (uint64_t)llround(exp(lo + unif(&s) * (hi - lo)));
    t->dim = kind == KIND_SERVER ? dims[below(&s, sizeof dims / sizeof dims[0])] : dim; /* a trainer: one dim */
    t->hot = (uint32_t)llround(exp(unif(&s) * log(100.0)));
    t->alpha = round(unif(&s) * 120) / 100; /* 0 .. 1.2 */
    t->opt = opt;
    bytes += t->rows * row_bytes(t);
  }
  if (bytes > r->set_bytes[kind]) { /* within memory: every table's rows scaled down alike */
    double f = (double)r->set_bytes[kind] / (double)bytes;
    for (uint32_t k = 0; k < set->n; k++) {
      uint64_t rows = (uint64_t)((double)set->t[k].rows * f);
      set->t[k].rows = rows < r->rows_lo ? r->rows_lo : rows;
    }
  }
}

/* ids[b][k]: table k's batch * hot ids of batch b (sample-major), drawn
 * with the table's Zipf and hashed onto its rows.  One allocation per
 * batch (ids[b][0] is it).  0 or -ENOMEM. */
static int draw_ids(const run_t *r, const bset_t *set, uint64_t index, uint64_t *ids[N_BATCHES][SET_MAX]) {
  size_t per = 0;
  for (uint32_t k = 0; k < set->n; k++) per += (size_t)r->batch * set->t[k].hot;
  for (int b = 0; b < N_BATCHES; b++) {
    uint64_t *p = malloc(per * sizeof *p);
    if (!p) return -ENOMEM;
    for (uint32_t k = 0; k < set->n; k++) {
      const btab_t *t = &set->t[k];
      data_zipf_t z;
      data_zipf_init(&z, t->rows, t->alpha);
      uint64_t key = table_mix64(r->seed + ((uint64_t)set->kind << 48) + index * SET_MAX + k);
      uint64_t s = table_mix64(key + (uint64_t)b + 1);
      ids[b][k] = p;
      for (size_t j = 0, m = (size_t)r->batch * t->hot; j < m; j++)
        *p++ = table_mix64(data_zipf_rank(&z, &s) ^ key) % t->rows;
    }
  }
  return 0;
}

static void free_ids(uint64_t *ids[N_BATCHES][SET_MAX]) {
  for (int b = 0; b < N_BATCHES; b++) free(ids[b][0]);
}

/* ---- timing one set, and what else ran meanwhile */

/* The machine's busy CPU ticks (every CPU: user, nice, system, irq,
 * softirq, steal) and this process's (user + system, every thread), from
 * /proc.  0, or -1 where /proc cannot be read (no contention figure). */
static int cpu_ticks(uint64_t *busy, uint64_t *self) {
  unsigned long long v[8] = {0}, ut = 0, st = 0;
  char buf[1024];
  FILE *f = fopen("/proc/stat", "r");
  int ok = f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7]) == 8;
  if (f) fclose(f);
  f = fopen("/proc/self/stat", "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* after the command's name: state is field 3, utime 14, stime 15 */
  ok = ok && p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2;
  if (!ok) return -1;
  *busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* not idle (3), not iowait (4) */
  *self = ut + st;
  return 0;
}

/* one iteration of a set on batch b (of N_BATCHES): 0 or an error (why) */
typedef int (*iteration_fn)(void *ctx, int b, char *why, size_t why_len);

typedef struct timing_s {
  double us;     /* the median microseconds of one iteration */
  int reps;      /* timed iterations */
  int tries;     /* rounds of them (more when other processes ran) */
  double others; /* CPUs that other processes used during the kept round (NAN: unknown) */
} timing_t;

/* warm iterations, then rounds of timed ones (at least MIN_REPS, more
 * while under REP_SECONDS, at most MAX_REPS; batches cycling), a round
 * again (after a pause, at most TRIES rounds) while other processes used
 * more than QUIET_CPUS of the machine during it: the round they disturbed
 * least is kept.  0 or fn's error. */
static int timed(const run_t *r, iteration_fn fn, void *ctx, int warm, timing_t *out, char *why, size_t why_len) {
  double t[MAX_REPS];
  int rc = 0, w = 0;
  *out = (timing_t){.others = INFINITY};
  for (; w < warm && !rc; w++) rc = fn(ctx, w % N_BATCHES, why, why_len);
  for (int round = 0; round < TRIES && !rc; round++) {
    if (round) usleep(500 * 1000); /* let whatever else runs pass */
    uint64_t b0 = 0, s0 = 0, b1 = 0, s1 = 0;
    int known = cpu_ticks(&b0, &s0) == 0, i = 0;
    double sum = 0, w0 = clock_mono_s();
    for (; i < MAX_REPS && !rc; i++, w++) {
      double t0 = clock_mono_s();
      rc = fn(ctx, w % N_BATCHES, why, why_len);
      t[i] = clock_mono_s() - t0;
      sum += t[i];
      if (i + 1 >= (r->quick ? 3 : MIN_REPS) && sum >= (r->quick ? 0.05 : REP_SECONDS)) {
        i++;
        break;
      }
    }
    if (rc) break;
    double wall = clock_mono_s() - w0;
    known = known && cpu_ticks(&b1, &s1) == 0;
    double others = NAN;
    if (known) { /* (ticks are counted apart: the difference may come out a little below 0) */
      double ticks = (double)(b1 - b0) - (double)(s1 - s0);
      others = (ticks > 0 ? ticks : 0) / (double)sysconf(_SC_CLK_TCK) / wall;
    }
    qsort(t, (size_t)i, sizeof *t, bench_cmp_double);
    out->tries = round + 1;
    if (!(others >= out->others)) { /* (NAN: keep the last) */
      out->us = 1e6 * (i % 2 ? t[i / 2] : (t[i / 2 - 1] + t[i / 2]) / 2);
      out->reps = i;
      out->others = others;
    }
    if (!(others > QUIET_CPUS)) break;
  }
  return rc;
}

/* ---- trainer: the owner's pooling, fold and row update */

typedef struct trainer_set_s {
  const bset_t *set;
  opt_hparams_t hp;
  uint8_t *dirty[SET_MAX];
} trainer_set_t;

/* as trainer_partition.c's row_update: the row optimizer and the dirty mark */
static void row_update(void *ud, uint32_t k, uint64_t r, float *row, const float *grad) {
  trainer_set_t *c = ud;
  opt_row_update(c->set->t[k].opt, &c->hp, row, c->set->t[k].dim, grad);
  c->dirty[k][r] = 1;
}

typedef struct trainer_iter_s {
  const run_t *r;
  embag_t *eb;
  float **base, *out, *d_out;
  size_t rf;
  uint64_t *(*ids)[SET_MAX];
  trainer_set_t *ctx;
} trainer_iter_t;

static int trainer_iteration(void *arg, int b, char *why, size_t why_len) {
  trainer_iter_t *it = arg;
  (void)why, (void)why_len;
  const uint64_t *const *idx = (const uint64_t *const *)it->ids[b];
  embag_fwd(it->eb, it->r->pool, it->r->batch, it->base, it->rf, idx, NULL, it->out);
  embag_bwd_each(it->eb, it->r->pool, it->r->batch, it->d_out, idx, NULL, it->base, it->rf, row_update, it->ctx);
  return 0;
}

/* One forward + backward of set, timed.  0, -ENOMEM (and why). */
static int measure_trainer(run_t *r, const bset_t *set, uint64_t index, timing_t *tm, char *why, size_t why_len) {
  uint32_t n = set->n, dim = set->t[0].dim, hot[SET_MAX];
  size_t rf = row_bytes(&set->t[0]) / sizeof(float), cols = (size_t)r->batch * n * dim;
  float *base[SET_MAX] = {0}, *out = malloc(cols * sizeof(float)), *d_out = malloc(cols * sizeof(float));
  uint64_t *ids[N_BATCHES][SET_MAX] = {{0}};
  trainer_set_t ctx = {.set = set};
  embag_t *eb = NULL;
  int rc = -ENOMEM;
  opt_hparams_from_cfg(r->cfg, set->t[0].opt, &ctx.hp);
  for (uint32_t k = 0; k < n; k++) {
    hot[k] = set->t[k].hot;
    size_t R = set->t[k].rows;
    if (!(base[k] = embag_rows_alloc(R * rf * sizeof(float), 0)) || !(ctx.dirty[k] = calloc(R, 1))) goto out;
    for (size_t i = 0; i < R; i++) { /* every row resident: small vectors, zero state */
      float *row = base[k] + i * rf;
      for (uint32_t d = 0; d < dim; d++) row[d] = (float)((i * 31 + d * 7) % 1000) * 1e-5f - 0.005f;
      memset(row + dim, 0, (rf - dim) * sizeof(float));
    }
  }
  if (!out || !d_out || draw_ids(r, set, index, ids) || embag_create_tables(n, hot, dim, r->batch, &eb)) goto out;
  for (size_t i = 0; i < cols; i++) d_out[i] = (float)((i * 2654435761u) % 2001) * 1e-6f - 1e-3f;
  trainer_iter_t it = {.r = r, .eb = eb, .base = base, .out = out, .d_out = d_out, .rf = rf, .ids = ids, .ctx = &ctx};
  rc = timed(r, trainer_iteration, &it, 2, tm, why, why_len);
out:
  if (rc) snprintf(why, why_len, "out of memory for a set of %u tables", n);
  embag_destroy(eb);
  free_ids(ids);
  for (uint32_t k = 0; k < n; k++) free(base[k]), free(ctx.dirty[k]);
  free(out), free(d_out);
  return rc;
}

/* ---- server: a store holding the set, Lookup + WriteBack of a batch's keys */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Writes every row of the set once (the memory tier left empty, as after a
 * restart). */
static int fill_store(store_t *st, const bset_t *set, char *why, size_t why_len) {
  enum { CHUNK = 16384 };
  uint64_t *keys = malloc(CHUNK * sizeof *keys);
  float *rows = malloc((size_t)CHUNK * 256 * sizeof(float)); /* dim 128 + adagrad's 128 */
  int rc = keys && rows ? 0 : -ENOMEM;
  for (size_t i = 0; !rc && i < (size_t)CHUNK * 256; i++) rows[i] = (float)(i % 1000) * 1e-5f - 0.005f;
  for (uint32_t k = 0; k < set->n && !rc; k++) {
    for (uint64_t r0 = 0; r0 < set->t[k].rows && !rc; r0 += CHUNK) {
      size_t m = set->t[k].rows - r0 < CHUNK ? (size_t)(set->t[k].rows - r0) : CHUNK;
      for (size_t i = 0; i < m; i++) keys[i] = TABLE_KEY(k, r0 + i);
      rc = store_write(st, keys, m, rows, m * row_bytes(&set->t[k]), STORE_WRITE_NO_HOT, why, why_len);
    }
  }
  if (rc == -ENOMEM) snprintf(why, why_len, "out of memory filling the store");
  free(keys), free(rows);
  return rc;
}

/* One iteration: the keys' rows read, then written back, in calls of at
 * most max_lookup / max_write keys.  0 or the store's error (and why). */
static int server_iteration(store_t *st, const uint64_t *keys, size_t n, float *rows, size_t max_lookup,
                            size_t max_write, char *why, size_t why_len) {
  int rc = 0;
  size_t off = 0, bytes;
  for (size_t i = 0; i < n && !rc; i += max_lookup) {
    size_t m = n - i < max_lookup ? n - i : max_lookup;
    if (!(rc = store_rows_bytes(st, keys + i, m, &bytes, why, why_len)))
      rc = store_lookup(st, keys + i, m, rows + off / sizeof(float), bytes, 0, NULL, why, why_len);
    off += bytes;
  }
  off = 0;
  for (size_t i = 0; i < n && !rc; i += max_write) {
    size_t m = n - i < max_write ? n - i : max_write;
    if (!(rc = store_rows_bytes(st, keys + i, m, &bytes, why, why_len)))
      rc = store_write(st, keys + i, m, rows + off / sizeof(float), bytes, 0, why, why_len);
    off += bytes;
  }
  return rc;
}

typedef struct server_iter_s {
  store_t *st;
  uint64_t **keys;
  size_t *nkeys, max_lookup, max_write;
  float *rows;
} server_iter_t;

static int server_step(void *arg, int b, char *why, size_t why_len) {
  server_iter_t *it = arg;
  return server_iteration(it->st, it->keys[b], it->nkeys[b], it->rows, it->max_lookup, it->max_write, why, why_len);
}

static int measure_server(run_t *r, const bset_t *set, uint64_t index, timing_t *tm, char *why, size_t why_len) {
  char dir[128];
  table_layout_t l;
  store_t *st = NULL;
  uint64_t *ids[N_BATCHES][SET_MAX] = {{0}}, *keys[N_BATCHES] = {0};
  size_t nkeys[N_BATCHES] = {0}, most = 0;
  float *rows = NULL;
  int rc = table_layout_init(&l, set->n, r->seed);
  if (rc) return rc;
  snprintf(dir, sizeof dir, "%s/set%" PRIu64, r->tmp, index);
  for (uint32_t k = 0; k < set->n; k++)
    l.tables[k] = (table_info_t){.rows = set->t[k].rows, .dim = set->t[k].dim,
                                 .state_floats = opt_row_state_floats(set->t[k].opt, set->t[k].dim)};
  store_opts_t so = {.data_dir = dir, .layout = &l, .hot_bytes = (size_t)cfg_int(r->cfg, "embedding.hot_mb") << 20,
                     .block_cache_bytes = (size_t)cfg_int(r->cfg, "embedding.block_cache_mb") << 20,
                     .sync_writes = cfg_bool(r->cfg, "embedding.sync_writes")};
  if ((rc = store_open(&so, &st, why, why_len)) != 0 || (rc = fill_store(st, set, why, why_len)) != 0) goto out;
  rc = -ENOMEM;
  if (draw_ids(r, set, index, ids)) goto out;
  for (int b = 0; b < N_BATCHES; b++) { /* the batch's distinct keys, ascending */
    size_t n = 0;
    for (uint32_t k = 0; k < set->n; k++) n += (size_t)r->batch * set->t[k].hot;
    if (!(keys[b] = malloc(n * sizeof *keys[b]))) goto out;
    n = 0;
    for (uint32_t k = 0; k < set->n; k++)
      for (size_t j = 0, m = (size_t)r->batch * set->t[k].hot; j < m; j++) keys[b][n++] = TABLE_KEY(k, ids[b][k][j]);
    qsort(keys[b], n, sizeof *keys[b], cmp_u64);
    size_t u = 0;
    for (size_t j = 0; j < n; j++)
      if (!u || keys[b][u - 1] != keys[b][j]) keys[b][u++] = keys[b][j];
    nkeys[b] = u;
    size_t bytes = 0;
    for (size_t j = 0; j < u; j++) bytes += table_row_bytes(&l, TABLE_ID(keys[b][j]));
    if (bytes > most) most = bytes;
  }
  if (!(rows = malloc(most ? most : 1))) goto out;
  server_iter_t it = {.st = st, .keys = keys, .nkeys = nkeys, .rows = rows,
                      .max_lookup = (size_t)cfg_int(r->cfg, "embedding.max_lookup_keys"),
                      .max_write = (size_t)cfg_int(r->cfg, "embedding.max_write_keys")};
  rc = timed(r, server_step, &it, N_BATCHES, tm, why, why_len); /* warm: each batch's rows into the memory tier */
out:
  if (rc == -ENOMEM) snprintf(why, why_len, "out of memory for a set of %u tables", set->n);
  store_close(st);
  char rm_why[256];
  if (fsio_remove_tree(dir, rm_why, sizeof rm_why)) fprintf(stderr, "bench tables: %s\n", rm_why);
  free_ids(ids);
  for (int b = 0; b < N_BATCHES; b++) free(keys[b]);
  free(rows);
  table_layout_close(&l);
  return rc;
}

/* ---- the dataset */

/* The comments that open the dataset, but the contention line (save). */
static void header(run_t *r, int kinds) {
  char cpu[256] = "unknown", line[512], date[64];
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
      cpu[strcspn(cpu, "\n")] = 0;
      break;
    }
  if (f) fclose(f);
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  sb_printf(&r->head, "# chanter bench tables v1\n# cpu: %s\n# threads: %u\n# date: %s\n", cpu,
            pool_threads(r->pool), date);
  sb_printf(&r->head, "# seed: %" PRIu64 "\n# batch: %u\n# kinds: %s\n", r->seed, r->batch,
            kinds == 3 ? "trainer server" : kinds == 4 ? "coll" : kind_name[kinds == 1 ? KIND_TRAINER : KIND_SERVER]);
  sb_printf(&r->head,
            "# trainer: embag_fwd of the global batch + embag_bwd_each (fold, row optimizer, dirty marks), no "
            "AlltoAll\n# server: store_lookup + store_write of the batch's distinct keys in process, no gRPC "
            "(hot_mb %" PRId64 ", sync_writes %s)\n",
            cfg_int(r->cfg, "embedding.hot_mb"), cfg_bool(r->cfg, "embedding.sync_writes") ? "true" : "false");
}

/* Per kind: how many sets were timed while other processes used more than
 * QUIET_CPUS (after TRIES rounds), and the median CPUs they used. */
static void contention(run_t *r, sbuf_t *b, const char *lead) {
  for (int k = 0; k < KINDS; k++) {
    size_t n = r->done[k], loud = 0, m = 0;
    double *o = malloc((n ? n : 1) * sizeof *o);
    for (size_t i = 0; o && i < n; i++) {
      loud += r->others[k][i] > QUIET_CPUS;
      if (r->others[k][i] == r->others[k][i]) o[m++] = r->others[k][i];
    }
    if (o && n)
      sb_printf(b, "%s%s: %zu of %zu sets timed while other processes used more than %.1f CPU (each timed up to %d times); "
                   "their median use %.2f CPU\n", lead, kind_name[k], loud, n, QUIET_CPUS, TRIES, bench_median(o, m));
    free(o);
  }
}

static int save(run_t *r) {
  char why[512];
  sbuf_t f = {0};
  sb_printf(&f, "%s", r->head.s);
  contention(r, &f, "# contention: ");
  sb_printf(&f, "# <kind> <batch> <cost_us> <n> then n x <rows> <dim> <hotness> <alpha> <opt>\n");
  if (r->coll.s) sb_printf(&f, "# coll <allreduce|alltoall> <ranks> <bytes a rank> <cost_us>\n%s", r->coll.s);
  sb_printf(&f, "%s", r->body.s ? r->body.s : "");
  int rc = 0;
  if (f.oom || r->head.oom || r->body.oom) {
    fprintf(stderr, "bench tables: out of memory holding the dataset\n");
    rc = 1;
  } else if (fsio_replace(r->out, f.s, f.n, 0644, why, sizeof why)) {
    fprintf(stderr, "bench tables: cannot write %s: %s\n", r->out, why);
    rc = 1;
  }
  free(f.s);
  return rc;
}

static int run_kind(run_t *r, int kind, uint64_t sets) {
  double t0 = clock_mono_s();
  if (!(r->cost[kind] = calloc(sets, sizeof(double))) || !(r->others[kind] = calloc(sets, sizeof(double)))) return 1;
  for (uint64_t i = r->first; i < r->first + sets; i++) {
    bset_t set;
    draw_set(r, kind, i, &set);
    timing_t tm;
    char why[512] = "";
    int rc = kind == KIND_TRAINER ? measure_trainer(r, &set, i, &tm, why, sizeof why)
                                  : measure_server(r, &set, i, &tm, why, sizeof why);
    if (rc) {
      fprintf(stderr, "bench tables: %s set %" PRIu64 " (%u tables) failed: %s\n", kind_name[kind], i, set.n, why);
      return 1;
    }
    sb_printf(&r->body, "%s %u %.1f %u", kind_name[kind], r->batch, tm.us, set.n);
    uint64_t rows = 0;
    double bytes = 0;
    for (uint32_t k = 0; k < set.n; k++) {
      const btab_t *t = &set.t[k];
      sb_printf(&r->body, "  %" PRIu64 " %u %u %.2f %s", t->rows, t->dim, t->hot, t->alpha, opt_kind_name(t->opt));
      rows += t->rows;
      bytes += (double)t->rows * (double)row_bytes(t);
    }
    sb_printf(&r->body, "\n");
    r->others[kind][r->done[kind]] = tm.others;
    r->cost[kind][r->done[kind]++] = tm.us;
    printf("%-7s %4" PRIu64 "/%-4" PRIu64 " %u tables %9" PRIu64 " rows %7.1f MiB %-15s %11.1f us (%2d runs",
           kind_name[kind], i + 1, r->first + sets, set.n, rows, bytes / (1 << 20), opt_kind_name(set.t[0].opt), tm.us,
           tm.reps);
    if (tm.tries > 1) printf(", %d rounds", tm.tries);
    if (tm.others > QUIET_CPUS) printf(", others used %.2f CPU", tm.others);
    printf(")\n");
    fflush(stdout);
    if (r->done[kind] % SAVE_EVERY == 0 && save(r)) return 1;
  }
  r->secs[kind] = clock_mono_s() - t0;
  return 0;
}

static int parse_u64(cli_t *cli, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *v) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 10);
  if (!*s || *end || errno || *s == '-' || x < lo || x > hi)
    return cli_usage_error(cli, "%s '%s': expected an integer in [%" PRIu64 ", %" PRIu64 "]", opt, s, lo, hi);
  *v = x;
  return 0;
}

int bench_tables(cli_t *cli) {
  run_t r = {.cfg = cli->cfg, .out = "tables.dataset", .quick = cli_flag(cli, "--quick")};
  const char *s, *kind = "both";
  uint64_t sets = 400, server_sets = 200, v, ranks = 2;
  r.batch = (uint32_t)cfg_int(cli->cfg, "batch_size");
  r.seed = (uint64_t)cfg_int(cli->cfg, "seed");
  if (r.quick) sets = 6, server_sets = 3;
  if ((s = cli_opt(cli, "--out"))) r.out = s;
  if ((s = cli_opt(cli, "--kind"))) kind = s;
  if ((s = cli_opt(cli, "--sets"))) {
    if (parse_u64(cli, "--sets", s, 1, 1000000, &sets)) return 2;
    server_sets = sets;
  }
  if ((s = cli_opt(cli, "--server-sets")) && parse_u64(cli, "--server-sets", s, 1, 1000000, &server_sets)) return 2;
  if ((s = cli_opt(cli, "--seed")) && parse_u64(cli, "--seed", s, 0, UINT64_MAX, &r.seed)) return 2;
  if ((s = cli_opt(cli, "--first")) && parse_u64(cli, "--first", s, 0, UINT64_C(1) << 40, &r.first)) return 2;
  if ((s = cli_opt(cli, "--batch"))) {
    if (parse_u64(cli, "--batch", s, 1, 65536, &v)) return 2; /* 4 batches of ids: 2 GiB at 65536 x 8 x 100 */
    r.batch = (uint32_t)v;
  }
  if ((s = cli_opt(cli, "--coll-ranks")) && parse_u64(cli, "--coll-ranks", s, 0, 16, &ranks)) return 2;
  if (ranks == 1) return cli_usage_error(cli, "--coll-ranks 1: a collective needs 2 ranks or more (0: not timed)");
  if (cli_done(cli, "tables")) return 2;
  int kinds = !strcmp(kind, "trainer") ? 1 : !strcmp(kind, "server") ? 2 : !strcmp(kind, "both") ? 3
              : !strcmp(kind, "coll") ? 4 : 0;
  if (!kinds) return cli_usage_error(cli, "--kind '%s': expected trainer, server, both or coll", kind);
  if (kinds == 4 && !ranks) return cli_usage_error(cli, "--kind coll with --coll-ranks 0 times nothing");
  if (ranks) { /* forks: before the pool's threads exist */
    char why[512];
    int crc = bench_tables_coll((uint32_t)ranks, r.quick, &r.coll, why, sizeof why);
    if (crc) {
      fprintf(stderr, "bench tables: the collectives: %s\n", why);
      free(r.coll.s);
      return 1;
    }
  }
  r.rows_lo = 1000;
  r.rows_hi[KIND_TRAINER] = r.quick ? 100000 : 2000000;
  r.rows_hi[KIND_SERVER] = r.quick ? 20000 : 200000;
  r.set_bytes[KIND_TRAINER] = r.quick ? (size_t)64 << 20 : (size_t)1536 << 20;
  r.set_bytes[KIND_SERVER] = r.quick ? (size_t)16 << 20 : (size_t)256 << 20;
  snprintf(r.tmp, sizeof r.tmp, "/tmp/chanter-bench-tables-XXXXXX");
  int rc = 1;
  if (pool_create(0, &r.pool)) {
    fprintf(stderr, "bench tables: cannot start the threads\n");
    return 1;
  }
  if (!mkdtemp(r.tmp)) {
    fprintf(stderr, "bench tables: cannot create a directory in /tmp: %s\n", strerror(errno));
    pool_destroy(r.pool);
    return 1;
  }
  log_level = LOG_WARN;
  header(&r, kinds);
  if (kinds != 4)
    printf("chanter bench tables: %s%s%s sets of 1..%d tables, batch %u, %u threads, seed %" PRIu64 " -> %s\n",
           kinds & 1 ? "trainer" : "", kinds == 3 ? " and " : "", kinds & 2 ? "server" : "", SET_MAX, r.batch,
           pool_threads(r.pool), r.seed, r.out);
  double t0 = clock_mono_s();
  if ((kinds & 1) && run_kind(&r, KIND_TRAINER, sets)) goto out;
  if ((kinds & 2) && run_kind(&r, KIND_SERVER, server_sets)) goto out;
  if (save(&r)) goto out;
  if (kinds != 4) printf("\n%-8s %6s %12s %12s %12s %10s\n", "kind", "sets", "min us", "median us", "max us", "seconds");
  for (int k = 0; k < KINDS; k++) {
    size_t n = r.done[k];
    if (!n) continue;
    double med = bench_median(r.cost[k], n); /* (sorts) */
    printf("%-8s %6zu %12.1f %12.1f %12.1f %10.1f\n", kind_name[k], n, r.cost[k][0], med, r.cost[k][n - 1],
           r.secs[k]);
  }
  sbuf_t c = {0};
  contention(&r, &c, "");
  if (c.s) fputs(c.s, stdout);
  free(c.s);
  printf("%zu sets in %.1f s, written to %s\n", r.done[0] + r.done[1], clock_mono_s() - t0, r.out);
  rc = 0;
out:
  if (rc && r.done[0] + r.done[1]) save(&r); /* what was measured before the failure */
  char why[256];
  if (fsio_remove_tree(r.tmp, why, sizeof why)) fprintf(stderr, "bench tables: %s\n", why);
  pool_destroy(r.pool);
  for (int k = 0; k < KINDS; k++) free(r.cost[k]), free(r.others[k]);
  free(r.head.s), free(r.body.s), free(r.coll.s);
  return rc;
}
