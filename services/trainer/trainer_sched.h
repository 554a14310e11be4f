/*
 * trainer_sched: a trainer's collectives in one priority queue, run by one
 * communication thread in the same order on every trainer (EmbRace's 2D
 * scheduling, papers/embrace.txt 4.2; trainer.comm_schedule = priority).
 *
 * The training thread, the dense all-reduce's hook and the background
 * thread SUBMIT operations (a function run on the group, and an id); the
 * communication thread runs them, one at a time, on the trainer's group.
 * The id orders them:
 *
 *   id = class << 60 | iteration << 20 | index       lower id = sooner
 *   class 0  NEXT     what the next forward waits for: the partitioned
 *                     tables' AlltoAlls, the critical rows, the owned
 *                     rows' hand-over, barriers
 *   class 1  DENSE    the dense gradient buckets
 *   class 2  DELAYED  the delayed rows, in chunks (trainer.comm_chunk_kb)
 *
 * So a bucket of dense gradients that becomes ready while the delayed rows
 * of the step before are being all-reduced goes before their next chunk,
 * and the next step's AlltoAll before both.
 *
 * Agreement.  Collectives must run in the same order on every rank, and
 * what is ready when differs from rank to rank.  Before each operation the
 * ranks exchange the ids they have ready (an allgather of the 32 lowest,
 * a round) and run every id that every rank has, most urgent first (an
 * id submitted meanwhile waits for the next round).  When no id is common
 * (the ranks are at different points), each rank waits until it has the
 * lowest id any rank offered (the TARGET) before the next round, so no
 * round is spent polling.  Every rank computes the same choice from the
 * same allgathered lists, so the order is the same everywhere.  It cannot
 * deadlock as long as every rank submits the same operations with the same
 * ids, and an operation's submission waits only on operations submitted
 * before it: the lowest offered id is then submitted everywhere without
 * anything that is still pending.  The order never changes a result: the
 * operations touch disjoint buffers, and each is deterministic by itself.
 *
 * Failures.  A failed collective leaves the group unusable: its code goes
 * to that operation, to every operation pending, and to every later
 * submission (sticky).  The thread also fails them with ERR_CANCELLED when
 * cancelled() says the trainer stops or leaves the generation, so no
 * waiter hangs on a peer that left without an error reaching this rank.
 *
 * Threads: submit / wait from any thread (an operation is waited for by the
 * thread that submitted it); the group (coll_t) is the communication
 * thread's alone between create and destroy.
 */
#ifndef CHANTER_TRAINER_SCHED_H
#define CHANTER_TRAINER_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

enum { TRAINER_SCHED_NEXT = 0, TRAINER_SCHED_DENSE = 1, TRAINER_SCHED_DELAYED = 2 };

/* NEXT-class indices inside an iteration (the training thread runs them
 * one at a time: unique while pending) */
enum {
  TRAINER_SCHED_A2A_FWD = 0, /* the partitioned tables' pooled embeddings */
  TRAINER_SCHED_A2A_BWD,     /* their gradients */
  TRAINER_SCHED_CRITICAL,    /* the critical rows */
  TRAINER_SCHED_HANDOVER,    /* the owned rows' replication */
  TRAINER_SCHED_GATE,        /* the gate's barrier */
  TRAINER_SCHED_EVAL         /* the barrier before an evaluation */
};

typedef int (*trainer_sched_fn)(coll_t *c, void *ud);

typedef struct trainer_sched_op_s trainer_sched_op_t;
struct trainer_sched_op_s {
  uint64_t id;
  trainer_sched_fn fn;
  void *ud;
  int done, rc;  /* under the scheduler's lock */
  double seconds; /* spent in fn */
  trainer_sched_op_t *next;
};

typedef struct trainer_sched_s trainer_sched_t;

typedef struct trainer_sched_stats_s {
  uint64_t ops, rounds, empty_rounds;
  double t_agree, t_ops; /* seconds in the rounds' allgathers, in the operations */
} trainer_sched_stats_t;

uint64_t trainer_sched_id(int cls, uint64_t iteration, uint32_t index);

/* Starts the communication thread on group c.  cancelled(ud), polled
 * while waiting: nonzero fails everything pending with ERR_CANCELLED.
 * 0, -ENOMEM or -EAGAIN. */
int trainer_sched_create(coll_t *c, int (*cancelled)(void *), void *ud, trainer_sched_t **out);
/* Fails what is pending (ERR_CANCELLED), stops the thread (after the
 * collective it may be in), frees s.  NULL is fine. */
void trainer_sched_destroy(trainer_sched_t *s);

/* Queues op (its storage stays the caller's until trainer_sched_wait). */
void trainer_sched_submit(trainer_sched_t *s, trainer_sched_op_t *op, uint64_t id, trainer_sched_fn fn, void *ud);
/* Between hold and release no round starts: operations submitted in
 * between are offered together (held counts; the caller does not wait in
 * between). */
void trainer_sched_hold(trainer_sched_t *s);
void trainer_sched_release(trainer_sched_t *s);
/* Waits until op ran (or failed); its code. */
int trainer_sched_wait(trainer_sched_t *s, trainer_sched_op_t *op);
/* Submit and wait; s == NULL: fn(direct, ud) on the calling thread (the
 * comm_schedule = threads path). */
int trainer_sched_run(trainer_sched_t *s, coll_t *direct, uint64_t id, trainer_sched_fn fn, void *ud);

void trainer_sched_stats(trainer_sched_t *s, trainer_sched_stats_t *out);

/* The collectives of coll.h as one operation each (submit and wait, or
 * direct on s == NULL). */
int trainer_sched_sum_ordered(trainer_sched_t *s, coll_t *direct, uint64_t id, float *buf, size_t n);
int trainer_sched_allgather(trainer_sched_t *s, coll_t *direct, uint64_t id, const void *in, size_t bytes_each,
                            void *out);
int trainer_sched_alltoallv(trainer_sched_t *s, coll_t *direct, uint64_t id, const void *send, const size_t *send_bytes,
                            void *recv, const size_t *recv_bytes);
int trainer_sched_barrier(trainer_sched_t *s, coll_t *direct, uint64_t id);

/* A rank-ordered sum (coll_allreduce_sum_f32_ordered) cut into chunks of
 * at most chunk floats, each its own operation (so that operations of
 * higher priority can go between them): submitted by
 * trainer_sched_chunks_submit, waited for by trainer_sched_chunks_wait.
 * The element-wise sum is the same whatever the cut.  Without a
 * scheduler, submit does nothing and wait runs the whole sum directly. */
typedef struct trainer_sched_chunks_s {
  trainer_sched_op_t *ops;
  void *args;
  size_t n_ops, cap;
  float *buf;
  size_t n;
} trainer_sched_chunks_t;
int trainer_sched_chunks_submit(trainer_sched_t *s, trainer_sched_chunks_t *ch, int cls, uint64_t iteration, float *buf,
                                size_t n, size_t chunk); /* 0 or -ENOMEM */
int trainer_sched_chunks_wait(trainer_sched_t *s, coll_t *direct, trainer_sched_chunks_t *ch);
void trainer_sched_chunks_free(trainer_sched_chunks_t *ch);

#endif
