/*
 * trainer_loop: what chanter-trainer does from start to StopWork.  The
 * "training thread" runs trainer_run (main.c keeps the libuv loop for
 * signals, the watchdog and the exit); two more threads serve it.
 *
 *   1. Join the oracle (role TRAINER, rank, address, schema and layout
 *      fingerprints); a heartbeat thread then calls Heartbeat every
 *      trainer.heartbeat_ms.
 *   2. Form the collective group (Gloo) through the oracle's KV store under
 *      the prefix "<job_id>/<generation>"; broadcast rank 0's dense
 *      parameters (every rank initialized them identically anyway).
 *   3. Open the Work stream.  The FEEDER thread reads its items in order;
 *      for a Step it waits for the step's prefetch gate (every trainer has
 *      finished the iterations < prefetch_gate, background work included)
 *      and fetches the step's rows from the embedding servers straight
 *      into their cache slots (trainer_step.h, "the cache"), up to L steps
 *      ahead of training; then it queues the item.  The training thread
 *      serves the queue:
 *      Step x  forward over the cached rows -> wait for the BACKGROUND
 *              thread to finish x-1 -> backward with the dense all-reduce
 *              in buckets overlapped (trainer_ar.h) -> all-reduce the
 *              critical rows' gradients -> update everything but the
 *              delayed rows -> hand x's delayed rows and write-backs to
 *              the background thread (it synchronizes and updates them
 *              and writes back the evicted rows while x+1's forward runs)
 *              -> Report.  With L = 0 the gate of x is x itself: the
 *              training thread finishes x-1's background work and meets
 *              the others at a barrier before x's rows are fetched (the
 *              synchronous baseline, nothing overlapped).
 *      Eval    wait for the background, barrier, rows from the cache when
 *              cached (newer than the servers') else fetched, forward
 *              only, EvalResult (logits and labels).
 *      Stop    return 0.
 *   mode = ideal keeps every row in a trainer-local store (trainer_rows.h)
 *   instead of the embedding servers and synchronizes no rows: a lower
 *   bound of iteration time, NOT a correct distributed model (each
 *   trainer's copy of a shared row drifts apart).
 *
 * How this is cut into files (the conductor, trainer_loop.c, and the
 * stages it runs: join, pipeline, exec, eval): trainer_state.h.  Each
 * WorkItem is decoded and checked once, when the feeder reads it
 * (trainer_work.h); nothing after that sees protobuf.
 *
 * Failover (DESIGN.md 5): when the oracle says the job recovers (StopWork
 * "recovering"), or this generation breaks for a reason another may cure
 * (a failed collective, a broken stream, the oracle silent for three
 * heartbeats, an embedding server unreachable after embc's retries), the
 * trainer leaves the generation -- its stream, threads and group --,
 * rebuilds its model and cache as a new process would, and joins again
 * (retrying Join for up to trainer.rejoin_timeout_ms); the oracle then
 * rolls everyone back to the last complete checkpoint.  Errors no other
 * generation can cure (a bad configuration, a malformed item, out of
 * memory) are logged with the iteration and the peer, and trainer_run
 * returns non-zero: systemd (or chanter local) restarts the process.
 */
#ifndef CHANTER_TRAINER_LOOP_H
#define CHANTER_TRAINER_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "metrics.h"

typedef struct trainer_s trainer_t;

/* Builds the model (identical on every rank: model_init(seed)), the data
 * schema and table layout, the embedding client (mode normal) and the
 * oracle client; registers metrics in reg (may be NULL).  Talks to nobody
 * yet.  0 or a negative code with err.  cfg outlives the trainer, which
 * sets its trainers when the oracle says chanter scale changed the count. */
int trainer_create(cfg_t *cfg, uint32_t rank, metrics_registry_t *reg, trainer_t **out, char *err,
                   size_t err_len);
void trainer_destroy(trainer_t *t);

/* After the last iteration, also write the dense parameters (raw native
 * float32, model_params order) to path: to check a run against
 * `chanter train --local`, whose digest starts with these bytes.  Before
 * trainer_run; path is copied. */
int trainer_save_dense_to(trainer_t *t, const char *path);

/* Runs steps 1-3 above on the calling thread until StopWork (returns 0,
 * as it does when chanter scale left this trainer's rank out of the job,
 * or TRAINER_JOB_FAILED when the StopWork says the job failed because of
 * another daemon), a requested stop (trainer_stop: returns 0 too), or a
 * failure of this trainer (logged; returns the negative code). */
#define TRAINER_JOB_FAILED 3
int trainer_run(trainer_t *t);

/* Asks trainer_run to return soon: sets the stop flag and cancels the Work
 * stream.  A collective in progress still runs to its timeout.  Any
 * thread, any time (also before trainer_run). */
void trainer_stop(trainer_t *t, const char *why);

#endif
