/*
 * oracle_timeline: the job's timeline, one JSON object a line, appended to
 * oracle.state_dir/timeline.jsonl (nothing without a state_dir), for
 * `chanter report` and for a person with jq.  It is an observation, not
 * state: written from the loop thread without fsync, read by nothing that
 * decides, and a line lost in a crash loses nothing but a point of a plot.
 *
 * Lines, each with "t" (Unix seconds), "kind", "job_id" and "generation":
 *   "iter"        at most twice a second, and for the last iteration: the
 *                 iteration count, samples/s and the mean loss, phase
 *                 milliseconds and rows moved per iteration since the
 *                 line before, with the traffic floor of the same
 *                 iterations (rows.floor: the cached tables' rows first
 *                 used in their window plus those shared, plan_floor.h;
 *                 absent in mode ideal), the lookahead L and the slots
 *                 in use;
 *   "eval"        an evaluation round: after_iteration, auc, logloss;
 *   "checkpoint"  a complete checkpoint: its id, iteration, total seconds;
 *   "state"       the job's state as it is reported (oracle_state_name),
 *                 each time it changes: a recovery shows as "recovering".
 * A recovered or resumed job appends to the same file; its iterations
 * start again where its checkpoint left off.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "fsio.h"
#include "json.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "phase.h"

#define TIMELINE_EVERY_S 0.5

static void head(oracle_job_t *j, const char *kind) {
  char id[2 * sizeof j->job_id];
  json_escape(id, sizeof id, j->job_id);
  fprintf(j->report.tl, "{\"t\": %.3f, \"kind\": \"%s\", \"job_id\": \"%s\", \"generation\": %u", clock_wall_s(), kind,
          id, j->generation);
}

static void tail(oracle_job_t *j) {
  fputs("}\n", j->report.tl);
  fflush(j->report.tl);
}

void oracle_timeline__open(oracle_job_t *j) {
  const char *dir = cfg_str(j->cfg, "oracle.state_dir");
  if (!*dir || j->report.tl) return;
  char path[4200], why[512] = "";
  snprintf(path, sizeof path, "%s/timeline.jsonl", dir);
  if (fsio_mkdir_p(dir, why, sizeof why) == 0) j->report.tl = fopen(path, "ae");
  if (!j->report.tl) log_warn("cannot append to %s: %s; the job goes on without a timeline", path, why[0] ? why : strerror(errno));
  j->report.tl_t = oracle_job__now();
  oracle_timeline__state(j, oracle_state_name(j->state));
}

void oracle_timeline__close(oracle_job_t *j) {
  if (j->report.tl) fclose(j->report.tl);
  j->report.tl = NULL;
}

void oracle_timeline__iteration(oracle_job_t *j, const oracle_agg_t *a, double loss, double now) {
  oracle_report_t *rp = &j->report;
  if (!rp->tl) return;
  rp->tl_n++;
  rp->tl_loss += loss;
  for (int k = 0; k < PHASE_N_REPORT; k++) rp->tl_phase[k] += a->t[k] / j->P;
  rp->tl_rows[0] += (double)a->rows_fetched;
  rp->tl_rows[1] += (double)a->rows_synced + (double)a->rows_synced_delayed;
  rp->tl_rows[2] += (double)a->rows_written_back;
  rp->tl_rows[3] += (double)a->cache_hits;
  if (a->floor_known) rp->tl_floor += (double)a->floor_rows, rp->tl_floor_n++;
  if (now - rp->tl_t < TIMELINE_EVERY_S && rp->done != j->iterations) return;
  double n = (double)rp->tl_n, span = now - rp->tl_t;
  head(j, "iter");
  fprintf(rp->tl, ", \"iteration\": %" PRIu64 ", \"samples_per_sec\": %.1f, \"loss\": %.6f, \"phase_ms\": {", rp->done,
          span > 0 ? n * (double)j->B / span : 0.0, rp->tl_loss / n);
  for (int k = 0; k < PHASE_N_REPORT; k++)
    fprintf(rp->tl, "%s\"%s\": %.4f", k ? ", " : "", phase_name(k), 1e3 * rp->tl_phase[k] / n);
  fprintf(rp->tl,
          "}, \"rows\": {\"fetched\": %.1f, \"synced\": %.1f, \"written_back\": %.1f, \"cache_hits\": %.1f",
          rp->tl_rows[0] / n, rp->tl_rows[1] / n, rp->tl_rows[2] / n, rp->tl_rows[3] / n);
  if (rp->tl_floor_n) fprintf(rp->tl, ", \"floor\": %.1f", rp->tl_floor / (double)rp->tl_floor_n);
  fprintf(rp->tl, "}, \"lookahead\": %u, \"slots_used\": %" PRIu64, j->pipe.L_now, (uint64_t)j->pipe.slots_used);
  tail(j);
  rp->tl_t = now;
  rp->tl_n = 0;
  rp->tl_loss = 0;
  memset(rp->tl_phase, 0, sizeof rp->tl_phase);
  memset(rp->tl_rows, 0, sizeof rp->tl_rows);
  rp->tl_floor = 0;
  rp->tl_floor_n = 0;
}

void oracle_timeline__eval(oracle_job_t *j, uint64_t after, double auc, double logloss) {
  if (!j->report.tl) return;
  head(j, "eval");
  fprintf(j->report.tl, ", \"after_iteration\": %" PRIu64 ", \"auc\": %.6f, \"logloss\": %.6f", after, auc, logloss);
  tail(j);
}

void oracle_timeline__checkpoint(oracle_job_t *j, const char *id, uint64_t iteration, double seconds) {
  if (!j->report.tl) return;
  char e[512];
  json_escape(e, sizeof e, id);
  head(j, "checkpoint");
  fprintf(j->report.tl, ", \"id\": \"%s\", \"iteration\": %" PRIu64 ", \"total_seconds\": %.3f", e, iteration, seconds);
  tail(j);
}

void oracle_timeline__state(oracle_job_t *j, const char *state) {
  if (!j->report.tl) return;
  head(j, "state");
  fprintf(j->report.tl, ", \"state\": \"%s\", \"iteration\": %" PRIu64, state, j->report.done);
  tail(j);
}
