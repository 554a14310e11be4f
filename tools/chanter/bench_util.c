/* bench_util: see bench_util.h. */
#include "bench_util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsio.h"
#include "json.h"

static void self_dir(char *out, size_t n) {
  ssize_t l = readlink("/proc/self/exe", out, n - 1);
  out[l > 0 ? l : 0] = 0;
  char *s = strrchr(out, '/');
  if (s) *s = 0;
}

int bench_start_daemon(const char *daemon, char *const argv[], const char *ready, const char *logf, pid_t *pid) {
  char bin[4096];
  char *args[32];
  int n = 0;
  self_dir(bin, sizeof bin - 64);
  strcat(bin, "/");
  strcat(bin, daemon);
  args[n++] = bin;
  for (int i = 0; argv[i] && n < 31; i++) args[n++] = argv[i];
  args[n] = NULL;
  unlink(ready);
  *pid = fork();
  if (*pid == 0) {
    if (!freopen(logf, "w", stderr)) _exit(126);
    execv(bin, args);
    _exit(127);
  }
  for (int i = 0; i < 600; i++) {
    FILE *f = fopen(ready, "r");
    if (f) {
      char buf[512] = "";
      size_t r = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[r] = 0;
      int64_t port;
      if (json_get_i64(buf, "rpc_port", &port) == 0) return (int)port;
    }
    if (waitpid(*pid, NULL, WNOHANG) == *pid) return -1;
    usleep(50000);
  }
  kill(*pid, SIGKILL);
  waitpid(*pid, NULL, 0);
  return -1;
}

int bench_stop_daemon(pid_t pid) {
  int status = 0;
  kill(pid, SIGTERM);
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

void cli_tail_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char lines[12][512];
  int n = 0;
  while (fgets(lines[n % 12], sizeof lines[0], f)) n++;
  fclose(f);
  if (!n) return;
  fprintf(stderr, "--- last lines of %s ---\n", path);
  for (int i = n > 12 ? n - 12 : 0; i < n; i++) fprintf(stderr, "  %s", lines[i % 12]);
}

int bench_report(const char *self, const char *workdir, const char *out) {
  char cmd[13000], why[512];
  if (fsio_mkdir_p(out, why, sizeof why)) {
    fprintf(stderr, "no report of %s: %s\n", workdir, why);
    return -1;
  }
  snprintf(cmd, sizeof cmd, "'%s' report --workdir '%s' --out '%s' >/dev/null 2>'%s.err'", self, workdir, out, out);
  if (system(cmd) == 0) {
    fprintf(stderr, "report of %s: %s/index.html\n", workdir, out);
    return 0;
  }
  fprintf(stderr, "no report of %s (see %s.err)\n", workdir, out);
  return -1;
}

int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, size_t n) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
