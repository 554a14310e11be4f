/*
 * trainer_state: the one trainer_t that the parts of chanter-trainer
 * share; private to services/trainer (main.c sees trainer_loop.h only).
 *
 * How the trainer is cut.  trainer_loop.c is the conductor: it creates and
 * destroys the trainer, and its serve() is the one place that decides what
 * runs next -- which item, which phase of a step, when the background work
 * must be over, when a gate is opened.  The stages it calls each own one
 * sub-struct of trainer_t, return what changed, and never call the next
 * stage themselves:
 *   trainer_join.c      t->join   Join, the heartbeat thread, the collective
 *                                 group (and the dense all-reduce on it)
 *   trainer_pipeline.c  t->pipe   the feeder thread (reads the Work stream,
 *                                 decodes each item once, prefetches a
 *                                 Step's rows once its gate allows), the
 *                                 background thread (delayed rows,
 *                                 write-backs), the gate (known_done)
 *   trainer_exec.c      t->exec   the phases of a step, replication of owned rows,
 *                                 the Report
 *   trainer_eval.c      t->eval   evaluation
 * Under them: trainer_work.h (the decoded WorkItem: no stage reads
 * protobuf), trainer_step.h (the math), trainer_kmap.h, trainer_rows.h,
 * trainer_ar.h.
 *
 * The rest of trainer_t is shared: set up by trainer_create and read by
 * every stage (the job, the model, the clients, the key map, the metrics),
 * or the Work stream and the stop flag under mu.  The key map is the
 * training thread's alone (the stages that touch it all run there).
 *
 * Threads: the training thread runs trainer_run and every stage function
 * unless its comment says otherwise; the feeder and the background thread
 * are trainer_pipeline.c's, the heartbeat thread trainer_join.c's.
 */
#ifndef CHANTER_TRAINER_STATE_H
#define CHANTER_TRAINER_STATE_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "cfg.h"
#include "data.h"
#include "embc.h"
#include "metrics.h"
#include "orc.h"
#include "table.h"
#include "trainer_eval.h"
#include "trainer_exec.h"
#include "trainer_join.h"
#include "trainer_kmap.h"
#include "trainer_loop.h"
#include "trainer_partition.h"
#include "trainer_pipeline.h"
#include "trainer_rows.h"
#include "trainer_step.h"
#include "trainer_work.h"

/* The trainer's metrics (registered by trainer_exec_metrics; NULL
 * handles without a registry, which the metrics calls accept). */
typedef struct trainer_metrics_s {
  metrics_gauge_t *iter, *loss, *phase[PHASE_N_STEP];
  metrics_hist_t *step;
  metrics_counter_t *fetched, *synced, *written, *samples, *evals, *hits, *delayed, *replicated;
} trainer_metrics_t;

struct trainer_s {
  /* ---- the job (trainer_create; read-only after, but for chanter scale: trainer_loop.c's rescale) */
  cfg_t *cfg;
  uint32_t rank, trainers;
  uint64_t iterations;
  int ideal;
  char address[256];
  data_schema_t schema;
  int have_schema;
  table_layout_t layout;
  trainer_work_limits_t limits; /* what every WorkItem is checked against */
  uint32_t scale_to;            /* Join said chanter scale changed the count to this (0: it did not) ... */
  int scaled_out;               /* ... and this rank is not in the job any more */
  uint32_t emb_to;              /* Join said chanter scale changed the embedding servers to this many (0: no) ... */
  char *emb_cluster;            /* ... at these addresses (comma-separated, malloc'ed) */
  char *save_dense;             /* --save-dense */

  /* ---- the model, the rows, the clients */
  trainer_step_t *ts;
  trainer_rows_t *local;      /* ideal mode */
  embc_t *embc;        /* normal mode */
  uint64_t cache_rows; /* normal mode */
  trainer_kmap_t *kmap;        /* normal mode; training thread only */
  trainer_partition_t partition;         /* the partitioned tables (table_strategy) */
  orc_t *orc;
  trainer_metrics_t m;

  /* ---- the Work stream, cancelled by trainer_stop from any thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rpc_stream_t *stream;
  atomic_int stop;
  char stop_why[256];
  int write_failed; /* a Report / EvalResult could not be sent: the stream ended */
  /* the conductor's: the oracle's StopWork said the job failed (another
   * daemon's failure); the final drain of the stream is over (under mu) */
  int job_failed;
  char job_msg[512];
  int drained;
  /* ---- failover (DESIGN.md 5): this generation ends (the oracle said
   * "recovering", it is lost, or a step failed because a peer is); the
   * trainer rebuilds its model and cache and joins the next one.  Set
   * from any thread by trainer_abort_generation (under mu). */
  atomic_int abort_gen;
  char abort_why[512];
  int rejoins;          /* generations joined after the first */
  char job_state[32];   /* the job's state in the last Join answer */

  /* ---- the stages */
  trainer_join_t join;
  trainer_pipeline_t pipe;
  trainer_exec_t exec;
  trainer_eval_t eval;
};

static inline int trainer_stopping(trainer_t *t) { return atomic_load(&t->stop); }
/* Stopping, or this generation is being abandoned: every wait gives up. */
static inline int trainer_halting(trainer_t *t) { return atomic_load(&t->stop) || atomic_load(&t->abort_gen); }

/* Ends this generation from any thread (the heartbeat finds the oracle
 * gone): the Work stream is cancelled, the embedding client's retries give
 * up, every wait of the pipeline wakes; the conductor then rejoins. */
void trainer_abort_generation(trainer_t *t, const char *why);

/* Room for need elements of elem bytes in *p (capacity *cap, doubling).
 * 0 or -ENOMEM (*p unchanged). */
static inline int trainer_grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 1024;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = nc;
  return 0;
}

#endif
