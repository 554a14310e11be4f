/*
 * chanter bench e2e: the whole cluster, baseline against ideal.
 *
 * Runs the same job twice on a local cluster (`chanter local up`: one data
 * processor, two embedding servers, the oracle, two trainers): mode =
 * normal with lookahead 0 (the baseline: every row fetched for its batch
 * and written back after it) and mode = ideal (no embedding traffic at all,
 * the lower bound of iteration time), and prints samples/s and the time per
 * phase side by side.  This is the table the lookahead cache must beat.
 * The job comes from --config/--set (defaults: DLRM, batch 1024, 200
 * iterations; --quick: 60), plus lookahead = auto with the job's
 * allocation and with allocation = laia, and a run of ideal with the dense
 * all-reduce in one buffer after the backward (no overlap).  Prints only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "phase.h"


/* up, train, down in dir; returns the summary text (caller frees) */
static char *run(cli_t *cli, const char *self, const char *dir, const char *extra, int iters) {
  char cmd[8192];
  int o = snprintf(cmd, sizeof cmd, "'%s'", self);
  if (cli->config_path) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  o += snprintf(cmd + o, sizeof cmd - (size_t)o,
                " --set iterations=%d --set trainers=2 --set embedding_servers=2"
                " --set dataprocs=1 --set eval_batches=0 %s local up --workdir '%s' >'%s.up' 2>&1",
                iters, extra, dir, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench e2e: local up failed; see %s.up\n", dir);
    return NULL;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench e2e: local down reported a problem in %s\n", dir);
  if (rc != 0) {
    fprintf(stderr, "bench e2e: the job (%s) failed; see %s.train and %s/logs/\n", extra, dir, dir);
    return NULL;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  return cli_slurp(path);
}

/* The columns: the same job with these settings on top. */
typedef struct col_s {
  const char *label, *dir, *sets;
} col_t;
static const col_t cols[] = {
    {"baseline L=0", "baseline", "--set mode=normal --set lookahead=0"},
    {"lookahead auto", "lookahead", "--set mode=normal --set lookahead=auto"},
    {"lookahead+laia", "laia", "--set mode=normal --set lookahead=auto --set allocation=laia"},
    {"ideal", "ideal", "--set mode=ideal --set lookahead=0"},
    {"ideal, 1 AR", "ideal-noovl", "--set mode=ideal --set lookahead=0 --set trainer.bucket_kb=0"},
};
#define N_COLS (sizeof cols / sizeof cols[0])

int bench_e2e(cli_t *cli) {
  int quick = cli_flag(cli, "--quick");
  if (cli_done(cli, "e2e")) return 2;
  int iters = quick ? 60 : 200;
  char self[1024], tmp[] = "/tmp/chanter-bench-e2e-XXXXXX", dir[1200];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) return 1;
  printf("chanter bench e2e: local cluster (1 data processor, 2 embedding servers, oracle, 2 trainers), %d iterations, "
         "batch %lld\n\n",
         iters, (long long)cfg_int(cli->cfg, "batch_size"));
  char *sm[N_COLS];
  int rc = 0;
  for (size_t c = 0; c < N_COLS; c++) {
    snprintf(dir, sizeof dir, "%s/%s", tmp, cols[c].dir);
    if (!(sm[c] = run(cli, self, dir, cols[c].sets, iters))) rc = 1;
  }
  if (rc == 0) {
    static const int ph[] = {PHASE_WAIT,     PHASE_FETCH,         PHASE_PREFETCH_WAIT, PHASE_SYNC_WAIT,
                             PHASE_FORWARD,  PHASE_BACKWARD,      PHASE_ALLREDUCE,     PHASE_SYNC_CRITICAL,
                             PHASE_UPDATE,   PHASE_REPLICATE,     PHASE_WRITE_BACK,    PHASE_TOTAL};
    static const char *names[] = {"data wait",  "fetch",         "  blocked on prefetch", "wait for background",
                                  "forward",    "backward",      "all-reduce",            "  critical rows",
                                  "update",     "  replication", "write-back",            "iteration"};
    static const char *rows[] = {"rows_fetched", "rows_synced", "rows_synced_delayed", "rows_replicated",
                                 "rows_written_back", "cache_hits"};
    static const char *rnames[] = {"rows fetched / iteration", "rows synchronized / iter.", "  of which delayed",
                                   "  of which handed over",    "rows written back / iter.", "cache hits / iteration"};
    printf("%-26s", "");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14s", cols[c].label);
    printf("\n%-26s", "samples/s");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "samples_per_sec"));
    printf("\n%-26s", "  after iteration 0");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "steady_samples_per_sec"));
    printf("\n%-26s", "iteration 0 (start-up)");
    for (size_t c = 0; c < N_COLS; c++) printf(" %11.0f ms", 1e3 * cli_json_num(sm[c], "first_iteration_seconds"));
    printf("\n");
    for (int i = 0; i < 12; i++) {
      printf("%-26s", names[i]);
      for (size_t c = 0; c < N_COLS; c++)
        printf(" %11.2f ms", 1e3 * cli_json_num(strstr(sm[c], "\"phase_seconds\""), phase_name(ph[i])));
      printf("\n");
    }
    for (int i = 0; i < 6; i++) {
      printf("%-26s", rnames[i]);
      for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], rows[i]));
      printf("\n");
    }
    printf("%-26s", "iteration after it. 0");
    for (size_t c = 0; c < N_COLS; c++) printf(" %11.2f ms", 1e3 * cli_json_num(sm[c], "steady_iteration_seconds"));
    printf("\n%-26s", "lookahead L");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "lookahead"));
    double b = cli_json_num(sm[0], "steady_samples_per_sec"), id = cli_json_num(sm[3], "steady_iteration_seconds"),
           ids = cli_json_num(sm[3], "steady_samples_per_sec");
    double mb = cli_json_num(sm[0], "rows_fetched") + cli_json_num(sm[0], "rows_synced");
    printf("\n\n");
    for (size_t c = 1; c <= 2; c++) {
      double la = cli_json_num(sm[c], "steady_samples_per_sec"), lit = cli_json_num(sm[c], "steady_iteration_seconds");
      double ml = cli_json_num(sm[c], "rows_fetched") + cli_json_num(sm[c], "rows_synced");
      printf("%s vs baseline: %.2fx samples/s; rows fetched + synchronized per iteration %.0f -> %.0f (%.0f%% "
             "fewer; aim >= 80%%); iteration time %.0f%% above ideal (aim <= 15%%).\n",
             cols[c].label, la / b, mb, ml, mb > 0 ? 100.0 * (1.0 - ml / mb) : 0.0, 100.0 * (lit / id - 1.0));
    }
    printf("(speed and iteration time after iteration 0, whose wait holds the start-up: lookahead = auto plans "
           "oracle.auto_probe batches and chooses L before the first Step, shown on its own line)\n");
    printf("(lookahead+laia: allocation = laia, samples placed on the trainer that holds their rows; the baseline "
           "and ideal use the job's allocation)\n");
    printf("ideal / baseline: %.2fx samples/s after iteration 0.  \"ideal, 1 AR\": the dense gradients all-reduced "
           "in one buffer after the backward (trainer.bucket_kb = 0) instead of in buckets during it.\n"
           "(per-phase times are means over trainers and iterations; all-reduce is the time the trainer waits for it "
           "after the backward; ideal keeps every row in the trainer and is not a correct distributed model, only the "
           "lower bound of iteration time)\n",
           ids / b);
  }
  for (size_t c = 0; c < N_COLS; c++) free(sm[c]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (rc == 0 && system(cmd) != 0) fprintf(stderr, "bench e2e: could not remove %s\n", tmp);
  return rc;
}
