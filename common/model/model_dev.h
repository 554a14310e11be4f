/*
 * model_dev: one model handle whatever the device (the `device` key).
 *
 * device = cpu is model.h as is.  device = cuda is model.cu (model_cuda_*):
 * parameters and activations live on the GPU; this layer copies each
 * batch's dense features, pooled embeddings and labels to the device and
 * the embedding gradients and dense gradients back, and pushes the
 * parameters after the host-side optimizer step.  The host copy of the
 * parameters (mdev_params) is authoritative between steps on both devices,
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

typedef struct mdev_s mdev_t;
struct pool_s;

/* The model of cfg on cfg's device.  device = cuda without a usable GPU:
 * ERR_NOGPU with chanter_cuda_check's sentence in err. */
int mdev_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim, uint32_t max_batch,
                mdev_t **out, char *err, size_t err_len);
void mdev_destroy(mdev_t *m);
void mdev_init(mdev_t *m, uint64_t seed);
size_t mdev_n_params(const mdev_t *m);
/* Host arrays (mdev_n_params floats): parameters, and the gradients of
 * the last mdev_backward. */
float *mdev_params(mdev_t *m);
float *mdev_grads(mdev_t *m);
/* After changing mdev_params (optimizer, restore): make the device see it. */
int mdev_params_changed(mdev_t *m);
const char *mdev_describe(const mdev_t *m);
struct pool_s *mdev_pool(mdev_t *m);  /* CPU model's threads, or NULL */
/* As model_forward / model_backward, host pointers -- except that on
 * device = cuda, emb may be mdev_emb_dev(m) (already on the device: read in
 * place) and d_emb may be NULL (the input gradient stays in
 * mdev_demb_dev(m)).  A caller that keeps its embedding rows on the
 * device uses both, so rows never cross to the host for a step. */
int mdev_forward(mdev_t *m, uint32_t n, const float *dense, const float *emb, float *logits);
double mdev_backward(mdev_t *m, uint32_t n, const float *labels, float scale, float *d_emb);
/* device = cuda: the model's DEVICE input (max_batch rows of n_tables * dim
 * floats) and input gradient; NULL on the CPU. */
float *mdev_emb_dev(mdev_t *m);
float *mdev_demb_dev(mdev_t *m);
/* The CPU model (device = cpu: its threads, the backward's grad-ready
 * hook), or NULL. */
struct model_s *mdev_cpu_model(mdev_t *m);
int mdev_is_cuda(const mdev_t *m);

#endif
