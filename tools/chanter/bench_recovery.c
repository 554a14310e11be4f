/*
 * chanter bench recovery: how long a failover takes, per daemon kind
 * (DESIGN.md 5), next to the baseline a user would otherwise have: the
 * whole job restarted from its last checkpoint.
 *
 *   chanter [--config F] [--set k=v ...] bench recovery [--runs N] [--kinds K,K,...] [--workdir DIR]
 *
 * Each run is a drill (drill.h) on the bench's job -- 2 trainers, 2
 * embedding servers, 1 data processor, batch 256, 300 iterations, a
 * checkpoint every 40, the kill at iteration 130, the oracle's heartbeat
 * timeout and the supervisor's watchdog at 2 s (the --set values given
 * come after these and win).  Per kind it prints the median over the runs
 * of: detection (kill to the oracle noticing), restart (kill to the
 * supervisor's new process), rollback (notice to every server restored),
 * rejoin (to every trainer in the new generation), kill to the first
 * replayed iteration (the aim: under 5 s), and to caught up; and how many
 * runs ended with the reference digest.  The baseline: kill -9 of every
 * daemon at the same iteration, then `chanter local up` again, the time
 * to its first replayed iteration (a restarted oracle recovers the job).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "drill.h"

static const char *bench_sets[] = {"iterations=300",        "batch_size=256",           "synthetic.samples=100000",
                                   "trainers=2",            "embedding_servers=2",      "dataprocs=1",
                                   "eval_every=100",        "eval_batches=2",           "cache_rows=200000",
                                   "checkpoint_every=40",   "checkpoint_seconds=0",     "embedding.sync_writes=false",
                                   "oracle.heartbeat_timeout_ms=2000", "local.watchdog_ms=2000"};

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of the values >= 0 (NAN when none). */
static double median(double *v, int n) {
  double w[64];
  int m = 0;
  for (int i = 0; i < n && m < 64; i++)
    if (v[i] >= 0) w[m++] = v[i];
  if (!m) return NAN;
  qsort(w, (size_t)m, sizeof *w, cmp_d);
  return m % 2 ? w[m / 2] : (w[m / 2 - 1] + w[m / 2]) / 2;
}

static void cell(double v) {
  if (isnan(v)) printf(" %9s", "-");
  else printf(" %8.2fs", v);
}

int bench_recovery(cli_t *cli) {
  const char *runs_s = cli_opt(cli, "--runs"), *kinds_s = cli_opt(cli, "--kinds"), *workdir = cli_opt(cli, "--workdir");
  const char *report = cli_opt(cli, "--report");
  if (cli_done(cli, "recovery")) return 2;
  int runs = runs_s ? atoi(runs_s) : 3;
  if (runs < 1 || runs > 20) return cli_usage_error(cli, "--runs %s: expected 1..20", runs_s);
  char kinds[256];
  snprintf(kinds, sizeof kinds, "%s", kinds_s ? kinds_s : "kill-trainer,kill-oracle,kill-embedding,kill-dataproc,hang-trainer");
  /* the bench's job, then the user's --set on top */
  char **sets = calloc((size_t)cli->n_sets + 32, sizeof *sets);
  if (!sets) return 1;
  int n = 0;
  for (size_t i = 0; i < sizeof bench_sets / sizeof bench_sets[0]; i++) sets[n++] = (char *)bench_sets[i];
  for (int i = 0; i < cli->n_sets; i++) sets[n++] = cli->sets[i];
  char **user_sets = cli->sets;
  int user_n = cli->n_sets;
  cli->sets = sets;
  cli->n_sets = n;

  char dir[4096], self[4096], sub[4300], ref[65];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (workdir) snprintf(dir, sizeof dir, "%s", workdir), mkdir(dir, 0755);
  else if (snprintf(dir, sizeof dir, "/tmp/chanter-bench-recovery-XXXXXX"), !mkdtemp(dir)) {
    fprintf(stderr, "bench recovery: cannot create a directory under /tmp: %s\n", strerror(errno));
    goto fail;
  }
  fprintf(stderr, "bench recovery: in %s; the reference run first\n", dir);
  snprintf(sub, sizeof sub, "%s/reference", dir);
  if (drill_reference(cli, self, sub, ref)) goto fail;

  printf("recovery per daemon kind, median of %d run(s): seconds after the kill (rollback and rejoin: after the\n"
         "loss was noticed); the job: 2 trainers, 2 servers, batch 256, 300 iterations, a checkpoint every 40,\n"
         "the kill at iteration 130, heartbeat timeout and watchdog 2 s\n",
         runs);
  printf("%-16s %9s %9s %9s %9s %9s %9s %9s  %s\n", "kind", "detect", "restart", "rollback", "rejoin", "1st-repl",
         "caught-up", "replayed", "bits");
  drill_result_t *r = calloc(1, sizeof *r);
  if (!r) goto fail;
  for (char *save = NULL, *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
    double det[20], rst[20], rb[20], rj[20], first[20], cu[20], rep[20];
    int pass = 0, ran = 0;
    for (int i = 0; i < runs; i++) {
      drill_opts_t o = {.kind = k, .rank = -1, .at = 130, .times = 1, .reference = ref, .quiet = 1};
      snprintf(sub, sizeof sub, "%s/%s-%d", dir, k, i);
      o.workdir = sub;
      det[i] = rst[i] = rb[i] = rj[i] = first[i] = cu[i] = rep[i] = -1;
      if (drill_run(cli, self, &o, r)) {
        fprintf(stderr, "bench recovery: %s run %d: %s\n", k, i, r->error);
        continue;
      }
      ran++;
      pass += r->pass;
      if (report) { /* the drilled cluster's plots: the recovery on its time axis */
        char out[4400];
        snprintf(out, sizeof out, "%s/%s-%d", report, k, i);
        bench_report(self, sub, out);
      }
      if (!r->pass) fprintf(stderr, "bench recovery: %s run %d FAILED: %s (see %s)\n", k, i, r->error[0] ? r->error : "another digest", sub);
      if (!r->n_kills) continue;
      const drill_kill_t *x = &r->kills[0];
      det[i] = x->detected;
      rst[i] = x->restarted;
      rb[i] = x->rolled_back >= 0 && x->detected >= 0 ? x->rolled_back - x->detected : -1;
      rj[i] = x->resumed >= 0 && x->detected >= 0 ? x->resumed - x->detected : -1;
      first[i] = x->first;
      cu[i] = x->caught_up;
      rep[i] = x->rollback_to >= -1 ? (double)x->replayed : -1;
    }
    printf("%-16s", k);
    cell(median(det, runs));
    cell(median(rst, runs));
    cell(median(rb, runs));
    cell(median(rj, runs));
    cell(median(first, runs));
    cell(median(cu, runs));
    double mr = median(rep, runs);
    if (isnan(mr)) printf(" %9s", "-");
    else printf(" %9.0f", mr);
    printf("  %d/%d identical\n", pass, ran);
    fflush(stdout);
  }
  free(r);

  /* the baseline: every daemon killed, the cluster started again */
  {
    double first[20];
    int ok = 0;
    for (int i = 0; i < runs; i++) {
      first[i] = -1;
      drill_opts_t o = {.kind = "restart-all", .at = 130, .reference = ref, .quiet = 1};
      snprintf(sub, sizeof sub, "%s/restart-all-%d", dir, i);
      o.workdir = sub;
      drill_result_t *b = calloc(1, sizeof *b);
      if (!b) break;
      if (drill_run(cli, self, &o, b) == 0 && b->n_kills) {
        first[i] = b->kills[0].first;
        ok += b->pass;
      } else {
        fprintf(stderr, "bench recovery: whole-job restart run %d: %s\n", i, b->error);
      }
      free(b);
    }
    printf("%-16s %9s %9s %9s %9s", "baseline: all", "-", "-", "-", "-");
    cell(median(first, runs));
    printf(" %9s %9s  %d/%d identical   (kill -9 of every daemon, `chanter local up` again: the whole job\n"
           "%-16s restarted from its last checkpoint, as TorchRec or HugeCTR users do)\n",
           "-", "-", ok, runs, "");
  }
  cli->sets = user_sets;
  cli->n_sets = user_n;
  free(sets);
  printf("(aim: under 5 s from the kill to the first replayed iteration; replay is bounded by the checkpoint interval)\n");
  return 0;
fail:
  cli->sets = user_sets;
  cli->n_sets = user_n;
  free(sets);
  return 1;
}
