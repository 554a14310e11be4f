/*
 * embdev_alloc.cu: the storage side of embdev.cu (contract in embdev.h):
 * creating the embedding tables of train --local on the device and the
 * host (embdev_create: the step's buffers, the placement under the memory
 * budget, the first rows), the same for a set of tables (embdev_set_*),
 * freeing both, and reading rows back.  Host code calling the CUDA
 * runtime; the kernels and the steps that launch them are in embdev.cu,
 * the structures both files use in embdev_internal.h.
 */
#include <cuda_runtime.h>

#include <cub/cub.cuh>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "nn_cuda.h"

extern "C" { /* C headers without their own extern "C" */
#include "embag.h"
#include "err.h"
#include "opt.h"
#include "table.h"
}

#include "embdev.h"
#include "embdev_internal.h"

#define INIT_ROWS (UINT64_C(1) << 16) /* rows initialized on the host per copy */

static uint32_t bits_for(uint64_t max_value) {
  uint32_t b = 0;
  while (b < 64 && (max_value >> b) != 0) b++;
  return b;
}

/* ------------------------------------------------------------------ embdev_t */

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

/* The step's buffers first (sized for every table), so that an automatic
 * budget sees what is left after them.  0 or ERR_CUDA. */
static int alloc_step(embdev_t *e, size_t max_ids) {
  uint32_t T = e->n_tables;
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
    return ERR_CUDA;
  /* CUB's storage for the widest sort of the largest batch */
  cub::DoubleBuffer<uint64_t> kb(e->d_keys[0], e->d_keys[1]);
  cub::DoubleBuffer<uint32_t> vb(e->d_vals[0], e->d_vals[1]);
  if (!ok(e, cub::DeviceRadixSort::SortPairs(NULL, e->temp_bytes, kb, vb, (uint32_t)max_ids, 0, 64),
          "cub::DeviceRadixSort::SortPairs (embdev sizing)") ||
      !ok(e, cudaMalloc(&e->d_temp, e->temp_bytes ? e->temp_bytes : 1), "cudaMalloc (embdev sort)"))
    return ERR_CUDA;
  return 0;
}

/* Which tables go to the device (e->on_dev) under the budget: budget, or
 * with EMBDEV_AUTO what the device has free now.  0 or ERR_CUDA. */
static int place_tables(embdev_t *e, const table_layout_t *l, int64_t budget) {
  uint64_t b;
  if (budget == EMBDEV_AUTO) {
    size_t fr = 0, tot = 0;
    if (!ok(e, cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo (embdev)")) return ERR_CUDA;
    b = embdev_budget(EMBDEV_AUTO, fr, tot);
  } else {
    b = budget > 0 ? (uint64_t)budget : 0;
  }
  embdev_plan(l, b, e->on_dev, NULL);
  return 0;
}

/* The device tables in index order, with their first rows (buf: INIT_ROWS
 * rows of staging); one whose allocation fails anyway (fragmentation,
 * another process) stays on the host.  Then the sort key's bits.  0 or
 * init_rows' error. */
static int make_device_tables(embdev_t *e, const table_layout_t *l, const uint32_t *hotness, float *buf) {
  uint64_t max_rows = 1;
  int rc;
  e->hpre[0] = 0;
  for (uint32_t t = 0; t < e->n_tables; t++) {
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
      return rc;
    }
    e->slot[t] = (int32_t)j;
    e->tab[j] = t;
    e->hpre[j + 1] = e->hpre[j] + hotness[t];
    e->dev_bytes += bytes;
    if (e->rows[t] > max_rows) max_rows = e->rows[t];
    e->nd++;
  }
  e->rbits = bits_for(max_rows - 1);
  if (e->rbits == 0) e->rbits = 1;
  e->end_bit = e->rbits + (e->nd > 1 ? bits_for(e->nd - 1) : 0);
  return 0;
}

/* The device tables' indices, hotness, prefix sums and row stores, copied
 * to the device for the kernels.  0, -ENOMEM or ERR_CUDA. */
static int upload_device_index(embdev_t *e, const uint32_t *hotness) {
  if (!e->nd) return 0;
  uint32_t *hot_dev = (uint32_t *)malloc(e->nd * sizeof(uint32_t));
  if (!hot_dev) return -ENOMEM;
  for (uint32_t j = 0; j < e->nd; j++) hot_dev[j] = hotness[e->tab[j]];
  int good = ok(e, cudaMemcpy(e->d_tab, e->tab, e->nd * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)") &&
             ok(e, cudaMemcpy(e->d_hot, hot_dev, e->nd * sizeof(uint32_t), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)") &&
             ok(e, cudaMemcpy(e->d_hpre, e->hpre, (e->nd + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice),
                "cudaMemcpy (embdev)") &&
             ok(e, cudaMemcpy(e->d_base, e->base, e->nd * sizeof(float *), cudaMemcpyHostToDevice), "cudaMemcpy (embdev)");
  free(hot_dev);
  return good ? 0 : ERR_CUDA;
}

/* The host tables (every table not on the device), with their first rows:
 * embag's CPU code runs them (on model_dev_pool's threads).  0 or -ENOMEM
 * with err set. */
static int make_host_tables(embdev_t *e, const table_layout_t *l, char *err, size_t err_len) {
  for (uint32_t t = 0; t < e->n_tables; t++) {
    e->on_host[t] = !e->on_dev[t];
    if (!e->on_host[t]) continue;
    e->nh++;
    e->hbase[t] = (float *)malloc((e->rows[t] ? e->rows[t] : 1) * e->rf * sizeof(float));
    if (!e->hbase[t])
      return fail(-ENOMEM, err, err_len, "out of host memory for table %u (%llu rows)", t, (unsigned long long)e->rows[t]);
    (void)init_rows(e, l, t, e->hbase[t], 0, NULL);
  }
  return 0;
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
  rc = -ENOMEM;
  if (!e->hotness || !e->rows || !e->on_dev || !e->on_host || !e->slot || !e->tab || !e->hpre || !e->base ||
      !e->hbase || !e->logits || !buf)
    goto out;
  for (uint32_t t = 0; t < T; t++) {
    e->hotness[t] = hotness[t];
    e->rows[t] = l->tables[t].rows;
  }
  if ((rc = alloc_step(e, max_ids)) != 0 || (rc = place_tables(e, l, budget)) != 0 ||
      (rc = make_device_tables(e, l, hotness, buf)) != 0 || (rc = upload_device_index(e, hotness)) != 0 ||
      (rc = make_host_tables(e, l, err, err_len)) != 0)
    goto out;
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

/* ------------------------------------------------------------------ a set of tables (embdev_set_*) */

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

/* See embdev_internal.h. */
int embdev__set_reserve(embdev_set_t *s, uint32_t n) {
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

int embdev_set_read_rows(embdev_set_t *s, uint32_t k, uint64_t r0, uint64_t count, float *out) {
  if (k >= s->n || r0 > s->rows[k] || count > s->rows[k] - r0) return -EINVAL;
  if (!count) return 0;
  if (!sok(s, cudaStreamSynchronize((cudaStream_t)nn_cuda_stream()), "cudaStreamSynchronize (embdev_set_read_rows)") ||
      !sok(s, cudaMemcpy(out, s->base[k] + r0 * s->rf, count * s->rf * sizeof(float), cudaMemcpyDeviceToHost),
           "cudaMemcpy (embdev_set_read_rows)"))
    return ERR_CUDA;
  return 0;
}
