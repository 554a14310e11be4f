/*
 * model_dev: one model handle whatever the device (the `device` key).
 *
 * device = cpu is model.h as is: the parameters, gradients and optimizer
 * state are host arrays, and every call below that moves data is a no-op.
 *
 * device = cuda is model.cu (model_cuda_*) and opt.cu (opt_cuda_step):
 * the dense parameters, their gradients and the dense optimizer's state
 * LIVE ON THE GPU between steps.  A step copies in only the batch (dense
 * features and labels through pinned staging, asynchronously on the
 * model's stream, nn_cuda_stream(); host pooled embeddings likewise) and
 * waits once, for the loss; the gradients stay on the device and
 * model_dev_opt_step updates the parameters there.  Host mirrors exist
 * (pinned, at fixed addresses for the model's life) and are filled only
 * when asked: model_dev_params / model_dev_grads copy device -> host when
 * the device is newer, model_dev_opt_sync does the same for the
 * optimizer state into opt_state(o).  A caller that WRITES a host mirror
 * tells the device: model_dev_params_changed, model_dev_grads_changed,
 * model_dev_opt_changed.
 *
 * The invariant: after any model_dev call returns, the host and device
 * views agree wherever a caller can observe them -- a host array returned
 * by model_dev_params / model_dev_grads (or opt_state(o) after
 * model_dev_opt_sync) holds the device's current values, and nothing in
 * flight on the stream reads or writes a host mirror (every copy to or
 * from one is waited for before the call returns).  A pointer kept from
 * an earlier call (trainer_ar keeps the gradients') is the same array but
 * may hold old values: call model_dev_grads again before reading through
 * it.  A write to a mirror not followed by its *_changed call is lost at
 * the next device step.  What the CPU tests prove about the arithmetic
 * carries over: the device optimizer is bit-identical to opt_step.
 *
 * One thread at a time (the copies and kernels go to the calling thread's
 * nn_cuda stream, so keep to one thread per model, or one stream).
 */
#ifndef CHANTER_MODEL_DEV_H
#define CHANTER_MODEL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"

typedef struct model_dev_s model_dev_t;
struct pool_s;

/* The model of cfg on cfg's device.  device = cuda without a usable GPU:
 * ERR_NOGPU with cuda_check's sentence in err. */
int model_dev_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim, uint32_t max_batch,
                model_dev_t **out, char *err, size_t err_len);
void model_dev_destroy(model_dev_t *m);
/* As model_init (bit-identical parameters on both devices); zeroes the
 * gradients. */
void model_dev_init(model_dev_t *m, uint64_t seed);
size_t model_dev_n_params(const model_dev_t *m);
/* Host arrays (model_dev_n_params floats, owned by m, the same address for
 * m's life): the parameters, and the gradients of the last
 * model_dev_backward (as left by model_dev_grads_changed /
 * model_dev_grads_zero since).  On CUDA each call first copies the
 * device's values over when they are newer (waits); a failed copy is
 * logged and recorded in the thread's nn_cuda_error, and the array keeps
 * its old values. */
float *model_dev_params(model_dev_t *m);
float *model_dev_grads(model_dev_t *m);
/* The copies those two make, with their outcome: 0 (also when there was
 * nothing to copy, and always on the CPU) or ERR_CUDA. */
int model_dev_params_to_host(model_dev_t *m);
int model_dev_grads_to_host(model_dev_t *m);
/* After writing model_dev_params (a broadcast, a restore): the device
 * takes the host values (waits).  0 or ERR_CUDA; nothing to do on the CPU. */
int model_dev_params_changed(model_dev_t *m);
/* After writing model_dev_grads (an all-reduce on host memory): the same
 * for the gradients.  0 or ERR_CUDA; nothing to do on the CPU. */
int model_dev_grads_changed(model_dev_t *m);
/* Gradients := 0 on both sides (a step with no samples).  0 or ERR_CUDA. */
int model_dev_grads_zero(model_dev_t *m);
/* ---- the dense optimizer on the model's device.  o is the job's dense
 * optimizer (opt.h: kind, hyper-parameters, step count, host state) for
 * model_dev_n_params parameters; one optimizer per model.
 * model_dev_opt_step: params -= update(grads), advancing opt_steps(o) (on
 * the host, which stays its truth); on the CPU opt_step_pool over the
 * model's threads; on CUDA opt_cuda_step over the device arrays,
 * bit-identical to opt_step, one launch, no wait.  There the state lives
 * on the device from the first step on (uploaded from opt_state(o) then),
 * so opt_state(o) goes stale: model_dev_opt_sync copies it back (before a
 * checkpoint or a digest reads it) and model_dev_opt_changed sends
 * opt_state(o) after the caller wrote it (a restore; opt_steps(o) needs
 * nothing: the host computes Adam's bias corrections from it each step).
 * Naming another optimizer than the last one drops the device copy of the
 * last one's state (sync it first).  0 or ERR_CUDA; the CPU's sync calls
 * are no-ops returning 0. */
struct opt_s;
int model_dev_opt_step(model_dev_t *m, struct opt_s *o);
int model_dev_opt_sync(model_dev_t *m, struct opt_s *o);
int model_dev_opt_changed(model_dev_t *m, struct opt_s *o);
/* device = cuda: the DEVICE arrays of the parameters and gradients
 * (model_dev_n_params floats).  A collective on device memory reads and
 * writes the gradients in place between model_dev_backward and
 * model_dev_opt_step, on the model's stream or ordered after it, and calls
 * nothing: the host mirror is then merely stale, which model_dev_grads
 * repairs (it copies from the device whenever a backward or an optimizer
 * step ran since its last copy; so do not read the host gradients between
 * the backward and such a collective).  NULL on the CPU. */
float *model_dev_params_dev(model_dev_t *m);
float *model_dev_grads_dev(model_dev_t *m);
const char *model_dev_describe(const model_dev_t *m);
/* Host threads for the embedding work that runs on the host (embag.h:
 * results independent of the thread count): device = cpu, the model's
 * own; device = cuda, a pool of the CPUs in the affinity mask (at most
 * 32) that only this work uses.  NULL when none could start (run
 * single-threaded).  Driven by the model's thread, while no model call
 * is running. */
struct pool_s *model_dev_pool(model_dev_t *m);
/* As model_forward / model_backward, host pointers -- except that on
 * device = cuda, emb may be model_dev_emb_dev(m) (already on the device: read in
 * place) and d_emb may be NULL (the input gradient stays in
 * model_dev_demb_dev(m)).  A caller that keeps its embedding rows on the
 * device uses both, so rows never cross to the host for a step.
 * On CUDA the inputs go through pinned staging on the model's stream;
 * model_dev_forward waits only when logits != NULL (the caller reads them
 * on return), so a training step passes NULL there and waits once, in
 * model_dev_backward, for the loss (and again for d_emb when it asks for
 * it); the logits stay on the device for model_dev_logits.  On the CPU
 * logits must not be NULL.  model_dev_backward: NaN when a CUDA call
 * failed. */
int model_dev_forward(model_dev_t *m, uint32_t n, const float *dense, const float *emb, float *logits);
double model_dev_backward(model_dev_t *m, uint32_t n, const float *labels, float scale, float *d_emb);
/* device = cuda: the n logits of the last model_dev_forward into logits
 * (waits).  0 or ERR_CUDA.  On the CPU nothing (the forward wrote them),
 * 0. */
int model_dev_logits(model_dev_t *m, uint32_t n, float *logits);
/* device = cuda: the model's DEVICE input (max_batch rows of n_tables * dim
 * floats) and input gradient; NULL on the CPU. */
float *model_dev_emb_dev(model_dev_t *m);
float *model_dev_demb_dev(model_dev_t *m);
/* device = cuda, for a caller that pools most tables on the device and
 * gets the others' pooled embeddings on the host (trainer_step's external
 * tables): table t's columns (dim floats at t * dim of each of n rows of
 * n_tables * dim) for every t with cols[t] != 0 -- host emb into the
 * device input (model_dev_emb_cols_in), the device input gradient of the
 * last model_dev_backward into host d_emb (model_dev_demb_cols_out).  The
 * other columns are left alone on both sides.  Waits for the copies.
 * 0 or ERR_CUDA; cols = NULL, n = 0 or the CPU (whose model reads and
 * writes the host arrays themselves): nothing to do, 0. */
int model_dev_emb_cols_in(model_dev_t *m, uint32_t n, const float *emb, const uint8_t *cols);
int model_dev_demb_cols_out(model_dev_t *m, uint32_t n, float *d_emb, const uint8_t *cols);
/* The CPU model (device = cpu: its threads, the backward's grad-ready
 * hook), or NULL. */
struct model_s *model_dev_cpu_model(model_dev_t *m);
int model_dev_is_cuda(const model_dev_t *m);

#endif
