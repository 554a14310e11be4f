/*
 * nn: forward and backward of the layers in nn.h, CPU reference.
 *
 * Matrix products go to OpenBLAS (except the one-output logit layers, a
 * matrix-vector product done here); everything else is written as plain,
 * fixed-order C loops.  The build is -O2 without -march, so the hot loops
 * carry NN_HOT: GCC compiles them for x86-64, AVX2 and AVX-512 and picks
 * one at load time (target_clones), vectorized at -O3.  No loop relies on
 * the compiler reassociating a sum and -std=c11 disables FMA contraction,
 * so all three clones give the same bits: the choice of clone never
 * changes a result.  Sums that must be vectorized are written so that the
 * order is explicit: vector-over-output loops (acc[j] += a * b[j]), GCC
 * vector types of 16 lanes (the DLRM interaction, one lane per output),
 * or a dot product in 8 fixed lanes combined in a fixed order (dot8).
 * Inner loops that write several arrays live in small inline helpers with
 * restrict parameters: GCC honours restrict there, not on block-scope
 * pointers, and otherwise falls back to scalar code at run time.
 */
#include "nn.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
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

/* Dot product in 8 fixed lanes, combined in a fixed order: vectorizes
 * without depending on the compiler's reassociation. */
static inline __attribute__((always_inline)) float dot8(const float *restrict a, const float *restrict b, uint32_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (uint32_t l = 0; l < 8; l++) acc[l] += a[j + l] * b[j + l];
  for (uint32_t l = 0; j + l < d; l++) acc[l] += a[j + l] * b[j + l];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* A linear layer with one output (the logit layers) is a matrix-vector
 * product; these loops beat a GEMM call with N = 1 and keep a fixed order. */
NN_HOT static void linear1_fwd(const float *restrict x, uint32_t n, uint32_t in,
                               const float *restrict w, float *restrict y) {
  for (uint32_t i = 0; i < n; i++) y[i] = dot8(x + (size_t)i * in, w, in);
}

NN_HOT static void linear1_bwd(const float *restrict x, const float *restrict dy, uint32_t n,
                               uint32_t in, const float *restrict w, float *restrict dw,
                               float *restrict dx, int dx_accumulate) {
  for (uint32_t k = 0; k < in; k++) dw[k] = 0.0f;
  for (uint32_t i = 0; i < n; i++) {
    const float *restrict xi = x + (size_t)i * in;
    float g = dy[i];
    for (uint32_t k = 0; k < in; k++) dw[k] += g * xi[k];
  }
  if (!dx) return;
  for (uint32_t i = 0; i < n; i++) {
    float *restrict di = dx + (size_t)i * in;
    float g = dy[i];
    if (dx_accumulate)
      for (uint32_t k = 0; k < in; k++) di[k] += g * w[k];
    else
      for (uint32_t k = 0; k < in; k++) di[k] = g * w[k];
  }
}

void nn_linear_fwd(const float *x, uint32_t n, uint32_t in, uint32_t out,
                   const float *w, const float *b, nn_act_t act, float *y) {
  if (n == 0 || out == 0) return;
  if (in == 0) {
    memset(y, 0, (size_t)n * out * sizeof(float));
  } else if (out == 1) {
    linear1_fwd(x, n, in, w, y);
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
  if (out == 1) {
    linear1_bwd(x, dy, n, in, w, dw, dx, dx_accumulate);
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
    for (uint32_t h = 0; h < hotness && ahead + h < total; h++) {
      /* both ends: a row off a line boundary spans two lines */
      const float *p = base + idx[ahead + h] * row_stride;
      __builtin_prefetch(p);
      __builtin_prefetch(p + dim - 1);
    }
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

#define RADIX_BITS 11
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

/* Per-sample scratch lives on the stack: F vectors of dim floats, their
 * transpose padded to whole chunks, and the F x F gradient matrix. */
#define NN_INTERACT_MAX_STACK 8192 /* floats of each scratch array */
#define IL 16                      /* lanes of one vector chunk */

uint32_t nn_interact_out_width(uint32_t n_emb, uint32_t dim, int has_bottom) {
  uint32_t f = n_emb + (has_bottom ? 1 : 0);
  return (has_bottom ? dim : 0) + f * (f - 1) / 2;
}

static inline uint32_t round_il(uint32_t x) { return (x + IL - 1) / IL * IL; }

int nn_interact_fits(uint32_t n_emb, uint32_t dim, int has_bottom) {
  uint64_t f = (uint64_t)n_emb + (has_bottom ? 1 : 0);
  uint64_t fp = round_il((uint32_t)f);
  return f * dim <= NN_INTERACT_MAX_STACK && fp * dim <= NN_INTERACT_MAX_STACK &&
         f * fp <= NN_INTERACT_MAX_STACK;
}

/* IL floats as one GCC vector: the compiler maps it onto whatever the
 * clone's ISA has (one zmm, two ymm, four xmm); lane-wise mul and add, so
 * each lane computes exactly what a scalar loop would.  Loaded and stored
 * with memcpy (no alignment assumed). */
typedef float vf_t __attribute__((vector_size(IL * sizeof(float))));

/* Rows of a block computed together: independent accumulators hide the
 * add latency and share each column load. */
#define IR 4

/* Z (packed strict lower triangle, DLRM order) of the f vectors vp[a]
 * (dim floats each).  vt[dim x fp] receives their transpose (columns f..fp
 * must already be zero).  Rows are computed IR at a time, each as IL-wide
 * vectors over the columns of vt into the full-row scratch zs[f x fp]; every
 * dot is summed over d ascending, as a scalar loop would.  Then the
 * triangle is packed into z. */
NN_HOT static void tril_dots(const float *const *vp, uint32_t f, uint32_t fp, uint32_t dim,
                             float *restrict vt, float *restrict zs, float *restrict z) {
  for (uint32_t a = 0; a < f; a++) {
    const float *restrict va = vp[a];
    for (uint32_t d = 0; d < dim; d++) vt[(size_t)d * fp + a] = va[d];
  }
  for (uint32_t a0 = 1; a0 < f; a0 += IR) {
    uint32_t r[IR];
    for (uint32_t k = 0; k < IR; k++) r[k] = a0 + k < f ? a0 + k : f - 1;
    const float *restrict v0 = vp[r[0]], *restrict v1 = vp[r[1]], *restrict v2 = vp[r[2]],
                          *restrict v3 = vp[r[3]];
    for (uint32_t c0 = 0; c0 < r[IR - 1]; c0 += IL) { /* columns < the block's last row */
      vf_t s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
      for (uint32_t d = 0; d < dim; d++) {
        vf_t col;
        memcpy(&col, vt + (size_t)d * fp + c0, sizeof(col));
        s0 += v0[d] * col;
        s1 += v1[d] * col;
        s2 += v2[d] * col;
        s3 += v3[d] * col;
      }
      memcpy(zs + (size_t)r[0] * fp + c0, &s0, sizeof(s0));
      memcpy(zs + (size_t)r[1] * fp + c0, &s1, sizeof(s1));
      memcpy(zs + (size_t)r[2] * fp + c0, &s2, sizeof(s2));
      memcpy(zs + (size_t)r[3] * fp + c0, &s3, sizeof(s3));
    }
  }
  for (uint32_t a = 1; a < f; a++) {
    const float *restrict src = zs + (size_t)a * fp;
    float *restrict dst = z + (size_t)a * (a - 1) / 2;
    for (uint32_t c = 0; c < a; c++) dst[c] = src[c];
  }
}

void nn_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     float *out, size_t out_stride) {
  uint32_t f = n_emb + (bottom ? 1 : 0), fp = round_il(f);
  ASSERT(nn_interact_fits(n_emb, dim, bottom != NULL));
  float vt[NN_INTERACT_MAX_STACK] __attribute__((aligned(64)));
  float zs[NN_INTERACT_MAX_STACK] __attribute__((aligned(64)));
  const float *vp[NN_INTERACT_MAX_STACK / 8];
  memset(vt, 0, (size_t)dim * fp * sizeof(float));
  for (uint32_t i = 0; i < n; i++) {
    const float *bi = bottom ? bottom + (size_t)i * bottom_stride : NULL;
    const float *ei = emb + (size_t)i * emb_stride;
    float *o = out + (size_t)i * out_stride;
    uint32_t off = 0;
    if (bi) {
      vp[0] = bi;
      off = 1;
      memcpy(o, bi, (size_t)dim * sizeof(float));
      o += dim;
    }
    for (uint32_t t = 0; t < n_emb; t++) vp[off + t] = ei + (size_t)t * dim;
    tril_dots(vp, f, fp, dim, vt, zs, o);
  }
}

/* dv = G v for the f vectors vp[b] (dim floats each) with G the symmetric
 * f x f matrix of the packed dz and a zero diagonal.  gl[f x fp] receives
 * the strict lower triangle, zero padded, so that for any a, b one of
 * gl[a][b] (b < a) and gl[b][a] (b > a) is the coefficient and the other
 * is 0.  Rows are done IR at a time sharing the loads of v[b]: first the
 * b < a terms from the rows of gl, then the b > a terms from its columns,
 * so every dv[a] sums its terms in ascending b, each an IL-wide vector
 * over d.  A scalar loop in the same order covers a dim that is not a
 * whole number of chunks.  dvp[a] receives row a. */
NN_HOT static void tril_dots_bwd(const float *const *vp, const float *restrict dz,
                                 uint32_t f, uint32_t fp, uint32_t dim,
                                 float *restrict gl, float *const *dvp) {
  for (uint32_t a = 0; a < f; a++) {
    float *restrict row = gl + (size_t)a * fp;
    const float *restrict src = dz + (size_t)a * (a - 1) / 2;
    for (uint32_t b = 0; b < a; b++) row[b] = src[b];
    for (uint32_t b = a; b < fp; b++) row[b] = 0.0f;
  }
  uint32_t dfull = dim / IL * IL;
  for (uint32_t a0 = 0; a0 < f; a0 += IR) {
    uint32_t r[IR];
    for (uint32_t k = 0; k < IR; k++) r[k] = a0 + k < f ? a0 + k : f - 1;
    const float *restrict g0 = gl + (size_t)r[0] * fp, *restrict g1 = gl + (size_t)r[1] * fp,
                          *restrict g2 = gl + (size_t)r[2] * fp, *restrict g3 = gl + (size_t)r[3] * fp;
    for (uint32_t d0 = 0; d0 < dfull; d0 += IL) {
      vf_t s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
      for (uint32_t b = 0; b < r[IR - 1]; b++) { /* b < a: row a of gl */
        vf_t x;
        memcpy(&x, vp[b] + d0, sizeof(x));
        s0 += g0[b] * x;
        s1 += g1[b] * x;
        s2 += g2[b] * x;
        s3 += g3[b] * x;
      }
      for (uint32_t b = a0 + 1; b < f; b++) { /* b > a: column a of gl */
        vf_t x;
        memcpy(&x, vp[b] + d0, sizeof(x));
        const float *restrict gb = gl + (size_t)b * fp;
        s0 += gb[r[0]] * x;
        s1 += gb[r[1]] * x;
        s2 += gb[r[2]] * x;
        s3 += gb[r[3]] * x;
      }
      memcpy(dvp[r[0]] + d0, &s0, sizeof(s0));
      memcpy(dvp[r[1]] + d0, &s1, sizeof(s1));
      memcpy(dvp[r[2]] + d0, &s2, sizeof(s2));
      memcpy(dvp[r[3]] + d0, &s3, sizeof(s3));
    }
  }
  for (uint32_t a = 0; a < f && dfull < dim; a++)
    for (uint32_t d = dfull; d < dim; d++) {
      float acc = 0.0f;
      for (uint32_t b = 0; b < a; b++) acc += gl[(size_t)a * fp + b] * vp[b][d];
      for (uint32_t b = a + 1; b < f; b++) acc += gl[(size_t)b * fp + a] * vp[b][d];
      dvp[a][d] = acc;
    }
}

void nn_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     const float *d_out, size_t out_stride, float *d_bottom,
                     float *d_emb, size_t d_emb_stride) {
  uint32_t f = n_emb + (bottom ? 1 : 0), fp = round_il(f);
  ASSERT(nn_interact_fits(n_emb, dim, bottom != NULL));
  float gl[NN_INTERACT_MAX_STACK] __attribute__((aligned(64)));
  float dbot[NN_INTERACT_MAX_STACK] __attribute__((aligned(64)));
  const float *vp[NN_INTERACT_MAX_STACK / 8];
  float *dvp[NN_INTERACT_MAX_STACK / 8];
  for (uint32_t i = 0; i < n; i++) {
    const float *bi = bottom ? bottom + (size_t)i * bottom_stride : NULL;
    const float *gi = d_out + (size_t)i * out_stride;
    const float *ei = emb + (size_t)i * emb_stride;
    float *di = d_emb + (size_t)i * d_emb_stride;
    uint32_t off = bi ? 1 : 0;
    if (bi) {
      vp[0] = bi;
      dvp[0] = dbot;
    }
    for (uint32_t t = 0; t < n_emb; t++) {
      vp[off + t] = ei + (size_t)t * dim;
      dvp[off + t] = di + (size_t)t * dim;
    }
    tril_dots_bwd(vp, gi + (bi ? dim : 0), f, fp, dim, gl, dvp);
    if (bi && d_bottom) {
      float *db = d_bottom + (size_t)i * bottom_stride;
      for (uint32_t d = 0; d < dim; d++) db[d] = gi[d] + dbot[d];
    }
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

/* The per-row loops of the cross layers, with restrict parameters (GCC
 * honours restrict on parameters, also once inlined, not on block-scope
 * pointers): y = x0 * s + b + x. */
static inline __attribute__((always_inline)) void cross_fwd_row(
    float *restrict y, const float *restrict a, const float *restrict x,
    const float *restrict b, float si, uint32_t d) {
  for (uint32_t j = 0; j < d; j++) y[j] = a[j] * si + b[j] + x[j];
}

/* One layer's backward for one row, g (d y in, d x out) in place. */
static inline __attribute__((always_inline)) void cross_bwd_row(
    float *restrict g, const float *restrict x, const float *restrict w,
    float *restrict dw, float *restrict db, float *restrict d0, float ds, float si,
    uint32_t d) {
  for (uint32_t j = 0; j < d; j++) {
    float gj = g[j];
    db[j] += gj;
    dw[j] += ds * x[j];
    d0[j] += gj * si;
    g[j] = gj + ds * w[j];
  }
}

NN_HOT void nn_cross_fwd(const float *x0, const float *x, uint32_t n, uint32_t d,
                         const float *w, const float *b, float *s, float *y) {
  for (uint32_t i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * d;
    float si = dot8(xi, w, d);
    s[i] = si;
    cross_fwd_row(y + (size_t)i * d, x0 + (size_t)i * d, xi, b, si, d);
  }
}

NN_HOT void nn_cross_bwd(const float *x0, const float *x, const float *s, uint32_t n,
                         uint32_t d, const float *w, const float *dy, float *dw,
                         float *db, float *dx, float *dx0) {
  memset(dw, 0, (size_t)d * sizeof(float));
  memset(db, 0, (size_t)d * sizeof(float));
  for (uint32_t i = 0; i < n; i++) {
    const float *a = x0 + (size_t)i * d;
    float *g = dx + (size_t)i * d;
    if (dx != dy) memcpy(g, dy + (size_t)i * d, (size_t)d * sizeof(float));
    float ds = dot8(g, a, d);
    cross_bwd_row(g, x + (size_t)i * d, w, dw, db, dx0 + (size_t)i * d, ds, s[i], d);
  }
}

NN_HOT void nn_cross_stack_fwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                               const float *const *w, const float *const *b, float *const *s,
                               float *const *xl) {
  for (uint32_t i = 0; i < n; i++) {
    const float *a = x0 + (size_t)i * d;
    const float *x = a;
    for (uint32_t l = 0; l < L; l++) {
      float *y = xl[l + 1] + (size_t)i * d;
      float si = dot8(x, w[l], d);
      s[l][i] = si;
      cross_fwd_row(y, a, x, b[l], si, d);
      x = y;
    }
  }
}

NN_HOT static void add_into(float *restrict d, const float *restrict s, uint32_t n) {
  for (uint32_t j = 0; j < n; j++) d[j] += s[j];
}

NN_HOT void nn_cross_stack_bwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                               const float *const *w, const float *const *xl,
                               const float *const *s, float *dy, float *const *dw,
                               float *const *db, float *dx0) {
  for (uint32_t l = 0; l < L; l++) {
    memset(dw[l], 0, (size_t)d * sizeof(float));
    memset(db[l], 0, (size_t)d * sizeof(float));
  }
  for (uint32_t i = 0; i < n; i++) {
    const float *a = x0 + (size_t)i * d;
    float *g = dy + (size_t)i * d;
    float *d0 = dx0 + (size_t)i * d;
    for (uint32_t l = L; l-- > 0;) {
      const float *xi = l ? xl[l] + (size_t)i * d : a;
      float ds = dot8(g, a, d);
      cross_bwd_row(g, xi, w[l], dw[l], db[l], d0, ds, s[l][i], d);
    }
    add_into(d0, g, d);
  }
}

/* ------------------------------------------------------ DCNv2 cross layer */

/* y = x0 * z + x, one row. */
static inline __attribute__((always_inline)) void cross2_y_row(
    float *restrict y, const float *restrict a, const float *restrict z,
    const float *restrict x, uint32_t d) {
  for (uint32_t j = 0; j < d; j++) y[j] = a[j] * z[j] + x[j];
}

/* dz = g * x0; dx0 += g * z, one row. */
static inline __attribute__((always_inline)) void cross2_g_row(
    float *restrict dz, float *restrict d0, const float *restrict g,
    const float *restrict a, const float *restrict z, uint32_t d) {
  for (uint32_t j = 0; j < d; j++) {
    dz[j] = g[j] * a[j];
    d0[j] += g[j] * z[j];
  }
}

NN_HOT static void cross2_y(float *y, const float *x0, const float *z, const float *x,
                            size_t rows, uint32_t d) {
  for (size_t i = 0; i < rows; i++) {
    size_t o = i * d;
    cross2_y_row(y + o, x0 + o, z + o, x + o, d);
  }
}

NN_HOT static void cross2_g(float *dz, float *dx0, const float *g, const float *x0,
                            const float *z, size_t rows, uint32_t d) {
  for (size_t i = 0; i < rows; i++) {
    size_t o = i * d;
    cross2_g_row(dz + o, dx0 + o, g + o, x0 + o, z + o, d);
  }
}

void nn_cross2_fwd(const float *x0, const float *x, uint32_t n, uint32_t d, uint32_t r,
                   const float *w, const float *v, const float *b, float *t, float *z,
                   float *y) {
  if (n == 0) return;
  if (r) {
    nn_linear_fwd(x, n, d, r, v, NULL, NN_ACT_NONE, t);
    nn_linear_fwd(t, n, r, d, w, b, NN_ACT_NONE, z);
  } else {
    nn_linear_fwd(x, n, d, d, w, b, NN_ACT_NONE, z);
  }
  cross2_y(y, x0, z, x, n, d);
}

void nn_cross2_bwd(const float *x0, const float *x, const float *t, const float *z,
                   uint32_t n, uint32_t d, uint32_t r, const float *w, const float *v,
                   float *g, float *dz, float *dt, float *dw, float *dv, float *db,
                   float *dx0) {
  cross2_g(dz, dx0, g, x0, z, n, d);
  /* z's own linear layer: dw, db, and its input gradient (dt, or added to
   * g, which already holds the identity term of d x) */
  if (r) {
    nn_linear_bwd(t, z, dz, n, r, d, w, NN_ACT_NONE, dw, db, dt, 0);
    nn_linear_bwd(x, t, dt, n, d, r, v, NN_ACT_NONE, dv, NULL, g, 1);
  } else {
    nn_linear_bwd(x, z, dz, n, d, d, w, NN_ACT_NONE, dw, db, g, 1);
  }
}
