/*
 * testutil: what every unit test needs, in one header (as libuv's
 * test/task.h): a near-equality assert, a configuration from "key=value"
 * strings, a temporary directory, and a child daemon on loopback (one of
 * build/bin's binaries with --listen 127.0.0.1:0 and --ready-file, so the
 * kernel picks its port; stopped with a signal).
 *
 * Include it after <cmocka.h> (and its <setjmp.h> <stdarg.h> <stddef.h>).
 * Everything is static inline: a test binary is one file and uses what it
 * needs.  Only the main thread may call the child helpers (cmocka runs
 * every test there; PR_SET_PDEATHSIG is per thread).
 */
#ifndef CHANTER_TESTUTIL_H
#define CHANTER_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"

/* ---- near-equality */

/* |a - b| <= tol, both as double; prints both operands when it fails. */
#define assert_near(a, b, tol)                                              \
  do {                                                                      \
    double a_ = (double)(a), b_ = (double)(b);                              \
    if (!(fabs(a_ - b_) <= (double)(tol))) {                                \
      print_error("%s = %.12g, %s = %.12g, tolerance %g\n", #a, a_, #b, b_, \
                  (double)(tol));                                           \
      fail();                                                               \
    }                                                                       \
  } while (0)

/* ---- configuration */

/* A configuration with the defaults and then each "key=value" of sets (a
 * NULL-terminated array; sets may be NULL) applied as --set would; fails
 * the test if one does not apply.  The caller cfg_destroy()s it. */
static inline cfg_t *testutil_cfg_of(const char *const *sets) {
  cfg_t *c;
  char err[512];
  assert_int_equal(cfg_create(&c), 0);
  for (; sets && *sets; sets++)
    if (cfg_set(c, *sets, "test", err, sizeof err)) fail_msg("cfg_set %s: %s", *sets, err);
  return c;
}

/* The same from arguments, NULL-terminated: testutil_cfg("a=1", "b=2", NULL). */
static inline cfg_t *testutil_cfg(const char *first, ...) {
  cfg_t *c;
  char err[512];
  assert_int_equal(cfg_create(&c), 0);
  va_list ap;
  va_start(ap, first);
  for (const char *kv = first; kv; kv = va_arg(ap, const char *))
    if (cfg_set(c, kv, "test", err, sizeof err)) fail_msg("cfg_set %s: %s", kv, err);
  va_end(ap);
  return c;
}

/* ---- temporary directory */

/* Makes a fresh directory /tmp/chanter-<tag>-XXXXXX and writes its path
 * into dir[0..n).  0 or -errno (for a cmocka setup to return). */
static inline int testutil_tmpdir(char *dir, size_t n, const char *tag) {
  if ((size_t)snprintf(dir, n, "/tmp/chanter-%s-XXXXXX", tag) >= n) return -ENAMETOOLONG;
  return mkdtemp(dir) ? 0 : -errno;
}

static inline int testutil__rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

/* Removes dir and everything under it (rm -rf, without following
 * symlinks).  0 or -1. */
static inline int testutil_rmtree(const char *dir) {
  return nftw(dir, testutil__rm_cb, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

/* ---- child daemons */

static inline double testutil__now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline void testutil__sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The daemons' directory of this build (BUILD/tests/test_x -> BUILD/bin)
 * into out[0..n).  0 or -1. */
static inline int testutil_bin_dir(char *out, size_t n) {
  char exe[1024];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) return -1;
  exe[k] = 0;
  return (size_t)snprintf(out, n, "%s/bin", dirname(dirname(exe))) < n ? 0 : -1;
}

/* Starts bin_dir/name with args (NULL-terminated, at most 38), its stdout
 * and stderr appended to log; the child gets SIGKILL if this thread dies
 * first.  The pid, or -1. */
static inline pid_t testutil_spawn(const char *bin_dir, const char *name, char *const args[], const char *log) {
  extern char **environ;
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", bin_dir, name);
  char *argv[40];
  int a = 0;
  argv[a++] = path;
  for (int i = 0; args[i] && a < 39; i++) argv[a++] = args[i];
  argv[a] = NULL;
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(path, argv, environ);
    _exit(127);
  }
  close(fd);
  return pid;
}

/* The RPC port from a daemon's ready file (daemon.c writes it once
 * serving), waiting up to 20 s; -1 if pid exited first or on time-out. */
static inline int testutil_wait_ready(const char *ready, pid_t pid) {
  for (int i = 0; i < 400; i++) {
    FILE *f = fopen(ready, "r");
    if (f) {
      char buf[1024] = "";
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[n] = 0;
      char *p = strstr(buf, "\"rpc_port\": ");
      if (p) return atoi(p + 12);
    }
    if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
    testutil__sleep_ms(50);
  }
  return -1;
}

/* Sends sig and waits up to timeout_s for the exit: its status (128 +
 * signal when killed by one), or -1 when it did not exit in time (it is
 * then killed and reaped). */
static inline int testutil_stop(pid_t pid, int sig, double timeout_s) {
  int st = 0;
  kill(pid, sig);
  for (double t0 = testutil__now_s(); testutil__now_s() - t0 < timeout_s;) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    testutil__sleep_ms(20);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

#endif
