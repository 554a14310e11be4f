/*
 * trainer_pipeline: the feeder thread, the background thread and the gate
 * between them and the training thread (see trainer_pipeline.h for the
 * contract).  The feeder is the one place where the oracle's WorkItem
 * message is read: it decodes each into a trainer_work_t and frees it.
 * The training thread reaches this file only through the conductor
 * (trainer_loop.c), which decides when to wait for the background, when
 * to hand it a step, when to open or advance the gate.
 */
#include "trainer_pipeline.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "proc.h"
#include "trainer_state.h"

void trainer_pipeline_init(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->fcv, NULL);
  pthread_cond_init(&p->bcv, NULL);
  pthread_cond_init(&p->rcv, NULL);
}

/* The messages the reader holds, freed (mu held, or no thread running). */
static void drop_read(trainer_pipeline_t *p) {
  for (; p->rd_n; p->rd_n--, p->rd_head = (p->rd_head + 1) % TRAINER_READ_AHEAD)
    protobuf_c_message_free_unpacked(&p->rd_msg[p->rd_head]->base, NULL);
}

static void release_list(trainer_item_t *it) {
  while (it) {
    trainer_item_t *n = it->next;
    trainer_pipeline_release(it);
    it = n;
  }
}

void trainer_pipeline_close(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  release_list(p->head);
  p->head = p->tail = NULL;
  trainer_pipeline_release(p->bg_item);
  p->bg_item = NULL;
  free(p->pf_rows);
  free(p->bg_grad);
  free(p->bg_rows);
  trainer_sched_chunks_free(&p->bg_chunks);
  drop_read(p);
  pthread_cond_destroy(&p->rcv);
  pthread_cond_destroy(&p->bcv);
  pthread_cond_destroy(&p->fcv);
  pthread_mutex_destroy(&p->mu);
}

void trainer_pipeline_release(trainer_item_t *it) {
  if (!it) return;
  trainer_work_close(&it->work);
  free(it);
}

void trainer_pipeline_wake(trainer_t *t) {
  pthread_mutex_lock(&t->pipe.mu);
  pthread_cond_broadcast(&t->pipe.fcv);
  pthread_cond_broadcast(&t->pipe.bcv);
  pthread_mutex_unlock(&t->pipe.mu);
}

/* ------------------------------------------------------------------ the reader */

static void *reader_main(void *arg) {
  proc_name_thread("trainer-read");
  trainer_t *t = arg;
  trainer_pipeline_t *p = &t->pipe;
  for (;;) {
    Chanter__Oracle__V1__WorkItem *msg = NULL;
    int rc = orc_work_next(t->stream, &msg);
    double t_read = clock_mono_s();
    pthread_mutex_lock(&p->mu);
    if (rc) {
      p->rd_end = 1;
      p->rd_rc = rc;
      pthread_cond_broadcast(&p->rcv);
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    while (p->rd_n == TRAINER_READ_AHEAD && !p->rd_drop) pthread_cond_wait(&p->rcv, &p->mu);
    if (p->rd_drop) { /* nobody takes it: read on to the stream's end */
      pthread_mutex_unlock(&p->mu);
      protobuf_c_message_free_unpacked(&msg->base, NULL);
      continue;
    }
    unsigned k = (p->rd_head + p->rd_n++) % TRAINER_READ_AHEAD;
    p->rd_msg[k] = msg;
    p->rd_t[k] = t_read;
    pthread_cond_broadcast(&p->rcv);
    pthread_mutex_unlock(&p->mu);
  }
}

/* The feeder's next message, in stream order, and when it was read; else
 * the stream's end (orc_work_next's code: 1 when clean). */
static int next_read(trainer_pipeline_t *p, Chanter__Oracle__V1__WorkItem **msg, double *t_read) {
  pthread_mutex_lock(&p->mu);
  while (!p->rd_n && !p->rd_end) pthread_cond_wait(&p->rcv, &p->mu);
  int rc = 0;
  if (p->rd_n) {
    *msg = p->rd_msg[p->rd_head];
    *t_read = p->rd_t[p->rd_head];
    p->rd_head = (p->rd_head + 1) % TRAINER_READ_AHEAD;
    p->rd_n--;
    pthread_cond_broadcast(&p->rcv);
  } else {
    rc = p->rd_rc;
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

/* ------------------------------------------------------------------ the feeder */

/* The prefetch of one (checked) Step: wait for its gate, fetch its rows
 * into their slots. */
static int prefetch(trainer_t *t, const trainer_work_step_t *st, double *t_fetch, char *err, size_t err_len) {
  trainer_pipeline_t *p = &t->pipe;
  uint64_t x = st->iteration;
  size_t n = st->n_fetch;
  pthread_mutex_lock(&p->mu);
  if (st->prefetch_gate > p->known_done) {
    p->pf_state = 1;
    p->pf_x = x;
    p->pf_gate = st->prefetch_gate;
    pthread_cond_broadcast(&p->fcv);
    while (st->prefetch_gate > p->known_done && !trainer_halting(t) && !p->feed_quit)
      pthread_cond_wait(&p->fcv, &p->mu);
  }
  p->pf_state = 2;
  p->pf_x = x;
  int quit = p->feed_quit;
  pthread_mutex_unlock(&p->mu);
  if (trainer_halting(t) || quit)
    return err_set(err, err_len, ERR_CANCELLED, "stopped while waiting to prefetch iteration %" PRIu64, x);
  double t0 = clock_mono_s();
  if (n) {
    uint32_t rf = trainer_step_row_floats(t->ts);
    if (trainer_grow((void **)&p->pf_rows, &p->pf_cap, n * rf, sizeof(float)))
      return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory for %zu prefetched rows", x, n);
    char why[768] = "";
    int rc = embc_lookup(t->embc, st->fetch_keys, n, p->pf_rows, why, sizeof why);
    if (rc) return err_set(err, err_len, rc, "iteration %" PRIu64 ": prefetch of %zu rows failed: %s", x, n, why);
    trainer_step_cache_scatter(t->ts, st->fetch_slots, n, p->pf_rows);
  }
  *t_fetch = clock_mono_s() - t0;
  return 0;
}

static void feed_finish(trainer_t *t, int rc, const char *why) {
  trainer_pipeline_t *p = &t->pipe;
  pthread_mutex_lock(&p->mu);
  p->rd_drop = 1; /* the reader reads on to the stream's end, keeping nothing */
  drop_read(p);
  pthread_cond_broadcast(&p->rcv);
  p->feed_end = 1;
  p->feed_rc = rc;
  snprintf(p->feed_err, sizeof p->feed_err, "%s", why);
  p->pf_state = 0;
  pthread_cond_broadcast(&p->fcv);
  pthread_mutex_unlock(&p->mu);
}

static void *feeder_main(void *arg) {
  proc_name_thread("trainer-feed");
  trainer_t *t = arg;
  trainer_pipeline_t *p = &t->pipe;
  trainer_step_cache_thread(TRAINER_STEP_ROLE_PREFETCH);
  for (;;) {
    Chanter__Oracle__V1__WorkItem *msg = NULL;
    double t_arrived = 0;
    int rc = next_read(p, &msg, &t_arrived);
    if (rc) {
      char why[768];
      snprintf(why, sizeof why, "the Work stream from the oracle at %s broke: %s", orc_address(t->orc), err_str(rc));
      feed_finish(t, rc, rc == 1 ? "" : why);
      return NULL;
    }
    trainer_item_t *it = calloc(1, sizeof *it);
    if (!it) {
      protobuf_c_message_free_unpacked(&msg->base, NULL);
      feed_finish(t, -ENOMEM, "out of memory queueing a work item");
      return NULL;
    }
    it->t_arrived = t_arrived;
    /* decoded and checked here, once; nothing after this reads the message */
    it->rc = trainer_work_decode(msg, &t->limits, &it->work, it->err, sizeof it->err);
    protobuf_c_message_free_unpacked(&msg->base, NULL);
    char err[768] = "";
    if (!it->rc && !t->ideal && it->work.kind == TRAINER_WORK_STEP &&
        ((rc = trainer_partition_load(&t->partition, &it->work.step, t->embc, err, sizeof err)) != 0 ||
         (rc = prefetch(t, &it->work.step, &it->t_fetch, err, sizeof err)) != 0)) {
      trainer_pipeline_release(it);
      feed_finish(t, rc, err);
      return NULL;
    }
    int bad = it->rc;
    pthread_mutex_lock(&p->mu);
    /* a resumed job: the iterations before its start are done everywhere
     * (the Steps after it are gated on them) */
    if (!bad && it->work.kind == TRAINER_WORK_RESUME && it->work.resume.start_iteration > p->known_done)
      p->known_done = it->work.resume.start_iteration;
    if (p->tail) p->tail->next = it;
    else p->head = it;
    p->tail = it;
    p->pf_state = 0;
    pthread_cond_broadcast(&p->fcv);
    pthread_mutex_unlock(&p->mu);
    if (bad) { /* the training thread fails on it, in order; the stream is not read further */
      feed_finish(t, bad, "a malformed work item ended the feed");
      return NULL;
    }
  }
}

int trainer_pipeline_next(trainer_t *t, uint64_t expect, double t_start, trainer_item_t **out,
                          double *t_prefetch_wait, char *err, size_t err_len) {
  trainer_pipeline_t *p = &t->pipe;
  *out = NULL;
  *t_prefetch_wait = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->head) {
      trainer_item_t *it = p->head;
      p->head = it->next;
      if (!p->head) p->tail = NULL;
      it->next = NULL;
      pthread_mutex_unlock(&p->mu);
      *t_prefetch_wait = clock_mono_s() - (it->t_arrived > t_start ? it->t_arrived : t_start);
      *out = it;
      return 0;
    }
    if (p->feed_end) {
      int rc = p->feed_rc;
      if (rc != TRAINER_PIPELINE_END) err_set(err, err_len, rc, "%s", p->feed_err);
      pthread_mutex_unlock(&p->mu);
      return rc;
    }
    if (!t->ideal && p->pf_state == 1 && p->pf_x == expect && p->pf_gate > p->known_done) {
      pthread_mutex_unlock(&p->mu);
      return TRAINER_PIPELINE_GATE;
    }
    pthread_cond_wait(&p->fcv, &p->mu);
  }
}

/* ------------------------------------------------------------------ the background */

static void *bg_main(void *arg) {
  proc_name_thread("trainer-bg");
  trainer_t *t = arg;
  trainer_pipeline_t *p = &t->pipe;
  trainer_step_cache_thread(TRAINER_STEP_ROLE_BACKGROUND);
  uint32_t dim = trainer_step_dim(t->ts);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->bg_busy && !p->bg_quit) pthread_cond_wait(&p->bcv, &p->mu);
    if (!p->bg_busy) break;
    int failed = p->bg_rc != 0;
    const trainer_work_step_t *st = &p->bg_item->work.step;
    pthread_mutex_unlock(&p->mu);
    int rc = 0;
    char err[768] = "";
    uint64_t x = st->iteration;
    if (!failed && st->n_delayed) {
      /* with the scheduler, in chunks of the lowest priority: the next
       * step's AlltoAll and dense buckets go between them */
      rc = trainer_sched_chunks_submit(t->join.sched, &p->bg_chunks, TRAINER_SCHED_DELAYED, x, p->bg_grad,
                                       st->n_delayed * dim, p->chunk_floats);
      if (!rc) rc = trainer_sched_chunks_wait(t->join.sched, t->join.coll, &p->bg_chunks);
      if (rc)
        err_set(err, sizeof err, rc,
                "iteration %" PRIu64 ": all-reduce of %zu delayed rows' gradients among %u trainers failed: %s", x,
                st->n_delayed, t->trainers, err_str(rc));
      else
        trainer_step_cache_update_rows(t->ts, st->sync_delayed, st->n_delayed, p->bg_grad);
    }
    if (!failed && !rc && st->n_write_back) {
      trainer_step_cache_gather(t->ts, st->write_back_slots, st->n_write_back, p->bg_rows);
      char why[768] = "";
      if ((rc = embc_write_done(t->embc, st->write_back_keys, st->n_write_back, p->bg_rows, x + 1, why, sizeof why)) != 0)
        err_set(err, sizeof err, rc, "iteration %" PRIu64 ": write-back of %zu rows failed: %s", x,
                st->n_write_back, why);
    }
    pthread_mutex_lock(&p->mu);
    if (rc && !p->bg_rc) {
      p->bg_rc = rc;
      snprintf(p->bg_err, sizeof p->bg_err, "%s", err);
    }
    p->bg_busy = 0;
    pthread_cond_broadcast(&p->bcv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int trainer_pipeline_bg_wait(trainer_t *t, double *t_waited, char *err, size_t err_len) {
  trainer_pipeline_t *p = &t->pipe;
  double t0 = clock_mono_s();
  pthread_mutex_lock(&p->mu);
  while (p->bg_busy) pthread_cond_wait(&p->bcv, &p->mu);
  int rc = p->bg_rc;
  if (rc) err_set(err, err_len, rc, "%s", p->bg_err);
  pthread_mutex_unlock(&p->mu);
  if (!rc && p->bg_item) { /* the step is over: its evicted slots leave the key map */
    const trainer_work_step_t *st = &p->bg_item->work.step;
    for (size_t i = 0; i < st->n_evict; i++) trainer_kmap_clear(t->kmap, st->evict_slots[i]);
    trainer_pipeline_release(p->bg_item);
    p->bg_item = NULL;
  }
  if (t_waited) *t_waited += clock_mono_s() - t0;
  return rc;
}

int trainer_pipeline_bg_reserve(trainer_t *t, const trainer_work_t *w, float **grads) {
  trainer_pipeline_t *p = &t->pipe;
  *grads = NULL;
  if (trainer_grow((void **)&p->bg_grad, &p->cap_grad, (w->step.n_delayed + 1) * trainer_step_dim(t->ts), sizeof(float)) ||
      trainer_grow((void **)&p->bg_rows, &p->cap_rows, (w->step.n_write_back + 1) * trainer_step_row_floats(t->ts),
                   sizeof(float)))
    return -ENOMEM;
  *grads = p->bg_grad;
  return 0;
}

void trainer_pipeline_bg_submit(trainer_t *t, trainer_item_t *it) {
  trainer_pipeline_t *p = &t->pipe;
  ASSERT(!p->bg_item && it->work.kind == TRAINER_WORK_STEP);
  pthread_mutex_lock(&p->mu);
  p->bg_item = it;
  p->bg_busy = 1;
  pthread_cond_broadcast(&p->bcv);
  pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------------------ the gate */

void trainer_pipeline_gate_advance(trainer_t *t, uint64_t done) {
  pthread_mutex_lock(&t->pipe.mu);
  if (done > t->pipe.known_done) t->pipe.known_done = done;
  pthread_cond_broadcast(&t->pipe.fcv);
  pthread_mutex_unlock(&t->pipe.mu);
}

int trainer_pipeline_gate_open(trainer_t *t, uint64_t x, char *err, size_t err_len) {
  int rc = trainer_pipeline_bg_wait(t, NULL, err, err_len);
  if (rc) return rc;
  if ((rc = trainer_sched_barrier(t->join.sched, t->join.coll, trainer_sched_id(TRAINER_SCHED_NEXT, x, TRAINER_SCHED_GATE))) !=
      0)
    return err_set(err, err_len, rc, "barrier before iteration %" PRIu64 " failed among %u trainers: %s", x,
                   t->trainers, err_str(rc));
  trainer_pipeline_gate_advance(t, x);
  return 0;
}

/* ------------------------------------------------------------------ start, stop */

int trainer_pipeline_start(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  p->chunk_floats = (size_t)cfg_int(t->cfg, "trainer.comm_chunk_kb") * 1024 / sizeof(float);
  if (pthread_create(&p->reader, NULL, reader_main, t) != 0) return -EAGAIN;
  p->reader_running = 1;
  if (pthread_create(&p->feeder, NULL, feeder_main, t) != 0) {
    pthread_mutex_lock(&p->mu);
    p->rd_drop = 1; /* no feeder: the reader reads to the end (joined by trainer_pipeline_join_feeder) */
    pthread_cond_broadcast(&p->rcv);
    pthread_mutex_unlock(&p->mu);
    return -EAGAIN;
  }
  p->feeder_running = 1;
  if (!t->ideal) {
    if (pthread_create(&p->bg, NULL, bg_main, t) != 0) return -EAGAIN;
    p->bg_running = 1;
  }
  return 0;
}

int trainer_pipeline_find_stop(trainer_t *t, trainer_item_t **stop) {
  trainer_pipeline_t *p = &t->pipe;
  *stop = NULL;
  pthread_mutex_lock(&p->mu);
  while (!*stop) {
    trainer_item_t *it = p->head;
    if (!it) {
      if (p->feed_end) break;
      pthread_cond_wait(&p->fcv, &p->mu);
      continue;
    }
    p->head = it->next;
    if (!p->head) p->tail = NULL;
    it->next = NULL;
    if (!it->rc && it->work.kind == TRAINER_WORK_STOP) *stop = it;
    else trainer_pipeline_release(it);
  }
  pthread_mutex_unlock(&p->mu);
  return *stop != NULL;
}

void trainer_pipeline_quit(trainer_t *t) {
  pthread_mutex_lock(&t->pipe.mu);
  t->pipe.feed_quit = 1;
  pthread_cond_broadcast(&t->pipe.fcv);
  pthread_mutex_unlock(&t->pipe.mu);
}

/* The feeder ends with the stream (cancelled or finished by the caller),
 * or earlier (quit, an error); the reader with the stream. */
void trainer_pipeline_join_feeder(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  if (!p->feeder_running && !p->reader_running) return;
  if (p->feeder_running) pthread_join(p->feeder, NULL);
  p->feeder_running = 0;
  if (p->reader_running) {
    pthread_join(p->reader, NULL);
    p->reader_running = 0;
  }
  pthread_mutex_lock(&p->mu);
  trainer_item_t *it = p->head;
  p->head = p->tail = NULL;
  pthread_mutex_unlock(&p->mu);
  release_list(it);
}

void trainer_pipeline_drain(trainer_t *t) {
  if (t->pipe.feeder_running || t->pipe.reader_running) {
    trainer_pipeline_join_feeder(t);
    return;
  }
  Chanter__Oracle__V1__WorkItem *msg = NULL;
  while (orc_work_next(t->stream, &msg) == 0) protobuf_c_message_free_unpacked(&msg->base, NULL);
}

void trainer_pipeline_reset(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  release_list(p->head);
  p->head = p->tail = NULL;
  trainer_pipeline_release(p->bg_item);
  p->bg_item = NULL;
  drop_read(p);
  p->rd_head = 0;
  p->rd_end = p->rd_rc = p->rd_drop = 0;
  p->feed_end = p->feed_rc = p->feed_quit = 0;
  p->feed_err[0] = 0;
  p->known_done = 0;
  p->pf_state = 0;
  p->pf_x = p->pf_gate = 0;
  p->bg_busy = p->bg_quit = p->bg_rc = 0;
  p->bg_err[0] = 0;
}

void trainer_pipeline_stop_bg(trainer_t *t) {
  trainer_pipeline_t *p = &t->pipe;
  if (!p->bg_running) return;
  pthread_mutex_lock(&p->mu);
  p->bg_quit = 1;
  pthread_cond_broadcast(&p->bcv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->bg, NULL);
  p->bg_running = 0;
}
