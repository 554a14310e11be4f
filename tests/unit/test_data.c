/* Unit tests of the data readers: Criteo TSV, Avazu CSV, the binary format,
 * malformed input (counted, reported, skipped; strict stops with
 * file:line), text vs binary identity, splits.  Files are written by the
 * tests into a mkdtemp directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* No file in dir is name's temporary ("<name>.tmp.<pid>", fsio_replace). */
static void assert_no_temp(const char *name) {
  char pre[128];
  snprintf(pre, sizeof pre, "%s.tmp", name);
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, pre, strlen(pre)) == 0) fail_msg("temporary %s left behind", e->d_name);
  closedir(d);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)l + 1);
  assert_int_equal(fread(b, 1, (size_t)l, f), (size_t)l);
  b[l] = 0;
  fclose(f);
  if (n) *n = (size_t)l;
  return b;
}

/* stderr capture (the reports are log lines) */
static int saved_fd = -1;
static void capture_start(void) {
  fflush(stderr);
  saved_fd = dup(2);
  int fd = open(path_of("stderr.log"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(fd >= 0);
  dup2(fd, 2);
  close(fd);
}
static char *capture_end(void) {
  fflush(stderr);
  dup2(saved_fd, 2);
  close(saved_fd);
  return read_file(path_of("stderr.log"), NULL);
}
static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

static int setup(void **st) {
  (void)st;
  assert_int_equal(testutil_tmpdir(dir, sizeof dir, "test-data"), 0);
  log_level = LOG_WARN;
  return 0;
}

static int teardown(void **st) {
  (void)st;
  return testutil_rmtree(dir);
}

/* ---- Criteo ---- */

/* valid line i: label i%2, I1 = i, I2 empty, I3 = -5, Ij = j*i; C1 empty,
 * Ct = %08x of (t*7919 + i), C26 in upper case */
static size_t criteo_line(char *b, int i, const char *eol) {
  size_t o = (size_t)sprintf(b, "%d\t%d\t\t-5", i % 2, i);
  for (int j = 4; j <= 13; j++) o += (size_t)sprintf(b + o, "\t%d", j * i);
  o += (size_t)sprintf(b + o, "\t");
  for (int t = 1; t < 26; t++) o += (size_t)sprintf(b + o, t == 25 ? "\t%08X" : "\t%08x", t * 7919 + i);
  o += (size_t)sprintf(b + o, "%s", eol);
  return o;
}

static void check_criteo_sample(const data_schema_t *s, const data_batch_t *b, uint32_t j, int i) {
  assert_true(b->labels[j] == (float)(i % 2));
  const float *d = b->dense + (size_t)j * 13;
  assert_true(d[0] == data_norm_int(i));
  assert_true(d[1] == 0.0f);
  assert_true(d[2] == 0.0f);
  for (int k = 4; k <= 13; k++) assert_true(d[k - 1] == data_norm_int((double)(k * i)));
  assert_true(fabsf(d[3] - (float)log(1.0 + 4 * i)) < 1e-6f);
  assert_int_equal(b->ids[b->ids_off[0] + j], data_hash_row(s, 0, "", 0));
  for (uint32_t t = 1; t < 26; t++) {
    char raw[16];
    sprintf(raw, t == 25 ? "%08X" : "%08x", t * 7919 + i);
    assert_int_equal(b->ids[b->ids_off[t] + j], data_hash_row(s, t, raw, 8));
    assert_true(b->ids[b->ids_off[t] + j] < s->table_rows[t]);
  }
}

static void test_criteo_valid(void **st) {
  (void)st;
  char buf[8192];
  size_t o = 0;
  o += criteo_line(buf + o, 1, "\n");
  o += criteo_line(buf + o, 2, "\r\n"); /* CRLF */
  o += (size_t)sprintf(buf + o, "\n");  /* an empty line: skipped, not counted */
  o += criteo_line(buf + o, 3, "");     /* last line without newline */
  const char *p = path_of("ok.tsv");
  write_file(p, buf, o);
  cfg_t *c = testutil_cfg("test_fraction=0", NULL);
  data_source_t *d;
  char err[512];
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  data_stats_t s;
  data_stats(d, &s);
  assert_int_equal(s.samples, 3);
  assert_int_equal(s.bad_records, 0);
  assert_int_equal(s.format, DATA_FMT_CRITEO);
  data_batch_t b;
  assert_int_equal(data_read_batch(d, DATA_TRAIN, 0, 3, &b, err, sizeof err), 0);
  assert_int_equal(b.n, 3);
  for (int i = 1; i <= 3; i++) check_criteo_sample(data_schema(d), &b, (uint32_t)i - 1, i);
  data_batch_free(&b);
  /* wrap-around: batch 1 of size 2 = samples 2, 0 */
  assert_int_equal(data_read_batch(d, DATA_TRAIN, 1, 2, &b, err, sizeof err), 0);
  check_criteo_sample(data_schema(d), &b, 0, 3);
  check_criteo_sample(data_schema(d), &b, 1, 1);
  data_batch_free(&b);
  /* test_fraction 0: the test split is empty */
  assert_int_equal(data_read_batch(d, DATA_TEST, 0, 2, &b, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "test split is empty"));
  data_close(d);
  cfg_destroy(c);
}

/* every malformed kind, between valid lines */
static size_t criteo_malformed(char *buf, int truncated_tail) {
  size_t o = 0;
  int v = 0;
  o += criteo_line(buf + o, ++v, "\n");                                 /* line 1 ok */
  o += (size_t)sprintf(buf + o, "1\n");                                 /* 2: a lone label */
  char l[4096];
  size_t n = criteo_line(l, 50, "\n");
  memcpy(strstr(l, "\t200\t"), "\t2x0\t", 5);                          /* I5 = "2x0" */
  memcpy(buf + o, l, n), o += n;                                        /* 3: integer */
  o += criteo_line(buf + o, ++v, "\n");                                 /* 4 ok */
  n = criteo_line(l, 60, "\n");
  char *c5 = strstr(l, "0000");                                         /* in the first categorical hex */
  c5[0] = 'z';
  memcpy(buf + o, l, n), o += n;                                        /* 5: hex */
  n = criteo_line(l, 61, "\n");
  l[0] = '2';
  memcpy(buf + o, l, n), o += n;                                        /* 6: label */
  memset(buf + o, 'a', 70000), o += 70000, buf[o++] = '\n';             /* 7: long line */
  n = criteo_line(l, 62, "\n");
  l[5] = (char)0xff, l[6] = (char)0xfe;
  memcpy(buf + o, l, n), o += n;                                        /* 8: invalid UTF-8 */
  n = criteo_line(l, 63, "\n");
  l[3] = 0;
  memcpy(buf + o, l, n), o += n;                                        /* 9: NUL byte */
  o += criteo_line(buf + o, ++v, "\r\n");                               /* 10 ok */
  n = criteo_line(l, 64, "\n");
  memcpy(l + n - 1, "\t12\n", 4);
  memcpy(buf + o, l, n + 3), o += n + 3;                                /* 11: 41 fields */
  if (truncated_tail) {
    n = criteo_line(l, 65, "");
    memcpy(buf + o, l, n / 2), o += n / 2;                              /* 12: truncated */
  } else {
    o += criteo_line(buf + o, ++v, "");
  }
  return o;
}

static void test_criteo_malformed(void **st) {
  (void)st;
  char *buf = malloc(200000);
  size_t n = criteo_malformed(buf, 1);
  const char *p = path_of("bad.tsv");
  write_file(p, buf, n);
  cfg_t *c = testutil_cfg("test_fraction=0", "data.max_reports=3", "data.max_bad_fraction=1", NULL);
  data_source_t *d;
  char err[512];
  capture_start();
  int rc = data_open_path(c, p, &d, err, sizeof err);
  char *log = capture_end();
  assert_int_equal(rc, 0);
  data_stats_t s;
  data_stats(d, &s);
  assert_int_equal(s.samples, 3);
  assert_int_equal(s.bad_records, 9);
  assert_int_equal(s.bad_kind[DATA_BAD_FIELDS], 2);
  assert_int_equal(s.bad_kind[DATA_BAD_INT], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_HEX], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_LABEL], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_LONG], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_BINARY], 2);
  assert_int_equal(s.bad_kind[DATA_BAD_TRUNCATED], 1);
  /* the first 3 reported with file:line and why, then a summary */
  assert_int_equal(count_str(log, "bad record skipped"), 3);
  char want[256];
  snprintf(want, sizeof want, "%s:2 why=\"1 field, expected 40", p);
  assert_non_null(strstr(log, want));
  snprintf(want, sizeof want, "%s:3 why=\"field 5 (integer I4) '2x0' is not an integer", p);
  assert_non_null(strstr(log, want));
  snprintf(want, sizeof want, "%s:5 why=\"field 16 (categorical C2) 'z0001f2b' is not hexadecimal", p);
  assert_non_null(strstr(log, want));
  assert_non_null(strstr(log, "count=9 reported=3"));
  free(log);
  data_batch_t b;
  assert_int_equal(data_read_batch(d, DATA_ALL, 0, 3, &b, err, sizeof err), 0);
  check_criteo_sample(data_schema(d), &b, 0, 1);
  check_criteo_sample(data_schema(d), &b, 1, 2);
  check_criteo_sample(data_schema(d), &b, 2, 3);
  data_batch_free(&b);
  data_close(d);
  cfg_destroy(c);
  free(buf);
}

/* each kind alone in strict mode: -EINVAL with file:line and why */
static void test_criteo_strict(void **st) {
  (void)st;
  static const struct {
    int line;
    const char *why;
  } want[] = {{2, "1 field, expected 40"},
              {3, "is not an integer"},
              {5, "is not hexadecimal"},
              {6, "(label) '2' is not 0 or 1"},
              {7, "line longer than 65536 bytes"},
              {8, "invalid UTF-8 or binary data (byte 0xff at column 6)"},
              {9, "invalid UTF-8 or binary data (byte 0x00 at column 4)"},
              {11, "41 fields, expected 40"},
              {12, "truncated last record (no newline at end of file): "}};
  char *buf = malloc(200000), *one = malloc(200000);
  size_t n = criteo_malformed(buf, 1);
  cfg_t *c = testutil_cfg("strict=true", NULL);
  char err[512], expect[300];
  /* keep the good lines 1, 4, 10 and one bad line at a time */
  size_t starts[13] = {0}, k = 1;
  for (size_t i = 0; i < n && k < 13; i++)
    if (buf[i] == '\n') starts[k++] = i + 1;
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    int bad = want[w].line;
    size_t o = 0;
    for (int line = 1; line <= 12; line++) {
      size_t s0 = starts[line - 1], s1 = line < 12 ? starts[line] : n;
      if (line == bad || line == 1 || line == 4 || line == 10) {
        memcpy(one + o, buf + s0, s1 - s0);
        o += s1 - s0;
      } else if (line < bad) {
        one[o++] = '\n'; /* keep the line numbers: empty lines are skipped */
      }
    }
    const char *p = path_of("strict.tsv");
    write_file(p, one, o);
    data_source_t *d = NULL;
    assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
    assert_null(d);
    snprintf(expect, sizeof expect, "%s:%d: ", p, bad);
    if (!strstr(err, expect) || !strstr(err, want[w].why)) fail_msg("line %d: got '%s'", bad, err);
  }
  cfg_destroy(c);
  free(buf);
  free(one);
}

static void test_criteo_config_and_open_errors(void **st) {
  (void)st;
  char line[4096], err[512];
  size_t n = criteo_line(line, 1, "\n");
  const char *p = path_of("one.tsv");
  write_file(p, line, n);
  data_source_t *d = NULL;
  cfg_t *c = testutil_cfg("n_dense=0", NULL);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, p));
  assert_non_null(strstr(err, "n_dense = 0 (from test)"));
  assert_non_null(strstr(err, "set n_dense = 13 and 26 table_rows"));
  cfg_destroy(c);
  c = testutil_cfg("table_rows=10,20", NULL);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "2 tables in table_rows"));
  cfg_destroy(c);
  c = testutil_cfg("table_hotness=" "2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", NULL);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "multi-hot"));
  cfg_destroy(c);
  c = testutil_cfg("table_hotness=1,2", NULL);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "table_hotness (from test) lists 2 values but table_rows"));
  cfg_destroy(c);
  c = testutil_cfg(NULL, NULL);
  assert_int_equal(data_open_path(c, path_of("missing.tsv"), &d, err, sizeof err), -ENOENT);
  assert_non_null(strstr(err, "missing.tsv: cannot open dataset: No such file"));
  assert_int_equal(data_open_path(c, dir, &d, err, sizeof err), -EINVAL); /* a directory */
  assert_non_null(strstr(err, "not a regular file"));
  write_file(path_of("empty.tsv"), "", 0);
  assert_int_equal(data_open_path(c, path_of("empty.tsv"), &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "no valid records"));
  /* binary garbage as Criteo: every line bad, nothing crashes */
  uint8_t *g = malloc(300000);
  uint64_t x = 1;
  for (size_t i = 0; i < 300000; i++) x = table_mix64(x), g[i] = (uint8_t)x;
  write_file(path_of("garbage.tsv"), g, 300000);
  cfg_set(c, "data.max_reports=0", "test", err, sizeof err);
  assert_int_equal(data_open_path(c, path_of("garbage.tsv"), &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "no valid records ("));
  free(g);
  cfg_destroy(c);
}

/* ---- Avazu ---- */

static void test_avazu(void **st) {
  (void)st;
  const char *csv =
      "\xef\xbb\xbfid,click,hour,C1,site_id\r\n"      /* BOM, CRLF */
      "1000009418151094273,0,14102100,1005,1fbe01fe\r\n" /* 2 */
      "10000169349117863715,1,14102100,,caf\xc3\xa9\n"   /* 3: empty field, UTF-8 */
      "1,1,14102100,1005\n"                              /* 4: 4 fields (no short lines in Avazu) */
      "2,x,14102100,1005,a\n"                            /* 5: label */
      "3,0,14102100,10\x01" "5,a\n"                      /* 6: control byte */
      "4,1,14102100,1005,\xff\n"                         /* 7: invalid UTF-8 */
      "5,1,14102101,1002,85f751fd";                      /* 8: no newline, fine */
  const char *p = path_of("train.csv");
  write_file(p, csv, strlen(csv));
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=1000,10,77", "test_fraction=0", "data.max_reports=0",
                      "data.max_bad_fraction=1", NULL);
  data_source_t *d;
  char err[512];
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0); /* .csv: Avazu by name */
  data_stats_t s;
  data_stats(d, &s);
  assert_int_equal(s.format, DATA_FMT_AVAZU);
  assert_int_equal(s.samples, 3);
  assert_int_equal(s.bad_records, 4);
  assert_int_equal(s.bad_kind[DATA_BAD_FIELDS], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_LABEL], 1);
  assert_int_equal(s.bad_kind[DATA_BAD_BINARY], 2);
  const data_schema_t *sc = data_schema(d);
  data_batch_t b;
  assert_int_equal(data_read_batch(d, DATA_TRAIN, 0, 3, &b, err, sizeof err), 0);
  assert_int_equal(b.n_dense, 0);
  assert_int_equal(b.n_tables, 3);
  assert_true(b.labels[0] == 0.0f && b.labels[1] == 1.0f && b.labels[2] == 1.0f);
  const char *vals[3][3] = {{"14102100", "1005", "1fbe01fe"}, {"14102100", "", "caf\xc3\xa9"},
                            {"14102101", "1002", "85f751fd"}};
  for (uint32_t j = 0; j < 3; j++)
    for (uint32_t t = 0; t < 3; t++)
      assert_int_equal(b.ids[b.ids_off[t] + j], data_hash_row(sc, t, vals[j][t], strlen(vals[j][t])));
  data_batch_free(&b);
  data_close(d);

  /* strict: file:line */
  cfg_set(c, "strict=true", "test", err, sizeof err);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  char want[200];
  snprintf(want, sizeof want, "%s:4: 4 fields, expected 5", p);
  assert_non_null(strstr(err, want));
  cfg_destroy(c);

  /* the job must match the header: 3 categoricals, no dense */
  c = testutil_cfg(NULL, NULL);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "3 one-hot categorical columns (all but id and click)"));
  assert_non_null(strstr(err, "n_dense = 13 (from default)"));
  cfg_destroy(c);

  /* no click column, explicit format on another name */
  write_file(path_of("noclick.txt"), "id,hour,C1\n1,2,3\n", 17);
  c = testutil_cfg("n_dense=0", "table_rows=5,5", "dataset_format=avazu", NULL);
  assert_int_equal(data_open_path(c, path_of("noclick.txt"), &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "noclick.txt:1: the Avazu CSV header has no 'click' column"));
  cfg_destroy(c);
}

/* ---- text vs binary ---- */

static void assert_batches_equal(const data_batch_t *a, const data_batch_t *b) {
  assert_int_equal(a->n, b->n);
  assert_int_equal(a->n_dense, b->n_dense);
  assert_int_equal(a->n_tables, b->n_tables);
  assert_memory_equal(a->labels, b->labels, a->n * sizeof(float));
  if (a->n_dense) assert_memory_equal(a->dense, b->dense, (size_t)a->n * a->n_dense * sizeof(float));
  assert_memory_equal(a->ids_off, b->ids_off, (a->n_tables + 1) * sizeof(size_t));
  assert_memory_equal(a->ids, b->ids, a->ids_off[a->n_tables] * sizeof(uint64_t));
}

static void compare_sources(data_source_t *x, data_source_t *y) {
  static const uint32_t bss[] = {1, 7, 64, 1000, 5000};
  static const uint64_t xs[] = {0, 1, 3, 17, 1000003, UINT64_C(1) << 40};
  char err[512];
  assert_int_equal(data_samples(x), data_samples(y));
  for (int split = DATA_TRAIN; split <= DATA_ALL; split++)
    for (size_t i = 0; i < sizeof bss / sizeof bss[0]; i++)
      for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        data_batch_t a, b;
        int ra = data_read_batch(x, split, xs[k], bss[i], &a, err, sizeof err);
        assert_int_equal(data_read_batch(y, split, xs[k], bss[i], &b, err, sizeof err), ra);
        if (ra) { /* an empty test split, in both */
          assert_int_equal(split, DATA_TEST);
          assert_int_equal(ra, -EINVAL);
          continue;
        }
        assert_int_equal(a.iteration, xs[k]);
        assert_int_equal(a.split, split);
        assert_batches_equal(&a, &b);
        data_batch_free(&a);
        data_batch_free(&b);
      }
}

static void test_text_binary_identical(void **st) {
  (void)st;
  /* hand-written Criteo with malformed lines, and an Avazu file */
  char *buf = malloc(1 << 20);
  size_t n = criteo_malformed(buf, 0);
  buf[n++] = '\n';
  for (int i = 100; i < 1100; i++) n += criteo_line(buf + n, i, i % 3 ? "\n" : "\r\n");
  const char *tsv = path_of("mix.tsv"), *bin = path_of("mix.bin");
  write_file(tsv, buf, n);
  cfg_t *c = testutil_cfg("data.max_reports=0", "test_fraction=0.25", "hash_seed=12345", NULL);
  char err[512];
  data_stats_t cs;
  assert_int_equal(data_convert(c, tsv, bin, &cs, err, sizeof err), 0);
  assert_int_equal(cs.samples, 1004);
  assert_int_equal(cs.bad_records, 8);
  data_source_t *a, *b;
  assert_int_equal(data_open_path(c, tsv, &a, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, bin, &b, err, sizeof err), 0);
  data_stats_t sa, sb;
  data_stats(a, &sa);
  data_stats(b, &sb);
  assert_int_equal(sb.format, DATA_FMT_BINARY); /* by magic, whatever the name */
  assert_int_equal(sa.samples, sb.samples);
  assert_int_equal(sa.train_samples, 753);
  assert_int_equal(sb.test_samples, 251);
  assert_int_equal(sb.bad_records, 8); /* kept in the header */
  compare_sources(a, b);

  /* the test split is the last samples, distinct from train */
  data_batch_t tr, te, all;
  assert_int_equal(data_read_batch(b, DATA_TRAIN, 0, 251, &tr, err, sizeof err), 0);
  assert_int_equal(data_read_batch(b, DATA_TEST, 0, 251, &te, err, sizeof err), 0);
  assert_int_equal(data_read_batch(b, DATA_ALL, 3, 251, &all, err, sizeof err), 0); /* samples 753..1003 */
  assert_batches_equal(&te, &all);
  assert_memory_not_equal(tr.ids + tr.ids_off[1], te.ids + te.ids_off[1], 251 * sizeof(uint64_t));
  data_batch_free(&tr);
  data_batch_free(&te);
  data_batch_free(&all);
  data_close(a);
  data_close(b);

  /* another hash_seed: other rows, and the binary refuses the job */
  cfg_t *c2 = testutil_cfg("hash_seed=1", NULL);
  assert_int_equal(data_open_path(c2, bin, &b, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "hash_seed = 12345; the job says"));
  cfg_destroy(c2);
  /* another table_rows: fine, rows are hash % table_rows at read time */
  c2 = testutil_cfg("hash_seed=12345", "table_rows=7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7", NULL);
  assert_int_equal(data_open_path(c2, bin, &b, err, sizeof err), 0);
  assert_int_equal(data_open_path(c2, tsv, &a, err, sizeof err), 0);
  compare_sources(a, b);
  data_close(a);
  data_close(b);
  cfg_destroy(c2);
  cfg_destroy(c);

  /* Avazu -> binary */
  const char *csv = "id,click,a,b\n1,0,x,y\n2,1,,z\r\n3,1,q,\n";
  write_file(path_of("a.csv"), csv, strlen(csv));
  c = testutil_cfg("n_dense=0", "table_rows=100,3", NULL);
  assert_int_equal(data_convert(c, path_of("a.csv"), path_of("a.bin"), NULL, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, path_of("a.csv"), &a, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, path_of("a.bin"), &b, err, sizeof err), 0);
  compare_sources(a, b);
  data_close(a);
  data_close(b);
  cfg_destroy(c);
  free(buf);
}

/* ---- binary errors ---- */

static void test_binary_errors(void **st) {
  (void)st;
  char line[4096], err[512];
  size_t n = 0;
  char *buf = malloc(100000);
  for (int i = 0; i < 50; i++) n += criteo_line(buf + n, i, "\n");
  write_file(path_of("src.tsv"), buf, n);
  cfg_t *c = testutil_cfg("test_fraction=0", NULL);
  const char *bin = path_of("ok.bin");
  assert_int_equal(data_convert(c, path_of("src.tsv"), bin, NULL, err, sizeof err), 0);
  size_t len;
  char *good = read_file(bin, &len);
  const size_t hdr = 56 + 4 * 26 + 8, rec = 4 + 4 * 13 + 8 * 26;
  assert_int_equal(len, hdr + 50 * rec);
  assert_memory_equal(good, "CHANTERD", 8);
  data_source_t *d = NULL;

  /* the text file forced through the binary reader: wrong magic */
  cfg_t *cb = testutil_cfg("dataset_format=binary", NULL);
  assert_int_equal(data_open_path(cb, path_of("src.tsv"), &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "src.tsv: not a chanter binary dataset"));
  cfg_destroy(cb);

  char *m = malloc(len + rec);
  const char *p = path_of("bad.bin");
  /* another version (auto-detected as ours by the magic) */
  memcpy(m, good, len);
  m[8] = 2;
  write_file(p, m, len);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "bad.bin: binary dataset format version 2; this chanter reads version 1"));
  /* truncated record */
  write_file(p, good, len - 10);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "bad.bin: truncated: "));
  assert_non_null(strstr(err, "hold 49 complete records"));
  /* truncated header */
  write_file(p, good, 40);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "truncated header"));
  /* trailing bytes */
  memcpy(m, good, len);
  memset(m + len, 0, rec);
  write_file(p, m, len + rec);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "after the 50 records"));
  /* a corrupted header byte */
  memcpy(m, good, len);
  m[60] ^= 1;
  write_file(p, m, len);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "checksum"));
  /* a corrupted label: -EIO when read */
  memcpy(m, good, len);
  float bad = 0.5f;
  memcpy(m + hdr + 3 * rec, &bad, 4);
  write_file(p, m, len);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  data_batch_t b;
  assert_int_equal(data_read_batch(d, DATA_TRAIN, 0, 2, &b, err, sizeof err), 0);
  data_batch_free(&b);
  assert_int_equal(data_read_batch(d, DATA_TRAIN, 1, 2, &b, err, sizeof err), -EIO);
  assert_non_null(strstr(err, "record 3 is corrupt"));
  data_close(d);
  /* config mismatch: n_dense / tables */
  cfg_t *c2 = testutil_cfg("n_dense=4", NULL);
  assert_int_equal(data_open_path(c2, bin, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "ok.bin: written for n_dense = 13, 26 tables"));
  assert_non_null(strstr(err, "the job says n_dense = 4, 26 tables"));
  cfg_destroy(c2);
  c2 = testutil_cfg("table_rows=5,5", NULL);
  assert_int_equal(data_open_path(c2, bin, &d, err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "2 tables with hotness 1,1"));
  cfg_destroy(c2);
  /* the output of a failed conversion does not appear */
  assert_int_equal(data_convert(c, path_of("nope.tsv"), path_of("nope.bin"), NULL, err, sizeof err), -ENOENT);
  assert_int_equal(access(path_of("nope.bin"), F_OK), -1);
  assert_no_temp("nope.bin");
  cfg_set(c, "strict=true", "test", err, sizeof err);
  n = criteo_line(line, 1, "\n");
  memcpy(line + n, "1\t2\tz\n", 6); /* a short line, but 'z' is not an integer */
  write_file(path_of("strict.tsv"), line, n + 6);
  assert_int_equal(data_convert(c, path_of("strict.tsv"), path_of("s.bin"), NULL, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "strict.tsv:2: field 3 (integer I2) 'z' is not an integer"));
  assert_int_equal(access(path_of("s.bin"), F_OK), -1);
  assert_no_temp("s.bin");
  free(m);
  free(good);
  free(buf);
  cfg_destroy(c);
}

/* ---- concurrent reads ---- */

typedef struct reader_s {
  data_source_t *d;
  int id;
  uint64_t digest[24];
  int rc;
} reader_t;

static uint64_t batch_digest(const data_batch_t *b) {
  uint64_t h = XXH3_64bits(b->labels, b->n * sizeof(float));
  h ^= XXH3_64bits(b->dense, (size_t)b->n * b->n_dense * sizeof(float)) * 3;
  return h ^ XXH3_64bits(b->ids, b->ids_off[b->n_tables] * sizeof(uint64_t)) * 5;
}

static void *reader(void *arg) {
  reader_t *r = arg;
  char err[256];
  for (int k = 0; k < 24 && !r->rc; k++) {
    int x = (k * 7 + r->id * 5) % 24; /* each thread in its own order */
    data_batch_t b;
    if ((r->rc = data_read_batch(r->d, DATA_TRAIN, (uint64_t)x, 97, &b, err, sizeof err)) == 0) {
      r->digest[x] = batch_digest(&b);
      data_batch_free(&b);
    }
  }
  return NULL;
}

/* data_read_batch from several threads at once gives what one thread gets,
 * for text, binary and synthetic sources. */
static void test_threads(void **st) {
  (void)st;
  char err[256];
  cfg_t *c = testutil_cfg("synthetic.samples=1500", "data.max_reports=0", NULL);
  assert_int_equal(data_gen(c, path_of("t.tsv"), DATA_FMT_CRITEO, 0, err, sizeof err), 0);
  assert_int_equal(data_convert(c, path_of("t.tsv"), path_of("t.bin"), NULL, err, sizeof err), 0);
  const char *paths[3] = {path_of("t.tsv"), path_of("t.bin"), "synthetic"};
  uint64_t first[24];
  for (int s = 0; s < 3; s++) {
    data_source_t *d;
    assert_int_equal(data_open_path(c, paths[s], &d, err, sizeof err), 0);
    reader_t one = {.d = d};
    reader(&one);
    assert_int_equal(one.rc, 0);
    if (s == 0) memcpy(first, one.digest, sizeof first);
    assert_memory_equal(first, one.digest, sizeof first); /* and every source agrees */
    pthread_t th[4];
    reader_t r[4];
    for (int i = 0; i < 4; i++) {
      r[i] = (reader_t){.d = d, .id = i + 1};
      assert_int_equal(pthread_create(&th[i], NULL, reader, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(th[i], NULL);
      assert_int_equal(r[i].rc, 0);
      assert_memory_equal(r[i].digest, one.digest, sizeof one.digest);
    }
    data_close(d);
  }
  cfg_destroy(c);
}

/* ---- garbage in, no crash (run under ASan) ---- */

/* Random byte edits, insertions of newlines/tabs/commas/CRs and
 * truncations of small Criteo and Avazu files, and random header edits of
 * a binary file with the checksum fixed up: every open either fails with a
 * message or yields samples whose batches read fine. */
static void test_fuzz(void **st) {
  (void)st;
  char *base = malloc(1 << 16), *m = malloc(1 << 17), err[512];
  size_t n = 0;
  for (int i = 0; i < 40; i++) n += criteo_line(base + n, i, i % 2 ? "\n" : "\r\n");
  cfg_t *crit = testutil_cfg("data.max_reports=0", "test_fraction=0.3", "data.max_bad_fraction=1", NULL);
  cfg_t *avz = testutil_cfg("data.max_reports=0", "n_dense=0", "table_rows=10,20,30", "dataset_format=avazu",
                        "data.max_bad_fraction=1", NULL);
  const char *avbase = "id,click,a,b,c\n1,0,x,y,z\n2,1,,\xc3\xa9,q\r\n3,1,k,l,m\n4,0,1,2,3\n";
  uint64_t x = 7;
  const char seps[] = "\n\t,\r\0\xff-";
  int opened = 0, refused = 0, bin_opened = 0, bin_refused = 0;
  for (int round = 0; round < 300; round++) {
    int avazu = round % 3 == 2;
    const char *src = avazu ? avbase : base;
    size_t len = avazu ? strlen(avbase) : n;
    memcpy(m, src, len);
    int edits = 1 + (int)((x = table_mix64(x)) % 8);
    for (int e = 0; e < edits; e++) {
      x = table_mix64(x);
      size_t at = (size_t)(x % (len + 1));
      switch ((x >> 32) % 4) {
      case 0: if (at < len) m[at] = (char)(x >> 40); break;
      case 1: if (at < len) m[at] = seps[(x >> 40) % (sizeof seps - 1)]; break;
      case 2: if (len < (1 << 17) - 1) { memmove(m + at + 1, m + at, len - at); m[at] = seps[(x >> 40) % (sizeof seps - 1)]; len++; } break;
      case 3: len = at; break;
      }
    }
    const char *p = path_of(avazu ? "fuzz.csv" : "fuzz.tsv");
    write_file(p, m, len);
    data_source_t *d = NULL;
    int rc = data_open_path(avazu ? avz : crit, p, &d, err, sizeof err);
    if (rc) {
      assert_true(strlen(err) > 0);
      refused++;
      continue;
    }
    opened++;
    data_batch_t b;
    for (int split = DATA_TRAIN; split <= DATA_ALL; split++) {
      rc = data_read_batch(d, split, (uint64_t)round, 33, &b, err, sizeof err);
      if (rc) {
        assert_int_equal(split, DATA_TEST); /* a small file may have no test split */
        continue;
      }
      for (uint32_t j = 0; j < b.n; j++) assert_true(b.labels[j] == 0.0f || b.labels[j] == 1.0f);
      for (uint32_t t = 0; t < b.n_tables; t++)
        for (size_t i = b.ids_off[t]; i < b.ids_off[t + 1]; i++) assert_true(b.ids[i] < data_schema(d)->table_rows[t]);
      data_batch_free(&b);
    }
    data_close(d);
  }
  /* binary headers */
  const char *bin = path_of("f.bin");
  write_file(path_of("f.tsv"), base, n);
  assert_int_equal(data_convert(crit, path_of("f.tsv"), bin, NULL, err, sizeof err), 0);
  size_t blen;
  char *good = read_file(bin, &blen);
  const size_t hdr = 168;
  for (int round = 0; round < 300; round++) {
    memcpy(m, good, blen);
    size_t len = blen;
    x = table_mix64(x);
    m[8 + x % (hdr - 16)] = (char)(x >> 40);
    if (round % 2) { /* a consistent checksum: only the field checks remain */
      uint64_t h = XXH3_64bits(m, hdr - 8);
      memcpy(m + hdr - 8, &h, 8);
    }
    if (round % 5 == 0) len = (size_t)((x >> 20) % (blen + 1));
    write_file(bin, m, len);
    data_source_t *d = NULL;
    if (data_open_path(crit, bin, &d, err, sizeof err)) {
      assert_true(strlen(err) > 0);
      bin_refused++;
      continue;
    }
    bin_opened++;
    data_batch_t b;
    if (data_read_batch(d, DATA_ALL, 1, 50, &b, err, sizeof err) == 0) data_batch_free(&b);
    data_close(d);
  }
  print_message("text: %d opened, %d refused; binary: %d opened, %d refused\n", opened, refused, bin_opened,
                bin_refused);
  assert_true(opened > 100 && refused > 0 && bin_opened > 0 && bin_refused > 100);
  free(good);
  free(base);
  free(m);
  cfg_destroy(crit);
  cfg_destroy(avz);
}

/* ---- schema, hash, norm ---- */

static void test_schema_hash(void **st) {
  (void)st;
  cfg_t *c = testutil_cfg("table_rows=10,1000000", "table_hotness=3,1", "n_dense=2", "hash_seed=9", NULL);
  data_schema_t s;
  char err[256];
  assert_int_equal(data_schema_from_cfg(c, &s, err, sizeof err), 0);
  assert_int_equal(s.n_tables, 2);
  assert_int_equal(s.hotness[0], 3);
  assert_int_equal(s.table_rows[1], 1000000);
  assert_int_equal(s.hash_seed, 9);
  /* XXH3 of the raw bytes seeded from (hash_seed, table) */
  assert_int_equal(data_hash64(&s, 1, "abc", 3), XXH3_64bits_withSeed("abc", 3, data__table_seed(9, 1)));
  assert_int_equal(data_hash_row(&s, 1, "abc", 3), data_hash64(&s, 1, "abc", 3) % 1000000);
  assert_int_not_equal(data_hash64(&s, 0, "abc", 3), data_hash64(&s, 1, "abc", 3));
  s.hash_seed = 10;
  assert_int_not_equal(data_hash64(&s, 1, "abc", 3), XXH3_64bits_withSeed("abc", 3, data__table_seed(9, 1)));
  data_schema_close(&s);
  assert_true(data_norm_int(-3) == 0.0f);
  assert_true(data_norm_int(0) == 0.0f);
  assert_true(fabsf(data_norm_int(99) - (float)log(100.0)) < 1e-6f);
  assert_int_equal(data_format_parse("tsv"), DATA_FMT_CRITEO);
  assert_string_equal(data_format_name(DATA_FMT_AVAZU), "avazu");
  cfg_destroy(c);
}

/* ---- too many malformed records: data.max_bad_fraction ---- */

/* n lines, those with (i % every == every - 1) having 41 fields; returns the
 * first bad line number (1-based), 0 if none */
static int criteo_with_bad(const char *path, int n, int bad) {
  char *buf = malloc((size_t)n * 400 + 16), l[4096];
  size_t o = 0;
  int first = 0;
  for (int i = 0; i < n; i++) {
    size_t k = criteo_line(l, i, "\n");
    if (i * bad / n != (i + 1) * bad / n) { /* bad lines spread evenly */
      memcpy(l + k - 1, "\t7\n", 3), k += 2; /* 41 fields */
      if (!first) first = i + 1;
    }
    memcpy(buf + o, l, k), o += k;
  }
  write_file(path, buf, o);
  free(buf);
  return first;
}

static void test_bad_fraction(void **st) {
  (void)st;
  char err[1024], want[600];
  const char *p = path_of("frac.tsv");
  data_source_t *d = NULL;
  cfg_t *c = testutil_cfg("data.max_reports=0", NULL); /* default data.max_bad_fraction = 0.01 */
  /* 96 of 200 bad: refused at open, with the count, the fraction, the limit and the first */
  int first = criteo_with_bad(p, 200, 96);
  assert_int_equal(first, 3);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_null(d);
  snprintf(want, sizeof want,
           "%s: 96 of 200 records are malformed (48.0%%, more than data.max_bad_fraction = 1.0%%); first at %s:3: "
           "41 fields, expected 40",
           p, p);
  if (strncmp(err, want, strlen(want))) fail_msg("got '%s'", err);
  /* ... by data convert too, writing nothing */
  data_stats_t cs;
  assert_int_equal(data_convert(c, p, path_of("frac.bin"), &cs, err, sizeof err), -EINVAL);
  if (strncmp(err, want, strlen(want))) fail_msg("convert: got '%s'", err);
  assert_int_equal(cs.bad_records, 96);
  assert_int_equal(access(path_of("frac.bin"), F_OK), -1);
  assert_no_temp("frac.bin");
  /* under the limit: opens, counts */
  cfg_set(c, "data.max_bad_fraction=0.5", "test", err, sizeof err);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  data_stats_t s;
  data_stats(d, &s);
  assert_int_equal(s.samples, 104);
  assert_int_equal(s.bad_records, 96);
  data_close(d);
  /* at the default: 2 of 200 is exactly 1.0%, not more; 3 of 200 is */
  cfg_set(c, "data.max_bad_fraction=0.01", "test", err, sizeof err);
  criteo_with_bad(p, 200, 2);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), 0);
  data_close(d);
  first = criteo_with_bad(p, 200, 3);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  snprintf(want, sizeof want,
           "%s: 3 of 200 records are malformed (1.5%%, more than data.max_bad_fraction = 1.0%%); first at %s:%d: ", p,
           p, first);
  if (strncmp(err, want, strlen(want))) fail_msg("got '%s'", err);
  /* 0: any bad record fails (after counting all of them); a limit of 0.1% prints as set */
  cfg_set(c, "data.max_bad_fraction=0", "test", err, sizeof err);
  first = criteo_with_bad(p, 200, 1);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "1 of 200 records are malformed (0.5%, more than data.max_bad_fraction = 0.0%)"));
  cfg_set(c, "data.max_bad_fraction=0.0004", "test", err, sizeof err);
  criteo_with_bad(p, 2000, 1);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "1 of 2000 records are malformed (0.05%, more than data.max_bad_fraction = 0.04%)"));
  /* strict: the first bad record, whatever the fraction */
  cfg_set(c, "data.max_bad_fraction=1", "test", err, sizeof err);
  cfg_set(c, "strict=true", "test", err, sizeof err);
  first = criteo_with_bad(p, 200, 1);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  snprintf(want, sizeof want, "%s:%d: 41 fields, expected 40", p, first);
  assert_non_null(strstr(err, want));
  assert_non_null(strstr(err, "(strict = true)"));
  /* nothing valid, whatever the limit: says so, with the first */
  cfg_set(c, "strict=false", "test", err, sizeof err);
  write_file(p, "x\n1\n", 4);
  assert_int_equal(data_open_path(c, p, &d, err, sizeof err), -EINVAL);
  snprintf(want, sizeof want, "%s: no valid records (2 malformed; first at %s:1: field 1 (label) 'x' is not 0 or 1)", p,
           p);
  if (strcmp(err, want)) fail_msg("got '%s'", err);
  /* Avazu: the same check */
  const char *csv = "id,click,a\n1,0,x\n2,1\n3,1,y\n4,0,z,w\n";
  write_file(path_of("frac.csv"), csv, strlen(csv));
  cfg_t *ca = testutil_cfg("n_dense=0", "table_rows=10", "data.max_reports=0", "data.max_bad_fraction=0.25", NULL);
  assert_int_equal(data_open_path(ca, path_of("frac.csv"), &d, err, sizeof err), -EINVAL);
  snprintf(want, sizeof want,
           "%s: 2 of 4 records are malformed (50.0%%, more than data.max_bad_fraction = 25.0%%); first at %s:3: 2 "
           "fields, expected 3",
           path_of("frac.csv"), path_of("frac.csv"));
  if (strncmp(err, want, strlen(want))) fail_msg("got '%s'", err);
  cfg_destroy(ca);
  cfg_destroy(c);
}

/* ---- short Criteo lines (trailing empty fields stripped) ---- */

/* Line i of a file whose fields from n on are empty: full (40 fields, the
 * empty ones explicit) or stripped (n fields). */
static size_t criteo_tail_empty(char *b, int i, int n, int stripped) {
  size_t o = (size_t)sprintf(b, "%d", i % 2);
  for (int f = 1; f < 40; f++) {
    if (f >= n && stripped) break;
    if (f >= n) o += (size_t)sprintf(b + o, "\t");
    else if (f <= 13) o += (size_t)sprintf(b + o, "\t%d", f * 3 + i);
    else o += (size_t)sprintf(b + o, "\t%08x", f * 7919 + i);
  }
  b[o++] = '\n';
  return o;
}

static void test_short_lines(void **st) {
  (void)st;
  char *full = malloc(1 << 16), *cut = malloc(1 << 16), err[1024];
  size_t nf = 0, nc = 0;
  for (int n = 2; n <= 40; n++) /* 2 .. 39 fields: short; 40: a full line in both */
    for (int i = 0; i < 3; i++) {
      nf += criteo_tail_empty(full + nf, n * 3 + i, n, 0);
      nc += criteo_tail_empty(cut + nc, n * 3 + i, n, 1);
    }
  write_file(path_of("full.tsv"), full, nf);
  write_file(path_of("cut.tsv"), cut, nc);
  cfg_t *c = testutil_cfg("test_fraction=0.2", "hash_seed=77", NULL);
  data_source_t *a, *b;
  assert_int_equal(data_open_path(c, path_of("full.tsv"), &a, err, sizeof err), 0);
  assert_int_equal(data_open_path(c, path_of("cut.tsv"), &b, err, sizeof err), 0);
  data_stats_t sa, sb;
  data_stats(a, &sa);
  data_stats(b, &sb);
  assert_int_equal(sa.samples, 117);
  assert_int_equal(sb.samples, 117);
  assert_int_equal(sa.short_lines, 0);
  assert_int_equal(sb.short_lines, 114); /* 38 lengths x 3 */
  assert_int_equal(sb.bad_records, 0);
  /* the same samples, bit for bit: an empty integer is 0, an empty categorical hashes "" */
  compare_sources(a, b);
  data_batch_t x;
  assert_int_equal(data_read_batch(b, DATA_ALL, 0, 3, &x, err, sizeof err), 0); /* the 2-field lines */
  for (uint32_t t = 0; t < 26; t++) assert_int_equal(x.ids[x.ids_off[t]], data_hash_row(data_schema(b), t, "", 0));
  for (uint32_t k = 1; k < 13; k++) assert_true(x.dense[k] == 0.0f);
  assert_true(x.dense[0] == data_norm_int(3 + 6));
  data_batch_free(&x);
  data_close(a);
  data_close(b);
  /* and the binary conversions are the same bytes; convert counts short lines */
  data_stats_t ca, cb;
  assert_int_equal(data_convert(c, path_of("full.tsv"), path_of("full.bin"), &ca, err, sizeof err), 0);
  assert_int_equal(data_convert(c, path_of("cut.tsv"), path_of("cut.bin"), &cb, err, sizeof err), 0);
  assert_int_equal(ca.short_lines, 0);
  assert_int_equal(cb.short_lines, 114);
  assert_int_equal(cb.samples, 117);
  size_t la, lb;
  char *ba = read_file(path_of("full.bin"), &la), *bb = read_file(path_of("cut.bin"), &lb);
  assert_int_equal(la, lb);
  assert_memory_equal(ba, bb, la);
  free(ba);
  free(bb);

  /* what stays malformed: a lone label, 41 fields, a bad value in a short
   * line (named), a short last line without its newline (a cut file) */
  cfg_set(c, "data.max_bad_fraction=1", "test", err, sizeof err);
  cfg_set(c, "data.max_reports=10", "test", err, sizeof err);
  size_t o = 0;
  o += criteo_tail_empty(cut + o, 1, 5, 1);                   /* 1: short, fine */
  o += (size_t)sprintf(cut + o, "1\n");                       /* 2: lone label */
  o += criteo_tail_empty(cut + o, 2, 40, 0);                  /* 3: full, fine */
  memcpy(cut + o - 1, "\tab\n", 4), o += 3;                   /*    ... plus a 41st field */
  o += (size_t)sprintf(cut + o, "0\t1\t2\tq\t4\n");           /* 4: I3 'q' */
  o += (size_t)sprintf(cut + o, "1\t\t\t\t\t\t\t\t\t\t\t\t\t\tzz\n"); /* 5: C1 'zz' */
  o += criteo_tail_empty(cut + o, 3, 38, 1);                  /* 6: short, fine */
  size_t k = criteo_tail_empty(cut + o, 5, 40, 0);            /* 7: without its label, as */
  memmove(cut + o, cut + o + 2, k - 2), o += k - 2;           /*    Kaggle's test.txt */
  o += criteo_tail_empty(cut + o, 4, 20, 1) - 1;              /* 8: short, no newline */
  const char *p = path_of("shortbad.tsv");
  write_file(p, cut, o);
  capture_start();
  int rc = data_open_path(c, p, &a, err, sizeof err);
  char *log = capture_end();
  assert_int_equal(rc, 0);
  data_stats(a, &sa);
  assert_int_equal(sa.samples, 2);
  assert_int_equal(sa.short_lines, 2);
  assert_int_equal(sa.bad_records, 6);
  assert_int_equal(sa.bad_kind[DATA_BAD_FIELDS], 2);
  assert_int_equal(sa.bad_kind[DATA_BAD_LABEL], 1);
  assert_int_equal(sa.bad_kind[DATA_BAD_INT], 1);
  assert_int_equal(sa.bad_kind[DATA_BAD_HEX], 1);
  assert_int_equal(sa.bad_kind[DATA_BAD_TRUNCATED], 1);
  char want[300];
  const char *whys[] = {":2 why=\"1 field, expected 40", ":3 why=\"41 fields, expected 40",
                        ":4 why=\"field 4 (integer I3) 'q' is not an integer",
                        ":5 why=\"field 15 (categorical C1) 'zz' is not hexadecimal",
                        ":7 why=\"field 1 (label) '8' is not 0 or 1; 39 fields: Kaggle's test.txt has no labels\"",
                        ":8 why=\"truncated last record (no newline at end of file): 20 fields, expected 40\""};
  for (size_t i = 0; i < sizeof whys / sizeof whys[0]; i++) {
    snprintf(want, sizeof want, "%s%s", p, whys[i]);
    if (!strstr(log, want)) fail_msg("no '%s' in:\n%s", want, log);
  }
  free(log);
  data_close(a);
  cfg_destroy(c);
  free(full);
  free(cut);
}

/* ---- raw values and merged rows (data_profile) ---- */

static void test_profile_merged(void **st) {
  (void)st;
  char err[512];
  /* two values x, y of table 0 that share a row at 1000 rows, and z alone */
  cfg_t *c = testutil_cfg("n_dense=0", "table_rows=1000,1", "test_fraction=0", "hash_seed=5", NULL);
  data_schema_t sc;
  assert_int_equal(data_schema_from_cfg(c, &sc, err, sizeof err), 0);
  char x[16] = "", y[16] = "", z[16] = "";
  for (int i = 0; i < 1000 && !y[0]; i++)
    for (int j = 0; j < i && !y[0]; j++) {
      char a[16], b[16];
      sprintf(a, "v%d", j);
      sprintf(b, "v%d", i);
      if (data_hash_row(&sc, 0, a, strlen(a)) == data_hash_row(&sc, 0, b, strlen(b))) strcpy(x, a), strcpy(y, b);
    }
  assert_true(y[0]);
  for (int i = 0; !z[0]; i++) {
    sprintf(z, "w%d", i);
    if (data_hash_row(&sc, 0, z, strlen(z)) == data_hash_row(&sc, 0, x, strlen(x))) z[0] = 0;
  }
  /* table 0: x x5, y x3, z x2 -> rows {x,y}: 8 accesses, {z}: 2.
   * table 1 (1 row): p x6, q x4 -> one row, both values: 10 merged. */
  const char *t0[10] = {x, y, x, z, x, y, x, z, y, x}, *t1[10] = {"p", "q", "p", "p", "q", "p", "q", "p", "q", "p"};
  char csv[1024];
  size_t o = (size_t)sprintf(csv, "click,a,b\n");
  for (int i = 0; i < 10; i++) o += (size_t)sprintf(csv + o, "%d,%s,%s\n", i % 2, t0[i], t1[i]);
  write_file(path_of("m.csv"), csv, o);
  assert_int_equal(data_convert(c, path_of("m.csv"), path_of("m.bin"), NULL, err, sizeof err), 0);
  const char *paths[2] = {path_of("m.csv"), path_of("m.bin")}; /* the binary keeps the 64-bit hashes */
  for (int k = 0; k < 2; k++) {
    data_source_t *d;
    data_profile_t p;
    assert_int_equal(data_open_path(c, paths[k], &d, err, sizeof err), 0);
    assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
    const data_table_profile_t *a = &p.tables[0], *b = &p.tables[1], *all = &p.overall;
    assert_int_equal(a->distinct, 2);
    assert_int_equal(a->raw_values, 3);
    assert_true(a->raw_exact);
    assert_int_equal(a->merged_rows, 1);
    assert_int_equal(a->merged_accesses, 8);
    assert_true(a->merged_share == 0.8);
    assert_int_equal(b->distinct, 1);
    assert_int_equal(b->raw_values, 2);
    assert_int_equal(b->merged_rows, 1);
    assert_true(b->merged_share == 1.0);
    assert_int_equal(all->raw_values, 5);
    assert_true(all->raw_exact);
    assert_int_equal(all->merged_rows, 2);
    assert_int_equal(all->merged_accesses, 18);
    assert_true(fabs(all->merged_share - 0.9) < 1e-12);
    data_profile_close(&p);
    /* no memory for raw values: lower bounds, marked; merged shares still exact */
    data__profile_raw_bytes = 0;
    assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
    data__profile_raw_bytes = DATA_PROFILE_RAW_BYTES;
    assert_int_equal(p.tables[0].raw_values, 2);
    assert_false(p.tables[0].raw_exact);
    assert_int_equal(p.tables[1].raw_values, 1);
    assert_false(p.overall.raw_exact);
    assert_true(p.tables[0].merged_share == 0.8);
    assert_true(p.tables[1].merged_share == 1.0);
    data_profile_close(&p);
    data_close(d);
  }
  /* more rows: nothing merged */
  cfg_t *c2 = testutil_cfg("n_dense=0", "table_rows=1000000,1000000", "test_fraction=0", "hash_seed=5", NULL);
  data_source_t *d;
  data_profile_t p;
  assert_int_equal(data_open_path(c2, path_of("m.csv"), &d, err, sizeof err), 0);
  assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
  assert_int_equal(p.tables[0].raw_values, 3);
  assert_int_equal(p.tables[0].distinct, 3);
  assert_int_equal(p.tables[0].merged_rows, 0);
  assert_true(p.overall.merged_share == 0.0);
  data_profile_close(&p);
  data_close(d);
  cfg_destroy(c2);
  /* synthetic: records hold the raw values' hashes too.  All 50 ranks of a
   * uniform 50-row table are drawn, their 50 raw values hashed into 50 rows:
   * about 1 - 1/e of them share a row */
  c2 = testutil_cfg("n_dense=0", "table_rows=50", "synthetic.samples=20000", "synthetic.alpha=0", NULL);
  assert_int_equal(data_open(c2, &d, err, sizeof err), 0);
  assert_int_equal(data_profile(d, &p, err, sizeof err), 0);
  print_message("synthetic: 50 raw values in %" PRIu64 " rows, %" PRIu64 " merged, share %.3f\n", p.tables[0].distinct,
                p.tables[0].merged_rows, p.tables[0].merged_share);
  assert_int_equal(p.tables[0].raw_values, 50);
  assert_true(p.tables[0].distinct < 50);
  assert_true(p.tables[0].merged_share > 0.3 && p.tables[0].merged_share < 0.9);
  data_profile_close(&p);
  data_close(d);
  cfg_destroy(c2);
  data_schema_close(&sc);
  cfg_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schema_hash),
      cmocka_unit_test(test_criteo_valid),
      cmocka_unit_test(test_criteo_malformed),
      cmocka_unit_test(test_criteo_strict),
      cmocka_unit_test(test_criteo_config_and_open_errors),
      cmocka_unit_test(test_avazu),
      cmocka_unit_test(test_text_binary_identical),
      cmocka_unit_test(test_binary_errors),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_fuzz),
      cmocka_unit_test(test_bad_fraction),
      cmocka_unit_test(test_short_lines),
      cmocka_unit_test(test_profile_merged),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
