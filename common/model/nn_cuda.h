/*
 * nn_cuda: the CUDA mirror of nn.h (nn.cu, its embedding bag in
 * nn_embedding_bag.cu) and of model.h (model.cu).
 *
 * Every nn_<layer> of nn.h has an nn_cuda_<layer> here with the SAME
 * argument order and meaning; only the memory differs: every float /
 * uint64_t data pointer is a DEVICE pointer.  The small per-piece
 * descriptor arrays of concat and of the cross stack (src[], width[],
 * stride[], w[], b[], s[], xl[], dw[], db[]) are HOST arrays, holding
 * device pointers where they hold pointers.  The model driver likewise
 * mirrors model.h as model_cuda_* over device pointers.
 *
 * Plain C (no CUDA types), so C code includes it in any build; the
 * functions exist only when the build has CUDA (CHANTER_CUDA): check
 * cuda_check() (cuda_check.h) before calling any of them.
 *
 * Execution.  A function enqueues its work on the calling thread's stream
 * (nn_cuda_set_stream; default the legacy default stream) and returns
 * without waiting, except the ones that hand a value back to the host
 * (the BCE losses, nn_cuda_embedding_bag_bwd's count, model_cuda_backward),
 * which wait for the stream.  Each host thread gets its own cuBLAS handle
 * and scratch on first use (nn_cuda_release frees them); one thread drives
 * a given set of buffers at a time, as with nn.h.
 *
 * Errors.  The layer functions return what their nn.h twins return, so a
 * CUDA or cuBLAS failure is recorded per thread instead (the first one
 * wins; a GEMM with no cuBLAS handle is skipped) and nn_cuda_error()
 * reports and clears it: check it after a step.  Kernel faults surface
 * asynchronously, at the next synchronizing call.
 *
 * Determinism and agreement with the CPU (nn.c):
 *  - run to run on one GPU model: every result is bit-identical (fixed
 *    launch shapes, no atomics, no cross-thread reductions in our kernels,
 *    a stable sort; cuBLAS is deterministic for a given toolkit, GPU
 *    architecture and SM count while a handle serves one stream at a
 *    time, which a per-thread handle gives);
 *  - against the CPU: the build uses --fmad=false (no FMA contraction,
 *    like -std=c11) and each thread adds its terms in nn.c's order, so
 *    these are bit-identical to nn.c on the same inputs (up to the sign
 *    of an exact zero): ReLU, sigmoid's backward, concat/split, the
 *    bias/ReLU epilogue of linear, the linear layer's forward and dx when
 *    out == 1 (nn.c's 8-lane dot product is reproduced), and its column
 *    sums over the samples (db; dw when out == 1) up to 64 samples: past
 *    that they add chunks of 64 rows, then the chunks, in parallel (one
 *    serial thread per column was 90% of the step at batch 16384), so they
 *    agree with nn.c within rounding, embedding bag
 *    forward and coalesced backward, interaction, FM, cross and cross
 *    stack;
 *  - these differ from nn.c in the last bits: the DCNv2 cross layer
 *    (cross2: its GEMMs; its element-wise parts are nn.c's), linear layers with out > 1
 *    (cuBLAS sums in its own order), sigmoid's forward and BCE's gradient
 *    (CUDA's expf, within 2 ulp of glibc's), and the BCE loss (CUDA's
 *    exp/log1p; the sum is taken per chunk of 256 samples, then over the
 *    chunks, where the CPU adds sample after sample).  The model driver
 *    runs a batch whole where model.c cuts it into MODEL_PARTS parts and
 *    adds their gradients, so model gradients differ in the last bits too.
 */
#ifndef CHANTER_NN_CUDA_H
#define CHANTER_NN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "model.h"
#include "nn.h"

/* ---- per-thread context */
/* Work of this thread goes to stream (a cudaStream_t; NULL = the legacy
 * default stream) from now on. */
void nn_cuda_set_stream(void *stream);
void *nn_cuda_stream(void);
/* Grows this thread's device scratch so that calls over up to max_n
 * samples allocate nothing (the BCE partial sums, the cross layer's
 * per-sample dot products); also creates the cuBLAS handle.  A model
 * calls it at create time.  0 or ERR_CUDA. */
int nn_cuda_reserve(uint32_t max_n);
/* 0 when nothing failed since the last call; else ERR_CUDA with the first
 * failure in err (which call, the library's message), then forgets it.
 * (Every launch is checked when it is made, so nothing is pending.) */
int nn_cuda_error(char *err, size_t err_len);
/* Destroys this thread's cuBLAS handle and frees its scratch (waits for
 * its stream first).  The next call creates them again. */
void nn_cuda_release(void);
/* Internal, for model.cu: records a failed CUDA runtime call (a
 * cudaError_t as int) made by `what` in this thread's sticky error.
 * Returns 1 when status is success, else 0. */
int nn_cuda__ok(int cuda_status, const char *what);

/* ---- layers: see nn.h for each one's contract */
void nn_cuda_linear_fwd(const float *x, uint32_t n, uint32_t in, uint32_t out,
                        const float *w, const float *b, nn_act_t act, float *y);
void nn_cuda_linear_bwd(const float *x, const float *y, float *dy, uint32_t n,
                        uint32_t in, uint32_t out, const float *w, nn_act_t act,
                        float *dw, float *db, float *dx, int dx_accumulate);

void nn_cuda_relu_fwd(const float *x, size_t len, float *y);
void nn_cuda_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
void nn_cuda_sigmoid_fwd(const float *x, size_t len, float *y);
void nn_cuda_sigmoid_bwd(const float *y, const float *dy, size_t len, float *dx);

/* The sum is reduced on the device and returned to the host (waits);
 * NaN when a CUDA call failed. */
double nn_cuda_bce_logits_fwd(const float *logits, const float *labels, uint32_t n);
double nn_cuda_bce_logits_bwd(const float *logits, const float *labels, uint32_t n,
                              float scale, float *dlogits);

void nn_cuda_concat_fwd(uint32_t n, uint32_t n_pieces, const float *const *src,
                        const size_t *src_stride, const uint32_t *width, float *dst,
                        size_t dst_stride);
void nn_cuda_concat_bwd(uint32_t n, uint32_t n_pieces, const float *d_dst,
                        size_t d_dst_stride, const uint32_t *width, float *const *d_src,
                        const size_t *d_src_stride, int accumulate);

void nn_cuda_embedding_bag_fwd(const float *base, size_t row_stride,
                               const uint64_t *idx, uint32_t n, uint32_t hotness,
                               uint32_t dim, float *out, size_t out_stride);
/* Bytes of DEVICE workspace nn_cuda_embedding_bag_bwd needs for n * hotness
 * ids (the sort's buffers and CUB's temporary storage); 0 when CUB cannot
 * size it (no device: see nn_cuda_error). */
size_t nn_cuda_embedding_bag_bwd_work_size(uint32_t n, uint32_t hotness);
/* As nn_embedding_bag_bwd: ids sorted ascending on the device by a stable
 * radix sort (CUB), so equal ids keep sample order, then one thread per
 * (unique id, column) adds that id's rows in sample order.  uniq, grad
 * and work are device memory; the count comes back to the host (waits).
 * n * hotness must be below 2^32. */
uint32_t nn_cuda_embedding_bag_bwd(const float *d_out, size_t d_out_stride,
                                   const uint64_t *idx, uint32_t n, uint32_t hotness,
                                   uint32_t dim, uint64_t *uniq, float *grad,
                                   size_t grad_stride, void *work);

/* No shape limit of its own (nn_interact_fits is the CPU's stack limit);
 * nn_interact_out_width gives the width as for the CPU. */
void nn_cuda_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                          size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                          float *out, size_t out_stride);
void nn_cuda_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                          size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                          const float *d_out, size_t out_stride, float *d_bottom,
                          float *d_emb, size_t d_emb_stride);

void nn_cuda_fm_fwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
                    uint32_t dim, float *out);
void nn_cuda_fm_bwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
                    uint32_t dim, const float *d_out, float *d_emb,
                    size_t d_emb_stride, int accumulate);

void nn_cuda_cross_fwd(const float *x0, const float *x, uint32_t n, uint32_t d,
                       const float *w, const float *b, float *s, float *y);
void nn_cuda_cross_bwd(const float *x0, const float *x, const float *s, uint32_t n,
                       uint32_t d, const float *w, const float *dy, float *dw,
                       float *db, float *dx, float *dx0);
void nn_cuda_cross_stack_fwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                             const float *const *w, const float *const *b,
                             float *const *s, float *const *xl);
void nn_cuda_cross_stack_bwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                             const float *const *w, const float *const *xl,
                             const float *const *s, float *dy, float *const *dw,
                             float *const *db, float *dx0);

void nn_cuda_cross2_fwd(const float *x0, const float *x, uint32_t n, uint32_t d, uint32_t r,
                        const float *w, const float *v, const float *b, float *t, float *z,
                        float *y);
void nn_cuda_cross2_bwd(const float *x0, const float *x, const float *t, const float *z,
                        uint32_t n, uint32_t d, uint32_t r, const float *w, const float *v,
                        float *g, float *dz, float *dt, float *dw, float *dv, float *db,
                        float *dx0);

/* ---- the model driver (model.cu): model.h over device memory, all
 * five models.  Same planning, parameter layout (one contiguous cudaMalloc
 * for the parameters, one for the gradients), initialization and
 * description as model_create / model_init, so a CUDA model and a CPU
 * model of the same config and seed start from identical parameters.
 * There are no parts and no threads: a batch runs whole on the stream. */
typedef struct model_cuda_s model_cuda_t;

/* As model_create, plus ERR_NOGPU (cuda_check's sentence in err)
 * when no device is usable and ERR_CUDA when a cudaMalloc fails. */
int model_cuda_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables,
                      uint32_t dim, uint32_t max_batch, model_cuda_t **out, char *err,
                      size_t err_len);
void model_cuda_destroy(model_cuda_t *m);
/* As model_init (bit-identical parameters): computed on the host and
 * copied to the device (waits); zeroes the gradients. */
void model_cuda_init(model_cuda_t *m, uint64_t seed);
model_kind_t model_cuda_kind(const model_cuda_t *m);
size_t model_cuda_n_params(const model_cuda_t *m);
/* DEVICE arrays of model_cuda_n_params floats, owned by the model. */
float *model_cuda_params(model_cuda_t *m);
float *model_cuda_grads(model_cuda_t *m);
uint32_t model_cuda_max_batch(const model_cuda_t *m);
const char *model_cuda_describe(const model_cuda_t *m);
/* As model_forward / model_backward; dense, emb, logits, labels and d_emb
 * are device pointers.  model_cuda_backward waits for the stream (it
 * returns the loss) and returns NaN when a CUDA call failed. */
void model_cuda_forward(model_cuda_t *m, uint32_t n, const float *dense, const float *emb,
                        float *logits);
double model_cuda_backward(model_cuda_t *m, uint32_t n, const float *labels, float scale,
                           float *d_emb);

#ifdef __cplusplus
}
#endif

#endif
