/*
 * oracle_ckpt: whole-job checkpoints and the job's start (DESIGN.md
 * section 5; oracle_job_internal.h says how the stages share a job).
 *
 * A checkpoint at iteration c holds the model as synchronous training has
 * it after c.  Its parts, in order:
 *  1. Choosing c.  Asked once per batch when its planning is queued
 *     (oracle_ckpt__wanted): after every checkpoint_every iterations,
 *     when checkpoint_seconds have passed since the last one, on demand
 *     (chanter checkpoint: the next batch planned), and after the last
 *     iteration.  With allocation = laia the planning work saves laia's
 *     state right after it allocated c (laia runs ahead of training).
 *  2. Deciding c.  Right after the cacher decided c, and before it
 *     decides c + 1, cacher_flush lists for every trainer the rows it
 *     holds newer than the servers' copy and writes back (each row once).
 *  3. The trainers.  After Step c and the evaluations due after c, each
 *     trainer gets CheckpointWork: it waits for c's background work,
 *     writes its flush rows back without evicting them, rank 0 stores the
 *     dense state (parameters and dense optimizer state) as a blob on
 *     server 0, and it answers CheckpointDone.  Dispatch holds Step c + 1
 *     back until the checkpoint is complete: so no write-back of c + 1
 *     can reach a server before its checkpoint of c.
 *  4. The servers (worker pool, once every trainer answered and the
 *     evaluations due are scored): the oracle's state as a blob on server
 *     0 (c, the evaluation record, the summary's counters, laia), a
 *     RocksDB checkpoint on every server, then the MANIFEST sealed into
 *     every server's checkpoint and copied to oracle.state_dir.  A
 *     checkpoint is complete, and listed as usable, only once sealed on
 *     every server.  Then the oldest beyond checkpoint_keep go.
 *
 * The start: once every trainer is attached the servers are checked.
 * Servers that hold nothing get the job's stamp (a blob "job") and the job
 * begins at 0.  Servers holding anything -- rows, blobs, checkpoints --
 * hold another job's state (or this job's, stopped): the job is BLOCKED,
 * saying what it found, until chanter train --resume (restore every
 * server to a complete checkpoint, load the oracle's state, and tell the
 * trainers with ResumeWork where to go on) or --fresh (clear them).
 *
 * The manifest is text, one key=value a line, ending with sha256= over
 * the lines before it.  The oracle's state blob is binary (little-endian,
 * "CHORACLV" and a version, SHA-256 trailer: oracle_ckpt_state.c).
 *
 * What happens at the start (checked, blocked, fresh, resumed, rolled
 * back) is decided by the lifecycle (oracle_job.c, advance); this stage
 * queues the calls to the servers (oracle_ckpt__check, __start,
 * __rollback) and keeps what they returned for it (oracle_ckpt__start_done).
 *
 * The stage has three rooms: this file, on the loop thread (choosing c,
 * the decision's flush lists, when an item goes to a trainer (dispatch
 * builds it), the answers, the checkpoint's completion, reporting);
 * oracle_ckpt_work.c, the calls to the embedding servers on the worker
 * pool; oracle_ckpt_state.c, the job's manifest and the oracle's state
 * blob (each stage restores its own part of it).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "log.h"
#include "manifest.h"
#include "oracle_job_internal.h"
#include "table.h"

static void cp_free(oracle_cp_t *cp, uint32_t P) {
  if (!cp) return;
  if (cp->flush) cacher_flush_free(cp->flush, P);
  free(cp->flush);
  free(cp->laia_state);
  free(cp->sent);
  free(cp);
}

void oracle_ckpt__work_free(ck_work_t *w) {
  if (!w) return;
  free(w->ostate);
  free(w->oblob);
  free(w->bytes);
  free(w);
}

/* Fence(c) answered: Step c + 1 may go. */
static void fence_done(oracle_job_t *j, ck_work_t *w) {
  w->cp->fencing = 0;
  if (w->rc && (w->rc == ERR_UNAVAILABLE || w->rc == ERR_DEADLINE))
    oracle_job__lose(j, "embedding", "an embedding server", -1, "checkpoint %s: fencing it failed: %s", w->cp->id,
                     w->err);
  else if (w->rc)
    oracle_job__error(j, w->rc, "checkpoint %s (after iteration %" PRIu64 "): fencing the servers failed: %s",
                      w->cp->id, w->cp->iteration, w->err);
  else
    w->cp->fenced = 1;
}

/* The servers' part of checkpoint cp is done: it is complete (reported,
 * and off the list), or it failed. */
static void servers_done(oracle_job_t *j, ck_work_t *w) {
  oracle_ckpt_t *ck = &j->ckpt;
  oracle_cp_t *cp = w->cp;
  cp->running = 0;
  if (w->rc && (w->rc == ERR_UNAVAILABLE || w->rc == ERR_DEADLINE)) {
    oracle_job__lose(j, "embedding", "an embedding server", -1, "checkpoint %s (after iteration %" PRIu64 "): %s",
                     cp->id, cp->iteration, w->err);
    return;
  }
  if (w->rc) {
    oracle_job__error(j, w->rc,
                      "checkpoint %s (after iteration %" PRIu64 ") failed: %s; it is not listed as complete, and "
                      "a resume uses the last complete one",
                      cp->id, cp->iteration, w->err);
    return;
  }
  double now = oracle_job__now();
  oracle_cp_report_t *r = &ck->last;
  snprintf(r->id, sizeof r->id, "%s", cp->id);
  r->iteration = cp->iteration;
  r->rows_flushed = cp->rows_flushed;
  r->dense_bytes = cp->dense_bytes;
  /* the whole checkpoint: from the end of c everywhere to here; training went on meanwhile, so the stall is
   * measured later (oracle_ckpt__run), once an iteration after this end is in */
  r->total = now - (cp->t_reported ? cp->t_reported : cp->t_first_sent);
  r->trainer_secs = cp->trainer_secs;
  if (cp->iteration + 1 >= j->iterations) { /* the end's: the job waited for all of it */
    r->stall = r->total;
    ck->stall_sum += r->stall;
    ck->n_stall++;
    metrics_gauge_set(ck->m_stall, r->stall);
  } else {
    r->stall = NAN;
    ck->stall_pending = 1;
  }
  ck->stall_c = cp->iteration;
  ck->stall_done_at_end = j->report.done;
  ck->stall_t0 = cp->t_reported ? cp->t_reported : cp->t_first_sent;
  ck->stall_ema = cp->ema_before;
  r->server_secs = w->secs;
  r->unix_time = (double)(time_t)clock_wall_s();
  r->bytes_total = 0;
  for (uint32_t s = 0; s < ck->S; s++) r->bytes_total += (r->bytes[s] = w->bytes[s]);
  ck->n_done++;
  ck->total_sum += r->total;
  metrics_counter_inc(ck->m_count);
  metrics_gauge_set(ck->m_total, r->total);
  metrics_gauge_set(ck->m_bytes, (double)r->bytes_total);
  metrics_gauge_set(ck->m_iteration, (double)(r->iteration + 1));
  char end_stall[40] = "";
  if (!isnan(r->stall)) snprintf(end_stall, sizeof end_stall, " stall_ms=%.1f", 1e3 * r->stall);
  log_info("checkpoint complete id=%s iteration=%" PRIu64 " done=%" PRIu64 "%s total_ms=%.1f trainers_ms=%.1f "
           "servers_ms=%.1f rows_flushed=%" PRIu64 " dense_bytes=%" PRIu64 " bytes=%" PRIu64 " servers=%u%s%s",
           cp->id, cp->iteration, j->report.done, end_stall, 1e3 * r->total, 1e3 * cp->trainer_secs, 1e3 * w->secs,
           cp->rows_flushed, cp->dense_bytes, r->bytes_total, ck->S, w->pruned[0] ? " removed=" : "", w->pruned);
  oracle_timeline__checkpoint(j, cp->id, cp->iteration, r->total);
  oracle_ckpt_info_t *rec = &ck->recent[ck->n_recent++ % ORACLE_CKPT_RECENT];
  memset(rec, 0, sizeof *rec);
  snprintf(rec->id, sizeof rec->id, "%s", cp->id);
  rec->iteration = cp->iteration;
  rec->complete = 1;
  rec->started = cp->unix_started;
  rec->finished = r->unix_time;
  ck->head = cp->next;
  if (!ck->head) ck->tail = NULL;
  cp_free(cp, j->P);
}

/* A call to the servers came back (loop): kept for advance, whose case
 * for the job's state decides what a start's means (oracle_ckpt__start_done)
 * and whose training pass applies a checkpoint's (oracle_ckpt__collect). */
static void ck_done(uv_work_t *req, int status) {
  ck_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_ckpt_t *ck = &j->ckpt;
  ck->running--;
  if (status == UV_ECANCELED && !w->rc) w->rc = ERR_SHUTDOWN;
  if (w->kind == W_RECOVER && j->reshape_from && !j->reshape_ckpt[0] && w->reshape_id[0])
    snprintf(j->reshape_ckpt, sizeof j->reshape_ckpt, "%s", w->reshape_id); /* (a move again: the same one) */
  if (w->kind == W_RECOVER && j->reshape_from && w->reshaped >= 1) j->reshape_done = 1;
  if (w->kind == W_RECOVER && j->reshape_from && w->reshaped == 1)
    oracle_scale__moved(j, w->rows_moved, w->bytes_moved, w->move_seconds, w->reshape_id, w->reshape_iter);
  if (!j->destroying && !oracle_job__over(j)) {
    switch (w->kind) {
    case W_PREFLIGHT:
    case W_FRESH:
    case W_RESUME:
    case W_RECOVER:
      ASSERT(!ck->start_done); /* one start call at a time */
      ck->start_done = w;
      w = NULL;
      break;
    case W_FENCE:
    case W_SERVERS:
      if (ck->done_tail) ck->done_tail->next = w;
      else ck->done_head = w;
      ck->done_tail = w;
      w = NULL;
      break;
    }
  }
  oracle_ckpt__work_free(w);
  oracle_job__advance(j);
}

int oracle_ckpt__collect(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  while (ck->done_head && !j->fail_rc && !j->lost) {
    ck_work_t *w = ck->done_head;
    if (!(ck->done_head = w->next)) ck->done_tail = NULL;
    if (w->kind == W_FENCE) fence_done(j, w);
    else servers_done(j, w);
    oracle_ckpt__work_free(w);
  }
  return j->fail_rc;
}

ck_work_t *oracle_ckpt__start_done(oracle_job_t *j) {
  ck_work_t *w = j->ckpt.start_done;
  j->ckpt.start_done = NULL;
  return w;
}

static int queue(oracle_job_t *j, ck_work_t *w) {
  w->req.data = w;
  w->j = j;
  oracle_ckpt__job_manifest(j, &w->job);
  int rc = uv_queue_work(j->loop, &w->req, oracle_ckpt__work, ck_done);
  if (rc) return rc;
  j->ckpt.running++;
  return 0;
}

/* A start's call of kind (want: the checkpoint, for resume and recover). */
static int queue_start(oracle_job_t *j, int kind, int quiet, const char *want, const char *what) {
  ck_work_t *w = calloc(1, sizeof *w);
  if (!w) return oracle_job__error(j, -ENOMEM, "out of memory queueing %s", what);
  w->kind = kind;
  w->empty = quiet; /* fresh after a check found nothing (Clear on empty servers is cheap and harmless) */
  if (want) snprintf(w->want, sizeof w->want, "%s", want);
  if (queue(j, w)) {
    free(w);
    return oracle_job__error(j, -EIO, "cannot queue %s", what);
  }
  return 0;
}

int oracle_ckpt__check(oracle_job_t *j) {
  return queue_start(j, W_PREFLIGHT, 0, NULL, "the check of the embedding servers");
}

int oracle_ckpt__start(oracle_job_t *j, int fresh, int quiet, const char *want) {
  return queue_start(j, fresh ? W_FRESH : W_RESUME, quiet, want, "the job's start");
}

int oracle_ckpt__rollback(oracle_job_t *j) {
  return queue_start(j, W_RECOVER, 0, "latest", "the roll-back of the embedding servers");
}

void oracle_ckpt__resumed(oracle_job_t *j, const manifest_t *m) {
  oracle_ckpt_t *ck = &j->ckpt;
  ck->resumed = 1;
  snprintf(ck->resume_id, sizeof ck->resume_id, "%s", m->id);
  snprintf(ck->resume_blob, sizeof ck->resume_blob, "%s", m->dense_blob);
  ck->resume_server = (uint32_t)m->dense_server;
}

int oracle_job_checkpoint_request(oracle_job_t *j, char *id, size_t id_len, uint64_t *iteration, char *msg,
                                  size_t msg_len) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job takes no checkpoints (mode = ideal, or cluster.embedding is empty)");
  if (!oracle_job__training(j))
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s; checkpoints are taken while it trains",
                   oracle_state_name(oracle_job_state(j)));
  uint64_t x = j->pipe.next; /* the next batch whose planning is queued */
  if (x >= j->iterations) x = j->iterations - 1; /* the end's checkpoint, already due */
  else if (ck->asap_at == UINT64_MAX || ck->asap_at < x) ck->asap_at = x;
  else x = ck->asap_at;
  *iteration = x;
  snprintf(id, id_len, "%.60s-%012" PRIu64, j->job_id, x + 1);
  log_info("checkpoint requested: it will hold the model after iteration %" PRIu64 " id=%s", x, id);
  return 0;
}

int oracle_ckpt__wanted(oracle_job_t *j, uint64_t x) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->enabled) return 0;
  int want = x + 1 == j->iterations || (ck->every && (x + 1) % ck->every == 0) || x == ck->asap_at;
  double now = oracle_job__now();
  if (!want && ck->seconds && now - ck->t_last >= (double)ck->seconds) want = 1;
  if (want) {
    ck->t_last = now;
    if (x == ck->asap_at) ck->asap_at = UINT64_MAX;
  }
  return want;
}

int oracle_ckpt__decided(oracle_job_t *j, oracle_entry_t *s, cacher_t *cache) {
  oracle_ckpt_t *ck = &j->ckpt;
  oracle_cp_t *cp = calloc(1, sizeof *cp);
  if (!cp || !(cp->flush = calloc(j->P, sizeof *cp->flush)) || !(cp->sent = calloc(j->P, 1))) {
    cp_free(cp, j->P);
    return oracle_job__error(j, -ENOMEM, "out of memory for the checkpoint after batch %llu",
                             (unsigned long long)s->iteration);
  }
  int rc = cacher_flush(cache, cp->flush);
  if (rc) {
    free(cp->flush);
    cp->flush = NULL;
    cp_free(cp, j->P);
    return oracle_job__error(j, rc, "listing the cached rows for the checkpoint after batch %llu: %s",
                             (unsigned long long)s->iteration, err_str(rc));
  }
  cp->iteration = s->iteration;
  cp->unix_started = clock_wall_s();
  snprintf(cp->id, sizeof cp->id, "%.60s-%012" PRIu64, j->job_id, s->iteration + 1);
  cp->laia_state = s->laia_state;
  cp->laia_len = s->laia_len;
  s->laia_state = NULL;
  s->laia_len = 0;
  for (uint32_t p = 0; p < j->P; p++) cp->rows_flushed += cp->flush[p].n;
  if (ck->tail) ck->tail->next = cp;
  else ck->head = cp;
  ck->tail = cp;
  return 0;
}

int oracle_ckpt__dispatch(oracle_job_t *j, uint32_t p, uint64_t x) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (ck->resumed && !ck->resume_sent[p]) {
    if (oracle_dispatch__resume(j, p) != 0) return -1;
    ck->resume_sent[p] = 1;
    return 1;
  }
  oracle_cp_t *cp = ck->head;
  if (!cp || x <= cp->iteration) return 0; /* Step x comes before the oldest checkpoint's */
  /* the CheckpointWork of every checkpoint before x, in order (one at most is not complete and fenced: the head) */
  for (; cp && x > cp->iteration; cp = cp->next) {
    if (!cp->sent[p]) {
      if (oracle_dispatch__checkpoint(j, p, cp) != 0) return -1;
      cp->sent[p] = 1;
      if (cp->t_first_sent == 0) cp->t_first_sent = oracle_job__now();
      return 1;
    }
    /* Step c + 1 goes once every server holds back later write-backs until its checkpoint of c */
    if (!cp->fenced) return -1;
    /* a scale's checkpoint: this group runs no step past c (the next one, of the scaled size, goes on from c) */
    if (oracle_scale__asked(j) && cp->iteration == j->scale_at) return -1;
  }
  return 0;
}

int oracle_ckpt__message(oracle_job_t *j, uint32_t p, const Chanter__Oracle__V1__CheckpointDone *m, char *why,
                         size_t why_len) {
  /* any checkpoint sent to p and not yet complete: a later one's answer may come while the one before it is
   * still being written (its flush waits at the fenced servers) */
  oracle_cp_t *cp = j->ckpt.head;
  while (cp && strcmp(m->id ? m->id : "", cp->id)) cp = cp->next;
  if (cp && cp->sent[p] == 2) {
    snprintf(why, why_len, "a second CheckpointDone for %s", cp->id);
    return -EINVAL;
  }
  if (!cp || !cp->sent[p]) {
    snprintf(why, why_len, "CheckpointDone for %s, which is not a checkpoint this rank was asked for (%s is the oldest "
                           "under way)",
             m->id ? m->id : "(none)", j->ckpt.head ? j->ckpt.head->id : "none");
    return -EINVAL;
  }
  cp->sent[p] = 2; /* answered */
  cp->acks++;
  cp->dense_bytes += m->dense_bytes;
  if (m->seconds > cp->trainer_secs) cp->trainer_secs = m->seconds;
  if (cp->acks == j->P) cp->t_acked = oracle_job__now();
  return 0;
}

int oracle_ckpt__run(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  oracle_cp_t *cp = ck->head;
  oracle_report_t *rp = &j->report;
  /* the last checkpoint's stall, once the first iteration after its end is in */
  if (ck->stall_pending && rp->done > ck->stall_done_at_end) {
    uint64_t n = rp->done - (ck->stall_c + 1);
    double st = (rp->t_last - ck->stall_t0) - (double)n * ck->stall_ema;
    ck->last.stall = st > 0 ? st : 0;
    ck->stall_sum += ck->last.stall;
    ck->n_stall++;
    ck->stall_pending = 0;
    metrics_gauge_set(ck->m_stall, ck->last.stall);
    log_info("checkpoint stall id=%s iteration=%" PRIu64 " stall_ms=%.1f (iterations %" PRIu64 "..%" PRIu64 " took %.1f ms, %.1f ms each before it)",
             ck->last.id, ck->stall_c, 1e3 * ck->last.stall, ck->stall_c + 1, rp->done - 1, 1e3 * (rp->t_last - ck->stall_t0),
             1e3 * ck->stall_ema);
  }
  if (cp && !cp->t_reported && rp->done > cp->iteration) {
    cp->t_reported = oracle_job__now();
    cp->ema_before = rp->ema_dt;
  }
  /* the head's fence, before any Step after it */
  if (cp && !cp->fenced && !cp->fencing) {
    ck_work_t *w = calloc(1, sizeof *w);
    if (!w) return oracle_job__error(j, -ENOMEM, "out of memory for checkpoint %s", cp->id);
    w->kind = W_FENCE;
    w->cp = cp;
    int rc = queue(j, w);
    if (rc) {
      free(w);
      return oracle_job__error(j, rc, "cannot queue the fence of checkpoint %s", cp->id);
    }
    cp->fencing = 1;
  }
  if (!cp || cp->running || cp->acks < j->P) return 0;
  /* the evaluations due after c are scored: the oracle's state holds them */
  if (rp->evals_running || rp->evals_done < oracle_report__rounds_upto(j, cp->iteration)) return 0;
  ck_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->bytes = calloc(ck->S, sizeof *w->bytes))) {
    free(w);
    return oracle_job__error(j, -ENOMEM, "out of memory for checkpoint %s", cp->id);
  }
  int rc = oracle_ckpt__state_encode(j, cp, &w->oblob, &w->oblob_len);
  if (rc) {
    free(w->bytes);
    free(w);
    return oracle_job__error(j, rc, "out of memory encoding the oracle's state for checkpoint %s", cp->id);
  }
  w->kind = W_SERVERS;
  w->cp = cp;
  if ((rc = queue(j, w)) != 0) {
    free(w->oblob);
    free(w->bytes);
    free(w);
    return oracle_job__error(j, rc, "cannot queue checkpoint %s", cp->id);
  }
  cp->running = 1;
  return 0;
}

int oracle_ckpt__busy(const oracle_job_t *j) { return j->ckpt.head != NULL; }

/* The parts checkpoint cp still lacks, in words, into out. */
static void missing_parts(const oracle_job_t *j, const oracle_cp_t *cp, char *out, size_t cap) {
  size_t o = 0;
  out[0] = 0;
  if (cp->acks < j->P) {
    o += (size_t)snprintf(out + o, cap - o, "CheckpointDone from trainer");
    uint32_t listed = 0;
    for (uint32_t p = 0; p < j->P && o < cap; p++) {
      if (cp->sent && cp->sent[p] == 2) continue;
      if (listed++ == 8) {
        o += (size_t)snprintf(out + o, cap - o, ", ...");
        break;
      }
      o += (size_t)snprintf(out + o, cap - o, "%s %u", listed > 1 ? "," : "", p);
    }
    if (o < cap && !cp->t_first_sent)
      o += (size_t)snprintf(out + o, cap - o, " (training has not reached iteration %" PRIu64 ")", cp->iteration);
  } else if (j->report.evals_running || j->report.evals_done < oracle_report__rounds_upto(j, cp->iteration)) {
    o += (size_t)snprintf(out + o, cap - o, "the evaluations due after iteration %" PRIu64, cp->iteration);
  }
  if (o < cap && !cp->fenced)
    o += (size_t)snprintf(out + o, cap - o, "%sthe servers' fence%s", o ? "; " : "", cp->fencing ? " (asked)" : "");
  if (o < cap)
    snprintf(out + o, cap - o, "%sthe servers' part: the oracle's state, a RocksDB checkpoint and the sealed manifest "
                               "on each of %u servers%s",
             o ? "; " : "", j->ckpt.S, cp->running ? " (running)" : "");
}

size_t oracle_job_checkpoints(const oracle_job_t *j, oracle_ckpt_info_t *out, size_t max) {
  const oracle_ckpt_t *ck = &j->ckpt;
  size_t n = 0;
  uint64_t first = ck->n_recent > ORACLE_CKPT_RECENT ? ck->n_recent - ORACLE_CKPT_RECENT : 0;
  for (uint64_t i = first; i < ck->n_recent && n < max; i++) out[n++] = ck->recent[i % ORACLE_CKPT_RECENT];
  for (const oracle_cp_t *cp = ck->head; cp && n < max; cp = cp->next) {
    oracle_ckpt_info_t *c = &out[n++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", cp->id);
    c->iteration = cp->iteration;
    c->started = cp->unix_started;
    missing_parts(j, cp, c->missing, sizeof c->missing);
  }
  return n;
}

void oracle_ckpt__summary(const oracle_job_t *j, char *out, size_t cap) {
  const oracle_ckpt_t *ck = &j->ckpt;
  const oracle_cp_report_t *r = &ck->last;
  char stall[32] = "null"; /* null until an iteration after the checkpoint is in */
  if (!isnan(r->stall)) snprintf(stall, sizeof stall, "%.6f", r->stall);
  size_t o = (size_t)snprintf(out, cap, "\"checkpoints\": %llu, ", (unsigned long long)ck->n_done);
  if (o < cap)
    o += (size_t)snprintf(out + o, cap - o, "\"resumed_from\": \"%s\", \"start_iteration\": %llu, ", ck->resume_id,
                          (unsigned long long)ck->start);
  if (!r->id[0]) {
    if (o < cap) snprintf(out + o, cap - o, "\"checkpoint\": null");
    return;
  }
  if (o < cap)
    o += (size_t)snprintf(out + o, cap - o,
                          "\"checkpoint\": {\"id\": \"%s\", \"iteration\": %llu, \"stall_seconds\": %s, "
                          "\"total_seconds\": %.6f, \"trainers_seconds\": %.6f, \"servers_seconds\": %.6f, "
                          "\"rows_flushed\": %llu, \"dense_bytes\": %llu, \"bytes\": %llu, \"bytes_per_server\": [",
                          r->id, (unsigned long long)r->iteration, stall, r->total, r->trainer_secs, r->server_secs,
                          (unsigned long long)r->rows_flushed, (unsigned long long)r->dense_bytes,
                          (unsigned long long)r->bytes_total);
  for (uint32_t s = 0; s < ck->S && o < cap; s++)
    o += (size_t)snprintf(out + o, cap - o, "%s%llu", s ? ", " : "", (unsigned long long)r->bytes[s]);
  if (o < cap)
    snprintf(out + o, cap - o, "], \"stall_seconds_mean\": %.6f, \"total_seconds_mean\": %.6f}",
             ck->n_stall ? ck->stall_sum / (double)ck->n_stall : 0.0, ck->n_done ? ck->total_sum / (double)ck->n_done : 0.0);
}

int oracle_ckpt__init(oracle_job_t *j, metrics_registry_t *reg, char *err, size_t err_len) {
  oracle_ckpt_t *ck = &j->ckpt;
  const cfg_t *cfg = j->cfg;
  ck->open = 1;
  ck->asap_at = UINT64_MAX;
  ck->every = (uint64_t)cfg_int(cfg, "checkpoint_every");
  ck->seconds = (uint64_t)cfg_int(cfg, "checkpoint_seconds");
  ck->keep = (uint64_t)cfg_int(cfg, "checkpoint_keep");
  ck->state_dir = cfg_str(cfg, "oracle.state_dir");
  ck->t_last = oracle_job__now();
  if (!(ck->resume_sent = calloc(j->P, 1))) return -ENOMEM;
  data_schema_t sc;
  table_layout_t lay;
  int rc = data_schema_from_cfg(cfg, &sc, err, err_len);
  if (rc) return rc;
  ck->schema_hash = dpc_schema_hash(&sc);
  data_schema_close(&sc);
  if ((rc = cfg_layout(cfg, &lay, err, err_len)) != 0) return rc;
  ck->layout_hash = table_layout_hash(&lay);
  table_layout_close(&lay);
  char **hosts = NULL;
  size_t n_hosts = 0;
  if (cfg_list(cfg, "cluster.embedding", &hosts, &n_hosts) == 0) cfg_list_free(hosts, n_hosts);
  if (!j->ideal && n_hosts > 0) {
    if ((rc = embc_create(cfg, &ck->embc, err, err_len)) != 0) return rc;
    ck->S = embc_servers(ck->embc);
    ck->enabled = 1;
    if (!(ck->last.bytes = calloc(ck->S, sizeof *ck->last.bytes))) return -ENOMEM;
  } else {
    log_info("checkpoints off: %s", j->ideal ? "mode = ideal keeps every row in the trainers" : "cluster.embedding is empty");
  }
  ck->m_count = metrics_counter(reg, "checkpoints_total", NULL, "whole-job checkpoints completed");
  ck->m_stall = metrics_gauge(reg, "checkpoint_stall_seconds", NULL,
                              "the last checkpoint: what training lost to it (measured after it)");
  ck->m_total = metrics_gauge(reg, "checkpoint_seconds", NULL, "the last checkpoint: time it took in all");
  ck->m_bytes = metrics_gauge(reg, "checkpoint_bytes", NULL, "the last checkpoint: bytes on all servers");
  ck->m_iteration = metrics_gauge(reg, "checkpoint_iteration", NULL, "the last checkpoint: iterations it holds");
  return 0;
}

void oracle_ckpt__restore(oracle_job_t *j, const oracle_ostate_t *o) {
  j->ckpt.n_done = o->n_done;
  j->ckpt.stall_sum = o->stall_sum;
  j->ckpt.total_sum = o->total_sum;
  j->ckpt.start = o->iteration + 1;
}

void oracle_ckpt__close(oracle_job_t *j) {
  oracle_ckpt_t *ck = &j->ckpt;
  if (!ck->open) return;
  while (ck->head) {
    oracle_cp_t *cp = ck->head;
    ck->head = cp->next;
    cp_free(cp, j->P);
  }
  oracle_ckpt__work_free(ck->start_done);
  ck->start_done = NULL;
  while (ck->done_head) {
    ck_work_t *w = ck->done_head;
    ck->done_head = w->next;
    oracle_ckpt__work_free(w);
  }
  ck->done_tail = NULL;
  embc_destroy(ck->embc);
  free(ck->resume_sent);
  free(ck->last.bytes);
  ck->open = 0;
}
