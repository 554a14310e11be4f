/*
 * The CUDA mirror: cuda_check.h (device = cuda refuses clearly without a
 * GPU), nn_cuda.h's layers against nn.c, model_cuda against model.c.
 *
 * What runs where:
 *  - everywhere: the refusal sentence, in a child process with every
 *    device hidden (CUDA_VISIBLE_DEVICES=""), so it is checked on GPU
 *    machines too; in a CUDA=0 build it is the "built without CUDA" one;
 *  - CUDA builds: every nn_cuda_ / model_cuda_ function links (their
 *    addresses are taken, which pulls nn.cu and model.cu into the
 *    binary with cudart and cuBLAS);
 *  - CUDA builds without a usable device (CI): model_cuda_create refuses
 *    with ERR_NOGPU, and a kernel launch fails into nn_cuda_error instead
 *    of crashing;
 *  - with a GPU only (skipped otherwise): each kernel against nn.c on
 *    random inputs, and each model against model.c.
 *
 * Tolerances of the GPU comparisons (nn_cuda.h lists which results are
 * meant to be bit-identical to nn.c; those are compared with ==, which
 * also accepts +0 == -0):
 *  - GEMMs (cuBLAS vs OpenBLAS): |a - b| <= 1e-5 + 1e-4 |b|.  Inputs are
 *    in [-1, 1) and K <= 40, so each output is a sum of <= 40 terms of
 *    magnitude <= 1; two float summation orders differ by at most about
 *    K * 2^-24 * sum|terms| <= 1e-4 absolute in the worst case and ~1e-6
 *    typically.  TF32 (10-bit mantissa, ~1e-3 relative) would fail it,
 *    which is intended: the handle must compute in FP32.
 *  - sigmoid (CUDA's expf, <= 2 ulp): 1e-6 relative; the BCE gradient:
 *    a bound in ulps of the sigmoid, derived at check_bce_grad.
 *  - the dense optimizer (opt.cu) and model_dev's device-resident step:
 *    bit-identical to opt_step / to a host-optimizer run (memcmp).
 *  - the BCE loss sum (CUDA's exp/log1p <= 1 ulp, chunked sum): 1e-12
 *    relative.
 *  - whole models: the GEMM differences propagate through a few layers of
 *    small width; |a - b| <= 1e-5 + 1e-3 |b| for logits, gradients and
 *    d_emb (their magnitudes here are 1e-3 .. 1).  One thing no tolerance
 *    absorbs: a ReLU pre-activation within rounding (~1e-7) of zero may
 *    land on different sides of the kink on the two GEMMs, and then that
 *    sample's gradient through that unit differs by O(1/N).  The chance
 *    is ~1e-4 per model here, and the inputs are fixed, so it would show
 *    as a steady failure on one GPU type, not a flaky one: change the
 *    seed if a model test fails with logits in tolerance.  (On Criteo-
 *    sized models it does happen: one flip in 180k activations was seen
 *    with a reference GEMM.)
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfg.h"
#include "cuda_check.h"
#include "err.h"
#include "model.h"
#include "model_dev.h"
#include "nn.h"
#include "nn_cuda.h"
#include "opt.h"
#include "opt_cuda.h"
#include "table.h"
#include "trainer_ckpt.h"
#include "trainer_step.h"
#include "testutil.h"
#ifdef CHANTER_CUDA
#include "tcache_cuda.h"
#endif

#ifdef CHANTER_CUDA
#include <cuda_runtime_api.h>
#endif

#define NO_DEVICE_PREFIX "no CUDA device found (cudaGetDeviceCount: "
#define NO_DEVICE_SUFFIX "): this machine cannot run device = cuda; use device = cpu"
#define NO_CUDA_BUILD "this chanter was built without CUDA (make CUDA=0 or no nvcc): use device = cpu"

#ifdef CHANTER_CUDA
static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}
#endif

/* The refusal of a machine with no visible device, whatever this build. */
static void assert_refusal(int rc, const char *msg) {
  assert_int_equal(rc, ERR_NOGPU);
  assert_string_equal(err_str(rc), "no CUDA device");
#ifdef CHANTER_CUDA
  if (strncmp(msg, NO_DEVICE_PREFIX, strlen(NO_DEVICE_PREFIX)) != 0 || !ends_with(msg, NO_DEVICE_SUFFIX)) {
    print_error("unexpected refusal: '%s'\n", msg);
    fail();
  }
  /* the runtime's reason sits between the parentheses */
  assert_true(strlen(msg) > strlen(NO_DEVICE_PREFIX) + strlen(NO_DEVICE_SUFFIX));
#else
  assert_string_equal(msg, NO_CUDA_BUILD);
#endif
}

/* ------------------------------------------------------------ refusal */

/* cuda_check in a child with CUDA_VISIBLE_DEVICES="" (set before
 * the CUDA runtime starts in that process): no device is visible there
 * even on a GPU machine. */
static void test_refusal_hidden_devices(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char msg[1024] = "";
    close(fds[0]);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    int rc = cuda_check(msg, sizeof msg);
    ssize_t w1 = write(fds[1], &rc, sizeof rc);
    ssize_t w2 = write(fds[1], msg, sizeof msg);
    _exit(w1 == (ssize_t)sizeof rc && w2 == (ssize_t)sizeof msg ? 0 : 1);
  }
  close(fds[1]);
  int rc = 0, status = 0;
  char msg[1024];
  size_t got = 0;
  ssize_t r;
  while ((r = read(fds[0], (char *)&rc + got, sizeof rc - got)) > 0) got += (size_t)r;
  assert_int_equal(got, sizeof rc);
  got = 0;
  while (got < sizeof msg && (r = read(fds[0], msg + got, sizeof msg - got)) > 0) got += (size_t)r;
  assert_int_equal(got, sizeof msg);
  close(fds[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  msg[sizeof msg - 1] = 0;
  print_message("  refusal: %s\n", msg);
  assert_refusal(rc, msg);
}

/* This process, this machine: refuses (and says so) unless a GPU is here. */
static void test_refusal_here(void **state) {
  (void)state;
  char msg[1024] = "";
  int rc = cuda_check(msg, sizeof msg);
  if (rc == 0) {
    print_message("  a usable CUDA device is present: nothing to refuse\n");
    assert_int_equal(cuda_check_built(), 1);
    skip();
  }
  assert_refusal(rc, msg);
  /* asking twice gives the same answer (no state left behind) */
  char again[1024] = "";
  assert_int_equal(cuda_check(again, sizeof again), rc);
  assert_string_equal(again, msg);
}

static void test_built_flag(void **state) {
  (void)state;
#ifdef CHANTER_CUDA
  assert_int_equal(cuda_check_built(), 1);
#else
  assert_int_equal(cuda_check_built(), 0);
#endif
  char err[256] = "";
  assert_int_equal(cuda_check_error(0, "x", err, sizeof err), 0);
  assert_int_equal(cuda_check_cublas_error(0, "x", err, sizeof err), 0);
  assert_int_equal(cuda_check_error(2, "cudaMalloc (test)", err, sizeof err), ERR_CUDA);
  assert_non_null(strstr(err, "cudaMalloc (test): "));
  assert_int_equal(cuda_check_cublas_error(3, "cublasCreate", err, sizeof err), ERR_CUDA);
  assert_non_null(strstr(err, "cublasCreate: "));
}

#ifdef CHANTER_CUDA

/* ------------------------------------------------------------ linking */

typedef void (*any_fn)(void);

static void test_symbols_link(void **state) {
  (void)state;
  const any_fn fns[] = {
      (any_fn)nn_cuda_set_stream, (any_fn)nn_cuda_stream, (any_fn)nn_cuda_reserve,
      (any_fn)nn_cuda_error, (any_fn)nn_cuda_release,
      (any_fn)nn_cuda_linear_fwd, (any_fn)nn_cuda_linear_bwd,
      (any_fn)nn_cuda_relu_fwd, (any_fn)nn_cuda_relu_bwd,
      (any_fn)nn_cuda_sigmoid_fwd, (any_fn)nn_cuda_sigmoid_bwd,
      (any_fn)nn_cuda_bce_logits_fwd, (any_fn)nn_cuda_bce_logits_bwd,
      (any_fn)nn_cuda_concat_fwd, (any_fn)nn_cuda_concat_bwd,
      (any_fn)nn_cuda_embedding_bag_fwd, (any_fn)nn_cuda_embedding_bag_bwd_work_size,
      (any_fn)nn_cuda_embedding_bag_bwd,
      (any_fn)nn_cuda_interact_fwd, (any_fn)nn_cuda_interact_bwd,
      (any_fn)nn_cuda_fm_fwd, (any_fn)nn_cuda_fm_bwd,
      (any_fn)nn_cuda_cross_fwd, (any_fn)nn_cuda_cross_bwd,
      (any_fn)nn_cuda_cross_stack_fwd, (any_fn)nn_cuda_cross_stack_bwd,
      (any_fn)nn_cuda_cross2_fwd, (any_fn)nn_cuda_cross2_bwd,
      (any_fn)model_cuda_create, (any_fn)model_cuda_destroy, (any_fn)model_cuda_init,
      (any_fn)model_cuda_kind, (any_fn)model_cuda_n_params, (any_fn)model_cuda_params,
      (any_fn)model_cuda_grads, (any_fn)model_cuda_max_batch, (any_fn)model_cuda_describe,
      (any_fn)model_cuda_forward, (any_fn)model_cuda_backward,
      (any_fn)tcache_cuda_create, (any_fn)tcache_cuda_destroy, (any_fn)tcache_cuda_scatter, (any_fn)tcache_cuda_gather,
      (any_fn)tcache_cuda_forward, (any_fn)tcache_cuda_backward, (any_fn)tcache_cuda_update_rows,
      /* partitioned tables on the GPU path: the skipped tables' forward, their columns in and out */
      (any_fn)tcache_cuda_forward_skip, (any_fn)model_dev_emb_cols_in, (any_fn)model_dev_demb_cols_out,
      /* the dense state on the device: the optimizer, model_dev's residency calls, the trainer's */
      (any_fn)opt_cuda_step, (any_fn)model_dev_opt_step, (any_fn)model_dev_opt_sync, (any_fn)model_dev_opt_changed,
      (any_fn)model_dev_grads_changed, (any_fn)model_dev_params_dev, (any_fn)model_dev_grads_dev,
      (any_fn)model_dev_params_to_host, (any_fn)model_dev_grads_to_host, (any_fn)model_dev_grads_zero,
      (any_fn)model_dev_logits, (any_fn)trainer_step_grads_fetch, (any_fn)trainer_step_grads_changed,
      (any_fn)trainer_step_set_collective_on_device, (any_fn)trainer_step_dense_sync, (any_fn)trainer_step_dense_changed,
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) assert_non_null(fns[i]);
  /* the CPU twins are distinct functions */
  assert_ptr_not_equal((any_fn)nn_cuda_linear_fwd, (any_fn)nn_linear_fwd);
}

/* ------------------------------------------------------------ no device */

static int have_device(void) {
  char msg[1024];
  return cuda_check(msg, sizeof msg) == 0;
}

static void test_model_refuses_without_device(void **state) {
  (void)state;
  if (have_device()) skip();
  const char *sets[] = {"model=dlrm", "model.bottom_mlp=8", "model.top_mlp=8", NULL};
  cfg_t *c = testutil_cfg_of(sets);
  model_cuda_t *m = (model_cuda_t *)&m; /* must be reset to NULL */
  char err[1024] = "";
  int rc = model_cuda_create(c, 4, 3, 4, 16, &m, err, sizeof err);
  assert_null(m);
  assert_refusal(rc, err);
  /* a bad shape is reported as such before the device is looked at */
  const char *bad[] = {"model=dlrm", "model.bottom_mlp=0", NULL};
  cfg_t *c2 = testutil_cfg_of(bad);
  rc = model_cuda_create(c2, 4, 3, 4, 16, &m, err, sizeof err);
  assert_int_equal(rc, ERR_CONFIG);
  assert_null(m);
  assert_non_null(strstr(err, "model.bottom_mlp"));
  cfg_destroy(c2);
  cfg_destroy(c);
}

/* The trainer's GPU cache and step without a device: a sentence, no
 * crash, nothing half made. */
static void test_trainer_cache_refuses_without_device(void **state) {
  (void)state;
  if (have_device()) skip();
  const uint32_t hot[2] = {1, 2};
  tcache_cuda_t *c = (tcache_cuda_t *)&c;
  char err[1024] = "";
  int rc = tcache_cuda_create(1000, 5, 4, 2, hot, 16, &c, err, sizeof err);
  assert_int_not_equal(rc, 0);
  assert_null(c);
  print_message("  tcache_cuda_create: %s\n", err);
  assert_non_null(strstr(err, "cuda"));
  /* bad shapes are refused before the device is looked at */
  assert_int_equal(tcache_cuda_create(0, 5, 4, 2, hot, 16, &c, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "cache_rows"));
  assert_int_equal(tcache_cuda_create(10, 3, 4, 2, hot, 16, &c, err, sizeof err), -EINVAL);
  /* the whole step: device = cuda refused with the machine's reason */
  const char *sets[] = {"device=cuda", "model=dlrm", "model.bottom_mlp=8", "model.top_mlp=8", "n_dense=3",
                        "table_rows=50,40", "table_hotness=1,2", "embedding_dim=4", NULL};
  cfg_t *cf = testutil_cfg_of(sets);
  data_schema_t sc;
  table_layout_t lay;
  assert_int_equal(data_schema_from_cfg(cf, &sc, err, sizeof err), 0);
  assert_int_equal(cfg_layout(cf, &lay, err, sizeof err), 0);
  trainer_step_t *ts = (trainer_step_t *)&ts;
  rc = trainer_step_create(cf, &sc, &lay, 16, &ts, err, sizeof err);
  assert_null(ts);
  assert_refusal(rc, err);
  table_layout_close(&lay);
  data_schema_close(&sc);
  cfg_destroy(cf);
}

/* Without a driver a launch fails; the failure lands in nn_cuda_error
 * (naming the function) and the process carries on. */
static void test_launch_failure_is_reported(void **state) {
  (void)state;
  if (have_device()) skip(); /* here the launch would run on NULL */
  char err[1024] = "";
  (void)nn_cuda_error(err, sizeof err); /* start clean */
  nn_cuda_relu_fwd(NULL, 16, NULL);
  int rc = nn_cuda_error(err, sizeof err);
  assert_int_equal(rc, ERR_CUDA);
  print_message("  %s\n", err);
  assert_non_null(strstr(err, "nn_cuda_relu_fwd"));
  assert_int_equal(nn_cuda_error(err, sizeof err), 0); /* reported once */
  double l = nn_cuda_bce_logits_fwd(NULL, NULL, 4);
  assert_true(isnan(l));
  assert_int_equal(nn_cuda_error(err, sizeof err), ERR_CUDA);
  nn_cuda_release();
}

/* ------------------------------------------------------------ GPU vs CPU */

static uint64_t rng_state;
static float urand(void) { /* uniform [-1, 1) */
  rng_state = table_mix64(rng_state);
  return (float)((double)(rng_state >> 40) / 8388608.0 - 1.0);
}
static float *rnd(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = scale * urand();
  return p;
}

static void *dev(const void *host, size_t bytes) {
  void *d = NULL;
  assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
  if (host && bytes) assert_int_equal(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  else assert_int_equal(cudaMemset(d, 0, bytes ? bytes : 4), cudaSuccess);
  return d;
}
static float *devf(const float *host, size_t n) { return dev(host, n * sizeof(float)); }
static float *back(const float *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(h);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  if (n) assert_int_equal(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
static void no_cuda_error(void) {
  char err[1024] = "";
  int rc = nn_cuda_error(err, sizeof err);
  if (rc) print_error("CUDA: %s\n", err);
  assert_int_equal(rc, 0);
}

/* a[i] == b[i] for all i (bit-identical up to the sign of zero) */
static void same(const char *what, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(a[i] == b[i])) {
      print_error("%s[%zu]: GPU %.9g CPU %.9g (expected identical)\n", what, i, a[i], b[i]);
      fail();
    }
}
static void close_to(const char *what, const float *a, const float *b, size_t n, double atol,
                     double rtol) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)a[i] - b[i]) <= atol + rtol * fabs((double)b[i]))) {
      print_error("%s[%zu]: GPU %.9g CPU %.9g (atol %g rtol %g)\n", what, i, a[i], b[i], atol, rtol);
      fail();
    }
}

#define GEMM_ATOL 1e-5
#define GEMM_RTOL 1e-4

static void check_linear(uint32_t n, uint32_t in, uint32_t out, nn_act_t act, int with_bias) {
  float *x = rnd((size_t)n * in, 1), *w = rnd((size_t)out * in, 1), *b = rnd(out, 0.5f);
  float *dy0 = rnd((size_t)n * out, 1), *dxa = rnd((size_t)n * in, 1);
  float *y = malloc((size_t)n * out * 4), *dw = malloc((size_t)out * in * 4), *db = malloc(out * 4);
  float *dx = malloc((size_t)n * in * 4);
  const float *bb = with_bias ? b : NULL;
  int exact = out == 1; /* the CPU's dot8 path is mirrored; GEMMs are not */
  /* sums over the n rows (dw, db) in two orders: each within (n - 1) u sum|x|
   * of the exact value; for these random inputs (|x| <= 1) that drifts with
   * sqrt(n) u times the terms' size, so past a few dozen rows the absolute
   * tolerance grows with n (1e-6 per row: 1e-3 at n = 1000, ~100x the
   * typical rounding, far below an error of one term) */
  double atol = n > 64 ? 1e-6 * n : GEMM_ATOL;
  nn_linear_fwd(x, n, in, out, w, bb, act, y);
  float *dX = devf(x, (size_t)n * in), *dW = devf(w, (size_t)out * in), *dB = devf(b, out);
  float *dY = devf(NULL, (size_t)n * out);
  nn_cuda_linear_fwd(dX, n, in, out, dW, with_bias ? dB : NULL, act, dY);
  float *gy = back(dY, (size_t)n * out);
  no_cuda_error();
  if (exact) same("linear y", gy, y, (size_t)n * out);
  else close_to("linear y", gy, y, (size_t)n * out, GEMM_ATOL, GEMM_RTOL);
  /* backward from the CPU's y, so both use the same ReLU mask */
  for (int acc = 0; acc < 2; acc++) {
    float *dyc = malloc((size_t)n * out * 4);
    memcpy(dyc, dy0, (size_t)n * out * 4);
    memcpy(dx, dxa, (size_t)n * in * 4);
    nn_linear_bwd(x, y, dyc, n, in, out, w, act, dw, with_bias ? db : NULL, dx, acc);
    float *dYc = devf(y, (size_t)n * out), *dDY = devf(dy0, (size_t)n * out);
    float *dDW = devf(NULL, (size_t)out * in), *dDB = devf(NULL, out), *dDX = devf(dxa, (size_t)n * in);
    nn_cuda_linear_bwd(dX, dYc, dDY, n, in, out, dW, act, dDW, with_bias ? dDB : NULL, dDX, acc);
    float *g_dy = back(dDY, (size_t)n * out), *g_dw = back(dDW, (size_t)out * in);
    float *g_db = back(dDB, out), *g_dx = back(dDX, (size_t)n * in);
    no_cuda_error();
    same("linear dy (masked)", g_dy, dyc, (size_t)n * out);
    /* column sums (db; dw of the one-output layer) add chunks of 64 rows,
     * then the chunks (nn.cu's col_sums): nn.c's bits for n <= 64, within
     * rounding beyond */
    int one_chunk = n <= 64;
    if (with_bias && one_chunk) same("linear db", g_db, db, out);
    if (with_bias && !one_chunk) close_to("linear db", g_db, db, out, atol, GEMM_RTOL);
    if (exact) {
      if (one_chunk) same("linear dw", g_dw, dw, (size_t)out * in);
      else close_to("linear dw", g_dw, dw, (size_t)out * in, atol, GEMM_RTOL);
      same("linear dx", g_dx, dx, (size_t)n * in);
    } else {
      close_to("linear dw", g_dw, dw, (size_t)out * in, atol, GEMM_RTOL);
      close_to("linear dx", g_dx, dx, (size_t)n * in, GEMM_ATOL, GEMM_RTOL);
    }
    free(dyc); free(g_dy); free(g_dw); free(g_db); free(g_dx);
    cudaFree(dYc); cudaFree(dDY); cudaFree(dDW); cudaFree(dDB); cudaFree(dDX);
  }
  free(gy);
  cudaFree(dX); cudaFree(dW); cudaFree(dB); cudaFree(dY);
  free(x); free(w); free(b); free(dy0); free(dxa); free(y); free(dw); free(db); free(dx);
}

static void test_gpu_linear(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 1;
  check_linear(37, 29, 23, NN_ACT_RELU, 1);
  check_linear(37, 29, 23, NN_ACT_NONE, 1);
  check_linear(16, 40, 9, NN_ACT_RELU, 0);
  check_linear(33, 21, 1, NN_ACT_NONE, 1); /* the logit layer: dot8 path */
  check_linear(5, 13, 1, NN_ACT_RELU, 0);
  /* past one chunk of the column sums: 1000 = 15 chunks of 64 and one of 40 */
  check_linear(1000, 29, 23, NN_ACT_RELU, 1);
  check_linear(1000, 21, 1, NN_ACT_NONE, 1);
}

static void test_gpu_elementwise(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 2;
  size_t len = 1000;
  float *x = rnd(len, 8), *dy = rnd(len, 1), *y = malloc(len * 4), *dx = malloc(len * 4);
  float *dX = devf(x, len), *dDY = devf(dy, len), *dY = devf(NULL, len), *dDX = devf(NULL, len);
  nn_relu_fwd(x, len, y);
  nn_cuda_relu_fwd(dX, len, dY);
  float *g = back(dY, len);
  same("relu y", g, y, len);
  free(g);
  nn_relu_bwd(y, dy, len, dx);
  nn_cuda_relu_bwd(dY, dDY, len, dDX);
  g = back(dDX, len);
  same("relu dx", g, dx, len);
  free(g);
  nn_sigmoid_fwd(x, len, y);
  nn_cuda_sigmoid_fwd(dX, len, dY);
  g = back(dY, len);
  close_to("sigmoid y", g, y, len, 0, 1e-6);
  free(g);
  cudaMemcpy(dY, y, len * 4, cudaMemcpyHostToDevice); /* same y for both */
  nn_sigmoid_bwd(y, dy, len, dx);
  nn_cuda_sigmoid_bwd(dY, dDY, len, dDX);
  g = back(dDX, len);
  same("sigmoid dx", g, dx, len);
  free(g);
  no_cuda_error();
  cudaFree(dX); cudaFree(dDY); cudaFree(dY); cudaFree(dDX);
  free(x); free(dy); free(y); free(dx);
}

/* The BCE gradient g = scale * (s - t), s = sigmoid(z) as nn.c computes it
 * (1/(1+e) with e = expf(-z) for z >= 0, e/(1+e) with e = expf(z) below),
 * against the CPU's.  The only difference is expf: glibc's is within 1 ulp
 * of exp, CUDA's within 2 (CUDA C Programming Guide, maximum ulp errors),
 * so the two e differ by <= 3 ulp(e) <= 3 * 2^-23 e relative.  Let
 * S = sigmoid(z) exactly.  On each side, a relative error k * 2^-23 in e
 * moves s by S (1 - S) k 2^-23 (d s / d e * e / s = -(1 - S) for
 * z >= 0, +(1 - S) below), and its two float roundings (1 + e, then the
 * division) add <= 2 * 2^-24 S, so |s_side - S| <= S ((1 - S) k + 1) 2^-23
 * and |s_gpu - s_cpu| <= S (3 (1 - S) + 2) 2^-23 <= 5 * 2^-23 S: a few ulp
 * of the SIGMOID.  Then s - t: exact for t = 0, and for t = 1 when
 * s >= 1/2 (Sterbenz); otherwise rounded, <= 2^-24 |s - t| on each side;
 * the product with scale rounds once more on each side.  So
 *   |g_gpu - g_cpu| <= scale * 2^-23 * (5 S + 2 |s - t|)   (S ~ s_cpu),
 * an absolute bound in units of the sigmoid, not of the difference:
 * where s - t cancels (s near t) a relative tolerance on g is meaningless
 * (seen on an H200: dlogits[488] = -7.54279536e-05 vs -7.542807e-05,
 * s ~ 0.9246, t = 1, scale = 1/1000: 1.2e-10 apart, 1.5e-6 relative but
 * 0.2 of this bound).  s_cpu + 2^-20 covers S vs s_cpu. */
static void check_bce_grad(const float *g, const float *c, const float *z, const float *t, uint32_t n, float scale) {
  float *s = malloc(n * sizeof(float));
  assert_non_null(s);
  nn_sigmoid_fwd(z, n, s);
  for (uint32_t i = 0; i < n; i++) {
    double S = (double)s[i] * (1.0 + 0x1p-20), d = fabs((double)s[i] - t[i]);
    double bound = (double)scale * 0x1p-23 * (5.0 * S + 2.0 * d);
    if (!(fabs((double)g[i] - c[i]) <= bound)) {
      print_error("bce dlogits[%u]: GPU %.9g CPU %.9g (z %.9g t %g: bound %.3g)\n", i, g[i], c[i], z[i], t[i], bound);
      fail();
    }
  }
  free(s);
}

static void test_gpu_bce(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 3;
  uint32_t ns[] = {1, 255, 256, 1000};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    uint32_t n = ns[k];
    float *z = rnd(n, 6), *t = malloc(n * 4), *dl = malloc(n * 4);
    for (uint32_t i = 0; i < n; i++) t[i] = (float)(table_mix64(i + 77 * k) & 1);
    float *dZ = devf(z, n), *dT = devf(t, n), *dDL = devf(NULL, n);
    double lf = nn_bce_logits_fwd(z, t, n), gf = nn_cuda_bce_logits_fwd(dZ, dT, n);
    double lb = nn_bce_logits_bwd(z, t, n, 1.0f / (float)n, dl);
    double gb = nn_cuda_bce_logits_bwd(dZ, dT, n, 1.0f / (float)n, dDL);
    no_cuda_error();
    assert_true(fabs(gf - lf) <= 1e-12 * fabs(lf));
    assert_true(fabs(gb - lb) <= 1e-12 * fabs(lb));
    float *g = back(dDL, n);
    check_bce_grad(g, dl, z, t, n, 1.0f / (float)n);
    free(g);
    cudaFree(dZ); cudaFree(dT); cudaFree(dDL);
    free(z); free(t); free(dl);
  }
  assert_true(nn_cuda_bce_logits_fwd(NULL, NULL, 0) == 0.0);
}

static void test_gpu_concat(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 4;
  enum { N = 19, W0 = 3, W1 = 7, S0 = 5, S1 = 7, DS = 12 };
  float *a = rnd(N * S0, 1), *b = rnd(N * S1, 1), *dst = rnd(N * DS, 1);
  float *dA = devf(a, N * S0), *dB = devf(b, N * S1), *dD = devf(dst, N * DS);
  const float *src[2] = {a, b}, *dsrc[2] = {dA, dB};
  size_t stride[2] = {S0, S1};
  uint32_t width[2] = {W0, W1};
  nn_concat_fwd(N, 2, src, stride, width, dst, DS);
  nn_cuda_concat_fwd(N, 2, dsrc, stride, width, dD, DS);
  float *g = back(dD, N * DS);
  same("concat", g, dst, N * DS);
  free(g);
  for (int acc = 0; acc < 2; acc++) {
    float *ga = rnd(N * S0, 1), *gb = rnd(N * S1, 1);
    float *dGA = devf(ga, N * S0), *dGB = devf(gb, N * S1);
    float *d_src[2] = {ga, gb}, *dd_src[2] = {dGA, dGB};
    nn_concat_bwd(N, 2, dst, DS, width, d_src, stride, acc);
    nn_cuda_concat_bwd(N, 2, dD, DS, width, dd_src, stride, acc);
    float *r0 = back(dGA, N * S0), *r1 = back(dGB, N * S1);
    same("split 0", r0, ga, N * S0);
    same("split 1", r1, gb, N * S1);
    free(r0); free(r1); free(ga); free(gb);
    cudaFree(dGA); cudaFree(dGB);
  }
  no_cuda_error();
  cudaFree(dA); cudaFree(dB); cudaFree(dD);
  free(a); free(b); free(dst);
}

static void test_gpu_embedding_bag(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 5;
  /* ids 1000 + 3k for k < 50: a lowest id far from 0, gaps, many repeats */
  enum { ROWS = 1150, DIM = 6, STRIDE = 8, N = 41, HOT = 3, OS = 7 };
  float *table = rnd(ROWS * STRIDE, 1);
  uint64_t idx[N * HOT];
  for (size_t k = 0; k < N * HOT; k++) idx[k] = 1000 + table_mix64(k * 31 + 7) % 50 * 3;
  float *out = rnd(N * OS, 1);
  float *dT = devf(table, ROWS * STRIDE), *dO = devf(out, N * OS);
  uint64_t *dI = dev(idx, sizeof idx);
  nn_embedding_bag_fwd(table, STRIDE, idx, N, HOT, DIM, out, OS);
  nn_cuda_embedding_bag_fwd(dT, STRIDE, dI, N, HOT, DIM, dO, OS);
  float *g = back(dO, N * OS);
  same("embedding bag", g, out, N * OS); /* columns past DIM untouched by both */
  free(g);
  /* backward: same unique ids in the same order, same sums */
  float *d_out = rnd(N * OS, 1);
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, HOT));
  uint64_t uniq[N * HOT], guniq[N * HOT];
  float *grad = malloc(N * HOT * STRIDE * 4);
  uint32_t u = nn_embedding_bag_bwd(d_out, OS, idx, N, HOT, DIM, uniq, grad, STRIDE, work);
  assert_true(u > 1 && u < N * HOT);
  size_t dws = nn_cuda_embedding_bag_bwd_work_size(N, HOT);
  no_cuda_error();
  assert_true(dws > 0);
  void *dWork = dev(NULL, dws);
  uint64_t *dU = dev(NULL, sizeof uniq);
  float *dDO = devf(d_out, N * OS), *dG = devf(NULL, N * HOT * STRIDE);
  uint32_t gu = nn_cuda_embedding_bag_bwd(dDO, OS, dI, N, HOT, DIM, dU, dG, STRIDE, dWork);
  no_cuda_error();
  assert_int_equal(gu, u);
  assert_int_equal(cudaMemcpy(guniq, dU, u * sizeof(uint64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t k = 0; k < u; k++) assert_true(guniq[k] == uniq[k]);
  float *gg = back(dG, (size_t)u * STRIDE);
  for (uint32_t k = 0; k < u; k++) same("embedding grad", gg + k * STRIDE, grad + k * STRIDE, DIM);
  free(gg);
  cudaFree(dWork); cudaFree(dU); cudaFree(dDO); cudaFree(dG); cudaFree(dT); cudaFree(dO); cudaFree(dI);
  free(d_out); free(work); free(grad); free(table); free(out);
}

static void check_interact(uint32_t n, uint32_t n_emb, uint32_t dim, int has_bottom) {
  uint32_t ow = nn_interact_out_width(n_emb, dim, has_bottom), os = ow + 2, es = n_emb * dim + 1;
  float *bot = rnd((size_t)n * dim, 1), *emb = rnd((size_t)n * es, 1), *out = rnd((size_t)n * os, 1);
  float *dBot = devf(bot, (size_t)n * dim), *dEmb = devf(emb, (size_t)n * es), *dOut = devf(out, (size_t)n * os);
  nn_interact_fwd(has_bottom ? bot : NULL, dim, emb, es, n, n_emb, dim, out, os);
  nn_cuda_interact_fwd(has_bottom ? dBot : NULL, dim, dEmb, es, n, n_emb, dim, dOut, os);
  float *g = back(dOut, (size_t)n * os);
  for (uint32_t i = 0; i < n; i++) same("interact", g + (size_t)i * os, out + (size_t)i * os, ow);
  free(g);
  float *dout = rnd((size_t)n * os, 1), *db = rnd((size_t)n * dim, 1), *de = rnd((size_t)n * es, 1);
  float *dDout = devf(dout, (size_t)n * os), *dDb = devf(db, (size_t)n * dim), *dDe = devf(de, (size_t)n * es);
  nn_interact_bwd(has_bottom ? bot : NULL, dim, emb, es, n, n_emb, dim, dout, os, has_bottom ? db : NULL, de, es);
  nn_cuda_interact_bwd(has_bottom ? dBot : NULL, dim, dEmb, es, n, n_emb, dim, dDout, os,
                       has_bottom ? dDb : NULL, dDe, es);
  float *gb = back(dDb, (size_t)n * dim), *ge = back(dDe, (size_t)n * es);
  no_cuda_error();
  same("interact d_bottom", gb, db, (size_t)n * dim);
  for (uint32_t i = 0; i < n; i++)
    same("interact d_emb", ge + (size_t)i * es, de + (size_t)i * es, n_emb * dim);
  free(gb); free(ge);
  cudaFree(dBot); cudaFree(dEmb); cudaFree(dOut); cudaFree(dDout); cudaFree(dDb); cudaFree(dDe);
  free(bot); free(emb); free(out); free(dout); free(db); free(de);
}

static void test_gpu_interact(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 6;
  check_interact(23, 5, 4, 1);
  check_interact(9, 26, 16, 1);  /* Criteo: 27 vectors, whole chunks of 16 */
  check_interact(7, 6, 19, 1);   /* a dim with a tail past the chunks */
  check_interact(11, 4, 3, 0);
}

static void test_gpu_fm(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 7;
  enum { N = 21, T = 5, D = 7, ES = T * D + 3 };
  float *emb = rnd(N * ES, 1), *out = malloc(N * 4), *dout = rnd(N, 1);
  float *dE = devf(emb, N * ES), *dO = devf(NULL, N), *dDO = devf(dout, N);
  nn_fm_fwd(emb, ES, N, T, D, out);
  nn_cuda_fm_fwd(dE, ES, N, T, D, dO);
  float *g = back(dO, N);
  same("fm", g, out, N);
  free(g);
  for (int acc = 0; acc < 2; acc++) {
    float *de = rnd(N * ES, 1), *dDE = devf(de, N * ES);
    nn_fm_bwd(emb, ES, N, T, D, dout, de, ES, acc);
    nn_cuda_fm_bwd(dE, ES, N, T, D, dDO, dDE, ES, acc);
    g = back(dDE, N * ES);
    for (int i = 0; i < N; i++) same("fm d_emb", g + i * ES, de + i * ES, T * D);
    free(g); free(de);
    cudaFree(dDE);
  }
  no_cuda_error();
  cudaFree(dE); cudaFree(dO); cudaFree(dDO);
  free(emb); free(out); free(dout);
}

static void test_gpu_cross(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 8;
  enum { N = 17, D = 21, L = 3 };
  float *x0 = rnd(N * D, 1), *x = rnd(N * D, 1), *w = rnd(D, 1), *b = rnd(D, 1);
  float *s = malloc(N * 4), *y = malloc(N * D * 4);
  float *dX0 = devf(x0, N * D), *dX = devf(x, N * D), *dW = devf(w, D), *dB = devf(b, D);
  float *dS = devf(NULL, N), *dY = devf(NULL, N * D);
  nn_cross_fwd(x0, x, N, D, w, b, s, y);
  nn_cuda_cross_fwd(dX0, dX, N, D, dW, dB, dS, dY);
  float *gs = back(dS, N), *gy = back(dY, N * D);
  same("cross s", gs, s, N);
  same("cross y", gy, y, N * D);
  free(gs); free(gy);
  float *dy = rnd(N * D, 1), *dx0 = rnd(N * D, 1), *dw = malloc(D * 4), *db = malloc(D * 4);
  float *dx = malloc(N * D * 4);
  float *dDY = devf(dy, N * D), *dDX0 = devf(dx0, N * D), *dDW = devf(NULL, D), *dDB = devf(NULL, D);
  float *dDX = devf(NULL, N * D);
  nn_cross_bwd(x0, x, s, N, D, w, dy, dw, db, dx, dx0);
  nn_cuda_cross_bwd(dX0, dX, dS, N, D, dW, dDY, dDW, dDB, dDX, dDX0);
  float *g1 = back(dDW, D), *g2 = back(dDB, D), *g3 = back(dDX, N * D), *g4 = back(dDX0, N * D);
  same("cross dw", g1, dw, D);
  same("cross db", g2, db, D);
  same("cross dx", g3, dx, N * D);
  same("cross dx0", g4, dx0, N * D);
  free(g1); free(g2); free(g3); free(g4);
  /* the stack of L layers */
  float *ws[L], *bs[L], *ss[L], *xl[L + 1], *dws[L], *dbs[L];
  float *dws_d[L], *dbs_d[L], *ws_d[L], *bs_d[L], *ss_d[L], *xl_d[L + 1];
  xl[0] = x0;
  xl_d[0] = dX0;
  for (int l = 0; l < L; l++) {
    ws[l] = rnd(D, 0.3f);
    bs[l] = rnd(D, 0.3f);
    ss[l] = malloc(N * 4);
    xl[l + 1] = malloc(N * D * 4);
    dws[l] = malloc(D * 4);
    dbs[l] = malloc(D * 4);
    ws_d[l] = devf(ws[l], D);
    bs_d[l] = devf(bs[l], D);
    ss_d[l] = devf(NULL, N);
    xl_d[l + 1] = devf(NULL, N * D);
    dws_d[l] = devf(NULL, D);
    dbs_d[l] = devf(NULL, D);
  }
  nn_cross_stack_fwd(x0, N, D, L, (const float *const *)ws, (const float *const *)bs, ss, xl);
  nn_cuda_cross_stack_fwd(dX0, N, D, L, (const float *const *)ws_d, (const float *const *)bs_d, ss_d, xl_d);
  for (int l = 0; l < L; l++) {
    float *a = back(xl_d[l + 1], N * D), *c = back(ss_d[l], N);
    same("cross stack x", a, xl[l + 1], N * D);
    same("cross stack s", c, ss[l], N);
    free(a); free(c);
  }
  float *sdy = rnd(N * D, 1), *sdx0 = rnd(N * D, 1);
  float *dSDY = devf(sdy, N * D), *dSDX0 = devf(sdx0, N * D);
  nn_cross_stack_bwd(x0, N, D, L, (const float *const *)ws, (const float *const *)xl,
                     (const float *const *)ss, sdy, dws, dbs, sdx0);
  nn_cuda_cross_stack_bwd(dX0, N, D, L, (const float *const *)ws_d, (const float *const *)xl_d,
                          (const float *const *)ss_d, dSDY, dws_d, dbs_d, dSDX0);
  float *a = back(dSDX0, N * D);
  same("cross stack dx0", a, sdx0, N * D);
  free(a);
  for (int l = 0; l < L; l++) {
    float *p = back(dws_d[l], D), *q = back(dbs_d[l], D);
    same("cross stack dw", p, dws[l], D);
    same("cross stack db", q, dbs[l], D);
    free(p); free(q);
    free(ws[l]); free(bs[l]); free(ss[l]); free(xl[l + 1]); free(dws[l]); free(dbs[l]);
    cudaFree(ws_d[l]); cudaFree(bs_d[l]); cudaFree(ss_d[l]); cudaFree(xl_d[l + 1]);
    cudaFree(dws_d[l]); cudaFree(dbs_d[l]);
  }
  no_cuda_error();
  cudaFree(dSDY); cudaFree(dSDX0);
  free(sdy); free(sdx0);
  cudaFree(dX0); cudaFree(dX); cudaFree(dW); cudaFree(dB); cudaFree(dS); cudaFree(dY);
  cudaFree(dDY); cudaFree(dDX0); cudaFree(dDW); cudaFree(dDB); cudaFree(dDX);
  free(x0); free(x); free(w); free(b); free(s); free(y); free(dy); free(dx0); free(dw); free(db); free(dx);
}

/* A CUDA model against the CPU model of the same config and seed. */
static void check_model(const char *const *sets, uint32_t n_dense, uint32_t n_tables, uint32_t dim) {
  enum { N = 64 };
  cfg_t *c = testutil_cfg_of(sets);
  model_t *cm = NULL;
  model_cuda_t *gm = NULL;
  char err[1024] = "";
  assert_int_equal(model_create(c, n_dense, n_tables, dim, N, &cm, err, sizeof err), 0);
  int rc = model_cuda_create(c, n_dense, n_tables, dim, N, &gm, err, sizeof err);
  if (rc) print_error("model_cuda_create: %s\n", err);
  assert_int_equal(rc, 0);
  print_message("  %s\n", model_cuda_describe(gm));
  assert_string_equal(model_cuda_describe(gm), model_describe(cm));
  assert_int_equal(model_cuda_kind(gm), model_kind(cm));
  size_t np = model_n_params(cm);
  assert_int_equal(model_cuda_n_params(gm), np);
  model_init(cm, 4242);
  model_cuda_init(gm, 4242);
  float *gp = back(model_cuda_params(gm), np);
  assert_memory_equal(gp, model_params(cm), np * sizeof(float));
  free(gp);
  size_t ew = (size_t)n_tables * dim;
  rng_state = 9;
  float *dense = rnd((size_t)N * n_dense, 1), *emb = rnd(N * ew, 1), *labels = malloc(N * 4);
  float *logits = malloc(N * 4), *d_emb = malloc(N * ew * 4 + 4);
  for (int i = 0; i < N; i++) labels[i] = (float)(table_mix64((uint64_t)i) & 1);
  float *dDense = devf(dense, (size_t)N * n_dense), *dEmb = devf(emb, N * ew), *dLab = devf(labels, N);
  float *dLog = devf(NULL, N), *dDEmb = devf(NULL, N * ew);
  model_forward(cm, N, dense, emb, logits);
  model_cuda_forward(gm, N, n_dense ? dDense : NULL, dEmb, dLog);
  float *g = back(dLog, N);
  close_to("model logits", g, logits, N, 1e-5, 1e-3);
  free(g);
  double lc = model_backward(cm, N, labels, 1.0f / N, d_emb);
  double lg = model_cuda_backward(gm, N, dLab, 1.0f / N, dDEmb);
  no_cuda_error();
  assert_true(fabs(lg - lc) <= 1e-5 * fabs(lc));
  g = back(model_cuda_grads(gm), np);
  close_to("model grads", g, model_grads(cm), np, 1e-5, 1e-3);
  free(g);
  g = back(dDEmb, N * ew);
  close_to("model d_emb", g, d_emb, N * ew, 1e-5, 1e-3);
  free(g);
  cudaFree(dDense); cudaFree(dEmb); cudaFree(dLab); cudaFree(dLog); cudaFree(dDEmb);
  free(dense); free(emb); free(labels); free(logits); free(d_emb);
  model_cuda_destroy(gm);
  model_destroy(cm);
  cfg_destroy(c);
}

static void test_gpu_models(void **state) {
  (void)state;
  if (!have_device()) skip();
  const char *dlrm[] = {"model=dlrm", "model.bottom_mlp=16,8", "model.top_mlp=16,8", NULL};
  check_model(dlrm, 13, 5, 4);
  const char *dlrm0[] = {"model=dlrm", "model.top_mlp=6", NULL};
  check_model(dlrm0, 0, 4, 3);
  const char *wdl[] = {"model=wdl", "model.deep_mlp=16,8", NULL};
  check_model(wdl, 5, 3, 4);
  const char *deepfm[] = {"model=deepfm", "model.deep_mlp=16,8", NULL};
  check_model(deepfm, 5, 3, 4);
  const char *dcn[] = {"model=dcn", "model.deep_mlp=16,8", "model.cross_layers=2", NULL};
  check_model(dcn, 5, 3, 4);
  const char *dcn0[] = {"model=dcn", "model.deep_mlp=", "model.cross_layers=3", NULL};
  check_model(dcn0, 2, 2, 3);
  const char *dcn2[] = {"model=dlrm_dcn", "model.bottom_mlp=16", "model.top_mlp=16,8", "model.cross_layers=3",
                        "model.cross_rank=5", NULL};
  check_model(dcn2, 5, 3, 4);
  const char *dcn2f[] = {"model=dlrm_dcn", "model.top_mlp=8", "model.cross_layers=2", "model.cross_rank=0", NULL};
  check_model(dcn2f, 0, 3, 4); /* full rank, no dense features */
  nn_cuda_release();
}

/* The DCNv2 cross layer against nn.c: the element-wise parts are nn.c's
 * operations, the GEMMs cuBLAS's (within rounding). */
static void check_cross2(uint32_t r) {
  enum { N = 70, D = 24 };
  uint32_t R = r ? r : D;
  rng_state = 31 + r;
  float *x0 = rnd(N * D, 1), *x = rnd(N * D, 1), *w = rnd(D * R, 0.3f), *v = rnd(R * D, 0.3f), *b = rnd(D, 1);
  float *t = rnd(N * R, 0), *z = rnd(N * D, 0), *y = rnd(N * D, 0);
  float *dX0 = devf(x0, N * D), *dX = devf(x, N * D), *dW = devf(w, D * R), *dV = devf(v, R * D), *dB = devf(b, D);
  float *dT = devf(NULL, N * R), *dZ = devf(NULL, N * D), *dY = devf(NULL, N * D);
  nn_cross2_fwd(x0, x, N, D, r, w, v, b, t, z, y);
  nn_cuda_cross2_fwd(dX0, dX, N, D, r, dW, dV, dB, dT, dZ, dY);
  float *a = back(dY, N * D);
  close_to("cross2 y", a, y, N * D, 1e-5, 1e-4);
  free(a);
  float *g = rnd(N * D, 1), *dx0 = rnd(N * D, 1), *dz = rnd(N * D, 0), *dt = rnd(N * R, 0);
  float *dw = rnd(D * R, 0), *dv = rnd(R * D, 0), *db = rnd(D, 0);
  float *dG = devf(g, N * D), *dDX0 = devf(dx0, N * D), *dDZ = devf(NULL, N * D), *dDT = devf(NULL, N * R);
  float *dDW = devf(NULL, D * R), *dDV = devf(NULL, R * D), *dDB = devf(NULL, D);
  nn_cross2_bwd(x0, x, t, z, N, D, r, w, v, g, dz, dt, dw, dv, db, dx0);
  nn_cuda_cross2_bwd(dX0, dX, dT, dZ, N, D, r, dW, dV, dG, dDZ, dDT, dDW, dDV, dDB, dDX0);
  no_cuda_error();
  struct { const char *what; float *dev, *host; size_t n; } cmp[] = {
      {"cross2 dx", dG, g, N * D}, {"cross2 dx0", dDX0, dx0, N * D}, {"cross2 dw", dDW, dw, (size_t)D * R},
      {"cross2 db", dDB, db, D},   {"cross2 dv", dDV, dv, r ? (size_t)R * D : 0}};
  for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++) {
    a = back(cmp[k].dev, cmp[k].n ? cmp[k].n : 1);
    close_to(cmp[k].what, a, cmp[k].host, cmp[k].n, 1e-5, 1e-4);
    free(a);
  }
  float *frees[] = {x0, x, w, v, b, t, z, y, g, dx0, dz, dt, dw, dv, db};
  for (size_t k = 0; k < sizeof frees / sizeof frees[0]; k++) free(frees[k]);
  float *dfrees[] = {dX0, dX, dW, dV, dB, dT, dZ, dY, dG, dDX0, dDZ, dDT, dDW, dDV, dDB};
  for (size_t k = 0; k < sizeof dfrees / sizeof dfrees[0]; k++) cudaFree(dfrees[k]);
}

static void test_gpu_cross2(void **state) {
  (void)state;
  if (!have_device()) skip();
  check_cross2(0);
  check_cross2(1);
  check_cross2(7);
  nn_cuda_release();
}

/* The trainer's GPU cache (tcache_cuda.h) against the host cache's loops
 * (trainer_step.c): bit for bit, since each is the same float operations
 * in the same order -- scatter / gather, pooling by slot, per-slot
 * gradient folding in sample order, and the three row optimizers. */
static void check_row_update(tcache_cuda_t *c, opt_kind_t kind, float *host_rows, uint32_t rf, uint32_t dim) {
  enum { NU = 37 };
  uint32_t slots[NU];
  for (uint32_t i = 0; i < NU; i++) slots[i] = (i * 53 + 11) % 997; /* distinct */
  float *g = rnd((size_t)NU * dim, 1);
  opt_hparams_t hp = {.lr = 0.05f, .eps = 1e-8f};
  char err[512];
  assert_int_equal(tcache_cuda_update_rows(c, TCACHE_CUDA_BACKGROUND, slots, NU, g, kind, &hp, err, sizeof err), 0);
  for (uint32_t i = 0; i < NU; i++) opt_row_update(kind, &hp, host_rows + (size_t)slots[i] * rf, dim, g + (size_t)i * dim);
  float *got = malloc((size_t)NU * rf * sizeof(float));
  assert_int_equal(tcache_cuda_gather(c, TCACHE_CUDA_BACKGROUND, slots, NU, got, err, sizeof err), 0);
  for (uint32_t i = 0; i < NU; i++) same("row update", got + (size_t)i * rf, host_rows + (size_t)slots[i] * rf, rf);
  free(got);
  free(g);
}

static void test_gpu_trainer_cache(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 9;
  enum { ROWS = 1000, DIM = 4, RF = 5, N = 24, NT = 2 };
  const uint32_t hot[NT] = {1, 3};
  char err[512];
  tcache_cuda_t *c;
  assert_int_equal(tcache_cuda_create(ROWS, RF, DIM, NT, hot, N, &c, err, sizeof err), 0);
  /* every row through scatter (unaligned slot bytes, as in a message), back through gather */
  float *rows = rnd((size_t)ROWS * RF, 1);
  for (size_t i = 0; i < ROWS; i++) rows[i * RF + DIM] = fabsf(rows[i * RF + DIM]); /* adagrad state >= 0 */
  uint8_t *sb = malloc(ROWS * 4 + 1);
  for (uint32_t i = 0; i < ROWS; i++) {
    uint32_t sl = ROWS - 1 - i;
    memcpy(sb + 1 + i * 4, &sl, 4);
  }
  float *rev = malloc((size_t)ROWS * RF * sizeof(float));
  for (uint32_t i = 0; i < ROWS; i++) memcpy(rev + (size_t)i * RF, rows + (size_t)(ROWS - 1 - i) * RF, RF * 4);
  assert_int_equal(tcache_cuda_scatter(c, TCACHE_CUDA_PREFETCH, sb + 1, ROWS, rev, err, sizeof err), 0);
  float *all = malloc((size_t)ROWS * RF * sizeof(float));
  assert_int_equal(tcache_cuda_gather(c, TCACHE_CUDA_TRAIN, sb + 1, ROWS, all, err, sizeof err), 0);
  same("scatter/gather", all, rev, (size_t)ROWS * RF);
  /* pooling: table-major slot lists with repeats */
  size_t n_ids = (size_t)N * (hot[0] + hot[1]);
  uint64_t *idx = malloc(n_ids * sizeof *idx);
  for (size_t k = 0; k < n_ids; k++) idx[k] = table_mix64(k * 7 + 1) % 60 * 11;
  float *emb = malloc((size_t)N * NT * DIM * sizeof(float));
  float *dEmb = devf(NULL, (size_t)N * NT * DIM);
  assert_int_equal(tcache_cuda_forward(c, idx, N, dEmb, err, sizeof err), 0);
  size_t o = 0;
  for (uint32_t t = 0; t < NT; t++) {
    nn_embedding_bag_fwd(rows, RF, idx + o, N, hot[t], DIM, emb + (size_t)t * DIM, NT * DIM);
    o += (size_t)N * hot[t];
  }
  float *gemb = back(dEmb, (size_t)N * NT * DIM);
  same("pooling by slot", gemb, emb, (size_t)N * NT * DIM);
  /* folding per slot, table by table */
  float *d = rnd((size_t)N * NT * DIM, 1);
  float *dD = devf(d, (size_t)N * NT * DIM);
  void *work = malloc(nn_embedding_bag_bwd_work_size(N, 3) + 8);
  o = 0;
  for (uint32_t t = 0; t < NT; t++) {
    uint64_t uq[N * 3], guq[N * 3];
    float gr[N * 3 * DIM], ggr[N * 3 * DIM];
    uint32_t u = nn_embedding_bag_bwd(d + (size_t)t * DIM, NT * DIM, idx + o, N, hot[t], DIM, uq, gr, DIM, work), gu = 0;
    assert_int_equal(tcache_cuda_backward(c, dD, t, guq, ggr, &gu, err, sizeof err), 0);
    assert_int_equal(gu, u);
    for (uint32_t k = 0; k < u; k++) assert_true(guq[k] == uq[k]);
    same("folded gradients", ggr, gr, (size_t)u * DIM);
    o += (size_t)N * hot[t];
  }
  /* the row optimizers: slot s holds rows[s] */
  check_row_update(c, OPT_SGD, rows, RF, DIM);
  check_row_update(c, OPT_ROWWISE_ADAGRAD, rows, RF, DIM);
  tcache_cuda_destroy(c);
  /* full-vector adagrad: rf = 2 dim */
  assert_int_equal(tcache_cuda_create(ROWS, 2 * DIM, DIM, NT, hot, N, &c, err, sizeof err), 0);
  float *r2 = rnd((size_t)ROWS * 2 * DIM, 1);
  for (size_t i = 0; i < (size_t)ROWS * 2 * DIM; i++) r2[i] = fabsf(r2[i]);
  uint32_t *sl = malloc(ROWS * sizeof *sl);
  for (uint32_t i = 0; i < ROWS; i++) sl[i] = i;
  assert_int_equal(tcache_cuda_scatter(c, TCACHE_CUDA_PREFETCH, sl, ROWS, r2, err, sizeof err), 0);
  check_row_update(c, OPT_ADAGRAD, r2, 2 * DIM, DIM);
  tcache_cuda_destroy(c);
  no_cuda_error();
  cudaFree(dEmb);
  cudaFree(dD);
  free(sl); free(r2); free(work); free(d); free(gemb); free(emb); free(idx); free(all); free(rev); free(sb); free(rows);
}

/* ------------------------------------------------------------ the dense state on the device */

/* memcmp, naming the first differing element */
static void bits(const char *what, const float *gpu, const float *cpu, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&gpu[i], &cpu[i], sizeof(float)) != 0) {
      print_error("%s[%zu]: GPU %.9g CPU %.9g (expected the same bits)\n", what, i, gpu[i], cpu[i]);
      fail();
    }
}

/* opt_cuda_step against opt_step: STEPS steps with fresh random gradients
 * each (some exact zeros, magnitudes over 6 decades), n elements. */
static void check_opt(opt_kind_t kind, size_t n) {
  enum { STEPS = 5 };
  opt_hparams_t hp = {.lr = 0.01f, .eps = kind == OPT_ADAM ? 1e-8f : 1e-10f, .beta1 = 0.9f, .beta2 = 0.999f,
                      .adagrad_init = 0.1f};
  opt_t *host = NULL, *gpu = NULL;
  assert_int_equal(opt_create_kind(kind, &hp, n, &host), 0);
  assert_int_equal(opt_create_kind(kind, &hp, n, &gpu), 0);
  size_t ns = opt_state_floats(host);
  float *w = rnd(n, 1), *g = malloc((n ? n : 1) * sizeof(float));
  float *dW = devf(w, n), *dG = devf(NULL, n), *dS = ns ? devf(opt_state(gpu), ns) : NULL;
  for (int step = 0; step < STEPS; step++) {
    for (size_t i = 0; i < n; i++) {
      float u = urand();
      g[i] = i % 17 == 3 ? 0.0f : u * powf(10.0f, -6.0f * fabsf(urand()));
    }
    assert_int_equal(cudaMemcpy(dG, g, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    opt_step(host, w, g);
    assert_int_equal(opt_cuda_step(gpu, dW, dG, dS), 0);
    assert_int_equal(opt_steps(gpu), opt_steps(host));
    float *gw = back(dW, n);
    char what[64];
    snprintf(what, sizeof what, "%s n=%zu step %d: params", opt_kind_name(kind), n, step + 1);
    bits(what, gw, w, n);
    free(gw);
    if (ns) {
      float *gs = back(dS, ns);
      snprintf(what, sizeof what, "%s n=%zu step %d: state", opt_kind_name(kind), n, step + 1);
      bits(what, gs, opt_state(host), ns);
      free(gs);
    }
  }
  no_cuda_error();
  cudaFree(dW); cudaFree(dG); cudaFree(dS);
  free(w); free(g);
  opt_destroy(host);
  opt_destroy(gpu);
}

static void test_gpu_opt(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 21;
  /* around the block, and past the grid's cap (the grid-stride loop) */
  const size_t sizes[] = {1, 7, OPT_CUDA_BLOCK - 1, OPT_CUDA_BLOCK, OPT_CUDA_BLOCK + 1, 1000,
                          (size_t)OPT_CUDA_BLOCK * OPT_CUDA_MAX_BLOCKS + 333};
  const opt_kind_t kinds[] = {OPT_SGD, OPT_ADAGRAD, OPT_ADAM};
  for (size_t k = 0; k < 3; k++)
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_opt(kinds[k], sizes[i]);
  /* n = 0: the step count still advances, nothing runs */
  opt_hparams_t hp = {.lr = 0.1f};
  opt_t *o = NULL;
  assert_int_equal(opt_create_kind(OPT_SGD, &hp, 0, &o), 0);
  assert_int_equal(opt_cuda_step(o, NULL, NULL, NULL), 0);
  assert_int_equal(opt_steps(o), 1);
  opt_destroy(o);
}

/* model_dev on CUDA with the dense state on the device, against a run of
 * the same model (same GPU: the forward and backward give the same bits
 * run to run) whose optimizer runs on the host from model_dev_grads, its
 * parameters sent back with model_dev_params_changed -- what every step
 * did before the state moved to the device.  After each step the
 * parameters (model_dev_params), the optimizer state (model_dev_opt_sync)
 * and step count agree bit for bit; the logits left on the device
 * (model_dev_logits) equal the ones a forward returns. */
static void check_model_dev(const char *optimizer) {
  enum { N = 48, D = 5, T = 3, DIM = 4, STEPS = 4 };
  const char *sets[] = {"device=cuda", "model=dlrm", "model.bottom_mlp=16,8", "model.top_mlp=16,8", optimizer, NULL};
  cfg_t *c = testutil_cfg_of(sets);
  char err[1024] = "";
  model_dev_t *a = NULL, *b = NULL;
  assert_int_equal(model_dev_create(c, D, T, DIM, N, &a, err, sizeof err), 0);
  assert_int_equal(model_dev_create(c, D, T, DIM, N, &b, err, sizeof err), 0);
  assert_true(model_dev_is_cuda(a));
  model_dev_init(a, 77);
  model_dev_init(b, 77);
  size_t np = model_dev_n_params(a);
  opt_t *oa = NULL, *ob = NULL;
  assert_int_equal(opt_create(c, np, &oa), 0);
  assert_int_equal(opt_create(c, np, &ob), 0);
  size_t ns = opt_state_floats(oa);
  bits("initial params", model_dev_params(a), model_dev_params(b), np);
  rng_state = 31;
  float *dense = malloc((size_t)N * D * sizeof(float)), *emb = malloc((size_t)N * T * DIM * sizeof(float));
  float *labels = malloc(N * sizeof(float)), *la = malloc(N * sizeof(float)), *lb = malloc(N * sizeof(float));
  float *da = malloc((size_t)N * T * DIM * sizeof(float)), *db = malloc((size_t)N * T * DIM * sizeof(float));
  for (int step = 0; step < STEPS; step++) {
    uint32_t n = step == 2 ? N - 13 : N; /* a short batch too */
    for (size_t i = 0; i < (size_t)n * D; i++) dense[i] = urand();
    for (size_t i = 0; i < (size_t)n * T * DIM; i++) emb[i] = 0.5f * urand();
    for (uint32_t i = 0; i < n; i++) labels[i] = (float)(table_mix64((uint64_t)(step * N + i)) & 1);
    /* a: the training step's way -- no logits at the forward, no wait */
    assert_int_equal(model_dev_forward(a, n, dense, emb, NULL), 0);
    assert_int_equal(model_dev_forward(b, n, dense, emb, lb), 0);
    assert_int_equal(model_dev_logits(a, n, la), 0);
    bits("logits", la, lb, n);
    double lossa = model_dev_backward(a, n, labels, 1.0f / (float)n, da);
    double lossb = model_dev_backward(b, n, labels, 1.0f / (float)n, db);
    assert_false(isnan(lossa));
    assert_true(lossa == lossb);
    bits("d_emb", da, db, (size_t)n * T * DIM);
    assert_int_equal(model_dev_opt_step(a, oa), 0);
    /* b: the host optimizer over the fetched arrays */
    float *pb = model_dev_params(b);
    opt_step(ob, pb, model_dev_grads(b));
    assert_int_equal(model_dev_params_changed(b), 0);
    /* a's host views, fetched now */
    assert_int_equal(model_dev_params_to_host(a), 0);
    bits("params after the step", model_dev_params(a), model_dev_params(b), np);
    bits("grads", model_dev_grads(a), model_dev_grads(b), np);
    assert_int_equal(opt_steps(oa), opt_steps(ob));
    assert_int_equal(model_dev_opt_sync(a, oa), 0);
    if (ns) bits("optimizer state", opt_state(oa), opt_state(ob), ns);
    /* the device parameters are the host's */
    float *dp = back(model_dev_params_dev(a), np);
    bits("device params", dp, model_dev_params(a), np);
    free(dp);
  }
  /* round trips.  params_changed: a host write reaches the device */
  float *pa = model_dev_params(a);
  for (size_t i = 0; i < np; i++) pa[i] = 0.5f * pa[i] + 0.001f;
  assert_int_equal(model_dev_params_changed(a), 0);
  float *dp = back(model_dev_params_dev(a), np);
  bits("params_changed", dp, pa, np);
  free(dp);
  memcpy(model_dev_params(b), pa, np * sizeof(float));
  assert_int_equal(model_dev_params_changed(b), 0);
  /* opt_changed (a restore): a written state and step count drive the next
   * device step, as they drive the host's */
  if (ns) {
    float *sa = opt_state(oa), *sb = opt_state(ob);
    for (size_t i = 0; i < ns; i++) sa[i] = sb[i] = sb[i] * 0.75f + (opt_kind(oa) == OPT_ADAGRAD ? 0.01f : 0.0f);
  }
  opt_set_steps(oa, 40);
  opt_set_steps(ob, 40);
  assert_int_equal(model_dev_opt_changed(a, oa), 0);
  /* grads_changed (a host all-reduce): the written gradients are the ones the device step uses */
  float *ga = model_dev_grads(a), *gb = model_dev_grads(b);
  for (size_t i = 0; i < np; i++) ga[i] = gb[i] = 2.0f * gb[i] - 0.0001f;
  assert_int_equal(model_dev_grads_changed(a), 0);
  assert_int_equal(model_dev_opt_step(a, oa), 0);
  opt_step(ob, model_dev_params(b), gb);
  assert_int_equal(model_dev_params_changed(b), 0);
  bits("step after the round trips", model_dev_params(a), model_dev_params(b), np);
  assert_int_equal(model_dev_opt_sync(a, oa), 0);
  if (ns) bits("state after the round trips", opt_state(oa), opt_state(ob), ns);
  assert_int_equal(opt_steps(oa), 41);
  /* grads_zero: zeros on both sides */
  assert_int_equal(model_dev_grads_zero(a), 0);
  float *dg = back(model_dev_grads_dev(a), np);
  for (size_t i = 0; i < np; i++) assert_true(dg[i] == 0.0f && model_dev_grads(a)[i] == 0.0f);
  free(dg);
  no_cuda_error();
  free(dense); free(emb); free(labels); free(la); free(lb); free(da); free(db);
  opt_destroy(oa);
  opt_destroy(ob);
  model_dev_destroy(a);
  model_dev_destroy(b);
  cfg_destroy(c);
}

static void test_gpu_model_dev(void **state) {
  (void)state;
  if (!have_device()) skip();
  check_model_dev("optimizer=sgd");
  check_model_dev("optimizer=adagrad");
  check_model_dev("optimizer=adam");
}

/* The trainer's side on the GPU: gradients written to the host array (as
 * the Gloo all-reduce does) and sent with trainer_step_grads_changed drive
 * the device's dense step; the checkpoint's dense blob carries the
 * device's parameters and optimizer state (trainer_step_dense_sync), and
 * loading it into another GPU trainer (trainer_step_dense_changed) makes
 * its next step the same as the first one's, bit for bit. */
static void test_gpu_trainer_dense_state(void **state) {
  (void)state;
  if (!have_device()) skip();
  const char *sets[] = {"device=cuda", "model=dlrm", "model.bottom_mlp=8", "model.top_mlp=8", "n_dense=3",
                        "table_rows=50,40", "table_hotness=1,2", "embedding_dim=4", "optimizer=adam", NULL};
  cfg_t *cf = testutil_cfg_of(sets);
  data_schema_t sc;
  table_layout_t lay;
  char err[1024] = "";
  assert_int_equal(data_schema_from_cfg(cf, &sc, err, sizeof err), 0);
  assert_int_equal(cfg_layout(cf, &lay, err, sizeof err), 0);
  trainer_step_t *ts = NULL, *t2 = NULL;
  assert_int_equal(trainer_step_create(cf, &sc, &lay, 16, &ts, err, sizeof err), 0);
  assert_int_equal(trainer_step_create(cf, &sc, &lay, 16, &t2, err, sizeof err), 0);
  assert_true(trainer_step_is_cuda(ts));
  size_t np = trainer_step_n_params(ts);
  opt_t *ref = NULL;
  assert_int_equal(opt_create(cf, np, &ref), 0);
  float *p = malloc(np * sizeof(float)), *g = malloc(np * sizeof(float));
  memcpy(p, trainer_step_params(ts), np * sizeof(float));
  rng_state = 41;
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < np; i++) g[i] = 0.01f * urand();
    assert_int_equal(trainer_step_grads_fetch(ts), 0);
    memcpy(trainer_step_grads(ts), g, np * sizeof(float)); /* the "all-reduce" */
    assert_int_equal(trainer_step_grads_changed(ts), 0);
    trainer_step_update(ts);
    assert_int_equal(trainer_step_device_status(ts, err, sizeof err), 0);
    opt_step(ref, p, g);
    bits("trainer params", trainer_step_params(ts), p, np);
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(trainer_ckpt_dense_encode(ts, &buf, &len), 0);
  assert_int_equal(trainer_ckpt_dense_decode(t2, buf, len, err, sizeof err), 0);
  opt_t *o2 = trainer_step_dense_opt(t2);
  assert_int_equal(opt_steps(o2), 3);
  bits("restored state", opt_state(o2), opt_state(ref), opt_state_floats(ref));
  bits("restored params", trainer_step_params(t2), p, np);
  /* the next step on both, and on the host */
  for (size_t i = 0; i < np; i++) g[i] = 0.01f * urand();
  trainer_step_t *both[2] = {ts, t2};
  for (int k = 0; k < 2; k++) {
    memcpy(trainer_step_grads(both[k]), g, np * sizeof(float));
    assert_int_equal(trainer_step_grads_changed(both[k]), 0);
    trainer_step_update(both[k]);
    assert_int_equal(trainer_step_device_status(both[k], err, sizeof err), 0);
  }
  opt_step(ref, p, g);
  bits("step after the restore", trainer_step_params(t2), p, np);
  bits("the original's step", trainer_step_params(ts), p, np);
  /* a collective on the device: the host calls move nothing (the host
   * array keeps what was written, the device keeps its gradients) */
  trainer_step_set_collective_on_device(ts, 1);
  float *hg = trainer_step_grads(ts);
  hg[0] = 123.0f;
  assert_int_equal(trainer_step_grads_changed(ts), 0);
  assert_int_equal(trainer_step_grads_fetch(ts), 0);
  assert_true(hg[0] == 123.0f);
  free(buf);
  free(p);
  free(g);
  opt_destroy(ref);
  trainer_step_destroy(ts);
  trainer_step_destroy(t2);
  table_layout_close(&lay);
  data_schema_close(&sc);
  cfg_destroy(cf);
  nn_cuda_release();
}

#endif /* CHANTER_CUDA */

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusal_hidden_devices),
      cmocka_unit_test(test_refusal_here),
      cmocka_unit_test(test_built_flag),
#ifdef CHANTER_CUDA
      cmocka_unit_test(test_symbols_link),
      cmocka_unit_test(test_model_refuses_without_device),
      cmocka_unit_test(test_trainer_cache_refuses_without_device),
      cmocka_unit_test(test_launch_failure_is_reported),
      cmocka_unit_test(test_gpu_linear),
      cmocka_unit_test(test_gpu_elementwise),
      cmocka_unit_test(test_gpu_bce),
      cmocka_unit_test(test_gpu_concat),
      cmocka_unit_test(test_gpu_embedding_bag),
      cmocka_unit_test(test_gpu_interact),
      cmocka_unit_test(test_gpu_fm),
      cmocka_unit_test(test_gpu_cross),
      cmocka_unit_test(test_gpu_models),
      cmocka_unit_test(test_gpu_cross2),
      cmocka_unit_test(test_gpu_trainer_cache),
      cmocka_unit_test(test_gpu_opt),
      cmocka_unit_test(test_gpu_model_dev),
      cmocka_unit_test(test_gpu_trainer_dense_state),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
