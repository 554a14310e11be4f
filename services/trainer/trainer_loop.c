/*
 * trainer_loop: the trainer's conductor (see trainer_loop.h for what the
 * trainer does, trainer_state.h for how it is cut).  It builds and frees
 * the trainer, opens and closes the Work stream, and serve() is the one
 * place that decides what runs next: the next item from the pipeline
 * (opening its gate first when only this thread can), then for a Step the
 * phases of trainer_exec.c with the pipeline's waits and hand-over between
 * them, for an Eval the waits and trainer_eval.c, for a StopWork the end.
 * The stages return what changed; none of them calls the next one.  The
 * failover lives here too (generation, leave_generation, trainer_run's
 * loop): stop the pipeline, leave the group, rebuild the model and cache,
 * join again, and serve the next generation's stream from its ResumeWork.
 */
#include "trainer_loop.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "proc.h"
#include "sdn.h"
#include "trainer_ckpt.h"
#include "trainer_state.h"

/* ------------------------------------------------------------------ create */

int trainer_create(cfg_t *cfg, uint32_t rank, metrics_registry_t *reg, trainer_t **out, char *err,
                   size_t err_len) {
  *out = NULL;
  trainer_t *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  trainer_pipeline_init(t);
  t->cfg = cfg;
  t->rank = rank;
  t->trainers = (uint32_t)cfg_int(cfg, "trainers");
  t->iterations = (uint64_t)cfg_int(cfg, "iterations");
  t->ideal = strcmp(cfg_str(cfg, "mode"), "ideal") == 0;
  int rc = 0;
  char **hosts = NULL;
  size_t n_hosts = 0;
  if (rank >= t->trainers) {
    rc = err_set(err, err_len, ERR_CONFIG, "rank %u is outside the job's trainers = %u (from %s)", rank, t->trainers,
                 cfg_origin(cfg, "trainers"));
    goto fail;
  }
  if ((rc = cfg_list(cfg, "cluster.trainers", &hosts, &n_hosts)) != 0) goto fail;
  snprintf(t->address, sizeof t->address, "%s", rank < n_hosts ? hosts[rank] : "127.0.0.1");
  cfg_list_free(hosts, n_hosts);
  if ((rc = data_schema_from_cfg(cfg, &t->schema, err, err_len)) != 0) goto fail;
  t->have_schema = 1;
  if ((rc = cfg_layout(cfg, &t->layout, err, err_len)) != 0) goto fail;
  if ((rc = trainer_partition_init(&t->partition, cfg, &t->schema, &t->layout, rank, t->ideal, err, err_len)) != 0) goto fail;
  if ((rc = trainer_step_create(cfg, &t->schema, &t->layout, (uint32_t)cfg_int(cfg, "batch_size"), &t->ts, err, err_len)) != 0)
    goto fail;
  if (t->ideal) {
    if ((rc = trainer_rows_create(&t->layout, &t->local)) != 0) {
      err_set(err, err_len, rc, "cannot create the local row store: %s", err_str(rc));
      goto fail;
    }
  } else {
    if ((rc = embc_create(cfg, &t->embc, err, err_len)) != 0) goto fail;
    t->cache_rows = (uint64_t)cfg_int(cfg, "cache_rows");
    if ((rc = trainer_step_cache_init(t->ts, t->cache_rows, err, err_len)) != 0) goto fail;
    if ((rc = trainer_kmap_create(t->cache_rows, &t->kmap)) != 0) {
      err_set(err, err_len, rc, "out of memory for the map of %" PRIu64 " cache slots", t->cache_rows);
      goto fail;
    }
    log_info("cache rank=%u cache_rows=%" PRIu64 " bytes=%.1f MiB", rank, t->cache_rows,
             (double)t->cache_rows * trainer_step_row_floats(t->ts) * 4 / (1 << 20));
  }
  t->limits = (trainer_work_limits_t){.schema = &t->schema,
                                      .max_batch = trainer_step_max_batch(t->ts),
                                      .cache_rows = t->cache_rows,
                                      .trainers = t->trainers,
                                      .rank = rank};
  if ((rc = orc_create(cfg, NULL, &t->orc, err, err_len)) != 0) goto fail;
  if ((rc = trainer_join_init(t, err, err_len)) != 0) goto fail;
  trainer_exec_metrics(t, reg);
  *out = t;
  return 0;
fail:
  trainer_destroy(t);
  return rc;
}

void trainer_destroy(trainer_t *t) {
  if (!t) return;
  trainer_join_close(t);
  orc_destroy(t->orc);
  embc_destroy(t->embc);
  free(t->emb_cluster);
  trainer_rows_destroy(t->local);
  trainer_step_destroy(t->ts);
  table_layout_close(&t->layout);
  if (t->have_schema) data_schema_close(&t->schema);
  trainer_eval_close(t);
  trainer_exec_close(t);
  free(t->save_dense);
  trainer_kmap_destroy(t->kmap);
  trainer_partition_close(&t->partition);
  trainer_pipeline_close(t);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

int trainer_save_dense_to(trainer_t *t, const char *path) {
  free(t->save_dense);
  t->save_dense = path ? strdup(path) : NULL;
  return path && !t->save_dense ? -ENOMEM : 0;
}

void trainer_stop(trainer_t *t, const char *why) {
  pthread_mutex_lock(&t->mu);
  if (!atomic_exchange(&t->stop, 1)) {
    snprintf(t->stop_why, sizeof t->stop_why, "%s", why ? why : "stop requested");
    log_info("stopping rank=%u reason=\"%s\"", t->rank, t->stop_why);
  }
  if (t->stream) rpc_stream_cancel(t->stream);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  /* calls retrying an embedding server or an oracle that is gone (stopped
   * with the cluster) give up: the job resumes from its last checkpoint
   * anyway (a Join retried for 30 s held the exit past its 10 s) */
  embc_abort(t->embc);
  orc_abort(t->orc);
  orc_abort(t->join.hb_orc);
  trainer_pipeline_wake(t);
}

/* ------------------------------------------------------------------ the Work stream */

static int open_stream(trainer_t *t, char *err, size_t err_len) {
  rpc_stream_t *s = NULL;
  int rc = orc_work_open(t->orc, t->rank, 0, &s, err, err_len);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  t->stream = s;
  if (trainer_stopping(t)) rpc_stream_cancel(s);
  pthread_mutex_unlock(&t->mu);
  return 0;
}

/* Cancels t->stream unless t->drained is set within DRAIN_MS: a guard
 * around the final drain of the Work stream, so that an oracle that never
 * ends it cannot keep the trainer from exiting. */
#define DRAIN_MS 5000
static void *drain_guard(void *arg) {
  proc_name_thread("trainer-drain");
  trainer_t *t = arg;
  struct timespec ts = clock_deadline_rt(DRAIN_MS / 1000 * 1000);
  pthread_mutex_lock(&t->mu);
  while (!t->drained) {
    if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
      log_warn("the oracle did not end the Work stream within %d ms of StopWork; cancelling it", DRAIN_MS);
      if (t->stream) rpc_stream_cancel(t->stream);
      break;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void close_stream(trainer_t *t, int clean) {
  if (!t->stream) return;
  trainer_pipeline_quit(t); /* a feeder waiting for a gate that will never open (the job ended) */
  if (clean) {
    /* half-close, then read to the server's end of the stream (the oracle
     * finishes it after StopWork), so that it sees a clean end */
    pthread_t g;
    t->drained = 0;
    int guarded = pthread_create(&g, NULL, drain_guard, t) == 0;
    rpc_stream_writes_done(t->stream);
    trainer_pipeline_drain(t);
    rpc_status_t st;
    rpc_stream_finish(t->stream, &st);
    pthread_mutex_lock(&t->mu);
    t->drained = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (guarded) pthread_join(g, NULL);
  } else {
    rpc_stream_cancel(t->stream);
    trainer_pipeline_join_feeder(t);
  }
  pthread_mutex_lock(&t->mu);
  rpc_stream_t *s = t->stream;
  t->stream = NULL;
  pthread_mutex_unlock(&t->mu);
  rpc_stream_destroy(s);
}

/* ------------------------------------------------------------------ what runs next */

/* A StopWork that says the job failed (another daemon's failure). */
static void note_stop(trainer_t *t, const trainer_work_stop_t *sw) {
  snprintf(t->job_state, sizeof t->job_state, "%s", sw->job_state);
  if (!strcmp(sw->job_state, "failed")) {
    t->job_failed = 1;
    snprintf(t->job_msg, sizeof t->job_msg, "%s", sw->reason);
  }
}

/* After a failed write (the oracle ended the stream while this trainer was
 * busy): 1 if a StopWork is among the items still buffered, i.e. the
 * oracle stopped the job on purpose (its Stop RPC, SIGTERM, another
 * trainer's failure), and the trainer should stop cleanly. */
static int stop_pending(trainer_t *t, uint64_t done) {
  trainer_item_t *it;
  /* a feeder waiting for a gate that will never open does not read the
   * StopWork behind it: it gives up first.  If the StopWork was not read,
   * the caller leaves the generation, and Join's answer says what the job
   * is (stopped, done, failed: exit; recovering: the next generation). */
  trainer_pipeline_quit(t);
  if (!trainer_pipeline_find_stop(t, &it)) return 0;
  note_stop(t, &it->work.stop);
  log_info("StopWork from the oracle while iteration %" PRIu64 " was running (its report was not delivered) "
           "rank=%u reason=\"%s\"",
           done, t->rank, it->work.stop.reason);
  trainer_pipeline_release(it);
  return 1;
}

/* One Step with the cache (every mode but ideal), its rows prefetched into
 * their slots by the feeder.  *itp goes to the background (NULL after). */
static int step_cache(trainer_t *t, trainer_item_t **itp, uint64_t expect, double t_wait, double t_pf, char *err,
                      size_t err_len) {
  trainer_exec_step_t s;
  char why[768] = "";
  int rc;
  /* a. forward over the cached rows */
  if ((rc = trainer_exec_forward(t, &(*itp)->work, expect, t_wait, t_pf, &s, err, err_len)) != 0) return rc;
  /* b. the background work of x - 1 must be over before x's dense
   * all-reduce starts (it is what tells every trainer that x - 1 is done
   * everywhere) and before x's critical rows are synchronized */
  if ((rc = trainer_pipeline_bg_wait(t, &s.c.sync_wait, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "%s", why);
  /* c. backward, the dense all-reduce overlapped with it */
  if ((rc = trainer_exec_backward(t, &s, err, err_len)) != 0) return rc;
  trainer_pipeline_gate_advance(t, s.iteration); /* every trainer finished x - 1: prefetches gated on it may go */
  /* d. critical rows: synchronized before x + 1 starts */
  if ((rc = trainer_exec_sync_critical(t, &s, err, err_len)) != 0) return rc;
  /* e. updates and ownership, the delayed rows' gradients packed for the
   * background */
  float *delayed_grads;
  if (trainer_pipeline_bg_reserve(t, &(*itp)->work, &delayed_grads) != 0)
    return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory for the background work", s.iteration);
  if ((rc = trainer_exec_update(t, &s, delayed_grads, err, err_len)) != 0) return rc;
  /* f. the rest of x to the background: delayed rows, write-backs, then
   * its evictions; the last step's write-backs are durable before its
   * Report: the digest the job computes next must see them */
  trainer_pipeline_bg_submit(t, *itp);
  *itp = NULL;
  if (s.iteration + 1 == t->iterations && (rc = trainer_pipeline_bg_wait(t, &s.c.sync_wait, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "%s", why);
  size_t n_partitioned; /* and so are the partitioned tables' rows */
  if (s.iteration + 1 == t->iterations && t->partition.placed) {
    double t0 = clock_mono_s();
    if ((rc = trainer_partition_flush(&t->partition, t->embc, s.iteration + 1, &n_partitioned, err, err_len)) != 0)
      return rc;
    log_info("partitioned tables: rank %u wrote back %zu rows at the end in %.1f ms (%" PRIu64
             " more during the last iterations)",
             t->rank, n_partitioned, 1e3 * (clock_mono_s() - t0),
             t->partition.rows_retired /* (read after the flush's drain: the writer is idle) */);
  }
  /* g. report */
  return trainer_exec_report(t, &s, err, err_len);
}

static int step_ideal(trainer_t *t, const trainer_work_t *w, uint64_t expect, double t_wait, char *err,
                      size_t err_len) {
  trainer_exec_step_t s;
  int rc = trainer_exec_step_ideal(t, w, expect, t_wait, &s, err, err_len);
  return rc ? rc : trainer_exec_report(t, &s, err, err_len);
}

static int eval(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len) {
  char why[768] = "";
  int rc = 0;
  /* the model as it is after the iteration just trained: this trainer's
   * background work, then every trainer's (the sync's barrier: their
   * write-backs are then durable) */
  if (!t->ideal) rc = trainer_pipeline_bg_wait(t, NULL, why, sizeof why);
  if (!rc) rc = trainer_eval_sync(t, w, why, sizeof why);
  if (rc) return err_set(err, err_len, rc, "eval round %" PRIu64 ": %s", w->eval.round, why);
  if (!t->ideal) /* the barrier also says every trainer finished the iterations so far */
    trainer_pipeline_gate_advance(t, atomic_load(&t->exec.last_done));
  return trainer_eval_answer(t, w, err, err_len);
}

static int serve(trainer_t *t, int *got_stop, char *err, size_t err_len) {
  uint64_t expect = 0;
  for (;;) {
    trainer_item_t *it = NULL;
    double t0 = clock_mono_s(), t_pf = 0;
    char why[1024] = "";
    int rc;
    /* the next item; when the feeder waits for the gate of the very Step
     * needed next (L = 0), this thread opens it: its background, a barrier */
    while ((rc = trainer_pipeline_next(t, expect, t0, &it, &t_pf, why, sizeof why)) == TRAINER_PIPELINE_GATE)
      if ((rc = trainer_pipeline_gate_open(t, expect, why, sizeof why)) != 0) break;
    double t_wait = clock_mono_s() - t0;
    if (rc == TRAINER_PIPELINE_END) {
      if (expect >= t->iterations) { /* every step done: as good as StopWork */
        *got_stop = 1;
        return 0;
      }
      return err_set(err, err_len, ERR_UNAVAILABLE,
                     "the oracle at %s ended the Work stream before iteration %" PRIu64 " without StopWork",
                     orc_address(t->orc), expect);
    }
    if (rc < 0) return err_set(err, err_len, rc, "waiting for iteration %" PRIu64 ": %s", expect, why);
    trainer_work_t *w = &it->work;
    if (expect == 0 && w->kind == TRAINER_WORK_STEP)
      log_info("first Step rank=%u waited_ms=%.1f (the job's start at the oracle: planning, lookahead = auto's "
               "probe, the first decisions; counted as iteration 0's wait) rows_ms=%.1f (its fetch)",
               t->rank, 1e3 * (t_wait - t_pf), 1e3 * t_pf);
    if (it->rc) { /* it failed its checks on arrival */
      rc = err_set(err, err_len, it->rc, "%s", it->err);
    } else if (w->kind == TRAINER_WORK_STEP) {
      /* this run's write epoch: x's write-backs (in the background too) carry it */
      if (!t->ideal) embc_set_write_epoch(t->embc, w->step.write_epoch);
      rc = t->ideal ? step_ideal(t, w, expect, t_wait, err, err_len)
                    : step_cache(t, &it, expect, t_wait, t_pf, err, err_len);
      if (!rc) expect++;
    } else if (w->kind == TRAINER_WORK_EVAL) {
      rc = eval(t, w, err, err_len);
    } else if (w->kind == TRAINER_WORK_CHECKPOINT) {
      /* the model after the iteration just trained: this trainer's
       * background work (delayed rows, write-backs) first */
      if (!t->ideal) rc = trainer_pipeline_bg_wait(t, NULL, why, sizeof why);
      if (rc) rc = err_set(err, err_len, rc, "checkpoint %s: %s", w->checkpoint.id, why);
      else rc = trainer_ckpt_take(t, w, err, err_len);
    } else if (w->kind == TRAINER_WORK_RESUME) {
      if (!t->ideal) embc_set_write_epoch(t->embc, w->resume.write_epoch);
      rc = trainer_ckpt_resume(t, w, &expect, err, err_len);
    } else { /* TRAINER_WORK_STOP */
      log_info("StopWork from the oracle rank=%u iterations_done=%" PRIu64 " job_state=%s reason=\"%s\"", t->rank,
               expect, *w->stop.job_state ? w->stop.job_state : "?", w->stop.reason);
      note_stop(t, &w->stop);
      *got_stop = 1;
    }
    trainer_pipeline_release(it);
    if (rc && t->write_failed && stop_pending(t, expect)) {
      *got_stop = 1;
      rc = 0;
    }
    if (rc || *got_stop) return rc;
  }
}

/* ------------------------------------------------------------------ failover */

void trainer_abort_generation(trainer_t *t, const char *why) {
  pthread_mutex_lock(&t->mu);
  if (!atomic_exchange(&t->abort_gen, 1)) {
    snprintf(t->abort_why, sizeof t->abort_why, "%s", why);
    log_warn("leaving this generation of the job rank=%u reason=\"%s\"", t->rank, why);
  }
  if (t->stream) rpc_stream_cancel(t->stream);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  embc_abort(t->embc);
  trainer_pipeline_wake(t);
}

/* Errors that another generation cannot cure: this process exits (1, and
 * systemd or chanter local restarts it only if that may help). */
static int fatal(int rc) { return rc == ERR_CONFIG || rc == ERR_BADMSG || rc == ERR_LAYOUT || rc == -ENOMEM; }

/* The model and the cache as a new process has them: a recovered job goes
 * on from a checkpoint's dense state (ResumeWork) or from the start, with
 * empty caches, and every trainer must begin from the same bits. */
static int rebuild(trainer_t *t, char *err, size_t err_len) {
  trainer_partition_reset(&t->partition); /* the partitioned rows: read again from the (rolled back) servers */
  trainer_step_destroy(t->ts);
  t->ts = NULL;
  int rc = trainer_step_create(t->cfg, &t->schema, &t->layout, (uint32_t)cfg_int(t->cfg, "batch_size"), &t->ts, err,
                               err_len);
  if (rc) return rc;
  if (t->ideal) {
    trainer_rows_destroy(t->local);
    t->local = NULL;
    if ((rc = trainer_rows_create(&t->layout, &t->local)) != 0)
      return err_set(err, err_len, rc, "cannot create the local row store: %s", err_str(rc));
  } else {
    if ((rc = trainer_step_cache_init(t->ts, t->cache_rows, err, err_len)) != 0) return rc;
    trainer_kmap_destroy(t->kmap);
    t->kmap = NULL;
    if ((rc = trainer_kmap_create(t->cache_rows, &t->kmap)) != 0)
      return err_set(err, err_len, rc, "out of memory for the map of %" PRIu64 " cache slots", t->cache_rows);
  }
  atomic_store(&t->exec.last_done, 0);
  return 0;
}

/* Leaves this generation: the stream, the pipeline's threads, the group;
 * then a fresh model and cache for the next one. */
static int leave_generation(trainer_t *t, char *err, size_t err_len) {
  trainer_abort_generation(t, "the job recovers");
  close_stream(t, 0);
  trainer_pipeline_stop_bg(t);
  trainer_partition_writer_stop(&t->partition); /* while embc is aborted: a write to a lost server gives up */
  trainer_join_group_close(t);
  trainer_pipeline_reset(t);
  pthread_mutex_lock(&t->mu);
  t->write_failed = t->job_failed = 0;
  t->job_msg[0] = 0;
  atomic_store(&t->abort_gen, 0);
  pthread_mutex_unlock(&t->mu);
  embc_unabort(t->embc);
  if (trainer_stopping(t)) embc_abort(t->embc); /* a stop that came meanwhile stays */
  return rebuild(t, err, err_len);
}

/* chanter scale changed the job's trainer count (Join said so): this
 * trainer's configuration says so from now on, and what is sized by the
 * count is made again (the model and cache are rebuilt as every new
 * generation's are).  0 or an error with err. */
static int rescale(trainer_t *t, char *err, size_t err_len) {
  uint32_t n = t->scale_to, was = t->trainers;
  char kv[64];
  t->scale_to = 0;
  snprintf(kv, sizeof kv, "trainers=%u", n);
  int rc = cfg_set(t->cfg, kv, "chanter scale (the oracle's Join answer)", err, err_len);
  if (rc) return rc;
  trainer_partition_close(&t->partition);
  if ((rc = trainer_partition_init(&t->partition, t->cfg, &t->schema, &t->layout, t->rank, t->ideal, err, err_len)))
    return rc;
  t->trainers = t->limits.trainers = n;
  log_info("the job was scaled from %u to %u trainers; rank %u goes on in the new group without restarting", was, n,
           t->rank);
  return 0;
}

/* chanter scale --embedding-servers (Join said so): the configuration
 * names the new servers from now on, and the client of the servers is
 * made again for them (no thread uses it between two generations). */
static int reroute(trainer_t *t, char *err, size_t err_len) {
  uint32_t n = t->emb_to, was = embc_servers(t->embc);
  char kv[64], *cl = malloc(strlen(t->emb_cluster) + 32);
  if (!cl) return -ENOMEM;
  snprintf(kv, sizeof kv, "embedding_servers=%u", n);
  sprintf(cl, "cluster.embedding=%s", t->emb_cluster);
  const char *why = "chanter scale (the oracle's Join answer)";
  int rc = cfg_set(t->cfg, kv, why, err, err_len);
  if (!rc) rc = cfg_set(t->cfg, cl, why, err, err_len);
  free(cl);
  embc_t *c = NULL;
  if (!rc) rc = embc_create(t->cfg, &c, err, err_len);
  if (rc) return rc;
  embc_destroy(t->embc);
  t->embc = c;
  if (trainer_stopping(t)) embc_abort(t->embc);
  t->emb_to = 0;
  free(t->emb_cluster);
  t->emb_cluster = NULL;
  log_info("the job's embedding servers went from %u to %u; rank %u goes on with them without restarting", was, n,
           t->rank);
  return 0;
}

/* One generation: join (again), the group, the stream, serve.  *recover
 * says the job goes on in another generation (StopWork "recovering", or
 * this one broke for a reason a new one may cure). */
static int generation(trainer_t *t, int *got_stop, int *recover, char *err, size_t err_len) {
  int rc;
  *recover = 0;
  if ((rc = trainer_join_oracle(t, t->rejoins > 0, err, err_len)) != 0) return rc;
  if (t->scaled_out) { /* as good as StopWork: this rank's work ended */
    *got_stop = 1;
    return 0;
  }
  if (t->scale_to && (rc = rescale(t, err, err_len)) != 0) return rc;
  if (t->emb_to && (rc = reroute(t, err, err_len)) != 0) return rc;
  if (!t->join.hb_running) trainer_join_heartbeat_start(t);
  if (trainer_stopping(t)) return 0;
  if (trainer_join_over(t)) { /* rejoined a job that ended meanwhile */
    *got_stop = 1;
    if (!strcmp(t->job_state, "failed")) {
      t->job_failed = 1;
      snprintf(t->job_msg, sizeof t->job_msg, "the job failed while this trainer was rejoining it");
    }
    return 0;
  }
  if ((rc = trainer_join_group_form(t, err, err_len)) == 0 && !trainer_stopping(t) &&
      (rc = open_stream(t, err, err_len)) == 0) {
    if ((rc = trainer_pipeline_start(t)) != 0) return err_set(err, err_len, rc, "cannot start the feeder / background threads");
    sdn_status("training (rank %u of %u%s)", t->rank, t->trainers, t->rejoins ? ", rejoined after a recovery" : "");
    rc = serve(t, got_stop, err, err_len);
  }
  if (trainer_stopping(t)) return rc;
  if (!rc && *got_stop && !strcmp(t->job_state, "recovering")) {
    *got_stop = 0;
    *recover = 1;
  } else if (rc && !fatal(rc)) {
    /* a half-close says "this trainer leaves": the oracle names the peer
     * whose loss made the step fail, if it sees one */
    pthread_mutex_lock(&t->mu);
    rpc_stream_t *s = t->stream;
    pthread_mutex_unlock(&t->mu);
    if (s) rpc_stream_writes_done(s);
    log_warn("this generation of the job broke rank=%u: %s; the oracle recovers the job (it rolls back to the last "
             "complete checkpoint), and this trainer joins again",
             t->rank, err[0] ? err : err_str(rc));
    rc = 0;
    *recover = 1;
  }
  return rc;
}

int trainer_run(trainer_t *t) {
  char err[2048] = "";
  int rc, got_stop = 0, recover = 0;
  for (;;) {
    err[0] = 0;
    got_stop = 0;
    rc = generation(t, &got_stop, &recover, err, sizeof err);
    if (rc || !recover || trainer_stopping(t)) break;
    if ((rc = leave_generation(t, err, sizeof err)) != 0) break;
    t->rejoins++;
    sdn_status("rejoining the job after a recovery (rank %u)", t->rank);
  }
  if (rc && trainer_stopping(t)) {
    log_info("stopped rank=%u while %s", t->rank, err[0] ? err : err_str(rc));
    rc = 0;
  } else if (rc) {
    log_error("trainer failed rank=%u: %s", t->rank, err[0] ? err : err_str(rc));
  }
  if (!t->ideal && !rc) { /* the background work of the last step (normally waited for already) */
    char why[768] = "";
    int brc = trainer_pipeline_bg_wait(t, NULL, why, sizeof why);
    if (brc && trainer_stopping(t)) log_info("stopped rank=%u while %s", t->rank, why);
    else if (brc) log_error("trainer failed rank=%u: %s", t->rank, why);
    if (brc && !trainer_stopping(t)) rc = brc;
  }
  close_stream(t, got_stop && !rc);
  trainer_pipeline_stop_bg(t);
  /* stop the heartbeat thread (trainer_stop also wakes it) */
  pthread_mutex_lock(&t->mu);
  atomic_store(&t->stop, 1);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  trainer_join_heartbeat_stop(t);
  trainer_join_group_close(t);
  if (!rc && t->scaled_out) {
    log_info("the job was scaled to %u trainers: rank %u is not in it any more; exiting", t->scale_to, t->rank);
  } else if (!rc && got_stop && t->job_failed) {
    log_error("the job failed elsewhere rank=%u iterations_done=%llu why=\"%s\" (this trainer is fine; see the "
              "oracle's log)",
              t->rank, (unsigned long long)atomic_load(&t->exec.last_done), t->job_msg);
    rc = TRAINER_JOB_FAILED;
  } else if (!rc && got_stop) {
    unsigned long long done = atomic_load(&t->exec.last_done);
    if (done == t->iterations)
      log_info("finished rank=%u iterations=%llu", t->rank, done);
    else
      log_warn("the oracle stopped the job early rank=%u iterations_done=%llu of %llu", t->rank, done,
               (unsigned long long)t->iterations);
  }
  return rc;
}
