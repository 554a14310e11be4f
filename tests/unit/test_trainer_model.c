/*
 * The four models of common/model/model.h: whole-model gradients
 * against finite differences, the parameter accounting, determinism, and
 * learning a planted signal end to end (embedding bag + model + dense and
 * row optimizers, as a trainer runs them).
 *
 * Finite differences: L = sum of BCE losses (model_backward with scale 1),
 * central differences with e = 1e-3 on float32 forwards, for every dense
 * parameter and every input embedding value.  Per element |a - n| <= 2e-3 +
 * 2e-2 |n| (the loss is O(1) with float32 rounding ~1e-6, i.e. ~5e-4 in the
 * quotient after a few layers; curvature adds e^2/6 |f'''| ~ 1e-6).  The
 * models contain ReLUs: a +-e perturbation that moves some hidden
 * pre-activation across 0 makes that one quotient wrong, so up to 1% of the
 * elements (at least 1) may miss the per-element bound, and the whole
 * gradient vector must still agree to 1e-2 in relative L2 norm.
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

#include <cmocka.h>

#include "cfg.h"
#include "embag.h"
#include "err.h"
#include "eval.h"
#include "model.h"
#include "model_dev.h"
#include "nn.h"
#include "opt.h"
#include "table.h"
#include "model_fd.h"
#include "testutil.h"

static double u01(void) {
  rng_state = table_mix64(rng_state);
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double gauss(void) { /* Box-Muller */
  double a = u01(), b = u01();
  return sqrt(-2.0 * log(a + 1e-300)) * cos(6.283185307179586 * b);
}

/* ------------------------------------------------------- gradient checks */

static void test_grad_dlrm(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm", "model.bottom_mlp=6", "model.top_mlp=7,5", NULL};
  model_fd_check(sets, 3, 3, 4, 4);
}

static void test_grad_dlrm_no_dense(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm", "model.top_mlp=6", NULL};
  model_fd_check(sets, 0, 4, 3, 4);
}

static void test_grad_wdl(void **state) {
  (void)state;
  const char *sets[] = {"model=wdl", "model.deep_mlp=6,5", NULL};
  model_fd_check(sets, 3, 3, 4, 4);
}

static void test_grad_deepfm(void **state) {
  (void)state;
  const char *sets[] = {"model=deepfm", "model.deep_mlp=6,5", NULL};
  model_fd_check(sets, 3, 3, 4, 4);
}

static void test_grad_dcn(void **state) {
  (void)state;
  const char *sets[] = {"model=dcn", "model.deep_mlp=6,5", "model.cross_layers=2", NULL};
  model_fd_check(sets, 3, 3, 4, 4);
  const char *sets0[] = {"model=dcn", "model.deep_mlp=", "model.cross_layers=3", NULL};
  model_fd_check(sets0, 2, 2, 3, 4); /* cross network only */
  const char *sets1[] = {"model=dcn", "model.deep_mlp=5", "model.cross_layers=0", NULL};
  model_fd_check(sets1, 2, 2, 3, 4); /* deep tower only */
}

/* ------------------------------------------------------- shapes, accounting */

static void test_default_shapes(void **state) {
  (void)state;
  model_t *m = make_model(NULL, 13, 26, 16, 64);
  const char *d = model_describe(m);
  assert_non_null(strstr(d, "bottom=13-512-256-64-16"));
  assert_non_null(strstr(d, "interaction=27x16->367"));
  assert_non_null(strstr(d, "top=367-512-256-1"));
  /* (13*512+512 + 512*256+256 + 256*64+64 + 64*16+16)
   * + (367*512+512 + 512*256+256 + 256*1+1) */
  assert_int_equal(model_n_params(m), 155984 + 320001);
  /* forward 2*sum(in*out) = 948736, dW the same, dx all but the first
   * layer: 948736 - 2*13*512 */
  assert_near(model_gemm_flops_per_sample(m), 948736.0 * 3 - 2 * 13 * 512, 0);
  model_gemm_t g[64];
  size_t k = model_gemms(m, 2048, g, 64);
  assert_int_equal(k, 4 * 3 - 1 + 3 * 3);
  assert_true(g[0].m == 2048 && g[0].n == 512 && g[0].k == 13 && g[0].trans_b);
  model_destroy(m);
  const char *sets[] = {"model=dcn", NULL};
  m = make_model(sets, 13, 26, 16, 64);
  assert_non_null(strstr(model_describe(m), "x0=429 cross=3 deep=429-512-256-128 final=557-1"));
  model_destroy(m);
}

static void test_bad_config(void **state) {
  (void)state;
  const char *bad[][3] = {
      {"model=dlrm", "model.top_mlp=64,0", NULL},
      {"model=wdl", "model.deep_mlp=12,2000000", NULL}, /* a non-number is cfg's to refuse (test_cfg) */
  };
  for (int i = 0; i < 2; i++) {
    cfg_t *c = testutil_cfg_of(bad[i]);
    model_t *m = (model_t *)1;
    char err[256] = "";
    assert_int_equal(model_create(c, 13, 26, 16, 64, &m, err, sizeof(err)), ERR_CONFIG);
    assert_null(m);
    assert_non_null(strstr(err, "model."));
    cfg_destroy(c);
  }
  cfg_t *c = testutil_cfg_of(NULL);
  model_t *m;
  char err[256];
  assert_int_equal(model_create(c, 0, 0, 16, 64, &m, err, sizeof(err)), -EINVAL);
  cfg_destroy(c);
}

/* ------------------------------------------------ training a planted signal */

/* Planted problem: T tables of R rows, D dense features.  The true logit of
 * a sample is bias + sum_t a_t[row_t] + b . dense with a ~ N(0, 0.7^2),
 * b ~ N(0, 0.5^2); rows are drawn with a mild skew; the label is drawn from
 * sigmoid(true logit).  No model can beat the Bayes AUC of the true logits
 * on the test labels; the test prints it next to what each model reaches. */
enum { T = 4, R = 40, D = 4, DIM = 8, NTRAIN = 8192, NTEST = 4096, BATCH = 128 };

typedef struct data_s {
  uint32_t n;
  float dense[NTRAIN * D];
  uint64_t idx[T][NTRAIN]; /* per table, sample-contiguous */
  float labels[NTRAIN], truth[NTRAIN];
} data_t;

static float a_row[T][R], b_dense[D];

static void plant(uint64_t seed) {
  rng_state = seed;
  for (int t = 0; t < T; t++)
    for (int r = 0; r < R; r++) a_row[t][r] = (float)(0.7 * gauss());
  for (int d = 0; d < D; d++) b_dense[d] = (float)(0.5 * gauss());
}

static void draw(data_t *x, uint32_t n) {
  x->n = n;
  for (uint32_t i = 0; i < n; i++) {
    double z = -0.5;
    for (int d = 0; d < D; d++) {
      float v = (float)gauss();
      x->dense[i * D + d] = v;
      z += b_dense[d] * v;
    }
    for (int t = 0; t < T; t++) {
      double u = u01();
      uint64_t r = (uint64_t)(R * u * u); /* skewed to low rows */
      x->idx[t][i] = r;
      z += a_row[t][r];
    }
    x->truth[i] = (float)z;
    x->labels[i] = u01() < 1.0 / (1.0 + exp(-z)) ? 1.0f : 0.0f;
  }
}

typedef struct run_s {
  model_t *m;
  opt_t *opt;
  opt_kind_t row_kind;
  opt_hparams_t row_hp;
  uint32_t stride;
  float *tables[T];
  float emb[BATCH * T * DIM], d_emb[BATCH * T * DIM], logits[BATCH];
  uint64_t uniq[BATCH];
  float grad[BATCH * DIM];
  void *work;
} run_t;

static void run_open(run_t *r, const char *const *sets, uint64_t seed) {
  memset(r, 0, sizeof(*r));
  cfg_t *c = testutil_cfg_of(sets);
  char err[256];
  assert_int_equal(model_create(c, D, T, DIM, BATCH, &r->m, err, sizeof(err)), 0);
  model_init(r->m, seed);
  assert_int_equal(opt_create(c, model_n_params(r->m), &r->opt), 0);
  assert_int_equal(opt_kind_parse(cfg_str(c, "embedding_optimizer"), &r->row_kind), 0);
  opt_hparams_from_cfg(c, r->row_kind, &r->row_hp);
  table_layout_t l;
  assert_int_equal(table_layout_init(&l, T, seed), 0);
  for (int t = 0; t < T; t++) {
    l.tables[t].rows = R;
    l.tables[t].dim = DIM;
    l.tables[t].state_floats = opt_row_state_floats(r->row_kind, DIM);
  }
  r->stride = table_row_floats(&l, 0);
  for (int t = 0; t < T; t++) {
    r->tables[t] = malloc((size_t)R * r->stride * sizeof(float));
    for (uint64_t k = 0; k < R; k++) table_init_row(&l, TABLE_KEY(t, k), r->tables[t] + k * r->stride);
  }
  table_layout_close(&l);
  r->work = malloc(nn_embedding_bag_bwd_work_size(BATCH, 1));
  cfg_destroy(c);
}

static void run_close(run_t *r) {
  for (int t = 0; t < T; t++) free(r->tables[t]);
  free(r->work);
  opt_destroy(r->opt);
  model_destroy(r->m);
}

static void gather(run_t *r, const data_t *x, uint32_t off, uint32_t n) {
  for (int t = 0; t < T; t++)
    nn_embedding_bag_fwd(r->tables[t], r->stride, x->idx[t] + off, n, 1, DIM, r->emb + t * DIM,
                         T * DIM);
}

/* One training step on samples [off, off+n): returns the summed loss. */
static double train_step(run_t *r, const data_t *x, uint32_t off, uint32_t n) {
  gather(r, x, off, n);
  model_forward(r->m, n, x->dense + (size_t)off * D, r->emb, r->logits);
  double loss = model_backward(r->m, n, x->labels + off, 1.0f / (float)n, r->d_emb);
  opt_step(r->opt, model_params(r->m), model_grads(r->m));
  for (int t = 0; t < T; t++) {
    uint32_t u = nn_embedding_bag_bwd(r->d_emb + t * DIM, T * DIM, x->idx[t] + off, n, 1, DIM,
                                      r->uniq, r->grad, DIM, r->work);
    for (uint32_t k = 0; k < u; k++)
      opt_row_update(r->row_kind, &r->row_hp, r->tables[t] + r->uniq[k] * r->stride, DIM,
                     r->grad + (size_t)k * DIM);
  }
  return loss;
}

static double evaluate(run_t *r, const data_t *x) {
  eval_acc_t a;
  eval_acc_init(&a);
  for (uint32_t off = 0; off < x->n; off += BATCH) {
    uint32_t n = x->n - off < BATCH ? x->n - off : BATCH;
    gather(r, x, off, n);
    model_forward(r->m, n, x->dense + (size_t)off * D, r->emb, r->logits);
    assert_int_equal(eval_acc_add(&a, r->logits, x->labels + off, n), 0);
  }
  double auc;
  assert_int_equal(eval_acc_result(&a, NULL, NULL, &auc), 0);
  eval_acc_close(&a);
  return auc;
}

static data_t *train_set, *test_set;
static double bayes_auc;

static int setup_data(void **state) {
  (void)state;
  train_set = malloc(sizeof(*train_set));
  test_set = malloc(sizeof(*test_set));
  plant(2024);
  draw(train_set, NTRAIN);
  draw(test_set, NTEST);
  assert_int_equal(eval_auc(test_set->truth, test_set->labels, NTEST, &bayes_auc), 0);
  return 0;
}

static int teardown_data(void **state) {
  (void)state;
  free(train_set);
  free(test_set);
  return 0;
}


static double train_and_eval(const char *const *sets, int epochs) {
  run_t *r = malloc(sizeof(*r));
  run_open(r, sets, 7);
  double first = 0.0, last = 0.0;
  for (int e = 0; e < epochs; e++) {
    double sum = 0.0;
    for (uint32_t off = 0; off < NTRAIN; off += BATCH) sum += train_step(r, train_set, off, BATCH);
    if (e == 0) first = sum / NTRAIN;
    last = sum / NTRAIN;
  }
  double auc = evaluate(r, test_set);
  print_message("  %-7s train logloss %.4f -> %.4f, test AUC %.4f (Bayes %.4f)\n", sets[0] + 6,
                first, last, auc, bayes_auc);
  assert_true(last < first);
  run_close(r);
  free(r);
  return auc;
}

/* Thresholds.  With 4096 test samples an AUC's standard error is about
 * 0.01, so chance (0.5) stays far below 0.6.  The Bayes AUC of this
 * problem (the true logits scored on the test labels) is 0.83: every model
 * must reach 0.75 -- 25 standard errors above chance, unreachable without
 * learning -- and come within 0.05 of the Bayes AUC.  Measured (4 epochs =
 * 256 steps of 128): dlrm 0.798, wdl 0.815, deepfm 0.815, dcn 0.810; on
 * five other planted seeds the gap to Bayes stayed below 0.03.  DLRM has
 * the largest gap: it sees the embeddings only through dot products (and
 * the top MLP), so an additive signal must be encoded through those, and
 * it overfits sooner. */
static void check_learns(double auc) {
  assert_true(bayes_auc > 0.8);
  assert_true(auc > 0.75);
  assert_true(auc > bayes_auc - 0.05);
}

static void test_learn_dlrm(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm", "model.bottom_mlp=16", "model.top_mlp=32,16",
                        "optimizer=adam", "learning_rate=0.03",
                        "embedding_optimizer=rowwise_adagrad", NULL};
  check_learns(train_and_eval(sets, 4));
}

static void test_learn_all(void **state) {
  (void)state;
  const char *wdl[] = {"model=wdl", "model.deep_mlp=32,16", "optimizer=adagrad",
                       "learning_rate=0.05", "embedding_optimizer=adagrad", NULL};
  const char *deepfm[] = {"model=deepfm", "model.deep_mlp=32,16", "optimizer=adam",
                          "learning_rate=0.01", "embedding_optimizer=rowwise_adagrad", NULL};
  const char *dcn[] = {"model=dcn", "model.deep_mlp=32,16", "model.cross_layers=2",
                       "optimizer=sgd", "learning_rate=0.3", "embedding_optimizer=sgd", NULL};
  check_learns(train_and_eval(wdl, 4));
  check_learns(train_and_eval(deepfm, 4));
  check_learns(train_and_eval(dcn, 4));
}

/* ------------------------------------------------------------ determinism */

static void train_bytes(const char *const *sets, uint32_t threads, float **params, size_t *np,
                        float **table0) {
  run_t *r = malloc(sizeof(*r));
  run_open(r, sets, 99);
  assert_int_equal(model_set_threads(r->m, threads), 0);
  assert_int_equal(model_threads(r->m), threads);
  for (uint32_t off = 0; off + BATCH <= 2048; off += BATCH) train_step(r, train_set, off, BATCH);
  *np = model_n_params(r->m);
  *params = malloc(*np * sizeof(float));
  memcpy(*params, model_params(r->m), *np * sizeof(float));
  *table0 = malloc((size_t)R * r->stride * sizeof(float));
  memcpy(*table0, r->tables[0], (size_t)R * r->stride * sizeof(float));
  run_close(r);
  free(r);
}

static void test_determinism(void **state) {
  (void)state;
  /* layers wide enough that OpenBLAS runs its threaded kernels */
  const char *models[4][8] = {
      {"model=dlrm", "model.bottom_mlp=256,64", "model.top_mlp=256,128", "optimizer=adam",
       "embedding_optimizer=rowwise_adagrad", NULL},
      {"model=wdl", "model.deep_mlp=256,128", "optimizer=adagrad", "embedding_optimizer=adagrad", NULL},
      {"model=deepfm", "model.deep_mlp=256,128", "optimizer=sgd", NULL},
      {"model=dcn", "model.deep_mlp=256,128", "optimizer=adam", NULL},
  };
  /* two runs, and runs on 1, 2, 3 and 4 threads: the same bytes (the
   * batch is cut into MODEL_PARTS parts whatever the thread count) */
  uint32_t threads[5] = {2, 2, 1, 3, 4};
  for (int k = 0; k < 4; k++) {
    float *p1, *t1;
    size_t n1;
    train_bytes(models[k], threads[0], &p1, &n1, &t1);
    for (int j = 1; j < 5; j++) {
      float *p2, *t2;
      size_t n2;
      train_bytes(models[k], threads[j], &p2, &n2, &t2);
      assert_int_equal(n1, n2);
      assert_memory_equal(p1, p2, n1 * sizeof(float));
      assert_memory_equal(t1, t2, (size_t)R * DIM * sizeof(float)); /* >= the first rows */
      free(p2); free(t2);
    }
    free(p1); free(t1);
  }
  /* init depends on the seed only */
  model_t *a = make_model(models[0], D, T, DIM, 16), *b = make_model(models[0], D, T, DIM, 16);
  model_init(a, 5);
  model_init(b, 5);
  assert_memory_equal(model_params(a), model_params(b), model_n_params(a) * sizeof(float));
  model_init(b, 6);
  assert_memory_not_equal(model_params(a), model_params(b), model_n_params(a) * sizeof(float));
  model_destroy(a);
  model_destroy(b);
}

/* embag_train_step (train --local's and bench model's step: the embedding
 * work on the model's threads) on 1..4 threads gives the bytes of the
 * serial step above (train_step: one loop over the tables) on one thread:
 * dense parameters and every table. */
static void test_embag_step(void **state) {
  (void)state;
  const char *sets[] = {"model=dlrm", "model.bottom_mlp=256,64", "model.top_mlp=256,128", "optimizer=adam",
                        "embedding_optimizer=rowwise_adagrad", NULL};
  enum { STEPS = 16 };
  run_t *ref = malloc(sizeof(*ref));
  run_open(ref, sets, 99);
  assert_int_equal(model_set_threads(ref->m, 1), 0);
  for (uint32_t s = 0; s < STEPS; s++) train_step(ref, train_set, s * BATCH, BATCH);
  const uint32_t hot[T] = {1, 1, 1, 1};
  for (uint32_t threads = 1; threads <= 4; threads++) {
    run_t *r = malloc(sizeof(*r));
    run_open(r, sets, 99);
    cfg_t *c = testutil_cfg_of(sets);
    char err[256];
    model_dev_t *md = NULL;
    embag_t *e = NULL;
    assert_int_equal(model_dev_create(c, D, T, DIM, BATCH, &md, err, sizeof(err)), 0);
    model_dev_init(md, 99);
    assert_int_equal(model_set_threads(model_dev_cpu_model(md), threads), 0);
    assert_int_equal(embag_create(T, hot, DIM, BATCH, &e), 0);
    double sec[EMBAG_PHASES] = {0};
    for (uint32_t s = 0; s < STEPS; s++) {
      uint32_t off = s * BATCH;
      const uint64_t *idx[T];
      for (int t = 0; t < T; t++) idx[t] = train_set->idx[t] + off;
      double loss = embag_train_step(e, md, r->opt, r->row_kind, &r->row_hp, r->tables, r->stride, BATCH,
                                     train_set->dense + (size_t)off * D, train_set->labels + off, idx,
                                     1.0f / (float)BATCH, sec);
      assert_false(isnan(loss));
    }
    assert_true(sec[EMBAG_PHASE_FORWARD] > 0.0);
    assert_int_equal(model_dev_n_params(md), model_n_params(ref->m));
    assert_memory_equal(model_dev_params(md), model_params(ref->m), model_n_params(ref->m) * sizeof(float));
    for (int t = 0; t < T; t++)
      assert_memory_equal(r->tables[t], ref->tables[t], (size_t)R * r->stride * sizeof(float));
    embag_destroy(e);
    model_dev_destroy(md);
    cfg_destroy(c);
    run_close(r);
    free(r);
  }
  run_close(ref);
  free(ref);
}

/* model_dev's dense-state API on device = cpu: model_dev_opt_step is
 * opt_step_pool over the model's threads (bit for bit, step count too), and
 * the device-residency calls are no-ops returning 0 that move nothing:
 * the host arrays are the model's own. */
static void test_model_dev_cpu_api(void **state) {
  (void)state;
  const char *kinds[] = {"optimizer=sgd", "optimizer=adagrad", "optimizer=adam"};
  for (int k = 0; k < 3; k++) {
    const char *sets[] = {"model=dlrm", "model.bottom_mlp=16", "model.top_mlp=16", kinds[k], NULL};
    cfg_t *c = testutil_cfg_of(sets);
    char err[256];
    model_dev_t *md = NULL;
    assert_int_equal(model_dev_create(c, D, T, DIM, BATCH, &md, err, sizeof(err)), 0);
    model_dev_init(md, 3);
    assert_int_equal(model_set_threads(model_dev_cpu_model(md), 3), 0);
    assert_false(model_dev_is_cuda(md));
    model_t *m = model_dev_cpu_model(md);
    size_t np = model_dev_n_params(md);
    assert_ptr_equal(model_dev_params(md), model_params(m));
    assert_ptr_equal(model_dev_grads(md), model_grads(m));
    assert_null(model_dev_params_dev(md));
    assert_null(model_dev_grads_dev(md));
    assert_null(model_dev_emb_dev(md));
    opt_t *o = NULL, *ref = NULL;
    assert_int_equal(opt_create(c, np, &o), 0);
    assert_int_equal(opt_create(c, np, &ref), 0);
    float *want = malloc(np * sizeof(float));
    memcpy(want, model_dev_params(md), np * sizeof(float));
    rng_state = 11;
    float *logits = malloc(BATCH * sizeof(float)), *d_emb = malloc((size_t)BATCH * T * DIM * sizeof(float));
    float *emb = malloc((size_t)BATCH * T * DIM * sizeof(float));
    for (int step = 0; step < 3; step++) {
      uint32_t off = (uint32_t)step * BATCH;
      for (size_t i = 0; i < (size_t)BATCH * T * DIM; i++) emb[i] = 0.1f * urand();
      assert_int_equal(model_dev_forward(md, BATCH, train_set->dense + (size_t)off * D, emb, logits), 0);
      assert_false(isnan(model_dev_backward(md, BATCH, train_set->labels + off, 1.0f / BATCH, d_emb)));
      assert_int_equal(model_dev_grads_to_host(md), 0);
      assert_int_equal(model_dev_grads_changed(md), 0);
      opt_step_pool(ref, want, model_dev_grads(md), model_pool(m));
      assert_int_equal(model_dev_opt_step(md, o), 0);
      assert_int_equal(model_dev_params_to_host(md), 0);
      assert_memory_equal(model_dev_params(md), want, np * sizeof(float));
      assert_int_equal(opt_steps(o), opt_steps(ref));
      assert_int_equal(model_dev_opt_sync(md, o), 0);
      if (opt_state_floats(o))
        assert_memory_equal(opt_state(o), opt_state(ref), opt_state_floats(o) * sizeof(float));
    }
    /* the logits are the forward's (model_dev_logits has nothing to add) */
    float keep = logits[0];
    assert_int_equal(model_dev_logits(md, BATCH, logits), 0);
    assert_true(logits[0] == keep);
    /* a restore: the host state is the state, nothing to send */
    assert_int_equal(model_dev_params_changed(md), 0);
    assert_int_equal(model_dev_opt_changed(md, o), 0);
    assert_int_equal(model_dev_grads_zero(md), 0);
    for (size_t i = 0; i < np; i++) assert_true(model_dev_grads(md)[i] == 0.0f);
    free(logits);
    free(d_emb);
    free(emb);
    free(want);
    opt_destroy(o);
    opt_destroy(ref);
    model_dev_destroy(md);
    cfg_destroy(c);
  }
}

/* ------------------------------------------------------- the backward hook */

typedef struct hook_rec_s {
  model_t *m;
  size_t calls, lo[64];
  float *snap[64]; /* grads[lo, n) at the moment of the call */
} hook_rec_t;

static void record_ready(void *ud, size_t lo) {
  hook_rec_t *h = ud;
  assert_true(h->calls < 64);
  size_t n = model_n_params(h->m);
  h->lo[h->calls] = lo;
  h->snap[h->calls] = malloc((n - lo) * sizeof(float) + 1);
  memcpy(h->snap[h->calls], model_grads(h->m) + lo, (n - lo) * sizeof(float));
  h->calls++;
}

/* model_set_grad_ready: the reported suffixes shrink strictly to 0, at most
 * one per stage, and what a suffix holds when reported is already its
 * final value (nothing writes it afterwards) -- the property the
 * overlapped all-reduce relies on; and the hook changes no result. */
static void test_grad_ready(void **state) {
  (void)state;
  const char *models[5][6] = {
      {"model=dlrm", "model.bottom_mlp=64,32", "model.top_mlp=64,32", NULL},
      {"model=wdl", "model.deep_mlp=64,32", NULL},
      {"model=deepfm", "model.deep_mlp=64,32", NULL},
      {"model=dcn", "model.deep_mlp=64,32", "model.cross_layers=2", NULL},
      {"model=dcn", "model.deep_mlp=", "model.cross_layers=3", NULL},
  };
  const uint32_t n = 200, nd = 5, nt = 4, dim = 8;
  float *dense = malloc((size_t)n * nd * sizeof(float)), *emb = malloc((size_t)n * nt * dim * sizeof(float));
  float *labels = malloc(n * sizeof(float)), *demb = malloc((size_t)n * nt * dim * sizeof(float));
  rng_state = 17;
  for (size_t i = 0; i < (size_t)n * nd; i++) dense[i] = urand();
  for (size_t i = 0; i < (size_t)n * nt * dim; i++) emb[i] = urand();
  for (uint32_t i = 0; i < n; i++) labels[i] = u01() < 0.3 ? 1.0f : 0.0f;
  for (int k = 0; k < 5; k++) {
    for (uint32_t threads = 1; threads <= 3; threads += 2) {
      model_t *m = make_model(models[k], nd, nt, dim, n);
      assert_int_equal(model_set_threads(m, threads), 0);
      model_init(m, 3);
      size_t np = model_n_params(m);
      /* without the hook */
      model_forward(m, n, dense, emb, NULL);
      model_backward(m, n, labels, 1.0f / n, demb);
      float *ref = malloc(np * sizeof(float));
      memcpy(ref, model_grads(m), np * sizeof(float));
      /* with it */
      hook_rec_t h = {.m = m};
      model_set_grad_ready(m, record_ready, &h);
      model_forward(m, n, dense, emb, NULL);
      model_backward(m, n, labels, 1.0f / n, demb);
      assert_memory_equal(ref, model_grads(m), np * sizeof(float));
      assert_true(h.calls >= 2);
      assert_true(h.calls <= model_backward_stages(m));
      assert_int_equal(h.lo[h.calls - 1], 0);
      for (size_t c = 0; c < h.calls; c++) {
        if (c) assert_true(h.lo[c] < h.lo[c - 1]);
        assert_true(h.lo[c] < np);
        assert_memory_equal(h.snap[c], ref + h.lo[c], (np - h.lo[c]) * sizeof(float));
        free(h.snap[c]);
      }
      free(ref);
      model_destroy(m);
    }
  }
  free(dense); free(emb); free(labels); free(demb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grad_dlrm),
      cmocka_unit_test(test_grad_dlrm_no_dense),
      cmocka_unit_test(test_grad_wdl),
      cmocka_unit_test(test_grad_deepfm),
      cmocka_unit_test(test_grad_dcn),
      cmocka_unit_test(test_default_shapes),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_learn_dlrm),
      cmocka_unit_test(test_learn_all),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_embag_step),
      cmocka_unit_test(test_model_dev_cpu_api),
      cmocka_unit_test(test_grad_ready),
  };
  return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
