/*
 * embdev_internal.h: what embdev.cu (the kernels and the steps that launch
 * them) and embdev_alloc.cu (creating, sizing and freeing the storage,
 * reading rows back) share: the two structures and the CUDA-status
 * helpers.  C++ (nvcc) only; nobody else includes it.
 */
#ifndef CHANTER_EMBDEV_INTERNAL_H
#define CHANTER_EMBDEV_INTERNAL_H

#include <cuda_runtime.h>

#include <stdint.h>

#include "cuda_check.h"

extern "C" { /* C headers without their own extern "C" */
#include "embag.h"
#include "opt.h"
}

#include "embdev.h"

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

/* 1 when st is success; else the first failure's sentence in e->msg. */
static inline int ok(embdev_t *e, cudaError_t st, const char *what) {
  if (st == cudaSuccess) return 1;
  if (!e->msg[0]) (void)cuda_check_error((int)st, what, e->msg, sizeof e->msg);
  return 0;
}

/* The same for a set: 1 when st is success, else the sentence in s->msg. */
static inline int sok(embdev_set_t *s, cudaError_t st, const char *what) {
  if (st == cudaSuccess) return 1;
  if (!s->msg[0]) (void)cuda_check_error((int)st, what, s->msg, sizeof s->msg);
  return 0;
}

/* The step's buffers of a set for n samples (grown when n is over its
 * capacity; waits for the step's work first).  0, -ENOMEM (host) or
 * ERR_CUDA. */
int embdev__set_reserve(embdev_set_t *s, uint32_t n);

#endif
