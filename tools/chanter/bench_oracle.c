/*
 * chanter bench oracle: how many samples/s the oracle decides.
 *
 * The stream: batches of 16384 samples, 26 one-hot tables with Criteo's
 * (Kaggle) cardinalities -- five of 2e6 to 1e7 rows, five of 1e4 to 3e5,
 * sixteen smaller -- and Zipf-like ids per table: row = rows * u^a with u
 * uniform, i.e. P(row) ~ row^-(1 - 1/a), a = 8 for the big tables (a few
 * rows take most of the lookups, a long tail is seen once), 6, 4, 2 for
 * smaller ones; generated from (seed, batch) by our owner generator, never
 * timed.
 *
 * Measured, at P = 8 trainers (contiguous allocation, LRPP and delayed
 * synchronization on), L = 200:
 *   (a) plan_build with PLAN_KEYS (sample allocation + the
 *       batch's distinct keys), which the oracle runs on worker threads: on
 *       one thread, and on 2 threads over disjoint batches;
 *   (b) the cacher (cacher_push + cacher_decide + cacher_dec_free), which is
 *       sequential: timed after L + 1 warm-up batches, over L + 100 batches
 *       (fewer with --quick); also at P = 2;
 *   (c) both: an estimate from (a) and (b) -- one core doing everything,
 *       and 2 cores with the planning spread and the cacher on one -- and a
 *       measured pipeline, one thread planning while the other runs the
 *       cacher.
 * Then the effect of L (0, 10, 50, 200), every cacher fed the same batches:
 * the slots it needs (its peak over the run, which is what cacher_need
 * returns for those batches), rows fetched per batch (summed over the
 * trainers), rows synchronized per batch (critical + delayed), and its owner
 * cost per batch.
 *
 * Then (d) the effect of the sample allocation at L = 64: rows fetched,
 * all-reduced and replicated per batch with contiguous and laia
 * allocation (laia.h), P = 2 and 8, and laia's owner cost.
 *
 * Timed parts run alone (the plans a timed cacher reads are built before
 * its clock starts); the untimed warm-up uses both cores.  The machine may
 * be shared, so the cacher is also timed per chunk of 25 batches and the
 * best chunk is shown next to the mean.  Prints only: nothing is a
 * threshold.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "clock.h"
#include "data.h"
#include "cacher.h"
#include "laia.h"
#include "plan.h"
#include "table.h"

#define BATCH_SIZE 16384    /* samples per batch */
#define NT 26       /* tables */
#define LBIG 200    /* the lookahead of the headline figures */
#define NL 4        /* lookaheads compared */
#define CHUNK 16    /* batches planned at a time */
#define RING (LBIG + 1 + CHUNK + 8)
#define SEED UINT64_C(0x5eed0a11)
#define TCHUNK 25   /* batches per timing chunk */

static const uint32_t LS[NL] = {0, 10, 50, LBIG};

/* Criteo Kaggle's 26 categorical cardinalities. */
static const uint64_t CARD[NT] = {1460,  583,     10131227, 2202608, 305,   24,  12517, 633,    3,
                                  93145, 5683,    8351593,  3194,    27,    14992, 5461306, 10,   5652,
                                  2173,  4,       7046547,  18,      15,    286181, 105, 142572};

/* ------------------------------------------------------------------ the stream */

static uint32_t skew(uint64_t rows) { return rows >= 1000000 ? 8 : rows >= 10000 ? 6 : rows >= 1000 ? 4 : 2; }

/* Batch x: ids of table t from a splitmix64 sequence seeded by (SEED, x, t);
 * row = floor(rows * u^a). */
static int gen_batch(uint64_t x, data_batch_t *b) {
  memset(b, 0, sizeof *b);
  b->iteration = x;
  b->n = BATCH_SIZE;
  b->n_tables = NT;
  b->hotness = malloc(NT * sizeof *b->hotness);
  b->ids_off = malloc((NT + 1) * sizeof *b->ids_off);
  b->labels = calloc(BATCH_SIZE, sizeof *b->labels);
  b->dense = malloc(sizeof *b->dense);
  b->ids = malloc((size_t)NT * BATCH_SIZE * sizeof *b->ids);
  if (!b->hotness || !b->ids_off || !b->labels || !b->dense || !b->ids) {
    data_batch_free(b);
    return -ENOMEM;
  }
  for (uint32_t t = 0; t < NT; t++) {
    b->hotness[t] = 1;
    b->ids_off[t] = (size_t)t * BATCH_SIZE;
    uint64_t s = table_mix64(SEED ^ (x * NT + t)), *ids = b->ids + (size_t)t * BATCH_SIZE;
    uint32_t a = skew(CARD[t]);
    double rows = (double)CARD[t];
    for (uint32_t i = 0; i < BATCH_SIZE; i++) {
      s += UINT64_C(0x9e3779b97f4a7c15);
      double u = (double)(table_mix64(s) >> 11) * 0x1.0p-53, v = u;
      for (uint32_t k = 1; k < a; k++) v *= u;
      uint64_t r = (uint64_t)(v * rows);
      ids[i] = r < CARD[t] ? r : CARD[t] - 1;
    }
  }
  b->ids_off[NT] = (size_t)NT * BATCH_SIZE;
  return 0;
}

/* Generates and plans batches [x0, x1) into ring[x % RING] on `threads`
 * threads (batch x on thread x % threads). */
typedef struct planjob_s {
  plan_t *ring;
  uint64_t x0, x1;
  uint32_t P, tid, threads;
  int rc;
} planjob_t;

static void *plan_worker(void *arg) {
  planjob_t *j = arg;
  for (uint64_t x = j->x0 + j->tid; x < j->x1 && !j->rc; x += j->threads) {
    data_batch_t b;
    if ((j->rc = gen_batch(x, &b)) != 0) break;
    j->rc = plan_build(&b, j->P, PLAN_ALLOC_CONTIGUOUS, SEED, PLAN_KEYS, &j->ring[x % RING]);
    data_batch_free(&b);
  }
  return NULL;
}

static int plan_range(plan_t *ring, uint64_t x0, uint64_t x1, uint32_t P, uint32_t threads) {
  pthread_t th[2];
  planjob_t j[2];
  int started[2] = {0, 0};
  for (uint32_t i = 0; i < threads; i++) {
    j[i] = (planjob_t){.ring = ring, .x0 = x0, .x1 = x1, .P = P, .tid = i, .threads = threads};
    if (i) started[i] = pthread_create(&th[i], NULL, plan_worker, &j[i]) == 0;
  }
  plan_worker(&j[0]);
  int rc = j[0].rc;
  for (uint32_t i = 1; i < threads; i++) {
    if (started[i]) pthread_join(th[i], NULL);
    else plan_worker(&j[i]); /* no thread: do its share here */
    if (j[i].rc) rc = j[i].rc;
  }
  return rc;
}

/* ------------------------------------------------------------------ (a) planning */

typedef struct ptime_s {
  data_batch_t *b;
  size_t n, first, stride;
  uint32_t P;
  double secs;
  int rc;
} ptime_t;

static void *ptime_worker(void *arg) {
  ptime_t *t = arg;
  double s = 0;
  for (size_t i = t->first; i < t->n && !t->rc; i += t->stride) {
    plan_t p;
    double t0 = clock_mono_s();
    t->rc = plan_build(&t->b[i], t->P, PLAN_ALLOC_CONTIGUOUS, SEED, PLAN_KEYS, &p);
    s += clock_mono_s() - t0;
    plan_close(&p);
  }
  t->secs = s;
  return NULL;
}

/* Samples/s of plan_build over b[0..n): on one thread (best of 2
 * rounds), and on 2 threads over disjoint batches (wall time). */
static int bench_plan(data_batch_t *b, size_t n, uint32_t P, double *one, double *two, size_t *unique) {
  double best = 0;
  for (int round = 0; round < 2; round++) {
    ptime_t t = {.b = b, .n = n, .first = 0, .stride = 1, .P = P};
    ptime_worker(&t);
    if (t.rc) return t.rc;
    if (best == 0 || t.secs < best) best = t.secs;
  }
  *one = (double)n * BATCH_SIZE / best;
  ptime_t t[2];
  pthread_t th;
  double t0 = clock_mono_s();
  for (int i = 0; i < 2; i++) t[i] = (ptime_t){.b = b, .n = n, .first = (size_t)i, .stride = 2, .P = P};
  int started = pthread_create(&th, NULL, ptime_worker, &t[1]) == 0;
  ptime_worker(&t[0]);
  if (started) pthread_join(th, NULL);
  else ptime_worker(&t[1]);
  double wall = clock_mono_s() - t0;
  if (t[0].rc || t[1].rc) return t[0].rc ? t[0].rc : t[1].rc;
  *two = (double)n * BATCH_SIZE / wall;
  plan_t p;
  int rc = plan_build(&b[0], P, PLAN_ALLOC_CONTIGUOUS, SEED, PLAN_KEYS, &p);
  if (rc) return rc;
  *unique = p.n_unique;
  plan_close(&p);
  return 0;
}

/* ------------------------------------------------------------------ (b) the cacher */

typedef struct ccr_s {
  uint32_t L, P;
  cacher_t *c;
  uint64_t end_at; /* its last batch (cacher_end after it); UINT64_MAX: open */
  /* timing of the calls made while timed */
  double t_push, t_decide, chunk_t, best_chunk;
  uint64_t timed, chunk_n;
  /* decisions of the batches in [s0, s1) */
  uint64_t s0, s1, st_n, st_fetch, st_crit, st_del, st_unique, st_new, st_write_back, st_replicate;
  uint64_t decided;
  int ended; /* its last batch went in and what the statistics need is decided */
  char err[256];
} ccr_t;

static int ccr_open(ccr_t *r, uint32_t P, uint32_t L, uint64_t end_at) {
  memset(r, 0, sizeof *r);
  r->L = L;
  r->P = P;
  r->end_at = end_at;
  cacher_opts_t o = {.trainers = P, .lookahead = L, .cache_rows = 0, .lrpp = 1, .delayed = 1};
  return cacher_create(&o, &r->c);
}

static void ccr_stats(ccr_t *r, const cacher_dec_t *d) {
  if (d->iteration < r->s0 || d->iteration >= r->s1) return;
  r->st_n++;
  for (uint32_t q = 0; q < d->trainers; q++) {
    r->st_fetch += d->tr[q].n_fetch;
    r->st_write_back += d->tr[q].n_write_back;
  }
  r->st_crit += d->n_critical;
  r->st_del += d->n_delayed;
  r->st_replicate += d->n_replicate;
  r->st_unique += d->n_unique;
  r->st_new += d->n_new;
}

/* Decides whatever is ready, up to batch `upto` (excluded); each call (and
 * the free of its decision) is timed when `timed`. */
static int ccr_drain(ccr_t *r, int timed, uint64_t upto) {
  while (r->decided < upto && cacher_ready(r->c)) {
    cacher_dec_t d;
    double t0 = clock_mono_s();
    int rc = cacher_decide(r->c, &d, r->err, sizeof r->err);
    if (rc) return rc;
    double t1 = clock_mono_s();
    ccr_stats(r, &d);
    double t2 = clock_mono_s();
    cacher_dec_free(&d);
    double t3 = clock_mono_s();
    if (timed) {
      r->t_decide += (t1 - t0) + (t3 - t2);
      r->chunk_t += (t1 - t0) + (t3 - t2);
    }
    r->decided++;
  }
  return 0;
}

/* Batch p enters r's cacher, then every ready batch is decided.  After its
 * last batch (end_at) the stream ends and the rest is decided as far as the
 * statistics need (s1), untimed: timed pushes and decisions stay one for
 * one. */
static int ccr_step(ccr_t *r, const plan_t *p, int timed) {
  int last = p->iteration == r->end_at;
  if (last) timed = 0;
  double t0 = clock_mono_s();
  int rc = cacher_push(r->c, p);
  if (rc) {
    snprintf(r->err, sizeof r->err, "cacher_push of batch %" PRIu64 ": %s", p->iteration, strerror(-rc));
    return rc;
  }
  if (last) {
    cacher_end(r->c);
    r->ended = 1;
  }
  if (timed) {
    double dt = clock_mono_s() - t0;
    r->t_push += dt;
    r->chunk_t += dt;
  }
  if ((rc = ccr_drain(r, timed, last ? r->s1 : UINT64_MAX)) != 0) return rc;
  if (timed) {
    r->timed++;
    if (++r->chunk_n == TCHUNK) {
      if (r->best_chunk == 0 || r->chunk_t < r->best_chunk) r->best_chunk = r->chunk_t;
      r->chunk_n = 0;
      r->chunk_t = 0;
    }
  }
  return 0;
}

/* Cachers rs[first], rs[first + stride], ... over ring batches [x0, x1). */
typedef struct cjob_s {
  ccr_t **rs;
  size_t n, first, stride;
  const plan_t *ring;
  uint64_t x0, x1;
  int timed, rc;
  ccr_t *failed;
} cjob_t;

static void *cacher_worker(void *arg) {
  cjob_t *j = arg;
  for (size_t i = j->first; i < j->n && !j->rc; i += j->stride)
    for (uint64_t x = j->x0; x < j->x1 && !j->rc; x++)
      if ((j->rc = ccr_step(j->rs[i], &j->ring[x % RING], j->timed)) != 0) j->failed = j->rs[i];
  return NULL;
}

/* Feeds ring batches [x0, x1) to every cacher of rs: timed ones one after
 * the other on this thread, untimed ones on 2 threads. */
static int cachers_range(ccr_t **rs, size_t n, const plan_t *ring, uint64_t x0, uint64_t x1, int timed) {
  cjob_t j[2];
  int threads = timed || n < 2 ? 1 : 2;
  pthread_t th;
  for (int i = 0; i < threads; i++)
    j[i] = (cjob_t){.rs = rs, .n = n, .first = (size_t)i, .stride = (size_t)threads, .ring = ring,
                    .x0 = x0, .x1 = x1, .timed = timed};
  int started = threads == 2 && pthread_create(&th, NULL, cacher_worker, &j[1]) == 0;
  cacher_worker(&j[0]);
  if (started) pthread_join(th, NULL);
  else if (threads == 2) cacher_worker(&j[1]);
  for (int i = 0; i < threads; i++)
    if (j[i].rc) {
      fprintf(stderr, "bench oracle: cacher L=%u: %s\n", j[i].failed->L, j[i].failed->err);
      return j[i].rc;
    }
  return 0;
}

/* Closes the ring plans every cacher of rs has decided (or ended without
 * deciding: they no longer read them). */
static void close_decided(plan_t *ring, ccr_t **rs, size_t n, uint64_t *closed) {
  uint64_t upto = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    uint64_t d = rs[i]->ended ? UINT64_MAX : rs[i]->decided;
    if (d < upto) upto = d;
  }
  if (upto == UINT64_MAX) return;
  for (; *closed < upto; (*closed)++) plan_close(&ring[*closed % RING]);
}

/* Runs the cachers rs over batches [0, n_batches) at P: warm-up on both
 * cores, batches >= warm timed (cacher by cacher, alone).  A cacher whose
 * end_at is later stays open (a pipeline continues its stream). */
static int cachers_run(ccr_t **rs, size_t n, plan_t *ring, uint32_t P, uint64_t warm, uint64_t n_batches,
                       uint64_t *closed) {
  int rc = 0;
  for (uint64_t x0 = 0; x0 < n_batches && !rc; x0 += CHUNK) {
    uint64_t x1 = x0 + CHUNK < n_batches ? x0 + CHUNK : n_batches;
    if ((rc = plan_range(ring, x0, x1, P, 2)) != 0) {
      fprintf(stderr, "bench oracle: planning batches %" PRIu64 "..%" PRIu64 ": %s\n", x0, x1 - 1, strerror(-rc));
      break;
    }
    uint64_t split = x0 < warm ? (x1 < warm ? x1 : warm) : x0; /* [x0, split) warm-up, [split, x1) timed */
    if (split > x0 && (rc = cachers_range(rs, n, ring, x0, split, 0)) != 0) break;
    if (x1 > split && (rc = cachers_range(rs, n, ring, split, x1, 1)) != 0) break;
    close_decided(ring, rs, n, closed);
  }
  return rc;
}

/* ------------------------------------------------------------------ (c) a pipeline */

/* One thread plans batches (pre-generated) while this one runs the cacher:
 * the planner stays at most `lead` batches ahead. */
typedef struct pipe_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  plan_t *ring;
  data_batch_t *b;
  uint64_t x0, n, built, consumed, lead;
  uint32_t P;
  int rc;
} pipe_t;

static void *pipe_planner(void *arg) {
  pipe_t *pp = arg;
  for (uint64_t i = 0; i < pp->n; i++) {
    pthread_mutex_lock(&pp->mu);
    while (i >= pp->consumed + pp->lead && !pp->rc) pthread_cond_wait(&pp->cv, &pp->mu);
    int stop = pp->rc != 0;
    pthread_mutex_unlock(&pp->mu);
    if (stop) break;
    int rc = plan_build(&pp->b[i], pp->P, PLAN_ALLOC_CONTIGUOUS, SEED, PLAN_KEYS,
                               &pp->ring[(pp->x0 + i) % RING]);
    pthread_mutex_lock(&pp->mu);
    if (rc) pp->rc = rc;
    else pp->built = i + 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
    if (rc) break;
  }
  return NULL;
}

/* Continues r's stream with batches x0 .. x0+n-1 through the pipeline:
 * samples/s over the wall time (r's stream stays open: the caller ends it). */
static int bench_pipeline(ccr_t *r, plan_t *ring, uint64_t x0, uint64_t n, uint64_t *closed, double *sps) {
  data_batch_t *b = calloc(n, sizeof *b);
  if (!b) return -ENOMEM;
  int rc = 0;
  for (uint64_t i = 0; i < n && !rc; i++) rc = gen_batch(x0 + i, &b[i]);
  pipe_t pp = {.ring = ring, .b = b, .x0 = x0, .n = n, .lead = 8, .P = r->P};
  pthread_mutex_init(&pp.mu, NULL);
  pthread_cond_init(&pp.cv, NULL);
  pthread_t th;
  int started = 0;
  double t0 = clock_mono_s();
  if (!rc) started = pthread_create(&th, NULL, pipe_planner, &pp) == 0;
  if (!started && !rc) rc = -EAGAIN;
  for (uint64_t i = 0; i < n && !rc; i++) {
    pthread_mutex_lock(&pp.mu);
    while (pp.built <= i && !pp.rc) pthread_cond_wait(&pp.cv, &pp.mu);
    rc = pp.rc;
    pthread_mutex_unlock(&pp.mu);
    if (rc) break;
    if ((rc = ccr_step(r, &ring[(x0 + i) % RING], 0)) != 0) {
      fprintf(stderr, "bench oracle: pipeline: %s\n", r->err);
      break;
    }
    close_decided(ring, &r, 1, closed);
    pthread_mutex_lock(&pp.mu);
    pp.consumed = i + 1;
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
  }
  double wall = clock_mono_s() - t0;
  pthread_mutex_lock(&pp.mu);
  if (rc && !pp.rc) pp.rc = rc;
  pthread_cond_broadcast(&pp.cv);
  pthread_mutex_unlock(&pp.mu);
  if (started) pthread_join(th, NULL);
  if (!rc) rc = pp.rc;
  *sps = (double)n * BATCH_SIZE / wall;
  for (uint64_t i = 0; i < n; i++) data_batch_free(&b[i]);
  free(b);
  pthread_mutex_destroy(&pp.mu);
  pthread_cond_destroy(&pp.cv);
  return rc;
}

/* ------------------------------------------------------------------ output */

static double ccr_sps(const ccr_t *r) { return r->timed ? (double)r->timed * BATCH_SIZE / (r->t_push + r->t_decide) : 0; }
static double ccr_best(const ccr_t *r) { return r->best_chunk > 0 ? (double)TCHUNK * BATCH_SIZE / r->best_chunk : ccr_sps(r); }

/* ------------------------------------------------------------------ (d) allocation */

#define LALLOC 64 /* the lookahead of the allocation comparison (lookahead = auto's default cap) */

/* The cacher at L = LALLOC over b[0..n) for P trainers, contiguous or laia
 * (window LALLOC); per batch over [LALLOC + 1, n): *r holds the counts,
 * *laia_s the seconds laia_assign took a batch, *held the rows laia's map
 * holds at the end (its memory: 16 bytes each, at a load of 1/4 to 1/2). */
static int alloc_run(const data_batch_t *b, uint64_t n, uint32_t P, int laia, ccr_t *r, double *laia_s,
                     size_t *held, uint32_t *tables) {
  plan_t *pl = calloc(n, sizeof *pl);
  uint32_t *owner = malloc((size_t)BATCH_SIZE * sizeof *owner);
  laia_t *l = NULL;
  /* laia: 1 every table, 2 adaptive with the job's defaults (oracle.laia_profile, oracle.laia_min_share) */
  laia_opts_t lo = {.trainers = P, .window = LALLOC, .seed = SEED, .profile = laia == 2 ? 16 : 0, .min_share = 0.01};
  int rc = -ENOMEM;
  *laia_s = 0;
  if (!pl || !owner || ccr_open(r, P, LALLOC, n - 1) || (laia && laia_create(&lo, &l))) goto out;
  r->s0 = LALLOC + 1;
  r->s1 = n;
  for (uint64_t x = 0; x < n; x++) {
    if (laia) {
      double t0 = clock_mono_s();
      if ((rc = laia_assign(l, &b[x], owner)) != 0) goto out;
      *laia_s += clock_mono_s() - t0;
      rc = plan_build_owned(&b[x], P, owner, PLAN_KEYS, &pl[x]);
    } else {
      rc = plan_build(&b[x], P, PLAN_ALLOC_CONTIGUOUS, SEED, PLAN_KEYS, &pl[x]);
    }
    if (rc || (rc = ccr_step(r, &pl[x], 0)) != 0) goto out;
  }
  *laia_s /= (double)n;
  *held = 0;
  if (l) {
    laia_stats_t ls;
    laia_stats(l, &ls);
    *held = ls.rows_held;
    *tables = ls.tables_scored;
  }
  rc = 0;
out:
  for (uint64_t x = 0; pl && x < n; x++) plan_close(&pl[x]);
  free(pl);
  free(owner);
  laia_destroy(l);
  return rc;
}

/* Rows that move per batch with contiguous and laia allocation, P = 2 and
 * 8, the same batches. */
static int bench_alloc(uint64_t n) {
  data_batch_t *b = calloc(n, sizeof *b);
  int rc = 1;
  if (!b) return 1;
  for (uint64_t x = 0; x < n; x++)
    if (gen_batch(UINT64_C(2) << 40 | x, &b[x])) goto out;
  for (uint64_t x = 0; x < n; x++) b[x].iteration = x;
  printf("\nallocation (L = %d, laia window %d; per batch over batches %d..%" PRIu64 "):\n", LALLOC, LALLOC,
         LALLOC + 1, n - 1);
  printf("  %3s %-11s %13s %12s %12s %13s %14s %12s %12s %10s\n", "P", "allocation", "fetched rows", "all-reduced",
         "handed over", "fetch+synced", "laia ms/batch", "samples/s", "rows held", "tables");
  const uint32_t Ps[2] = {2, 8};
  static const char *names[3] = {"contiguous", "laia all", "laia"};
  for (int pi = 0; pi < 2; pi++)
    for (int laia = 0; laia <= 2; laia++) {
      ccr_t r;
      double ls = 0;
      size_t held = 0;
      uint32_t tables = 0;
      int e = alloc_run(b, n, Ps[pi], laia, &r, &ls, &held, &tables);
      if (e) {
        fprintf(stderr, "bench oracle: allocation P=%u %s: %s %s\n", Ps[pi], names[laia],
                strerror(-e), r.err);
        if (r.c) cacher_destroy(r.c);
        goto out;
      }
      double k = r.st_n ? (double)r.st_n : 1;
      printf("  %3u %-11s %13.0f %12.0f %12.0f %13.0f", Ps[pi], names[laia], (double)r.st_fetch / k,
             (double)(r.st_crit + r.st_del) / k, (double)r.st_replicate / k,
             (double)(r.st_fetch + r.st_crit + r.st_del + r.st_replicate) / k);
      if (laia) printf(" %14.2f %12.0f %11.2fM %7u/%u\n", 1e3 * ls, BATCH_SIZE / ls, (double)held / 1e6, tables, NT);
      else printf(" %14s %12s %12s %10s\n", "-", "-", "-", "-");
      cacher_destroy(r.c);
    }
  printf("  (laia all: every table scored; laia: scored after a 16-batch profile only where >= 1%% of the ids found\n"
         "   a held row, the job's default;\n"
         "   all-reduced: rows several trainers use in the batch; handed over: owned rows replicated because another\n"
         "   trainer uses them; laia ms/batch: laia_assign alone, one thread -- the oracle runs it on its planning\n"
         "   workers, one batch after the other; rows held: laia's map at the end, 16 bytes a row at a load of 1/4..1/2)\n");
  rc = 0;
out:
  for (uint64_t x = 0; x < n; x++) data_batch_free(&b[x]);
  free(b);
  return rc;
}

static void row(const char *what, double sps, double best, double ms) {
  printf("  %-52s %11.0f", what, sps);
  if (best > 0) printf(" %11.0f", best);
  else printf(" %11s", "-");
  printf(" %9.2f\n", ms);
  fflush(stdout);
}

static void close_ring(plan_t *ring, uint64_t *closed, uint64_t upto) {
  for (; *closed < upto; (*closed)++) plan_close(&ring[*closed % RING]);
}

int bench_oracle(cli_t *cli) {
  int quick = cli_flag(cli, "--quick");
  if (cli_done(cli, "oracle")) return 2;
  const uint32_t P = 8, P2 = 2;
  uint64_t warm = LBIG + 1, timed = quick ? 30 : LBIG + 100, timed2 = quick ? 10 : 100;
  uint64_t n_batches = warm + timed, n_pipe = quick ? 16 : 40, n_plan = quick ? 6 : 16;
  /* the effect of L: decisions of these batches (every window full, unless --quick) */
  uint64_t s0 = warm, s1 = n_batches - LBIG > warm + 10 ? n_batches - LBIG : n_batches;
  plan_t *ring = calloc(RING, sizeof *ring);
  data_batch_t *pb = calloc(n_plan, sizeof *pb);
  ccr_t cr[NL], cr2, *rs[NL], *rs2 = &cr2;
  uint64_t closed = 0;
  int rc = 1;
  memset(cr, 0, sizeof cr);
  memset(&cr2, 0, sizeof cr2);
  if (!ring || !pb) goto out;

  uint64_t big = 0, mid = 0, small = 0;
  for (int t = 0; t < NT; t++) {
    if (CARD[t] >= 1000000) big++;
    else if (CARD[t] >= 10000) mid++;
    else small++;
  }
  printf("\nchanter bench oracle: batch %d, %d one-hot tables with Criteo's cardinalities (%" PRIu64
         " of 2e6..1e7 rows, %" PRIu64 " of 1e4..3e5, %" PRIu64 " smaller), Zipf-like ids%s\n",
         BATCH_SIZE, NT, big, mid, small, quick ? " (--quick)" : "");
  printf("reference: Bagpipe reports 3.27M samples/s on 72 cores (%.0f per core); the aim: >= 1M samples/s per core\n\n",
         3.27e6 / 72);

  /* (a) planning, on batches of their owner */
  for (uint64_t i = 0; i < n_plan; i++)
    if (gen_batch(UINT64_C(1) << 40 | i, &pb[i])) goto out;
  double one = 0, two = 0;
  size_t uniq = 0;
  if ((rc = bench_plan(pb, n_plan, P, &one, &two, &uniq)) != 0) {
    fprintf(stderr, "bench oracle: plan_build: %s\n", strerror(-rc));
    rc = 1;
    goto out;
  }
  rc = 1;
  printf("%d ids and about %zu distinct keys a batch; P = %u trainers, contiguous allocation, LRPP and delayed "
         "sync on\n\n",
         BATCH_SIZE * NT, uniq, P);
  printf("  %-52s %11s %11s %9s\n", "", "samples/s", "best chunk", "ms/batch");
  row("(a) plan (allocation + distinct keys), 1 thread", one, 0, 1e3 * BATCH_SIZE / one);
  row("(a) plan, 2 threads over disjoint batches", two, 0, 1e3 * BATCH_SIZE / two);

  /* (b) the cacher at every L on the same batches; the L = 200 one goes on
   * into the pipeline (c) */
  for (int i = 0; i < NL; i++) {
    if (ccr_open(&cr[i], P, LS[i], LS[i] == LBIG ? UINT64_MAX : n_batches - 1)) goto out;
    cr[i].s0 = s0;
    cr[i].s1 = s1;
    rs[i] = &cr[i];
  }
  ccr_t *hb = &cr[NL - 1];
  if (cachers_run(rs, NL, ring, P, warm, n_batches, &closed)) goto out;
  double cacher_s = (hb->t_push + hb->t_decide) / (double)hb->timed;
  char what[128];
  snprintf(what, sizeof what, "(b) cacher, P = %u, L = %d, %" PRIu64 " batches", P, LBIG, hb->timed);
  row(what, ccr_sps(hb), ccr_best(hb), 1e3 * cacher_s);
  printf("  %-52s push %.2f ms + decide %.2f ms a batch\n", "", 1e3 * hb->t_push / (double)hb->timed,
         1e3 * hb->t_decide / (double)hb->timed);

  /* (c) */
  double pipe_sps = 0;
  if ((rc = bench_pipeline(hb, ring, n_batches, n_pipe, &closed, &pipe_sps)) != 0) {
    rc = 1;
    goto out;
  }
  rc = 1;
  cacher_end(hb->c);
  hb->ended = 1;
  if (ccr_drain(hb, 0, s1)) {
    fprintf(stderr, "bench oracle: cacher L=%u: %s\n", hb->L, hb->err);
    goto out;
  }
  close_ring(ring, &closed, n_batches + n_pipe); /* every plan: the cachers are done reading */
  double plan_s = BATCH_SIZE / one;
  row("(c) plan + cacher on one core (from a, b)", BATCH_SIZE / (plan_s + cacher_s), 0, 1e3 * (plan_s + cacher_s));
  double two_s = cacher_s > (plan_s + cacher_s) / 2 ? cacher_s : (plan_s + cacher_s) / 2;
  row("(c) plan + cacher on 2 cores, plans spread (from a, b)", BATCH_SIZE / two_s, 0, 1e3 * two_s);
  snprintf(what, sizeof what, "(c) measured: 1 thread plans, 1 runs the cacher (%" PRIu64 ")", n_pipe);
  row(what, pipe_sps, 0, 1e3 * BATCH_SIZE / pipe_sps);

  /* (b) at P = 2 */
  if (ccr_open(&cr2, P2, LBIG, warm + timed2 - 1)) goto out;
  closed = 0;
  if (cachers_run(&rs2, 1, ring, P2, warm, warm + timed2, &closed)) goto out;
  close_ring(ring, &closed, warm + timed2);
  snprintf(what, sizeof what, "(b) cacher, P = %u, L = %d, %" PRIu64 " batches", P2, LBIG, cr2.timed);
  row(what, ccr_sps(&cr2), ccr_best(&cr2), 1e3 * (cr2.t_push + cr2.t_decide) / (double)cr2.timed);
  printf("  (best chunk: the fastest %d consecutive batches, for a shared machine)\n", TCHUNK);

  /* the effect of L */
  printf("\neffect of L (P = %u; per batch, over batches %" PRIu64 "..%" PRIu64 "%s):\n", P, s0, s1 - 1,
         s1 == n_batches ? ", the last ones decided as the stream ends" : "");
  printf("  %5s %13s %8s %13s %12s %12s %11s %11s %10s %10s %11s\n", "L", "slots needed", "(over)", "fetched rows",
         "synced rows", "of critical", "replicated", "written bk", "new keys", "cacher ms", "samples/s");
  for (int i = 0; i < NL; i++) {
    const ccr_t *r = &cr[i];
    double n = r->st_n ? (double)r->st_n : 1;
    printf("  %5u %13" PRIu64 " %8" PRIu64 " %13.0f %12.0f %12.0f %11.0f %11.0f %10.0f %10.2f %11.0f\n", r->L,
           cacher_slots_peak(r->c), r->decided, (double)r->st_fetch / n,
           (double)(r->st_crit + r->st_del + r->st_replicate) / n, (double)r->st_crit / n, (double)r->st_replicate / n,
           (double)r->st_write_back / n, (double)r->st_new / n,
           1e3 * (r->t_push + r->t_decide) / (double)r->timed, ccr_sps(r));
  }
  printf("  (slots needed: the peak over the first (over) batches, which is what cacher_need returns for them;\n"
         "   fetched rows: summed over the %u trainers; synced: critical + delayed + replicated (owned rows\n"
         "   handed to every trainer); written bk: rows written back;\n"
         "   new keys: distinct keys not cached before the batch; cacher ms: push + decide a batch, timed)\n",
         P);
  if (bench_alloc(quick ? LALLOC + 11 : LALLOC + 61)) goto out;
  rc = 0;
out:
  for (int i = 0; i < NL; i++)
    if (cr[i].c) cacher_destroy(cr[i].c);
  if (cr2.c) cacher_destroy(cr2.c);
  for (uint64_t i = 0; ring && i < RING; i++) plan_close(&ring[i]);
  for (uint64_t i = 0; pb && i < n_plan; i++) data_batch_free(&pb[i]);
  free(pb);
  free(ring);
  return rc;
}
