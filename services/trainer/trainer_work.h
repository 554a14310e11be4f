/*
 * trainer_work: the oracle's WorkItem decoded and validated ONCE, where it
 * arrives (the feeder thread, trainer_pipeline.c), into a plain C struct of
 * arrays.  Every check of a Step, an Eval or a StopWork that the trainer
 * makes is here, each with the sentence the trainer logs when it fails
 * ("iteration 3: slots has 12 bytes, want 32 (4 per entry)"); after
 * trainer_work_decode nothing downstream (the pipeline's prefetch and
 * background work, trainer_exec.c, trainer_eval.c, the step math of
 * trainer_step.h) reads protobuf or re-checks a field.  The decoded item
 * owns copies of its arrays (aligned: uint32 slots, uint64 keys, the
 * samples as the data_batch_t the step reads), so the message is freed at
 * once and the item can wait in the feeder's queue and then travel to the
 * background thread with its write-backs and evictions.
 *
 * The checks against the job (trainer_work_limits_t): the samples against
 * the schema (dense features, tables, hotness, byte lengths; a Step's at
 * most max_batch); every slot < cache_rows; list lengths that must agree
 * (fetch_keys / fetch_slots, write_back_keys / write_back_slots, the
 * replicate lists, one slot per id); every replicate owner < trainers;
 * global_batch >= the samples.  What is not a property of one message --
 * "is this the iteration that comes next" -- is the caller's check
 * (trainer_exec.c).  Without a cache (mode = ideal) a Step's cache fields
 * are not read, as the ideal step never uses them.
 *
 * Errors: 0, or ERR_BADMSG / -ENOMEM with the sentence in err.  Any
 * thread; a trainer_work_t is used by one thread at a time.
 */
#ifndef CHANTER_TRAINER_WORK_H
#define CHANTER_TRAINER_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "oracle.pb-c.h"
#include "trainer_step.h"

/* What a WorkItem is checked against (views; the caller keeps them). */
typedef struct trainer_work_limits_s {
  const data_schema_t *schema; /* n_dense, n_tables, hotness of the samples */
  uint32_t max_batch;          /* a Step's samples at most (an Eval's: any number) */
  uint64_t cache_rows;         /* every slot < cache_rows; 0: no cache (ideal), a Step's cache fields unread */
  uint32_t trainers;           /* every replicate owner < trainers */
  uint32_t rank;               /* this trainer: the partitioned tables' ids it is sent */
} trainer_work_limits_t;

typedef enum {
  TRAINER_WORK_NONE = 0, /* an empty or unknown item (decode fails) */
  TRAINER_WORK_STEP = 1,
  TRAINER_WORK_EVAL = 2,
  TRAINER_WORK_STOP = 3,
  TRAINER_WORK_CHECKPOINT = 4,
  TRAINER_WORK_RESUME = 5
} trainer_work_kind_t;

/* A Step (oracle.proto: Step).  Slots are < cache_rows; the counts say
 * how many entries each array has (arrays of 0 entries may be NULL). */
typedef struct trainer_work_step_s {
  uint64_t iteration;
  uint32_t global_batch_size; /* >= batch.n when batch.n > 0 */
  uint64_t prefetch_gate;
  uint64_t write_epoch;        /* the servers' write epoch of this run (its write-backs carry it) */
  uint32_t lookahead;    /* reporting */
  uint64_t cache_hits;   /* reporting */
  /* ---- the cache (all empty without one) */
  const uint32_t *slots; /* the slot of every id of batch.ids, same layout */
  const uint64_t *fetch_keys;
  const uint32_t *fetch_slots; /* where each fetch_keys row goes */
  size_t n_fetch;
  const uint64_t *write_back_keys;
  const uint32_t *write_back_slots;
  size_t n_write_back;
  const uint32_t *sync_critical;
  size_t n_critical;
  const uint32_t *sync_delayed;
  size_t n_delayed;
  const uint32_t *evict_slots;
  size_t n_evict;
  /* ---- ownership (LRPP) */
  const uint32_t *owned_slots;
  size_t n_owned_slots;
  const uint32_t *stale_slots;
  size_t n_stale;
  const uint32_t *replicate_slots;
  const uint32_t *replicate_owners; /* each < trainers */
  const uint64_t *replicate_keys;
  size_t n_replicate;
  /* ---- partitioned tables (strategy.h; all NULL when every table is
   * cached): their ids carry no slot (CACHER_NO_SLOT) */
  const uint32_t *partition_owner;  /* n_tables: the rank holding table t, or UINT32_MAX (cached) */
  const uint32_t *partition_counts; /* trainers: samples of each in the global batch (sum = global_batch_size, ours = batch.n) */
  const uint64_t *partition_ids;    /* the tables this trainer holds, ascending: global_batch_size * hotness ids each, in
                                  trainer order; every id < its table's rows */
  size_t n_partition_ids;
} trainer_work_step_t;

/* An Eval. */
typedef struct trainer_work_eval_s {
  uint64_t round, after_iteration;
  const uint64_t *fetch_keys; /* the rows of the samples (cache mode reads them) */
  size_t n_fetch;
} trainer_work_eval_t;

/* A StopWork (strings never NULL; "" when absent). */
typedef struct trainer_work_stop_s {
  const char *reason, *job_state;
} trainer_work_stop_t;

/* A CheckpointWork: after `iteration`, write back the flush rows without
 * evicting them; store the dense state as dense_blob ("" = not this
 * trainer's part) on server dense_server.  Strings never NULL. */
typedef struct trainer_work_checkpoint_s {
  const char *id, *dense_blob;
  uint64_t iteration;
  uint32_t dense_server;
  const uint64_t *flush_keys;
  const uint32_t *flush_slots;
  size_t n_flush;
} trainer_work_checkpoint_t;

/* A ResumeWork: the job goes on at start_iteration (>= 1) from checkpoint
 * id; the dense state is blob dense_blob on server dense_server. */
typedef struct trainer_work_resume_s {
  const char *id, *dense_blob;
  uint64_t start_iteration;
  uint32_t dense_server;
  uint64_t write_epoch;        /* as the Step's */
} trainer_work_resume_t;

/* One decoded WorkItem: kind says which of step / eval / stop is set;
 * batch holds the samples of a Step or an Eval.  Everything lives in one
 * block (mem) owned by the item. */
typedef struct trainer_work_s {
  trainer_work_kind_t kind;
  data_batch_t batch;      /* a view into mem (data.h) */
  trainer_work_step_t step;
  trainer_work_eval_t eval;
  trainer_work_stop_t stop;
  trainer_work_checkpoint_t checkpoint;
  trainer_work_resume_t resume;
  void *mem;
} trainer_work_t;

/* Decodes and checks item into *out (whose previous content is not
 * freed: close it first).  On failure out->kind still says what the item
 * was and out owns nothing.  0, ERR_BADMSG or -ENOMEM with err. */
int trainer_work_decode(const Chanter__Oracle__V1__WorkItem *item, const trainer_work_limits_t *lim,
                        trainer_work_t *out, char *err, size_t err_len);

/* Only a Samples message (s may be NULL: no samples) into out->batch,
 * checked as a Step's (at most max_batch samples) unless allow_large.
 * err gets the bare sentence ("samples carry 2 hotness entries for 3
 * tables"), without the iteration. */
int trainer_work_decode_samples(const Chanter__Oracle__V1__Samples *s, const trainer_work_limits_t *lim,
                                int allow_large, trainer_work_t *out, char *err, size_t err_len);

/* Frees what out owns and zeroes it.  NULL-safe. */
void trainer_work_close(trainer_work_t *w);

#endif
