/*
 * embdev.cu: the embedding tables of train --local in GPU memory and
 * their step (contract in embdev.h): the kernels and the steps that launch
 * them.  Creating, sizing and freeing the storage is embdev_alloc.cu; the
 * structures both use are in embdev_internal.h.
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
 *             the CPU's sample order.  k_update has `lanes` threads per
 *             sorted position (update_lanes: sgd and adagrad, the width
 *             rounded up to a power of two, at most a warp; rowwise, one);
 *             the lanes at the first position of a run of equal keys own
 *             that row (rows are distinct across runs: no two runs write
 *             one row, no atomics), lane l its columns l, l + lanes, ...,
 *             and each adds the gradient rows of the run's samples in that
 *             order starting from 0.0f, as add_row does after the memset,
 *             CHUNK of its columns at a time in registers (each column's
 *             sum is the same sequence of adds, whichever lane does it).
 *             A row that thousands of a batch's ids share (a table of 3
 *             rows) is added up by its lanes side by side, one column
 *             each, rather than by one thread column after column.
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
 * and the lanes that do not start a run return at once, so the number
 * of distinct rows never travels to the host.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/cub.cuh>

#include <errno.h>
#include <math.h>
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
#include "embdev_internal.h"

#define TPB 256
#define CHUNK 16                   /* gradient columns a k_update thread keeps in registers */

static unsigned blocks(size_t total) { return (unsigned)((total + TPB - 1) / TPB); }

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

/* acc[c] = sum over the run's positions q in order of
 * g[vals[q] * width + c * stride], from 0.0f, for c < left (add_row's adds,
 * column by column). */
static __device__ __forceinline__ void run_sum(float acc[CHUNK], const float *__restrict__ g,
                                               const uint32_t *__restrict__ vals, uint32_t p, uint32_t end,
                                               size_t width, uint32_t stride, uint32_t left) {
#pragma unroll
  for (uint32_t c = 0; c < CHUNK; c++) acc[c] = 0.0f;
  for (uint32_t q = p; q < end; q++) {
    const float *s = g + (size_t)vals[q] * width;
#pragma unroll
    for (uint32_t c = 0; c < CHUNK; c++)
      if (c < left) acc[c] += s[(size_t)c * stride];
  }
}

/* Lanes per sorted position of k_update: sgd and adagrad update each
 * column by itself, so the row's columns are dealt to up to a warp of
 * lanes (the width rounded up to a power of two); rowwise sums the
 * squares over the columns in order, so one lane does the row. */
static uint32_t update_lanes(opt_kind_t kind, uint32_t dim) {
  uint32_t l = 1;
  if (kind != OPT_SGD && kind != OPT_ADAGRAD) return 1;
  while (l < dim && l < 32) l <<= 1;
  return l;
}

/* `lanes` threads per sorted position; those of the first of each run fold
 * and update its row, lane l the columns l, l + lanes, ... (see the top). */
template <int KIND>
static __global__ void k_update(const uint64_t *__restrict__ keys, const uint32_t *__restrict__ vals, uint32_t total,
                                uint32_t lanes, uint32_t rbits, float *const *__restrict__ base,
                                const uint32_t *__restrict__ tab, uint32_t dim, uint32_t rf, size_t width,
                                const float *__restrict__ demb, float lr, float eps, const uint64_t *__restrict__ lim,
                                unsigned long long *count) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (size_t)total * lanes) return;
  uint32_t p = (uint32_t)(t / lanes), lane = (uint32_t)(t % lanes);
  uint64_t key = keys[p];
  if (p > 0 && keys[p - 1] == key) return;
  uint32_t j = (uint32_t)(key >> rbits);
  uint64_t row = key & ((UINT64_C(1) << rbits) - 1);
  if (lim && row >= lim[j]) return; /* a placeholder row: never updated (embdev_set) */
  if (count && lane == 0) atomicAdd(count, 1ULL);
  uint32_t end = p + 1;
  while (end < total && keys[end] == key) end++;
  float *w = base[j] + row * rf;
  const float *g = demb + (size_t)tab[j] * dim;
  float acc[CHUNK], ss = 0.0f;
  if (KIND != OPT_ROWWISE_ADAGRAD) {
    /* this lane's columns d = d0 + c * lanes, CHUNK of them a pass */
    for (uint32_t d0 = lane; d0 < dim; d0 += CHUNK * lanes) {
      run_sum(acc, g + d0, vals, p, end, width, lanes, (dim - d0 + lanes - 1) / lanes);
#pragma unroll
      for (uint32_t c = 0; c < CHUNK; c++) {
        uint32_t d = d0 + c * lanes;
        if (d >= dim) continue;
        float x = acc[c];
        if (KIND == OPT_SGD) {
          w[d] -= lr * x;
        } else {
          w[dim + d] += x * x;
          w[d] -= lr * x / (sqrtf(w[dim + d]) + eps);
        }
      }
    }
  } else {
    for (uint32_t d0 = 0; d0 < dim; d0 += CHUNK) {
      run_sum(acc, g + d0, vals, p, end, width, 1, dim - d0);
#pragma unroll
      for (uint32_t c = 0; c < CHUNK; c++)
        if (d0 + c < dim) ss += acc[c] * acc[c];
    }
    float h = w[dim] + ss / (float)dim;
    w[dim] = h;
    float step = lr / (sqrtf(h) + eps);
    for (uint32_t d0 = 0; d0 < dim; d0 += CHUNK) {
      if (dim > CHUNK) run_sum(acc, g + d0, vals, p, end, width, 1, dim - d0); /* else acc holds it */
#pragma unroll
      for (uint32_t c = 0; c < CHUNK; c++)
        if (d0 + c < dim) w[d0 + c] -= step * acc[c];
    }
  }
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
  uint32_t lanes = update_lanes(a->kind, a->dim);
  unsigned nb = blocks((size_t)a->total * lanes);
  switch (a->kind) {
    case OPT_SGD:
      k_update<OPT_SGD><<<nb, TPB, 0, st>>>(keys, vals, a->total, lanes, a->rbits, a->base, a->tab, a->dim, a->rf,
                                            a->width, a->demb, lr, eps, a->lim, a->count);
      break;
    case OPT_ADAGRAD:
      k_update<OPT_ADAGRAD><<<nb, TPB, 0, st>>>(keys, vals, a->total, lanes, a->rbits, a->base, a->tab, a->dim, a->rf,
                                                a->width, a->demb, lr, eps, a->lim, a->count);
      break;
    default:
      k_update<OPT_ROWWISE_ADAGRAD><<<nb, TPB, 0, st>>>(keys, vals, a->total, lanes, a->rbits, a->base, a->tab, a->dim,
                                                        a->rf, a->width, a->demb, lr, eps, a->lim, a->count);
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

int embdev_set_pool(embdev_set_t *s, uint32_t n, const uint64_t *const *idx, float *out, float *host_out, int train) {
  s->fwd_train = 0;
  if (!out && !host_out) return -EINVAL;
  if (!n) {
    s->fwd_n = 0;
    s->fwd_train = train;
    return 0;
  }
  int rc = embdev__set_reserve(s, n);
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
