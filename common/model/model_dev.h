/*
 * model_dev: one model handle whatever the device (the `device` key).
 *
 * device = cpu is model.h as is.  device = cuda is model.cu (model_cuda_*):
 * parameters and activations live on the GPU; this layer copies each
 * batch's dense features, pooled embeddings and labels to the device and
 * the embedding gradients and dense gradients back, and pushes the
 * parameters after the host-side optimizer step.  The host copy of the
 * parameters (model_dev_params) is authoritative between steps on both devices,
 * so the optimizer, the all-reduce and the digest see one host array
 * either way, and what the CPU tests prove about the step carries over.
 * (Keeping the optimizer on the device would save two copies per step; not
 * done yet.)  One thread at a time.
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
void model_dev_init(model_dev_t *m, uint64_t seed);
size_t model_dev_n_params(const model_dev_t *m);
/* Host arrays (model_dev_n_params floats): parameters, and the gradients of
 * the last model_dev_backward. */
float *model_dev_params(model_dev_t *m);
float *model_dev_grads(model_dev_t *m);
/* After changing model_dev_params (optimizer, restore): make the device see it. */
int model_dev_params_changed(model_dev_t *m);
/* After changing model_dev_grads (an all-reduce on host memory): make the
 * device see it.  0 or ERR_CUDA; nothing to do on the CPU. */
int model_dev_grads_changed(model_dev_t *m);
/* ---- the dense optimizer on the model's device.  o is the job's dense
 * optimizer (opt.h: kind, hyper-parameters, step count, host state).
 * model_dev_opt_step: params -= update(grads), advancing opt_steps(o);
 * on the CPU opt_step_pool over the model's threads; on CUDA on the device
 * (bit-identical to opt_step: element-wise, --fmad=false).  On CUDA the
 * state may then live on the device: model_dev_opt_sync brings it back
 * into opt_state(o) (a checkpoint, the digest) and model_dev_opt_changed
 * sends opt_state(o) and opt_steps(o) after the caller wrote them (a
 * restore).  0 or ERR_CUDA. */
struct opt_s;
int model_dev_opt_step(model_dev_t *m, struct opt_s *o);
int model_dev_opt_sync(model_dev_t *m, struct opt_s *o);
int model_dev_opt_changed(model_dev_t *m, struct opt_s *o);
/* device = cuda: the DEVICE arrays of the parameters and gradients
 * (model_dev_n_params floats; a collective on device memory reads and
 * writes them, then calls nothing); NULL on the CPU. */
float *model_dev_params_dev(model_dev_t *m);
float *model_dev_grads_dev(model_dev_t *m);
const char *model_dev_describe(const model_dev_t *m);
struct pool_s *model_dev_pool(model_dev_t *m);  /* CPU model's threads, or NULL */
/* As model_forward / model_backward, host pointers -- except that on
 * device = cuda, emb may be model_dev_emb_dev(m) (already on the device: read in
 * place) and d_emb may be NULL (the input gradient stays in
 * model_dev_demb_dev(m)).  A caller that keeps its embedding rows on the
 * device uses both, so rows never cross to the host for a step. */
int model_dev_forward(model_dev_t *m, uint32_t n, const float *dense, const float *emb, float *logits);
double model_dev_backward(model_dev_t *m, uint32_t n, const float *labels, float scale, float *d_emb);
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
