/*
 * opt_cuda: the dense optimizer of opt.h on the GPU (opt.cu), the device
 * twin of opt_step (opt.c): same name with the _cuda prefix, same
 * arguments, plus the DEVICE array that holds the state on the GPU.
 *
 * Bit-identical to opt_step on the same inputs: one thread per element
 * does opt.c's float operations in opt.c's order with IEEE rounding
 * (__fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn, which are never fused
 * into an FMA and are IEEE whatever nvcc's -prec-div / -prec-sqrt /
 * --use_fast_math say), and Adam's bias corrections come from the host
 * (opt_adam_bias, the same function opt_step calls, in double there).
 *
 * Plain C (no CUDA types), so C code includes it in any build; the
 * function exists only when the build has CUDA (CHANTER_CUDA).
 */
#ifndef CHANTER_OPT_CUDA_H
#define CHANTER_OPT_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "opt.h"

/* Threads per block of the step's one launch (grid-stride beyond
 * OPT_CUDA_MAX_BLOCKS blocks); the tests use sizes around it. */
#define OPT_CUDA_BLOCK 256
#define OPT_CUDA_MAX_BLOCKS 4096

/* As opt_step: params -= update(grads) over the n parameters of o, and
 * o's step count advances (on the host: opt_steps(o) is the truth).
 * params, grads and state are DEVICE arrays; state holds
 * opt_state_floats(o) floats in opt_state's layout (adagrad h[n]; adam
 * m[n] then v[n]; NULL for sgd) -- the caller keeps it and copies it
 * to / from opt_state(o) when the host needs it.  One kernel launch on
 * the calling thread's nn_cuda stream (nn_cuda_stream()); does not wait.
 * 0, or ERR_CUDA when the launch failed (also recorded in the thread's
 * nn_cuda_error).  The thread that drives the model. */
int opt_cuda_step(opt_t *o, float *params, const float *grads, float *state);

#ifdef __cplusplus
}
#endif

#endif
