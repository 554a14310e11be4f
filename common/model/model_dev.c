/* model_dev: see model_dev.h. */
#include "model_dev.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "err.h"
#include "log.h"
#include "model.h"
#include "opt.h"
#include "pool.h"
#ifdef CHANTER_CUDA
#include <cuda_runtime.h>

#include "nn_cuda.h"
#include "opt_cuda.h"
#endif

/* device = cuda: the host threads for the embedding work that stays on
 * the host (model_dev_pool), at most this many */
#define HOST_THREADS_MAX 32

struct model_dev_s {
  int cuda;
  model_t *cpu;
  pool_t *host; /* device = cuda: model_dev_pool's threads (NULL: none could start) */
#ifdef CHANTER_CUDA
  model_cuda_t *gpu;
  size_t np;                              /* model_cuda_n_params */
  /* host mirrors (pinned), filled when asked: *_stale says the device
   * holds newer values than the mirror */
  float *h_params, *h_grads;
  int params_stale, grads_stale;
  /* the dense optimizer's state on the device (model_dev_opt_step) */
  float *d_state;
  size_t state_floats;
  const opt_t *state_of;                  /* whose state d_state holds; NULL: none yet */
  int state_stale;                        /* d_state is newer than opt_state(state_of) */
  /* per-step staging (pinned) for the inputs and the logits */
  float *h_dense, *h_labels, *h_logits;
  cudaEvent_t staged;                     /* recorded after the last copy out of h_dense / h_labels */
  int have_staged;
  float *d_dense, *d_emb, *d_demb, *d_labels, *d_logits;
  uint32_t n_dense, n_tables, dim, width, max_batch;
#endif
};

#ifdef CHANTER_CUDA
static cudaStream_t stream(void) { return (cudaStream_t)nn_cuda_stream(); }

/* bytes from src to dst on the model's stream, waited for.  1, or 0 with
 * the failure recorded in the thread's nn_cuda_error. */
static int copy_wait(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, const char *what) {
  if (!bytes) return 1;
  return nn_cuda__ok((int)cudaMemcpyAsync(dst, src, bytes, kind, stream()), what) &&
         nn_cuda__ok((int)cudaStreamSynchronize(stream()), what);
}

/* The host may write the staging buffers again: the copies that read
 * them are done (already so in a step, whose loss waited). */
static int staging_free(model_dev_t *m) {
  return nn_cuda__ok((int)cudaEventSynchronize(m->staged), "cudaEventSynchronize (model_dev staging)");
}
static int staging_used(model_dev_t *m) {
  return nn_cuda__ok((int)cudaEventRecord(m->staged, stream()), "cudaEventRecord (model_dev staging)");
}

static float *pinned(size_t n) {
  void *p = NULL;
  return cudaHostAlloc(&p, (n ? n : 1) * sizeof(float), cudaHostAllocDefault) == cudaSuccess ? (float *)p : NULL;
}
#endif

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
  {
    uint32_t nt = pool_default_threads();
    if (nt > HOST_THREADS_MAX) nt = HOST_THREADS_MAX;
    if (pool_create(nt, &m->host) != 0) { /* still correct, only slower */
      m->host = NULL;
      log_warn("model_dev: cannot start %u host threads for the embedding work, running it on one", nt);
    }
  }
  if ((rc = model_cuda_create(cfg, n_dense, n_tables, dim, max_batch, &m->gpu, err, err_len)) != 0) {
    pool_destroy(m->host);
    free(m);
    return rc;
  }
  size_t np = m->np = model_cuda_n_params(m->gpu), nb = max_batch;
  m->h_params = pinned(np);
  m->h_grads = pinned(np);
  m->h_dense = pinned(nb * n_dense);
  m->h_labels = pinned(nb);
  m->h_logits = pinned(nb);
  if (!m->h_params || !m->h_grads || !m->h_dense || !m->h_labels || !m->h_logits ||
      cudaEventCreateWithFlags(&m->staged, cudaEventDisableTiming) != cudaSuccess || !(m->have_staged = 1) ||
      cudaMalloc((void **)&m->d_dense, (nb * n_dense + 1) * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_emb, nb * m->width * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_demb, nb * m->width * 4) != cudaSuccess ||
      cudaMalloc((void **)&m->d_labels, nb * 4) != cudaSuccess || cudaMalloc((void **)&m->d_logits, nb * 4) != cudaSuccess) {
    snprintf(err, err_len, "cannot allocate the model's device and pinned host buffers for batch %u", max_batch);
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
  pool_destroy(m->host);
#ifdef CHANTER_CUDA
  if (m->cuda) (void)cudaStreamSynchronize(stream()); /* nothing in flight reads what is freed below */
  if (m->gpu) model_cuda_destroy(m->gpu);
  cudaFree(m->d_dense);
  cudaFree(m->d_emb);
  cudaFree(m->d_demb);
  cudaFree(m->d_labels);
  cudaFree(m->d_logits);
  cudaFree(m->d_state);
  if (m->have_staged) cudaEventDestroy(m->staged);
  cudaFreeHost(m->h_params);
  cudaFreeHost(m->h_grads);
  cudaFreeHost(m->h_dense);
  cudaFreeHost(m->h_labels);
  cudaFreeHost(m->h_logits);
#endif
  free(m);
}

void model_dev_init(model_dev_t *m, uint64_t seed) {
  if (!m->cuda) {
    model_init(m->cpu, seed);
    return;
  }
#ifdef CHANTER_CUDA
  model_cuda_init(m->gpu, seed); /* params on the device, grads zeroed there; waits */
  m->params_stale = 1;
  memset(m->h_grads, 0, m->np * sizeof(float));
  m->grads_stale = 0;
#endif
}

size_t model_dev_n_params(const model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) return m->np;
#endif
  return model_n_params(m->cpu);
}

int model_dev_params_to_host(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda && m->params_stale) {
    if (!copy_wait(m->h_params, model_cuda_params(m->gpu), m->np * 4, cudaMemcpyDeviceToHost,
                   "model_dev_params (to the host)")) {
      log_error("model_dev: the dense parameters could not be copied from the GPU");
      return ERR_CUDA;
    }
    m->params_stale = 0;
  }
#endif
  (void)m;
  return 0;
}

int model_dev_grads_to_host(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda && m->grads_stale) {
    if (!copy_wait(m->h_grads, model_cuda_grads(m->gpu), m->np * 4, cudaMemcpyDeviceToHost,
                   "model_dev_grads (to the host)")) {
      log_error("model_dev: the dense gradients could not be copied from the GPU");
      return ERR_CUDA;
    }
    m->grads_stale = 0;
  }
#endif
  (void)m;
  return 0;
}

float *model_dev_params(model_dev_t *m) {
  (void)model_dev_params_to_host(m);
#ifdef CHANTER_CUDA
  if (m->cuda) return m->h_params;
#endif
  return model_params(m->cpu);
}

float *model_dev_grads(model_dev_t *m) {
  (void)model_dev_grads_to_host(m);
#ifdef CHANTER_CUDA
  if (m->cuda) return m->h_grads;
#endif
  return model_grads(m->cpu);
}

int model_dev_params_changed(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) {
    if (!copy_wait(model_cuda_params(m->gpu), m->h_params, m->np * 4, cudaMemcpyHostToDevice,
                   "model_dev_params_changed (to the GPU)"))
      return ERR_CUDA;
    m->params_stale = 0;
  }
#endif
  (void)m;
  return 0;
}

int model_dev_grads_changed(model_dev_t *m) {
#ifdef CHANTER_CUDA
  if (m->cuda) {
    if (!copy_wait(model_cuda_grads(m->gpu), m->h_grads, m->np * 4, cudaMemcpyHostToDevice,
                   "model_dev_grads_changed (to the GPU)"))
      return ERR_CUDA;
    m->grads_stale = 0;
  }
#endif
  (void)m;
  return 0;
}

int model_dev_grads_zero(model_dev_t *m) {
  if (!m->cuda) {
    memset(model_grads(m->cpu), 0, model_n_params(m->cpu) * sizeof(float));
    return 0;
  }
#ifdef CHANTER_CUDA
  memset(m->h_grads, 0, m->np * sizeof(float));
  m->grads_stale = 0;
  if (!nn_cuda__ok((int)cudaMemsetAsync(model_cuda_grads(m->gpu), 0, m->np * 4, stream()),
                   "cudaMemsetAsync (model_dev_grads_zero)"))
    return ERR_CUDA;
#endif
  return 0;
}

#ifdef CHANTER_CUDA
/* d_state holds o's state, allocated and uploaded at o's first step (or
 * after model_dev_opt_changed named another optimizer).  1 or 0. */
static int state_for(model_dev_t *m, opt_t *o) {
  size_t ns = opt_state_floats(o);
  if (m->state_of == o || ns == 0) return 1;
  if (ns > m->state_floats) {
    cudaFree(m->d_state);
    m->d_state = NULL;
    m->state_floats = 0;
    if (!nn_cuda__ok((int)cudaMalloc((void **)&m->d_state, ns * sizeof(float)), "cudaMalloc (the optimizer state)"))
      return 0;
    m->state_floats = ns;
  }
  if (!copy_wait(m->d_state, opt_state(o), ns * sizeof(float), cudaMemcpyHostToDevice, "the optimizer state (to the GPU)"))
    return 0;
  m->state_of = o;
  m->state_stale = 0;
  return 1;
}
#endif

int model_dev_opt_step(model_dev_t *m, opt_t *o) {
  if (!m->cuda) {
    opt_step_pool(o, model_dev_params(m), model_dev_grads(m), model_dev_pool(m));
    return 0;
  }
#ifdef CHANTER_CUDA
  ASSERT_OP(opt_n_params(o), ==, m->np);
  if (!state_for(m, o)) return ERR_CUDA;
  int rc = opt_cuda_step(o, model_cuda_params(m->gpu), model_cuda_grads(m->gpu), opt_state_floats(o) ? m->d_state : NULL);
  /* even a failed launch advanced the step count, as a host step would have */
  m->params_stale = 1;
  m->grads_stale = 1; /* a collective on the device may have rewritten them in place since the last copy */
  m->state_stale = opt_state_floats(o) != 0;
  return rc;
#else
  return ERR_CUDA;
#endif
}

int model_dev_opt_sync(model_dev_t *m, opt_t *o) {
#ifdef CHANTER_CUDA
  if (m->cuda && m->state_of == o && m->state_stale) {
    if (!copy_wait(opt_state(o), m->d_state, opt_state_floats(o) * sizeof(float), cudaMemcpyDeviceToHost,
                   "model_dev_opt_sync (the optimizer state to the host)"))
      return ERR_CUDA;
    m->state_stale = 0;
  }
#endif
  (void)m;
  (void)o;
  return 0;
}

int model_dev_opt_changed(model_dev_t *m, opt_t *o) {
#ifdef CHANTER_CUDA
  if (m->cuda) {
    m->state_of = NULL; /* the next step (or this call) uploads opt_state(o) */
    m->state_stale = 0;
    if (m->d_state && !state_for(m, o)) return ERR_CUDA;
  }
#endif
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

struct pool_s *model_dev_pool(model_dev_t *m) { return m->cpu ? model_pool(m->cpu) : m->host; }
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
  ASSERT_OP(n, <=, m->max_batch);
  const float *d_dense = dense && m->n_dense ? m->d_dense : NULL;
  if (d_dense) { /* through pinned staging: a true asynchronous copy */
    size_t bytes = (size_t)n * m->n_dense * sizeof(float);
    if (!staging_free(m)) return ERR_CUDA;
    memcpy(m->h_dense, dense, bytes);
    if (!nn_cuda__ok((int)cudaMemcpyAsync(m->d_dense, m->h_dense, bytes, cudaMemcpyHostToDevice, stream()),
                     "cudaMemcpyAsync (model_dev_forward dense)") ||
        !staging_used(m))
      return ERR_CUDA;
  }
  /* host embeddings: the runtime stages a pageable source itself and
   * returns once it has (no device synchronization) */
  if (emb != m->d_emb && n &&
      !nn_cuda__ok((int)cudaMemcpyAsync(m->d_emb, emb, (size_t)n * m->width * sizeof(float), cudaMemcpyHostToDevice,
                                        stream()),
                   "cudaMemcpyAsync (model_dev_forward emb)"))
    return ERR_CUDA;
  model_cuda_forward(m->gpu, n, d_dense, m->d_emb, m->d_logits);
  if (logits && n) { /* the caller reads them on return: the forward's one wait */
    if (!copy_wait(m->h_logits, m->d_logits, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                   "model_dev_forward (logits to the host)"))
      return ERR_CUDA;
    memcpy(logits, m->h_logits, (size_t)n * sizeof(float));
  }
#endif
  return 0;
}

int model_dev_logits(model_dev_t *m, uint32_t n, float *logits) {
#ifdef CHANTER_CUDA
  if (m->cuda && n) {
    ASSERT_OP(n, <=, m->max_batch);
    if (!copy_wait(m->h_logits, m->d_logits, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                   "model_dev_logits (to the host)"))
      return ERR_CUDA;
    memcpy(logits, m->h_logits, (size_t)n * sizeof(float));
  }
#endif
  (void)m;
  (void)n;
  (void)logits;
  return 0;
}

double model_dev_backward(model_dev_t *m, uint32_t n, const float *labels, float scale, float *d_emb) {
  if (!m->cuda) return model_backward(m->cpu, n, labels, scale, d_emb);
#ifdef CHANTER_CUDA
  ASSERT_OP(n, <=, m->max_batch);
  size_t bytes = (size_t)n * sizeof(float);
  if (!staging_free(m)) return NAN;
  memcpy(m->h_labels, labels, bytes);
  if ((bytes && !nn_cuda__ok((int)cudaMemcpyAsync(m->d_labels, m->h_labels, bytes, cudaMemcpyHostToDevice, stream()),
                             "cudaMemcpyAsync (model_dev_backward labels)")) ||
      !staging_used(m))
    return NAN;
  /* waits for the loss (the step's one wait), then enqueues the rest of
   * the backward: the gradients stay on the device */
  double loss = model_cuda_backward(m->gpu, n, m->d_labels, scale, m->d_demb);
  m->grads_stale = 1;
  if (d_emb && !copy_wait(d_emb, m->d_demb, bytes * m->width, cudaMemcpyDeviceToHost,
                          "model_dev_backward (input gradient to the host)"))
    return NAN;
  return loss;
#else
  (void)labels;
  (void)scale;
  (void)d_emb;
  (void)n;
  return NAN;
#endif
}
