/*
 * Layers of common/model/nn.h: forward values against direct formulas
 * and backward against central finite differences.
 *
 * Finite differences: every layer is checked through the scalar
 * L = sum_k r_k * y_k (r fixed random weights, summed in double), whose
 * gradient w.r.t. y is r; the analytic gradients from the backward with
 * dy = r are compared element by element with (L(p+e) - L(p-e)) / 2e,
 * e = 1e-3, computed with the float32 forward.  Tolerance |a - n| <= 1e-3 +
 * 1e-2 |n|: the float32 forward rounds each output to ~6e-8 relative
 * (values here are O(1), sums of <= 16 terms), so L carries an error of a
 * few 1e-7 and the difference quotient ~1e-4; the truncation error of a
 * central difference is e^2/6 * |f'''| ~ 1e-7 for these smooth layers.
 * Inputs of ReLU layers are kept at least 0.02 from the kink so a +-e
 * perturbation never crosses it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "blas_cpu.h"
#include "embag.h"
#include "nn.h"
#include "opt.h"
#include "pool.h"
#include "table.h"
#include "testutil.h"

/* |a - b| <= tol, in double (cmocka's assert_float_equal rounds to float) */
#define FD_EPS 1e-3f
#define FD_ATOL 1e-3
#define FD_RTOL 1e-2

static uint64_t rng_state;
static float urand(void) { /* uniform [-1, 1) */
  rng_state = table_mix64(rng_state);
  return (float)((double)(rng_state >> 40) / 8388608.0 - 1.0);
}
static void fill(float *p, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) p[i] = scale * urand();
}
static double wsum(const float *y, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)y[i] * r[i];
  return s;
}

/* ---- generic finite-difference check */
typedef double (*objective_fn)(void *ctx);

static void fd_check(const char *what, objective_fn f, void *ctx, float *p, size_t n,
                     const float *analytic) {
  for (size_t i = 0; i < n; i++) {
    float saved = p[i];
    p[i] = saved + FD_EPS;
    double lp = f(ctx);
    p[i] = saved - FD_EPS;
    double lm = f(ctx);
    p[i] = saved;
    double num = (lp - lm) / (2.0 * FD_EPS);
    double a = analytic[i];
    if (fabs(a - num) > FD_ATOL + FD_RTOL * fabs(num)) {
      print_error("%s[%zu]: analytic %.6g numeric %.6g\n", what, i, a, num);
      fail();
    }
  }
}

/* ------------------------------------------------------------------ linear */

typedef struct lin_ctx_s {
  uint32_t n, in, out;
  nn_act_t act;
  float *x, *w, *b, *y, *r;
} lin_ctx_t;

static double lin_obj(void *c) {
  lin_ctx_t *l = c;
  nn_linear_fwd(l->x, l->n, l->in, l->out, l->w, l->b, l->act, l->y);
  return wsum(l->y, l->r, (size_t)l->n * l->out);
}

static void check_linear(nn_act_t act, int with_bias, uint32_t in, uint32_t out) {
  lin_ctx_t l = {.n = 5, .in = in, .out = out, .act = act};
  size_t nx = l.n * l.in, nw = l.in * l.out, ny = l.n * l.out;
  l.x = malloc(nx * 4); l.w = malloc(nw * 4); l.b = with_bias ? malloc(l.out * 4) : NULL;
  l.y = malloc(ny * 4); l.r = malloc(ny * 4);
  float *dy = malloc(ny * 4), *dw = malloc(nw * 4), *db = malloc(l.out * 4),
        *dx = malloc(nx * 4), *pre = malloc(ny * 4);
  /* draw until every pre-activation is >= 0.02 from the ReLU kink */
  for (rng_state = 1;; ) {
    fill(l.x, nx, 1.0f); fill(l.w, nw, 0.5f); if (l.b) fill(l.b, l.out, 0.5f);
    nn_linear_fwd(l.x, l.n, l.in, l.out, l.w, l.b, NN_ACT_NONE, pre);
    size_t k = 0;
    while (k < ny && fabsf(pre[k]) >= 0.02f) k++;
    if (k == ny) break;
  }
  fill(l.r, ny, 1.0f);
  /* forward against the direct formula */
  lin_obj(&l);
  for (uint32_t i = 0; i < l.n; i++)
    for (uint32_t j = 0; j < l.out; j++) {
      double s = l.b ? l.b[j] : 0.0;
      for (uint32_t k = 0; k < l.in; k++) s += (double)l.x[i * l.in + k] * l.w[j * l.in + k];
      if (act == NN_ACT_RELU && s < 0) s = 0;
      assert_near(l.y[i * l.out + j], s, 1e-5);
    }
  memcpy(dy, l.r, ny * 4);
  nn_linear_bwd(l.x, l.y, dy, l.n, l.in, l.out, l.w, act, dw, l.b ? db : NULL, dx, 0);
  fd_check("linear dx", lin_obj, &l, l.x, nx, dx);
  fd_check("linear dw", lin_obj, &l, l.w, nw, dw);
  if (l.b) fd_check("linear db", lin_obj, &l, l.b, l.out, db);
  /* dx_accumulate adds to what is there */
  float *dx2 = malloc(nx * 4);
  for (size_t i = 0; i < nx; i++) dx2[i] = 1.0f;
  memcpy(dy, l.r, ny * 4);
  lin_obj(&l);
  nn_linear_bwd(l.x, l.y, dy, l.n, l.in, l.out, l.w, act, dw, NULL, dx2, 1);
  for (size_t i = 0; i < nx; i++) assert_near(dx2[i], dx[i] + 1.0f, 1e-6);
  free(dx2);
  free(l.x); free(l.w); free(l.b); free(l.y); free(l.r);
  free(dy); free(dw); free(db); free(dx); free(pre);
}

static void test_linear(void **state) {
  (void)state;
  check_linear(NN_ACT_NONE, 1, 7, 6);
  check_linear(NN_ACT_RELU, 1, 7, 6);
  check_linear(NN_ACT_NONE, 0, 7, 6);
  check_linear(NN_ACT_RELU, 0, 7, 6);
  /* one output: the matrix-vector path (in = 19: 8-lane blocks + tail) */
  check_linear(NN_ACT_NONE, 1, 19, 1);
  check_linear(NN_ACT_RELU, 0, 19, 1);
}

/* -------------------------------------------------------------- element-wise */

typedef struct ew_ctx_s {
  size_t n;
  int sigmoid;
  float *x, *y, *r;
} ew_ctx_t;

static double ew_obj(void *c) {
  ew_ctx_t *e = c;
  if (e->sigmoid) nn_sigmoid_fwd(e->x, e->n, e->y);
  else nn_relu_fwd(e->x, e->n, e->y);
  return wsum(e->y, e->r, e->n);
}

static void test_relu_sigmoid(void **state) {
  (void)state;
  enum { N = 64 };
  float x[N], y[N], r[N], dx[N];
  rng_state = 7;
  for (int i = 0; i < N; i++) {
    float v = 3.0f * urand();
    x[i] = fabsf(v) < 0.02f ? 0.5f : v; /* away from the kink */
  }
  fill(r, N, 1.0f);
  for (int s = 0; s < 2; s++) {
    ew_ctx_t e = {N, s, x, y, r};
    ew_obj(&e);
    for (int i = 0; i < N; i++) {
      double ref = s ? 1.0 / (1.0 + exp(-(double)x[i])) : (x[i] > 0 ? x[i] : 0.0);
      assert_near(y[i], ref, 1e-6);
    }
    if (s) nn_sigmoid_bwd(y, r, N, dx);
    else nn_relu_bwd(y, r, N, dx);
    fd_check(s ? "sigmoid" : "relu", ew_obj, &e, x, N, dx);
  }
  /* sigmoid saturates without NaN or overflow */
  float big[4] = {-200.0f, -90.0f, 90.0f, 200.0f}, out[4];
  nn_sigmoid_fwd(big, 4, out);
  assert_true(out[0] == 0.0f && out[1] >= 0.0f && out[1] < 1e-30f);
  assert_true(out[2] == 1.0f && out[3] == 1.0f);
  /* in place */
  memcpy(y, x, sizeof(x));
  nn_relu_fwd(y, N, y);
  for (int i = 0; i < N; i++) assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
}

/* ---------------------------------------------------------------- BCE */

typedef struct bce_ctx_s {
  uint32_t n;
  float *z, *t;
} bce_ctx_t;

static double bce_obj(void *c) {
  bce_ctx_t *b = c;
  return nn_bce_logits_fwd(b->z, b->t, b->n);
}

static void test_bce(void **state) {
  (void)state;
  enum { N = 32 };
  float z[N], t[N], dz[N];
  rng_state = 11;
  for (int i = 0; i < N; i++) {
    z[i] = 6.0f * urand();
    t[i] = (float)(i & 1);
  }
  double s = nn_bce_logits_fwd(z, t, N), ref = 0.0;
  for (int i = 0; i < N; i++) {
    double p = 1.0 / (1.0 + exp(-(double)z[i]));
    ref += -(t[i] * log(p) + (1 - t[i]) * log(1 - p));
  }
  assert_near(s, ref, 1e-9 * N);
  double s2 = nn_bce_logits_bwd(z, t, N, 1.0f, dz);
  assert_true(s2 == s);
  bce_ctx_t b = {N, z, t};
  fd_check("bce", bce_obj, &b, z, N, dz);
  /* scale multiplies the gradient */
  float dz2[N];
  nn_bce_logits_bwd(z, t, N, 0.25f, dz2);
  for (int i = 0; i < N; i++) assert_near(dz2[i], 0.25f * dz[i], 1e-7);
  /* extreme logits: finite, exact large-margin values */
  float ze[4] = {100.0f, -100.0f, 100.0f, -100.0f}, te[4] = {0, 1, 1, 0}, de[4];
  double e = nn_bce_logits_bwd(ze, te, 4, 1.0f, de);
  assert_near(e, 200.0, 1e-9);
  assert_near(de[0], 1.0, 1e-7);
  assert_near(de[1], -1.0, 1e-7);
  assert_near(de[2], 0.0, 1e-7);
  assert_near(de[3], 0.0, 1e-7);
}

/* ---------------------------------------------------------------- concat */

static void test_concat(void **state) {
  (void)state;
  float a[2 * 3] = {1, 2, 3, 4, 5, 6}; /* 2 samples x 3 (stride 3) */
  float b[2 * 4] = {7, 8, 0, 0, 9, 10, 0, 0}; /* 2 samples x 2 (stride 4) */
  const float *src[2] = {a, b};
  size_t ss[2] = {3, 4};
  uint32_t w[2] = {3, 2};
  float d[2 * 6];
  memset(d, 0xff, sizeof(d));
  nn_concat_fwd(2, 2, src, ss, w, d, 6);
  float want[12] = {1, 2, 3, 7, 8, -1, 4, 5, 6, 9, 10, -1};
  for (int i = 0; i < 12; i++)
    if (i != 5 && i != 11) assert_true(d[i] == want[i]);
  float ga[6], gb[8] = {0};
  float *dst[2] = {ga, gb};
  nn_concat_bwd(2, 2, d, 6, w, dst, ss, 0);
  for (int i = 0; i < 6; i++) assert_true(ga[i] == a[i]);
  assert_true(gb[0] == 7 && gb[1] == 8 && gb[4] == 9 && gb[5] == 10);
  nn_concat_bwd(2, 2, d, 6, w, dst, ss, 1);
  for (int i = 0; i < 6; i++) assert_true(ga[i] == 2 * a[i]);
  float *dst2[2] = {NULL, gb}; /* skip a piece */
  nn_concat_bwd(2, 2, d, 6, w, dst2, ss, 0);
  assert_true(gb[0] == 7 && gb[5] == 10);
}

/* ------------------------------------------------------------ embedding bag */

static void test_embedding_bag_onehot(void **state) {
  (void)state;
  enum { ROWS = 10, DIM = 3, STRIDE = 4 }; /* one float of state after each row */
  float base[ROWS * STRIDE];
  for (int r = 0; r < ROWS; r++)
    for (int d = 0; d < STRIDE; d++) base[r * STRIDE + d] = (float)(r * 10 + d);
  uint64_t idx[4] = {3, 7, 3, 0};
  float out[4 * 5];
  nn_embedding_bag_fwd(base, STRIDE, idx, 4, 1, DIM, out, 5);
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < DIM; d++) assert_true(out[i * 5 + d] == (float)(idx[i] * 10 + d));
  /* backward: 3 appears twice -> coalesced, ids ascending */
  float dout[4 * 5];
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < 5; d++) dout[i * 5 + d] = (float)(i + 1) * (d + 1);
  uint64_t uniq[4];
  float grad[4 * DIM];
  void *work = malloc(nn_embedding_bag_bwd_work_size(4, 1));
  uint32_t u = nn_embedding_bag_bwd(dout, 5, idx, 4, 1, DIM, uniq, grad, DIM, work);
  assert_int_equal(u, 3);
  assert_true(uniq[0] == 0 && uniq[1] == 3 && uniq[2] == 7);
  for (int d = 0; d < DIM; d++) {
    assert_true(grad[0 * DIM + d] == 4.0f * (d + 1));            /* sample 3 */
    assert_true(grad[1 * DIM + d] == (1.0f + 3.0f) * (d + 1));   /* samples 0, 2 */
    assert_true(grad[2 * DIM + d] == 2.0f * (d + 1));            /* sample 1 */
  }
  free(work);
}

static void test_embedding_bag_multihot(void **state) {
  (void)state;
  enum { ROWS = 50, DIM = 5, N = 40, H = 4, STRIDE = DIM + 1 };
  float base[ROWS * STRIDE], out[N * DIM], dout[N * DIM];
  uint64_t idx[N * H], uniq[N * H];
  rng_state = 99;
  fill(base, ROWS * STRIDE, 1.0f);
  fill(dout, N * DIM, 1.0f);
  /* keys far above zero (as with table bits) and many duplicates, also
   * within one sample */
  uint64_t off = UINT64_C(5) << 48;
  for (int k = 0; k < N * H; k++) {
    rng_state = table_mix64(rng_state);
    idx[k] = off + rng_state % ROWS;
  }
  idx[1] = idx[0];
  uint64_t small[N * H]; /* the forward reads rows 0..ROWS-1 */
  for (int k = 0; k < N * H; k++) small[k] = idx[k] - off;
  nn_embedding_bag_fwd(base, STRIDE, small, N, H, DIM, out, DIM);
  for (int i = 0; i < N; i++)
    for (int d = 0; d < DIM; d++) {
      float s = 0.0f;
      for (int h = 0; h < H; h++) s += base[(idx[i * H + h] - off) * STRIDE + d];
      assert_true(out[i * DIM + d] == s); /* same order, same bits */
    }
  float grad[N * H * DIM];
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, H));
  uint32_t u = nn_embedding_bag_bwd(dout, DIM, idx, N, H, DIM, uniq, grad, DIM, work);
  /* reference: ids ascending, contributions in sample order */
  uint32_t want_u = 0;
  for (uint64_t r = 0; r < ROWS; r++) {
    float g[DIM] = {0};
    int seen = 0;
    for (int k = 0; k < N * H; k++)
      if (idx[k] == off + r) {
        seen = 1;
        for (int d = 0; d < DIM; d++) g[d] += dout[(k / H) * DIM + d];
      }
    if (!seen) continue;
    assert_true(uniq[want_u] == off + r);
    for (int d = 0; d < DIM; d++) assert_true(grad[want_u * DIM + d] == g[d]);
    want_u++;
  }
  assert_int_equal(u, want_u);
  /* determinism: a second run gives the same bytes */
  uint64_t uniq2[N * H];
  float grad2[N * H * DIM];
  uint32_t u2 = nn_embedding_bag_bwd(dout, DIM, idx, N, H, DIM, uniq2, grad2, DIM, work);
  assert_int_equal(u2, u);
  assert_memory_equal(uniq2, uniq, u * sizeof(uint64_t));
  assert_memory_equal(grad2, grad, (size_t)u * DIM * sizeof(float));
  free(work);
}

/* embag's per-table work on 1..4 threads against the serial loop over
 * the tables (nn_embedding_bag_fwd / _bwd, opt_row_update): the same bits
 * for the pooled input, every table's fold, the updated rows, and a
 * masked row list; a skipped table is left alone. */
static void test_embag_threads(void **state) {
  (void)state;
  enum { T = 7, ROWS = 300, DIM = 8, RF = 2 * DIM, N = 200, W = T * DIM };
  const uint32_t hot[T] = {1, 3, 1, 2, 1, 4, 1};
  opt_hparams_t hp = {.lr = 0.05f, .eps = 1e-8f};
  size_t off[T + 1];
  off[0] = 0;
  for (int t = 0; t < T; t++) off[t + 1] = off[t] + (size_t)N * hot[t];
  uint64_t *ids = malloc(off[T] * sizeof *ids);
  float *rows0 = malloc((size_t)T * ROWS * RF * sizeof(float)), *rows_ref = malloc((size_t)T * ROWS * RF * sizeof(float));
  float *rows = malloc((size_t)T * ROWS * RF * sizeof(float));
  float *out_ref = malloc((size_t)N * W * sizeof(float)), *out = malloc((size_t)N * W * sizeof(float));
  float *dout = malloc((size_t)N * W * sizeof(float));
  uint64_t *uniq_ref = malloc(off[T] * sizeof(uint64_t));
  float *grad_ref = malloc(off[T] * DIM * sizeof(float));
  uint32_t nu_ref[T];
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, 4));
  assert_non_null(ids && rows0 && rows_ref && rows && out_ref && out && dout && uniq_ref && grad_ref && work);
  rng_state = 4242;
  fill(rows0, (size_t)T * ROWS * RF, 1.0f);
  for (size_t k = 0; k < (size_t)T * ROWS; k++) /* adagrad state starts >= 0 */
    for (int d = DIM; d < RF; d++) rows0[k * RF + d] = 0.0f;
  fill(dout, (size_t)N * W, 0.1f);
  for (size_t k = 0; k < off[T]; k++) { /* Zipf-like: many repeats of low rows */
    rng_state = table_mix64(rng_state);
    uint64_t r = rng_state % ROWS;
    ids[k] = (k % 3) ? r % 17 : r;
  }
  float *base0[T], *base[T];
  const uint64_t *idx[T];
  for (int t = 0; t < T; t++) idx[t] = ids + off[t];
  /* the serial reference */
  memcpy(rows_ref, rows0, (size_t)T * ROWS * RF * sizeof(float));
  for (int t = 0; t < T; t++) {
    base0[t] = rows_ref + (size_t)t * ROWS * RF;
    nn_embedding_bag_fwd(base0[t], RF, idx[t], N, hot[t], DIM, out_ref + t * DIM, W);
  }
  for (int t = 0; t < T; t++) {
    nu_ref[t] = nn_embedding_bag_bwd(dout + t * DIM, W, idx[t], N, hot[t], DIM, uniq_ref + off[t],
                                     grad_ref + off[t] * DIM, DIM, work);
    for (uint32_t k = 0; k < nu_ref[t]; k++)
      opt_row_update(OPT_ADAGRAD, &hp, base0[t] + uniq_ref[off[t] + k] * RF, DIM, grad_ref + (off[t] + k) * DIM);
  }
  for (uint32_t nt = 1; nt <= 4; nt++) {
    pool_t *p = NULL;
    assert_int_equal(pool_create(nt, &p), 0);
    embag_t *e = NULL;
    assert_int_equal(embag_create(T, hot, DIM, N, &e), 0);
    memcpy(rows, rows0, (size_t)T * ROWS * RF * sizeof(float));
    for (int t = 0; t < T; t++) base[t] = rows + (size_t)t * ROWS * RF;
    embag_fwd(e, p, N, base, RF, idx, NULL, out);
    assert_memory_equal(out, out_ref, (size_t)N * W * sizeof(float));
    embag_bwd(e, p, N, dout, idx, NULL);
    for (int t = 0; t < T; t++) {
      const uint64_t *u;
      const float *g;
      assert_int_equal(embag_table(e, t, &u, &g), nu_ref[t]);
      assert_memory_equal(u, uniq_ref + off[t], nu_ref[t] * sizeof(uint64_t));
      assert_memory_equal(g, grad_ref + off[t] * DIM, (size_t)nu_ref[t] * DIM * sizeof(float));
    }
    size_t want = 0;
    for (int t = 0; t < T; t++) want += nu_ref[t];
    assert_int_equal(embag_bwd_update(e, p, N, dout, idx, NULL, base, RF, OPT_ADAGRAD, &hp), want);
    assert_memory_equal(rows, rows_ref, (size_t)T * ROWS * RF * sizeof(float));
    /* a skipped table: its columns and rows untouched, no fold */
    uint8_t skip[T] = {0, 0, 1, 0, 0, 0, 0};
    for (size_t k = 0; k < (size_t)N * W; k++) out[k] = -7.0f;
    embag_fwd(e, p, N, base, RF, idx, skip, out);
    for (int i = 0; i < N; i++)
      for (int t = 0; t < T; t++)
        for (int d = 0; d < DIM; d++)
          if (t == 2) assert_true(out[(size_t)i * W + t * DIM + d] == -7.0f);
    embag_bwd(e, p, N, dout, idx, skip);
    assert_int_equal(embag_table(e, 2, NULL, NULL), 0);
    assert_int_equal(embag_table(e, 3, NULL, NULL), nu_ref[3]);
    /* a masked list of distinct rows (long enough to use the threads) */
    memcpy(rows, rows0, (size_t)T * ROWS * RF * sizeof(float));
    memcpy(rows_ref, rows0, (size_t)T * ROWS * RF * sizeof(float));
    enum { L = T * ROWS / 2 };
    uint32_t *at = malloc(L * sizeof *at);
    uint8_t *mask = malloc(L);
    assert_non_null(at && mask);
    size_t want_n = 0;
    for (uint32_t i = 0; i < L; i++) {
      at[i] = (uint32_t)(T * ROWS - 1 - 2 * i);
      mask[i] = (uint8_t)(i % 5 == 1);
      if (!mask[i]) {
        opt_row_update(OPT_ADAGRAD, &hp, rows_ref + (size_t)at[i] * RF, DIM, dout + (size_t)i * DIM);
        want_n++;
      }
    }
    assert_int_equal(embag_update_rows(p, OPT_ADAGRAD, &hp, rows, RF, DIM, at, dout, mask, 0, L), want_n);
    assert_memory_equal(rows, rows_ref, (size_t)T * ROWS * RF * sizeof(float));
    free(at);
    free(mask);
    /* restore the reference of the next thread count */
    memcpy(rows_ref, rows0, (size_t)T * ROWS * RF * sizeof(float));
    for (int t = 0; t < T; t++)
      for (uint32_t k = 0; k < nu_ref[t]; k++)
        opt_row_update(OPT_ADAGRAD, &hp, rows_ref + (size_t)t * ROWS * RF + uniq_ref[off[t] + k] * RF, DIM,
                       grad_ref + (off[t] + k) * DIM);
    embag_destroy(e);
    pool_destroy(p);
  }
  free(ids);
  free(rows0);
  free(rows_ref);
  free(rows);
  free(out_ref);
  free(out);
  free(dout);
  free(uniq_ref);
  free(grad_ref);
  free(work);
}

/* embag_create_tables + embag_bwd_each, as a partitioned table's owner
 * uses them (tables in separate row arrays, pooled into a buffer of its
 * own): on 1..4 threads the same bits as the serial loop, the callback once
 * per folded row with that row's address and summed gradient, in
 * ascending row order per table, never two threads on one table. */
typedef struct each_s {
  opt_hparams_t hp;
  float *const *base;
  size_t rf;
  uint32_t dim;
  uint32_t *calls[3]; /* table t's calls per row: written by one thread at a time */
  uint64_t last[3];   /* the last row seen per table (+1) */
  int order_ok[3];
} each_t;

static void each_cb(void *ud, uint32_t t, uint64_t r, float *row, const float *grad) {
  each_t *x = ud;
  if (row != x->base[t] + r * x->rf) x->order_ok[t] = 0;
  if (r + 1 <= x->last[t]) x->order_ok[t] = 0;
  x->last[t] = r + 1;
  x->calls[t][r]++;
  opt_row_update(OPT_ADAGRAD, &x->hp, row, x->dim, grad);
}

static void test_embag_each(void **state) {
  (void)state;
  enum { T = 3, ROWS = 500, DIM = 6, RF = 2 * DIM, N = 301, W = T * DIM };
  const uint32_t hot[T] = {2, 1, 3};
  opt_hparams_t hp = {.lr = 0.03f, .eps = 1e-8f};
  size_t off[T + 1] = {0};
  for (int t = 0; t < T; t++) off[t + 1] = off[t] + (size_t)N * hot[t];
  uint64_t *ids = malloc(off[T] * sizeof *ids);
  float *rows0 = malloc((size_t)T * ROWS * RF * sizeof(float)), *rows_ref = malloc((size_t)T * ROWS * RF * sizeof(float));
  float *out_ref = malloc((size_t)N * W * sizeof(float)), *out = malloc((size_t)N * W * sizeof(float));
  float *dout = malloc((size_t)N * W * sizeof(float));
  uint64_t *uniq = malloc((size_t)N * 3 * sizeof *uniq);
  float *grad = malloc((size_t)N * 3 * DIM * sizeof(float));
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, 3));
  uint32_t *want_calls = calloc((size_t)T * ROWS, sizeof *want_calls);
  assert_non_null(ids && rows0 && rows_ref && out_ref && out && dout && uniq && grad && work && want_calls);
  rng_state = 777;
  fill(rows0, (size_t)T * ROWS * RF, 1.0f);
  for (size_t k = 0; k < (size_t)T * ROWS; k++)
    for (int d = DIM; d < RF; d++) rows0[k * RF + d] = 0.0f;
  fill(dout, (size_t)N * W, 0.2f);
  for (size_t k = 0; k < off[T]; k++) {
    rng_state = table_mix64(rng_state);
    ids[k] = (k % 4) ? rng_state % 23 : rng_state % ROWS; /* repeats */
  }
  const uint64_t *idx[T];
  float *bref[T];
  size_t want = 0;
  memcpy(rows_ref, rows0, (size_t)T * ROWS * RF * sizeof(float));
  for (int t = 0; t < T; t++) {
    idx[t] = ids + off[t];
    bref[t] = rows_ref + (size_t)t * ROWS * RF;
    nn_embedding_bag_fwd(bref[t], RF, idx[t], N, hot[t], DIM, out_ref + t * DIM, W);
    uint32_t u = nn_embedding_bag_bwd(dout + t * DIM, W, idx[t], N, hot[t], DIM, uniq, grad, DIM, work);
    for (uint32_t k = 0; k < u; k++) {
      opt_row_update(OPT_ADAGRAD, &hp, bref[t] + uniq[k] * RF, DIM, grad + (size_t)k * DIM);
      want_calls[(size_t)t * ROWS + uniq[k]]++;
    }
    want += u;
  }
  for (uint32_t nt = 1; nt <= 4; nt++) {
    pool_t *p = NULL;
    assert_int_equal(pool_create(nt, &p), 0);
    embag_t *e = NULL;
    assert_int_equal(embag_create_tables(T, hot, DIM, N, &e), 0);
    assert_null(embag_emb(e));
    assert_null(embag_d_emb(e));
    /* each table in its own allocation, as trainer_partition holds them */
    float *base[T];
    uint32_t *calls = calloc((size_t)T * ROWS, sizeof *calls);
    assert_non_null(calls);
    each_t x = {.hp = hp, .base = base, .rf = RF, .dim = DIM};
    for (int t = 0; t < T; t++) {
      base[t] = malloc((size_t)ROWS * RF * sizeof(float));
      assert_non_null(base[t]);
      memcpy(base[t], rows0 + (size_t)t * ROWS * RF, (size_t)ROWS * RF * sizeof(float));
      x.calls[t] = calls + (size_t)t * ROWS;
      x.order_ok[t] = 1;
    }
    embag_fwd(e, p, N, base, RF, idx, NULL, out);
    assert_memory_equal(out, out_ref, (size_t)N * W * sizeof(float));
    assert_int_equal(embag_bwd_each(e, p, N, dout, idx, NULL, base, RF, each_cb, &x), want);
    for (int t = 0; t < T; t++) {
      assert_true(x.order_ok[t]);
      assert_memory_equal(base[t], bref[t], (size_t)ROWS * RF * sizeof(float));
    }
    assert_memory_equal(calls, want_calls, (size_t)T * ROWS * sizeof *calls);
    /* an empty batch: no fold, no call */
    assert_int_equal(embag_bwd_each(e, p, 0, dout, idx, NULL, base, RF, each_cb, &x), 0);
    assert_memory_equal(calls, want_calls, (size_t)T * ROWS * sizeof *calls);
    for (int t = 0; t < T; t++) free(base[t]);
    free(calls);
    embag_destroy(e);
    pool_destroy(p);
  }
  free(ids);
  free(rows0);
  free(rows_ref);
  free(out_ref);
  free(out);
  free(dout);
  free(uniq);
  free(grad);
  free(work);
  free(want_calls);
}

/* Keys spread over 2^40 (several radix passes), with duplicates: the
 * coalesced output against a sort-and-sum reference. */
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void test_embedding_bag_wide_keys(void **state) {
  (void)state;
  enum { N = 3000, DIM = 3 };
  static uint64_t idx[N], sorted[N], uniq[N];
  static float dout[N * DIM], grad[N * DIM];
  rng_state = 1234;
  for (int i = 0; i < N; i++) {
    rng_state = table_mix64(rng_state);
    idx[i] = i % 7 == 3 ? idx[i / 2] : (rng_state >> 24); /* 40 bits, some repeats */
  }
  fill(dout, N * DIM, 1.0f);
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, 1));
  uint32_t u = nn_embedding_bag_bwd(dout, DIM, idx, N, 1, DIM, uniq, grad, DIM, work);
  memcpy(sorted, idx, sizeof(idx));
  qsort(sorted, N, sizeof(uint64_t), cmp_u64);
  uint32_t k = 0;
  for (int i = 0; i < N; i++) {
    if (i > 0 && sorted[i] == sorted[i - 1]) continue;
    assert_true(k < u);
    assert_true(uniq[k] == sorted[i]);
    float g[DIM] = {0, 0, 0};
    for (int j = 0; j < N; j++) /* sample order */
      if (idx[j] == sorted[i])
        for (int d = 0; d < DIM; d++) g[d] += dout[j * DIM + d];
    for (int d = 0; d < DIM; d++) assert_true(grad[k * DIM + d] == g[d]);
    k++;
  }
  assert_int_equal(u, k);
  assert_true(u < N); /* there were duplicates */
  free(work);
}

/* The bag is linear in the rows: its coalesced gradient is the exact
 * derivative of sum r * out w.r.t. each row. */
typedef struct eb_ctx_s {
  float *base, *out, *r;
  uint64_t *idx;
  uint32_t n, h, dim, stride;
} eb_ctx_t;

static double eb_obj(void *c) {
  eb_ctx_t *e = c;
  nn_embedding_bag_fwd(e->base, e->stride, e->idx, e->n, e->h, e->dim, e->out, e->dim);
  return wsum(e->out, e->r, (size_t)e->n * e->dim);
}

static void test_embedding_bag_fd(void **state) {
  (void)state;
  enum { ROWS = 6, DIM = 4, N = 5, H = 3, STRIDE = DIM };
  float base[ROWS * STRIDE], out[N * DIM], r[N * DIM], grad[N * H * DIM];
  uint64_t idx[N * H], uniq[N * H];
  rng_state = 5;
  fill(base, ROWS * STRIDE, 1.0f);
  fill(r, N * DIM, 1.0f);
  for (int k = 0; k < N * H; k++) idx[k] = (uint64_t)((k * 7) % 5);
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, H));
  uint32_t u = nn_embedding_bag_bwd(r, DIM, idx, N, H, DIM, uniq, grad, DIM, work);
  float full[ROWS * DIM];
  memset(full, 0, sizeof(full));
  for (uint32_t k = 0; k < u; k++) memcpy(full + uniq[k] * DIM, grad + k * DIM, DIM * 4);
  eb_ctx_t e = {base, out, r, idx, N, H, DIM, STRIDE};
  fd_check("embedding bag", eb_obj, &e, base, ROWS * DIM, full);
  free(work);
}

/* ---------------------------------------------------------- dot interaction */

typedef struct it_ctx_s {
  float *bottom, *emb, *out, *r;
  uint32_t n, t, dim, w;
} it_ctx_t;

static double it_obj(void *c) {
  it_ctx_t *e = c;
  nn_interact_fwd(e->bottom, e->dim, e->emb, (size_t)e->t * e->dim, e->n, e->t, e->dim,
                  e->out, e->w);
  return wsum(e->out, e->r, (size_t)e->n * e->w);
}

static void check_interact(int with_bottom, uint32_t T, uint32_t DIM) {
  enum { N = 3 };
  uint32_t f = T + (with_bottom ? 1 : 0);
  uint32_t w = nn_interact_out_width(T, DIM, with_bottom);
  assert_int_equal(w, (with_bottom ? DIM : 0) + f * (f - 1) / 2);
  assert_true(nn_interact_fits(T, DIM, with_bottom));
  float *bottom = malloc(N * DIM * 4), *emb = malloc(N * T * DIM * 4), *out = malloc(N * w * 4),
        *r = malloc(N * w * 4), *dbot = malloc(N * DIM * 4), *demb = malloc(N * T * DIM * 4);
  rng_state = 21 + with_bottom + T * 100 + DIM;
  fill(bottom, N * DIM, 1.0f);
  fill(emb, N * T * DIM, 1.0f);
  fill(r, N * w, 1.0f);
  it_ctx_t e = {with_bottom ? bottom : NULL, emb, out, r, N, T, DIM, w};
  it_obj(&e);
  /* forward: bottom copied, then pairs (1,0), (2,0), (2,1), ... each dot
   * summed in d order, so equal to a float loop to the bit */
  for (uint32_t i = 0; i < N; i++) {
    const float *v[64];
    uint32_t k = 0;
    if (with_bottom) v[k++] = bottom + i * DIM;
    for (uint32_t t = 0; t < T; t++) v[k++] = emb + (i * T + t) * DIM;
    const float *o = out + i * w;
    if (with_bottom)
      for (uint32_t d = 0; d < DIM; d++) assert_true(o[d] == bottom[i * DIM + d]);
    uint32_t p = with_bottom ? DIM : 0;
    for (uint32_t a = 1; a < f; a++)
      for (uint32_t b = 0; b < a; b++) {
        float s = 0.0f;
        for (uint32_t d = 0; d < DIM; d++) s += v[a][d] * v[b][d];
        if (o[p] != s) print_error("pair (%u,%u): %.9g vs %.9g\n", a, b, o[p], s);
        assert_true(o[p] == s);
        p++;
      }
    assert_int_equal(p, w);
  }
  nn_interact_bwd(e.bottom, DIM, emb, T * DIM, N, T, DIM, r, w, with_bottom ? dbot : NULL,
                  demb, T * DIM);
  fd_check("interaction d_emb", it_obj, &e, emb, N * T * DIM, demb);
  if (with_bottom) fd_check("interaction d_bottom", it_obj, &e, bottom, N * DIM, dbot);
  free(bottom); free(emb); free(out); free(r); free(dbot); free(demb);
}

/* Shapes: scalar paths (dim 5), DLRM's default (27 vectors of 16: two
 * column chunks, a partial row block), a dim with a vector part and a
 * tail (20), more than 16 vectors without a bottom, a single pair. */
static void test_interaction(void **state) {
  (void)state;
  check_interact(1, 4, 5);
  check_interact(0, 4, 5);
  check_interact(1, 26, 16);
  check_interact(1, 18, 20);
  check_interact(0, 17, 32);
  check_interact(0, 2, 16);
}

/* ---------------------------------------------------------------- FM */

typedef struct fm_ctx_s {
  float *emb, *out, *r;
  uint32_t n, t, dim;
} fm_ctx_t;

static double fm_obj(void *c) {
  fm_ctx_t *e = c;
  nn_fm_fwd(e->emb, (size_t)e->t * e->dim, e->n, e->t, e->dim, e->out);
  return wsum(e->out, e->r, e->n);
}

static void test_fm(void **state) {
  (void)state;
  enum { N = 4, T = 5, DIM = 3 };
  float emb[N * T * DIM], out[N], r[N], demb[N * T * DIM];
  rng_state = 33;
  fill(emb, N * T * DIM, 1.0f);
  fill(r, N, 1.0f);
  fm_ctx_t e = {emb, out, r, N, T, DIM};
  fm_obj(&e);
  for (int i = 0; i < N; i++) { /* the identity: sum over pairs a < b of <v_a, v_b> */
    double s = 0.0;
    for (int a = 0; a < T; a++)
      for (int b = a + 1; b < T; b++)
        for (int d = 0; d < DIM; d++)
          s += (double)emb[(i * T + a) * DIM + d] * emb[(i * T + b) * DIM + d];
    assert_near(out[i], s, 1e-5);
  }
  nn_fm_bwd(emb, T * DIM, N, T, DIM, r, demb, T * DIM, 0);
  fd_check("fm", fm_obj, &e, emb, N * T * DIM, demb);
  float demb2[N * T * DIM];
  for (int k = 0; k < N * T * DIM; k++) demb2[k] = 2.0f;
  nn_fm_bwd(emb, T * DIM, N, T, DIM, r, demb2, T * DIM, 1);
  for (int k = 0; k < N * T * DIM; k++) assert_near(demb2[k], demb[k] + 2.0f, 1e-6);
}

/* ------------------------------------------------------------- cross layer */

typedef struct cr_ctx_s {
  float *x0, *x, *w, *b, *s, *y, *r;
  uint32_t n, d;
} cr_ctx_t;

static double cr_obj(void *c) {
  cr_ctx_t *e = c;
  nn_cross_fwd(e->x0, e->x, e->n, e->d, e->w, e->b, e->s, e->y);
  return wsum(e->y, e->r, (size_t)e->n * e->d);
}

static void test_cross(void **state) {
  (void)state;
  enum { N = 3, D = 11 }; /* D > 8: exercises the lane loop and its tail */
  float x0[N * D], x[N * D], w[D], b[D], s[N], y[N * D], r[N * D];
  float dw[D], db[D], dx[N * D], dx0[N * D];
  rng_state = 44;
  fill(x0, N * D, 1.0f); fill(x, N * D, 1.0f); fill(w, D, 0.5f); fill(b, D, 0.5f);
  fill(r, N * D, 1.0f);
  cr_ctx_t e = {x0, x, w, b, s, y, r, N, D};
  cr_obj(&e);
  for (int i = 0; i < N; i++) {
    double dot = 0.0;
    for (int j = 0; j < D; j++) dot += (double)x[i * D + j] * w[j];
    for (int j = 0; j < D; j++)
      assert_near(y[i * D + j], x0[i * D + j] * dot + b[j] + x[i * D + j], 1e-5);
  }
  memset(dx0, 0, sizeof(dx0));
  nn_cross_bwd(x0, x, s, N, D, w, r, dw, db, dx, dx0);
  fd_check("cross dx", cr_obj, &e, x, N * D, dx);
  fd_check("cross dx0", cr_obj, &e, x0, N * D, dx0);
  fd_check("cross dw", cr_obj, &e, w, D, dw);
  fd_check("cross db", cr_obj, &e, b, D, db);
  /* dx may alias dy */
  float g[N * D];
  memcpy(g, r, sizeof(g));
  memset(dx0, 0, sizeof(dx0));
  nn_cross_bwd(x0, x, s, N, D, w, g, dw, db, g, dx0);
  assert_memory_equal(g, dx, sizeof(g));
}

/* The fused stack is the layer-by-layer computation, bit for bit. */
static void test_cross_stack(void **state) {
  (void)state;
  enum { N = 5, D = 21, L = 3 };
  static float x0[N * D], xs[L + 1][N * D], xr[L + 1][N * D], w[L][D], b[L][D];
  static float ss[L][N], sr[L][N], dy[N * D], gs[N * D], gr[N * D];
  static float dws[L][D], dbs[L][D], dwr[L][D], dbr[L][D], d0s[N * D], d0r[N * D];
  rng_state = 55;
  fill(x0, N * D, 1.0f);
  fill(&w[0][0], L * D, 0.3f);
  fill(&b[0][0], L * D, 0.3f);
  fill(dy, N * D, 1.0f);
  fill(d0s, N * D, 1.0f);
  memcpy(d0r, d0s, sizeof(d0s));
  const float *wp[L], *bp[L], *xsp[L + 1], *ssp[L];
  float *ssw[L], *xsw[L + 1], *dwp[L], *dbp[L];
  for (int l = 0; l < L; l++) {
    wp[l] = w[l]; bp[l] = b[l]; ssw[l] = ss[l]; ssp[l] = ss[l];
    dwp[l] = dws[l]; dbp[l] = dbs[l];
  }
  for (int l = 0; l <= L; l++) { xsw[l] = xs[l]; xsp[l] = xs[l]; }
  memcpy(xs[0], x0, sizeof(x0));
  memcpy(xr[0], x0, sizeof(x0));
  nn_cross_stack_fwd(x0, N, D, L, wp, bp, ssw, xsw);
  for (int l = 0; l < L; l++) nn_cross_fwd(x0, xr[l], N, D, w[l], b[l], sr[l], xr[l + 1]);
  for (int l = 1; l <= L; l++) assert_memory_equal(xs[l], xr[l], sizeof(x0));
  assert_memory_equal(ss, sr, sizeof(ss));
  memcpy(gs, dy, sizeof(dy));
  memcpy(gr, dy, sizeof(dy));
  nn_cross_stack_bwd(x0, N, D, L, wp, xsp, ssp, gs, dwp, dbp, d0s);
  for (int l = L; l-- > 0;) nn_cross_bwd(x0, xr[l], sr[l], N, D, w[l], gr, dwr[l], dbr[l], gr, d0r);
  for (int k = 0; k < N * D; k++) d0r[k] += gr[k];
  assert_memory_equal(d0s, d0r, sizeof(d0s));
  assert_memory_equal(dws, dwr, sizeof(dws));
  assert_memory_equal(dbs, dbr, sizeof(dbs));
}

/* ---- the OpenBLAS kernel set (blas_cpu.h).  main() runs blas_cpu_init
 * first, as every chanter binary does, so this process runs the chosen set. */

#define F_YMM 0x7ull  /* x87 + SSE + YMM */
#define F_ZMM 0xe7ull /* + opmask, ZMM_Hi256, Hi16_ZMM */

static blas_cpu_features_t feat(unsigned long long xcr0, int avx2fma, int avx512, int bf16) {
  blas_cpu_features_t f = {0};
  f.osxsave = xcr0 != 0;
  f.xcr0 = xcr0;
  f.avx = avx2fma || avx512;
  f.avx2 = f.fma = avx2fma;
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = f.avx512cd = avx512;
  f.avx512bf16 = bf16;
  return f;
}

/* The pure choice: features (cpuid AND the OS's XCR0) in, core out. */
static void test_blas_pick(void **state) {
  (void)state;
  blas_cpu_features_t f = feat(0, 0, 0, 0); /* pre-AVX (Nehalem) */
  assert_null(blas_cpu_pick(&f));
  f = feat(F_YMM, 0, 0, 0); /* AVX only (Sandy Bridge) */
  f.avx = 1;
  assert_null(blas_cpu_pick(&f));
  f = feat(F_YMM, 1, 0, 0); /* Zen 3, Haswell, Alder Lake */
  assert_string_equal(blas_cpu_pick(&f), "Haswell");
  f.fma = 0; /* AVX2 without FMA: OpenBLAS's Haswell kernels need both */
  assert_null(blas_cpu_pick(&f));
  f = feat(F_ZMM, 1, 1, 0); /* Skylake-X, Ice Lake */
  assert_string_equal(blas_cpu_pick(&f), "SkylakeX");
  f = feat(F_ZMM, 1, 1, 1); /* Cooper Lake, Sapphire/Emerald Rapids, Zen 4 */
  assert_string_equal(blas_cpu_pick(&f), "Cooperlake");
  f.avx512vl = 0; /* an incomplete AVX-512 (Knights Landing has no VL/BW/DQ) */
  assert_string_equal(blas_cpu_pick(&f), "Haswell");
  /* the OS did not enable ZMM state (XCR0 bits 5-7 clear): no AVX-512 */
  f = feat(F_YMM, 1, 1, 1);
  assert_string_equal(blas_cpu_pick(&f), "Haswell");
  f = feat(F_YMM | 0x20, 1, 1, 0); /* opmask only */
  assert_string_equal(blas_cpu_pick(&f), "Haswell");
  /* no YMM state (or no OSXSAVE): not even AVX2 */
  f = feat(0x3, 1, 1, 1);
  assert_null(blas_cpu_pick(&f));
  f = feat(F_ZMM, 1, 1, 1);
  f.osxsave = 0;
  assert_null(blas_cpu_pick(&f));

  assert_int_equal(blas_cpu_tier("SkylakeX"), 2);
  assert_int_equal(blas_cpu_tier("cooperlake"), 2);
  assert_int_equal(blas_cpu_tier("SapphireRapids"), 2);
  assert_int_equal(blas_cpu_tier("Haswell"), 1);
  assert_int_equal(blas_cpu_tier("Zen"), 1);
  const char *generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                           "Barcelona", "Bulldozer", "Piledriver", "Steamroller", "Nano", "unknown"};
  for (size_t k = 0; k < sizeof generic / sizeof *generic; k++) assert_int_equal(blas_cpu_tier(generic[k]), 0);
  assert_int_equal(blas_cpu_tier(NULL), 0);
}

/* The probe agrees with GCC's __builtin_cpu_supports, which (GCC 12's
 * libgcc, cpuinfo.o, checked: it runs xgetbv) also requires the OS's
 * register state. */
static void test_blas_probe(void **state) {
  (void)state;
#if defined(__x86_64__) && defined(__GNUC__)
  blas_cpu_features_t f;
  blas_cpu_probe(&f);
  const char *p = blas_cpu_pick(&f);
  __builtin_cpu_init();
  int gcc512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512cd");
  int gcc2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  assert_int_equal(blas_cpu_tier(p), gcc512 ? 2 : gcc2 ? 1 : 0);
#else
  print_message("blas_cpu: not x86-64, nothing to probe\n");
#endif
}

/* This process (blas_cpu_init ran in main) runs a kernel set as good as
 * the CPU: with AVX-512 an AVX-512 set, with AVX2 no generic one. */
static void test_blas_in_process(void **state) {
  (void)state;
  blas_cpu_features_t f;
  blas_cpu_probe(&f);
  int want = blas_cpu_tier(blas_cpu_pick(&f)), have = blas_cpu_tier(blas_cpu_core());
  print_message("blas: %s\n", blas_cpu_describe());
  if (blas_cpu_by() == BLAS_CPU_BY_USER || blas_cpu_by() == BLAS_CPU_NOT_FIXED) {
    print_message("blas: kernel set not chanter's to choose here; nothing checked\n");
    return;
  }
  if (want == 0) print_message("blas: no AVX2 (or not enabled by the OS): nothing to check\n");
  assert_true(have >= want);
  assert_null(getenv("CHANTER_BLAS_REEXEC_FROM"));
}

/* Runs this test binary again (/proc/self/exe --blas-report MARK) as a
 * child with env (NULL-terminated "K=V" pairs added to ours; "K" removes
 * K) and returns its stdout in out. */
static int run_report(const char *const *env, char *out, size_t n, pid_t *child) {
  int fd[2];
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    for (; *env; env++) {
      const char *eq = strchr(*env, '=');
      if (!eq) {
        unsetenv(*env);
        continue;
      }
      char k[64];
      snprintf(k, sizeof k, "%.*s", (int)(eq - *env), *env);
      setenv(k, eq + 1, 1);
    }
    char *argv[] = {(char *)"test_trainer_nn", (char *)"--blas-report", (char *)"mark with spaces", NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0;
  ssize_t r;
  while (len + 1 < n && (r = read(fd[0], out + len, n - 1 - len)) > 0) len += (size_t)r;
  out[len] = 0;
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  *child = pid;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The re-exec itself, on any CPU: pretend OpenBLAS fell back to Prescott
 * (CHANTER_BLAS_TEST_FALLBACK) and see the child come back once, with the
 * same pid, argv, environment and stdout, on the features' kernel set,
 * and without OPENBLAS_CORETYPE or the guard left in its environment. */
static void test_blas_reexec(void **state) {
  (void)state;
  blas_cpu_features_t f;
  blas_cpu_probe(&f);
  const char *want = blas_cpu_pick(&f);
  char out[4096], line[256];
  pid_t pid;
  const char *env[] = {"OPENBLAS_CORETYPE=Prescott", "CHANTER_BLAS_TEST_FALLBACK=1", "CHANTER_TEST_KEEP=kept",
                       "CHANTER_BLAS_REEXEC", NULL};
  assert_int_equal(run_report(env, out, sizeof out, &pid), 0);
  print_message("%s", out);
  if (!want) {
    assert_non_null(strstr(out, "core=Prescott by=openblas"));
    print_message("blas: no AVX2: the re-exec is not tried here\n");
    return;
  }
  snprintf(line, sizeof line, "core=%s by=chanter pid=%d argv=mark with spaces keep=kept coretype=- guard=-\n", want,
           (int)pid);
  assert_non_null(strstr(out, line));
  assert_non_null(strstr(out, "OpenBLAS alone picked Prescott"));

  /* CHANTER_BLAS_REEXEC=0: no re-exec, the fallback stays and says so */
  const char *off[] = {"OPENBLAS_CORETYPE=Prescott", "CHANTER_BLAS_TEST_FALLBACK=1", "CHANTER_BLAS_REEXEC=0", NULL};
  assert_int_equal(run_report(off, out, sizeof out, &pid), 0);
  print_message("%s", out);
  assert_non_null(strstr(out, "core=Prescott by=not fixed"));
  assert_non_null(strstr(out, "CHANTER_BLAS_REEXEC=0"));

  /* a user's OPENBLAS_CORETYPE is theirs */
  const char *user[] = {"OPENBLAS_CORETYPE=Haswell", "CHANTER_BLAS_TEST_FALLBACK", "CHANTER_BLAS_REEXEC", NULL};
  assert_int_equal(run_report(user, out, sizeof out, &pid), 0);
  print_message("%s", out);
  assert_non_null(strstr(out, "core=Haswell by=environment"));
  assert_non_null(strstr(out, "OPENBLAS_CORETYPE=Haswell set in the environment"));
}

/* the child side of test_blas_reexec: one line of facts, one of the log */
static int blas_report(int argc, char **argv) {
  const char *k = getenv("CHANTER_TEST_KEEP"), *c = getenv("OPENBLAS_CORETYPE"),
             *g = getenv("CHANTER_BLAS_REEXEC_FROM");
  printf("core=%s by=%s pid=%d argv=%s keep=%s coretype=%s guard=%s\n%s\n", blas_cpu_core(),
         blas_cpu_by_name(blas_cpu_by()), (int)getpid(), argc > 2 ? argv[2] : "-", k ? k : "-", c ? c : "-",
         g ? g : "-", blas_cpu_describe());
  return 0;
}

int main(int argc, char **argv) {
  blas_cpu_init(argv); /* as every chanter binary: this process runs the chosen kernels */
  if (argc > 1 && !strcmp(argv[1], "--blas-report")) return blas_report(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_blas_pick),
      cmocka_unit_test(test_blas_probe),
      cmocka_unit_test(test_blas_in_process),
      cmocka_unit_test(test_blas_reexec),
      cmocka_unit_test(test_relu_sigmoid),
      cmocka_unit_test(test_bce),
      cmocka_unit_test(test_concat),
      cmocka_unit_test(test_embedding_bag_onehot),
      cmocka_unit_test(test_embedding_bag_multihot),
      cmocka_unit_test(test_embedding_bag_wide_keys),
      cmocka_unit_test(test_embedding_bag_fd),
      cmocka_unit_test(test_embag_threads),
      cmocka_unit_test(test_embag_each),
      cmocka_unit_test(test_interaction),
      cmocka_unit_test(test_fm),
      cmocka_unit_test(test_cross),
      cmocka_unit_test(test_cross_stack),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
