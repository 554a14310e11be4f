/*
 * chanter bench e2e: the whole cluster, baseline against lookahead against
 * ideal, on each data generator.
 *
 *   chanter bench e2e [--quick] [--data independent|sessions|both]
 *                     [--hosts N|auto [--link RATE,DELAY]]
 *
 * Runs the same job on a local cluster (`chanter local up`: one data
 * processor, two embedding servers, the oracle, two trainers; with --hosts
 * on emulated hosts joined by shaped links, README "Emulated hosts") once
 * per column: mode = normal with lookahead 0 (the baseline: every row
 * fetched for its batch and written back after it), lookahead = auto with
 * the job's allocation and with allocation = laia, mode = ideal (no
 * embedding traffic at all, the lower bound of iteration time) and ideal
 * with the dense all-reduce in one buffer after the backward.  For each
 * data generator (synthetic.preset independent, then sessions: --data
 * both, the default) it prints samples/s, time per phase, rows and bytes
 * moved per iteration on the critical path and in the background, and the
 * traffic floor of the data (data_floor: rows first used inside the
 * lookahead window, plus rows two trainers use in the same batch) with
 * each column's rows moved as a ratio to it.  The job comes from
 * --config/--set (defaults: DLRM, batch 1024, 200 iterations; --quick:
 * 60).  Prints only: the aims are in the text, never thresholds.
 *
 * The default link with --hosts is BENCH_LINK: a 100 Gbit/s cluster link
 * scaled down by how much faster a GPU computes this step than one of
 * these cores (README, "The benchmark on emulated hosts"), so that compute
 * and communication stand in the ratio they have on GPU hosts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "data.h"
#include "fsio.h"
#include "phase.h"

#define BENCH_LINK "400mbit,0"

/* The cluster every column runs: --set on top of the job, also for the
 * floor's configuration (job_cfg). */
static const char *const fixed_sets[] = {"trainers=2", "embedding_servers=2", "dataprocs=1", "eval_batches=0"};
#define N_FIXED (sizeof fixed_sets / sizeof fixed_sets[0])

static const char *g_report; /* --report DIR: each run's plots there (chanter report) */

/* up, train, down in dir; returns the summary text (caller frees) */
static char *run(cli_t *cli, const char *self, const char *dir, const char *sets, const char *up_args, int iters) {
  char cmd[8192];
  int o = snprintf(cmd, sizeof cmd, "'%s'", self);
  if (cli->config_path) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  for (size_t i = 0; i < N_FIXED; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set %s", fixed_sets[i]);
  o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set iterations=%d %s local up %s --workdir '%s' >'%s.up' 2>&1",
                iters, sets, up_args, dir, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench e2e: local up failed; see %s.up\n", dir);
    snprintf(cmd, sizeof cmd, "%s.up", dir);
    cli_tail_file(cmd);
    return NULL;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench e2e: local down reported a problem in %s\n", dir);
  if (rc != 0) {
    fprintf(stderr, "bench e2e: the job (%s) failed; see %s.train and %s/logs/\n", sets, dir, dir);
    return NULL;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  char *summary = NULL;
  fsio_read_all(path, 0, &summary, NULL, NULL, 0);
  return summary;
}

/* The columns: the same job with these settings on top. */
typedef struct col_s {
  const char *label, *dir, *sets;
} col_t;
static const col_t cols[] = {
    {"baseline L=0", "baseline", "--set mode=normal --set lookahead=0 --set table_strategy=cache"},
    {"lookahead auto", "lookahead", "--set mode=normal --set lookahead=auto --set table_strategy=cache"},
    {"lookahead+laia", "laia", "--set mode=normal --set lookahead=auto --set allocation=laia --set table_strategy=cache"},
    {"partition", "partition", "--set mode=normal --set lookahead=auto --set table_strategy=partition"},
    {"partition_rows", "partrows", "--set mode=normal --set lookahead=auto --set table_strategy=partition_rows"},
    {"strategy auto", "strategy_auto", "--set mode=normal --set lookahead=auto --set table_strategy=auto"},
    {"auto, model", "strategy_auto-model",
     "--set mode=normal --set lookahead=auto --set table_strategy=auto --set strategy.auto_cost=model"},
    {"auto, priority", "strategy_auto-prio",
     "--set mode=normal --set lookahead=auto --set table_strategy=auto --set trainer.comm_schedule=priority"},
    {"ideal", "ideal", "--set mode=ideal --set lookahead=0"},
    {"ideal, 1 AR", "ideal-noovl", "--set mode=ideal --set lookahead=0 --set trainer.bucket_kb=0"},
};
#define N_COLS (sizeof cols / sizeof cols[0])
enum { C_BASE, C_LA, C_LAIA, C_PART, C_ROWS, C_AUTO, C_AUTO_MODEL, C_AUTO_PRIO, C_IDEAL };

/* The job as the columns run it, on generator gen, for data_floor. */
static cfg_t *job_cfg(cli_t *cli, const char *gen, int iters, char *err, size_t n) {
  cfg_t *c;
  if (cfg_create(&c)) return NULL;
  char kv[128];
  int rc = cli->config_path ? cfg_load_file(c, cli->config_path, err, n) : 0;
  for (int i = 0; i < cli->n_sets && !rc; i++) rc = cfg_set(c, cli->sets[i], "--set", err, n);
  for (size_t i = 0; i < N_FIXED && !rc; i++) rc = cfg_set(c, fixed_sets[i], "bench", err, n);
  snprintf(kv, sizeof kv, "synthetic.preset=%s", gen);
  if (!rc) rc = cfg_set(c, kv, "bench", err, n);
  snprintf(kv, sizeof kv, "iterations=%d", iters);
  if (!rc) rc = cfg_set(c, kv, "bench", err, n);
  if (rc) {
    cfg_destroy(c);
    return NULL;
  }
  return c;
}

/* Rows moved per iteration on the critical path and in the background.
 * With lookahead 0 the fetch, the write-back and the critical
 * synchronization wait in the step; with lookahead the fetch is a prefetch
 * L batches ahead and the write-back runs behind, so only the critical
 * rows (synchronized before the step) are on its path.  Delayed rows are
 * background either way. */
static void split_rows(const char *sm, double *crit, double *bg) {
  double f = cli_json_num(sm, "rows_fetched"), s = cli_json_num(sm, "rows_synced"),
         d = cli_json_num(sm, "rows_synced_delayed"), w = cli_json_num(sm, "rows_written_back");
  if (cli_json_num(sm, "lookahead") > 0) {
    *crit = s - d;
    *bg = f + w + d;
  } else {
    *crit = f + w + (s - d);
    *bg = d;
  }
}

static int bench_gen(cli_t *cli, const char *self, const char *tmp, const char *gen, const char *up_args, int iters) {
  static const int ph[] = {PHASE_WAIT,     PHASE_FETCH,     PHASE_PREFETCH_WAIT, PHASE_SYNC_WAIT,
                           PHASE_FORWARD,  PHASE_BACKWARD,  PHASE_ALLTOALL,      PHASE_ALLREDUCE,
                           PHASE_SYNC_CRITICAL, PHASE_UPDATE, PHASE_REPLICATE,   PHASE_WRITE_BACK, PHASE_TOTAL};
  static const char *names[] = {"data wait", "fetch",         "  blocked on prefetch", "wait for background",
                                "forward",   "backward",      "  alltoall (fwd+bwd)",  "all-reduce",
                                "  critical rows", "update",  "  replication",         "write-back",
                                "iteration"};
  enum { N_PH = sizeof ph / sizeof ph[0] };
  static const char *rows[] = {"rows_fetched",      "rows_synced", "rows_synced_delayed", "rows_replicated",
                               "rows_written_back", "cache_hits"};
  static const char *rnames[] = {"rows fetched / iteration",  "rows synchronized / iter.", "  of which delayed",
                                 "  of which handed over",    "rows written back / iter.", "cache hits / iteration"};
  char dir[1200], sets[600], err[512];
  char *sm[N_COLS] = {0};
  int rc = 0;
  printf("=== data: synthetic.preset = %s\n", gen);
  fflush(stdout);
  for (size_t c = 0; c < N_COLS && !rc; c++) {
    snprintf(dir, sizeof dir, "%s/%s-%s", tmp, gen, cols[c].dir);
    snprintf(sets, sizeof sets, "%s --set synthetic.preset=%s", cols[c].sets, gen);
    if (!(sm[c] = run(cli, self, dir, sets, up_args, iters))) rc = 1;
    else if (g_report) {
      char out[2400];
      snprintf(out, sizeof out, "%s/%s-%s", g_report, gen, cols[c].dir);
      bench_report(self, dir, out);
    }
  }
  /* the floor, over the lookahead run's window */
  data_floor_t fl = {0};
  int have_floor = 0;
  cfg_t *jc = rc ? NULL : job_cfg(cli, gen, iters, err, sizeof err);
  if (!rc && jc) {
    data_source_t *d;
    uint32_t window = (uint32_t)cli_json_num(sm[C_LA], "lookahead");
    if (data_open(jc, &d, err, sizeof err) == 0) {
      have_floor = data_floor(d, (uint32_t)cfg_int(jc, "batch_size"), 2, window, (uint32_t)iters, &fl, err,
                              sizeof err) == 0;
      data_close(d);
    }
    if (!have_floor) fprintf(stderr, "bench e2e: no traffic floor: %s\n", err);
  }
  double row_bytes = 0;
  if (jc) {
    uint32_t dim = (uint32_t)cfg_int(jc, "embedding_dim");
    row_bytes = 4.0 * (dim + (uint32_t)cfg_state_floats(cfg_str(jc, "embedding_optimizer"), dim));
  }
  if (rc == 0) {
    printf("%-26s", "");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14s", cols[c].label);
    printf("\n%-26s", "samples/s");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "samples_per_sec"));
    printf("\n%-26s", "  after iteration 0");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "steady_samples_per_sec"));
    printf("\n%-26s", "iteration 0 (start-up)");
    for (size_t c = 0; c < N_COLS; c++) printf(" %11.0f ms", 1e3 * cli_json_num(sm[c], "first_iteration_seconds"));
    printf("\n%-26s", "last iteration (wind-down)");
    for (size_t c = 0; c < N_COLS; c++) printf(" %11.0f ms", 1e3 * cli_json_num(sm[c], "last_iteration_seconds"));
    printf("\n");
    for (int i = 0; i < N_PH; i++) {
      printf("%-26s", names[i]);
      for (size_t c = 0; c < N_COLS; c++)
        printf(" %11.2f ms", 1e3 * cli_json_num(strstr(sm[c], "\"steady_phase_seconds\""), phase_name(ph[i])));
      printf("\n");
    }
    for (int i = 0; i < 6; i++) {
      printf("%-26s", rnames[i]);
      for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], rows[i]));
      printf("\n");
    }
    double crit[N_COLS], bg[N_COLS];
    for (size_t c = 0; c < N_COLS; c++) split_rows(sm[c], &crit[c], &bg[c]);
    printf("%-26s", "rows, critical path / it.");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", crit[c]);
    printf("\n%-26s", "rows, background / it.");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", bg[c]);
    printf("\n%-26s", "KiB, critical path / it.");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.1f", crit[c] * row_bytes / 1024);
    printf("\n%-26s", "KiB, background / it.");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.1f", bg[c] * row_bytes / 1024);
    printf("\n%-26s", "fetched+synced / floor");
    for (size_t c = 0; c < N_COLS; c++) {
      double m = cli_json_num(sm[c], "rows_fetched") + cli_json_num(sm[c], "rows_synced");
      if (have_floor && fl.per_iteration > 0 && c < C_IDEAL) printf(" %13.2fx", m / fl.per_iteration);
      else printf(" %14s", "-");
    }
    printf("\n%-26s", "iteration after it. 0");
    for (size_t c = 0; c < N_COLS; c++) printf(" %11.2f ms", 1e3 * cli_json_num(sm[c], "steady_iteration_seconds"));
    printf("\n%-26s", "lookahead L");
    for (size_t c = 0; c < N_COLS; c++) printf(" %14.0f", cli_json_num(sm[c], "lookahead"));
    printf("\n\n");
    if (have_floor)
      printf("traffic floor (%s): %.0f rows / iteration = %.0f first used inside the window of L = %u batches + %.0f "
             "used by both trainers in one batch (contiguous allocation, %u batches)\n",
             gen, fl.per_iteration, (double)fl.first_use / fl.batches, fl.window, (double)fl.shared / fl.batches,
             fl.batches);
    double b = cli_json_num(sm[C_BASE], "steady_samples_per_sec"),
           id = cli_json_num(sm[C_IDEAL], "steady_iteration_seconds"),
           ids = cli_json_num(sm[C_IDEAL], "steady_samples_per_sec");
    double mb = cli_json_num(sm[C_BASE], "rows_fetched") + cli_json_num(sm[C_BASE], "rows_synced");
    for (size_t c = C_LA; c <= C_LAIA; c++) {
      double la = cli_json_num(sm[c], "steady_samples_per_sec"), lit = cli_json_num(sm[c], "steady_iteration_seconds");
      double ml = cli_json_num(sm[c], "rows_fetched") + cli_json_num(sm[c], "rows_synced");
      printf("%s vs baseline: %.2fx samples/s; rows fetched + synchronized per iteration %.0f -> %.0f (%.0f%% "
             "fewer; aim >= 80%% on sessions)",
             cols[c].label, la / b, mb, ml, mb > 0 ? 100.0 * (1.0 - ml / mb) : 0.0);
      if (have_floor && fl.per_iteration > 0) printf(", %.2fx the floor (aim <= 1.3)", ml / fl.per_iteration);
      printf("; iteration time %.0f%% above ideal (aim <= 10%%).\n", 100.0 * (lit / id - 1.0));
    }
    printf("ideal / baseline: %.2fx samples/s after iteration 0 (aim on emulated hosts: >= 2, or the link is not the "
           "bottleneck).\n",
           ids / b);
    /* issue 17's aims: the best of the three strategies against ideal, auto against the best fixed one */
    static const size_t strat_cols[] = {C_LA, C_PART, C_ROWS, C_AUTO};
    size_t best = C_LA, best_fixed = C_LA; /* fixed: the two auto chooses from, cache and partition */
    for (size_t i = 0; i < sizeof strat_cols / sizeof strat_cols[0]; i++) {
      size_t c = strat_cols[i];
      double v = cli_json_num(sm[c], "steady_samples_per_sec");
      if (v > cli_json_num(sm[best], "steady_samples_per_sec")) best = c;
      if ((c == C_LA || c == C_PART) && v > cli_json_num(sm[best_fixed], "steady_samples_per_sec")) best_fixed = c;
    }
    double bv = cli_json_num(sm[best], "steady_samples_per_sec"),
           fv = cli_json_num(sm[best_fixed], "steady_samples_per_sec"),
           av = cli_json_num(sm[C_AUTO], "steady_samples_per_sec");
    printf("best of cache / partition / partition_rows / auto: %s, %.0f samples/s = %.0f%% of ideal (aim >= 90%%); "
           "strategy auto: %.0f%% of the better of cache and partition (%s; aim >= 95%%).\n",
           cols[best].label, bv, 100.0 * bv / ids, 100.0 * av / fv, cols[best_fixed].label);
    double yv = cli_json_num(sm[C_AUTO_MODEL], "steady_samples_per_sec");
    printf("strategy auto on the cost model's predicted microseconds (auto, model: strategy.auto_cost = model) against "
           "weighted bytes (strategy auto, the default): %.0f vs %.0f samples/s, %.2fx.\n",
           yv, av, av > 0 ? yv / av : 0.0);
    double pv = cli_json_num(sm[C_AUTO_PRIO], "steady_samples_per_sec");
    printf("collectives in one priority queue (trainer.comm_schedule = priority) against each thread issuing its own "
           "(threads, the default; the strategy auto column): %.0f vs %.0f samples/s, %.0f%%.\n\n",
           pv, av, av > 0 ? 100.0 * pv / av : 0.0);
  }
  if (jc) cfg_destroy(jc);
  for (size_t c = 0; c < N_COLS; c++) free(sm[c]);
  return rc;
}

int bench_e2e(cli_t *cli) {
  int quick = cli_flag(cli, "--quick");
  const char *data = cli_opt(cli, "--data"), *hosts = cli_opt(cli, "--hosts"), *link = cli_opt(cli, "--link");
  int insecure = cli_flag(cli, "--insecure");
  g_report = cli_opt(cli, "--report");
  if (cli_done(cli, "e2e")) return 2;
  if (!data) data = "both";
  if (strcmp(data, "both") && strcmp(data, "independent") && strcmp(data, "sessions"))
    return cli_usage_error(cli, "--data %s: independent, sessions or both", data);
  if (link && !hosts) return cli_usage_error(cli, "--link needs --hosts (the links are those of emulated hosts)");
  if (hosts && !link) link = BENCH_LINK;
  char up_args[512] = "";
  int o = 0;
  if (hosts) {
    o = snprintf(up_args, sizeof up_args, "--hosts '%s'", hosts);
    if (link) o += snprintf(up_args + o, sizeof up_args - (size_t)o, " --link '%s'", link);
  }
  if (insecure) snprintf(up_args + o, sizeof up_args - (size_t)o, "%s--insecure", o ? " " : "");
  int iters = quick ? 60 : 200;
  char self[1024], tmp[] = "/tmp/chanter-bench-e2e-XXXXXX";
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) return 1;
  printf("chanter bench e2e: %s (1 data processor, 2 embedding servers, oracle, 2 trainers), %d iterations, "
         "batch %lld%s%s%s\n\n",
         hosts ? "emulated hosts" : "local cluster on 127.0.0.1", iters, (long long)cfg_int(cli->cfg, "batch_size"),
         up_args[0] ? ", local up " : "", up_args, insecure ? "" : " (mutual TLS: --insecure for plaintext)");
  int rc = 0;
  if (strcmp(data, "sessions")) rc = bench_gen(cli, self, tmp, "independent", up_args, iters);
  if (!rc && strcmp(data, "independent")) rc = bench_gen(cli, self, tmp, "sessions", up_args, iters);
  printf("(speed and iteration time after iteration 0, whose wait holds the start-up: lookahead = auto plans "
         "oracle.measure_batches batches and chooses L before the first Step, shown on its own line)\n"
         "(lookahead+laia: allocation = laia, samples placed on the trainer that holds their rows; the baseline "
         "and ideal use the job's allocation; the floor assumes contiguous allocation)\n"
         "(critical path: rows the step waits for -- with L = 0 the fetch, the write-back and the critical "
         "synchronization; with lookahead only the critical synchronization; bytes = rows x (embedding_dim + "
         "optimizer state) x 4)\n"
         "(partition: table_strategy = partition, every table's rows on one trainer, pooled embeddings by AlltoAll; "
         "partition_rows: every table's rows spread over both trainers, partial sums by AlltoAll; "
         "strategy auto: the oracle's choice per table, weighing bytes; \"auto, model\": the same on the cost model's "
         "predicted microseconds (strategy.auto_cost = model); \"auto, priority\": the same with trainer.comm_schedule = "
         "priority, one queue of collectives per trainer instead of every thread issuing its own; the wind-down is the last iteration, whose write-back of "
         "the rows newer than the servers' ends the job, set apart from the steady figures like the start-up)\n"
         "(\"ideal, 1 AR\": the dense gradients all-reduced in one buffer after the backward, trainer.bucket_kb = 0; "
         "ideal keeps every row in the trainer and is not a correct distributed model, only the lower bound of "
         "iteration time; per-phase times are means over trainers and the iterations after iteration 0, as the "
         "iteration line: steady_phase_seconds)\n");
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (rc == 0 && system(cmd) != 0) fprintf(stderr, "bench e2e: could not remove %s\n", tmp);
  return rc;
}
