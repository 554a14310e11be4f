/*
 * oracle_report: the last stage of a job (oracle_job_internal.h): what
 * comes back from the trainers and what the job says about itself.
 *
 * A TrainerMessage after Hello is decoded and checked here, once, into
 * plain C: Reports are aggregated per iteration once all P arrived (in
 * order, since each trainer reports in order), which moves the dispatch
 * window and the statistics; EvalResults are gathered per round, whose
 * logloss and AUC (the model library's eval_logloss / eval_auc, as
 * `chanter train --local` computes them) are computed on the worker pool.
 * oracle_report__finished tells the conductor when every iteration and
 * evaluation is in and the trainers' dense parameters agree.  The
 * evaluation schedule (rounds due after iterations x with (x + 1) %
 * eval_every == 0, and after the last one) lives here too: dispatch asks
 * it when an Eval is due.  The summary (summary.json, Status) is written
 * here from every stage's counters.  j->report is this file's.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "eval.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "sbuf.h"
#include "sdn.h"
#include "strategy.h"

/* ---- the evaluation schedule */

uint64_t oracle_report__rounds_upto(const oracle_job_t *j, uint64_t x) {
  if (j->eval_batches == 0 || j->iterations == 0) return 0;
  if (x >= j->iterations - 1) return j->report.rounds_total;
  return j->eval_every ? (x + 1) / j->eval_every : 0;
}

uint64_t oracle_report__round_after(const oracle_job_t *j, uint64_t r) {
  if (!j->eval_every) return j->iterations - 1;
  uint64_t a = (r + 1) * j->eval_every - 1;
  return a < j->iterations - 1 ? a : j->iterations - 1;
}

/* ---- reports */

typedef struct report_s { /* a Report, decoded */
  uint64_t iteration, samples, rows_fetched, rows_synced, rows_synced_delayed, rows_replicated, rows_written_back,
      cache_hits;
  double loss_sum, t[PHASE_N_REPORT], t_part;
  const uint8_t *sha;
  size_t sha_len;
} report_t;

static void decode_report(const Chanter__Oracle__V1__Report *m, report_t *r) {
  *r = (report_t){.iteration = m->iteration,
                  .samples = m->samples,
                  .rows_fetched = m->rows_fetched,
                  .rows_synced = m->rows_synced,
                  .rows_synced_delayed = m->rows_synced_delayed,
                  .rows_replicated = m->rows_replicated,
                  .rows_written_back = m->rows_written_back,
                  .cache_hits = m->cache_hits,
                  .loss_sum = m->loss_sum,
                  .t_part = m->t_partition_compute,
                  .sha = m->dense_sha256.data,
                  .sha_len = m->dense_sha256.len};
#define REPORT_T(id, name) r->t[PHASE_##id] = m->t_##name;
  PHASE_REPORT_LIST(REPORT_T)
#undef REPORT_T
}

static void complete_iteration(oracle_job_t *j, oracle_agg_t *a) {
  oracle_report_t *rp = &j->report;
  double now = oracle_job__now();
  double loss = a->loss_sum / (double)(j->B ? j->B : 1);
  double dt = now - rp->t_last;
  if (rp->done + 1 == j->iterations && rp->done > rp->start) { /* the last one: its end is the job's wind-down */
    rp->t_before_last = rp->t_last;
    for (int k = 0; k < PHASE_N_REPORT; k++) rp->last_t[k] = a->t[k] / j->P;
  }
  rp->t_last = now;
  rp->ema_dt = rp->done == rp->start ? dt : 0.9 * rp->ema_dt + 0.1 * dt;
  rp->loss_last = loss;
  rp->loss_ring[rp->done % ORACLE_LOSS_RING] = loss;
  if (rp->done >= rp->tail_start) {
    rp->tail_loss_sum += loss;
    rp->tail_n++;
  }
  rp->sum_rows_fetched += (double)a->rows_fetched;
  rp->sum_rows_synced += (double)a->rows_synced;
  rp->sum_rows_synced_delayed += (double)a->rows_synced_delayed;
  rp->sum_rows_replicated += (double)a->rows_replicated;
  rp->sum_rows_written_back += (double)a->rows_written_back;
  rp->sum_cache_hits += (double)a->cache_hits;
  uint32_t fu, sh;
  if ((a->floor_known = oracle_pipeline__floor(j, rp->done, &fu, &sh)) != 0) {
    a->floor_rows = (uint64_t)fu + sh;
    rp->sum_floor_first_use += fu;
    rp->sum_floor_shared += sh;
    rp->floor_n++;
    metrics_counter_add(j->m.floor_rows, a->floor_rows);
  }
  for (int k = 0; k < PHASE_N_REPORT; k++) rp->sum_t[k] += a->t[k] / j->P;
  if (rp->done == rp->start) { /* (a resumed job keeps iteration 0's; its own start is in first_iteration_seconds) */
    if (rp->start == 0)
      for (int k = 0; k < PHASE_N_REPORT; k++) rp->first_t[k] = a->t[k] / j->P;
    rp->t_first_done = now;
  }
  rp->done++;
  oracle_probe__progress(j);
  oracle_timeline__iteration(j, a, loss, now);
  metrics_gauge_set(j->m.iteration, (double)rp->done);
  metrics_gauge_set(j->m.loss, loss);
  metrics_gauge_set(j->m.sps, rp->ema_dt > 0 ? j->B / rp->ema_dt : 0);
  metrics_hist_observe(j->m.iter, dt);
  if (rp->done % rp->log_every == 0 || rp->done == j->iterations) {
    double span = now - rp->t_last_log;
    double sps = span > 0 ? (double)(rp->done - rp->done_at_last_log) * j->B / span : 0;
    const oracle_pipe_t *pp = &j->pipe;
    log_info("iteration=%llu/%llu samples_per_sec=%.0f loss=%.5f plan_ms=%.3f lookahead=%u slots_used=%llu",
             (unsigned long long)rp->done, (unsigned long long)j->iterations, sps, loss,
             pp->plans_done ? 1e3 * pp->plan_secs_sum / pp->plans_done : 0, pp->L_now,
             (unsigned long long)pp->slots_used);
    sdn_status("training: iteration %llu/%llu, %.0f samples/s, loss %.4f", (unsigned long long)rp->done,
               (unsigned long long)j->iterations, sps, loss);
    rp->t_last_log = now;
    rp->done_at_last_log = rp->done;
  }
  memset(a, 0, sizeof *a);
}

static int on_report(oracle_job_t *j, uint32_t p, const report_t *r, char *why, size_t why_len) {
  oracle_report_t *rp = &j->report;
  oracle_report_rank_t *t = &rp->rank[p];
  uint64_t next_step = j->dispatch.rank[p].next_step;
  if (r->iteration != t->reported || r->iteration >= next_step) {
    snprintf(why, why_len, "Report for iteration %llu, but the next iteration due from this rank is %llu%s",
             (unsigned long long)r->iteration, (unsigned long long)t->reported,
             t->reported >= next_step ? " and it has not been sent yet" : "");
    return -EINVAL;
  }
  if (r->sha_len > sizeof t->sha) {
    snprintf(why, why_len, "Report.dense_sha256 has %zu bytes; a SHA-256 has 32", r->sha_len);
    return -EINVAL;
  }
  oracle_agg_t *a = &rp->agg[r->iteration % rp->n_agg];
  if (a->reports == 0) a->iteration = r->iteration;
  ASSERT(a->iteration == r->iteration);
  a->reports++;
  a->loss_sum += r->loss_sum;
  a->samples += r->samples;
  a->rows_fetched += r->rows_fetched;
  /* every trainer all-reduces the same shared list: rows synchronized in
   * this iteration is that list's length, not P times it */
  if (r->rows_synced > a->rows_synced) a->rows_synced = r->rows_synced;
  if (r->rows_synced_delayed > a->rows_synced_delayed) a->rows_synced_delayed = r->rows_synced_delayed;
  if (r->rows_replicated > a->rows_replicated) a->rows_replicated = r->rows_replicated;
  a->rows_written_back += r->rows_written_back;
  a->cache_hits += r->cache_hits;
  for (int k = 0; k < PHASE_N_REPORT; k++) {
    a->t[k] += r->t[k];
    metrics_hist_observe(j->m.phase[k], r->t[k]);
  }
  metrics_counter_inc(j->m.reports);
  metrics_counter_add(j->m.rows_fetched, r->rows_fetched);
  metrics_counter_add(j->m.rows_synced, r->rows_synced);
  metrics_counter_add(j->m.rows_synced_delayed, r->rows_synced_delayed);
  metrics_counter_add(j->m.rows_replicated, r->rows_replicated);
  metrics_counter_add(j->m.rows_written_back, r->rows_written_back);
  t->part_sum += r->t_part;
  t->part_n++;
  if (r->iteration > rp->start && r->iteration + 1 < j->iterations) {
    t->part_steady_sum += r->t_part;
    t->part_steady_n++;
  }
  if (r->iteration + 1 == j->iterations) {
    if (r->sha_len) memcpy(t->sha, r->sha, r->sha_len);
    t->sha_len = r->sha_len;
  }
  t->reported++;
  while (rp->done < j->iterations) {
    oracle_agg_t *c = &rp->agg[rp->done % rp->n_agg];
    if (c->reports < j->P || c->iteration != rp->done) break;
    complete_iteration(j, c);
  }
  return 0;
}

/* ---- evaluation results */

typedef struct eval_work_s {
  uv_work_t req;
  oracle_job_t *j;
  oracle_eval_round_t *r;
  double logloss, auc;
  int rc;
} eval_work_t;

static void eval_work(uv_work_t *req) {
  eval_work_t *w = req->data;
  const oracle_eval_set_t *e = &w->j->fetch.eval;
  const float *z = w->r->logits;
  w->logloss = eval_logloss(z, e->labels, e->n);
  w->rc = eval_auc(z, e->labels, e->n, &w->auc); /* a NaN score ranks lowest */
}

static void eval_free(oracle_eval_round_t *r) {
  if (!r) return;
  free(r->got);
  free(r->logits);
  free(r);
}

static void eval_done(uv_work_t *req, int status) {
  eval_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_report_t *rp = &j->report;
  oracle_eval_round_t *r = w->r;
  rp->evals_running--;
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  if (w->rc) {
    oracle_job__error(j, w->rc, "evaluation round %llu: %s", (unsigned long long)r->round, err_str(w->rc));
  } else {
    metrics_gauge_set(j->m.test_loss, w->logloss);
    metrics_gauge_set(j->m.test_auc, w->auc);
    metrics_counter_inc(j->m.evals);
    rp->evals[rp->n_evals++ % ORACLE_EVAL_HISTORY] = (oracle_eval_rec_t){r->round, r->after, w->logloss, w->auc};
    rp->last_test_logloss = w->logloss;
    rp->last_test_auc = w->auc;
    oracle_timeline__eval(j, r->after, w->auc, w->logloss);
    log_info("evaluation round=%llu after_iteration=%llu: scored %zu test samples, test_logloss=%.5f test_auc=%.5f",
             (unsigned long long)r->round, (unsigned long long)r->after, j->fetch.eval.n, w->logloss, w->auc);
    rp->evals_done++;
  }
  eval_free(r);
  free(w);
  oracle_job__advance(j);
}

static int on_eval_result(oracle_job_t *j, uint32_t p, const Chanter__Oracle__V1__EvalResult *e, char *why,
                          size_t why_len) {
  oracle_report_t *rp = &j->report;
  const oracle_eval_set_t *es = &j->fetch.eval;
  /* decoded: the round, and the logits and labels as float arrays (little-endian host) */
  uint64_t round = e->round;
  const uint8_t *logits = e->logits.data, *labels = e->labels.data;
  size_t logits_len = e->logits.len, labels_len = e->labels.len;
  if (round >= j->dispatch.rank[p].evals_sent) {
    snprintf(why, why_len, "EvalResult for round %llu, which was not sent to this rank", (unsigned long long)round);
    return -EINVAL;
  }
  const data_batch_t *sh = &es->plan.shares[p].batch;
  if (logits_len != (size_t)sh->n * sizeof(float) || (labels_len && labels_len != logits_len)) {
    snprintf(why, why_len, "EvalResult of round %llu has %zu logit bytes and %zu label bytes; the Eval had %u samples",
             (unsigned long long)round, logits_len, labels_len, sh->n);
    return -EINVAL;
  }
  oracle_eval_round_t *r = rp->rounds, **pp = &rp->rounds;
  while (r && r->round != round) {
    pp = &r->next;
    r = r->next;
  }
  if (!r) {
    r = calloc(1, sizeof *r);
    if (!r || !(r->got = calloc(j->P, 1)) || !(r->logits = malloc((es->n ? es->n : 1) * sizeof(float)))) {
      eval_free(r);
      return oracle_job__error(j, -ENOMEM, "out of memory collecting evaluation round %llu", (unsigned long long)round);
    }
    r->round = round;
    r->after = oracle_report__round_after(j, round);
    *pp = r;
  }
  if (r->got[p]) {
    snprintf(why, why_len, "a second EvalResult for round %llu", (unsigned long long)round);
    return -EINVAL;
  }
  r->got[p] = 1;
  if (logits_len) memcpy(r->logits + es->off[p], logits, logits_len);
  if (labels_len && !rp->labels_warned && memcmp(labels, es->labels + es->off[p], labels_len) != 0) {
    rp->labels_warned = 1;
    log_warn("EvalResult labels differ from the eval set's rank=%u round=%llu (using the oracle's labels)", p,
             (unsigned long long)round);
  }
  if (++r->received < j->P) return 0;
  /* complete: unlink and compute off the loop */
  *pp = r->next;
  r->next = NULL;
  eval_work_t *w = calloc(1, sizeof *w);
  if (!w) {
    eval_free(r);
    return oracle_job__error(j, -ENOMEM, "out of memory computing evaluation round %llu", (unsigned long long)round);
  }
  w->req.data = w;
  w->j = j;
  w->r = r;
  int rc = uv_queue_work(j->loop, &w->req, eval_work, eval_done);
  if (rc) {
    eval_free(r);
    free(w);
    return oracle_job__error(j, rc, "cannot queue evaluation round %llu: %s", (unsigned long long)round,
                             uv_strerror(rc));
  }
  rp->evals_running++;
  return 0;
}

int oracle_report__message(oracle_job_t *j, uint32_t rank, const Chanter__Oracle__V1__TrainerMessage *m, char *why,
                           size_t why_len) {
  switch (m->kind_case) {
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_REPORT: {
    if (!oracle_job__training(j)) break;
    report_t r;
    decode_report(m->report, &r);
    return on_report(j, rank, &r, why, why_len);
  }
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_EVAL:
    if (!oracle_job__training(j)) break;
    return on_eval_result(j, rank, m->eval, why, why_len);
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_HELLO:
    snprintf(why, why_len, "a second Hello on one Work stream");
    return -EINVAL;
  default:
    snprintf(why, why_len, "an empty TrainerMessage (no hello, report or eval)");
    return -EINVAL;
  }
  snprintf(why, why_len, "%s before the job started",
           m->kind_case == CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_REPORT ? "Report" : "EvalResult");
  return -EINVAL;
}

/* ---- the end */

static void hex(const uint8_t *b, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 3 <= cap; i++) o += (size_t)snprintf(out + o, cap - o, "%02x", b[i]);
  if (cap) out[o < cap ? o : cap - 1] = 0;
}

int oracle_report__finished(oracle_job_t *j) {
  oracle_report_t *rp = &j->report;
  if (rp->done < j->iterations || rp->evals_done < rp->rounds_total) return 0;
  if (j->iterations == 0) return ORACLE_CH_FINISHED;
  /* every rank's dense parameters must agree after the last iteration */
  const oracle_report_rank_t *r0 = &rp->rank[0];
  char bad[1024] = "";
  size_t o = 0;
  for (uint32_t p = 1; p < j->P; p++) {
    const oracle_report_rank_t *t = &rp->rank[p];
    if (t->sha_len != r0->sha_len || memcmp(t->sha, r0->sha, t->sha_len) != 0) {
      char h[40];
      hex(t->sha, t->sha_len < 8 ? t->sha_len : 8, h, sizeof h);
      if (o < sizeof bad) o += (size_t)snprintf(bad + o, sizeof bad - o, "%srank %u (%s...)", o ? ", " : "", p, h);
    }
  }
  if (o) {
    char h0[40];
    hex(r0->sha, r0->sha_len < 8 ? r0->sha_len : 8, h0, sizeof h0);
    return oracle_job__error(j, ORACLE_ERR_PRECONDITION,
                             "the trainers' dense parameters differ after the last iteration: rank 0 has SHA-256 "
                             "%s..., %s; the replicas diverged (a collective or the update is not deterministic)",
                             h0, bad);
  }
  hex(r0->sha, r0->sha_len, rp->dense_hex, sizeof rp->dense_hex);
  return ORACLE_CH_FINISHED;
}

/* ---- create / destroy */

int oracle_report__init(oracle_job_t *j) {
  oracle_report_t *rp = &j->report;
  rp->open = 1;
  rp->rounds_total = 0;
  if (j->eval_batches && j->iterations)
    rp->rounds_total = j->eval_every ? j->iterations / j->eval_every + (j->iterations % j->eval_every ? 1 : 0) : 1;
  rp->tail_start = j->iterations - jobrule_train_tail(j->iterations); /* the train logloss's iterations */
  rp->log_every = j->iterations / 10;
  if (rp->log_every > 100) rp->log_every = 100;
  if (rp->log_every == 0) rp->log_every = 1;
  /* the reports of a dispatch window, the largest the pipeline may set */
  rp->n_agg = j->pipe.window_max;
  rp->rank = calloc(j->P, sizeof *rp->rank);
  rp->agg = calloc(rp->n_agg, sizeof *rp->agg);
  oracle_timeline__open(j);
  return rp->rank && rp->agg ? 0 : -ENOMEM;
}

void oracle_report__start(oracle_job_t *j) {
  oracle_report_t *rp = &j->report;
  rp->t_start = rp->t_last = rp->t_last_log = oracle_job__now();
}

void oracle_report__restore(oracle_job_t *j, const oracle_ostate_t *o) {
  oracle_report_t *rp = &j->report;
  uint64_t s = o->iteration + 1;
  for (uint32_t p = 0; p < j->P; p++) /* (the partition sums count from here: this run's) */
    rp->rank[p] = (oracle_report_rank_t){.reported = s};
  rp->done = rp->start = s;
  rp->evals_done = o->evals_done;
  rp->n_evals = o->n_evals;
  uint64_t first = o->n_evals - o->n_hist;
  for (uint64_t i = 0; i < o->n_hist; i++) rp->evals[(first + i) % ORACLE_EVAL_HISTORY] = o->hist[i];
  rp->last_test_logloss = o->last_ll;
  rp->last_test_auc = o->last_auc;
  rp->loss_last = o->loss_last;
  rp->tail_loss_sum = o->tail_sum;
  rp->tail_n = o->tail_n;
  for (uint64_t i = 0; i < o->n_loss; i++) rp->loss_ring[(s - o->n_loss + i) % ORACLE_LOSS_RING] = o->loss[i];
  rp->sum_rows_fetched = o->sums[0];
  rp->sum_rows_synced = o->sums[1];
  rp->sum_rows_synced_delayed = o->sums[2];
  rp->sum_rows_replicated = o->sums[3];
  rp->sum_rows_written_back = o->sums[4];
  rp->sum_cache_hits = o->sums[5];
  memcpy(rp->sum_t, o->sum_t, sizeof rp->sum_t);
  memcpy(rp->first_t, o->first_t, sizeof rp->first_t);
  rp->seconds_before = o->seconds;
}

void oracle_report__close(oracle_job_t *j) {
  oracle_report_t *rp = &j->report;
  if (!rp->open) return;
  while (rp->rounds) {
    oracle_eval_round_t *r = rp->rounds;
    rp->rounds = r->next;
    eval_free(r);
  }
  free(rp->agg);
  free(rp->rank);
  oracle_timeline__close(j);
  rp->open = 0;
}

/* ---- the summary */


/* train_logloss: the mean over the job's tail once it is done (jobrule),
 * before that over the last tenth of the iterations done; NAN before any. */
static double train_logloss(const oracle_job_t *j) {
  const oracle_report_t *rp = &j->report;
  double train_loss = NAN;
  if (rp->done > 0) {
    if (rp->tail_n && rp->done == j->iterations) {
      train_loss = rp->tail_loss_sum / (double)rp->tail_n;
    } else {
      uint64_t k = rp->done / 10;
      if (k == 0) k = 1;
      if (k > ORACLE_LOSS_RING) k = ORACLE_LOSS_RING;
      double s = 0;
      for (uint64_t i = rp->done - k; i < rp->done; i++) s += rp->loss_ring[i % ORACLE_LOSS_RING];
      train_loss = s / (double)k;
    }
  }
  return train_loss;
}

/* The rows and cache hits per iteration, the phases' seconds. */
static void summary_rows(sbuf_t *sb, const oracle_job_t *j, double n) {
  const oracle_report_t *rp = &j->report;
  sb_num(sb, "rows_fetched", n > 0 ? rp->sum_rows_fetched / n : 0);
  sb_printf(sb, ", ");
  sb_num(sb, "rows_synced", n > 0 ? rp->sum_rows_synced / n : 0);
  sb_printf(sb, ", ");
  sb_num(sb, "rows_synced_delayed", n > 0 ? rp->sum_rows_synced_delayed / n : 0);
  sb_printf(sb, ", ");
  sb_num(sb, "rows_replicated", n > 0 ? rp->sum_rows_replicated / n : 0);
  sb_printf(sb, ", ");
  sb_num(sb, "rows_written_back", n > 0 ? rp->sum_rows_written_back / n : 0);
  sb_printf(sb, ", ");
  sb_num(sb, "cache_hits", n > 0 ? rp->sum_cache_hits / n : 0);
  /* the floor (plan_floor.h) of the same iterations, as far as this run saw them: null in mode ideal */
  double fn = (double)rp->floor_n;
  sb_printf(sb, ", ");
  sb_num(sb, "floor_rows", fn > 0 ? (rp->sum_floor_first_use + rp->sum_floor_shared) / fn : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "floor_first_use", fn > 0 ? rp->sum_floor_first_use / fn : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "floor_shared", fn > 0 ? rp->sum_floor_shared / fn : NAN);
  sb_printf(sb, ", \"floor_iterations\": %llu, ", (unsigned long long)rp->floor_n);
  sb_str(sb, "floor_definition",
         "per iteration, over this run's iterations (since the start, a resume or the last recovery), the cached "
         "tables only (a partitioned table's rows do not move through the cache): the distinct keys no trainer "
         "used in the L batches before (fetched from the servers and written back, whatever the cache) plus the "
         "keys two or more trainers use in the batch (synchronized); L = the lookahead each batch was decided with");
  sb_printf(sb, ", \"phase_seconds\": {");
  for (int k = 0; k < PHASE_N_REPORT; k++) {
    if (k) sb_printf(sb, ", ");
    sb_num(sb, phase_name(k), n > 0 ? rp->sum_t[k] / n : 0);
  }
  sb_printf(sb, "}, ");
}

/* The start-up (iteration 0: measuring the first batches, choosing L, the first
 * decisions and fetches), the wind-down (the job's last iteration, whose
 * write-back of every cached and partitioned row newer than the servers'
 * ends the job) and the steady state between them. */
static void summary_steady(sbuf_t *sb, const oracle_job_t *j, double n, double run, double end) {
  const oracle_report_t *rp = &j->report;
  double first = run > 0 && rp->t_start > 0 ? rp->t_first_done - rp->t_start : NAN;
  int wind = rp->done == j->iterations && rp->t_before_last > 0 && run > 2; /* the last one is set apart */
  double rest = run > 1 ? (wind ? rp->t_before_last : end) - rp->t_first_done : 0;
  double ns = n - 1 - wind, steady[PHASE_N_REPORT];
  for (int k = 0; k < PHASE_N_REPORT; k++)
    steady[k] = ns > 0 ? (rp->sum_t[k] - rp->first_t[k] - (wind ? rp->last_t[k] : 0)) / ns : NAN;
  sb_num(sb, "first_iteration_seconds", first);
  sb_printf(sb, ", ");
  sb_num(sb, "last_iteration_seconds", wind ? rp->t_last - rp->t_before_last : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "steady_samples_per_sec", rest > 0 ? (run - 1 - wind) * j->B / rest : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "steady_iteration_seconds", steady[PHASE_TOTAL]);
  /* the phases over the same iterations as steady_iteration_seconds
   * (after iteration 0, before the last), so that they add up to it;
   * phase_seconds counts them all */
  sb_printf(sb, ", \"steady_phase_seconds\": {");
  for (int k = 0; k < PHASE_N_REPORT; k++) {
    if (k) sb_printf(sb, ", ");
    sb_num(sb, phase_name(k), steady[k]);
  }
  sb_printf(sb, "}, ");
}

/* Each table's strategy (table_strategy, strategy.h), its owner when
 * partitioned, and why. */
static void summary_tables(sbuf_t *sb, const oracle_job_t *j) {
  sb_printf(sb, "\"tables\": [");
  for (uint32_t t = 0; t < j->n_tables; t++) {
    uint32_t o = j->partition_owner ? j->partition_owner[t] : UINT32_MAX;
    sb_printf(sb, "%s{\"table\": %u, ", t ? ", " : "", t);
    sb_str(sb, "strategy", o == STRATEGY_OWNER_NONE ? "cache" : o == STRATEGY_OWNER_ALL ? "partition_rows" : "partition");
    if (o != STRATEGY_OWNER_NONE && o != STRATEGY_OWNER_ALL) sb_printf(sb, ", \"owner\": %u", o);
    sb_printf(sb, ", ");
    sb_str(sb, "why", j->strat_why ? j->strat_why[t] : "");
    sb_printf(sb, "}");
  }
  sb_printf(sb, "], \"placement\": {");
  sb_str(sb, "algorithm", j->have_place ? j->place.note : "");
  sb_printf(sb, ", ");
  sb_num(sb, "predicted_max_us", j->have_place ? j->place.predicted_max_us : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "predicted_balance", j->have_place ? j->place.predicted_balance : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "lookup_greedy_max_us", j->have_place ? j->place.baseline_max_us : NAN);
  sb_printf(sb, ", ");
  sb_num(sb, "lookup_greedy_balance", j->have_place ? j->place.baseline_balance : NAN);
  sb_printf(sb, "}, ");
}

/* The measured work on each trainer's partitioned tables per iteration
 * (pooling, fold, row update: Report.t_partition_compute), the steady
 * iterations' mean where there are any, else every iteration's, and its
 * degree of balance, min / max over the trainers (null when no trainer
 * did any): what the placement's predicted balance is checked against. */
static void summary_partition(sbuf_t *sb, const oracle_job_t *j) {
  const oracle_report_t *rp = &j->report;
  int steady = 1;
  for (uint32_t p = 0; p < j->P; p++) steady &= rp->rank[p].part_steady_n > 0;
  double lo = INFINITY, hi = 0;
  sb_printf(sb, "\"partition_compute_seconds\": [");
  for (uint32_t p = 0; p < j->P; p++) {
    const oracle_report_rank_t *t = &rp->rank[p];
    double s = steady ? t->part_steady_sum : t->part_sum, n = (double)(steady ? t->part_steady_n : t->part_n);
    double v = n > 0 ? s / n : 0;
    sb_printf(sb, "%s%.9g", p ? ", " : "", v);
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  sb_printf(sb, "], ");
  sb_num(sb, "partition_balance", hi > 0 ? lo / hi : NAN);
  sb_printf(sb, ", ");
  sb_str(sb, "partition_compute_definition",
         steady ? "per trainer, seconds per iteration of work on its own partitioned tables (pooling for the global "
                  "batch, fold, row update; not the AlltoAlls), over the iterations of steady_phase_seconds; "
                  "partition_balance: min / max over the trainers"
                : "per trainer, seconds per iteration of work on its own partitioned tables (pooling for the global "
                  "batch, fold, row update; not the AlltoAlls), over every iteration of this run (none steady yet); "
                  "partition_balance: min / max over the trainers");
  sb_printf(sb, ", ");
}

/* allocation = laia: of the samples allocated, those some trainer held a
 * row of, those placed on a trainer holding most of them. */
static void summary_laia(sbuf_t *sb, const oracle_job_t *j) {
  if (!j->pipe.laia) return;
  laia_stats_t ls;
  double laia_secs;
  oracle_pipeline__laia_stats(j, &ls, &laia_secs);
  double ns = ls.samples ? (double)ls.samples : 1;
  sb_printf(sb, ", \"laia\": {");
  sb_num(sb, "samples_scored", (double)ls.scored / ns);
  sb_printf(sb, ", ");
  sb_num(sb, "samples_on_holder", (double)ls.best / ns);
  sb_printf(sb, ", ");
  sb_num(sb, "seconds_per_batch", ls.batches ? laia_secs / (double)ls.batches : 0);
  sb_printf(sb, ", \"rows_held\": %zu, \"tables_scored\": %u, \"tables\": %u}", ls.rows_held, ls.tables_scored,
            ls.tables);
}

/* The checkpoints, the recoveries, the warnings, the evaluations (the
 * summary's last fields). */
static void summary_records(sbuf_t *sb, const oracle_job_t *j) {
  const oracle_report_t *rp = &j->report;
  const oracle_fetch_t *f = &j->fetch;
  {
    char ck[1024];
    oracle_ckpt__summary(j, ck, sizeof ck);
    sb_printf(sb, ", %s", ck);
  }
  if (j->recs) { /* every recovery of the job, with its moments (oracle_recover.h) */
    size_t cap = 1400 * ORACLE_RECOVERIES_KEPT + 16;
    char *rj = malloc(cap);
    if (rj) {
      oracle_recoveries_json(j->recs, rj, cap);
      sb_printf(sb, ", \"recoveries\": %s", rj);
      oracle_recoveries_line(j->recs, rj, cap);
      sb_printf(sb, ", ");
      sb_str(sb, "recovery", rj);
      oracle_scales_json(j->recs, rj, cap); /* chanter scale (oracle_scale.c) */
      sb_printf(sb, ", \"scales\": %s, ", rj);
      oracle_scales_line(j->recs, rj, cap);
      sb_str(sb, "scale", rj);
      free(rj);
    }
  }
  /* said once at start: a batch larger than a split */
  sb_printf(sb, ", \"warnings\": [");
  for (int k = 0; k < f->n_warnings; k++) {
    if (k) sb_printf(sb, ", ");
    sb_str_value(sb, f->warnings[k]);
  }
  sb_printf(sb, "], \"evals\": [");
  uint64_t first = rp->n_evals > ORACLE_EVAL_HISTORY ? rp->n_evals - ORACLE_EVAL_HISTORY : 0;
  for (uint64_t i = first; i < rp->n_evals; i++) {
    const oracle_eval_rec_t *e = &rp->evals[i % ORACLE_EVAL_HISTORY];
    sb_printf(sb, "%s{\"round\": %llu, \"after_iteration\": %llu, ", i > first ? ", " : "",
              (unsigned long long)e->round, (unsigned long long)e->after);
    sb_num(sb, "logloss", e->logloss);
    sb_printf(sb, ", ");
    sb_num(sb, "auc", e->auc);
    sb_printf(sb, "}");
  }
  sb_printf(sb, "]}");
}

char *oracle_report__summary(const oracle_job_t *j) {
  const oracle_report_t *rp = &j->report;
  const oracle_pipe_t *pp = &j->pipe;
  const oracle_fetch_t *f = &j->fetch;
  sbuf_t b = {0};
  double n = (double)rp->done;
  double run = (double)(rp->done - rp->start); /* iterations of this run (a resumed job's since its checkpoint) */
  double end = oracle_job__over(j) ? rp->t_last : oracle_job__now();
  if (oracle_job__training(j) && rp->done == rp->start) end = oracle_job__now();
  double span = rp->t_start > 0 ? end - rp->t_start : 0;
  double sps = span > 0 && run > 0 ? run * j->B / span : 0;
  double train_loss = train_logloss(j);
  sb_printf(&b, "{");
  sb_printf(&b, "\"iterations\": %llu, ", (unsigned long long)rp->done);
  sb_num(&b, "samples_per_sec", sps);
  sb_printf(&b, ", ");
  sb_num(&b, "train_logloss", train_loss);
  {
    /* what train_logloss is once the job is done (before: the same over the iterations done so far) */
    char def[256];
    jobrule_train_logloss_definition(j->iterations, def, sizeof def);
    sb_printf(&b, ", \"train_logloss_iterations\": %llu, ", (unsigned long long)jobrule_train_tail(j->iterations));
    sb_str(&b, "train_logloss_definition", def);
  }
  sb_printf(&b, ", ");
  sb_num(&b, "test_logloss", rp->n_evals ? rp->last_test_logloss : NAN);
  sb_printf(&b, ", ");
  sb_num(&b, "test_auc", rp->n_evals ? rp->last_test_auc : NAN);
  sb_printf(&b, ", ");
  /* each evaluation scores these, each test sample at most once */
  sb_num(&b, "test_samples_scored", f->eval.ready ? (double)f->eval.n : NAN);
  sb_printf(&b, ", ");
  sb_str(&b, "dense_sha256", rp->dense_hex);
  sb_printf(&b, ", ");
  summary_rows(&b, j, n);
  summary_steady(&b, j, n, run, end);
  sb_num(&b, "unique_keys", pp->plans_done ? pp->sum_unique / (double)pp->plans_done : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "plan_seconds", pp->plans_done ? pp->plan_secs_sum / (double)pp->plans_done : 0);
  /* lookahead: in force at the end (or now); lookahead_start: given, or chosen by auto (0 until then) */
  sb_printf(&b,
            ", \"trainers\": %u, \"batch_size\": %u, \"lookahead\": %u, \"lookahead_start\": %u, \"cache_rows\": %llu, "
            "\"slots_peak\": %llu, ",
            j->P, j->B, pp->L_now, pp->L_start, (unsigned long long)pp->cache_rows, (unsigned long long)pp->slots_peak);
  sb_str(&b, "lookahead_config", j->ideal ? "0" : j->lookahead_cfg);
  sb_printf(&b, ", ");
  summary_tables(&b, j);
  summary_partition(&b, j);
  /* what holds the first Step back, while lookahead = auto chooses L (the
   * progress line of `chanter train` shows it); empty once L is known */
  {
    char why[160] = "";
    if (pp->auto_l && !pp->l_known && pp->auto_running)
      snprintf(why, sizeof why, "lookahead = auto: choosing L from the %llu measured batches",
               (unsigned long long)pp->measure);
    else if (pp->auto_l && !pp->l_known)
      snprintf(why, sizeof why, "lookahead = auto: measuring the first batches, %llu of %llu (oracle.measure_batches)",
               (unsigned long long)pp->measure_ready, (unsigned long long)pp->measure);
    sb_str(&b, "startup", why);
    sb_printf(&b, ", ");
  }
  /* a server's full disk holds the job (oracle_probe.c): the sentence, "" when none */
  {
    char why[640] = "";
    if (!oracle_job__over(j)) oracle_probe__disk_full(j, why, sizeof why);
    sb_str(&b, "paused", why);
    sb_printf(&b, ", ");
  }
  sb_str(&b, "mode", j->mode);
  sb_printf(&b, ", ");
  sb_str(&b, "allocation", j->allocation);
  summary_laia(&b, j);
  sb_printf(&b, ", \"target_iterations\": %llu, ", (unsigned long long)j->iterations);
  sb_str(&b, "state", oracle_state_name(oracle_job_state(j)));
  sb_printf(&b, ", ");
  sb_str(&b, "job_id", j->job_id);
  sb_printf(&b, ", ");
  sb_num(&b, "train_seconds", span);
  sb_printf(&b, ", ");
  sb_num(&b, "train_seconds_total", rp->seconds_before + span);
  summary_records(&b, j);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}
