/* trainer_loop: see trainer_loop.h. */
#include "trainer_loop.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "trainer_ar.h"
#include "data.h"
#include "dpc.h"
#include "embc.h"
#include "err.h"
#include "log.h"
#include "orc.h"
#include "sdn.h"
#include "trainer_kmap.h"
#include "trainer_rows.h"
#include "trainer_step.h"

/* A progress line every LOG_EVERY iterations (and the first and last). */
#define LOG_EVERY 100

enum { PH_WAIT, PH_FETCH, PH_FWD, PH_BWD, PH_ALLREDUCE, PH_UPDATE, PH_WB, PH_TOTAL, PH_N };
static const char *phase_names[PH_N] = {"wait", "fetch", "forward", "backward", "allreduce", "update", "write_back",
                                        "total"};

struct trainer_s {
  const cfg_t *cfg;
  uint32_t rank, trainers;
  uint64_t iterations;
  int ideal;
  char address[256];
  data_schema_t schema;
  int have_schema;
  tbl_layout_t layout;
  tstep_t *ts;
  trows_t *local;      /* ideal mode */
  embc_t *embc;        /* normal mode */
  orc_t *orc;
  cfg_t *hb_cfg;       /* the heartbeat's own client: a deadline of its period, */
  orc_t *hb_orc;       /* so that a dead oracle cannot hold up the exit */
  coll_t *coll;
  tar_t *dense_ar;     /* the bucketed dense all-reduce (trainer_ar.h) */
  char prefix[512];
  char *save_dense;    /* --save-dense */

  /* the Work stream, cancelled by trainer_stop from any thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rpc_stream_t *stream;
  atomic_int stop;
  char stop_why[256];
  /* the oracle's StopWork said the job failed (another daemon's failure) */
  int job_failed;
  char job_msg[512];
  int drained;        /* the final drain of the stream is over (under mu) */
  int write_failed;   /* a Report / EvalResult could not be sent: the stream ended */

  /* heartbeat thread */
  pthread_t hb;
  int hb_running;
  atomic_ullong last_done; /* last finished iteration + 1 (0: none) */

  /* ---- the cache pipeline (every mode but ideal; trainer_loop.h) */
  uint64_t cache_rows;
  kmap_t *kmap;          /* training thread only */
  pthread_mutex_t pmu;   /* the fields below */
  pthread_cond_t fcv;    /* feeder queue, known_done, gate waits */
  pthread_cond_t bcv;    /* background work */
  /* the feeder: reads the Work stream, prefetches each Step's rows once
   * its gate allows, queues the items for the training thread */
  pthread_t feeder;
  int feeder_running;
  struct fitem_s *fq_head, *fq_tail;
  int feed_end, feed_rc, feed_quit;
  char feed_err[768];
  uint64_t known_done;   /* iterations < known_done finished by every trainer, background work included */
  int pf_state;          /* 0 reading the stream, 1 waiting for a gate, 2 fetching */
  uint64_t pf_x, pf_gate;
  uint64_t *pf_keys;     /* feeder only */
  float *pf_rows;
  size_t pf_cap;
  /* the background thread: delayed synchronization, delayed updates,
   * write-backs of one step while the next one trains */
  pthread_t bgth;
  int bg_running, bg_busy, bg_quit, bg_rc, bg_evict_pending;
  char bg_err[768];
  uint64_t bg_x;
  uint32_t *bg_del, *bg_wbs, *bg_evict;
  uint64_t *bg_wbk;
  float *bg_grad, *bg_rows;
  size_t bg_n_del, bg_n_wb, bg_n_evict, bg_cap_del, bg_cap_wb, bg_cap_evict;
  float *crit_buf;
  size_t cap_crit;

  /* scratch */
  float *eval_logits;
  size_t cap_eval;

  /* metrics */
  metrics_gauge_t *m_iter, *m_loss, *m_phase[PH_N];
  metrics_hist_t *m_step;
  metrics_counter_t *m_fetched, *m_synced, *m_written, *m_samples, *m_evals, *m_hits, *m_delayed, *m_replicated;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int stopping(trainer_t *t) { return atomic_load(&t->stop); }

/* ------------------------------------------------------------------ create */

static void register_metrics(trainer_t *t, metrics_registry_t *reg) {
  if (!reg) return;
  t->m_iter = metrics_gauge(reg, "iteration", NULL, "last training iteration finished by this trainer");
  t->m_loss = metrics_gauge(reg, "loss", NULL, "mean BCE loss of this trainer's samples in the last iteration");
  t->m_step = metrics_histogram(reg, "step_seconds", NULL, "seconds per training iteration (Step received to Report)",
                                metrics_latency_bounds, metrics_latency_n);
  t->m_fetched = metrics_counter(reg, "rows_fetched_total", NULL, "embedding rows fetched for training steps");
  t->m_synced =
      metrics_counter(reg, "rows_synced_total", NULL, "shared embedding rows whose gradients were all-reduced");
  t->m_written = metrics_counter(reg, "rows_written_back_total", NULL, "embedding rows written back");
  t->m_hits = metrics_counter(reg, "cache_hits_total", NULL,
                              "distinct rows of a step's samples already in the cache (not fetched for it)");
  t->m_replicated = metrics_counter(reg, "rows_replicated_total", NULL,
                                    "of the rows synchronized, owned rows handed to every trainer");
  t->m_delayed = metrics_counter(reg, "rows_synced_delayed_total", NULL,
                                 "shared rows synchronized in the background, overlapped with the next step");
  t->m_samples = metrics_counter(reg, "samples_total", NULL, "training samples processed by this trainer");
  t->m_evals = metrics_counter(reg, "eval_items_total", NULL, "evaluation items answered");
  for (int p = 0; p < PH_N; p++) {
    char lab[64];
    snprintf(lab, sizeof lab, "phase=\"%s\"", phase_names[p]);
    t->m_phase[p] = metrics_gauge(reg, "last_phase_seconds", lab, "seconds of each phase in the last iteration");
  }
}

/* The heartbeat's client: the job's oracle address, TLS and message size,
 * with rpc.timeout_ms = max(2 heartbeat periods, 1 s) (at most the job's
 * own), instead of the job's 30 s default. */
static int heartbeat_client(trainer_t *t, char *err, size_t err_len) {
  static const char *copy[] = {"cluster.oracle", "rpc.max_message_mb", "tls.ca_file", "tls.cert_file",
                               "tls.key_file",   "tls.server_name"};
  int64_t ms = 2 * cfg_int(t->cfg, "trainer.heartbeat_ms");
  if (ms < 1000) ms = 1000;
  if (ms > cfg_int(t->cfg, "rpc.timeout_ms")) ms = cfg_int(t->cfg, "rpc.timeout_ms");
  int rc = cfg_create(&t->hb_cfg);
  if (rc) return rc;
  char kv[8192];
  for (size_t i = 0; i < sizeof copy / sizeof copy[0] && !rc; i++) {
    const char *v = copy[i][0] == 'r' ? NULL : cfg_str(t->cfg, copy[i]);
    if (v)
      snprintf(kv, sizeof kv, "%s=%s", copy[i], v);
    else
      snprintf(kv, sizeof kv, "%s=%lld", copy[i], (long long)cfg_int(t->cfg, copy[i]));
    rc = cfg_set(t->hb_cfg, kv, "heartbeat", err, err_len);
  }
  snprintf(kv, sizeof kv, "rpc.timeout_ms=%lld", (long long)ms);
  if (!rc) rc = cfg_set(t->hb_cfg, kv, "heartbeat", err, err_len);
  if (!rc) rc = orc_create(t->hb_cfg, NULL, &t->hb_orc, err, err_len);
  return rc;
}

int trainer_create(const cfg_t *cfg, uint32_t rank, metrics_registry_t *reg, trainer_t **out, char *err,
                   size_t err_len) {
  *out = NULL;
  trainer_t *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  pthread_mutex_init(&t->pmu, NULL);
  pthread_cond_init(&t->fcv, NULL);
  pthread_cond_init(&t->bcv, NULL);
  t->cfg = cfg;
  t->rank = rank;
  t->trainers = (uint32_t)cfg_int(cfg, "trainers");
  t->iterations = (uint64_t)cfg_int(cfg, "iterations");
  t->ideal = strcmp(cfg_str(cfg, "mode"), "ideal") == 0;
  int rc = 0;
  char **hosts = NULL;
  size_t n_hosts = 0;
  if (rank >= t->trainers) {
    rc = err_set(err, err_len, ERR_CONFIG, "rank %u is outside the job's trainers = %u (from %s)", rank, t->trainers,
                 cfg_origin(cfg, "trainers"));
    goto fail;
  }
  if ((rc = cfg_list(cfg, "cluster.trainers", &hosts, &n_hosts)) != 0) goto fail;
  snprintf(t->address, sizeof t->address, "%s", rank < n_hosts ? hosts[rank] : "127.0.0.1");
  cfg_list_free(hosts, n_hosts);
  if ((rc = data_schema_from_cfg(cfg, &t->schema, err, err_len)) != 0) goto fail;
  t->have_schema = 1;
  if ((rc = cfg_layout(cfg, &t->layout, err, err_len)) != 0) goto fail;
  if ((rc = tstep_create(cfg, &t->schema, &t->layout, (uint32_t)cfg_int(cfg, "batch_size"), &t->ts, err, err_len)) != 0)
    goto fail;
  if (t->ideal) {
    if ((rc = trows_create(&t->layout, &t->local)) != 0) {
      err_set(err, err_len, rc, "cannot create the local row store: %s", err_str(rc));
      goto fail;
    }
  } else {
    if ((rc = embc_create(cfg, &t->embc, err, err_len)) != 0) goto fail;
    t->cache_rows = (uint64_t)cfg_int(cfg, "cache_rows");
    if ((rc = tstep_cache_init(t->ts, t->cache_rows, err, err_len)) != 0) goto fail;
    if ((rc = kmap_create(t->cache_rows, &t->kmap)) != 0) {
      err_set(err, err_len, rc, "out of memory for the map of %" PRIu64 " cache slots", t->cache_rows);
      goto fail;
    }
    log_info("cache rank=%u cache_rows=%" PRIu64 " bytes=%.1f MiB", rank, t->cache_rows,
             (double)t->cache_rows * tstep_row_floats(t->ts) * 4 / (1 << 20));
  }
  if ((rc = orc_create(cfg, NULL, &t->orc, err, err_len)) != 0) goto fail;
  if ((rc = heartbeat_client(t, err, err_len)) != 0) goto fail;
  register_metrics(t, reg);
  *out = t;
  return 0;
fail:
  trainer_destroy(t);
  return rc;
}

void trainer_destroy(trainer_t *t) {
  if (!t) return;
  tar_destroy(t->dense_ar);
  coll_destroy(t->coll);
  orc_destroy(t->hb_orc);
  cfg_destroy(t->hb_cfg);
  orc_destroy(t->orc);
  embc_destroy(t->embc);
  trows_destroy(t->local);
  tstep_destroy(t->ts);
  tbl_layout_close(&t->layout);
  if (t->have_schema) data_schema_close(&t->schema);
  free(t->eval_logits);
  free(t->save_dense);
  kmap_destroy(t->kmap);
  free(t->pf_keys);
  free(t->pf_rows);
  free(t->bg_del);
  free(t->bg_wbs);
  free(t->bg_evict);
  free(t->bg_wbk);
  free(t->bg_grad);
  free(t->bg_rows);
  free(t->crit_buf);
  pthread_cond_destroy(&t->bcv);
  pthread_cond_destroy(&t->fcv);
  pthread_mutex_destroy(&t->pmu);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

int trainer_save_dense_to(trainer_t *t, const char *path) {
  free(t->save_dense);
  t->save_dense = path ? strdup(path) : NULL;
  return path && !t->save_dense ? -ENOMEM : 0;
}

/* Writes the dense parameters to path (temporary file, then rename). */
static int save_dense(trainer_t *t, const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return -errno;
  size_t n = tstep_n_params(t->ts);
  int rc = fwrite(tstep_params(t->ts), sizeof(float), n, f) == n ? 0 : -EIO;
  if (fclose(f) != 0 && !rc) rc = -errno;
  if (!rc && rename(tmp, path) != 0) rc = -errno;
  return rc;
}

void trainer_stop(trainer_t *t, const char *why) {
  pthread_mutex_lock(&t->mu);
  if (!atomic_exchange(&t->stop, 1)) {
    snprintf(t->stop_why, sizeof t->stop_why, "%s", why ? why : "stop requested");
    log_info("stopping rank=%u reason=\"%s\"", t->rank, t->stop_why);
  }
  if (t->stream) rpc_stream_cancel(t->stream);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_lock(&t->pmu);
  pthread_cond_broadcast(&t->fcv);
  pthread_cond_broadcast(&t->bcv);
  pthread_mutex_unlock(&t->pmu);
}

/* ------------------------------------------------------------------ heartbeat */

static void *heartbeat_main(void *arg) {
  trainer_t *t = arg;
  int64_t every = cfg_int(t->cfg, "trainer.heartbeat_ms");
  int failing = 0;
  pthread_mutex_lock(&t->mu);
  while (!stopping(t)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += every / 1000;
    ts.tv_nsec += (every % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    if (stopping(t)) break;
    pthread_mutex_unlock(&t->mu);
    unsigned long long done = atomic_load(&t->last_done);
    int stop = 0;
    char err[512] = "";
    int rc = orc_heartbeat(t->hb_orc, CHANTER__ORACLE__V1__ROLE__TRAINER, t->rank, done ? done - 1 : 0, &stop, err,
                           sizeof err);
    if (rc && !failing) log_warn("heartbeat failed rank=%u err=\"%s\"", t->rank, err);
    if (!rc && failing) log_info("heartbeat answered again rank=%u", t->rank);
    failing = rc != 0;
    if (!rc && stop) trainer_stop(t, "the oracle answered a heartbeat with stop");
    pthread_mutex_lock(&t->mu);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* ------------------------------------------------------------------ rendezvous store over the oracle's KV */

static int kv_set(void *ud, const char *key, const void *val, size_t len) {
  trainer_t *t = ud;
  char err[512];
  int rc = orc_kv_set(t->orc, key, val, len, err, sizeof err);
  if (rc) log_error("rendezvous: KvSet failed rank=%u key=%s err=\"%s\"", t->rank, key, err);
  return rc;
}

static int kv_get(void *ud, const char *key, void **val, size_t *len, int64_t timeout_ms) {
  trainer_t *t = ud;
  char err[512];
  int rc = orc_kv_get(t->orc, key, val, len, timeout_ms, err, sizeof err);
  if (rc == ERR_NOTFOUND) return ERR_DEADLINE;
  if (rc) log_error("rendezvous: KvGet failed rank=%u key=%s err=\"%s\"", t->rank, key, err);
  return rc;
}

/* ------------------------------------------------------------------ helpers */

static int check_keys_field(const ProtobufCBinaryData *f, const char *name, uint64_t x, char *err, size_t err_len) {
  if (f->len % 8)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, not a multiple of 8", x, name,
                   f->len);
  return 0;
}

/* Ideal mode: puts the rows of keys (sorted) into the step's slot array
 * from the trainer-local store. */
static int fetch(trainer_t *t, const void *keys, size_t n, char *err, size_t err_len) {
  float *rows;
  int rc = tstep_set_slots(t->ts, keys, n, &rows, err, err_len);
  if (rc || !n) return rc;
  char why[256] = "";
  rc = trows_gather(t->local, tstep_slot_keys(t->ts), n, rows, why, sizeof why);
  if (rc) err_set(err, err_len, rc, "local rows: %s", why[0] ? why : err_str(rc));
  return rc;
}

/* ------------------------------------------------------------------ the cache pipeline
 *
 * Three threads per trainer (DESIGN.md 3):
 *   feeder      reads the Work stream; for a Step, waits for its gate
 *               (every trainer finished the iterations < prefetch_gate,
 *               background work included), fetches its rows from the
 *               embedding servers into their cache slots, then queues it;
 *   training    forward, backward (dense all-reduce overlapped), critical
 *               synchronization, updates, hand-off to the background, the
 *               Report;
 *   background  the delayed synchronization of step x, the delayed rows'
 *               updates and x's write-backs, while step x+1's forward runs.
 * They touch disjoint cache slots (the oracle's slot rules), so the hot
 * path takes no lock; they meet once per step on pmu.
 *
 * What "every trainer finished" means here: the background work of x-1 is
 * waited for before the backward of x, whose dense all-reduce then cannot
 * complete on any trainer before every trainer has done so: after it,
 * known_done = x.  A gate beyond that (x itself, with L = 0) is reached
 * by an explicit barrier (gate_barrier).  The group's collectives run in
 * one order on every trainer: [background x-1: delayed rows] [the gate
 * barrier, if any] [dense buckets of x] [critical rows of x] ... */

typedef struct fitem_s {
  struct fitem_s *next;
  Chanter__Oracle__V1__WorkItem *item;
  double t_fetch;   /* seconds the feeder spent fetching its rows */
  double t_arrived; /* when the feeder read it from the stream (now_s) */
} fitem_t;

static int grow_buf(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 1024;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = nc;
  return 0;
}

static int check_u32_field(const tstep_t *ts, const ProtobufCBinaryData *f, size_t want, const char *name, uint64_t x,
                           char *err, size_t err_len) {
  if (want != SIZE_MAX && f->len != want * 4)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, want %zu (4 per entry)", x,
                   name, f->len, want * 4);
  if (f->len % 4)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, not a multiple of 4", x, name,
                   f->len);
  char why[256];
  int rc = tstep_cache_check(ts, f->data, f->len / 4, name, why, sizeof why);
  if (rc) return err_set(err, err_len, rc, "iteration %" PRIu64 ": %s", x, why);
  return 0;
}

/* The feeder's prefetch of one Step: validate, wait for the gate, fetch. */
static int prefetch(trainer_t *t, const Chanter__Oracle__V1__Step *st, double *t_fetch, char *err, size_t err_len) {
  uint64_t x = st->iteration;
  int rc;
  if ((rc = check_keys_field(&st->fetch_keys, "fetch_keys", x, err, err_len)) != 0) return rc;
  size_t n = st->fetch_keys.len / 8;
  if ((rc = check_u32_field(t->ts, &st->fetch_slots, n, "fetch_slots", x, err, err_len)) != 0) return rc;
  pthread_mutex_lock(&t->pmu);
  if (st->prefetch_gate > t->known_done) {
    t->pf_state = 1;
    t->pf_x = x;
    t->pf_gate = st->prefetch_gate;
    pthread_cond_broadcast(&t->fcv);
    while (st->prefetch_gate > t->known_done && !stopping(t) && !t->feed_quit) pthread_cond_wait(&t->fcv, &t->pmu);
  }
  t->pf_state = 2;
  t->pf_x = x;
  int quit = t->feed_quit;
  pthread_mutex_unlock(&t->pmu);
  if (stopping(t) || quit) return err_set(err, err_len, ERR_CANCELLED, "stopped while waiting to prefetch iteration %" PRIu64, x);
  double t0 = now_s();
  if (n) {
    uint32_t rf = tstep_row_floats(t->ts);
    size_t cap_k = t->pf_cap, cap_r = t->pf_cap;
    if (grow_buf((void **)&t->pf_keys, &cap_k, n, sizeof *t->pf_keys) ||
        grow_buf((void **)&t->pf_rows, &cap_r, n * rf, sizeof(float)))
      return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory for %zu prefetched rows", x, n);
    t->pf_cap = cap_k < cap_r / rf ? cap_k : cap_r / rf;
    memcpy(t->pf_keys, st->fetch_keys.data, n * 8);
    char why[768] = "";
    if ((rc = embc_lookup(t->embc, t->pf_keys, n, t->pf_rows, why, sizeof why)) != 0)
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": prefetch of %zu rows failed: %s", x, n, why);
    tstep_cache_scatter(t->ts, st->fetch_slots.data, n, t->pf_rows);
  }
  *t_fetch = now_s() - t0;
  return 0;
}

static void feed_finish(trainer_t *t, int rc, const char *why) {
  pthread_mutex_lock(&t->pmu);
  t->feed_end = 1;
  t->feed_rc = rc;
  snprintf(t->feed_err, sizeof t->feed_err, "%s", why);
  t->pf_state = 0;
  pthread_cond_broadcast(&t->fcv);
  pthread_mutex_unlock(&t->pmu);
}

static void *feeder_main(void *arg) {
  trainer_t *t = arg;
  tstep_cache_thread(TSTEP_ROLE_PREFETCH);
  for (;;) {
    Chanter__Oracle__V1__WorkItem *item = NULL;
    int rc = orc_work_next(t->stream, &item);
    double t_arrived = now_s();
    if (rc) {
      char why[768];
      snprintf(why, sizeof why, "the Work stream from the oracle at %s broke: %s", orc_address(t->orc), err_str(rc));
      feed_finish(t, rc, rc == 1 ? "" : why);
      return NULL;
    }
    double tf = 0;
    char err[768] = "";
    if (!t->ideal && item->kind_case == CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP &&
        (rc = prefetch(t, item->step, &tf, err, sizeof err)) != 0) {
      protobuf_c_message_free_unpacked(&item->base, NULL);
      feed_finish(t, rc, err);
      return NULL;
    }
    fitem_t *f = calloc(1, sizeof *f);
    if (!f) {
      protobuf_c_message_free_unpacked(&item->base, NULL);
      feed_finish(t, -ENOMEM, "out of memory queueing a work item");
      return NULL;
    }
    f->item = item;
    f->t_fetch = tf;
    f->t_arrived = t_arrived;
    pthread_mutex_lock(&t->pmu);
    if (t->fq_tail) t->fq_tail->next = f;
    else t->fq_head = f;
    t->fq_tail = f;
    t->pf_state = 0;
    pthread_cond_broadcast(&t->fcv);
    pthread_mutex_unlock(&t->pmu);
  }
}

static void *bg_main(void *arg) {
  trainer_t *t = arg;
  tstep_cache_thread(TSTEP_ROLE_BACKGROUND);
  uint32_t dim = tstep_dim(t->ts);
  pthread_mutex_lock(&t->pmu);
  for (;;) {
    while (!t->bg_busy && !t->bg_quit) pthread_cond_wait(&t->bcv, &t->pmu);
    if (!t->bg_busy) break;
    int failed = t->bg_rc != 0;
    pthread_mutex_unlock(&t->pmu);
    int rc = 0;
    char err[768] = "";
    if (!failed && t->bg_n_del) {
      if ((rc = coll_allreduce_sum_f32_ordered(t->coll, t->bg_grad, t->bg_n_del * dim)) != 0)
        err_set(err, sizeof err, rc,
                "iteration %" PRIu64 ": all-reduce of %zu delayed rows' gradients among %u trainers failed: %s",
                t->bg_x, t->bg_n_del, t->trainers, err_str(rc));
      else
        tstep_cache_update_rows(t->ts, t->bg_del, t->bg_n_del, t->bg_grad);
    }
    if (!failed && !rc && t->bg_n_wb) {
      tstep_cache_gather(t->ts, t->bg_wbs, t->bg_n_wb, t->bg_rows);
      char why[768] = "";
      if ((rc = embc_write(t->embc, t->bg_wbk, t->bg_n_wb, t->bg_rows, why, sizeof why)) != 0)
        err_set(err, sizeof err, rc, "iteration %" PRIu64 ": write-back of %zu rows failed: %s", t->bg_x, t->bg_n_wb,
                why);
    }
    pthread_mutex_lock(&t->pmu);
    if (rc && !t->bg_rc) {
      t->bg_rc = rc;
      snprintf(t->bg_err, sizeof t->bg_err, "%s", err);
    }
    t->bg_busy = 0;
    pthread_cond_broadcast(&t->bcv);
  }
  pthread_mutex_unlock(&t->pmu);
  return NULL;
}

/* Waits for the background work in flight; then its evictions leave the
 * key map.  0 or its error. */
static int wait_bg(trainer_t *t, double *t_waited, char *err, size_t err_len) {
  double t0 = now_s();
  pthread_mutex_lock(&t->pmu);
  while (t->bg_busy) pthread_cond_wait(&t->bcv, &t->pmu);
  int rc = t->bg_rc;
  if (rc) err_set(err, err_len, rc, "%s", t->bg_err);
  pthread_mutex_unlock(&t->pmu);
  if (!rc && t->bg_evict_pending) {
    for (size_t i = 0; i < t->bg_n_evict; i++) kmap_clear(t->kmap, t->bg_evict[i]);
    t->bg_evict_pending = 0;
  }
  if (t_waited) *t_waited += now_s() - t0;
  return rc;
}

/* Every trainer has finished the iterations < x (background included):
 * this trainer's background, then a barrier. */
static int gate_barrier(trainer_t *t, uint64_t x, char *err, size_t err_len) {
  int rc = wait_bg(t, NULL, err, err_len);
  if (rc) return rc;
  if ((rc = coll_barrier(t->coll)) != 0)
    return err_set(err, err_len, rc, "barrier before iteration %" PRIu64 " failed among %u trainers: %s", x,
                   t->trainers, err_str(rc));
  pthread_mutex_lock(&t->pmu);
  if (x > t->known_done) t->known_done = x;
  pthread_cond_broadcast(&t->fcv);
  pthread_mutex_unlock(&t->pmu);
  return 0;
}

/* The next queued item (for iteration `expect` when it is a Step).  1 at
 * the clean end of the stream, a negative code on failure (err).
 * *t_prefetch_wait: the part of the wait after the item had arrived from
 * the oracle (its gate and the fetch of its rows: the feeder's work, not
 * the oracle's); the caller's whole wait minus that is the wait for the
 * oracle's Step itself. */
static int next_item(trainer_t *t, uint64_t expect, fitem_t **out, double *t_prefetch_wait, char *err,
                     size_t err_len) {
  *out = NULL;
  *t_prefetch_wait = 0;
  double t0 = now_s();
  pthread_mutex_lock(&t->pmu);
  for (;;) {
    if (t->fq_head) {
      fitem_t *f = t->fq_head;
      t->fq_head = f->next;
      if (!t->fq_head) t->fq_tail = NULL;
      pthread_mutex_unlock(&t->pmu);
      *t_prefetch_wait = now_s() - (f->t_arrived > t0 ? f->t_arrived : t0);
      *out = f;
      return 0;
    }
    if (t->feed_end) {
      int rc = t->feed_rc;
      if (rc != 1) err_set(err, err_len, rc, "%s", t->feed_err);
      pthread_mutex_unlock(&t->pmu);
      return rc;
    }
    if (!t->ideal && t->pf_state == 1 && t->pf_x == expect && t->pf_gate > t->known_done) {
      pthread_mutex_unlock(&t->pmu);
      int rc = gate_barrier(t, expect, err, err_len);
      if (rc) return rc;
      pthread_mutex_lock(&t->pmu);
      continue;
    }
    pthread_cond_wait(&t->fcv, &t->pmu);
  }
}

static void free_fitem(fitem_t *f) {
  if (!f) return;
  if (f->item) protobuf_c_message_free_unpacked(&f->item->base, NULL);
  free(f);
}

/* Room in the background's buffers (only touched while it is idle). */
static int bg_reserve(trainer_t *t, size_t n_del, size_t n_wb, size_t n_ev, uint32_t dim, uint32_t rf) {
  if (n_del + 1 > t->bg_cap_del) {
    size_t nc = (n_del + 1) * 2;
    uint32_t *d = realloc(t->bg_del, nc * sizeof *d);
    if (d) t->bg_del = d;
    float *g = realloc(t->bg_grad, nc * dim * sizeof(float));
    if (g) t->bg_grad = g;
    if (!d || !g) return -ENOMEM;
    t->bg_cap_del = nc;
  }
  if (n_wb + 1 > t->bg_cap_wb) {
    size_t nc = (n_wb + 1) * 2;
    uint64_t *k = realloc(t->bg_wbk, nc * sizeof *k);
    if (k) t->bg_wbk = k;
    uint32_t *w = realloc(t->bg_wbs, nc * sizeof *w);
    if (w) t->bg_wbs = w;
    float *r = realloc(t->bg_rows, nc * rf * sizeof(float));
    if (r) t->bg_rows = r;
    if (!k || !w || !r) return -ENOMEM;
    t->bg_cap_wb = nc;
  }
  if (n_ev + 1 > t->bg_cap_evict) {
    size_t nc = (n_ev + 1) * 2;
    uint32_t *e = realloc(t->bg_evict, nc * sizeof *e);
    if (!e) return -ENOMEM;
    t->bg_evict = e;
    t->bg_cap_evict = nc;
  }
  return 0;
}

static int start_pipeline(trainer_t *t) {
  if (pthread_create(&t->feeder, NULL, feeder_main, t) != 0) return -EAGAIN;
  t->feeder_running = 1;
  if (!t->ideal) {
    if (pthread_create(&t->bgth, NULL, bg_main, t) != 0) return -EAGAIN;
    t->bg_running = 1;
  }
  return 0;
}

/* The feeder ends with the stream (cancelled or finished by the caller). */
static void join_feeder(trainer_t *t) {
  if (!t->feeder_running) return;
  pthread_join(t->feeder, NULL);
  t->feeder_running = 0;
  pthread_mutex_lock(&t->pmu);
  fitem_t *f = t->fq_head;
  t->fq_head = t->fq_tail = NULL;
  pthread_mutex_unlock(&t->pmu);
  while (f) {
    fitem_t *n = f->next;
    free_fitem(f);
    f = n;
  }
}

static void stop_bg(trainer_t *t) {
  if (!t->bg_running) return;
  pthread_mutex_lock(&t->pmu);
  t->bg_quit = 1;
  pthread_cond_broadcast(&t->bcv);
  pthread_mutex_unlock(&t->pmu);
  pthread_join(t->bgth, NULL);
  t->bg_running = 0;
}

/* What one step moved, for the Report, the metrics and the log. */
typedef struct step_counts_s {
  size_t fetched, synced, synced_delayed, replicated, written_back, hits;
  double dense_comm, prefetch_wait, sync_wait, sync_critical, replicate;
  uint32_t lookahead;
} step_counts_t;

static int report_step(trainer_t *t, uint64_t x, uint32_t n, double loss, const double *ph, const step_counts_t *c,
                       char *err, size_t err_len) {
  char why[600];
  int rc = tstep_device_status(t->ts, why, sizeof why);
  if (rc) /* a GPU failure in this step (or in the background work before it): not reported as done */
    return err_set(err, err_len, rc, "iteration %" PRIu64 " on the GPU: %s", x, why);
  Chanter__Oracle__V1__Report r = CHANTER__ORACLE__V1__REPORT__INIT;
  r.iteration = x;
  r.loss_sum = loss;
  r.samples = n;
  r.rows_fetched = c->fetched;
  r.rows_synced = c->synced;
  r.rows_synced_delayed = c->synced_delayed;
  r.rows_replicated = c->replicated;
  r.rows_written_back = c->written_back;
  r.cache_hits = c->hits;
  r.t_wait = ph[PH_WAIT];
  r.t_fetch = ph[PH_FETCH];
  r.t_forward = ph[PH_FWD];
  r.t_backward = ph[PH_BWD];
  r.t_allreduce = ph[PH_ALLREDUCE];
  r.t_update = ph[PH_UPDATE];
  r.t_write_back = ph[PH_WB];
  r.t_total = ph[PH_TOTAL];
  r.t_prefetch_wait = c->prefetch_wait;
  r.t_sync_wait = c->sync_wait;
  r.t_sync_critical = c->sync_critical;
  r.t_replicate = c->replicate;
  uint8_t sha[32];
  char hex[65] = "";
  if (x + 1 == t->iterations) {
    tstep_dense_sha256(t->ts, sha);
    r.dense_sha256.data = sha;
    r.dense_sha256.len = 32;
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    if (t->save_dense && (rc = save_dense(t, t->save_dense)) != 0)
      log_warn("cannot save the dense parameters path=%s err=\"%s\"", t->save_dense, err_str(rc));
    else if (t->save_dense)
      log_info("dense parameters saved path=%s floats=%zu", t->save_dense, tstep_n_params(t->ts));
  }
  if ((rc = orc_work_report(t->stream, &r)) != 0 && (t->write_failed = 1))
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": cannot send the Report to the oracle at %s: %s", x,
                   orc_address(t->orc), err_str(rc));
  atomic_store(&t->last_done, x + 1);

  metrics_gauge_set(t->m_iter, (double)x);
  if (n) metrics_gauge_set(t->m_loss, loss / n);
  metrics_hist_observe(t->m_step, ph[PH_TOTAL] - ph[PH_WAIT]);
  metrics_counter_add(t->m_fetched, c->fetched);
  metrics_counter_add(t->m_synced, c->synced);
  metrics_counter_add(t->m_written, c->written_back);
  metrics_counter_add(t->m_hits, c->hits);
  metrics_counter_add(t->m_delayed, c->synced_delayed);
  metrics_counter_add(t->m_replicated, c->replicated);
  metrics_counter_add(t->m_samples, n);
  for (int p = 0; p < PH_N; p++) metrics_gauge_set(t->m_phase[p], ph[p]);
  if (x == 0 || (x + 1) % LOG_EVERY == 0 || x + 1 == t->iterations) {
    log_info("progress rank=%u iteration=%" PRIu64 " done=%" PRIu64 "/%" PRIu64
             " samples=%u loss=%.5f lookahead=%u rows_fetched=%zu cache_hits=%zu rows_synced=%zu delayed=%zu"
             " rows_written_back=%zu wait_ms=%.2f fetch_ms=%.2f forward_ms=%.2f sync_wait_ms=%.2f backward_ms=%.2f"
             " allreduce_ms=%.2f dense_comm_ms=%.2f update_ms=%.2f write_back_ms=%.2f total_ms=%.2f%s%s",
             t->rank, x, x + 1, t->iterations, n, n ? loss / n : 0.0, c->lookahead, c->fetched, c->hits, c->synced,
             c->synced_delayed, c->written_back, 1e3 * ph[PH_WAIT], 1e3 * ph[PH_FETCH], 1e3 * ph[PH_FWD],
             1e3 * c->sync_wait, 1e3 * ph[PH_BWD], 1e3 * ph[PH_ALLREDUCE], 1e3 * c->dense_comm, 1e3 * ph[PH_UPDATE],
             1e3 * ph[PH_WB], 1e3 * ph[PH_TOTAL], hex[0] ? " dense_sha256=" : "", hex);
    sdn_status("training: iteration %" PRIu64 "/%" PRIu64 " (rank %u of %u)", x + 1, t->iterations, t->rank,
               t->trainers);
  }
  return 0;
}

/* ------------------------------------------------------------------ one step */

/* What both kinds of step check first: the iteration expected, the
 * samples against the schema, the global batch.  *b views the tstep's
 * copy of the samples. */
static int step_batch(trainer_t *t, const Chanter__Oracle__V1__Step *st, uint64_t expect, tstep_batch_t *b, char *err,
                      size_t err_len) {
  uint64_t x = st->iteration;
  if (x != expect)
    return err_set(err, err_len, ERR_BADMSG, "the oracle sent Step %" PRIu64 " but iteration %" PRIu64 " was next", x,
                   expect);
  char why[768] = "";
  int rc = tstep_batch_from_pb(t->ts, st->samples, 0, b, why, sizeof why);
  if (rc) return err_set(err, err_len, rc, "iteration %" PRIu64 ": bad samples: %s", x, why);
  if (b->n && st->global_batch < b->n)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": global_batch %u is smaller than this trainer's %u samples", x,
                   st->global_batch, b->n);
  return 0;
}

/* The end of the dense all-reduce that started inside the backward
 * (trainer_ar.h); *t_comm: its own time. */
static int dense_finish(trainer_t *t, uint64_t x, double *t_comm, char *err, size_t err_len) {
  int rc = tar_finish(t->dense_ar, t_comm);
  if (rc)
    err_set(err, err_len, rc,
            "iteration %" PRIu64 ": dense all-reduce of %zu floats among %u trainers failed: %s "
            "(a peer trainer died or is unreachable; see the collective's log line)",
            x, tstep_n_params(t->ts), t->trainers, err_str(rc));
  return rc;
}

static int do_step_ideal(trainer_t *t, const Chanter__Oracle__V1__Step *st, uint64_t expect, double t_wait,
                         char *err, size_t err_len) {
  uint64_t x = st->iteration;
  double ph[PH_N] = {0};
  ph[PH_WAIT] = t_wait;
  double t0 = now_s();
  tstep_batch_t b;
  char why[768] = "";
  int rc = step_batch(t, st, expect, &b, err, err_len);
  if (rc) return rc;

  /* a. rows: this batch's own, from the local store */
  size_t n_fetch;
  const uint64_t *fkeys;
  if ((rc = tstep_batch_keys(t->ts, &b, &fkeys, &n_fetch)) != 0) return rc;
  if ((rc = fetch(t, fkeys, n_fetch, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": fetch of %zu rows failed: %s", x, n_fetch, why);
  double t1 = now_s();

  /* b. forward, backward; c. the dense all-reduce starts inside the
   * backward (trainer_ar.h) and ends after it; no row is synchronized */
  if ((rc = tstep_forward(t->ts, &b, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": %s", x, why);
  double t2 = now_s();
  tar_begin(t->dense_ar);
  double loss = tstep_backward(t->ts, &b, st->global_batch ? st->global_batch : 1);
  double t3 = now_s();
  double t_comm = 0;
  if ((rc = dense_finish(t, x, &t_comm, err, err_len)) != 0) return rc;
  double t4 = now_s();

  /* d. update; e. the rows back to the local store */
  tstep_update(t->ts);
  double t5 = now_s();
  size_t n_wb = tstep_slots(t->ts);
  if ((rc = trows_scatter(t->local, tstep_slot_keys(t->ts), n_wb, tstep_slot_rows(t->ts), why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": local rows: %s", x, why);
  double t6 = now_s();

  ph[PH_FETCH] = t1 - t0;
  ph[PH_FWD] = t2 - t1;
  ph[PH_BWD] = t3 - t2;
  ph[PH_ALLREDUCE] = t4 - t3;
  ph[PH_UPDATE] = t5 - t4;
  ph[PH_WB] = t6 - t5;
  ph[PH_TOTAL] = t_wait + (t6 - t0);

  /* f. report: no embedding traffic */
  step_counts_t c = {.dense_comm = t_comm};
  return report_step(t, x, b.n, loss, ph, &c, err, err_len);
}

/* Step x's ownership changes (Step fields 16-20): this trainer's own /
 * stale marks in the key map (what evaluation reads), then the replicated
 * rows (an allgather of each owner's copies; every trainer takes the
 * owner's bytes, no arithmetic, so the bits are the owner's), which every
 * trainer holds again. */
static int ownership(trainer_t *t, const Chanter__Oracle__V1__Step *st, uint64_t x, char *err, size_t err_len) {
  int rc;
  if ((rc = check_u32_field(t->ts, &st->own_slots, SIZE_MAX, "own_slots", x, err, err_len)) != 0 ||
      (rc = check_u32_field(t->ts, &st->stale_slots, SIZE_MAX, "stale_slots", x, err, err_len)) != 0)
    return rc;
  for (size_t i = 0; i < st->own_slots.len / 4; i++) {
    uint32_t sl;
    memcpy(&sl, st->own_slots.data + 4 * i, 4);
    kmap_set_owned(t->kmap, sl, 1);
  }
  for (size_t i = 0; i < st->stale_slots.len / 4; i++) {
    uint32_t sl;
    memcpy(&sl, st->stale_slots.data + 4 * i, 4);
    kmap_clear(t->kmap, sl);
  }
  size_t n = st->replicate_slots.len / 4;
  if ((rc = check_u32_field(t->ts, &st->replicate_slots, SIZE_MAX, "replicate_slots", x, err, err_len)) != 0)
    return rc;
  if (st->replicate_owners.len != n * 4 || st->replicate_keys.len != n * 8)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": %zu replicate slots but %zu owner bytes and %zu key bytes", x, n,
                   st->replicate_owners.len, st->replicate_keys.len);
  if (n) {
    /* Each owner sends only its own rows: grouped by owner (in list order
     * inside a group), every group padded to the largest, one allgather;
     * one gather of this trainer's rows and one scatter per other owner. */
    uint32_t rf = tstep_row_floats(t->ts), P = t->trainers;
    size_t *off = calloc((size_t)P + 1, sizeof *off), maxc = 0;
    uint32_t *grouped = malloc(n * sizeof *grouped);
    if (!off || !grouped) {
      free(off), free(grouped);
      return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory replicating %zu rows", x, n);
    }
    for (size_t i = 0; i < n; i++) {
      uint32_t o;
      memcpy(&o, st->replicate_owners.data + 4 * i, 4);
      if (o >= P) {
        free(off), free(grouped);
        return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": replicate_owners[%zu] = %u, only %u trainers",
                       x, i, o, P);
      }
      off[o + 1]++;
    }
    for (uint32_t o = 0; o < P; o++) {
      if (off[o + 1] > maxc) maxc = off[o + 1];
      off[o + 1] += off[o];
    }
    size_t *fill = calloc(P, sizeof *fill);
    float *mine = calloc(maxc * rf, sizeof(float)), *all = malloc((size_t)P * maxc * rf * sizeof(float));
    if (!fill || !mine || !all) {
      free(off), free(grouped), free(fill), free(mine), free(all);
      return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory replicating %zu rows", x, n);
    }
    for (size_t i = 0; i < n; i++) {
      uint32_t o, sl;
      memcpy(&o, st->replicate_owners.data + 4 * i, 4);
      memcpy(&sl, st->replicate_slots.data + 4 * i, 4);
      grouped[off[o] + fill[o]++] = sl;
    }
    size_t mine_n = off[t->rank + 1] - off[t->rank];
    tstep_cache_gather(t->ts, grouped + off[t->rank], mine_n, mine);
    if ((rc = coll_allgather(t->coll, mine, maxc * rf * sizeof(float), all)) != 0) {
      free(off), free(grouped), free(fill), free(mine), free(all);
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": replicating %zu owned rows among %u trainers failed: %s",
                     x, n, P, err_str(rc));
    }
    for (uint32_t o = 0; o < P; o++)
      if (o != t->rank && off[o + 1] > off[o])
        tstep_cache_scatter(t->ts, grouped + off[o], off[o + 1] - off[o], all + (size_t)o * maxc * rf);
    for (size_t i = 0; i < n; i++) {
      uint32_t sl;
      uint64_t k;
      memcpy(&sl, st->replicate_slots.data + 4 * i, 4);
      memcpy(&k, st->replicate_keys.data + 8 * i, 8);
      if (kmap_set(t->kmap, sl, k) != 0) {
        free(off), free(grouped), free(fill), free(mine), free(all);
        return err_set(err, err_len, -ENOMEM, "out of memory in the key map");
      }
    }
    free(off), free(grouped), free(fill), free(mine), free(all);
  }
  return 0;
}

/* One step with the cache (every mode but ideal; see "the cache pipeline"
 * above).  Its rows were prefetched into their slots by the feeder. */
static int do_step_cache(trainer_t *t, const Chanter__Oracle__V1__Step *st, uint64_t expect, double t_wait,
                         double t_prefetch, char *err, size_t err_len) {
  uint64_t x = st->iteration;
  double ph[PH_N] = {0};
  step_counts_t c = {.lookahead = st->lookahead, .prefetch_wait = t_prefetch};
  ph[PH_WAIT] = t_wait - t_prefetch;
  ph[PH_FETCH] = t_prefetch; /* the part of the wait spent on this step's own rows */
  double t0 = now_s();
  tstep_batch_t b;
  char why[768] = "";
  int rc = step_batch(t, st, expect, &b, err, err_len);
  if (rc) return rc;
  size_t n_fetch = st->fetch_keys.len / 8, n_wb;
  size_t n_crit = st->sync_critical.len / 4, n_del = st->sync_delayed.len / 4, n_ev = st->evict_slots.len / 4;
  if ((rc = check_u32_field(t->ts, &st->slots, b.n ? b.ids_off[t->schema.n_tables] : 0, "slots", x, err, err_len)) ||
      (rc = check_keys_field(&st->write_back_keys, "write_back_keys", x, err, err_len)) ||
      (rc = check_u32_field(t->ts, &st->write_back_slots, st->write_back_keys.len / 8, "write_back_slots", x, err,
                            err_len)) ||
      (rc = check_u32_field(t->ts, &st->sync_critical, SIZE_MAX, "sync_critical", x, err, err_len)) ||
      (rc = check_u32_field(t->ts, &st->sync_delayed, SIZE_MAX, "sync_delayed", x, err, err_len)) ||
      (rc = check_u32_field(t->ts, &st->evict_slots, SIZE_MAX, "evict_slots", x, err, err_len)))
    return rc;
  n_wb = st->write_back_keys.len / 8;

  /* a. forward over the cached rows */
  if ((rc = tstep_cache_forward(t->ts, &b, st->slots.data, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": %s", x, why);
  double t1 = now_s();
  ph[PH_FWD] = t1 - t0;

  /* b. the background work of x - 1 must be over before x's dense
   * all-reduce starts (it is what tells every trainer that x - 1 is done
   * everywhere) and before x's critical rows are synchronized */
  if ((rc = wait_bg(t, &c.sync_wait, why, sizeof why)) != 0) return err_set(err, err_len, rc, "%s", why);
  for (size_t i = 0; i < n_fetch; i++) { /* x's rows are cached now: the key map learns them */
    uint64_t k;
    uint32_t sl;
    memcpy(&k, st->fetch_keys.data + 8 * i, 8);
    memcpy(&sl, st->fetch_slots.data + 4 * i, 4);
    if (kmap_set(t->kmap, sl, k) != 0) return err_set(err, err_len, -ENOMEM, "out of memory in the key map");
  }
  double t2 = now_s();

  /* c. backward, the dense all-reduce overlapped with it */
  tar_begin(t->dense_ar);
  double loss = tstep_backward(t->ts, &b, st->global_batch ? st->global_batch : 1);
  double t3 = now_s();
  ph[PH_BWD] = t3 - t2;
  if ((rc = dense_finish(t, x, &c.dense_comm, err, err_len)) != 0) return rc;
  pthread_mutex_lock(&t->pmu); /* every trainer finished x - 1: prefetches gated on it may go */
  if (x > t->known_done) t->known_done = x;
  pthread_cond_broadcast(&t->fcv);
  pthread_mutex_unlock(&t->pmu);

  /* d. critical rows: synchronized before x + 1 starts */
  uint32_t dim = tstep_dim(t->ts);
  double tc0 = now_s();
  if (n_crit) {
    if (grow_buf((void **)&t->crit_buf, &t->cap_crit, n_crit * dim, sizeof(float))) return -ENOMEM;
    tstep_cache_pack(t->ts, st->sync_critical.data, n_crit, t->crit_buf);
    if ((rc = coll_allreduce_sum_f32_ordered(t->coll, t->crit_buf, n_crit * dim)) != 0)
      return err_set(err, err_len, rc,
                     "iteration %" PRIu64 ": all-reduce of %zu shared rows' gradients among %u trainers failed: %s", x,
                     n_crit, t->trainers, err_str(rc));
    tstep_cache_unpack(t->ts, st->sync_critical.data, n_crit, t->crit_buf);
  }
  double t4 = now_s();
  ph[PH_ALLREDUCE] = t4 - t3;
  c.sync_critical = t4 - tc0;

  /* e. updates: dense, and every row with a gradient but the delayed ones
   * (their gradients are packed for the background first: x + 1's
   * backward will overwrite the step's gradients) */
  uint32_t rf = tstep_row_floats(t->ts);
  if (bg_reserve(t, n_del, n_wb, n_ev, dim, rf) != 0)
    return err_set(err, err_len, -ENOMEM, "iteration %" PRIu64 ": out of memory for the background work", x);
  if (n_del) memcpy(t->bg_del, st->sync_delayed.data, n_del * 4); /* (an empty field's data may be NULL) */
  tstep_cache_pack(t->ts, st->sync_delayed.data, n_del, t->bg_grad);
  tstep_cache_update(t->ts, st->sync_delayed.data, n_del);

  /* e2. ownership (LRPP): rows that another trainer uses next get their
   * owner's copy everywhere; rows taking an owner here go stale elsewhere
   * (part of the update phase) */
  double tr0 = now_s();
  if ((rc = ownership(t, st, x, err, err_len)) != 0) return rc;
  double t5 = now_s();
  c.replicate = t5 - tr0;
  ph[PH_UPDATE] = t5 - t4;

  /* f. hand the rest of x to the background: delayed rows, write-backs */
  if (n_wb) {
    memcpy(t->bg_wbk, st->write_back_keys.data, n_wb * 8);
    memcpy(t->bg_wbs, st->write_back_slots.data, n_wb * 4);
  }
  if (n_ev) memcpy(t->bg_evict, st->evict_slots.data, n_ev * 4);
  pthread_mutex_lock(&t->pmu);
  t->bg_x = x;
  t->bg_n_del = n_del;
  t->bg_n_wb = n_wb;
  t->bg_n_evict = n_ev;
  t->bg_evict_pending = 1;
  t->bg_busy = 1;
  pthread_cond_broadcast(&t->bcv);
  pthread_mutex_unlock(&t->pmu);
  /* the last step's write-backs are durable before its Report: the digest
   * the job computes next must see them */
  if (x + 1 == t->iterations && (rc = wait_bg(t, &c.sync_wait, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "%s", why);
  double t6 = now_s();
  ph[PH_WB] = t6 - t5;
  ph[PH_TOTAL] = t_wait + (t6 - t0);

  c.fetched = n_fetch;
  c.hits = st->cache_hits;
  c.synced = n_crit + n_del + st->replicate_slots.len / 4; /* replicated owned rows move too */
  c.synced_delayed = n_del;
  c.replicated = st->replicate_slots.len / 4;
  c.written_back = n_wb;
  return report_step(t, x, b.n, loss, ph, &c, err, err_len);
}

/* ------------------------------------------------------------------ eval */

/* The rows of an evaluation with the cache: the model as it is after the
 * iteration just trained, so this trainer's background work is waited for
 * and every trainer's (a barrier: their write-backs are then durable);
 * rows in the cache are newer than the servers' copies and are taken from
 * it (the key map), the others are fetched. */
static int eval_rows(trainer_t *t, const Chanter__Oracle__V1__Eval *ev, const void *keys, size_t n, char *err,
                     size_t err_len) {
  int rc = wait_bg(t, NULL, err, err_len);
  if (rc) return rc;
  /* rows this trainer owns are current only here: to the servers first,
   * so that the other trainers read them there */
  size_t n_own = kmap_owned(t->kmap, NULL, NULL, 0);
  if (n_own) {
    uint32_t rf = tstep_row_floats(t->ts);
    uint32_t *os = malloc(n_own * sizeof *os);
    uint64_t *ok = malloc(n_own * sizeof *ok);
    float *orow = malloc(n_own * rf * sizeof(float));
    if (!os || !ok || !orow) {
      free(os), free(ok), free(orow);
      return err_set(err, err_len, -ENOMEM, "out of memory writing back %zu owned rows", n_own);
    }
    kmap_owned(t->kmap, os, ok, n_own);
    tstep_cache_gather(t->ts, os, n_own, orow);
    char why[768] = "";
    rc = embc_write(t->embc, ok, n_own, orow, why, sizeof why); /* (any key order: embc routes each key) */
    free(os), free(ok), free(orow);
    if (rc) return err_set(err, err_len, rc, "writing back %zu owned rows before evaluating failed: %s", n_own, why);
  }
  if ((rc = coll_barrier(t->coll)) != 0)
    return err_set(err, err_len, rc, "barrier before evaluating failed among %u trainers: %s", t->trainers,
                   err_str(rc));
  pthread_mutex_lock(&t->pmu); /* the barrier also says every trainer finished the iterations so far */
  uint64_t done = atomic_load(&t->last_done);
  if (done > t->known_done) t->known_done = done;
  pthread_cond_broadcast(&t->fcv);
  pthread_mutex_unlock(&t->pmu);
  float *rows;
  if ((rc = tstep_set_slots(t->ts, keys, n, &rows, err, err_len)) != 0 || !n) return rc;
  const uint64_t *sk = tstep_slot_keys(t->ts);
  uint32_t rf = tstep_row_floats(t->ts);
  /* cached rows in one gather (one copy on a GPU), the rest from the servers */
  size_t miss = 0, hit = 0;
  uint64_t *mk = malloc(n * sizeof *mk);
  size_t *mi = malloc(n * sizeof *mi), *hi = malloc(n * sizeof *hi);
  uint32_t *hs = malloc(n * sizeof *hs);
  float *mr = malloc(n * rf * sizeof(float));
  if (!mk || !mi || !hi || !hs || !mr) {
    free(mk), free(mi), free(hi), free(hs), free(mr);
    return err_set(err, err_len, -ENOMEM, "out of memory for %zu evaluation rows", n);
  }
  for (size_t i = 0; i < n; i++) {
    int64_t sl = kmap_find(t->kmap, sk[i]);
    if (sl >= 0) {
      hs[hit] = (uint32_t)sl;
      hi[hit++] = i;
    } else {
      mk[miss] = sk[i];
      mi[miss++] = i;
    }
  }
  if (hit) {
    tstep_cache_gather(t->ts, hs, hit, mr);
    for (size_t j = 0; j < hit; j++) memcpy(rows + hi[j] * rf, mr + j * rf, rf * sizeof(float));
  }
  if (miss && (rc = embc_lookup(t->embc, mk, miss, mr, err, err_len)) == 0)
    for (size_t j = 0; j < miss; j++) memcpy(rows + mi[j] * rf, mr + j * rf, rf * sizeof(float));
  free(mk), free(mi), free(hi), free(hs), free(mr);
  log_debug("eval round=%" PRIu64 " rows=%zu from_cache=%zu fetched=%zu", ev->round, n, hit, miss);
  return rc;
}

static int do_eval(trainer_t *t, const Chanter__Oracle__V1__Eval *ev, char *err, size_t err_len) {
  tstep_batch_t b;
  char why[768] = "";
  int rc = tstep_batch_from_pb(t->ts, ev->samples, 1, &b, why, sizeof why);
  if (rc) return err_set(err, err_len, rc, "eval round %" PRIu64 ": bad samples: %s", ev->round, why);
  if ((rc = check_keys_field(&ev->fetch_keys, "fetch_keys", ev->after_iteration, err, err_len)) != 0) return rc;
  uint64_t done = atomic_load(&t->last_done);
  if (done != ev->after_iteration + 1)
    log_warn("eval round %" PRIu64 " asks for the model after iteration %" PRIu64 " but this trainer has finished %"
             PRIu64 " iterations; evaluating the current model",
             ev->round, ev->after_iteration, (uint64_t)done);
  const void *keys;
  size_t n;
  if (t->ideal) {
    const uint64_t *k;
    if ((rc = tstep_batch_keys(t->ts, &b, &k, &n)) != 0) return rc;
    keys = k;
  } else {
    keys = ev->fetch_keys.data;
    n = ev->fetch_keys.len / 8;
  }
  if (t->ideal) {
    if ((rc = fetch(t, keys, n, why, sizeof why)) != 0)
      return err_set(err, err_len, rc, "eval round %" PRIu64 ": fetch of %zu rows failed: %s", ev->round, n, why);
  } else if ((rc = eval_rows(t, ev, keys, n, why, sizeof why)) != 0) {
    return err_set(err, err_len, rc, "eval round %" PRIu64 ": %s", ev->round, why);
  }
  if (b.n + 1 > t->cap_eval) {
    float *l = realloc(t->eval_logits, (b.n + 1) * sizeof(float));
    if (!l) return -ENOMEM;
    t->eval_logits = l;
    t->cap_eval = b.n + 1;
  }
  if ((rc = tstep_eval(t->ts, &b, t->eval_logits, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "eval round %" PRIu64 ": %s", ev->round, why);
  Chanter__Oracle__V1__EvalResult r = CHANTER__ORACLE__V1__EVAL_RESULT__INIT;
  r.round = ev->round;
  r.logits.data = (uint8_t *)t->eval_logits;
  r.logits.len = (size_t)b.n * sizeof(float);
  r.labels.data = (uint8_t *)b.labels;
  r.labels.len = (size_t)b.n * sizeof(float);
  if ((rc = orc_work_eval(t->stream, &r)) != 0 && (t->write_failed = 1))
    return err_set(err, err_len, rc, "eval round %" PRIu64 ": cannot send the EvalResult to the oracle at %s: %s",
                   ev->round, orc_address(t->orc), err_str(rc));
  metrics_counter_inc(t->m_evals);
  log_debug("eval round=%" PRIu64 " samples=%u rows=%zu", ev->round, b.n, n);
  return 0;
}

/* ------------------------------------------------------------------ run */

static int join(trainer_t *t, char *err, size_t err_len) {
  Chanter__Oracle__V1__JoinRequest req = CHANTER__ORACLE__V1__JOIN_REQUEST__INIT;
  req.role = CHANTER__ORACLE__V1__ROLE__TRAINER;
  req.rank = t->rank;
  req.address = t->address;
  req.schema_hash = dpc_schema_hash(&t->schema);
  req.layout_hash = tbl_layout_hash(&t->layout);
  req.pid = (uint32_t)getpid();
  Chanter__Oracle__V1__JoinResponse *resp = NULL;
  sdn_status("joining the oracle at %s", orc_address(t->orc));
  int rc = orc_join(t->orc, &req, &resp, err, err_len);
  if (rc) return rc;
  if (resp->trainers != t->trainers) {
    rc = err_set(err, err_len, ERR_CONFIG,
                 "the oracle at %s runs a job of %u trainers but this trainer's configuration says trainers = %u "
                 "(from %s): do they read the same job file?",
                 orc_address(t->orc), resp->trainers, t->trainers, cfg_origin(t->cfg, "trainers"));
  } else if (resp->start_iteration != 0) {
    rc = err_set(err, err_len, ERR_CONFIG,
                 "the oracle asks to resume at iteration %" PRIu64 ", but this trainer starts from a fresh model "
                 "(resuming a job is not implemented yet)",
                 resp->start_iteration);
  } else {
    snprintf(t->prefix, sizeof t->prefix, "%s/%u", resp->job_id ? resp->job_id : "", resp->generation);
    log_info("joined oracle=%s job_id=%s generation=%u trainers=%u rank=%u address=%s", orc_address(t->orc),
             resp->job_id ? resp->job_id : "", resp->generation, resp->trainers, t->rank, t->address);
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

static int form_group(trainer_t *t, char *err, size_t err_len) {
  coll_store_t store = {.set = kv_set, .get = kv_get, .ud = t};
  coll_opts_t o = {.rank = (int)t->rank,
                   .size = (int)t->trainers,
                   .backend = "gloo",
                   .iface_addr = t->address,
                   .prefix = t->prefix,
                   .timeout_ms = cfg_int(t->cfg, "trainer.coll_timeout_ms")};
  sdn_status("forming the trainer group (%u trainers, gloo) through the oracle at %s", t->trainers,
             orc_address(t->orc));
  char why[512] = "";
  double t0 = now_s();
  int rc = coll_create(&o, &store, &t->coll, why, sizeof why);
  if (rc)
    return err_set(err, err_len, rc, "cannot form the group of %u trainers (rank %u, address %s, prefix %s): %s",
                   t->trainers, t->rank, t->address, t->prefix, why[0] ? why : err_str(rc));
  /* every rank initialized identically; make sure anyway */
  model_t *m = tstep_model(t->ts); /* the CPU model (its backward's grad-ready hook), or NULL on a GPU */
  if ((rc = coll_broadcast(t->coll, tstep_params(t->ts), tstep_n_params(t->ts) * sizeof(float), 0)) != 0)
    return err_set(err, err_len, rc, "broadcast of rank 0's dense parameters failed: %s", err_str(rc));
  if ((rc = tstep_params_changed(t->ts)) != 0)
    return err_set(err, err_len, rc, "copying the dense parameters to the GPU failed: %s", err_str(rc));
  /* the dense all-reduce in buckets, overlapped with the backward (one
   * trainer: nothing to reduce, no hook) */
  size_t bucket = (size_t)cfg_int(t->cfg, "trainer.bucket_kb") * 1024 / sizeof(float);
  if ((rc = tar_create(t->coll, tstep_grads(t->ts), tstep_n_params(t->ts), bucket, &t->dense_ar)) != 0)
    return err_set(err, err_len, rc, "cannot start the all-reduce thread: %s", err_str(rc));
  int overlap = t->trainers > 1 && bucket && m; /* the GPU model's gradients come back after its backward */
  if (overlap) model_set_grad_ready(m, tar_ready, t->dense_ar);
  log_info("group formed rank=%u size=%u backend=%s prefix=%s seconds=%.3f dense_floats=%zu buckets=%zu "
           "overlap=%s",
           t->rank, t->trainers, coll_backend(t->coll), t->prefix, now_s() - t0, tstep_n_params(t->ts),
           tar_buckets(t->dense_ar), overlap ? "yes" : "no");
  return 0;
}

static int open_stream(trainer_t *t, char *err, size_t err_len) {
  rpc_stream_t *s = NULL;
  int rc = orc_work_open(t->orc, t->rank, 0, &s, err, err_len);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  t->stream = s;
  if (stopping(t)) rpc_stream_cancel(s);
  pthread_mutex_unlock(&t->mu);
  return 0;
}

/* Cancels t->stream unless t->drained is set within DRAIN_MS: a guard
 * around the final drain of the Work stream, so that an oracle that never
 * ends it cannot keep the trainer from exiting. */
#define DRAIN_MS 5000
static void *drain_guard(void *arg) {
  trainer_t *t = arg;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += DRAIN_MS / 1000;
  pthread_mutex_lock(&t->mu);
  while (!t->drained) {
    if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
      log_warn("the oracle did not end the Work stream within %d ms of StopWork; cancelling it", DRAIN_MS);
      if (t->stream) rpc_stream_cancel(t->stream);
      break;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void close_stream(trainer_t *t, int clean) {
  if (!t->stream) return;
  /* a feeder waiting for a gate that will never open (the job ended) */
  pthread_mutex_lock(&t->pmu);
  t->feed_quit = 1;
  pthread_cond_broadcast(&t->fcv);
  pthread_mutex_unlock(&t->pmu);
  if (clean) {
    /* half-close, then read to the server's end of the stream (the oracle
     * finishes it after StopWork; the feeder reads it), so that it sees a
     * clean end */
    pthread_t g;
    t->drained = 0;
    int guarded = pthread_create(&g, NULL, drain_guard, t) == 0;
    rpc_stream_writes_done(t->stream);
    if (t->feeder_running) {
      join_feeder(t);
    } else {
      Chanter__Oracle__V1__WorkItem *item = NULL;
      while (orc_work_next(t->stream, &item) == 0) protobuf_c_message_free_unpacked(&item->base, NULL);
    }
    rpc_status_t st;
    rpc_stream_finish(t->stream, &st);
    pthread_mutex_lock(&t->mu);
    t->drained = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (guarded) pthread_join(g, NULL);
  } else {
    rpc_stream_cancel(t->stream);
    join_feeder(t);
  }
  pthread_mutex_lock(&t->mu);
  rpc_stream_t *s = t->stream;
  t->stream = NULL;
  pthread_mutex_unlock(&t->mu);
  rpc_stream_destroy(s);
}

/* After a failed write (the oracle ended the stream while this trainer was
 * busy): 1 if a StopWork is among the items still buffered, i.e. the
 * oracle stopped the job on purpose (its Stop RPC, SIGTERM, another
 * trainer's failure), and the trainer should stop cleanly. */
static void note_stop(trainer_t *t, const Chanter__Oracle__V1__StopWork *sw) {
  if (sw->job_state && !strcmp(sw->job_state, "failed")) {
    t->job_failed = 1;
    snprintf(t->job_msg, sizeof t->job_msg, "%s", sw->reason ? sw->reason : "");
  }
}

static int stop_pending(trainer_t *t, uint64_t done) {
  int found = 0;
  pthread_mutex_lock(&t->pmu);
  while (!found) {
    fitem_t *f = t->fq_head;
    if (!f) {
      if (t->feed_end) break;
      pthread_cond_wait(&t->fcv, &t->pmu);
      continue;
    }
    t->fq_head = f->next;
    if (!t->fq_head) t->fq_tail = NULL;
    if (f->item->kind_case == CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP) {
      found = 1;
      note_stop(t, f->item->stop);
      log_info("StopWork from the oracle while iteration %" PRIu64 " was running (its report was not delivered) "
               "rank=%u reason=\"%s\"",
               done, t->rank, f->item->stop->reason ? f->item->stop->reason : "");
    }
    free_fitem(f);
  }
  pthread_mutex_unlock(&t->pmu);
  return found;
}

static int serve(trainer_t *t, int *got_stop, char *err, size_t err_len) {
  uint64_t expect = 0;
  for (;;) {
    fitem_t *f = NULL;
    double t0 = now_s(), t_pf = 0;
    char why[1024] = "";
    int rc = next_item(t, expect, &f, &t_pf, why, sizeof why);
    double t_wait = now_s() - t0;
    if (rc == 1) {
      if (expect >= t->iterations) { /* every step done: as good as StopWork */
        *got_stop = 1;
        return 0;
      }
      return err_set(err, err_len, ERR_UNAVAILABLE,
                     "the oracle at %s ended the Work stream before iteration %" PRIu64 " without StopWork",
                     orc_address(t->orc), expect);
    }
    if (rc < 0) return err_set(err, err_len, rc, "waiting for iteration %" PRIu64 ": %s", expect, why);
    Chanter__Oracle__V1__WorkItem *item = f->item;
    if (expect == 0 && item->kind_case == CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP)
      log_info("first Step rank=%u waited_ms=%.1f (the job's start at the oracle: planning, lookahead = auto's "
               "probe, the first decisions; counted as iteration 0's wait) rows_ms=%.1f (its fetch)",
               t->rank, 1e3 * (t_wait - t_pf), 1e3 * t_pf);
    switch (item->kind_case) {
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP:
      if (t->ideal) rc = do_step_ideal(t, item->step, expect, t_wait, err, err_len);
      else rc = do_step_cache(t, item->step, expect, t_wait, t_pf, err, err_len);
      if (!rc) expect++;
      break;
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_EVAL:
      rc = do_eval(t, item->eval, err, err_len);
      break;
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP:
      log_info("StopWork from the oracle rank=%u iterations_done=%" PRIu64 " job_state=%s reason=\"%s\"", t->rank,
               expect, item->stop->job_state && *item->stop->job_state ? item->stop->job_state : "?",
               item->stop->reason ? item->stop->reason : "");
      note_stop(t, item->stop);
      *got_stop = 1;
      break;
    default:
      rc = err_set(err, err_len, ERR_BADMSG, "the oracle sent an empty or unknown work item (kind %d)",
                   (int)item->kind_case);
      break;
    }
    free_fitem(f);
    if (rc && t->write_failed && stop_pending(t, expect)) {
      *got_stop = 1;
      rc = 0;
    }
    if (rc || *got_stop) return rc;
  }
}

int trainer_run(trainer_t *t) {
  char err[2048] = "";
  int rc, got_stop = 0;
  if ((rc = join(t, err, sizeof err)) != 0) goto out;
  if (pthread_create(&t->hb, NULL, heartbeat_main, t) == 0) t->hb_running = 1;
  else log_warn("cannot start the heartbeat thread rank=%u; training without heartbeats", t->rank);
  if (stopping(t)) goto out;
  if ((rc = form_group(t, err, sizeof err)) != 0) goto out;
  if (stopping(t)) goto out;
  if ((rc = open_stream(t, err, sizeof err)) != 0) goto out;
  if ((rc = start_pipeline(t)) != 0) {
    err_set(err, sizeof err, rc, "cannot start the feeder / background threads");
    goto out;
  }
  sdn_status("training (rank %u of %u)", t->rank, t->trainers);
  rc = serve(t, &got_stop, err, sizeof err);
out:
  if (rc && stopping(t)) {
    log_info("stopped rank=%u while %s", t->rank, err[0] ? err : err_str(rc));
    rc = 0;
  } else if (rc) {
    log_error("trainer failed rank=%u: %s", t->rank, err[0] ? err : err_str(rc));
  }
  if (t->bg_running && !rc) { /* the background work of the last step (normally waited for already) */
    char why[768] = "";
    int brc = wait_bg(t, NULL, why, sizeof why);
    if (brc) log_error("trainer failed rank=%u: %s", t->rank, why);
    if (brc) rc = brc;
  }
  close_stream(t, got_stop && !rc);
  stop_bg(t);
  /* stop the heartbeat thread (trainer_stop also wakes it) */
  pthread_mutex_lock(&t->mu);
  atomic_store(&t->stop, 1);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  if (t->hb_running) pthread_join(t->hb, NULL);
  t->hb_running = 0;
  if (t->ts && tstep_model(t->ts)) model_set_grad_ready(tstep_model(t->ts), NULL, NULL);
  tar_destroy(t->dense_ar);
  t->dense_ar = NULL;
  coll_destroy(t->coll);
  t->coll = NULL;
  if (!rc && got_stop && t->job_failed) {
    log_error("the job failed elsewhere rank=%u iterations_done=%llu why=\"%s\" (this trainer is fine; see the "
              "oracle's log)",
              t->rank, (unsigned long long)atomic_load(&t->last_done), t->job_msg);
    rc = TRAINER_JOB_FAILED;
  } else if (!rc && got_stop) {
    unsigned long long done = atomic_load(&t->last_done);
    if (done == t->iterations)
      log_info("finished rank=%u iterations=%llu", t->rank, done);
    else
      log_warn("the oracle stopped the job early rank=%u iterations_done=%llu of %llu", t->rank, done,
               (unsigned long long)t->iterations);
  }
  return rc;
}
