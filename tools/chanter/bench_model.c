/*
 * chanter bench model: how close a CPU training step of each model comes to
 * OpenBLAS's own sgemm speed.
 *
 * For each model (dlrm, wdl, deepfm, dcn, dlrm_dcn) at batch 2048 (--batch)
 * it runs full training steps -- embag_train_step, the very step `chanter
 * train --local` runs: embedding bag forward over uniform random ids
 * (table_hotness of them per table and sample) in in-memory tables of the
 * job's layout (table_rows / table_scale, embedding_dim, state of
 * embedding_optimizer), model forward and backward, the dense optimizer
 * step, the coalesced embedding backward and the row updates -- and prints
 * samples/s, the GEMM FLOPs per sample (model_gemm_flops_per_sample),
 * achieved GFLOP/s, and, measured in the same run, cblas_sgemm GFLOP/s with
 * OpenBLAS on every CPU on the model's largest layer (its forward,
 * weight-gradient and input-gradient GEMMs at this batch) and on the
 * model's whole GEMM sequence.  ratio = achieved / largest-layer sgemm.  A
 * per-phase split of the step says where the rest goes.
 *
 * The machine may be shared, so the model and the sgemm baselines are
 * measured in alternating rounds; samples/s is given for the best round
 * and for the median one (what a run of training sees), the sgemm
 * figures for the best.  For dlrm_dcn it also prints the cross layers'
 * share of the GEMM FLOPs (MLPerf DLRMv2's shape,
 * deploy/jobs/mlperf-dlrmv2.ini: two thirds).  Embedding work runs per table on the model's
 * threads (embag.h), in training as here.
 *
 * The OpenBLAS kernel set is the one every chanter command runs, chosen
 * from the CPU's features when the process starts (blas_cpu.h: chanter's
 * main re-executes once with OPENBLAS_CORETYPE where OpenBLAS alone fell
 * back to generic kernels; CHANTER_BLAS_REEXEC=0 keeps OpenBLAS's own
 * pick).  The header names the set and who chose it, and ratio is the
 * share of that set's own GEMM peak measured in the same run.  Nothing is
 * a threshold: this prints.
 *
 * --device cuda times embdev_train_step instead -- the step `chanter
 * train --local` runs with device = cuda: the embedding tables in GPU
 * memory (embdev.h, as far as trainer.device_mb allows), the model on the
 * GPU (model.cu) -- at batch 2048 and 16384 (or --batch), for dlrm alone
 * unless --models names others.  dlrm runs on a fixed shape (26 tables x
 * 100k rows, dim 16, one-hot uniform ids; docs/gpu.md's); every other
 * model on the config's shape as the CPU path reads it (bench_open: the
 * tables, table_scale, table_hotness, n_dense, model.*), e.g. dlrm_dcn
 * with --config deploy/jobs/mlperf-dlrmv2.ini.  It prints samples/s, ms
 * per iteration, its parts, and the step's GEMM GFLOP/s as a share of an
 * 8192^3 cublasSgemm measured once in the same run (and dlrm_dcn's cross
 * layers' share of the GEMM FLOPs).  Without a usable GPU it says so in
 * one line and exits 0.
 */
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "blas_cpu.h"
#include "cli.h"
#include "clock.h"
#include "cuda_check.h"
#include "data.h"
#include "embag.h"
#include "embdev.h"
#include "err.h"
#include "model.h"
#include "model_dev.h"
#include "nn.h"
#include "opt.h"
#include "pool.h"
#include "table.h"

#define ID_BATCHES 8 /* distinct random id batches cycled through */

typedef struct bench_s {
  uint32_t batch, n_dense, n_tables, dim, stride;
  uint32_t *hot;         /* ids per sample of each table (table_hotness; one-hot when unset) */
  size_t *id_off;        /* table t's ids at id_off[t] of a batch's ids */
  size_t ids_per_batch;  /* batch x the sum of hot */
  uint64_t *rows;        /* rows per table */
  float **tables;        /* in-memory row stores, stride floats a row */
  uint64_t *ids;         /* [ID_BATCHES][n_tables][batch x hot[t]] */
  float *dense, *labels; /* [batch x n_dense], [batch] */
  embag_t *eb;           /* the step's embedding work and the model's input, as in train --local */
  const uint64_t **idx;  /* per table: the ids of the step being run */
  opt_kind_t row_kind;
  opt_hparams_t row_hp;
} bench_t;

typedef struct phases_s {
  double emb_fwd, fwd, bwd, opt, emb_bwd; /* seconds per step */
} phases_t;

typedef struct result_s {
  const char *model;
  double samples_s, flops, gflops, sgemm_big, sgemm_all, ratio;
  double samples_s_median; /* the median round's: what a run of training sees, not its best moment */
  double cross_share;      /* dlrm_dcn: the cross layers' share of the GEMM FLOPs; else -1 */
  phases_t ph;
  uint32_t threads;
  char big[64];
  char desc[256];
} result_t;

/* The job's shape as the config gives it (cfg_layout: table_rows /
 * table_scale, embedding_dim; the data schema: table_hotness; n_dense),
 * ID_BATCHES batches of uniform random ids, dense inputs and labels; with
 * tables, also the in-memory tables and the embag of the CPU step (--device
 * cuda: none, the tables live in embdev). */
static int bench_open(bench_t *b, cfg_t *cfg, uint32_t batch, uint64_t rows_cap, int tables) {
  char err[256];
  table_layout_t l;
  memset(b, 0, sizeof(*b));
  int rc = cfg_layout(cfg, &l, err, sizeof(err));
  if (rc < 0) {
    fprintf(stderr, "bench model: %s\n", err);
    return rc;
  }
  rc = opt_kind_parse(cfg_str(cfg, "embedding_optimizer"), &b->row_kind);
  if (rc < 0) goto out;
  opt_hparams_from_cfg(cfg, b->row_kind, &b->row_hp);
  b->batch = batch;
  b->n_dense = (uint32_t)cfg_int(cfg, "n_dense");
  b->n_tables = l.n_tables;
  b->dim = l.n_tables ? l.tables[0].dim : (uint32_t)cfg_int(cfg, "embedding_dim");
  for (uint32_t t = 0; t < l.n_tables; t++)
    if (l.tables[t].dim != b->dim) {
      fprintf(stderr, "bench model: the models need one embedding_dim for all tables\n");
      rc = -EINVAL;
      goto out;
    }
  b->stride = b->dim + opt_row_state_floats(b->row_kind, b->dim);
  size_t B = batch;
  data_schema_t sc;
  if ((rc = data_schema_from_cfg(cfg, &sc, err, sizeof err)) < 0) {
    fprintf(stderr, "bench model: %s\n", err);
    goto out;
  }
  b->hot = calloc(l.n_tables + 1, sizeof *b->hot);
  b->id_off = calloc(l.n_tables + 1, sizeof *b->id_off);
  for (uint32_t t = 0; b->hot && b->id_off && t < l.n_tables; t++) {
    b->hot[t] = t < sc.n_tables ? sc.hotness[t] : 1;
    b->id_off[t] = b->ids_per_batch;
    b->ids_per_batch += B * b->hot[t];
  }
  data_schema_close(&sc);
  b->rows = calloc(l.n_tables + 1, sizeof(uint64_t));
  b->tables = calloc(l.n_tables + 1, sizeof(float *));
  b->ids = malloc((ID_BATCHES * b->ids_per_batch + 1) * sizeof(uint64_t));
  b->dense = malloc((B * b->n_dense + 1) * sizeof(float));
  b->labels = malloc(B * sizeof(float));
  b->idx = calloc(l.n_tables + 1, sizeof *b->idx);
  rc = -ENOMEM;
  if (!b->hot || !b->id_off || !b->rows || !b->tables || !b->ids || !b->dense || !b->labels || !b->idx) goto out;
  if (tables && embag_create(b->n_tables, b->hot, b->dim, batch, &b->eb)) goto out;
  for (uint32_t t = 0; t < b->n_tables; t++) {
    uint64_t r = l.tables[t].rows < rows_cap ? l.tables[t].rows : rows_cap;
    b->rows[t] = r;
    if (!tables) continue;
    b->tables[t] = malloc(r * b->stride * sizeof(float));
    if (!b->tables[t]) goto out;
    float row[1024];
    for (uint64_t k = 0; k < r; k++) {
      if (table_row_floats(&l, t) <= 1024) {
        table_init_row(&l, TABLE_KEY(t, k), row);
        memcpy(b->tables[t] + k * b->stride, row, b->stride * sizeof(float));
      } else {
        memset(b->tables[t] + k * b->stride, 0, b->stride * sizeof(float));
      }
    }
  }
  uint64_t s = 12345;
  for (size_t x = 0; x < ID_BATCHES; x++)
    for (uint32_t t = 0; t < b->n_tables; t++)
      for (size_t i = 0; i < B * b->hot[t]; i++) {
        s = table_mix64(s);
        b->ids[x * b->ids_per_batch + b->id_off[t] + i] = (s >> 8) % b->rows[t];
      }
  for (size_t i = 0; i < B * b->n_dense; i++) {
    s = table_mix64(s);
    b->dense[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
  }
  for (size_t i = 0; i < B; i++) {
    s = table_mix64(s);
    b->labels[i] = (float)(s & 1);
  }
  rc = 0;
out:
  table_layout_close(&l);
  return rc;
}

static void bench_close(bench_t *b) {
  for (uint32_t t = 0; b->tables && t < b->n_tables; t++) free(b->tables[t]);
  embag_destroy(b->eb);
  free(b->idx);
  free(b->hot);
  free(b->id_off);
  free(b->tables);
  free(b->rows);
  free(b->ids);
  free(b->dense);
  free(b->labels);
}

/* One training step, embag_train_step as train --local runs it; adds
 * each phase's seconds into ph. */
static double step(bench_t *b, model_dev_t *md, opt_t *o, uint32_t it, phases_t *ph) {
  uint32_t B = b->batch;
  const uint64_t *ids = b->ids + (size_t)(it % ID_BATCHES) * b->ids_per_batch;
  for (uint32_t t = 0; t < b->n_tables; t++) b->idx[t] = ids + b->id_off[t];
  double sec[EMBAG_PHASES] = {0};
  double loss = embag_train_step(b->eb, md, o, b->row_kind, &b->row_hp, b->tables, b->stride, B, b->dense, b->labels,
                                 b->idx, 1.0f / (float)B, sec);
  if (ph) {
    ph->emb_fwd += sec[EMBAG_PHASE_GATHER];
    ph->fwd += sec[EMBAG_PHASE_FORWARD];
    ph->bwd += sec[EMBAG_PHASE_BACKWARD];
    ph->opt += sec[EMBAG_PHASE_DENSE_UPDATE];
    ph->emb_bwd += sec[EMBAG_PHASE_EMBEDDING_UPDATE];
  }
  return loss;
}

/* Operands of a list of GEMMs, allocated once. */
typedef struct gemm_set_s {
  const model_gemm_t *g;
  size_t k;
  float *a[64], *b[64], *c[64];
  double flops;
} gemm_set_t;

static int gemm_set_open(gemm_set_t *s, const model_gemm_t *g, size_t k) {
  memset(s, 0, sizeof(*s));
  s->g = g;
  s->k = k > 64 ? 64 : k;
  for (size_t i = 0; i < s->k; i++) {
    size_t na = (size_t)g[i].m * g[i].k, nb = (size_t)g[i].k * g[i].n, nc = (size_t)g[i].m * g[i].n;
    s->a[i] = aligned_alloc(64, (na * 4 + 64) & ~(size_t)63);
    s->b[i] = aligned_alloc(64, (nb * 4 + 64) & ~(size_t)63);
    s->c[i] = aligned_alloc(64, (nc * 4 + 64) & ~(size_t)63);
    if (!s->a[i] || !s->b[i] || !s->c[i]) return -ENOMEM;
    for (size_t j = 0; j < na; j++) s->a[i][j] = (float)((j * 7) % 13) * 0.01f;
    for (size_t j = 0; j < nb; j++) s->b[i][j] = (float)((j * 5) % 11) * 0.01f;
    memset(s->c[i], 0, nc * 4);
    s->flops += 2.0 * g[i].m * g[i].n * g[i].k;
  }
  return 0;
}

static void gemm_set_close(gemm_set_t *s) {
  for (size_t i = 0; i < s->k; i++) {
    free(s->a[i]);
    free(s->b[i]);
    free(s->c[i]);
  }
}

static void gemm_set_run(const gemm_set_t *s) {
  for (size_t i = 0; i < s->k; i++) {
    const model_gemm_t *x = &s->g[i];
    int lda = x->trans_a ? (int)x->m : (int)x->k, ldb = x->trans_b ? (int)x->k : (int)x->n;
    cblas_sgemm(CblasRowMajor, x->trans_a ? CblasTrans : CblasNoTrans,
                x->trans_b ? CblasTrans : CblasNoTrans, (int)x->m, (int)x->n, (int)x->k, 1.0f,
                s->a[i], lda, s->b[i], ldb, 0.0f, s->c[i], (int)x->n);
  }
}

/* GFLOP/s of the set run back to back for at least min_s (after one
 * warm-up run). */
static double gemm_set_gflops(const gemm_set_t *s, double min_s) {
  gemm_set_run(s);
  int reps = 0;
  double t0 = clock_mono_s(), el;
  do {
    gemm_set_run(s);
    reps++;
    el = clock_mono_s() - t0;
  } while (el < min_s || reps < 2);
  return s->flops * reps / el / 1e9;
}

/* dlrm_dcn's cross layers' share of its GEMM FLOPs: 1 - the FLOPs of the
 * same model without them (built for one sample, only to count) / flops. */
static double cross_share(cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim, double flops) {
  char kv[64], err[256];
  model_t *m0 = NULL;
  double share = -1.0;
  long long was = (long long)cfg_int(cfg, "model.cross_layers");
  if (cfg_set(cfg, "model.cross_layers=0", "bench", err, sizeof err) == 0 &&
      model_create(cfg, n_dense, n_tables, dim, 1, &m0, err, sizeof err) == 0 && flops > 0)
    share = 1.0 - model_gemm_flops_per_sample(m0) / flops;
  model_destroy(m0);
  snprintf(kv, sizeof kv, "model.cross_layers=%lld", was);
  (void)cfg_set(cfg, kv, "bench", err, sizeof err);
  return share;
}

static int bench_one(bench_t *b, cfg_t *cfg, const char *name, uint32_t threads, int iters,
                     int rounds, double seconds, result_t *r) {
  char kv[64], err[256];
  int rc;
  memset(r, 0, sizeof(*r));
  r->model = name;
  snprintf(kv, sizeof(kv), "model=%s", name);
  if ((rc = cfg_set(cfg, kv, "bench", err, sizeof(err))) < 0 ||
      (rc = cfg_set(cfg, "device=cpu", "bench", err, sizeof(err))) < 0) {
    fprintf(stderr, "bench model: %s\n", err);
    return rc;
  }
  model_dev_t *md = NULL;
  model_t *m = NULL;
  opt_t *o = NULL;
  gemm_set_t big, all;
  memset(&big, 0, sizeof(big));
  memset(&all, 0, sizeof(all));
  rc = model_dev_create(cfg, b->n_dense, b->n_tables, b->dim, b->batch, &md, err, sizeof(err));
  if (rc < 0) {
    fprintf(stderr, "bench model: %s: %s\n", name, err);
    return rc;
  }
  m = model_dev_cpu_model(md);
  snprintf(r->desc, sizeof(r->desc), "%s", model_describe(m));
  r->cross_share = model_kind(m) == MODEL_DLRM_DCN ? cross_share(cfg, b->n_dense, b->n_tables, b->dim, model_gemm_flops_per_sample(m)) : -1.0;
  if (threads && (rc = model_set_threads(m, threads)) < 0) {
    fprintf(stderr, "bench model: threads: %s\n", err_str(rc));
    goto out;
  }
  r->threads = model_threads(m);
  model_init(m, (uint64_t)cfg_int(cfg, "seed"));
  if ((rc = opt_create(cfg, model_n_params(m), &o)) < 0) {
    fprintf(stderr, "bench model: optimizer: %s\n", err_str(rc));
    goto out;
  }

  /* the baselines: the largest layer's forward GEMM and the two backward
   * GEMMs after it, and the model's whole GEMM list */
  model_gemm_t g[64];
  size_t k = model_gemms(m, b->batch, g, 64);
  if (k > 64) k = 64;
  size_t best = 0;
  double best_f = -1.0;
  for (size_t i = 0; i < k; i++) {
    double f = (double)g[i].n * g[i].k;
    if (!g[i].trans_a && g[i].trans_b && f > best_f) {
      best_f = f;
      best = i;
    }
  }
  size_t nb = (best + 2 < k && !g[best + 2].trans_a && !g[best + 2].trans_b) ? 3 : 2;
  snprintf(r->big, sizeof(r->big), "%ux%u", g[best].k, g[best].n);
  if ((rc = gemm_set_open(&big, g + best, nb)) < 0 || (rc = gemm_set_open(&all, g, k)) < 0) {
    fprintf(stderr, "bench model: out of memory\n");
    goto out;
  }

  step(b, md, o, 0, NULL); /* warm-up: page in activations and tables */
  step(b, md, o, 1, NULL);
  uint32_t it = 2;
  double best_step = 1e30;
  double *round_step = calloc((size_t)rounds, sizeof *round_step);
  if (!round_step) {
    rc = -ENOMEM;
    goto out;
  }
  int ncpu = (int)pool_default_threads();
  for (int round = 0; round < rounds; round++) {
    /* the model, with its own threads (OpenBLAS single-threaded) */
    openblas_set_num_threads(r->threads > 1 ? 1 : ncpu);
    phases_t ph;
    memset(&ph, 0, sizeof(ph));
    int n = 0;
    double t0 = clock_mono_s(), el;
    do {
      step(b, md, o, it++, &ph);
      n++;
      el = clock_mono_s() - t0;
    } while (n < iters || el < seconds / (2 * rounds));
    round_step[round] = el / n;
    if (el / n < best_step) {
      best_step = el / n;
      r->ph.emb_fwd = ph.emb_fwd / n;
      r->ph.fwd = ph.fwd / n;
      r->ph.bwd = ph.bwd / n;
      r->ph.opt = ph.opt / n;
      r->ph.emb_bwd = ph.emb_bwd / n;
    }
    /* sgemm with OpenBLAS on every CPU */
    openblas_set_num_threads(ncpu);
    double gb = gemm_set_gflops(&big, seconds / (4 * rounds));
    double ga = gemm_set_gflops(&all, seconds / (4 * rounds));
    if (gb > r->sgemm_big) r->sgemm_big = gb;
    if (ga > r->sgemm_all) r->sgemm_all = ga;
  }
  openblas_set_num_threads(r->threads > 1 ? 1 : ncpu);
  r->samples_s = (double)b->batch / best_step;
  r->samples_s_median = (double)b->batch / bench_median(round_step, (size_t)rounds);
  free(round_step);
  r->flops = model_gemm_flops_per_sample(m);
  r->gflops = r->flops * r->samples_s / 1e9;
  r->ratio = r->gflops / r->sgemm_big;
out:
  gemm_set_close(&big);
  gemm_set_close(&all);
  opt_destroy(o);
  model_dev_destroy(md);
  return rc;
}

/* ---- --device cuda */

#define CUDA_TABLES 26
#define CUDA_ROWS 100000
#define CUDA_DIM 16
#define SGEMM_N 8192
#define CUDA_MODELS 5

typedef struct cuda_result_s {
  uint32_t batch, dev_tables;
  double dev_mib, samples_s, samples_s_median, ms, gflops, share;
  double ph[EMBAG_PHASES]; /* ms per iteration, the best round's */
} cuda_result_t;

/* One model of --device cuda: its shape, its GEMM FLOPs per sample
 * (counted on a CPU twin), and a result per batch size. */
typedef struct cuda_model_s {
  const char *name;
  uint32_t n_dense, n_tables, dim, ids; /* ids: per sample, all tables */
  uint64_t rows;                        /* all tables' */
  double flops, cross_share;            /* cross_share: dlrm_dcn's; else -1 */
  char desc[256];
  int done;
  cuda_result_t res[2];
} cuda_model_t;

#ifdef CHANTER_CUDA
/* The step at b's batch size on b's ids: rounds of at least iters steps
 * and seconds / rounds seconds each after three warm-up steps. */
static int cuda_one(bench_t *b, cfg_t *cfg, int iters, int rounds, double seconds, double flops, double sgemm,
                    cuda_result_t *r) {
  char err[1024] = "";
  table_layout_t l;
  model_dev_t *md = NULL;
  opt_t *o = NULL;
  embdev_t *e = NULL;
  uint32_t batch = b->batch;
  double *round_step = NULL;
  memset(r, 0, sizeof *r);
  r->batch = batch;
  int rc = cfg_layout(cfg, &l, err, sizeof err);
  if (rc) {
    fprintf(stderr, "bench model: %s\n", err);
    return rc;
  }
  int64_t mb = cfg_int(cfg, "trainer.device_mb");
  if ((rc = model_dev_create(cfg, b->n_dense, b->n_tables, b->dim, batch, &md, err, sizeof err)) != 0 ||
      (model_dev_init(md, (uint64_t)cfg_int(cfg, "seed")), (rc = opt_create(cfg, model_dev_n_params(md), &o)) != 0) ||
      (rc = embdev_create(&l, b->hot, batch, b->row_kind, &b->row_hp, mb < 0 ? EMBDEV_AUTO : mb * (INT64_C(1) << 20),
                          &e, err, sizeof err)) != 0) {
    fprintf(stderr, "bench model: %s, batch %u: %s\n", cfg_str(cfg, "model"), batch, err[0] ? err : err_str(rc));
    goto out;
  }
  r->dev_tables = embdev_n_device(e);
  r->dev_mib = (double)embdev_device_bytes(e) / (1 << 20);
  rc = -ENOMEM;
  if (!(round_step = calloc((size_t)rounds, sizeof *round_step))) goto out;
  uint32_t it = 0;
  double best = 1e30;
  rc = ERR_CUDA;
  for (int round = -1; round < rounds; round++) { /* round -1: three warm-up steps */
    double sec[EMBAG_PHASES] = {0}, t0 = clock_mono_s(), el;
    int n = 0;
    do {
      const uint64_t *ids = b->ids + (size_t)(it++ % ID_BATCHES) * b->ids_per_batch;
      for (uint32_t t = 0; t < b->n_tables; t++) b->idx[t] = ids + b->id_off[t];
      if (isnan(embdev_train_step(e, md, o, batch, b->dense, b->labels, b->idx, 1.0f / (float)batch, sec))) {
        fprintf(stderr, "bench model: %s, batch %u: the step failed: %s\n", cfg_str(cfg, "model"), batch,
                embdev_error(e)[0] ? embdev_error(e) : "a CUDA call failed or the loss is NaN");
        goto out;
      }
      n++;
      el = clock_mono_s() - t0;
    } while (round < 0 ? n < 3 : (n < iters || el < seconds / rounds));
    if (round < 0) continue;
    round_step[round] = el / n;
    if (el / n < best) {
      best = el / n;
      for (int k = 0; k < EMBAG_PHASES; k++) r->ph[k] = 1e3 * sec[k] / n;
    }
  }
  qsort(round_step, (size_t)rounds, sizeof *round_step, bench_cmp_double);
  r->samples_s = (double)batch / best;
  r->samples_s_median = (double)batch / round_step[rounds / 2];
  r->ms = 1e3 * round_step[rounds / 2];
  r->gflops = flops * r->samples_s_median / 1e9;
  r->share = sgemm > 0 ? r->gflops / sgemm : 0;
  rc = 0;
out:
  free(round_step);
  embdev_destroy(e);
  opt_destroy(o);
  model_dev_destroy(md);
  table_layout_close(&l);
  return rc;
}

/* The keys dlrm's fixed shape sets (the first two integers), saved to be
 * put back after it. */
static const char *const fixed_keys[] = {"embedding_dim", "table_scale", "table_dims", "table_hotness", "table_rows"};
#define N_FIXED (sizeof fixed_keys / sizeof fixed_keys[0])

/* dlrm runs on docs/gpu.md's shape: 26 tables x 100,000 rows, dim 16,
 * one-hot ids; the config's values of those keys go to saved[] (freed by
 * the caller) for fixed_restore.  0 or -1 (said why on stderr). */
static int fixed_apply(cfg_t *cfg, char *saved[N_FIXED]) {
  char err[256], num[32], rows[CUDA_TABLES * 8 + 16] = "table_rows=";
  for (size_t k = 0; k < N_FIXED; k++) {
    const char *key = fixed_keys[k], *v = k < 2 ? num : cfg_str(cfg, key);
    if (k < 2) snprintf(num, sizeof num, "%lld", (long long)cfg_int(cfg, key));
    size_t len = strlen(key) + strlen(v) + 2;
    if (!(saved[k] = malloc(len))) return -1;
    snprintf(saved[k], len, "%s=%s", key, v);
  }
  for (int t = 0; t < CUDA_TABLES; t++) strcat(rows, t ? ",100000" : "100000");
  const char *sets[] = {"embedding_dim=16", "table_dims=", "table_hotness=", "table_scale=1", rows};
  for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++)
    if (cfg_set(cfg, sets[k], "bench", err, sizeof err) < 0) {
      fprintf(stderr, "bench model: %s\n", err);
      return -1;
    }
  return 0;
}

static void fixed_restore(cfg_t *cfg, char *saved[N_FIXED]) {
  char err[256];
  for (size_t k = 0; k < N_FIXED; k++)
    if (saved[k] && cfg_set(cfg, saved[k], "bench", err, sizeof err) < 0) fprintf(stderr, "bench model: %s\n", err);
}

/* One model at each batch size (batches[0 .. nb)), on the config's shape
 * (dlrm: the fixed one).  0, or nonzero after saying why. */
static int cuda_model(cfg_t *cfg, const char *name, const uint32_t *batches, int nb, int iters, int rounds,
                      double seconds, double sgemm, cuda_model_t *cm) {
  char kv[64], err[256], *saved[N_FIXED] = {0};
  model_t *m = NULL;
  int rc = -1;
  memset(cm, 0, sizeof *cm);
  cm->name = name;
  cm->cross_share = -1.0;
  snprintf(kv, sizeof kv, "model=%s", name);
  if (strcmp(name, "dlrm") == 0 && fixed_apply(cfg, saved) != 0) goto out;
  if (cfg_set(cfg, kv, "bench", err, sizeof err) < 0 || cfg_set(cfg, "device=cuda", "bench", err, sizeof err) < 0) {
    fprintf(stderr, "bench model: %s\n", err);
    goto out;
  }
  for (int k = 0; k < nb; k++) {
    bench_t b;
    if ((rc = bench_open(&b, cfg, batches[k], UINT64_MAX, 0)) == 0 && k == 0) {
      cm->n_dense = b.n_dense;
      cm->n_tables = b.n_tables;
      cm->dim = b.dim;
      cm->ids = (uint32_t)(b.ids_per_batch / b.batch);
      for (uint32_t t = 0; t < b.n_tables; t++) cm->rows += b.rows[t];
      /* GEMM FLOPs per sample, counted on a CPU twin of the model */
      if ((rc = model_create(cfg, b.n_dense, b.n_tables, b.dim, 64, &m, err, sizeof err)) != 0) {
        fprintf(stderr, "bench model: %s: %s\n", name, err);
      } else {
        cm->flops = model_gemm_flops_per_sample(m);
        snprintf(cm->desc, sizeof cm->desc, "%s", model_describe(m));
        if (model_kind(m) == MODEL_DLRM_DCN)
          cm->cross_share = cross_share(cfg, b.n_dense, b.n_tables, b.dim, cm->flops);
      }
    }
    if (rc == 0 && (rc = cuda_one(&b, cfg, iters, rounds, seconds, cm->flops, sgemm, &cm->res[k])) == 0) cm->done++;
    bench_close(&b);
    if (rc != 0) break;
  }
out:
  model_destroy(m);
  fixed_restore(cfg, saved);
  for (size_t k = 0; k < N_FIXED; k++) free(saved[k]);
  return rc;
}

static void cuda_print_json(const cuda_model_t *cms, int n, double sgemm) {
  printf("{\"device\": \"cuda\", \"sgemm_gflops\": %.1f, \"models\": [", sgemm);
  for (int i = 0; i < n; i++) {
    const cuda_model_t *cm = &cms[i];
    printf("%s\n {\"model\": \"%s\", \"tables\": %u, \"rows\": %" PRIu64 ", \"dim\": %u, \"ids_per_sample\": %u, "
           "\"flops_per_sample\": %.0f, \"cross_flops_share\": %.4f, \"results\": [",
           i ? "," : "", cm->name, cm->n_tables, cm->rows, cm->dim, cm->ids, cm->flops, cm->cross_share);
    for (int k = 0; k < cm->done; k++) {
      const cuda_result_t *r = &cm->res[k];
      printf("%s\n  {\"batch\": %u, \"samples_per_sec\": %.1f, \"samples_per_sec_median\": %.1f, "
             "\"ms_per_iteration\": %.4f, \"gflops\": %.2f, \"sgemm_share\": %.5f, \"device_tables\": %u, "
             "\"ms_gather\": %.4f, \"ms_fwd\": %.4f, \"ms_bwd\": %.4f, \"ms_dense_update\": %.4f, \"ms_embedding_update\": %.4f}",
             k ? "," : "", r->batch, r->samples_s, r->samples_s_median, r->ms, r->gflops, r->share, r->dev_tables,
             r->ph[EMBAG_PHASE_GATHER], r->ph[EMBAG_PHASE_FORWARD], r->ph[EMBAG_PHASE_BACKWARD],
             r->ph[EMBAG_PHASE_DENSE_UPDATE], r->ph[EMBAG_PHASE_EMBEDDING_UPDATE]);
    }
    printf("]}");
  }
  printf("]}\n");
}

static void cuda_print(const cuda_model_t *cms, int n, double sgemm, const cfg_t *cfg) {
  printf("chanter bench model --device cuda: embdev_train_step (train --local's step), optimizer %s, rows %s\n",
         cfg_str(cfg, "optimizer"), cfg_str(cfg, "embedding_optimizer"));
  printf("sgemm peak: cublasSgemm %d^3 FP32 %.1f GFLOP/s, measured once before the models; share = step GFLOP/s "
         "(median round) / sgemm peak\n",
         SGEMM_N, sgemm);
  for (int i = 0; i < n; i++) {
    const cuda_model_t *cm = &cms[i];
    printf("%s: %u tables, %" PRIu64 " rows in all, dim %u, uniform ids, %u a sample (%s), %u dense; %.3f "
           "MFLOP/sample in GEMMs",
           cm->name, cm->n_tables, cm->rows, cm->dim, cm->ids, cm->ids == cm->n_tables ? "one-hot" : "table_hotness",
           cm->n_dense, cm->flops / 1e6);
    if (cm->cross_share >= 0) printf(" (the cross layers: %.0f%% of them)", 100.0 * cm->cross_share);
    printf("\n  %s\n", cm->desc);
    printf("%6s %11s %10s %8s %9s %6s %9s | ms/iter %6s %6s %6s %6s %6s\n", "batch", "samples/s", "(median)",
           "ms/iter", "GFLOP/s", "share", "GPU tabs", "gather", "fwd", "bwd", "dense", "embupd");
    for (int k = 0; k < cm->done; k++) {
      const cuda_result_t *r = &cm->res[k];
      printf("%6u %11.0f %10.0f %8.3f %9.1f %5.1f%% %4u/%-4u |         %6.3f %6.3f %6.3f %6.3f %6.3f\n", r->batch,
             r->samples_s, r->samples_s_median, r->ms, r->gflops, 100.0 * r->share, r->dev_tables, cm->n_tables,
             r->ph[EMBAG_PHASE_GATHER], r->ph[EMBAG_PHASE_FORWARD], r->ph[EMBAG_PHASE_BACKWARD],
             r->ph[EMBAG_PHASE_DENSE_UPDATE], r->ph[EMBAG_PHASE_EMBEDDING_UPDATE]);
    }
  }
}
#endif

/* --device cuda: each of models (comma-separated) at batch 2048 and 16384
 * (or batch); dlrm on the fixed shape, the others on the config's. */
static int bench_cuda(cli_t *cli, const char *models, uint32_t batch, int iters, int rounds, double seconds) {
  char err[1024] = "";
  char list[128];
  const char *names[CUDA_MODELS];
  int nm = 0;
  snprintf(list, sizeof list, "%s", models);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    model_kind_t k;
    if (model_kind_parse(tok, &k) < 0 || nm == CUDA_MODELS) {
      fprintf(stderr, "bench model: %s '%s'\n", nm == CUDA_MODELS ? "too many models at" : "unknown model", tok);
      return 2;
    }
    names[nm++] = model_kind_name(k);
  }
  if (cuda_check(err, sizeof err) != 0) {
    printf("chanter bench model --device cuda: nothing measured: %s\n", err);
    return 0;
  }
#ifdef CHANTER_CUDA
  double sgemm = embdev_sgemm_gflops(SGEMM_N, err, sizeof err);
  if (sgemm <= 0) fprintf(stderr, "bench model: the sgemm baseline failed: %s\n", err);
  uint32_t batches[2] = {2048, 16384};
  int nb = 2;
  if (batch) {
    batches[0] = batch;
    nb = 1;
  }
  cuda_model_t cms[CUDA_MODELS];
  int rc = 0, n = 0;
  while (n < nm && rc == 0) {
    rc = cuda_model(cli->cfg, names[n], batches, nb, iters, rounds, seconds, sgemm, &cms[n]);
    n++;
  }
  if (cli->json)
    cuda_print_json(cms, n, sgemm);
  else
    cuda_print(cms, n, sgemm, cli->cfg);
  return rc ? 1 : 0;
#else
  (void)cli;
  (void)names;
  (void)batch;
  (void)iters;
  (void)rounds;
  (void)seconds;
  return 0;
#endif
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter bench model [--batch N] [--iters N] [--seconds S] [--models a,b]\n"
          "                           [--threads N] [--rounds N] [--rows-cap N]\n                           [--device cpu|cuda] [--json]\n"
          "  --batch      samples per step (default 2048)\n"
          "  --iters      steps per round at least (default 3)\n"
          "  --rounds     alternating model / sgemm rounds; samples/s of the best and the median one (default 10)\n"
          "  --seconds    time per model, all rounds (default 6)\n"
          "  --models     subset of dlrm,wdl,deepfm,dcn,dlrm_dcn (default all; --device cuda: dlrm)\n"
          "  --threads    model threads (default: the CPUs available, at most %d)\n"
          "  --rows-cap   cap on rows per in-memory table (default none)\n"
          "  --device     cpu (default) or cuda: train --local's GPU step (embdev) at batch 2048 and 16384 (or\n"
          "               --batch), of dlrm (default) on 26 tables x 100k rows, dim 16, one-hot ids, and of the\n"
          "               other --models on the config's shape (dlrm_dcn: --config deploy/jobs/mlperf-dlrmv2.ini);\n"
          "               exits 0 without a GPU\n"
          "The model, optimizers and table layout come from the config (--config/--set).\n"
          "The OpenBLAS kernel set is chosen from the CPU's features at start, as for every chanter command;\n"
          "OPENBLAS_CORETYPE=NAME forces one, CHANTER_BLAS_REEXEC=0 keeps OpenBLAS's own pick.\n",
          MODEL_PARTS);
}

int bench_model(cli_t *cli) {
  const char *s;
  uint32_t batch = 2048, threads = 0;
  int iters = 3, rounds = 10;
  double seconds = 6.0;
  uint64_t rows_cap = UINT64_MAX;
  const char *models = "dlrm,wdl,deepfm,dcn,dlrm_dcn";
  if (cli_flag(cli, "--help") || cli_flag(cli, "-h")) {
    usage(stdout);
    return 0;
  }
  const char *device = cli_opt(cli, "--device");
  int batch_given = 0;
  if ((s = cli_opt(cli, "--batch"))) {
    batch = (uint32_t)strtoul(s, NULL, 10);
    batch_given = 1;
  }
  if ((s = cli_opt(cli, "--iters"))) iters = atoi(s);
  if ((s = cli_opt(cli, "--rounds"))) rounds = atoi(s);
  if ((s = cli_opt(cli, "--seconds"))) seconds = atof(s);
  if ((s = cli_opt(cli, "--threads"))) threads = (uint32_t)strtoul(s, NULL, 10);
  if ((s = cli_opt(cli, "--rows-cap"))) rows_cap = strtoull(s, NULL, 10);
  int models_given = 0;
  if ((s = cli_opt(cli, "--models"))) {
    models = s;
    models_given = 1;
  }
  if (cli->argc > 0) return cli_done(cli, "model");
  if (batch == 0 || rows_cap == 0 || iters < 1 || rounds < 1 || seconds < 0) {
    usage(stderr);
    return 2;
  }
  if (device && strcmp(device, "cpu") != 0) {
    if (strcmp(device, "cuda") != 0) {
      usage(stderr);
      return 2;
    }
    return bench_cuda(cli, models_given ? models : "dlrm", batch_given ? batch : 0, iters, rounds, seconds);
  }
  bench_t b;
  int rc = bench_open(&b, cli->cfg, batch, rows_cap, 1);
  if (rc < 0) {
    bench_close(&b);
    return 1;
  }
  result_t res[5];
  int nr = 0;
  char list[128];
  snprintf(list, sizeof(list), "%s", models);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && nr < 5;
       tok = strtok_r(NULL, ",", &save)) {
    model_kind_t k;
    if (model_kind_parse(tok, &k) < 0) {
      fprintf(stderr, "bench model: unknown model '%s'\n", tok);
      rc = -EINVAL;
      break;
    }
    if ((rc = bench_one(&b, cli->cfg, model_kind_name(k), threads, iters, rounds, seconds, &res[nr])) < 0)
      break;
    nr++;
  }
  if (cli->json) {
    printf("{\"batch\": %u, \"blas_core\": \"%s\", \"blas_chosen_by\": \"%s\", \"results\": [", batch,
           blas_cpu_core(), blas_cpu_by_name(blas_cpu_by()));
    for (int i = 0; i < nr; i++)
      printf("%s\n {\"model\": \"%s\", \"threads\": %u, \"samples_per_sec\": %.1f, "
             "\"samples_per_sec_median\": %.1f, \"flops_per_sample\": %.0f, \"gflops\": %.2f, \"sgemm_largest_gflops\": %.2f, "
             "\"sgemm_all_gflops\": %.2f, \"ratio\": %.4f, \"ms_emb_fwd\": %.3f, \"ms_fwd\": %.3f, "
             "\"ms_bwd\": %.3f, \"ms_opt\": %.3f, \"ms_emb_bwd\": %.3f, \"cross_flops_share\": %.4f}",
             i ? "," : "", res[i].model, res[i].threads, res[i].samples_s, res[i].samples_s_median, res[i].flops,
             res[i].gflops, res[i].sgemm_big, res[i].sgemm_all, res[i].ratio,
             1e3 * res[i].ph.emb_fwd, 1e3 * res[i].ph.fwd, 1e3 * res[i].ph.bwd,
             1e3 * res[i].ph.opt, 1e3 * res[i].ph.emb_bwd, res[i].cross_share);
    printf("]}\n");
  } else {
    size_t ids = b.ids_per_batch / (batch ? batch : 1);
    printf("chanter bench model: batch %u, %u dense, %u tables x dim %u, %zu ids a sample (%s), optimizer %s, rows "
           "%s; model threads %u\n",
           batch, b.n_dense, b.n_tables, b.dim, ids, ids == b.n_tables ? "one-hot" : "table_hotness",
           cfg_str(cli->cfg, "optimizer"), cfg_str(cli->cfg, "embedding_optimizer"), nr ? res[0].threads : 0);
    printf("blas: %s\n", blas_cpu_describe());
    for (int i = 0; i < nr; i++) {
      printf("  %s", res[i].desc);
      if (res[i].cross_share >= 0) printf(" (the cross layers: %.0f%% of the GEMM FLOPs)", 100.0 * res[i].cross_share);
      printf("\n");
    }
    printf("sgemm(layer): cblas_sgemm, OpenBLAS on %u CPUs, on the largest layer's fwd+dW+dx "
           "shapes; sgemm(all): the model's GEMMs alone; ratio = GFLOP/s / sgemm(layer), the share of the "
           "%s kernels' GEMM peak; best of %d rounds (samples/s: best, then the median round's)\n",
           pool_default_threads(), blas_cpu_core(), rounds);
    printf("%-7s %10s %10s %9s %8s %9s %8s %8s %6s | ms/step %6s %6s %6s %6s %6s\n", "model",
           "samples/s", "(median)", "MFLOP/smp", "GFLOP/s", "layer", "sgemm", "sgemm", "ratio", "embfw",
           "fwd", "bwd", "opt", "embbw");
    printf("%-7s %10s %10s %9s %8s %9s %8s %8s %6s |\n", "", "", "", "", "", "", "(layer)", "(all)", "");
    for (int i = 0; i < nr; i++) {
      const result_t *r = &res[i];
      printf("%-7s %10.0f %10.0f %9.3f %8.1f %9s %8.1f %8.1f %5.1f%% |         %6.2f %6.2f %6.2f %6.2f "
             "%6.2f\n",
             r->model, r->samples_s, r->samples_s_median, r->flops / 1e6, r->gflops, r->big, r->sgemm_big,
             r->sgemm_all, 100.0 * r->ratio, 1e3 * r->ph.emb_fwd, 1e3 * r->ph.fwd,
             1e3 * r->ph.bwd, 1e3 * r->ph.opt, 1e3 * r->ph.emb_bwd);
    }
  }
  bench_close(&b);
  return rc < 0 ? 1 : 0;
}
