/*
 * fsio, json and clock: the shared file, JSON and clock helpers of
 * common/ (fsio.h, json.h, clock.h).
 *
 *  - fsio_replace writes a file that fsio_read_all reads back byte for
 *    byte (binary data with NULs included), replaces an existing file,
 *    leaves no temporary behind, and fails with a message naming the path
 *    when the directory does not exist (leaving the old file in place);
 *    the streaming pair commits, and with ok = false leaves the old file
 *    and no temporary; fsio_read_all refuses a file over its limit.
 *  - fsio_mkdir_p creates nested directories and accepts an existing one,
 *    refuses a path through a regular file; fsio_remove_tree removes a
 *    tree and accepts a missing one.
 *  - json_escape escapes quotes, backslashes and control bytes and never
 *    cuts an escape in half; every json_get_* reads back what sbuf wrote
 *    (escapes undone), the first match only, a whole key only ("ab" is
 *    not "b"), arrays by index, and says -1 for a missing key, a null, or
 *    a value of the other type.
 *  - the monotonic clock never goes back and its three units agree; a
 *    wall-clock deadline lies the asked time ahead, normalized.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "fsio.h"
#include "json.h"
#include "sbuf.h"

static char dir[256];

static int setup(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/test_fsio.XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  return fsio_remove_tree(dir, NULL, 0);
}

static size_t count_entries(const char *d) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", d);
  FILE *p = popen(cmd, "r");
  size_t n = 0;
  if (p) {
    if (fscanf(p, "%zu", &n) != 1) n = 999;
    pclose(p);
  }
  return n;
}

static void test_replace_read(void **st) {
  (void)st;
  char path[512], why[256];
  snprintf(path, sizeof path, "%s/f.bin", dir);
  const char data[] = {'a', 0, 'b', '\n', (char)0xff};
  assert_int_equal(fsio_replace(path, data, sizeof data, 0644, why, sizeof why), 0);
  char *s;
  size_t n;
  assert_int_equal(fsio_read_all(path, 0, &s, &n, why, sizeof why), 0);
  assert_int_equal(n, sizeof data);
  assert_memory_equal(s, data, sizeof data);
  assert_int_equal(s[n], 0);
  free(s);
  assert_int_equal(fsio_replace(path, "new", 3, 0600, why, sizeof why), 0);
  assert_int_equal(fsio_read_all(path, 0, &s, &n, why, sizeof why), 0);
  assert_string_equal(s, "new");
  free(s);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  assert_int_equal(count_entries(dir), 1); /* no temporary left */
  /* over the limit */
  assert_int_equal(fsio_read_all(path, 2, &s, &n, why, sizeof why), -EFBIG);
  assert_null(s);
  assert_non_null(strstr(why, path));
  /* a missing directory: an error naming the path */
  char bad[512];
  snprintf(bad, sizeof bad, "%s/nodir/f", dir);
  assert_true(fsio_replace(bad, "x", 1, 0644, why, sizeof why) < 0);
  assert_non_null(strstr(why, "nodir"));
  assert_int_equal(fsio_read_all(bad, 0, &s, &n, why, sizeof why), -ENOENT);
  assert_non_null(strstr(why, "nodir"));
  /* streaming: commit, then an abandoned one leaves the old file */
  fsio_tmp_t t;
  assert_int_equal(fsio_replace_open(&t, path, 0644, why, sizeof why), 0);
  fprintf(t.f, "streamed %d", 42);
  assert_int_equal(fsio_replace_commit(&t, true, why, sizeof why), 0);
  assert_int_equal(fsio_read_all(path, 0, &s, NULL, why, sizeof why), 0);
  assert_string_equal(s, "streamed 42");
  free(s);
  assert_int_equal(fsio_replace_open(&t, path, 0644, why, sizeof why), 0);
  fprintf(t.f, "half");
  assert_true(fsio_replace_commit(&t, false, why, sizeof why) < 0);
  assert_int_equal(fsio_read_all(path, 0, &s, NULL, why, sizeof why), 0);
  assert_string_equal(s, "streamed 42");
  free(s);
  assert_int_equal(count_entries(dir), 1);
  unlink(path);
}

static void test_dirs(void **st) {
  (void)st;
  char p[512], why[256];
  snprintf(p, sizeof p, "%s/a/b/c", dir);
  assert_int_equal(fsio_mkdir_p(p, why, sizeof why), 0);
  assert_int_equal(fsio_mkdir_p(p, why, sizeof why), 0);
  assert_true(fsio_exists(p));
  char f[512];
  snprintf(f, sizeof f, "%s/a/b/file", dir);
  assert_int_equal(fsio_replace(f, "1", 1, 0644, why, sizeof why), 0);
  char through[600];
  snprintf(through, sizeof through, "%s/sub", f);
  assert_true(fsio_mkdir_p(through, why, sizeof why) < 0);
  assert_int_equal(fsio_fsync_path(p, true, why, sizeof why), 0);
  assert_int_equal(fsio_fsync_parent(f, why, sizeof why), 0);
  snprintf(p, sizeof p, "%s/a", dir);
  assert_int_equal(fsio_remove_tree(p, why, sizeof why), 0);
  assert_false(fsio_exists(p));
  assert_int_equal(fsio_remove_tree(p, why, sizeof why), 0);
}

static void test_json(void **st) {
  (void)st;
  char e[16];
  json_escape(e, sizeof e, "a\"b\\c\n");
  assert_string_equal(e, "a\\\"b\\\\c\\u000a");
  json_escape(e, 8, "ab\n"); /* "ab" fits, the 6-byte escape does not */
  assert_string_equal(e, "ab");
  sbuf_t b = {0};
  sb_printf(&b, "{");
  sb_str(&b, "ab", "first");
  sb_printf(&b, ", ");
  sb_str(&b, "b", "q\"uo\\te\ttab\x01");
  sb_printf(&b, ", ");
  sb_num(&b, "n", 12.5);
  sb_printf(&b, ", ");
  sb_num(&b, "inf", 1.0 / 0.0);
  sb_printf(&b, ", \"big\": 9007199254740993, \"list\": [\"x\", \"y\\\"z\"], ");
  sb_str(&b, "b", "second");
  sb_printf(&b, "}");
  assert_false(b.oom);
  char out[64];
  assert_int_equal(json_get_str(b.s, "b", out, sizeof out), 0);
  assert_string_equal(out, "q\"uo\\te\ttab\x01");
  assert_int_equal(json_get_str(b.s, "ab", out, sizeof out), 0);
  assert_string_equal(out, "first");
  assert_int_equal(json_get_str(b.s, "n", out, sizeof out), -1);
  assert_string_equal(out, "");
  assert_int_equal(json_get_str(b.s, "missing", out, sizeof out), -1);
  double v = -1;
  assert_int_equal(json_get_num(b.s, "n", &v), 0);
  assert_true(v == 12.5);
  assert_int_equal(json_get_num(b.s, "inf", &v), -1); /* null */
  assert_int_equal(json_get_num(b.s, "b", &v), -1);   /* a string */
  int64_t i = 0;
  assert_int_equal(json_get_i64(b.s, "big", &i), 0);
  assert_true(i == 9007199254740993LL);
  assert_int_equal(json_get_str_at(b.s, "list", 1, out, sizeof out), 0);
  assert_string_equal(out, "y\"z");
  assert_int_equal(json_get_str_at(b.s, "list", 0, out, sizeof out), 0);
  assert_string_equal(out, "x");
  assert_int_equal(json_get_str_at(b.s, "list", 2, out, sizeof out), -1);
  const char *nums = "{\"a\": [1.5, -2, 3e2], \"s\": [\"x\"]}";
  assert_int_equal(json_get_num_at(nums, "a", 0, &v), 0);
  assert_true(v == 1.5);
  assert_int_equal(json_get_num_at(nums, "a", 2, &v), 0);
  assert_true(v == 300);
  assert_int_equal(json_get_num_at(nums, "a", 3, &v), -1);
  assert_int_equal(json_get_num_at(nums, "s", 0, &v), -1);
  assert_int_equal(json_get_str(b.s, "ab", out, 3), 0); /* truncated */
  assert_string_equal(out, "fi");
  free(b.s);
}

static void test_clock(void **st) {
  (void)st;
  int64_t a = clock_mono_ns();
  double s = clock_mono_s();
  int64_t m = clock_mono_ms();
  int64_t z = clock_mono_ns();
  assert_true(z >= a);
  assert_true(m >= a / 1000000 && m <= z / 1000000);
  assert_true(s * 1e9 >= (double)a - 1e3 && s * 1e9 <= (double)z + 1e3);
  assert_true(clock_wall_s() > 1.7e9);
  struct timespec w = clock_wall_ts(), d = clock_deadline_rt(1500);
  assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
  double ahead = (double)(d.tv_sec - w.tv_sec) + (double)(d.tv_nsec - w.tv_nsec) * 1e-9;
  assert_true(ahead >= 1.5 - 1e-3 && ahead < 1.6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replace_read),
      cmocka_unit_test(test_dirs),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
