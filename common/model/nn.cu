/*
 * nn.cu: the layers of nn.h as CUDA kernels plus cuBLAS, the device twin
 * of nn.c (same names with the nn_cuda_ prefix, same argument order; see
 * nn_cuda.h for the contract, the error model and which results are
 * bit-identical to the CPU).  The embedding bag layer is in
 * nn_embedding_bag.cu; the thread's context and the launch helpers both
 * files use are in nn_cuda_internal.h.
 *
 * How the kernels are written.  Every kernel is one thread per output
 * element (or per output column / per sample where the CPU sums along a
 * row or a column), with no shared memory, no atomics and no cross-thread
 * reduction: each thread adds its terms in exactly the order nn.c does,
 * and the build passes --fmad=false, so a product followed by a sum is
 * rounded twice as in C11 (no FMA contraction).  That gives run-to-run
 * determinism for free and bit-equality with nn.c wherever the CPU's order
 * is a plain loop.  It is not the fastest layout for every layer (a
 * column sum over a large batch is one thread's serial loop), but GEMMs
 * dominate these models and go to cuBLAS.
 *
 * Row-major GEMMs through column-major cuBLAS: a row-major A[r x c] is
 * the column-major A^T[c x r] with leading dimension c, so
 *   y = x W^T   is  y^T  = W x^T   : Sgemm(T, N, out, n, in, W, in, x, in, y, out)
 *   dW = dy^T x is  dW^T = x^T dy  : Sgemm(N, T, in, out, n, x, in, dy, out, dW, in)
 *   dx = dy W   is  dx^T = W^T dy^T: Sgemm(N, N, in, n, out, W, in, dy, out, dx, in)
 * The handle uses CUBLAS_DEFAULT_MATH: FP32 GEMMs stay FP32 (no TF32).
 *
 * Launch shapes: TPB threads per block, ceil(total / TPB) blocks, on the
 * calling thread's stream.  Every launch is followed by a launch-error
 * check recorded in the thread's sticky error (nn_cuda_error).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

extern "C" { /* a C header without its own extern "C" */
#include "err.h"
}

#define BCE_CHUNK 256 /* samples per partial sum of the BCE loss */

/* ------------------------------------------------------------------ context */

thread_local nn_cuda__::ctx_t nn_cuda__::ctx;

static int ok_blas(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return 1;
  if (!ctx.failed) ctx.failed = cuda_check_cublas_error((int)st, what, ctx.msg, sizeof ctx.msg);
  return 0;
}

static cublasHandle_t blas(void) {
  if (!ctx.blas) {
    cublasHandle_t h = NULL;
    if (!ok_blas(cublasCreate(&h), "cublasCreate")) return NULL;
    if (!ok_blas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode") ||
        !ok_blas(cublasSetStream(h, ctx.stream), "cublasSetStream")) {
      cublasDestroy(h);
      return NULL;
    }
    ctx.blas = h;
  }
  return ctx.blas;
}

/* This thread's device scratch, grown to at least bytes (NULL on failure). */
static void *scratch(size_t bytes) {
  if (bytes <= ctx.scratch_bytes && ctx.scratch) return ctx.scratch;
  size_t want = 64 * 1024;
  while (want < bytes) want *= 2;
  if (ctx.scratch) {
    /* work queued on the stream may still read the old buffer */
    (void)ok_cuda(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize");
    (void)ok_cuda(cudaFree(ctx.scratch), "cudaFree");
    ctx.scratch = NULL;
    ctx.scratch_bytes = 0;
  }
  void *p = NULL;
  if (!ok_cuda(cudaMalloc(&p, want), "cudaMalloc (nn_cuda scratch)")) return NULL;
  ctx.scratch = p;
  ctx.scratch_bytes = want;
  return p;
}

/* Scratch bytes of the calls over n samples (BCE: n per-sample losses,
 * the chunk sums and the total, as doubles; cross: n floats). */
static size_t scratch_for(uint32_t n) {
  size_t chunks = ((size_t)n + BCE_CHUNK - 1) / BCE_CHUNK;
  return ((size_t)n + chunks + 1) * sizeof(double);
}

int nn_cuda__ok(int cuda_status, const char *what) { return ok_cuda((cudaError_t)cuda_status, what); }

void nn_cuda_set_stream(void *stream) {
  ctx.stream = (cudaStream_t)stream;
  if (ctx.blas) (void)ok_blas(cublasSetStream(ctx.blas, ctx.stream), "cublasSetStream");
}

void *nn_cuda_stream(void) { return (void *)ctx.stream; }

int nn_cuda_reserve(uint32_t max_n) {
  if (!blas() || !scratch(scratch_for(max_n))) return ctx.failed ? ctx.failed : ERR_CUDA;
  return 0;
}

int nn_cuda_error(char *err, size_t err_len) {
  int rc = ctx.failed;
  if (rc && err_len) snprintf(err, err_len, "%s", ctx.msg);
  ctx.failed = 0;
  ctx.msg[0] = 0;
  return rc;
}

void nn_cuda_release(void) {
  if (ctx.blas || ctx.scratch) (void)ok_cuda(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize");
  if (ctx.blas) cublasDestroy(ctx.blas);
  if (ctx.scratch) (void)ok_cuda(cudaFree(ctx.scratch), "cudaFree");
  ctx.blas = NULL;
  ctx.scratch = NULL;
  ctx.scratch_bytes = 0;
}

/* ------------------------------------------------------------------ helpers */

/* nn.c's dot8: 8 fixed lanes over j, combined in a fixed order. */
static __device__ float dot8(const float *a, const float *b, uint32_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t j = 0;
  for (; j + 8 <= d; j += 8)
#pragma unroll
    for (uint32_t l = 0; l < 8; l++) acc[l] += a[j + l] * b[j + l];
  for (uint32_t l = 0; j + l < d; l++) acc[l] += a[j + l] * b[j + l];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static __device__ __forceinline__ float sigmoidf_stable(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  float e = expf(z);
  return e / (1.0f + e);
}

/* y[i] = dot8(x_i, w) for n rows of width in: the one-output linear layer
 * and the cross layer's x . w. */
static __global__ void k_dot8_rows(const float *x, uint32_t n, uint32_t in, const float *w,
                                   float *y) {
  size_t i = gtid();
  if (i >= n) return;
  y[i] = dot8(x + i * in, w, in);
}

/* y[i] = dot8(a_i, b_i) for n pairs of rows of width d. */
static __global__ void k_dot8_pairs(const float *a, const float *b, uint32_t n, uint32_t d,
                                    float *y) {
  size_t i = gtid();
  if (i >= n) return;
  y[i] = dot8(a + i * d, b + i * d, d);
}

/* dst[i*ds + j] += src[i*ss + j] */
static __global__ void k_add2d(float *dst, size_t ds, const float *src, size_t ss, uint32_t n,
                               uint32_t w) {
  size_t k = gtid();
  if (k >= (size_t)n * w) return;
  size_t i = k / w, j = k % w;
  dst[i * ds + j] += src[i * ss + j];
}

/* ------------------------------------------------------------------ linear */

static __global__ void k_bias_act(float *y, const float *b, uint32_t n, uint32_t out, int relu) {
  size_t k = gtid();
  if (k >= (size_t)n * out) return;
  float v = y[k];
  if (b) v = v + b[k % out];
  if (relu) v = v > 0.0f ? v : 0.0f;
  y[k] = v;
}

/* Column sums over the samples, parallel and in a fixed order: the rows
 * are cut into chunks of COL_CHUNK consecutive samples; one thread per
 * (chunk, column) adds its chunk's rows in row order (k_col_part, into
 * part[chunk * out + column]), then one thread per column adds the chunks'
 * partial sums in chunk order (k_col_fin).  The order depends on n alone:
 * bit-identical run to run, and equal to nn.c's row-by-row sum when n <=
 * COL_CHUNK (one chunk); beyond it the last bits may differ from nn.c, as
 * cuBLAS's do.  (A single thread per column, nn.c's order, kept the GPU
 * waiting on one serial loop of n loads per layer: 32 ms of a 35 ms step
 * at batch 16384 on an H200.) */
#define COL_CHUNK 64
static __host__ __device__ unsigned col_chunks(uint32_t n) { return (n + COL_CHUNK - 1) / COL_CHUNK; }
static __global__ void k_relu_bwd(const float *y, const float *dy, size_t len, float *dx);

/* dy *= (y > 0) when relu (written back), part = the chunk's column sum of
 * dy (db) -- or, with x (the one-output layer's dw), of dy[i] * x[i][j]. */
static __global__ void k_col_part(const float *y, float *dy, const float *x, uint32_t n, uint32_t out,
                                  int relu, float *part) {
  size_t t = gtid();
  if (t >= (size_t)col_chunks(n) * out) return;
  uint32_t j = (uint32_t)(t % out), c = (uint32_t)(t / out);
  size_t i0 = (size_t)c * COL_CHUNK, i1 = i0 + COL_CHUNK < n ? i0 + COL_CHUNK : n;
  float acc = 0.0f;
  for (size_t i = i0; i < i1; i++) {
    float v;
    if (x) {
      v = dy[i] * x[i * out + j];
    } else {
      size_t k = i * out + j;
      v = dy[k];
      if (relu) {
        v = y[k] > 0.0f ? v : 0.0f;
        dy[k] = v;
      }
    }
    acc += v;
  }
  part[t] = acc;
}

static __global__ void k_col_fin(const float *part, uint32_t chunks, uint32_t out, float *sum) {
  size_t j = gtid();
  if (j >= out) return;
  float acc = 0.0f;
  for (uint32_t c = 0; c < chunks; c++) acc += part[(size_t)c * out + j];
  sum[j] = acc;
}

/* The column sums of k_col_part into sum[out] (NULL: only the ReLU mask);
 * the partial sums in this thread's scratch. */
static void col_sums(const float *y, float *dy, const float *x, uint32_t n, uint32_t out, int relu, float *sum,
                     const char *what) {
  size_t parts = (size_t)col_chunks(n) * out;
  if (!sum) {
    if (relu && n) {
      k_relu_bwd<<<grid_for((size_t)n * out), TPB, 0, ctx.stream>>>(y, dy, (size_t)n * out, dy);
      launched(what);
    }
    return;
  }
  if (n == 0) {
    (void)ok_cuda(cudaMemsetAsync(sum, 0, (size_t)out * sizeof(float), ctx.stream), "cudaMemsetAsync (column sums)");
    return;
  }
  float *part = (float *)scratch(parts * sizeof(float));
  if (!part) return;
  k_col_part<<<grid_for(parts), TPB, 0, ctx.stream>>>(y, dy, x, n, out, relu, part);
  launched(what);
  k_col_fin<<<grid_for(out), TPB, 0, ctx.stream>>>(part, col_chunks(n), out, sum);
  launched(what);
}

static __global__ void k_linear1_dx(const float *dy, uint32_t n, uint32_t in, const float *w,
                                    float *dx, int accumulate) {
  size_t t = gtid();
  if (t >= (size_t)n * in) return;
  size_t i = t / in, k = t % in;
  float v = dy[i] * w[k];
  dx[t] = accumulate ? dx[t] + v : v;
}

static __global__ void k_relu_fwd(const float *x, size_t len, float *y);
static __global__ void k_relu_bwd(const float *y, const float *dy, size_t len, float *dx);

void nn_cuda_linear_fwd(const float *x, uint32_t n, uint32_t in, uint32_t out, const float *w,
                        const float *b, nn_act_t act, float *y) {
  if (n == 0 || out == 0) return;
  if (in == 0) {
    (void)ok_cuda(cudaMemsetAsync(y, 0, (size_t)n * out * sizeof(float), ctx.stream),
                  "cudaMemsetAsync (nn_cuda_linear_fwd)");
  } else if (out == 1) {
    k_dot8_rows<<<grid_for(n), TPB, 0, ctx.stream>>>(x, n, in, w, y);
    launched("nn_cuda_linear_fwd (dot8)");
  } else {
    cublasHandle_t h = blas();
    const float one = 1.0f, zero = 0.0f;
    if (h)
      (void)ok_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n, (int)in, &one, w,
                                (int)in, x, (int)in, &zero, y, (int)out),
                    "cublasSgemm (nn_cuda_linear_fwd)");
  }
  if (b || act != NN_ACT_NONE) {
    k_bias_act<<<grid_for((size_t)n * out), TPB, 0, ctx.stream>>>(y, b, n, out, act == NN_ACT_RELU);
    launched("nn_cuda_linear_fwd (bias/act)");
  }
}

void nn_cuda_linear_bwd(const float *x, const float *y, float *dy, uint32_t n, uint32_t in,
                        uint32_t out, const float *w, nn_act_t act, float *dw, float *db,
                        float *dx, int dx_accumulate) {
  if (out == 0) return;
  if (db || (act == NN_ACT_RELU && n > 0))
    col_sums(y, dy, NULL, n, out, act == NN_ACT_RELU, db, "nn_cuda_linear_bwd (act/bias)");
  if (in == 0) return;
  if (n == 0) {
    (void)ok_cuda(cudaMemsetAsync(dw, 0, (size_t)out * in * sizeof(float), ctx.stream),
                  "cudaMemsetAsync (nn_cuda_linear_bwd)");
    return;
  }
  if (out == 1) {
    col_sums(NULL, dy, x, n, in, 0, dw, "nn_cuda_linear_bwd (dw)");
    if (dx) {
      k_linear1_dx<<<grid_for((size_t)n * in), TPB, 0, ctx.stream>>>(dy, n, in, w, dx, dx_accumulate);
      launched("nn_cuda_linear_bwd (dx)");
    }
    return;
  }
  cublasHandle_t h = blas();
  if (!h) return;
  const float one = 1.0f, zero = 0.0f;
  (void)ok_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)in, (int)out, (int)n, &one, x,
                            (int)in, dy, (int)out, &zero, dw, (int)in),
                "cublasSgemm (nn_cuda_linear_bwd dW)");
  if (dx)
    (void)ok_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)in, (int)n, (int)out, &one, w,
                              (int)in, dy, (int)out, dx_accumulate ? &one : &zero, dx, (int)in),
                  "cublasSgemm (nn_cuda_linear_bwd dx)");
}

/* ------------------------------------------------------------ element-wise */

static __global__ void k_relu_fwd(const float *x, size_t len, float *y) {
  size_t i = gtid();
  if (i >= len) return;
  y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static __global__ void k_relu_bwd(const float *y, const float *dy, size_t len, float *dx) {
  size_t i = gtid();
  if (i >= len) return;
  dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static __global__ void k_sigmoid_fwd(const float *x, size_t len, float *y) {
  size_t i = gtid();
  if (i >= len) return;
  y[i] = sigmoidf_stable(x[i]);
}

static __global__ void k_sigmoid_bwd(const float *y, const float *dy, size_t len, float *dx) {
  size_t i = gtid();
  if (i >= len) return;
  dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

void nn_cuda_relu_fwd(const float *x, size_t len, float *y) {
  if (len == 0) return;
  k_relu_fwd<<<grid_for(len), TPB, 0, ctx.stream>>>(x, len, y);
  launched("nn_cuda_relu_fwd");
}

void nn_cuda_relu_bwd(const float *y, const float *dy, size_t len, float *dx) {
  if (len == 0) return;
  k_relu_bwd<<<grid_for(len), TPB, 0, ctx.stream>>>(y, dy, len, dx);
  launched("nn_cuda_relu_bwd");
}

void nn_cuda_sigmoid_fwd(const float *x, size_t len, float *y) {
  if (len == 0) return;
  k_sigmoid_fwd<<<grid_for(len), TPB, 0, ctx.stream>>>(x, len, y);
  launched("nn_cuda_sigmoid_fwd");
}

void nn_cuda_sigmoid_bwd(const float *y, const float *dy, size_t len, float *dx) {
  if (len == 0) return;
  k_sigmoid_bwd<<<grid_for(len), TPB, 0, ctx.stream>>>(y, dy, len, dx);
  launched("nn_cuda_sigmoid_bwd");
}

/* ---------------------------------------------------------------- BCE */

/* Per sample: the loss (double, as nn.c's bce1) and, when dlogits is
 * given, scale * (sigmoid(z) - t). */
static __global__ void k_bce(const float *logits, const float *labels, uint32_t n, float scale,
                             float *dlogits, double *loss) {
  size_t i = gtid();
  if (i >= n) return;
  float z = logits[i], t = labels[i];
  double zd = z;
  loss[i] = (zd > 0.0 ? zd : 0.0) - zd * (double)t + log1p(exp(-fabs(zd)));
  if (dlogits) dlogits[i] = scale * (sigmoidf_stable(z) - t);
}

/* part[c] = sum of v[c*BCE_CHUNK ..] in order, one thread per chunk. */
static __global__ void k_sum_chunks(const double *v, uint32_t n, double *part) {
  size_t c = gtid(), lo = c * BCE_CHUNK;
  if (lo >= n) return;
  size_t hi = lo + BCE_CHUNK < n ? lo + BCE_CHUNK : n;
  double s = 0.0;
  for (size_t k = lo; k < hi; k++) s += v[k];
  part[c] = s;
}

static __global__ void k_sum_serial(const double *v, uint32_t n, double *out) {
  if (gtid() != 0) return;
  double s = 0.0;
  for (uint32_t k = 0; k < n; k++) s += v[k];
  *out = s;
}

static double bce(const float *logits, const float *labels, uint32_t n, float scale,
                  float *dlogits, const char *what) {
  if (n == 0) return 0.0;
  double *loss = (double *)scratch(scratch_for(n));
  if (!loss) return NAN;
  uint32_t chunks = (uint32_t)(((size_t)n + BCE_CHUNK - 1) / BCE_CHUNK);
  double *part = loss + n, *total = part + chunks, host = NAN;
  k_bce<<<grid_for(n), TPB, 0, ctx.stream>>>(logits, labels, n, scale, dlogits, loss);
  launched(what);
  k_sum_chunks<<<grid_for(chunks), TPB, 0, ctx.stream>>>(loss, n, part);
  launched(what);
  k_sum_serial<<<1, 1, 0, ctx.stream>>>(part, chunks, total);
  launched(what);
  if (!ok_cuda(cudaMemcpyAsync(&host, total, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream),
               "cudaMemcpyAsync (BCE loss)") ||
      !ok_cuda(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize (BCE loss)"))
    return NAN;
  return host;
}

double nn_cuda_bce_logits_fwd(const float *logits, const float *labels, uint32_t n) {
  return bce(logits, labels, n, 0.0f, NULL, "nn_cuda_bce_logits_fwd");
}

double nn_cuda_bce_logits_bwd(const float *logits, const float *labels, uint32_t n, float scale,
                              float *dlogits) {
  return bce(logits, labels, n, scale, dlogits, "nn_cuda_bce_logits_bwd");
}

/* ------------------------------------------------------------ concatenation */

void nn_cuda_concat_fwd(uint32_t n, uint32_t n_pieces, const float *const *src,
                        const size_t *src_stride, const uint32_t *width, float *dst,
                        size_t dst_stride) {
  size_t off = 0;
  for (uint32_t p = 0; p < n_pieces; p++) {
    if (n && width[p])
      (void)ok_cuda(cudaMemcpy2DAsync(dst + off, dst_stride * sizeof(float), src[p],
                                      src_stride[p] * sizeof(float), width[p] * sizeof(float), n,
                                      cudaMemcpyDeviceToDevice, ctx.stream),
                    "cudaMemcpy2DAsync (nn_cuda_concat_fwd)");
    off += width[p];
  }
}

void nn_cuda_concat_bwd(uint32_t n, uint32_t n_pieces, const float *d_dst, size_t d_dst_stride,
                        const uint32_t *width, float *const *d_src, const size_t *d_src_stride,
                        int accumulate) {
  size_t off = 0;
  for (uint32_t p = 0; p < n_pieces; p++) {
    if (d_src[p] && n && width[p]) {
      if (accumulate) {
        k_add2d<<<grid_for((size_t)n * width[p]), TPB, 0, ctx.stream>>>(
            d_src[p], d_src_stride[p], d_dst + off, d_dst_stride, n, width[p]);
        launched("nn_cuda_concat_bwd");
      } else {
        (void)ok_cuda(cudaMemcpy2DAsync(d_src[p], d_src_stride[p] * sizeof(float), d_dst + off,
                                        d_dst_stride * sizeof(float), width[p] * sizeof(float), n,
                                        cudaMemcpyDeviceToDevice, ctx.stream),
                      "cudaMemcpy2DAsync (nn_cuda_concat_bwd)");
      }
    }
    off += width[p];
  }
}

/* ------------------------------------------------------- dot interaction */

/* Vector k of sample i: the bottom output first when there is one. */
static __device__ __forceinline__ const float *ivec(const float *bottom, size_t bottom_stride,
                                                    const float *emb, size_t emb_stride,
                                                    uint32_t dim, size_t i, uint32_t k) {
  if (bottom) {
    if (k == 0) return bottom + i * bottom_stride;
    k--;
  }
  return emb + i * emb_stride + (size_t)k * dim;
}

/* Pair p of the strict lower triangle in DLRM order -> (a, b), b < a,
 * p = a (a - 1) / 2 + b. */
static __device__ __forceinline__ void tril_pair(uint64_t p, uint32_t *a, uint32_t *b) {
  uint64_t r = (uint64_t)((1.0 + sqrt(1.0 + 8.0 * (double)p)) * 0.5);
  while (r * (r - 1) / 2 > p) r--;
  while ((r + 1) * r / 2 <= p) r++;
  *a = (uint32_t)r;
  *b = (uint32_t)(p - r * (r - 1) / 2);
}

/* One thread per output element: the bottom copy, or one dot product
 * summed over d ascending (nn.c's tril_dots, lane for lane). */
static __global__ void k_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                                      size_t emb_stride, uint32_t n, uint32_t dim, uint32_t width,
                                      float *out, size_t out_stride) {
  size_t t = gtid();
  if (t >= (size_t)n * width) return;
  size_t i = t / width;
  uint32_t c = (uint32_t)(t % width), lead = bottom ? dim : 0;
  float *o = out + i * out_stride;
  if (c < lead) {
    o[c] = bottom[i * bottom_stride + c];
    return;
  }
  uint32_t a, b;
  tril_pair(c - lead, &a, &b);
  const float *va = ivec(bottom, bottom_stride, emb, emb_stride, dim, i, a);
  const float *vb = ivec(bottom, bottom_stride, emb, emb_stride, dim, i, b);
  float acc = 0.0f;
  for (uint32_t d = 0; d < dim; d++) acc += va[d] * vb[d];
  o[c] = acc;
}

/* One thread per (sample, vector a, column d): dv_a[d] = sum over b != a,
 * b ascending, of dz(a, b) * v_b[d] (nn.c's tril_dots_bwd order); the
 * bottom vector's gradient also gets the pass-through d_out[0 .. dim). */
static __global__ void k_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                                      size_t emb_stride, uint32_t n, uint32_t f, uint32_t dim,
                                      const float *d_out, size_t out_stride, float *d_bottom,
                                      float *d_emb, size_t d_emb_stride) {
  size_t t = gtid();
  if (t >= (size_t)n * f * dim) return;
  size_t i = t / ((size_t)f * dim);
  uint32_t a = (uint32_t)(t / dim % f), d = (uint32_t)(t % dim);
  const float *gi = d_out + i * out_stride;
  const float *dz = gi + (bottom ? dim : 0);
  if (bottom && a == 0 && !d_bottom) return;
  float acc = 0.0f;
  for (uint32_t b = 0; b < f; b++) {
    if (b == a) continue;
    uint64_t hi = a > b ? a : b, lo = a > b ? b : a;
    acc += dz[hi * (hi - 1) / 2 + lo] * ivec(bottom, bottom_stride, emb, emb_stride, dim, i, b)[d];
  }
  if (bottom && a == 0)
    d_bottom[i * bottom_stride + d] = gi[d] + acc;
  else
    d_emb[i * d_emb_stride + (size_t)(a - (bottom ? 1 : 0)) * dim + d] = acc;
}

void nn_cuda_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                          size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim, float *out,
                          size_t out_stride) {
  uint32_t width = nn_interact_out_width(n_emb, dim, bottom != NULL);
  if (n == 0 || width == 0) return;
  k_interact_fwd<<<grid_for((size_t)n * width), TPB, 0, ctx.stream>>>(
      bottom, bottom_stride, emb, emb_stride, n, dim, width, out, out_stride);
  launched("nn_cuda_interact_fwd");
}

void nn_cuda_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                          size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                          const float *d_out, size_t out_stride, float *d_bottom, float *d_emb,
                          size_t d_emb_stride) {
  uint32_t f = n_emb + (bottom ? 1 : 0);
  if (n == 0 || f == 0 || dim == 0) return;
  k_interact_bwd<<<grid_for((size_t)n * f * dim), TPB, 0, ctx.stream>>>(
      bottom, bottom_stride, emb, emb_stride, n, f, dim, d_out, out_stride, d_bottom, d_emb,
      d_emb_stride);
  launched("nn_cuda_interact_bwd");
}

/* ---------------------------------------------------------------- FM */

/* One thread per sample: per column the sum and the sum of squares over
 * the vectors in t order, then the columns added in d order. */
static __global__ void k_fm_fwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
                                uint32_t dim, float *out) {
  size_t i = gtid();
  if (i >= n) return;
  const float *e = emb + i * emb_stride;
  float r = 0.0f;
  for (uint32_t d = 0; d < dim; d++) {
    float s = 0.0f, q = 0.0f;
    for (uint32_t t = 0; t < n_emb; t++) {
      float v = e[(size_t)t * dim + d];
      s += v;
      q += v * v;
    }
    r += s * s - q;
  }
  out[i] = 0.5f * r;
}

/* One thread per (sample, column). */
static __global__ void k_fm_bwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
                                uint32_t dim, const float *d_out, float *d_emb,
                                size_t d_emb_stride, int accumulate) {
  size_t t = gtid();
  if (t >= (size_t)n * dim) return;
  size_t i = t / dim, d = t % dim;
  const float *e = emb + i * emb_stride;
  float *de = d_emb + i * d_emb_stride;
  float g = d_out[i], s = 0.0f;
  for (uint32_t k = 0; k < n_emb; k++) s += e[(size_t)k * dim + d];
  for (uint32_t k = 0; k < n_emb; k++) {
    size_t o = (size_t)k * dim + d;
    float v = g * (s - e[o]);
    de[o] = accumulate ? de[o] + v : v;
  }
}

void nn_cuda_fm_fwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                    float *out) {
  if (n == 0) return;
  k_fm_fwd<<<grid_for(n), TPB, 0, ctx.stream>>>(emb, emb_stride, n, n_emb, dim, out);
  launched("nn_cuda_fm_fwd");
}

void nn_cuda_fm_bwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                    const float *d_out, float *d_emb, size_t d_emb_stride, int accumulate) {
  if (n == 0 || dim == 0) return;
  k_fm_bwd<<<grid_for((size_t)n * dim), TPB, 0, ctx.stream>>>(emb, emb_stride, n, n_emb, dim,
                                                               d_out, d_emb, d_emb_stride,
                                                               accumulate);
  launched("nn_cuda_fm_bwd");
}

/* ------------------------------------------------------------- cross layer */

/* y = x0 * s + b + x, one thread per element */
static __global__ void k_cross_y(const float *x0, const float *x, uint32_t n, uint32_t d,
                                 const float *b, const float *s, float *y) {
  size_t t = gtid();
  if (t >= (size_t)n * d) return;
  size_t i = t / d, j = t % d;
  y[t] = x0[t] * s[i] + b[j] + x[t];
}

/* One thread per column: db[j] = sum_i dy[i][j], dw[j] = sum_i ds[i] x[i][j],
 * i ascending. */
static __global__ void k_cross_cols(const float *x, const float *dy, const float *ds, uint32_t n,
                                    uint32_t d, float *dw, float *db) {
  size_t j = gtid();
  if (j >= d) return;
  float sw = 0.0f, sb = 0.0f;
  for (size_t i = 0; i < n; i++) {
    sb += dy[i * d + j];
    sw += ds[i] * x[i * d + j];
  }
  dw[j] = sw;
  db[j] = sb;
}

/* dx0 += dy * s, dx = dy + ds * w (dx may be dy: read, then write) */
static __global__ void k_cross_dx(const float *dy, const float *ds, const float *s,
                                  const float *w, uint32_t n, uint32_t d, float *dx, float *dx0) {
  size_t t = gtid();
  if (t >= (size_t)n * d) return;
  size_t i = t / d, j = t % d;
  float g = dy[t];
  dx0[t] += g * s[i];
  dx[t] = g + ds[i] * w[j];
}

static __global__ void k_add(float *dst, const float *src, size_t len) {
  size_t t = gtid();
  if (t < len) dst[t] += src[t];
}

void nn_cuda_cross_fwd(const float *x0, const float *x, uint32_t n, uint32_t d, const float *w,
                       const float *b, float *s, float *y) {
  if (n == 0) return;
  k_dot8_rows<<<grid_for(n), TPB, 0, ctx.stream>>>(x, n, d, w, s);
  launched("nn_cuda_cross_fwd (dot)");
  if (d == 0) return;
  k_cross_y<<<grid_for((size_t)n * d), TPB, 0, ctx.stream>>>(x0, x, n, d, b, s, y);
  launched("nn_cuda_cross_fwd");
}

void nn_cuda_cross_bwd(const float *x0, const float *x, const float *s, uint32_t n, uint32_t d,
                       const float *w, const float *dy, float *dw, float *db, float *dx,
                       float *dx0) {
  if (d == 0) return;
  float *ds = n ? (float *)scratch((size_t)n * sizeof(float)) : NULL;
  if (n && !ds) return;
  if (n) {
    k_dot8_pairs<<<grid_for(n), TPB, 0, ctx.stream>>>(dy, x0, n, d, ds);
    launched("nn_cuda_cross_bwd (dot)");
  }
  /* the column sums read dy before k_cross_dx overwrites it (dx may be dy) */
  k_cross_cols<<<grid_for(d), TPB, 0, ctx.stream>>>(x, dy, ds, n, d, dw, db);
  launched("nn_cuda_cross_bwd (dw, db)");
  if (n == 0) return;
  k_cross_dx<<<grid_for((size_t)n * d), TPB, 0, ctx.stream>>>(dy, ds, s, w, n, d, dx, dx0);
  launched("nn_cuda_cross_bwd (dx)");
}

void nn_cuda_cross_stack_fwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                             const float *const *w, const float *const *b, float *const *s,
                             float *const *xl) {
  for (uint32_t l = 0; l < L; l++)
    nn_cuda_cross_fwd(x0, l ? xl[l] : x0, n, d, w[l], b[l], s[l], xl[l + 1]);
}

void nn_cuda_cross_stack_bwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                             const float *const *w, const float *const *xl,
                             const float *const *s, float *dy, float *const *dw,
                             float *const *db, float *dx0) {
  for (uint32_t l = L; l-- > 0;)
    nn_cuda_cross_bwd(x0, l ? xl[l] : x0, s[l], n, d, w[l], dy, dw[l], db[l], dy, dx0);
  size_t len = (size_t)n * d;
  if (len == 0) return;
  k_add<<<grid_for(len), TPB, 0, ctx.stream>>>(dx0, dy, len);
  launched("nn_cuda_cross_stack_bwd");
}

/* ------------------------------------------------------ DCNv2 cross layer */

/* y = x0 * z + x, one thread per element (nn.c's (x0*z) + x) */
static __global__ void k_cross2_y(const float *x0, const float *z, const float *x, size_t len, float *y) {
  size_t t = gtid();
  if (t >= len) return;
  y[t] = x0[t] * z[t] + x[t];
}

/* dz = g * x0; dx0 += g * z */
static __global__ void k_cross2_g(const float *g, const float *x0, const float *z, size_t len, float *dz,
                                  float *dx0) {
  size_t t = gtid();
  if (t >= len) return;
  float gv = g[t];
  dz[t] = gv * x0[t];
  dx0[t] += gv * z[t];
}

void nn_cuda_cross2_fwd(const float *x0, const float *x, uint32_t n, uint32_t d, uint32_t r,
                        const float *w, const float *v, const float *b, float *t, float *z,
                        float *y) {
  size_t len = (size_t)n * d;
  if (len == 0) return;
  if (r) {
    nn_cuda_linear_fwd(x, n, d, r, v, NULL, NN_ACT_NONE, t);
    nn_cuda_linear_fwd(t, n, r, d, w, b, NN_ACT_NONE, z);
  } else {
    nn_cuda_linear_fwd(x, n, d, d, w, b, NN_ACT_NONE, z);
  }
  k_cross2_y<<<grid_for(len), TPB, 0, ctx.stream>>>(x0, z, x, len, y);
  launched("nn_cuda_cross2_fwd");
}

void nn_cuda_cross2_bwd(const float *x0, const float *x, const float *t, const float *z,
                        uint32_t n, uint32_t d, uint32_t r, const float *w, const float *v,
                        float *g, float *dz, float *dt, float *dw, float *dv, float *db,
                        float *dx0) {
  size_t len = (size_t)n * d;
  if (len) {
    k_cross2_g<<<grid_for(len), TPB, 0, ctx.stream>>>(g, x0, z, len, dz, dx0);
    launched("nn_cuda_cross2_bwd");
  }
  if (r) {
    nn_cuda_linear_bwd(t, z, dz, n, r, d, w, NN_ACT_NONE, dw, db, dt, 0);
    nn_cuda_linear_bwd(x, t, dt, n, d, r, v, NN_ACT_NONE, dv, NULL, g, 1);
  } else {
    nn_cuda_linear_bwd(x, z, dz, n, d, d, w, NN_ACT_NONE, dw, db, g, 1);
  }
}
