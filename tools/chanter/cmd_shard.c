/*
 * chanter shard: AutoShard's cost model and planner (common/plan/shard_*).
 *
 *   chanter shard fit --data FILE [--out MODEL] [--holdout 0.2] [--seed S] [--steps N] [--wd W] [--size H1,E,H2]
 *   chanter shard plan [--json] [--trainers N] [--servers M] [--model FILE]
 *
 * fit: fits the cost model to a `chanter bench tables` dataset, holding
 * out a seeded share of the measured sets, and prints, per kind (trainer,
 * server), the absolute and relative error on the fitted and the held-out
 * sets (median, p90, mean absolute: the paper's Table 3), next to a plain
 * additive baseline's; --out saves the model (its label names the machine
 * the dataset was measured on, the date, the sets and the held-out error).
 *
 * plan: a dry run of the job's placement, from the job configuration and
 * the model alone (no data is read, nothing is timed): per trainer and per
 * embedding server, the tables placed, the predicted cost per iteration
 * and the degree of balance (min / max predicted cost), for autoshard,
 * lookup_greedy, size_greedy and random side by side, and for servers
 * today's rule (shard_map_init: rows-greedy) too.  Trainers hold the
 * tables whose table_strategy is partition or auto (as if auto partitioned
 * them; an auto table over strategy.partition_mb alone is spread, as the
 * oracle's choice would), spread the partition_rows ones, and leave the
 * cache ones out; each may hold strategy.partition_mb MiB.  Servers hold
 * every table, whole up to shard.table_wise_max_rows rows and spread
 * row-wise above; they have no memory limit (embedding.hot_mb is a memory
 * tier in front of RocksDB, which holds every row).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cli.h"
#include "data.h"
#include "err.h"
#include "sbuf.h"
#include "shard.h"
#include "shard_cost.h"
#include "shard_fit.h"
#include "shard_place.h"
#include "shard_plan.h"
#include "strategy.h"
#include "table.h"

#define N_COLS (SHARD_ALGOS + 1) /* the algorithms, and today's rule (servers) */

/* ---- fit */

static void err_row(const char *what, const char *unit, const shard_fit_err_t *f, const shard_fit_err_t *h) {
  if (!strcmp(unit, "abs"))
    printf("  %-10s abs (us) %9.1f %9.1f %9.1f   %9.1f %9.1f %9.1f\n", what, f->med_abs, f->p90_abs, f->mean_abs, h->med_abs,
           h->p90_abs, h->mean_abs);
  else
    printf("  %-10s rel      %8.1f%% %8.1f%% %9s   %8.1f%% %8.1f%% %9s\n", "", 100 * f->med_rel, 100 * f->p90_rel, "", 100 * h->med_rel,
           100 * h->p90_rel, "");
}

static void json_err(sbuf_t *b, const char *key, const shard_fit_err_t *e) {
  sb_printf(b, "\"%s\": {\"sets\": %zu, ", key, e->n);
  sb_num(b, "median_abs_us", e->med_abs), sb_printf(b, ", "), sb_num(b, "p90_abs_us", e->p90_abs), sb_printf(b, ", ");
  sb_num(b, "mean_abs_us", e->mean_abs), sb_printf(b, ", "), sb_num(b, "median_rel", e->med_rel), sb_printf(b, ", ");
  sb_num(b, "p90_rel", e->p90_rel), sb_printf(b, "}");
}

static int shard_fit_cmd(cli_t *cli) {
  const char *data = cli_opt(cli, "--data"), *outp = cli_opt(cli, "--out"), *ho = cli_opt(cli, "--holdout"),
             *seed_s = cli_opt(cli, "--seed"), *steps_s = cli_opt(cli, "--steps"), *wd_s = cli_opt(cli, "--wd"),
             *size_s = cli_opt(cli, "--size");
  if (cli_done(cli, "fit")) return 2;
  if (!data) return cli_usage_error(cli, "--data FILE is required (a `chanter bench tables` dataset)");
  shard_fit_opts_t o = {.holdout = ho ? atof(ho) : 0.2, .seed = seed_s ? strtoull(seed_s, NULL, 10) : 1,
                        .steps = steps_s ? (uint32_t)atoi(steps_s) : 0};
  if (!(o.holdout >= 0 && o.holdout <= 0.9)) return cli_usage_error(cli, "--holdout %s is not a fraction in [0, 0.9]", ho);
  if (wd_s && !((o.wd = atof(wd_s)) > 0 && o.wd < 10)) return cli_usage_error(cli, "--wd %s is not a weight decay in (0, 10)", wd_s);
  if (size_s && (sscanf(size_s, "%u,%u,%u", &o.h1, &o.e, &o.h2) != 3 || !o.h1 || !o.e || !o.h2 || o.h1 > 64 || o.e > 64 ||
                 o.h2 > 64))
    return cli_usage_error(cli, "--size %s is not H1,E,H2 (each 1..64)", size_s);
  char err[1024];
  shard_data_t d;
  shard_cost_t *m = NULL;
  shard_fit_report_t r;
  int rc = 1;
  if (shard_fit_load_data(data, &d, err, sizeof err)) {
    fprintf(stderr, "chanter shard fit: %s\n", err);
    goto out;
  }
  double t0 = clock_mono_s();
  if (shard_fit(&d, &o, &m, &r, err, sizeof err)) {
    fprintf(stderr, "chanter shard fit: %s: %s\n", data, err);
    goto out;
  }
  double secs = clock_mono_s() - t0;
  char label[512], when[32];
  time_t now = time(NULL);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  snprintf(label, sizeof label, "%s; fitted %s from %s", shard_cost_label(m), when, data);
  shard_cost_set_label(m, label);
  if (outp && shard_cost_save(m, outp, err, sizeof err)) {
    fprintf(stderr, "chanter shard fit: %s\n", err);
    goto out;
  }
  if (cli->json) {
    sbuf_t b = {0};
    sb_printf(&b, "{"), sb_str(&b, "data", data), sb_printf(&b, ", "), sb_str(&b, "label", label);
    sb_printf(&b, ", \"sets\": %zu, ", d.n), sb_num(&b, "holdout", o.holdout), sb_printf(&b, ", \"seed\": %llu, ", (unsigned long long)o.seed);
    sb_num(&b, "fit_seconds", secs), sb_printf(&b, ", "), sb_str(&b, "out", outp ? outp : ""), sb_printf(&b, ", \"kinds\": {");
    int first = 1;
    for (int k = 0; k < SHARD_KINDS; k++) {
      if (!shard_cost_has(m, k)) continue;
      sb_printf(&b, "%s\"%s\": {\"sets_fit\": %zu, \"sets_held\": %zu, \"model\": {", first ? "" : ", ", shard_kind_name(k),
                r.kind[k].sets_fit, r.kind[k].sets_held);
      json_err(&b, "fit", &r.kind[k].fit), sb_printf(&b, ", "), json_err(&b, "held", &r.kind[k].held);
      sb_printf(&b, "}, \"additive\": {"), json_err(&b, "fit", &r.kind[k].add_fit), sb_printf(&b, ", ");
      json_err(&b, "held", &r.kind[k].add_held), sb_printf(&b, "}}");
      first = 0;
    }
    sb_printf(&b, "}, \"coll\": {");
    first = 1;
    for (int op = 0; op < SHARD_COLLS; op++) {
      const shard_coll_t *c = &r.coll[op];
      if (!c->present) continue;
      sb_printf(&b, "%s\"%s\": {\"ranks\": %u, \"calls\": %u, ", first ? "" : ", ", shard_coll_name(op), c->ranks, c->points);
      sb_num(&b, "alpha_us", c->alpha_us), sb_printf(&b, ", "), sb_num(&b, "us_per_mb", c->us_per_mb), sb_printf(&b, ", ");
      sb_num(&b, "median_rel", c->med_rel), sb_printf(&b, "}");
      first = 0;
    }
    sb_printf(&b, "}}\n");
    fputs(b.s, stdout);
    free(b.s);
  } else {
    printf("%zu sets from %s (measured on %s); %.0f%% held out (seed %llu); fitted in %.1f s\n", d.n, data,
           d.cpu[0] ? d.cpu : "an unnamed machine", 100 * o.holdout, (unsigned long long)o.seed, secs);
    for (int k = 0; k < SHARD_KINDS; k++) {
      if (!shard_cost_has(m, k)) continue;
      printf("\n%-7s %zu fitted sets              (median, p90, mean)    %zu held-out sets\n", shard_kind_name(k), r.kind[k].sets_fit,
             r.kind[k].sets_held);
      if (isfinite(r.kind[k].wd_score))
        printf("  weight decay %g (chosen: %.1f%% median relative error on a fifth of the fitted sets held back)\n",
               r.kind[k].wd, 100 * r.kind[k].wd_score);
      err_row("model", "abs", &r.kind[k].fit, &r.kind[k].held);
      err_row("model", "rel", &r.kind[k].fit, &r.kind[k].held);
      err_row("additive", "abs", &r.kind[k].add_fit, &r.kind[k].add_held);
      err_row("additive", "rel", &r.kind[k].add_fit, &r.kind[k].add_held);
    }
    for (int k = 0; k < SHARD_KINDS; k++)
      if (!shard_cost_has(m, k)) printf("\n%s: fewer than 4 sets in the dataset, not fitted\n", shard_kind_name(k));
    for (int op = 0; op < SHARD_COLLS; op++) {
      const shard_coll_t *c = &r.coll[op];
      if (c->present)
        printf("\ncoll %-9s %u calls over %u ranks: %.1f us + %.1f us per MiB a rank (median relative error %.1f%%)", shard_coll_name(op),
               c->points, c->ranks, c->alpha_us, c->us_per_mb, 100 * c->med_rel);
    }
    if (!r.coll[0].present && !r.coll[1].present)
      printf("\ncollectives: not in the dataset (table_strategy = auto then weighs bytes: strategy.cache_weight)");
    printf("\n");
    printf("\nadditive: each table's cost linear in its work terms, a set's the sum (no interaction)\n");
    printf(outp ? "model written to %s (name it with shard.cost_model)\n" : "not saved (--out MODEL)%s\n", outp ? outp : "");
  }
  rc = 0;
out:
  shard_cost_destroy(m);
  shard_fit_data_close(&d);
  return rc;
}

/* ---- plan */

/* One kind of device and what the planner gets for it. */
typedef struct side_s {
  int kind;
  uint32_t devices;
  uint64_t mem_limit;       /* 0: none */
  char limit_why[96];
  uint32_t n;               /* tables given to the planner */
  uint32_t *idx;            /* n: their job table index */
  shard_table_t *tables;    /* n */
  uint64_t *bytes;          /* n */
  uint8_t *spread;          /* n */
  uint32_t left_out;        /* job tables not on this kind (cached ones) */
  int has_current;
  shard_plan_t plan[N_COLS];
  double ms[N_COLS];        /* planning time */
} side_t;

static const char *col_name(int c) { return c < SHARD_ALGOS ? shard_algo_name(c) : "current"; }

static void side_close(side_t *s) {
  for (int c = 0; c < N_COLS; c++) shard_plan_close(&s->plan[c]);
  free(s->idx), free(s->tables), free(s->bytes), free(s->spread);
}

/* The job's tables as the model sees them, their bytes, and notes for the
 * header.  0, or 1 after saying why. */
typedef struct job_s {
  uint32_t T, batch;
  shard_table_t *tables;
  uint64_t *bytes;
  uint8_t *strat;
  table_layout_t layout;
  char alpha_note[160];
} job_t;

static int job_read(const cfg_t *cfg, job_t *j) {
  char err[1024];
  data_schema_t schema = {0};
  int rc = 1;
  memset(j, 0, sizeof *j);
  if (cfg_layout(cfg, &j->layout, err, sizeof err) || data_schema_from_cfg(cfg, &schema, err, sizeof err)) goto out;
  j->T = j->layout.n_tables, j->batch = (uint32_t)cfg_int(cfg, "batch_size");
  j->tables = calloc(j->T, sizeof *j->tables), j->bytes = calloc(j->T, sizeof *j->bytes), j->strat = calloc(j->T, 1);
  if (!j->tables || !j->bytes || !j->strat) {
    snprintf(err, sizeof err, "out of memory");
    goto out;
  }
  if (shard_job_tables(cfg, &schema, &j->layout, j->tables, j->bytes, err, sizeof err) ||
      strategy_parse(cfg, j->T, j->strat, err, sizeof err))
    goto out;
  if (strcmp(cfg_str(cfg, "dataset"), "synthetic"))
    snprintf(j->alpha_note, sizeof j->alpha_note, "dataset is a file: row popularity taken from synthetic.alpha, not measured");
  rc = 0;
out:
  if (rc) fprintf(stderr, "chanter shard plan: %s\n", err);
  data_schema_close(&schema);
  return rc;
}

static void job_close(job_t *j) {
  free(j->tables), free(j->bytes), free(j->strat);
  table_layout_close(&j->layout);
}

static int side_alloc(side_t *s, uint32_t T) {
  s->idx = calloc(T, sizeof *s->idx), s->tables = calloc(T, sizeof *s->tables);
  s->bytes = calloc(T, sizeof *s->bytes), s->spread = calloc(T, 1);
  return s->idx && s->tables && s->bytes && s->spread ? 0 : -1;
}
static void side_add(side_t *s, const job_t *j, uint32_t t, int spread) {
  s->idx[s->n] = t, s->tables[s->n] = j->tables[t], s->bytes[s->n] = j->bytes[t], s->spread[s->n] = (uint8_t)spread;
  s->n++;
}

/* Plans one side with every algorithm (and evaluates today's rule for
 * servers).  0, or 1 after saying why. */
static int side_plan(side_t *s, const job_t *j, const cfg_t *cfg, const shard_cost_t *m) {
  char err[1024];
  shard_plan_in_t in = {s->tables, s->bytes, s->spread, s->n, s->devices, s->mem_limit, m, s->kind, j->batch,
                        (uint64_t)cfg_int(cfg, "seed"), 0};
  for (int a = 0; a < SHARD_ALGOS; a++) {
    double t0 = clock_mono_s();
    if (shard_plan_run(&in, a, &s->plan[a], err, sizeof err)) {
      fprintf(stderr, "chanter shard plan: %ss, %s: %s%s\n", shard_kind_name(s->kind), shard_algo_name(a), err,
              s->mem_limit ? " (raise strategy.partition_mb, or make the table partition_rows or cache)" : "");
      return 1;
    }
    s->ms[a] = (clock_mono_s() - t0) * 1e3;
  }
  if (s->has_current) { /* the job's map (shard_map_from_cfg: shard.table_servers, or rows-greedy), evaluated */
    shard_map_t map;
    uint32_t *owner = calloc(s->n ? s->n : 1, sizeof *owner);
    int rc = owner ? shard_map_from_cfg(&map, cfg, &j->layout, s->devices, err, sizeof err) : -ENOMEM;
    if (!rc) {
      for (uint32_t i = 0; i < s->n; i++) {
        uint32_t o = map.table_server[s->idx[i]];
        owner[i] = o == SHARD_ROWWISE ? SHARD_PLAN_SPREAD : o;
      }
      shard_map_close(&map);
      rc = shard_plan_eval(&in, owner, &s->plan[SHARD_ALGOS], err, sizeof err);
    }
    free(owner);
    if (rc) {
      fprintf(stderr, "chanter shard plan: servers, the job's map: %s\n", rc == -ENOMEM ? "out of memory" : err);
      return 1;
    }
  }
  return 0;
}

static void side_text(const side_t *s) {
  int cols = s->has_current ? N_COLS : SHARD_ALGOS;
  const char *w = shard_kind_name(s->kind);
  uint32_t spread = 0;
  for (uint32_t i = 0; i < s->n; i++) spread += s->spread[i];
  printf("\n%ss: %u, %s; %u tables placed whole, %u spread over all, %u not on %ss\n", w, s->devices, s->limit_why,
         s->n - spread, spread, s->left_out, w);
  printf("  %-12s", "");
  for (int c = 0; c < cols; c++) printf(" %26s", col_name(c));
  printf("\n");
  for (uint32_t d = 0; d < s->devices; d++) {
    char name[32];
    snprintf(name, sizeof name, "%s %u", w, d);
    printf("  %-12s", name);
    for (int c = 0; c < cols; c++) {
      char cell[64];
      snprintf(cell, sizeof cell, "%.0f us %3u t %6.0f MiB", s->plan[c].cost[d], s->plan[c].count[d], s->plan[c].bytes[d] / 1048576.0);
      printf(" %26s", cell);
    }
    printf("\n");
  }
  printf("  %-12s", "max (us)");
  for (int c = 0; c < cols; c++) printf(" %26.0f", s->plan[c].max_cost);
  printf("\n  %-12s", "balance");
  for (int c = 0; c < cols; c++) printf(" %25.1f%%", 100 * s->plan[c].balance);
  printf("\n  %-12s", "vs random");
  for (int c = 0; c < cols; c++) printf(" %25.2fx", s->plan[SHARD_ALGO_RANDOM].max_cost / s->plan[c].max_cost);
  printf("\n  %-12s", "plan (ms)");
  for (int c = 0; c < SHARD_ALGOS; c++) printf(" %26.2f", s->ms[c]);
  printf("\n");
  for (int c = 0; c < cols; c++) {
    printf("  tables, %s:", col_name(c));
    for (uint32_t d = 0; d < s->devices; d++) {
      printf(" %s %u [", w, d);
      int first = 1;
      for (uint32_t i = 0; i < s->n; i++)
        if (s->plan[c].owner[i] == d) printf(first ? "%u" : " %u", s->idx[i]), first = 0;
      printf("]");
    }
    printf("\n");
  }
}

/* autoshard's server placement as a shard.table_servers value (every
 * table is on the server side, in table order). */
static void table_servers(sbuf_t *b, const side_t *s) {
  const shard_plan_t *p = &s->plan[SHARD_ALGO_AUTOSHARD];
  for (uint32_t i = 0; i < s->n; i++)
    p->owner[i] == SHARD_PLAN_SPREAD ? sb_printf(b, i ? ",rows" : "rows") : sb_printf(b, i ? ",%u" : "%u", p->owner[i]);
}

static void side_json(sbuf_t *b, const side_t *s) {
  int cols = s->has_current ? N_COLS : SHARD_ALGOS;
  sb_printf(b, "\"%ss\": {\"devices\": %u, \"mem_limit_mib\": %.1f, \"left_out\": %u, \"tables\": [", shard_kind_name(s->kind),
            s->devices, s->mem_limit / 1048576.0, s->left_out);
  for (uint32_t i = 0; i < s->n; i++) sb_printf(b, "%s%u", i ? ", " : "", s->idx[i]);
  sb_printf(b, "], \"spread\": [");
  for (uint32_t i = 0, f = 1; i < s->n; i++)
    if (s->spread[i]) sb_printf(b, "%s%u", f ? "" : ", ", s->idx[i]), f = 0;
  sb_printf(b, "], \"plans\": {");
  for (int c = 0; c < cols; c++) {
    const shard_plan_t *p = &s->plan[c];
    sb_printf(b, "%s\"%s\": {", c ? ", " : "", col_name(c));
    sb_num(b, "max_cost_us", p->max_cost), sb_printf(b, ", "), sb_num(b, "balance", p->balance), sb_printf(b, ", ");
    sb_num(b, "speedup_vs_random", s->plan[SHARD_ALGO_RANDOM].max_cost / p->max_cost), sb_printf(b, ", ");
    if (c < SHARD_ALGOS) sb_num(b, "plan_ms", s->ms[c]), sb_printf(b, ", ");
    sb_printf(b, "\"owner\": [");
    for (uint32_t i = 0; i < s->n; i++) sb_printf(b, i ? ", %d" : "%d", p->owner[i] == SHARD_PLAN_SPREAD ? -1 : (int)p->owner[i]);
    sb_printf(b, "], \"cost_us\": [");
    for (uint32_t d = 0; d < s->devices; d++) sb_printf(b, d ? ", %.3f" : "%.3f", p->cost[d]);
    sb_printf(b, "], \"mib\": [");
    for (uint32_t d = 0; d < s->devices; d++) sb_printf(b, d ? ", %.3f" : "%.3f", p->bytes[d] / 1048576.0);
    sb_printf(b, "]}");
  }
  sb_printf(b, "}}");
}

static int shard_plan_cmd(cli_t *cli) {
  const char *tr = cli_opt(cli, "--trainers"), *sv = cli_opt(cli, "--servers"), *mp = cli_opt(cli, "--model");
  if (cli_done(cli, "plan")) return 2;
  long P = tr ? atol(tr) : (long)cfg_int(cli->cfg, "trainers"), S = sv ? atol(sv) : (long)cfg_int(cli->cfg, "embedding_servers");
  if (P < 1 || P > 4096) return cli_usage_error(cli, "--trainers %s is not a count in [1, 4096]", tr);
  if (S < 1 || S > 4096) return cli_usage_error(cli, "--servers %s is not a count in [1, 4096]", sv);
  const char *path = mp ? mp : cfg_str(cli->cfg, "shard.cost_model");
  char err[1024];
  shard_cost_t *m = NULL;
  job_t j;
  side_t side[2] = {{.kind = SHARD_KIND_TRAINER}, {.kind = SHARD_KIND_SERVER}};
  int rc = 1;
  if (shard_cost_load(path, &m, err, sizeof err)) {
    fprintf(stderr, "chanter shard plan: %s\n", err);
    return 1;
  }
  if (job_read(cli->cfg, &j)) goto out;
  uint64_t limit = (uint64_t)cfg_int(cli->cfg, "strategy.partition_mb") << 20, wise = (uint64_t)cfg_int(cli->cfg, "shard.table_wise_max_rows");
  side[0].devices = (uint32_t)P, side[0].mem_limit = limit;
  snprintf(side[0].limit_why, sizeof side[0].limit_why, "%llu MiB each (strategy.partition_mb)", (unsigned long long)(limit >> 20));
  side[1].devices = (uint32_t)S, side[1].has_current = 1;
  snprintf(side[1].limit_why, sizeof side[1].limit_why, "no memory limit (RocksDB holds every row)");
  if (side_alloc(&side[0], j.T) || side_alloc(&side[1], j.T)) {
    fprintf(stderr, "chanter shard plan: out of memory\n");
    goto out;
  }
  for (uint32_t t = 0; t < j.T; t++) {
    int st = j.strat[t];
    if (st == STRATEGY_CACHE) side[0].left_out++;
    else side_add(&side[0], &j, t, st == STRATEGY_PARTITION_ROWS || (st == STRATEGY_AUTO && j.bytes[t] > limit));
    side_add(&side[1], &j, t, S > 1 && j.tables[t].rows > wise);
  }
  for (int k = 0; k < 2; k++) {
    if (!shard_cost_has(m, side[k].kind)) continue;
    if (side_plan(&side[k], &j, cli->cfg, m)) goto out;
  }
  if (cli->json) {
    sbuf_t b = {0};
    sb_printf(&b, "{\"tables\": %u, \"batch\": %u, \"model\": {", j.T, j.batch);
    sb_str(&b, "path", path && *path ? path : "(built in)"), sb_printf(&b, ", "), sb_str(&b, "label", shard_cost_label(m));
    sb_printf(&b, "}");
    for (int k = 0; k < 2; k++)
      if (shard_cost_has(m, side[k].kind)) sb_printf(&b, ", "), side_json(&b, &side[k]);
    if (shard_cost_has(m, SHARD_KIND_SERVER)) sb_printf(&b, ", \"table_servers\": \""), table_servers(&b, &side[1]), sb_printf(&b, "\"");
    sb_printf(&b, "}\n");
    fputs(b.s, stdout);
    free(b.s);
  } else {
    printf("%u tables, batch %u; predicted cost per iteration (us), tables (t) and MiB per device\n", j.T, j.batch);
    printf("model: %s (%s)\n", path && *path ? path : "built in", shard_cost_label(m));
    if (j.alpha_note[0]) printf("note: %s\n", j.alpha_note);
    printf("trainers: every table whose table_strategy is partition or auto is placed, as if auto partitioned it\n");
    for (int k = 0; k < 2; k++) {
      if (shard_cost_has(m, side[k].kind)) side_text(&side[k]);
      else printf("\n%ss: the model has no %s part (its dataset measured none)\n", shard_kind_name(side[k].kind), shard_kind_name(side[k].kind));
    }
    printf("\nbalance = min / max predicted cost over the devices; vs random = random's max / the column's max\n");
    if (shard_cost_has(m, SHARD_KIND_SERVER)) {
      sbuf_t b = {0};
      table_servers(&b, &side[1]);
      printf("autoshard's server placement, for the job file (every daemon and client reads it):\n"
             "  shard.table_servers = %s\n", b.s ? b.s : "");
      free(b.s);
    }
  }
  rc = 0;
out:
  side_close(&side[0]), side_close(&side[1]);
  job_close(&j);
  shard_cost_destroy(m);
  return rc;
}

int cmd_shard(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected 'fit' or 'plan'");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (!strcmp(sub, "fit")) return shard_fit_cmd(cli);
  if (!strcmp(sub, "plan")) return shard_plan_cmd(cli);
  return cli_usage_error(cli, "unknown subcommand '%s'", sub);
}
