/*
 * chanter bench placement: where the oracle puts the partitioned tables,
 * measured on a local cluster.
 *
 *   chanter [--set k=v ...] bench placement --job FILE [--trainers 2,4] [--rounds N] [--insecure] [--keep]
 *
 * For each trainer count, the job FILE (table_strategy = partition, e.g.
 * deploy/jobs/dlrmv2-hetero.ini) runs on a local cluster (`chanter local
 * up`, train, down) with shard.placement = autoshard and = lookup_greedy,
 * interleaved (round 1 autoshard first, round 2 lookup_greedy first, ...),
 * N rounds (--rounds, 2).  Each run's summary.json gives the measured work
 * of each trainer on its own tables per steady iteration
 * (partition_compute_seconds: pooling for the global batch, fold, row
 * update; not the AlltoAlls), its min / max (partition_balance), the
 * planner's predicted balance (placement) and steady samples/s.  Printed
 * per run (with the balance the cost model predicts for the run's owners:
 * shard_plan_eval; the model is the job's shard.cost_model, else the one
 * built in, else none), then per placement the means over the rounds,
 * each trainer's measured time next to the model's prediction for the
 * tables it got, the oracle's predicted balance, the tables on each
 * trainer, and autoshard / lookup_greedy: measured balance and samples/s
 * with the aims (balance >= 85%, samples/s >= 1.2x) printed next to them,
 * never asserted, and whether every run gave the same digest (the
 * placement changes no bits).
 *
 * The job: FILE, then eval_batches = 0 (no evaluation: it is not part of
 * the steady figures), then the --set options, then trainers and
 * shard.placement.  Keep iterations modest on a small machine (--set
 * iterations=150): four trainers, two embedding servers, a data processor
 * and the oracle share its cores.  --keep leaves the runs' work dirs.
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
#include "json.h"
#include "shard_cost.h"
#include "shard_plan.h"
#include "strategy.h"
#include "table.h"

#define MAX_COUNTS 8   /* trainer counts */
#define MAX_P 64       /* trainers in one run */
#define MAX_ROUNDS 20

enum { PL_AUTO, PL_LOOKUP, N_PL };
static const char *const pl_names[N_PL] = {"autoshard", "lookup_greedy"};

/* One run's figures, from its summary.json. */
typedef struct run_s {
  int ok;
  double ms[MAX_P];    /* measured ms per iteration on each trainer's own tables */
  double balance, predicted, lookup_predicted, sps, iter_ms;
  char algorithm[160], digest[80];
  uint32_t *owner;     /* T: the summary's owner, SHARD_PLAN_SPREAD (partition_rows), UINT32_MAX (cache) */
} run_t;

/* The job as the runs see it, for the model's predictions. */
typedef struct bjob_s {
  cfg_t *cfg;
  uint32_t T, batch;
  shard_table_t *tables;
  shard_cost_t *model; /* NULL: no predictions */
  char model_what[1700];
} bjob_t;

static int job_open(cli_t *cli, const char *path, bjob_t *j) {
  char err[1024];
  data_schema_t schema = {0};
  table_layout_t layout = {0};
  double *alpha = NULL;
  int rc = 1, have_layout = 0;
  memset(j, 0, sizeof *j);
  if (cfg_create(&j->cfg)) return 1;
  if (cfg_load_file(j->cfg, path, err, sizeof err) || cfg_set(j->cfg, "eval_batches=0", "bench", err, sizeof err))
    goto out;
  for (int i = 0; i < cli->n_sets; i++)
    if (cfg_set(j->cfg, cli->sets[i], "--set", err, sizeof err)) goto out;
  if (cfg_layout(j->cfg, &layout, err, sizeof err)) goto out;
  have_layout = 1;
  if (data_schema_from_cfg(j->cfg, &schema, err, sizeof err)) goto out;
  j->T = layout.n_tables, j->batch = (uint32_t)cfg_int(j->cfg, "batch_size");
  j->tables = calloc(j->T ? j->T : 1, sizeof *j->tables);
  alpha = calloc(j->T ? j->T : 1, sizeof *alpha);
  if (!j->tables || !alpha) {
    snprintf(err, sizeof err, "out of memory");
    goto out;
  }
  if (data_table_alpha(j->cfg, j->T, alpha, err, sizeof err)) goto out;
  int o = shard_opt_parse(cfg_str(j->cfg, "embedding_optimizer"));
  for (uint32_t t = 0; t < j->T; t++)
    j->tables[t] = (shard_table_t){layout.tables[t].rows, layout.tables[t].dim, schema.hotness[t], alpha[t],
                                   o < 0 ? SHARD_OPT_SGD : o};
  const char *mp = cfg_str(j->cfg, "shard.cost_model");
  if (shard_cost_load(mp, &j->model, err, sizeof err) == 0 && shard_cost_has(j->model, SHARD_KIND_TRAINER)) {
    snprintf(j->model_what, sizeof j->model_what, "%s (%s)", *mp ? mp : "built in", shard_cost_label(j->model));
  } else {
    snprintf(j->model_what, sizeof j->model_what, "none, no predictions (%s)", err);
    shard_cost_destroy(j->model);
    j->model = NULL;
  }
  rc = 0;
out:
  if (rc && strstr(err, path)) fprintf(stderr, "chanter bench placement: %s\n", err);
  else if (rc) fprintf(stderr, "chanter bench placement: %s: %s\n", path, err);
  data_schema_close(&schema);
  if (have_layout) table_layout_close(&layout);
  free(alpha);
  return rc;
}

static void job_close(bjob_t *j) {
  if (j->cfg) cfg_destroy(j->cfg);
  free(j->tables);
  shard_cost_destroy(j->model);
}

/* The owners of summary's tables into owner[T]; 0, or -1 when the list
 * does not name T tables. */
static int summary_owners(const char *sm, uint32_t T, uint32_t *owner) {
  const char *p = strstr(sm, "\"tables\": [");
  uint32_t n = 0;
  while (p && n < T && (p = strstr(p, "{\"table\": ")) != NULL) {
    unsigned t, o;
    char strat[32];
    int k = sscanf(p, "{\"table\": %u, \"strategy\": \"%31[^\"]\", \"owner\": %u", &t, strat, &o);
    if (k < 2 || t != n) return -1;
    owner[n++] = !strcmp(strat, "partition") && k == 3 ? o : !strcmp(strat, "partition_rows") ? SHARD_PLAN_SPREAD
                                                                                               : UINT32_MAX;
    p++;
  }
  return n == T ? 0 : -1;
}

/* up, train, down of the job with trainers = P, shard.placement = pl, in
 * dir; the run's figures into *r (r->ok: the run gave a summary). */
static void run_one(cli_t *cli, const char *self, const char *job, const char *dir, uint32_t P, int pl, int insecure,
                    uint32_t T, run_t *r) {
  char cmd[8192];
  int o = snprintf(cmd, sizeof cmd, "'%s' --config '%s' --set eval_batches=0", self, job);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set trainers=%u --set shard.placement=%s local up%s --workdir '%s' >'%s.up' 2>&1",
                P, pl_names[pl], insecure ? " --insecure" : "", dir, dir);
  r->ok = 0;
  if (system(cmd) != 0) {
    fprintf(stderr, "bench placement: local up failed; see %s.up\n", dir);
    snprintf(cmd, sizeof cmd, "%s.up", dir);
    cli_tail_file(cmd);
    return;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench placement: local down reported a problem in %s\n", dir);
  if (rc != 0) {
    fprintf(stderr, "bench placement: the job (%u trainers, %s) failed; see %s.train and %s/logs/\n", P, pl_names[pl],
            dir, dir);
    return;
  }
  char path[4200], *sm = NULL;
  snprintf(path, sizeof path, "%s/summary.json", dir);
  if (fsio_read_all(path, 0, &sm, NULL, NULL, 0) != 0 || !sm) {
    fprintf(stderr, "bench placement: no %s\n", path);
    return;
  }
  int bad = summary_owners(sm, T, r->owner);
  for (uint32_t p = 0; p < P && !bad; p++) {
    double v;
    if (json_get_num_at(sm, "partition_compute_seconds", p, &v)) bad = 1;
    r->ms[p] = 1e3 * v;
  }
  if (bad) {
    fprintf(stderr, "bench placement: %s lacks the tables' owners or partition_compute_seconds of %u trainers (a build "
            "from before them?)\n", path, P);
    free(sm);
    return;
  }
  r->balance = cli_json_num(sm, "partition_balance");
  r->predicted = cli_json_num(sm, "predicted_balance");
  r->lookup_predicted = cli_json_num(sm, "lookup_greedy_balance");
  r->sps = cli_json_num(sm, "steady_samples_per_sec");
  r->iter_ms = 1e3 * cli_json_num(sm, "steady_iteration_seconds");
  if (json_get_str(sm, "algorithm", r->algorithm, sizeof r->algorithm)) snprintf(r->algorithm, sizeof r->algorithm, "?");
  json_get_str(sm, "digest", r->digest, sizeof r->digest);
  free(sm);
  r->ok = 1;
}

/* The model's predicted ms per iteration of each trainer's tables under
 * owner (NAN without a model or when the owners do not evaluate). */
static void predict(const bjob_t *j, uint32_t P, const uint32_t *owner, double *ms) {
  for (uint32_t p = 0; p < P; p++) ms[p] = NAN;
  if (!j->model) return;
  shard_table_t *tab = calloc(j->T ? j->T : 1, sizeof *tab);
  uint32_t *own = calloc(j->T ? j->T : 1, sizeof *own);
  uint8_t *spread = calloc(j->T ? j->T : 1, 1);
  uint64_t *bytes = calloc(j->T ? j->T : 1, sizeof *bytes);
  uint32_t n = 0;
  shard_plan_t out = {0};
  char err[512];
  if (tab && own && spread && bytes) {
    for (uint32_t t = 0; t < j->T; t++) {
      if (owner[t] == UINT32_MAX) continue; /* cached */
      tab[n] = j->tables[t], own[n] = owner[t], spread[n] = owner[t] == SHARD_PLAN_SPREAD;
      n++;
    }
    shard_plan_in_t in = {tab, bytes, spread, n, P, 0, j->model, SHARD_KIND_TRAINER, j->batch, 0, 0};
    if (n && shard_plan_eval(&in, own, &out, err, sizeof err) == 0)
      for (uint32_t p = 0; p < P; p++) ms[p] = out.cost[p] / 1e3;
    else if (n)
      fprintf(stderr, "bench placement: predicting the trainers' costs: %s\n", err);
  }
  shard_plan_close(&out);
  free(tab), free(own), free(spread), free(bytes);
}

static double minmax(const double *v, uint32_t n) {
  double lo = INFINITY, hi = 0;
  for (uint32_t i = 0; i < n; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
  return hi > 0 ? lo / hi : NAN;
}

static void print_ms(const double *v, uint32_t P) {
  for (uint32_t p = 0; p < P; p++) printf(" %7.2f", v[p]);
}

/* The costliest partitioned table on its own as the model predicts it,
 * against the mean trainer's measured time of each placement: no
 * whole-table placement is better balanced than mean / that table's cost
 * when it is above the mean. */
static void heaviest(const bjob_t *j, uint32_t P, const uint32_t *owner, double mean[N_PL][MAX_P]) {
  if (!j->model) return;
  double best = -1;
  uint32_t bt = 0;
  for (uint32_t t = 0; t < j->T; t++) {
    if (owner[t] == UINT32_MAX || owner[t] == SHARD_PLAN_SPREAD) continue;
    double c = shard_cost_predict(j->model, SHARD_KIND_TRAINER, &j->tables[t], 1, j->batch) / 1e3;
    if (c > best) best = c, bt = t;
  }
  if (best < 0) return;
  printf("costliest table alone (predicted): table %u, %.2f ms; the mean trainer's measured time:", bt, best);
  for (int pl = 0; pl < N_PL; pl++) {
    double m = 0;
    for (uint32_t p = 0; p < P; p++) m += mean[pl][p] / P;
    printf(" %.2f ms (%s)", m, pl_names[pl]);
  }
  printf("\n");
}

/* The table ids each trainer holds under owner. */
static void print_tables(const uint32_t *owner, uint32_t T, uint32_t P) {
  for (uint32_t p = 0; p < P; p++) {
    printf("%s trainer %u [", p ? "," : "", p);
    for (uint32_t t = 0, f = 1; t < T; t++)
      if (owner[t] == p) printf(f ? "%u" : " %u", t), f = 0;
    printf("]");
  }
  printf("\n");
}

/* Every round of P trainers; 0, or 1 when a run failed. */
static int bench_count(cli_t *cli, const char *self, const char *job, const char *tmp, const bjob_t *j, uint32_t P,
                       int rounds, int insecure) {
  run_t runs[N_PL][MAX_ROUNDS];
  int rc = 0, same = 1;
  memset(runs, 0, sizeof runs);
  for (int pl = 0; pl < N_PL; pl++)
    for (int r = 0; r < rounds; r++)
      if (!(runs[pl][r].owner = calloc(j->T ? j->T : 1, sizeof *runs[pl][r].owner))) rc = 1;
  printf("=== %u trainers: %d rounds, autoshard and lookup_greedy interleaved\n", P, rounds);
  printf("%-5s %-14s %10s %9s %9s %9s  %s\n", "round", "placement", "samples/s", "iter ms", "balance", "predicted",
         "measured ms per iteration on trainer 0, 1, ...");
  for (int r = 0; r < rounds && !rc; r++)
    for (int k = 0; k < N_PL && !rc; k++) {
      int pl = r % 2 ? N_PL - 1 - k : k;
      run_t *x = &runs[pl][r];
      char dir[1400];
      snprintf(dir, sizeof dir, "%s/p%u-%s-%d", tmp, P, pl_names[pl], r + 1);
      run_one(cli, self, job, dir, P, pl, insecure, j->T, x);
      if (!x->ok) {
        rc = 1;
        break;
      }
      double pm[MAX_P];
      predict(j, P, x->owner, pm);
      printf("%-5d %-14s %10.0f %9.2f %8.1f%% %8.1f%% ", r + 1, pl_names[pl], x->sps, x->iter_ms, 100 * x->balance,
             100 * minmax(pm, P));
      print_ms(x->ms, P);
      if (strcmp(x->algorithm, pl_names[pl])) printf("  (placed by: %s)", x->algorithm);
      printf("\n");
      fflush(stdout);
      same &= !strcmp(x->digest, runs[0][0].digest);
    }
  if (!rc) {
    double mean[N_PL][MAX_P] = {{0}}, pred[N_PL][MAX_P], sps[N_PL] = {0}, bal_runs[N_PL] = {0}, bal[N_PL];
    printf("mean over the %d rounds (balance: min / max of the mean times; per trainer: measured / predicted ms)\n", rounds);
    for (int pl = 0; pl < N_PL; pl++) {
      for (int r = 0; r < rounds; r++) {
        for (uint32_t p = 0; p < P; p++) mean[pl][p] += runs[pl][r].ms[p] / rounds;
        sps[pl] += runs[pl][r].sps / rounds;
        bal_runs[pl] += runs[pl][r].balance / rounds;
      }
      bal[pl] = minmax(mean[pl], P);
      predict(j, P, runs[pl][0].owner, pred[pl]);
      printf("  %-14s %10.0f samples/s, balance %5.1f%% (runs' mean %5.1f%%), predicted %5.1f%% (the oracle's: "
             "%.1f%%);", pl_names[pl], sps[pl], 100 * bal[pl], 100 * bal_runs[pl], 100 * minmax(pred[pl], P),
             100 * (pl == PL_AUTO ? runs[pl][0].predicted : runs[PL_AUTO][0].lookup_predicted));
      for (uint32_t p = 0; p < P; p++) printf(" %.2f/%.2f", mean[pl][p], pred[pl][p]);
      printf("\n    tables:");
      print_tables(runs[pl][0].owner, j->T, P);
    }
    heaviest(j, P, runs[PL_AUTO][0].owner, mean);
    printf("autoshard / lookup_greedy, %u trainers: measured balance %.1f%% vs %.1f%% (aim: autoshard >= 85%%), "
           "steady samples/s %.2fx (aim: >= 1.2x)\n",
           P, 100 * bal[PL_AUTO], 100 * bal[PL_LOOKUP], sps[PL_AUTO] / sps[PL_LOOKUP]);
    printf("digest: %s in every run of %u trainers%s\n\n", same ? "the same" : "DIFFERS", P,
           same ? " (the placement changes no bits)" : ": a placement changed the model");
  }
  for (int pl = 0; pl < N_PL; pl++)
    for (int r = 0; r < rounds; r++) free(runs[pl][r].owner);
  return rc;
}

/* "2,4" into counts; the number of them, or -1. */
static int parse_counts(const char *s, uint32_t *counts) {
  int n = 0;
  while (s && *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > MAX_P || n == MAX_COUNTS || (*end && *end != ',')) return -1;
    counts[n++] = (uint32_t)v;
    s = *end ? end + 1 : end;
  }
  return n ? n : -1;
}

int bench_placement(cli_t *cli) {
  const char *job = cli_opt(cli, "--job"), *tr = cli_opt(cli, "--trainers"), *rs = cli_opt(cli, "--rounds");
  int insecure = cli_flag(cli, "--insecure"), keep = cli_flag(cli, "--keep");
  if (cli_done(cli, "placement")) return 2;
  if (!job) job = cli->config_path;
  if (!job) return cli_usage_error(cli, "--job FILE: the job to run (table_strategy = partition)");
  uint32_t counts[MAX_COUNTS];
  int n_counts = parse_counts(tr ? tr : "2,4", counts);
  if (n_counts < 0) return cli_usage_error(cli, "--trainers %s: comma-separated counts in [1, %d]", tr, MAX_P);
  int rounds = rs ? atoi(rs) : 2;
  if (rounds < 1 || rounds > MAX_ROUNDS) return cli_usage_error(cli, "--rounds %s is not in [1, %d]", rs, MAX_ROUNDS);
  bjob_t j;
  if (job_open(cli, job, &j)) {
    job_close(&j);
    return 1;
  }
  char self[1024], tmp[] = "/tmp/chanter-bench-placement-XXXXXX";
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) {
    job_close(&j);
    return 1;
  }
  printf("chanter bench placement: %s, %lld iterations, batch %u, %u tables, table_strategy = %s; local cluster on "
         "127.0.0.1 (%lld embedding servers, %lld data processors, the oracle, the trainers)%s\n"
         "cost model: %s\n\n",
         job, (long long)cfg_int(j.cfg, "iterations"), j.batch, j.T, cfg_str(j.cfg, "table_strategy"),
         (long long)cfg_int(j.cfg, "embedding_servers"), (long long)cfg_int(j.cfg, "dataprocs"),
         insecure ? "" : ", mutual TLS (--insecure: plaintext)", j.model_what);
  fflush(stdout);
  int rc = 0;
  for (int c = 0; c < n_counts && !rc; c++) rc = bench_count(cli, self, job, tmp, &j, counts[c], rounds, insecure);
  printf("(measured: summary.json's partition_compute_seconds, each trainer's pooling for the global batch, fold and "
         "row update of its own tables per steady iteration, not the AlltoAlls; balance = min / max over the "
         "trainers; predicted: the cost model on the run's owners (per trainer, and their balance), the oracle's: "
         "summary.json's placement (lookup_greedy's as the autoshard run predicted it); samples/s: steady_samples_per_sec; the runs share this machine's cores, so each "
         "trainer's time includes waiting for a core)\n");
  if (keep) {
    printf("work dirs kept: %s\n", tmp);
  } else {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "bench placement: could not remove %s\n", tmp);
  }
  job_close(&j);
  return rc;
}
