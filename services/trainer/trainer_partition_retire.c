/*
 * trainer_partition_retire: the end-of-job write-back of the partitioned
 * rows, overlapped with the last iterations (contract in
 * trainer_partition.h, trainer_partition_retire).
 *
 * Without it the last Step writes back every row this rank updated since
 * its last flush (for a job without checkpoints: every row it ever read)
 * before its Report: the whole wind-down.  Once the feeder has read the
 * job's last Step, last[t][l] (iteration + 1 of the last Step using row l)
 * is final; the first trainer_partition_retire after that starts a writer
 * thread, which sorts the held rows by last use once (a counting sort:
 * the rows last used by iteration x0 -- the first hand-over -- in one
 * bucket, then one bucket per later iteration) and, each time the
 * training thread says iteration x is updated, writes the dirty rows of
 * the buckets up to x, tagged x + 1, in chunks, clearing their marks.
 *
 * Why the bits are the same: a row last used by Step y <= x is never
 * updated again, so its bytes now are its bytes at the job's end (and at
 * every later checkpoint or evaluation, whose flush then skips it: its
 * mark is clear).  A row that is not dirty (flushed by a checkpoint after
 * its last use) is skipped: the servers hold exactly those bytes.
 *
 * Threads: the writer reads rows and marks only of rows whose last use is
 * done (the training thread's pool no longer touches them: other rows'
 * bytes, other marks), and the training thread's flushes read every mark
 * only after trainer_partition_writer_drain (the writer idle: the mutex
 * orders its clears before).  The tag x + 1 is never above the
 * checkpoint a server may be fenced at (the training thread takes
 * checkpoint c right after iteration c, so x <= c): no write is parked
 * while the checkpoint's own flush waits for the writer.  A write that
 * fails leaves its rows dirty (the next flush writes them; its error is
 * logged) and the writer stops retiring.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "proc.h"
#include "strategy.h"
#include "trainer_partition.h"

#define RETIRE_CHUNK 65536 /* rows per write-back call */

typedef struct trainer_partition_writer_s {
  trainer_partition_t *p;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t want;  /* write the rows last used by iteration want - 1 or before (mu) */
  uint64_t done;  /* written up to there (mu) */
  int busy, stop, failed; /* (mu) */
  /* the writer's own */
  uint64_t x0;       /* the bucket of rows last used by x0 - 1 or before: 0; last use y >= x0: y - x0 + 1 */
  uint64_t *keys;    /* the held rows read, by bucket */
  size_t *start;     /* nb + 1: bucket b's keys at [start[b], start[b + 1]) */
  size_t nb, pos;    /* buckets; keys before pos written (or skipped) */
  uint64_t *ckeys;   /* the chunk */
  float *crows;
  double secs;
  char why[768];
} writer_t;

static uint64_t local_of(const trainer_partition_t *p, uint32_t t, uint64_t r) {
  return p->owner[t] == STRATEGY_OWNER_ALL ? r / p->P : r;
}
static uint64_t global_of(const trainer_partition_t *p, uint32_t t, uint64_t l) {
  return p->owner[t] == STRATEGY_OWNER_ALL ? l * p->P + p->rank : l;
}
static size_t bucket_of(const writer_t *w, uint64_t last) {
  return last <= w->x0 ? 0 : (size_t)(last - w->x0);
}

/* The held rows read so far, sorted by last use (stable: table order, then
 * row order, within a bucket).  0 or -ENOMEM. */
static int sort_rows(writer_t *w) {
  trainer_partition_t *p = w->p;
  w->nb = (size_t)(p->iterations - w->x0) + 1; /* last uses up to iterations */
  if (!(w->start = calloc(w->nb + 1, sizeof *w->start))) return -ENOMEM;
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k];
    uint64_t R = strategy_local_rows(p->owner[t], p->rank, p->P, p->schema->table_rows[t]);
    for (uint64_t l = 0; l < R; l++)
      if (p->last[t][l]) w->start[bucket_of(w, p->last[t][l]) + 1]++;
  }
  for (size_t b = 0; b < w->nb; b++) w->start[b + 1] += w->start[b];
  size_t n = w->start[w->nb];
  size_t *at = malloc((w->nb ? w->nb : 1) * sizeof *at);
  w->keys = malloc((n ? n : 1) * sizeof *w->keys);
  if (!at || !w->keys) {
    free(at);
    return -ENOMEM;
  }
  memcpy(at, w->start, w->nb * sizeof *at);
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k];
    uint64_t R = strategy_local_rows(p->owner[t], p->rank, p->P, p->schema->table_rows[t]);
    for (uint64_t l = 0; l < R; l++)
      if (p->last[t][l]) w->keys[at[bucket_of(w, p->last[t][l])]++] = TABLE_KEY(t, global_of(p, t, l));
  }
  free(at);
  return 0;
}

/* Writes the n rows of the chunk, tagged done, and clears their marks. */
static int write_chunk(writer_t *w, size_t *n, uint64_t done) {
  trainer_partition_t *p = w->p;
  if (!*n) return 0;
  int rc = embc_write_done(p->embc, w->ckeys, *n, w->crows, done, w->why, sizeof w->why);
  if (rc) return rc;
  for (size_t i = 0; i < *n; i++) {
    uint32_t t = TABLE_ID(w->ckeys[i]);
    p->dirty[t][local_of(p, t, TABLE_ROW(w->ckeys[i]))] = 0;
  }
  p->rows_retired += *n;
  *n = 0;
  return 0;
}

/* The dirty rows of the buckets of last use <= want - 1, tagged want. */
static int write_upto(writer_t *w, uint64_t want) {
  trainer_partition_t *p = w->p;
  int rc = 0;
  if (!w->keys && (rc = sort_rows(w)) != 0) return rc;
  if (!w->ckeys && (!(w->ckeys = malloc(RETIRE_CHUNK * sizeof *w->ckeys)) ||
                    !(w->crows = malloc((size_t)RETIRE_CHUNK * p->rf * sizeof(float)))))
    return -ENOMEM;
  size_t end = w->start[bucket_of(w, want) + 1], n = 0;
  for (; w->pos < end && !rc; w->pos++) {
    uint64_t key = w->keys[w->pos];
    uint32_t t = TABLE_ID(key);
    uint64_t l = local_of(p, t, TABLE_ROW(key));
    if (!p->dirty[t][l]) continue;
    w->ckeys[n] = key;
    memcpy(w->crows + n * p->rf, p->rows[t] + (size_t)l * p->rf, p->rf * sizeof(float));
    if (++n < RETIRE_CHUNK) continue;
    if ((rc = write_chunk(w, &n, want)) != 0) break;
    pthread_mutex_lock(&w->mu);
    int stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    if (stop) return ERR_CANCELLED;
  }
  return rc ? rc : write_chunk(w, &n, want);
}

static void *writer_main(void *arg) {
  proc_name_thread("trainer-retire");
  writer_t *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && (w->failed || w->done >= w->want)) pthread_cond_wait(&w->cv, &w->mu);
    if (w->stop) break;
    uint64_t want = w->want;
    w->busy = 1;
    pthread_mutex_unlock(&w->mu);
    double t0 = clock_mono_s();
    int rc = write_upto(w, want);
    w->secs += clock_mono_s() - t0;
    if (rc && rc != ERR_CANCELLED)
      log_warn("partitioned tables: writing back the rows no later iteration uses (up to iteration %" PRIu64
               ") failed, left to the last flush: %s",
               want - 1, rc == -ENOMEM ? "out of memory" : *w->why ? w->why : err_str(rc));
    pthread_mutex_lock(&w->mu);
    if (rc) w->failed = 1;
    else w->done = want;
    w->busy = 0;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

void trainer_partition_retire(trainer_partition_t *p, uint64_t x) {
  if (!p->n_mine || p->ds || x + 1 >= p->iterations || !atomic_load_explicit(&p->final_seen, memory_order_acquire))
    return; /* (the last iteration's rows: its own flush) */
  writer_t *w = p->wr;
  if (!w) {
    if (!(w = calloc(1, sizeof *w))) return; /* the last flush writes them */
    w->p = p;
    w->x0 = x + 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->th, NULL, writer_main, w) != 0) {
      pthread_mutex_destroy(&w->mu);
      pthread_cond_destroy(&w->cv);
      free(w);
      return;
    }
    p->wr = w;
  }
  pthread_mutex_lock(&w->mu);
  w->want = x + 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void trainer_partition_writer_drain(trainer_partition_t *p) {
  writer_t *w = p->wr;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  while (w->busy || (!w->failed && !w->stop && w->done < w->want)) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

void trainer_partition_writer_stop(trainer_partition_t *p) {
  writer_t *w = p->wr;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->th, NULL);
  log_info("partitioned tables: rank %u wrote back %" PRIu64 " rows during the last iterations (%.3f s of writing)",
           p->rank, p->rows_retired, w->secs);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->keys), free(w->start), free(w->ckeys), free(w->crows);
  free(w);
  p->wr = NULL;
}
