/* Unit tests of the synthetic generator (dataset = synthetic and `chanter
 * data gen`): determinism, synthetic == the generated files, the skew
 * controls (Zipf alpha, hot share) measured against what was asked, the
 * planted signal (learnable), and data_profile's figures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_internal.h"
#include "err.h"
#include "log.h"
#include "testutil.h"

static char dir[64];

static const char *path_of(const char *name) {
  static char p[4][160];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)l + 1);
  assert_int_equal(fread(b, 1, (size_t)l, f), (size_t)l);
  fclose(f);
  *n = (size_t)l;
  return b;
}

static void assert_same_file(const char *a, const char *b, int same) {
  size_t na, nb;
  char *x = read_file(a, &na), *y = read_file(b, &nb);
  if (same) {
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
  } else {
    assert_true(na != nb || memcmp(x, y, na) != 0);
  }
  free(x);
  free(y);
}

static int setup(void **st) {
  (void)st;
  assert_int_equal(testutil_tmpdir(dir, sizeof dir, "test-gen"), 0);
  log_level = LOG_WARN;
  return 0;
}

static int teardown(void **st) {
  (void)st;
  return testutil_rmtree(dir);
}

static void assert_batches_equal(const data_batch_t *a, const data_batch_t *b) {
  assert_int_equal(a->n, b->n);
  assert_memory_equal(a->labels, b->labels, a->n * sizeof(float));
  if (a->n_dense) assert_memory_equal(a->dense, b->dense, (size_t)a->n * a->n_dense * sizeof(float));
  assert_memory_equal(a->ids_off, b->ids_off, (a->n_tables + 1) * sizeof(size_t));
  assert_memory_equal(a->ids, b->ids, a->ids_off[a->n_tables] * sizeof(uint64_t));
}

static void compare_sources(data_source_t *x, data_source_t *y) {
  static const uint32_t bss[] = {1, 100, 777, 4096};
  static const uint64_t xs[] = {0, 2, 9, 12345};
  char err[512];
  assert_int_equal(data_samples(x), data_samples(y));
  for (int split = DATA_TRAIN; split <= DATA_ALL; split++)
    for (size_t i = 0; i < sizeof bss / sizeof bss[0]; i++)
      for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        data_batch_t a, b;
        assert_int_equal(data_read_batch(x, split, xs[k], bss[i], &a, err, sizeof err), 0);
        assert_int_equal(data_read_batch(y, split, xs[k], bss[i], &b, err, sizeof err), 0);
        assert_batches_equal(&a, &b);
        data_batch_free(&a);
        data_batch_free(&b);
      }
}

/* ---- determinism, synthetic == file ---- */

static void test_same_seed_same_bytes(void **st) {
  (void)st;
  char err[512];
  cfg_t *c = testutil_cfg("synthetic.samples=3000", NULL), *c43 = testutil_cfg("synthetic.samples=3000", "seed=43", NULL);
  assert_int_equal(data_gen(c, path_of("a.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), 0);
  assert_int_equal(data_gen(c, path_of("b.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), 0);
  assert_int_equal(data_gen(c43, path_of("c.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), 0);
  assert_same_file(path_of("a.tsv"), path_of("b.tsv"), 1);
  assert_same_file(path_of("a.tsv"), path_of("c.tsv"), 0);
  assert_int_equal(data_gen(c, path_of("a.bin"), DATA_FMT_BINARY, 0, err, sizeof err), 0);
  assert_int_equal(data_gen(c, path_of("b.bin"), DATA_FMT_BINARY, 0, err, sizeof err), 0);
  assert_int_equal(data_gen(c43, path_of("c.bin"), DATA_FMT_BINARY, 0, err, sizeof err), 0);
  assert_same_file(path_of("a.bin"), path_of("b.bin"), 1);
  assert_same_file(path_of("a.bin"), path_of("c.bin"), 0);
  /* converting the TSV gives the very bytes written directly */
  assert_int_equal(data_convert(c, path_of("a.tsv"), path_of("conv.bin"), NULL, err, sizeof err), 0);
  assert_same_file(path_of("a.bin"), path_of("conv.bin"), 1);
  /* sample i does not depend on how many are generated */
  assert_int_equal(data_gen(c, path_of("short.tsv"), DATA_FMT_CRITEO, 1000, err, sizeof err), 0);
  size_t na, ns;
  char *a = read_file(path_of("a.tsv"), &na), *s = read_file(path_of("short.tsv"), &ns);
  assert_true(ns < na);
  assert_memory_equal(a, s, ns);
  /* looks like Criteo: 40 tab-separated fields, 8 hex digits */
  char *nl = memchr(a, '\n', na);
  int tabs = 0;
  for (char *p = a; p < nl; p++) tabs += *p == '\t';
  assert_int_equal(tabs, 39);
  char *last = nl;
  while (last[-1] != '\t') last--;
  assert_int_equal(nl - last, 8);
  free(a);
  free(s);
  cfg_destroy(c);
  cfg_destroy(c43);
}

static void test_synthetic_equals_file(void **st) {
  (void)st;
  char err[512];
  cfg_t *c = testutil_cfg("synthetic.samples=2500", "test_fraction=0.2", "synthetic.alpha=0.9", NULL);
  assert_int_equal(data_gen(c, path_of("g.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), 0);
  assert_int_equal(data_gen(c, path_of("g.bin"), DATA_FMT_BINARY, 0, err, sizeof err), 0);
  data_source_t *syn, *tsv, *bin;
  assert_int_equal(data_open(c, &syn, err, sizeof err), 0); /* dataset = synthetic is the default */
  assert_int_equal(data_open_path(c, path_of("g.tsv"), &tsv, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, path_of("g.bin"), &bin, err, sizeof err), 0);
  data_stats_t s;
  data_stats(syn, &s);
  assert_int_equal(s.format, DATA_FMT_SYNTHETIC);
  assert_int_equal(s.train_samples, 2000);
  assert_int_equal(s.test_samples, 500);
  compare_sources(syn, tsv);
  compare_sources(syn, bin);
  data_close(syn);
  data_close(tsv);
  data_close(bin);
  cfg_destroy(c);

  /* any schema, multi-hot: binary only */
  c = testutil_cfg("synthetic.samples=1500", "n_dense=3", "table_rows=100,5000000000,7", "table_hotness=1,3,2",
               "synthetic.hot_share=30", NULL);
  assert_int_equal(data_gen(c, path_of("m.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "multi-hot (table_hotness): use --format binary"));
  assert_int_equal(access(path_of("m.tsv"), F_OK), -1);
  assert_int_equal(data_gen(c, path_of("m.bin"), DATA_FMT_BINARY, 0, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, "synthetic", &syn, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, path_of("m.bin"), &bin, err, sizeof err), 0);
  compare_sources(syn, bin);
  data_batch_t b;
  assert_int_equal(data_read_batch(syn, DATA_TRAIN, 0, 64, &b, err, sizeof err), 0);
  assert_int_equal(b.ids_off[1], 64);
  assert_int_equal(b.ids_off[2], 64 + 3 * 64);
  assert_int_equal(b.ids_off[3], 64 + 5 * 64);
  int big = 0;
  for (size_t i = b.ids_off[1]; i < b.ids_off[2]; i++) big |= b.ids[i] > UINT32_MAX; /* 64-bit raw values */
  assert_true(big);
  for (size_t i = b.ids_off[2]; i < b.ids_off[3]; i++) assert_true(b.ids[i] < 7);
  data_batch_free(&b);
  data_close(syn);
  data_close(bin);
  cfg_destroy(c);
}

/* ---- skew ---- */

static int desc_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* counts of each row of table 0 over every sample, sorted descending */
static uint64_t *row_counts(data_source_t *d, uint64_t rows) {
  uint64_t *cnt = calloc(rows, sizeof *cnt);
  char err[256];
  data_batch_t b;
  uint64_t n = data_samples(d);
  assert_int_equal(n % 10000, 0);
  for (uint64_t x = 0; x < n / 10000; x++) {
    assert_int_equal(data_read_batch(d, DATA_ALL, x, 10000, &b, err, sizeof err), 0);
    for (size_t i = 0; i < b.ids_off[1]; i++) cnt[b.ids[i]]++;
    data_batch_free(&b);
  }
  qsort(cnt, rows, sizeof *cnt, desc_u64);
  return cnt;
}

/* least-squares slope of log(count) over log(rank), ranks [lo, hi] */
static double loglog_slope(const uint64_t *cnt, int lo, int hi) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (int r = lo; r <= hi; r++, n++) {
    double x = log(r), y = log((double)cnt[r - 1]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

/* The requested Zipf exponent is recovered from the rank-frequency curve
 * of the rows (after hashing, collisions included) within 0.08, fitting
 * ranks 1..200 of 300k accesses to a 1M-row table. */
static void test_zipf_alpha(void **st) {
  (void)st;
  static const double alphas[] = {0.7, 1.05, 1.4};
  char err[256], kv[64];
  for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
    snprintf(kv, sizeof kv, "synthetic.alpha=%g", alphas[k]);
    cfg_t *c = testutil_cfg("n_dense=0", "table_rows=1000000", "synthetic.samples=300000", kv, NULL);
    data_source_t *d;
    assert_int_equal(data_open(c, &d, err, sizeof err), 0);
    uint64_t *cnt = row_counts(d, 1000000);
    double slope = -loglog_slope(cnt, 1, 200);
    print_message("alpha %.2f: fitted %.3f (top row %.4f of accesses)\n", alphas[k], slope, cnt[0] / 300000.0);
    assert_true(fabs(slope - alphas[k]) < 0.08);
    free(cnt);
    data_close(d);
    cfg_destroy(c);
  }
  /* alpha = 0 is uniform: a flat rank-frequency curve.  (The top 1% of
   * rows take a few % rather than 1%: Poisson noise at 10 accesses per row,
   * and hash collisions give some rows two or three raw values.) */
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=20000", "synthetic.samples=200000", "synthetic.alpha=0", NULL);
  data_source_t *d;
  data_profile_t p;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  uint64_t *cnt = row_counts(d, 20000);
  double slope = -loglog_slope(cnt, 1, 200);
  free(cnt);
  assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
  print_message("alpha 0: fitted %.3f, top 1%% share %.4f, distinct %" PRIu64 "\n", slope, p.tables[0].top_1,
                p.tables[0].distinct);
  assert_true(fabs(slope) < 0.25); /* collisions and noise only; the mildest Zipf above is 0.7 */
  assert_true(p.tables[0].top_1 < 0.06);
  /* 20000 values hashed into 20000 rows: 1 - 1/e of the rows are used */
  assert_true(fabs((double)p.tables[0].distinct / 20000 - (1 - exp(-1))) < 0.01);
  data_profile_close(&p);
  data_close(d);
  cfg_destroy(c);
}

/* "the hottest 1% of rows take p% of accesses": measured top-1% share within
 * 0.015 of p (hash collisions between hot and cold values add a little). */
static void test_hot_share(void **st) {
  (void)st;
  static const double shares[] = {50, 80, 95};
  char err[256], kv[64];
  for (size_t k = 0; k < sizeof shares / sizeof shares[0]; k++) {
    snprintf(kv, sizeof kv, "synthetic.hot_share=%g", shares[k]);
    cfg_t *c = testutil_cfg("n_dense=0", "table_rows=100000,3000", "synthetic.samples=200000", kv, NULL);
    data_source_t *d;
    data_profile_t p;
    assert_int_equal(data_open(c, &d, err, sizeof err), 0);
    assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
    print_message("hot_share %g%%: top 1%% share %.4f / %.4f\n", shares[k], p.tables[0].top_1, p.tables[1].top_1);
    assert_true(fabs(p.tables[0].top_1 - shares[k] / 100) < 0.015);
    assert_true(fabs(p.tables[1].top_1 - shares[k] / 100) < 0.015);
    data_profile_close(&p);
    data_close(d);
    cfg_destroy(c);
  }
}

/* ---- the planted signal ---- */

typedef struct scored_s {
  double s;
  float y;
} scored_t;

static int by_score(const void *a, const void *b) {
  double x = ((const scored_t *)a)->s, y = ((const scored_t *)b)->s;
  return x < y ? -1 : x > y;
}

static double auc(scored_t *v, size_t n) {
  qsort(v, n, sizeof *v, by_score);
  double pos = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && v[j].s == v[i].s) j++;
    double r = (double)(i + j + 1) / 2; /* ties share the mean rank */
    for (size_t k = i; k < j; k++)
      if (v[k].y > 0) pos++, rank_sum += r;
    i = j;
  }
  double neg = (double)n - pos;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

/* Logistic regression (dense weights + one weight per row, i.e. embeddings
 * of dimension 1) trained by SGD on the train split for 400 steps of 128
 * samples beats AUC 0.7 on the test split, and the planted logit itself
 * (the Bayes-optimal score) does better still.  With signal = 0 labels do
 * not depend on the features. */
static void test_signal_learnable(void **st) {
  (void)st;
  char err[256];
  cfg_t *c = testutil_cfg("n_dense=4", "table_rows=40,40,40,40", "synthetic.samples=60000", "test_fraction=0.2", NULL);
  data_source_t *d;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  double w[4] = {0}, v[4][40] = {{0}}, bias = 0, lr = 0.1;
  data_batch_t b;
  for (uint64_t step = 0; step < 400; step++) {
    assert_int_equal(data_read_batch(d, DATA_TRAIN, step, 128, &b, err, sizeof err), 0);
    for (uint32_t j = 0; j < b.n; j++) {
      double z = bias;
      for (int k = 0; k < 4; k++) z += w[k] * b.dense[j * 4 + k] + v[k][b.ids[b.ids_off[k] + j]];
      double g = 1 / (1 + exp(-z)) - b.labels[j];
      bias -= lr * g;
      for (int k = 0; k < 4; k++) w[k] -= lr * g * b.dense[j * 4 + k], v[k][b.ids[b.ids_off[k] + j]] -= lr * g;
    }
    data_batch_free(&b);
  }
  data_stats_t s;
  data_stats(d, &s);
  assert_int_equal(data_read_batch(d, DATA_TEST, 0, (uint32_t)s.test_samples, &b, err, sizeof err), 0);
  scored_t *lr_s = calloc(b.n, sizeof *lr_s), *bayes = calloc(b.n, sizeof *bayes);
  double clicks = 0;
  for (uint32_t j = 0; j < b.n; j++) {
    double z = bias;
    for (int k = 0; k < 4; k++) z += w[k] * b.dense[j * 4 + k] + v[k][b.ids[b.ids_off[k] + j]];
    lr_s[j] = (scored_t){z, b.labels[j]};
    bayes[j] = (scored_t){data__synth_logit(d->impl, s.train_samples + j), b.labels[j]};
    clicks += b.labels[j];
  }
  double a_lr = auc(lr_s, b.n), a_bayes = auc(bayes, b.n);
  print_message("signal 1: logistic regression test AUC %.3f, planted logit AUC %.3f, click rate %.3f\n", a_lr,
                a_bayes, clicks / b.n);
  assert_true(a_lr > 0.7);
  assert_true(a_bayes >= a_lr - 0.01);
  data_batch_free(&b);
  data_close(d);
  cfg_destroy(c);

  /* signal 0: coin flips whatever the features */
  c = testutil_cfg("n_dense=4", "table_rows=40,40,40,40", "synthetic.samples=20000", "synthetic.signal=0", NULL);
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  assert_int_equal(data_read_batch(d, DATA_ALL, 0, 20000, &b, err, sizeof err), 0);
  /* score by the signal-1 logit of the same sample: no relation left */
  cfg_t *c1 = testutil_cfg("n_dense=4", "table_rows=40,40,40,40", NULL);
  data_schema_t sc;
  data_synth_t *g1;
  assert_int_equal(data_schema_from_cfg(c1, &sc, err, sizeof err), 0);
  assert_int_equal(data__synth_create(c1, &sc, &g1, err, sizeof err), 0);
  clicks = 0;
  for (uint32_t j = 0; j < b.n; j++) {
    bayes[j % 10000] = (scored_t){data__synth_logit(g1, j), b.labels[j]};
    clicks += b.labels[j];
  }
  double a0 = auc(bayes, 10000);
  print_message("signal 0: AUC %.3f, click rate %.3f\n", a0, clicks / b.n);
  assert_true(fabs(a0 - 0.5) < 0.03);
  assert_true(fabs(clicks / b.n - 0.5) < 0.02);
  data__synth_destroy(g1);
  data_schema_close(&sc);
  cfg_destroy(c1);
  data_batch_free(&b);
  data_close(d);
  cfg_destroy(c);
  free(lr_s);
  free(bayes);
}

/* ---- the default preset is today's generator, bit for bit ---- */

/* XXH3 of records 0..n-1 and of a far one of dataset = synthetic under cfg */
static uint64_t records_digest(const cfg_t *c, uint64_t n) {
  char err[512];
  data_source_t *d;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  uint8_t *scratch = malloc(d->record_bytes);
  XXH3_state_t *x = XXH3_createState();
  XXH3_64bits_reset(x);
  for (uint64_t i = 0; i <= n; i++) {
    const uint8_t *rec;
    assert_int_equal(d->ops->rec(d, i < n ? i : UINT64_C(987654321), scratch, &rec, err, sizeof err), 0);
    XXH3_64bits_update(x, rec, d->record_bytes);
  }
  uint64_t h = XXH3_64bits_digest(x);
  XXH3_freeState(x);
  free(scratch);
  data_close(d);
  return h;
}

static void test_independent_unchanged(void **st) {
  (void)st;
  /* computed with the generator before synthetic.preset existed */
  cfg_t *c = testutil_cfg("synthetic.samples=5000", NULL);
  cfg_t *ci = testutil_cfg("synthetic.samples=5000", "synthetic.preset=independent", NULL);
  cfg_t *m = testutil_cfg("n_dense=3", "table_rows=1000,70000,5", "table_hotness=1,3,2", "synthetic.alpha=0.8",
                          "seed=7", NULL);
  cfg_t *h = testutil_cfg("synthetic.hot_share=60", NULL);
  uint64_t dc = records_digest(c, 2000), di = records_digest(ci, 2000), dm = records_digest(m, 2000),
           dh = records_digest(h, 2000);
  print_message("digests %016" PRIx64 " %016" PRIx64 " %016" PRIx64 "\n", dc, dm, dh);
  assert_true(dc == UINT64_C(0x2be8099c018534ae));
  assert_true(di == UINT64_C(0x2be8099c018534ae));
  assert_true(dm == UINT64_C(0xa3cf02a93aa71b10));
  assert_true(dh == UINT64_C(0x4f4b7ecb56a6e89d));
  cfg_destroy(c);
  cfg_destroy(ci);
  cfg_destroy(m);
  cfg_destroy(h);
}

/* synthetic.table_alpha: each table draws with its own exponent.  Two
 * tables of 20000 rows, alpha 0 and 1.2: the hottest 1% of the first take
 * a few % of its accesses (uniform, as test_zipf_alpha's alpha 0), of the
 * second most of them.  A list that repeats synthetic.alpha for every table
 * gives the bytes of the empty key; a bad entry or length is refused at
 * open, naming the key and the entry. */
static void test_table_alpha(void **st) {
  (void)st;
  char err[256];
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=20000,20000", "synthetic.samples=100000",
                          "synthetic.table_alpha=0,1.2", NULL);
  data_source_t *d;
  data_profile_t p;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
  print_message("table_alpha 0,1.2: top 1%% share %.4f / %.4f\n", p.tables[0].top_1, p.tables[1].top_1);
  assert_true(p.tables[0].top_1 < 0.06);
  assert_true(p.tables[1].top_1 > 0.5);
  data_profile_close(&p);
  data_close(d);
  cfg_destroy(c);

  cfg_t *same = testutil_cfg("synthetic.samples=5000", "synthetic.table_alpha=1.05,1.05,1.05,1.05,1.05,1.05,1.05,"
                             "1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,1.05,"
                             "1.05,1.05", NULL);
  assert_true(records_digest(same, 2000) == UINT64_C(0x2be8099c018534ae)); /* test_independent_unchanged's */
  cfg_destroy(same);

  static const char *bad[][2] = {{"synthetic.table_alpha=0.5,x", "entry 2 is 'x'"},
                                 {"synthetic.table_alpha=0.5,11", "entry 2 is '11'"},
                                 {"synthetic.table_alpha=0.5,0.5,0.5", "3 values for 2 tables"}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    cfg_t *b = testutil_cfg("n_dense=0", "table_rows=100,100", bad[k][0], NULL);
    err[0] = 0;
    assert_int_equal(data_open(b, &d, err, sizeof err), ERR_CONFIG);
    print_message("%s: %s\n", bad[k][0], err);
    assert_non_null(strstr(err, "synthetic.table_alpha"));
    assert_non_null(strstr(err, bad[k][1]));
    cfg_destroy(b);
  }
}

/* ---- synthetic.preset = sessions ---- */

static void test_sessions(void **st) {
  (void)st;
  char err[512];
  const char *base[] = {"synthetic.samples=20000", "synthetic.preset=sessions", "synthetic.users=300",
                        "synthetic.active_users=50", NULL};
  cfg_t *c = testutil_cfg_of(base), *c2 = testutil_cfg_of(base);
  cfg_t *ci = testutil_cfg("synthetic.samples=20000", NULL);
  uint64_t d1 = records_digest(c, 3000);
  assert_true(d1 == records_digest(c2, 3000));            /* deterministic */
  assert_true(d1 != records_digest(ci, 3000));            /* and not independent */
  assert_true(d1 != UINT64_C(0x2be8099c018534ae));
  data_source_t *d;
  assert_int_equal(data_open(c, &d, err, sizeof err), 0);
  const data_synth_t *g = d->impl;
  const data_schema_t *s = data_schema(d);
  assert_int_equal(s->n_tables, 26);
  /* default user tables: the first round(26 * 5 / 22) = 6 */
  uint8_t *rec = malloc(d->record_bytes), *first = calloc(300, d->record_bytes);
  uint8_t *seen = calloc(300, 1);
  size_t hoff = 4 + 4 * (size_t)s->n_dense;
  /* 50 users in a session at once, a session spanning 50 * 6 = 300 samples
   * of the log: count the sessions as (slot, start) pairs seen */
  uint64_t sessions = 0, diff_other = 0, user0 = 0, last_start[50], slot_user[50], interleaved = 0, prev_slot = 50;
  for (int k = 0; k < 50; k++) last_start[k] = UINT64_MAX;
  for (uint64_t i = 0; i < 20000; i++) {
    uint64_t slot, start, u = data__synth_user(g, i, &slot, &start);
    assert_true(u < 300 && slot < 50 && start <= i && i - start < 300);
    if (start != last_start[slot]) {
      sessions++;
      last_start[slot] = start;
      slot_user[slot] = u;
    }
    assert_true(slot_user[slot] == u); /* one user per session */
    interleaved += slot != prev_slot;  /* consecutive samples come from different users' sessions */
    prev_slot = slot;
    user0 += u == 0;
    const uint8_t *r;
    assert_int_equal(d->ops->rec(d, i, rec, &r, err, sizeof err), 0);
    uint8_t *f = first + u * d->record_bytes;
    if (!seen[u]) {
      memcpy(f, r, d->record_bytes);
      seen[u] = 1;
      continue;
    }
    /* the user's tables are the user's, always; the others are drawn per sample */
    assert_memory_equal(f + hoff, r + hoff, 6 * 8);
    diff_other += memcmp(f + hoff + 6 * 8, r + hoff + 6 * 8, 20 * 8) != 0;
  }
  double mean = 20000.0 / (double)sessions;
  assert_true(mean > 4.5 && mean < 7.5); /* session_mean = 6 */
  assert_true(interleaved > 19000);
  assert_true(diff_other > 15000);
  assert_true(user0 > 20000 / 20); /* skewed: user 0 takes far more than 1/300 */
  free(rec);
  free(first);
  free(seen);
  data_close(d);
  /* a user table index beyond the schema is refused */
  cfg_t *bad = testutil_cfg("synthetic.preset=sessions", "synthetic.user_tables=3,26", NULL);
  assert_int_equal(data_open(bad, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "synthetic.user_tables"));
  cfg_destroy(bad);
  cfg_destroy(c);
  cfg_destroy(c2);
  cfg_destroy(ci);
}

/* the locality figure: the default job's batches, sessions reuse more */
static void test_locality(void **st) {
  (void)st;
  char err[512];
  data_locality_t l[2];
  for (int k = 0; k < 2; k++) {
    cfg_t *c = testutil_cfg("synthetic.samples=100000",
                            k ? "synthetic.preset=sessions" : "synthetic.preset=independent", NULL);
    data_source_t *d;
    assert_int_equal(data_open(c, &d, err, sizeof err), 0);
    assert_int_equal(data_locality(d, 1024, 2, 4, 64, &l[k], err, sizeof err), 0);
    assert_int_equal(l[k].batches, 64);
    assert_true(l[k].rows > 0 && l[k].reused <= l[k].rows && l[k].reused_accesses <= l[k].accesses);
    data_close(d);
    cfg_destroy(c);
  }
  print_message("locality ids: independent %.3f sessions %.3f\n", l[0].access_share, l[1].access_share);
  print_message("locality rows: independent %.3f sessions %.3f\n", l[0].share, l[1].share);
  /* measured: ids 0.807 -> 0.833, rows 0.479 -> 0.526 (6 of 26 tables are the user's) */
  assert_true(l[1].access_share > l[0].access_share + 0.01);
  assert_true(l[1].share > l[0].share + 0.02);
}

/* ---- the traffic floor on a file whose answer is known ---- */

static void test_floor(void **st) {
  (void)st;
  /* batch 4 over 2 trainers, one table: batch 0 = t0 {a, b}, t1 {a, c};
   * batch 1 = t0 {a, d}, t1 {e, e}; batch 2 = t0 {b, b}, t1 {f, b} */
  const char *csv = "click,v\n1,a\n0,b\n1,a\n0,c\n0,a\n1,d\n0,e\n0,e\n1,b\n0,b\n0,f\n1,b\n";
  const char *p = path_of("floor.csv");
  FILE *f = fopen(p, "w");
  fputs(csv, f);
  fclose(f);
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=1000000", "test_fraction=0", NULL);
  char err[256];
  data_source_t *d;
  data_floor_t fl;
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  /* window 1: first uses a b c | d e | b f (b last used 2 batches ago) = 7; shared: a in batch 0, b in batch 2 = 2 */
  assert_int_equal(data_floor(d, 4, 2, 1, 3, &fl, err, sizeof err), 0);
  assert_int_equal(fl.batches, 3);
  assert_int_equal(fl.first_use, 7);
  assert_int_equal(fl.shared, 2);
  assert_true(fl.per_iteration == 3.0);
  /* window 2: b is still in it in batch 2: 6 first uses */
  assert_int_equal(data_floor(d, 4, 2, 2, 3, &fl, err, sizeof err), 0);
  assert_int_equal(fl.first_use, 6);
  /* window 0: every batch's keys come from the servers: 3 + 3 + 2 */
  assert_int_equal(data_floor(d, 4, 2, 0, 3, &fl, err, sizeof err), 0);
  assert_int_equal(fl.first_use, 8);
  data_close(d);
  cfg_destroy(c);
}

/* ---- data_profile on a file whose answer is known ---- */

static void test_profile(void **st) {
  (void)st;
  /* one table, 1000 rows: values a x5, b x3, c, d */
  const char *csv = "click,v\n1,a\n0,a\n1,b\n0,a\n0,c\n1,b\n0,a\n0,d\n1,a\n0,b\n";
  const char *p = path_of("p.csv");
  FILE *f = fopen(p, "w");
  fputs(csv, f);
  fclose(f);
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=1000", "test_fraction=0", NULL);
  char err[256];
  data_source_t *d;
  data_profile_t pr;
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  const data_schema_t *s = data_schema(d);
  uint64_t ra = data_hash_row(s, 0, "a", 1), rb = data_hash_row(s, 0, "b", 1), rc = data_hash_row(s, 0, "c", 1),
           rd = data_hash_row(s, 0, "d", 1);
  assert_true(ra != rb && ra != rc && ra != rd && rb != rc && rb != rd && rc != rd); /* no collision at this seed */
  assert_int_equal(data_profile(d, &pr, err, sizeof err), 0);
  assert_int_equal(pr.stats.samples, 10);
  assert_int_equal(pr.n_tables, 1);
  assert_int_equal(pr.tables[0].accesses, 10);
  assert_int_equal(pr.tables[0].distinct, 4);
  assert_true(fabs(pr.tables[0].top_0_1 - 0.5) < 1e-12); /* ceil(0.1% of 1000) = 1 row: a */
  assert_true(fabs(pr.tables[0].top_1 - 1.0) < 1e-12);   /* 10 rows: all */
  assert_true(fabs(pr.overall.top_0_1 - 0.5) < 1e-12);
  assert_int_equal(pr.batch[0].batch_size, 1024);
  assert_int_equal(pr.batch[0].batches, 1);
  assert_true(pr.batch[0].unique_rows == 4.0); /* the batch wraps around the 10 samples */
  assert_true(pr.batch[2].ids_per_batch == 16384.0);
  data_profile_close(&pr);
  data_close(d);
  cfg_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_same_bytes), cmocka_unit_test(test_synthetic_equals_file),
      cmocka_unit_test(test_zipf_alpha),           cmocka_unit_test(test_hot_share),
      cmocka_unit_test(test_signal_learnable),     cmocka_unit_test(test_profile),
      cmocka_unit_test(test_independent_unchanged), cmocka_unit_test(test_sessions),
      cmocka_unit_test(test_locality),        cmocka_unit_test(test_floor),
      cmocka_unit_test(test_table_alpha),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
