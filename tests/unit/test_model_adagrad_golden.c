/*
 * model = dlrm_dcn and Adagrad against an independent reference: the
 * golden file tests/golden/adagrad_dlrm_dcn.txt, computed in float64 by
 * tests/golden/make_adagrad_golden.py (numpy alone; its header says how,
 * and defines the model and the optimizers as MLPerf DLRMv2's reference
 * does: PyTorch's Adagrad for the dense parameters, FBGEMM's exact and
 * row-wise Adagrad for the rows).
 *
 * The same inputs and initial parameters go through the path `chanter
 * train --local` runs: embag (pooling, the per-row fold), model_dev on the
 * CPU, then embag_train_step (the dense optimizer and the row optimizer).
 * Checked: the forward's logits, the mean loss, every dense gradient, every
 * row's batch-summed gradient, and the parameters and rows (with their
 * optimizer state) after two Adagrad steps, for element-wise and row-wise
 * row Adagrad and for eps = 1e-8 and 1e-2, on the CPU and, where a GPU
 * is present, with device = cuda.  Every value agrees within
 * 1e-5 relative, float32 against float64, or 1e-6 absolute near 0 (a
 * value of order 0.1 that two updates carry to ~1e-4 keeps the float32
 * rounding of its O(0.1) terms).
 */
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
#include "model_dev.h"
#include "opt.h"
#include "testutil.h"

enum { B = 3, ND = 2, NT = 2, DIM = 4, ROWS = 5, NSEC = 64 };
static const uint32_t HOT[NT] = {2, 1};

/* ---- the golden file: sections "name count" then count numbers */
typedef struct sec_s {
  char name[256];
  size_t n;
  double *v;
} sec_t;
static sec_t secs[NSEC];
static size_t n_secs;

static const sec_t *sec(const char *name, size_t want) {
  for (size_t i = 0; i < n_secs; i++)
    if (strcmp(secs[i].name, name) == 0) {
      if (secs[i].n != want) fail_msg("golden section %s has %zu values, expected %zu", name, secs[i].n, want);
      return &secs[i];
    }
  fail_msg("golden section %s missing", name);
  return NULL;
}

static FILE *open_golden(void) {
  char path[1024];
  /* from the source tree (make runs tests from the repository root), or
   * next to the build directory */
  snprintf(path, sizeof path, "%.*s/../golden/adagrad_dlrm_dcn.txt",
           (int)(strrchr(__FILE__, '/') ? strrchr(__FILE__, '/') - __FILE__ : 1), __FILE__);
  FILE *f = fopen(path, "r");
  const char *b = getenv("CHANTER_BUILD");
  if (!f && b) {
    snprintf(path, sizeof path, "%s/../tests/golden/adagrad_dlrm_dcn.txt", b);
    f = fopen(path, "r");
  }
  if (!f) fail_msg("cannot open tests/golden/adagrad_dlrm_dcn.txt (run from the repository root)");
  return f;
}

static int load(void **state) {
  (void)state;
  FILE *f = open_golden();
  char line[256];
  while (fscanf(f, " %255s", line) == 1) {
    if (line[0] == '#') {
      if (!fgets(line, sizeof line, f)) break; /* the rest of the comment */
      while (!strchr(line, '\n') && fgets(line, sizeof line, f)) {
      }
      continue;
    }
    assert_true(n_secs < NSEC);
    sec_t *s = &secs[n_secs++];
    snprintf(s->name, sizeof s->name, "%s", line);
    assert_int_equal(fscanf(f, "%zu", &s->n), 1);
    s->v = malloc((s->n ? s->n : 1) * sizeof(double));
    for (size_t i = 0; i < s->n; i++) assert_int_equal(fscanf(f, "%lf", &s->v[i]), 1);
  }
  fclose(f);
  assert_true(n_secs > 10);
  return 0;
}

static int unload(void **state) {
  (void)state;
  for (size_t i = 0; i < n_secs; i++) free(secs[i].v);
  n_secs = 0;
  return 0;
}

static void agree(const char *what, const float *got, const double *want, size_t n, size_t stride_got,
                  size_t stride_want, size_t width) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < width; j++) {
      double a = got[i * stride_got + j], b = want[i * stride_want + j];
      if (!(fabs(a - b) <= 1e-5 * fabs(b) + 1e-6)) {
        print_error("%s[%zu][%zu]: chanter %.9g golden %.9g\n", what, i, j, a, b);
        fail();
      }
    }
}

/* ---- the job: the model and optimizers of the golden file */

typedef struct fix_s {
  cfg_t *cfg;
  model_dev_t *md;
  embag_t *e;
  float dense[B * ND], labels[B];
  uint64_t ids[NT][B * 2];
  const uint64_t *idx[NT];
  float *tables[NT];
  size_t stride; /* floats per row: DIM + the row optimizer's state */
} fix_t;

/* device = cpu, or cuda (the same checks where a GPU is present; those
 * tests skip without one) */
static const char *g_device = "cpu";

/* 0, or 1 when device = cuda has no GPU here (the caller skips). */
static int fix_init(fix_t *x, const char *row_opt, double eps) {
  char e[64];
  snprintf(e, sizeof e, "adagrad_eps=%.17g", eps);
  const char *sets[] = {"model=dlrm_dcn", "model.bottom_mlp=4", "model.top_mlp=4", "model.cross_layers=2",
                        "model.cross_rank=2", "optimizer=adagrad", "learning_rate=0.1", "adagrad_init=0", e, NULL};
  memset(x, 0, sizeof *x);
  x->cfg = testutil_cfg_of(sets);
  char err[256], kv[64];
  snprintf(kv, sizeof kv, "embedding_optimizer=%s", row_opt);
  assert_int_equal(cfg_set(x->cfg, kv, "test", err, sizeof err), 0);
  snprintf(kv, sizeof kv, "device=%s", g_device);
  assert_int_equal(cfg_set(x->cfg, kv, "test", err, sizeof err), 0);
  assert_near(cfg_float(x->cfg, "learning_rate"), sec("lr", 1)->v[0], 1e-12);
  int rc = model_dev_create(x->cfg, ND, NT, DIM, B, &x->md, err, sizeof err);
  if (rc == ERR_NOGPU) {
    cfg_destroy(x->cfg);
    return 1;
  }
  if (rc) print_error("model_dev_create: %s\n", err);
  assert_int_equal(rc, 0);
  const sec_t *p = sec("params", model_dev_n_params(x->md));
  float *params = model_dev_params(x->md);
  for (size_t i = 0; i < p->n; i++) params[i] = (float)p->v[i];
  assert_int_equal(model_dev_params_changed(x->md), 0);
  assert_int_equal(embag_create(NT, HOT, DIM, B, &x->e), 0);
  const sec_t *d = sec("dense", B * ND), *l = sec("labels", B);
  for (size_t i = 0; i < B * ND; i++) x->dense[i] = (float)d->v[i];
  for (size_t i = 0; i < B; i++) x->labels[i] = (float)l->v[i];
  opt_kind_t k;
  assert_int_equal(opt_kind_parse(row_opt, &k), 0);
  x->stride = DIM + opt_row_state_floats(k, DIM);
  for (uint32_t t = 0; t < NT; t++) {
    char name[16];
    snprintf(name, sizeof name, "ids%u", t);
    const sec_t *s = sec(name, B * HOT[t]);
    for (size_t i = 0; i < s->n; i++) x->ids[t][i] = (uint64_t)s->v[i];
    x->idx[t] = x->ids[t];
    snprintf(name, sizeof name, "table%u", t);
    s = sec(name, ROWS * DIM);
    x->tables[t] = calloc(ROWS * x->stride, sizeof(float)); /* state 0: the initial accumulator */
    for (size_t r = 0; r < ROWS; r++)
      for (size_t j = 0; j < DIM; j++) x->tables[t][r * x->stride + j] = (float)s->v[r * DIM + j];
  }
  return 0;
}

static void fix_close(fix_t *x) {
  for (uint32_t t = 0; t < NT; t++) free(x->tables[t]);
  embag_destroy(x->e);
  model_dev_destroy(x->md);
  cfg_destroy(x->cfg);
}

/* ---- forward and backward */

static void test_forward_backward(void **state) {
  (void)state;
  fix_t x;
  if (fix_init(&x, "adagrad", 1e-8)) skip();
  float logits[B];
  embag_fwd(x.e, NULL, B, x.tables, x.stride, x.idx, NULL, embag_emb(x.e));
  assert_int_equal(model_dev_forward(x.md, B, x.dense, embag_emb(x.e), logits), 0);
  agree("logits", logits, sec("logits", B)->v, 1, 0, 0, B);
  double loss = model_dev_backward(x.md, B, x.labels, 1.0f / B, embag_d_emb(x.e)) / B;
  assert_true(fabs(loss - sec("loss", 1)->v[0]) <= 1e-5 * fabs(sec("loss", 1)->v[0]));
  size_t np = model_dev_n_params(x.md);
  agree("dense grads", model_dev_grads(x.md), sec("grads", np)->v, 1, 0, 0, np);
  embag_bwd(x.e, NULL, B, embag_d_emb(x.e), x.idx, NULL);
  for (uint32_t t = 0; t < NT; t++) {
    char name[16];
    snprintf(name, sizeof name, "rowgrad%u", t);
    const double *want = sec(name, ROWS * DIM)->v;
    const uint64_t *uniq;
    const float *grad;
    uint32_t nu = embag_table(x.e, t, &uniq, &grad);
    int seen[ROWS] = {0};
    for (uint32_t k = 0; k < nu; k++) {
      assert_true(uniq[k] < ROWS);
      seen[uniq[k]] = 1;
      agree(name, grad + (size_t)k * DIM, want + uniq[k] * DIM, 1, 0, 0, DIM);
    }
    for (uint32_t r = 0; r < ROWS; r++) /* a row the batch does not use has no gradient */
      if (!seen[r])
        for (uint32_t j = 0; j < DIM; j++) assert_true(want[r * DIM + j] == 0.0);
    assert_true(nu >= 2);
  }
  fix_close(&x);
}

/* ---- two optimizer steps */

static void check_steps(const char *row_opt, uint32_t eps_i) {
  const double eps = sec("eps", 2)->v[eps_i];
  fix_t x;
  if (fix_init(&x, row_opt, eps)) skip();
  opt_t *o = NULL;
  assert_int_equal(opt_create(x.cfg, model_dev_n_params(x.md), &o), 0);
  assert_int_equal(opt_kind(o), OPT_ADAGRAD);
  assert_true(opt_hparams(o)->adagrad_init == 0.0f && opt_hparams(o)->eps == (float)eps);
  opt_kind_t k;
  assert_int_equal(opt_kind_parse(row_opt, &k), 0);
  opt_hparams_t hp;
  opt_hparams_from_cfg(x.cfg, k, &hp);
  for (int s = 0; s < 2; s++) {
    double l = embag_train_step(x.e, x.md, o, k, &hp, x.tables, x.stride, B, x.dense, x.labels, x.idx, 1.0f / B,
                                NULL);
    assert_false(isnan(l));
  }
  char name[96];
  size_t np = model_dev_n_params(x.md);
  snprintf(name, sizeof name, "after2.%s.eps%u.params", row_opt, eps_i);
  agree(name, model_dev_params(x.md), sec(name, np)->v, 1, 0, 0, np);
  for (uint32_t t = 0; t < NT; t++) {
    snprintf(name, sizeof name, "after2.%s.eps%u.table%u", row_opt, eps_i, t);
    agree(name, x.tables[t], sec(name, ROWS * x.stride)->v, ROWS, x.stride, x.stride, x.stride);
  }
  opt_destroy(o);
  fix_close(&x);
}

static void test_adagrad_rows_elementwise(void **state) {
  (void)state;
  check_steps("adagrad", 0);
  check_steps("adagrad", 1);
}

static void test_adagrad_rows_rowwise(void **state) {
  (void)state;
  check_steps("rowwise_adagrad", 0);
  check_steps("rowwise_adagrad", 1);
}

static int on_cuda(void **state) {
  (void)state;
  g_device = "cuda";
  return 0;
}

static int on_cpu(void **state) {
  (void)state;
  g_device = "cpu";
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_forward_backward, on_cpu, NULL),
      cmocka_unit_test_setup_teardown(test_adagrad_rows_elementwise, on_cpu, NULL),
      cmocka_unit_test_setup_teardown(test_adagrad_rows_rowwise, on_cpu, NULL),
      /* the same on the GPU (skipped without one) */
      cmocka_unit_test_setup_teardown(test_forward_backward, on_cuda, on_cpu),
      cmocka_unit_test_setup_teardown(test_adagrad_rows_elementwise, on_cuda, on_cpu),
      cmocka_unit_test_setup_teardown(test_adagrad_rows_rowwise, on_cuda, on_cpu),
  };
  return cmocka_run_group_tests(tests, load, unload);
}
