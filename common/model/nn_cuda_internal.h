/*
 * nn_cuda_internal.h: what nn.cu and nn_embedding_bag.cu share: the
 * calling thread's context (its stream, cuBLAS handle, scratch and sticky
 * error; see nn_cuda.h), the launch shape (TPB threads per block) and the
 * helpers every launch uses.  C++ (nvcc) only; nobody else includes it.
 */
#ifndef CHANTER_NN_CUDA_INTERNAL_H
#define CHANTER_NN_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stddef.h>

#include "cuda_check.h"

#define TPB 256

namespace nn_cuda__ {
typedef struct ctx_s {
  cublasHandle_t blas;
  cudaStream_t stream;
  void *scratch;
  size_t scratch_bytes;
  int failed;     /* 0 or ERR_CUDA: the first failure since nn_cuda_error */
  char msg[512];  /* its sentence */
} ctx_t;



/* This thread's context (defined in nn.cu). */
extern thread_local ctx_t ctx;
} // namespace nn_cuda__
using nn_cuda__::ctx;
using nn_cuda__::ctx_t;

/* 1 when st is success; else 0, the first failure recorded in ctx. */
static inline int ok_cuda(cudaError_t st, const char *what) {
  if (st == cudaSuccess) return 1;
  if (!ctx.failed) ctx.failed = cuda_check_error((int)st, what, ctx.msg, sizeof ctx.msg);
  return 0;
}


/* After a kernel launch: records a launch failure (bad configuration, no
 * device, a previous fault). */
static inline void launched(const char *what) { (void)ok_cuda(cudaGetLastError(), what); }


static inline unsigned grid_for(size_t total) { return (unsigned)((total + TPB - 1) / TPB); }

static __device__ __forceinline__ size_t gtid(void) {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

#endif
