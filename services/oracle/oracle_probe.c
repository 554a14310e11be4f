/*
 * oracle_probe: the oracle watches its embedding servers (DESIGN.md 5).
 *
 * Once a second while the job trains, one worker-pool call asks every
 * server who it is (embc_incarnation: Stats, brief, 1 s deadline, no
 * retry).  A server that answers with another incarnation than before was
 * restarted.  With embedding.sync_writes = true every write it
 * acknowledged was in its fsynced write-ahead log: the clients' retries
 * carried them over the outage, nothing is rolled back, and the outage is
 * logged.  With sync_writes = false the writes it acknowledged since the
 * last sync may be gone (a host crash loses the unsynced log; a killed
 * process alone does not, but the oracle cannot tell the two apart): the
 * job recovers, rolled back to its last complete checkpoint.  A server
 * that says it started on a lost disk (its data dir was empty and it put
 * back its checkpoints from checkpoint.backup_dir: StatsResponse.lost_disk)
 * lost acknowledged writes whatever sync_writes says: the job recovers,
 * rolled back to the newest checkpoint complete on every server.  A server
 * that does not answer is logged once; the trainers' calls retry it.
 *
 * The same answer says whether the server's data dir is full (its writes
 * and checkpoints answered RESOURCE_EXHAUSTED: the trainers and the
 * checkpoint retry them, embc.c).  That is no loss: the job is paused,
 * said in the log, the status (oracle_probe__disk_full: summary.json's
 * "paused", the status page) and chanter_oracle_embedding_disk_full, and
 * goes on by itself once the server has space again; after
 * embedding.disk_full_timeout_s of it the job fails, naming the server
 * and its data dir.
 *
 * j->probe is this file's; the loop side runs on the loop thread, the
 * calls on the worker pool (they read the job's shape and embc only).
 * What it saw of each server (incarnation, restarts, last answer) is
 * also for the status page (oracle_job_servers).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"

typedef struct probe_work_s {
  uv_work_t req;
  oracle_job_t *j;
  embc_probe_t *p; /* S: incarnation 0 = no answer */
  int *rc;       /* S */
  char (*err)[256];
} probe_work_t;

static void probe_work(uv_work_t *req) {
  probe_work_t *w = req->data;
  oracle_job_t *j = w->j;
  for (uint32_t s = 0; s < j->ckpt.S; s++) w->rc[s] = embc_probe(j->ckpt.embc, s, &w->p[s], w->err[s], sizeof w->err[s]);
}

static void probe_free(probe_work_t *w) {
  free(w->p);
  free(w->rc);
  free(w->err);
  free(w);
}

static void disk_sentence(const oracle_job_t *j, uint32_t s, char *out, size_t n) {
  const struct oracle_disk_s *d = &j->probe.disk[s];
  snprintf(out, n, "embedding server %u (%s) ran out of space in its data dir %s (%.1f MiB free of %.1f MiB now)", s,
           embc_address(j->ckpt.embc, s), d->dir, d->free / 1048576.0, d->total / 1048576.0);
}

/* What server s said of its disk: the pause starts or ends (logged), or
 * it lasted too long (the job fails). */
static void disk_seen(oracle_job_t *j, uint32_t s, const embc_probe_t *p) {
  oracle_probe_t *pr = &j->probe;
  struct oracle_disk_s *d = &pr->disk[s];
  int was = d->full;
  d->full = p->disk_full;
  d->since = p->disk_full_since;
  d->free = p->disk_free_bytes;
  d->total = p->disk_total_bytes;
  snprintf(d->dir, sizeof d->dir, "%.255s", p->data_dir);
  metrics_gauge_set(d->g_full, d->full ? 1 : 0);
  char why[640];
  disk_sentence(j, s, why, sizeof why);
  double wall = clock_wall_s();
  if (d->full && !was)
    log_warn("the job is paused: %s; its write-backs and checkpoints wait, for up to %.0f s "
             "(embedding.disk_full_timeout_s); free space there and the job goes on by itself",
             why, pr->disk_full_s);
  else if (!d->full && was)
    log_info("the job goes on: embedding server %u's data dir %s has space again (%.1f MiB free)", s, d->dir,
             d->free / 1048576.0);
  if (d->full && d->since > 0 && wall - d->since >= pr->disk_full_s)
    oracle_job__error(j, -ENOSPC,
                      "%s, for %.0f s (embedding.disk_full_timeout_s = %.0f): free space there, then `chanter train "
                      "--resume` goes on from the last complete checkpoint",
                      why, wall - d->since, pr->disk_full_s);
}

static void on_probe(uv_timer_t *t);

void oracle_probe__progress(oracle_job_t *j) {
  oracle_probe_t *pr = &j->probe;
  if (!pr->open || !pr->disk || pr->running) return;
  for (uint32_t s = 0; s < j->ckpt.S; s++)
    if (pr->disk[s].full) {
      on_probe(&pr->timer);
      return;
    }
}

int oracle_probe__disk_full(const oracle_job_t *j, char *why, size_t why_len) {
  if (why_len) why[0] = 0;
  for (uint32_t s = 0; j->probe.disk && s < j->ckpt.S; s++) {
    if (!j->probe.disk[s].full) continue;
    disk_sentence(j, s, why, why_len);
    return 1;
  }
  return 0;
}

static void probe_done(uv_work_t *req, int status) {
  probe_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_probe_t *pr = &j->probe;
  pr->running = 0;
  if (status == UV_ECANCELED || j->destroying || oracle_job__over(j)) {
    probe_free(w);
    return;
  }
  double now = oracle_job__now();
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    if (!w->rc[s]) disk_seen(j, s, &w->p[s]);
    if (w->rc[s]) {
      if (!pr->down_since[s]) {
        pr->down_since[s] = now;
        log_warn("embedding server %u does not answer (%s); the trainers' calls retry it for up to rpc.timeout_ms", s,
                 w->err[s]);
      }
      continue;
    }
    uint64_t was = pr->inc[s], now_inc = w->p[s].incarnation;
    pr->inc[s] = now_inc;
    pr->last_answer[s] = clock_wall_s();
    double down = pr->down_since[s] ? now - pr->down_since[s] : 0;
    pr->down_since[s] = 0;
    char who[32];
    snprintf(who, sizeof who, "embedding-%u", s);
    if (w->p[s].lost_disk) /* whatever the incarnation: until the job is rolled back, it serves nothing */
      oracle_job__lose(j, "embedding", who, -1,
                       "embedding server %u started on a lost disk (an empty data dir) and restored checkpoint %s from "
                       "checkpoint.backup_dir: the writes it acknowledged since are gone",
                       s, w->p[s].restored[0] ? w->p[s].restored : "(none: no backup could be restored)");
    if (!was || was == now_inc) {
      if (down > 0) log_info("embedding server %u answers again after %.1f s (the same process)", s, down);
      continue;
    }
    pr->restarts++;
    pr->restarts_of[s]++;
    metrics_counter_inc(pr->m_restarts);
    if (w->p[s].lost_disk) {
      log_warn("embedding server %u restarted on a lost disk (incarnation %016" PRIx64 " -> %016" PRIx64 "): the job "
               "rolls back", s, was, now_inc);
    } else if (pr->durable) {
      log_warn("embedding server %u restarted (incarnation %016" PRIx64 " -> %016" PRIx64 ", %.1f s without an "
               "answer): embedding.sync_writes = true, every write it acknowledged is in its write-ahead log; no "
               "rollback, the clients' retries went on",
               s, was, now_inc, down);
    } else {
      oracle_job__lose(j, "embedding", who, -1,
                       "it restarted (incarnation %016" PRIx64 " -> %016" PRIx64 ") without durable writes "
                       "(embedding.sync_writes = false): the writes it acknowledged since its last sync may be gone",
                       was, now_inc);
    }
  }
  probe_free(w);
  oracle_job__advance(j);
}

static void on_probe(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  oracle_probe_t *pr = &j->probe;
  if (pr->running || j->destroying || oracle_job__over(j) || !oracle_job__training(j)) return;
  uint32_t S = j->ckpt.S;
  probe_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->p = calloc(S, sizeof *w->p)) || !(w->rc = calloc(S, sizeof *w->rc)) ||
      !(w->err = calloc(S, sizeof *w->err))) {
    if (w) probe_free(w);
    return;
  }
  w->j = j;
  w->req.data = w;
  if (uv_queue_work(j->loop, &w->req, probe_work, probe_done)) {
    probe_free(w);
    return;
  }
  pr->running = 1;
}

int oracle_probe__init(oracle_job_t *j, metrics_registry_t *reg) {
  oracle_probe_t *pr = &j->probe;
  pr->durable = cfg_bool(j->cfg, "embedding.sync_writes");
  pr->m_restarts = metrics_counter(reg, "embedding_restarts_total", NULL,
                                   "embedding servers seen restarted (another incarnation) by the oracle's probe");
  if (!j->ckpt.enabled) return 0;
  pr->disk_full_s = (double)cfg_int(j->cfg, "embedding.disk_full_timeout_s");
  if (!(pr->disk = calloc(j->ckpt.S, sizeof *pr->disk))) return -ENOMEM;
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    char l[32];
    snprintf(l, sizeof l, "server=\"%u\"", s);
    pr->disk[s].g_full = metrics_gauge(reg, "embedding_disk_full", l,
                                       "1 while the oracle's probe sees this embedding server's data dir full (the job "
                                       "is paused for it)");
    metrics_gauge_set(pr->disk[s].g_full, 0);
  }
  if (!(pr->inc = calloc(j->ckpt.S, sizeof *pr->inc)) || !(pr->down_since = calloc(j->ckpt.S, sizeof *pr->down_since)) ||
      !(pr->last_answer = calloc(j->ckpt.S, sizeof *pr->last_answer)) ||
      !(pr->restarts_of = calloc(j->ckpt.S, sizeof *pr->restarts_of)))
    return -ENOMEM;
  uv_timer_init(j->loop, &pr->timer);
  pr->timer.data = j;
  uv_unref((uv_handle_t *)&pr->timer);
  uv_timer_start(&pr->timer, on_probe, 1000, 1000);
  pr->open = 1;
  return 0;
}

void oracle_probe__stop(oracle_job_t *j) {
  if (j->probe.open) uv_timer_stop(&j->probe.timer);
}

int oracle_probe__busy(const oracle_job_t *j) { return j->probe.running; }

void oracle_probe__close_handle(oracle_job_t *j, uv_close_cb cb) {
  if (!j->probe.open) return;
  j->probe.open = 0;
  j->handles_open++;
  uv_close((uv_handle_t *)&j->probe.timer, cb);
}

void oracle_probe__baseline(oracle_job_t *j, const uint64_t *incs, uint32_t n) {
  if (!j->probe.inc) return;
  for (uint32_t s = 0; s < n && s < ORACLE_PROBE_MAX_SERVERS; s++)
    if (incs[s]) j->probe.inc[s] = incs[s];
}

uint32_t oracle_job_servers(const oracle_job_t *j, oracle_server_info_t *out, uint32_t max) {
  const oracle_probe_t *pr = &j->probe;
  uint32_t S = pr->inc ? j->ckpt.S : 0;
  double now = oracle_job__now(), wall = clock_wall_s();
  for (uint32_t s = 0; s < S && s < max; s++)
    out[s] = (oracle_server_info_t){.incarnation = pr->inc[s],
                                    .restarts = pr->restarts_of[s],
                                    .last_answer = pr->last_answer[s],
                                    .down_since = pr->down_since[s] ? wall - (now - pr->down_since[s]) : 0};
  return S;
}

void oracle_probe__free(oracle_job_t *j) {
  free(j->probe.disk);
  j->probe.disk = NULL;
  free(j->probe.inc);
  free(j->probe.down_since);
  free(j->probe.last_answer);
  free(j->probe.restarts_of);
  j->probe.inc = NULL;
  j->probe.down_since = NULL;
  j->probe.last_answer = NULL;
  j->probe.restarts_of = NULL;
}
