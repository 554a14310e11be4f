/* Unit tests of cfg: defaults, files, --set overrides, errors with file:line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cfg.h"
#include "err.h"

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
  tbl_layout_t l;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(l.n_tables, 26);
  assert_int_equal(l.tables[0].rows, 1460);
  assert_int_equal(l.tables[0].state_floats, 0);
  tbl_layout_close(&l);
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
  tbl_layout_t l;
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  assert_int_equal(l.n_tables, 3); /* the indented line continued the list */
  assert_int_equal(l.tables[2].rows, 30);
  assert_int_equal(l.tables[1].state_floats, 1);
  tbl_layout_close(&l);
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
  expect_file_error("model = gpt\n", "model = 'gpt' is not one of dlrm|wdl|deepfm|dcn");
  expect_file_error("batch_size = 0\n", "batch_size = 0 is out of range");
  expect_file_error("this is not ini\n", ":1: syntax error");
  expect_file_error("table_rows = 10,x\n", "entry 1 'x' must be an integer");
  expect_file_error("embedding_servers = 3\n[cluster]\nembedding = a:1,b:2\n",
                    "lists 2 servers but embedding_servers");
  expect_file_error("lookahead = soon\n", "lookahead = 'soon'");
  expect_file_error("[tls]\ncert_file = /x.pem\n", "must be set together");
  char longline[400];
  snprintf(longline, sizeof longline, "dataset = %0300d\n", 7);
  expect_file_error(longline, "line longer than");
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_file_and_overrides),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_set_errors_and_missing_file),
  };
  return cmocka_run_group_tests_name("cfg", tests, NULL, NULL);
}
