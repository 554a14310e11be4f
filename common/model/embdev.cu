/*
 * embdev.cu: the embedding tables of train --local in GPU memory and
 * their step (contract in embdev.h).
 *
 * Self-review: how each piece mirrors the CPU's embag.
 *
 *  layout     device table j (0 .. nd-1, the device tables in index order)
 *             is one cudaMalloc of rows * rf floats, row r at r * rf, the
 *             row-optimizer state after its dim floats (table.h), filled
 *             with table_init_row on the host and copied (bits moved).
 *  ids        the batch's ids of device table j sit at n * hpre[j] in one
 *             pinned buffer (hpre: prefix sums of the device tables'
 *             hotness), sample-major as in the batch; one cudaMemcpyAsync
 *             sends them; an event says when the buffer may be refilled.
 *  k_pool     = nn_embedding_bag_fwd per table: one thread per (sample i,
 *             device table j, column d), o = row(id[0])[d], then o +=
 *             row(id[h])[d] for h = 1 .. hotness-1, written at column
 *             t * dim + d of the model's input row i (t = the table's
 *             index).  The thread of column 0 also writes each id's sort
 *             key (j << rbits | row) and its sample i.
 *  the fold   = nn_embedding_bag_bwd: the keys of all device tables are
 *             sorted by one stable LSD radix sort (CUB; only the
 *             rbits + jbits low bits) carrying the sample, so equal keys
 *             -- one row of one table -- keep the order (i, h) ascending,
 *             the CPU's sample order.  k_update has one thread per sorted
 *             position; the thread at the first position of a run of equal
 *             keys owns that row (rows are distinct across runs: no two
 *             threads write one row, no atomics) and adds the gradient
 *             rows of the run's samples in that order starting from 0.0f,
 *             as add_row does after the memset, CHUNK columns at a time in
 *             registers (each column's sum is the same sequence of adds).
 *  the update = opt_row_update, same expressions, same association:
 *               sgd:     w[d] -= lr * g[d]
 *               adagrad: h[d] += g[d] * g[d]; w[d] -= lr * g[d] / (sqrtf(h[d]) + eps)
 *               rowwise: ss = 0; ss += g[d] * g[d] (d ascending);
 *                        h = row[dim] + ss / (float)dim; row[dim] = h;
 *                        step = lr / (sqrtf(h) + eps); w[d] -= step * g[d]
 *             (a row wider than CHUNK sums its gradient again for the
 *             second pass: the same adds, the same bits).  --fmad=false
 *             keeps products rounded as C11 does; nvcc's defaults make
 *             sqrtf and '/' IEEE-rounded with denormals kept.
 *  host tables run embag with skip = the device tables, on the
 *             model's host threads (model_dev_pool); their columns cross
 *             with model_dev_emb_cols_in and model_dev_demb_cols_out.
 *
 * Launches per training step on the device tables: the ids' copy, k_pool,
 * CUB's sort (a few kernels), k_update, and one wait at the end.  Kernels
 * are sized from n on the host; k_update runs over every sorted position
 * and the threads that do not start a run return at once, so the number
 * of distinct rows never travels to the host.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/cub.cuh>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "nn_cuda.h"

extern "C" { /* C headers without their own extern "C" */
#include "clock.h"
#include "embag.h"
#include "err.h"
#include "model_dev.h"
#include "opt.h"
#include "pool.h"
#include "table.h"
}

#include "embdev.h"

#define TPB 256
#define CHUNK 16                   /* gradient columns a k_update thread keeps in registers */
#define INIT_ROWS (UINT64_C(1) << 16) /* rows initialized on the host per copy */

struct embdev_s {
  uint32_t n_tables, dim, rf, max_batch;
  opt_kind_t kind;
  opt_hparams_t hp;
  uint32_t *hotness;          /* n_tables */
  uint64_t *rows;             /* n_tables */
  uint8_t *on_dev, *on_host;  /* n_tables: 1 where the table lives there */
  /* device tables */
  uint32_t nd;
  uint64_t dev_bytes;
  int32_t *slot;              /* n_tables: its j, or -1 */
  uint32_t *tab, *hpre;       /* host: nd table indices; nd + 1 hotness prefix sums */
  float **base;               /* host: nd device row stores */
  uint32_t rbits, end_bit;    /* sort key = j << rbits | row; bits sorted */
  uint32_t *d_tab, *d_hot, *d_hpre;
  float **d_base;
  uint64_t *h_ids;            /* pinned: max_batch * hpre[nd] */
  uint64_t *d_ids;
  uint64_t *d_keys[2];
  uint32_t *d_vals[2];
  void *d_temp;
  size_t temp_bytes;
  cudaEvent_t ids_copied;
  uint32_t fwd_n;
  int fwd_train;
  /* host tables */
  uint32_t nh;
  float **hbase;              /* n_tables: host row stores (NULL on the device) */
  embag_t *eb;
  float *logits;
  char msg[512];
};

/* 1 when st is success; else the first failure's sentence in e->msg. */
static int ok(embdev_t *e, cudaError_t st, const char *what) {
  if (st == cudaSuccess) return 1;
  if (!e->msg[0]) (void)cuda_check_error((int)st, what, e->msg, sizeof e->msg);
  return 0;
}

static unsigned blocks(size_t total) { return (unsigned)((total + TPB - 1) / TPB); }

static uint32_t bits_for(uint64_t max_value) {
  uint32_t b = 0;
  while (b < 64 && (max_value >> b) != 0) b++;
  return b;
}

/* ------------------------------------------------------------------ kernels */

/* One thread per (sample i, device table j, column d); see the top. */
static __global__ void k_pool(const float *const *__restrict__ base, const uint32_t *__restrict__ tab,
                              const uint32_t *__restrict__ hot, const uint32_t *__restrict__ hpre, uint32_t nd,
                              uint32_t n, uint32_t dim, uint32_t rf, size_t width, const uint64_t *__restrict__ ids,
                              float *__restrict__ out, uint64_t *__restrict__ keys, uint32_t *__restrict__ vals,
                              uint32_t rbits) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (size_t)n * nd * dim) return;
  uint32_t d = (uint32_t)(t % dim);
  size_t q = t / dim;
  uint32_t j = (uint32_t)(q % nd), i = (uint32_t)(q / nd), h = hot[j];
  size_t at = (size_t)n * hpre[j] + (size_t)i * h;
  const uint64_t *id = ids + at;
  const float *b = base[j];
  float o = 0.0f;
  if (h) {
    o = b[id[0] * rf + d];
    for (uint32_t k = 1; k < h; k++) o += b[id[k] * rf + d];
  }
  out[(size_t)i * width + (size_t)tab[j] * dim + d] = o;
  if (keys && d == 0)
    for (uint32_t k = 0; k < h; k++) {
      keys[at + k] = ((uint64_t)j << rbits) | id[k];
      vals[at + k] = i;
    }
}

/* acc[c] = sum over the run's positions q in order of g[vals[q] * width + c],
 * from 0.0f, for c < left (add_row's adds, column by column). */
static __device__ __forceinline__ void run_sum(float acc[CHUNK], const float *__restrict__ g,
                                               const uint32_t *__restrict__ vals, uint32_t p, uint32_t end,
                                               size_t width, uint32_t left) {
#pragma unroll
  for (uint32_t c = 0; c < CHUNK; c++) acc[c] = 0.0f;
  for (uint32_t q = p; q < end; q++) {
    const float *s = g + (size_t)vals[q] * width;
#pragma unroll
    for (uint32_t c = 0; c < CHUNK; c++)
      if (c < left) acc[c] += s[c];
  }
}

/* One thread per sorted position; the first of each run folds and updates
 * its row (see the top). */
template <int KIND>
static __global__ void k_update(const uint64_t *__restrict__ keys, const uint32_t *__restrict__ vals, uint32_t total,
                                uint32_t rbits, float *const *__restrict__ base, const uint32_t *__restrict__ tab,
                                uint32_t dim, uint32_t rf, size_t width, const float *__restrict__ demb, float lr,
                                float eps, const uint64_t *__restrict__ lim, unsigned long long *count) {
  uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= total) return;
  uint64_t key = keys[p];
  if (p > 0 && keys[p - 1] == key) return;
  uint32_t j = (uint32_t)(key >> rbits);
  uint64_t row = key & ((UINT64_C(1) << rbits) - 1);
  if (lim && row >= lim[j]) return; /* a placeholder row: never updated (embdev_set) */
  if (count) atomicAdd(count, 1ULL);
  uint32_t end = p + 1;
  while (end < total && keys[end] == key) end++;
  float *w = base[j] + row * rf;
  const float *g = demb + (size_t)tab[j] * dim;
  float acc[CHUNK], ss = 0.0f;
  for (uint32_t d0 = 0; d0 < dim; d0 += CHUNK) {
    run_sum(acc, g + d0, vals, p, end, width, dim - d0);
#pragma unroll
    for (uint32_t c = 0; c < CHUNK; c++) {
      if (d0 + c >= dim) continue;
      float x = acc[c];
      if (KIND == OPT_SGD) {
        w[d0 + c] -= lr * x;
      } else if (KIND == OPT_ADAGRAD) {
        w[dim + d0 + c] += x * x;
        w[d0 + c] -= lr * x / (sqrtf(w[dim + d0 + c]) + eps);
      } else {
        ss += x * x;
      }
    }
  }
  if (KIND == OPT_ROWWISE_ADAGRAD) {
    float h = w[dim] + ss / (float)dim;
    w[dim] = h;
    float step = lr / (sqrtf(h) + eps);
    for (uint32_t d0 = 0; d0 < dim; d0 += CHUNK) {
      if (dim > CHUNK) run_sum(acc, g + d0, vals, p, end, width, dim - d0); /* else acc holds it */
#pragma unroll
      for (uint32_t c = 0; c < CHUNK; c++)
        if (d0 + c < dim) w[d0 + c] -= step * acc[c];
    }
  }
}

/* ------------------------------------------------------------------ create */

void embdev_destroy(embdev_t *e) {
  if (!e) return;
  if (e->base)
    for (uint32_t j = 0; j < e->nd; j++) cudaFree(e->base[j]);
  for (uint32_t t = 0; e->hbase && t < e->n_tables; t++) free(e->hbase[t]);
  cudaFree(e->d_tab);
  cudaFree(e->d_hot);
  cudaFree(e->d_hpre);
  cudaFree(e->d_base);
  cudaFree(e->d_ids);
  cudaFree(e->d_keys[0]);
  cudaFree(e->d_keys[1]);
  cudaFree(e->d_vals[0]);
  cudaFree(e->d_vals[1]);
  cudaFree(e->d_temp);
  if (e->h_ids) cudaFreeHost(e->h_ids);
  if (e->ids_copied) cudaEventDestroy(e->ids_copied);
  embag_destroy(e->eb);
  free(e->hotness);
  free(e->rows);
  free(e->on_dev);
  free(e->on_host);
  free(e->slot);
  free(e->tab);
  free(e->hpre);
  free(e->base);
  free(e->hbase);
  free(e->logits);
  free(e);
}

/* Rows of table t, table_init_row's, into dst (device or host); buf holds
 * INIT_ROWS rows. */
static int init_rows(embdev_t *e, const table_layout_t *l, uint32_t t, float *dst, int device, float *buf) {
  for (uint64_t r0 = 0; r0 < e->rows[t]; r0 += INIT_ROWS) {
    uint64_t m = e->rows[t] - r0 < INIT_ROWS ? e->rows[t] - r0 : INIT_ROWS;
    float *to = device ? buf : dst + r0 * e->rf;
    for (uint64_t r = 0; r < m; r++) table_init_row(l, TABLE_KEY(t, r0 + r), to + r * e->rf);
    if (device && !ok(e, cudaMemcpy(dst + r0 * e->rf, buf, m * e->rf * sizeof(float), cudaMemcpyHostToDevice),
                      "cudaMemcpy (embdev_create: initial rows)"))
      return ERR_CUDA;
  }
  return 0;
}

static int fail(int rc, char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(int rc, char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && err_len) vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return rc;
}

int embdev_create(const table_layout_t *l, const uint32_t *hotness, uint32_t max_batch, opt_kind_t kind,
                  const opt_hparams_t *hp, int64_t budget, embdev_t **out, char *err, size_t err_len) {
  *out = NULL;
  if (err && err_len) err[0] = 0;
  uint32_t T = l->n_tables;
  if (!T || !max_batch) return fail(-EINVAL, err, err_len, "embdev: no tables or a batch of 0");
  if (kind != OPT_SGD && kind != OPT_ADAGRAD && kind != OPT_ROWWISE_ADAGRAD)
    return fail(-EINVAL, err, err_len, "embedding_optimizer = %s cannot update embedding rows", opt_kind_name(kind));
  uint32_t dim = l->tables[0].dim, rf = dim + opt_row_state_floats(kind, dim);
  uint64_t sum_hot = 0;
  for (uint32_t t = 0; t < T; t++) {
    if (l->tables[t].dim != dim || table_row_floats(l, t) != rf)
      return fail(-EINVAL, err, err_len, "table %u has rows of %u floats (dim %u); embdev needs %u (dim %u and %s's state)",
                  t, table_row_floats(l, t), l->tables[t].dim, rf, dim, opt_kind_name(kind));
    sum_hot += hotness[t];
  }
  if ((uint64_t)max_batch * sum_hot > INT32_MAX)
    return fail(-EINVAL, err, err_len, "embdev: batch %u x %llu ids per sample is over 2^31 ids", max_batch,
                (unsigned long long)sum_hot);
  int rc = cuda_check(err, err_len);
  if (rc) return rc;
  embdev_t *e = (embdev_t *)calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->n_tables = T;
  e->dim = dim;
  e->rf = rf;
  e->max_batch = max_batch;
  e->kind = kind;
  e->hp = *hp;
  e->hotness = (uint32_t *)malloc(T * sizeof *e->hotness);
  e->rows = (uint64_t *)malloc(T * sizeof *e->rows);
  e->on_dev = (uint8_t *)calloc(T, 1);
  e->on_host = (uint8_t *)calloc(T, 1);
  e->slot = (int32_t *)malloc(T * sizeof *e->slot);
  e->tab = (uint32_t *)malloc(T * sizeof *e->tab);
  e->hpre = (uint32_t *)malloc((T + 1) * sizeof *e->hpre);
  e->base = (float **)calloc(T, sizeof *e->base);
  e->hbase = (float **)calloc(T, sizeof *e->hbase);
  e->logits = (float *)malloc((size_t)max_batch * sizeof(float));
  float *buf = (float *)malloc(INIT_ROWS * rf * sizeof(float));
  size_t max_ids = (size_t)max_batch * sum_hot;
  uint64_t max_rows = 1;
  rc = -ENOMEM;
  if (!e->hotness || !e->rows || !e->on_dev || !e->on_host || !e->slot || !e->tab || !e->hpre || !e->base ||
      !e->hbase || !e->logits || !buf)
    goto out;
  for (uint32_t t = 0; t < T; t++) {
    e->hotness[t] = hotness[t];
    e->rows[t] = l->tables[t].rows;
  }
  rc = ERR_CUDA;
  /* the step's buffers first (sized for every table), so that an
   * automatic budget sees what is left after them */
  if (!ok(e, cudaEventCreateWithFlags(&e->ids_copied, cudaEventDisableTiming), "cudaEventCreate (embdev)") ||
      !ok(e, cudaMallocHost((void **)&e->h_ids, max_ids * sizeof(uint64_t)), "cudaMallocHost (embdev ids)") ||
      !ok(e, cudaMalloc((void **)&e->d_ids, max_ids * sizeof(uint64_t)), "cudaMalloc (embdev ids)") ||
      !ok(e, cudaMalloc((void **)&e->d_keys[0], max_ids * sizeof(uint64_t)), "cudaMalloc (embdev keys)") ||
      !ok(e, cudaMalloc((void **)&e->d_keys[1], max_ids * sizeof(uint64_t)), "cudaMalloc (embdev keys)") ||
      !ok(e, cudaMalloc((void **)&e->d_vals[0], max_ids * sizeof(uint32_t)), "cudaMalloc (embdev samples)") ||
      !ok(e, cudaMalloc((void **)&e->d_vals[1], max_ids * sizeof(uint32_t)), "cudaMalloc (embdev samples)") ||
      !ok(e, cudaMalloc((void **)&e->d_tab, T * sizeof(uint32_t)), "cudaMalloc (embdev tables)") ||
      !ok(e, cudaMalloc((void **)&e->d_hot, T * sizeof(uint32_t)), "cudaMalloc (embdev tables)") ||
      !ok(e, cudaMalloc((void **)&e->d_hpre, (T + 1) * sizeof(uint32_t)), "cudaMalloc (embdev tables)") ||
      !ok(e, cudaMalloc((void **)&e->d_base, T * sizeof(float *)), "cudaMalloc (embdev tables)"))
    goto out;
  {
    /* CUB's storage for the widest sort of the largest batch */
    cub::DoubleBuffer<uint64_t> kb(e->d_keys[0], e->d_keys[1]);
    cub::DoubleBuffer<uint32_t> vb(e->d_vals[0], e->d_vals[1]);
    if (!ok(e, cub::DeviceRadixSort::SortPairs(NULL, e->temp_bytes, kb, vb, (uint32_t)max_ids, 0, 64),
            "cub::DeviceRadixSort::SortPairs (embdev sizing)") ||
        !ok(e, cudaMalloc(&e->d_temp, e->temp_bytes ? e->temp_bytes : 1), "cudaMalloc (embdev sort)"))
      goto out;
  }
  {
    uint64_t b;
    if (budget == EMBDEV_AUTO) {
      size_t fr = 0, tot = 0;
      if (!ok(e, cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo (embdev)")) goto out;
      b = embdev_budget(EMBDEV_AUTO, fr, tot);
    } else {
      b = budget > 0 ? (uint64_t)budget : 0;
    }
    embdev_plan(l, b, e->on_dev, NULL);
  }
  /* the device tables in index order; one whose allocation fails anyway
   * (fragmentation, another process) stays on the host */
  e->hpre[0] = 0;
  for (uint32_t t = 0; t < T; t++) {
    e->slot[t] = -1;
    if (!e->on_dev[t]) continue;
    uint32_t j = e->nd;
    uint64_t bytes = embdev_table_bytes(l, t);
    if (cudaMalloc((void **)&e->base[j], bytes ? bytes : 4) != cudaSuccess) {
      (void)cudaGetLastError();
      e->base[j] = NULL;
      e->on_dev[t] = 0;
      continue;
    }
    if ((rc = init_rows(e, l, t, e->base[j], 1, buf)) != 0) {
      e->nd++; /* freed by destroy */
      goto out;
    }
    e->slot[t] = (int32_t)j;
    e->tab[j] = t;
    e->hpre[j + 1] = e->hpre[j] + hotness[t];
    e->dev_bytes += bytes;
    if (e->rows[t] > max_rows) max_rows = e->rows[t];
    e->nd++;
  }
  rc = ERR_CUDA;
  e->rbits = bits_for(max_rows - 1);
  if (e->rbits == 0) e->rbits = 1;
  e->end_bit = e->rbits + (e->nd > 1 ? bits_for(e->nd - 1) : 0);
  if (e->nd) {
    uint32_t *hot_dev = (uint32_t *)malloc(e->nd * sizeof(uint32_t));
    if (!hot_dev) {
      rc = -ENOMEM;
      goto out;
    }
    for (uint32_t j = 0; j < e->nd; j++) hot_dev[j] = hotness[e->tab[j]];
    int good = ok(e, cudaMemcpy(e->d_tab, e->tab, e->nd * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)") &&
               ok(e, cudaMemcpy(e->d_hot, hot_dev, e->nd * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)") &&
               ok(e, cudaMemcpy(e->d_hpre, e->hpre, (e->nd + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice),
                  "cudaMemcpy (embdev)") &&
               ok(e, cudaMemcpy(e->d_base, e->base, e->nd * sizeof(float *), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)");
    free(hot_dev);
    if (!good) goto out;
  }
  /* the host tables: embag's CPU code (on model_dev_pool's threads) */
  for (uint32_t t = 0; t < T; t++) {
    e->on_host[t] = !e->on_dev[t];
    if (!e->on_host[t]) continue;
    e->nh++;
    e->hbase[t] = (float *)malloc((e->rows[t] ? e->rows[t] : 1) * rf * sizeof(float));
    if (!e->hbase[t]) {
      rc = fail(-ENOMEM, err, err_len, "out of host memory for table %u (%llu rows)", t, (unsigned long long)e->rows[t]);
      goto out;
    }
    (void)init_rows(e, l, t, e->hbase[t], 0, NULL);
  }
  if (e->nh && (rc = embag_create(T, hotness, dim, max_batch, &e->eb)) != 0) goto out;
  rc = 0;
out:
  free(buf);
  if (rc) {
    if (rc == ERR_CUDA && err && err_len && !err[0]) snprintf(err, err_len, "%s", e->msg);
    embdev_destroy(e);
    return rc;
  }
  *out = e;
  return 0;
}

uint32_t embdev_n_device(const embdev_t *e) { return e->nd; }
uint64_t embdev_device_bytes(const embdev_t *e) { return e->dev_bytes; }
int embdev_on_device(const embdev_t *e, uint32_t t) { return t < e->n_tables && e->on_dev[t]; }
const char *embdev_error(const embdev_t *e) { return e->msg; }
float *embdev_logits(embdev_t *e) { return e->logits; }

int embdev_read_rows(embdev_t *e, uint32_t t, uint64_t r0, uint64_t count, float *out) {
  if (t >= e->n_tables || r0 > e->rows[t] || count > e->rows[t] - r0) return -EINVAL;
  size_t bytes = count * e->rf * sizeof(float);
  if (!e->on_dev[t]) {
    memcpy(out, e->hbase[t] + r0 * e->rf, bytes);
    return 0;
  }
  if (!ok(e, cudaStreamSynchronize((cudaStream_t)nn_cuda_stream()), "cudaStreamSynchronize (embdev_read_rows)") ||
      !ok(e, cudaMemcpy(out, e->base[e->slot[t]] + r0 * e->rf, bytes, cudaMemcpyDeviceToHost),
          "cudaMemcpy (embdev_read_rows)"))
    return ERR_CUDA;
  return 0;
}

/* ------------------------------------------------------------------ step */

int embdev_fwd(embdev_t *e, struct model_dev_s *md, uint32_t n, const uint64_t *const *idx, int train) {
  e->fwd_train = 0;
  float *emb = model_dev_emb_dev(md);
  if (n > e->max_batch || !emb) return -EINVAL;
  e->fwd_n = n;
  if (!n) {
    e->fwd_train = train;
    return 0;
  }
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  size_t width = (size_t)e->n_tables * e->dim;
  if (e->nd) {
    /* the previous copy has read the staging buffer */
    if (!ok(e, cudaEventSynchronize(e->ids_copied), "cudaEventSynchronize (embdev ids)")) return ERR_CUDA;
    for (uint32_t j = 0; j < e->nd; j++)
      memcpy(e->h_ids + (size_t)n * e->hpre[j], idx[e->tab[j]], (size_t)n * e->hotness[e->tab[j]] * sizeof(uint64_t));
    size_t total = (size_t)n * e->hpre[e->nd];
    if (!ok(e, cudaMemcpyAsync(e->d_ids, e->h_ids, total * sizeof(uint64_t), cudaMemcpyHostToDevice, st),
            "cudaMemcpyAsync (embdev ids)") ||
        !ok(e, cudaEventRecord(e->ids_copied, st), "cudaEventRecord (embdev ids)"))
      return ERR_CUDA;
    size_t threads = (size_t)n * e->nd * e->dim;
    k_pool<<<blocks(threads), TPB, 0, st>>>(e->d_base, e->d_tab, e->d_hot, e->d_hpre, e->nd, n, e->dim, e->rf, width,
                                            e->d_ids, emb, train ? e->d_keys[0] : NULL, e->d_vals[0], e->rbits);
    if (!ok(e, cudaGetLastError(), "k_pool (embdev_fwd)")) return ERR_CUDA;
  }
  if (e->nh) {
    embag_fwd(e->eb, model_dev_pool(md), n, e->hbase, e->rf, idx, e->on_dev, embag_emb(e->eb));
    if (model_dev_emb_cols_in(md, n, embag_emb(e->eb), e->on_host)) {
      snprintf(e->msg, sizeof e->msg, "model_dev_emb_cols_in (embdev_fwd: the host tables' columns) failed");
      return ERR_CUDA;
    }
  }
  e->fwd_train = train;
  return 0;
}

/* The keys / samples of `total` ids (in kb / vb's current buffers) sorted
 * on their end_bit low bits, and k_update over them, enqueued on st;
 * failures in msg. */
typedef struct sort_update_s {
  uint64_t *keys[2];
  uint32_t *vals[2];
  void *temp;
  size_t temp_bytes;
  uint32_t total, rbits, end_bit, dim, rf;
  size_t width;
  float *const *base;
  const uint32_t *tab;
  const float *demb;
  opt_kind_t kind;
  opt_hparams_t hp;
  const uint64_t *lim;
  unsigned long long *count;
} sort_update_t;

static int sort_update(const sort_update_t *a, cudaStream_t st, char *msg, size_t msg_len) {
  cub::DoubleBuffer<uint64_t> kb(a->keys[0], a->keys[1]);
  cub::DoubleBuffer<uint32_t> vb(a->vals[0], a->vals[1]);
  size_t need = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, need, kb, vb, a->total, 0, (int)a->end_bit, st);
  if (e != cudaSuccess) {
    if (!msg[0]) (void)cuda_check_error((int)e, "cub::DeviceRadixSort::SortPairs (embdev sizing)", msg, msg_len);
    return ERR_CUDA;
  }
  if (need > a->temp_bytes) {
    if (!msg[0]) snprintf(msg, msg_len, "embdev: the sort wants %zu bytes of storage, %zu were sized", need, a->temp_bytes);
    return ERR_CUDA;
  }
  e = cub::DeviceRadixSort::SortPairs(a->temp, need, kb, vb, a->total, 0, (int)a->end_bit, st);
  if (e != cudaSuccess) {
    if (!msg[0]) (void)cuda_check_error((int)e, "cub::DeviceRadixSort::SortPairs (embdev)", msg, msg_len);
    return ERR_CUDA;
  }
  const uint64_t *keys = kb.Current();
  const uint32_t *vals = vb.Current();
  float lr = a->hp.lr, eps = a->hp.eps;
  unsigned nb = blocks(a->total);
  switch (a->kind) {
    case OPT_SGD:
      k_update<OPT_SGD><<<nb, TPB, 0, st>>>(keys, vals, a->total, a->rbits, a->base, a->tab, a->dim, a->rf, a->width,
                                            a->demb, lr, eps, a->lim, a->count);
      break;
    case OPT_ADAGRAD:
      k_update<OPT_ADAGRAD><<<nb, TPB, 0, st>>>(keys, vals, a->total, a->rbits, a->base, a->tab, a->dim, a->rf,
                                                a->width, a->demb, lr, eps, a->lim, a->count);
      break;
    default:
      k_update<OPT_ROWWISE_ADAGRAD><<<nb, TPB, 0, st>>>(keys, vals, a->total, a->rbits, a->base, a->tab, a->dim, a->rf,
                                                        a->width, a->demb, lr, eps, a->lim, a->count);
      break;
  }
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    if (!msg[0]) (void)cuda_check_error((int)e, "k_update (embdev)", msg, msg_len);
    return ERR_CUDA;
  }
  return 0;
}

/* The sort and the fold-and-update of the device tables, enqueued. */
static int dev_update(embdev_t *e, const float *demb, uint32_t n, cudaStream_t st) {
  sort_update_t a;
  memset(&a, 0, sizeof a);
  a.keys[0] = e->d_keys[0], a.keys[1] = e->d_keys[1];
  a.vals[0] = e->d_vals[0], a.vals[1] = e->d_vals[1];
  a.temp = e->d_temp, a.temp_bytes = e->temp_bytes;
  a.total = n * e->hpre[e->nd], a.rbits = e->rbits, a.end_bit = e->end_bit, a.dim = e->dim, a.rf = e->rf;
  a.width = (size_t)e->n_tables * e->dim;
  a.base = e->d_base, a.tab = e->d_tab, a.demb = demb, a.kind = e->kind, a.hp = e->hp;
  return sort_update(&a, st, e->msg, sizeof e->msg);
}

int embdev_bwd_update(embdev_t *e, struct model_dev_s *md, uint32_t n, const uint64_t *const *idx) {
  if (!e->fwd_train || n != e->fwd_n) return -EINVAL;
  e->fwd_train = 0;
  if (!n) return 0;
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  const float *demb = model_dev_demb_dev(md);
  if (!demb) return -EINVAL;
  /* the host tables' gradient columns first (a wait), so that the host's
   * fold below overlaps the device's */
  if (e->nh && model_dev_demb_cols_out(md, n, embag_d_emb(e->eb), e->on_host)) {
    snprintf(e->msg, sizeof e->msg, "model_dev_demb_cols_out (embdev_bwd_update: the host tables' columns) failed");
    return ERR_CUDA;
  }
  int rc = e->nd ? dev_update(e, demb, n, st) : 0;
  if (e->nh) embag_bwd_update(e->eb, model_dev_pool(md), n, embag_d_emb(e->eb), idx, e->on_dev, e->hbase, e->rf, e->kind, &e->hp);
  if (!ok(e, cudaStreamSynchronize(st), "cudaStreamSynchronize (embdev_bwd_update)")) return ERR_CUDA;
  return rc;
}

double embdev_train_step(embdev_t *e, struct model_dev_s *md, opt_t *dense_opt, uint32_t n, const float *dense,
                         const float *labels, const uint64_t *const *idx, float scale, double sec[EMBAG_PHASES]) {
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  double t0 = clock_mono_s();
  if (embdev_fwd(e, md, n, idx, 1)) return NAN;
  if (sec && !ok(e, cudaStreamSynchronize(st), "cudaStreamSynchronize (embdev_train_step: pooling)")) return NAN;
  double t1 = clock_mono_s();
  /* no logits: the step does not read them, and asking would wait for the forward */
  if (model_dev_forward(md, n, dense, model_dev_emb_dev(md), NULL)) return NAN;
  double t2 = clock_mono_s();
  double loss = model_dev_backward(md, n, labels, scale, NULL);
  if (isnan(loss)) return NAN;
  double t3 = clock_mono_s();
  if (model_dev_opt_step(md, dense_opt)) return NAN;
  if (sec && !ok(e, cudaStreamSynchronize(st), "cudaStreamSynchronize (embdev_train_step: dense update)")) return NAN;
  double t4 = clock_mono_s();
  if (embdev_bwd_update(e, md, n, idx)) return NAN;
  double t5 = clock_mono_s();
  const double t[EMBAG_PHASES + 1] = {t0, t1, t2, t3, t4, t5};
  embag_phases_add(sec, t);
  return loss;
}

/* ------------------------------------------------------------------ a set of tables (embdev_set_*) */

/* One thread per (row i, float f): rows[i] into table tab[i] at row at[i]. */
static __global__ void k_scatter(float *const *__restrict__ base, const uint32_t *__restrict__ tab,
                                 const uint64_t *__restrict__ at, const float *__restrict__ rows, size_t count,
                                 uint32_t rf) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count * rf) return;
  size_t i = t / rf;
  base[tab[i]][at[i] * rf + t % rf] = rows[t];
}

struct embdev_set_s {
  uint32_t n, dim, rf, width;
  opt_kind_t kind;
  opt_hparams_t hp;
  uint64_t *rows;             /* n */
  uint32_t *hot, *hpre;       /* n; n + 1 */
  float **base;               /* n device row stores */
  uint64_t bytes;
  uint32_t rbits, end_bit;
  uint32_t *d_col, *d_hot, *d_hpre;
  uint64_t *d_lim;            /* NULL: every row is updated */
  float **d_base;
  /* the step's buffers, for up to cap samples (grown) */
  uint32_t cap;
  uint64_t *h_ids, *d_ids, *d_keys[2];
  uint32_t *d_vals[2];
  void *d_temp;
  size_t temp_bytes;
  float *d_out;               /* the layout's buffer when the caller has none (cap * width) */
  unsigned long long *d_count, *h_count;
  cudaEvent_t ids_copied;
  uint32_t fwd_n;
  int fwd_train, pending;
  /* the writer's (embdev_set_write_rows): its own stream and buffers */
  cudaStream_t wst;
  uint32_t *d_wtab;
  uint64_t *d_wat;
  float *d_wrows;
  size_t wcap;
  char msg[512];
};

static int sok(embdev_set_t *s, cudaError_t st, const char *what) {
  if (st == cudaSuccess) return 1;
  if (!s->msg[0]) (void)cuda_check_error((int)st, what, s->msg, sizeof s->msg);
  return 0;
}

static void set_free_step(embdev_set_t *s) {
  cudaFree(s->d_ids);
  cudaFree(s->d_keys[0]);
  cudaFree(s->d_keys[1]);
  cudaFree(s->d_vals[0]);
  cudaFree(s->d_vals[1]);
  cudaFree(s->d_temp);
  cudaFree(s->d_out);
  if (s->h_ids) cudaFreeHost(s->h_ids);
  s->d_ids = NULL, s->d_keys[0] = s->d_keys[1] = NULL, s->d_vals[0] = s->d_vals[1] = NULL;
  s->d_temp = NULL, s->d_out = NULL, s->h_ids = NULL;
  s->temp_bytes = 0;
  s->cap = 0;
}

void embdev_set_destroy(embdev_set_t *s) {
  if (!s) return;
  if (s->wst) (void)cudaStreamSynchronize(s->wst);
  (void)cudaStreamSynchronize((cudaStream_t)nn_cuda_stream());
  for (uint32_t k = 0; s->base && k < s->n; k++) cudaFree(s->base[k]);
  set_free_step(s);
  cudaFree(s->d_col);
  cudaFree(s->d_hot);
  cudaFree(s->d_hpre);
  cudaFree(s->d_lim);
  cudaFree(s->d_base);
  cudaFree(s->d_count);
  if (s->h_count) cudaFreeHost(s->h_count);
  if (s->ids_copied) cudaEventDestroy(s->ids_copied);
  cudaFree(s->d_wtab);
  cudaFree(s->d_wat);
  cudaFree(s->d_wrows);
  if (s->wst) cudaStreamDestroy(s->wst);
  free(s->rows);
  free(s->hot);
  free(s->hpre);
  free(s->base);
  free(s);
}

int embdev_set_create(uint32_t n, const uint64_t *rows, const uint64_t *lim, const uint32_t *hotness,
                      const uint32_t *col, uint32_t width, uint32_t dim, opt_kind_t kind, const opt_hparams_t *hp,
                      embdev_set_t **out, char *err, size_t err_len) {
  *out = NULL;
  if (err && err_len) err[0] = 0;
  if (!n || !dim) return fail(-EINVAL, err, err_len, "embdev_set: no tables or dim 0");
  if (kind != OPT_SGD && kind != OPT_ADAGRAD && kind != OPT_ROWWISE_ADAGRAD)
    return fail(-EINVAL, err, err_len, "embedding_optimizer = %s cannot update embedding rows", opt_kind_name(kind));
  uint64_t max_rows = 1;
  for (uint32_t k = 0; k < n; k++) {
    if ((uint64_t)(col[k] + 1) * dim > width)
      return fail(-EINVAL, err, err_len, "embdev_set: table %u's column %u is outside a layout of %u floats", k, col[k],
                  width);
    if (rows[k] > max_rows) max_rows = rows[k];
  }
  int rc = cuda_check(err, err_len);
  if (rc) return rc;
  embdev_set_t *s = (embdev_set_t *)calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->n = n, s->dim = dim, s->rf = dim + opt_row_state_floats(kind, dim), s->width = width;
  s->kind = kind, s->hp = *hp;
  s->rows = (uint64_t *)malloc(n * sizeof *s->rows);
  s->hot = (uint32_t *)malloc(n * sizeof *s->hot);
  s->hpre = (uint32_t *)malloc((n + 1) * sizeof *s->hpre);
  s->base = (float **)calloc(n, sizeof *s->base);
  rc = -ENOMEM;
  if (!s->rows || !s->hot || !s->hpre || !s->base) goto out;
  s->hpre[0] = 0;
  for (uint32_t k = 0; k < n; k++) {
    s->rows[k] = rows[k];
    s->hot[k] = hotness[k];
    s->hpre[k + 1] = s->hpre[k] + hotness[k];
  }
  rc = ERR_CUDA;
  s->rbits = bits_for(max_rows - 1);
  if (s->rbits == 0) s->rbits = 1;
  s->end_bit = s->rbits + (n > 1 ? bits_for(n - 1) : 0);
  if (s->end_bit > 64) {
    rc = fail(-EINVAL, err, err_len, "embdev_set: %u tables of up to %llu rows do not fit a 64-bit sort key", n,
              (unsigned long long)max_rows);
    goto out;
  }
  if (!sok(s, cudaStreamCreateWithFlags(&s->wst, cudaStreamNonBlocking), "cudaStreamCreate (embdev_set)") ||
      !sok(s, cudaEventCreateWithFlags(&s->ids_copied, cudaEventDisableTiming), "cudaEventCreate (embdev_set)") ||
      !sok(s, cudaMalloc((void **)&s->d_col, n * sizeof(uint32_t)), "cudaMalloc (embdev_set)") ||
      !sok(s, cudaMalloc((void **)&s->d_hot, n * sizeof(uint32_t)), "cudaMalloc (embdev_set)") ||
      !sok(s, cudaMalloc((void **)&s->d_hpre, (n + 1) * sizeof(uint32_t)), "cudaMalloc (embdev_set)") ||
      !sok(s, cudaMalloc((void **)&s->d_base, n * sizeof(float *)), "cudaMalloc (embdev_set)") ||
      !sok(s, cudaMalloc((void **)&s->d_count, sizeof(unsigned long long)), "cudaMalloc (embdev_set)") ||
      !sok(s, cudaMallocHost((void **)&s->h_count, sizeof(unsigned long long)), "cudaMallocHost (embdev_set)") ||
      (lim && !sok(s, cudaMalloc((void **)&s->d_lim, n * sizeof(uint64_t)), "cudaMalloc (embdev_set)")))
    goto out;
  for (uint32_t k = 0; k < n; k++) {
    uint64_t b = rows[k] * s->rf * sizeof(float);
    if (cudaMalloc((void **)&s->base[k], b ? b : 4) != cudaSuccess) {
      (void)cudaGetLastError();
      s->base[k] = NULL;
      uint64_t all = 0;
      for (uint32_t q = 0; q < n; q++) all += rows[q] * s->rf * sizeof(float);
      rc = fail(ERR_CUDA, err, err_len, "out of device memory for table %u of %u (%.1f MiB; %.1f MiB in all)", k, n,
                (double)b / (1 << 20), (double)all / (1 << 20));
      goto out;
    }
    s->bytes += b;
    if (!sok(s, cudaMemset(s->base[k], 0, b ? b : 4), "cudaMemset (embdev_set rows)")) goto out;
  }
  if (!sok(s, cudaMemcpy(s->d_col, col, n * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev_set)") ||
      !sok(s, cudaMemcpy(s->d_hot, s->hot, n * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev_set)") ||
      !sok(s, cudaMemcpy(s->d_hpre, s->hpre, (n + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice),
           "cudaMemcpy (embdev_set)") ||
      !sok(s, cudaMemcpy(s->d_base, s->base, n * sizeof(float *), cudaMemcpyHostToDevice), "cudaMemcpy (embdev_set)") ||
      (lim && !sok(s, cudaMemcpy(s->d_lim, lim, n * sizeof(uint64_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev_set)")))
    goto out;
  rc = 0;
out:
  if (rc) {
    if (rc == ERR_CUDA && err && err_len && !err[0]) snprintf(err, err_len, "%s", s->msg);
    embdev_set_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

uint64_t embdev_set_bytes(const embdev_set_t *s) { return s->bytes; }
const char *embdev_set_error(const embdev_set_t *s) { return s->msg; }

/* The step's buffers for n samples (grown when n is over cap; waits for
 * the step's work first).  0, -ENOMEM (host) or ERR_CUDA. */
static int set_reserve(embdev_set_t *s, uint32_t n) {
  if (n <= s->cap) return 0;
  if (!sok(s, cudaStreamSynchronize((cudaStream_t)nn_cuda_stream()), "cudaStreamSynchronize (embdev_set grow)"))
    return ERR_CUDA;
  set_free_step(s);
  size_t ids = (size_t)n * s->hpre[s->n];
  if (ids > INT32_MAX) {
    snprintf(s->msg, sizeof s->msg, "embdev_set: %zu ids in one batch, over 2^31", ids);
    return -EINVAL;
  }
  cub::DoubleBuffer<uint64_t> kb(NULL, NULL);
  cub::DoubleBuffer<uint32_t> vb(NULL, NULL);
  if (!sok(s, cudaMallocHost((void **)&s->h_ids, (ids ? ids : 1) * sizeof(uint64_t)), "cudaMallocHost (embdev_set ids)") ||
      !sok(s, cudaMalloc((void **)&s->d_ids, (ids ? ids : 1) * sizeof(uint64_t)), "cudaMalloc (embdev_set ids)") ||
      !sok(s, cudaMalloc((void **)&s->d_keys[0], (ids ? ids : 1) * sizeof(uint64_t)), "cudaMalloc (embdev_set keys)") ||
      !sok(s, cudaMalloc((void **)&s->d_keys[1], (ids ? ids : 1) * sizeof(uint64_t)), "cudaMalloc (embdev_set keys)") ||
      !sok(s, cudaMalloc((void **)&s->d_vals[0], (ids ? ids : 1) * sizeof(uint32_t)), "cudaMalloc (embdev_set samples)") ||
      !sok(s, cudaMalloc((void **)&s->d_vals[1], (ids ? ids : 1) * sizeof(uint32_t)), "cudaMalloc (embdev_set samples)") ||
      !sok(s, cudaMalloc((void **)&s->d_out, (size_t)n * s->width * sizeof(float)), "cudaMalloc (embdev_set columns)") ||
      !sok(s, cub::DeviceRadixSort::SortPairs(NULL, s->temp_bytes, kb, vb, (uint32_t)ids, 0, 64),
           "cub::DeviceRadixSort::SortPairs (embdev_set sizing)") ||
      !sok(s, cudaMalloc(&s->d_temp, s->temp_bytes ? s->temp_bytes : 1), "cudaMalloc (embdev_set sort)")) {
    set_free_step(s);
    return ERR_CUDA;
  }
  s->cap = n;
  return 0;
}

int embdev_set_write_rows(embdev_set_t *s, size_t count, const uint32_t *tab, const uint64_t *at, const float *rows) {
  if (!count) return 0;
  for (size_t i = 0; i < count; i++)
    if (tab[i] >= s->n || at[i] >= s->rows[tab[i]]) return -EINVAL;
  if (count > s->wcap) {
    cudaFree(s->d_wtab);
    cudaFree(s->d_wat);
    cudaFree(s->d_wrows);
    s->d_wtab = NULL, s->d_wat = NULL, s->d_wrows = NULL, s->wcap = 0;
    if (!sok(s, cudaMalloc((void **)&s->d_wtab, count * sizeof(uint32_t)), "cudaMalloc (embdev_set_write_rows)") ||
        !sok(s, cudaMalloc((void **)&s->d_wat, count * sizeof(uint64_t)), "cudaMalloc (embdev_set_write_rows)") ||
        !sok(s, cudaMalloc((void **)&s->d_wrows, count * s->rf * sizeof(float)), "cudaMalloc (embdev_set_write_rows)"))
      return ERR_CUDA;
    s->wcap = count;
  }
  if (!sok(s, cudaMemcpyAsync(s->d_wtab, tab, count * sizeof(uint32_t), cudaMemcpyHostToDevice, s->wst),
           "cudaMemcpyAsync (embdev_set_write_rows)") ||
      !sok(s, cudaMemcpyAsync(s->d_wat, at, count * sizeof(uint64_t), cudaMemcpyHostToDevice, s->wst),
           "cudaMemcpyAsync (embdev_set_write_rows)") ||
      !sok(s, cudaMemcpyAsync(s->d_wrows, rows, count * s->rf * sizeof(float), cudaMemcpyHostToDevice, s->wst),
           "cudaMemcpyAsync (embdev_set_write_rows)"))
    return ERR_CUDA;
  k_scatter<<<blocks(count * s->rf), TPB, 0, s->wst>>>(s->d_base, s->d_wtab, s->d_wat, s->d_wrows, count, s->rf);
  if (!sok(s, cudaGetLastError(), "k_scatter (embdev_set_write_rows)") ||
      !sok(s, cudaStreamSynchronize(s->wst), "cudaStreamSynchronize (embdev_set_write_rows)"))
    return ERR_CUDA;
  return 0;
}

int embdev_set_read_rows(embdev_set_t *s, uint32_t k, uint64_t r0, uint64_t count, float *out) {
  if (k >= s->n || r0 > s->rows[k] || count > s->rows[k] - r0) return -EINVAL;
  if (!count) return 0;
  if (!sok(s, cudaStreamSynchronize((cudaStream_t)nn_cuda_stream()), "cudaStreamSynchronize (embdev_set_read_rows)") ||
      !sok(s, cudaMemcpy(out, s->base[k] + r0 * s->rf, count * s->rf * sizeof(float), cudaMemcpyDeviceToHost),
           "cudaMemcpy (embdev_set_read_rows)"))
    return ERR_CUDA;
  return 0;
}

int embdev_set_pool(embdev_set_t *s, uint32_t n, const uint64_t *const *idx, float *out, float *host_out, int train) {
  s->fwd_train = 0;
  if (!out && !host_out) return -EINVAL;
  if (!n) {
    s->fwd_n = 0;
    s->fwd_train = train;
    return 0;
  }
  int rc = set_reserve(s, n);
  if (rc) return rc;
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  if (!sok(s, cudaEventSynchronize(s->ids_copied), "cudaEventSynchronize (embdev_set ids)")) return ERR_CUDA;
  for (uint32_t k = 0; k < s->n; k++)
    memcpy(s->h_ids + (size_t)n * s->hpre[k], idx[k], (size_t)n * s->hot[k] * sizeof(uint64_t));
  size_t total = (size_t)n * s->hpre[s->n];
  if (total && (!sok(s, cudaMemcpyAsync(s->d_ids, s->h_ids, total * sizeof(uint64_t), cudaMemcpyHostToDevice, st),
                     "cudaMemcpyAsync (embdev_set ids)") ||
                !sok(s, cudaEventRecord(s->ids_copied, st), "cudaEventRecord (embdev_set ids)")))
    return ERR_CUDA;
  float *dst = out ? out : s->d_out;
  size_t threads = (size_t)n * s->n * s->dim;
  /* k_pool with the set's tables as "device tables" and col as their table index */
  k_pool<<<blocks(threads), TPB, 0, st>>>(s->d_base, s->d_col, s->d_hot, s->d_hpre, s->n, n, s->dim, s->rf, s->width,
                                          s->d_ids, dst, train ? s->d_keys[0] : NULL, s->d_vals[0], s->rbits);
  if (!sok(s, cudaGetLastError(), "k_pool (embdev_set_pool)")) return ERR_CUDA;
  if (!out && (!sok(s, cudaMemcpyAsync(host_out, s->d_out, (size_t)n * s->width * sizeof(float), cudaMemcpyDeviceToHost,
                                       st),
                    "cudaMemcpyAsync (embdev_set_pool: columns to the host)") ||
               !sok(s, cudaStreamSynchronize(st), "cudaStreamSynchronize (embdev_set_pool)")))
    return ERR_CUDA;
  s->fwd_n = n;
  s->fwd_train = train;
  return 0;
}

int embdev_set_fold(embdev_set_t *s, uint32_t n, const float *grad, const float *host_grad) {
  if (!s->fwd_train || n != s->fwd_n || (!grad && !host_grad)) return -EINVAL;
  s->fwd_train = 0;
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  if (!sok(s, cudaMemsetAsync(s->d_count, 0, sizeof(unsigned long long), st), "cudaMemsetAsync (embdev_set count)"))
    return ERR_CUDA;
  s->pending = 1;
  if (!n) return 0;
  if (!grad) {
    if (!sok(s, cudaMemcpyAsync(s->d_out, host_grad, (size_t)n * s->width * sizeof(float), cudaMemcpyHostToDevice, st),
             "cudaMemcpyAsync (embdev_set_fold: gradient to the device)"))
      return ERR_CUDA;
    grad = s->d_out;
  }
  sort_update_t a;
  memset(&a, 0, sizeof a);
  a.keys[0] = s->d_keys[0], a.keys[1] = s->d_keys[1];
  a.vals[0] = s->d_vals[0], a.vals[1] = s->d_vals[1];
  a.temp = s->d_temp, a.temp_bytes = s->temp_bytes;
  a.total = (uint32_t)((size_t)n * s->hpre[s->n]), a.rbits = s->rbits, a.end_bit = s->end_bit;
  a.dim = s->dim, a.rf = s->rf, a.width = s->width;
  /* k_update reads the gradient columns at tab[j] * dim: the set's col */
  a.base = s->d_base, a.tab = s->d_col, a.demb = grad, a.kind = s->kind, a.hp = s->hp;
  a.lim = s->d_lim, a.count = s->d_count;
  return a.total ? sort_update(&a, st, s->msg, sizeof s->msg) : 0;
}

int embdev_set_sync(embdev_set_t *s, size_t *updated) {
  *updated = 0;
  if (!s->pending) return 0;
  s->pending = 0;
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  if (!sok(s, cudaMemcpyAsync(s->h_count, s->d_count, sizeof(unsigned long long), cudaMemcpyDeviceToHost, st),
           "cudaMemcpyAsync (embdev_set count)") ||
      !sok(s, cudaStreamSynchronize(st), "cudaStreamSynchronize (embdev_set_sync)"))
    return ERR_CUDA;
  *updated = (size_t)*s->h_count;
  return 0;
}

/* ------------------------------------------------------------------ the benchmark's baseline */

static __global__ void k_fill(float *a, size_t len, float scale) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < len) a[i] = scale * (float)((i * 7) % 13);
}

double embdev_sgemm_gflops(uint32_t n, char *err, size_t err_len) {
  size_t len = (size_t)n * n;
  float *a = NULL, *b = NULL, *c = NULL;
  cublasHandle_t h = NULL;
  cudaEvent_t ev[2] = {NULL, NULL};
  double best = 0;
  int rc = 0;
  const float one = 1.0f, zero = 0.0f;
  if ((rc = cuda_check_error((int)cudaMalloc((void **)&a, len * 4), "cudaMalloc (sgemm)", err, err_len)) ||
      (rc = cuda_check_error((int)cudaMalloc((void **)&b, len * 4), "cudaMalloc (sgemm)", err, err_len)) ||
      (rc = cuda_check_error((int)cudaMalloc((void **)&c, len * 4), "cudaMalloc (sgemm)", err, err_len)) ||
      (rc = cuda_check_error((int)cudaEventCreate(&ev[0]), "cudaEventCreate (sgemm)", err, err_len)) ||
      (rc = cuda_check_error((int)cudaEventCreate(&ev[1]), "cudaEventCreate (sgemm)", err, err_len)) ||
      (rc = cuda_check_cublas_error((int)cublasCreate(&h), "cublasCreate (sgemm)", err, err_len)) ||
      (rc = cuda_check_cublas_error((int)cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", err, err_len)))
    goto out;
  k_fill<<<blocks(len), TPB>>>(a, len, 0.01f);
  k_fill<<<blocks(len), TPB>>>(b, len, 0.02f);
  for (int round = 0; round < 4; round++) { /* round 0 warms up */
    const int reps = 3;
    cudaEventRecord(ev[0]);
    for (int r = 0; r < reps; r++)
      if ((rc = cuda_check_cublas_error((int)cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, a,
                                                         (int)n, b, (int)n, &zero, c, (int)n),
                                        "cublasSgemm", err, err_len)))
        goto out;
    cudaEventRecord(ev[1]);
    if ((rc = cuda_check_error((int)cudaEventSynchronize(ev[1]), "cudaEventSynchronize (sgemm)", err, err_len)))
      goto out;
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[0], ev[1]);
    double g = ms > 0 ? 2.0 * n * (double)n * n * reps / (ms * 1e-3) / 1e9 : 0;
    if (round && g > best) best = g;
  }
out:
  if (h) cublasDestroy(h);
  if (ev[0]) cudaEventDestroy(ev[0]);
  if (ev[1]) cudaEventDestroy(ev[1]);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return rc ? 0 : best;
}
