/*
 * oracle_pipeline: the second stage of a job (oracle_job_internal.h): from
 * a fetched batch to a decided one.
 *
 * Planning: the loop takes batches in order (oracle_fetch__take) and hands
 * each to libuv's worker pool (plan_build; at most 2 at once, at
 * most L + window + 3 planned batches not yet sent to every trainer;
 * ideal: window + 2).  Plans keep each batch's distinct keys and their
 * users (PLAN_KEYS); ideal plans have no key lists at all.  With
 * allocation = laia the planning work first allocates the batch's samples
 * (laia_assign), in batch order across the workers.
 *
 * The cacher (loop, every mode but ideal): planned batches enter it in
 * order (cacher_push) and batch x is decided (cacher_decide) once x + L
 * has entered, or the last batch has.  lookahead = N starts at L = N;
 * lookahead = auto first waits for the first oracle.measure_batches batches to
 * be planned and picks, on the worker pool, the largest L <=
 * oracle.max_lookahead whose exact slot need over them fits cache_rows
 * (cacher_auto: all L in one pass over the keys; a
 * given L is checked the same way and lowered if it does not fit; the job
 * fails if even L = 0 does not).  The cacher lowers L when the cache runs
 * full (logged); a batch that does not fit even at L = 0 fails the job.
 * L fixes the dispatch window, max(oracle.window, L + 2), which dispatch
 * reads.
 *
 * A plan lives in an entry of the ring j->pipe.plans until it is decided
 * and sent to every trainer.  j->pipe is this file's; the planning works
 * touch only their own entry and, for laia, the part under laia_mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "proc.h"
#include "strategy_auto.h"

#define PLAN_PARALLEL 2 /* batches planned at once on the worker pool */
#define PLAN_AHEAD 2    /* planned batches kept beyond the dispatch window */

/* ---- the ring's entries */

/* Frees an entry's plan and decisions (READY or decided entries only). */
static void entry_release(oracle_entry_t *s) {
  plan_close(&s->plan);
  if (s->decided) cacher_dec_free(&s->dec);
  free(s->evict);
  s->evict = NULL;
  s->n_evict = 0;
  free(s->laia_state);
  s->laia_state = NULL;
  s->laia_len = 0;
  s->ckpt = 0;
  s->decided = 0;
  s->state = ORACLE_ENTRY_EMPTY;
}

/* At the end of the job: every READY plan goes (PLANNING ones go when
 * their work returns).  Not while cacher_auto reads the measured batches' plans on the
 * worker pool: auto_done calls this then. */
static void release_plans(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  if (pp->auto_running) return;
  for (uint32_t i = 0; pp->plans && i < pp->n_plans; i++)
    if (pp->plans[i].state == ORACLE_ENTRY_READY) entry_release(&pp->plans[i]);
}

const oracle_entry_t *oracle_pipeline__decided(const oracle_job_t *j, uint64_t x) {
  const oracle_entry_t *s = &j->pipe.plans[x % j->pipe.n_plans];
  return s->state == ORACLE_ENTRY_READY && s->iteration == x && s->decided ? s : NULL;
}

/* ---- planning on the worker pool */

typedef struct plan_work_s {
  uv_work_t req;
  oracle_job_t *j;
  data_batch_t *batch;
  uint32_t *owner; /* allocation = laia: decided in plan_work, in batch order; else NULL */
  uint8_t *skip;   /* the partitioned tables, once every strategy is known: their keys are not gathered */
  oracle_entry_t *entry;
  int rc;
  double secs;
} plan_work_t;

/* allocation = laia: the owners of w's batch, once the batch before has
 * its own (the works are queued in batch order, so that one runs or ran on
 * another worker). */
static int laia_in_order(oracle_job_t *j, plan_work_t *w) {
  oracle_pipe_t *pp = &j->pipe;
  uint64_t x = w->batch->iteration;
  pthread_mutex_lock(&pp->laia_mu);
  while (pp->laia_next != x && !pp->laia_rc) pthread_cond_wait(&pp->laia_cv, &pp->laia_mu);
  int rc = pp->laia_rc;
  if (!rc) {
    double t0 = oracle_job__now();
    rc = laia_assign(pp->laia, w->batch, w->owner);
    pp->laia_secs += oracle_job__now() - t0;
    /* a checkpoint after x holds laia as it is now (it runs ahead of training) */
    if (!rc && w->entry->ckpt) rc = laia_save(pp->laia, &w->entry->laia_state, &w->entry->laia_len);
    if (!rc && !pp->laia_said && laia_profiled(pp->laia)) {
      /* which tables decide the placement from now on (log_info is thread-safe) */
      char list[1024];
      size_t o = 0;
      laia_stats_t ls;
      laia_stats(pp->laia, &ls);
      for (uint32_t t = 0; t < ls.tables && o + 24 < sizeof list; t++)
        if (laia_table_scored(pp->laia, t))
          o += (size_t)snprintf(list + o, sizeof list - o, "%s%u:%.3f", o ? "," : "", t, laia_table_share(pp->laia, t));
      list[o] = 0;
      log_info("allocation laia: profile of %u batches done; scoring %u of %u tables (table:share of ids on a held row) "
               "%s; the others are below oracle.laia_min_share=%.3f",
               pp->laia_profile, ls.tables_scored, ls.tables, list, pp->laia_min_share);
      pp->laia_said = 1;
    }
    if (rc) pp->laia_rc = rc;
    pp->laia_next = x + 1;
  }
  pthread_cond_broadcast(&pp->laia_cv);
  pthread_mutex_unlock(&pp->laia_mu);
  return rc;
}

static void plan_work(uv_work_t *req) {
  proc_name_thread("oracle-plan"); /* a libuv pool thread: named by its last work */
  plan_work_t *w = req->data;
  oracle_job_t *j = w->j;
  double t0 = oracle_job__now();
  if (w->owner && (w->rc = laia_in_order(j, w)) != 0) {
    w->secs = oracle_job__now() - t0;
    return;
  }
  /* ideal: no key lists at all; else the batch's distinct keys and their users, for the cacher */
  unsigned flags = j->ideal ? PLAN_IDEAL : PLAN_KEYS;
  w->rc = plan_build_skip(w->batch, j->P, j->pipe.policy, j->seed, w->owner, flags, j->ideal ? NULL : w->skip,
                          &w->entry->plan);
  w->secs = oracle_job__now() - t0;
}

static void plan_done(uv_work_t *req, int status) {
  plan_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_pipe_t *pp = &j->pipe;
  oracle_entry_t *s = w->entry;
  pp->running--;
  if (status == UV_ECANCELED && !w->rc) {
    w->rc = ERR_SHUTDOWN;
    plan_close(&s->plan);
  }
  if (w->rc || oracle_job__over(j)) {
    if (!w->rc) plan_close(&s->plan);
    s->state = ORACLE_ENTRY_EMPTY;
    if (w->rc) oracle_job__error(j, w->rc, "planning batch %llu failed: %s", (unsigned long long)s->iteration, err_str(w->rc));
  } else if (j->partitioned && (w->rc = plan_drop_tables(&s->plan, j->partitioned)) != 0) {
    /* partitioned tables (table_strategy) stay out of the cacher; dropped
     * here, on the loop, where j->partitioned changes (an auto choice) */
    plan_close(&s->plan);
    s->state = ORACLE_ENTRY_EMPTY;
    oracle_job__error(j, w->rc, "planning batch %llu failed: %s", (unsigned long long)s->iteration, err_str(w->rc));
  } else {
    s->state = ORACLE_ENTRY_READY;
    s->decided = j->ideal; /* ideal: nothing to decide */
    pp->plans_done++;
    pp->plan_secs_sum += w->secs;
    pp->sum_unique += (double)s->plan.n_unique;
    if (s->iteration >= j->ckpt.start && s->iteration - j->ckpt.start < pp->measure) pp->measure_ready++;
    metrics_hist_observe(j->m.plan, w->secs);
  }
  data_batch_free(w->batch);
  free(w->batch);
  free(w->owner);
  free(w->skip);
  free(w);
  oracle_job__advance(j);
}

static uint64_t min_next_step(const oracle_job_t *j) {
  uint64_t m = UINT64_MAX;
  for (uint32_t p = 0; p < j->P; p++)
    if (j->dispatch.rank[p].next_step < m) m = j->dispatch.rank[p].next_step;
  return m;
}

/* Plans batches in order while fewer than span are ahead of the slowest
 * trainer.  Slot x % n_plans last held batch x - n_plans <= x - span,
 * below every trainer's next Step, so it was decided, sent to every
 * trainer and freed (the reaping just before). */
int oracle_pipeline__plan(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  uint64_t slowest = min_next_step(j);
  for (; pp->reaped < slowest; pp->reaped++) { /* decided and sent: the cacher no longer reads it */
    oracle_entry_t *s = &pp->plans[pp->reaped % pp->n_plans];
    ASSERT(s->state == ORACLE_ENTRY_READY && s->iteration == pp->reaped && s->decided);
    entry_release(s);
  }
  int changed = 0;
  while (pp->next < j->iterations && pp->running < PLAN_PARALLEL && pp->next < slowest + pp->span) {
    uint64_t x = pp->next;
    oracle_entry_t *s = &pp->plans[x % pp->n_plans];
    if (s->state != ORACLE_ENTRY_EMPTY) break; /* cannot happen: see above */
    data_batch_t *b = oracle_fetch__take(j, x);
    if (!b) break; /* the fetchers wake us */
    plan_work_t *w = calloc(1, sizeof *w);
    if (!w) {
      data_batch_free(b);
      free(b);
      return oracle_job__error(j, -ENOMEM, "out of memory planning batch %llu", (unsigned long long)x);
    }
    w->req.data = w;
    w->j = j;
    w->batch = b;
    w->entry = s;
    /* every table's strategy known (table_strategy = auto has chosen): the
     * partitioned tables' keys are never gathered (plan_done's
     * plan_drop_tables then finds none of them) */
    if (!j->strat_pending && j->partitioned && (w->skip = malloc(j->n_tables)) != NULL)
      memcpy(w->skip, j->partitioned, j->n_tables);
    if (pp->laia && !(w->owner = malloc(((size_t)b->n + 1) * sizeof *w->owner))) {
      data_batch_free(b);
      free(b);
      free(w->skip);
      free(w);
      return oracle_job__error(j, -ENOMEM, "out of memory allocating the samples of batch %llu (laia)",
                               (unsigned long long)x);
    }
    s->iteration = x;
    s->state = ORACLE_ENTRY_PLANNING;
    s->decided = 0;
    s->ckpt = oracle_ckpt__wanted(j, x);
    int rc = uv_queue_work(j->loop, &w->req, plan_work, plan_done);
    if (rc) {
      s->state = ORACLE_ENTRY_EMPTY;
      data_batch_free(b);
      free(b);
      free(w->owner);
      free(w->skip);
      free(w);
      return oracle_job__error(j, rc, "cannot queue the planning of batch %llu: %s", (unsigned long long)x,
                               uv_strerror(rc));
    }
    pp->running++;
    pp->next++;
    changed = ORACLE_CH_PLANNING;
  }
  return changed;
}

/* ---- the cacher (every mode but ideal; cacher.h) */

/* L is known (given, or chosen by auto): the dispatch window, the planning
 * span and the cacher follow from it.  The window is at least L + 2: a
 * trainer prefetches batch x + L while it trains x, so it must already hold
 * the Steps up to x + L, and one more lets the next arrive meanwhile.  The
 * plans span the L + 1 batches the cacher holds undecided, the window and
 * PLAN_AHEAD.  0 or -ENOMEM. */
static int set_lookahead(oracle_job_t *j, uint32_t L) {
  oracle_pipe_t *pp = &j->pipe;
  /* the first L + 1 batches enter the cacher before the first decision,
   * which the trainers wait for: its map is sized for their keys (those
   * planned already) at once rather than grown and rehashed as they come */
  uint64_t expect = 0;
  for (uint64_t x = j->ckpt.start; x <= j->ckpt.start + L && x < j->iterations; x++) {
    const oracle_entry_t *s = &pp->plans[x % pp->n_plans];
    if (s->state == ORACLE_ENTRY_READY && s->iteration == x) expect += s->plan.n_unique;
  }
  cacher_opts_t o = {.trainers = j->P,
                     .lookahead = L,
                     .cache_rows = pp->cache_rows,
                     .lrpp = pp->lrpp,
                     .delayed = pp->delayed,
                     .first = j->ckpt.start,
                     .expect_keys = expect};
  int rc = cacher_create(&o, &pp->cache);
  if (rc) return rc;
  pp->L_start = pp->L_now = L;
  pp->window = pp->window_cfg > L + 2 ? pp->window_cfg : L + 2;
  pp->span = L + pp->window + PLAN_AHEAD + 1;
  ASSERT_OP(pp->window, <=, pp->window_max);
  ASSERT_OP(pp->span, <=, pp->n_plans);
  pp->l_known = 1;
  metrics_gauge_set(j->m.lookahead, L);
  log_info("lookahead L=%u cache_rows=%llu lrpp=%d delayed_sync=%d window=%u (max of oracle.window=%u and L + 2) "
           "plans_ahead=%u",
           L, (unsigned long long)pp->cache_rows, pp->lrpp, pp->delayed, pp->window, pp->window_cfg, pp->span);
  return 0;
}

/* The traffic floor of batch x (s), decided with window L: counted into
 * the running total and kept for report (oracle_pipeline__floor).  It only
 * reads the plan: nothing a trainer gets depends on it.  0 or an error
 * (said). */
static int count_floor(oracle_job_t *j, const oracle_entry_t *s, uint32_t L) {
  oracle_pipe_t *pp = &j->pipe;
  double t0 = oracle_job__now();
  uint64_t fu = 0, sh = 0;
  int rc = plan_floor_add(&pp->floor, &s->plan, L, &fu, &sh);
  if (rc)
    return oracle_job__error(j, rc, "counting the traffic floor of batch %llu: %s", (unsigned long long)s->iteration,
                             err_str(rc));
  oracle_floor_t *f = &pp->floor_at[s->iteration % pp->n_floor];
  ASSERT_OP(f->iteration, <=, j->report.done); /* taken (iteration + 1 <= done), or never set */
  *f = (oracle_floor_t){.iteration = s->iteration + 1, .first_use = (uint32_t)fu, .shared = (uint32_t)sh};
  pp->floor_secs += oracle_job__now() - t0;
  return 0;
}

int oracle_pipeline__floor(const oracle_job_t *j, uint64_t x, uint32_t *first_use, uint32_t *shared) {
  const oracle_pipe_t *pp = &j->pipe;
  if (!pp->floor_at) return 0;
  const oracle_floor_t *f = &pp->floor_at[x % pp->n_floor];
  if (f->iteration != x + 1) return 0;
  *first_use = f->first_use;
  *shared = f->shared;
  return 1;
}

/* Decides batch decide_next into its entry, with the list of slots it
 * frees.  0 or an error (said): cache_rows too small even at L = 0, out
 * of memory. */
static int decide_one(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  uint64_t x = pp->decide_next;
  oracle_entry_t *s = &pp->plans[x % pp->n_plans];
  ASSERT(s->state == ORACLE_ENTRY_READY && s->iteration == x && !s->decided);
  char err[512];
  int rc = cacher_decide(pp->cache, &s->dec, err, sizeof err);
  if (rc) {
    if (rc == ERR_CONFIG) return oracle_job__error(j, rc, "%s", err); /* names cache_rows, the batch and the need */
    return oracle_job__error(j, rc, "the cacher failed on batch %llu: %s", (unsigned long long)x,
                             err[0] ? err : err_str(rc));
  }
  const cacher_dec_t *d = &s->dec;
  /* The evicted set is the union of the trainers' write-backs (each
   * evicted row is written back by exactly one trainer); every trainer
   * frees all of it, an owned row's slot being merely unused elsewhere. */
  size_t n = 0;
  for (uint32_t p = 0; p < j->P; p++) n += d->tr[p].n_write_back;
  s->evict = malloc((n ? n : 1) * sizeof *s->evict);
  if (!s->evict) {
    cacher_dec_free(&s->dec);
    return oracle_job__error(j, -ENOMEM, "out of memory deciding batch %llu", (unsigned long long)x);
  }
  for (uint32_t p = 0; p < j->P; p++) {
    memcpy(s->evict + s->n_evict, d->tr[p].write_back_slots, d->tr[p].n_write_back * sizeof *s->evict);
    s->n_evict += d->tr[p].n_write_back;
  }
  s->decided = 1;
  pp->decide_next++;
  /* a checkpoint after x: the rows cached now (the cacher has not decided x + 1) */
  if (s->ckpt && (rc = oracle_ckpt__decided(j, s, pp->cache)) != 0) return rc;
  if (d->lookahead < pp->L_now)
    log_warn("lookahead lowered from %u to %u at batch %llu: cache_rows=%llu is full", pp->L_now, d->lookahead,
             (unsigned long long)x, (unsigned long long)pp->cache_rows);
  pp->L_now = d->lookahead;
  if ((rc = count_floor(j, s, d->lookahead)) != 0) return rc;
  pp->slots_used = d->slots_used;
  pp->slots_peak = cacher_slots_peak(pp->cache);
  metrics_gauge_set(j->m.lookahead, pp->L_now);
  metrics_gauge_set(j->m.slots, (double)pp->slots_used);
  return 0;
}

/* The measured batches: the first batches of this run (a resumed job's from c + 1). */
static size_t measure_size(const oracle_job_t *j) {
  uint64_t st = j->ckpt.start, left = j->iterations > st ? j->iterations - st : 0;
  return (size_t)(j->pipe.measure < left ? j->pipe.measure : left);
}

/* Shallow copies of the measured batches' n plans, contiguous (the works only read
 * them): n_plans >= measure, so batch start + i (i < n) sits in its own
 * entry, READY and undecided.  NULL: out of memory. */
static plan_t *measure_plans(const oracle_job_t *j, size_t n) {
  const oracle_pipe_t *pp = &j->pipe;
  plan_t *pl = malloc(n * sizeof *pl);
  for (size_t i = 0; pl && i < n; i++) {
    const oracle_entry_t *s = &pp->plans[(j->ckpt.start + i) % pp->n_plans];
    ASSERT(s->state == ORACLE_ENTRY_READY && s->iteration == j->ckpt.start + i);
    pl[i] = s->plan;
  }
  return pl;
}

typedef struct auto_work_s {
  uv_work_t req;
  oracle_job_t *j;
  plan_t *plans; /* shallow copies of the measured batches' plans, contiguous (cacher_auto only reads them) */
  size_t n;
  uint32_t L;
  uint64_t need;
  int rc;
  double secs;
} auto_work_t;

static void auto_work(uv_work_t *req) {
  auto_work_t *w = req->data;
  const oracle_pipe_t *pp = &w->j->pipe;
  double t0 = oracle_job__now();
  w->rc = cacher_auto(w->plans, w->n, w->j->P, pp->cache_rows, pp->max_l, pp->lrpp, &w->L, &w->need);
  w->secs = oracle_job__now() - t0;
}

static void auto_done(uv_work_t *req, int status) {
  auto_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_pipe_t *pp = &j->pipe;
  pp->auto_running = 0;
  free(w->plans);
  if (j->destroying) { /* oracle_job_destroy frees the plans */
    free(w);
    return;
  }
  if (oracle_job__over(j)) { /* the job's end left the plans to us */
    release_plans(j);
    free(w);
    return;
  }
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  if (w->rc) {
    oracle_job__error(j, w->rc, "lookahead = auto: measuring the cache over the first %zu batches failed: %s", w->n,
                      err_str(w->rc));
  } else if (w->need > pp->cache_rows) {
    oracle_job__error(j, ERR_CONFIG,
                      "lookahead = %s: cache_rows = %llu (from %s) is too small: even lookahead 0 needs %llu slots "
                      "over the first %zu batches (the distinct rows of a batch must fit); raise cache_rows to at "
                      "least %llu",
                      j->lookahead_cfg, (unsigned long long)pp->cache_rows, cfg_origin(j->cfg, "cache_rows"),
                      (unsigned long long)w->need, w->n, (unsigned long long)w->need);
  } else {
    if (strcmp(j->lookahead_cfg, "auto") == 0)
      log_info("lookahead auto: L=%u needs %llu of cache_rows=%llu slots over the first %zu batches "
               "(oracle.max_lookahead=%u, measured in %.3f s)",
               w->L, (unsigned long long)w->need, (unsigned long long)pp->cache_rows, w->n, pp->max_l, w->secs);
    else if (w->L < pp->max_l)
      log_warn("lookahead lowered from %u to %u before training: cache_rows=%llu (from %s) holds what L=%u needs "
               "(%llu slots over the first %zu batches) but not more; raise cache_rows to keep L=%u",
               pp->max_l, w->L, (unsigned long long)pp->cache_rows, cfg_origin(j->cfg, "cache_rows"), w->L,
               (unsigned long long)w->need, w->n, pp->max_l);
    else
      log_info("lookahead L=%u needs %llu of cache_rows=%llu slots over the first %zu batches (measured in %.3f s)",
               w->L, (unsigned long long)w->need, (unsigned long long)pp->cache_rows, w->n, w->secs);
    if (set_lookahead(j, w->L) != 0) oracle_job__error(j, -ENOMEM, "out of memory creating the cacher");
  }
  free(w);
  oracle_job__advance(j);
}

/* lookahead = auto: once the first `measure` batches are planned, choose L
 * over them on the worker pool (cacher_auto: one pass over their keys
 * gives the exact need of every L <= max_lookahead, ~0.1 s for 128 batches
 * of 53k distinct keys -- still too long for the loop).  Nothing is
 * decided before.  0 or an error (said). */
static int start_auto(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  /* every table partitioned: no row goes through the cache, so no L fetches
   * fewer rows, and each L costs every trainer L + 2 Steps held in memory
   * (about 9 MB each at batch 16384 on the 26-table shape) and the time to
   * copy them in */
  uint32_t part = 0;
  for (uint32_t t = 0; j->partitioned && t < j->n_tables; t++) part += j->partitioned[t] != 0;
  if (!pp->auto_running && j->n_tables && part == j->n_tables && !strcmp(j->lookahead_cfg, "auto")) {
    log_info("lookahead auto: L=0: every table is partitioned (table_strategy), so no row goes through the cache "
             "and looking ahead would fetch nothing fewer");
    if (set_lookahead(j, 0) != 0) return oracle_job__error(j, -ENOMEM, "out of memory creating the cacher");
    return 0;
  }
  /* the measured batches: the first batches of this run (a resumed job's from c + 1) */
  size_t n = measure_size(j);
  if (pp->auto_running || n == 0 || pp->measure_ready < n) return 0;
  auto_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->plans = measure_plans(j, n))) {
    free(w);
    return oracle_job__error(j, -ENOMEM, "out of memory choosing lookahead = auto");
  }
  w->n = n;
  w->req.data = w;
  w->j = j;
  int rc = uv_queue_work(j->loop, &w->req, auto_work, auto_done);
  if (rc) {
    free(w->plans);
    free(w);
    return oracle_job__error(j, rc, "cannot queue the choice of lookahead = auto: %s", uv_strerror(rc));
  }
  pp->auto_running = 1;
  log_info("lookahead auto: measuring the cache each L <= %u needs over the first %zu batches, cache_rows=%llu",
           pp->max_l, w->n, (unsigned long long)pp->cache_rows);
  return 0;
}

/* table_strategy = auto: once the first `measure` batches are planned (all
 * tables' keys: nothing was dropped yet), strategy_auto_choose on the worker
 * pool; then the choice is set, the planned batches lose the partitioned
 * tables' keys, and start_auto measures L over what remains. */
typedef struct strat_work_s {
  uv_work_t req;
  oracle_job_t *j;
  plan_t *plans; /* shallow copies: read only */
  size_t n;
  uint8_t *out;
  strategy_auto_table_t *tab;
  int rc;
  double secs;
} strat_work_t;

/* strategy_auto's placer: the job's shard.placement (the worker runs
 * alone on j->place while the choice is pending). */
static int place_tables(void *ctx, const uint8_t *strat, uint32_t *owner) {
  return shard_place_trainers(ctx, strat, owner);
}

static void strat_work(uv_work_t *req) {
  strat_work_t *w = req->data;
  oracle_job_t *j = w->j;
  double t0 = oracle_job__now();
  strategy_auto_opts_t o = {.P = j->P,
                        /* the window the cache could have at most, not the L in force: the
                         * choice, and so the model, must not depend on the lookahead */
                        .L = (uint32_t)cfg_int(j->cfg, "oracle.max_lookahead"),
                        .B = j->B,
                        .cache_weight = cfg_float(j->cfg, "strategy.cache_weight"),
                        .step_bytes = 1024.0 * (double)cfg_int(j->cfg, "strategy.step_kb"),
                        .budget_bytes = (uint64_t)cfg_int(j->cfg, "strategy.partition_mb") << 20,
                        .place = place_tables,
                        .place_ctx = &j->place,
                        .cost = j->auto_cost,
                        .tables = j->place.tables};
  w->rc = strategy_auto_choose(w->plans, w->n, j->strat, &j->schema, &j->layout, &o, w->out, w->tab);
  w->secs = oracle_job__now() - t0;
}

static void strat_done(uv_work_t *req, int status) {
  strat_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_pipe_t *pp = &j->pipe;
  j->strat_running = 0;
  if (status == UV_ECANCELED && !w->rc) w->rc = ERR_SHUTDOWN;
  if (j->destroying) {
    /* oracle_job_destroy frees the plans */
  } else if (oracle_job__over(j)) { /* the job's end left the plans to us */
    release_plans(j);
  } else {
    int rc = w->rc;
    if (!rc) {
      for (uint32_t t = 0; t < j->n_tables; t++)
        snprintf(j->strat_why[t], sizeof j->strat_why[t], "%s", w->tab[t].why);
      rc = oracle_job__strategy_set(j, w->out);
    }
    /* the planned batches lose the partitioned tables' keys (none is in the cacher yet) */
    for (uint32_t i = 0; !rc && j->partitioned && i < pp->n_plans; i++)
      if (pp->plans[i].state == ORACLE_ENTRY_READY) rc = plan_drop_tables(&pp->plans[i].plan, j->partitioned);
    if (rc)
      oracle_job__error(j, rc, "table_strategy = auto: choosing over the first %zu batches failed: %s", w->n,
                        err_str(rc));
    else
      log_info("table_strategy auto: chosen over the first %zu batches in %.3f s", w->n, w->secs);
  }
  free(w->plans), free(w->out), free(w->tab), free(w);
  oracle_job__advance(j);
}

static int start_strategy(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  size_t n = measure_size(j);
  if (j->strat_running || n == 0 || pp->measure_ready < n) return 0;
  strat_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->plans = measure_plans(j, n)) || !(w->out = malloc(j->n_tables)) ||
      !(w->tab = calloc(j->n_tables, sizeof *w->tab))) {
    if (w) free(w->plans), free(w->out);
    free(w);
    return oracle_job__error(j, -ENOMEM, "out of memory choosing table_strategy = auto");
  }
  w->n = n;
  w->req.data = w;
  w->j = j;
  int rc = uv_queue_work(j->loop, &w->req, strat_work, strat_done);
  if (rc) {
    free(w->plans), free(w->out), free(w->tab), free(w);
    return oracle_job__error(j, rc, "cannot queue the choice of table_strategy = auto: %s", uv_strerror(rc));
  }
  j->strat_running = 1;
  log_info("table_strategy auto: measuring each table's traffic over the first %zu batches", w->n);
  return 0;
}

/* In batch order: a planned batch enters (cacher_push; cacher_end after
 * the last one's) whenever none can be decided, and a batch is decided as
 * soon as it can be -- one per call, so that the conductor dispatches each
 * decision at once: once L is known (lookahead = auto) about L + 1
 * batches can be decided in a row (about 1.5 ms each), and the first
 * Steps, which the trainers are waiting for, need only the first two. */
int oracle_pipeline__cache(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  if (j->ideal) return 0;
  if (j->strat_pending) return start_strategy(j);
  if (!pp->l_known) {
    int rc = start_auto(j);
    if (rc || !pp->l_known) return rc;
  }
  for (;;) {
    if (cacher_ready(pp->cache)) {
      int rc = decide_one(j);
      return rc ? rc : ORACLE_CH_DECIDED;
    }
    if (pp->push_next >= j->iterations) return 0;
    oracle_entry_t *s = &pp->plans[pp->push_next % pp->n_plans];
    if (s->state != ORACLE_ENTRY_READY || s->iteration != pp->push_next) return 0;
    int rc = cacher_push(pp->cache, &s->plan);
    if (rc)
      return oracle_job__error(j, rc, "the cacher refused batch %llu: %s", (unsigned long long)pp->push_next,
                               err_str(rc));
    if (++pp->push_next == j->iterations) cacher_end(pp->cache);
  }
}

/* ---- the end, statistics */

void oracle_pipeline__laia_stats(const oracle_job_t *j, laia_stats_t *ls, double *secs) {
  oracle_pipe_t *pp = (oracle_pipe_t *)&j->pipe; /* the lock only */
  pthread_mutex_lock(&pp->laia_mu);
  laia_stats(pp->laia, ls);
  *secs = pp->laia_secs;
  pthread_mutex_unlock(&pp->laia_mu);
}

void oracle_pipeline__end(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  release_plans(j);
  if (pp->floor.batches) {
    double nb = (double)pp->floor.batches;
    log_info("traffic floor of the cached tables: rows_per_iteration=%.1f first_use=%.1f shared=%.1f over %llu "
             "batches (window = the lookahead of each), counted in %.3f ms a batch, keys_kept=%zu",
             plan_floor_per_iteration(&pp->floor), (double)pp->floor.first_use / nb, (double)pp->floor.shared / nb,
             (unsigned long long)pp->floor.batches, 1e3 * pp->floor_secs / nb, u64map_count(&pp->floor.last));
  }
  if (pp->laia) {
    laia_stats_t ls;
    double secs;
    oracle_pipeline__laia_stats(j, &ls, &secs);
    double ns = ls.samples ? (double)ls.samples : 1;
    log_info("allocation laia: batches=%llu samples_on_holder=%.1f%% samples_scored=%.1f%% rows_held=%zu "
             "ms_per_batch=%.2f window=%u tables_scored=%u/%u",
             (unsigned long long)ls.batches, 100.0 * (double)ls.best / ns, 100.0 * (double)ls.scored / ns,
             ls.rows_held, ls.batches ? 1e3 * secs / (double)ls.batches : 0.0, pp->laia_window, ls.tables_scored,
             ls.tables);
  }
}

/* ---- create / destroy */

int oracle_pipeline__init(oracle_job_t *j, char *err, size_t err_len) {
  oracle_pipe_t *pp = &j->pipe;
  const cfg_t *cfg = j->cfg;
  pthread_mutex_init(&pp->laia_mu, NULL);
  pthread_cond_init(&pp->laia_cv, NULL);
  pp->open = 1;
  pp->policy = plan_alloc_parse(j->allocation);
  pp->laia_window = (uint32_t)cfg_int(cfg, "oracle.laia_window");
  pp->laia_profile = (uint32_t)cfg_int(cfg, "oracle.laia_profile");
  pp->laia_min_share = cfg_float(cfg, "oracle.laia_min_share");
  pp->window = pp->window_cfg = (uint32_t)cfg_int(cfg, "oracle.window");
  /* every L, given or auto, is checked against cache_rows over the first
   * batches before training: a given L too large for the cache is lowered
   * then (the cacher's lowering during the run only frees slots waiting
   * out their L batches; it cannot undo rows already kept for a long
   * window) */
  pp->auto_l = !j->ideal;
  int given_l = strcmp(j->lookahead_cfg, "auto") != 0; /* lookahead = N: at most N */
  pp->lrpp = cfg_bool(cfg, "lrpp");
  pp->delayed = cfg_bool(cfg, "delayed_sync");
  pp->max_l = given_l ? (uint32_t)strtoul(j->lookahead_cfg, NULL, 10) : (uint32_t)cfg_int(cfg, "oracle.max_lookahead");
  /* lookahead = 0 (the baseline) has nothing to lower: nothing measured; a batch
   * too large for the cache fails the job when it is decided, naming
   * cache_rows (cacher.c) */
  if (given_l && pp->max_l == 0 && !j->strat_pending) pp->auto_l = 0;
  pp->cache_rows = (uint64_t)cfg_int(cfg, "cache_rows");
  pp->measure = pp->auto_l ? (uint64_t)cfg_int(cfg, "oracle.measure_batches") : 0;
  if (pp->measure > j->iterations) pp->measure = j->iterations;
  /* The ring of plans and the largest window (which sizes report's ring):
   * see set_lookahead; auto sizes them for the largest L it may choose,
   * and the plans for the measured batches too. */
  if (j->ideal) {
    pp->window_max = pp->window;
    pp->n_plans = pp->window + PLAN_AHEAD;
  } else {
    uint32_t l = pp->max_l;
    pp->window_max = pp->window_cfg > l + 2 ? pp->window_cfg : l + 2;
    uint64_t n = (uint64_t)l + pp->window_max + PLAN_AHEAD + 1;
    pp->n_plans = (uint32_t)(n > pp->measure ? n : pp->measure);
  }
  pp->span = pp->n_plans;
  if (pp->policy == PLAN_ALLOC_LAIA) {
    laia_opts_t lo = {.trainers = j->P,
                      .window = pp->laia_window,
                      .seed = j->seed,
                      .profile = pp->laia_profile,
                      .min_share = pp->laia_min_share};
    int rc = laia_create(&lo, &pp->laia);
    if (rc) {
      snprintf(err, err_len, "allocation = laia: %s", err_str(rc));
      return rc;
    }
  }
  if (!(pp->plans = calloc(pp->n_plans, sizeof *pp->plans))) return -ENOMEM;
  if (!j->ideal) {
    /* decided batches run at most n_plans + window_max ahead of the iterations reported */
    pp->n_floor = pp->n_plans + pp->window_max + 1;
    if (!(pp->floor_at = calloc(pp->n_floor, sizeof *pp->floor_at)) || plan_floor_init(&pp->floor, 0) != 0)
      return -ENOMEM;
    pp->floor_open = 1;
  }
  return 0;
}

int oracle_pipeline__start(oracle_job_t *j) {
  /* the cacher: now for lookahead = 0, else once the measured batches are planned (start_auto) */
  if (!j->ideal && !j->pipe.auto_l) return set_lookahead(j, 0);
  return 0;
}

int oracle_pipeline__restore(oracle_job_t *j, const oracle_ostate_t *o, char *err, size_t err_len) {
  oracle_pipe_t *pp = &j->pipe;
  uint64_t s = o->iteration + 1;
  if (pp->laia) {
    laia_t *l = NULL;
    laia_opts_t lo = {.trainers = j->P,
                      .window = pp->laia_window,
                      .seed = j->seed,
                      .profile = pp->laia_profile,
                      .min_share = pp->laia_min_share};
    if (o->laia_len && o->P == j->P) {
      char why[512] = "";
      int rc = laia_load(&lo, o->laia, o->laia_len, &l, why, sizeof why);
      if (rc) return err_set(err, err_len, rc, "laia's state in the checkpoint: %s", why);
    } else {
      /* another allocation or trainer count: laia starts over from c + 1 (warned: summation order) */
      int rc = laia_create(&lo, &l);
      if (rc || (rc = laia_start_at(l, s)) != 0) {
        laia_destroy(l);
        return err_set(err, err_len, rc, "allocation = laia: %s", err_str(rc));
      }
    }
    laia_destroy(pp->laia);
    pp->laia = l;
  }
  pp->laia_next = s;
  pp->next = pp->reaped = pp->push_next = pp->decide_next = s;
  return 0;
}

void oracle_pipeline__close(oracle_job_t *j) {
  oracle_pipe_t *pp = &j->pipe;
  if (!pp->open) return;
  release_plans(j);
  free(pp->plans);
  free(pp->floor_at);
  if (pp->floor_open) plan_floor_close(&pp->floor);
  cacher_destroy(pp->cache);
  laia_destroy(pp->laia);
  pthread_mutex_destroy(&pp->laia_mu);
  pthread_cond_destroy(&pp->laia_cv);
  pp->open = 0;
}
