/*
 * oracle_page: the job's live status page, read-only, on the oracle's
 * metrics port (metrics_http_route, metrics.h):
 *
 *   GET /status.json  the job as the oracle sees it now, with a bounded
 *                     history (below); 503 before the first snapshot
 *   GET / , /status   one self-contained HTML page (inline CSS, JS and SVG
 *                     charts; nothing fetched from elsewhere) that polls
 *                     /status.json every 1.5 s and redraws without reload
 *
 * Threads.  The job lives on the loop thread; the HTTP server runs on its
 * own.  The loop calls oracle_page_refresh once a second (the service's
 * housekeeping tick): it reads the job (its summary, its metrics) and the
 * members, appends a history point, renders status.json and publishes it
 * under the page's mutex.  A request only copies the published text.
 *
 * status.json (docs/reference.md, "The status page and status.json"):
 * {"time", "job": {job_id, state, message, iteration, iterations,
 * generation, samples_per_sec, eta_seconds, train_loss, test_logloss,
 * test_auc, ...}, "cache": {hit_rate, lookahead, slots_used, slots_peak,
 * cache_rows, rows per iteration fetched / synced / written back,
 * cache_hits, and the traffic floor: floor_rows = floor_first_use +
 * floor_shared over floor_iterations, of the cached tables only (a
 * partitioned table's rows do not move through the cache; plan_floor.h)},
 * "history": {"every_seconds", "points": [{t, iteration, samples_per_sec,
 * train_loss, hit_rate, rows_*, floor_rows, "phases": {wait, fetch, ...:
 * seconds of one iteration}}]}, "daemons": [{role, rank, address, pid,
 * alive, seconds_since_heartbeat, iteration, recoveries; an embedding
 * server: incarnation, restarts, last_answer, seconds_since_answer,
 * down_since}], "checkpoints": [{id, iteration, state: complete |
 * in_progress | incomplete, started, finished, generation, missing,
 * note}], "summary": the job's summary (summary.json: tables and their
 * strategies, checkpoints, recoveries with their moments, evaluations)}.
 * The history keeps at most ORACLE_PAGE_HISTORY points over the whole job:
 * when full, every other point goes and the spacing doubles.  A point holds
 * running totals, so rates over a span stay exact when points are dropped.
 *
 * Across job objects.  A recovery replaces the job object (a new
 * generation) while the page stays: it keeps the checkpoints it saw
 * (oracle_job_checkpoints; one under way when its job object ended is
 * incomplete, with why) and each embedding server's incarnation
 * (oracle_job_servers; a restart is counted once, from the job object's
 * probe or from an incarnation that changed between two objects).
 */
#ifndef CHANTER_ORACLE_PAGE_H
#define CHANTER_ORACLE_PAGE_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "metrics.h"
#include "oracle_job.h"

#define ORACLE_PAGE_HISTORY 240

typedef struct oracle_page_s oracle_page_t;

/* A member of the job as the service knows it (Join, Heartbeat). */
typedef struct oracle_page_member_s {
  const char *role; /* "trainer", ... */
  uint32_t rank;
  const char *address;
  uint32_t pid;
  int alive;                      /* heard from within oracle.heartbeat_timeout_ms */
  double seconds_since_heartbeat; /* its last Join, Heartbeat or Work message */
  uint64_t iteration;             /* the iterations it reported */
} oracle_page_member_t;

/* Registers the routes on reg's HTTP endpoint (served once the daemon
 * starts it); reads the cluster's addresses from cfg.  reg must outlive
 * the page.  0 or an error with err (the oracle then runs without it). */
int oracle_page_create(const cfg_t *cfg, metrics_registry_t *reg, oracle_page_t **out, char *err, size_t err_len);
/* A new snapshot of the job j (generation: the trainer group's; address:
 * the oracle's own, host:port, or "" before it listens) and its members.
 * Loop thread. */
void oracle_page_refresh(oracle_page_t *pg, const oracle_job_t *j, uint32_t generation, const char *address,
                         const oracle_page_member_t *members, size_t n_members);
/* Removes the routes (waiting for a request that runs one) and frees the
 * page.  NULL is a no-op. */
void oracle_page_destroy(oracle_page_t *pg);

/* The HTML page (oracle_page_html.c). */
extern const char oracle_page_html[];

/* The actions an admin asked for on the page since the last call (loop
 * thread): a checkpoint (*checkpoint 1), a trainer to take for lost
 * (*recover_rank >= 0).  POST /action/checkpoint and POST
 * /action/recover?arg=RANK, over HTTPS (metrics.tls) with the admin
 * role's client certificate; anyone else gets 403. */
void oracle_page_take_actions(oracle_page_t *pg, int *checkpoint, long *recover_rank);

#endif
