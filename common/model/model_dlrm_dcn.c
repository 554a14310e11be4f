/*
 * model_dlrm_dcn: MLPerf DLRMv2's model (TorchRec's DLRM_DCN): DLRM's
 * bottom MLP and pooled embeddings, DCNv2 cross layers as the interaction
 * (nn_cross2_*, full or low rank), then the top MLP on the last cross
 * output.  model.c plans, runs and threads every model; its switches call
 * these functions for model = dlrm_dcn (architecture, layout and
 * initialization in model.h).
 *
 * Per part of a batch (model.h, "threads"):
 *   forward   bottom MLP -> x0 = [bottom, emb] -> x_1 .. x_L -> top MLP
 *   backward  stages: the top layers (last first), the cross layers (last
 *             first; the first of them zeroes dx0, each adds its x0 term),
 *             one stage that adds x_0's own gradient to dx0 and splits it
 *             into the bottom MLP's output gradient and d_emb, then the
 *             bottom layers.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "err.h"
#include "model_internal.h"

#define ROWS MODEL_ROWS

/* The first parameter of cross layer l (V when low rank, else W). */
static size_t cross_first(const model_t *m, uint32_t l) {
  return m->rank ? m->cross_v[l] : m->cross_w[l];
}

int model__dcn2_plan(model_t *m, const cfg_t *cfg, char *err, size_t err_len) {
  int rc;
  uint32_t s1[MAX_LAYERS], s2[MAX_LAYERS];
  size_t k1 = 0, k2 = 0;
  if ((rc = model__parse_sizes(cfg, "model.bottom_mlp", s1, &k1, err, err_len)) < 0) return rc;
  if ((rc = model__parse_sizes(cfg, "model.top_mlp", s2, &k2, err, err_len)) < 0) return rc;
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
    s1[k1++] = m->dim; /* the bottom MLP ends at the embedding dimension */
    model__plan_mlp(m, &m->bottom, m->n_dense, s1, k1, 0);
  }
  uint32_t d = m->d0, rk = m->rank;
  for (uint32_t l = 0; l < m->n_cross; l++) {
    if (rk) {
      m->cross_v[l] = model__add_tensor(m, (size_t)rk * d, INIT_XAVIER, d, rk);
      m->cross_w[l] = model__add_tensor(m, (size_t)d * rk, INIT_XAVIER, rk, d);
    } else {
      m->cross_w[l] = model__add_tensor(m, (size_t)d * d, INIT_XAVIER, d, d);
    }
    m->cross_b[l] = model__add_tensor(m, d, INIT_ZERO, d, d);
  }
  model__plan_mlp(m, &m->top, d, s2, k2, 1);
  return 0;
}

int model__dcn2_alloc(model_t *m) {
  size_t B = m->max_batch, d = m->d0;
  if (model__alloc_mlp(m, &m->bottom) < 0 || model__alloc_mlp(m, &m->top) < 0) return -ENOMEM;
  m->x0 = model__alloc(m, B * d);
  m->dx0 = model__alloc(m, B * d);
  m->dxl = model__alloc(m, B * d);
  m->dz = model__alloc(m, B * d);
  m->dt = model__alloc(m, B * (m->rank ? m->rank : 1));
  if (!m->x0 || !m->dx0 || !m->dxl || !m->dz || !m->dt) return -ENOMEM;
  m->xl[0] = m->x0;
  for (uint32_t l = 0; l < m->n_cross; l++) {
    m->xl[l + 1] = model__alloc(m, B * d);
    m->zl[l] = model__alloc(m, B * d);
    m->tl[l] = m->rank ? model__alloc(m, B * m->rank) : NULL;
    if (!m->xl[l + 1] || !m->zl[l] || (m->rank && !m->tl[l])) return -ENOMEM;
  }
  m->zbuf = m->top.y[m->top.n - 1];
  return 0;
}

void model__dcn2_describe(model_t *m) {
  model__describe_mlp(m->desc, sizeof(m->desc), "bottom", &m->bottom);
  size_t o = strlen(m->desc);
  if (m->rank)
    snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u cross=%ux%u", m->d0, m->n_cross, m->rank);
  else
    snprintf(m->desc + o, sizeof(m->desc) - o, " x0=%u cross=%uxfull", m->d0, m->n_cross);
  model__describe_mlp(m->desc, sizeof(m->desc), "top", &m->top);
}

/* Layer l's parameters (in p's gradient buffer when g). */
static void cross_params(const model_t *m, const float *base, uint32_t l, const float **w,
                         const float **v, const float **b) {
  *w = base + m->cross_w[l];
  *v = m->rank ? base + m->cross_v[l] : NULL;
  *b = base + m->cross_b[l];
}

void model__dcn2_forward(model_t *m, const part_t *p) {
  uint32_t n = p->n, d = m->d0, r = m->rank;
  if (n == 0) return;
  const float *emb = ROWS(m->emb, m->emb_w);
  float *x0 = ROWS(m->x0, d);
  if (m->has_bottom) {
    const float *bot = model__mlp_fwd(m, &m->bottom, p, ROWS(m->dense, m->n_dense));
    const float *src[2] = {bot, emb};
    size_t stride[2] = {m->dim, m->emb_w};
    uint32_t width[2] = {m->dim, m->emb_w};
    nn_concat_fwd(n, 2, src, stride, width, x0, d);
  } else {
    memcpy(x0, emb, (size_t)n * d * sizeof(float));
  }
  const float *x = x0;
  for (uint32_t l = 0; l < m->n_cross; l++) {
    const float *w, *v, *b;
    cross_params(m, m->params, l, &w, &v, &b);
    float *y = ROWS(m->xl[l + 1], d);
    nn_cross2_fwd(x0, x, n, d, r, w, v, b, r ? ROWS(m->tl[l], r) : NULL, ROWS(m->zl[l], d), y);
    x = y;
  }
  model__mlp_fwd(m, &m->top, p, x);
}

uint32_t model__dcn2_stages(const model_t *m) {
  return m->top.n + m->n_cross + 1 + (m->has_bottom ? m->bottom.n : 0);
}

size_t model__dcn2_stage_lo(const model_t *m, uint32_t s) {
  uint32_t T = m->top.n, L = m->n_cross;
  if (s < T) return m->top.l[T - 1 - s].w;
  if (s < T + L) return cross_first(m, L - 1 - (s - T));
  if (s == T + L) return L ? cross_first(m, 0) : m->top.l[0].w; /* the split: no parameters */
  return m->bottom.l[m->bottom.n - 1 - (s - T - L - 1)].w;
}

void model__dcn2_backward_stage(model_t *m, part_t *p, uint32_t s, const float *dl, float *d_emb) {
  uint32_t n = p->n, d = m->d0, r = m->rank, T = m->top.n, L = m->n_cross;
  float *dx0 = ROWS(m->dx0, d), *g = ROWS(m->dxl, d);
  if (s < T) {
    if (s == 0) memcpy(ROWS(m->top.dy[T - 1], 1), dl, (size_t)n * sizeof(float));
    model__mlp_bwd_layer(m, &m->top, p, T - 1 - s, ROWS(m->xl[L], d), g, 0);
  } else if (s < T + L) {
    uint32_t l = L - 1 - (s - T);
    if (l == L - 1) memset(dx0, 0, (size_t)n * d * sizeof(float));
    const float *w, *v, *b;
    cross_params(m, m->params, l, &w, &v, &b);
    float *dw = p->g + m->cross_w[l], *dv = r ? p->g + m->cross_v[l] : NULL, *db = p->g + m->cross_b[l];
    nn_cross2_bwd(ROWS(m->x0, d), ROWS(m->xl[l], d), r ? ROWS(m->tl[l], r) : NULL, ROWS(m->zl[l], d), n, d, r, w,
                  v, g, ROWS(m->dz, d), r ? ROWS(m->dt, r) : NULL, dw, dv, db, dx0);
  } else if (s == T + L) {
    /* x_0 is x0 itself: its gradient as the first cross input (or as the
     * top MLP's input) joins the x0 terms */
    size_t len = (size_t)n * d;
    if (L)
      for (size_t i = 0; i < len; i++) dx0[i] += g[i];
    else
      memcpy(dx0, g, len * sizeof(float));
    float *dst[2] = {m->has_bottom ? ROWS(m->bottom.dy[m->bottom.n - 1], m->dim) : NULL,
                     d_emb};
    size_t stride[2] = {m->dim, m->emb_w};
    uint32_t width[2] = {m->dim, m->emb_w};
    uint32_t k = m->has_bottom ? 0 : 1;
    nn_concat_bwd(n, 2 - k, dx0, d, width + k, dst + k, stride + k, 0);
  } else {
    model__mlp_bwd_layer(m, &m->bottom, p, m->bottom.n - 1 - (s - T - L - 1), ROWS(m->dense, m->n_dense), NULL,
                         0);
  }
}

size_t model__dcn2_gemms(const model_t *m, uint32_t n, model_gemm_t *out, size_t cap) {
  size_t k = 0;
  uint32_t d = m->d0, r = m->rank;
  for (uint32_t i = 0; i < m->bottom.n; i++) k = model__add_gemms(&m->bottom.l[i], n, i > 0, out, cap, k);
  for (uint32_t l = 0; l < m->n_cross; l++) {
    if (r) {
      lin_t v = {.in = d, .out = r}, u = {.in = r, .out = d};
      k = model__add_gemms(&v, n, 1, out, cap, k);
      k = model__add_gemms(&u, n, 1, out, cap, k);
    } else {
      lin_t w = {.in = d, .out = d};
      k = model__add_gemms(&w, n, 1, out, cap, k);
    }
  }
  for (uint32_t i = 0; i < m->top.n; i++) k = model__add_gemms(&m->top.l[i], n, 1, out, cap, k);
  return k;
}
