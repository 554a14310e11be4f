/* shard_place: see shard_place.h. */
#include "shard_place.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "strategy.h"

int shard_job_tables(const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                     shard_table_t *tables, uint64_t *bytes, char *err, size_t err_len) {
  uint32_t T = schema->n_tables;
  double *alpha = calloc(T ? T : 1, sizeof *alpha);
  if (!alpha) return err_set(err, err_len, -ENOMEM, "out of memory");
  int rc = data_table_alpha(cfg, T, alpha, err, err_len), opt = shard_opt_parse(cfg_str(cfg, "embedding_optimizer"));
  if (opt < 0) opt = SHARD_OPT_SGD;
  for (uint32_t t = 0; t < T && !rc; t++) {
    if (tables) tables[t] = (shard_table_t){schema->table_rows[t], layout->tables[t].dim, schema->hotness[t], alpha[t], opt};
    if (bytes) bytes[t] = schema->table_rows[t] * (uint64_t)table_row_bytes(layout, t);
  }
  free(alpha);
  return rc;
}

int shard_place_init(shard_place_t *pl, const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                     uint32_t P, char *err, size_t err_len) {
  memset(pl, 0, sizeof *pl);
  pl->schema = schema, pl->layout = layout, pl->P = P ? P : 1;
  pl->batch = (uint32_t)cfg_int(cfg, "batch_size");
  pl->mem_limit = (uint64_t)cfg_int(cfg, "strategy.partition_mb") << 20;
  pl->seed = (uint64_t)cfg_int(cfg, "seed");
  pl->predicted_max_us = pl->predicted_balance = pl->baseline_max_us = pl->baseline_balance = NAN;
  const char *a = cfg_str(cfg, "shard.placement");
  pl->algo = shard_algo_parse(a);
  if (pl->algo < 0)
    return err_set(err, err_len, ERR_CONFIG, "shard.placement = %s (from %s): use autoshard, lookup_greedy, size_greedy or random",
                   a, cfg_origin(cfg, "shard.placement"));
  size_t T = schema->n_tables ? schema->n_tables : 1;
  if (!(pl->tables = calloc(T, sizeof *pl->tables)) || !(pl->bytes = calloc(T, sizeof *pl->bytes))) return -ENOMEM;
  int rc = shard_job_tables(cfg, schema, layout, pl->tables, pl->bytes, err, err_len);
  if (rc) return rc;
  if (pl->algo == SHARD_ALGO_LOOKUP_GREEDY) return 0; /* strategy_place itself */
  const char *path = cfg_str(cfg, "shard.cost_model");
  char why[512];
  if (!*path && !shard_cost_have_default()) { /* a build from a tree without deploy/shard/cost_model.txt */
    log_warn("shard.placement = %s, but this build carries no default cost model and shard.cost_model is empty: the "
             "partition tables are placed by lookup_greedy (fit one: chanter bench tables, then chanter shard fit)",
             a);
    pl->algo = SHARD_ALGO_LOOKUP_GREEDY;
    return 0;
  }
  if ((rc = shard_cost_load(path, &pl->model, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "shard.placement = %s needs the cost model (shard.cost_model = '%s', from %s): %s", a,
                   path, cfg_origin(cfg, "shard.cost_model"), why);
  if (!shard_cost_has(pl->model, SHARD_KIND_TRAINER))
    return err_set(err, err_len, ERR_CONFIG, "shard.cost_model '%s' has no trainer model (fit it on a dataset with trainer sets)",
                   *path ? path : "(built in)");
  return 0;
}

void shard_place_close(shard_place_t *pl) {
  shard_cost_destroy(pl->model);
  free(pl->tables);
  free(pl->bytes);
  memset(pl, 0, sizeof *pl);
}

const char *shard_place_name(const shard_place_t *pl) { return shard_algo_name(pl->algo); }

int shard_place_trainers(shard_place_t *pl, const uint8_t *strat, uint32_t *owner) {
  const data_schema_t *s = pl->schema;
  uint32_t T = s->n_tables, n = 0;
  strategy_place(strat, s, pl->layout, pl->P, owner); /* lookup_greedy, and the baseline */
  snprintf(pl->note, sizeof pl->note, "%s", shard_place_name(pl));
  if (!pl->model) return 0;
  shard_table_t *tab = calloc(T ? T : 1, sizeof *tab);
  uint64_t *bytes = calloc(T ? T : 1, sizeof *bytes);
  uint8_t *spread = calloc(T ? T : 1, 1);
  uint32_t *idx = calloc(T ? T : 1, sizeof *idx), *base = calloc(T ? T : 1, sizeof *base);
  shard_plan_t plan = {0}, was = {0};
  char err[512] = "";
  int rc = tab && bytes && spread && idx && base ? 0 : -ENOMEM;
  for (uint32_t t = 0; t < T && !rc; t++) {
    if (strat[t] != STRATEGY_PARTITION && strat[t] != STRATEGY_PARTITION_ROWS) continue;
    tab[n] = pl->tables[t];
    bytes[n] = pl->bytes[t];
    spread[n] = strat[t] == STRATEGY_PARTITION_ROWS;
    base[n] = spread[n] ? SHARD_PLAN_SPREAD : owner[t];
    idx[n++] = t;
  }
  if (rc || !n) goto out;
  shard_plan_in_t in = {tab, bytes, spread, n, pl->P, pl->mem_limit, pl->model, SHARD_KIND_TRAINER, pl->batch, pl->seed, 0};
  if ((rc = shard_plan_eval(&in, base, &was, err, sizeof err)) != 0) goto out;
  pl->baseline_max_us = was.max_cost, pl->baseline_balance = was.balance;
  rc = shard_plan_run(&in, pl->algo, &plan, err, sizeof err);
  if (rc == ERR_CONFIG) { /* no placement fits the limit: place without it; the budget check decides */
    snprintf(pl->note, sizeof pl->note, "%s without strategy.partition_mb (%s)", shard_place_name(pl), err);
    in.mem_limit = 0;
    rc = shard_plan_run(&in, pl->algo, &plan, err, sizeof err);
  }
  if (rc) goto out;
  for (uint32_t i = 0; i < n; i++)
    if (!spread[i]) owner[idx[i]] = plan.owner[i];
  pl->predicted_max_us = plan.max_cost, pl->predicted_balance = plan.balance;
out:
  if (rc && rc != -ENOMEM) { /* the planner refused (a bad model): keep strategy_place's owners, and say so */
    log_warn("shard.placement = %s failed, the partition tables stay where lookup_greedy puts them: %s", shard_place_name(pl),
             err);
    snprintf(pl->note, sizeof pl->note, "lookup_greedy (%s failed)", shard_place_name(pl));
    rc = 0;
  }
  shard_plan_close(&plan), shard_plan_close(&was);
  free(tab), free(bytes), free(spread), free(idx), free(base);
  return rc;
}
