/*
 * chanter bench shard: the sharding planner (common/plan/shard_plan.h).
 *
 *   chanter bench shard [--model FILE] [--data FILE [--holdout F] [--seed S]] [--runs N]
 *
 * Planning time of every algorithm for 100 tables over 8 devices and 856
 * over 64 (the paper's task sizes: papers/autoshard.txt 5.1), each stated
 * as a ratio to lookup_greedy's time measured in the same run, and each
 * algorithm's predicted max cost, degree of balance (min / max) and
 * speedup over random (random's max / its max).  Aims: autoshard under
 * 1 s and under 10 s.  Tables are drawn from the paper's statistics of
 * Meta's synthetic tables (Table 1: hash sizes up to 12.5M, mean 4.1M;
 * pooling factors up to 193, mean 15): rows 12.5M x u^2.05 (mean 4.1M),
 * pooling 1 + 192 x u^12.7 rounded (mean 15), dims 8..128, alpha 0..1.2,
 * sgd or adagrad, u uniform; N runs (--runs, 3) draw N sets of tables
 * from seeds 1..N.  No memory limit (the paper's D = tables / 10 fits).
 * The global batch is the job's batch_size.  Every algorithm's time
 * includes embedding each table in the model and evaluating its plan.
 *
 * The model: --model, else shard.cost_model, else the one built in; with
 * none, a model fitted here to the synthetic costs of
 * shard_fit_synthetic_text, and said so (the times are the planner's
 * whatever the model; the predicted costs are then not this machine's).
 * --data FILE (a `chanter bench tables` dataset): the model's error on the
 * sets `chanter shard fit` held out with the same --holdout and --seed
 * (0.2 and 1, its defaults): median and p90, absolute and relative.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cli.h"
#include "shard_cost.h"
#include "shard_fit.h"
#include "shard_plan.h"
#include "table.h"


/* T tables from the paper's statistics (above). */
static void paper_tables(uint32_t T, uint64_t seed, shard_table_t *t, uint64_t *bytes) {
  static const uint32_t dims[] = {8, 16, 32, 64, 128};
  uint64_t s = seed;
  for (uint32_t i = 0; i < T; i++) {
    double r = 12543670.0 * pow(table_rng_unit(&s), 2.05);
    t[i].rows = r < 1 ? 1 : (uint64_t)r;
    t[i].hotness = floor(1 + 192 * pow(table_rng_unit(&s), 12.7) + 0.5);
    t[i].dim = dims[table_rng_next(&s) % 5];
    t[i].alpha = 1.2 * table_rng_unit(&s);
    t[i].opt = (int)(table_rng_next(&s) % 2);
    bytes[i] = t[i].rows * t[i].dim * 4 * (t[i].opt == SHARD_OPT_ADAGRAD ? 2u : 1u);
  }
}

/* The model to plan with; *what says where it came from. */
static shard_cost_t *bench_model_of(cli_t *cli, const char *path, char *what, size_t n) {
  char err[1024];
  shard_cost_t *m = NULL;
  if (!path) path = cfg_str(cli->cfg, "shard.cost_model");
  if (!shard_cost_load(path, &m, err, sizeof err)) {
    snprintf(what, n, "%s: %s", path && *path ? path : "built in", shard_cost_label(m));
    return m;
  }
  if (path && *path) {
    fprintf(stderr, "chanter bench shard: %s\n", err);
    return NULL;
  }
  char *text = shard_fit_synthetic_text(1000, 0, 1);
  shard_data_t d;
  shard_fit_opts_t o = {.holdout = 0, .seed = 1};
  shard_fit_report_t r;
  int rc = !text || shard_fit_parse_data(text, "synthetic", &d, err, sizeof err) || shard_fit(&d, &o, &m, &r, err, sizeof err);
  if (text) shard_fit_data_close(&d);
  free(text);
  if (rc) {
    fprintf(stderr, "chanter bench shard: fitting a synthetic model: %s\n", err);
    return NULL;
  }
  snprintf(what, n, "no fitted model (%.200s); a model fitted to synthetic costs (shard_fit_synthetic_text): the times are "
           "the planner's, the costs are not this machine's", err);
  return m;
}

static int accuracy(const shard_cost_t *m, const char *data, double holdout, uint64_t seed) {
  char err[1024];
  shard_data_t d;
  if (shard_fit_load_data(data, &d, err, sizeof err)) {
    fprintf(stderr, "chanter bench shard: %s\n", err);
    shard_fit_data_close(&d);
    return 1;
  }
  uint8_t *held = malloc(d.n ? d.n : 1);
  if (!held) return 1;
  shard_fit_split(&d, holdout, seed, held);
  printf("held-out accuracy on %s (%.0f%% held out, seed %llu; measured on %s): predicted against measured cost of a set\n",
         data, 100 * holdout, (unsigned long long)seed, d.cpu[0] ? d.cpu : "an unnamed machine");
  printf("  %-8s %6s %14s %14s %12s %12s\n", "kind", "sets", "median abs us", "p90 abs us", "median rel", "p90 rel");
  for (int k = 0; k < SHARD_KINDS; k++) {
    if (!shard_cost_has(m, k)) continue;
    shard_fit_err_t e;
    shard_fit_errors(m, &d, k, held, 1, &e);
    printf("  %-8s %6zu %14.1f %14.1f %11.1f%% %11.1f%%\n", shard_kind_name(k), e.n, e.med_abs, e.p90_abs, 100 * e.med_rel, 100 * e.p90_rel);
  }
  printf("  aim: median relative error within 15%%\n\n");
  free(held);
  shard_fit_data_close(&d);
  return 0;
}

int bench_shard(cli_t *cli) {
  const char *mp = cli_opt(cli, "--model"), *data = cli_opt(cli, "--data"), *ho = cli_opt(cli, "--holdout"),
             *sd = cli_opt(cli, "--seed"), *rs = cli_opt(cli, "--runs");
  if (cli_done(cli, "shard")) return 2;
  int runs = rs ? atoi(rs) : 3;
  if (runs < 1 || runs > 100) return cli_usage_error(cli, "--runs %s is not in [1, 100]", rs);
  char what[512], err[1024];
  shard_cost_t *m = bench_model_of(cli, mp, what, sizeof what);
  if (!m) return 1;
  int kind = shard_cost_has(m, SHARD_KIND_TRAINER) ? SHARD_KIND_TRAINER : SHARD_KIND_SERVER, rc = 0;
  printf("chanter bench shard: model %s\n", what);
  if (data) rc = accuracy(m, data, ho ? atof(ho) : 0.2, sd ? strtoull(sd, NULL, 10) : 1);
  static const struct {
    uint32_t T, D;
    double aim_s;
  } cases[] = {{100, 8, 1}, {856, 64, 10}};
  uint32_t batch = (uint32_t)cfg_int(cli->cfg, "batch_size");
  printf("planning (%s kind, batch %u (batch_size), %d runs of tables drawn from the paper's statistics; means over the runs)\n",
         shard_kind_name(kind), batch, runs);
  printf("  %6s %7s  %-14s %12s %10s %9s %10s %10s %9s\n", "tables", "devices", "algorithm", "time (ms)", "x lookup", "balance",
         "vs random", "max (ms)", "evals");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !rc; c++) {
    uint32_t T = cases[c].T, D = cases[c].D;
    shard_table_t *t = calloc(T, sizeof *t);
    uint64_t *bytes = calloc(T, sizeof *bytes);
    double ms[SHARD_ALGOS] = {0}, bal[SHARD_ALGOS] = {0}, spd[SHARD_ALGOS] = {0}, mx[SHARD_ALGOS] = {0}, ev[SHARD_ALGOS] = {0}, worst = 0;
    if (!t || !bytes) rc = 1;
    for (int r = 1; r <= runs && !rc; r++) {
      paper_tables(T, (uint64_t)r, t, bytes);
      shard_plan_in_t in = {t, bytes, NULL, T, D, 0, m, kind, batch, (uint64_t)r, 0};
      shard_plan_t p[SHARD_ALGOS];
      for (int a = 0; a < SHARD_ALGOS && !rc; a++) {
        double t0 = clock_mono_s();
        if (shard_plan_run(&in, a, &p[a], err, sizeof err)) {
          fprintf(stderr, "chanter bench shard: %s: %s\n", shard_algo_name(a), err);
          rc = 1;
          for (int b = 0; b < a; b++) shard_plan_close(&p[b]);
          break;
        }
        double dt = (clock_mono_s() - t0) * 1e3;
        ms[a] += dt / runs, bal[a] += p[a].balance / runs, mx[a] += p[a].max_cost / 1e3 / runs, ev[a] += (double)p[a].evals / runs;
        if (a == SHARD_ALGO_AUTOSHARD && dt > worst) worst = dt;
      }
      if (rc) break;
      for (int a = 0; a < SHARD_ALGOS; a++) spd[a] += p[SHARD_ALGO_RANDOM].max_cost / p[a].max_cost / runs;
      for (int a = 0; a < SHARD_ALGOS; a++) shard_plan_close(&p[a]);
    }
    for (int a = 0; a < SHARD_ALGOS && !rc; a++)
      printf("  %6u %7u  %-14s %12.2f %9.1fx %8.1f%% %9.2fx %10.2f %9.0f\n", T, D, shard_algo_name(a), ms[a],
             ms[a] / ms[SHARD_ALGO_LOOKUP_GREEDY], 100 * bal[a], spd[a], mx[a], ev[a]);
    if (!rc)
      printf("  aim: autoshard under %.0f s for %u tables over %u devices: slowest run %.3f s (%s)\n", cases[c].aim_s, T, D,
             worst / 1e3, worst / 1e3 < cases[c].aim_s ? "met" : "NOT met");
    free(t);
    free(bytes);
  }
  shard_cost_destroy(m);
  return rc;
}
