/*
 * opt.cu: the dense optimizers of opt.c on the GPU (contract in
 * opt_cuda.h).  One kernel per rule, one thread per element over a
 * grid-stride loop, each thread doing exactly opt.c's loop body:
 *
 *   sgd:     w = w - lr*g
 *   adagrad: h = h + g*g;  w = w - (lr*g) / (sqrt(h) + eps)
 *   adam:    m = b1*m + c1*g;  v = b2*v + c2*(g*g);
 *            w = w - (lr_t*m) / (sqrt(v) + eps_t)
 *
 * with c1 = 1-b1, c2 = 1-b2 and every operation a single IEEE float
 * operation written as an _rn intrinsic, so no flag can contract or
 * approximate it (opt.c is C11 without -ffp-contract: no FMA either).
 * The h, m, v that the update reads are the freshly stored floats, as in
 * opt.c.  lr_t / eps_t come from opt_adam_bias on the host, once a step.
 */
#include <cuda_runtime.h>

#include <stdint.h>

#include "nn_cuda.h"
#include "opt_cuda.h"

extern "C" { /* a C header without its own extern "C" */
#include "err.h"
}

static __global__ void k_sgd(float *w, const float *g, size_t n, float lr) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, g[i]));
}

static __global__ void k_adagrad(float *w, float *h, const float *g, size_t n, float lr, float eps) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i];
    float hi = __fadd_rn(h[i], __fmul_rn(gi, gi));
    h[i] = hi;
    w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, gi), __fadd_rn(__fsqrt_rn(hi), eps)));
  }
}

static __global__ void k_adam(float *w, float *m, float *v, const float *g, size_t n, float b1, float b2, float c1,
                              float c2, float lr_t, float eps_t) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i];
    float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(c1, gi));
    float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(c2, __fmul_rn(gi, gi)));
    m[i] = mi;
    v[i] = vi;
    w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr_t, mi), __fadd_rn(__fsqrt_rn(vi), eps_t)));
  }
}

/* ceil(n / OPT_CUDA_BLOCK) blocks, at most OPT_CUDA_MAX_BLOCKS (the loop
 * strides over the rest) */
static unsigned grid_for(size_t n) {
  size_t b = (n + OPT_CUDA_BLOCK - 1) / OPT_CUDA_BLOCK;
  return (unsigned)(b < OPT_CUDA_MAX_BLOCKS ? b : OPT_CUDA_MAX_BLOCKS);
}

int opt_cuda_step(opt_t *o, float *params, const float *grads, float *state) {
  opt_set_steps(o, opt_steps(o) + 1); /* as opt_step: the step about to run is number opt_steps(o) */
  size_t n = opt_n_params(o);
  if (n == 0) return 0;
  const opt_hparams_t *hp = opt_hparams(o);
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  unsigned grid = grid_for(n);
  switch (opt_kind(o)) {
    case OPT_SGD:
      k_sgd<<<grid, OPT_CUDA_BLOCK, 0, st>>>(params, grads, n, hp->lr);
      break;
    case OPT_ADAGRAD:
      k_adagrad<<<grid, OPT_CUDA_BLOCK, 0, st>>>(params, state, grads, n, hp->lr, hp->eps);
      break;
    case OPT_ADAM: {
      float lr_t, eps_t;
      opt_adam_bias(hp, opt_steps(o), &lr_t, &eps_t);
      /* opt.c's c1, c2: float subtractions, done here once on the host */
      float c1 = 1.0f - hp->beta1, c2 = 1.0f - hp->beta2;
      k_adam<<<grid, OPT_CUDA_BLOCK, 0, st>>>(params, state, state + n, grads, n, hp->beta1, hp->beta2, c1, c2, lr_t,
                                              eps_t);
      break;
    }
    default:
      ASSERT(!"bad dense optimizer");
  }
  return nn_cuda__ok((int)cudaGetLastError(), "opt_cuda_step (kernel launch)") ? 0 : ERR_CUDA;
}
