/* Unit tests of cfg: defaults, files, --set overrides, errors with file:line,
 * long lines and continuations, strict lists, cfg_dump reading back, and
 * what the reader refuses before parsing (not a regular file, too large, a
 * NUL byte) and malformed section headers; a renamed key's old name (an
 * alias) sets the new key with one deprecation warning per old name that
 * names both keys and where, is dumped under the new name, and setting
 * both names is an error naming both places; the path placeholders
 * ({role}, %i) expand in one place (cfg_path_expand). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cfg.h"
#include "clock.h"
#include "data.h"
#include "err.h"
#include "testutil.h"

static char *write_tmp(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/chanter-cfg-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

static void test_defaults(void **st) {
  cfg_t *c;
  assert_int_equal(cfg_create(&c), 0);
  assert_string_equal(cfg_str(c, "model"), "dlrm");
  assert_int_equal(cfg_int(c, "embedding_dim"), 16);
  assert_int_equal(cfg_bool(c, "embedding.sync_writes"), 1);
  assert_string_equal(cfg_origin(c, "model"), "default");
  char err[256];
  assert_int_equal(cfg_validate(c, err, sizeof err), 0);
  table_layout_t l;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(l.n_tables, 26);
  assert_int_equal(l.tables[0].rows, 1460);
  assert_int_equal(l.tables[0].state_floats, 0);
  table_layout_close(&l);
  cfg_destroy(c);
}

static void test_file_and_overrides(void **st) {
  const char *path = write_tmp(
      "; a job\n"
      "model = dcn\n"
      "batch_size = 2048\n"
      "table_rows = 10, 20,\n"
      "   30\n"
      "embedding_optimizer = rowwise_adagrad\n"
      "[embedding]\n"
      "hot_mb = 64\n"
      "[cluster]\n"
      "embedding = 127.0.0.1:7001,127.0.0.1:7002\n");
  cfg_t *c;
  char err[256];
  assert_int_equal(cfg_create(&c), 0);
  char *argv[] = {"prog", "--config", (char *)path, "--set", "batch_size=512", "pos", "--set=model=wdl", NULL};
  int argc = 7;
  assert_int_equal(cfg_parse_args(c, &argc, argv, err, sizeof err), 0);
  assert_int_equal(argc, 2);
  assert_string_equal(argv[1], "pos");
  assert_string_equal(cfg_str(c, "model"), "wdl");
  assert_int_equal(cfg_int(c, "batch_size"), 512);
  assert_string_equal(cfg_origin(c, "batch_size"), "--set");
  assert_int_equal(cfg_int(c, "embedding.hot_mb"), 64);
  char want[128];
  snprintf(want, sizeof want, "%s:8", path);
  assert_string_equal(cfg_origin(c, "embedding.hot_mb"), want);
  table_layout_t l;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(l.n_tables, 3); /* the indented line continued the list */
  assert_int_equal(l.tables[2].rows, 30);
  assert_int_equal(l.tables[1].state_floats, 1);
  table_layout_close(&l);
  char **items;
  size_t n;
  assert_int_equal(cfg_list(c, "cluster.embedding", &items, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(items[1], "127.0.0.1:7002");
  cfg_list_free(items, n);
  cfg_destroy(c);
  unlink(path);
}

static void expect_file_error(const char *text, const char *needle) {
  const char *path = write_tmp(text);
  cfg_t *c;
  char err[512] = "";
  assert_int_equal(cfg_create(&c), 0);
  int rc = cfg_load_file(c, path, err, sizeof err);
  if (rc == 0) rc = cfg_validate(c, err, sizeof err);
  assert_int_equal(rc, ERR_CONFIG);
  if (!strstr(err, needle)) fail_msg("error '%s' lacks '%s'", err, needle);
  if (!strstr(err, path)) fail_msg("error '%s' does not name the file", err);
  cfg_destroy(c);
  unlink(path);
}

static void test_file_errors(void **st) {
  expect_file_error("model = dlrm\nbatch_size = many\n", ":2: batch_size = 'many' is not an integer");
  expect_file_error("\n\nmodle = dlrm\n", ":3: unknown key 'modle'");
  expect_file_error("[embedding]\nhot_mbb = 3\n", ":2: unknown key 'hot_mbb' in section [embedding]");
  expect_file_error("model = gpt\n", "model = 'gpt' is not one of dlrm|wdl|deepfm|dcn|dlrm_dcn");
  expect_file_error("batch_size = 0\n", "batch_size = 0 is out of range");
  expect_file_error("this is not ini\n", ":1: syntax error");
  expect_file_error("table_rows = 10,x\n", "entry 1 'x' must be an integer");
  expect_file_error("embedding_servers = 3\n[cluster]\nembedding = a:1,b:2\n",
                    "lists 2 servers but embedding_servers");
  expect_file_error("lookahead = soon\n", "lookahead = 'soon'");
  expect_file_error("[tls]\ncert_file = /x.pem\n", "must be set together");
}

/* cfg_dump of c into a malloc'd string. */
static char *dump_of(const cfg_t *c, int verbose) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  cfg_dump(c, f, verbose);
  fclose(f);
  return buf;
}

static void test_long_lines(void **st) {
  /* 26 tables of 40M rows, 8-digit dims, long cluster lists, on one line each */
  size_t cap = 1 << 16, o = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  o += (size_t)snprintf(text + o, cap - o, "embedding_servers = 26\ntable_rows = ");
  for (int t = 0; t < 26; t++) o += (size_t)snprintf(text + o, cap - o, "%s40000000", t ? ", " : "");
  o += (size_t)snprintf(text + o, cap - o, "\ntable_dims = ");
  for (int t = 0; t < 26; t++) o += (size_t)snprintf(text + o, cap - o, "%s%08d", t ? "," : "", 4 + t % 3);
  o += (size_t)snprintf(text + o, cap - o, "\n[cluster]\nembedding = ");
  for (int t = 0; t < 26; t++) o += (size_t)snprintf(text + o, cap - o, "%semb%02d.example.internal:7100", t ? ", " : "", t);
  o += (size_t)snprintf(text + o, cap - o, "\n[tls]\ninsecure = true\n");
  const char *path = write_tmp(text);
  cfg_t *c;
  char err[512] = "";
  assert_int_equal(cfg_create(&c), 0);
  if (cfg_load_file(c, path, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cfg_validate(c, err, sizeof err), 0);
  table_layout_t l;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(l.n_tables, 26);
  assert_int_equal(l.tables[25].rows, 40000000);
  assert_int_equal(l.tables[1].dim, 5);
  table_layout_close(&l);
  char **items;
  size_t n;
  assert_int_equal(cfg_list(c, "cluster.embedding", &items, &n), 0);
  assert_int_equal(n, 26);
  assert_string_equal(items[25], "emb25.example.internal:7100");
  cfg_list_free(items, n);
  cfg_destroy(c);
  unlink(path);
  free(text);

  /* a line of CFG_MAX_LINE characters is read; one more is refused, named */
  char path2[] = "/tmp/chanter-cfg-XXXXXX";
  int fd = mkstemp(path2);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "model = dcn\ndataset = ");
  for (int i = 0; i < CFG_MAX_LINE - 10; i++) fputc('d', f);
  fprintf(f, "\n");
  fclose(f);
  assert_int_equal(cfg_create(&c), 0);
  if (cfg_load_file(c, path2, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(strlen(cfg_str(c, "dataset")), CFG_MAX_LINE - 10);
  cfg_destroy(c);
  f = fopen(path2, "w"); /* on its own: two such lines pass CFG_MAX_FILE */
  fprintf(f, "model = dcn\nseed = 1\ndataset = x");
  for (int i = 0; i < CFG_MAX_LINE; i++) fputc('d', f);
  fprintf(f, "\nseed = 2\n");
  fclose(f);
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_load_file(c, path2, err, sizeof err), ERR_CONFIG);
  char want[128];
  snprintf(want, sizeof want, "%s:3: line longer than %d characters", path2, CFG_MAX_LINE);
  if (!strstr(err, want)) fail_msg("error '%s' lacks '%s'", err, want);
  cfg_destroy(c);
  unlink(path2);
}

static void test_continuations(void **st) {
  static const struct {
    const char *text, *key, *want;
  } cases[] = {
      {"table_rows = 10, 20,\n   30\n", "table_rows", "10,20,30"},     /* the comma before the break is not doubled */
      {"table_rows = 10, 20\n\t30\n", "table_rows", "10,20,30"},       /* nor missing without one */
      {"table_rows = 10\n   , 20\n", "table_rows", "10,20"},            /* or with it on the next line */
      {"table_rows = 1,\n; two\n\n  # more\n    2\n", "table_rows", "1,2"}, /* comments, blank lines between */
      {"table_rows =\n    5, 6\n", "table_rows", "5,6"},
      {"\xEF\xBB\xBF" "dataset = d1 ; a comment\r\n", "dataset", "d1"}, /* BOM, inline comment, CRLF */
      {"dataset = a;b\n", "dataset", "a;b"},
      {"table_rows = 7\n[tls]\n  server_name = n9\n", "tls.server_name", "n9"}, /* a header ends the list */
      {"[model]\ntop_mlp = 8\n[]\nmodel = dcn\n", "model", "dcn"},        /* "[]": the job keys again */
      {"[cluster]\nembedding = a:1 ,\n  b:2\n", "cluster.embedding", "a:1,b:2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *path = write_tmp(cases[i].text);
    cfg_t *c;
    char err[512] = "";
    assert_int_equal(cfg_create(&c), 0);
    if (cfg_load_file(c, path, err, sizeof err)) fail_msg("case %zu: %s", i, err);
    if (strcmp(cfg_str(c, cases[i].key), cases[i].want))
      fail_msg("case %zu: %s = '%s', want '%s'", i, cases[i].key, cfg_str(c, cases[i].key), cases[i].want);
    cfg_destroy(c);
    unlink(path);
  }
  /* a continued key's origin is the line of the key */
  const char *path = write_tmp("model = dcn\ntable_rows = 1,\n  2,\n  3\n");
  cfg_t *c;
  char err[512], want[128];
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_load_file(c, path, err, sizeof err), 0);
  snprintf(want, sizeof want, "%s:2", path);
  assert_string_equal(cfg_origin(c, "table_rows"), want);
  cfg_destroy(c);
  unlink(path);
}

static void test_list_errors(void **st) {
  expect_file_error("table_rows = 1,,2\n", ":1: table_rows: entry 1 is empty");
  expect_file_error("seed = 1\ntable_rows = 1, 2,\n", ":2: table_rows: entry 2 is empty (the list ends with a comma)");
  expect_file_error("table_rows = 1, 2,\n[embedding]\nhot_mb = 3\n",
                    ":1: table_rows: entry 2 is empty (the list ends with a comma)");
  expect_file_error("table_rows = ,1\n", ":1: table_rows: entry 0 is empty (the list starts with a comma)");
  /* the line of the entry, not of the key */
  expect_file_error("table_rows = 1, 2,\n    3, 4,\n    5,, 6\n", ":3: table_rows: entry 5 is empty");
  expect_file_error("table_rows = 1,\n    2,\n    x3, 4\nseed = 1\n", ":3: table_rows: entry 2 'x3' must be an integer");
  expect_file_error("table_dims = 4, 4.5\n", ":1: table_dims: entry 1 '4.5' must be an integer");
  expect_file_error("table_hotness = 1,-2\n", ":1: table_hotness: entry 1 '-2' must be an integer");
  expect_file_error("[model]\ntop_mlp = 64 32\n", ":2: model.top_mlp: entry 0 '64 32' must be an integer");
  expect_file_error("[cluster]\nembedding = a:1,,b:2\n", ":2: cluster.embedding: entry 1 is empty");
  expect_file_error("[cluster]\ntrainers = h0, h1,\n", ":2: cluster.trainers: entry 2 is empty");
  /* bounds are still checked where the list is used, with its origin */
  expect_file_error("table_rows = 5, 0\n", "table_rows (from ");
  cfg_t *c;
  char err[512];
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_set(c, "table_rows=1,,2", "--set", err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "--set table_rows=1,,2: table_rows: entry 1 is empty")) fail_msg("%s", err);
  assert_int_equal(cfg_set(c, "cluster.dataproc=h:1,", "--set", err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "cluster.dataproc: entry 1 is empty")) fail_msg("%s", err);
  /* lists are kept as "a,b,c" whatever the spacing */
  assert_int_equal(cfg_set(c, "model.top_mlp= 64 ,  32", "--set", err, sizeof err), 0);
  assert_string_equal(cfg_str(c, "model.top_mlp"), "64,32");
  assert_int_equal(cfg_set(c, "table_dims=  ", "--set", err, sizeof err), 0);
  assert_string_equal(cfg_str(c, "table_dims"), "");
  /* a value a job file could not carry is refused at --set */
  assert_int_equal(cfg_set(c, "dataset=/d/a ;b", "--set", err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "would read as a comment")) fail_msg("%s", err);
  assert_int_equal(cfg_set(c, "dataset=a\nb", "--set", err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "line break")) fail_msg("%s", err);
  cfg_destroy(c);
}

/* Plaintext beyond loopback is refused unless tls.insecure says it is
 * meant; certificates make it fine. */
static void test_plaintext_off_loopback(void **st) {
  (void)st;
  assert_true(cfg_addr_loopback("127.0.0.1:7000"));
  assert_true(cfg_addr_loopback("127.1.2.3:1"));
  assert_true(cfg_addr_loopback("localhost:7000"));
  assert_true(cfg_addr_loopback("[::1]:7000"));
  assert_true(cfg_addr_loopback("::1"));
  assert_true(cfg_addr_loopback("127.0.0.1"));
  assert_false(cfg_addr_loopback("0.0.0.0:7000"));
  assert_false(cfg_addr_loopback(":7000"));
  assert_false(cfg_addr_loopback("10.0.0.2:7000"));
  assert_false(cfg_addr_loopback("[::]:7000"));
  assert_false(cfg_addr_loopback("emb0.example.internal:7000"));
  assert_false(cfg_addr_loopback("localhost.evil:7000"));
  const char *plain[] = {"cluster.embedding=127.0.0.1:7100,10.0.0.2:7100", NULL};
  cfg_t *c = testutil_cfg_of(plain);
  char err[512];
  assert_int_equal(cfg_validate(c, err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "cluster.embedding") || !strstr(err, "entry 1 '10.0.0.2:7100' is not a loopback address") ||
      !strstr(err, "tls.insecure = true"))
    fail_msg("%s", err);
  cfg_destroy(c);
  const char *trainers[] = {"cluster.trainers=127.0.0.1,host-b", NULL};
  c = testutil_cfg_of(trainers);
  assert_int_equal(cfg_validate(c, err, sizeof err), ERR_CONFIG);
  if (!strstr(err, "cluster.trainers") || !strstr(err, "'host-b'")) fail_msg("%s", err);
  cfg_destroy(c);
  const char *insecure[] = {"cluster.embedding=127.0.0.1:7100,10.0.0.2:7100", "tls.insecure=true", NULL};
  c = testutil_cfg_of(insecure);
  if (cfg_validate(c, err, sizeof err)) fail_msg("%s", err);
  cfg_destroy(c);
  const char *tls[] = {"cluster.embedding=127.0.0.1:7100,10.0.0.2:7100", "tls.ca_file=/etc/chanter/ca.pem",
                       "tls.cert_file=/etc/chanter/{role}.pem", "tls.key_file=/etc/chanter/{role}.key", NULL};
  c = testutil_cfg_of(tls);
  if (cfg_validate(c, err, sizeof err)) fail_msg("%s", err);
  assert_true(cfg_tls_on(c));
  cfg_destroy(c);
}

static void test_dump_reads_back(void **st) {
  char rows[1024], dims[512], emb[2048], trainers[2048], dp[1024];
  int o = snprintf(rows, sizeof rows, "table_rows=");
  for (int t = 0; t < 26; t++) o += snprintf(rows + o, sizeof rows - (size_t)o, "%s40000000", t ? "," : "");
  o = snprintf(dims, sizeof dims, "table_dims=");
  for (int t = 0; t < 26; t++) o += snprintf(dims + o, sizeof dims - (size_t)o, "%s%08d", t ? "," : "", 8);
  o = snprintf(emb, sizeof emb, "cluster.embedding=");
  for (int t = 0; t < 26; t++) o += snprintf(emb + o, sizeof emb - (size_t)o, "%s127.0.0.1:%d", t ? "," : "", 40000 + t);
  o = snprintf(trainers, sizeof trainers, "cluster.trainers=");
  for (int t = 0; t < 64; t++) o += snprintf(trainers + o, sizeof trainers - (size_t)o, "%strainer-%02d.example.internal", t ? "," : "", t);
  o = snprintf(dp, sizeof dp, "cluster.dataproc=");
  for (int t = 0; t < 16; t++) o += snprintf(dp + o, sizeof dp - (size_t)o, "%sdata%d.example.internal:7200", t ? "," : "", t);
  const char *sets[] = {rows, dims, "embedding_servers=26", emb, trainers, dp, "cluster.oracle=127.0.0.1:7000", "tls.insecure=true",
                        "dataset=/var/lib/chanter/a path with spaces;and=signs.bin", "model.deep_mlp=", NULL};
  cfg_t *c = testutil_cfg_of(sets);
  char err[512];
  assert_int_equal(cfg_validate(c, err, sizeof err), 0);
  for (int verbose = 0; verbose <= 1; verbose++) {
    char *text = dump_of(c, verbose);
    /* the lists went over continuation lines, none past 80 columns */
    for (char *line = text, *nl; *line; line = nl + 1) {
      nl = strchr(line, '\n');
      assert_non_null(nl);
      if (line[0] != '#' && nl - line > 80) fail_msg("line of %d characters: %.60s...", (int)(nl - line), line);
    }
    assert_non_null(strstr(text, "\ntable_rows = 40000000,"));
    assert_non_null(strstr(text, ",\n    40000000,"));
    const char *path = write_tmp(text);
    cfg_t *c2;
    assert_int_equal(cfg_create(&c2), 0);
    if (cfg_load_file(c2, path, err, sizeof err)) fail_msg("verbose=%d: %s", verbose, err);
    assert_int_equal(cfg_validate(c2, err, sizeof err), 0);
    char *again = dump_of(c2, 0), *first = dump_of(c, 0);
    assert_string_equal(again, first); /* every key reads back to the same value */
    assert_string_equal(cfg_str(c2, "dataset"), "/var/lib/chanter/a path with spaces;and=signs.bin");
    free(again);
    free(first);
    free(text);
    cfg_destroy(c2);
    unlink(path);
  }
  cfg_destroy(c);
  /* values the reader could take for a comment are written so it does not */
  const char *odd[] = {"tls.server_name=;odd", "dataset=#odd",
                       "cluster.trainers=#t0.example.internal,;t1.example.internal,#t2.example.internal,"
                       "#t3.example.internal,#t4.example.internal,#t5.example.internal",
                       NULL};
  c = testutil_cfg_of(odd);
  char *text = dump_of(c, 0), *first = dump_of(c, 0);
  const char *path = write_tmp(text);
  cfg_t *c2;
  assert_int_equal(cfg_create(&c2), 0);
  if (cfg_load_file(c2, path, err, sizeof err)) fail_msg("%s", err);
  char *again = dump_of(c2, 0);
  assert_string_equal(again, first);
  assert_string_equal(cfg_str(c2, "tls.server_name"), ";odd");
  free(again);
  free(first);
  free(text);
  cfg_destroy(c2);
  cfg_destroy(c);
  unlink(path);
}

/* Loads path into a fresh config, expecting ERR_CONFIG and an error that
 * begins with path and contains want. */
static void expect_refused(const char *path, const char *want) {
  cfg_t *c;
  char err[512] = "";
  assert_int_equal(cfg_create(&c), 0);
  int rc = cfg_load_file(c, path, err, sizeof err);
  if (rc != ERR_CONFIG) fail_msg("%s: rc %d, want ERR_CONFIG (%s)", path, rc, err);
  if (strncmp(err, path, strlen(path)) || !strstr(err, want)) fail_msg("error '%s' is not '%s...%s'", err, path, want);
  cfg_destroy(c);
}

static void test_not_a_regular_file(void **st) {
  char dir[128], path[192], want[256];
  assert_int_equal(testutil_tmpdir(dir, sizeof dir, "cfg"), 0);
  snprintf(want, sizeof want, "%s: is a directory, not a job file", dir);
  expect_refused(dir, want);
  expect_refused("/dev/null", "/dev/null: is a character device, not a job file");
  expect_refused("/dev/zero", "/dev/zero: is a character device, not a job file");
  /* a FIFO without a writer: refused at once, the open does not block
   * (the alarm ends the test, rather than hanging it, if it does) */
  snprintf(path, sizeof path, "%s/fifo.ini", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  double t0 = clock_mono_s();
  alarm(10);
  expect_refused(path, ": is a FIFO, not a job file");
  alarm(0);
  assert_true(clock_mono_s() - t0 < 1.0);
  /* a symlink to a job file is read as the file */
  snprintf(path, sizeof path, "%s/job.ini", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("seed = 5\n", f);
  fclose(f);
  char link[192];
  snprintf(link, sizeof link, "%s/link.ini", dir);
  assert_int_equal(symlink(path, link), 0);
  cfg_t *c;
  char err[512];
  assert_int_equal(cfg_create(&c), 0);
  if (cfg_load_file(c, link, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cfg_int(c, "seed"), 5);
  cfg_destroy(c);
  testutil_rmtree(dir);
}

static void test_file_size_limit(void **st) {
  /* sparse files: cheap to make at any size */
  char path[] = "/tmp/chanter-cfg-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)2 << 30), 0);
  expect_refused(path, ": 2.0 GiB; a job file is at most 16 MiB");
  assert_int_equal(ftruncate(fd, (off_t)CFG_MAX_FILE + 1), 0);
  expect_refused(path, ": 16.1 MiB; a job file is at most 16 MiB"); /* rounded up: never reads as within */
  /* exactly CFG_MAX_FILE is read (all NULs here, so it is the first NUL
   * that is refused, not the size) */
  assert_int_equal(ftruncate(fd, (off_t)CFG_MAX_FILE), 0);
  expect_refused(path, ":1:1: a NUL byte (a binary file?)");
  close(fd);
  unlink(path);
  assert_int_equal(CFG_MAX_FILE, 16 << 20); /* the number the messages and cfg.h state */
}

static void test_nul_byte(void **st) {
  static const char text[] = "model = dcn\n\n[embedding]\nhot_mb = 6\0" "4\n";
  char path[] = "/tmp/chanter-cfg-XXXXXX", want[128];
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
  close(fd);
  snprintf(want, sizeof want, "%s:4:11: a NUL byte (a binary file?)", path);
  expect_refused(path, want);
  unlink(path);
}

static void test_section_headers(void **st) {
  expect_file_error("model = dcn\n[oracle\nwindow = 3\n", ":2: missing ] in the section header '[oracle'");
  expect_file_error("[oracle window = 3\n", ":1: missing ] in the section header '[oracle'");
  expect_file_error("[oracle ; ]\n", ":1: missing ] in the section header '[oracle'"); /* the ']' was a comment */
  expect_file_error("seed = 1\n\n[oracle] window = 3\n",
                    ":3: 'window = 3' after the section header '[oracle]' (a section header is a line of its own)");
  expect_file_error("[oracle]]\n", ":1: ']' after the section header '[oracle]'");
  expect_file_error("[oracel]\nwindow = 3\n", ":1: unknown section [oracel] (see `chanter config keys`)");
  expect_file_error("oracle]\n", ":1: missing [ in the section header 'oracle]'");
  /* what is well formed still reads: blanks inside the brackets, a comment
   * after the header, "[]" back to the job keys, no newline at the end */
  const char *path = write_tmp("[ embedding ] ; the servers\nhot_mb = 7\n[]\nseed = 9");
  cfg_t *c;
  char err[512];
  assert_int_equal(cfg_create(&c), 0);
  if (cfg_load_file(c, path, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cfg_int(c, "embedding.hot_mb"), 7);
  assert_int_equal(cfg_int(c, "seed"), 9);
  cfg_destroy(c);
  unlink(path);
}

static void test_set_errors_and_missing_file(void **st) {
  cfg_t *c;
  char err[256];
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_set(c, "nokey", "--set", err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "expected key=value"));
  assert_int_equal(cfg_set(c, "bogus=1", "--set", err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "unknown key 'bogus'"));
  assert_int_equal(cfg_set(c, "learning_rate=-1", "--set", err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "out of range"));
  assert_int_equal(cfg_load_file(c, "/nonexistent/job.ini", err, sizeof err), -ENOENT);
  assert_non_null(strstr(err, "/nonexistent/job.ini: cannot open"));
  char *argv[] = {"prog", "--set", NULL};
  int argc = 2;
  assert_int_equal(cfg_parse_args(c, &argc, argv, err, sizeof err), ERR_CONFIG);
  cfg_destroy(c);
}

/* err contains every one of the NULL-terminated needles. */
static void expect_all(const char *err, const char *const *needles) {
  for (; *needles; needles++)
    if (!strstr(err, *needles)) fail_msg("'%s' lacks '%s'", err, *needles);
}

static void test_alias_sets_new_key(void **st) {
  char path[64]; /* (write_tmp's buffer is reused below) */
  snprintf(path, sizeof path, "%s", write_tmp("seed = 3\n[oracle]\nauto_probe = 7\n[trainer]\npartition_on_device = off\n"));
  cfg_t *c;
  char err[512], at[128];
  assert_int_equal(cfg_create(&c), 0);
  assert_true(cfg_is_key("oracle.auto_probe"));
  assert_true(cfg_is_key("oracle.measure_batches"));
  if (cfg_load_file(c, path, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cfg_int(c, "oracle.measure_batches"), 7);
  assert_string_equal(cfg_str(c, "strategy.partition_on_device"), "off");
  snprintf(at, sizeof at, "%s:3", path);
  assert_string_equal(cfg_origin(c, "oracle.measure_batches"), at);
  /* one warning per old name, naming the old key, the new one and where */
  const char *first[] = {"oracle.auto_probe", "oracle.measure_batches", at, NULL};
  assert_non_null(cfg_warning(c, 0));
  expect_all(cfg_warning(c, 0), first);
  snprintf(at, sizeof at, "%s:5", path);
  const char *second[] = {"trainer.partition_on_device", "strategy.partition_on_device", at, NULL};
  assert_non_null(cfg_warning(c, 1));
  expect_all(cfg_warning(c, 1), second);
  assert_null(cfg_warning(c, 2));
  /* the same old name again (later wins, as for any key): no second warning */
  assert_int_equal(cfg_set(c, "oracle.auto_probe=9", "--set", err, sizeof err), 0);
  assert_int_equal(cfg_int(c, "oracle.measure_batches"), 9);
  assert_string_equal(cfg_origin(c, "oracle.measure_batches"), "--set");
  assert_null(cfg_warning(c, 2));
  assert_int_equal(cfg_set(c, "trainer.partition_mb=8", "--set", err, sizeof err), 0);
  assert_int_equal(cfg_int(c, "strategy.partition_mb"), 8);
  const char *third[] = {"trainer.partition_mb", "strategy.partition_mb", "--set", NULL};
  assert_non_null(cfg_warning(c, 2));
  expect_all(cfg_warning(c, 2), third);
  /* an old name's value is checked as the new key's */
  assert_int_equal(cfg_set(c, "oracle.strategy_step_kb=lots", "--set", err, sizeof err), ERR_CONFIG);
  assert_non_null(strstr(err, "strategy.step_kb = 'lots' is not an integer"));
  /* dumped under the new names only, and read back without a warning */
  char *text = dump_of(c, 1);
  assert_non_null(strstr(text, "\n[strategy]\n"));
  assert_non_null(strstr(text, "\nmeasure_batches = 9\n"));
  assert_non_null(strstr(text, "\npartition_mb = 8\n"));
  assert_non_null(strstr(text, "(from --set, as oracle.auto_probe)"));
  assert_null(strstr(text, "auto_probe ="));
  assert_null(strstr(text, "\n[trainer]\npartition"));
  const char *again = write_tmp(text);
  cfg_t *c2;
  assert_int_equal(cfg_create(&c2), 0);
  if (cfg_load_file(c2, again, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cfg_int(c2, "oracle.measure_batches"), 9);
  assert_int_equal(cfg_int(c2, "strategy.partition_mb"), 8);
  assert_null(cfg_warning(c2, 0));
  free(text);
  cfg_destroy(c2);
  cfg_destroy(c);
  unlink(again);
  unlink(path);
}

static void test_alias_and_new_key_both_set(void **st) {
  cfg_t *c;
  char err[512], a[128], b[128];
  /* in one file, either order: both lines named */
  const char *files[] = {"[oracle]\nauto_probe = 7\nmeasure_batches = 8\n",
                         "[oracle]\nmeasure_batches = 8\nauto_probe = 7\n"};
  for (int k = 0; k < 2; k++) {
    const char *path = write_tmp(files[k]);
    assert_int_equal(cfg_create(&c), 0);
    assert_int_equal(cfg_load_file(c, path, err, sizeof err), ERR_CONFIG);
    snprintf(a, sizeof a, "at %s:2", path);
    snprintf(b, sizeof b, "at %s:3", path);
    const char *want[] = {"oracle.auto_probe", "oracle.measure_batches", a, b, "keep only oracle.measure_batches", NULL};
    expect_all(err, want);
    cfg_destroy(c);
    unlink(path);
  }
  /* the file and --set, either way round */
  const char *path = write_tmp("[strategy]\nstep_kb = 0\n");
  snprintf(a, sizeof a, "at %s:2", path);
  assert_int_equal(cfg_create(&c), 0);
  char *argv[] = {"prog", "--config", (char *)path, "--set", "oracle.strategy_step_kb=5", NULL};
  int argc = 5;
  assert_int_equal(cfg_parse_args(c, &argc, argv, err, sizeof err), ERR_CONFIG);
  const char *want[] = {"oracle.strategy_step_kb (at --set)", "strategy.step_kb (", a, NULL};
  expect_all(err, want);
  cfg_destroy(c);
  unlink(path);
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_set(c, "trainer.partition_mb=8", "--set", err, sizeof err), 0);
  assert_int_equal(cfg_set(c, "strategy.partition_mb=9", "job.ini:4", err, sizeof err), ERR_CONFIG);
  const char *want2[] = {"trainer.partition_mb (at --set)", "strategy.partition_mb (at job.ini:4)", NULL};
  expect_all(err, want2);
  assert_int_equal(cfg_int(c, "strategy.partition_mb"), 8); /* the refused setting changed nothing */
  cfg_destroy(c);
}

/* cfg_path_expand: {role} and %i, every occurrence, only those asked
 * for; a result that does not fit is -ENAMETOOLONG. */
/* table_scale divides every table's rows (at least 1), the same in the
 * layout and in the data schema. */
static void test_table_scale(void **st) {
  (void)st;
  cfg_t *c = testutil_cfg("table_rows=40000000,39060,3,64", "table_scale=64", NULL);
  char err[256];
  table_layout_t l;
  data_schema_t s;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(data_schema_from_cfg(c, &s, err, sizeof err), 0);
  const uint64_t want[] = {625000, 610, 1, 1};
  for (uint32_t t = 0; t < 4; t++) {
    assert_int_equal(l.tables[t].rows, want[t]);
    assert_int_equal(s.table_rows[t], want[t]);
  }
  table_layout_close(&l);
  data_schema_close(&s);
  assert_int_not_equal(cfg_set(c, "table_scale=0", "test", err, sizeof err), 0);
  cfg_destroy(c);
}

static void test_path_expand(void **state) {
  (void)state;
  char out[64];
  assert_int_equal(cfg_path_expand("certs/{role}.pem", "trainer", -1, out, sizeof out), 0);
  assert_string_equal(out, "certs/trainer.pem");
  assert_int_equal(cfg_path_expand("/d/x-%i/y-%i", NULL, 12, out, sizeof out), 0);
  assert_string_equal(out, "/d/x-12/y-12");
  assert_int_equal(cfg_path_expand("{role}-%i", NULL, -1, out, sizeof out), 0); /* neither asked for */
  assert_string_equal(out, "{role}-%i");
  assert_int_equal(cfg_path_expand("{role}/%i/{rol}%", "oracle", 3, out, sizeof out), 0);
  assert_string_equal(out, "oracle/3/{rol}%");
  assert_int_equal(cfg_path_expand("abc-%i", NULL, 1234, out, 7), -ENAMETOOLONG);
  assert_int_equal(cfg_path_expand("abc-%i", NULL, 12, out, 7), 0);
  assert_string_equal(out, "abc-12");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_file_and_overrides),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_set_errors_and_missing_file),
      cmocka_unit_test(test_not_a_regular_file),
      cmocka_unit_test(test_file_size_limit),
      cmocka_unit_test(test_nul_byte),
      cmocka_unit_test(test_section_headers),
      cmocka_unit_test(test_long_lines),
      cmocka_unit_test(test_continuations),
      cmocka_unit_test(test_list_errors),
      cmocka_unit_test(test_dump_reads_back),
      cmocka_unit_test(test_plaintext_off_loopback),
      cmocka_unit_test(test_alias_sets_new_key),
      cmocka_unit_test(test_alias_and_new_key_both_set),
      cmocka_unit_test(test_path_expand),
      cmocka_unit_test(test_table_scale),
  };
  return cmocka_run_group_tests_name("cfg", tests, NULL, NULL);
}
