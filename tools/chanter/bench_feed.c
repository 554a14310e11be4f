/*
 * chanter bench feed: what feeding one trainer a batch of 16384 costs each
 * daemon's threads, on a real cluster.
 *
 *   chanter bench feed [--quick] [--device cuda]
 *
 * The cluster (`chanter local up`: 2 data processors, 1 embedding server,
 * the oracle, 1 trainer) trains the GPU
 * check's shape (26 tables x 100k rows, dim 16, uniform ids, batch 16384,
 * every table partitioned onto the trainer) with MLPs of 16 units, so that
 * the model's own arithmetic is small and the threads that carry the
 * batches show.  While it trains, the CPU time of every thread of every
 * daemon (/proc/PID/task/TID/stat, utime + stime) is read at two moments
 * of the steady state, and the iterations between them from the oracle's
 * Status.  Threads are grouped by daemon and name (each daemon names its
 * threads by role: trainer-read, trainer-feed, oracle-fetch, ...).
 *
 * Printed: CPU milliseconds per iteration of each group (and how many
 * threads it has), and what that group alone would allow if its work ran
 * on one thread: batch size / its CPU time per iteration (a group of
 * several threads, as the build pool, allows that many times more).  A GPU trains this step in about 5 ms
 * (docs/gpu.md), so a thread above 5 ms per batch holds a GPU trainer back
 * by itself.  Two columns from the same run: the cluster with mutual TLS
 * (as `local up` and production run it) and in plaintext (--insecure),
 * which shows what TLS costs each thread; and each daemon's peak resident
 * memory (VmHWM).  The model's threads (trainer-step, model-pool) do the
 * CPU's training and are not part of the feed.  Prints only: nothing is a
 * threshold.  With --device cuda the trainer trains on the GPU with the
 * shape's own MLPs (13-512-256-64-16, 512-256-1), and the samples/s line
 * is the one-trainer cluster's figure to set against `train --local`.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "clock.h"
#include "orc.h"

#define FEED_BATCH 16384
#define MAX_THREADS 512
#define MAX_GROUPS 64
#define MAX_DAEMONS 16

typedef struct thr_s {
  char daemon[64], name[64];
  long tid;
  double cpu; /* seconds */
} thr_t;

typedef struct group_s {
  char daemon[64], name[64];
  double ms[2]; /* CPU ms per iteration, per column */
  int threads;  /* threads of this name (the first column's run) */
} group_t;

typedef struct mem_s {
  char daemon[64];
  double mib[2]; /* VmHWM, per column */
} mem_t;

/* The peak resident memory of every daemon in dir/pids, into col of m. */
static void peak_memory(const char *dir, mem_t *m, size_t *nm, int col) {
  char path[2400], name[64], line[256];
  snprintf(path, sizeof path, "%s/pids", dir);
  FILE *f = fopen(path, "r");
  long pid, port;
  while (f && fscanf(f, "%63s %ld %ld", name, &pid, &port) == 3) {
    size_t i = 0;
    while (i < *nm && strcmp(m[i].daemon, name)) i++;
    if (i == *nm) {
      if (*nm == MAX_DAEMONS) break;
      memset(&m[i], 0, sizeof m[i]);
      snprintf(m[i].daemon, sizeof m[i].daemon, "%.60s", name);
      (*nm)++;
    }
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *s = fopen(path, "r");
    unsigned long kb = 0;
    while (s && fgets(line, sizeof line, s))
      if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
    if (s) fclose(s);
    m[i].mib[col] = (double)kb / 1024;
  }
  if (f) fclose(f);
}

/* Every thread of every daemon in dir/pids, with its CPU seconds. */
static size_t snapshot(const char *dir, thr_t *out, size_t cap) {
  char path[1200], name[64];
  snprintf(path, sizeof path, "%s/pids", dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = 0;
  long pid, port;
  long hz = sysconf(_SC_CLK_TCK);
  while (n < cap && fscanf(f, "%63s %ld %ld", name, &pid, &port) == 3) {
    snprintf(path, sizeof path, "/proc/%ld/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && n < cap && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      thr_t *t = &out[n];
      char p2[1600], buf[1024];
      snprintf(t->daemon, sizeof t->daemon, "%.60s", name);
      t->tid = strtol(e->d_name, NULL, 10);
      snprintf(p2, sizeof p2, "%s/%.255s/comm", path, e->d_name);
      FILE *c = fopen(p2, "r");
      if (!c) continue;
      if (!fgets(t->name, sizeof t->name, c)) t->name[0] = 0;
      fclose(c);
      t->name[strcspn(t->name, "\n")] = 0;
      snprintf(p2, sizeof p2, "%s/%.255s/stat", path, e->d_name);
      FILE *s = fopen(p2, "r");
      if (!s) continue;
      size_t got = fread(buf, 1, sizeof buf - 1, s);
      fclose(s);
      buf[got] = 0;
      /* fields after the ")" of comm: state is field 3; utime, stime are 14, 15 */
      char *q = strrchr(buf, ')');
      unsigned long ut = 0, st = 0;
      if (!q || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) continue;
      t->cpu = (double)(ut + st) / (double)hz;
      n++;
    }
    if (d) closedir(d);
  }
  fclose(f);
  return n;
}

static group_t *group_of(group_t *g, size_t *n, const char *daemon, const char *name) {
  for (size_t i = 0; i < *n; i++)
    if (!strcmp(g[i].daemon, daemon) && !strcmp(g[i].name, name)) return &g[i];
  if (*n == MAX_GROUPS) return NULL;
  group_t *x = &g[(*n)++];
  memset(x, 0, sizeof *x);
  snprintf(x->daemon, sizeof x->daemon, "%.60s", daemon);
  snprintf(x->name, sizeof x->name, "%.60s", name);
  return x;
}

/* One column: up, train in the background, two snapshots at iterations a
 * and b of the oracle's Status, down.  Fills col of the groups; *sps the
 * samples/s between the snapshots.  0 or -1 (said). */
static int run_column(const char *self, const char *dir, int cuda, int insecure, uint64_t a, uint64_t b,
                      uint64_t iters, group_t *g, size_t *ng, mem_t *m, size_t *nm, int col, double *sps) {
  static const char *rows = "100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,"
                            "100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,"
                            "100000,100000";
  char cmd[8192], err[1024];
  snprintf(cmd, sizeof cmd,
           "'%s' --set model=dlrm --set table_rows=%s --set embedding_dim=16 --set synthetic.alpha=0 "
           "--set synthetic.samples=100000000 --set test_fraction=0 --set eval_batches=0 --set eval_every=0 "
           "%s --set batch_size=%d --set iterations=%" PRIu64 " "
           "--set trainers=1 --set embedding_servers=1 --set dataprocs=2 --set table_strategy=partition "
           "--set lookahead=auto local up %s --workdir '%s' >'%s.up' 2>&1",
           self, rows, cuda ? "--set device=cuda" : "--set model.bottom_mlp=16 --set model.top_mlp=16", FEED_BATCH,
           iters, insecure ? "--insecure" : "", dir, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench feed: local up failed; see %s.up\n", dir);
    return -1;
  }
  int rc = -1;
  cfg_t *cfg = NULL;
  orc_t *o = NULL;
  pid_t tp = fork();
  if (tp == 0) {
    char job[2300], logp[2300];
    snprintf(job, sizeof job, "%s/job.ini", dir);
    snprintf(logp, sizeof logp, "%s.train", dir);
    if (!freopen("/dev/null", "w", stdout) || !freopen(logp, "w", stderr)) _exit(127);
    execl(self, self, "--config", job, "train", "--workdir", dir, "--quiet", (char *)NULL);
    _exit(127);
  }
  if (tp < 0) goto down;
  snprintf(cmd, sizeof cmd, "%s/job.ini", dir);
  if (cfg_create(&cfg) || cfg_load_file(cfg, cmd, err, sizeof err) || orc_create(cfg, NULL, &o, err, sizeof err)) {
    fprintf(stderr, "bench feed: %s\n", err);
    goto wait;
  }
  static thr_t s1[MAX_THREADS], s2[MAX_THREADS];
  size_t n1 = 0, n2 = 0;
  uint64_t i1 = 0, i2 = 0;
  double t1 = 0, t2 = 0, deadline = clock_mono_s() + 600;
  while (clock_mono_s() < deadline) {
    Chanter__Oracle__V1__StatusResponse *st = NULL;
    if (orc_status(o, &st, err, sizeof err) == 0) {
      uint64_t it = st->iteration;
      int over = strcmp(st->state, "training") && strcmp(st->state, "waiting");
      chanter__oracle__v1__status_response__free_unpacked(st, NULL);
      if (!n1 && it >= a) n1 = snapshot(dir, s1, MAX_THREADS), i1 = it, t1 = clock_mono_s();
      if (n1 && it >= b) {
        n2 = snapshot(dir, s2, MAX_THREADS), i2 = it, t2 = clock_mono_s();
        peak_memory(dir, m, nm, col);
        break;
      }
      if (over) break;
    }
    usleep(200000); /* a Status builds the running summary on the oracle's loop: not too often */
  }
  if (!n2 || i2 <= i1) {
    fprintf(stderr, "bench feed: the job did not reach iteration %" PRIu64 "; see %s.train, %s/logs/\n", b, dir, dir);
    goto wait;
  }
  double iters_d = (double)(i2 - i1);
  *sps = iters_d * FEED_BATCH / (t2 - t1);
  for (size_t i = 0; i < n2; i++) {
    double before = 0;
    for (size_t k = 0; k < n1; k++)
      if (s1[k].tid == s2[i].tid && !strcmp(s1[k].daemon, s2[i].daemon)) before = s1[k].cpu;
    group_t *x = group_of(g, ng, s2[i].daemon, s2[i].name);
    if (x) x->ms[col] += (s2[i].cpu - before) * 1e3 / iters_d;
    if (x && col == 0) x->threads++;
  }
  rc = 0;
wait:
  orc_destroy(o);
  cfg_destroy(cfg);
  if (tp > 0) {
    int ws;
    if (rc) kill(tp, SIGTERM);
    waitpid(tp, &ws, 0);
    if (!rc && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) {
      fprintf(stderr, "bench feed: the job failed; see %s.train\n", dir);
      rc = -1;
    }
  }
down:
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench feed: local down reported a problem in %s\n", dir);
  return rc;
}

static int by_first(const void *x, const void *y) {
  double a = ((const group_t *)x)->ms[0], b = ((const group_t *)y)->ms[0];
  return a < b ? 1 : a > b ? -1 : 0;
}

int bench_cluster_feed(cli_t *cli) {
  int quick = 0, cuda = 0;
  for (int i = 0; i < cli->argc; i++) {
    if (!strcmp(cli->argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(cli->argv[i], "--device") && i + 1 < cli->argc &&
               (!strcmp(cli->argv[i + 1], "cpu") || !strcmp(cli->argv[i + 1], "cuda"))) {
      cuda = !strcmp(cli->argv[++i], "cuda");
    } else {
      fprintf(stderr, "bench feed: unknown option %s (--quick, --device cpu|cuda)\n", cli->argv[i]);
      return 2;
    }
  }
  char self[1024], tmp[] = "/tmp/chanter-bench-feed-XXXXXX", dir[2][1100], cmd[1200];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) return 1;
  /* the steady state: after the start-up, before the final flush */
  uint64_t a = quick ? 30 : 60, b = quick ? 80 : 200, iters = b + 40;
  static group_t g[MAX_GROUPS];
  static mem_t m[MAX_DAEMONS];
  size_t ng = 0, nm = 0;
  double sps[2] = {0, 0};
  int rc = 0;
  for (int c = 0; c < 2 && !rc; c++) {
    snprintf(dir[c], sizeof dir[c], "%s/%s", tmp, c ? "plain" : "tls");
    rc = run_column(self, dir[c], cuda, c, a, b, iters, g, &ng, m, &nm, c, &sps[c]);
  }
  if (!rc) {
    qsort(g, ng, sizeof *g, by_first);
    printf("\nthe feed of one trainer on a local cluster: batch %d, 26 partitioned tables x 100k rows, dim 16,\n"
           "%s, lookahead = auto; CPU ms per iteration over iterations %" PRIu64 "-%" PRIu64 "\n\n",
           FEED_BATCH, cuda ? "device = cuda, the shape's MLPs" : "MLPs of 16 units", a, b);
    printf("%-12s %-16s %7s %12s %12s %18s\n", "daemon", "thread", "threads", "mutual TLS", "plaintext",
           "TLS allows samples/s");
    for (size_t i = 0; i < ng; i++) {
      if (g[i].ms[0] < 0.5 && g[i].ms[1] < 0.5) continue;
      int model = !strcmp(g[i].name, "trainer-step") || !strcmp(g[i].name, "model-pool");
      printf("%-12s %-16s %7d %12.1f %12.1f %18.0f%s\n", g[i].daemon, g[i].name, g[i].threads, g[i].ms[0], g[i].ms[1],
             g[i].ms[0] > 0 ? FEED_BATCH / (g[i].ms[0] / 1e3) : 0,
             model ? "  (the CPU's training)" : g[i].threads > 1 ? "  (if on one thread)" : "");
    }
    printf("%-37s %12.0f %12.0f\n", "samples/s here (shared cores)", sps[0], sps[1]);
    printf("\npeak resident memory (MiB)\n");
    for (size_t i = 0; i < nm; i++) printf("%-37s %12.0f %12.0f\n", m[i].daemon, m[i].mib[0], m[i].mib[1]);
    printf("\naim: every thread of the feed under 5 ms a batch (a GPU's step at this batch, docs/gpu.md)\n");
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "bench feed: could not remove %s\n", tmp);
  return rc ? 1 : 0;
}
