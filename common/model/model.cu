/*
 * model.cu: DLRM, Wide&Deep, DeepFM, Deep&Cross and DLRM-DCNv2 over the kernels of
 * nn.cu, the device twin of model.c (contract in nn_cuda.h, architectures
 * and parameter layout in model.h).
 *
 * model_cuda_create plans the parameter tensors exactly as model_create
 * does (same order, same offsets, same description), then allocates with
 * plain cudaMalloc: ONE array for the parameters, one for the gradients,
 * and one buffer per activation / activation gradient for max_batch
 * samples, so a step allocates nothing.  Forward and backward run the same
 * layer calls as model.c's forward_part / backward_part over the whole
 * batch (there are no parts: the GPU is the parallelism), enqueued on the
 * calling thread's nn_cuda stream.
 *
 * The planning and the initialization are copies of model.c's (they are
 * static there); the GPU tests compare n_params, the description and the
 * initial parameters with a CPU model, so a drift shows up as a failure.
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
#include "table.h"
}

#define MAX_LAYERS 32
#define MAX_CROSS 64

typedef enum init_e { INIT_ZERO = 0, INIT_HE, INIT_XAVIER } init_t;

typedef struct tensor_s {
  size_t off, len;
  init_t init;
  uint32_t fan_in, fan_out;
} tensor_t;

typedef struct lin_s {
  uint32_t in, out;
  size_t w, b;
  nn_act_t act;
} lin_t;

typedef struct mlp_s {
  uint32_t n;
  lin_t l[MAX_LAYERS];
  float *y[MAX_LAYERS];  /* device [max_batch x out] */
  float *dy[MAX_LAYERS];
} mlp_t;

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

static const char *const kind_names[] = {"dlrm", "wdl", "deepfm", "dcn", "dlrm_dcn"};

static cudaStream_t stream(void) { return (cudaStream_t)nn_cuda_stream(); }

/* ----------------------------------------------------------------- planning
 * (model.c's, line for line) */

static size_t add_tensor(model_cuda_t *m, size_t len, init_t init, uint32_t fan_in,
                         uint32_t fan_out) {
  ASSERT(m->n_tensors < sizeof(m->tensors) / sizeof(m->tensors[0]));
  tensor_t *t = &m->tensors[m->n_tensors++];
  t->off = m->n_params;
  t->len = len;
  t->init = init;
  t->fan_in = fan_in;
  t->fan_out = fan_out;
  m->n_params += len;
  return t->off;
}

static lin_t plan_linear(model_cuda_t *m, uint32_t in, uint32_t out, nn_act_t act) {
  lin_t l;
  memset(&l, 0, sizeof(l));
  l.in = in;
  l.out = out;
  l.act = act;
  l.w = add_tensor(m, (size_t)in * out, act == NN_ACT_RELU ? INIT_HE : INIT_XAVIER, in, out);
  l.b = add_tensor(m, out, INIT_ZERO, in, out);
  return l;
}

static int plan_mlp(model_cuda_t *m, mlp_t *p, uint32_t in, const uint32_t *sizes, size_t k,
                    uint32_t final_out) {
  p->n = 0;
  if (k + (final_out > 0) > MAX_LAYERS) return -EINVAL;
  for (size_t i = 0; i < k; i++) {
    p->l[p->n++] = plan_linear(m, in, sizes[i], NN_ACT_RELU);
    in = sizes[i];
  }
  if (final_out) p->l[p->n++] = plan_linear(m, in, final_out, NN_ACT_NONE);
  return 0;
}

static uint32_t mlp_out(const mlp_t *p, uint32_t in) { return p->n ? p->l[p->n - 1].out : in; }

static int parse_sizes(const cfg_t *cfg, const char *key, uint32_t *sizes, size_t *k, char *err,
                       size_t err_len) {
  char **items = NULL;
  size_t n = 0;
  int rc = cfg_list(cfg, key, &items, &n);
  if (rc < 0) {
    snprintf(err, err_len, "%s: %s", key, err_str(rc));
    return rc;
  }
  if (n > MAX_LAYERS - 1) {
    snprintf(err, err_len, "%s: %zu layers, at most %d", key, n, MAX_LAYERS - 1);
    rc = ERR_CONFIG;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(items[i], &end, 10);
    if (errno || !end || *end || end == items[i] || v == 0 || v > (1ul << 20)) {
      snprintf(err, err_len, "%s: '%s' is not a layer size in [1, 1048576]", key, items[i]);
      rc = ERR_CONFIG;
      goto out;
    }
    sizes[i] = (uint32_t)v;
  }
  *k = n;
out:
  cfg_list_free(items, n);
  return rc;
}

static void describe_mlp(char *buf, size_t len, const char *name, const mlp_t *p) {
  size_t o = strlen(buf);
  if (p->n == 0 || o >= len) return;
  o += (size_t)snprintf(buf + o, len - o, " %s=%u", name, p->l[0].in);
  for (uint32_t i = 0; i < p->n && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "-%u", p->l[i].out);
}

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

/* dlrm_dcn: model_dlrm_dcn.c's model__dcn2_plan, line for line. */
static int plan_dcn2(model_cuda_t *m, const cfg_t *cfg, char *err, size_t err_len) {
  int rc;
  uint32_t s1[MAX_LAYERS], s2[MAX_LAYERS];
  size_t k1 = 0, k2 = 0;
  if ((rc = parse_sizes(cfg, "model.bottom_mlp", s1, &k1, err, err_len)) < 0) return rc;
  if ((rc = parse_sizes(cfg, "model.top_mlp", s2, &k2, err, err_len)) < 0) return rc;
  int64_t L = cfg_int(cfg, "model.cross_layers"), r = cfg_int(cfg, "model.cross_rank");
  if (L < 0 || L > MAX_CROSS) {
    snprintf(err, err_len, "model.cross_layers: %lld not in [0, %d]", (long long)L, MAX_CROSS);
    return ERR_CONFIG;
  }
  if (r < 0 || r > (1 << 20)) {
    snprintf(err, err_len, "model.cross_rank: %lld not in [0, 1048576]", (long long)r);
    return ERR_CONFIG;
  }
  m->has_bottom = m->n_dense > 0;
  m->d0 = (m->has_bottom ? m->dim : 0) + m->emb_w;
  m->n_cross = (uint32_t)L;
  m->rank = (uint32_t)r;
  if (m->has_bottom) {
    s1[k1++] = m->dim;
    plan_mlp(m, &m->bottom, m->n_dense, s1, k1, 0);
  }
  uint32_t d = m->d0, rk = m->rank;
  for (uint32_t l = 0; l < m->n_cross; l++) {
    if (rk) {
      m->cross_v[l] = add_tensor(m, (size_t)rk * d, INIT_XAVIER, d, rk);
      m->cross_w[l] = add_tensor(m, (size_t)d * rk, INIT_XAVIER, rk, d);
    } else {
      m->cross_w[l] = add_tensor(m, (size_t)d * d, INIT_XAVIER, d, d);
    }
    m->cross_b[l] = add_tensor(m, d, INIT_ZERO, d, d);
  }
  plan_mlp(m, &m->top, d, s2, k2, 1);
  return 0;
}

/* The layers of m->kind (tensors added in this order: it is the parameter
 * layout, the same as model.c's).  0, or ERR_CONFIG / -EINVAL with err
 * set. */
static int plan_layers(model_cuda_t *m, const cfg_t *cfg, char *err, size_t err_len) {
  int rc;
  uint32_t s1[MAX_LAYERS], s2[MAX_LAYERS];
  size_t k1 = 0, k2 = 0;
  uint32_t n_dense = m->n_dense, n_tables = m->n_tables, dim = m->dim;
  if (m->kind == MODEL_DLRM_DCN) return plan_dcn2(m, cfg, err, err_len);
  if (m->kind == MODEL_DLRM) {
    if ((rc = parse_sizes(cfg, "model.bottom_mlp", s1, &k1, err, err_len)) < 0) return rc;
    if ((rc = parse_sizes(cfg, "model.top_mlp", s2, &k2, err, err_len)) < 0) return rc;
    m->has_bottom = n_dense > 0;
    /* the same limit as the CPU model, so both accept the same configs */
    if (!nn_interact_fits(n_tables, dim, m->has_bottom)) {
      snprintf(err, err_len, "dlrm: interaction of %u vectors of %u floats is too large",
               n_tables + (m->has_bottom ? 1 : 0), dim);
      return -EINVAL;
    }
    if (m->has_bottom) {
      s1[k1++] = dim;
      plan_mlp(m, &m->bottom, n_dense, s1, k1, 0);
    }
    m->inter_w = nn_interact_out_width(n_tables, dim, m->has_bottom);
    if (m->inter_w == 0) {
      snprintf(err, err_len, "dlrm: nothing to interact (one table, no dense features)");
      return -EINVAL;
    }
    plan_mlp(m, &m->top, m->inter_w, s2, k2, 1);
  } else {
    if ((rc = parse_sizes(cfg, "model.deep_mlp", s1, &k1, err, err_len)) < 0) return rc;
    if (m->kind == MODEL_DCN) {
      int64_t L = cfg_int(cfg, "model.cross_layers");
      if (L < 0 || L > MAX_CROSS) {
        snprintf(err, err_len, "model.cross_layers: %lld not in [0, %d]", (long long)L, MAX_CROSS);
        return ERR_CONFIG;
      }
      m->n_cross = (uint32_t)L;
      for (uint32_t l = 0; l < m->n_cross; l++) {
        m->cross_w[l] = add_tensor(m, m->d0, INIT_XAVIER, m->d0, 1);
        m->cross_b[l] = add_tensor(m, m->d0, INIT_ZERO, m->d0, 1);
      }
      plan_mlp(m, &m->deep, m->d0, s1, k1, 0);
      uint32_t fin = m->d0 + (m->deep.n ? mlp_out(&m->deep, m->d0) : 0);
      m->final = plan_linear(m, fin, 1, NN_ACT_NONE);
    } else {
      m->wide = plan_linear(m, m->d0, 1, NN_ACT_NONE);
      plan_mlp(m, &m->deep, m->d0, s1, k1, 1);
    }
  }
  return 0;
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

/* m->desc: the kind, the layers' widths and the parameter count. */
static void describe(model_cuda_t *m) {
  size_t o;
  snprintf(m->desc, sizeof(m->desc), "%s", kind_names[m->kind]);
  if (m->kind == MODEL_DLRM_DCN) {
    describe_mlp(m->desc, sizeof(m->desc), "bottom", &m->bottom);
    o = strlen(m->desc);
    if (m->rank)
      snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u cross=%ux%u", m->d0, m->n_cross, m->rank);
    else
      snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u cross=%uxfull", m->d0, m->n_cross);
    describe_mlp(m->desc, sizeof(m->desc), "top", &m->top);
  } else if (m->kind == MODEL_DLRM) {
    describe_mlp(m->desc, sizeof(m->desc), "bottom", &m->bottom);
    o = strlen(m->desc);
    snprintf(m->desc + o, sizeof(m->desc) - o, " interaction=%ux%u->%u",
             m->n_tables + (m->has_bottom ? 1 : 0), m->dim, m->inter_w);
    describe_mlp(m->desc, sizeof(m->desc), "top", &m->top);
  } else {
    o = strlen(m->desc);
    snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u", m->d0);
    if (m->kind == MODEL_DCN) {
      o = strlen(m->desc);
      snprintf(m->desc + o, sizeof(m->desc) - o, " cross=%u", m->n_cross);
    }
    describe_mlp(m->desc, sizeof(m->desc), "deep", &m->deep);
    if (m->kind == MODEL_DCN) {
      o = strlen(m->desc);
      snprintf(m->desc + o, sizeof(m->desc) - o, " final=%u-1", m->final.in);
    }
  }
  o = strlen(m->desc);
  snprintf(m->desc + o, sizeof(m->desc) - o, " params=%zu", m->n_params);
}

int model_cuda_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                      uint32_t max_batch, model_cuda_t **out, char *err, size_t err_len) {
  int rc = 0;
  model_cuda_t *m = NULL;
  model_kind_t kind;
  *out = NULL;
  if (err_len) err[0] = 0;

  if (model_kind_parse(cfg_str(cfg, "model"), &kind) < 0) {
    snprintf(err, err_len, "model: unknown model '%s'", cfg_str(cfg, "model"));
    return ERR_CONFIG;
  }
  if (max_batch == 0 || dim == 0 || (n_dense == 0 && n_tables == 0)) {
    snprintf(err, err_len,
             "model: needs max_batch, dim and some input (n_dense=%u n_tables=%u dim=%u max_batch=%u)",
             n_dense, n_tables, dim, max_batch);
    return -EINVAL;
  }
  if ((uint64_t)n_tables * dim > (1u << 24) || n_dense > (1u << 24)) {
    snprintf(err, err_len, "model: input too wide (n_dense=%u n_tables=%u dim=%u)", n_dense,
             n_tables, dim);
    return -EINVAL;
  }
  m = (model_cuda_t *)calloc(1, sizeof(*m));
  if (!m) return -ENOMEM;
  m->kind = kind;
  m->n_dense = n_dense;
  m->n_tables = n_tables;
  m->dim = dim;
  m->max_batch = max_batch;
  m->emb_w = n_tables * dim;
  m->d0 = n_dense + m->emb_w;

  if ((rc = plan_layers(m, cfg, err, err_len)) < 0) goto out;

  /* the shape is valid: now the device */
  if ((rc = cuda_check(err, err_len)) < 0) goto out;
  if ((rc = nn_cuda_reserve(max_batch)) < 0) goto cuda_failed;
  if (dalloc_buffers(m) < 0) goto cuda_failed;
  describe(m);
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

/* model.c's unif: uniform in [-1, 1) from (seed, tensor, element). */
static inline float unif(uint64_t tseed, size_t i) {
  uint64_t r = table_mix64(tseed + (uint64_t)i * UINT64_C(0xd1b54a32d192ed03));
  return (float)((double)(r >> 40) * (1.0 / 8388608.0) - 1.0);
}

void model_cuda_init(model_cuda_t *m, uint64_t seed) {
  float *host = (float *)malloc((m->n_params ? m->n_params : 1) * sizeof(float));
  if (!host) {
    (void)nn_cuda__ok((int)cudaErrorMemoryAllocation, "model_cuda_init (host staging buffer)");
    return;
  }
  for (uint32_t t = 0; t < m->n_tensors; t++) {
    const tensor_t *ts = &m->tensors[t];
    float *p = host + ts->off;
    double lim = 0.0;
    if (ts->init == INIT_HE)
      lim = sqrt(6.0 / (double)ts->fan_in);
    else if (ts->init == INIT_XAVIER)
      lim = sqrt(6.0 / ((double)ts->fan_in + (double)ts->fan_out));
    uint64_t tseed = table_mix64(seed ^ (UINT64_C(0x6d6f64656c) + ((uint64_t)t << 32)));
    for (size_t i = 0; i < ts->len; i++) p[i] = lim > 0.0 ? (float)(lim * unif(tseed, i)) : 0.0f;
  }
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
