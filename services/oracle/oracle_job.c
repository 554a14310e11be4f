/*
 * oracle_job: the job's lifecycle and its conductor (oracle_job.h says
 * what a job does; oracle_job_internal.h how its files share it).
 *
 * The lifecycle.  A job object is in one state at a time; set_state, in
 * this file, is the only writer of j->state and of what mirrors it (the
 * job_state gauge, the job record in oracle.state_dir), and it moves only
 * along this table (oracle_job__next_state holds it as code, and refuses
 * anything else):
 *
 *   state       what it waits for                  event         next
 *   ----------  ---------------------------------  ------------  ----------
 *   (created)   nothing                            create        waiting
 *               ... created to recover             recover       recovering
 *   waiting     every trainer attached (Hello):
 *                - embedding servers to check      attached      checking
 *                - none, or already rolled back    ready         training
 *   checking    the check (worker pool) came back:
 *                - the servers hold nothing        empty         starting
 *                - another job's state             block         blocked
 *   blocked     chanter train --resume / --fresh   start         starting
 *   starting    the start (fresh: clear and stamp; resume: restore) came
 *               back:
 *                - done, every trainer attached    ready         training
 *                - done, but a trainer left        left          waiting
 *                - a resume refused                block         blocked
 *   recovering  the roll-back came back and every trainer attached
 *                                                  ready         training
 *                - the servers hold another job's  block         blocked
 *   training    report says every iteration and evaluation is in
 *                                                  finished      done
 *   any above   an error said (oracle_job__error), fail          failed
 *               the start timeout, a lost daemon
 *               with no recovery left
 *   any above   Stop, SIGTERM                      stop          stopped
 *   done, failed, stopped: the end; the job only answers Status.
 *
 * A lost daemon (DESIGN.md 5: a trainer's stream broke or it fell silent,
 * an embedding server lost without durable writes) is not a transition of
 * this object: advance retires it (j->retired: StopWork "recovering" to
 * every trainer, on_recover from the loop), and oracle_job_successor
 * (which the service calls there) creates the next run's object -- the
 * next generation, started in recovering -- and retires this one, which
 * frees itself once nothing of it runs.  checking and starting are
 * reported as "waiting" (oracle_state_name), as they always were.  A
 * scale (oracle_scale.c) ends a run the same way once its checkpoint is
 * complete (job_rescaled); the successor has the new trainer count.
 *
 * The conductor, oracle_job__advance, has a case for every state, and is
 * the one place that decides: every event -- a worker-pool completion, a
 * fetch thread's wake-up, a message, a stream that ends or has room, a
 * request -- only records what happened (a result kept for its state's
 * case, a counter, oracle_job__error, oracle_job__lose) and calls it.  In
 * training it runs the stages in the order a batch goes through them, as
 * Redis's beforeSleep or libuv's uv_run phases do: fetch (collect what
 * the threads posted), pipeline (plan, then the cacher), dispatch, the
 * checkpoint's servers' part, and asks report whether the job is
 * finished; it runs them again while a decision or a Step sent may let an
 * earlier stage go on.  job_end is the single way a job ends.
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
#include "strategy.h"

/* ---- the lifecycle table, as code */

static const char *const state_labels[ORACLE_N_STATES] = {
    [ORACLE_WAITING] = "waiting",       [ORACLE_TRAINING] = "training", [ORACLE_DONE] = "done",
    [ORACLE_FAILED] = "failed",         [ORACLE_STOPPED] = "stopped",   [ORACLE_BLOCKED] = "blocked",
    [ORACLE_RECOVERING] = "recovering", [ORACLE_CHECKING] = "checking", [ORACLE_STARTING] = "starting",
};

static const char *const event_names[ORACLE_N_EVENTS] = {
    [ORACLE_EV_CREATE] = "create", [ORACLE_EV_RECOVER] = "recover", [ORACLE_EV_ATTACHED] = "attached",
    [ORACLE_EV_EMPTY] = "empty",   [ORACLE_EV_BLOCK] = "block",     [ORACLE_EV_START] = "start",
    [ORACLE_EV_LEFT] = "left",     [ORACLE_EV_READY] = "ready",     [ORACLE_EV_FINISHED] = "finished",
    [ORACLE_EV_FAIL] = "fail",     [ORACLE_EV_STOP] = "stop",
};

static const struct {
  int from, ev, to;
} lifecycle[] = {
    {ORACLE_WAITING, ORACLE_EV_CREATE, ORACLE_WAITING}, /* (calloc'ed: the object starts waiting) */
    {ORACLE_WAITING, ORACLE_EV_RECOVER, ORACLE_RECOVERING},
    {ORACLE_WAITING, ORACLE_EV_ATTACHED, ORACLE_CHECKING},
    {ORACLE_WAITING, ORACLE_EV_READY, ORACLE_TRAINING},
    {ORACLE_CHECKING, ORACLE_EV_EMPTY, ORACLE_STARTING},
    {ORACLE_CHECKING, ORACLE_EV_BLOCK, ORACLE_BLOCKED},
    {ORACLE_BLOCKED, ORACLE_EV_START, ORACLE_STARTING},
    {ORACLE_STARTING, ORACLE_EV_READY, ORACLE_TRAINING},
    {ORACLE_STARTING, ORACLE_EV_LEFT, ORACLE_WAITING},
    {ORACLE_STARTING, ORACLE_EV_BLOCK, ORACLE_BLOCKED},
    {ORACLE_RECOVERING, ORACLE_EV_READY, ORACLE_TRAINING},
    {ORACLE_RECOVERING, ORACLE_EV_BLOCK, ORACLE_BLOCKED},
    {ORACLE_TRAINING, ORACLE_EV_FINISHED, ORACLE_DONE},
};

static int is_end(int state) { return state == ORACLE_DONE || state == ORACLE_FAILED || state == ORACLE_STOPPED; }

int oracle_job__next_state(int state, int ev) {
  if (state < 0 || state >= ORACLE_N_STATES || ev < 0 || ev >= ORACLE_N_EVENTS || is_end(state)) return -1;
  if (ev == ORACLE_EV_FAIL) return ORACLE_FAILED;
  if (ev == ORACLE_EV_STOP) return ORACLE_STOPPED;
  for (size_t i = 0; i < sizeof lifecycle / sizeof lifecycle[0]; i++)
    if (lifecycle[i].from == state && lifecycle[i].ev == ev) return lifecycle[i].to;
  return -1;
}

const char *oracle_job__state_label(int state) {
  return state >= 0 && state < ORACLE_N_STATES ? state_labels[state] : "unknown";
}

const char *oracle_job__event_name(int ev) { return ev >= 0 && ev < ORACLE_N_EVENTS ? event_names[ev] : "unknown"; }

/* The state as the wire, the log and the job_state metric know it. */
static int reported(int state) {
  return state == ORACLE_CHECKING || state == ORACLE_STARTING ? ORACLE_WAITING : state;
}

const char *oracle_state_name(int state) {
  return state >= 0 && state < ORACLE_N_STATES ? state_labels[reported(state)] : "unknown";
}

/* Moves the job along the lifecycle (ev must be a transition of the
 * table) and updates what mirrors its state: the gauge, and the job record
 * for the states a restarted oracle reads (training: killed from here on,
 * the next oracle recovers the job; an end: it must not). */
static void set_state(oracle_job_t *j, int ev) {
  int from = j->state, to = oracle_job__next_state(from, ev);
  ASSERT(to >= 0);
  j->state = to;
  j->again = 1; /* (inside advance: the new state's case runs next) */
  metrics_gauge_set(j->m.state, reported(to));
  if (reported(to) != reported(from)) oracle_timeline__state(j, oracle_state_name(to));
  log_debug("job state job_id=%s from=%s to=%s event=%s", j->job_id, oracle_job__state_label(from),
            oracle_job__state_label(to), oracle_job__event_name(ev));
  if (j->on_state) j->on_state(j, from, to, j->on_recover_ud);
  if ((to == ORACLE_TRAINING || is_end(to)) && j->recs && j->ckpt.state_dir[0]) {
    char e2[512], cfgh[65];
    oracle_record_scale_t sc; /* (a scale under way stays in the record) */
    oracle_scale__record(j, cfgh, &sc);
    if (oracle_record_write(j->ckpt.state_dir, j->job_id, oracle_state_name(to), cfgh, &sc, e2, sizeof e2)) {
      log_warn("the oracle's job record was not %s: %s", to == ORACLE_TRAINING ? "written (a restarted oracle will "
               "not recover this job by itself)" : "updated", e2);
    }
  }
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
  /* no recovery onto a full disk: its restore and replay would meet it too */
  char full[640];
  if (oracle_probe__disk_full(j, full, sizeof full)) {
    oracle_job__error(j, -ENOSPC, "%s was lost (%s) while the job was paused: %s; the job does not recover onto a "
                      "full disk: free space there, then `chanter train --resume` goes on from the last complete "
                      "checkpoint", who, why, full);
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

/* What every end of this job object does: every trainer gets StopWork
 * (j->message; the job's state as reported) and its stream is finished,
 * the fetch threads and the probe stop, the plans go. */
static void end_run(oracle_job_t *j, int reported_state) {
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
    oracle_dispatch__stop_work(c, j->message, reported_state);
    rpc_call_finish(c, 0, NULL);
  }
  oracle_pipeline__end(j);
}

/* Ends the job with why (ev: finished, fail or stop).  No-op once over. */
static void job_end(oracle_job_t *j, int ev, const char *why) {
  if (oracle_job__over(j)) return;
  snprintf(j->message, sizeof j->message, "%s", why);
  set_state(j, ev);
  end_run(j, j->state);
  if (j->state == ORACLE_FAILED)
    log_error("job failed job_id=%s iteration=%llu why=\"%s\"", j->job_id, (unsigned long long)j->report.done,
              j->message);
  else
    log_info("job %s job_id=%s iteration=%llu message=\"%s\"", oracle_state_name(j->state), j->job_id,
             (unsigned long long)j->report.done, j->message);
  sdn_status("job %s after %llu/%llu iterations: %s", oracle_state_name(j->state), (unsigned long long)j->report.done,
             (unsigned long long)j->iterations, j->message);
}

/* A daemon was lost: this job object ends (StopWork says "recovering")
 * and retires, and on_recover (from the loop) replaces it; or, with no
 * recovery left, the job fails. */
static void job_lost(oracle_job_t *j) {
  char limit[1024];
  j->rec = oracle_recoveries_begin(j->recs, j->lost_kind, j->lost_who, j->lost_rank, j->report.done, j->lost_why,
                                   limit, sizeof limit);
  if (!j->rec) {
    job_end(j, ORACLE_EV_FAIL, limit);
    return;
  }
  snprintf(j->message, sizeof j->message, "%s lost: %s", j->lost_who, j->lost_why);
  if (j->scale_to) oracle_scales_ended(j->recs); /* the recovery carries the scale out */
  j->retired = 1;
  oracle_timeline__state(j, "recovering");
  end_run(j, ORACLE_RECOVERING);
  log_warn("job %s: %s; this run of it ends here (generation %u), and the job recovers%s", j->job_id, j->message,
           j->generation, j->scale_to ? " on the trainers it is scaled to" : "");
  uv_timer_start(&j->recover_timer, on_recover_timer, 0, 0);
}

/* chanter scale: its checkpoint is complete; this run ends as a
 * recovery's does, and the successor has scale_to trainers (oracle_scale.c). */
static void job_rescaled(oracle_job_t *j) {
  oracle_scale__what(j, j->message, sizeof j->message);
  if (j->recs) oracle_scales_ended(j->recs);
  j->retired = 1;
  oracle_timeline__state(j, "recovering");
  end_run(j, ORACLE_RECOVERING);
  log_info("job %s: %s; this run (generation %u, %u trainers) ends here", j->job_id, j->message, j->generation, j->P);
  uv_timer_start(&j->recover_timer, on_recover_timer, 0, 0);
}

/* ---- the conductor's cases */

/* While training: the stages in the order a batch goes through them,
 * again and again until nothing moves (the cacher decides one batch per
 * pass so that each decision is dispatched at once; a Step sent lets
 * planning go on).  ORACLE_CH_FINISHED once report says so, 0 when
 * nothing more can move now, or a stage's error (said). */
static int train(oracle_job_t *j) {
  for (;;) {
    int ch = 0, c;
    if ((c = oracle_ckpt__collect(j)) < 0) return c; /* the servers' answers for a checkpoint */
    if (j->lost) return 0;                            /* ... one was lost: advance recovers */
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

/* The embedding servers say no: the job waits for an operator. */
static void block(oracle_job_t *j, const char *why) {
  snprintf(j->message, sizeof j->message, "%.1500s", why);
  set_state(j, ORACLE_EV_BLOCK);
  log_warn("job blocked: %s", why);
}

/* Training begins at j->ckpt.start (0, or c + 1 resumed): the clocks, the
 * fetch threads. */
static void begin_training(oracle_job_t *j) {
  j->message[0] = 0;
  if (oracle_pipeline__start(j) != 0) { /* lookahead = 0: the cacher, from the first batch of this run */
    oracle_job__error(j, -ENOMEM, "out of memory creating the cacher");
    return;
  }
  set_state(j, ORACLE_EV_READY);
  oracle_report__start(j);
  if (j->recover && j->rec) oracle_recovery_resumed(j->recs, j->rec, j->generation);
  if (j->recover && j->recs) oracle_scales_trained(j->recs, j->generation, j->ckpt.start);
  log_info("all %u trainers connected; training job_id=%s iterations=%llu batch_size=%u allocation=%s mode=%s "
           "window=%u fetch_threads=%u chunk=%u queue=%u",
           j->P, j->job_id, (unsigned long long)j->iterations, j->B, j->allocation, j->mode, j->pipe.window,
           j->fetch.n_train_threads, j->fetch.chunk, j->fetch.q_cap);
  sdn_status("training: iteration %llu/%llu", (unsigned long long)j->ckpt.start, (unsigned long long)j->iterations);
  oracle_fetch__begin(j); /* an error is said: advance ends the job */
}

/* The servers are ready: training, if every trainer is still attached;
 * else the job waits for them again (their return checks the servers
 * anew). */
static void servers_ready(oracle_job_t *j) {
  if (j->attached == j->P) {
    begin_training(j);
    return;
  }
  snprintf(j->message, sizeof j->message, "a trainer left before the start; waiting for %u of %u", j->P - j->attached,
           j->P);
  set_state(j, ORACLE_EV_LEFT);
  log_warn("%s", j->message);
}

/* waiting: every trainer attached?  Then the servers are checked; with
 * none (or rolled back already, by this recovery's object) training
 * begins. */
static void case_waiting(oracle_job_t *j) {
  if (j->attached < j->P) return;
  if (!j->ckpt.enabled || (j->recover && j->rolled_back)) {
    begin_training(j);
    return;
  }
  if (oracle_ckpt__check(j) != 0) return; /* said */
  snprintf(j->message, sizeof j->message, "checking the embedding servers");
  set_state(j, ORACLE_EV_ATTACHED);
}

/* checking: what the servers hold decides. */
static void case_checking(oracle_job_t *j) {
  ck_work_t *w = oracle_ckpt__start_done(j);
  if (!w) return;
  if (w->rc) {
    oracle_job__error(j, w->rc, "checking the embedding servers before the job starts: %s", w->err);
  } else if (!w->empty) {
    block(j, w->found);
  } else if (oracle_ckpt__start(j, 1, 1, NULL) == 0) { /* nothing there: this job's stamp, then training */
    set_state(j, ORACLE_EV_EMPTY);
  }
  oracle_ckpt__work_free(w);
}

/* blocked: an operator's --resume or --fresh starts the job. */
static void case_blocked(oracle_job_t *j) {
  if (!j->start_req.asked) return;
  j->start_req.asked = 0;
  if (oracle_ckpt__start(j, j->start_req.fresh, 0, j->start_req.want) != 0) return; /* said */
  if (j->start_req.fresh) snprintf(j->message, sizeof j->message, "clearing the embedding servers (--fresh)");
  else snprintf(j->message, sizeof j->message, "restoring checkpoint %s", j->start_req.want);
  set_state(j, ORACLE_EV_START);
  log_info("start requested: %s", j->message);
}

/* The job goes on from checkpoint m (resumed, or rolled back to): the
 * oracle's state blob back into every stage.  0 or an error (said). */
static int load_checkpoint(oracle_job_t *j, ck_work_t *w, const char *what) {
  char err[1024];
  int rc = oracle_ckpt__state_load(j, w->ostate, w->ostate_len, err, sizeof err);
  if (rc) return oracle_job__error(j, rc, "%s from checkpoint %s: %s", what, w->m.id, err);
  oracle_ckpt__resumed(j, &w->m);
  return 0;
}

/* starting: the servers were cleared (fresh) or restored (resume). */
static void case_starting(oracle_job_t *j) {
  ck_work_t *w = oracle_ckpt__start_done(j);
  if (!w) return;
  if (w->kind == W_FRESH && w->rc) {
    oracle_job__error(j, w->rc, "starting the job on cleared embedding servers: %s", w->err);
  } else if (w->kind == W_FRESH) {
    j->write_epoch = w->write_epoch;
    oracle_probe__baseline(j, w->incs, j->ckpt.S);
    if (!w->empty) log_info("embedding servers cleared (--fresh); the job starts at iteration 0 job_id=%s", j->job_id);
    servers_ready(j);
  } else if (w->rc) { /* the servers are as they were (unless the message says otherwise): blocked again */
    char why[1200];
    snprintf(why, sizeof why, "resume refused: %.1150s", w->err);
    block(j, why);
  } else if (load_checkpoint(j, w, "resuming") == 0) {
    if (w->warn[0]) {
      log_warn("resume: %s", w->warn);
      oracle_fetch__warn(j, w->warn);
    }
    j->write_epoch = w->write_epoch;
    oracle_probe__baseline(j, w->incs, j->ckpt.S);
    snprintf(j->job_id, sizeof j->job_id, "%s", w->m.job_id);
    log_info("resumed job_id=%s from checkpoint=%s: the model after iteration %" PRIu64 "; going on at %" PRIu64,
             j->job_id, w->m.id, w->m.iteration, w->m.iteration + 1);
    servers_ready(j);
  }
  oracle_ckpt__work_free(w);
}

/* The roll-back came back: the servers hold the job's latest complete
 * checkpoint (or its start).  0, or -1 when the job cannot go on. */
static int rolled_back(oracle_job_t *j, ck_work_t *w) {
  if (w->rc) {
    if (oracle_scale__move_failed(j, w)) return -1; /* a lost server: the next run moves again */
    if (w->rc == ORACLE_ERR_PRECONDITION) block(j, w->err); /* another job's state: an operator decides */
    else oracle_job__error(j, w->rc, "recovering: rolling the embedding servers back failed: %s", w->err);
    return -1;
  }
  char id[96] = "";
  int64_t c = -1;
  j->write_epoch = w->write_epoch;
  oracle_probe__baseline(j, w->incs, j->ckpt.S);
  if (w->restored) {
    if (load_checkpoint(j, w, "recovering") != 0) return -1;
    snprintf(id, sizeof id, "%s", w->m.id);
    c = (int64_t)w->m.iteration;
  }
  j->rolled_back = 1;
  if (j->rec) oracle_recovery_rolled_back(j->recs, j->rec, id, c);
  snprintf(j->message, sizeof j->message, "rolled back to %s; waiting for the trainers (%u of %u joined)",
           c >= 0 ? id : "the job's start", j->attached, j->P);
  return 0;
}

/* recovering: training once the servers are rolled back and every
 * trainer of the new generation attached. */
static void case_recovering(oracle_job_t *j) {
  ck_work_t *w = oracle_ckpt__start_done(j);
  int rc = w ? rolled_back(j, w) : 0;
  oracle_ckpt__work_free(w);
  if (rc || j->attached < j->P) return;
  if (j->rolled_back) begin_training(j);
  else snprintf(j->message, sizeof j->message, "every trainer joined; rolling the embedding servers back");
}

static void case_training(oracle_job_t *j) {
  int c = train(j);
  recovery_progress(j);
  if (c < 0) {
    job_end(j, ORACLE_EV_FAIL, j->fail_why);
  } else if (c & ORACLE_CH_FINISHED) {
    char why[96];
    snprintf(why, sizeof why, "training finished: %llu iterations", (unsigned long long)j->iterations);
    job_end(j, ORACLE_EV_FINISHED, why);
  } else if (oracle_scale__due(j)) {
    job_rescaled(j);
  }
}

/* ---- the conductor */

void oracle_job__advance(oracle_job_t *j) {
  if (j->destroying) return;
  if (j->advancing) { /* called from inside a pass: one more pass */
    j->again = 1;
    return;
  }
  j->advancing = 1;
  do {
    j->again = 0;
    int hold = oracle_scale__moving(j); /* a loss waits for a move in flight: two runs never move at once */
    if (j->lost && !hold && !oracle_job__over(j)) job_lost(j); /* a lost daemon: recover (it retires), or fail */
    if (j->fail_rc && !oracle_job__over(j)) job_end(j, ORACLE_EV_FAIL, j->fail_why);
    if (j->retired) continue; /* nothing of it runs any more: the service replaces it */
    switch (j->state) {
    case ORACLE_WAITING: case_waiting(j); break;
    case ORACLE_CHECKING: case_checking(j); break;
    case ORACLE_BLOCKED: case_blocked(j); break;
    case ORACLE_STARTING: case_starting(j); break;
    case ORACLE_RECOVERING: case_recovering(j); break;
    case ORACLE_TRAINING: case_training(j); break;
    case ORACLE_DONE:
    case ORACLE_FAILED:
    case ORACLE_STOPPED: /* over: the job only answers Status; an evaluation set posted before the end still counts */
      oracle_fetch__collect(j);
      break;
    }
    if (!oracle_job__over(j) && ((j->lost && !hold) || j->fail_rc)) j->again = 1; /* the next pass ends the job */
  } while (j->again);
  j->advancing = 0;
}

int oracle_job_start_request(oracle_job_t *j, const char *resume, int fresh, char *msg, size_t msg_len) {
  if (!j->ckpt.enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job has no embedding servers to resume or clear (mode = ideal, or cluster.embedding is empty)");
  int st = oracle_job_state(j);
  if (st != ORACLE_BLOCKED) {
    if (st == ORACLE_WAITING)
      return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is waiting (%s); ask again once it is blocked",
                     j->message[0] ? j->message : "for its trainers");
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s, not blocked: %s%s", oracle_state_name(st),
                   j->ckpt.resumed ? "it was resumed from "
                                   : (st == ORACLE_TRAINING ? "it started at iteration 0 on empty servers" : ""),
                   j->ckpt.resumed ? j->ckpt.resume_id : "");
  }
  j->start_req.asked = 1;
  j->start_req.fresh = fresh;
  snprintf(j->start_req.want, sizeof j->start_req.want, "%s", resume && *resume ? resume : "latest");
  oracle_job__advance(j); /* blocked's case starts it */
  if (j->state != ORACLE_STARTING) return err_set(msg, msg_len, -EIO, "cannot queue the start");
  snprintf(msg, msg_len, "%s", j->message);
  return 0;
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
  int st = oracle_job_state(j);
  if ((st != ORACLE_WAITING && st != ORACLE_RECOVERING) || j->retired) {
    snprintf(why, why_len, "the job is %s%s%s%s", oracle_state_name(st), j->message[0] ? ": " : "", j->message,
             st == ORACLE_TRAINING ? "; a trainer joins a running job only through a recovery (the oracle "
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
    oracle_job__advance(j); /* the servers are checked (or rolled back), then training begins (or is blocked) */
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
  /* before the start its replacement (or itself) attaches again; but lost while the job recovers, it is in the
   * others' group of this generation: a loss, and all form the next one (Join waits for it: oracle_job_lost) */
  if (!oracle_job__training(j) && !(cancelled && j->state == ORACLE_RECOVERING)) {
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
      uv_timer_start(&j->soft_timer, on_soft_timer, SOFT_GRACE_MS, 0);
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

int oracle_job_lost(const oracle_job_t *j) { return j->lost && !oracle_job__over(j); }

int oracle_job_lost_rank(const oracle_job_t *j) { return j->rec ? j->rec->lost_rank : -1; }
uint32_t oracle_job_generation(const oracle_job_t *j) { return j->generation; }

void oracle_job_sent(oracle_job_t *j, uint32_t rank) {
  if (rank < j->P && j->tr[rank].call) oracle_job__advance(j);
}

void oracle_job_stop(oracle_job_t *j, const char *reason) {
  job_end(j, ORACLE_EV_STOP, reason && *reason ? reason : "stopped");
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
  j->reg = reg;
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
  j->on_state = opts->on_state;
  j->on_recover_ud = opts->ud;
  if ((rc = oracle_scale__init(j, opts)) != 0) goto fail;
  j->lost_rank = -1;
  j->soft_rank = -1;
  if (opts->job_id && *opts->job_id) {
    snprintf(j->job_id, sizeof j->job_id, "%s", opts->job_id);
  } else {
    char ts[32];
    time_t now = (time_t)clock_wall_s();
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(j->job_id, sizeof j->job_id, "seed%llu-%s", (unsigned long long)j->seed, ts);
  }
  if ((rc = oracle_job__strategy_init(j, err, err_len)) != 0) goto fail;
  /* the stages, in order (report's ring follows the pipeline's window) */
  if ((rc = oracle_fetch__init(j, err, err_len)) != 0 || (rc = oracle_pipeline__init(j, err, err_len)) != 0 ||
      (rc = oracle_dispatch__init(j)) != 0 || (rc = oracle_report__init(j)) != 0 ||
      (rc = oracle_ckpt__init(j, reg, err, err_len)) != 0 || (rc = oracle_probe__init(j, reg)) != 0)
    goto fail;
  if (!(j->tr = calloc(j->P, sizeof *j->tr))) {
    rc = -ENOMEM;
    goto fail;
  }
  oracle_job__metrics_init(j, reg);
  /* handles: unref'd, so that they never keep a draining daemon's loop alive */
  uv_async_init(loop, &j->wake, on_wake);
  j->wake.data = j;
  uv_unref((uv_handle_t *)&j->wake);
  uv_timer_init(loop, &j->start_timer);
  j->start_timer.data = j;
  uv_timer_start(&j->start_timer, on_start_timeout, (uint64_t)cfg_int(cfg, "oracle.start_timeout_ms"), 0);
  uv_unref((uv_handle_t *)&j->start_timer);
  uv_timer_t *timers[] = {&j->recover_timer, &j->soft_timer, &j->retire_timer};
  for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
    uv_timer_init(loop, timers[i]);
    timers[i]->data = j;
    uv_unref((uv_handle_t *)timers[i]);
  }
  j->handles_open = 5;
  set_state(j, j->recover ? ORACLE_EV_RECOVER : ORACLE_EV_CREATE);
  log_info("job created job_id=%s trainers=%u batch_size=%u iterations=%llu allocation=%s mode=%s lookahead=%s "
           "eval_every=%llu eval_batches=%llu dataprocs=%u",
           j->job_id, j->P, j->B, (unsigned long long)j->iterations, j->allocation, j->mode,
           j->ideal ? "0 (ideal)" : j->lookahead_cfg, (unsigned long long)j->eval_every,
           (unsigned long long)j->eval_batches, j->fetch.n_dpc);
  *out = j;
  if (j->recover && !j->ckpt.enabled) { /* no servers: nothing to roll back, the trainers start over */
    j->rolled_back = 1;
    if (j->rec) oracle_recovery_rolled_back(j->recs, j->rec, "", -1);
  } else if (j->recover && oracle_ckpt__rollback(j) == 0) { /* now: parked write-backs go, stale ones fail */
    snprintf(j->message, sizeof j->message,
             "rolling the embedding servers back to the job's latest complete checkpoint");
  }
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
  oracle_scale__free(j);
  free(j->tr);
  free(j->partitioned);
  if (j->have_place) shard_place_close(&j->place);
  shard_cost_destroy(j->auto_cost);
  free(j->partition_owner);
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
  /* cacher_auto may still read the measured batches' plans on the worker pool, and
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
    uv_close((uv_handle_t *)&j->soft_timer, on_closed);
    uv_close((uv_handle_t *)&j->retire_timer, on_closed);
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
  if (j->pipe.auto_running || j->strat_running || j->pipe.running || j->fetch.info_running || j->ckpt.running ||
      j->report.evals_running || oracle_probe__busy(j))
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
  uv_close((uv_handle_t *)&j->soft_timer, on_retired_closed);
  uv_close((uv_handle_t *)&j->retire_timer, on_retired_closed);
  oracle_probe__close_handle(j, on_retired_closed);
}

int oracle_job_successor(oracle_job_t *old, oracle_job_t **out, char *err, size_t err_len) {
  oracle_job_opts_t o = {.job_id = old->job_id,
                         .recover = 1,
                         .generation = old->generation + 1,
                         .recs = old->recs,
                         .rec = old->recs ? oracle_recoveries_current(old->recs) : NULL,
                         .on_recover = old->on_recover,
                         .on_state = old->on_state,
                         .ud = old->on_recover_ud};
  oracle_scale__successor(old, &o);
  int rc = oracle_job_create(old->loop, old->cfg, old->reg, &o, out, err, err_len);
  if (rc == 0) oracle_job_retire(old);
  return rc;
}

void oracle_job_retire(oracle_job_t *j) {
  if (!j) return;
  j->destroying = 1;
  oracle_fetch__stop(j);
  oracle_probe__stop(j);
  if (j->ckpt.embc) embc_abort(j->ckpt.embc);
  uv_timer_stop(&j->start_timer);
  uv_timer_stop(&j->soft_timer);
  uv_timer_start(&j->retire_timer, on_retire_poll, 0, 20);
}

/* ---- accessors */

const char *oracle_job_id(const oracle_job_t *j) { return j->job_id; }
int oracle_job_state(const oracle_job_t *j) { return j->retired ? ORACLE_RECOVERING : reported(j->state); }
int oracle_job_over(const oracle_job_t *j) { return oracle_job__over(j); }
const char *oracle_job_message(const oracle_job_t *j) { return j->message; }
uint64_t oracle_job_done(const oracle_job_t *j) { return j->report.done; }
uint64_t oracle_job_iterations(const oracle_job_t *j) { return j->iterations; }
uint64_t oracle_job_rank_reported(const oracle_job_t *j, uint32_t rank) {
  return rank < j->P ? j->report.rank[rank].reported : 0;
}
int oracle_job_rank_attached(const oracle_job_t *j, uint32_t rank) { return rank < j->P && j->tr[rank].call; }
char *oracle_job_summary(const oracle_job_t *j) { return oracle_report__summary(j); }
