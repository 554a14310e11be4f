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
 * latest complete checkpoint).  The job record takes the scaled
 * configuration's fingerprint at once, so that an oracle restarted on the
 * scaled job file recovers the job.  A move of the embedding servers that
 * fails part-way is a lost embedding server: the next run moves again
 * from checkpoint c on the old servers (oracle_scale__move_failed).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "manifest.h"
#include "oracle_job_internal.h"

#define TRAINERS_MAX 4096 /* the key trainers' bound (cfg_keys.h) */

static void record_scale(oracle_job_t *j);

/* What refuses a scale of either kind in this state of the job: 0, or an error with msg. */
static int scale_refused(oracle_job_t *j, const char *what, char *msg, size_t msg_len) {
  int st = oracle_job_state(j);
  if (!j->ckpt.enabled)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "this job takes no checkpoints (mode = ideal, or cluster.embedding is empty): a scale goes on from "
                   "one; stop the job and start it again with %s",
                   what);
  if (j->scale_to || j->scale_servers)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "a scale to %u %s is under way (after the checkpoint of iteration %" PRIu64
                   "); ask again once the job trains on them",
                   j->scale_to ? j->scale_to : j->scale_servers, j->scale_to ? "trainers" : "embedding servers",
                   j->scale_at);
  oracle_recovery_t *r = j->recs ? oracle_recoveries_current(j->recs) : NULL;
  if (r && !r->t_caught_up)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "the job is recovering from the loss of %s; ask again once it has caught up", r->who);
  if (st == ORACLE_RECOVERING) /* no loss: the run a scale ended, its successor not yet training */
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "the job's group re-forms after a scale (%s); ask again once it trains",
                   j->reshape_from ? "the embedding servers' rows move" : "the new group joins");
  if (!oracle_job__training(j))
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job is %s; a job is scaled while it trains",
                   oracle_state_name(st));
  if (j->pipe.next + 1 >= j->iterations)
    return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION,
                   "the job's next checkpoint is its last (iteration %" PRIu64 "): nothing would be left to train on %s",
                   j->iterations - 1, what);
  return 0;
}

int oracle_job_scale_request(oracle_job_t *j, uint32_t n, char *id, size_t id_len, uint64_t *iteration, char *msg,
                             size_t msg_len) {
  if (n < 1 || n > TRAINERS_MAX)
    return err_set(msg, msg_len, -EINVAL, "trainers = %u is outside 1..%d, the bounds of the key trainers", n,
                   TRAINERS_MAX);
  if (n > j->B)
    return err_set(msg, msg_len, -EINVAL,
                   "trainers = %u is more than batch_size = %u: every trainer needs a sample of each batch", n, j->B);
  char what[48];
  snprintf(what, sizeof what, "trainers = %u", n);
  int rc = scale_refused(j, what, msg, msg_len);
  if (rc) return rc;
  if (n == j->P) return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job has trainers = %u already", n);
  if ((rc = oracle_job_checkpoint_request(j, id, id_len, iteration, msg, msg_len)) != 0) return rc;
  j->scale_to = n;
  j->scale_at = *iteration;
  if (j->recs) oracle_scales_begin(j->recs, "", j->P, n, *iteration, id);
  record_scale(j);
  snprintf(msg, msg_len,
           "the job goes from %u to %u trainers after checkpoint %s (the model after iteration %" PRIu64
           "): the group re-forms there, as a resume on %u trainers would",
           j->P, n, id, *iteration, n);
  return 0;
}

/* "a,b,c" of addrs[0..n) (malloc'ed), or NULL. */
static char *joined(char *const *addrs, size_t n) {
  size_t len = 1;
  for (size_t i = 0; i < n; i++) len += strlen(addrs[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) o += (size_t)snprintf(s + o, len - o, "%s%s", i ? "," : "", addrs[i]);
  s[o] = 0;
  return s;
}

int oracle_job_scale_servers_request(oracle_job_t *j, uint32_t n, char *const *addrs, size_t n_addrs, char *id,
                                     size_t id_len, uint64_t *iteration, char *msg, size_t msg_len) {
  uint32_t m = j->ckpt.S;
  if (n < 1 || n > MANIFEST_MAX_SERVERS)
    return err_set(msg, msg_len, -EINVAL, "embedding_servers = %u is outside 1..%d", n, MANIFEST_MAX_SERVERS);
  char what[48];
  snprintf(what, sizeof what, "embedding_servers = %u", n);
  int rc = scale_refused(j, what, msg, msg_len);
  if (rc) return rc;
  if (n == m) return err_set(msg, msg_len, ORACLE_ERR_PRECONDITION, "the job has embedding_servers = %u already", n);
  if (n_addrs != (n > m ? n : m))
    return err_set(msg, msg_len, -EINVAL,
                   "%zu embedding server addresses for %u servers now and %u after: give %u, the job's servers of now "
                   "first (a server past the list has no address to start at)",
                   n_addrs, m, n, n > m ? n : m);
  for (uint32_t s = 0; s < m; s++)
    if (strcmp(addrs[s], embc_address(j->ckpt.embc, s)))
      return err_set(msg, msg_len, -EINVAL,
                     "address %u is %s, but the job's embedding server %u is at %s: list the job's servers first", s,
                     addrs[s], s, embc_address(j->ckpt.embc, s));
  char *uni = joined(addrs, n_addrs), *cl = joined(addrs, n);
  if (!uni || !cl) {
    free(uni);
    free(cl);
    return err_set(msg, msg_len, -ENOMEM, "out of memory");
  }
  if ((rc = oracle_job_checkpoint_request(j, id, id_len, iteration, msg, msg_len)) != 0) {
    free(uni);
    free(cl);
    return rc;
  }
  j->scale_servers = n;
  j->scale_union = uni;
  j->scale_cluster = cl;
  j->scale_at = *iteration;
  j->scale_asked = clock_wall_s();
  if (j->recs) oracle_scales_begin(j->recs, "embedding_servers", m, n, *iteration, id);
  record_scale(j);
  snprintf(msg, msg_len,
           "the job goes from %u to %u embedding servers after checkpoint %s (the model after iteration %" PRIu64
           "): the rows whose owner changes move server to server there%s",
           m, n, id, *iteration, n < m ? "; the servers past the new count are drained, then may stop" : "");
  return 0;
}

int oracle_scale__split(const char *s, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  char **v = calloc(cap, sizeof *v);
  if (!v) return -ENOMEM;
  for (const char *p = s; *p;) {
    size_t l = strcspn(p, ",");
    if (!(v[*n] = strndup(p, l))) {
      cfg_list_free(v, *n);
      *n = 0;
      return -ENOMEM;
    }
    (*n)++;
    p += l;
    if (*p == ',') p++;
  }
  *out = v;
  return 0;
}

uint32_t oracle_job_scale_servers(const oracle_job_t *j, const char **cluster) {
  int done = j->scale_servers && j->ckpt.n_done && j->ckpt.last.iteration == j->scale_at;
  if (cluster) *cluster = done ? j->scale_cluster : "";
  return done ? j->scale_servers : 0;
}

void oracle_scale__moved(oracle_job_t *j, uint64_t rows, uint64_t bytes, double seconds, const char *id,
                         uint64_t iteration) {
  j->reshape_rows = rows;
  j->reshape_bytes = bytes;
  oracle_scale_t *s = j->recs && j->recs->n_scales ? &j->recs->s[(j->recs->n_scales - 1) % ORACLE_SCALES_KEPT] : NULL;
  if (s && s->what[0] && !s->t_first) {
    s->rows_moved = rows;
    s->bytes_moved = bytes;
    s->move_seconds = seconds;
    s->at_iteration = iteration; /* (an earlier one than asked when the scale's own was cut short) */
    snprintf(s->checkpoint, sizeof s->checkpoint, "%s", id);
    oracle_scales_save(j->recs);
  }
}

void oracle_scale__record(const oracle_job_t *j, char conf[65], oracle_record_scale_t *scale) {
  memset(scale, 0, sizeof *scale);
  if (j->scale_to) { /* an oracle restarted on the scaled job file recovers the job on scale_to */
    oracle_record_config_hash_as(j->cfg, "trainers", j->scale_to, conf);
    return;
  }
  oracle_record_config_hash(j->cfg, conf);
  if (!j->scale_servers) return;
  scale->from = j->ckpt.S;
  scale->to = j->scale_servers;
  scale->at = j->scale_at;
  scale->asked = j->scale_asked;
  scale->addrs = j->scale_union;
  oracle_record_config_hash_as(j->cfg, "embedding_servers", j->scale_servers, scale->config);
}

/* The job record says "training" with the scale asked (oracle_scale__record). */
static void record_scale(oracle_job_t *j) {
  if (!j->recs || !j->ckpt.state_dir[0]) return;
  char conf[65], e2[512];
  oracle_record_scale_t sc;
  oracle_scale__record(j, conf, &sc);
  if (oracle_record_write(j->ckpt.state_dir, j->job_id, "training", conf, &sc, e2, sizeof e2))
    log_warn("the job record was not updated for the scale (an oracle restarted before it is done will find the "
             "job blocked): %s",
             e2);
}

int oracle_scale__asked(const oracle_job_t *j) { return j->scale_to || j->scale_servers; }

void oracle_scale__what(const oracle_job_t *j, char *out, size_t cap) {
  if (j->scale_servers)
    snprintf(out, cap, "scaled to %u embedding servers after %s", j->scale_servers, j->ckpt.last.id);
  else
    snprintf(out, cap, "scaled to %u trainers after %s", j->scale_to, j->ckpt.last.id);
}

void oracle_scale__successor(const oracle_job_t *old, oracle_job_opts_t *o) {
  if (old->reshape_from && !old->reshape_done) { /* its move did not complete: the next run moves again */
    log_info("the move of checkpoint %s from %u embedding servers onto %u did not complete: the next run moves it "
             "again (restored on the old servers, the new ones cleared)",
             old->reshape_ckpt, old->reshape_from, old->ckpt.S);
    o->reshape_from = old->reshape_from;
    o->reshape_ckpt = old->reshape_ckpt;
    o->reshape_union = old->reshape_union;
    return;
  }
  if (!oracle_job_scale_servers(old, NULL)) {
    if (old->scale_servers)
      log_warn("the scale to %u embedding servers is dropped: the job recovers before its checkpoint was complete; "
               "ask again",
               old->scale_servers);
    return;
  }
  o->reshape_from = old->ckpt.S;
  o->reshape_ckpt = old->ckpt.last.id;
  o->reshape_union = old->scale_union;
}

int oracle_scale__moving(const oracle_job_t *j) {
  return j->reshape_from && !j->reshape_done && j->ckpt.running > 0;
}

int oracle_scale__move_failed(oracle_job_t *j, const ck_work_t *w) {
  if (!j->reshape_from || j->reshape_done || w->kind != W_RECOVER || w->reshaped == 1) return 0;
  if (w->rc == ERR_CONFIG || w->rc == -EINVAL || w->rc == -ENOMEM) return 0; /* the same again: the job fails */
  /* a server killed, restarted or unreachable in the middle: checkpoint c is intact on the old servers (only their
   * live rows moved), so the next run restores it there, clears the new ones and moves again */
  oracle_job__lose(j, "embedding", "embedding servers", -1,
                   "the move of checkpoint %s from %u servers onto %u failed part-way (%s); the next run moves it "
                   "again from the old servers' copy",
                   j->reshape_ckpt, j->reshape_from, j->ckpt.S, w->err);
  return 1;
}

int oracle_scale__init(oracle_job_t *j, const oracle_job_opts_t *o) {
  if (!o->reshape_from) return 0;
  j->reshape_from = o->reshape_from;
  snprintf(j->reshape_ckpt, sizeof j->reshape_ckpt, "%s", o->reshape_ckpt);
  return (j->reshape_union = strdup(o->reshape_union)) ? 0 : -ENOMEM;
}

void oracle_scale__free(oracle_job_t *j) {
  free(j->scale_union);
  free(j->scale_cluster);
  free(j->reshape_union);
}

uint32_t oracle_job_scale_to(const oracle_job_t *j) { return j->scale_to; }

int oracle_scale__due(oracle_job_t *j) {
  if (j->recs && j->report.done > j->ckpt.start) oracle_scales_first(j->recs, j->report.done);
  if (j->recs && oracle_scale__asked(j) && j->report.done > j->scale_at) oracle_scales_c_done(j->recs);
  return oracle_scale__asked(j) && j->ckpt.n_done && j->ckpt.last.iteration == j->scale_at;
}

/* ---- the record */

static oracle_scale_t *last_open(oracle_recoveries_t *rs, int ended, int trained) {
  if (!rs->n_scales) return NULL;
  oracle_scale_t *s = &rs->s[(rs->n_scales - 1) % ORACLE_SCALES_KEPT];
  if ((s->t_ended != 0) != ended || (s->t_trained != 0) != trained || s->t_first) return NULL;
  return s;
}

oracle_scale_t *oracle_scales_begin(oracle_recoveries_t *rs, const char *what, uint32_t from, uint32_t to, uint64_t c,
                                    const char *id) {
  oracle_scale_t *s = &rs->s[rs->n_scales++ % ORACLE_SCALES_KEPT];
  *s = (oracle_scale_t){.from = from, .to = to, .at_iteration = c, .t_asked = clock_wall_s()};
  snprintf(s->what, sizeof s->what, "%s", what);
  snprintf(s->checkpoint, sizeof s->checkpoint, "%s", id);
  oracle_scales_save(rs);
  log_info("scale requested from=%u to=%u checkpoint=%s at_iteration=%" PRIu64 ": the trainer group re-forms once "
           "it is complete",
           from, to, id, c);
  return s;
}

void oracle_scales_restarted(oracle_recoveries_t *rs, const oracle_record_scale_t *sc) {
  oracle_scale_t *s = rs->n_scales ? &rs->s[(rs->n_scales - 1) % ORACLE_SCALES_KEPT] : NULL;
  if (s && s->t_first) s = NULL; /* (done: none open) */
  if (!s && sc && sc->to) {
    s = &rs->s[rs->n_scales++ % ORACLE_SCALES_KEPT];
    *s = (oracle_scale_t){.from = sc->from, .to = sc->to, .at_iteration = sc->at, .t_asked = sc->asked};
    snprintf(s->what, sizeof s->what, "embedding_servers");
  }
  if (!s) return;
  if (!s->t_ended) s->t_ended = clock_wall_s();
  s->t_trained = 0; /* (the group forms again with this oracle) */
  oracle_scales_save(rs);
}

void oracle_scales_ended(oracle_recoveries_t *rs) {
  oracle_scale_t *s = last_open(rs, 0, 0);
  if (!s) return;
  s->t_ended = clock_wall_s();
  log_info("scale: checkpoint %s complete %.2f s after the request; the run of %u %s ends here, the next "
           "generation has %u",
           s->checkpoint, s->t_ended - s->t_asked, s->from, s->what[0] ? "embedding servers" : "trainers", s->to);
  oracle_scales_save(rs);
}

void oracle_scales_c_done(oracle_recoveries_t *rs) {
  oracle_scale_t *s = last_open(rs, 0, 0);
  if (s && !s->t_c) s->t_c = clock_wall_s();
  if (s) oracle_scales_save(rs);
}

/* The pause: from the old group's iteration c done (or, when a recovery
 * carried the scale out before it, its run's end) to c + 1 done. */
static double pause_of(const oracle_scale_t *s) { return s->t_first - (s->t_c ? s->t_c : s->t_ended); }

void oracle_scales_trained(oracle_recoveries_t *rs, uint32_t generation, uint64_t start) {
  oracle_scale_t *s = last_open(rs, 1, 0);
  if (!s) return;
  s->t_trained = clock_wall_s();
  s->generation = generation;
  oracle_recovery_t *r = oracle_recoveries_current(rs);
  if (start && s->at_iteration != start - 1) { /* an earlier checkpoint than asked: a loss cut the scale's short */
    s->at_iteration = start - 1;
    if (r && r->rollback_to == (int64_t)(start - 1)) snprintf(s->checkpoint, sizeof s->checkpoint, "%s", r->checkpoint);
  }
  log_info("scale: all %u trainers of generation %u joined %.2f s after the old run ended; training from iteration "
           "%" PRIu64,
           s->to, generation, s->t_trained - s->t_ended, s->at_iteration + 1);
  oracle_scales_save(rs);
}

void oracle_scales_first(oracle_recoveries_t *rs, uint64_t done) {
  oracle_scale_t *s = last_open(rs, 1, 1);
  if (!s) return;
  s->t_first = clock_wall_s();
  metrics_counter_inc(rs->m_scales);
  metrics_gauge_set(rs->m_scale_pause, pause_of(s));
  if (s->what[0]) {
    metrics_gauge_set(rs->m_scale_rows, (double)s->rows_moved);
    metrics_gauge_set(rs->m_scale_bytes, (double)s->bytes_moved);
  }
  log_info("scaled from=%u to=%u what=%s at_iteration=%" PRIu64 " checkpoint=%s rows_moved=%" PRIu64
           " bytes_moved=%" PRIu64 " pause_seconds=%.3f seconds=%.3f (iteration %" PRIu64 " done on the new shape)",
           s->from, s->to, s->what[0] ? s->what : "trainers", s->at_iteration, s->checkpoint, s->rows_moved,
           s->bytes_moved, pause_of(s), s->t_first - s->t_asked, done - 1);
  oracle_scales_save(rs);
}

void oracle_scales_json(const oracle_recoveries_t *rs, char *out, size_t cap) {
  size_t o = 0;
  uint64_t first = rs->n_scales > ORACLE_SCALES_KEPT ? rs->n_scales - ORACLE_SCALES_KEPT : 0;
  o += (size_t)snprintf(out + o, cap - o, "[");
  for (uint64_t i = first; i < rs->n_scales && o < cap; i++) {
    const oracle_scale_t *s = &rs->s[i % ORACLE_SCALES_KEPT];
    /* -1 while not yet: the pause from iteration c done, the whole from the request, to c + 1 done */
    o += (size_t)snprintf(out + o, cap - o,
                          "%s{\"at_iteration\": %" PRIu64 ", \"from\": %u, \"to\": %u, \"what\": \"%s\", "
                          "\"rows_moved\": %" PRIu64 ", \"bytes_moved\": %" PRIu64 ", \"move_seconds\": %.3f, "
                          "\"checkpoint\": \"%s\", "
                          "\"generation\": %u, \"asked_unix\": %.3f, \"pause_seconds\": %.3f, \"seconds\": %.3f}",
                          i > first ? ", " : "", s->at_iteration, s->from, s->to, s->what[0] ? s->what : "trainers",
                          s->rows_moved, s->bytes_moved, s->move_seconds, s->checkpoint, s->generation,
                          s->t_asked, s->t_first ? pause_of(s) : -1.0,
                          s->t_first ? s->t_first - s->t_asked : -1.0);
  }
  if (o < cap) snprintf(out + o, cap - o, "]");
}

void oracle_scales_line(const oracle_recoveries_t *rs, char *out, size_t cap) {
  out[0] = 0;
  if (!rs->n_scales) return;
  const oracle_scale_t *s = &rs->s[(rs->n_scales - 1) % ORACLE_SCALES_KEPT];
  const char *what = s->what[0] ? "embedding servers" : "trainers";
  char moved[96] = "";
  if (s->what[0] && s->t_first)
    snprintf(moved, sizeof moved, ", %" PRIu64 " rows (%" PRIu64 " bytes) moved server to server", s->rows_moved,
             s->bytes_moved);
  if (!s->t_first)
    snprintf(out, cap, "scaling from %u to %u %s after iteration %" PRIu64 " (%.1f s so far)", s->from, s->to, what,
             s->at_iteration, clock_wall_s() - s->t_asked);
  else
    snprintf(out, cap, "scaled from %u to %u %s after iteration %" PRIu64 ": paused %.2f s, %.2f s in all%s", s->from,
             s->to, what, s->at_iteration, pause_of(s), s->t_first - s->t_asked, moved);
}
