/*
 * oracle_page: see oracle_page.h.  The snapshot is built on the loop
 * thread from what the job already says about itself: its summary (the
 * text summary.json and Status carry, read back with json.h), a few of its
 * metrics (read by name, metrics_read) and the members the service
 * passes.  Nothing here writes to
 * the job.
 */
#include "oracle_page.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "json.h"
#include "phase.h"
#include "sbuf.h"

/* One history point: the job's running totals at time t (unix s).  The
 * summary gives means per iteration; times done they are totals. */
typedef struct point_s {
  double t, done;
  double phase[PHASE_N_STEP]; /* seconds, summed over the iterations done */
  double fetched, synced, synced_delayed, written_back, hits;
  double floor, floor_n; /* the traffic floor's rows and iterations, this job object's (they restart with a recovery) */
  uint32_t gen;          /* the job object's generation */
  double loss;           /* the last iteration's mean train loss */
} point_t;

#define PAGE_CKPTS 32 /* checkpoints the page lists (the latest) */

/* A checkpoint as the page saw it over the job objects (oracle_job_checkpoints). */
typedef struct page_ckpt_s {
  oracle_ckpt_info_t c;
  uint32_t gen;   /* the job object's generation that took it */
  int state;      /* CK_* */
  char note[200]; /* incomplete: why it will not complete */
} page_ckpt_t;
enum { CK_COMPLETE = 0, CK_IN_PROGRESS, CK_INCOMPLETE };
static const char *const ck_state[] = {"complete", "in_progress", "incomplete"};

/* An embedding server's incarnation, counted over the job objects. */
typedef struct page_server_s {
  uint64_t inc, restarts;
  uint64_t job_restarts; /* what the job object of generation gen said */
  uint32_t gen;
  double last_answer, down_since;
} page_server_t;

struct oracle_page_s {
  metrics_registry_t *reg;
  pthread_mutex_t lock; /* guards json and the actions asked for */
  char *json;           /* the published status.json, or NULL */
  int want_checkpoint;  /* POST /action/checkpoint (admin), for the loop to take */
  long want_recover;    /* POST /action/recover?arg=RANK (admin): the rank, or -1 */
  /* the loop thread's */
  point_t pts[ORACLE_PAGE_HISTORY];
  size_t n;
  double every; /* seconds between points (doubles when the history is full) */
  char **emb, **dp;
  size_t n_emb, n_dp;
  page_ckpt_t ck[PAGE_CKPTS]; /* oldest first */
  size_t n_ck;
  page_server_t *srv; /* n_emb */
  oracle_ckpt_info_t *infos; /* scratch for oracle_job_checkpoints */
  oracle_server_info_t *sinfo; /* scratch for oracle_job_servers, n_emb */
};

static const char ctype_json[] = "application/json";
static const char ctype_html[] = "text/html; charset=utf-8";

/* ---- the routes (the HTTP server's thread) */

static int route_json(void *ud, sbuf_t *body, const char **ctype) {
  oracle_page_t *pg = ud;
  int status = 200;
  pthread_mutex_lock(&pg->lock);
  if (pg->json) {
    sb_printf(body, "%s", pg->json);
    *ctype = ctype_json;
  } else {
    sb_printf(body, "the oracle has not published its status yet; retry in a second\n");
    status = 503;
  }
  pthread_mutex_unlock(&pg->lock);
  return status;
}

static int route_html(void *ud, sbuf_t *body, const char **ctype) {
  (void)ud;
  sb_printf(body, "%s", oracle_page_html);
  *ctype = ctype_html;
  return 200;
}

static const struct {
  const char *path;
  metrics_route_cb cb;
} routes[] = {{"/status.json", route_json}, {"/", route_html}, {"/status", route_html}};
#define N_ROUTES (sizeof routes / sizeof routes[0])

/* ---- reading the summary */

static double num(const char *json, const char *key) {
  double v = NAN;
  if (json) json_get_num(json, key, &v);
  return v;
}

/* The object or array that follows "key": in s (its first occurrence), or
 * NULL. */
static const char *after_key(const char *s, const char *key) {
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = s ? strstr(s, pat) : NULL;
  return p ? p + strlen(pat) : NULL;
}

/* The recoveries of the summary that lost who ("trainer-1", "oracle"). */
static int recoveries_of(const char *summary, const char *who) {
  const char *p = after_key(summary, "recoveries");
  const char *end = p ? strstr(p, "], \"recovery\"") : NULL;
  char pat[64];
  int n = 0;
  snprintf(pat, sizeof pat, "\"who\": \"%s\"", who);
  while (p && (p = strstr(p, pat)) != NULL && (!end || p < end)) {
    n++;
    p += strlen(pat);
  }
  return n;
}

/* One of the job's metrics (oracle_job_shape.c, oracle_probe.c), by
 * name; NAN when it has none. */
static double metric(const oracle_page_t *pg, const char *name) {
  double v = NAN;
  metrics_read(pg->reg, name, NULL, &v);
  return v;
}

static double nz(double v) { return isfinite(v) ? v : 0; }

/* The job's totals now, from its summary and metrics. */
static void point_read(oracle_page_t *pg, const char *summary, point_t *p) {
  double done = nz(num(summary, "iterations"));
  memset(p, 0, sizeof *p);
  p->t = clock_wall_s();
  p->done = done;
  const char *ph = after_key(summary, "phase_seconds");
  for (int k = 0; k < PHASE_N_STEP; k++) p->phase[k] = nz(num(ph, phase_name(k))) * done;
  p->fetched = nz(num(summary, "rows_fetched")) * done;
  p->synced = nz(num(summary, "rows_synced")) * done;
  p->synced_delayed = nz(num(summary, "rows_synced_delayed")) * done;
  p->written_back = nz(num(summary, "rows_written_back")) * done;
  p->hits = nz(num(summary, "cache_hits")) * done;
  p->floor_n = nz(num(summary, "floor_iterations"));
  p->floor = nz(num(summary, "floor_rows")) * p->floor_n;
  p->loss = done > 0 ? metric(pg, "train_loss") : NAN;
}

/* Appends p when the spacing allows while the job trains, and at once
 * when the job moved while it does not (its last iteration): a full
 * history drops every other point and doubles the spacing. */
static void history_add(oracle_page_t *pg, const point_t *p, int training) {
  if (pg->n) {
    const point_t *last = &pg->pts[pg->n - 1];
    if (training ? p->t - last->t < pg->every : p->done == last->done) return;
  }
  if (pg->n == ORACLE_PAGE_HISTORY) {
    size_t k = 0;
    for (size_t i = 0; i < pg->n; i += 2) pg->pts[k++] = pg->pts[i];
    pg->n = k;
    pg->every *= 2;
  }
  pg->pts[pg->n++] = *p;
}

/* ---- writing status.json (the loop thread) */

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

/* The rates between two points: per second, per iteration. */
static void json_span(sbuf_t *b, const point_t *a, const point_t *p, double batch) {
  double dt = p->t - a->t, dd = p->done - a->done;
  int ok = dd > 0; /* a roll-back (recovery) moves done back: no rates across it */
  sb_printf(b, "{\"t\": %.3f, \"iteration\": %.0f, ", p->t, p->done);
  sb_num(b, "samples_per_sec", dd >= 0 && dt > 0 ? dd * batch / dt : NAN);
  sb_printf(b, ", ");
  sb_num(b, "train_loss", p->loss);
  sb_printf(b, ", ");
  double dh = p->hits - a->hits, df = p->fetched - a->fetched;
  sb_num(b, "hit_rate", ok ? ratio(dh, dh + df) : NAN);
  sb_printf(b, ", ");
  sb_num(b, "rows_fetched", ok ? df / dd : NAN);
  sb_printf(b, ", ");
  sb_num(b, "rows_synced", ok ? (p->synced - a->synced) / dd : NAN);
  sb_printf(b, ", ");
  sb_num(b, "rows_synced_delayed", ok ? (p->synced_delayed - a->synced_delayed) / dd : NAN);
  sb_printf(b, ", ");
  sb_num(b, "rows_written_back", ok ? (p->written_back - a->written_back) / dd : NAN);
  sb_printf(b, ", ");
  double dn = p->floor_n - a->floor_n; /* a new job object (recovery) counts its floor from 0 */
  sb_num(b, "floor_rows", a->gen == p->gen && dn > 0 ? (p->floor - a->floor) / dn : NAN);
  sb_printf(b, ", \"phases\": {");
  for (int k = 0; k < PHASE_N_STEP; k++) {
    if (k) sb_printf(b, ", ");
    sb_num(b, phase_name(k), ok ? (p->phase[k] - a->phase[k]) / dd : NAN);
  }
  sb_printf(b, "}}");
}

static void json_history(sbuf_t *b, const oracle_page_t *pg, double batch) {
  sb_printf(b, "\"history\": {\"every_seconds\": %g, \"max_points\": %d, \"points\": [", pg->every,
            ORACLE_PAGE_HISTORY);
  for (size_t i = 1; i < pg->n; i++) {
    if (i > 1) sb_printf(b, ", ");
    json_span(b, &pg->pts[i - 1], &pg->pts[i], batch);
  }
  sb_printf(b, "]}");
}

static void json_job(sbuf_t *b, oracle_page_t *pg, const oracle_job_t *j, uint32_t generation, const char *summary) {
  int st = oracle_job_state(j);
  uint64_t done = oracle_job_done(j), its = oracle_job_iterations(j);
  double batch = num(summary, "batch_size"), sps = metric(pg, "samples_per_second");
  double eta = st == ORACLE_TRAINING && sps > 0 && batch > 0 ? (double)(its - done) * batch / sps : NAN;
  sb_printf(b, "\"job\": {");
  sb_str(b, "job_id", oracle_job_id(j));
  sb_printf(b, ", ");
  sb_str(b, "state", oracle_state_name(st));
  sb_printf(b, ", ");
  sb_str(b, "message", oracle_job_message(j));
  sb_printf(b, ", \"iteration\": %llu, \"iterations\": %llu, \"generation\": %u, ", (unsigned long long)done,
            (unsigned long long)its, generation);
  sb_num(b, "samples_per_sec", st == ORACLE_TRAINING ? sps : num(summary, "samples_per_sec"));
  sb_printf(b, ", ");
  sb_num(b, "eta_seconds", eta);
  sb_printf(b, ", ");
  sb_num(b, "train_loss", done ? metric(pg, "train_loss") : NAN);
  sb_printf(b, ", ");
  sb_num(b, "train_logloss", num(summary, "train_logloss"));
  sb_printf(b, ", ");
  sb_num(b, "test_logloss", num(summary, "test_logloss"));
  sb_printf(b, ", ");
  sb_num(b, "test_auc", num(summary, "test_auc"));
  sb_printf(b, ", ");
  sb_num(b, "trainers", num(summary, "trainers"));
  sb_printf(b, ", ");
  sb_num(b, "batch_size", batch);
  char s[64] = "", paused[640] = "";
  json_get_str(summary ? summary : "", "mode", s, sizeof s);
  sb_printf(b, ", ");
  sb_str(b, "mode", s);
  /* what holds a training job (a server's full disk), "" when nothing */
  json_get_str(summary ? summary : "", "paused", paused, sizeof paused);
  sb_printf(b, ", ");
  sb_str(b, "paused", paused);
  sb_printf(b, "}");
}

static void json_cache(sbuf_t *b, oracle_page_t *pg, const char *summary) {
  double hits = num(summary, "cache_hits"), fetched = num(summary, "rows_fetched");
  sb_printf(b, "\"cache\": {");
  sb_num(b, "hit_rate", ratio(hits, hits + fetched));
  sb_printf(b, ", ");
  sb_num(b, "lookahead", metric(pg, "lookahead"));
  sb_printf(b, ", ");
  sb_num(b, "lookahead_start", num(summary, "lookahead_start"));
  sb_printf(b, ", ");
  sb_num(b, "cache_rows", num(summary, "cache_rows"));
  sb_printf(b, ", ");
  sb_num(b, "slots_used", metric(pg, "cache_slots_used"));
  sb_printf(b, ", ");
  sb_num(b, "slots_peak", num(summary, "slots_peak"));
  static const char *const per_it[] = {"rows_fetched", "rows_synced",   "rows_synced_delayed", "rows_written_back",
                                       "cache_hits",   "unique_keys",   "floor_rows",          "floor_first_use",
                                       "floor_shared", "floor_iterations"};
  for (size_t i = 0; i < sizeof per_it / sizeof per_it[0]; i++) {
    sb_printf(b, ", ");
    sb_num(b, per_it[i], num(summary, per_it[i]));
  }
  sb_printf(b, ", \"per\": \"iteration, mean over the job (the floor: over this run's iterations)\", ");
  sb_str(b, "floor_of", "the cached tables only: a partitioned table's rows do not move through the cache");
  sb_printf(b, "}");
}

/* The last recovery's "who" in the summary ("trainer-1", "embedding-0"),
 * or "". */
static void last_recovery_who(const char *summary, char *out, size_t cap) {
  static const char pat[] = "\"who\": \"";
  const char *p = after_key(summary, "recoveries");
  const char *end = p ? strstr(p, "], \"recovery\"") : NULL, *last = NULL;
  while (p && (p = strstr(p, pat)) != NULL && (!end || p < end)) {
    last = p + strlen(pat);
    p = last;
  }
  out[0] = 0;
  if (last) snprintf(out, cap, "%.*s", (int)strcspn(last, "\""), last);
}

/* ---- checkpoints, complete or not, over the job objects */

static page_ckpt_t *ckpt_find(oracle_page_t *pg, const char *id, uint32_t gen) {
  for (size_t i = 0; i < pg->n_ck; i++)
    if (pg->ck[i].gen == gen && !strcmp(pg->ck[i].c.id, id)) return &pg->ck[i];
  return NULL;
}

/* What the job object j says of its checkpoints, into the page's record:
 * one still under way when its job object ended (a recovery replaced it,
 * or the job failed or stopped) will not complete. */
static void ckpts_update(oracle_page_t *pg, const oracle_job_t *j, const char *summary) {
  uint32_t gen = oracle_job_generation(j);
  int over = oracle_job_over(j), st = oracle_job_state(j);
  size_t n = oracle_job_checkpoints(j, pg->infos, PAGE_CKPTS);
  char who[64];
  last_recovery_who(summary, who, sizeof who);
  for (size_t i = 0; i < pg->n_ck; i++) {
    page_ckpt_t *c = &pg->ck[i];
    if (c->state != CK_IN_PROGRESS) continue;
    int listed = 0;
    for (size_t k = 0; k < n && !listed; k++) listed = !strcmp(pg->infos[k].id, c->c.id);
    if (c->gen != gen) {
      c->state = CK_INCOMPLETE;
      snprintf(c->note, sizeof c->note, "abandoned: the job recovered%s%s (generation %u -> %u) before it was complete",
               who[0] ? " from the loss of " : "", who, c->gen, gen);
    } else if (!listed) { /* completed, and already out of the job object's record (not seen complete here) */
      c->state = CK_COMPLETE;
      c->c.complete = 1;
      c->c.missing[0] = 0;
    }
  }
  for (size_t k = 0; k < n; k++) {
    const oracle_ckpt_info_t *in = &pg->infos[k];
    page_ckpt_t *c = ckpt_find(pg, in->id, gen);
    if (!c) {
      if (pg->n_ck == PAGE_CKPTS) memmove(&pg->ck[0], &pg->ck[1], --pg->n_ck * sizeof pg->ck[0]);
      c = &pg->ck[pg->n_ck++];
      memset(c, 0, sizeof *c);
    }
    c->c = *in;
    c->gen = gen;
    c->note[0] = 0;
    c->state = in->complete ? CK_COMPLETE : over ? CK_INCOMPLETE : CK_IN_PROGRESS;
    if (c->state == CK_INCOMPLETE)
      snprintf(c->note, sizeof c->note, "the job's run ended (%s) before it was complete: %s", oracle_state_name(st),
               oracle_job_message(j));
  }
}

static void json_ckpts(sbuf_t *b, const oracle_page_t *pg) {
  sb_printf(b, "\"checkpoints\": [");
  for (size_t i = 0; i < pg->n_ck; i++) {
    const page_ckpt_t *c = &pg->ck[i];
    sb_printf(b, "%s{", i ? ", " : "");
    sb_str(b, "id", c->c.id);
    sb_printf(b, ", \"iteration\": %llu, ", (unsigned long long)c->c.iteration);
    sb_str(b, "state", ck_state[c->state]);
    sb_printf(b, ", ");
    sb_num(b, "started", c->c.started > 0 ? c->c.started : NAN);
    sb_printf(b, ", ");
    sb_num(b, "finished", c->c.finished > 0 ? c->c.finished : NAN);
    sb_printf(b, ", \"generation\": %u, ", c->gen);
    sb_str(b, "missing", c->c.missing);
    sb_printf(b, ", ");
    sb_str(b, "note", c->note);
    sb_printf(b, "}");
  }
  sb_printf(b, "]");
}

/* ---- embedding servers' incarnations, over the job objects */

/* A restart is counted once: from the job object's own count, or, across
 * two job objects (a recovery's roll-back reads the incarnations again),
 * from an incarnation that changed. */
static void servers_update(oracle_page_t *pg, const oracle_job_t *j) {
  uint32_t gen = oracle_job_generation(j);
  uint32_t S = oracle_job_servers(j, pg->sinfo, (uint32_t)pg->n_emb);
  for (uint32_t s = 0; s < S && s < pg->n_emb; s++) {
    const oracle_server_info_t *in = &pg->sinfo[s];
    page_server_t *v = &pg->srv[s];
    if (v->gen != gen) v->gen = gen, v->job_restarts = 0;
    uint64_t d = in->restarts > v->job_restarts ? in->restarts - v->job_restarts : 0;
    if (!d && in->incarnation && v->inc && in->incarnation != v->inc) d = 1;
    v->restarts += d;
    v->job_restarts = in->restarts;
    if (in->incarnation) v->inc = in->incarnation;
    if (in->last_answer > v->last_answer) v->last_answer = in->last_answer;
    v->down_since = in->down_since;
  }
}

/* One daemon the configuration names (no heartbeat of its own reaches the
 * oracle): its role, index and address, the recoveries that lost it; an
 * embedding server (v) its incarnation as the oracle's probe saw it. */
static void json_cfg_daemon(sbuf_t *b, const char *role, size_t i, const char *addr, const char *summary,
                            const page_server_t *v, double now) {
  char who[48];
  snprintf(who, sizeof who, "%s-%zu", role, i);
  sb_printf(b, ", {");
  sb_str(b, "role", role);
  sb_printf(b, ", \"rank\": %zu, ", i);
  sb_str(b, "address", addr);
  sb_printf(b, ", \"recoveries\": %d", recoveries_of(summary, who));
  if (v) {
    char inc[24] = "";
    if (v->inc) snprintf(inc, sizeof inc, "%016llx", (unsigned long long)v->inc);
    sb_printf(b, ", ");
    sb_str(b, "incarnation", inc);
    sb_printf(b, ", \"restarts\": %llu, ", (unsigned long long)v->restarts);
    sb_num(b, "last_answer", v->last_answer > 0 ? v->last_answer : NAN);
    sb_printf(b, ", ");
    sb_num(b, "seconds_since_answer", v->last_answer > 0 ? now - v->last_answer : NAN);
    sb_printf(b, ", ");
    sb_num(b, "down_since", v->down_since > 0 ? v->down_since : NAN);
  }
  sb_printf(b, "}");
}

static void json_daemons(sbuf_t *b, oracle_page_t *pg, uint32_t generation, const char *address,
                         const oracle_page_member_t *m, size_t n, const char *summary) {
  sb_printf(b, "\"daemons\": [{\"role\": \"oracle\", ");
  sb_str(b, "address", address ? address : "");
  sb_printf(b, ", \"pid\": %d, \"generation\": %u, \"restarts\": %d}", (int)getpid(), generation,
            recoveries_of(summary, "oracle"));
  for (size_t i = 0; i < n; i++) {
    char who[48];
    snprintf(who, sizeof who, "%s-%u", m[i].role, m[i].rank);
    sb_printf(b, ", {");
    sb_str(b, "role", m[i].role);
    sb_printf(b, ", \"rank\": %u, ", m[i].rank);
    sb_str(b, "address", m[i].address);
    sb_printf(b, ", \"pid\": %u, \"alive\": %s, ", m[i].pid, m[i].alive ? "true" : "false");
    sb_num(b, "seconds_since_heartbeat", m[i].seconds_since_heartbeat);
    sb_printf(b, ", \"iteration\": %llu, \"recoveries\": %d}", (unsigned long long)m[i].iteration,
              recoveries_of(summary, who));
  }
  double now = clock_wall_s();
  for (size_t i = 0; i < pg->n_emb; i++) json_cfg_daemon(b, "embedding", i, pg->emb[i], summary, &pg->srv[i], now);
  for (size_t i = 0; i < pg->n_dp; i++) json_cfg_daemon(b, "dataproc", i, pg->dp[i], summary, NULL, now);
  sb_printf(b, "], ");
  sb_num(b, "embedding_restarts", metric(pg, "embedding_restarts_total"));
}

void oracle_page_refresh(oracle_page_t *pg, const oracle_job_t *j, uint32_t generation, const char *address,
                         const oracle_page_member_t *members, size_t n_members) {
  if (!pg || !j) return;
  char *summary = oracle_job_summary(j);
  if (!summary) return; /* out of memory: the last snapshot stays */
  point_t p;
  point_read(pg, summary, &p);
  p.gen = oracle_job_generation(j);
  history_add(pg, &p, oracle_job_state(j) == ORACLE_TRAINING);
  ckpts_update(pg, j, summary);
  servers_update(pg, j);
  sbuf_t b = {0};
  sb_printf(&b, "{\"time\": %.3f, ", p.t);
  json_job(&b, pg, j, generation, summary);
  sb_printf(&b, ", ");
  json_cache(&b, pg, summary);
  sb_printf(&b, ", ");
  json_history(&b, pg, nz(num(summary, "batch_size")));
  sb_printf(&b, ", ");
  json_daemons(&b, pg, generation, address, members, n_members, summary);
  sb_printf(&b, ", ");
  json_ckpts(&b, pg);
  sb_printf(&b, ", \"summary\": %s}\n", summary);
  free(summary);
  if (b.oom) {
    free(b.s);
    return;
  }
  pthread_mutex_lock(&pg->lock);
  char *old = pg->json;
  pg->json = b.s;
  pthread_mutex_unlock(&pg->lock);
  free(old);
}

/* ---- the actions (admin only: metrics_http_action checks the caller's
 * certificate; the loop takes them in oracle_page_take_actions) */

static int action_checkpoint(void *ud, const char *role, const char *arg, sbuf_t *body) {
  (void)role, (void)arg;
  oracle_page_t *pg = ud;
  pthread_mutex_lock(&pg->lock);
  pg->want_checkpoint = 1;
  pthread_mutex_unlock(&pg->lock);
  sb_printf(body, "a checkpoint is asked for (as chanter checkpoint does); /status.json shows it once complete\n");
  return 202;
}

static int action_recover(void *ud, const char *role, const char *arg, sbuf_t *body) {
  (void)role;
  oracle_page_t *pg = ud;
  char *end;
  long rank = strtol(arg, &end, 10);
  if (!*arg || *end || rank < 0) {
    sb_printf(body, "arg=%s: say which trainer (arg=RANK)\n", arg);
    return 400;
  }
  pthread_mutex_lock(&pg->lock);
  pg->want_recover = rank;
  pthread_mutex_unlock(&pg->lock);
  sb_printf(body, "trainer %ld is taken for lost: the job recovers as from its kill -9 (a drill); /status.json shows "
                  "the recovery\n",
            rank);
  return 202;
}

static const struct {
  const char *path;
  metrics_action_cb cb;
} actions[] = {{"/action/checkpoint", action_checkpoint}, {"/action/recover", action_recover}};
#define N_ACTIONS (sizeof actions / sizeof actions[0])

void oracle_page_take_actions(oracle_page_t *pg, int *checkpoint, long *recover_rank) {
  *checkpoint = 0;
  *recover_rank = -1;
  if (!pg) return;
  pthread_mutex_lock(&pg->lock);
  *checkpoint = pg->want_checkpoint;
  *recover_rank = pg->want_recover;
  pg->want_checkpoint = 0;
  pg->want_recover = -1;
  pthread_mutex_unlock(&pg->lock);
}

/* ---- create / destroy */

int oracle_page_create(const cfg_t *cfg, metrics_registry_t *reg, oracle_page_t **out, char *err, size_t err_len) {
  oracle_page_t *pg = calloc(1, sizeof *pg);
  int rc;
  *out = NULL;
  if (!pg) {
    snprintf(err, err_len, "status page: out of memory");
    return -ENOMEM;
  }
  pg->reg = reg;
  pg->every = 1;
  pg->want_recover = -1;
  pthread_mutex_init(&pg->lock, NULL);
  if ((rc = cfg_list(cfg, "cluster.embedding", &pg->emb, &pg->n_emb)) != 0 ||
      (rc = cfg_list(cfg, "cluster.dataproc", &pg->dp, &pg->n_dp)) != 0) {
    snprintf(err, err_len, "status page: cannot read the cluster's addresses");
    goto fail;
  }
  if (!(pg->srv = calloc(pg->n_emb + 1, sizeof *pg->srv)) || !(pg->sinfo = calloc(pg->n_emb + 1, sizeof *pg->sinfo)) ||
      !(pg->infos = calloc(PAGE_CKPTS, sizeof *pg->infos))) {
    snprintf(err, err_len, "status page: out of memory");
    rc = -ENOMEM;
    goto fail;
  }
  for (size_t i = 0; i < N_ROUTES; i++)
    if ((rc = metrics_http_route(reg, routes[i].path, routes[i].cb, pg)) != 0) {
      snprintf(err, err_len, "status page: cannot add the route %s: %s", routes[i].path, strerror(-rc));
      goto fail;
    }
  for (size_t i = 0; i < N_ACTIONS; i++)
    if ((rc = metrics_http_action(reg, actions[i].path, "admin", actions[i].cb, pg)) != 0) {
      snprintf(err, err_len, "status page: cannot add the action %s: %s", actions[i].path, strerror(-rc));
      goto fail;
    }
  *out = pg;
  return 0;
fail:
  oracle_page_destroy(pg);
  return rc;
}

void oracle_page_destroy(oracle_page_t *pg) {
  if (!pg) return;
  for (size_t i = 0; i < N_ROUTES; i++) metrics_http_route(pg->reg, routes[i].path, NULL, NULL);
  for (size_t i = 0; i < N_ACTIONS; i++) metrics_http_action(pg->reg, actions[i].path, NULL, NULL, NULL);
  cfg_list_free(pg->emb, pg->n_emb);
  cfg_list_free(pg->dp, pg->n_dp);
  free(pg->srv);
  free(pg->sinfo);
  free(pg->infos);
  pthread_mutex_destroy(&pg->lock);
  free(pg->json);
  free(pg);
}
