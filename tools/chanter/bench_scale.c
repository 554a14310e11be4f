/*
 * chanter bench scale: what `chanter scale` costs a running job, measured
 * on a local cluster.
 *
 *   chanter [--config F] [--set k=v ...] bench scale [--table-scales 100,10] [--to 3]
 *           [--quick] [--hosts N|auto [--link R,0]] [--insecure] [--keep]
 *
 * For each table size (table_scale: every table's rows divided by it, so
 * 100 and 10 are the default job's tables at a hundredth and a
 * tenth of Criteo's), the job runs on a local cluster (`chanter local
 * up`: one data processor, two embedding servers, the oracle, two
 * trainers; eval_batches = 0) and, while it trains, is scaled to --to
 * trainers once a third of its iterations are done, and back to 2 after
 * two thirds (`chanter scale --trainers N --wait`); then again, its
 * embedding servers (`chanter scale --embedding-servers N --wait`), with
 * the rows moved server to server, the move's seconds, and both the move
 * and the pause per million rows moved.  Printed per size and per scale: the iteration c it happened after, the pause (iteration c
 * done by the old group to c + 1 done by the new one: the checkpoint's
 * write, the group's re-forming, the caches' refill and one iteration),
 * the whole (from the request: up to L iterations more before c, then the
 * pause), and samples/s over the 40 iterations before c against the 40
 * after c + 1 (from the oracle's timeline) -- the run's own baseline.
 * The digest of the scaled run is printed; test_scale_trainers.sh checks
 * it against a stop-and-resume.  Prints only, never a threshold.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "clock.h"
#include "fsio.h"
#include "json.h"

#define MAX_SIZES 8
#define WINDOW 40 /* iterations each side of a scale */

/* The largest iteration of the oracle's timeline in dir so far (-1: none). */
static double timeline_max_iter(const char *dir) {
  char path[4200], *text = NULL;
  snprintf(path, sizeof path, "%s/oracle/timeline.jsonl", dir);
  if (fsio_read_all(path, 0, &text, NULL, NULL, 0) != 0 || !text) return -1;
  double best = -1;
  for (char *l = text, *next; l && *l; l = next) {
    next = strchr(l, '\n');
    if (next) *next++ = 0;
    double it;
    if (strstr(l, "\"kind\": \"iter\"") && json_get_num(l, "iteration", &it) == 0 && it > best) best = it;
  }
  free(text);
  return best;
}

/* samples/s between iterations a and b of the timeline (the "iter"
 * records nearest inside [a, b]): NAN when fewer than two. */
static double rate(const char *dir, double a, double b, double batch) {
  char path[4200], *text = NULL;
  snprintf(path, sizeof path, "%s/oracle/timeline.jsonl", dir);
  if (fsio_read_all(path, 0, &text, NULL, NULL, 0) != 0 || !text) return NAN;
  double i0 = NAN, t0 = 0, i1 = NAN, t1 = 0;
  for (char *l = text, *next; l && *l; l = next) {
    next = strchr(l, '\n');
    if (next) *next++ = 0;
    double it, t;
    if (!strstr(l, "\"kind\": \"iter\"") || json_get_num(l, "iteration", &it) || json_get_num(l, "t", &t)) continue;
    if (it < a || it > b) continue;
    if (isnan(i0) || it < i0) i0 = it, t0 = t;
    if (isnan(i1) || it > i1) i1 = it, t1 = t;
  }
  free(text);
  return !isnan(i0) && i1 > i0 && t1 > t0 ? (i1 - i0) * batch / (t1 - t0) : NAN;
}

/* The k-th object of summary's "scales" into obj (NUL-terminated): 0, or -1. */
static int scale_obj(const char *sm, int k, char *obj, size_t n) {
  const char *p = strstr(sm, "\"scales\": [");
  if (!p) return -1;
  p = strchr(p, '[') + 1;
  for (int i = 0; i <= k; i++) {
    const char *a = strchr(p, '{'), *end = strchr(p, ']');
    if (!a || (end && end < a)) return -1;
    const char *b = strchr(a, '}');
    if (!b) return -1;
    if (i == k) {
      snprintf(obj, n, "%.*s", (int)(b - a + 1), a);
      return 0;
    }
    p = b + 1;
  }
  return -1;
}

static int run_cmd(const char *cmd) {
  int rc = system(cmd);
  return rc == 0 ? 0 : -1;
}

/* Waits until the timeline passes iteration `it` or the job's process ends. */
static int wait_iter(const char *dir, double it, pid_t train) {
  for (;;) {
    if (timeline_max_iter(dir) >= it) return 0;
    int st;
    if (waitpid(train, &st, WNOHANG) == train) return -1;
    usleep(100000);
  }
}

/* One run: the job at table_scale `scale`, its trainers (servers = 0) or
 * its embedding servers (servers = 1) scaled 2 -> to -> 2. */
static int one_size(cli_t *cli, const char *self, const char *tmp, long scale, int to, int servers, int iters,
                    const char *up_args, int keep) {
  char dir[1200], cmd[8192];
  const char *flag = servers ? "--embedding-servers" : "--trainers";
  snprintf(dir, sizeof dir, "%s/scale-%s-%ld", tmp, servers ? "servers" : "trainers", scale);
  int o = snprintf(cmd, sizeof cmd, "'%s'", self);
  if (cli->config_path) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  snprintf(cmd + o, sizeof cmd - (size_t)o,
           " --set trainers=2 --set embedding_servers=2 --set eval_batches=0 --set table_scale=%ld --set iterations=%d "
           "local up %s --workdir "
           "'%s' >'%s.up' 2>&1",
           scale, iters, up_args, dir, dir);
  if (run_cmd(cmd)) {
    fprintf(stderr, "bench scale: local up failed; see %s.up\n", dir);
    return 1;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  fflush(NULL);
  pid_t train = fork();
  if (train == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  int rc = train < 0 ? 1 : 0;
  const int counts[2] = {to, 2};
  for (int k = 0; k < 2 && !rc; k++) {
    if (wait_iter(dir, (double)iters * (k + 1) / 3, train)) {
      fprintf(stderr, "bench scale: the job ended before iteration %d; see %s.train\n", iters * (k + 1) / 3, dir);
      rc = 1;
      train = -1;
      break;
    }
    snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' scale %s %d --workdir '%s' --wait >'%s.scale%d' 2>&1", self,
             dir, flag, counts[k], dir, dir, k);
    if (run_cmd(cmd)) {
      fprintf(stderr, "bench scale: chanter scale %s %d failed; see %s.scale%d\n", flag, counts[k], dir, k);
      rc = 1;
    }
  }
  int st = 0;
  if (train > 0 && (waitpid(train, &st, 0) != train || !WIFEXITED(st) || WEXITSTATUS(st) != 0) && !rc) {
    fprintf(stderr, "bench scale: the job failed; see %s.train and %s/logs/\n", dir, dir);
    rc = 1;
  }
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (run_cmd(cmd)) fprintf(stderr, "bench scale: local down reported a problem in %s\n", dir);
  char path[1300], *sm = NULL, obj[1024], digest[80] = "";
  snprintf(path, sizeof path, "%s/summary.json", dir);
  if (!rc && (fsio_read_all(path, 0, &sm, NULL, NULL, 0) != 0 || !sm)) {
    fprintf(stderr, "bench scale: no %s\n", path);
    rc = 1;
  }
  if (!rc) {
    double batch = cli_json_num(sm, "batch_size"), rows = cli_json_num(sm, "stored_rows");
    json_get_str(sm, "digest", digest, sizeof digest);
    printf("table_scale %ld, %s: %.0f rows on the servers at the end; digest %.16s...\n", scale,
           servers ? "embedding servers" : "trainers", isnan(rows) ? 0 : rows, digest);
    for (int k = 0; k < 2; k++) {
      if (scale_obj(sm, k, obj, sizeof obj)) {
        printf("  scale %d: not in summary.json\n", k + 1);
        continue;
      }
      double c = cli_json_num(obj, "at_iteration"), from = cli_json_num(obj, "from"), tt = cli_json_num(obj, "to");
      double before = rate(dir, c - WINDOW, c, batch), after = rate(dir, c + 1, c + 1 + WINDOW, batch);
      double pause = cli_json_num(obj, "pause_seconds");
      printf("  %.0f -> %.0f after iteration %.0f: pause %.2f s, %.2f s from the request; samples/s %.0f before, %.0f "
             "after (%.2fx)\n",
             from, tt, c, pause, cli_json_num(obj, "seconds"), before, after, after / before);
      double moved = cli_json_num(obj, "rows_moved"), mb = cli_json_num(obj, "bytes_moved"),
             ms = cli_json_num(obj, "move_seconds");
      if (servers && moved > 0)
        printf("    %.0f rows (%.1f MiB) moved server to server in %.3f s: %.2f s of move and %.2f s of pause per "
               "million rows moved\n",
               moved, mb / 1048576.0, ms, ms / moved * 1e6, pause / moved * 1e6);
    }
  }
  free(sm);
  if (!keep && !rc) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'.*", dir, dir);
    if (run_cmd(cmd)) fprintf(stderr, "bench scale: could not remove %s\n", dir);
  }
  return rc;
}

int bench_scale(cli_t *cli) {
  const char *sizes = cli_opt(cli, "--table-scales"), *to_s = cli_opt(cli, "--to"), *hosts = cli_opt(cli, "--hosts"),
             *link = cli_opt(cli, "--link");
  int quick = cli_flag(cli, "--quick"), insecure = cli_flag(cli, "--insecure"), keep = cli_flag(cli, "--keep");
  if (cli_done(cli, "scale")) return 2;
  long scales[MAX_SIZES];
  int n = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", sizes ? sizes : (quick ? "100" : "100,10"));
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *end;
    long v = strtol(t, &end, 10);
    if (*end || v < 1 || n == MAX_SIZES) return cli_usage_error(cli, "--table-scales '%s': up to %d integers >= 1", sizes, MAX_SIZES);
    scales[n++] = v;
  }
  char *end = NULL;
  long to = to_s ? strtol(to_s, &end, 10) : 3;
  if ((to_s && *end) || to < 1 || to > 64 || to == 2)
    return cli_usage_error(cli, "--to '%s': a trainer count in 1..64 other than 2 (the job starts with 2)", to_s);
  if (link && !hosts) return cli_usage_error(cli, "--link needs --hosts");
  char up_args[512] = "";
  int o = 0;
  if (hosts) o = snprintf(up_args, sizeof up_args, "--hosts '%s'%s%s%s", hosts, link ? " --link '" : "", link ? link : "",
                          link ? "'" : "");
  if (insecure) snprintf(up_args + o, sizeof up_args - (size_t)o, "%s--insecure", o ? " " : "");
  int iters = quick ? 800 : 1600; /* a scale lands up to L + the window ahead: the job must be long enough */
  char self[1024], tmp[] = "/tmp/chanter-bench-scale-XXXXXX";
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) {
    fprintf(stderr, "bench scale: cannot create a directory in /tmp: %s\n", strerror(errno));
    return 1;
  }
  printf("chanter bench scale: %s, 2 trainers, then 2 embedding servers, scaled to %ld after a third of %d iterations "
         "and back to 2 after two thirds; batch %lld\n",
         hosts ? "emulated hosts" : "local cluster on 127.0.0.1", to, iters, (long long)cfg_int(cli->cfg, "batch_size"));
  int rc = 0;
  double t0 = clock_mono_s();
  for (int i = 0; i < n && !rc; i++)
    for (int servers = 0; servers < 2 && !rc; servers++)
      rc = one_size(cli, self, tmp, scales[i], (int)to, servers, iters, up_args, keep);
  printf("(pause: iteration c done by the old group to c + 1 done by the new one; the old group runs no step past c; "
         "samples/s over the %d iterations before c and after c + 1, from the oracle's timeline; %.0f s in all)\n",
         WINDOW, clock_mono_s() - t0);
  if (!keep && !rc) rmdir(tmp);
  else printf("runs kept in %s\n", tmp);
  return rc;
}
