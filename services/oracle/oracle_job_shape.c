/*
 * oracle_job_shape: what a job is before it runs (oracle_job.c runs it):
 * the checks of its configuration this oracle makes (oracle_job_check_cfg),
 * the tables' strategies (table_strategy, strategy.h: which tables live on
 * one trainer, and whose; chosen at create, once auto has seen the first
 * batches, or taken back from a checkpoint) and the job's metrics.  Loop
 * thread, or before the loop runs.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "strategy.h"
#include "strategy_auto.h"

#define MAX_LOOKAHEAD 4096 /* largest fixed L (about 2 L plans in memory): oracle.max_lookahead's bound */

int oracle_job_check_cfg(const cfg_t *cfg, char *err, size_t err_len) {
  /* cfg already checked that lookahead is auto or a number >= 0 */
  const char *la = cfg_str(cfg, "lookahead");
  if (strcmp(la, "auto") != 0 && strtoull(la, NULL, 10) > MAX_LOOKAHEAD) {
    snprintf(err, err_len,
             "lookahead = %s (from %s) is above %d: the oracle keeps about 2 L planned batches in memory; set a "
             "smaller lookahead, or auto",
             la, cfg_origin(cfg, "lookahead"), MAX_LOOKAHEAD);
    return ERR_CONFIG;
  }
  /* slots travel as uint32, and a trainer's cache has at least one row */
  int64_t rows = cfg_int(cfg, "cache_rows");
  if (strcmp(cfg_str(cfg, "mode"), "ideal") != 0 && (rows < 1 || (uint64_t)rows > UINT32_MAX)) {
    snprintf(err, err_len,
             "cache_rows = %lld (from %s) is not in [1, 2^32): every mode but ideal caches embedding rows in each "
             "trainer; set cache_rows to the rows a trainer's cache may hold",
             (long long)rows, cfg_origin(cfg, "cache_rows"));
    return ERR_CONFIG;
  }
  const char *al = cfg_str(cfg, "allocation");
  if (plan_alloc_parse(al) < 0) {
    snprintf(err, err_len, "allocation = %s (from %s) is unknown; use contiguous, random or laia", al,
             cfg_origin(cfg, "allocation"));
    return ERR_CONFIG;
  }
  data_schema_t sc;
  int rc = data_schema_from_cfg(cfg, &sc, err, err_len);
  if (rc) return rc;
  uint8_t *strat = malloc(sc.n_tables ? sc.n_tables : 1);
  rc = strat ? strategy_parse(cfg, sc.n_tables, strat, err, err_len) : -ENOMEM;
  free(strat);
  data_schema_close(&sc);
  return rc;
}

/* table_strategy = auto's cost model (strategy.auto_cost = model): the
 * job's shard.cost_model, or the built-in one -- the very model the
 * placement loaded from that key when it has one (j->place.model, shared:
 * each side gives it back), else loaded here.  A model that cannot price
 * the choice (no collectives' lines: a dataset timed without them; or no
 * model in this build) leaves the byte weights, with a warning; a model
 * that does not load is the configuration's error. */
static int auto_cost_init(oracle_job_t *j, char *err, size_t err_len) {
  if (strcmp(cfg_str(j->cfg, "strategy.auto_cost"), "model")) return 0;
  const char *path = cfg_str(j->cfg, "shard.cost_model");
  char why[512];
  if (j->place.model) {
    j->auto_cost = shard_cost_share(j->place.model);
  } else if (!*path && !shard_cost_have_default()) {
    log_warn("strategy.auto_cost = model, but this build carries no default cost model and shard.cost_model is empty: "
             "table_strategy = auto weighs bytes (strategy.cache_weight, strategy.step_kb)");
    return 0;
  } else {
    int rc = shard_cost_load(path, &j->auto_cost, why, sizeof why);
    if (rc)
      return err_set(err, err_len, rc,
                     "strategy.auto_cost = model needs the cost model (shard.cost_model = '%s', from %s): %s", path,
                     cfg_origin(j->cfg, "shard.cost_model"), why);
  }
  if (!strategy_auto_model_ok(j->auto_cost, why, sizeof why)) {
    log_warn("strategy.auto_cost = model, but %s (%s): table_strategy = auto weighs bytes (strategy.cache_weight, "
             "strategy.step_kb); time the collectives with chanter bench tables and fit again with chanter shard fit",
             why, *path ? path : "the built-in model");
    shard_cost_destroy(j->auto_cost); /* (the placement keeps a shared one) */
    j->auto_cost = NULL;
  }
  return 0;
}

/* table_strategy: which tables live on one trainer (strategy.h), and whose.
 * With an auto table the choice waits for the first batches
 * (oracle_pipeline__strategy); until then no table is dropped from the
 * plans and nothing is cached. */
int oracle_job__strategy_init(oracle_job_t *j, char *err, size_t err_len) {
  int rc = data_schema_from_cfg(j->cfg, &j->schema, err, err_len);
  if (rc) return rc;
  j->have_schema = 1;
  if ((rc = cfg_layout(j->cfg, &j->layout, err, err_len)) != 0) return rc;
  uint32_t T = j->n_tables = j->schema.n_tables;
  if (!(j->strat = malloc(T)) || !(j->partition_owner = malloc(T * sizeof *j->partition_owner)) ||
      !(j->strat_why = calloc(T, sizeof *j->strat_why)))
    return -ENOMEM;
  if ((rc = strategy_parse(j->cfg, T, j->strat, err, err_len)) != 0) return rc;
  if ((rc = shard_place_init(&j->place, j->cfg, &j->schema, &j->layout, j->P, err, err_len)) != 0) return rc;
  j->have_place = 1;
  if (j->ideal) memset(j->strat, STRATEGY_CACHE, T);
  j->part_any = strategy_any_partitioned(j->strat, T);
  for (uint32_t t = 0; t < T; t++) {
    j->partition_owner[t] = STRATEGY_OWNER_NONE;
    j->strat_pending |= j->strat[t] == STRATEGY_AUTO;
    snprintf(j->strat_why[t], sizeof j->strat_why[t], "%s",
             j->ideal ? "ideal mode: every row in the trainer" : "fixed by table_strategy");
  }
  if (j->strat_pending && (rc = auto_cost_init(j, err, err_len)) != 0) return rc;
  return j->strat_pending ? 0 : oracle_job__strategy_set(j, j->strat);
}

int oracle_job__strategy_set(oracle_job_t *j, const uint8_t *strat) {
  uint32_t T = j->n_tables;
  int rc = shard_place_trainers(&j->place, strat, j->partition_owner);
  if (rc) return rc;
  if (isfinite(j->place.predicted_max_us))
    log_info("placement: %s on the cost model (%s): predicted max %.0f us per iteration on one trainer, balance "
             "%.1f%%; lookup_greedy's: %.0f us, %.1f%%",
             j->place.note, shard_cost_label(j->place.model), j->place.predicted_max_us,
             100 * j->place.predicted_balance, j->place.baseline_max_us, 100 * j->place.baseline_balance);
  free(j->partitioned);
  j->partitioned = NULL;
  if (strategy_any_partitioned(strat, T) && !(j->partitioned = calloc(T, 1))) return -ENOMEM;
  for (uint32_t t = 0; t < T; t++) {
    if (j->partitioned) j->partitioned[t] = j->partition_owner[t] != STRATEGY_OWNER_NONE;
    if (j->partition_owner[t] == STRATEGY_OWNER_ALL)
      log_info("table %u: strategy=partition_rows owner=every trainer (row r on trainer r mod %u) rows=%" PRIu64
               " (%s)",
               t, j->P, j->schema.table_rows[t], j->strat_why[t]);
    else if (j->partition_owner[t] != STRATEGY_OWNER_NONE)
      log_info("table %u: strategy=partition owner=trainer %u rows=%" PRIu64 " (%s)", t, j->partition_owner[t],
               j->schema.table_rows[t], j->strat_why[t]);
    else if (j->strat[t] == STRATEGY_AUTO)
      log_info("table %u: strategy=cache (%s)", t, j->strat_why[t]);
  }
  j->strat_pending = 0;
  return 0;
}

int oracle_job__strategy_restore(oracle_job_t *j, const oracle_ostate_t *o, char *err, size_t err_len) {
  /* the fixed entries must agree: the fingerprint covers table_strategy */
  if (!j->strat_pending || o->n_strat != j->n_tables) return 0;
  uint8_t st[TABLE_MAX];
  for (uint32_t t = 0; t < j->n_tables; t++) {
    st[t] = j->strat[t] == STRATEGY_AUTO ? o->strat[t] : j->strat[t];
    if (j->strat[t] == STRATEGY_AUTO)
      snprintf(j->strat_why[t], sizeof j->strat_why[t], "auto: %s, as chosen at the start of the job (checkpoint)",
               strategy_name(st[t]));
  }
  int rc = oracle_job__strategy_set(j, st);
  if (rc) return err_set(err, err_len, rc, "out of memory placing the partitioned tables");
  return 0;
}

void oracle_job__metrics_init(oracle_job_t *j, metrics_registry_t *reg) {
  oracle_metrics_t *m = &j->m;
  m->iteration = metrics_gauge(reg, "iteration", NULL, "iterations every trainer has finished");
  m->sps = metrics_gauge(reg, "samples_per_second", NULL, "training throughput (moving average)");
  m->loss = metrics_gauge(reg, "train_loss", NULL, "mean training loss of the last iteration");
  m->test_loss = metrics_gauge(reg, "test_logloss", NULL, "logloss of the last evaluation");
  m->test_auc = metrics_gauge(reg, "test_auc", NULL, "ROC AUC of the last evaluation");
  m->state = metrics_gauge(reg, "job_state", NULL,
                           "0 waiting, 1 training, 2 done, 3 failed, 4 stopped, 5 blocked (the servers hold another "
                           "job's state)");
  m->lookahead = metrics_gauge(reg, "lookahead", NULL, "lookahead L in force (the cacher may lower it)");
  m->slots = metrics_gauge(reg, "cache_slots_used", NULL,
                           "trainer cache slots holding a row or waiting out L batches before reuse");
  for (int k = 0; k < PHASE_N_REPORT; k++) {
    char lab[64];
    snprintf(lab, sizeof lab, "phase=\"%s\"", phase_name(k));
    m->phase[k] = metrics_histogram(reg, "phase_seconds", lab, "trainer time per iteration and phase",
                                    metrics_latency_bounds, metrics_latency_n);
  }
  m->plan = metrics_histogram(reg, "plan_seconds", NULL, "time to plan one global batch", metrics_latency_bounds,
                              metrics_latency_n);
  m->iter = metrics_histogram(reg, "iteration_seconds", NULL, "time between consecutive finished iterations",
                              metrics_latency_bounds, metrics_latency_n);
  m->steps = metrics_counter(reg, "steps_sent_total", NULL, "Step items sent to trainers");
  m->reports = metrics_counter(reg, "reports_total", NULL, "Reports received from trainers");
  m->batches = metrics_counter(reg, "batches_fetched_total", NULL, "train batches received from data processors");
  m->rows_fetched = metrics_counter(reg, "rows_fetched_total", NULL, "embedding rows the trainers fetched");
  m->rows_synced = metrics_counter(reg, "rows_synced_total", NULL, "embedding rows the trainers synchronized");
  m->rows_replicated = metrics_counter(reg, "rows_replicated_total", NULL,
                                       "of the rows synchronized, owned rows handed to every trainer");
  m->rows_synced_delayed = metrics_counter(reg, "rows_synced_delayed_total", NULL,
                                           "of the rows synchronized, those synchronized in the background");
  m->rows_written_back = metrics_counter(reg, "rows_written_back_total", NULL, "embedding rows the trainers wrote back");
  m->evals = metrics_counter(reg, "evaluations_total", NULL, "evaluations completed");
  m->floor_rows = metrics_counter(reg, "floor_rows_total", NULL,
                                  "the traffic floor of the iterations completed: rows of the cached tables no "
                                  "trainer used in the L batches before, plus rows several trainers use (plan_floor.h)");
}
