/*
 * tcache_cuda.cu: the trainer's embedding cache in GPU memory, the device
 * twin of trainer_step.c's cache mode (contract in tcache_cuda.h).
 *
 * Self-review: how each function mirrors its CPU counterpart.
 *
 *  tcache_cuda_create   = trainer_step_cache_init: cache_rows * rf floats, zeroed (the
 *                 calloc), in ONE cudaMalloc addressed with 64-bit offsets
 *                 (slot * rf can pass 2^32 floats).  Also what the CPU's
 *                 trainer_step_create allocates for the cache path: idx for
 *                 max_batch * sum(hotness) ids, uniq / grad for
 *                 max_batch * max(hotness) entries, and the backward's
 *                 workspace (nn_cuda_embedding_bag_bwd_work_size, max over
 *                 tables).  One non-blocking stream per role; the zeroing
 *                 runs on one of them and is waited for, so no role can see
 *                 the array before it is zero.
 *  tcache_cuda_scatter  = trainer_step_cache_scatter: memcpy of row i into slot s_i.  One
 *                 thread per float: dst[s_i * rf + j] = rows[i * rf + j],
 *                 a pure copy (bits moved, no arithmetic).
 *  tcache_cuda_gather   = trainer_step_cache_gather: the same copy the other way.
 *  tcache_cuda_forward  = trainer_step_cache_forward's loop: per table t,
 *                 nn_cuda_embedding_bag_fwd(rows, rf, idx + o, n, h, dim,
 *                 emb + t * dim, n_tables * dim), o += n * h -- the same
 *                 arguments as the CPU's nn_embedding_bag_fwd call, and
 *                 nn.cu's kernel adds a sample's rows in h order starting
 *                 from row 0 as nn.c does.  tcache_cuda_forward_skip: a
 *                 table with skip[t] is passed over (its ids unchecked,
 *                 its columns untouched), as embag_fwd's skip on the CPU
 *                 (trainer_step's partitioned tables; model_dev_emb_cols_in
 *                 brings their columns from the host).
 *  tcache_cuda_backward = one table of trainer_step_backward's cache_mode loop:
 *                 nn_cuda_embedding_bag_bwd(d_emb + t * dim, width, idx + o,
 *                 n, h, dim, uniq, grad, dim, work) -- stable sort (equal
 *                 slots keep sample order), each unique slot's rows added in
 *                 that order from 0.0f as nn.c does; then uniq (ascending)
 *                 and grad copied to the host, where the caller does
 *                 cache_grad_of's memcpy.  A table the forward skipped is
 *                 refused (the caller's loop skips it first, as embag_bwd
 *                 does on the CPU): its ids name no slot.
 *  tcache_cuda_update_rows = opt_row_update per listed slot, one thread per row
 *                 (rows distinct, so no two threads touch one row):
 *                   sgd:     w[d] -= lr * g[d]                (d ascending)
 *                   adagrad: h[d] += g[d] * g[d];
 *                            w[d] -= lr * g[d] / (sqrtf(h[d]) + eps)
 *                   rowwise: ss = 0; ss += g[d] * g[d] for d = 0 .. dim-1
 *                            sequentially in the thread; h = row[dim] +
 *                            ss / (float)dim; row[dim] = h;
 *                            step = lr / (sqrtf(h) + eps);
 *                            w[d] -= step * g[d]
 *                 Same operations, same association as opt.c's C
 *                 expressions; --fmad=false keeps every product rounded
 *                 (no FMA, like C11 on the CPU); nvcc's defaults
 *                 (-prec-sqrt=true, -prec-div=true, -ftz=false) make sqrtf
 *                 and '/' IEEE round-to-nearest with denormals kept, as
 *                 SSE's sqrtss / divss.  OPT_ADAM is refused (opt.c
 *                 ASSERTs).
 *
 * Streams and buffers.  tcache_cuda_forward / tcache_cuda_backward run on the calling
 * thread's nn_cuda stream (the model's) and use the buffers allocated at
 * create (only the training thread calls them).  scatter / gather /
 * update_rows run on their role's stream with the role's growable device
 * buffers (slots, floats) and pinned host buffer (slots); buffers only
 * grow, and the stream is drained before an old one is freed.  Every call
 * waits for its stream before returning, so its results are in place and
 * the next call of any role sees them (the header's contract).
 *
 * Checks the CPU cache functions leave to their callers (an out-of-range
 * slot here would be a device memory fault that kills the context): slots
 * beyond the cache, n above max_batch, an unknown table or optimizer, rows
 * too short for the optimizer's state all return -EINVAL with a sentence.
 */
#include <cuda_runtime.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "nn_cuda.h"

extern "C" { /* C headers without their own extern "C" (opt.h before tcache_cuda.h includes it) */
#include "err.h"
#include "opt.h"
}

#include "tcache_cuda.h"

#define TPB 256

typedef struct role_s {
  cudaStream_t stream;
  uint32_t *h_slots; /* pinned, cap_slots */
  uint32_t *d_slots; /* device, cap_slots */
  size_t cap_slots;
  float *d_buf; /* device, cap_buf floats: rows (scatter / gather) or grads (update) */
  size_t cap_buf;
} role_t;

struct tcache_cuda_s {
  uint64_t cache_rows;
  uint32_t rf, dim, n_tables, max_batch, max_hot;
  uint32_t *hotness;     /* n_tables */
  size_t ids_per_sample; /* sum of hotness */
  float *rows;           /* device, cache_rows * rf */
  uint64_t *idx;         /* device, max_batch * ids_per_sample: the last forward's */
  uint64_t *uniq;        /* device, max_batch * max_hot */
  float *grad;           /* device, max_batch * max_hot * dim */
  void *work;            /* device, work_bytes */
  size_t work_bytes;
  uint32_t fwd_n;
  int fwd_ok;
  uint8_t *skipped;      /* n_tables: the last forward's skip */
  role_t role[TCACHE_CUDA_ROLES];
};

/* ------------------------------------------------------------------ errors */

/* 1 when st is success; else ERR_CUDA's sentence ("what: message") in err
 * and 0. */
static int ok(cudaError_t st, const char *what, char *err, size_t err_len, int *rc) {
  if (st == cudaSuccess) return 1;
  char tmp[1];
  *rc = cuda_check_error((int)st, what, err && err_len ? err : tmp, err && err_len ? err_len : sizeof tmp);
  return 0;
}

/* After nn_cuda_* calls: their sticky error, as ours. */
static int nn_failed(const char *what, char *err, size_t err_len) {
  char msg[400];
  int rc = nn_cuda_error(msg, sizeof msg);
  if (rc) return err_set(err, err_len, rc, "%s: %s", what, msg);
  return 0;
}

static const char *role_name(int r) {
  return r == TCACHE_CUDA_TRAIN ? "train" : r == TCACHE_CUDA_PREFETCH ? "prefetch" : r == TCACHE_CUDA_BACKGROUND ? "background" : "?";
}

static uint32_t load_u32(const void *p, size_t i) {
  uint32_t v;
  memcpy(&v, (const uint8_t *)p + i * 4, 4);
  return v;
}

/* ------------------------------------------------------------------ kernels */

static unsigned grid_for(size_t total) { return (unsigned)((total + TPB - 1) / TPB); }

static __device__ __forceinline__ size_t gtid(void) { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }

/* rows[slots[i] * rf + j] = src[i * rf + j], one thread per float */
static __global__ void k_scatter(float *__restrict__ rows, uint32_t rf, const uint32_t *__restrict__ slots,
                                 size_t n, const float *__restrict__ src) {
  size_t t = gtid();
  if (t >= n * rf) return;
  size_t i = t / rf, j = t % rf;
  rows[(size_t)slots[i] * rf + j] = src[t];
}

/* dst[i * rf + j] = rows[slots[i] * rf + j], one thread per float */
static __global__ void k_gather(const float *__restrict__ rows, uint32_t rf, const uint32_t *__restrict__ slots,
                                size_t n, float *__restrict__ dst) {
  size_t t = gtid();
  if (t >= n * rf) return;
  size_t i = t / rf, j = t % rf;
  dst[t] = rows[(size_t)slots[i] * rf + j];
}

/* opt_row_update(kind, {lr, eps}, rows + slots[i] * rf, dim, grads + i * dim),
 * one thread per listed row, in opt.c's operation order. */
static __global__ void k_update_rows(float *__restrict__ rows, uint32_t rf, const uint32_t *__restrict__ slots,
                                     size_t n, const float *__restrict__ grads, uint32_t dim, int kind, float lr,
                                     float eps) {
  size_t i = gtid();
  if (i >= n) return;
  float *w = rows + (size_t)slots[i] * rf;
  const float *g = grads + i * dim;
  if (kind == OPT_SGD) {
    for (uint32_t d = 0; d < dim; d++) w[d] -= lr * g[d];
  } else if (kind == OPT_ADAGRAD) {
    float *h = w + dim;
    for (uint32_t d = 0; d < dim; d++) {
      h[d] += g[d] * g[d];
      w[d] -= lr * g[d] / (sqrtf(h[d]) + eps);
    }
  } else { /* OPT_ROWWISE_ADAGRAD */
    float ss = 0.0f;
    for (uint32_t d = 0; d < dim; d++) ss += g[d] * g[d];
    float h = w[dim] + ss / (float)dim;
    w[dim] = h;
    float step = lr / (sqrtf(h) + eps);
    for (uint32_t d = 0; d < dim; d++) w[d] -= step * g[d];
  }
}

/* ------------------------------------------------------------------ buffers */

/* Role r's buffers grown to n_slots slots and n_floats floats (capacity is
 * kept; growth at least doubles). */
static int role_reserve(tcache_cuda_t *c, int r, size_t n_slots, size_t n_floats, char *err, size_t err_len) {
  role_t *ro = &c->role[r];
  int rc = 0;
  if (n_slots <= ro->cap_slots && n_floats <= ro->cap_buf) return 0;
  /* a failed earlier call may have left work queued on the old buffers */
  if (!ok(cudaStreamSynchronize(ro->stream), "cudaStreamSynchronize (tcc: growing the staging buffers)", err,
          err_len, &rc))
    return rc;
  if (n_slots > ro->cap_slots) {
    size_t cap = ro->cap_slots * 2;
    if (cap < 4096) cap = 4096;
    if (cap < n_slots) cap = n_slots;
    if (ro->h_slots) (void)cudaFreeHost(ro->h_slots);
    if (ro->d_slots) (void)cudaFree(ro->d_slots);
    ro->h_slots = NULL;
    ro->d_slots = NULL;
    ro->cap_slots = 0;
    char what[160];
    snprintf(what, sizeof what, "cudaMallocHost (tcc, %s role: %zu slots)", role_name(r), cap);
    if (!ok(cudaMallocHost((void **)&ro->h_slots, cap * sizeof(uint32_t)), what, err, err_len, &rc)) {
      ro->h_slots = NULL;
      return rc;
    }
    snprintf(what, sizeof what, "cudaMalloc (tcc, %s role: %zu slots)", role_name(r), cap);
    if (!ok(cudaMalloc((void **)&ro->d_slots, cap * sizeof(uint32_t)), what, err, err_len, &rc)) {
      ro->d_slots = NULL;
      return rc;
    }
    ro->cap_slots = cap;
  }
  if (n_floats > ro->cap_buf) {
    size_t cap = ro->cap_buf * 2;
    if (cap < 65536) cap = 65536;
    if (cap < n_floats) cap = n_floats;
    if (ro->d_buf) (void)cudaFree(ro->d_buf);
    ro->d_buf = NULL;
    ro->cap_buf = 0;
    char what[160];
    snprintf(what, sizeof what, "cudaMalloc (tcc, %s role: %zu floats of rows / gradients)", role_name(r), cap);
    if (!ok(cudaMalloc((void **)&ro->d_buf, cap * sizeof(float)), what, err, err_len, &rc)) {
      ro->d_buf = NULL;
      return rc;
    }
    ro->cap_buf = cap;
  }
  return 0;
}

/* The n slots (uint32, maybe unaligned) checked against the cache and
 * copied into role r's pinned buffer, then uploaded (async on its
 * stream).  Needs role_reserve first. */
static int upload_slots(tcache_cuda_t *c, int r, const void *slots, size_t n, const char *fn, char *err,
                        size_t err_len) {
  role_t *ro = &c->role[r];
  for (size_t i = 0; i < n; i++) {
    uint32_t s = load_u32(slots, i);
    if (s >= c->cache_rows)
      return err_set(err, err_len, -EINVAL, "%s: slots[%zu] = %u, beyond the cache of %" PRIu64 " rows", fn, i, s,
                     c->cache_rows);
    ro->h_slots[i] = s;
  }
  int rc = 0;
  char what[160];
  snprintf(what, sizeof what, "cudaMemcpyAsync (%s: %zu slots to the device)", fn, n);
  if (!ok(cudaMemcpyAsync(ro->d_slots, ro->h_slots, n * sizeof(uint32_t), cudaMemcpyHostToDevice, ro->stream),
          what, err, err_len, &rc))
    return rc;
  return 0;
}

static int bad_role(tcache_cuda_role_t role, const char *fn, char *err, size_t err_len) {
  if ((unsigned)role < TCACHE_CUDA_ROLES) return 0;
  return err_set(err, err_len, -EINVAL, "%s: role %d is not one of train, prefetch, background", fn, (int)role);
}

/* ------------------------------------------------------------------ create / destroy */

int tcache_cuda_create(uint64_t cache_rows, uint32_t rf, uint32_t dim, uint32_t n_tables, const uint32_t *hotness,
               uint32_t max_batch, tcache_cuda_t **out, char *err, size_t err_len) {
  *out = NULL;
  if (cache_rows == 0 || cache_rows > UINT32_MAX)
    return err_set(err, err_len, ERR_CONFIG, "cache_rows = %" PRIu64 " is not in [1, 2^32)", cache_rows);
  if (dim == 0 || rf < dim || n_tables == 0 || !hotness || max_batch == 0)
    return err_set(err, err_len, -EINVAL,
                   "tcache_cuda_create: bad shape (rf = %u, dim = %u, n_tables = %u, max_batch = %u): need 0 < dim <= rf, "
                   "at least one table and one sample",
                   rf, dim, n_tables, max_batch);
  tcache_cuda_t *c = (tcache_cuda_t *)calloc(1, sizeof *c);
  if (!c) return err_set(err, err_len, -ENOMEM, "tcache_cuda_create: out of memory");
  c->hotness = (uint32_t *)malloc(n_tables * sizeof *c->hotness);
  c->skipped = (uint8_t *)calloc(n_tables, 1);
  if (!c->hotness || !c->skipped) {
    free(c->hotness);
    free(c->skipped);
    free(c);
    return err_set(err, err_len, -ENOMEM, "tcache_cuda_create: out of memory");
  }
  c->cache_rows = cache_rows;
  c->rf = rf;
  c->dim = dim;
  c->n_tables = n_tables;
  c->max_batch = max_batch;
  c->max_hot = 1;
  for (uint32_t t = 0; t < n_tables; t++) {
    c->hotness[t] = hotness[t];
    c->ids_per_sample += hotness[t];
    if (hotness[t] > c->max_hot) c->max_hot = hotness[t];
  }
  int rc = 0;
  char what[200];
  size_t row_floats = (size_t)cache_rows * rf;
  size_t max_ids = (size_t)max_batch * c->max_hot;
  for (int r = 0; r < TCACHE_CUDA_ROLES; r++) {
    snprintf(what, sizeof what, "cudaStreamCreateWithFlags (tcc, %s role)", role_name(r));
    if (!ok(cudaStreamCreateWithFlags(&c->role[r].stream, cudaStreamNonBlocking), what, err, err_len, &rc)) {
      c->role[r].stream = NULL;
      goto fail;
    }
  }
  snprintf(what, sizeof what, "cudaMalloc (tcache_cuda_create: a cache of %" PRIu64 " rows of %u floats, %.1f GiB)",
           cache_rows, rf, (double)row_floats * 4 / (1 << 30));
  if (!ok(cudaMalloc((void **)&c->rows, row_floats * sizeof(float)), what, err, err_len, &rc)) {
    c->rows = NULL;
    goto fail;
  }
  if (!ok(cudaMemsetAsync(c->rows, 0, row_floats * sizeof(float), c->role[TCACHE_CUDA_TRAIN].stream),
          "cudaMemsetAsync (tcache_cuda_create: zeroing the cache)", err, err_len, &rc) ||
      !ok(cudaStreamSynchronize(c->role[TCACHE_CUDA_TRAIN].stream), "cudaStreamSynchronize (tcache_cuda_create)", err, err_len, &rc))
    goto fail;
  snprintf(what, sizeof what, "cudaMalloc (tcache_cuda_create: slots of %u samples x %zu ids)", max_batch,
           c->ids_per_sample);
  if (!ok(cudaMalloc((void **)&c->idx, ((size_t)max_batch * c->ids_per_sample + 1) * sizeof(uint64_t)), what, err,
          err_len, &rc)) {
    c->idx = NULL;
    goto fail;
  }
  snprintf(what, sizeof what, "cudaMalloc (tcache_cuda_create: %zu unique slots of the backward)", max_ids);
  if (!ok(cudaMalloc((void **)&c->uniq, (max_ids + 1) * sizeof(uint64_t)), what, err, err_len, &rc)) {
    c->uniq = NULL;
    goto fail;
  }
  snprintf(what, sizeof what, "cudaMalloc (tcache_cuda_create: %zu gradient rows of %u floats)", max_ids, dim);
  if (!ok(cudaMalloc((void **)&c->grad, (max_ids * dim + 1) * sizeof(float)), what, err, err_len, &rc)) {
    c->grad = NULL;
    goto fail;
  }
  for (uint32_t t = 0; t < n_tables; t++) {
    if ((size_t)max_batch * c->hotness[t] == 0) continue;
    size_t b = nn_cuda_embedding_bag_bwd_work_size(max_batch, c->hotness[t]);
    if (b == 0) {
      rc = nn_failed("tcache_cuda_create: sizing the embedding backward's workspace", err, err_len);
      if (!rc)
        rc = err_set(err, err_len, ERR_CUDA, "tcache_cuda_create: the embedding backward's workspace for table %u "
                     "(%u samples x %u ids) could not be sized", t, max_batch, c->hotness[t]);
      goto fail;
    }
    if (b > c->work_bytes) c->work_bytes = b;
  }
  snprintf(what, sizeof what, "cudaMalloc (tcache_cuda_create: %zu bytes of embedding backward workspace)", c->work_bytes);
  if (!ok(cudaMalloc(&c->work, c->work_bytes ? c->work_bytes : 256), what, err, err_len, &rc)) {
    c->work = NULL;
    goto fail;
  }
  *out = c;
  return 0;
fail:
  tcache_cuda_destroy(c);
  return rc ? rc : ERR_CUDA;
}

void tcache_cuda_destroy(tcache_cuda_t *c) {
  if (!c) return;
  for (int r = 0; r < TCACHE_CUDA_ROLES; r++) {
    role_t *ro = &c->role[r];
    if (ro->stream) (void)cudaStreamSynchronize(ro->stream);
    if (ro->h_slots) (void)cudaFreeHost(ro->h_slots);
    if (ro->d_slots) (void)cudaFree(ro->d_slots);
    if (ro->d_buf) (void)cudaFree(ro->d_buf);
    if (ro->stream) (void)cudaStreamDestroy(ro->stream);
  }
  if (c->rows) (void)cudaFree(c->rows);
  if (c->idx) (void)cudaFree(c->idx);
  if (c->uniq) (void)cudaFree(c->uniq);
  if (c->grad) (void)cudaFree(c->grad);
  if (c->work) (void)cudaFree(c->work);
  free(c->hotness);
  free(c->skipped);
  free(c);
}

/* ------------------------------------------------------------------ scatter / gather */

int tcache_cuda_scatter(tcache_cuda_t *c, tcache_cuda_role_t role, const void *slots, size_t n, const float *rows, char *err,
                size_t err_len) {
  int rc = bad_role(role, "tcache_cuda_scatter", err, err_len);
  if (rc || n == 0) return rc;
  role_t *ro = &c->role[role];
  size_t floats = n * c->rf;
  if ((rc = role_reserve(c, role, n, floats, err, err_len)) != 0 ||
      (rc = upload_slots(c, role, slots, n, "tcache_cuda_scatter", err, err_len)) != 0)
    return rc;
  char what[160];
  snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_scatter: %zu rows of %u floats to the device)", n, c->rf);
  if (!ok(cudaMemcpyAsync(ro->d_buf, rows, floats * sizeof(float), cudaMemcpyHostToDevice, ro->stream), what, err,
          err_len, &rc))
    return rc;
  k_scatter<<<grid_for(floats), TPB, 0, ro->stream>>>(c->rows, c->rf, ro->d_slots, n, ro->d_buf);
  if (!ok(cudaGetLastError(), "tcache_cuda_scatter (kernel launch)", err, err_len, &rc) ||
      !ok(cudaStreamSynchronize(ro->stream), "cudaStreamSynchronize (tcache_cuda_scatter)", err, err_len, &rc))
    return rc;
  return 0;
}

int tcache_cuda_gather(tcache_cuda_t *c, tcache_cuda_role_t role, const void *slots, size_t n, float *rows, char *err, size_t err_len) {
  int rc = bad_role(role, "tcache_cuda_gather", err, err_len);
  if (rc || n == 0) return rc;
  role_t *ro = &c->role[role];
  size_t floats = n * c->rf;
  if ((rc = role_reserve(c, role, n, floats, err, err_len)) != 0 ||
      (rc = upload_slots(c, role, slots, n, "tcache_cuda_gather", err, err_len)) != 0)
    return rc;
  k_gather<<<grid_for(floats), TPB, 0, ro->stream>>>(c->rows, c->rf, ro->d_slots, n, ro->d_buf);
  if (!ok(cudaGetLastError(), "tcache_cuda_gather (kernel launch)", err, err_len, &rc)) return rc;
  char what[160];
  snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_gather: %zu rows of %u floats to the host)", n, c->rf);
  if (!ok(cudaMemcpyAsync(rows, ro->d_buf, floats * sizeof(float), cudaMemcpyDeviceToHost, ro->stream), what, err,
          err_len, &rc) ||
      !ok(cudaStreamSynchronize(ro->stream), "cudaStreamSynchronize (tcache_cuda_gather)", err, err_len, &rc))
    return rc;
  return 0;
}

/* ------------------------------------------------------------------ forward / backward */

int tcache_cuda_forward(tcache_cuda_t *c, const uint64_t *idx, uint32_t n, float *emb, char *err, size_t err_len) {
  return tcache_cuda_forward_skip(c, idx, n, NULL, emb, err, err_len);
}

int tcache_cuda_forward_skip(tcache_cuda_t *c, const uint64_t *idx, uint32_t n, const uint8_t *skip, float *emb,
                             char *err, size_t err_len) {
  c->fwd_ok = 0;
  if (n > c->max_batch)
    return err_set(err, err_len, -EINVAL, "tcache_cuda_forward: %u samples, more than the batch of %u", n, c->max_batch);
  if (n) {
    size_t n_ids = (size_t)n * c->ids_per_sample, o = 0;
    for (uint32_t t = 0; t < c->n_tables; t++) { /* a skipped table's ids name no slot */
      size_t m = (size_t)n * c->hotness[t];
      if (!(skip && skip[t]))
        for (size_t i = o; i < o + m; i++)
          if (idx[i] >= c->cache_rows)
            return err_set(err, err_len, -EINVAL, "tcache_cuda_forward: idx[%zu] = slot %" PRIu64
                           ", beyond the cache of %" PRIu64 " rows", i, idx[i], c->cache_rows);
      o += m;
    }
    cudaStream_t st = (cudaStream_t)nn_cuda_stream();
    int rc = 0;
    char what[160];
    snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_forward: %zu slots to the device)", n_ids);
    if (n_ids &&
        !ok(cudaMemcpyAsync(c->idx, idx, n_ids * sizeof(uint64_t), cudaMemcpyHostToDevice, st), what, err, err_len,
            &rc))
      return rc;
    size_t width = (size_t)c->n_tables * c->dim;
    o = 0;
    for (uint32_t t = 0; t < c->n_tables; t++) {
      uint32_t h = c->hotness[t];
      if (!(skip && skip[t]))
        nn_cuda_embedding_bag_fwd(c->rows, c->rf, c->idx + o, n, h, c->dim, emb + (size_t)t * c->dim, width);
      o += (size_t)n * h;
    }
    if ((rc = nn_failed("tcache_cuda_forward (pooling)", err, err_len)) != 0) return rc;
    if (!ok(cudaStreamSynchronize(st), "cudaStreamSynchronize (tcache_cuda_forward)", err, err_len, &rc)) return rc;
  }
  for (uint32_t t = 0; t < c->n_tables; t++) c->skipped[t] = skip && skip[t];
  c->fwd_n = n;
  c->fwd_ok = 1;
  return 0;
}

int tcache_cuda_backward(tcache_cuda_t *c, const float *d_emb, uint32_t table, uint64_t *uniq, float *grad, uint32_t *n_uniq,
                 char *err, size_t err_len) {
  *n_uniq = 0;
  if (!c->fwd_ok)
    return err_set(err, err_len, -EINVAL, "tcache_cuda_backward: no successful tcache_cuda_forward to take the slots from");
  if (table >= c->n_tables)
    return err_set(err, err_len, -EINVAL, "tcache_cuda_backward: table %u of %u", table, c->n_tables);
  if (c->skipped[table])
    return err_set(err, err_len, -EINVAL,
                   "tcache_cuda_backward: table %u was skipped by the last forward (a partitioned table: its ids name "
                   "no slot)", table);
  uint32_t n = c->fwd_n, h = c->hotness[table];
  if ((size_t)n * h == 0) return 0;
  size_t o = 0;
  for (uint32_t t = 0; t < table; t++) o += (size_t)n * c->hotness[t];
  size_t need = nn_cuda_embedding_bag_bwd_work_size(n, h);
  int rc = nn_failed("tcache_cuda_backward (sizing the workspace)", err, err_len);
  if (rc) return rc;
  if (need == 0 || need > c->work_bytes)
    return err_set(err, err_len, ERR_CUDA,
                   "tcache_cuda_backward: table %u over %u samples needs %zu bytes of workspace, %zu were sized at create",
                   table, n, need, c->work_bytes);
  size_t width = (size_t)c->n_tables * c->dim;
  uint32_t u = nn_cuda_embedding_bag_bwd(d_emb + (size_t)table * c->dim, width, c->idx + o, n, h, c->dim, c->uniq,
                                         c->grad, c->dim, c->work);
  if ((rc = nn_failed("tcache_cuda_backward (coalescing)", err, err_len)) != 0) return rc;
  if (u == 0) /* n * h > 0 ids give at least one unique slot */
    return err_set(err, err_len, ERR_CUDA, "tcache_cuda_backward: table %u: the device found no unique slot", table);
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  char what[160];
  snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_backward: %u unique slots to the host)", u);
  if (!ok(cudaMemcpyAsync(uniq, c->uniq, (size_t)u * sizeof(uint64_t), cudaMemcpyDeviceToHost, st), what, err,
          err_len, &rc))
    return rc;
  snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_backward: %u gradient rows of %u floats to the host)", u, c->dim);
  if (!ok(cudaMemcpyAsync(grad, c->grad, (size_t)u * c->dim * sizeof(float), cudaMemcpyDeviceToHost, st), what, err,
          err_len, &rc) ||
      !ok(cudaStreamSynchronize(st), "cudaStreamSynchronize (tcache_cuda_backward)", err, err_len, &rc))
    return rc;
  *n_uniq = u;
  return 0;
}

/* ------------------------------------------------------------------ update */

int tcache_cuda_update_rows(tcache_cuda_t *c, tcache_cuda_role_t role, const uint32_t *slots, size_t n, const float *grads,
                    opt_kind_t kind, const opt_hparams_t *hp, char *err, size_t err_len) {
  int rc = bad_role(role, "tcache_cuda_update_rows", err, err_len);
  if (rc) return rc;
  if (kind != OPT_SGD && kind != OPT_ADAGRAD && kind != OPT_ROWWISE_ADAGRAD)
    return err_set(err, err_len, -EINVAL,
                   "tcache_cuda_update_rows: embedding rows are updated with sgd, adagrad or rowwise_adagrad, not %s",
                   opt_kind_name(kind));
  uint32_t state = opt_row_state_floats(kind, c->dim);
  if ((uint64_t)c->dim + state > c->rf)
    return err_set(err, err_len, -EINVAL, "tcache_cuda_update_rows: %s needs %u + %u floats per row, the cache has %u",
                   opt_kind_name(kind), c->dim, state, c->rf);
  if (n == 0) return 0;
  role_t *ro = &c->role[role];
  size_t floats = n * c->dim;
  if ((rc = role_reserve(c, role, n, floats, err, err_len)) != 0 ||
      (rc = upload_slots(c, role, slots, n, "tcache_cuda_update_rows", err, err_len)) != 0)
    return rc;
  char what[160];
  snprintf(what, sizeof what, "cudaMemcpyAsync (tcache_cuda_update_rows: %zu gradients of %u floats to the device)", n,
           c->dim);
  if (!ok(cudaMemcpyAsync(ro->d_buf, grads, floats * sizeof(float), cudaMemcpyHostToDevice, ro->stream), what, err,
          err_len, &rc))
    return rc;
  k_update_rows<<<grid_for(n), TPB, 0, ro->stream>>>(c->rows, c->rf, ro->d_slots, n, ro->d_buf, c->dim, (int)kind,
                                                      hp->lr, hp->eps);
  if (!ok(cudaGetLastError(), "tcache_cuda_update_rows (kernel launch)", err, err_len, &rc) ||
      !ok(cudaStreamSynchronize(ro->stream), "cudaStreamSynchronize (tcache_cuda_update_rows)", err, err_len, &rc))
    return rc;
  return 0;
}
