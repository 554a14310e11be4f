/*
 * oracle_job: one training job as the oracle runs it (DESIGN.md sections 3
 * and 4): in mode ideal without any embedding traffic, in every other mode
 * with the lookahead cacher (cacher.h) deciding, batch by batch, what
 * each trainer fetches into which cache slot, synchronizes (critical or
 * delayed) and writes back and evicts.
 *
 * Lifecycle (the table at the top of oracle_job.c): waiting (trainers
 * join and open their Work streams) -> the embedding servers checked and
 * started (or blocked until chanter train --resume / --fresh) -> training
 * -> done | failed | stopped; a lost daemon ends this job object and a new
 * one recovers the job.  The job then keeps answering Status until the
 * daemon exits.
 *
 * Threads and queues.
 *  - At the start of training, before any batch is fetched, one Info call
 *    (worker pool; the processors in turn, retried until rpc.timeout_ms)
 *    gives the sizes of the train and test splits.  A batch larger than a
 *    split (jobrule_batch_notes) is logged once as a warning and listed in
 *    the summary's "warnings", or, with strict = true, fails the job with
 *    that message; the evaluation set is cut to the test split, so that
 *    no test sample is scored twice (jobrule_eval_samples).
 *  - Fetch threads (2 per data processor, at most 16) pull the train
 *    batches 0..iterations-1 with dpc_stream in chunks of C batches, C = 1
 *    mod the number of processors, so chunk k starts at a batch number that
 *    dpc sends to processor k mod n: every processor serves two streams at
 *    once.  They put batches into a bounded reorder queue (batch x in slot
 *    x mod Q, a thread waits while x >= head + Q) and wake the loop with a
 *    uv_async (the conductor runs).  One more thread fetches the
 *    evaluation set (eval_batches test batches, at most the test split:
 *    the last batch cut), concatenates it and plans its split across
 *    trainers.
 *  - The loop thread pops batches in order and hands each to libuv's worker
 *    pool for planning (plan_build; at most 2 at once, at most
 *    L + window + 3 planned batches not yet sent to every trainer; ideal:
 *    window + 2).  Plans keep each batch's distinct keys and their users
 *    (PLAN_KEYS); ideal plans have no key lists at all.
 *  - The cacher (loop, every mode but ideal): planned batches enter it in
 *    order (cacher_push) and batch x is decided (cacher_decide) once x + L
 *    has entered, or the last batch has.  lookahead = N starts at L = N;
 *    lookahead = auto first waits for the first oracle.measure_batches batches
 *    to be planned and picks, on the worker pool, the largest L <=
 *    oracle.max_lookahead whose exact slot need over them fits cache_rows
 *    (the job fails if even L = 0 does not).  The cacher lowers L when the
 *    cache runs full (logged); a batch that does not fit even at L = 0
 *    fails the job.  A plan lives until it is decided and sent to every
 *    trainer.
 *  - Dispatch (loop): trainer p gets Step x once x is planned (and
 *    decided), x < (the iterations every trainer has reported) + window,
 *    window = max(oracle.window, L + 2) so that trainers can prefetch L
 *    batches ahead, and its send queue holds fewer than 2 messages
 *    (rpc_call_queued; a message sent and every report run the conductor
 *    again).  An Eval item follows Step x directly on the stream when an
 *    evaluation is due after x, so a trainer evaluates the model exactly as
 *    it is after x without the oracle stalling.
 *  - A Step carries, besides the samples: the slot of each id; the rows to
 *    fetch and their slots; the rows to write back and their slots; the
 *    slots all-reduced before the next step (sync_critical) and in the
 *    background (sync_delayed), both the same on every trainer; every slot
 *    freed after the step (evict_slots: all trainers' write-back slots, in
 *    rank order, the same list on every trainer); the prefetch gate (fetch
 *    once every trainer finished the iterations below it); L; the trainer's
 *    cache hits.  Slots are little-endian uint32, keys little-endian
 *    uint64.  sync_keys stays empty.
 *  - Reports are aggregated per iteration once all P arrived (in order,
 *    since each trainer reports in order); EvalResults per round, whose
 *    logloss and AUC (the model library's eval_logloss / eval_auc) are
 *    computed on the worker pool.
 *
 * The stages above are files of their own (oracle_fetch.c,
 * oracle_pipeline.c, oracle_dispatch.c, oracle_report.c), run in that
 * order by one conductor in oracle_job.c, which alone ends a job;
 * oracle_job_internal.h says how they share it.
 *
 * Every function here runs on the loop thread; the job owns the Work
 * stream calls it was given with oracle_job_attach (it finishes them).
 */
#ifndef CHANTER_ORACLE_JOB_H
#define CHANTER_ORACLE_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cfg.h"
#include "err.h"
#include "metrics.h"
#include "oracle.pb-c.h"
#include "rpc.h"

typedef struct oracle_job_s oracle_job_t;

/* The job's states (the lifecycle table at the top of oracle_job.c says
 * what leaves each).  The first seven are reported as they are named: on
 * the wire (Status, Join's and StopWork's job_state), in the log and in
 * the job_state metric, whose values are their numbers.  CHECKING (the
 * embedding servers are checked before the start) and STARTING (they are
 * cleared, restored or stamped) are reported as "waiting", as they always
 * were.  BLOCKED: every trainer is attached but the embedding servers hold
 * another job's state; the job waits for oracle_job_start_request
 * (chanter train --resume / --fresh).  RECOVERING: a job object created
 * after a daemon was lost (DESIGN.md 5) rolls the servers back to the
 * job's latest complete checkpoint and waits, like WAITING, for every
 * trainer to join the new generation.  (The object it replaces is not in
 * a state of its own: it is retired, and reported as "recovering" until
 * the service replaced it.) */
enum { ORACLE_WAITING = 0, ORACLE_TRAINING, ORACLE_DONE, ORACLE_FAILED, ORACLE_STOPPED, ORACLE_BLOCKED,
       ORACLE_RECOVERING, ORACLE_CHECKING, ORACLE_STARTING, ORACLE_N_STATES };

typedef struct oracle_recoveries_s oracle_recoveries_t;
typedef struct oracle_recovery_s oracle_recovery_t;

/* How a job object starts.  A recovery (or an oracle restarted in the
 * middle of a job) creates a new job object for the same job: its id,
 * recover = 1 (roll back before the trainers attach), rec = the record
 * it fills.  recs: the service's record of recoveries (NULL: a lost
 * trainer fails the job).  on_recover: called from the loop (never from
 * inside the job's own calls) once this job object has ended to recover:
 * the service replaces it (oracle_job_retire) with a new one. */
typedef struct oracle_job_opts_s {
  const char *job_id;
  int recover;
  uint32_t generation;
  oracle_recoveries_t *recs;
  oracle_recovery_t *rec;
  void (*on_recover)(oracle_job_t *j, void *ud);
  /* NULL, or called after every change of state (from, to: the states'
   * own numbers, oracle_job__state_label names them), synchronously from
   * inside the job: it must not call back into it.  Tests follow the
   * lifecycle with it. */
  void (*on_state)(oracle_job_t *j, int from, int to, void *ud);
  void *ud;
  /* a scale of the embedding servers (oracle_scale.c): the roll-back first moves checkpoint reshape_ckpt's rows from
   * reshape_from servers onto the configuration's, server to server; reshape_union lists every old and new
   * server's address (comma-separated).  0 / NULL: none. */
  uint32_t reshape_from;
  const char *reshape_ckpt, *reshape_union;
} oracle_job_opts_t;

/* FAILED_PRECONDITION: the request does not fit the job's state (the
 * status message says why). */
#define ORACLE_ERR_PRECONDITION ERR_PRECONDITION

/* The name a state is reported by: "waiting" (CHECKING and STARTING too),
 * "training", "done", "failed", "stopped", "blocked", "recovering". */
const char *oracle_state_name(int state);

/* Refuses what this oracle does not implement, with a sentence: a fixed
 * lookahead above 4096, cache_rows outside [1, 2^32) outside ideal mode,
 * allocation = laia.  0 or ERR_CONFIG. */
int oracle_job_check_cfg(const cfg_t *cfg, char *err, size_t err_len);

/* Creates the job (cfg must outlive it): channels to the data processors,
 * metrics on reg, the start timer (oracle.start_timeout_ms).  Nothing is
 * fetched before every trainer said Hello.  0 or an error with err.  Loop
 * thread, or before the loop runs. */
int oracle_job_create(uv_loop_t *loop, const cfg_t *cfg, metrics_registry_t *reg, const oracle_job_opts_t *opts,
                      oracle_job_t **out, char *err, size_t err_len);
/* The next run of old's job, once old ended to recover (from on_recover):
 * a new job object with the same id and hooks, recover = 1, the next
 * generation (old's + 1: the trainers' rendezvous keys of the two never
 * mix) and the record of recoveries' current entry; old is retired.  0,
 * or an error with err (old stays, over). */
int oracle_job_successor(oracle_job_t *old, oracle_job_t **out, char *err, size_t err_len);
/* destroy, without blocking the loop: the job stops what it runs and frees
 * itself once its worker-pool calls have come back (a recovery replaces
 * it while the loop runs). */
void oracle_job_retire(oracle_job_t *j);
/* The service noticed that trainer rank is lost (silent past
 * oracle.heartbeat_timeout_ms): its stream is ended and the job recovers
 * (or fails, without a record of recoveries).  kind: "hang" or "trainer". */
void oracle_job_lose_rank(oracle_job_t *j, uint32_t rank, const char *kind, const char *why);
/* The rank lost by the recovery that ended this job (-1: none); the
 * generation the job was created with. */
int oracle_job_lost_rank(const oracle_job_t *j);
uint32_t oracle_job_generation(const oracle_job_t *j);
/* Stops the fetch threads (waiting at most drain_ms + 1 s for them: a
 * thread stuck retrying a dead data processor is left behind, with the
 * memory it uses), closes the job's handles (runs the loop once) and frees
 * it.  After the loop stopped running. */
void oracle_job_destroy(oracle_job_t *j);

const char *oracle_job_id(const oracle_job_t *j);
/* The state as reported (oracle_state_name): CHECKING and STARTING are
 * WAITING, a retired object is RECOVERING. */
int oracle_job_state(const oracle_job_t *j);
/* done, failed or stopped (or ended to recover). */
int oracle_job_over(const oracle_job_t *j);
const char *oracle_job_message(const oracle_job_t *j);
/* Iterations every trainer has reported. */
uint64_t oracle_job_done(const oracle_job_t *j);
uint64_t oracle_job_iterations(const oracle_job_t *j);
/* Iterations rank has reported; whether it has a Work stream open. */
uint64_t oracle_job_rank_reported(const oracle_job_t *j, uint32_t rank);
int oracle_job_rank_attached(const oracle_job_t *j, uint32_t rank);
/* A daemon was lost and this run ends once nothing of it is in flight (a move): a trainer joins the next one. */
int oracle_job_lost(const oracle_job_t *j);
/* The summary (running while training), JSON; malloc'd, caller frees. */
char *oracle_job_summary(const oracle_job_t *j);

/* A checkpoint as this job object knows it (oracle_job_checkpoints). */
typedef struct oracle_ckpt_info_s {
  char id[96];
  uint64_t iteration; /* c: it holds the model after iteration c */
  int complete;       /* sealed on every server: listed as usable */
  double started;     /* unix seconds: c chosen and the cached rows listed (the cacher decided c) */
  double finished;    /* unix seconds it became complete; 0 while not */
  char missing[320];  /* not complete: the parts it still lacks, in words; "" once complete */
} oracle_ckpt_info_t;
#define ORACLE_CKPT_RECENT 8 /* complete checkpoints a job object remembers for oracle_job_checkpoints */

/* The checkpoints of this job object, oldest first, into out[0..max): the
 * last ORACLE_CKPT_RECENT it completed, then those under way (a job that
 * failed, or ended to recover, leaves its unfinished ones listed, not
 * complete).  Returns how many were written.  A recovered job's object
 * starts with none (the page keeps the earlier ones). */
size_t oracle_job_checkpoints(const oracle_job_t *j, oracle_ckpt_info_t *out, size_t max);

/* An embedding server as the oracle's probe sees it (oracle_job_servers). */
typedef struct oracle_server_info_s {
  uint64_t incarnation; /* its process's incarnation (from the start's check, then each probe); 0: not known */
  uint64_t restarts;    /* incarnations changed, seen by this job object's probe */
  double last_answer;   /* unix seconds of its last answer to a probe; 0: none yet */
  double down_since;    /* unix seconds since it stopped answering; 0: it answers */
} oracle_server_info_t;

/* The job's embedding servers (cluster.embedding order) into out[0..max):
 * returns how many the job has (0 without checkpoints: mode ideal or no
 * servers), of which min(that, max) are written. */
uint32_t oracle_job_servers(const oracle_job_t *j, oracle_server_info_t *out, uint32_t max);

/* Hello on a Work stream: rank takes the stream.  0, or an error (the
 * caller fails the call with it) and a sentence in why: ERR_EXISTS (rank
 * already has a stream), FAILED_PRECONDITION-class errors for a job that
 * is not waiting or a resume (next_iteration != 0). */
int oracle_job_attach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, uint64_t next_iteration, char *why,
                      size_t why_len);
/* A message after Hello on rank's stream.  Protocol errors finish the call
 * (INVALID_ARGUMENT) and fail the job. */
void oracle_job_on_message(oracle_job_t *j, uint32_t rank, rpc_call_t *call,
                           const Chanter__Oracle__V1__TrainerMessage *m);
/* rank's stream ended: cancelled (the call is dead) or half-closed (the
 * job finishes the call).  Mid-job this fails the job. */
void oracle_job_detach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, int cancelled);
/* A message queued on rank's stream went out: room to dispatch. */
void oracle_job_sent(oracle_job_t *j, uint32_t rank);
/* Ends the job early (state stopped; StopWork with reason to every
 * trainer).  No-op once the job is over. */
void oracle_job_stop(oracle_job_t *j, const char *reason);
/* chanter train --resume / --fresh on a blocked job: restore the servers to
 * checkpoint `resume` ("latest" or an id) or clear them, then train.  0
 * (msg says what happens now) or an error with msg: ERR_UNAVAILABLE while
 * the job is still waiting (ask again), FAILED_PRECONDITION-class when it
 * is not blocked or has no servers.  Loop thread. */
int oracle_job_start_request(oracle_job_t *j, const char *resume, int fresh, char *msg, size_t msg_len);
/* chanter checkpoint: a checkpoint after the next batch not yet planned
 * (its id and iteration), or an error with msg.  Loop thread. */
int oracle_job_checkpoint_request(oracle_job_t *j, char *id, size_t id_len, uint64_t *iteration, char *msg,
                                  size_t msg_len);
/* chanter scale: the trainer group re-forms with `trainers` trainers
 * after the next checkpoint (its id and iteration), as a resume of that
 * checkpoint on `trainers` trainers would (oracle_scale.c); msg says so.
 * Or an error with the sentence in msg: trainers outside 1..4096 or above
 * batch_size, no checkpoints (ideal), a scale already under way, a
 * recovery, not training, the count the job has, or no iteration left
 * after the next checkpoint.  Loop thread. */
int oracle_job_scale_request(oracle_job_t *j, uint32_t trainers, char *id, size_t id_len, uint64_t *iteration,
                             char *msg, size_t msg_len);
/* The trainer count a scale under way goes to; 0 when none is. */
uint32_t oracle_job_scale_to(const oracle_job_t *j);
/* chanter scale --embedding-servers: the job goes onto n servers, listed
 * (by shard) in addrs, which holds the job's servers of now first and as
 * many addresses as the larger of the two counts, after an as-soon-as-
 * possible checkpoint, as a trainer scale does.  Refusals as
 * oracle_job_scale_request's, and: n outside 1..4096, n the count the job
 * has, another number of addresses, an address of a server of now that
 * is not the job's.  0 with id, iteration and msg, or an error with msg.
 * Loop thread. */
int oracle_job_scale_servers_request(oracle_job_t *j, uint32_t n, char *const *addrs, size_t n_addrs, char *id,
                                     size_t id_len, uint64_t *iteration, char *msg, size_t msg_len);
/* A job whose run ended for a scale of its embedding servers (its
 * checkpoint complete): the count, and (*cluster) the new servers'
 * addresses, comma-separated (the job's own string).  0 when it is not
 * one. */
uint32_t oracle_job_scale_servers(const oracle_job_t *j, const char **cluster);

#endif
