/*
 * trainer_join: how a trainer becomes a member of its job -- the Join
 * RPC (role TRAINER, rank, address, schema and layout fingerprints), the
 * heartbeat thread (Heartbeat every trainer.heartbeat_ms on a client of
 * its own, whose short deadline keeps a dead oracle from holding up the
 * exit), and the collective group (Gloo, formed through the oracle's KV
 * store under "<job_id>/<generation>", rank 0's dense parameters
 * broadcast, the bucketed dense all-reduce of trainer_ar.h on it -- or,
 * with device = cuda and a GPU per trainer, on a second group, NCCL, over
 * the gradients in device memory).
 *
 * It owns t->join; the conductor (trainer_loop.c) calls it in order: join,
 * heartbeat, group, and at the end the reverse.  The group can be closed
 * and formed again (a new generation) without touching the model or the
 * cache.  Every other stage uses the group (t->join.coll, dense_ar) only
 * between trainer_join_group_form and trainer_join_group_close.
 */
#ifndef CHANTER_TRAINER_JOIN_H
#define CHANTER_TRAINER_JOIN_H

#include <pthread.h>
#include <stddef.h>

#include "cfg.h"
#include "coll.h"
#include "orc.h"
#include "trainer_ar.h"
#include "trainer_loop.h"

typedef struct trainer_join_s {
  cfg_t *hb_cfg;    /* the heartbeat's own client: a deadline of its period, */
  orc_t *hb_orc;    /* so that a dead oracle cannot hold up the exit */
  pthread_t hb;
  int hb_running;
  char prefix[512]; /* the group's rendezvous prefix, "<job_id>/<generation>" (Join's answer) */
  coll_t *coll;     /* the group */
  coll_t *pcoll;    /* comm_schedule = threads: the partitioned tables' AlltoAlls (a second group,
                       "<prefix>/part", the training thread's alone), when table_strategy partitions any table;
                       else NULL */
  trainer_sched_t *sched; /* comm_schedule = priority (and 2+ trainers): every collective of the generation
                             goes through its queue, which owns coll (trainer_sched.h); else NULL */
  trainer_ar_t *dense_ar;  /* the bucketed dense all-reduce (trainer_ar.h) on it -- or on ncoll */
  coll_t *ncoll;           /* device = cuda, every trainer on a GPU of its own: the dense all-reduce's NCCL
                              group (same prefix, keys "<prefix>/nccl/..."), on device memory; else NULL */
} trainer_join_t;

/* The heartbeat's client (cluster.oracle, TLS and message size of the
 * job, rpc.timeout_ms = max(2 heartbeat periods, 1 s), at most the
 * job's).  From trainer_create.  0 or a negative code with err. */
int trainer_join_init(trainer_t *t, char *err, size_t err_len);
/* Frees t->join (the heartbeat thread and the group already stopped). */
void trainer_join_close(trainer_t *t);

/* Join: records the group's prefix.  Refuses an oracle of another job
 * shape (trainers) or one that asks to resume (ERR_CONFIG).  0 or a
 * negative code with err. */
int trainer_join_oracle(trainer_t *t, int rejoin, char *err, size_t err_len);
/* rejoin (after a recovery, or the oracle's loss): Join is retried, with
 * backoff, while the oracle is down, recovering, or not yet aware that
 * this rank's previous process is gone -- for up to
 * trainer.rejoin_timeout_ms.  The job's state in the answer goes to
 * t->job_state; trainer_join_over: it is done, stopped or failed. */
int trainer_join_over(const trainer_t *t);

/* Starts the heartbeat thread (logs a warning and goes on without it if
 * it cannot).  It reads t->exec.last_done and calls trainer_stop when the
 * oracle answers stop. */
void trainer_join_heartbeat_start(trainer_t *t);
/* Joins it; the caller has set t->stop and broadcast t->cv. */
void trainer_join_heartbeat_stop(trainer_t *t);

/* Forms the group, broadcasts rank 0's dense parameters (to the GPU too),
 * starts the dense all-reduce (overlapped with the backward through the
 * CPU model's grad-ready hook when there are peers).  0 or a negative
 * code with err. */
int trainer_join_group_form(trainer_t *t, char *err, size_t err_len);
/* Unhooks the model, stops the dense all-reduce, leaves the group.
 * Idempotent. */
void trainer_join_group_close(trainer_t *t);

#endif
