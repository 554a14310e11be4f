/*
 * shard_plan: AutoShard's planner and the heuristics (contract in
 * shard_plan.h).
 *
 * A device's predicted cost is the model's readout of the sum of its
 * tables' representations (shard_cost_embed), so each table is embedded
 * once and a candidate move costs two readouts.  Every device's sum is
 * rebuilt from scratch, in table order, whenever its tables change, so the
 * costs a plan reports are exactly shard_cost_predict of the device's
 * tables (the spread shares first, then the tables by index).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "shard_plan.h"
#include "table.h"

static const char *const algo_names[SHARD_ALGOS] = {"autoshard", "lookup_greedy", "size_greedy", "random"};
const char *shard_algo_name(int algo) { return algo >= 0 && algo < SHARD_ALGOS ? algo_names[algo] : "?"; }
int shard_algo_parse(const char *s) {
  for (int a = 0; a < SHARD_ALGOS; a++)
    if (!strcmp(s, algo_names[a])) return a;
  return -1;
}

typedef struct ctx_s {
  const shard_plan_in_t *in;
  uint32_t D, E;
  double *rep;         /* n x E: each placed table's representation */
  double *base;        /* E: the spread tables' shares, on every device */
  uint64_t base_bytes; /* their bytes on every device */
  double *sum;         /* D x E */
  double *cost;        /* D */
  uint64_t *bytes;     /* D */
  uint32_t *owner;     /* n */
  double *tmp;         /* E: scratch */
  uint64_t evals;
} ctx_t;

static int is_spread(const shard_plan_in_t *in, uint32_t t) { return in->spread && in->spread[t]; }
static uint64_t share_bytes(uint64_t b, uint32_t D) { return (b + D - 1) / D; }

static double readout(ctx_t *c, const double *s) {
  c->evals++;
  return shard_cost_readout(c->in->model, c->in->kind, s);
}

/* Rebuilds device d's sum, bytes and cost from the owners. */
static void device_rebuild(ctx_t *c, uint32_t d) {
  double *s = c->sum + (size_t)d * c->E;
  memcpy(s, c->base, c->E * sizeof *s);
  c->bytes[d] = c->base_bytes;
  int any = c->base_bytes > 0;
  for (uint32_t t = 0; t < c->in->n; t++)
    if (c->owner[t] == d) {
      for (uint32_t k = 0; k < c->E; k++) s[k] += c->rep[(size_t)t * c->E + k];
      c->bytes[d] += c->in->bytes[t];
      any = 1;
    }
  c->cost[d] = any ? readout(c, s) : 0;
}

static void ctx_free(ctx_t *c) {
  free(c->rep), free(c->base), free(c->sum), free(c->cost), free(c->bytes), free(c->owner), free(c->tmp);
}

static int ctx_init(ctx_t *c, const shard_plan_in_t *in, char *err, size_t err_len) {
  memset(c, 0, sizeof *c);
  c->in = in;
  if (!in->devices) return err_set(err, err_len, -EINVAL, "no devices to place tables on");
  if (!shard_cost_has(in->model, in->kind))
    return err_set(err, err_len, -EINVAL, "the cost model has no %s part (its dataset had no %s sets)", shard_kind_name(in->kind),
                   shard_kind_name(in->kind));
  c->D = in->devices, c->E = shard_cost_width(in->model, in->kind);
  size_t n = in->n ? in->n : 1;
  c->rep = calloc(n * c->E, sizeof *c->rep), c->base = calloc(c->E, sizeof *c->base), c->tmp = calloc(c->E, sizeof *c->tmp);
  c->sum = calloc((size_t)c->D * c->E, sizeof *c->sum), c->cost = calloc(c->D, sizeof *c->cost);
  c->bytes = calloc(c->D, sizeof *c->bytes), c->owner = malloc(n * sizeof *c->owner);
  if (!c->rep || !c->base || !c->tmp || !c->sum || !c->cost || !c->bytes || !c->owner)
    return err_set(err, err_len, -ENOMEM, "out of memory planning %u tables", in->n);
  for (uint32_t t = 0; t < in->n; t++) {
    c->owner[t] = is_spread(in, t) ? SHARD_PLAN_SPREAD : UINT32_MAX - 1; /* UINT32_MAX - 1: not placed yet */
    if (is_spread(in, t)) {
      shard_table_t share = in->tables[t];
      share.rows = share.rows / c->D ? share.rows / c->D : 1;
      share.hotness /= c->D;
      shard_cost_embed(in->model, in->kind, &share, in->batch, c->tmp);
      for (uint32_t k = 0; k < c->E; k++) c->base[k] += c->tmp[k];
      c->base_bytes += share_bytes(in->bytes[t], c->D);
    } else {
      shard_cost_embed(in->model, in->kind, &in->tables[t], in->batch, c->rep + (size_t)t * c->E);
    }
  }
  if (in->mem_limit && c->base_bytes > in->mem_limit)
    return err_set(err, err_len, ERR_CONFIG, "the spread tables alone take %.1f MiB of every %s, over its limit of %.1f MiB",
                   c->base_bytes / 1048576.0, shard_kind_name(in->kind), in->mem_limit / 1048576.0);
  for (uint32_t d = 0; d < c->D; d++) device_rebuild(c, d);
  return 0;
}

static int fits(const ctx_t *c, uint32_t d, uint64_t b) { return !c->in->mem_limit || c->bytes[d] + b <= c->in->mem_limit; }

static int no_room(const ctx_t *c, uint32_t t, char *err, size_t err_len) {
  uint64_t most = 0;
  for (uint32_t d = 0; d < c->D; d++) {
    uint64_t fr = c->bytes[d] < c->in->mem_limit ? c->in->mem_limit - c->bytes[d] : 0;
    most = fr > most ? fr : most;
  }
  return err_set(err, err_len, ERR_CONFIG,
                 "table %u (%.1f MiB with its optimizer state) fits on no %s: the emptiest of the %u has %.1f MiB free of "
                 "its %.1f MiB",
                 t, c->in->bytes[t] / 1048576.0, shard_kind_name(c->in->kind), c->D, most / 1048576.0,
                 c->in->mem_limit / 1048576.0);
}

static void place(ctx_t *c, uint32_t t, uint32_t d) {
  c->owner[t] = d;
  device_rebuild(c, d);
}

/* ---- the heuristics: sort keys, then each table to the least loaded device it fits */

typedef struct item_s {
  double key, key2;
  uint32_t t;
} item_t;
static int by_key(const void *a, const void *b) {
  const item_t *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  if (x->key2 != y->key2) return x->key2 > y->key2 ? -1 : 1;
  return x->t < y->t ? -1 : x->t > y->t;
}

static int greedy_by(ctx_t *c, int algo, char *err, size_t err_len) {
  const shard_plan_in_t *in = c->in;
  item_t *it = malloc((in->n ? in->n : 1) * sizeof *it);
  double *load = calloc(c->D, sizeof *load);
  uint32_t m = 0;
  int rc = 0;
  if (!it || !load) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory");
    goto out;
  }
  for (uint32_t t = 0; t < in->n; t++) {
    double work = in->tables[t].hotness * in->tables[t].dim;
    if (is_spread(in, t)) {
      for (uint32_t d = 0; d < c->D; d++)
        load[d] += algo == SHARD_ALGO_LOOKUP_GREEDY ? floor(work / c->D) : (double)share_bytes(in->bytes[t], c->D);
      continue;
    }
    if (algo == SHARD_ALGO_LOOKUP_GREEDY) it[m++] = (item_t){work, (double)in->tables[t].rows, t};
    else it[m++] = (item_t){(double)in->bytes[t], 0, t};
  }
  qsort(it, m, sizeof *it, by_key);
  for (uint32_t i = 0; i < m && !rc; i++) {
    uint32_t t = it[i].t, best = UINT32_MAX;
    for (uint32_t d = 0; d < c->D; d++)
      if (fits(c, d, in->bytes[t]) && (best == UINT32_MAX || load[d] < load[best])) best = d;
    if (best == UINT32_MAX) {
      rc = no_room(c, t, err, err_len);
      break;
    }
    load[best] += it[i].key;
    place(c, t, best);
  }
out:
  free(it);
  free(load);
  return rc;
}

static int random_plan(ctx_t *c, char *err, size_t err_len) {
  uint64_t s = c->in->seed ^ UINT64_C(0x72616e646f6d), r;
  uint32_t *ok = malloc(c->D * sizeof *ok);
  int rc = 0;
  if (!ok) return err_set(err, err_len, -ENOMEM, "out of memory");
  for (uint32_t t = 0; t < c->in->n && !rc; t++) {
    if (is_spread(c->in, t)) continue;
    uint32_t k = 0;
    for (uint32_t d = 0; d < c->D; d++)
      if (fits(c, d, c->in->bytes[t])) ok[k++] = d;
    if (!k) {
      rc = no_room(c, t, err, err_len);
      break;
    }
    r = table_rng_next(&s);
    place(c, t, ok[r % k]);
  }
  free(ok);
  return rc;
}

/* ---- autoshard */

/* Greedy on predicted cost. */
static int autoshard_greedy(ctx_t *c, char *err, size_t err_len) {
  const shard_plan_in_t *in = c->in;
  item_t *it = malloc((in->n ? in->n : 1) * sizeof *it);
  uint32_t m = 0;
  int rc = 0;
  if (!it) return err_set(err, err_len, -ENOMEM, "out of memory");
  for (uint32_t t = 0; t < in->n; t++)
    if (!is_spread(in, t)) it[m++] = (item_t){readout(c, c->rep + (size_t)t * c->E), 0, t};
  qsort(it, m, sizeof *it, by_key);
  for (uint32_t i = 0; i < m; i++) {
    uint32_t t = it[i].t, best = UINT32_MAX;
    double best_cost = 0;
    const double *r = c->rep + (size_t)t * c->E;
    for (uint32_t d = 0; d < c->D; d++) {
      if (!fits(c, d, in->bytes[t])) continue;
      const double *s = c->sum + (size_t)d * c->E;
      for (uint32_t k = 0; k < c->E; k++) c->tmp[k] = s[k] + r[k];
      double cost = readout(c, c->tmp);
      if (best == UINT32_MAX || cost < best_cost) best = d, best_cost = cost;
    }
    if (best == UINT32_MAX) {
      rc = no_room(c, t, err, err_len);
      break;
    }
    place(c, t, best);
  }
  free(it);
  return rc;
}

/* (max, sum of squares) of a change: the objective, compared with a
 * relative margin so that float noise cannot make the search cycle. */
typedef struct obj_s {
  double max, sq;
} obj_t;
static int better(obj_t a, obj_t b) {
  double tol = 1e-12 * (b.max > 0 ? b.max : 1);
  if (a.max < b.max - tol) return 1;
  if (a.max > b.max + tol) return 0;
  return a.sq < b.sq - 1e-12 * (b.sq > 0 ? b.sq : 1);
}

/* The highest cost over the devices other than a and b. */
static double max_except(const ctx_t *c, uint32_t a, uint32_t b) {
  double m = 0;
  for (uint32_t d = 0; d < c->D; d++)
    if (d != a && d != b && c->cost[d] > m) m = c->cost[d];
  return m;
}

/* The cost of device d's sum with rep `minus` taken away and `plus` added
 * (either NULL); the caller makes sure the device keeps a table or a
 * spread share (a device left empty costs 0, which no sum says). */
static double cost_with(ctx_t *c, uint32_t d, const double *minus, const double *plus) {
  const double *s = c->sum + (size_t)d * c->E;
  for (uint32_t k = 0; k < c->E; k++) c->tmp[k] = s[k] - (minus ? minus[k] : 0) + (plus ? plus[k] : 0);
  return readout(c, c->tmp);
}

/* The best move or swap of a table off device m that improves on *best
 * (the objective now, sq its sum of squares): into *best, *bt (the
 * table), *bu (the table it swaps with, or UINT32_MAX), *bq (where bt
 * goes). */
static void search_from(ctx_t *c, uint32_t m, double sq, uint64_t budget, obj_t *best, uint32_t *bt, uint32_t *bu, uint32_t *bq) {
  const shard_plan_in_t *in = c->in;
  uint32_t left = 0;
  for (uint32_t u = 0; u < in->n; u++) left += c->owner[u] == m;
  for (uint32_t t = 0; t < in->n && c->evals < budget; t++) {
    if (c->owner[t] != m) continue;
    const double *rt = c->rep + (size_t)t * c->E;
    double cm = left > 1 || c->base_bytes ? cost_with(c, m, rt, NULL) : 0;
    for (uint32_t q = 0; q < c->D && c->evals < budget; q++) {
      if (q == m || !fits(c, q, in->bytes[t])) continue;
      double cq = cost_with(c, q, NULL, rt), mx = max_except(c, m, q);
      obj_t o = {fmax(mx, fmax(cm, cq)), sq - c->cost[m] * c->cost[m] - c->cost[q] * c->cost[q] + cm * cm + cq * cq};
      if (better(o, *best)) *best = o, *bt = t, *bu = UINT32_MAX, *bq = q;
    }
    for (uint32_t u = 0; u < in->n && c->evals + 1 < budget; u++) {
      uint32_t q = c->owner[u];
      if (q == m || q == SHARD_PLAN_SPREAD) continue;
      if (in->mem_limit && (c->bytes[m] - in->bytes[t] + in->bytes[u] > in->mem_limit ||
                            c->bytes[q] - in->bytes[u] + in->bytes[t] > in->mem_limit))
        continue;
      const double *ru = c->rep + (size_t)u * c->E;
      double cm2 = cost_with(c, m, rt, ru), cq = cost_with(c, q, ru, rt), mx = max_except(c, m, q);
      obj_t o = {fmax(mx, fmax(cm2, cq)), sq - c->cost[m] * c->cost[m] - c->cost[q] * c->cost[q] + cm2 * cm2 + cq * cq};
      if (better(o, *best)) *best = o, *bt = t, *bu = u, *bq = q;
    }
  }
}

/* One round: the best move or swap off the most costly device (ties: the
 * lower index).  1 when it applied one, 0 when none improves (or the
 * budget ran out).  (Moving off every device in turn, to even out the
 * sum of squares when the max device cannot improve, was tried: on
 * `chanter bench shard`'s tables, with a model fitted to a synthetic
 * dataset, it gave a lower degree of balance, 27.6% against 29.9% for 100
 * tables on 8 devices, at 50 times the time.) */
static int search_round(ctx_t *c, uint64_t budget) {
  uint32_t m = 0;
  double sq = 0;
  for (uint32_t d = 0; d < c->D; d++) {
    if (c->cost[d] > c->cost[m]) m = d;
    sq += c->cost[d] * c->cost[d];
  }
  obj_t best = {c->cost[m], sq};
  uint32_t bt = UINT32_MAX, bu = UINT32_MAX, bq = 0;
  search_from(c, m, sq, budget, &best, &bt, &bu, &bq);
  if (bt == UINT32_MAX) return 0;
  if (bu != UINT32_MAX) c->owner[bu] = m;
  c->owner[bt] = bq;
  device_rebuild(c, m);
  device_rebuild(c, bq);
  return 1;
}

static int autoshard(ctx_t *c, char *err, size_t err_len) {
  int rc = autoshard_greedy(c, err, err_len);
  uint64_t budget = c->in->budget ? c->in->budget : SHARD_PLAN_BUDGET;
  while (!rc && c->evals < budget && search_round(c, budget)) {
  }
  return rc;
}

/* ---- results */

static int fill(ctx_t *c, shard_plan_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  out->n = c->in->n, out->devices = c->D;
  out->owner = malloc((c->in->n ? c->in->n : 1) * sizeof *out->owner);
  out->cost = calloc(c->D, sizeof *out->cost), out->bytes = calloc(c->D, sizeof *out->bytes);
  out->count = calloc(c->D, sizeof *out->count);
  if (!out->owner || !out->cost || !out->bytes || !out->count) {
    shard_plan_close(out);
    return err_set(err, err_len, -ENOMEM, "out of memory");
  }
  memcpy(out->owner, c->owner, c->in->n * sizeof *out->owner);
  for (uint32_t t = 0; t < c->in->n; t++)
    if (c->owner[t] < c->D) out->count[c->owner[t]]++;
  out->evals = c->evals;
  for (uint32_t d = 0; d < c->D; d++) {
    device_rebuild(c, d); /* fresh sums: the costs shard_cost_predict gives */
    out->cost[d] = c->cost[d], out->bytes[d] = c->bytes[d];
    if (!d || c->cost[d] > out->max_cost) out->max_cost = c->cost[d];
    if (!d || c->cost[d] < out->min_cost) out->min_cost = c->cost[d];
  }
  out->balance = out->max_cost > 0 ? out->min_cost / out->max_cost : 1;
  return 0;
}

int shard_plan_run(const shard_plan_in_t *in, int algo, shard_plan_t *out, char *err, size_t err_len) {
  ctx_t c;
  memset(out, 0, sizeof *out);
  int rc = ctx_init(&c, in, err, err_len);
  if (!rc) {
    switch (algo) {
    case SHARD_ALGO_AUTOSHARD: rc = autoshard(&c, err, err_len); break;
    case SHARD_ALGO_LOOKUP_GREEDY:
    case SHARD_ALGO_SIZE_GREEDY: rc = greedy_by(&c, algo, err, err_len); break;
    case SHARD_ALGO_RANDOM: rc = random_plan(&c, err, err_len); break;
    default: rc = err_set(err, err_len, -EINVAL, "unknown algorithm %d", algo);
    }
  }
  if (!rc) rc = fill(&c, out, err, err_len);
  ctx_free(&c);
  return rc;
}

int shard_plan_eval(const shard_plan_in_t *in, const uint32_t *owner, shard_plan_t *out, char *err, size_t err_len) {
  ctx_t c;
  memset(out, 0, sizeof *out);
  int rc = ctx_init(&c, in, err, err_len);
  for (uint32_t t = 0; !rc && t < in->n; t++) {
    if (is_spread(in, t) != (owner[t] == SHARD_PLAN_SPREAD))
      rc = err_set(err, err_len, -EINVAL, "table %u: owner %u, but it is %sspread", t, owner[t], is_spread(in, t) ? "" : "not ");
    else if (owner[t] != SHARD_PLAN_SPREAD && owner[t] >= c.D)
      rc = err_set(err, err_len, -EINVAL, "table %u: owner %u, but there are %u devices", t, owner[t], c.D);
    else c.owner[t] = owner[t];
  }
  if (!rc) rc = fill(&c, out, err, err_len);
  ctx_free(&c);
  return rc;
}

void shard_plan_close(shard_plan_t *p) {
  free(p->owner), free(p->cost), free(p->bytes), free(p->count);
  memset(p, 0, sizeof *p);
}
