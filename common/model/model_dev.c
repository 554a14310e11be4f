/* model_dev: see model_dev.h. */
#include "model_dev.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "err.h"
#include "log.h"
#include "model.h"
#include "opt.h"
#ifdef CHANTER_CUDA
#include <cuda_runtime.h>

#include "nn_cuda.h"
#endif

struct model_dev_s {
  int cuda;
  model_t *cpu;
#ifdef CHANTER_CUDA
  model_cuda_t *gpu;
  float *h_params, *h_grads;              /* host mirrors */
  float *d_dense, *d_emb, *d_demb, *d_labels, *d_logits;
  uint32_t n_dense, n_tables, dim, width, max_batch;
#endif
};

int model_dev_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim, uint32_t max_batch,
                model_dev_t **out, char *err, size_t err_len) {
  model_dev_t *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  int rc;
  if (strcmp(cfg_str(cfg, "device"), "cuda") != 0) {
    if ((rc = model_create(cfg, n_dense, n_tables, dim, max_batch, &m->cpu, err, err_len)) != 0) {
      free(m);
      return rc;
    }
    *out = m;
    return 0;
  }
  if ((rc = cuda_check(err, err_len)) != 0) {
    free(m);
    return rc;
  }
#ifdef CHANTER_CUDA
  m->cuda = 1;
  m->n_dense = n_dense;
  m->n_tables = n_tables;
  m->dim = dim;
  m->width = n_tables * dim;
  m->max_batch = max_batch;
  if ((rc = model_cuda_create(cfg, n_dense, n_tables, dim, max_batch, &m->gpu, err, err_len)) != 0) {
    free(m);
    return rc;
  }
  size_t np = model_cuda_n_params(m->gpu), nb = max_batch;
  m->h_params = calloc(np ? np : 1, sizeof(float));
  m->h_grads = calloc(np ? np : 1, sizeof(float));
  if (!m->h_params || !m->h_grads || cudaMalloc((void **)&m->d_dense, (nb * n_dense + 1) * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_emb, nb * m->width * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_demb, nb * m->width * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_labels, nb * 4) != cudaSuccess || cudaMalloc((void **)&m->d_logits, nb * 4) != cudaSuccess) {
    snprintf(err, err_len, "cannot allocate the model's device buffers for batch %u", max_batch);
    model_dev_destroy(m);
    return ERR_CUDA;
  }
  *out = m;
  return 0;
#else
  free(m);
  return ERR_NOGPU; /* not reached: cuda_check refuses without CUDA */
#endif
}

void model_dev_destroy(model_dev_t *m) {
  if (!m) return;
  if (m->cpu) model_destroy(m->cpu);
#ifdef CHANTER_CUDA
  if (m->gpu) model_cuda_destroy(m->gpu);
  cudaFree(m->d_dense);
  cudaFree(m->d_emb);
  cudaFree(m->d_demb);
  cudaFree(m->d_labels);
  cudaFree(m->d_logits);
  free(m->h_params);
  free(m->h_grads);
#endif
  free(m);
}

void model_dev_init(model_dev_t *m, uint64_t seed) {
  if (!m->cuda) {
    model_init(m->cpu, seed);
    return;
  }
#ifdef CHANTER_CUDA
  model_cuda_init(m->gpu, seed);
  cudaMemcpy(m->h_params, model_cuda_params(m->gpu), model_cuda_n_params(m->gpu) * 4, cudaMemcpyDeviceToHost);
  memset(m->h_grads, 0, model_cuda_n_params(m->gpu) * 4);
#endif
}

size_t model_dev_n_params(const model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return model_cuda_n_params(m->gpu);
#endif
  return model_n_params(m->cpu);
}

float *model_dev_params(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return m->h_params;
#endif
  return model_params(m->cpu);
}

float *model_dev_grads(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return m->h_grads;
#endif
  return model_grads(m->cpu);
}

int model_dev_params_changed(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda && cudaMemcpy(model_cuda_params(m->gpu), m->h_params, model_cuda_n_params(m->gpu) * 4,
                            cudaMemcpyHostToDevice) != cudaSuccess)
    return ERR_CUDA;
#endif
  (void)m;
  return 0;
}

int model_dev_grads_changed(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda && cudaMemcpy(model_cuda_grads(m->gpu), m->h_grads, model_cuda_n_params(m->gpu) * 4,
                            cudaMemcpyHostToDevice) != cudaSuccess)
    return ERR_CUDA;
#endif
  (void)m;
  return 0;
}

int model_dev_opt_step(model_dev_t *m, opt_t *o) {
  opt_step_pool(o, model_dev_params(m), model_dev_grads(m), model_dev_pool(m));
  return m->cuda ? model_dev_params_changed(m) : 0;
}

int model_dev_opt_sync(model_dev_t *m, opt_t *o) {
  (void)m;
  (void)o;
  return 0;
}

int model_dev_opt_changed(model_dev_t *m, opt_t *o) {
  (void)m;
  (void)o;
  return 0;
}

float *model_dev_params_dev(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return model_cuda_params(m->gpu);
#endif
  (void)m;
  return NULL;
}

float *model_dev_grads_dev(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return model_cuda_grads(m->gpu);
#endif
  (void)m;
  return NULL;
}

const char *model_dev_describe(const model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return model_cuda_describe(m->gpu);
#endif
  return model_describe(m->cpu);
}

struct pool_s *model_dev_pool(model_dev_t *m) { return m->cpu ? model_pool(m->cpu) : NULL; }
struct model_s *model_dev_cpu_model(model_dev_t *m) { return m->cpu; }
int model_dev_is_cuda(const model_dev_t *m) { return m->cuda; }
float *model_dev_emb_dev(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return m->d_emb;
#endif
  (void)m;
  return NULL;
}
float *model_dev_demb_dev(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return m->d_demb;
#endif
  (void)m;
  return NULL;
}

#ifdef CHANTER_CUDA
/* The columns of the tables with cols[t] != 0 between dst and src (both n
 * rows of width floats), a run of consecutive tables as one strided copy,
 * on the model's stream (nn_cuda_stream), waited for. */
static int copy_cols(model_dev_t *m, uint32_t n, float *dst, const float *src, const uint8_t *cols,
                     enum cudaMemcpyKind kind) {
  cudaStream_t st = (cudaStream_t)nn_cuda_stream();
  size_t pitch = (size_t)m->width * sizeof(float);
  for (uint32_t t = 0; t < m->n_tables;) {
    if (!cols[t]) {
      t++;
      continue;
    }
    uint32_t t1 = t + 1;
    while (t1 < m->n_tables && cols[t1]) t1++;
    size_t off = (size_t)t * m->dim;
    if (cudaMemcpy2DAsync(dst + off, pitch, src + off, pitch, (size_t)(t1 - t) * m->dim * sizeof(float), n, kind,
                          st) != cudaSuccess)
      return ERR_CUDA;
    t = t1;
  }
  return cudaStreamSynchronize(st) == cudaSuccess ? 0 : ERR_CUDA;
}
#endif

int model_dev_emb_cols_in(model_dev_t *m, uint32_t n, const float *emb, const uint8_t *cols) {
  if (!m->cuda || !cols || !n) return 0;
#ifdef CHANTER_CUDA
  return copy_cols(m, n, m->d_emb, emb, cols, cudaMemcpyHostToDevice);
#else
  (void)emb;
  return 0;
#endif
}

int model_dev_demb_cols_out(model_dev_t *m, uint32_t n, float *d_emb, const uint8_t *cols) {
  if (!m->cuda || !cols || !n) return 0;
#ifdef CHANTER_CUDA
  return copy_cols(m, n, d_emb, m->d_demb, cols, cudaMemcpyDeviceToHost);
#else
  (void)d_emb;
  return 0;
#endif
}

int model_dev_forward(model_dev_t *m, uint32_t n, const float *dense, const float *emb, float *logits) {
  if (!m->cuda) {
    model_forward(m->cpu, n, dense, emb, logits);
    return 0;
  }
#ifdef CHANTER_CUDA
  if ((dense && m->n_dense && cudaMemcpy(m->d_dense, dense, (size_t)n * m->n_dense * 4, cudaMemcpyHostToDevice)) ||
      (emb != m->d_emb && cudaMemcpy(m->d_emb, emb, (size_t)n * m->width * 4, cudaMemcpyHostToDevice)))
    return ERR_CUDA;
  model_cuda_forward(m->gpu, n, m->n_dense ? m->d_dense : NULL, m->d_emb, m->d_logits);
  if (cudaMemcpy(logits, m->d_logits, (size_t)n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return ERR_CUDA;
#endif
  return 0;
}

double model_dev_backward(model_dev_t *m, uint32_t n, const float *labels, float scale, float *d_emb) {
  if (!m->cuda) return model_backward(m->cpu, n, labels, scale, d_emb);
#ifdef CHANTER_CUDA
  if (cudaMemcpy(m->d_labels, labels, (size_t)n * 4, cudaMemcpyHostToDevice) != cudaSuccess) return NAN;
  double loss = model_cuda_backward(m->gpu, n, m->d_labels, scale, m->d_demb);
  if ((d_emb && cudaMemcpy(d_emb, m->d_demb, (size_t)n * m->width * 4, cudaMemcpyDeviceToHost) != cudaSuccess) ||
      cudaMemcpy(m->h_grads, model_cuda_grads(m->gpu), model_cuda_n_params(m->gpu) * 4, cudaMemcpyDeviceToHost) !=
          cudaSuccess)
    return NAN;
  return loss;
#else
  return NAN;
#endif
}
