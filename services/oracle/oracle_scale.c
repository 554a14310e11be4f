/*
 * oracle_scale: chanter scale -- the trainer group of a running job
 * re-formed with another number of trainers (oracle_job.h says what the
 * request does; oracle_recover.h keeps the record).
 *
 * How: the scale asks for a checkpoint as soon as possible (the one
 * chanter checkpoint asks for).  Once it is complete, advance ends the run
 * as a recovery does (oracle_job.c, job_rescaled: StopWork "recovering"),
 * without a lost daemon and without counting against
 * oracle.max_recoveries; the service sets trainers = N in its
 * configuration and makes the successor, which rolls the servers back to
 * that very checkpoint (the latest complete one) and waits for N trainers.
 * From there it is the path of a resume with trainers = N: the oracle's
 * state from the checkpoint's blob (laia re-planned for N, the tables'
 * strategies placed for N, L chosen again), the caches empty, the dense
 * state from ResumeWork.  So the model is the one the same job stopped at
 * c and resumed with --resume on N trainers would have, bit for bit.
 * The old group runs no step past c (oracle_ckpt__dispatch holds Step
 * c + 1), so nothing is undone by the roll-back: the pause is from its
 * iteration c done to the new group's c + 1 done -- the checkpoint's
 * write, the group's re-forming, the caches' refill and one iteration.
 *
 * A daemon lost while a scale waits for its checkpoint: the recovery
 * carries the scale out (its successor has N trainers too, from the
 * latest complete checkpoint).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"

#define TRAINERS_MAX 4096 /* the key trainers' bound (cfg_keys.h) */

int oracle_job_scale_request(oracle_job_t *j, uint32_t n, char *id, size_t id_len, uint64_t *iteration, char *msg,
                             size_t msg_len) {
  int st = oracle_job_state(j);
  if (n < 1 || n > TRAINERS_MAX)
    return err_set(msg, msg_len, -EINVAL, "trainers = %u is outside 1..%d, the bounds of the key trainers", n,
                   TRAINERS_MAX);
  if (n > j->B)
    return err_set(msg, msg_len, -EINVAL,
                   "trainers = %u is more than batch_size = %u: every trainer needs a sample of each batch", n, j->B);
  if (!j->ckpt.enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job takes no checkpoints (mode = ideal, or cluster.embedding is empty): a scale goes on from "
                   "one; stop the job and start it again with trainers = %u",
                   n);
  if (j->scale_to)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "a scale to %u trainers is under way (after the checkpoint of iteration %" PRIu64
                   "); ask again once the job trains on them",
                   j->scale_to, j->scale_at);
  oracle_recovery_t *r = j->recs ? oracle_recoveries_current(j->recs) : NULL;
  if (st == ORACLE_RECOVERING || (r && !r->t_caught_up))
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "the job is recovering from the loss of %s; ask again once it has caught up", r ? r->who : "a daemon");
  if (!oracle_job__training(j))
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s; a job is scaled while it trains",
                   oracle_state_name(st));
  if (n == j->P) return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job has trainers = %u already", n);
  if (j->pipe.next + 1 >= j->iterations)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "the job's next checkpoint is its last (iteration %" PRIu64 "): nothing would be left to train on %u "
                   "trainers",
                   j->iterations - 1, n);
  int rc = oracle_job_checkpoint_request(j, id, id_len, iteration, msg, msg_len);
  if (rc) return rc;
  j->scale_to = n;
  j->scale_at = *iteration;
  if (j->recs) oracle_scales_begin(j->recs, j->P, n, *iteration, id);
  snprintf(msg, msg_len,
           "the job goes from %u to %u trainers after checkpoint %s (the model after iteration %" PRIu64
           "): the group re-forms there, as a resume on %u trainers would",
           j->P, n, id, *iteration, n);
  return 0;
}

uint32_t oracle_job_scale_to(const oracle_job_t *j) { return j->scale_to; }

int oracle_scale__due(oracle_job_t *j) {
  if (j->recs && j->report.done > j->ckpt.start) oracle_scales_first(j->recs, j->report.done);
  if (j->recs && j->scale_to && j->report.done > j->scale_at) oracle_scales_c_done(j->recs);
  return j->scale_to && j->ckpt.n_done && j->ckpt.last.iteration == j->scale_at;
}

/* ---- the record */

static oracle_scale_t *last_open(oracle_recoveries_t *rs, int ended, int trained) {
  if (!rs->n_scales) return NULL;
  oracle_scale_t *s = &rs->s[(rs->n_scales - 1) % ORACLE_SCALES_KEPT];
  if ((s->t_ended != 0) != ended || (s->t_trained != 0) != trained || s->t_first) return NULL;
  return s;
}

oracle_scale_t *oracle_scales_begin(oracle_recoveries_t *rs, uint32_t from, uint32_t to, uint64_t c, const char *id) {
  oracle_scale_t *s = &rs->s[rs->n_scales++ % ORACLE_SCALES_KEPT];
  *s = (oracle_scale_t){.from = from, .to = to, .at_iteration = c, .t_asked = clock_wall_s()};
  snprintf(s->checkpoint, sizeof s->checkpoint, "%s", id);
  log_info("scale requested from=%u to=%u checkpoint=%s at_iteration=%" PRIu64 ": the trainer group re-forms once "
           "it is complete",
           from, to, id, c);
  return s;
}

void oracle_scales_ended(oracle_recoveries_t *rs) {
  oracle_scale_t *s = last_open(rs, 0, 0);
  if (!s) return;
  s->t_ended = clock_wall_s();
  log_info("scale: checkpoint %s complete %.2f s after the request; the run of %u trainers ends here, the next "
           "generation has %u",
           s->checkpoint, s->t_ended - s->t_asked, s->from, s->to);
}

void oracle_scales_c_done(oracle_recoveries_t *rs) {
  oracle_scale_t *s = last_open(rs, 0, 0);
  if (s && !s->t_c) s->t_c = clock_wall_s();
}

/* The pause: from the old group's iteration c done (or, when a recovery
 * carried the scale out before it, its run's end) to c + 1 done. */
static double pause_of(const oracle_scale_t *s) { return s->t_first - (s->t_c ? s->t_c : s->t_ended); }

void oracle_scales_trained(oracle_recoveries_t *rs, uint32_t generation) {
  oracle_scale_t *s = last_open(rs, 1, 0);
  if (!s) return;
  s->t_trained = clock_wall_s();
  s->generation = generation;
  log_info("scale: all %u trainers of generation %u joined %.2f s after the old run ended; training from iteration "
           "%" PRIu64,
           s->to, generation, s->t_trained - s->t_ended, s->at_iteration + 1);
}

void oracle_scales_first(oracle_recoveries_t *rs, uint64_t done) {
  oracle_scale_t *s = last_open(rs, 1, 1);
  if (!s) return;
  s->t_first = clock_wall_s();
  metrics_counter_inc(rs->m_scales);
  metrics_gauge_set(rs->m_scale_pause, pause_of(s));
  log_info("scaled from=%u to=%u at_iteration=%" PRIu64 " checkpoint=%s pause_seconds=%.3f seconds=%.3f (iteration "
           "%" PRIu64 " done on %u trainers)",
           s->from, s->to, s->at_iteration, s->checkpoint, pause_of(s), s->t_first - s->t_asked, done - 1,
           s->to);
}

void oracle_scales_json(const oracle_recoveries_t *rs, char *out, size_t cap) {
  size_t o = 0;
  uint64_t first = rs->n_scales > ORACLE_SCALES_KEPT ? rs->n_scales - ORACLE_SCALES_KEPT : 0;
  o += (size_t)snprintf(out + o, cap - o, "[");
  for (uint64_t i = first; i < rs->n_scales && o < cap; i++) {
    const oracle_scale_t *s = &rs->s[i % ORACLE_SCALES_KEPT];
    /* -1 while not yet: the pause from iteration c done, the whole from the request, to c + 1 done */
    o += (size_t)snprintf(out + o, cap - o,
                          "%s{\"at_iteration\": %" PRIu64 ", \"from\": %u, \"to\": %u, \"checkpoint\": \"%s\", "
                          "\"generation\": %u, \"asked_unix\": %.3f, \"pause_seconds\": %.3f, \"seconds\": %.3f}",
                          i > first ? ", " : "", s->at_iteration, s->from, s->to, s->checkpoint, s->generation,
                          s->t_asked, s->t_first ? pause_of(s) : -1.0,
                          s->t_first ? s->t_first - s->t_asked : -1.0);
  }
  if (o < cap) snprintf(out + o, cap - o, "]");
}

void oracle_scales_line(const oracle_recoveries_t *rs, char *out, size_t cap) {
  out[0] = 0;
  if (!rs->n_scales) return;
  const oracle_scale_t *s = &rs->s[(rs->n_scales - 1) % ORACLE_SCALES_KEPT];
  if (!s->t_first)
    snprintf(out, cap, "scaling from %u to %u trainers after iteration %" PRIu64 " (%.1f s so far)", s->from, s->to,
             s->at_iteration, clock_wall_s() - s->t_asked);
  else
    snprintf(out, cap, "scaled from %u to %u trainers after iteration %" PRIu64 ": paused %.2f s, %.2f s in all",
             s->from, s->to, s->at_iteration, pause_of(s), s->t_first - s->t_asked);
}
