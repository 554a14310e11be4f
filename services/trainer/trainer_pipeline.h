/*
 * trainer_pipeline: the two threads that serve the training thread, and
 * the gate between them (DESIGN.md 3).
 *
 *   reader      reads the Work stream: gRPC's transport, TLS and the
 *               protobuf unpacking of each message, up to
 *               TRAINER_READ_AHEAD messages ahead of the feeder (at batch
 *               16384 a Step is ~9 MB, and reading it costs about as much as
 *               all the feeder's work on it: two threads double the Steps
 *               a trainer can take in).  Once the feeder has ended it reads
 *               the stream to its end and drops what it reads.
 *   feeder      takes the messages in order; decodes and checks each
 *               item once (trainer_work.h) and frees the message; for a
 *               Step (every mode but ideal) waits for its gate -- every
 *               trainer finished the iterations < prefetch_gate,
 *               background work included -- and fetches its rows from the
 *               embedding servers straight into their cache slots, up to L
 *               steps ahead of training; then queues the item.  An item
 *               that fails its checks is queued too, carrying its error,
 *               and ends the feed: the training thread meets it in order.
 *   background  the delayed synchronization of step x, the delayed rows'
 *               updates and x's write-backs, while step x+1's forward
 *               runs.  It takes the Step item itself (its delayed slots,
 *               write-backs and evictions) from the training thread and
 *               gives it back at the next trainer_pipeline_bg_wait, where
 *               x's evicted slots leave the key map.
 * They touch disjoint cache slots (the oracle's slot rules), so the hot
 * path takes no lock; they meet once per step on t->pipe.mu.
 *
 * The gate: known_done = every trainer finished the iterations <
 * known_done.  The conductor advances it (trainer_pipeline_gate_advance)
 * after x's dense all-reduce (which no trainer finishes before every
 * trainer has waited for its background of x-1), after an evaluation's
 * barrier, and -- when the feeder waits for the gate of the very item the
 * training thread needs (L = 0) -- by an explicit barrier
 * (trainer_pipeline_gate_open).  With trainer.comm_schedule = threads (the default)
 * the group's collectives run in one order on every trainer: [background
 * x-1: delayed rows] [the gate barrier, if any] [dense buckets of x]
 * [critical rows of x] ...; with priority each is an
 * operation of the trainer's scheduler (trainer_sched.h), whose rounds
 * agree on the order, the delayed rows in chunks of the lowest priority.
 *
 * Owns t->pipe.  Functions run on the training thread unless said.
 */
#ifndef CHANTER_TRAINER_PIPELINE_H
#define CHANTER_TRAINER_PIPELINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer_loop.h"
#include "trainer_sched.h"
#include "trainer_work.h"

#define TRAINER_READ_AHEAD 2 /* messages the reader holds for the feeder */

/* A work item in the feeder's queue (and, for a Step, then in the
 * background's hands). */
typedef struct trainer_item_s trainer_item_t;
struct trainer_item_s {
  trainer_item_t *next;
  trainer_work_t work;
  int rc;           /* the item failed its checks: rc and err (work.kind still says what it was) */
  char err[768];
  double t_fetch;   /* seconds the feeder spent fetching its rows */
  double t_arrived; /* when the feeder read it from the stream (clock_mono_s) */
};

typedef struct trainer_pipeline_s {
  pthread_mutex_t mu; /* everything below but the feeder's and the background's own buffers */
  pthread_cond_t fcv; /* feeder queue, known_done, gate waits */
  pthread_cond_t bcv; /* background work */
  /* the reader: a ring of the messages read ahead of the feeder (under mu) */
  pthread_t reader;
  int reader_running;
  pthread_cond_t rcv; /* the ring: a message in, a place free, the end */
  Chanter__Oracle__V1__WorkItem *rd_msg[TRAINER_READ_AHEAD];
  double rd_t[TRAINER_READ_AHEAD]; /* when each was read (clock_mono_s) */
  unsigned rd_head, rd_n;
  int rd_end, rd_rc; /* the stream ended: orc_work_next's code (1: cleanly) */
  int rd_drop;       /* the feeder has ended: read to the end, keep nothing */
  /* the feeder */
  pthread_t feeder;
  int feeder_running;
  trainer_item_t *head, *tail;
  int feed_end, feed_rc, feed_quit;
  char feed_err[768];
  uint64_t known_done; /* iterations < known_done finished by every trainer, background work included */
  int pf_state;        /* 0 reading the stream, 1 waiting for a gate, 2 fetching */
  uint64_t pf_x, pf_gate;
  float *pf_rows;      /* feeder only */
  size_t pf_cap;
  /* the background */
  pthread_t bg;
  int bg_running, bg_busy, bg_quit, bg_rc;
  char bg_err[768];
  trainer_item_t *bg_item; /* the Step handed over (owned until the next bg_wait) */
  float *bg_grad, *bg_rows; /* its delayed rows' gradients (packed by the training thread), write-back rows */
  size_t cap_grad, cap_rows;
  trainer_sched_chunks_t bg_chunks; /* the delayed rows' all-reduce as operations of the scheduler */
  size_t chunk_floats;              /* trainer.comm_chunk_kb */
} trainer_pipeline_t;

/* From trainer_create / trainer_destroy (threads stopped by then). */
void trainer_pipeline_init(trainer_t *t);
void trainer_pipeline_close(trainer_t *t);

/* Starts the feeder on t->stream and (but in ideal mode) the background
 * thread.  0 or -EAGAIN. */
int trainer_pipeline_start(trainer_t *t);
/* trainer_stop, any thread: every wait of the pipeline sees the stop flag. */
void trainer_pipeline_wake(trainer_t *t);

/* trainer_pipeline_next's answers besides 0 (an item) and a negative code */
#define TRAINER_PIPELINE_END 1  /* the stream ended cleanly */
#define TRAINER_PIPELINE_GATE 2 /* the feeder waits for the gate of iteration `expect`: open it */

/* The next queued item (*out, owned by the caller: trainer_pipeline_release
 * or trainer_pipeline_bg_submit), or END, or GATE, or the feeder's error
 * (err).  expect: the iteration the training thread needs next.
 * *t_prefetch_wait: the part of the wait since t_start after the item had
 * arrived from the oracle (its gate and the fetch of its rows: the
 * feeder's work, not the oracle's). */
int trainer_pipeline_next(trainer_t *t, uint64_t expect, double t_start, trainer_item_t **out,
                          double *t_prefetch_wait, char *err, size_t err_len);
void trainer_pipeline_release(trainer_item_t *it);

/* Every trainer has finished the iterations < x: this trainer's
 * background, then a barrier, then the gate advances.  0 or the error. */
int trainer_pipeline_gate_open(trainer_t *t, uint64_t x, char *err, size_t err_len);
/* Every trainer has finished the iterations < done: prefetches gated on
 * them may go. */
void trainer_pipeline_gate_advance(trainer_t *t, uint64_t done);

/* Waits for the background work in flight (*t_waited += the seconds, may
 * be NULL); then its Step's evicted slots leave the key map and the item
 * is freed.  0 or its error (sticky: the first failure). */
int trainer_pipeline_bg_wait(trainer_t *t, double *t_waited, char *err, size_t err_len);
/* Room for w's background work (only while it is idle: after
 * trainer_pipeline_bg_wait); *grads: where the training thread packs w's
 * delayed rows' gradients (n_delayed * dim floats).  0 or -ENOMEM. */
int trainer_pipeline_bg_reserve(trainer_t *t, const trainer_work_t *w, float **grads);
/* Hands the Step it (whose gradients are in *grads) to the background
 * thread, which takes ownership. */
void trainer_pipeline_bg_submit(trainer_t *t, trainer_item_t *it);

/* After a failed write (the oracle ended the stream while this trainer
 * was busy): the items still buffered, up to the end of the feed; 1 and
 * the StopWork in *stop (the caller releases it) if one is among them. */
int trainer_pipeline_find_stop(trainer_t *t, trainer_item_t **stop);

/* Ending the stream.  quit: a feeder waiting for a gate that will never
 * open gives up.  drain: after the caller's half-close, read the stream
 * to its end (the feeder does, or this thread when there is none).
 * join_feeder: after a cancel.  stop_bg: the background thread ends. */
void trainer_pipeline_quit(trainer_t *t);
void trainer_pipeline_drain(trainer_t *t);
void trainer_pipeline_join_feeder(trainer_t *t);
void trainer_pipeline_stop_bg(trainer_t *t);
/* After both threads ended (a generation abandoned): back to the state
 * trainer_pipeline_init left, keeping the buffers. */
void trainer_pipeline_reset(trainer_t *t);

#endif
