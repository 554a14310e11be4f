/*
 * model.cu: DLRM, Wide&Deep, DeepFM, Deep&Cross and DLRM-DCNv2 over the kernels of
 * nn.cu, the device twin of model.c (contract in nn_cuda.h, architectures
 * and parameter layout in model.h).
 *
 * model_cuda_create takes model_create's plan (model__plan in
 * model_internal.h: same tensors, offsets and description), then allocates with
 * plain cudaMalloc: ONE array for the parameters, one for the gradients,
 * and one buffer per activation / activation gradient for max_batch
 * samples, so a step allocates nothing.  Forward and backward run the same
 * layer calls as model.c's forward_part / backward_part over the whole
 * batch (there are no parts: the GPU is the parallelism), enqueued on the
 * calling thread's nn_cuda stream.
 *
 * The planning and the initialization are model.c's own (model__plan,
 * model__init_params), so the two cannot drift; the GPU tests still
 * compare n_params, the description and the initial parameters.
 */
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "nn_cuda.h"

extern "C" { /* C headers without their own extern "C" */
#include "cfg.h"
#include "err.h"
#include "model_internal.h" /* the plan's types (mlp_t's y / dy: device buffers here) */
}

struct model_cuda_s {
  model_kind_t kind;
  uint32_t n_dense, n_tables, dim, max_batch;
  uint32_t emb_w, d0;
  size_t n_params;
  float *params, *grads; /* device */
  tensor_t tensors[4 * MAX_LAYERS + 3 * MAX_CROSS];
  uint32_t n_tensors;

  mlp_t bottom, top, deep;
  int has_bottom;
  uint32_t inter_w;
  float *inter, *d_inter, *d_emb_scratch;

  lin_t wide;
  float *wide_y, *wide_dy, *fm_y;
  float *x0, *dx0;

  uint32_t n_cross;
  size_t cross_w[MAX_CROSS], cross_b[MAX_CROSS];
  float *xl[MAX_CROSS + 1], *sl[MAX_CROSS], *dxl;
  /* dlrm_dcn (model.c's fields of the same names) */
  uint32_t rank;
  size_t cross_v[MAX_CROSS];
  float *zl[MAX_CROSS], *tl[MAX_CROSS], *dz, *dt;
  lin_t final;
  float *cat, *dcat, *final_y;

  float *dlogits;
  float *zbuf;
  const float *dense, *emb;
  uint32_t n;
  char desc[1024];

  void *allocs[8 * MAX_LAYERS + 4 * MAX_CROSS + 32];
  uint32_t n_allocs;
};

static cudaStream_t stream(void) { return (cudaStream_t)nn_cuda_stream(); }

static uint32_t mlp_out(const mlp_t *p, uint32_t in) { return p->n ? p->l[p->n - 1].out : in; }

/* ----------------------------------------------------------------- memory */

/* n floats of zeroed device memory, owned by m; NULL on failure (the
 * failure is in the thread's nn_cuda error). */
static float *dalloc(model_cuda_t *m, size_t n) {
  size_t bytes = n * sizeof(float);
  if (bytes == 0) bytes = 64;
  ASSERT(m->n_allocs < sizeof(m->allocs) / sizeof(m->allocs[0]));
  void *p = NULL;
  if (!nn_cuda__ok((int)cudaMalloc(&p, bytes), "cudaMalloc (model_cuda_create)")) return NULL;
  m->allocs[m->n_allocs++] = p;
  if (!nn_cuda__ok((int)cudaMemset(p, 0, bytes), "cudaMemset (model_cuda_create)")) return NULL;
  return (float *)p;
}

static int dalloc_mlp(model_cuda_t *m, mlp_t *p) {
  for (uint32_t i = 0; i < p->n; i++) {
    p->y[i] = dalloc(m, (size_t)m->max_batch * p->l[i].out);
    p->dy[i] = dalloc(m, (size_t)m->max_batch * p->l[i].out);
    if (!p->y[i] || !p->dy[i]) return ERR_CUDA;
  }
  return 0;
}

/* ----------------------------------------------------------------- create */

/* m's plan: p's (model__plan), field by field; buffers stay unset. */
static void take_plan(model_cuda_t *m, const struct model_s *p) {
  static_assert(sizeof m->tensors == sizeof p->tensors && sizeof m->desc == sizeof p->desc &&
                    sizeof m->cross_w == sizeof p->cross_w && sizeof m->cross_v == sizeof p->cross_v,
                "model_cuda_s and model_s hold plans of one size");
  m->kind = p->kind;
  m->n_dense = p->n_dense;
  m->n_tables = p->n_tables;
  m->dim = p->dim;
  m->max_batch = p->max_batch;
  m->emb_w = p->emb_w;
  m->d0 = p->d0;
  m->n_params = p->n_params;
  memcpy(m->tensors, p->tensors, sizeof m->tensors);
  m->n_tensors = p->n_tensors;
  m->bottom = p->bottom; /* y / dy: NULL in a plan */
  m->top = p->top;
  m->deep = p->deep;
  m->has_bottom = p->has_bottom;
  m->inter_w = p->inter_w;
  m->wide = p->wide;
  m->n_cross = p->n_cross;
  memcpy(m->cross_w, p->cross_w, sizeof m->cross_w);
  memcpy(m->cross_b, p->cross_b, sizeof m->cross_b);
  m->rank = p->rank;
  memcpy(m->cross_v, p->cross_v, sizeof m->cross_v);
  m->final = p->final;
  memcpy(m->desc, p->desc, sizeof m->desc);
}

/* The parameters, gradients and every activation buffer on the device for
 * max_batch samples; m->zbuf set.  0 or ERR_CUDA (the failure is in the
 * thread's nn_cuda error; what was allocated is in m->allocs). */
static int dalloc_buffers(model_cuda_t *m) {
  size_t B = m->max_batch;
  m->params = dalloc(m, m->n_params);
  m->grads = dalloc(m, m->n_params);
  m->dlogits = dalloc(m, B);
  if (!m->params || !m->grads || !m->dlogits) return ERR_CUDA;
  if (m->kind == MODEL_DLRM_DCN) {
    size_t d = m->d0;
    if (dalloc_mlp(m, &m->bottom) < 0 || dalloc_mlp(m, &m->top) < 0) return ERR_CUDA;
    m->x0 = dalloc(m, B * d);
    m->dx0 = dalloc(m, B * d);
    m->dxl = dalloc(m, B * d);
    m->dz = dalloc(m, B * d);
    m->dt = dalloc(m, B * (m->rank ? m->rank : 1));
    if (!m->x0 || !m->dx0 || !m->dxl || !m->dz || !m->dt) return ERR_CUDA;
    m->xl[0] = m->x0;
    for (uint32_t l = 0; l < m->n_cross; l++) {
      m->xl[l + 1] = dalloc(m, B * d);
      m->zl[l] = dalloc(m, B * d);
      m->tl[l] = m->rank ? dalloc(m, B * m->rank) : NULL;
      if (!m->xl[l + 1] || !m->zl[l] || (m->rank && !m->tl[l])) return ERR_CUDA;
    }
    m->zbuf = m->top.y[m->top.n - 1];
    return 0;
  }
  if (m->kind == MODEL_DLRM) {
    if (dalloc_mlp(m, &m->bottom) < 0 || dalloc_mlp(m, &m->top) < 0) return ERR_CUDA;
    m->inter = dalloc(m, B * m->inter_w);
    m->d_inter = dalloc(m, B * m->inter_w);
    m->d_emb_scratch = dalloc(m, B * m->emb_w);
    if (!m->inter || !m->d_inter || !m->d_emb_scratch) return ERR_CUDA;
  } else {
    m->x0 = dalloc(m, B * m->d0);
    m->dx0 = dalloc(m, B * m->d0);
    if (!m->x0 || !m->dx0 || dalloc_mlp(m, &m->deep) < 0) return ERR_CUDA;
    if (m->kind == MODEL_DCN) {
      m->xl[0] = m->x0;
      for (uint32_t l = 0; l < m->n_cross; l++) {
        m->xl[l + 1] = dalloc(m, B * m->d0);
        m->sl[l] = dalloc(m, B);
        if (!m->xl[l + 1] || !m->sl[l]) return ERR_CUDA;
      }
      m->dxl = dalloc(m, B * m->d0);
      m->final_y = dalloc(m, B);
      if (!m->dxl || !m->final_y) return ERR_CUDA;
      if (m->deep.n) {
        m->cat = dalloc(m, B * m->final.in);
        m->dcat = dalloc(m, B * m->final.in);
        if (!m->cat || !m->dcat) return ERR_CUDA;
      }
    } else {
      m->wide_y = dalloc(m, B);
      m->wide_dy = dalloc(m, B);
      m->fm_y = dalloc(m, B);
      if (!m->wide_y || !m->wide_dy || !m->fm_y) return ERR_CUDA;
    }
  }

  if (m->kind == MODEL_DLRM)
    m->zbuf = m->top.y[m->top.n - 1];
  else if (m->kind == MODEL_DCN)
    m->zbuf = m->final_y;
  else
    m->zbuf = m->deep.y[m->deep.n - 1];
  return 0;
}

int model_cuda_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                      uint32_t max_batch, model_cuda_t **out, char *err, size_t err_len) {
  int rc = 0;
  model_cuda_t *m = NULL;
  *out = NULL;
  if (err_len) err[0] = 0;

  struct model_s *plan = (struct model_s *)calloc(1, sizeof(*plan));
  if (!plan) return -ENOMEM;
  rc = model__plan(plan, cfg, n_dense, n_tables, dim, max_batch, err, err_len);
  if (rc == 0 && !(m = (model_cuda_t *)calloc(1, sizeof(*m)))) rc = -ENOMEM;
  if (rc == 0) take_plan(m, plan);
  free(plan); /* a plan allocates nothing */
  if (rc < 0) goto out;

  /* the shape is valid: now the device */
  if ((rc = cuda_check(err, err_len)) < 0) goto out;
  if ((rc = nn_cuda_reserve(max_batch)) < 0) goto cuda_failed;
  if (dalloc_buffers(m) < 0) goto cuda_failed;
  *out = m;
  return 0;

cuda_failed:
  rc = nn_cuda_error(err, err_len);
  if (rc == 0) {
    rc = ERR_CUDA;
    snprintf(err, err_len, "model_cuda_create: CUDA failure");
  }
out:
  model_cuda_destroy(m);
  return rc;
}

void model_cuda_destroy(model_cuda_t *m) {
  if (!m) return;
  for (uint32_t i = 0; i < m->n_allocs; i++)
    (void)nn_cuda__ok((int)cudaFree(m->allocs[i]), "cudaFree (model_cuda_destroy)");
  free(m);
}

/* ----------------------------------------------------------------- init */

void model_cuda_init(model_cuda_t *m, uint64_t seed) {
  float *host = (float *)malloc((m->n_params ? m->n_params : 1) * sizeof(float));
  if (!host) {
    (void)nn_cuda__ok((int)cudaErrorMemoryAllocation, "model_cuda_init (host staging buffer)");
    return;
  }
  model__init_params(m->tensors, m->n_tensors, seed, host);
  size_t bytes = m->n_params * sizeof(float);
  (void)(nn_cuda__ok((int)cudaMemcpyAsync(m->params, host, bytes, cudaMemcpyHostToDevice, stream()),
                     "cudaMemcpyAsync (model_cuda_init)") &&
         nn_cuda__ok((int)cudaMemsetAsync(m->grads, 0, bytes, stream()),
                     "cudaMemsetAsync (model_cuda_init)") &&
         nn_cuda__ok((int)cudaStreamSynchronize(stream()), "cudaStreamSynchronize (model_cuda_init)"));
  free(host);
}

model_kind_t model_cuda_kind(const model_cuda_t *m) { return m->kind; }
size_t model_cuda_n_params(const model_cuda_t *m) { return m->n_params; }
float *model_cuda_params(model_cuda_t *m) { return m->params; }
float *model_cuda_grads(model_cuda_t *m) { return m->grads; }
uint32_t model_cuda_max_batch(const model_cuda_t *m) { return m->max_batch; }
const char *model_cuda_describe(const model_cuda_t *m) { return m->desc; }

/* ----------------------------------------------------------------- layers */

static void copy(float *dst, const float *src, size_t n, const char *what) {
  if (n) (void)nn_cuda__ok((int)cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()), what);
}

static void lin_fwd(model_cuda_t *m, const lin_t *l, uint32_t n, const float *x, float *y) {
  nn_cuda_linear_fwd(x, n, l->in, l->out, m->params + l->w, m->params + l->b, l->act, y);
}

static void lin_bwd(model_cuda_t *m, const lin_t *l, uint32_t n, const float *x, const float *y,
                    float *dy, float *dx, int acc) {
  nn_cuda_linear_bwd(x, y, dy, n, l->in, l->out, m->params + l->w, l->act, m->grads + l->w,
                     m->grads + l->b, dx, acc);
}

static const float *mlp_fwd(model_cuda_t *m, mlp_t *q, uint32_t n, const float *x) {
  for (uint32_t i = 0; i < q->n; i++) {
    lin_fwd(m, &q->l[i], n, x, q->y[i]);
    x = q->y[i];
  }
  return x;
}

static void mlp_bwd(model_cuda_t *m, mlp_t *q, uint32_t n, const float *x, float *dx, int acc) {
  for (uint32_t i = q->n; i-- > 0;)
    lin_bwd(m, &q->l[i], n, i ? q->y[i - 1] : x, q->y[i], q->dy[i], i ? q->dy[i - 1] : dx,
            i ? 0 : acc);
}

static void concat_x0(model_cuda_t *m, uint32_t n, const float *dense, const float *emb) {
  const float *src[2] = {dense, emb};
  size_t stride[2] = {m->n_dense, m->emb_w};
  uint32_t width[2] = {m->n_dense, m->emb_w};
  uint32_t k = m->n_dense ? 0 : 1;
  nn_cuda_concat_fwd(n, 2 - k, src + k, stride + k, width + k, m->x0, m->d0);
}

static void split_dx0(model_cuda_t *m, uint32_t n, float *d_emb) {
  if (!d_emb || m->emb_w == 0) return;
  float *dst[2] = {NULL, d_emb};
  size_t stride[2] = {m->n_dense, m->emb_w};
  uint32_t width[2] = {m->n_dense, m->emb_w};
  nn_cuda_concat_bwd(n, 2, m->dx0, m->d0, width, dst, stride, 0);
}

/* wdl / deepfm logit: y = (wide + y) [+ fm], in model.c's order */
static __global__ void k_logit_sum(float *y, const float *wide, const float *fm, uint32_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = fm ? (wide[i] + y[i]) + fm[i] : wide[i] + y[i];
}

/* dlrm_dcn's backward: model_dlrm_dcn.c's stages in order, over the whole
 * batch. */
static __global__ void k_add(float *dst, const float *src, size_t len) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < len) dst[i] += src[i];
}

static void backward_dcn2(model_cuda_t *m, uint32_t n, const float *dl, float *d_emb) {
  uint32_t d = m->d0, r = m->rank, L = m->n_cross;
  size_t len = (size_t)n * d;
  copy(m->top.dy[m->top.n - 1], dl, n, "cudaMemcpyAsync (model_cuda_backward)");
  mlp_bwd(m, &m->top, n, m->xl[L], m->dxl, 0);
  if (L)
    (void)nn_cuda__ok((int)cudaMemsetAsync(m->dx0, 0, len * sizeof(float), stream()),
                      "cudaMemsetAsync (model_cuda_backward)");
  for (uint32_t l = L; l-- > 0;)
    nn_cuda_cross2_bwd(m->x0, m->xl[l], m->tl[l], m->zl[l], n, d, r, m->params + m->cross_w[l],
                       r ? m->params + m->cross_v[l] : NULL, m->dxl, m->dz, m->dt, m->grads + m->cross_w[l],
                       r ? m->grads + m->cross_v[l] : NULL, m->grads + m->cross_b[l], m->dx0);
  if (L && len) {
    k_add<<<(unsigned)((len + 255) / 256), 256, 0, stream()>>>(m->dx0, m->dxl, len);
    (void)nn_cuda__ok((int)cudaGetLastError(), "model_cuda_backward (x0)");
  } else if (!L) {
    copy(m->dx0, m->dxl, len, "cudaMemcpyAsync (model_cuda_backward x0)");
  }
  float *dst[2] = {m->has_bottom ? m->bottom.dy[m->bottom.n - 1] : NULL, d_emb};
  size_t stride[2] = {m->dim, m->emb_w};
  uint32_t width[2] = {m->dim, m->emb_w};
  uint32_t k = m->has_bottom ? 0 : 1;
  nn_cuda_concat_bwd(n, 2 - k, m->dx0, d, width + k, dst + k, stride + k, 0);
  if (m->has_bottom) mlp_bwd(m, &m->bottom, n, m->dense, NULL, 0);
}

/* ----------------------------------------------------------------- steps */

void model_cuda_forward(model_cuda_t *m, uint32_t n, const float *dense, const float *emb,
                        float *logits) {
  ASSERT_OP(n, <=, m->max_batch);
  m->n = n;
  m->dense = dense;
  m->emb = emb;
  if (n == 0) return;
  switch (m->kind) {
    case MODEL_DLRM: {
      const float *bot = m->has_bottom ? mlp_fwd(m, &m->bottom, n, dense) : NULL;
      nn_cuda_interact_fwd(bot, m->dim, emb, m->emb_w, n, m->n_tables, m->dim, m->inter,
                           m->inter_w);
      mlp_fwd(m, &m->top, n, m->inter);
      break;
    }
    case MODEL_WDL:
    case MODEL_DEEPFM: {
      concat_x0(m, n, dense, emb);
      lin_fwd(m, &m->wide, n, m->x0, m->wide_y);
      float *y = (float *)mlp_fwd(m, &m->deep, n, m->x0);
      const float *fm = NULL;
      if (m->kind == MODEL_DEEPFM) {
        nn_cuda_fm_fwd(emb, m->emb_w, n, m->n_tables, m->dim, m->fm_y);
        fm = m->fm_y;
      }
      k_logit_sum<<<(n + 255) / 256, 256, 0, stream()>>>(y, m->wide_y, fm, n);
      (void)nn_cuda__ok((int)cudaGetLastError(), "model_cuda_forward (logit sum)");
      break;
    }
    case MODEL_DCN: {
      const float *w[MAX_CROSS], *b[MAX_CROSS];
      for (uint32_t l = 0; l < m->n_cross; l++) {
        w[l] = m->params + m->cross_w[l];
        b[l] = m->params + m->cross_b[l];
      }
      concat_x0(m, n, dense, emb);
      nn_cuda_cross_stack_fwd(m->x0, n, m->d0, m->n_cross, w, b, m->sl, m->xl);
      const float *fin = m->xl[m->n_cross];
      if (m->deep.n) {
        uint32_t hw = mlp_out(&m->deep, m->d0);
        const float *src[2] = {fin, mlp_fwd(m, &m->deep, n, m->x0)};
        size_t stride[2] = {m->d0, hw};
        uint32_t width[2] = {m->d0, hw};
        nn_cuda_concat_fwd(n, 2, src, stride, width, m->cat, m->final.in);
        fin = m->cat;
      }
      lin_fwd(m, &m->final, n, fin, m->final_y);
      break;
    }
    case MODEL_DLRM_DCN: {
      uint32_t d = m->d0, r = m->rank;
      if (m->has_bottom) {
        const float *src[2] = {mlp_fwd(m, &m->bottom, n, dense), emb};
        size_t stride[2] = {m->dim, m->emb_w};
        uint32_t width[2] = {m->dim, m->emb_w};
        nn_cuda_concat_fwd(n, 2, src, stride, width, m->x0, d);
      } else {
        copy(m->x0, emb, (size_t)n * d, "cudaMemcpyAsync (model_cuda_forward x0)");
      }
      for (uint32_t l = 0; l < m->n_cross; l++)
        nn_cuda_cross2_fwd(m->x0, m->xl[l], n, d, r, m->params + m->cross_w[l],
                           r ? m->params + m->cross_v[l] : NULL, m->params + m->cross_b[l], m->tl[l], m->zl[l],
                           m->xl[l + 1]);
      mlp_fwd(m, &m->top, n, m->xl[m->n_cross]);
      break;
    }
  }
  if (logits) copy(logits, m->zbuf, n, "cudaMemcpyAsync (model_cuda_forward logits)");
}

double model_cuda_backward(model_cuda_t *m, uint32_t n, const float *labels, float scale,
                           float *d_emb) {
  ASSERT_OP(n, ==, m->n);
  float *dl = m->dlogits;
  double loss = nn_cuda_bce_logits_bwd(m->zbuf, labels, n, scale, dl);
  switch (m->kind) {
    case MODEL_DLRM: {
      copy(m->top.dy[m->top.n - 1], dl, n, "cudaMemcpyAsync (model_cuda_backward)");
      mlp_bwd(m, &m->top, n, m->inter, m->d_inter, 0);
      const float *bot = m->has_bottom ? m->bottom.y[m->bottom.n - 1] : NULL;
      float *dbot = m->has_bottom ? m->bottom.dy[m->bottom.n - 1] : NULL;
      nn_cuda_interact_bwd(bot, m->dim, m->emb, m->emb_w, n, m->n_tables, m->dim, m->d_inter,
                           m->inter_w, dbot, d_emb ? d_emb : m->d_emb_scratch, m->emb_w);
      if (m->has_bottom) mlp_bwd(m, &m->bottom, n, m->dense, NULL, 0);
      break;
    }
    case MODEL_WDL:
    case MODEL_DEEPFM: {
      copy(m->deep.dy[m->deep.n - 1], dl, n, "cudaMemcpyAsync (model_cuda_backward)");
      copy(m->wide_dy, dl, n, "cudaMemcpyAsync (model_cuda_backward)");
      mlp_bwd(m, &m->deep, n, m->x0, m->dx0, 0);
      lin_bwd(m, &m->wide, n, m->x0, m->wide_y, m->wide_dy, m->dx0, 1);
      if (m->kind == MODEL_DEEPFM)
        nn_cuda_fm_bwd(m->emb, m->emb_w, n, m->n_tables, m->dim, dl, m->dx0 + m->n_dense, m->d0,
                       1);
      split_dx0(m, n, d_emb);
      break;
    }
    case MODEL_DCN: {
      const float *fin = m->deep.n ? m->cat : m->xl[m->n_cross];
      float *dfin = m->deep.n ? m->dcat : m->dxl;
      lin_bwd(m, &m->final, n, fin, m->final_y, dl, dfin, 0);
      if (m->deep.n) {
        uint32_t hw = mlp_out(&m->deep, m->d0);
        float *dst[2] = {m->dxl, m->deep.dy[m->deep.n - 1]};
        size_t stride[2] = {m->d0, hw};
        uint32_t width[2] = {m->d0, hw};
        nn_cuda_concat_bwd(n, 2, dfin, m->final.in, width, dst, stride, 0);
        mlp_bwd(m, &m->deep, n, m->x0, m->dx0, 0);
      } else {
        (void)nn_cuda__ok((int)cudaMemsetAsync(m->dx0, 0, (size_t)n * m->d0 * sizeof(float), stream()),
                          "cudaMemsetAsync (model_cuda_backward)");
      }
      const float *w[MAX_CROSS], *xl[MAX_CROSS + 1], *sl[MAX_CROSS];
      float *dw[MAX_CROSS], *db[MAX_CROSS];
      for (uint32_t l = 0; l < m->n_cross; l++) {
        w[l] = m->params + m->cross_w[l];
        xl[l] = m->xl[l];
        sl[l] = m->sl[l];
        dw[l] = m->grads + m->cross_w[l];
        db[l] = m->grads + m->cross_b[l];
      }
      nn_cuda_cross_stack_bwd(m->x0, n, m->d0, m->n_cross, w, xl, sl, m->dxl, dw, db, m->dx0);
      split_dx0(m, n, d_emb);
      break;
    }
    case MODEL_DLRM_DCN:
      backward_dcn2(m, n, dl, d_emb);
      break;
  }
  return loss;
}
