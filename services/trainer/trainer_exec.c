/*
 * trainer_exec: the phases of a training step and its Report (see
 * trainer_exec.h for the order the conductor runs them in).  Reads the
 * decoded Step only -- its lists were checked when it arrived -- and
 * drives trainer_step.h's math, the group's all-reduces and allgather,
 * the key map, and the Work stream's write side.  Never waits for the
 * pipeline's threads: the conductor does that between the phases.
 */
#include "trainer_exec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "log.h"
#include "sdn.h"
#include "trainer_state.h"

/* A progress line every LOG_EVERY iterations (and the first and last). */
#define LOG_EVERY 100

void trainer_exec_metrics(trainer_t *t, metrics_registry_t *reg) {
  trainer_metrics_t *m = &t->m;
  if (!reg) return;
  m->iter = metrics_gauge(reg, "iteration", NULL, "last training iteration finished by this trainer");
  m->loss = metrics_gauge(reg, "loss", NULL, "mean BCE loss of this trainer's samples in the last iteration");
  m->step = metrics_histogram(reg, "step_seconds", NULL, "seconds per training iteration (Step received to Report)",
                              metrics_latency_bounds, metrics_latency_n);
  m->fetched = metrics_counter(reg, "rows_fetched_total", NULL, "embedding rows fetched for training steps");
  m->synced =
      metrics_counter(reg, "rows_synced_total", NULL, "shared embedding rows whose gradients were all-reduced");
  m->written = metrics_counter(reg, "rows_written_back_total", NULL, "embedding rows written back");
  m->hits = metrics_counter(reg, "cache_hits_total", NULL,
                            "distinct rows of a step's samples already in the cache (not fetched for it)");
  m->replicated = metrics_counter(reg, "rows_replicated_total", NULL,
                                  "of the rows synchronized, owned rows handed to every trainer");
  m->delayed = metrics_counter(reg, "rows_synced_delayed_total", NULL,
                               "shared rows synchronized in the background, overlapped with the next step");
  m->samples = metrics_counter(reg, "samples_total", NULL, "training samples processed by this trainer");
  m->evals = metrics_counter(reg, "eval_items_total", NULL, "evaluation items answered");
  for (int p = 0; p < PHASE_N_STEP; p++) {
    char lab[64];
    snprintf(lab, sizeof lab, "phase=\"%s\"", phase_name(p));
    m->phase[p] = metrics_gauge(reg, "last_phase_seconds", lab, "seconds of each phase in the last iteration");
  }
}

void trainer_exec_close(trainer_t *t) {
  free(t->exec.crit_buf);
  t->exec.crit_buf = NULL;
  t->exec.cap_crit = 0;
}

/* ------------------------------------------------------------------ the report */

/* Writes the dense parameters to path (fsio_replace: a reader sees the old
 * file or the whole new one). */
static int save_dense(trainer_t *t, const char *path) {
  return fsio_replace(path, trainer_step_params(t->ts), trainer_step_n_params(t->ts) * sizeof(float), 0644, NULL, 0);
}

int trainer_exec_report(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len) {
  uint64_t x = s->iteration;
  uint32_t n = s->n;
  double *ph = s->ph;
  const trainer_exec_counts_t *c = &s->c;
  if (s->cache) { /* f. ends here: the hand-off to the background (and, after the last step, its wait) */
    double t6 = clock_mono_s();
    ph[PHASE_WRITE_BACK] = t6 - s->t_end;
    ph[PHASE_TOTAL] = s->t_wait + (t6 - s->t0);
  }
  char why[600];
  int rc = trainer_step_device_status(t->ts, why, sizeof why);
  if (rc) /* a GPU failure in this step (or in the background work before it): not reported as done */
    return err_set(err, err_len, rc, "iteration %" PRIu64 " on the GPU: %s", x, why);
  Chanter__Oracle__V1__Report r = CHANTER__ORACLE__V1__REPORT__INIT;
  r.iteration = x;
  r.loss_sum = s->loss;
  r.samples = n;
  r.rows_fetched = c->fetched;
  r.rows_synced = c->synced;
  r.rows_synced_delayed = c->synced_delayed;
  r.rows_replicated = c->replicated;
  r.rows_written_back = c->written_back;
  r.cache_hits = c->hits;
  r.t_partition_compute = c->part_compute; /* per trainer: the oracle's measured balance of the placement */
  /* the Report's t_<name> fields, from the one phase list: the step's
   * phases, then the parts of them that trainer_exec_counts_t times */
  double t_report[PHASE_N_REPORT];
  memcpy(t_report, ph, PHASE_N_STEP * sizeof *ph);
  t_report[PHASE_PREFETCH_WAIT] = c->prefetch_wait;
  t_report[PHASE_SYNC_WAIT] = c->sync_wait;
  t_report[PHASE_SYNC_CRITICAL] = c->sync_critical;
  t_report[PHASE_REPLICATE] = c->replicate;
  t_report[PHASE_ALLTOALL] = c->alltoall;
#define REPORT_T(id, name) r.t_##name = t_report[PHASE_##id];
  PHASE_REPORT_LIST(REPORT_T)
#undef REPORT_T
  uint8_t sha[32];
  char hex[65] = "";
  if (x + 1 == t->iterations) {
    trainer_step_dense_sha256(t->ts, sha);
    r.dense_sha256.data = sha;
    r.dense_sha256.len = 32;
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    if (t->save_dense && (rc = save_dense(t, t->save_dense)) != 0)
      log_warn("cannot save the dense parameters path=%s err=\"%s\"", t->save_dense, err_str(rc));
    else if (t->save_dense)
      log_info("dense parameters saved path=%s floats=%zu", t->save_dense, trainer_step_n_params(t->ts));
  }
  if ((rc = orc_work_report(t->stream, &r)) != 0 && (t->write_failed = 1))
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": cannot send the Report to the oracle at %s: %s", x,
                   orc_address(t->orc), err_str(rc));
  atomic_store(&t->exec.last_done, x + 1);

  trainer_metrics_t *m = &t->m;
  metrics_gauge_set(m->iter, (double)x);
  if (n) metrics_gauge_set(m->loss, s->loss / n);
  metrics_hist_observe(m->step, ph[PHASE_TOTAL] - ph[PHASE_WAIT]);
  metrics_counter_add(m->fetched, c->fetched);
  metrics_counter_add(m->synced, c->synced);
  metrics_counter_add(m->written, c->written_back);
  metrics_counter_add(m->hits, c->hits);
  metrics_counter_add(m->delayed, c->synced_delayed);
  metrics_counter_add(m->replicated, c->replicated);
  metrics_counter_add(m->samples, n);
  for (int p = 0; p < PHASE_N_STEP; p++) metrics_gauge_set(m->phase[p], ph[p]);
  if (x == 0 || (x + 1) % LOG_EVERY == 0 || x + 1 == t->iterations) {
    log_info("progress rank=%u iteration=%" PRIu64 " done=%" PRIu64 "/%" PRIu64
             " samples=%u loss=%.5f lookahead=%u rows_fetched=%zu cache_hits=%zu rows_synced=%zu delayed=%zu"
             " rows_written_back=%zu wait_ms=%.2f fetch_ms=%.2f forward_ms=%.2f sync_wait_ms=%.2f backward_ms=%.2f"
             " allreduce_ms=%.2f dense_comm_ms=%.2f update_ms=%.2f write_back_ms=%.2f total_ms=%.2f%s%s",
             t->rank, x, x + 1, t->iterations, n, n ? s->loss / n : 0.0, c->lookahead, c->fetched, c->hits,
             c->synced, c->synced_delayed, c->written_back, 1e3 * ph[PHASE_WAIT], 1e3 * ph[PHASE_FETCH],
             1e3 * ph[PHASE_FORWARD], 1e3 * c->sync_wait, 1e3 * ph[PHASE_BACKWARD], 1e3 * ph[PHASE_ALLREDUCE],
             1e3 * c->dense_comm, 1e3 * ph[PHASE_UPDATE], 1e3 * ph[PHASE_WRITE_BACK], 1e3 * ph[PHASE_TOTAL],
             hex[0] ? " dense_sha256=" : "", hex);
    sdn_status("training: iteration %" PRIu64 "/%" PRIu64 " (rank %u of %u)", x + 1, t->iterations, t->rank,
               t->trainers);
  }
  return 0;
}

/* ------------------------------------------------------------------ shared pieces */

/* The Step must be the iteration that comes next. */
static int check_next(uint64_t x, uint64_t expect, char *err, size_t err_len) {
  if (x != expect)
    return err_set(err, err_len, ERR_BADMSG, "the oracle sent Step %" PRIu64 " but iteration %" PRIu64 " was next", x,
                   expect);
  return 0;
}

/* The end of the dense all-reduce that started inside the backward
 * (trainer_ar.h); *t_comm: its own time.
 * device = cuda: the gradients stay on the GPU after the backward, and
 * trainer_ar reduces the host array it was given when the group formed,
 * so they come to it first and the sums go back after, before the
 * optimizer step (trainer_step_grads_fetch / _changed; no-ops on the CPU
 * and when the collective works on device memory).  Nothing was handed
 * to the group before this point on the GPU: the backward's grad-ready
 * hook, which starts buckets early, is the CPU model's only
 * (trainer_join_group_form).  One trainer: the sum is the array itself,
 * nothing to move. */
static int dense_finish(trainer_t *t, uint64_t x, double *t_comm, char *err, size_t err_len) {
  int move = t->trainers > 1, rc;
  if (move && (rc = trainer_step_grads_fetch(t->ts)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": copying the dense gradients from the GPU failed: %s", x,
                   err_str(rc));
  rc = trainer_ar_finish(t->join.dense_ar, t_comm);
  if (rc)
    return err_set(err, err_len, rc,
                   "iteration %" PRIu64 ": dense all-reduce of %zu floats among %u trainers failed: %s "
                   "(a peer trainer died or is unreachable; see the collective's log line)",
                   x, trainer_step_n_params(t->ts), t->trainers, err_str(rc));
  if (move && (rc = trainer_step_grads_changed(t->ts)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": copying the reduced dense gradients to the GPU failed: %s",
                   x, err_str(rc));
  return 0;
}

static void step_begin(const trainer_work_t *w, double t_wait, int cache, trainer_exec_step_t *s) {
  memset(s, 0, sizeof *s);
  s->w = w;
  s->iteration = w->step.iteration;
  s->n = w->batch.n;
  s->cache = cache;
  s->t_wait = t_wait;
  s->ph[PHASE_WAIT] = t_wait;
  s->t0 = clock_mono_s();
}

/* ------------------------------------------------------------------ mode = ideal */

int trainer_exec_step_ideal(trainer_t *t, const trainer_work_t *w, uint64_t expect, double t_wait,
                            trainer_exec_step_t *s, char *err, size_t err_len) {
  step_begin(w, t_wait, 0, s);
  uint64_t x = s->iteration;
  const data_batch_t *b = &w->batch;
  double *ph = s->ph, t0 = s->t0;
  char why[768] = "";
  int rc = check_next(x, expect, err, err_len);
  if (rc) return rc;

  /* a. rows: this batch's own, from the local store */
  size_t n_fetch;
  const uint64_t *fkeys;
  if ((rc = trainer_step_batch_keys(t->ts, b, &fkeys, &n_fetch)) != 0) return rc;
  if ((rc = trainer_rows_fetch(t->local, t->ts, fkeys, n_fetch, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": fetch of %zu rows failed: %s", x, n_fetch, why);
  double t1 = clock_mono_s();

  /* b. forward, backward; c. the dense all-reduce starts inside the
   * backward (trainer_ar.h) and ends after it; no row is synchronized */
  if ((rc = trainer_step_forward(t->ts, b, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": %s", x, why);
  double t2 = clock_mono_s();
  trainer_ar_begin(t->join.dense_ar, x);
  s->loss = trainer_step_backward(t->ts, b, w->step.global_batch_size ? w->step.global_batch_size : 1);
  double t3 = clock_mono_s();
  if ((rc = dense_finish(t, x, &s->c.dense_comm, err, err_len)) != 0) return rc;
  double t4 = clock_mono_s();

  /* d. update; e. the rows back to the local store */
  trainer_step_update(t->ts);
  double t5 = clock_mono_s();
  size_t n_write_back = trainer_step_n_keys(t->ts);
  if ((rc = trainer_rows_scatter(t->local, trainer_step_keys(t->ts), n_write_back, trainer_step_key_rows(t->ts), why,
                                  sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": local rows: %s", x, why);
  double t6 = clock_mono_s();

  ph[PHASE_FETCH] = t1 - t0;
  ph[PHASE_FORWARD] = t2 - t1;
  ph[PHASE_BACKWARD] = t3 - t2;
  ph[PHASE_ALLREDUCE] = t4 - t3;
  ph[PHASE_UPDATE] = t5 - t4;
  ph[PHASE_WRITE_BACK] = t6 - t5;
  ph[PHASE_TOTAL] = t_wait + (t6 - t0);
  /* f. the report: no embedding traffic */
  return 0;
}

/* ------------------------------------------------------------------ the cache path */

int trainer_exec_forward(trainer_t *t, const trainer_work_t *w, uint64_t expect, double t_wait, double t_prefetch,
                         trainer_exec_step_t *s, char *err, size_t err_len) {
  step_begin(w, t_wait, 1, s);
  s->c.lookahead = w->step.lookahead;
  s->c.prefetch_wait = t_prefetch;
  s->ph[PHASE_WAIT] = t_wait - t_prefetch;
  s->ph[PHASE_FETCH] = t_prefetch; /* the part of the wait spent on this step's own rows */
  char why[768] = "";
  int rc = check_next(s->iteration, expect, err, err_len);
  if (rc) return rc;
  /* the partitioned tables' pooled embeddings first: the model's input */
  double ta = clock_mono_s();
  if ((rc = trainer_partition_forward(&t->partition, t->ts, t->join.pcoll, &w->step, &w->batch, err, err_len)) != 0) return rc;
  s->c.alltoall = clock_mono_s() - ta;
  if ((rc = trainer_step_cache_forward(t->ts, &w->batch, w->step.slots, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": %s", s->iteration, why);
  s->t_end = clock_mono_s();
  s->ph[PHASE_FORWARD] = s->t_end - s->t0;
  return 0;
}

int trainer_exec_backward(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len) {
  const trainer_work_step_t *st = &s->w->step;
  for (size_t i = 0; i < st->n_fetch; i++) /* x's rows are cached now: the key map learns them */
    if (trainer_kmap_set(t->kmap, st->fetch_slots[i], st->fetch_keys[i]) != 0)
      return err_set(err, err_len, -ENOMEM, "out of memory in the key map");
  double t2 = clock_mono_s();
  trainer_ar_begin(t->join.dense_ar, s->iteration);
  s->loss = trainer_step_backward(t->ts, &s->w->batch, st->global_batch_size ? st->global_batch_size : 1);
  /* the partitioned tables' gradients to their owners (another group:
   * overlapped with the dense all-reduce's thread), folded and applied */
  double ta = clock_mono_s();
  int rc = trainer_partition_backward(&t->partition, t->ts, t->join.pcoll, st, &s->w->batch, &s->c.part_updated, err, err_len);
  double t3 = clock_mono_s();
  s->c.alltoall += t3 - ta;
  s->c.part_compute = t->partition.t_compute;
  s->ph[PHASE_BACKWARD] = t3 - t2;
  s->t_end = t3;
  if (rc) return rc;
  return dense_finish(t, s->iteration, &s->c.dense_comm, err, err_len);
}

int trainer_exec_sync_critical(trainer_t *t, trainer_exec_step_t *s, char *err, size_t err_len) {
  const trainer_work_step_t *st = &s->w->step;
  trainer_exec_t *e = &t->exec;
  size_t n_crit = st->n_critical;
  uint32_t dim = trainer_step_dim(t->ts);
  double tc0 = clock_mono_s();
  if (n_crit) {
    if (trainer_grow((void **)&e->crit_buf, &e->cap_crit, n_crit * dim, sizeof(float))) return -ENOMEM;
    trainer_step_cache_pack(t->ts, st->sync_critical, n_crit, e->crit_buf);
    int rc = trainer_sched_sum_ordered(t->join.sched, t->join.coll,
                                       trainer_sched_id(TRAINER_SCHED_NEXT, s->iteration, TRAINER_SCHED_CRITICAL),
                                       e->crit_buf, n_crit * dim);
    if (rc)
      return err_set(err, err_len, rc,
                     "iteration %" PRIu64 ": all-reduce of %zu shared rows' gradients among %u trainers failed: %s",
                     s->iteration, n_crit, t->trainers, err_str(rc));
    trainer_step_cache_unpack(t->ts, st->sync_critical, n_crit, e->crit_buf);
  }
  double t4 = clock_mono_s();
  s->ph[PHASE_ALLREDUCE] = t4 - s->t_end; /* from the backward's end: the dense all-reduce's rest too */
  s->c.sync_critical = t4 - tc0;
  s->t_end = t4;
  return 0;
}

/* Step x's ownership changes: this trainer's owned / stale marks in the key
 * map (what evaluation reads), then the replicated rows (an allgather of
 * each owner's copies; every trainer takes the owner's bytes, no
 * arithmetic, so the bits are the owner's), which every trainer holds
 * again. */
static int ownership(trainer_t *t, const trainer_work_step_t *st, uint64_t x, char *err, size_t err_len) {
  for (size_t i = 0; i < st->n_owned_slots; i++) trainer_kmap_set_owned(t->kmap, st->owned_slots[i], 1);
  for (size_t i = 0; i < st->n_stale; i++) trainer_kmap_clear(t->kmap, st->stale_slots[i]);
  size_t n = st->n_replicate;
  if (!n) return 0;
  /* Each owner sends only its own rows: grouped by owner (in list order
   * inside a group), every group padded to the largest, one allgather;
   * one gather of this trainer's rows and one scatter per other owner. */
  uint32_t rf = trainer_step_row_floats(t->ts), P = t->trainers;
  size_t *off = calloc((size_t)P + 1, sizeof *off), maxc = 0;
  size_t *fill = calloc(P, sizeof *fill);
  uint32_t *grouped = malloc(n * sizeof *grouped);
  float *mine = NULL, *all = NULL;
  int rc = 0;
  if (!off || !fill || !grouped) goto nomem;
  for (size_t i = 0; i < n; i++) off[st->replicate_owners[i] + 1]++; /* owners < P: checked on arrival */
  for (uint32_t o = 0; o < P; o++) {
    if (off[o + 1] > maxc) maxc = off[o + 1];
    off[o + 1] += off[o];
  }
  mine = calloc(maxc * rf, sizeof(float));
  all = malloc((size_t)P * maxc * rf * sizeof(float));
  if (!mine || !all) goto nomem;
  for (size_t i = 0; i < n; i++) {
    uint32_t o = st->replicate_owners[i];
    grouped[off[o] + fill[o]++] = st->replicate_slots[i];
  }
  size_t mine_n = off[t->rank + 1] - off[t->rank];
  trainer_step_cache_gather(t->ts, grouped + off[t->rank], mine_n, mine);
  if ((rc = trainer_sched_allgather(t->join.sched, t->join.coll,
                                    trainer_sched_id(TRAINER_SCHED_NEXT, x, TRAINER_SCHED_HANDOVER), mine,
                                    maxc * rf * sizeof(float), all)) != 0) {
    err_set(err, err_len, rc, "iteration %" PRIu64 ": replicating %zu owned rows among %u trainers failed: %s", x, n,
            P, err_str(rc));
    goto out;
  }
  for (uint32_t o = 0; o < P; o++)
    if (o != t->rank && off[o + 1] > off[o])
      trainer_step_cache_scatter(t->ts, grouped + off[o], off[o + 1] - off[o], all + (size_t)o * maxc * rf);
  for (size_t i = 0; i < n; i++)
    if (trainer_kmap_set(t->kmap, st->replicate_slots[i], st->replicate_keys[i]) != 0) {
      rc = err_set(err, err_len, -ENOMEM, "out of memory in the key map");
      goto out;
    }
  goto out;
nomem:
  rc = err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory replicating %zu rows", x, n);
out:
  free(off), free(grouped), free(fill), free(mine), free(all);
  return rc;
}

int trainer_exec_update(trainer_t *t, trainer_exec_step_t *s, float *delayed_grads, char *err, size_t err_len) {
  const trainer_work_step_t *st = &s->w->step;
  /* e. updates: dense, and every row with a gradient but the delayed ones
   * (their gradients are packed for the background first: x + 1's
   * backward will overwrite the step's gradients) */
  trainer_step_cache_pack(t->ts, st->sync_delayed, st->n_delayed, delayed_grads);
  trainer_step_cache_update(t->ts, st->sync_delayed, st->n_delayed);

  /* e2. ownership (LRPP): rows that another trainer uses next get their
   * owner's copy everywhere; rows taking an owner here go stale elsewhere
   * (part of the update phase) */
  double tr0 = clock_mono_s();
  int rc = ownership(t, st, s->iteration, err, err_len);
  if (rc) return rc;
  double t5 = clock_mono_s();
  s->c.replicate = t5 - tr0;
  s->ph[PHASE_UPDATE] = t5 - s->t_end;
  s->t_end = t5;

  trainer_exec_counts_t *c = &s->c;
  c->fetched = st->n_fetch;
  c->hits = st->cache_hits;
  c->synced = st->n_critical + st->n_delayed + st->n_replicate; /* replicated owned rows move too */
  c->synced_delayed = st->n_delayed;
  c->replicated = st->n_replicate;
  c->written_back = st->n_write_back;
  s->w = NULL; /* the Step may go to the background now */
  return 0;
}
