/*
 * model: DLRM, Wide&Deep, DeepFM and Deep&Cross over nn.h (see model.h for
 * the architectures, the parameter layout and the initialization).
 *
 * model_create plans the parameter tensors in layout order, allocates the
 * one parameter array and the one gradient array, and every activation and
 * activation-gradient buffer for max_batch samples; forward and backward
 * then only run layers over those buffers.  Buffers are 64-byte aligned so
 * the GEMMs and the vectorized loops start on cache lines.
 *
 * A step is cut into MODEL_PARTS parts of rows (model.h, "threads"): each
 * part's forward and backward read and write only its rows of the shared
 * activation buffers and its own gradient buffer, so parts run on any
 * thread with no locking; the backward runs layer by layer ("stages",
 * below) and sums each layer's part gradients in part order, sliced by
 * parameter index across the threads, while the next layer computes.
 */
#include "model.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "model_internal.h"
#include "nn.h"
#include "pool.h"
#include "table.h"


static uint32_t n_stages(const model_t *m);
static size_t stage_lo(const model_t *m, uint32_t s);

static const char *const kind_names[] = {"dlrm", "wdl", "deepfm", "dcn", "dlrm_dcn"};
#define N_KINDS 5

int model_kind_parse(const char *name, model_kind_t *out) {
  for (int k = 0; k < N_KINDS; k++)
    if (name && strcmp(name, kind_names[k]) == 0) {
      *out = (model_kind_t)k;
      return 0;
    }
  return -EINVAL;
}

const char *model_kind_name(model_kind_t k) {
  return (unsigned)k < N_KINDS ? kind_names[k] : "?";
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void add_floats(float *restrict d, const float *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

/* ----------------------------------------------------------------- planning */

size_t model__add_tensor(model_t *m, size_t len, init_t init, uint32_t fan_in,
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

static lin_t plan_linear(model_t *m, uint32_t in, uint32_t out, nn_act_t act) {
  lin_t l = {.in = in, .out = out, .act = act};
  l.w = model__add_tensor(m, (size_t)in * out, act == NN_ACT_RELU ? INIT_HE : INIT_XAVIER, in, out);
  l.b = model__add_tensor(m, out, INIT_ZERO, in, out);
  return l;
}

/* An MLP in -> sizes[0] -> ... -> sizes[k-1] (-> final_out when > 0);
 * ReLU after every layer except an appended final_out layer. */
int model__plan_mlp(model_t *m, mlp_t *p, uint32_t in, const uint32_t *sizes, size_t k,
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

static uint32_t mlp_out(const mlp_t *p, uint32_t in) {
  return p->n ? p->l[p->n - 1].out : in;
}

/* ----------------------------------------------------------------- memory */

float *model__alloc(model_t *m, size_t n) {
  size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
  if (bytes == 0) bytes = 64;
  ASSERT(m->n_allocs < sizeof(m->allocs) / sizeof(m->allocs[0]));
  float *p = aligned_alloc(64, bytes);
  if (p) {
    memset(p, 0, bytes);
    m->allocs[m->n_allocs++] = p;
  }
  return p;
}

int model__alloc_mlp(model_t *m, mlp_t *p) {
  for (uint32_t i = 0; i < p->n; i++) {
    p->y[i] = model__alloc(m, (size_t)m->max_batch * p->l[i].out);
    p->dy[i] = model__alloc(m, (size_t)m->max_batch * p->l[i].out);
    if (!p->y[i] || !p->dy[i]) return -ENOMEM;
  }
  return 0;
}

/* ----------------------------------------------------------------- config */

int model__parse_sizes(const cfg_t *cfg, const char *key, uint32_t *sizes, size_t *k,
                       char *err, size_t err_len) {
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

void model__describe_mlp(char *buf, size_t len, const char *name, const mlp_t *p) {
  size_t o = strlen(buf);
  if (p->n == 0 || o >= len) return;
  o += (size_t)snprintf(buf + o, len - o, " %s=%u", name, p->l[0].in);
  for (uint32_t i = 0; i < p->n && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "-%u", p->l[i].out);
}

/* ----------------------------------------------------------------- create */

/* The layers of m->kind (tensors added in this order: it is the parameter
 * layout).  0, or ERR_CONFIG / -EINVAL with err set. */
static int plan_layers(model_t *m, const cfg_t *cfg, char *err, size_t err_len) {
  int rc;
  uint32_t s1[MAX_LAYERS], s2[MAX_LAYERS];
  size_t k1 = 0, k2 = 0;
  uint32_t n_dense = m->n_dense, n_tables = m->n_tables, dim = m->dim;
  if (m->kind == MODEL_DLRM_DCN) return model__dcn2_plan(m, cfg, err, err_len);
  if (m->kind == MODEL_DLRM) {
    if ((rc = model__parse_sizes(cfg, "model.bottom_mlp", s1, &k1, err, err_len)) < 0) return rc;
    if ((rc = model__parse_sizes(cfg, "model.top_mlp", s2, &k2, err, err_len)) < 0) return rc;
    m->has_bottom = n_dense > 0;
    uint32_t f = n_tables + (m->has_bottom ? 1 : 0);
    if (!nn_interact_fits(n_tables, dim, m->has_bottom)) {
      snprintf(err, err_len, "dlrm: interaction of %u vectors of %u floats is too large", f, dim);
      return -EINVAL;
    }
    if (m->has_bottom) {
      s1[k1++] = dim; /* the bottom MLP ends at the embedding dimension */
      model__plan_mlp(m, &m->bottom, n_dense, s1, k1, 0);
    }
    m->inter_w = nn_interact_out_width(n_tables, dim, m->has_bottom);
    if (m->inter_w == 0) {
      snprintf(err, err_len, "dlrm: nothing to interact (one table, no dense features)");
      return -EINVAL;
    }
    model__plan_mlp(m, &m->top, m->inter_w, s2, k2, 1);
  } else {
    if ((rc = model__parse_sizes(cfg, "model.deep_mlp", s1, &k1, err, err_len)) < 0) return rc;
    if (m->kind == MODEL_DCN) {
      int64_t L = cfg_int(cfg, "model.cross_layers");
      if (L < 0 || L > MAX_CROSS) {
        snprintf(err, err_len, "model.cross_layers: %lld not in [0, %d]", (long long)L, MAX_CROSS);
        return ERR_CONFIG;
      }
      m->n_cross = (uint32_t)L;
      for (uint32_t l = 0; l < m->n_cross; l++) {
        m->cross_w[l] = model__add_tensor(m, m->d0, INIT_XAVIER, m->d0, 1);
        m->cross_b[l] = model__add_tensor(m, m->d0, INIT_ZERO, m->d0, 1);
      }
      model__plan_mlp(m, &m->deep, m->d0, s1, k1, 0);
      uint32_t fin = m->d0 + (m->deep.n ? mlp_out(&m->deep, m->d0) : 0);
      m->final = plan_linear(m, fin, 1, NN_ACT_NONE);
    } else {
      m->wide = plan_linear(m, m->d0, 1, NN_ACT_NONE);
      model__plan_mlp(m, &m->deep, m->d0, s1, k1, 1);
    }
  }
  return 0;
}

/* The parameters, gradients and every activation buffer for max_batch
 * samples; m->zbuf set.  0 or -ENOMEM (what was allocated is in m->allocs). */
static int alloc_buffers(model_t *m) {
  size_t B = m->max_batch;
  m->params = model__alloc(m, m->n_params);
  m->grads = model__alloc(m, m->n_params);
  m->dlogits = model__alloc(m, B);
  if (!m->params || !m->grads || !m->dlogits) return -ENOMEM;
  m->pgrads[0] = m->grads;
  for (uint32_t k = 1; k < MODEL_PARTS; k++)
    if (!(m->pgrads[k] = model__alloc(m, m->n_params))) return -ENOMEM;
  if (m->kind == MODEL_DLRM_DCN) return model__dcn2_alloc(m);
  if (m->kind == MODEL_DLRM) {
    if (model__alloc_mlp(m, &m->bottom) < 0 || model__alloc_mlp(m, &m->top) < 0) return -ENOMEM;
    m->inter = model__alloc(m, B * m->inter_w);
    m->d_inter = model__alloc(m, B * m->inter_w);
    m->d_emb_scratch = model__alloc(m, B * m->emb_w);
    if (!m->inter || !m->d_inter || !m->d_emb_scratch) return -ENOMEM;
  } else {
    m->x0 = model__alloc(m, B * m->d0);
    m->dx0 = model__alloc(m, B * m->d0);
    if (!m->x0 || !m->dx0 || model__alloc_mlp(m, &m->deep) < 0) return -ENOMEM;
    if (m->kind == MODEL_DCN) {
      m->xl[0] = m->x0;
      for (uint32_t l = 0; l < m->n_cross; l++) {
        m->xl[l + 1] = model__alloc(m, B * m->d0);
        m->sl[l] = model__alloc(m, B);
        if (!m->xl[l + 1] || !m->sl[l]) return -ENOMEM;
      }
      m->dxl = model__alloc(m, B * m->d0);
      m->final_y = model__alloc(m, B);
      if (!m->dxl || !m->final_y) return -ENOMEM;
      if (m->deep.n) {
        m->cat = model__alloc(m, B * m->final.in);
        m->dcat = model__alloc(m, B * m->final.in);
        if (!m->cat || !m->dcat) return -ENOMEM;
      }
    } else {
      m->wide_y = model__alloc(m, B);
      m->wide_dy = model__alloc(m, B);
      m->fm_y = model__alloc(m, B);
      if (!m->wide_y || !m->wide_dy || !m->fm_y) return -ENOMEM;
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
static void describe(model_t *m) {
  snprintf(m->desc, sizeof(m->desc), "%s", kind_names[m->kind]);
  if (m->kind == MODEL_DLRM_DCN) {
    model__dcn2_describe(m);
  } else if (m->kind == MODEL_DLRM) {
    model__describe_mlp(m->desc, sizeof(m->desc), "bottom", &m->bottom);
    size_t o = strlen(m->desc);
    snprintf(m->desc + o, sizeof(m->desc) - o, " interaction=%ux%u->%u",
             m->n_tables + (m->has_bottom ? 1 : 0), m->dim, m->inter_w);
    model__describe_mlp(m->desc, sizeof(m->desc), "top", &m->top);
  } else {
    size_t o = strlen(m->desc);
    snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u", m->d0);
    if (m->kind == MODEL_DCN) {
      o = strlen(m->desc);
      snprintf(m->desc + o, sizeof(m->desc) - o, " cross=%u", m->n_cross);
    }
    model__describe_mlp(m->desc, sizeof(m->desc), "deep", &m->deep);
    if (m->kind == MODEL_DCN) {
      o = strlen(m->desc);
      snprintf(m->desc + o, sizeof(m->desc) - o, " final=%u-1", m->final.in);
    }
  }
  size_t o = strlen(m->desc);
  snprintf(m->desc + o, sizeof(m->desc) - o, " params=%zu", m->n_params);
}

int model__plan(model_t *m, const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                uint32_t max_batch, char *err, size_t err_len) {
  int rc;
  if (err_len) err[0] = 0;
  model_kind_t kind;
  if (model_kind_parse(cfg_str(cfg, "model"), &kind) < 0) {
    snprintf(err, err_len, "model: unknown model '%s'", cfg_str(cfg, "model"));
    return ERR_CONFIG;
  }
  if (max_batch == 0 || dim == 0 || (n_dense == 0 && n_tables == 0)) {
    snprintf(err, err_len, "model: needs max_batch, dim and some input (n_dense=%u n_tables=%u dim=%u max_batch=%u)",
             n_dense, n_tables, dim, max_batch);
    return -EINVAL;
  }
  if ((uint64_t)n_tables * dim > (1u << 24) || n_dense > (1u << 24)) {
    snprintf(err, err_len, "model: input too wide (n_dense=%u n_tables=%u dim=%u)", n_dense,
             n_tables, dim);
    return -EINVAL;
  }
  m->kind = kind;
  m->n_dense = n_dense;
  m->n_tables = n_tables;
  m->dim = dim;
  m->max_batch = max_batch;
  m->emb_w = n_tables * dim;
  m->d0 = n_dense + m->emb_w;
  if ((rc = plan_layers(m, cfg, err, err_len)) < 0) return rc;
  describe(m);
  return 0;
}

int model_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                 uint32_t max_batch, model_t **out, char *err, size_t err_len) {
  int rc = 0;
  model_t *m = NULL;
  *out = NULL;
  if (err_len) err[0] = 0;

  m = calloc(1, sizeof(*m));
  if (!m) return -ENOMEM;
  if ((rc = model__plan(m, cfg, n_dense, n_tables, dim, max_batch, err, err_len)) < 0) goto out;
  if ((rc = alloc_buffers(m)) < 0) {
    snprintf(err, err_len, "model: out of memory");
    goto out;
  }

  /* the stages must report suffixes ending at 0 (see "backward") */
  for (uint32_t st = 0, S = n_stages(m); st < S; st++) {
    ASSERT_OP(stage_lo(m, st), <=, st ? stage_lo(m, st - 1) : (size_t)m->n_params);
    if (st + 1 == S) ASSERT_OP(stage_lo(m, st), ==, 0);
  }
  if ((rc = model_set_threads(m, 0)) < 0) /* still correct, only slower */
    log_warn("model: cannot start threads, running single-threaded err=%s", err_str(rc));
  *out = m;
  return 0;

out:
  model_destroy(m);
  return rc;
}

void model_destroy(model_t *m) {
  if (!m) return;
  pool_destroy(m->pool);
  for (uint32_t i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
  free(m);
}

/* ----------------------------------------------------------------- init */

/* Uniform in [-1, 1) from (seed, tensor, element): 24 random bits. */
static inline float unif(uint64_t tseed, size_t i) {
  uint64_t r = table_mix64(tseed + (uint64_t)i * UINT64_C(0xd1b54a32d192ed03));
  return (float)((double)(r >> 40) * (1.0 / 8388608.0) - 1.0);
}

void model__init_params(const tensor_t *tensors, uint32_t n_tensors, uint64_t seed, float *params) {
  for (uint32_t t = 0; t < n_tensors; t++) {
    const tensor_t *ts = &tensors[t];
    float *p = params + ts->off;
    double lim = 0.0;
    if (ts->init == INIT_HE)
      lim = sqrt(6.0 / (double)ts->fan_in);
    else if (ts->init == INIT_XAVIER)
      lim = sqrt(6.0 / ((double)ts->fan_in + (double)ts->fan_out));
    uint64_t tseed = table_mix64(seed ^ (UINT64_C(0x6d6f64656c) + ((uint64_t)t << 32)));
    for (size_t i = 0; i < ts->len; i++) p[i] = lim > 0.0 ? (float)(lim * unif(tseed, i)) : 0.0f;
  }
}

void model_init(model_t *m, uint64_t seed) {
  model__init_params(m->tensors, m->n_tensors, seed, m->params);
  for (uint32_t k = 0; k < MODEL_PARTS; k++) memset(m->pgrads[k], 0, m->n_params * sizeof(float));
}

model_kind_t model_kind(const model_t *m) { return m->kind; }
size_t model_n_params(const model_t *m) { return m->n_params; }
float *model_params(model_t *m) { return m->params; }
float *model_grads(model_t *m) { return m->grads; }
uint32_t model_max_batch(const model_t *m) { return m->max_batch; }
const char *model_describe(const model_t *m) { return m->desc; }

/* ----------------------------------------------------------------- layers */

/* Rows [i0, i0 + n) of a per-sample buffer of width w. */
#define ROWS MODEL_ROWS

static void lin_fwd(model_t *m, const lin_t *l, uint32_t n, const float *x, float *y) {
  nn_linear_fwd(x, n, l->in, l->out, m->params + l->w, m->params + l->b, l->act, y);
}

static void lin_bwd(model_t *m, const part_t *p, const lin_t *l, const float *x,
                    const float *y, float *dy, float *dx, int acc) {
  nn_linear_bwd(x, y, dy, p->n, l->in, l->out, m->params + l->w, l->act, p->g + l->w,
                p->g + l->b, dx, acc);
}

/* Forward of an MLP over the part's rows of x; returns its output rows. */
const float *model__mlp_fwd(model_t *m, mlp_t *q, const part_t *p, const float *x) {
  for (uint32_t i = 0; i < q->n; i++) {
    float *y = ROWS(q->y[i], q->l[i].out);
    lin_fwd(m, &q->l[i], p->n, x, y);
    x = y;
  }
  return x;
}

static void concat_x0(model_t *m, const part_t *p, const float *dense, const float *emb) {
  const float *src[2] = {dense, emb};
  size_t stride[2] = {m->n_dense, m->emb_w};
  uint32_t width[2] = {m->n_dense, m->emb_w};
  uint32_t k = m->n_dense ? 0 : 1; /* no dense piece without dense features */
  nn_concat_fwd(p->n, 2 - k, src + k, stride + k, width + k, ROWS(m->x0, m->d0), m->d0);
}

static void split_dx0(model_t *m, const part_t *p, float *d_emb) {
  if (!d_emb || m->emb_w == 0) return;
  float *dst[2] = {NULL, d_emb};
  size_t stride[2] = {m->n_dense, m->emb_w};
  uint32_t width[2] = {m->n_dense, m->emb_w};
  nn_concat_bwd(p->n, 2, ROWS(m->dx0, m->d0), m->d0, width, dst, stride, 0);
}

/* ----------------------------------------------------------------- forward */

static void forward_part(model_t *m, const part_t *p) {
  uint32_t n = p->n;
  if (n == 0) return;
  const float *dense = m->n_dense ? ROWS(m->dense, m->n_dense) : NULL;
  const float *emb = ROWS(m->emb, m->emb_w);
  switch (m->kind) {
    case MODEL_DLRM: {
      const float *bot = m->has_bottom ? model__mlp_fwd(m, &m->bottom, p, dense) : NULL;
      float *inter = ROWS(m->inter, m->inter_w);
      nn_interact_fwd(bot, m->dim, emb, m->emb_w, n, m->n_tables, m->dim, inter, m->inter_w);
      model__mlp_fwd(m, &m->top, p, inter);
      break;
    }
    case MODEL_WDL:
    case MODEL_DEEPFM: {
      concat_x0(m, p, dense, emb);
      const float *x0 = ROWS(m->x0, m->d0);
      float *wide = ROWS(m->wide_y, 1);
      lin_fwd(m, &m->wide, n, x0, wide);
      float *y = (float *)model__mlp_fwd(m, &m->deep, p, x0); /* the logits accumulate here */
      if (m->kind == MODEL_DEEPFM) {
        float *fm = ROWS(m->fm_y, 1);
        nn_fm_fwd(emb, m->emb_w, n, m->n_tables, m->dim, fm);
        for (uint32_t i = 0; i < n; i++) y[i] = (wide[i] + y[i]) + fm[i];
      } else {
        for (uint32_t i = 0; i < n; i++) y[i] = wide[i] + y[i];
      }
      break;
    }
    case MODEL_DLRM_DCN:
      model__dcn2_forward(m, p);
      break;
    case MODEL_DCN: {
      concat_x0(m, p, dense, emb);
      const float *x0 = ROWS(m->x0, m->d0);
      const float *w[MAX_CROSS], *b[MAX_CROSS];
      float *sl[MAX_CROSS], *xl[MAX_CROSS + 1];
      for (uint32_t l = 0; l < m->n_cross; l++) {
        w[l] = m->params + m->cross_w[l];
        b[l] = m->params + m->cross_b[l];
        sl[l] = ROWS(m->sl[l], 1);
        xl[l + 1] = ROWS(m->xl[l + 1], m->d0);
      }
      nn_cross_stack_fwd(x0, n, m->d0, m->n_cross, w, b, sl, xl);
      const float *fin = ROWS(m->xl[m->n_cross], m->d0);
      if (m->deep.n) {
        uint32_t hw = mlp_out(&m->deep, m->d0);
        const float *src[2] = {fin, model__mlp_fwd(m, &m->deep, p, x0)};
        size_t stride[2] = {m->d0, hw};
        uint32_t width[2] = {m->d0, hw};
        nn_concat_fwd(n, 2, src, stride, width, ROWS(m->cat, m->final.in), m->final.in);
        fin = ROWS(m->cat, m->final.in);
      }
      lin_fwd(m, &m->final, n, fin, ROWS(m->final_y, 1));
      break;
    }
  }
}

/* ----------------------------------------------------------------- backward */

/* The backward runs in STAGES, each one layer (or a parameter-free piece
 * merged with its neighbour) over every part, in reverse layout order: the
 * parameters whose gradients are final after stage s form a suffix
 * [stage_lo(s), n_params) of the array, because every model lays its
 * tensors out in forward order (model.h).  Between stages the threads meet
 * once; that lets the part gradients of stage s-1 be summed while stage s
 * computes, and lets model_backward report each finished suffix to a hook
 * (model_set_grad_ready) that starts communicating it while the rest of
 * the backward runs.  Stages change when work happens, never what is
 * computed: the same layer calls with the same arguments as one
 * uninterrupted backward, the same part-order sums. */

/* Backward of layer i of q for part p, from the part's rows of q->dy[i]:
 * the input gradient goes to q->dy[i-1], or to dx (added to when acc) for
 * layer 0 with input x. */
void model__mlp_bwd_layer(model_t *m, mlp_t *q, const part_t *p, uint32_t i, const float *x, float *dx,
                          int acc) {
  const float *xi = i ? ROWS(q->y[i - 1], q->l[i - 1].out) : x;
  float *dxi = i ? ROWS(q->dy[i - 1], q->l[i - 1].out) : dx;
  lin_bwd(m, p, &q->l[i], xi, ROWS(q->y[i], q->l[i].out), ROWS(q->dy[i], q->l[i].out), dxi, i ? 0 : acc);
}

static uint32_t n_stages(const model_t *m) {
  switch (m->kind) {
    case MODEL_DLRM: return m->top.n + 1 + (m->has_bottom ? m->bottom.n : 0);
    case MODEL_WDL:
    case MODEL_DEEPFM: return m->deep.n + 1;
    case MODEL_DCN: return m->deep.n + 2;
    case MODEL_DLRM_DCN: return model__dcn2_stages(m);
  }
  return 0;
}

/* The lowest parameter offset whose gradient is final after stage s. */
static size_t stage_lo(const model_t *m, uint32_t s) {
  switch (m->kind) {
    case MODEL_DLRM:
      if (s < m->top.n) return m->top.l[m->top.n - 1 - s].w;
      if (s == m->top.n) return m->top.l[0].w; /* the interaction: no parameters */
      return m->bottom.l[m->bottom.n - 1 - (s - m->top.n - 1)].w;
    case MODEL_WDL:
    case MODEL_DEEPFM:
      return s < m->deep.n ? m->deep.l[m->deep.n - 1 - s].w : m->wide.w;
    case MODEL_DCN:
      if (s == 0) return m->final.w;
      if (s <= m->deep.n) return m->deep.l[m->deep.n - s].w;
      return m->n_cross ? m->cross_w[0] : stage_lo(m, s - 1);
    case MODEL_DLRM_DCN:
      return model__dcn2_stage_lo(m, s);
  }
  return 0;
}

/* Note on the deep tower's output in wdl/deepfm: its y buffer holds the
 * final logit (wide + deep [+ fm]); the ReLU-free last layer's backward
 * never reads y, so reusing it is safe. */
static void backward_stage(model_t *m, part_t *p, uint32_t s) {
  uint32_t n = p->n;
  float *dl = ROWS(m->dlogits, 1);
  float *d_emb = m->d_emb_out ? ROWS(m->d_emb_out, m->emb_w) : NULL;
  if (s == 0) p->loss = nn_bce_logits_bwd(ROWS(m->zbuf, 1), ROWS(m->labels, 1), n, m->scale, dl);
  switch (m->kind) {
    case MODEL_DLRM: {
      float *inter = ROWS(m->inter, m->inter_w), *d_inter = ROWS(m->d_inter, m->inter_w);
      if (s < m->top.n) {
        if (s == 0) memcpy(ROWS(m->top.dy[m->top.n - 1], 1), dl, (size_t)n * sizeof(float));
        model__mlp_bwd_layer(m, &m->top, p, m->top.n - 1 - s, inter, d_inter, 0);
      } else if (s == m->top.n) {
        uint32_t lb = m->bottom.n - 1;
        const float *bot = m->has_bottom ? ROWS(m->bottom.y[lb], m->dim) : NULL;
        float *dbot = m->has_bottom ? ROWS(m->bottom.dy[lb], m->dim) : NULL;
        nn_interact_bwd(bot, m->dim, ROWS(m->emb, m->emb_w), m->emb_w, n, m->n_tables, m->dim, d_inter,
                        m->inter_w, dbot, d_emb ? d_emb : ROWS(m->d_emb_scratch, m->emb_w), m->emb_w);
      } else {
        model__mlp_bwd_layer(m, &m->bottom, p, m->bottom.n - 1 - (s - m->top.n - 1), ROWS(m->dense, m->n_dense), NULL,
                      0);
      }
      break;
    }
    case MODEL_WDL:
    case MODEL_DEEPFM: {
      const float *x0 = ROWS(m->x0, m->d0);
      float *dx0 = ROWS(m->dx0, m->d0);
      if (s < m->deep.n) {
        if (s == 0) {
          memcpy(ROWS(m->deep.dy[m->deep.n - 1], 1), dl, (size_t)n * sizeof(float));
          memcpy(ROWS(m->wide_dy, 1), dl, (size_t)n * sizeof(float));
        }
        model__mlp_bwd_layer(m, &m->deep, p, m->deep.n - 1 - s, x0, dx0, 0);
      } else {
        lin_bwd(m, p, &m->wide, x0, ROWS(m->wide_y, 1), ROWS(m->wide_dy, 1), dx0, 1);
        if (m->kind == MODEL_DEEPFM)
          nn_fm_bwd(ROWS(m->emb, m->emb_w), m->emb_w, n, m->n_tables, m->dim, dl, dx0 + m->n_dense, m->d0, 1);
        split_dx0(m, p, d_emb);
      }
      break;
    }
    case MODEL_DCN: {
      const float *x0 = ROWS(m->x0, m->d0);
      float *dx0 = ROWS(m->dx0, m->d0), *dxl = ROWS(m->dxl, m->d0);
      if (s == 0) {
        const float *fin = m->deep.n ? ROWS(m->cat, m->final.in) : ROWS(m->xl[m->n_cross], m->d0);
        float *dfin = m->deep.n ? ROWS(m->dcat, m->final.in) : dxl;
        lin_bwd(m, p, &m->final, fin, ROWS(m->final_y, 1), dl, dfin, 0);
        if (m->deep.n) {
          uint32_t hw = mlp_out(&m->deep, m->d0);
          float *dst[2] = {dxl, ROWS(m->deep.dy[m->deep.n - 1], hw)};
          size_t stride[2] = {m->d0, hw};
          uint32_t width[2] = {m->d0, hw};
          nn_concat_bwd(n, 2, dfin, m->final.in, width, dst, stride, 0);
        }
      } else if (s <= m->deep.n) {
        model__mlp_bwd_layer(m, &m->deep, p, m->deep.n - s, x0, dx0, 0);
      } else {
        if (!m->deep.n) memset(dx0, 0, (size_t)n * m->d0 * sizeof(float));
        /* through the cross stack; x_0 is x0 itself, so its gradient as the
         * first cross input (or as the final layer's input when there are no
         * cross layers) adds into dx0 too */
        const float *w[MAX_CROSS], *xl[MAX_CROSS + 1], *sl[MAX_CROSS];
        float *dw[MAX_CROSS], *db[MAX_CROSS];
        for (uint32_t l = 0; l < m->n_cross; l++) {
          w[l] = m->params + m->cross_w[l];
          xl[l] = ROWS(m->xl[l], m->d0);
          sl[l] = ROWS(m->sl[l], 1);
          dw[l] = p->g + m->cross_w[l];
          db[l] = p->g + m->cross_b[l];
        }
        nn_cross_stack_bwd(x0, n, m->d0, m->n_cross, w, xl, sl, dxl, dw, db, dx0);
        split_dx0(m, p, d_emb);
      }
      break;
    }
    case MODEL_DLRM_DCN:
      model__dcn2_backward_stage(m, p, s, dl, d_emb);
      break;
  }
}

#undef ROWS

/* ----------------------------------------------------------------- threads */

/* Thread tid runs the parts tid, tid + T, ...: which thread runs a part
 * never changes what the part computes. */
static void job_forward(void *arg, uint32_t tid, uint32_t nt) {
  model_t *m = arg;
  for (uint32_t k = tid; k < MODEL_PARTS; k += nt) forward_part(m, &m->part[k]);
}

/* grads[lo, hi) += the other parts' gradients, element-wise in part order
 * ((g0 + g1) + g2) + g3, over this thread's slice of [lo, hi). */
static void reduce_slice(model_t *m, size_t lo, size_t hi, uint32_t tid, uint32_t nt) {
  size_t n = hi - lo;
  size_t a = lo + n * tid / nt, b = lo + n * (tid + 1) / nt;
  if (tid) a = lo + ((a - lo) & ~(size_t)15);
  if (tid + 1 < nt) b = lo + ((b - lo) & ~(size_t)15);
  if (b <= a) return;
  for (uint32_t k = 1; k < MODEL_PARTS; k++) add_floats(m->grads + a, m->pgrads[k] + a, b - a);
}

/* Thread tid runs stage s of the parts tid, tid + T, ...; then sums its
 * slice of stage s-1's parameters (disjoint from what stage s writes);
 * then all threads meet, and thread 0 (the caller of model_backward)
 * reports the suffix that is now final. */
static void job_backward(void *arg, uint32_t tid, uint32_t nt) {
  model_t *m = arg;
  uint32_t S = n_stages(m);
  size_t hi = m->n_params, lo_prev = m->n_params;
  for (uint32_t s = 0; s <= S; s++) {
    if (s < S)
      for (uint32_t k = tid; k < MODEL_PARTS; k += nt) backward_stage(m, &m->part[k], s);
    if (s > 0) {
      size_t lo = stage_lo(m, s - 1);
      reduce_slice(m, lo, hi, tid, nt);
      hi = lo;
    }
    pool_barrier(m->pool);
    if (s > 0 && tid == 0 && m->ready && hi < lo_prev) {
      m->ready(m->ready_ud, hi);
      lo_prev = hi;
    }
  }
}

int model_set_threads(model_t *m, uint32_t n) {
  if (n == 0) n = pool_default_threads();
  if (n > MODEL_PARTS) n = MODEL_PARTS;
  if (n == model_threads(m)) return 0;
  pool_destroy(m->pool);
  m->pool = NULL;
  if (n == 1) return 0;
  openblas_set_num_threads(1); /* our threads call sgemm concurrently */
  return pool_create(n, &m->pool);
}

uint32_t model_threads(const model_t *m) { return pool_threads(m->pool); }

void model_set_grad_ready(model_t *m, model_grad_ready_fn fn, void *ud) {
  m->ready = fn;
  m->ready_ud = ud;
}

uint32_t model_backward_stages(const model_t *m) { return n_stages(m); }
pool_t *model_pool(model_t *m) { return m->pool; }

/* ----------------------------------------------------------------- steps */

/* Splits n rows into MODEL_PARTS parts: boundaries depend on n only (and
 * fall on multiples of 16 rows when they can). */
static void split(model_t *m, uint32_t n) {
  for (uint32_t k = 0; k < MODEL_PARTS; k++) {
    uint32_t lo = (uint32_t)((uint64_t)n * k / MODEL_PARTS);
    uint32_t hi = (uint32_t)((uint64_t)n * (k + 1) / MODEL_PARTS);
    if (n >= 16 * MODEL_PARTS) {
      lo &= ~15u;
      if (k + 1 < MODEL_PARTS) hi &= ~15u;
    }
    m->part[k].i0 = lo;
    m->part[k].n = hi - lo;
    m->part[k].g = m->pgrads[k];
    m->part[k].loss = 0.0;
  }
}

void model_forward(model_t *m, uint32_t n, const float *dense, const float *emb,
                   float *logits) {
  ASSERT_OP(n, <=, m->max_batch);
  m->n = n;
  m->dense = dense;
  m->emb = emb;
  split(m, n);
  pool_run(m->pool, job_forward, m);
  if (logits) memcpy(logits, m->zbuf, (size_t)n * sizeof(float));
}

double model_backward(model_t *m, uint32_t n, const float *labels, float scale,
                      float *d_emb) {
  ASSERT_OP(n, ==, m->n);
  m->labels = labels;
  m->scale = scale;
  m->d_emb_out = d_emb;
  pool_run(m->pool, job_backward, m);
  double loss = 0.0;
  for (uint32_t k = 0; k < MODEL_PARTS; k++) loss += m->part[k].loss;
  return loss;
}

/* ----------------------------------------------------------------- accounting */

size_t model__add_gemms(const lin_t *l, uint32_t n, int need_dx, model_gemm_t *out,
                        size_t cap, size_t k) {
  model_gemm_t g[3] = {
      {n, l->out, l->in, 0, 1},  /* y = x W^T */
      {l->out, l->in, n, 1, 0},  /* dW = dy^T x */
      {n, l->in, l->out, 0, 0},  /* dx = dy W */
  };
  for (int i = 0; i < (need_dx ? 3 : 2); i++) {
    if (k < cap) out[k] = g[i];
    k++;
  }
  return k;
}

size_t model_gemms(const model_t *m, uint32_t n, model_gemm_t *out, size_t cap) {
  size_t k = 0;
  if (m->kind == MODEL_DLRM_DCN) {
    k = model__dcn2_gemms(m, n, out, cap);
  } else if (m->kind == MODEL_DLRM) {
    for (uint32_t i = 0; i < m->bottom.n; i++) k = model__add_gemms(&m->bottom.l[i], n, i > 0, out, cap, k);
    for (uint32_t i = 0; i < m->top.n; i++) k = model__add_gemms(&m->top.l[i], n, 1, out, cap, k);
  } else if (m->kind == MODEL_DCN) {
    for (uint32_t i = 0; i < m->deep.n; i++) k = model__add_gemms(&m->deep.l[i], n, 1, out, cap, k);
    k = model__add_gemms(&m->final, n, 1, out, cap, k);
  } else {
    k = model__add_gemms(&m->wide, n, 1, out, cap, k);
    for (uint32_t i = 0; i < m->deep.n; i++) k = model__add_gemms(&m->deep.l[i], n, 1, out, cap, k);
  }
  return k;
}

double model_gemm_flops_per_sample(const model_t *m) {
  model_gemm_t g[6 * MAX_LAYERS + 6 * MAX_CROSS + 8];
  size_t k = model_gemms(m, 1, g, sizeof(g) / sizeof(g[0]));
  double f = 0.0;
  for (size_t i = 0; i < k; i++) f += 2.0 * g[i].m * g[i].n * g[i].k;
  return f;
}
