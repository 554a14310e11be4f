/*
 * nn_embedding_bag.cu: the embedding bag layer of nn.cu (nn_cuda.h):
 * the forward, one thread per (sample, column) adding the sample's rows in
 * h order, and the coalesced backward: the ids sorted by a stable LSD
 * radix sort (CUB) carrying their positions, runs of equal ids found with
 * a scan, then one thread per (run, column) adding the run's gradient rows
 * in sample order, as nn.c does.  The thread's context and the launch
 * helpers are nn.cu's (nn_cuda_internal.h).
 */
#include <cuda_runtime.h>

#include <cub/cub.cuh>

#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

extern "C" { /* a C header without its own extern "C" */
#include "err.h"
}

/* One thread per (sample, column): the sample's rows added in h order. */
static __global__ void k_eb_fwd(const float *base, size_t row_stride, const uint64_t *idx,
                                uint32_t n, uint32_t hotness, uint32_t dim, float *out,
                                size_t out_stride) {
  size_t t = gtid();
  if (t >= (size_t)n * dim) return;
  size_t i = t / dim, d = t % dim;
  const uint64_t *id = idx + i * hotness;
  float o = 0.0f;
  if (hotness) {
    o = base[id[0] * row_stride + d];
    for (uint32_t h = 1; h < hotness; h++) o += base[id[h] * row_stride + d];
  }
  out[i * out_stride + d] = o;
}

void nn_cuda_embedding_bag_fwd(const float *base, size_t row_stride, const uint64_t *idx,
                               uint32_t n, uint32_t hotness, uint32_t dim, float *out,
                               size_t out_stride) {
  if (n == 0 || dim == 0) return;
  k_eb_fwd<<<grid_for((size_t)n * dim), TPB, 0, ctx.stream>>>(base, row_stride, idx, n, hotness,
                                                               dim, out, out_stride);
  launched("nn_cuda_embedding_bag_fwd");
}

/* The backward's workspace, carved from one caller allocation. */
typedef struct eb_work_s {
  uint64_t *keys;   /* sorted ids */
  uint32_t *pos_in; /* 0, 1, ... : i * hotness + h */
  uint32_t *pos;    /* sorted with the keys */
  uint32_t *flag;   /* 1 where a run of equal ids starts */
  uint32_t *rank;   /* inclusive prefix sum of flag */
  uint32_t *seg;    /* start of each run, plus total at [count] */
  uint32_t *count;
  void *temp;       /* CUB */
  size_t temp_bytes, bytes;
} eb_work_t;

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Lays out (or, with base NULL, only sizes) the workspace for total ids.
 * 0, or ERR_CUDA when CUB cannot size its storage. */
static int eb_layout(size_t total, char *base, eb_work_t *w) {
  size_t sort_bytes = 0, scan_bytes = 0;
  if (!ok_cuda(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint64_t *)NULL,
                                                (uint64_t *)NULL, (const uint32_t *)NULL,
                                                (uint32_t *)NULL, (uint32_t)total, 0, 64,
                                                ctx.stream),
               "cub::DeviceRadixSort::SortPairs (sizing)") ||
      !ok_cuda(cub::DeviceScan::InclusiveSum(NULL, scan_bytes, (const uint32_t *)NULL,
                                             (uint32_t *)NULL, (uint32_t)total, ctx.stream),
               "cub::DeviceScan::InclusiveSum (sizing)"))
    return ERR_CUDA;
  size_t o = 0;
#define CARVE(field, type, count_)                  \
  w->field = base ? (type *)(base + o) : NULL;      \
  o += align256((size_t)(count_) * sizeof(type));
  CARVE(keys, uint64_t, total);
  CARVE(pos_in, uint32_t, total);
  CARVE(pos, uint32_t, total);
  CARVE(flag, uint32_t, total);
  CARVE(rank, uint32_t, total);
  CARVE(seg, uint32_t, total + 1);
  CARVE(count, uint32_t, 1);
#undef CARVE
  w->temp_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
  w->temp = base ? base + o : NULL;
  w->bytes = o + align256(w->temp_bytes);
  return 0;
}

size_t nn_cuda_embedding_bag_bwd_work_size(uint32_t n, uint32_t hotness) {
  eb_work_t w;
  size_t total = (size_t)n * hotness;
  if (total == 0) return 0;
  if (total > UINT32_MAX) {
    if (!ctx.failed) {
      ctx.failed = ERR_CUDA;
      snprintf(ctx.msg, sizeof ctx.msg, "nn_cuda_embedding_bag_bwd: %zu ids, at most %u", total,
               (unsigned)UINT32_MAX);
    }
    return 0;
  }
  return eb_layout(total, NULL, &w) ? 0 : w.bytes;
}

static __global__ void k_iota(uint32_t *v, size_t total) {
  size_t k = gtid();
  if (k < total) v[k] = (uint32_t)k;
}

static __global__ void k_run_flags(const uint64_t *keys, size_t total, uint32_t *flag) {
  size_t k = gtid();
  if (k >= total) return;
  flag[k] = (k == 0 || keys[k] != keys[k - 1]) ? 1u : 0u;
}

/* Run r (r = rank - 1 at its first position) starts at seg[r] and has id
 * uniq[r]; seg[count] = total. */
static __global__ void k_runs(const uint64_t *keys, const uint32_t *flag, const uint32_t *rank,
                              size_t total, uint32_t *seg, uint64_t *uniq, uint32_t *count) {
  size_t k = gtid();
  if (k >= total) return;
  if (flag[k]) {
    seg[rank[k] - 1] = (uint32_t)k;
    uniq[rank[k] - 1] = keys[k];
  }
  if (k == total - 1) {
    seg[rank[k]] = (uint32_t)total;
    *count = rank[k];
  }
}

/* One thread per (run, column): the run's gradient rows added in sorted
 * order, which the stable sort made sample order (then h order). */
static __global__ void k_run_sums(const float *d_out, size_t d_out_stride, const uint32_t *pos,
                                  uint32_t hotness, const uint32_t *seg, uint32_t runs,
                                  uint32_t dim, float *grad, size_t grad_stride) {
  size_t t = gtid();
  if (t >= (size_t)runs * dim) return;
  size_t r = t / dim, d = t % dim;
  float acc = 0.0f;
  for (uint32_t k = seg[r]; k < seg[r + 1]; k++)
    acc += d_out[(size_t)(pos[k] / hotness) * d_out_stride + d];
  grad[r * grad_stride + d] = acc;
}

uint32_t nn_cuda_embedding_bag_bwd(const float *d_out, size_t d_out_stride, const uint64_t *idx,
                                   uint32_t n, uint32_t hotness, uint32_t dim, uint64_t *uniq,
                                   float *grad, size_t grad_stride, void *work) {
  size_t total = (size_t)n * hotness;
  eb_work_t w;
  uint32_t runs = 0;
  if (total == 0) return 0;
  if (total > UINT32_MAX || eb_layout(total, (char *)work, &w)) {
    (void)nn_cuda_embedding_bag_bwd_work_size(n, hotness); /* records why */
    return 0;
  }
  k_iota<<<grid_for(total), TPB, 0, ctx.stream>>>(w.pos_in, total);
  launched("nn_cuda_embedding_bag_bwd (iota)");
  /* LSD radix sort: stable, so equal ids keep their sample order */
  if (!ok_cuda(cub::DeviceRadixSort::SortPairs(w.temp, w.temp_bytes, idx, w.keys, w.pos_in, w.pos,
                                                (uint32_t)total, 0, 64, ctx.stream),
               "cub::DeviceRadixSort::SortPairs (nn_cuda_embedding_bag_bwd)"))
    return 0;
  k_run_flags<<<grid_for(total), TPB, 0, ctx.stream>>>(w.keys, total, w.flag);
  launched("nn_cuda_embedding_bag_bwd (flags)");
  if (!ok_cuda(cub::DeviceScan::InclusiveSum(w.temp, w.temp_bytes, w.flag, w.rank,
                                             (uint32_t)total, ctx.stream),
               "cub::DeviceScan::InclusiveSum (nn_cuda_embedding_bag_bwd)"))
    return 0;
  k_runs<<<grid_for(total), TPB, 0, ctx.stream>>>(w.keys, w.flag, w.rank, total, w.seg, uniq,
                                                  w.count);
  launched("nn_cuda_embedding_bag_bwd (runs)");
  if (!ok_cuda(cudaMemcpyAsync(&runs, w.count, sizeof(runs), cudaMemcpyDeviceToHost, ctx.stream),
               "cudaMemcpyAsync (nn_cuda_embedding_bag_bwd count)") ||
      !ok_cuda(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize (nn_cuda_embedding_bag_bwd)"))
    return 0;
  if (runs && dim) {
    k_run_sums<<<grid_for((size_t)runs * dim), TPB, 0, ctx.stream>>>(
        d_out, d_out_stride, w.pos, hotness, w.seg, runs, dim, grad, grad_stride);
    launched("nn_cuda_embedding_bag_bwd (sums)");
  }
  return runs;
}
