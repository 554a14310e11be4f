/*
 * nn: forward and backward of the layers in nn.h, CPU reference.
 *
 * Matrix products go to OpenBLAS; everything else is written as plain,
 * fixed-order C loops.  The build is -O2 without -march, so the few hot
 * element-wise loops carry NN_HOT: GCC compiles them for x86-64, AVX2 and
 * AVX-512 and picks one at load time (target_clones), vectorized at -O3.
 * No loop reassociates a sum and -std=c11 disables FMA contraction, so all
 * three clones give the same bits: the choice of clone never changes a
 * result.  Sums that must be vectorized (dot products) are written as
 * vector-over-output loops (acc[j] += a * b[j]) in a fixed order instead.
 */
#include "nn.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "err.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define NN_HOT                                                      \
  __attribute__((target_clones("default", "avx2", "arch=x86-64-v4"), \
                 optimize("O3", "no-math-errno")))
#elif defined(__GNUC__) && !defined(__clang__)
#define NN_HOT __attribute__((optimize("O3", "no-math-errno")))
#else
#define NN_HOT
#endif

/* ------------------------------------------------------------------ linear */

/* y[i][j] = act(y[i][j] + b[j]) in one pass. */
NN_HOT static void bias_act(float *restrict y, const float *restrict b,
                            uint32_t n, uint32_t out, nn_act_t act) {
  for (uint32_t i = 0; i < n; i++) {
    float *restrict r = y + (size_t)i * out;
    if (b && act == NN_ACT_RELU) {
      for (uint32_t j = 0; j < out; j++) {
        float v = r[j] + b[j];
        r[j] = v > 0.0f ? v : 0.0f;
      }
    } else if (b) {
      for (uint32_t j = 0; j < out; j++) r[j] += b[j];
    } else if (act == NN_ACT_RELU) {
      for (uint32_t j = 0; j < out; j++) r[j] = r[j] > 0.0f ? r[j] : 0.0f;
    }
  }
}

/* dy *= (y > 0) when relu; db = column sums of dy, rows added in order. */
NN_HOT static void act_bias_bwd(const float *restrict y, float *restrict dy,
                                uint32_t n, uint32_t out, nn_act_t act,
                                float *restrict db) {
  if (db) memset(db, 0, (size_t)out * sizeof(float));
  for (uint32_t i = 0; i < n; i++) {
    float *restrict g = dy + (size_t)i * out;
    const float *restrict r = y + (size_t)i * out;
    if (act == NN_ACT_RELU && db) {
      for (uint32_t j = 0; j < out; j++) {
        float v = r[j] > 0.0f ? g[j] : 0.0f;
        g[j] = v;
        db[j] += v;
      }
    } else if (act == NN_ACT_RELU) {
      for (uint32_t j = 0; j < out; j++) g[j] = r[j] > 0.0f ? g[j] : 0.0f;
    } else if (db) {
      for (uint32_t j = 0; j < out; j++) db[j] += g[j];
    }
  }
}

void nn_linear_fwd(const float *x, uint32_t n, uint32_t in, uint32_t out,
                   const float *w, const float *b, nn_act_t act, float *y) {
  if (n == 0 || out == 0) return;
  if (in == 0) {
    memset(y, 0, (size_t)n * out * sizeof(float));
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out,
                (int)in, 1.0f, x, (int)in, w, (int)in, 0.0f, y, (int)out);
  }
  if (b || act != NN_ACT_NONE) bias_act(y, b, n, out, act);
}

void nn_linear_bwd(const float *x, const float *y, float *dy, uint32_t n,
                   uint32_t in, uint32_t out, const float *w, nn_act_t act,
                   float *dw, float *db, float *dx, int dx_accumulate) {
  if (out == 0) return;
  if (act != NN_ACT_NONE || db) act_bias_bwd(y, dy, n, out, act, db);
  if (in == 0) return;
  if (n == 0) {
    memset(dw, 0, (size_t)out * in * sizeof(float));
    return;
  }
  /* dW[out x in] = dy^T [out x n] x [n x in] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)out, (int)in,
              (int)n, 1.0f, dy, (int)out, x, (int)in, 0.0f, dw, (int)in);
  if (dx) {
    /* dx[n x in] = dy [n x out] W [out x in] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)in,
                (int)out, 1.0f, dy, (int)out, w, (int)in,
                dx_accumulate ? 1.0f : 0.0f, dx, (int)in);
  }
}

/* ------------------------------------------------------------ element-wise */

NN_HOT void nn_relu_fwd(const float *x, size_t len, float *y) {
  for (size_t i = 0; i < len; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

NN_HOT void nn_relu_bwd(const float *y, const float *dy, size_t len, float *dx) {
  for (size_t i = 0; i < len; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static inline float sigmoidf_stable(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  float e = expf(z);
  return e / (1.0f + e);
}

void nn_sigmoid_fwd(const float *x, size_t len, float *y) {
  for (size_t i = 0; i < len; i++) y[i] = sigmoidf_stable(x[i]);
}

void nn_sigmoid_bwd(const float *y, const float *dy, size_t len, float *dx) {
  for (size_t i = 0; i < len; i++) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

/* ---------------------------------------------------------------- BCE */

static inline double bce1(float z, float t) {
  double zd = z;
  return (zd > 0.0 ? zd : 0.0) - zd * (double)t + log1p(exp(-fabs(zd)));
}

double nn_bce_logits_fwd(const float *logits, const float *labels, uint32_t n) {
  double s = 0.0;
  for (uint32_t i = 0; i < n; i++) s += bce1(logits[i], labels[i]);
  return s;
}

double nn_bce_logits_bwd(const float *logits, const float *labels, uint32_t n,
                         float scale, float *dlogits) {
  double s = 0.0;
  for (uint32_t i = 0; i < n; i++) {
    s += bce1(logits[i], labels[i]);
    dlogits[i] = scale * (sigmoidf_stable(logits[i]) - labels[i]);
  }
  return s;
}

/* ------------------------------------------------------------ concatenation */

void nn_concat_fwd(uint32_t n, uint32_t n_pieces, const float *const *src,
                   const size_t *src_stride, const uint32_t *width, float *dst,
                   size_t dst_stride) {
  for (uint32_t i = 0; i < n; i++) {
    float *d = dst + (size_t)i * dst_stride;
    for (uint32_t p = 0; p < n_pieces; p++) {
      memcpy(d, src[p] + (size_t)i * src_stride[p], (size_t)width[p] * sizeof(float));
      d += width[p];
    }
  }
}

NN_HOT static void add_row(float *restrict d, const float *restrict s, uint32_t w) {
  for (uint32_t j = 0; j < w; j++) d[j] += s[j];
}

void nn_concat_bwd(uint32_t n, uint32_t n_pieces, const float *d_dst,
                   size_t d_dst_stride, const uint32_t *width, float *const *d_src,
                   const size_t *d_src_stride, int accumulate) {
  for (uint32_t i = 0; i < n; i++) {
    const float *s = d_dst + (size_t)i * d_dst_stride;
    for (uint32_t p = 0; p < n_pieces; p++) {
      if (d_src[p]) {
        float *d = d_src[p] + (size_t)i * d_src_stride[p];
        if (accumulate)
          add_row(d, s, width[p]);
        else
          memcpy(d, s, (size_t)width[p] * sizeof(float));
      }
      s += width[p];
    }
  }
}

/* ------------------------------------------------------------ embedding bag */

/* How far ahead (in samples) the forward gather prefetches rows: enough to
 * cover a DRAM miss with ~10 misses in flight. */
#define EB_PREFETCH 8

NN_HOT void nn_embedding_bag_fwd(const float *base, size_t row_stride,
                                 const uint64_t *idx, uint32_t n,
                                 uint32_t hotness, uint32_t dim, float *out,
                                 size_t out_stride) {
  size_t total = (size_t)n * hotness;
  for (uint32_t i = 0; i < n; i++) {
    float *restrict o = out + (size_t)i * out_stride;
    const uint64_t *id = idx + (size_t)i * hotness;
    size_t ahead = (size_t)(i + EB_PREFETCH) * hotness;
    for (uint32_t h = 0; h < hotness && ahead + h < total; h++)
      __builtin_prefetch(base + idx[ahead + h] * row_stride);
    const float *restrict r = base + id[0] * row_stride;
    for (uint32_t d = 0; d < dim; d++) o[d] = r[d];
    for (uint32_t h = 1; h < hotness; h++) {
      r = base + id[h] * row_stride;
      for (uint32_t d = 0; d < dim; d++) o[d] += r[d];
    }
  }
}

typedef struct eb_pair_s {
  uint64_t key; /* idx - min, sorted on */
  uint64_t pos; /* i * hotness + h: the sample order */
} eb_pair_t;

size_t nn_embedding_bag_bwd_work_size(uint32_t n, uint32_t hotness) {
  return 2 * (size_t)n * hotness * sizeof(eb_pair_t);
}

#define RADIX_BITS 8
#define RADIX (1u << RADIX_BITS)

uint32_t nn_embedding_bag_bwd(const float *d_out, size_t d_out_stride,
                              const uint64_t *idx, uint32_t n, uint32_t hotness,
                              uint32_t dim, uint64_t *uniq, float *grad,
                              size_t grad_stride, void *work) {
  size_t total = (size_t)n * hotness;
  if (total == 0) return 0;
  eb_pair_t *a = work, *b = a + total;
  uint64_t lo = idx[0], hi = idx[0];
  for (size_t k = 1; k < total; k++) {
    if (idx[k] < lo) lo = idx[k];
    if (idx[k] > hi) hi = idx[k];
  }
  for (size_t k = 0; k < total; k++) {
    a[k].key = idx[k] - lo;
    a[k].pos = k;
  }
  /* LSD radix sort on key - min: stable, so equal keys keep sample order. */
  uint64_t range = hi - lo;
  for (unsigned shift = 0; shift < 64 && (range >> shift) != 0; shift += RADIX_BITS) {
    size_t cnt[RADIX];
    memset(cnt, 0, sizeof(cnt));
    for (size_t k = 0; k < total; k++) cnt[(a[k].key >> shift) & (RADIX - 1)]++;
    size_t sum = 0;
    for (unsigned d = 0; d < RADIX; d++) {
      size_t c = cnt[d];
      cnt[d] = sum;
      sum += c;
    }
    for (size_t k = 0; k < total; k++) b[cnt[(a[k].key >> shift) & (RADIX - 1)]++] = a[k];
    eb_pair_t *t = a;
    a = b;
    b = t;
  }
  uint32_t u = 0;
  float *g = NULL;
  for (size_t k = 0; k < total; k++) {
    if (k == 0 || a[k].key != a[k - 1].key) {
      uniq[u] = a[k].key + lo;
      g = grad + (size_t)u * grad_stride;
      memset(g, 0, (size_t)dim * sizeof(float));
      u++;
    }
    add_row(g, d_out + (size_t)(a[k].pos / hotness) * d_out_stride, dim);
  }
  return u;
}

/* ------------------------------------------------------- dot interaction */

/* Most vectors an interaction handles: the per-sample scratch lives on the
 * stack. */
#define NN_INTERACT_MAX_F 1024
#define NN_INTERACT_MAX_STACK 16384 /* floats of F*dim and F*F scratch */

uint32_t nn_interact_out_width(uint32_t n_emb, uint32_t dim, int has_bottom) {
  uint32_t f = n_emb + (has_bottom ? 1 : 0);
  return (has_bottom ? dim : 0) + f * (f - 1) / 2;
}

/* Z (packed lower triangle, DLRM order) of the f vectors v[f x dim], using
 * the transposed copy vt[dim x f]: row a's dots are accumulated over d as
 * vectors over b, so they vectorize without reassociating any sum. */
NN_HOT static void tril_dots(const float *restrict v, const float *restrict vt,
                             uint32_t f, uint32_t dim, float *restrict z) {
  for (uint32_t a = 1; a < f; a++) {
    float *restrict za = z + (size_t)a * (a - 1) / 2;
    for (uint32_t c = 0; c < a; c++) za[c] = 0.0f;
    for (uint32_t d = 0; d < dim; d++) {
      float x = v[(size_t)a * dim + d];
      const float *restrict col = vt + (size_t)d * f;
      for (uint32_t c = 0; c < a; c++) za[c] += x * col[c];
    }
  }
}

NN_HOT static void gather_vectors(const float *restrict bottom, const float *restrict emb,
                                  uint32_t n_emb, uint32_t dim, float *restrict v,
                                  float *restrict vt, uint32_t f) {
  uint32_t off = 0;
  if (bottom) {
    memcpy(v, bottom, (size_t)dim * sizeof(float));
    off = 1;
  }
  memcpy(v + (size_t)off * dim, emb, (size_t)n_emb * dim * sizeof(float));
  for (uint32_t a = 0; a < f; a++)
    for (uint32_t d = 0; d < dim; d++) vt[(size_t)d * f + a] = v[(size_t)a * dim + d];
}

void nn_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     float *out, size_t out_stride) {
  uint32_t f = n_emb + (bottom ? 1 : 0);
  ASSERT((size_t)f * dim * 2 <= NN_INTERACT_MAX_STACK);
  float v[NN_INTERACT_MAX_STACK / 2], vt[NN_INTERACT_MAX_STACK / 2];
  for (uint32_t i = 0; i < n; i++) {
    const float *bi = bottom ? bottom + (size_t)i * bottom_stride : NULL;
    float *o = out + (size_t)i * out_stride;
    gather_vectors(bi, emb + (size_t)i * emb_stride, n_emb, dim, v, vt, f);
    if (bi) {
      memcpy(o, bi, (size_t)dim * sizeof(float));
      o += dim;
    }
    tril_dots(v, vt, f, dim, o);
  }
}

/* dv[f x dim] = G v with G the symmetric matrix of the packed dz (zero
 * diagonal); row a sums over b ascending, each a vector over d. */
NN_HOT static void tril_dots_bwd(const float *restrict v, const float *restrict dz,
                                 uint32_t f, uint32_t dim, float *restrict dv) {
  for (uint32_t a = 0; a < f; a++) {
    float *restrict da = dv + (size_t)a * dim;
    for (uint32_t d = 0; d < dim; d++) da[d] = 0.0f;
    for (uint32_t b = 0; b < f; b++) {
      if (b == a) continue;
      float g = a > b ? dz[(size_t)a * (a - 1) / 2 + b] : dz[(size_t)b * (b - 1) / 2 + a];
      const float *restrict vb = v + (size_t)b * dim;
      for (uint32_t d = 0; d < dim; d++) da[d] += g * vb[d];
    }
  }
}

void nn_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     const float *d_out, size_t out_stride, float *d_bottom,
                     float *d_emb, size_t d_emb_stride) {
  uint32_t f = n_emb + (bottom ? 1 : 0);
  ASSERT((size_t)f * dim * 2 <= NN_INTERACT_MAX_STACK);
  float v[NN_INTERACT_MAX_STACK / 2], dv[NN_INTERACT_MAX_STACK / 2];
  for (uint32_t i = 0; i < n; i++) {
    const float *bi = bottom ? bottom + (size_t)i * bottom_stride : NULL;
    const float *g = d_out + (size_t)i * out_stride;
    uint32_t off = 0;
    if (bi) {
      memcpy(v, bi, (size_t)dim * sizeof(float));
      off = 1;
    }
    memcpy(v + (size_t)off * dim, emb + (size_t)i * emb_stride,
           (size_t)n_emb * dim * sizeof(float));
    tril_dots_bwd(v, g + (bi ? dim : 0), f, dim, dv);
    if (bi && d_bottom) {
      float *db = d_bottom + (size_t)i * bottom_stride;
      for (uint32_t d = 0; d < dim; d++) db[d] = g[d] + dv[d];
    }
    memcpy(d_emb + (size_t)i * d_emb_stride, dv + (size_t)off * dim,
           (size_t)n_emb * dim * sizeof(float));
  }
}

/* ---------------------------------------------------------------- FM */

NN_HOT void nn_fm_fwd(const float *emb, size_t emb_stride, uint32_t n,
                      uint32_t n_emb, uint32_t dim, float *out) {
  float s[4096], q[4096];
  ASSERT(dim <= 4096);
  for (uint32_t i = 0; i < n; i++) {
    const float *e = emb + (size_t)i * emb_stride;
    for (uint32_t d = 0; d < dim; d++) s[d] = q[d] = 0.0f;
    for (uint32_t t = 0; t < n_emb; t++) {
      const float *restrict v = e + (size_t)t * dim;
      for (uint32_t d = 0; d < dim; d++) {
        s[d] += v[d];
        q[d] += v[d] * v[d];
      }
    }
    float r = 0.0f;
    for (uint32_t d = 0; d < dim; d++) r += s[d] * s[d] - q[d];
    out[i] = 0.5f * r;
  }
}

NN_HOT void nn_fm_bwd(const float *emb, size_t emb_stride, uint32_t n,
                      uint32_t n_emb, uint32_t dim, const float *d_out,
                      float *d_emb, size_t d_emb_stride, int accumulate) {
  float s[4096];
  ASSERT(dim <= 4096);
  for (uint32_t i = 0; i < n; i++) {
    const float *e = emb + (size_t)i * emb_stride;
    float *de = d_emb + (size_t)i * d_emb_stride;
    float g = d_out[i];
    for (uint32_t d = 0; d < dim; d++) s[d] = 0.0f;
    for (uint32_t t = 0; t < n_emb; t++)
      for (uint32_t d = 0; d < dim; d++) s[d] += e[(size_t)t * dim + d];
    for (uint32_t t = 0; t < n_emb; t++) {
      const float *restrict v = e + (size_t)t * dim;
      float *restrict dv = de + (size_t)t * dim;
      if (accumulate)
        for (uint32_t d = 0; d < dim; d++) dv[d] += g * (s[d] - v[d]);
      else
        for (uint32_t d = 0; d < dim; d++) dv[d] = g * (s[d] - v[d]);
    }
  }
}

/* ------------------------------------------------------------- cross layer */

/* Dot product in 8 fixed lanes, combined in a fixed order: vectorizes
 * without depending on the compiler's reassociation. */
NN_HOT static float dot8(const float *restrict a, const float *restrict b, uint32_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (uint32_t l = 0; l < 8; l++) acc[l] += a[j + l] * b[j + l];
  for (uint32_t l = 0; j + l < d; l++) acc[l] += a[j + l] * b[j + l];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

NN_HOT void nn_cross_fwd(const float *x0, const float *x, uint32_t n, uint32_t d,
                         const float *w, const float *b, float *s, float *y) {
  for (uint32_t i = 0; i < n; i++) {
    const float *restrict a = x0 + (size_t)i * d;
    const float *restrict xi = x + (size_t)i * d;
    float *restrict yi = y + (size_t)i * d;
    float si = dot8(xi, w, d);
    s[i] = si;
    for (uint32_t j = 0; j < d; j++) yi[j] = a[j] * si + b[j] + xi[j];
  }
}

NN_HOT void nn_cross_bwd(const float *x0, const float *x, const float *s, uint32_t n,
                         uint32_t d, const float *w, const float *dy, float *dw,
                         float *db, float *dx, float *dx0) {
  memset(dw, 0, (size_t)d * sizeof(float));
  memset(db, 0, (size_t)d * sizeof(float));
  for (uint32_t i = 0; i < n; i++) {
    const float *a = x0 + (size_t)i * d;
    const float *xi = x + (size_t)i * d;
    const float *g = dy + (size_t)i * d; /* may alias dx */
    float *dxi = dx + (size_t)i * d;
    float *d0 = dx0 + (size_t)i * d;
    float ds = dot8(g, a, d);
    float si = s[i];
    for (uint32_t j = 0; j < d; j++) {
      float gj = g[j];
      db[j] += gj;
      dw[j] += ds * xi[j];
      d0[j] += gj * si;
      dxi[j] = gj + ds * w[j];
    }
  }
}
