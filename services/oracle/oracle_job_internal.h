/*
 * oracle_job_internal: what the files of one oracle job share and nobody
 * else uses (as libuv keeps an internal header per subsystem).  A job
 * (oracle_job.h says what it does) is four stages, the checkpoint stage
 * and the probe beside them, and the conductor that runs them; a batch
 * travels through the four in this order:
 *
 *   oracle_fetch.c     pulls train batches and the evaluation set from the
 *                      data processors (threads, a reorder queue)
 *   oracle_pipeline.c  plans each batch on the worker pool (allocation,
 *                      laia), chooses L (lookahead = auto) and the auto
 *                      tables' strategies, and drives the cacher that
 *                      decides the batch
 *   oracle_dispatch.c  sends Steps, Evals, CheckpointWork, ResumeWork and
 *                      StopWork to the trainers: the only file that builds
 *                      a WorkItem
 *   oracle_report.c    takes the trainers' Reports and EvalResults, scores
 *                      evaluations, says when the job is finished, writes
 *                      the summary
 *   oracle_ckpt*.c     checkpoints (choosing, the trainers' part, the
 *                      servers' part) and the calls that start the job on
 *                      the embedding servers (check, fresh, resume,
 *                      roll-back); oracle_probe.c notices a server restart
 *   oracle_job.c       the lifecycle (its table is at the top of the file),
 *                      create / destroy, the Work streams, and
 *                      oracle_job__advance: the one place that decides what
 *                      happens next and in which order the stages run
 *   oracle_job_shape.c the configuration's checks, the tables' strategies,
 *                      the metrics
 *
 * Four rules keep the files from calling each other in circles:
 *  - The job's state is written by set_state in oracle_job.c only (with the
 *    job_state gauge and the job record), along the lifecycle table; every
 *    decision that changes it is made in advance's case for the state.
 *  - A stage's step (oracle_fetch__collect, oracle_pipeline__plan and
 *    __cache, oracle_dispatch__run, oracle_ckpt__run,
 *    oracle_report__finished) returns what it changed (ORACLE_CH_* bits) or
 *    a negative error and is called by advance only, never by another
 *    stage: advance runs them in order, and again while a change lets an
 *    earlier stage go on.  Events (a worker-pool completion, a fetch
 *    thread's wake-up, a message on a stream, a request) update their own
 *    stage's state, or keep their result for advance (the start's calls to
 *    the servers: oracle_ckpt__start_done), and call advance.  The other
 *    stages ask the checkpoint stage at three points (oracle_ckpt__wanted,
 *    __decided, __dispatch): queries and records, not steps.
 *  - Each stage owns one sub-struct of the job (j->fetch, j->pipe,
 *    j->dispatch, j->report, j->ckpt, j->probe), and only its own file
 *    writes it, a checkpoint's state included (oracle_<stage>__restore); it
 *    may read the others' and the job's shape, and ask another for what it
 *    produced (oracle_fetch__take, oracle_pipeline__decided).  The job's
 *    own fields are oracle_job.c's, except that the pipeline runs table
 *    strategy auto's choice (j->strat_running, j->strat_why, then
 *    oracle_job__strategy_set) and the probe counts its timer in
 *    j->handles_open.
 *  - A failure is said once, with oracle_job__error (the first reason
 *    wins), and the stage returns the error: only oracle_job.c ends a job
 *    (StopWork to every trainer, the stages' end hooks, the logs).
 *
 * Everything here runs on the loop thread unless it says otherwise.
 */
#ifndef CHANTER_ORACLE_JOB_INTERNAL_H
#define CHANTER_ORACLE_JOB_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <uv.h>

#include "cfg.h"
#include "data.h"
#include "embc.h"
#include "dpc.h"
#include "jobrule.h"
#include "metrics.h"
#include "oracle.pb-c.h"
#include "cacher.h"
#include "oracle_job.h"
#include "laia.h"
#include "manifest.h"
#include "phase.h"
#include "oracle_recover.h"
#include "plan.h"
#include "plan_floor.h"
#include "shard_place.h"
#include "rpc.h"
#include "clock.h"

#define ORACLE_LOSS_RING 1024   /* recent per-iteration losses for the running train_logloss */
#define ORACLE_EVAL_HISTORY 100 /* evaluations kept for the summary (the last ones) */

/* Trainer time per iteration (a Report's t_*): the PHASE_N_REPORT phases
 * of phase.h, indexed by PHASE_*. */

/* What a stage's step changed.  oracle_job__advance runs the stages again
 * while DECIDED or SENT: a decision may let dispatch send and the cacher
 * decide the next batch; a Step sent may let planning go on. */
enum {
  ORACLE_CH_EVAL_SET = 1 << 0, /* fetch: the evaluation set arrived (dispatch may send Evals) */
  ORACLE_CH_PLANNING = 1 << 1, /* pipeline: batches went to the worker pool */
  ORACLE_CH_DECIDED = 1 << 2,  /* pipeline: the cacher decided a batch */
  ORACLE_CH_SENT = 1 << 3,     /* dispatch: a Step went out */
  ORACLE_CH_FINISHED = 1 << 4, /* report: every iteration and evaluation is in, the replicas agree */
};

/* ---- the job's metrics (registered together, in oracle_job_create) */
typedef struct oracle_metrics_s {
  metrics_gauge_t *iteration, *sps, *loss, *test_loss, *test_auc, *state, *lookahead, *slots;
  metrics_hist_t *phase[PHASE_N_REPORT], *plan, *iter;
  metrics_counter_t *steps, *reports, *batches, *rows_fetched, *rows_synced, *rows_replicated, *rows_synced_delayed,
      *rows_written_back, *evals, *floor_rows;
} oracle_metrics_t;

/* ---- oracle_fetch.c: j->fetch */

typedef struct oracle_fetcher_s {
  oracle_job_t *j;
  uint32_t idx;
  int eval; /* the evaluation-set fetcher */
} oracle_fetcher_t;

/* The evaluation set, once fetched: read by dispatch (the shares) and
 * report (labels, offsets). */
typedef struct oracle_eval_set_s {
  int ready;          /* arrived */
  uint64_t want;      /* test samples an evaluation scores (jobrule_eval_samples) */
  uint64_t batches;   /* the test batches holding them, the last one cut */
  plan_t plan; /* the eval set split across trainers */
  float *labels;      /* n, eval set order */
  size_t n, *off;     /* off[p]: where rank p's share starts (P + 1 entries) */
} oracle_eval_set_t;

typedef struct oracle_fetch_s {
  int open; /* oracle_fetch__init ran: oracle_fetch__close may */
  dpc_t *dpc;
  uint32_t n_dpc, n_train_threads, chunk;
  pthread_t *threads;
  oracle_fetcher_t *fetchers;
  uint32_t n_threads;
  /* the dataset as the data processors serve it: asked once (Info) when
   * training starts, before any batch is fetched */
  int info_running;
  int strict;
  uint64_t train_samples, test_samples;
  char warnings[3][JOBRULE_NOTE_MAX]; /* said once at start (log, summary.json) */
  char warning_resume[JOBRULE_NOTE_MAX]; /* oracle_fetch__warn: joins them at start */
  int n_warnings;
  oracle_eval_set_t eval;
  uint64_t start; /* the first batch fetched (c + 1 resumed) */
  /* shared with the fetch threads (under mu) */
  pthread_mutex_t mu;
  pthread_cond_t cv_space;
  data_batch_t **q; /* the reorder queue: batch x in q[x % q_cap] */
  uint32_t q_cap;
  uint64_t q_head; /* the next batch the loop takes */
  int stop;
  int rc; /* a fetch thread failed: err says why */
  char err[1024];
  plan_t *eval_pending; /* the evaluation set, fetched and split, until the loop takes it */
  float *eval_labels_pending;
  size_t eval_n_pending;
} oracle_fetch_t;

/* ---- oracle_pipeline.c: j->pipe */

/* One decided batch's traffic floor (plan_floor.h). */
typedef struct oracle_floor_s {
  uint64_t iteration; /* + 1; 0: none */
  uint32_t first_use, shared;
} oracle_floor_t;

/* A batch from its planning to its last Step.  In every mode but ideal the
 * cacher reads the plan from cacher_push until cacher_decide, so an entry
 * of the ring is dispatchable once decided and is freed once decided AND sent to every
 * trainer (below every trainer's next Step). */
enum { ORACLE_ENTRY_EMPTY = 0, ORACLE_ENTRY_PLANNING, ORACLE_ENTRY_READY };
typedef struct oracle_entry_s {
  uint64_t iteration;
  int state;
  int decided; /* ideal: as soon as READY; else dec holds the cacher's decisions */
  plan_t plan;
  cacher_dec_t dec;
  uint32_t *evict; /* every slot freed after x: the trainers' write_back_slots, concatenated in rank order */
  size_t n_evict;
  int ckpt;          /* a checkpoint is taken after x (set before its planning is queued) */
  uint8_t *laia_state; /* ckpt and allocation = laia: laia's state after x (laia_save, by the planning work) */
  size_t laia_len;
} oracle_entry_t;

typedef struct oracle_pipe_s {
  int open; /* oracle_pipeline__init ran: oracle_pipeline__close may */
  /* allocation */
  int policy;
  laia_t *laia;           /* allocation = laia: the rows each trainer holds (laia.h) */
  uint32_t laia_window;   /* oracle.laia_window */
  uint32_t laia_profile;  /* oracle.laia_profile */
  double laia_min_share;  /* oracle.laia_min_share */
  /* laia runs in the planning work, on the worker pool, one batch after
   * the other: batch x waits for laia_next == x (under laia_mu) */
  pthread_mutex_t laia_mu;
  pthread_cond_t laia_cv;
  uint64_t laia_next;
  int laia_rc;      /* a failed allocation: the batches after it fail too */
  int laia_said;    /* the end of laia's profile was logged */
  double laia_secs; /* spent allocating */
  /* the plans: a ring of n_plans entries, batch x in plans[x % n_plans] */
  oracle_entry_t *plans;
  uint32_t n_plans, running;
  uint32_t span;   /* batches planned ahead of the slowest trainer's next Step (<= n_plans) */
  uint64_t next;   /* next batch to plan */
  uint64_t reaped; /* entries below this one were sent to every trainer and freed */
  double plan_secs_sum, sum_unique;
  uint64_t plans_done;
  /* the dispatch window: max(oracle.window, L + 2), set once L is known */
  uint32_t window, window_cfg, window_max;
  /* the cacher (every mode but ideal) */
  int auto_l; /* L is chosen over the first `measure` plans */
  int lrpp, delayed;
  uint32_t max_l;   /* oracle.max_lookahead, or the given L */
  uint32_t L_start; /* L given or chosen; ocache may lower it */
  uint32_t L_now;   /* L of the last decision */
  int l_known;      /* L_start is set and the cacher exists */
  uint64_t cache_rows, measure, measure_ready;
  cacher_t *cache;
  int auto_running; /* cacher_auto reads the measured batches' plans on the worker pool */
  uint64_t push_next;   /* next batch to enter the cacher */
  uint64_t decide_next; /* next batch to decide */
  uint64_t slots_used, slots_peak;
  /* the traffic floor (plan_floor.h), counted as each batch is decided with
   * its L; each batch's in floor_at[x % n_floor] until report takes it
   * (decided batches run at most n_plans + window_max ahead of it) */
  plan_floor_t floor;
  int floor_open;
  oracle_floor_t *floor_at;
  uint32_t n_floor;
  double floor_secs; /* spent counting */
} oracle_pipe_t;

/* ---- oracle_dispatch.c: j->dispatch */

typedef struct oracle_dispatch_rank_s {
  uint64_t next_step;  /* next Step to send */
  uint64_t evals_sent; /* Eval items sent */
} oracle_dispatch_rank_t;

typedef struct oracle_dispatch_s {
  oracle_dispatch_rank_t *rank; /* P */
} oracle_dispatch_t;

/* ---- oracle_report.c: j->report */

typedef struct oracle_report_rank_s {
  uint64_t reported; /* reports received = the next iteration expected */
  uint8_t sha[64];   /* dense_sha256 of the last iteration's report */
  size_t sha_len;
  /* the work on this rank's partitioned tables (Report.t_partition_compute),
   * summed over this run's iterations (since the start, a resume or the
   * last recovery): all of them, and the steady ones (after the run's
   * first, before the job's last: steady_phase_seconds's) */
  double part_sum, part_steady_sum;
  uint64_t part_n, part_steady_n;
} oracle_report_rank_t;

typedef struct oracle_agg_s { /* one iteration's reports, summed */
  uint64_t iteration;
  uint32_t reports;
  double loss_sum;
  uint64_t samples, rows_fetched, rows_synced, rows_synced_delayed, rows_replicated, rows_written_back, cache_hits;
  double t[PHASE_N_REPORT];
  int floor_known;     /* set as the iteration completes: its traffic floor (oracle_pipeline__floor) */
  uint64_t floor_rows; /* first uses + shared */
} oracle_agg_t;

typedef struct oracle_eval_round_s {
  struct oracle_eval_round_s *next;
  uint64_t round, after;
  uint32_t received;
  uint8_t *got;  /* P flags */
  float *logits; /* N, in the order of the eval set */
} oracle_eval_round_t;

typedef struct oracle_eval_rec_s {
  uint64_t round, after;
  double logloss, auc;
} oracle_eval_rec_t;

typedef struct oracle_report_s {
  int open; /* oracle_report__init ran: oracle_report__close may */
  oracle_report_rank_t *rank; /* P */
  uint64_t rounds_total, tail_start, log_every;
  oracle_agg_t *agg; /* n_agg >= any dispatch window, by x % n_agg */
  uint32_t n_agg;
  uint64_t done;  /* iterations every trainer has reported */
  uint64_t start; /* the first iteration of this run (c + 1 resumed, else 0) */
  double seconds_before; /* training time of the runs before a resume */
  /* evaluation */
  oracle_eval_round_t *rounds; /* rounds still collecting EvalResults */
  uint64_t evals_done;
  uint32_t evals_running;
  int labels_warned;
  oracle_eval_rec_t evals[ORACLE_EVAL_HISTORY]; /* the last ones, by n_evals % ORACLE_EVAL_HISTORY */
  uint64_t n_evals;
  double last_test_logloss, last_test_auc;
  /* statistics */
  double t_start, t_last, t_last_log, ema_dt;
  uint64_t done_at_last_log;
  double loss_last, tail_loss_sum, loss_ring[ORACLE_LOSS_RING];
  uint64_t tail_n;
  double sum_rows_fetched, sum_rows_synced, sum_rows_synced_delayed, sum_rows_replicated, sum_rows_written_back,
      sum_cache_hits, sum_t[PHASE_N_REPORT];
  /* the traffic floor over this run's iterations (not in a checkpoint: a
   * resumed or recovered run counts from its own start) */
  double sum_floor_first_use, sum_floor_shared;
  uint64_t floor_n;
  double first_t[PHASE_N_REPORT]; /* iteration 0's phases (its wait holds the start: the measured batches, choosing L, the first plans) */
  double t_first_done;         /* when iteration 0 completed */
  double last_t[PHASE_N_REPORT]; /* the job's last iteration's phases (its write-back ends the job), this run's */
  double t_before_last;        /* when the iteration before the last one completed (0: not in this run) */
  char dense_hex[160];
  /* the timeline (oracle_timeline.c): its file, and what it sums between two lines */
  FILE *tl;
  double tl_t, tl_loss, tl_phase[PHASE_N_REPORT], tl_rows[4], tl_floor;
  uint64_t tl_n, tl_floor_n;
} oracle_report_t;

/* ---- oracle_timeline.c: oracle.state_dir/timeline.jsonl (j->report.tl*) */

void oracle_timeline__open(oracle_job_t *j);
void oracle_timeline__close(oracle_job_t *j);
/* After iteration a completed (report's done already counts it) at now
 * (oracle_job__now, the report's own reading of the clock). */
void oracle_timeline__iteration(oracle_job_t *j, const oracle_agg_t *a, double loss, double now);
void oracle_timeline__eval(oracle_job_t *j, uint64_t after, double auc, double logloss);
void oracle_timeline__checkpoint(oracle_job_t *j, const char *id, uint64_t iteration, double seconds);
void oracle_timeline__state(oracle_job_t *j, const char *state);

/* ---- oracle_ckpt.c: j->ckpt */

/* One checkpoint, from the decision of its iteration c to its end. */
typedef struct oracle_cp_s {
  struct oracle_cp_s *next;
  char id[96];
  uint64_t iteration;      /* c: the model after iteration c */
  cacher_flush_t *flush;   /* P: the rows each trainer writes back without evicting */
  uint8_t *laia_state;     /* allocation = laia: laia after c */
  size_t laia_len;
  uint8_t *sent;           /* P flags: CheckpointWork queued */
  uint32_t acks;           /* CheckpointDone received */
  uint64_t rows_flushed, dense_bytes;
  double trainer_secs;     /* the slowest trainer's part (flush, dense blob) */
  double t_first_sent, t_acked; /* when the first CheckpointWork went out; when every trainer answered */
  double t_reported;       /* every trainer reported c: the stall (Step c + 1 held back) runs from here to the end */
  int running;             /* the servers' part is on the worker pool */
  int fencing, fenced;     /* Fence(c) on every server: asked; every server answered (Step c + 1 may go) */
  double ema_before;       /* the mean iteration time when every trainer reported c (the stall's baseline) */
  double unix_started;     /* when c was decided (oracle_job_checkpoints) */
} oracle_cp_t;

/* What the last complete checkpoint took (reporting). */
typedef struct oracle_cp_report_s {
  char id[96];
  uint64_t iteration, rows_flushed, dense_bytes, bytes_total;
  uint64_t *bytes; /* per server */
  double stall, total, trainer_secs, server_secs, unix_time;
} oracle_cp_report_t;

typedef struct oracle_ckpt_s {
  int open;
  int enabled;             /* the job has embedding servers (not ideal, cluster.embedding set) */
  uint64_t every, seconds, keep;
  const char *state_dir;
  embc_t *embc;            /* worker-pool calls only */
  uint32_t S;
  uint64_t layout_hash, schema_hash; /* this job's: a resume must match them */
  oracle_cp_t *head, *tail; /* in iteration order; the head is the oldest not complete */
  uint64_t asap_at;        /* chanter checkpoint: this batch (UINT64_MAX: none) */
  double t_last;           /* when the last checkpoint was placed (checkpoint_seconds) */
  int running;             /* a worker-pool call (preflight, start, servers' part) is out */
  /* the start */
  uint64_t start;          /* the first iteration of this run: c + 1 resumed, else 0 */
  int resumed;
  char resume_id[96];
  char resume_blob[160];   /* the dense state's blob (the manifest's dense_blob) */
  uint32_t resume_server;
  uint8_t *resume_sent;    /* P flags: ResumeWork queued */
  struct ck_work_s *start_done; /* a start's work (check, fresh, resume, roll-back) came back: advance decides */
  struct ck_work_s *done_head, *done_tail; /* a checkpoint's works that came back, in order: oracle_ckpt__collect */
  /* reporting */
  uint64_t n_done;
  double stall_sum, total_sum;
  uint64_t n_stall;
  /* the stall of the last complete checkpoint, measured once the first
   * iteration after its end is in: the wall time from c to that iteration
   * beyond what those iterations took before c */
  int stall_pending;
  uint64_t stall_c, stall_done_at_end;
  double stall_t0, stall_ema;
  oracle_cp_report_t last;
  oracle_ckpt_info_t recent[ORACLE_CKPT_RECENT]; /* the last complete ones, by n_recent % ORACLE_CKPT_RECENT */
  uint64_t n_recent;
  metrics_counter_t *m_count;
  metrics_gauge_t *m_stall, *m_total, *m_bytes, *m_iteration;
} oracle_ckpt_t;

/* ---- oracle_probe.c: j->probe */

typedef struct oracle_probe_s {
  int open;                /* the timer is initialized */
  int running;             /* a probe is on the worker pool */
  int durable;             /* embedding.sync_writes: a restarted server lost nothing it acknowledged */
  uv_timer_t timer;
  uint64_t *inc;           /* S: each server's incarnation as last seen (0: not yet) */
  double *down_since;      /* S: when it stopped answering (0: it answers) */
  double *last_answer;     /* S: unix seconds of its last answer (0: none yet) */
  uint64_t *restarts_of;   /* S: its restarts seen */
  uint64_t restarts;
  metrics_counter_t *m_restarts;
  /* a full disk (StatsResponse.disk_full): S entries; the job is paused while
   * one is full, and fails once one was full for disk_full_s */
  struct oracle_disk_s {
    int full;
    double since;             /* unix seconds, the server's */
    uint64_t free, total;     /* bytes */
    char dir[256];            /* its data dir */
    metrics_gauge_t *g_full;  /* chanter_oracle_embedding_disk_full{server="s"} */
  } *disk;
  double disk_full_s; /* embedding.disk_full_timeout_s */
} oracle_probe_t;

/* ---- the job (oracle_job.c) */

typedef struct oracle_trainer_s {
  rpc_call_t *call; /* the Work stream, NULL when none */
} oracle_trainer_t;

struct oracle_job_s {
  uv_loop_t *loop;
  const cfg_t *cfg;
  /* the job's shape, from the configuration: every stage reads it */
  uint32_t P, B;
  uint64_t iterations, eval_every, eval_batches, seed;
  int ideal, drain_ms;
  const char *mode, *allocation, *lookahead_cfg;
  char job_id[96];
  /* table_strategy (strategy.h): partitioned[t] = table t is partitioned (outside
   * the cache; every Step names its owner, partition_owner[t]); NULL when
   * every table is cached, and always in ideal mode */
  uint8_t *partitioned;
  uint32_t *partition_owner; /* n_tables: owner rank or STRATEGY_OWNER_NONE */
  char (*strat_why)[240]; /* n_tables: why each table has its strategy (summary.json "tables") */
  uint8_t *strat;         /* n_tables: table_strategy as given (auto entries until chosen) */
  shard_place_t place;    /* shard.placement: where the partitioned tables go (shard_place.h) */
  shard_cost_t *auto_cost; /* table_strategy = auto's cost model (strategy.auto_cost = model), else NULL */
  int have_place;
  int part_any;           /* table_strategy names partition or auto (not ideal): Steps carry part fields */
  int strat_pending;      /* an auto table is not chosen yet: nothing is cached before (oracle_pipeline.c) */
  int strat_running;      /* the choice runs on the worker pool */
  uint32_t n_tables;
  data_schema_t schema;   /* the tables' shape (hotness, rows) and ... */
  table_layout_t layout;  /* ... their rows' layout, from the job (read-only after create) */
  int have_schema;
  /* the state machine: state is written by set_state (oracle_job.c) only */
  int state;
  char message[1536];
  int fail_rc; /* a stage failed (oracle_job__error): advance ends the job with fail_why */
  char fail_why[1536];
  int advancing, again; /* advance is running; run it once more */
  int destroying;
  oracle_trainer_t *tr; /* P */
  uint32_t attached;
  /* recovery (DESIGN.md 5; oracle_recover.h) */
  uint32_t generation;       /* the trainer group's generation (Join's answer) */
  metrics_registry_t *reg;   /* where its metrics live (a successor's go there too) */
  uint64_t write_epoch;            /* the servers' write epoch of this run (raised at every start; Step.write_epoch) */
  int recover;               /* created to recover: the servers roll back before the trainers attach */
  int rolled_back;           /* ... and they have */
  oracle_recoveries_t *recs; /* the service's record (NULL: a lost trainer fails the job) */
  oracle_recovery_t *rec;    /* the recovery this job object carries out, or NULL */
  int lost;                  /* a daemon was lost: advance ends this job object to recover */
  char lost_kind[16], lost_who[32], lost_why[512];
  int lost_rank;
  int soft_rank;             /* a trainer that closed its stream mid-job (a step failed on it): lost if nothing else is */
  uint64_t soft_at;
  int retired;               /* this object ended to recover (not a state: the service replaces it) */
  /* chanter scale (oracle_scale.c): the run ends once checkpoint scale_at is complete; the successor has scale_to
   * trainers (0: none asked) */
  uint32_t scale_to;
  uint64_t scale_at;
  /* chanter scale --embedding-servers: the successor has scale_servers servers (0: none asked); scale_union lists
   * the old and the new ones' addresses, comma-separated (malloc'ed) */
  uint32_t scale_servers;
  double scale_asked; /* when (unix seconds) */
  char *scale_union, *scale_cluster; /* ... and the new ones' (the first scale_servers) */
  /* a successor of such a scale: its roll-back first moves checkpoint reshape_ckpt's rows from reshape_from servers
   * onto its own, server to server (reshape_union: every address, malloc'ed); the rows and bytes moved */
  uint32_t reshape_from;
  char reshape_ckpt[96];
  char *reshape_union;
  uint64_t reshape_rows, reshape_bytes;
  int reshape_done; /* the move is complete (<reshape_ckpt>.s<N> sealed): a later run does not move again */
  void (*on_recover)(oracle_job_t *j, void *ud);
  void (*on_state)(oracle_job_t *j, int from, int to, void *ud);
  void *on_recover_ud; /* (both callbacks') */
  /* chanter train --resume / --fresh on a blocked job: advance starts it */
  struct {
    int asked, fresh;
    char want[96];
  } start_req;
  uv_timer_t recover_timer;  /* calls on_recover from the loop, once retired */
  uv_timer_t soft_timer;     /* soft_rank's grace */
  uv_timer_t retire_timer;   /* polls a retired object until nothing of it runs, then frees it */
  uv_async_t wake; /* a fetch thread has something for the loop: advance */
  uv_timer_t start_timer;
  int handles_open;
  oracle_metrics_t m;
  /* the stages */
  oracle_fetch_t fetch;
  oracle_pipe_t pipe;
  oracle_dispatch_t dispatch;
  oracle_report_t report;
  oracle_ckpt_t ckpt;
  oracle_probe_t probe;
};

static inline double oracle_job__now(void) { return clock_mono_s(); }

static inline int oracle_job__over(const oracle_job_t *j) {
  return j->state == ORACLE_DONE || j->state == ORACLE_FAILED || j->state == ORACLE_STOPPED || j->retired;
}
/* Training, and not retired. */
static inline int oracle_job__training(const oracle_job_t *j) { return j->state == ORACLE_TRAINING && !j->retired; }

/* ---- the lifecycle (the table at the top of oracle_job.c) */

/* What moves a job from one state to the next.  FAIL and STOP leave every
 * state but the three ends. */
enum {
  ORACLE_EV_CREATE = 0, /* the job object exists */
  ORACLE_EV_RECOVER,    /* ... and was created to recover: the servers roll back */
  ORACLE_EV_ATTACHED,   /* every trainer attached: the servers are checked */
  ORACLE_EV_EMPTY,      /* the servers hold nothing: the job's stamp goes on them */
  ORACLE_EV_BLOCK,      /* they hold another job's state (or a resume was refused) */
  ORACLE_EV_START,      /* chanter train --resume / --fresh */
  ORACLE_EV_LEFT,       /* the servers are ready but a trainer left before the start */
  ORACLE_EV_READY,      /* the servers are ready and every trainer attached: training */
  ORACLE_EV_FINISHED,   /* every iteration and evaluation in, the replicas agree */
  ORACLE_EV_FAIL,       /* an error (a stage's, a timeout, a recovery refused) */
  ORACLE_EV_STOP,       /* Stop, SIGTERM */
  ORACLE_N_EVENTS
};
/* The state event ev leads to from state, or -1 when the table has no
 * such transition.  Pure (the tests walk it). */
int oracle_job__next_state(int state, int ev);
/* The state's own name ("checking", "starting" where oracle_state_name
 * says "waiting"); the event's. */
const char *oracle_job__state_label(int state);
const char *oracle_job__event_name(int ev);

/* ---- oracle_job.c */

/* Says why the job must fail: the first reason wins, and none is kept
 * once the job is over.  Returns rc (a negative error or a project code),
 * for `return oracle_job__error(j, rc, ...)`. */
int oracle_job__error(oracle_job_t *j, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Says that a daemon was lost (kind "trainer", "hang", "embedding"; who
 * "trainer-1"; rank the trainer's or -1): advance ends this job object and
 * the service recovers the job with a new one.  Without a record of
 * recoveries (recs NULL) it is oracle_job__error. */
void oracle_job__lose(oracle_job_t *j, const char *kind, const char *who, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The conductor: ends the job if a stage failed, else runs the stages in
 * order until nothing more can move.  Every event ends by calling it;
 * re-entered, it runs once more instead. */
void oracle_job__advance(oracle_job_t *j);

/* ---- oracle_job_shape.c */

/* The tables' schema, layout and strategies from the configuration (an
 * auto table waits: strat_pending).  0 or an error with err. */
int oracle_job__strategy_init(oracle_job_t *j, char *err, size_t err_len);
/* The job's metrics on reg (j->m). */
void oracle_job__metrics_init(oracle_job_t *j, metrics_registry_t *reg);
/* The tables' strategies are strat (no auto left): places the partitioned
 * ones (partition_owner, partitioned), logs them, ends strat_pending.  The plans
 * already made still hold every table's keys: the caller drops them.  0 or
 * -ENOMEM. */
int oracle_job__strategy_set(oracle_job_t *j, const uint8_t *strat);

/* ---- oracle_scale.c */

/* While training, after the stages: 1 once the checkpoint a scale waits
 * for is complete (advance ends the run: the successor has scale_to
 * trainers); notes a scaled run's first iteration done. */
int oracle_scale__due(oracle_job_t *j);
/* "a,b" into a list (cfg_list_free): 0 or -ENOMEM. */
int oracle_scale__split(const char *s, char ***out, size_t *n);
/* A successor's reshape is done: the scale's record gets what moved, and from which checkpoint. */
void oracle_scale__moved(oracle_job_t *j, uint64_t rows, uint64_t bytes, double seconds, const char *id,
                         uint64_t iteration);
/* What the job record says of a scale under way (set_state, the requests): the configuration's fingerprint to
 * record (after a scale of the trainers, at once) and the scale of the embedding servers (scale->addrs borrowed
 * from j; scale->to = 0: none). */
void oracle_scale__record(const oracle_job_t *j, char conf[65], oracle_record_scale_t *scale);
/* A scale of either kind is under way. */
int oracle_scale__asked(const oracle_job_t *j);
/* What the scale did, for the run's last message. */
void oracle_scale__what(const oracle_job_t *j, char *out, size_t cap);
/* A successor's reshape from its options (oracle_job_create), and its fields freed. */
int oracle_scale__init(oracle_job_t *j, const oracle_job_opts_t *o);
void oracle_scale__free(oracle_job_t *j);
/* The successor's options of a scale of the embedding servers carried out (oracle_job_successor), or of a
 * move that did not complete (the successor moves again from the old servers' checkpoint). */
void oracle_scale__successor(const oracle_job_t *old, oracle_job_opts_t *o);
/* A move in flight: a loss waits for it to come back (advance), so that two runs never move at once. */
int oracle_scale__moving(const oracle_job_t *j);
/* The roll-back w failed in the move: 1 when it is taken as a lost embedding server (the next run moves again
 * from the checkpoint on the old servers; oracle.max_recoveries counts it), 0 when the job fails as before. */
struct ck_work_s;
int oracle_scale__move_failed(oracle_job_t *j, const struct ck_work_s *w);

/* ---- oracle_probe.c */

/* The embedding servers' probe, once a second while training (after
 * oracle_ckpt__init: it uses its client).  0 or -ENOMEM. */
int oracle_probe__init(oracle_job_t *j, metrics_registry_t *reg);
/* No more probes; whether one is on the worker pool; closing the timer
 * (counted in handles_open, cb on close); the memory. */
void oracle_probe__stop(oracle_job_t *j);
int oracle_probe__busy(const oracle_job_t *j);
void oracle_probe__close_handle(oracle_job_t *j, uv_close_cb cb);
void oracle_probe__free(oracle_job_t *j);
/* The servers' incarnations when the run's epoch was raised (0: unknown):
 * a restart after that is one the probe must see. */
void oracle_probe__baseline(oracle_job_t *j, const uint64_t *incs, uint32_t n);
/* 1 with a sentence in why when the probe last saw an embedding server
 * whose data dir is full (the job is paused for it: its writes and
 * checkpoints wait), else 0 (why ""). */
int oracle_probe__disk_full(const oracle_job_t *j, char *why, size_t why_len);
/* An iteration completed: while a server is seen disk-full, the next probe
 * comes at once (the pause may be over: it is said without waiting for the
 * once-a-second probe).  Loop thread. */
void oracle_probe__progress(oracle_job_t *j);

/* ---- oracle_fetch.c */

/* The data processors' channels, the reorder queue, the fetch threads'
 * lock.  0 or an error with err. */
int oracle_fetch__init(oracle_job_t *j, char *err, size_t err_len);
/* Training starts: ask the data processors what they serve (Info, on the
 * worker pool), then size the evaluation set and start the fetch threads
 * (at once when there is nothing to fetch).  0 or an error (said). */
int oracle_fetch__begin(oracle_job_t *j);
/* Takes what the fetch threads posted: the evaluation set
 * (ORACLE_CH_EVAL_SET), or their failure (an error, said). */
int oracle_fetch__collect(oracle_job_t *j);
/* Batch x if it is next in the reorder queue and has arrived (the caller
 * owns it), else NULL: the fetch threads wake the loop when it does. */
data_batch_t *oracle_fetch__take(oracle_job_t *j, uint64_t x);
/* Tells the fetch threads (and the Info call) to stop.  Any thread. */
void oracle_fetch__stop(oracle_job_t *j);
/* Waits at most drain_ms + 1 s for the fetch threads; returns how many
 * are still running (stuck retrying a dead data processor). */
int oracle_fetch__join(oracle_job_t *j);
/* A sentence for the job's warnings (the log and summary.json). */
void oracle_fetch__warn(oracle_job_t *j, const char *msg);
/* Frees the queue, the channels, the evaluation set.  After join found
 * every thread gone. */
void oracle_fetch__close(oracle_job_t *j);

/* ---- oracle_pipeline.c */

/* Allocation (laia), the plan ring, the dispatch window, the lookahead
 * settings.  0 or an error with err. */
int oracle_pipeline__init(oracle_job_t *j, char *err, size_t err_len);
/* lookahead = 0 (not ideal): the cacher now, there is nothing to choose
 * (lookahead = auto or N waits for the measured batches).  0 or -ENOMEM. */
int oracle_pipeline__start(oracle_job_t *j);
/* Frees the entries every trainer has been sent, then queues the next
 * batches for planning on the worker pool while the plan span allows.
 * ORACLE_CH_PLANNING, 0, or an error (said). */
int oracle_pipeline__plan(oracle_job_t *j);
/* The cacher: starts choosing L (auto) once the measured batches are planned; pushes
 * planned batches in order and decides at most one.  ORACLE_CH_DECIDED,
 * 0, or an error (said). */
int oracle_pipeline__cache(oracle_job_t *j);
/* Batch x's entry if it is planned and decided, else NULL. */
const oracle_entry_t *oracle_pipeline__decided(const oracle_job_t *j, uint64_t x);
/* The job is over: frees the plans not in use on the worker pool, logs
 * laia's statistics. */
void oracle_pipeline__end(oracle_job_t *j);
/* Batch x's traffic floor (rows first used in its window, rows shared):
 * 1 once x is decided, 0 before (or in mode ideal, which has no cache).
 * Report takes it when x completes. */
int oracle_pipeline__floor(const oracle_job_t *j, uint64_t x, uint32_t *first_use, uint32_t *shared);
/* laia's statistics and the time it took (allocation = laia only). */
void oracle_pipeline__laia_stats(const oracle_job_t *j, laia_stats_t *ls, double *secs);
void oracle_pipeline__close(oracle_job_t *j);

/* ---- oracle_dispatch.c */

int oracle_dispatch__init(oracle_job_t *j);
/* Sends each trainer what it may have now: Steps within the window,
 * decided, and the Evals due after them, while its send queue has room.
 * ORACLE_CH_SENT or 0 (a send that fails is the stream's end: its cancel
 * handler says why). */
int oracle_dispatch__run(oracle_job_t *j);
/* Queues StopWork (reason, the job's state) on call. */
void oracle_dispatch__stop_work(rpc_call_t *call, const char *reason, int state);
/* Queue on rank p's stream: checkpoint cp's CheckpointWork; the
 * ResumeWork of a resumed job (j->ckpt's resume_*).  0 or the send's
 * error.  (oracle_ckpt__dispatch says when.) */
int oracle_dispatch__checkpoint(oracle_job_t *j, uint32_t p, const oracle_cp_t *cp);
int oracle_dispatch__resume(oracle_job_t *j, uint32_t p);
void oracle_dispatch__close(oracle_job_t *j);

/* ---- oracle_report.c */

int oracle_report__init(oracle_job_t *j);
/* Training starts: the clocks behind samples_per_sec. */
void oracle_report__start(oracle_job_t *j);
/* A Report or EvalResult from rank (m, decoded here).  0; -EINVAL for a
 * protocol error, with the sentence in why (the caller ends the stream and
 * fails the job); or another error (said). */
int oracle_report__message(oracle_job_t *j, uint32_t rank, const Chanter__Oracle__V1__TrainerMessage *m, char *why,
                           size_t why_len);
/* Whether the job is complete: ORACLE_CH_FINISHED once every iteration and
 * evaluation is in and every rank's dense parameters agree; 0; or an
 * error (said) when they differ. */
int oracle_report__finished(oracle_job_t *j);
/* The evaluation schedule: rounds due after iterations 0..x; the
 * iteration after which round r is due. */
uint64_t oracle_report__rounds_upto(const oracle_job_t *j, uint64_t x);
uint64_t oracle_report__round_after(const oracle_job_t *j, uint64_t r);
/* oracle_job_summary. */
char *oracle_report__summary(const oracle_job_t *j);
void oracle_report__close(oracle_job_t *j);

/* ---- oracle_ckpt.c */

/* Configuration, the embedding servers' client, metrics.  0 or an error
 * with err. */
int oracle_ckpt__init(oracle_job_t *j, metrics_registry_t *reg, char *err, size_t err_len);
/* The start's calls to the embedding servers, queued on the worker pool;
 * what they found comes back to advance (oracle_ckpt__start_done), which
 * decides.  check: what the servers hold (nothing, or another job's
 * state).  start: --fresh (clear them; quiet: nothing to clear, a check
 * found them empty) or --resume (restore checkpoint want), then the job's
 * stamp.  rollback: a job created to recover rolls the servers back to the
 * job's latest complete checkpoint (or its start), before the trainers
 * attach (their parked write-backs are released by it).  0 or an error
 * (said). */
int oracle_ckpt__check(oracle_job_t *j);
int oracle_ckpt__start(oracle_job_t *j, int fresh, int quiet, const char *want);
int oracle_ckpt__rollback(oracle_job_t *j);
/* The start's call that came back (the caller frees it with
 * oracle_ckpt__work_free), or NULL while none did. */
struct ck_work_s *oracle_ckpt__start_done(oracle_job_t *j);
void oracle_ckpt__work_free(struct ck_work_s *w);
/* The job goes on from checkpoint m (resumed, or rolled back to): the
 * ResumeWork every trainer gets first. */
void oracle_ckpt__resumed(oracle_job_t *j, const manifest_t *m);
/* Whether a checkpoint is taken after batch x (asked once per batch, in
 * order, when its planning is queued). */
int oracle_ckpt__wanted(oracle_job_t *j, uint64_t x);
/* Batch x, a checkpoint batch, was decided: the cacher's flush lists (the
 * cacher has not decided x + 1) and laia's state from the entry.  0 or an
 * error (said). */
int oracle_ckpt__decided(oracle_job_t *j, oracle_entry_t *s, cacher_t *cache);
/* Dispatch, for rank p whose next Step is x: 1 when an item went out
 * (ResumeWork, or the CheckpointWork due after x - 1), 0 when Step x may
 * go, -1 when Step x must wait (a checkpoint before it is not complete). */
int oracle_ckpt__dispatch(oracle_job_t *j, uint32_t p, uint64_t x);
/* A CheckpointDone from rank p.  0, or -EINVAL with why (protocol error). */
int oracle_ckpt__message(oracle_job_t *j, uint32_t p, const Chanter__Oracle__V1__CheckpointDone *m, char *why,
                         size_t why_len);
/* The conductor, first in every pass while training: what the servers
 * answered for a checkpoint (a fence: Step c + 1 may go; the servers'
 * part: the checkpoint is complete).  0, or an error (said); a server
 * lost is said with oracle_job__lose (advance recovers). */
int oracle_ckpt__collect(oracle_job_t *j);
/* The conductor: the servers' part of a checkpoint every trainer has
 * answered (on the worker pool).  0 or an error (said). */
int oracle_ckpt__run(oracle_job_t *j);
/* A checkpoint is still under way (the job is not finished before it). */
int oracle_ckpt__busy(const oracle_job_t *j);
/* ---- oracle_ckpt_state.c and oracle_ckpt_work.c (the stage's other rooms) */

#define ORACLE_PROBE_MAX_SERVERS 256 /* servers whose incarnation a start records (more: the probe's first answer) */
/* A call to the embedding servers on the worker pool, and its result for
 * ck_done (oracle_ckpt.c) on the loop, which keeps a start's for advance. */
enum { W_PREFLIGHT, W_FRESH, W_RESUME, W_FENCE, W_SERVERS, W_RECOVER };
typedef struct ck_work_s {
  uv_work_t req;
  oracle_job_t *j;
  int kind;
  int rc;
  char err[2048], warn[1024];
  /* preflight: what the servers hold */
  int empty;
  char found[1024];
  /* resume; recover: the servers' job stamp ("" when none), whether a
   * checkpoint was restored (else the servers were cleared: the start) */
  char want[96];
  char stamp_id[96];
  int restored;
  uint64_t write_epoch;  /* fresh, resume, recover: the write epoch the servers were raised to */
  uint64_t incs[ORACLE_PROBE_MAX_SERVERS]; /* ... and each server's incarnation then (the probe's baseline) */
  manifest_t m;
  uint8_t *ostate;
  size_t ostate_len;
  /* servers */
  oracle_cp_t *cp;
  uint8_t *oblob;
  size_t oblob_len;
  uint64_t *bytes;
  manifest_t job;
  double secs;
  uint64_t rows_moved, bytes_moved; /* recover: a scale of the embedding servers (oracle_scale.c) */
  int reshaped;                     /* ... its move complete (1), or nothing to move (2: oracle_scale.c) */
  double move_seconds;
  char reshape_id[96];              /* ... the old servers' checkpoint it moved, and its iteration */
  uint64_t reshape_iter;
  char pruned[512];
  struct ck_work_s *next; /* on the list of works that came back */
} ck_work_t;

/* The work of w->kind (uv_work_cb). */
void oracle_ckpt__work(uv_work_t *req);
/* Tests only (NULL otherwise): when set, it does the work instead of the
 * embedding servers (worker pool), filling in w's results. */
extern void (*oracle_ckpt__work_fake)(ck_work_t *w);
/* This job's fingerprint as a manifest (the per-checkpoint fields empty). */
void oracle_ckpt__job_manifest(const oracle_job_t *j, manifest_t *m);
/* 0 when the job may go on from checkpoint m (warn: a sentence for changes
 * that keep the model only up to summation order), else ERR_CONFIG with
 * the field that differs. */
int oracle_ckpt__check_manifest(const oracle_job_t *j, const manifest_t *m, char *err, size_t err_len,
                                char *warn, size_t warn_len);
/* The oracle's state after cp's iteration as a blob (malloc'ed). */
int oracle_ckpt__state_encode(const oracle_job_t *j, const oracle_cp_t *cp, uint8_t **out, size_t *len);
/* A state blob back into every stage: the job goes on at c + 1.  0 or an
 * error with err (a damaged or truncated blob, ERR_BADMSG; a blob of
 * another version, ERR_CONFIG naming both; laia's state refused). */
int oracle_ckpt__state_load(oracle_job_t *j, const uint8_t *p, size_t n, char *err, size_t err_len);

/* The oracle's state in a checkpoint, decoded (oracle_ckpt__state_load):
 * the job goes on at iteration + 1; laia points into the blob. */
typedef struct oracle_ostate_s {
  uint64_t iteration, P, evals_done, n_evals, n_hist, tail_n, n_loss, l_start, n_done;
  oracle_eval_rec_t hist[ORACLE_EVAL_HISTORY];
  double last_ll, last_auc, loss_last, tail_sum, loss[ORACLE_LOSS_RING];
  double sums[6], sum_t[PHASE_N_REPORT], first_t[PHASE_N_REPORT], seconds, stall_sum, total_sum;
  const uint8_t *laia;
  size_t laia_len;
  uint64_t n_strat;
  uint8_t strat[TABLE_MAX];
} oracle_ostate_t;
/* Each stage takes its part of o back (state_load calls them in this
 * order; only the pipeline's may refuse, with err: laia's state). */
int oracle_pipeline__restore(oracle_job_t *j, const oracle_ostate_t *o, char *err, size_t err_len);
void oracle_fetch__restore(oracle_job_t *j, const oracle_ostate_t *o);
void oracle_dispatch__restore(oracle_job_t *j, const oracle_ostate_t *o);
void oracle_report__restore(oracle_job_t *j, const oracle_ostate_t *o);
void oracle_ckpt__restore(oracle_job_t *j, const oracle_ostate_t *o);
/* table_strategy = auto: the choice the checkpointed run made (the job's
 * own part, oracle_job_shape.c).  0 or an error with err. */
int oracle_job__strategy_restore(oracle_job_t *j, const oracle_ostate_t *o, char *err, size_t err_len);

/* The summary's "checkpoint" object (appended to b). */
void oracle_ckpt__summary(const oracle_job_t *j, char *out, size_t cap);
void oracle_ckpt__close(oracle_job_t *j);

#endif
