/*
 * embdev (the embedding tables of train --local on the GPU) against
 * embag, the CPU code it mirrors.
 *
 * What runs where:
 *  - everywhere: which tables fit trainer.device_mb (embdev_plan, smallest
 *    first) and the automatic budget (embdev_budget, embdev_margin), and
 *    the config key's default and bounds;
 *  - CUDA builds without a usable device (CI): embdev_create refuses with
 *    the machine's reason, bad arguments before the device is looked at;
 *  - with a GPU only (skipped otherwise): pooling into the model's device
 *    input == embag_fwd, and the fold and row update from the model's
 *    device input gradient == embag_bwd_update, bit for bit (==), for
 *    sgd, adagrad and rowwise_adagrad, dims below and above the kernel's
 *    16-column chunk, several tables of different hotness, ids repeated
 *    inside a sample and across samples, batches that are not a multiple
 *    of the 256-thread block, a smaller batch after a larger one, and
 *    three steps in a row (the optimizer state feeds back); the same with
 *    the largest table left on the host by the budget, and with every
 *    table on the host (budget 0); the whole step (embdev_train_step with
 *    a DLRM) against embag_train_step on the CPU: same loss and rows up to
 *    cuBLAS's last bits, and bit-identical run to run;
 *  - embdev_set (a partitioned table's owner): without a device, bad
 *    arguments refused, then the device's reason; with a GPU only: rows
 *    written in a shuffled order, pooling into a device buffer and into a
 *    host buffer of a strided layout (columns permuted, two never written)
 *    == embag_fwd, fold + update of a strided gradient (device or host)
 *    == embag_bwd_each + opt_row_update, the rows updated counted alike,
 *    a placeholder row past lim used by ids and never updated, batches
 *    that grow the buffers, for the three row optimizers and dims around
 *    the 16-column chunk.
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
#include "cuda_check.h"
#include "embag.h"
#include "embdev.h"
#include "err.h"
#include "model_dev.h"
#include "nn_cuda.h"
#include "opt.h"
#include "table.h"
#include "testutil.h"

#ifdef CHANTER_CUDA
#include <cuda_runtime_api.h>
#endif

/* A layout of n tables with these rows, one dim, state for kind. */
static void layout_of(table_layout_t *l, uint32_t n, const uint64_t *rows, uint32_t dim, opt_kind_t kind) {
  assert_int_equal(table_layout_init(l, n, 42), 0);
  for (uint32_t t = 0; t < n; t++) {
    l->tables[t].rows = rows[t];
    l->tables[t].dim = dim;
    l->tables[t].state_floats = opt_row_state_floats(kind, dim);
  }
}

/* ------------------------------------------------------------ planning (CPU) */

static void test_plan_smallest_first(void **state) {
  (void)state;
  /* dim 4, sgd: 16 bytes a row */
  const uint64_t rows[5] = {100, 10, 1000, 10, 50};
  table_layout_t l;
  layout_of(&l, 5, rows, 4, OPT_SGD);
  assert_int_equal(embdev_table_bytes(&l, 0), 1600);
  assert_int_equal(embdev_table_bytes(&l, 2), 16000);
  uint8_t on[5];
  uint64_t bytes = 1;
  /* nothing fits */
  assert_int_equal(embdev_plan(&l, 0, on, &bytes), 0);
  assert_int_equal(bytes, 0);
  for (int t = 0; t < 5; t++) assert_int_equal(on[t], 0);
  /* one of the two 160-byte tables: the lower index */
  assert_int_equal(embdev_plan(&l, 200, on, &bytes), 1);
  assert_int_equal(bytes, 160);
  assert_int_equal(on[1], 1);
  assert_int_equal(on[3], 0);
  /* exactly the three smallest (160 + 160 + 800) */
  assert_int_equal(embdev_plan(&l, 1120, on, &bytes), 3);
  assert_int_equal(bytes, 1120);
  assert_true(on[1] && on[3] && on[4] && !on[0] && !on[2]);
  /* one byte short of the fourth: still three (no larger table jumps in) */
  assert_int_equal(embdev_plan(&l, 1120 + 1599, on, &bytes), 3);
  /* everything */
  assert_int_equal(embdev_plan(&l, UINT64_MAX, on, &bytes), 5);
  assert_int_equal(bytes, 1600 + 160 + 16000 + 160 + 800);
  assert_int_equal(embdev_plan(&l, UINT64_MAX, on, NULL), 5);
  table_layout_close(&l);
  /* the state counts: adagrad doubles a row */
  layout_of(&l, 5, rows, 4, OPT_ADAGRAD);
  assert_int_equal(embdev_table_bytes(&l, 0), 3200);
  assert_int_equal(embdev_plan(&l, 1120, on, &bytes), 2);
  table_layout_close(&l);
}

static void test_budget(void **state) {
  (void)state;
  const uint64_t MiB = UINT64_C(1) << 20, GiB = UINT64_C(1) << 30;
  assert_int_equal(embdev_margin(80 * GiB), 4 * GiB);
  assert_int_equal(embdev_margin(4 * GiB), 512 * MiB);
  assert_int_equal(embdev_budget(0, 70 * GiB, 80 * GiB), 0);
  assert_int_equal(embdev_budget(300, 70 * GiB, 80 * GiB), 300 * MiB);
  assert_int_equal(embdev_budget(EMBDEV_AUTO, 70 * GiB, 80 * GiB), 66 * GiB);
  assert_int_equal(embdev_budget(EMBDEV_AUTO, 100 * MiB, 4 * GiB), 0);
  /* the key: default automatic, 0 allowed, below -1 refused */
  cfg_t *c = testutil_cfg_of(NULL);
  assert_int_equal(cfg_int(c, "trainer.device_mb"), EMBDEV_AUTO);
  char err[512];
  assert_int_equal(cfg_set(c, "trainer.device_mb=0", "test", err, sizeof err), 0);
  assert_int_equal(cfg_int(c, "trainer.device_mb"), 0);
  assert_int_not_equal(cfg_set(c, "trainer.device_mb=-2", "test", err, sizeof err), 0);
  cfg_destroy(c);
}

#ifdef CHANTER_CUDA
static int have_device(void) {
  char msg[1024];
  return cuda_check(msg, sizeof msg) == 0;
}

/* ------------------------------------------------------------ no device */

static void test_refuses_without_device(void **state) {
  (void)state;
  if (have_device()) skip();
  const uint64_t rows[2] = {10, 20};
  const uint32_t hot[2] = {1, 2};
  table_layout_t l;
  layout_of(&l, 2, rows, 4, OPT_SGD);
  opt_hparams_t hp = {.lr = 0.1f, .eps = 1e-8f};
  embdev_t *e = (embdev_t *)&e;
  char err[1024] = "";
  int rc = embdev_create(&l, hot, 16, OPT_SGD, &hp, EMBDEV_AUTO, &e, err, sizeof err);
  assert_null(e);
  assert_int_equal(rc, ERR_NOGPU);
  print_message("  embdev_create: %s\n", err);
  assert_non_null(strstr(err, "device = cpu"));
  /* bad arguments are refused before the device is looked at */
  assert_int_equal(embdev_create(&l, hot, 16, OPT_ADAM, &hp, EMBDEV_AUTO, &e, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "adam"));
  assert_int_equal(embdev_create(&l, hot, 16, OPT_ADAGRAD, &hp, EMBDEV_AUTO, &e, err, sizeof err), -EINVAL);
  assert_int_equal(embdev_create(&l, hot, 0, OPT_SGD, &hp, EMBDEV_AUTO, &e, err, sizeof err), -EINVAL);
  assert_null(e);
  table_layout_close(&l);
}

/* ------------------------------------------------------------ GPU vs CPU */

static uint64_t rng_state;
static float urand(void) { /* uniform [-1, 1) */
  rng_state = table_mix64(rng_state);
  return (float)((double)(rng_state >> 40) / 8388608.0 - 1.0);
}
static uint64_t irand(uint64_t below) {
  rng_state = table_mix64(rng_state);
  return (rng_state >> 11) % below;
}

/* a[i] == b[i] for all i (bit-identical up to the sign of zero) */
static void same(const char *what, uint32_t t, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(a[i] == b[i])) {
      print_error("%s (table %u) [%zu]: GPU %.9g CPU %.9g (expected identical)\n", what, t, i, a[i], b[i]);
      fail();
    }
}

/* A small model on device whose device input and input gradient carry the
 * test's data (dlrm: the width is n_tables * dim). */
static model_dev_t *model_on(uint32_t n_tables, uint32_t dim, uint32_t max_batch, const char *device) {
  char d[64], dm[64], dev[64];
  snprintf(d, sizeof d, "embedding_dim=%u", dim);
  snprintf(dm, sizeof dm, "model.bottom_mlp=%u", 8u);
  snprintf(dev, sizeof dev, "device=%s", device);
  const char *sets[] = {dev, "model=dlrm", dm, "model.top_mlp=8", "n_dense=3", d, NULL};
  cfg_t *c = testutil_cfg_of(sets);
  model_dev_t *m = NULL;
  char err[1024] = "";
  int rc = model_dev_create(c, 3, n_tables, dim, max_batch, &m, err, sizeof err);
  if (rc) print_error("model_dev_create: %s\n", err);
  assert_int_equal(rc, 0);
  model_dev_init(m, 7);
  cfg_destroy(c);
  return m;
}

enum { T = 5 };
static const uint64_t ROWS[T] = {50, 1000, 7, 300, 3};
static const uint32_t HOT[T] = {1, 3, 2, 4, 1};

/* The tables' rows as table_init_row gives them (the CPU's reference). */
static float **ref_tables(const table_layout_t *l, uint32_t rf) {
  float **ref = calloc(T, sizeof *ref);
  assert_non_null(ref);
  for (uint32_t t = 0; t < T; t++) {
    ref[t] = malloc(l->tables[t].rows * rf * sizeof(float));
    assert_non_null(ref[t]);
    for (uint64_t r = 0; r < l->tables[t].rows; r++) table_init_row(l, TABLE_KEY(t, r), ref[t] + r * rf);
  }
  return ref;
}

/* Every row of every table, read back from e, == ref; returns how many
 * rows differ from their initial value (the steps did something). */
static size_t compare_rows(embdev_t *e, const table_layout_t *l, float **ref, uint32_t rf, const char *what) {
  size_t changed = 0;
  for (uint32_t t = 0; t < T; t++) {
    uint64_t rows = l->tables[t].rows;
    float *got = malloc(rows * rf * sizeof(float)), *init = malloc(rf * sizeof(float));
    assert_non_null(got);
    assert_non_null(init);
    assert_int_equal(embdev_read_rows(e, t, 0, rows, got), 0);
    same(what, t, got, ref[t], rows * rf);
    for (uint64_t r = 0; r < rows; r++) {
      table_init_row(l, TABLE_KEY(t, r), init);
      changed += memcmp(init, got + r * rf, rf * sizeof(float)) != 0;
    }
    free(got);
    free(init);
  }
  return changed;
}

/* Three steps of (pool, fold + row update) on the GPU and with embag on
 * the CPU, from the same ids and input gradients, for one optimizer, dim
 * and budget; expect_dev tables on the device. */
static void check_steps(opt_kind_t kind, uint32_t dim, int64_t budget, uint32_t expect_dev) {
  uint32_t rf = dim + opt_row_state_floats(kind, dim), width = T * dim, max_batch = 300;
  table_layout_t l;
  layout_of(&l, T, ROWS, dim, kind);
  opt_hparams_t hp = {.lr = 0.3f, .eps = 1e-3f};
  model_dev_t *md = model_on(T, dim, max_batch, "cuda");
  embdev_t *e = NULL;
  char err[1024] = "";
  int rc = embdev_create(&l, HOT, max_batch, kind, &hp, budget, &e, err, sizeof err);
  if (rc) print_error("embdev_create: %s\n", err);
  assert_int_equal(rc, 0);
  assert_int_equal(embdev_n_device(e), expect_dev);
  float **ref = ref_tables(&l, rf);
  embag_t *eb = NULL;
  assert_int_equal(embag_create(T, HOT, dim, max_batch, &eb), 0);
  uint64_t *ids[T];
  for (uint32_t t = 0; t < T; t++) ids[t] = malloc((size_t)max_batch * HOT[t] * sizeof(uint64_t));
  float *emb = malloc((size_t)max_batch * width * sizeof(float)), *got = malloc((size_t)max_batch * width * sizeof(float));
  float *demb = malloc((size_t)max_batch * width * sizeof(float));
  const uint32_t ns[3] = {300, 173, 257}; /* none a multiple of 256 but 257 > 256, a smaller batch after a larger */
  for (int s = 0; s < 3; s++) {
    uint32_t n = ns[s];
    for (uint32_t t = 0; t < T; t++)
      for (size_t k = 0; k < (size_t)n * HOT[t]; k++) ids[t][k] = irand(ROWS[t]);
    ids[1][0] = ids[1][1] = ids[1][2]; /* the same row three times in sample 0 */
    const uint64_t *const *idx = (const uint64_t *const *)ids;
    /* forward */
    assert_int_equal(embdev_fwd(e, md, n, idx, 1), 0);
    embag_fwd(eb, NULL, n, ref, rf, idx, NULL, emb);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, model_dev_emb_dev(md), (size_t)n * width * sizeof(float), cudaMemcpyDeviceToHost),
                     cudaSuccess);
    same("pooled (step)", (uint32_t)s, got, emb, (size_t)n * width);
    /* backward from the same gradient */
    for (size_t k = 0; k < (size_t)n * width; k++) demb[k] = urand();
    assert_int_equal(cudaMemcpy(model_dev_demb_dev(md), demb, (size_t)n * width * sizeof(float), cudaMemcpyHostToDevice),
                     cudaSuccess);
    rc = embdev_bwd_update(e, md, n, idx);
    if (rc) print_error("embdev_bwd_update: %s\n", embdev_error(e));
    assert_int_equal(rc, 0);
    embag_bwd_update(eb, NULL, n, demb, idx, NULL, ref, rf, kind, &hp);
    size_t changed = compare_rows(e, &l, ref, rf, "rows after the update");
    assert_true(changed > 100);
  }
  /* a backward without its forward is refused */
  assert_int_equal(embdev_bwd_update(e, md, 10, (const uint64_t *const *)ids), -EINVAL);
  char nerr[512];
  assert_int_equal(nn_cuda_error(nerr, sizeof nerr), 0);
  for (uint32_t t = 0; t < T; t++) {
    free(ids[t]);
    free(ref[t]);
  }
  free(ref);
  free(emb);
  free(got);
  free(demb);
  embag_destroy(eb);
  embdev_destroy(e);
  model_dev_destroy(md);
  table_layout_close(&l);
}

static void test_gpu_sgd(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 1;
  check_steps(OPT_SGD, 5, EMBDEV_AUTO, T);
  check_steps(OPT_SGD, 20, EMBDEV_AUTO, T);
}

static void test_gpu_adagrad(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 2;
  check_steps(OPT_ADAGRAD, 5, EMBDEV_AUTO, T);
  check_steps(OPT_ADAGRAD, 20, EMBDEV_AUTO, T);
}

static void test_gpu_rowwise_adagrad(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 3;
  check_steps(OPT_ROWWISE_ADAGRAD, 5, EMBDEV_AUTO, T);
  check_steps(OPT_ROWWISE_ADAGRAD, 16, EMBDEV_AUTO, T);
  check_steps(OPT_ROWWISE_ADAGRAD, 20, EMBDEV_AUTO, T);
}

/* The budget leaves the largest table (1000 rows) on the host, then all. */
static void test_gpu_host_tables(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 4;
  for (int k = 0; k < 3; k++) {
    opt_kind_t kind = (opt_kind_t)k;
    uint32_t dim = 6, rf = dim + opt_row_state_floats(kind, dim);
    int64_t small = (int64_t)(50 + 7 + 300 + 3) * rf * 4; /* every table but the 1000-row one */
    check_steps(kind, dim, small, T - 1);
    check_steps(kind, dim, small - 1, T - 2); /* the 300-row one no longer fits either */
    check_steps(kind, dim, 0, 0);
  }
  /* which ones */
  table_layout_t l;
  layout_of(&l, T, ROWS, 4, OPT_SGD);
  opt_hparams_t hp = {.lr = 0.1f};
  embdev_t *e = NULL;
  char err[1024];
  assert_int_equal(embdev_create(&l, HOT, 16, OPT_SGD, &hp, (50 + 7 + 300 + 3) * 16, &e, err, sizeof err), 0);
  assert_true(embdev_on_device(e, 0) && !embdev_on_device(e, 1) && embdev_on_device(e, 2) && embdev_on_device(e, 3) &&
              embdev_on_device(e, 4));
  assert_int_equal(embdev_device_bytes(e), (50 + 7 + 300 + 3) * 16);
  embdev_destroy(e);
  table_layout_close(&l);
}

/* The whole step: embdev_train_step (GPU model, device tables) against
 * embag_train_step (CPU model, host tables) from the same start: the
 * losses and rows agree up to cuBLAS's last bits; two GPU runs agree
 * bit for bit. */
static void test_gpu_train_step(void **state) {
  (void)state;
  if (!have_device()) skip();
  enum { N = 300, STEPS = 4 };
  uint32_t dim = 8;
  opt_kind_t kind = OPT_ROWWISE_ADAGRAD;
  uint32_t rf = dim + opt_row_state_floats(kind, dim);
  table_layout_t l;
  layout_of(&l, T, ROWS, dim, kind);
  opt_hparams_t hp = {.lr = 0.1f, .eps = 1e-8f}, dhp = {.lr = 0.1f};
  uint64_t *ids[STEPS][T];
  float *dense = malloc(N * 3 * sizeof(float)), *labels = malloc(N * sizeof(float));
  rng_state = 9;
  for (int s = 0; s < STEPS; s++)
    for (uint32_t t = 0; t < T; t++) {
      ids[s][t] = malloc((size_t)N * HOT[t] * sizeof(uint64_t));
      for (size_t k = 0; k < (size_t)N * HOT[t]; k++) ids[s][t][k] = irand(ROWS[t]);
    }
  for (int i = 0; i < N * 3; i++) dense[i] = urand();
  for (int i = 0; i < N; i++) labels[i] = irand(2) ? 1.0f : 0.0f;
  /* the CPU reference */
  float **ref = ref_tables(&l, rf);
  model_dev_t *cpu = model_on(T, dim, N, "cpu");
  opt_t *co = NULL;
  assert_int_equal(opt_create_kind(OPT_SGD, &dhp, model_dev_n_params(cpu), &co), 0);
  embag_t *eb = NULL;
  assert_int_equal(embag_create(T, HOT, dim, N, &eb), 0);
  double cpu_loss[STEPS], gpu_loss[2][STEPS];
  for (int s = 0; s < STEPS; s++)
    cpu_loss[s] = embag_train_step(eb, cpu, co, kind, &hp, ref, rf, N, dense, labels,
                                   (const uint64_t *const *)ids[s], 1.0f / N, NULL);
  float *rows[2][T];
  for (int run = 0; run < 2; run++) {
    model_dev_t *md = model_on(T, dim, N, "cuda");
    opt_t *o = NULL;
    assert_int_equal(opt_create_kind(OPT_SGD, &dhp, model_dev_n_params(md), &o), 0);
    embdev_t *e = NULL;
    char err[1024] = "";
    assert_int_equal(embdev_create(&l, HOT, N, kind, &hp, EMBDEV_AUTO, &e, err, sizeof err), 0);
    double sec[EMBAG_PHASES] = {0};
    for (int s = 0; s < STEPS; s++) {
      gpu_loss[run][s] = embdev_train_step(e, md, o, N, dense, labels, (const uint64_t *const *)ids[s], 1.0f / N,
                                           run ? sec : NULL);
      if (isnan(gpu_loss[run][s])) print_error("step %d: %s\n", s, embdev_error(e));
      assert_false(isnan(gpu_loss[run][s]));
      assert_true(fabs(gpu_loss[run][s] - cpu_loss[s]) <= 1e-4 * fabs(cpu_loss[s]));
    }
    for (int k = 0; k < EMBAG_PHASES; k++) assert_true(sec[k] >= 0);
    for (uint32_t t = 0; t < T; t++) {
      rows[run][t] = malloc(ROWS[t] * rf * sizeof(float));
      assert_int_equal(embdev_read_rows(e, t, 0, ROWS[t], rows[run][t]), 0);
      for (size_t k = 0; k < ROWS[t] * rf; k++)
        if (!(fabs((double)rows[run][t][k] - ref[t][k]) <= 1e-5 + 1e-3 * fabs((double)ref[t][k]))) {
          print_error("table %u [%zu]: GPU %.9g CPU %.9g\n", t, k, rows[run][t][k], ref[t][k]);
          fail();
        }
    }
    /* evaluation's path: pooled on the device, the model's logits */
    assert_int_equal(embdev_fwd(e, md, N, (const uint64_t *const *)ids[0], 0), 0);
    assert_int_equal(model_dev_forward(md, N, dense, model_dev_emb_dev(md), embdev_logits(e)), 0);
    for (int i = 0; i < N; i++) assert_false(isnan(embdev_logits(e)[i]));
    embdev_destroy(e);
    opt_destroy(o);
    model_dev_destroy(md);
  }
  for (int s = 0; s < STEPS; s++) assert_true(gpu_loss[0][s] == gpu_loss[1][s]);
  for (uint32_t t = 0; t < T; t++) {
    assert_memory_equal(rows[0][t], rows[1][t], ROWS[t] * rf * sizeof(float));
    free(rows[0][t]);
    free(rows[1][t]);
    free(ref[t]);
  }
  for (int s = 0; s < STEPS; s++)
    for (uint32_t t = 0; t < T; t++) free(ids[s][t]);
  free(ref);
  free(dense);
  free(labels);
  embag_destroy(eb);
  opt_destroy(co);
  model_dev_destroy(cpu);
  table_layout_close(&l);
}

/* ------------------------------------------------------------ embdev_set (a partitioned table's owner) */

static void test_set_refuses_without_device(void **state) {
  (void)state;
  if (have_device()) skip();
  const uint64_t rows[2] = {10, 20};
  const uint32_t hot[2] = {1, 2}, col[2] = {1, 0}, bad_col[2] = {1, 2};
  opt_hparams_t hp = {.lr = 0.1f, .eps = 1e-8f};
  embdev_set_t *s = (embdev_set_t *)&s;
  char err[1024] = "";
  /* bad arguments first: adam, a column outside the layout, no tables */
  assert_int_equal(embdev_set_create(2, rows, NULL, hot, col, 8, 4, OPT_ADAM, &hp, &s, err, sizeof err), -EINVAL);
  assert_null(s);
  assert_non_null(strstr(err, "adam"));
  assert_int_equal(embdev_set_create(2, rows, NULL, hot, bad_col, 8, 4, OPT_SGD, &hp, &s, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "outside"));
  assert_int_equal(embdev_set_create(0, rows, NULL, hot, col, 8, 4, OPT_SGD, &hp, &s, err, sizeof err), -EINVAL);
  /* then the device */
  assert_int_equal(embdev_set_create(2, rows, NULL, hot, col, 8, 4, OPT_SGD, &hp, &s, err, sizeof err), ERR_NOGPU);
  assert_null(s);
}

/* The set's table k is table k of T (ROWS / HOT), its columns at COL[k] of
 * a layout of W = 7 columns (two never written); table 2 has one extra row
 * of zeros past lim (partition_rows' placeholder), which ids use and the
 * update must leave alone. */
static const uint32_t COL[T] = {4, 0, 6, 2, 5};
enum { W = 7 };

/* rows updated by check_set's CPU reference (the placeholder skipped) */
typedef struct set_ref_s {
  opt_kind_t kind;
  const opt_hparams_t *hp;
  uint32_t dim;
  const uint64_t *lim;
  size_t updated;
} set_ref_t;

static void set_ref_row(void *ud, uint32_t t, uint64_t r, float *row, const float *grad) {
  set_ref_t *c = ud;
  if (r >= c->lim[t]) return;
  opt_row_update(c->kind, c->hp, row, c->dim, grad);
  c->updated++;
}

static void check_set(opt_kind_t kind, uint32_t dim) {
  uint32_t rf = dim + opt_row_state_floats(kind, dim), max_batch = 300;
  size_t wf = (size_t)W * dim, pf = (size_t)T * dim;
  uint64_t rows[T], lim[T];
  for (uint32_t k = 0; k < T; k++) rows[k] = lim[k] = ROWS[k];
  rows[2] = lim[2] + 1; /* the row of zeros */
  table_layout_t l;
  layout_of(&l, T, ROWS, dim, kind);
  opt_hparams_t hp = {.lr = 0.3f, .eps = 1e-3f};
  embdev_set_t *s = NULL;
  char err[1024] = "";
  int rc = embdev_set_create(T, rows, lim, HOT, COL, (uint32_t)wf, dim, kind, &hp, &s, err, sizeof err);
  if (rc) print_error("embdev_set_create: %s\n", err);
  assert_int_equal(rc, 0);
  /* the reference rows (the placeholder: zeros), written to the device in
   * two calls, in a shuffled order, tables interleaved */
  float *ref[T];
  size_t all = 0;
  for (uint32_t k = 0; k < T; k++) {
    ref[k] = calloc(rows[k] * rf, sizeof(float));
    assert_non_null(ref[k]);
    for (uint64_t r = 0; r < lim[k]; r++) table_init_row(&l, TABLE_KEY(k, r), ref[k] + r * rf);
    all += lim[k];
  }
  uint32_t *wt = malloc(all * sizeof *wt);
  uint64_t *wa = malloc(all * sizeof *wa);
  float *wr = malloc(all * rf * sizeof(float));
  size_t m = 0;
  for (uint32_t k = 0; k < T; k++)
    for (uint64_t r = 0; r < lim[k]; r++) wt[m] = k, wa[m] = r, m++;
  for (size_t i = m; i > 1; i--) { /* Fisher-Yates */
    size_t j = irand(i), a = i - 1;
    uint32_t tt = wt[a];
    uint64_t ta = wa[a];
    wt[a] = wt[j], wa[a] = wa[j], wt[j] = tt, wa[j] = ta;
  }
  for (size_t i = 0; i < m; i++) memcpy(wr + i * rf, ref[wt[i]] + wa[i] * rf, rf * sizeof(float));
  assert_int_equal(embdev_set_write_rows(s, m / 2, wt, wa, wr), 0);
  assert_int_equal(embdev_set_write_rows(s, m - m / 2, wt + m / 2, wa + m / 2, wr + (m / 2) * rf), 0);
  const uint32_t bad_t = T;
  assert_int_equal(embdev_set_write_rows(s, 1, &bad_t, wa, wr), -EINVAL);
  embag_t *eb = NULL;
  assert_int_equal(embag_create_tables(T, HOT, dim, max_batch, &eb), 0);
  uint64_t *ids[T];
  for (uint32_t k = 0; k < T; k++) ids[k] = malloc((size_t)max_batch * HOT[k] * sizeof(uint64_t));
  float *emb = malloc((size_t)max_batch * pf * sizeof(float)), *got = malloc((size_t)max_batch * wf * sizeof(float));
  float *g = malloc((size_t)max_batch * wf * sizeof(float)), *gp = malloc((size_t)max_batch * pf * sizeof(float));
  float *d_out = NULL, *d_g = NULL, *back = malloc(1001 * rf * sizeof(float));
  assert_int_equal(cudaMalloc((void **)&d_out, (size_t)max_batch * wf * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMalloc((void **)&d_g, (size_t)max_batch * wf * sizeof(float)), cudaSuccess);
  const uint32_t ns[4] = {173, 300, 257, 64}; /* a larger batch after a smaller one grows the buffers */
  for (int st = 0; st < 4; st++) {
    uint32_t n = ns[st];
    int on_host = st & 1; /* odd steps: through the host buffers */
    for (uint32_t k = 0; k < T; k++)
      for (size_t j = 0; j < (size_t)n * HOT[k]; j++) ids[k][j] = irand(rows[k]); /* the placeholder too */
    ids[1][0] = ids[1][1] = ids[1][2];
    const uint64_t *const *idx = (const uint64_t *const *)ids;
    /* pool: the set's columns == embag's; the other columns untouched */
    assert_int_equal(cudaMemset(d_out, 0xff, (size_t)n * wf * sizeof(float)), cudaSuccess);
    memset(got, 0xff, (size_t)n * wf * sizeof(float));
    rc = embdev_set_pool(s, n, idx, on_host ? NULL : d_out, got, 1);
    if (rc) print_error("embdev_set_pool: %s\n", embdev_set_error(s));
    assert_int_equal(rc, 0);
    if (!on_host)
      assert_int_equal(cudaMemcpy(got, d_out, (size_t)n * wf * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    embag_fwd(eb, NULL, n, ref, rf, idx, NULL, emb);
    for (uint32_t i = 0; i < n; i++)
      for (uint32_t k = 0; k < T; k++)
        same("pooled (set)", k, got + i * wf + (size_t)COL[k] * dim, emb + i * pf + (size_t)k * dim, dim);
    if (!on_host) /* columns 1 and 3 are no table's */
      for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, got + i * wf + 1 * dim, 4);
        assert_int_equal(u, 0xffffffffu);
        memcpy(&u, got + i * wf + 3 * dim, 4);
        assert_int_equal(u, 0xffffffffu);
      }
    /* fold + update from the same strided gradient */
    for (size_t j = 0; j < (size_t)n * wf; j++) g[j] = urand();
    for (uint32_t i = 0; i < n; i++)
      for (uint32_t k = 0; k < T; k++) memcpy(gp + i * pf + (size_t)k * dim, g + i * wf + (size_t)COL[k] * dim, dim * 4);
    if (!on_host)
      assert_int_equal(cudaMemcpy(d_g, g, (size_t)n * wf * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    rc = embdev_set_fold(s, n, on_host ? NULL : d_g, g);
    if (rc) print_error("embdev_set_fold: %s\n", embdev_set_error(s));
    assert_int_equal(rc, 0);
    size_t upd = 0;
    assert_int_equal(embdev_set_sync(s, &upd), 0);
    set_ref_t c = {.kind = kind, .hp = &hp, .dim = dim, .lim = lim};
    embag_bwd_each(eb, NULL, n, gp, idx, NULL, ref, rf, set_ref_row, &c);
    assert_int_equal(upd, c.updated);
    assert_true(upd > 100);
    for (uint32_t k = 0; k < T; k++) {
      assert_int_equal(embdev_set_read_rows(s, k, 0, rows[k], back), 0);
      same("rows after the update (set)", k, back, ref[k], rows[k] * rf);
    }
    for (uint32_t f = 0; f < rf; f++) assert_true(ref[2][lim[2] * rf + f] == 0.0f); /* the placeholder stayed zero */
  }
  /* a fold without its pool, and rows out of range, are refused */
  assert_int_equal(embdev_set_fold(s, 10, d_g, NULL), -EINVAL);
  assert_int_equal(embdev_set_read_rows(s, 0, 1, rows[0], back), -EINVAL);
  assert_true(embdev_set_bytes(s) > 0);
  cudaFree(d_out);
  cudaFree(d_g);
  for (uint32_t k = 0; k < T; k++) {
    free(ids[k]);
    free(ref[k]);
  }
  free(wt), free(wa), free(wr), free(emb), free(got), free(g), free(gp), free(back);
  embag_destroy(eb);
  embdev_set_destroy(s);
  table_layout_close(&l);
}

static void test_gpu_set(void **state) {
  (void)state;
  if (!have_device()) skip();
  rng_state = 11;
  check_set(OPT_SGD, 5);
  check_set(OPT_ADAGRAD, 20);
  check_set(OPT_ROWWISE_ADAGRAD, 16);
  check_set(OPT_ROWWISE_ADAGRAD, 33);
}

#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_smallest_first),
      cmocka_unit_test(test_budget),
#ifdef CHANTER_CUDA
      cmocka_unit_test(test_refuses_without_device),
      cmocka_unit_test(test_gpu_sgd),
      cmocka_unit_test(test_gpu_adagrad),
      cmocka_unit_test(test_gpu_rowwise_adagrad),
      cmocka_unit_test(test_gpu_host_tables),
      cmocka_unit_test(test_gpu_train_step),
      cmocka_unit_test(test_set_refuses_without_device),
      cmocka_unit_test(test_gpu_set),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
