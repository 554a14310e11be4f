/*
 * oracle_job: the job's state machine and its conductor (oracle_job.h says
 * what a job does; oracle_job_internal.h how its files share it).
 *
 * The states: waiting (trainers attach their Work streams) -> training
 * (once every rank said Hello) -> done | failed | stopped.  This file is
 * the only one that changes them, and job_end the single way a job ends:
 * from advance when a stage said an error (oracle_job__error; a timeout
 * waiting for the trainers and a broken stream are said the same way) or
 * report says the job is finished, and from oracle_job_stop.
 *
 * The conductor, oracle_job__advance, is the one place that says in
 * which order the stages run, as Redis's beforeSleep or libuv's uv_run
 * phases do: while training it runs fetch (collect what the threads
 * posted), pipeline (plan, then the cacher), dispatch, and asks report
 * whether the job is finished; it runs them again while a decision or a
 * Step sent may let an earlier stage go on.  Every event -- a worker-pool
 * completion, a fetch thread's wake-up, a message, a stream that ends or
 * has room -- ends by calling it.  A new state (a checkpoint, a recovery:
 * DESIGN.md section 5) is another case in advance with a pass of its own,
 * and the stages' end hooks in job_end are where a pause would go.
 */
#include "oracle_job.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "sdn.h"
#include "tstrat.h"

#define MAX_LOOKAHEAD 4096 /* largest fixed L (about 2 L plans in memory): oracle.max_lookahead's bound */

const char *oracle_state_name(int state) {
  switch (state) {
  case ORACLE_WAITING: return "waiting";
  case ORACLE_TRAINING: return "training";
  case ORACLE_DONE: return "done";
  case ORACLE_FAILED: return "failed";
  case ORACLE_STOPPED: return "stopped";
  case ORACLE_BLOCKED: return "blocked";
  case ORACLE_RECOVERING: return "recovering";
  }
  return "unknown";
}

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
  rc = strat ? tstrat_parse(cfg, sc.n_tables, strat, err, err_len) : -ENOMEM;
  free(strat);
  data_schema_close(&sc);
  return rc;
}

/* table_strategy: which tables live on one trainer (tstrat.h), and whose.
 * With an auto table the choice waits for the first batches
 * (oracle_pipeline__strategy); until then no table is dropped from the
 * plans and nothing is cached. */
static int strategy_init(oracle_job_t *j, char *err, size_t err_len) {
  int rc = data_schema_from_cfg(j->cfg, &j->schema, err, err_len);
  if (rc) return rc;
  j->have_schema = 1;
  if ((rc = cfg_layout(j->cfg, &j->layout, err, err_len)) != 0) return rc;
  uint32_t T = j->n_tables = j->schema.n_tables;
  if (!(j->strat = malloc(T)) || !(j->part_owner = malloc(T * sizeof *j->part_owner)) ||
      !(j->strat_why = calloc(T, sizeof *j->strat_why)))
    return -ENOMEM;
  if ((rc = tstrat_parse(j->cfg, T, j->strat, err, err_len)) != 0) return rc;
  if (j->ideal) memset(j->strat, TSTRAT_CACHE, T);
  j->part_any = tstrat_any(j->strat, T);
  for (uint32_t t = 0; t < T; t++) {
    j->part_owner[t] = TSTRAT_NONE;
    j->strat_pending |= j->strat[t] == TSTRAT_AUTO;
    snprintf(j->strat_why[t], sizeof j->strat_why[t], "%s",
             j->ideal ? "ideal mode: every row in the trainer" : "fixed by table_strategy");
  }
  return j->strat_pending ? 0 : oracle_job__strategy_set(j, j->strat);
}

int oracle_job__strategy_set(oracle_job_t *j, const uint8_t *strat) {
  uint32_t T = j->n_tables;
  tstrat_place(strat, &j->schema, &j->layout, j->P, j->part_owner);
  free(j->ext);
  j->ext = NULL;
  if (tstrat_any(strat, T) && !(j->ext = calloc(T, 1))) return -ENOMEM;
  for (uint32_t t = 0; t < T; t++) {
    if (j->ext) j->ext[t] = j->part_owner[t] != TSTRAT_NONE;
    if (j->part_owner[t] == TSTRAT_ALL)
      log_info("table %u: strategy=partition_rows owner=every trainer (row r on trainer r mod %u) rows=%" PRIu64
               " (%s)",
               t, j->P, j->schema.table_rows[t], j->strat_why[t]);
    else if (j->part_owner[t] != TSTRAT_NONE)
      log_info("table %u: strategy=partition owner=trainer %u rows=%" PRIu64 " (%s)", t, j->part_owner[t],
               j->schema.table_rows[t], j->strat_why[t]);
    else if (j->strat[t] == TSTRAT_AUTO)
      log_info("table %u: strategy=cache (%s)", t, j->strat_why[t]);
  }
  j->strat_pending = 0;
  return 0;
}

/* ---- the way out */

int oracle_job__error(oracle_job_t *j, int rc, const char *fmt, ...) {
  if (!rc) rc = -EIO;
  if (oracle_job__over(j) || j->fail_rc) return rc;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->fail_why, sizeof j->fail_why, fmt, ap);
  va_end(ap);
  j->fail_rc = rc;
  return rc;
}

void oracle_job__lose(oracle_job_t *j, const char *kind, const char *who, int rank, const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (oracle_job__over(j) || j->lost) return;
  if (!j->recs) {
    oracle_job__error(j, ERR_UNAVAILABLE, "%s was lost: %s", who, why);
    return;
  }
  j->lost = 1;
  j->lost_rank = rank;
  snprintf(j->lost_kind, sizeof j->lost_kind, "%s", kind);
  snprintf(j->lost_who, sizeof j->lost_who, "%s", who);
  snprintf(j->lost_why, sizeof j->lost_why, "%s", why);
}

static void on_recover_timer(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  if (j->on_recover && !j->destroying) j->on_recover(j, j->on_recover_ud);
}

/* Ends the job with why: every trainer gets StopWork and its stream is
 * finished, the fetch threads stop, the plans go.  No-op once over.
 * ORACLE_RECOVERING ends this job object only: StopWork says
 * "recovering", and on_recover (from the loop) replaces it. */
static void job_end(oracle_job_t *j, int state, const char *why) {
  if (oracle_job__over(j)) return;
  snprintf(j->message, sizeof j->message, "%s", why);
  j->state = state;
  if (state == ORACLE_RECOVERING) j->retired = 1;
  else metrics_gauge_set(j->m.state, state);
  oracle_fetch__stop(j);
  oracle_probe__stop(j);
  /* a checkpoint under way retrying a server that is gone gives up: the
   * daemon's loop ends once the worker pool is idle */
  if (j->ckpt.embc) embc_abort(j->ckpt.embc);
  for (uint32_t p = 0; p < j->P; p++) {
    rpc_call_t *c = j->tr[p].call;
    if (!c) continue;
    j->tr[p].call = NULL;
    j->attached--;
    oracle_dispatch__stop_work(c, j->message, state);
    rpc_call_finish(c, 0, NULL);
  }
  oracle_pipeline__end(j);
  if (state == ORACLE_RECOVERING) {
    log_warn("job %s: %s; this run of it ends here (generation %u), and the job recovers", j->job_id, j->message,
             j->generation);
    uv_timer_start(&j->recover_timer, on_recover_timer, 0, 0);
    return;
  }
  if (j->recs && j->ckpt.state_dir[0]) { /* a restarted oracle must not take this job for one killed mid-way */
    char e2[512];
    char cfgh[65];
    oracle_record_config_hash(j->cfg, cfgh);
    if (oracle_record_write(j->ckpt.state_dir, j->job_id, oracle_state_name(state), cfgh, e2, sizeof e2))
      log_warn("the oracle's job record was not updated: %s", e2);
  }
  if (state == ORACLE_FAILED) log_error("job failed job_id=%s iteration=%llu why=\"%s\"", j->job_id,
                                        (unsigned long long)j->report.done, j->message);
  else log_info("job %s job_id=%s iteration=%llu message=\"%s\"", oracle_state_name(state), j->job_id,
                (unsigned long long)j->report.done, j->message);
  sdn_status("job %s after %llu/%llu iterations: %s", oracle_state_name(state), (unsigned long long)j->report.done,
             (unsigned long long)j->iterations, j->message);
}

/* ---- the conductor */

/* While training: the stages in the order a batch goes through them,
 * again and again until nothing moves (the cacher decides one batch per
 * pass so that each decision is dispatched at once; a Step sent lets
 * planning go on).  ORACLE_CH_FINISHED once report says so, 0 when
 * nothing more can move now, or a stage's error (said). */
static int train(oracle_job_t *j) {
  for (;;) {
    int ch = 0, c;
    if ((c = oracle_fetch__collect(j)) < 0) return c; /* the evaluation set; a fetch thread's failure */
    ch |= c;
    if ((c = oracle_pipeline__plan(j)) < 0) return c; /* batches in order onto the worker pool */
    ch |= c;
    if ((c = oracle_pipeline__cache(j)) < 0) return c; /* choose L; push, decide one batch */
    ch |= c;
    if ((c = oracle_dispatch__run(j)) < 0) return c; /* Steps and Evals onto the streams */
    ch |= c;
    if ((c = oracle_ckpt__run(j)) < 0) return c; /* a checkpoint every trainer answered: the servers' part */
    if ((c = oracle_report__finished(j)) < 0) return c; /* every iteration and evaluation in? */
    if (c && !oracle_ckpt__busy(j)) return c;            /* ... and the end's checkpoint taken */
    if (!(ch & (ORACLE_CH_DECIDED | ORACLE_CH_SENT))) return 0;
  }
}

/* A recovery's last moments: the first replayed iteration, caught up. */
static void recovery_progress(oracle_job_t *j) {
  oracle_recovery_t *r = j->rec;
  if (!j->recover || !r) return;
  if (!r->t_first && j->report.done > j->ckpt.start) oracle_recovery_first(j->recs, r, j->report.done);
  if (r->t_first && !r->t_caught_up && j->report.done >= r->done_at_loss)
    oracle_recovery_caught_up(j->recs, r, j->report.done);
}

void oracle_job__advance(oracle_job_t *j) {
  if (j->destroying) return;
  if (j->advancing) { /* called from inside a pass: one more pass */
    j->again = 1;
    return;
  }
  j->advancing = 1;
  do {
    j->again = 0;
    if (j->lost && !oracle_job__over(j)) { /* a lost daemon: recover (this job object ends), or give up */
      char limit[1024];
      j->rec = oracle_recoveries_begin(j->recs, j->lost_kind, j->lost_who, j->lost_rank, j->report.done, j->lost_why,
                                       limit, sizeof limit);
      char msg[600];
      snprintf(msg, sizeof msg, "%s lost: %s", j->lost_who, j->lost_why);
      if (j->rec) job_end(j, ORACLE_RECOVERING, msg);
      else job_end(j, ORACLE_FAILED, limit);
    }
    if (j->fail_rc && !oracle_job__over(j)) job_end(j, ORACLE_FAILED, j->fail_why);
    switch (j->state) {
    case ORACLE_WAITING: break; /* trainers attach (oracle_job_attach starts training) */
    case ORACLE_RECOVERING: break; /* the servers roll back, trainers attach (oracle_ckpt.c begins) */
    case ORACLE_BLOCKED: break;    /* chanter train --resume / --fresh (oracle_job_start_request) */
    case ORACLE_TRAINING: {
      int c = train(j);
      recovery_progress(j);
      if (c < 0) {
        job_end(j, ORACLE_FAILED, j->fail_why);
      } else if (c & ORACLE_CH_FINISHED) {
        char why[96];
        snprintf(why, sizeof why, "training finished: %llu iterations", (unsigned long long)j->iterations);
        job_end(j, ORACLE_DONE, why);
      }
      break;
    }
    default: /* over: the job only answers Status; an evaluation set posted before the end still counts there */
      oracle_fetch__collect(j);
      break;
    }
  } while (j->again);
  j->advancing = 0;
}

void oracle_job__begin(oracle_job_t *j) {
  if (oracle_pipeline__start(j) != 0) { /* lookahead = 0: the cacher, from the first batch of this run */
    oracle_job__error(j, -ENOMEM, "out of memory creating the cacher");
    oracle_job__advance(j);
    return;
  }
  j->state = ORACLE_TRAINING;
  metrics_gauge_set(j->m.state, j->state);
  oracle_report__start(j);
  if (j->recover && j->rec) oracle_recovery_resumed(j->recs, j->rec, j->generation);
  if (j->recs && j->ckpt.state_dir[0]) { /* killed from here on, the next oracle recovers this job */
    char e2[512];
    char cfgh[65];
    oracle_record_config_hash(j->cfg, cfgh);
    if (oracle_record_write(j->ckpt.state_dir, j->job_id, "training", cfgh, e2, sizeof e2))
      log_warn("the oracle's job record was not written (a restarted oracle will not recover this job by "
               "itself): %s",
               e2);
  }
  log_info("all %u trainers connected; training job_id=%s iterations=%llu batch_size=%u allocation=%s mode=%s "
           "window=%u fetch_threads=%u chunk=%u queue=%u",
           j->P, j->job_id, (unsigned long long)j->iterations, j->B, j->allocation, j->mode, j->pipe.window,
           j->fetch.n_train_threads, j->fetch.chunk, j->fetch.q_cap);
  sdn_status("training: iteration %llu/%llu", (unsigned long long)j->ckpt.start, (unsigned long long)j->iterations);
  oracle_fetch__begin(j); /* an error is said: advance ends the job */
  oracle_job__advance(j);
}

/* ---- streams */

/* Ends rank's stream with a protocol error and fails the job. */
static void protocol_error(oracle_job_t *j, uint32_t p, rpc_call_t *call, const char *why) {
  if (j->tr[p].call == call) {
    j->tr[p].call = NULL;
    j->attached--;
  }
  rpc_call_fail(call, -EINVAL, "%s", why);
  if (j->state == ORACLE_TRAINING) oracle_job__error(j, -EINVAL, "trainer rank %u: %s", p, why);
}

int oracle_job_attach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, uint64_t next_iteration, char *why,
                      size_t why_len) {
  if (rank >= j->P) {
    snprintf(why, why_len, "rank %u is outside 0..%u (trainers = %u)", rank, j->P - 1, j->P);
    return -EINVAL;
  }
  if (j->state != ORACLE_WAITING && j->state != ORACLE_RECOVERING) {
    snprintf(why, why_len, "the job is %s%s%s%s", oracle_state_name(j->state), j->message[0] ? ": " : "", j->message,
             j->state == ORACLE_TRAINING ? "; a trainer joins a running job only through a recovery (the oracle "
                                           "recovers once it notices that the rank's trainer is lost)"
                                         : "");
    return ORACLE_ERR_PRECONDITION;
  }
  if (j->tr[rank].call) {
    snprintf(why, why_len, "rank %u already has a Work stream open; one trainer per rank", rank);
    return ERR_EXISTS;
  }
  if (next_iteration != 0) {
    snprintf(why, why_len,
             "Hello asks to resume at iteration %llu, but this oracle starts every job at iteration 0 (resuming "
             "is not supported yet)",
             (unsigned long long)next_iteration);
    return ORACLE_ERR_PRECONDITION;
  }
  j->tr[rank] = (oracle_trainer_t){.call = call};
  j->attached++;
  log_info("trainer connected rank=%u peer=%s connected=%u/%u", rank, rpc_call_peer(call), j->attached, j->P);
  if (j->attached == j->P) {
    uv_timer_stop(&j->start_timer);
    oracle_ckpt__attached(j); /* the servers are checked (or rolled back), then training begins (or is blocked) */
    oracle_job__advance(j);
  }
  return 0;
}

void oracle_job_on_message(oracle_job_t *j, uint32_t rank, rpc_call_t *call,
                           const Chanter__Oracle__V1__TrainerMessage *m) {
  if (rank >= j->P || j->tr[rank].call != call) return;
  char why[1024];
  int rc = m->kind_case == CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_CHECKPOINT_DONE
               ? oracle_ckpt__message(j, rank, m->checkpoint_done, why, sizeof why)
               : oracle_report__message(j, rank, m, why, sizeof why);
  if (rc == -EINVAL) protocol_error(j, rank, call, why);
  oracle_job__advance(j);
}

#define SOFT_GRACE_MS 500

static void on_soft_timer(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  int r = j->soft_rank;
  if (j->destroying || r < 0 || j->lost || oracle_job__over(j)) return;
  char who[32];
  snprintf(who, sizeof who, "trainer-%d", r);
  oracle_job__lose(j, "trainer", who, r,
                   "it left the job at iteration %llu after a step failed on it, and no other daemon was lost within "
                   "%d ms (see its log)",
                   (unsigned long long)j->soft_at, SOFT_GRACE_MS);
  oracle_job__advance(j);
}

void oracle_job_detach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, int cancelled) {
  if (rank >= j->P || j->tr[rank].call != call) return;
  oracle_trainer_t *t = &j->tr[rank];
  t->call = NULL;
  j->attached--;
  if (j->state != ORACLE_TRAINING) { /* before the start: its replacement (or itself) attaches again */
    log_warn("trainer left before the job started rank=%u how=%s state=%s", rank, cancelled ? "cancelled" : "half-closed",
             oracle_state_name(j->state));
    if (!cancelled) rpc_call_finish(call, 0, NULL);
    *t = (oracle_trainer_t){0};
    return;
  }
  if (!cancelled) {
    /* a trainer closes its stream mid-job when a step failed because of
     * a peer (a collective broke): the peer's loss usually shows at once;
     * this trainer is named only if none does within the grace */
    rpc_call_finish(call, 0, NULL);
    if (!j->lost && j->soft_rank < 0) {
      j->soft_rank = (int)rank;
      j->soft_at = j->report.rank[rank].reported;
      uv_timer_start(&j->recover_timer, on_soft_timer, SOFT_GRACE_MS, 0);
      log_info("trainer rank %u left the job's generation (a step failed on it); waiting %d ms for the loss behind it",
               rank, SOFT_GRACE_MS);
    }
    return;
  }
  char who[32];
  snprintf(who, sizeof who, "trainer-%u", rank);
  oracle_job__lose(j, "trainer", who, (int)rank,
                   "its Work stream broke (the trainer exited or lost its connection) at iteration %llu",
                   (unsigned long long)j->report.rank[rank].reported);
  oracle_job__advance(j);
}

void oracle_job_lose_rank(oracle_job_t *j, uint32_t rank, const char *kind, const char *why) {
  if (rank >= j->P || oracle_job__over(j)) return;
  rpc_call_t *c = j->tr[rank].call;
  if (j->state != ORACLE_TRAINING) return; /* not started: it is only missing, and the start timer says so */
  if (c) { /* its stream ends here: a trainer that wakes up finds it gone and joins again */
    j->tr[rank].call = NULL;
    j->attached--;
    rpc_call_fail(c, ERR_UNAVAILABLE, "trainer rank %u: %s; the job recovers without this stream", rank, why);
  }
  char who[32];
  snprintf(who, sizeof who, "trainer-%u", rank);
  oracle_job__lose(j, kind, who, (int)rank, "%s", why);
  oracle_job__advance(j);
}

int oracle_job_lost_rank(const oracle_job_t *j) { return j->rec ? j->rec->lost_rank : -1; }
uint32_t oracle_job_generation(const oracle_job_t *j) { return j->generation; }

void oracle_job_sent(oracle_job_t *j, uint32_t rank) {
  if (rank < j->P && j->tr[rank].call) oracle_job__advance(j);
}

void oracle_job_stop(oracle_job_t *j, const char *reason) {
  job_end(j, ORACLE_STOPPED, reason && *reason ? reason : "stopped");
}

static void on_wake(uv_async_t *h) { oracle_job__advance(h->data); }

static void on_start_timeout(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  if (j->state != ORACLE_WAITING) return;
  char missing[512] = "";
  size_t o = 0;
  for (uint32_t p = 0; p < j->P && o < sizeof missing - 16; p++)
    if (!j->tr[p].call) o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%u", o ? ", " : "", p);
  oracle_job__error(j, ERR_DEADLINE,
                    "only %u of %u trainers opened their Work stream within oracle.start_timeout_ms = %lld ms "
                    "(missing ranks: %s); start them, or raise oracle.start_timeout_ms",
                    j->attached, j->P, (long long)cfg_int(j->cfg, "oracle.start_timeout_ms"), missing);
  oracle_job__advance(j);
}

/* ---- create / destroy */

static void metrics_init(oracle_job_t *j, metrics_registry_t *reg) {
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
}

int oracle_job_create(uv_loop_t *loop, const cfg_t *cfg, metrics_registry_t *reg, const oracle_job_opts_t *opts,
                      oracle_job_t **out, char *err, size_t err_len) {
  static const oracle_job_opts_t none = {0};
  if (!opts) opts = &none;
  int rc = oracle_job_check_cfg(cfg, err, err_len);
  if (rc) return rc;
  oracle_job_t *j = calloc(1, sizeof *j);
  if (!j) return -ENOMEM;
  j->loop = loop;
  j->cfg = cfg;
  j->P = (uint32_t)cfg_int(cfg, "trainers");
  j->B = (uint32_t)cfg_int(cfg, "batch_size");
  j->iterations = (uint64_t)cfg_int(cfg, "iterations");
  j->eval_every = (uint64_t)cfg_int(cfg, "eval_every");
  j->eval_batches = (uint64_t)cfg_int(cfg, "eval_batches");
  j->seed = (uint64_t)cfg_int(cfg, "seed");
  j->allocation = cfg_str(cfg, "allocation");
  j->mode = cfg_str(cfg, "mode");
  j->ideal = !strcmp(j->mode, "ideal");
  j->drain_ms = (int)cfg_int(cfg, "oracle.drain_ms");
  j->lookahead_cfg = cfg_str(cfg, "lookahead");
  j->recover = opts->recover;
  j->generation = opts->generation ? opts->generation : 1;
  j->recs = opts->recs;
  j->rec = opts->rec;
  j->on_recover = opts->on_recover;
  j->on_recover_ud = opts->ud;
  j->lost_rank = -1;
  j->soft_rank = -1;
  if (opts->job_id && *opts->job_id) {
    snprintf(j->job_id, sizeof j->job_id, "%s", opts->job_id);
  } else {
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(j->job_id, sizeof j->job_id, "seed%llu-%s", (unsigned long long)j->seed, ts);
  }
  if (j->recover) j->state = ORACLE_RECOVERING;
  if ((rc = strategy_init(j, err, err_len)) != 0) goto fail;
  /* the stages, in order (report's ring follows the pipeline's window) */
  if ((rc = oracle_fetch__init(j, err, err_len)) != 0 || (rc = oracle_pipeline__init(j, err, err_len)) != 0 ||
      (rc = oracle_dispatch__init(j)) != 0 || (rc = oracle_report__init(j)) != 0 ||
      (rc = oracle_ckpt__init(j, reg, err, err_len)) != 0 || (rc = oracle_probe__init(j, reg)) != 0)
    goto fail;
  if (!(j->tr = calloc(j->P, sizeof *j->tr))) {
    rc = -ENOMEM;
    goto fail;
  }
  metrics_init(j, reg);
  /* handles: unref'd, so that they never keep a draining daemon's loop alive */
  uv_async_init(loop, &j->wake, on_wake);
  j->wake.data = j;
  uv_unref((uv_handle_t *)&j->wake);
  uv_timer_init(loop, &j->start_timer);
  j->start_timer.data = j;
  uv_timer_start(&j->start_timer, on_start_timeout, (uint64_t)cfg_int(cfg, "oracle.start_timeout_ms"), 0);
  uv_unref((uv_handle_t *)&j->start_timer);
  uv_timer_init(loop, &j->recover_timer);
  j->recover_timer.data = j;
  uv_unref((uv_handle_t *)&j->recover_timer);
  j->handles_open = 3;
  metrics_gauge_set(j->m.state, j->state);
  log_info("job created job_id=%s trainers=%u batch_size=%u iterations=%llu allocation=%s mode=%s lookahead=%s "
           "eval_every=%llu eval_batches=%llu dataprocs=%u",
           j->job_id, j->P, j->B, (unsigned long long)j->iterations, j->allocation, j->mode,
           j->ideal ? "0 (ideal)" : j->lookahead_cfg, (unsigned long long)j->eval_every,
           (unsigned long long)j->eval_batches, j->fetch.n_dpc);
  *out = j;
  if (j->recover) oracle_ckpt__recover(j); /* roll the servers back now: parked write-backs go, stale ones fail */
  return 0;
fail:
  oracle_job_destroy(j);
  return rc;
}

static void free_stages(oracle_job_t *j) {
  oracle_fetch__close(j);
  oracle_pipeline__close(j);
  oracle_dispatch__close(j);
  oracle_report__close(j);
  oracle_ckpt__close(j);
  oracle_probe__free(j);
  free(j->tr);
  free(j->ext);
  free(j->part_owner);
  free(j->strat_why);
  free(j->strat);
  if (j->have_schema) data_schema_close(&j->schema);
  table_layout_close(&j->layout);
  free(j);
}

static void on_closed(uv_handle_t *h) {
  oracle_job_t *j = h->data;
  j->handles_open--;
}

void oracle_job_destroy(oracle_job_t *j) {
  if (!j) return;
  /* cacher_auto may still read the probe plans on the worker pool, and
   * Info still be asked there (stop ends its retries) */
  j->destroying = 1;
  oracle_fetch__stop(j);
  if (j->ckpt.embc) embc_abort(j->ckpt.embc); /* a checkpoint's calls to a server that is gone give up */
  oracle_probe__stop(j);
  while (j->pipe.auto_running || j->strat_running || j->pipe.running || j->fetch.info_running || j->ckpt.running || j->report.evals_running ||
         oracle_probe__busy(j))
    uv_run(j->loop, UV_RUN_ONCE);
  int stuck = oracle_fetch__join(j);
  if (j->handles_open) {
    uv_close((uv_handle_t *)&j->wake, on_closed);
    uv_close((uv_handle_t *)&j->start_timer, on_closed);
    uv_close((uv_handle_t *)&j->recover_timer, on_closed);
    oracle_probe__close_handle(j, on_closed);
    while (j->handles_open) uv_run(j->loop, UV_RUN_NOWAIT);
  }
  if (stuck) {
    /* they still use the dpc and the queue: leave those to the process exit */
    log_warn("batch fetch threads still retrying a data processor at exit threads=%d; leaving them", stuck);
    return;
  }
  free_stages(j);
}

/* ---- retire: destroy from inside the loop */

static void on_retired_closed(uv_handle_t *h) {
  oracle_job_t *j = h->data;
  if (--j->handles_open == 0) free_stages(j);
}

/* Polls until nothing of the job runs on the worker pool, then lets the
 * fetch threads go and closes the handles (the last close frees it). */
static void on_retire_poll(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  if (j->pipe.auto_running || j->pipe.running || j->fetch.info_running || j->ckpt.running || j->report.evals_running ||
      oracle_probe__busy(j))
    return;
  uv_timer_stop(t);
  if (oracle_fetch__join(j)) {
    /* they still use the dpc and the queue: leave this job object (its memory) to the process exit */
    log_warn("batch fetch threads of the retired run (generation %u) still retry a data processor; leaving them",
             j->generation);
    return;
  }
  uv_close((uv_handle_t *)&j->wake, on_retired_closed);
  uv_close((uv_handle_t *)&j->start_timer, on_retired_closed);
  uv_close((uv_handle_t *)&j->recover_timer, on_retired_closed);
  oracle_probe__close_handle(j, on_retired_closed);
}

void oracle_job_retire(oracle_job_t *j) {
  if (!j) return;
  j->destroying = 1;
  oracle_fetch__stop(j);
  oracle_probe__stop(j);
  if (j->ckpt.embc) embc_abort(j->ckpt.embc);
  uv_timer_stop(&j->start_timer);
  uv_timer_start(&j->recover_timer, on_retire_poll, 0, 20);
}

/* ---- accessors */

const char *oracle_job_id(const oracle_job_t *j) { return j->job_id; }
int oracle_job_state(const oracle_job_t *j) { return j->state; }
int oracle_job_over(const oracle_job_t *j) { return oracle_job__over(j); }
const char *oracle_job_message(const oracle_job_t *j) { return j->message; }
uint64_t oracle_job_done(const oracle_job_t *j) { return j->report.done; }
uint64_t oracle_job_iterations(const oracle_job_t *j) { return j->iterations; }
uint64_t oracle_job_rank_reported(const oracle_job_t *j, uint32_t rank) {
  return rank < j->P ? j->report.rank[rank].reported : 0;
}
int oracle_job_rank_attached(const oracle_job_t *j, uint32_t rank) { return rank < j->P && j->tr[rank].call; }
char *oracle_job_summary(const oracle_job_t *j) { return oracle_report__summary(j); }
