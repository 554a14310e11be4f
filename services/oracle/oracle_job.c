/* oracle_job: see oracle_job.h. */
#include "oracle_job.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data.h"
#include "dpc.h"
#include "err.h"
#include "log.h"
#include "oracle_cache.h"
#include "oracle_eval.h"
#include "oracle_laia.h"
#include "oracle_plan.h"
#include "sdn.h"

/* Slots and keys go on the wire as the bytes of uint32_t / uint64_t arrays
 * (protobuf-c packs a bytes field by pointer, with no copy), and the
 * protocol says little-endian: like the floats of Samples, that holds only
 * on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the oracle's wire format assumes a little-endian host");

#define PLAN_PARALLEL 2   /* batches planned at once on the worker pool */
#define PLAN_AHEAD 2      /* planned batches kept beyond the dispatch window */
#define MAX_LOOKAHEAD 4096 /* largest fixed L (about 2 L plans in memory): oracle.max_lookahead's bound */
#define SEND_QUEUE_MAX 2  /* messages queued on one stream before dispatch waits for on_sent */
#define QUEUE_BYTES (256u << 20) /* budget of the batch reorder queue */
#define LOSS_RING 1024    /* recent per-iteration losses for the running train_logloss */
#define EVAL_HISTORY 100  /* evaluations kept for the summary (the last ones) */

/* Trainer time per iteration.  The last four are not phases of their own
 * but parts of others (prefetch_wait of fetch, sync_wait of the step's
 * start, sync_critical of allreduce, replicate of update): they show
 * whether the lookahead hides the traffic and what the rest costs. */
enum {
  PH_WAIT,
  PH_FETCH,
  PH_FORWARD,
  PH_BACKWARD,
  PH_ALLREDUCE,
  PH_UPDATE,
  PH_WRITE_BACK,
  PH_TOTAL,
  PH_PREFETCH_WAIT,
  PH_SYNC_WAIT,
  PH_SYNC_CRITICAL,
  PH_REPLICATE,
  N_PH
};
static const char *const phase_names[N_PH] = {"wait",   "fetch",      "forward", "backward",      "allreduce",
                                              "update", "write_back", "total",   "prefetch_wait", "sync_wait",
                                              "sync_critical", "replicate"};

typedef Chanter__Oracle__V1__Report report_t;
typedef Chanter__Oracle__V1__EvalResult eval_result_t;

typedef struct trainer_s {
  rpc_call_t *call;    /* the Work stream, NULL when none */
  uint64_t next_step;  /* next Step to send */
  uint64_t reported;   /* reports received = the next iteration expected */
  uint64_t evals_sent; /* Eval items sent */
  uint8_t sha[64];     /* dense_sha256 of the last iteration's report */
  size_t sha_len;
} trainer_t;

typedef struct agg_s { /* one iteration's reports, summed */
  uint64_t x;
  uint32_t reports;
  double loss_sum;
  uint64_t samples, rows_fetched, rows_synced, rows_synced_delayed, rows_replicated, rows_written_back, cache_hits;
  double t[N_PH];
} agg_t;

/* A batch from its planning to its last Step.  In every mode but ideal the
 * cacher reads the plan from ocache_push until ocache_decide, so a slot is
 * dispatchable once decided and is freed once decided AND sent to every
 * trainer. */
enum { SLOT_EMPTY = 0, SLOT_PLANNING, SLOT_READY };
typedef struct plan_slot_s {
  uint64_t x;
  int state;
  int decided;        /* ideal: as soon as READY; else dec holds the cacher's decisions */
  uint32_t sent;      /* trainers that got this Step */
  oracle_plan_t plan;
  ocache_dec_t dec;
  uint32_t *evict;    /* every slot freed after x: the trainers' wb_slots, concatenated in rank order */
  size_t n_evict;
} plan_slot_t;

typedef struct eval_round_s {
  struct eval_round_s *next;
  uint64_t round, after;
  uint32_t received;
  uint8_t *got;  /* P flags */
  float *logits; /* N, in the order of the eval set */
} eval_round_t;

typedef struct eval_rec_s {
  uint64_t round, after;
  double logloss, auc;
} eval_rec_t;

typedef struct fetcher_s {
  oracle_job_t *j;
  uint32_t idx;
  int eval; /* the evaluation-set fetcher */
} fetcher_t;

struct oracle_job_s {
  uv_loop_t *loop;
  const cfg_t *cfg;
  /* configuration */
  uint32_t P, B;
  uint32_t window;     /* dispatch window: max(oracle.window, L + 2), set once L is known */
  uint32_t window_cfg; /* oracle.window */
  uint64_t iterations, eval_every, eval_batches, seed, rounds_total, tail_start, log_every;
  int policy, ideal, drain_ms;
  uint32_t laia_window; /* oracle.laia_window */
  uint32_t laia_profile; /* oracle.laia_profile */
  double laia_min_share; /* oracle.laia_min_share */
  laia_t *laia;         /* allocation = laia: the rows each trainer holds (oracle_laia.h) */
  /* laia runs in the planning work, on the worker pool, one batch after the
   * other: batch x waits for laia_next == x (under laia_mu) */
  pthread_mutex_t laia_mu;
  pthread_cond_t laia_cv;
  uint64_t laia_next;
  int laia_rc;          /* a failed allocation: the batches after it fail too */
  int laia_said;        /* the end of laia's profile was logged */
  double laia_secs;     /* spent allocating */
  const char *mode, *allocation, *lookahead_cfg;
  /* the cacher (every mode but ideal) */
  int auto_l;          /* lookahead = auto: L is chosen over the first `probe` plans */
  int lrpp, delayed;
  uint32_t max_l;      /* oracle.max_lookahead */
  uint32_t L_start;    /* L given or chosen; ocache may lower it */
  uint32_t L_now;      /* L of the last decision */
  int l_known;         /* L_start is set and the cacher exists */
  uint64_t cache_rows, probe, probe_ready;
  ocache_t *cache;
  int auto_running;    /* ocache_auto reads the probe plans on the worker pool */
  int destroying;
  uint64_t push_next;  /* next batch to enter the cacher */
  uint64_t decide_next; /* next batch to decide */
  uint64_t slots_used, slots_peak;
  char job_id[96];
  /* state (loop thread) */
  int state;
  char message[1536];
  trainer_t *tr;
  uint32_t attached;
  uint64_t done;
  agg_t *agg;             /* n_agg >= window entries, by x % window */
  uint32_t n_agg;
  plan_slot_t *plans;     /* n_plans entries, by x % n_plans */
  uint32_t n_plans, plans_running;
  uint32_t plan_span;     /* batches planned ahead of the slowest trainer's next Step (<= n_plans) */
  uint64_t plan_next;
  /* the dataset as the data processors serve it: asked once (Info) when
   * training starts, before any batch is fetched */
  int info_running;
  int strict;
  uint64_t train_samples, test_samples;
  char warnings[2][ORACLE_NOTE_MAX]; /* said once at start (log, summary.json) */
  int n_warnings;
  /* evaluation */
  uint64_t eval_want;          /* test samples an evaluation scores (oracle_eval_samples) */
  uint64_t eval_fetch_batches; /* the test batches holding them, the last one cut */
  int eval_ready;
  oracle_plan_t eval_plan; /* the eval set split across trainers */
  float *eval_labels;      /* N, eval set order */
  size_t eval_n, *eval_off;
  eval_round_t *rounds;
  uint64_t evals_done;
  uint32_t evals_running;
  int labels_warned;
  eval_rec_t evals[EVAL_HISTORY]; /* the last ones, by n_evals % EVAL_HISTORY */
  uint64_t n_evals;
  double last_test_logloss, last_test_auc;
  /* statistics */
  double t_start, t_last, t_last_log, ema_dt;
  uint64_t done_at_last_log;
  double loss_last, tail_loss_sum, loss_ring[LOSS_RING];
  uint64_t tail_n;
  double sum_rows_fetched, sum_rows_synced, sum_rows_synced_delayed, sum_rows_replicated, sum_rows_written_back,
      sum_cache_hits,
      sum_t[N_PH];
  double first_t[N_PH]; /* iteration 0's phases (its wait holds the start: the probe, choosing L, the first plans) */
  double t_first_done;  /* when iteration 0 completed */
  double plan_secs_sum, sum_unique;
  uint64_t plans_done;
  char dense_hex[160];
  /* shared with the fetch threads (under mu) */
  pthread_mutex_t mu;
  pthread_cond_t cv_space;
  data_batch_t **q;
  uint32_t q_cap;
  uint64_t q_head;
  int stop;
  int fetch_rc;
  char fetch_err[1024];
  oracle_plan_t *eval_pending;
  float *eval_labels_pending;
  size_t eval_n_pending;
  /* threads */
  dpc_t *dpc;
  uint32_t n_dpc, n_train_threads, chunk;
  pthread_t *threads;
  fetcher_t *fetchers;
  uint32_t n_threads;
  int threads_started;
  uv_async_t async;
  uv_timer_t start_timer;
  int handles_open;
  /* metrics */
  metrics_gauge_t *g_iteration, *g_sps, *g_loss, *g_test_loss, *g_test_auc, *g_state, *g_lookahead, *g_slots;
  metrics_hist_t *h_phase[N_PH], *h_plan, *h_iter;
  metrics_counter_t *c_rows_replicated;
  metrics_counter_t *c_steps, *c_reports, *c_batches, *c_rows_fetched, *c_rows_synced, *c_rows_synced_delayed,
      *c_rows_wb, *c_evals;
};

static void end_job(oracle_job_t *j, int state, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void dispatch_all(oracle_job_t *j);
static void pump_plans(oracle_job_t *j);
static void run_cacher(oracle_job_t *j);
static void check_finished(oracle_job_t *j);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int is_over(const oracle_job_t *j) { return j->state >= ORACLE_DONE; }

const char *oracle_state_name(int state) {
  switch (state) {
  case ORACLE_WAITING: return "waiting";
  case ORACLE_TRAINING: return "training";
  case ORACLE_DONE: return "done";
  case ORACLE_FAILED: return "failed";
  case ORACLE_STOPPED: return "stopped";
  }
  return "unknown";
}

int oracle_job_check_cfg(const cfg_t *cfg, char *err, size_t err_len) {
  /* cfg already checked that lookahead is auto or a number >= 0 */
  const char *la = cfg_str(cfg, "lookahead");
  if (strcmp(la, "auto") != 0 && strtoull(la, NULL, 10) > MAX_LOOKAHEAD) {
    snprintf(err, err_len,
             "lookahead = %s (from %s) is above %d: the oracle keeps about 2 L planned batches in memory; set a "
             "smaller lookahead, or auto",
             la, cfg_origin(cfg, "lookahead"), MAX_LOOKAHEAD);
    return ERR_CONFIG;
  }
  /* slots travel as uint32, and a trainer's cache has at least one row */
  int64_t rows = cfg_int(cfg, "cache_rows");
  if (strcmp(cfg_str(cfg, "mode"), "ideal") != 0 && (rows < 1 || (uint64_t)rows > UINT32_MAX)) {
    snprintf(err, err_len,
             "cache_rows = %lld (from %s) is not in [1, 2^32): every mode but ideal caches embedding rows in each "
             "trainer; set cache_rows to the rows a trainer's cache may hold",
             (long long)rows, cfg_origin(cfg, "cache_rows"));
    return ERR_CONFIG;
  }
  const char *al = cfg_str(cfg, "allocation");
  if (oracle_alloc_parse(al) < 0) {
    snprintf(err, err_len, "allocation = %s (from %s) is unknown; use contiguous, random or laia", al,
             cfg_origin(cfg, "allocation"));
    return ERR_CONFIG;
  }
  return 0;
}

/* ---- evaluation schedule: rounds are due after iterations x with
 * (x + 1) % eval_every == 0, and after the last one */

static uint64_t rounds_upto(const oracle_job_t *j, uint64_t x) { /* rounds due after iterations 0..x */
  if (j->eval_batches == 0 || j->iterations == 0) return 0;
  if (x >= j->iterations - 1) return j->rounds_total;
  return j->eval_every ? (x + 1) / j->eval_every : 0;
}

static uint64_t round_after(const oracle_job_t *j, uint64_t r) {
  if (!j->eval_every) return j->iterations - 1;
  uint64_t a = (r + 1) * j->eval_every - 1;
  return a < j->iterations - 1 ? a : j->iterations - 1;
}

/* ---- the fetch threads */

static void post_error(oracle_job_t *j, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void post_error(oracle_job_t *j, int rc, const char *fmt, ...) {
  pthread_mutex_lock(&j->mu);
  if (!j->stop && !j->fetch_rc) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->fetch_err, sizeof j->fetch_err, fmt, ap);
    va_end(ap);
    j->fetch_rc = rc ? rc : ERR_RPC;
    uv_async_send(&j->async);
  }
  pthread_mutex_unlock(&j->mu);
}

static int put_batch(const data_batch_t *b, void *ud) {
  oracle_job_t *j = ((fetcher_t *)ud)->j;
  data_batch_t *c = malloc(sizeof *c);
  if (!c || oracle_batch_concat(b, 1, c) != 0) {
    free(c);
    post_error(j, -ENOMEM, "out of memory copying batch %llu", (unsigned long long)b->index);
    return 1;
  }
  metrics_counter_inc(j->c_batches);
  pthread_mutex_lock(&j->mu);
  while (!j->stop && b->index >= j->q_head + j->q_cap) pthread_cond_wait(&j->cv_space, &j->mu);
  int stop = j->stop;
  if (!stop) {
    j->q[b->index % j->q_cap] = c;
    if (b->index == j->q_head) uv_async_send(&j->async);
  }
  pthread_mutex_unlock(&j->mu);
  if (stop) {
    data_batch_free(c);
    free(c);
  }
  return stop;
}

typedef struct evalset_acc_s {
  data_batch_t *b;
  size_t n, cap;
  uint64_t samples, want; /* so far; wanted (the last batch is cut to fit: no test sample twice) */
  oracle_job_t *j;
} evalset_acc_t;

static int put_eval(const data_batch_t *b, void *ud) {
  evalset_acc_t *a = ud;
  if (a->n == a->cap) return 1;
  uint64_t left = a->want - a->samples;
  if (oracle_batch_head(b, b->n < left ? b->n : (uint32_t)left, &a->b[a->n]) != 0) return 1;
  a->samples += a->b[a->n].n;
  a->n++;
  pthread_mutex_lock(&a->j->mu);
  int stop = a->j->stop;
  pthread_mutex_unlock(&a->j->mu);
  return stop;
}

static void fetch_eval(oracle_job_t *j) {
  char err[1024] = "";
  evalset_acc_t a = {.j = j, .cap = (size_t)j->eval_fetch_batches, .want = j->eval_want};
  data_batch_t all = {0};
  oracle_plan_t *plan = calloc(1, sizeof *plan);
  float *labels = NULL;
  int rc = -ENOMEM;
  if (!plan || !(a.b = calloc(a.cap, sizeof *a.b))) goto out;
  uint32_t restarts = 0;
  rc = dpc_stream(j->dpc, DATA_TEST, 0, j->eval_fetch_batches, j->B, put_eval, &a, &restarts, err, sizeof err);
  if (rc == 0 && a.n < a.cap) {
    pthread_mutex_lock(&j->mu);
    int stop = j->stop;
    pthread_mutex_unlock(&j->mu);
    if (stop) goto out;
    rc = -ENOMEM;
    snprintf(err, sizeof err, "out of memory");
  }
  if (rc) {
    post_error(j, rc, "fetching the evaluation set (%llu test batches of %u, eval_batches = %llu): %s",
               (unsigned long long)j->eval_fetch_batches, j->B, (unsigned long long)j->eval_batches,
               err[0] ? err : err_str(rc));
    goto out;
  }
  if ((rc = oracle_batch_concat(a.b, a.n, &all)) != 0 ||
      (rc = oracle_plan_build(&all, j->P, ORACLE_ALLOC_CONTIGUOUS, 0, j->ideal ? ORACLE_PLAN_IDEAL : ORACLE_PLAN_EVAL,
                              plan)) != 0) {
    post_error(j, rc, "preparing the evaluation set: %s", err_str(rc));
    goto out;
  }
  if (!(labels = malloc((all.n ? all.n : 1) * sizeof *labels))) {
    post_error(j, -ENOMEM, "preparing the evaluation set: out of memory");
    rc = -ENOMEM;
    goto out;
  }
  memcpy(labels, all.labels, all.n * sizeof *labels);
  pthread_mutex_lock(&j->mu);
  if (!j->stop) {
    j->eval_pending = plan;
    j->eval_labels_pending = labels;
    j->eval_n_pending = all.n;
    plan = NULL;
    labels = NULL;
    uv_async_send(&j->async);
  }
  pthread_mutex_unlock(&j->mu);
out:
  for (size_t i = 0; a.b && i < a.n; i++) data_batch_free(&a.b[i]);
  free(a.b);
  data_batch_free(&all);
  if (plan) {
    oracle_plan_close(plan);
    free(plan);
  }
  free(labels);
}

static void *fetch_main(void *arg) {
  fetcher_t *f = arg;
  oracle_job_t *j = f->j;
  if (f->eval) {
    fetch_eval(j);
    return NULL;
  }
  /* chunks k = idx, idx + threads, ...: batches [k*C, k*C + C) */
  for (uint64_t k = f->idx;; k += j->n_train_threads) {
    uint64_t first = k * j->chunk;
    if (first >= j->iterations) break;
    uint64_t count = j->iterations - first < j->chunk ? j->iterations - first : j->chunk;
    pthread_mutex_lock(&j->mu);
    int stop = j->stop;
    pthread_mutex_unlock(&j->mu);
    if (stop) break;
    char err[1024] = "";
    uint32_t restarts = 0;
    int rc = dpc_stream(j->dpc, DATA_TRAIN, first, count, j->B, put_batch, f, &restarts, err, sizeof err);
    if (restarts) log_info("batch stream resumed restarts=%u first=%llu", restarts, (unsigned long long)first);
    if (rc) {
      post_error(j, rc, "fetching train batches %llu..%llu: %s", (unsigned long long)first,
                 (unsigned long long)(first + count - 1), err[0] ? err : err_str(rc));
      break;
    }
  }
  return NULL;
}

static int start_threads(oracle_job_t *j) {
  uint32_t n = j->n_train_threads + (j->eval_batches && j->iterations ? 1 : 0);
  if (j->iterations == 0) n = 0;
  j->threads = calloc(n ? n : 1, sizeof *j->threads);
  j->fetchers = calloc(n ? n : 1, sizeof *j->fetchers);
  if (!j->threads || !j->fetchers) return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    j->fetchers[i] = (fetcher_t){.j = j, .idx = i, .eval = i == j->n_train_threads};
    int rc = pthread_create(&j->threads[i], NULL, fetch_main, &j->fetchers[i]);
    if (rc) return -rc;
    j->n_threads++;
  }
  return 0;
}

/* ---- plan slots */

/* Frees a slot's plan and decisions (READY or decided slots only). */
static void slot_release(plan_slot_t *s) {
  oracle_plan_close(&s->plan);
  if (s->decided) ocache_dec_free(&s->dec);
  free(s->evict);
  s->evict = NULL;
  s->n_evict = 0;
  s->decided = 0;
  s->state = SLOT_EMPTY;
}

/* At the end of the job: every READY plan goes (PLANNING ones go when
 * their work returns).  Not while ocache_auto reads the probe plans on the
 * worker pool: auto_done calls this then. */
static void release_plans(oracle_job_t *j) {
  if (j->auto_running) return;
  for (uint32_t i = 0; j->plans && i < j->n_plans; i++)
    if (j->plans[i].state == SLOT_READY) slot_release(&j->plans[i]);
}

/* ---- planning on the worker pool */

typedef struct plan_work_s {
  uv_work_t req;
  oracle_job_t *j;
  data_batch_t *batch;
  uint32_t *owner; /* allocation = laia: decided in plan_work, in batch order; else NULL */
  plan_slot_t *slot;
  int rc;
  double secs;
} plan_work_t;

/* allocation = laia: the owners of w's batch, once the batch before has
 * its own (the works are queued in batch order, so that one runs or ran on
 * another worker). */
static int laia_in_order(oracle_job_t *j, plan_work_t *w) {
  uint64_t x = w->batch->index;
  pthread_mutex_lock(&j->laia_mu);
  while (j->laia_next != x && !j->laia_rc) pthread_cond_wait(&j->laia_cv, &j->laia_mu);
  int rc = j->laia_rc;
  if (!rc) {
    double t0 = now_s();
    rc = laia_assign(j->laia, w->batch, w->owner);
    j->laia_secs += now_s() - t0;
    if (!rc && !j->laia_said && laia_profiled(j->laia)) {
      /* which tables decide the placement from now on (log_info is thread-safe) */
      char list[1024];
      size_t o = 0;
      laia_stats_t ls;
      laia_stats(j->laia, &ls);
      for (uint32_t t = 0; t < ls.tables && o + 24 < sizeof list; t++)
        if (laia_table_scored(j->laia, t))
          o += (size_t)snprintf(list + o, sizeof list - o, "%s%u:%.3f", o ? "," : "", t, laia_table_share(j->laia, t));
      list[o] = 0;
      log_info("allocation laia: profile of %u batches done; scoring %u of %u tables (table:share of ids on a held row) "
               "%s; the others are below oracle.laia_min_share=%.3f",
               j->laia_profile, ls.tables_scored, ls.tables, list, j->laia_min_share);
      j->laia_said = 1;
    }
    if (rc) j->laia_rc = rc;
    j->laia_next = x + 1;
  }
  pthread_cond_broadcast(&j->laia_cv);
  pthread_mutex_unlock(&j->laia_mu);
  return rc;
}

static void plan_work(uv_work_t *req) {
  plan_work_t *w = req->data;
  oracle_job_t *j = w->j;
  double t0 = now_s();
  if (w->owner && (w->rc = laia_in_order(j, w)) != 0) {
    w->secs = now_s() - t0;
    return;
  }
  /* ideal: no key lists at all; else the batch's distinct keys and their users, for the cacher */
  unsigned flags = j->ideal ? ORACLE_PLAN_IDEAL : ORACLE_PLAN_KEYS;
  w->rc = w->owner ? oracle_plan_build_owned(w->batch, j->P, w->owner, flags, &w->slot->plan)
                   : oracle_plan_build(w->batch, j->P, j->policy, j->seed, flags, &w->slot->plan);
  w->secs = now_s() - t0;
}

static void plan_done(uv_work_t *req, int status) {
  plan_work_t *w = req->data;
  oracle_job_t *j = w->j;
  plan_slot_t *s = w->slot;
  j->plans_running--;
  if (status == UV_ECANCELED && !w->rc) {
    w->rc = ERR_SHUTDOWN;
    oracle_plan_close(&s->plan);
  }
  if (w->rc || is_over(j)) {
    if (!w->rc) oracle_plan_close(&s->plan);
    s->state = SLOT_EMPTY;
    if (w->rc && !is_over(j))
      end_job(j, ORACLE_FAILED, "planning batch %llu failed: %s", (unsigned long long)s->x, err_str(w->rc));
  } else {
    s->state = SLOT_READY;
    s->decided = j->ideal; /* ideal: nothing to decide */
    j->plans_done++;
    j->plan_secs_sum += w->secs;
    j->sum_unique += (double)s->plan.n_unique;
    if (s->x < j->probe) j->probe_ready++;
    metrics_hist_observe(j->h_plan, w->secs);
    run_cacher(j);
    dispatch_all(j);
  }
  data_batch_free(w->batch);
  free(w->batch);
  free(w->owner);
  free(w);
  pump_plans(j);
}

static uint64_t min_next_step(const oracle_job_t *j) {
  uint64_t m = UINT64_MAX;
  for (uint32_t p = 0; p < j->P; p++)
    if (j->tr[p].next_step < m) m = j->tr[p].next_step;
  return m;
}

static data_batch_t *pop_batch(oracle_job_t *j, uint64_t x) {
  data_batch_t *b = NULL;
  pthread_mutex_lock(&j->mu);
  if (j->q_head == x) {
    data_batch_t **slot = &j->q[x % j->q_cap];
    if (*slot && (*slot)->index == x) {
      b = *slot;
      *slot = NULL;
      j->q_head++;
      pthread_cond_broadcast(&j->cv_space);
    }
  }
  pthread_mutex_unlock(&j->mu);
  return b;
}

/* Plans batches in order while fewer than plan_span are ahead of the
 * slowest trainer.  Slot x % n_plans last held batch x - n_plans <= x -
 * plan_span, below every trainer's next Step, so it was decided, sent to
 * every trainer and freed. */
static void pump_plans(oracle_job_t *j) {
  while (j->state == ORACLE_TRAINING && j->plan_next < j->iterations && j->plans_running < PLAN_PARALLEL &&
         j->plan_next < min_next_step(j) + j->plan_span) {
    plan_slot_t *s = &j->plans[j->plan_next % j->n_plans];
    if (s->state != SLOT_EMPTY) break; /* cannot happen: see above */
    data_batch_t *b = pop_batch(j, j->plan_next);
    if (!b) break; /* the fetchers wake us */
    plan_work_t *w = calloc(1, sizeof *w);
    if (!w) {
      data_batch_free(b);
      free(b);
      end_job(j, ORACLE_FAILED, "out of memory planning batch %llu", (unsigned long long)j->plan_next);
      return;
    }
    w->req.data = w;
    w->j = j;
    w->batch = b;
    w->slot = s;
    if (j->laia && !(w->owner = malloc(((size_t)b->n + 1) * sizeof *w->owner))) {
      data_batch_free(b);
      free(b);
      free(w);
      end_job(j, ORACLE_FAILED, "out of memory allocating the samples of batch %llu (laia)",
              (unsigned long long)j->plan_next);
      return;
    }
    s->x = j->plan_next;
    s->state = SLOT_PLANNING;
    s->decided = 0;
    s->sent = 0;
    int rc = uv_queue_work(j->loop, &w->req, plan_work, plan_done);
    if (rc) {
      s->state = SLOT_EMPTY;
      data_batch_free(b);
      free(b);
      free(w->owner);
      free(w);
      end_job(j, ORACLE_FAILED, "cannot queue the planning of batch %llu: %s", (unsigned long long)j->plan_next,
              uv_strerror(rc));
      return;
    }
    j->plans_running++;
    j->plan_next++;
  }
}

/* ---- the cacher (every mode but ideal; oracle_cache.h) */

/* L is known (given, or chosen by auto): the dispatch window, the planning
 * span and the cacher follow from it.  The window is at least L + 2: a
 * trainer prefetches batch x + L while it trains x, so it must already hold
 * the Steps up to x + L, and one more lets the next arrive meanwhile.  The
 * plans span the L + 1 batches the cacher holds undecided, the window and
 * PLAN_AHEAD.  0 or -ENOMEM. */
static int set_lookahead(oracle_job_t *j, uint32_t L) {
  ocache_opts_t o = {
      .trainers = j->P, .lookahead = L, .cache_rows = j->cache_rows, .lrpp = j->lrpp, .delayed = j->delayed};
  int rc = ocache_create(&o, &j->cache);
  if (rc) return rc;
  j->L_start = j->L_now = L;
  j->window = j->window_cfg > L + 2 ? j->window_cfg : L + 2;
  j->plan_span = L + j->window + PLAN_AHEAD + 1;
  ASSERT_OP(j->window, <=, j->n_agg);
  ASSERT_OP(j->plan_span, <=, j->n_plans);
  j->l_known = 1;
  metrics_gauge_set(j->g_lookahead, L);
  log_info("lookahead L=%u cache_rows=%llu lrpp=%d delayed_sync=%d window=%u (max of oracle.window=%u and L + 2) "
           "plans_ahead=%u",
           L, (unsigned long long)j->cache_rows, j->lrpp, j->delayed, j->window, j->window_cfg, j->plan_span);
  return 0;
}

/* Decides batch decide_next into its slot, with the list of slots it
 * frees.  0, or the job has failed (cache_rows too small even at L = 0,
 * out of memory). */
static int decide_one(oracle_job_t *j) {
  uint64_t x = j->decide_next;
  plan_slot_t *s = &j->plans[x % j->n_plans];
  ASSERT(s->state == SLOT_READY && s->x == x && !s->decided);
  char err[512];
  int rc = ocache_decide(j->cache, &s->dec, err, sizeof err);
  if (rc) {
    if (rc == ERR_CONFIG) end_job(j, ORACLE_FAILED, "%s", err); /* names cache_rows, the batch and the need */
    else
      end_job(j, ORACLE_FAILED, "the cacher failed on batch %llu: %s", (unsigned long long)x,
              err[0] ? err : err_str(rc));
    return rc;
  }
  const ocache_dec_t *d = &s->dec;
  /* The evicted set is the union of the trainers' write-backs (each
   * evicted row is written back by exactly one trainer); every trainer
   * frees all of it, a private row's slot being merely unused elsewhere. */
  size_t n = 0;
  for (uint32_t p = 0; p < j->P; p++) n += d->tr[p].n_wb;
  s->evict = malloc((n ? n : 1) * sizeof *s->evict);
  if (!s->evict) {
    ocache_dec_free(&s->dec);
    end_job(j, ORACLE_FAILED, "out of memory deciding batch %llu", (unsigned long long)x);
    return -ENOMEM;
  }
  for (uint32_t p = 0; p < j->P; p++) {
    memcpy(s->evict + s->n_evict, d->tr[p].wb_slots, d->tr[p].n_wb * sizeof *s->evict);
    s->n_evict += d->tr[p].n_wb;
  }
  s->decided = 1;
  j->decide_next++;
  if (d->lookahead < j->L_now)
    log_warn("lookahead lowered from %u to %u at batch %llu: cache_rows=%llu is full", j->L_now, d->lookahead,
             (unsigned long long)x, (unsigned long long)j->cache_rows);
  j->L_now = d->lookahead;
  j->slots_used = d->slots_used;
  j->slots_peak = ocache_slots_peak(j->cache);
  metrics_gauge_set(j->g_lookahead, j->L_now);
  metrics_gauge_set(j->g_slots, (double)j->slots_used);
  return 0;
}

typedef struct auto_work_s {
  uv_work_t req;
  oracle_job_t *j;
  oracle_plan_t *plans; /* shallow copies of the probe plans, contiguous (ocache_auto only reads them) */
  size_t n;
  uint32_t L;
  uint64_t need;
  int rc;
  double secs;
} auto_work_t;

static void auto_work(uv_work_t *req) {
  auto_work_t *w = req->data;
  const oracle_job_t *j = w->j;
  double t0 = now_s();
  w->rc = ocache_auto(w->plans, w->n, j->P, j->cache_rows, j->max_l, j->lrpp, &w->L, &w->need);
  w->secs = now_s() - t0;
}

static void auto_done(uv_work_t *req, int status) {
  auto_work_t *w = req->data;
  oracle_job_t *j = w->j;
  j->auto_running = 0;
  free(w->plans);
  if (j->destroying) { /* oracle_job_destroy frees the plans */
    free(w);
    return;
  }
  if (is_over(j)) { /* end_job left the plans to us */
    release_plans(j);
    free(w);
    return;
  }
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  if (w->rc) {
    end_job(j, ORACLE_FAILED, "lookahead = auto: measuring the cache over the first %zu batches failed: %s", w->n,
            err_str(w->rc));
  } else if (w->need > j->cache_rows) {
    end_job(j, ORACLE_FAILED,
            "lookahead = %s: cache_rows = %llu (from %s) is too small: even lookahead 0 needs %llu slots over the "
            "first %zu batches (the distinct rows of a batch must fit); raise cache_rows to at least %llu",
            j->lookahead_cfg, (unsigned long long)j->cache_rows, cfg_origin(j->cfg, "cache_rows"),
            (unsigned long long)w->need, w->n,
            (unsigned long long)w->need);
  } else {
    if (strcmp(j->lookahead_cfg, "auto") == 0)
      log_info("lookahead auto: L=%u needs %llu of cache_rows=%llu slots over the first %zu batches "
               "(oracle.max_lookahead=%u, measured in %.3f s)",
               w->L, (unsigned long long)w->need, (unsigned long long)j->cache_rows, w->n, j->max_l, w->secs);
    else if (w->L < j->max_l)
      log_warn("lookahead lowered from %u to %u before training: cache_rows=%llu (from %s) holds what L=%u needs "
               "(%llu slots over the first %zu batches) but not more; raise cache_rows to keep L=%u",
               j->max_l, w->L, (unsigned long long)j->cache_rows, cfg_origin(j->cfg, "cache_rows"), w->L,
               (unsigned long long)w->need, w->n, j->max_l);
    else
      log_info("lookahead L=%u needs %llu of cache_rows=%llu slots over the first %zu batches (measured in %.3f s)",
               w->L, (unsigned long long)w->need, (unsigned long long)j->cache_rows, w->n, w->secs);
    if (set_lookahead(j, w->L) != 0) {
      end_job(j, ORACLE_FAILED, "out of memory creating the cacher");
    } else {
      run_cacher(j);
      dispatch_all(j);
    }
  }
  free(w);
}

/* lookahead = auto: once the first `probe` batches are planned, choose L
 * over them on the worker pool (ocache_auto runs the decisions about log2
 * max_lookahead times: too long for the loop).  Nothing is decided before. */
static void start_auto(oracle_job_t *j) {
  if (j->auto_running || j->probe == 0 || j->probe_ready < j->probe) return;
  auto_work_t *w = calloc(1, sizeof *w);
  if (!w || !(w->plans = malloc(j->probe * sizeof *w->plans))) {
    free(w);
    end_job(j, ORACLE_FAILED, "out of memory choosing lookahead = auto");
    return;
  }
  /* n_plans >= probe: batch x < probe sits in slot x, READY and undecided */
  for (uint64_t x = 0; x < j->probe; x++) {
    const plan_slot_t *s = &j->plans[x % j->n_plans];
    ASSERT(s->state == SLOT_READY && s->x == x);
    w->plans[x] = s->plan;
  }
  w->n = (size_t)j->probe;
  w->req.data = w;
  w->j = j;
  int rc = uv_queue_work(j->loop, &w->req, auto_work, auto_done);
  if (rc) {
    free(w->plans);
    free(w);
    end_job(j, ORACLE_FAILED, "cannot queue the choice of lookahead = auto: %s", uv_strerror(rc));
    return;
  }
  j->auto_running = 1;
  log_info("lookahead auto: measuring the cache each L <= %u needs over the first %zu batches, cache_rows=%llu",
           j->max_l, w->n, (unsigned long long)j->cache_rows);
}

static void dispatch(oracle_job_t *j, uint32_t p);

/* The cacher, on the loop thread and in batch order: every READY plan
 * enters (ocache_push; ocache_end after the last batch's), and every batch
 * that can be decided is, into its slot.  Called whenever a plan gets
 * ready (the only thing the cacher waits for).  Each decision is
 * dispatched at once: once L is known (lookahead = auto) about L + 1
 * batches are pushed and decided in one go here (about 1.5 ms each), and
 * the first Steps, which the trainers are waiting for, need only the
 * first two decisions. */
static void run_cacher(oracle_job_t *j) {
  if (j->ideal || j->state != ORACLE_TRAINING) return;
  if (!j->l_known) {
    start_auto(j);
    return;
  }
  for (;;) {
    while (ocache_ready(j->cache)) {
      if (decide_one(j) != 0) return;
      for (uint32_t p = 0; p < j->P && j->state == ORACLE_TRAINING; p++) dispatch(j, p);
    }
    if (j->push_next >= j->iterations) return;
    plan_slot_t *s = &j->plans[j->push_next % j->n_plans];
    if (s->state != SLOT_READY || s->x != j->push_next) return;
    int rc = ocache_push(j->cache, &s->plan);
    if (rc) {
      end_job(j, ORACLE_FAILED, "the cacher refused batch %llu: %s", (unsigned long long)j->push_next, err_str(rc));
      return;
    }
    if (++j->push_next == j->iterations) ocache_end(j->cache);
  }
}

/* ---- dispatch */

static void fill_samples(Chanter__Oracle__V1__Samples *s, const oracle_plan_t *p, const oracle_share_t *sh) {
  chanter__oracle__v1__samples__init(s);
  s->n = sh->n;
  s->n_dense = p->n_dense;
  s->n_tables = p->n_tables;
  s->n_hotness = p->n_tables;
  s->hotness = p->hotness;
  s->labels.data = (uint8_t *)sh->labels;
  s->labels.len = (size_t)sh->n * sizeof(float);
  s->dense.data = (uint8_t *)sh->dense;
  s->dense.len = (size_t)sh->n * p->n_dense * sizeof(float);
  s->ids.data = (uint8_t *)sh->ids;
  s->ids.len = sh->n_ids * sizeof(uint64_t);
}

/* Arrays as bytes fields, by pointer (little-endian host: see the top). */
static ProtobufCBinaryData keys_pb(const uint64_t *k, size_t n) {
  ProtobufCBinaryData d = {n * sizeof(uint64_t), (uint8_t *)k};
  return d;
}

static ProtobufCBinaryData slots_pb(const uint32_t *v, size_t n) {
  ProtobufCBinaryData d = {n * sizeof(uint32_t), (uint8_t *)v};
  return d;
}

static int send_step(oracle_job_t *j, uint32_t p, plan_slot_t *s) {
  const oracle_plan_t *pl = &s->plan;
  const oracle_share_t *sh = &pl->shares[p];
  Chanter__Oracle__V1__Samples smp;
  fill_samples(&smp, pl, sh);
  Chanter__Oracle__V1__Step st = CHANTER__ORACLE__V1__STEP__INIT;
  st.iteration = s->x;
  st.global_batch = pl->batch;
  st.samples = &smp;
  if (j->ideal) {
    /* no embedding traffic: the plan's lists are empty */
    st.fetch_keys = keys_pb(sh->fetch, sh->n_fetch);
    st.sync_keys = keys_pb(pl->sync, pl->n_sync);
    st.write_back_keys = keys_pb(sh->write_back, sh->n_write_back);
  } else {
    /* the cacher's decisions: rows by slot; sync_keys stays empty */
    const ocache_dec_t *d = &s->dec;
    const ocache_tr_t *t = &d->tr[p];
    ASSERT_OP(t->n_ids, ==, sh->n_ids);
    st.slots = slots_pb(t->slots, t->n_ids);
    st.fetch_keys = keys_pb(t->fetch_keys, t->n_fetch);
    st.fetch_slots = slots_pb(t->fetch_slots, t->n_fetch);
    st.write_back_keys = keys_pb(t->wb_keys, t->n_wb);
    st.write_back_slots = slots_pb(t->wb_slots, t->n_wb);
    st.sync_critical = slots_pb(d->critical, d->n_critical);
    st.sync_delayed = slots_pb(d->delayed, d->n_delayed);
    st.evict_slots = slots_pb(s->evict, s->n_evict);
    st.prefetch_gate = d->gate;
    st.lookahead = d->lookahead;
    st.cache_hits = t->n_hits;
    if (s->x + 1 < j->iterations) { /* after x's update: what x + 1's decision lists (dispatch waited for it) */
      const ocache_dec_t *dn = &j->plans[(s->x + 1) % j->n_plans].dec;
      st.replicate_slots = slots_pb(dn->rep_slots, dn->n_rep);
      st.replicate_owners = slots_pb(dn->rep_owners, dn->n_rep);
      st.replicate_keys = keys_pb(dn->rep_keys, dn->n_rep);
    }
    st.own_slots = slots_pb(t->own_slots, t->n_own);
    st.stale_slots = slots_pb(t->stale_slots, t->n_stale);
  }
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP;
  w.step = &st;
  return rpc_call_send(j->tr[p].call, &w.base);
}

static int send_eval(oracle_job_t *j, uint32_t p, uint64_t round) {
  const oracle_share_t *sh = &j->eval_plan.shares[p];
  Chanter__Oracle__V1__Samples smp;
  fill_samples(&smp, &j->eval_plan, sh);
  Chanter__Oracle__V1__Eval ev = CHANTER__ORACLE__V1__EVAL__INIT;
  ev.round = round;
  ev.after_iteration = round_after(j, round);
  ev.samples = &smp;
  ev.fetch_keys = keys_pb(sh->fetch, sh->n_fetch);
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_EVAL;
  w.eval = &ev;
  return rpc_call_send(j->tr[p].call, &w.base);
}

static void dispatch(oracle_job_t *j, uint32_t p) {
  trainer_t *t = &j->tr[p];
  while (j->state == ORACLE_TRAINING && t->call && rpc_call_queued(t->call) < SEND_QUEUE_MAX) {
    /* an evaluation due after the last Step sent goes first */
    if (t->next_step > 0 && t->evals_sent < rounds_upto(j, t->next_step - 1)) {
      if (!j->eval_ready) return; /* the eval set is still on its way: its arrival dispatches */
      if (send_eval(j, p, t->evals_sent) != 0) return;
      t->evals_sent++;
      continue;
    }
    uint64_t x = t->next_step;
    if (x >= j->iterations || x >= j->done + j->window) return;
    plan_slot_t *s = &j->plans[x % j->n_plans];
    if (s->state != SLOT_READY || s->x != x || !s->decided) return; /* planning or the cacher wake us */
    /* the rows x + 1 needs replicated after x are in x + 1's decision */
    if (!j->ideal && x + 1 < j->iterations) {
      const plan_slot_t *sn = &j->plans[(x + 1) % j->n_plans];
      if (sn->state != SLOT_READY || sn->x != x + 1 || !sn->decided) return;
    }
    int rc = send_step(j, p, s);
    if (rc) {
      log_warn("cannot queue a step rank=%u iteration=%llu err=\"%s\"", p, (unsigned long long)x, err_str(rc));
      return; /* the stream is ending; its cancel handler says why */
    }
    metrics_counter_inc(j->c_steps);
    t->next_step++;
    if (++s->sent == j->P) slot_release(s); /* decided and sent: the cacher no longer reads it */
  }
}

static void dispatch_all(oracle_job_t *j) {
  for (uint32_t p = 0; p < j->P && j->state == ORACLE_TRAINING; p++) dispatch(j, p);
  pump_plans(j);
}

/* ---- the end */

static void hex(const uint8_t *b, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 3 <= cap; i++) o += (size_t)snprintf(out + o, cap - o, "%02x", b[i]);
  if (cap) out[o < cap ? o : cap - 1] = 0;
}

static void end_job(oracle_job_t *j, int state, const char *fmt, ...) {
  if (is_over(j)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->message, sizeof j->message, fmt, ap);
  va_end(ap);
  j->state = state;
  metrics_gauge_set(j->g_state, state);
  pthread_mutex_lock(&j->mu);
  j->stop = 1;
  pthread_cond_broadcast(&j->cv_space);
  pthread_mutex_unlock(&j->mu);
  Chanter__Oracle__V1__StopWork sw = CHANTER__ORACLE__V1__STOP_WORK__INIT;
  sw.reason = j->message;
  sw.job_state = (char *)oracle_state_name(state);
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP;
  w.stop = &sw;
  for (uint32_t p = 0; p < j->P; p++) {
    rpc_call_t *c = j->tr[p].call;
    if (!c) continue;
    j->tr[p].call = NULL;
    j->attached--;
    rpc_call_send(c, &w.base);
    rpc_call_finish(c, 0, NULL);
  }
  release_plans(j);
  if (j->laia) {
    laia_stats_t ls;
    pthread_mutex_lock(&j->laia_mu);
    laia_stats(j->laia, &ls);
    double secs = j->laia_secs;
    pthread_mutex_unlock(&j->laia_mu);
    double ns = ls.samples ? (double)ls.samples : 1;
    log_info("allocation laia: batches=%llu samples_on_holder=%.1f%% samples_scored=%.1f%% rows_held=%zu "
             "ms_per_batch=%.2f window=%u tables_scored=%u/%u",
             (unsigned long long)ls.batches, 100.0 * (double)ls.best / ns, 100.0 * (double)ls.scored / ns,
             ls.rows_held, ls.batches ? 1e3 * secs / (double)ls.batches : 0.0, j->laia_window, ls.tables_scored,
             ls.tables);
  }
  if (state == ORACLE_FAILED) log_error("job failed job_id=%s iteration=%llu why=\"%s\"", j->job_id,
                                        (unsigned long long)j->done, j->message);
  else log_info("job %s job_id=%s iteration=%llu message=\"%s\"", oracle_state_name(state), j->job_id,
                (unsigned long long)j->done, j->message);
  sdn_status("job %s after %llu/%llu iterations: %s", oracle_state_name(state), (unsigned long long)j->done,
             (unsigned long long)j->iterations, j->message);
}

static void check_finished(oracle_job_t *j) {
  if (j->state != ORACLE_TRAINING || j->done < j->iterations || j->evals_done < j->rounds_total) return;
  /* every rank's dense parameters must agree after the last iteration */
  if (j->iterations > 0) {
    const trainer_t *r0 = &j->tr[0];
    char bad[1024] = "";
    size_t o = 0;
    for (uint32_t p = 1; p < j->P; p++) {
      const trainer_t *t = &j->tr[p];
      if (t->sha_len != r0->sha_len || memcmp(t->sha, r0->sha, t->sha_len) != 0) {
        char h[40];
        hex(t->sha, t->sha_len < 8 ? t->sha_len : 8, h, sizeof h);
        if (o < sizeof bad) o += (size_t)snprintf(bad + o, sizeof bad - o, "%srank %u (%s...)", o ? ", " : "", p, h);
      }
    }
    if (o) {
      char h0[40];
      hex(r0->sha, r0->sha_len < 8 ? r0->sha_len : 8, h0, sizeof h0);
      end_job(j, ORACLE_FAILED,
              "the trainers' dense parameters differ after the last iteration: rank 0 has SHA-256 %s..., %s; the "
              "replicas diverged (a collective or the update is not deterministic)",
              h0, bad);
      return;
    }
    hex(r0->sha, r0->sha_len, j->dense_hex, sizeof j->dense_hex);
  }
  end_job(j, ORACLE_DONE, "training finished: %llu iterations", (unsigned long long)j->iterations);
}

/* ---- reports */

static void complete_iteration(oracle_job_t *j, agg_t *a) {
  double now = now_s();
  double loss = a->loss_sum / (double)(j->B ? j->B : 1);
  double dt = now - j->t_last;
  j->t_last = now;
  j->ema_dt = j->done == 0 ? dt : 0.9 * j->ema_dt + 0.1 * dt;
  j->loss_last = loss;
  j->loss_ring[j->done % LOSS_RING] = loss;
  if (j->done >= j->tail_start) {
    j->tail_loss_sum += loss;
    j->tail_n++;
  }
  j->sum_rows_fetched += (double)a->rows_fetched;
  j->sum_rows_synced += (double)a->rows_synced;
  j->sum_rows_synced_delayed += (double)a->rows_synced_delayed;
  j->sum_rows_replicated += (double)a->rows_replicated;
  j->sum_rows_written_back += (double)a->rows_written_back;
  j->sum_cache_hits += (double)a->cache_hits;
  for (int k = 0; k < N_PH; k++) j->sum_t[k] += a->t[k] / j->P;
  if (j->done == 0) {
    for (int k = 0; k < N_PH; k++) j->first_t[k] = a->t[k] / j->P;
    j->t_first_done = now;
  }
  j->done++;
  metrics_gauge_set(j->g_iteration, (double)j->done);
  metrics_gauge_set(j->g_loss, loss);
  metrics_gauge_set(j->g_sps, j->ema_dt > 0 ? j->B / j->ema_dt : 0);
  metrics_hist_observe(j->h_iter, dt);
  if (j->done % j->log_every == 0 || j->done == j->iterations) {
    double span = now - j->t_last_log;
    double sps = span > 0 ? (double)(j->done - j->done_at_last_log) * j->B / span : 0;
    log_info("iteration=%llu/%llu samples_per_sec=%.0f loss=%.5f plan_ms=%.3f lookahead=%u slots_used=%llu",
             (unsigned long long)j->done, (unsigned long long)j->iterations, sps, loss,
             j->plans_done ? 1e3 * j->plan_secs_sum / j->plans_done : 0, j->L_now, (unsigned long long)j->slots_used);
    sdn_status("training: iteration %llu/%llu, %.0f samples/s, loss %.4f", (unsigned long long)j->done,
               (unsigned long long)j->iterations, sps, loss);
    j->t_last_log = now;
    j->done_at_last_log = j->done;
  }
  memset(a, 0, sizeof *a);
}

/* Ends rank's stream with a protocol error and fails the job. */
static void protocol_error(oracle_job_t *j, uint32_t p, rpc_call_t *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void protocol_error(oracle_job_t *j, uint32_t p, rpc_call_t *call, const char *fmt, ...) {
  char why[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (j->tr[p].call == call) {
    j->tr[p].call = NULL;
    j->attached--;
  }
  rpc_call_fail(call, -EINVAL, "%s", why);
  if (j->state == ORACLE_TRAINING) end_job(j, ORACLE_FAILED, "trainer rank %u: %s", p, why);
}

static void on_report(oracle_job_t *j, uint32_t p, rpc_call_t *call, const report_t *r) {
  trainer_t *t = &j->tr[p];
  if (r->iteration != t->reported || r->iteration >= t->next_step) {
    protocol_error(j, p, call, "Report for iteration %llu, but the next iteration due from this rank is %llu%s",
                   (unsigned long long)r->iteration, (unsigned long long)t->reported,
                   t->reported >= t->next_step ? " and it has not been sent yet" : "");
    return;
  }
  if (r->dense_sha256.len > sizeof t->sha) {
    protocol_error(j, p, call, "Report.dense_sha256 has %zu bytes; a SHA-256 has 32", r->dense_sha256.len);
    return;
  }
  agg_t *a = &j->agg[r->iteration % j->window];
  if (a->reports == 0) a->x = r->iteration;
  ASSERT(a->x == r->iteration);
  a->reports++;
  a->loss_sum += r->loss_sum;
  a->samples += r->samples;
  a->rows_fetched += r->rows_fetched;
  /* every trainer all-reduces the same shared list: rows synchronized in
   * this iteration is that list's length, not P times it */
  if (r->rows_synced > a->rows_synced) a->rows_synced = r->rows_synced;
  if (r->rows_synced_delayed > a->rows_synced_delayed) a->rows_synced_delayed = r->rows_synced_delayed;
  if (r->rows_replicated > a->rows_replicated) a->rows_replicated = r->rows_replicated;
  a->rows_written_back += r->rows_written_back;
  a->cache_hits += r->cache_hits;
  const double ts[N_PH] = {r->t_wait,   r->t_fetch,      r->t_forward, r->t_backward,     r->t_allreduce,
                           r->t_update, r->t_write_back, r->t_total,   r->t_prefetch_wait, r->t_sync_wait,
                           r->t_sync_critical, r->t_replicate};
  for (int k = 0; k < N_PH; k++) {
    a->t[k] += ts[k];
    metrics_hist_observe(j->h_phase[k], ts[k]);
  }
  metrics_counter_inc(j->c_reports);
  metrics_counter_add(j->c_rows_fetched, r->rows_fetched);
  metrics_counter_add(j->c_rows_synced, r->rows_synced);
  metrics_counter_add(j->c_rows_synced_delayed, r->rows_synced_delayed);
  metrics_counter_add(j->c_rows_replicated, r->rows_replicated);
  metrics_counter_add(j->c_rows_wb, r->rows_written_back);
  if (r->iteration + 1 == j->iterations) {
    if (r->dense_sha256.len) memcpy(t->sha, r->dense_sha256.data, r->dense_sha256.len);
    t->sha_len = r->dense_sha256.len;
  }
  t->reported++;
  while (j->done < j->iterations) {
    agg_t *c = &j->agg[j->done % j->window];
    if (c->reports < j->P || c->x != j->done) break;
    complete_iteration(j, c);
  }
  dispatch_all(j);
  check_finished(j);
}

/* ---- evaluation results */

typedef struct eval_work_s {
  uv_work_t req;
  oracle_job_t *j;
  eval_round_t *r;
  double logloss, auc;
  int rc;
} eval_work_t;

static void eval_work(uv_work_t *req) {
  eval_work_t *w = req->data;
  w->logloss = oracle_logloss(w->r->logits, w->j->eval_labels, w->j->eval_n);
  w->rc = oracle_auc(w->r->logits, w->j->eval_labels, w->j->eval_n, &w->auc);
}

static void eval_free(eval_round_t *r) {
  if (!r) return;
  free(r->got);
  free(r->logits);
  free(r);
}

static void eval_done(uv_work_t *req, int status) {
  eval_work_t *w = req->data;
  oracle_job_t *j = w->j;
  eval_round_t *r = w->r;
  j->evals_running--;
  if (status == UV_ECANCELED) w->rc = ERR_SHUTDOWN;
  if (w->rc) {
    if (!is_over(j)) end_job(j, ORACLE_FAILED, "evaluation round %llu: %s", (unsigned long long)r->round, err_str(w->rc));
  } else {
    metrics_gauge_set(j->g_test_loss, w->logloss);
    metrics_gauge_set(j->g_test_auc, w->auc);
    metrics_counter_inc(j->c_evals);
    j->evals[j->n_evals++ % EVAL_HISTORY] = (eval_rec_t){r->round, r->after, w->logloss, w->auc};
    j->last_test_logloss = w->logloss;
    j->last_test_auc = w->auc;
    log_info("evaluation round=%llu after_iteration=%llu: scored %zu test samples, test_logloss=%.5f test_auc=%.5f",
             (unsigned long long)r->round, (unsigned long long)r->after, j->eval_n, w->logloss, w->auc);
    j->evals_done++;
    check_finished(j);
  }
  eval_free(r);
  free(w);
}

static void on_eval_result(oracle_job_t *j, uint32_t p, rpc_call_t *call, const eval_result_t *e) {
  trainer_t *t = &j->tr[p];
  if (e->round >= t->evals_sent) {
    protocol_error(j, p, call, "EvalResult for round %llu, which was not sent to this rank",
                   (unsigned long long)e->round);
    return;
  }
  const oracle_share_t *sh = &j->eval_plan.shares[p];
  if (e->logits.len != (size_t)sh->n * sizeof(float) || (e->labels.len && e->labels.len != e->logits.len)) {
    protocol_error(j, p, call, "EvalResult of round %llu has %zu logit bytes and %zu label bytes; the Eval had %u samples",
                   (unsigned long long)e->round, e->logits.len, e->labels.len, sh->n);
    return;
  }
  eval_round_t *r = j->rounds, **pp = &j->rounds;
  while (r && r->round != e->round) {
    pp = &r->next;
    r = r->next;
  }
  if (!r) {
    r = calloc(1, sizeof *r);
    if (!r || !(r->got = calloc(j->P, 1)) || !(r->logits = malloc((j->eval_n ? j->eval_n : 1) * sizeof(float)))) {
      eval_free(r);
      end_job(j, ORACLE_FAILED, "out of memory collecting evaluation round %llu", (unsigned long long)e->round);
      return;
    }
    r->round = e->round;
    r->after = round_after(j, e->round);
    *pp = r;
  }
  if (r->got[p]) {
    protocol_error(j, p, call, "a second EvalResult for round %llu", (unsigned long long)e->round);
    return;
  }
  r->got[p] = 1;
  if (e->logits.len) memcpy(r->logits + j->eval_off[p], e->logits.data, e->logits.len);
  if (e->labels.len && !j->labels_warned &&
      memcmp(e->labels.data, j->eval_labels + j->eval_off[p], e->labels.len) != 0) {
    j->labels_warned = 1;
    log_warn("EvalResult labels differ from the eval set's rank=%u round=%llu (using the oracle's labels)", p,
             (unsigned long long)e->round);
  }
  if (++r->received < j->P) return;
  /* complete: unlink and compute off the loop */
  *pp = r->next;
  r->next = NULL;
  eval_work_t *w = calloc(1, sizeof *w);
  if (!w) {
    eval_free(r);
    end_job(j, ORACLE_FAILED, "out of memory computing evaluation round %llu", (unsigned long long)e->round);
    return;
  }
  w->req.data = w;
  w->j = j;
  w->r = r;
  int rc = uv_queue_work(j->loop, &w->req, eval_work, eval_done);
  if (rc) {
    eval_free(r);
    free(w);
    end_job(j, ORACLE_FAILED, "cannot queue evaluation round %llu: %s", (unsigned long long)e->round, uv_strerror(rc));
    return;
  }
  j->evals_running++;
}

/* ---- the start: what the data processors serve, then the fetch threads */

/* With the splits' sizes known: says once what a batch larger than a split
 * means (strict refuses it), sizes the evaluation set, starts fetching. */
static void start_fetch(oracle_job_t *j) {
  j->n_warnings = oracle_batch_notes(j->B, j->train_samples, j->test_samples,
                                     j->iterations ? j->eval_batches : 0, j->strict, j->warnings);
  if (j->strict && j->n_warnings) {
    end_job(j, ORACLE_FAILED, "%s%s%s", j->warnings[0], j->n_warnings > 1 ? "; " : "",
            j->n_warnings > 1 ? j->warnings[1] : "");
    j->n_warnings = 0;
    return;
  }
  for (int k = 0; k < j->n_warnings; k++) log_warn("%s", j->warnings[k]);
  if (j->eval_batches && j->iterations) {
    j->eval_want = oracle_eval_samples(j->eval_batches, j->B, j->test_samples);
    j->eval_fetch_batches = (j->eval_want + j->B - 1) / j->B;
    if (j->eval_want < j->eval_batches * j->B)
      log_info("evaluation set: eval_batches x batch_size exceeds the test split; each evaluation scores each test "
               "sample once eval_batches=%llu batch_size=%u test_samples=%llu batches=%llu (the last one cut)",
               (unsigned long long)j->eval_batches, j->B, (unsigned long long)j->test_samples,
               (unsigned long long)j->eval_fetch_batches);
  }
  int rc = start_threads(j);
  j->threads_started = 1;
  if (rc) {
    end_job(j, ORACLE_FAILED, "cannot start the batch fetch threads: %s", err_str(rc));
    return;
  }
  check_finished(j); /* iterations = 0 */
}

typedef struct info_work_s {
  uv_work_t req;
  oracle_job_t *j;
  int64_t timeout_ms;
  int rc;
  uint64_t train, test;
  char err[1024];
} info_work_t;

/* Worker pool: Info from the processors in turn until one answers;
 * those not up yet (UNAVAILABLE) are asked again, with backoff after each
 * round, until rpc.timeout_ms.  Any processor will do: they serve one
 * dataset. */
static void info_work(uv_work_t *req) {
  info_work_t *w = req->data;
  oracle_job_t *j = w->j;
  double deadline = now_s() + (double)w->timeout_ms / 1e3, backoff = 0.02;
  char last[768] = "";
  for (uint32_t attempt = 0;; attempt++) {
    Chanter__Dataproc__V1__InfoResponse *r = NULL;
    w->rc = dpc_info(j->dpc, attempt % j->n_dpc, &r, last, sizeof last);
    if (w->rc == 0) {
      w->train = r->train_samples;
      w->test = r->test_samples;
      protobuf_c_message_free_unpacked(&r->base, NULL);
      return;
    }
    pthread_mutex_lock(&j->mu);
    int stop = j->stop;
    pthread_mutex_unlock(&j->mu);
    if (stop) return;
    if (w->rc != ERR_UNAVAILABLE) {
      snprintf(w->err, sizeof w->err, "%s", last);
      return;
    }
    if (now_s() + backoff >= deadline) {
      snprintf(w->err, sizeof w->err, "no data processor answered Info within rpc.timeout_ms = %lld ms (last: %s)",
               (long long)w->timeout_ms, last);
      return;
    }
    if ((attempt + 1) % j->n_dpc == 0) {
      struct timespec ts = {(time_t)backoff, (long)((backoff - (double)(time_t)backoff) * 1e9)};
      nanosleep(&ts, NULL);
      if (backoff < 1) backoff *= 2;
    }
  }
}

static void info_done(uv_work_t *req, int status) {
  info_work_t *w = req->data;
  oracle_job_t *j = w->j;
  j->info_running = 0;
  if (!j->destroying && !is_over(j)) {
    if (status != 0 || w->rc != 0) {
      end_job(j, ORACLE_FAILED, "asking the data processors what they serve: %s",
              status != 0 ? uv_strerror(status) : w->err[0] ? w->err : err_str(w->rc));
    } else {
      j->train_samples = w->train;
      j->test_samples = w->test;
      log_info("dataset train_samples=%llu test_samples=%llu", (unsigned long long)w->train,
               (unsigned long long)w->test);
      start_fetch(j);
    }
  }
  free(w);
}

static void start_training(oracle_job_t *j) {
  j->state = ORACLE_TRAINING;
  metrics_gauge_set(j->g_state, j->state);
  j->t_start = j->t_last = j->t_last_log = now_s();
  uv_timer_stop(&j->start_timer);
  log_info("all %u trainers connected; training job_id=%s iterations=%llu batch_size=%u allocation=%s mode=%s "
           "window=%u fetch_threads=%u chunk=%u queue=%u",
           j->P, j->job_id, (unsigned long long)j->iterations, j->B, j->allocation, j->mode, j->window,
           j->n_train_threads, j->chunk, j->q_cap);
  sdn_status("training: iteration 0/%llu", (unsigned long long)j->iterations);
  if (j->iterations == 0) { /* nothing to fetch: done at once */
    start_fetch(j);
    return;
  }
  info_work_t *w = calloc(1, sizeof *w);
  int rc = -ENOMEM;
  if (w) {
    w->j = j;
    w->timeout_ms = cfg_int(j->cfg, "rpc.timeout_ms");
    w->req.data = w;
    rc = uv_queue_work(j->loop, &w->req, info_work, info_done);
  }
  if (rc) {
    free(w);
    end_job(j, ORACLE_FAILED, "cannot ask the data processors what they serve: %s",
            rc == -ENOMEM ? err_str(rc) : uv_strerror(rc));
    return;
  }
  j->info_running = 1;
}

/* ---- streams */

int oracle_job_attach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, uint64_t next_iteration, char *why,
                      size_t why_len) {
  if (rank >= j->P) {
    snprintf(why, why_len, "rank %u is outside 0..%u (trainers = %u)", rank, j->P - 1, j->P);
    return -EINVAL;
  }
  if (j->state != ORACLE_WAITING) {
    snprintf(why, why_len, "the job is %s%s%s%s", oracle_state_name(j->state), j->message[0] ? ": " : "", j->message,
             j->state == ORACLE_TRAINING ? "; replacing a trainer is not supported yet" : "");
    return ORACLE_ERR_PRECONDITION;
  }
  if (j->tr[rank].call) {
    snprintf(why, why_len, "rank %u already has a Work stream open; one trainer per rank", rank);
    return ERR_EXISTS;
  }
  if (next_iteration != 0) {
    snprintf(why, why_len,
             "Hello asks to resume at iteration %llu, but this oracle starts every job at iteration 0 (resuming "
             "is not supported yet)",
             (unsigned long long)next_iteration);
    return ORACLE_ERR_PRECONDITION;
  }
  j->tr[rank] = (trainer_t){.call = call};
  j->attached++;
  log_info("trainer connected rank=%u peer=%s connected=%u/%u", rank, rpc_call_peer(call), j->attached, j->P);
  if (j->attached == j->P) start_training(j);
  return 0;
}

void oracle_job_on_message(oracle_job_t *j, uint32_t rank, rpc_call_t *call,
                           const Chanter__Oracle__V1__TrainerMessage *m) {
  if (rank >= j->P || j->tr[rank].call != call) return;
  switch (m->kind_case) {
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_REPORT:
    if (j->state != ORACLE_TRAINING) protocol_error(j, rank, call, "Report before the job started");
    else on_report(j, rank, call, m->report);
    break;
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_EVAL:
    if (j->state != ORACLE_TRAINING) protocol_error(j, rank, call, "EvalResult before the job started");
    else on_eval_result(j, rank, call, m->eval);
    break;
  case CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_HELLO:
    protocol_error(j, rank, call, "a second Hello on one Work stream");
    break;
  default:
    protocol_error(j, rank, call, "an empty TrainerMessage (no hello, report or eval)");
    break;
  }
}

void oracle_job_detach(oracle_job_t *j, uint32_t rank, rpc_call_t *call, int cancelled) {
  if (rank >= j->P || j->tr[rank].call != call) return;
  trainer_t *t = &j->tr[rank];
  t->call = NULL;
  j->attached--;
  if (j->state == ORACLE_WAITING) {
    log_warn("trainer left before the job started rank=%u how=%s", rank, cancelled ? "cancelled" : "half-closed");
    if (!cancelled) rpc_call_finish(call, 0, NULL);
    *t = (trainer_t){0};
    return;
  }
  char why[512];
  snprintf(why, sizeof why,
           "trainer rank %u's Work stream %s at iteration %llu; the job cannot go on without it (replacing a "
           "trainer is not supported yet)",
           rank, cancelled ? "broke (the trainer exited or lost its connection)" : "was closed by the trainer",
           (unsigned long long)t->reported);
  if (!cancelled) rpc_call_finish(call, 0, NULL);
  if (j->state == ORACLE_TRAINING) end_job(j, ORACLE_FAILED, "%s", why);
}

void oracle_job_sent(oracle_job_t *j, uint32_t rank) {
  if (rank < j->P && j->tr[rank].call) dispatch(j, rank);
}

void oracle_job_stop(oracle_job_t *j, const char *reason) {
  end_job(j, ORACLE_STOPPED, "%s", reason && *reason ? reason : "stopped");
}

/* ---- the loop side of the fetch threads */

static void on_async(uv_async_t *h) {
  oracle_job_t *j = h->data;
  int rc;
  char err[1024];
  oracle_plan_t *ev;
  float *labels;
  size_t n;
  pthread_mutex_lock(&j->mu);
  rc = j->fetch_rc;
  memcpy(err, j->fetch_err, sizeof err);
  ev = j->eval_pending;
  labels = j->eval_labels_pending;
  n = j->eval_n_pending;
  j->eval_pending = NULL;
  j->eval_labels_pending = NULL;
  pthread_mutex_unlock(&j->mu);
  if (ev) {
    j->eval_plan = *ev;
    free(ev);
    j->eval_labels = labels;
    j->eval_n = n;
    j->eval_off = calloc((size_t)j->P + 1, sizeof *j->eval_off);
    if (!j->eval_off) {
      end_job(j, ORACLE_FAILED, "out of memory preparing the evaluation set");
      return;
    }
    for (uint32_t p = 0; p < j->P; p++) j->eval_off[p + 1] = j->eval_off[p] + j->eval_plan.shares[p].n;
    j->eval_ready = 1;
    log_info("evaluation set ready: each evaluation scores %zu test samples batches=%llu eval_batches=%llu "
             "test_samples=%llu unique_keys=%zu",
             n, (unsigned long long)j->eval_fetch_batches, (unsigned long long)j->eval_batches,
             (unsigned long long)j->test_samples, j->eval_plan.n_unique);
  }
  if (rc && !is_over(j)) {
    end_job(j, ORACLE_FAILED, "%s", err);
    return;
  }
  if (j->state == ORACLE_TRAINING) dispatch_all(j);
}

static void on_start_timeout(uv_timer_t *t) {
  oracle_job_t *j = t->data;
  if (j->state != ORACLE_WAITING) return;
  char missing[512] = "";
  size_t o = 0;
  for (uint32_t p = 0; p < j->P && o < sizeof missing - 16; p++)
    if (!j->tr[p].call) o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%u", o ? ", " : "", p);
  end_job(j, ORACLE_FAILED,
          "only %u of %u trainers opened their Work stream within oracle.start_timeout_ms = %lld ms (missing ranks: "
          "%s); start them, or raise oracle.start_timeout_ms",
          j->attached, j->P, (long long)cfg_int(j->cfg, "oracle.start_timeout_ms"), missing);
}

/* ---- create / destroy */

int oracle_job_create(uv_loop_t *loop, const cfg_t *cfg, metrics_registry_t *reg, oracle_job_t **out, char *err,
                      size_t err_len) {
  int rc = oracle_job_check_cfg(cfg, err, err_len);
  if (rc) return rc;
  oracle_job_t *j = calloc(1, sizeof *j);
  if (!j) return -ENOMEM;
  j->loop = loop;
  j->cfg = cfg;
  j->P = (uint32_t)cfg_int(cfg, "trainers");
  j->B = (uint32_t)cfg_int(cfg, "batch_size");
  j->window = j->window_cfg = (uint32_t)cfg_int(cfg, "oracle.window");
  j->iterations = (uint64_t)cfg_int(cfg, "iterations");
  j->eval_every = (uint64_t)cfg_int(cfg, "eval_every");
  j->eval_batches = (uint64_t)cfg_int(cfg, "eval_batches");
  j->eval_want = j->eval_batches * j->B; /* until the test split's size is known */
  j->eval_fetch_batches = j->eval_batches;
  j->strict = cfg_bool(cfg, "strict");
  j->seed = (uint64_t)cfg_int(cfg, "seed");
  j->allocation = cfg_str(cfg, "allocation");
  j->policy = oracle_alloc_parse(j->allocation);
  j->laia_window = (uint32_t)cfg_int(cfg, "oracle.laia_window");
  j->laia_profile = (uint32_t)cfg_int(cfg, "oracle.laia_profile");
  j->laia_min_share = cfg_float(cfg, "oracle.laia_min_share");
  j->mode = cfg_str(cfg, "mode");
  j->ideal = !strcmp(j->mode, "ideal");
  j->drain_ms = (int)cfg_int(cfg, "oracle.drain_ms");
  j->lookahead_cfg = cfg_str(cfg, "lookahead");
  /* every L, given or auto, is checked against cache_rows over the first
   * batches before training: a given L too large for the cache is lowered
   * then (the cacher's lowering during the run only frees slots waiting
   * out their L batches; it cannot undo rows already kept for a long
   * window) */
  j->auto_l = !j->ideal;
  int given_l = strcmp(j->lookahead_cfg, "auto") != 0; /* lookahead = N: at most N */
  j->lrpp = cfg_bool(cfg, "lrpp");
  j->delayed = cfg_bool(cfg, "delayed_sync");
  j->max_l = given_l ? (uint32_t)strtoul(j->lookahead_cfg, NULL, 10) : (uint32_t)cfg_int(cfg, "oracle.max_lookahead");
  /* lookahead = 0 (the baseline) has nothing to lower: no probe; a batch
   * too large for the cache fails the job when it is decided, naming
   * cache_rows (oracle_cache.c) */
  if (given_l && j->max_l == 0) j->auto_l = 0;
  j->cache_rows = (uint64_t)cfg_int(cfg, "cache_rows");
  j->probe = j->auto_l ? (uint64_t)cfg_int(cfg, "oracle.auto_probe") : 0;
  if (j->probe > j->iterations) j->probe = j->iterations;
  j->rounds_total = 0;
  if (j->eval_batches && j->iterations)
    j->rounds_total = j->eval_every ? j->iterations / j->eval_every + (j->iterations % j->eval_every ? 1 : 0) : 1;
  j->tail_start = j->iterations - oracle_train_tail(j->iterations); /* the train logloss's iterations */
  j->log_every = j->iterations / 10;
  if (j->log_every > 100) j->log_every = 100;
  if (j->log_every == 0) j->log_every = 1;
  {
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(j->job_id, sizeof j->job_id, "seed%llu-%s", (unsigned long long)j->seed, ts);
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv_space, NULL);
  pthread_mutex_init(&j->laia_mu, NULL);
  pthread_cond_init(&j->laia_cv, NULL);
  if ((rc = dpc_create(cfg, &j->dpc, err, err_len)) != 0) goto fail;
  j->n_dpc = dpc_servers(j->dpc);
  j->n_train_threads = 2 * j->n_dpc > 16 ? 16 : 2 * j->n_dpc;
  j->chunk = 4 * j->n_dpc + 1; /* = 1 mod n: chunk k starts on processor k mod n */
  {
    /* the reorder queue: enough for every thread's chunk, within a memory budget */
    data_schema_t sc;
    char e2[256];
    double per_sample = 4.0 + 4.0 * (double)cfg_int(cfg, "n_dense");
    if (data_schema_from_cfg(cfg, &sc, e2, sizeof e2) == 0) {
      for (uint32_t t = 0; t < sc.n_tables; t++) per_sample += 8.0 * sc.hotness[t];
      data_schema_close(&sc);
    }
    double batch_bytes = per_sample * j->B;
    uint64_t q = (uint64_t)(QUEUE_BYTES / (batch_bytes > 1 ? batch_bytes : 1));
    uint64_t want = (uint64_t)j->n_train_threads * j->chunk;
    if (q > want) q = want;
    if (q < 4) q = 4;
    j->q_cap = (uint32_t)q;
  }
  /* The rings: the reports of a dispatch window, and the plans (see
   * set_lookahead; auto sizes them for the largest L it may choose, and the
   * plans for the probe too). */
  if (j->ideal) {
    j->n_agg = j->window;
    j->n_plans = j->window + PLAN_AHEAD;
  } else {
    uint32_t l = j->max_l;
    j->n_agg = j->window_cfg > l + 2 ? j->window_cfg : l + 2;
    uint64_t n = (uint64_t)l + j->n_agg + PLAN_AHEAD + 1;
    j->n_plans = (uint32_t)(n > j->probe ? n : j->probe);
  }
  j->plan_span = j->n_plans;
  if (j->policy == ORACLE_ALLOC_LAIA) {
    laia_opts_t lo = {.trainers = j->P,
                      .window = j->laia_window,
                      .seed = j->seed,
                      .profile = j->laia_profile,
                      .min_share = j->laia_min_share};
    if ((rc = laia_create(&lo, &j->laia)) != 0) {
      snprintf(err, err_len, "allocation = laia: %s", err_str(rc));
      goto fail;
    }
  }
  j->tr = calloc(j->P, sizeof *j->tr);
  j->agg = calloc(j->n_agg, sizeof *j->agg);
  j->plans = calloc(j->n_plans, sizeof *j->plans);
  j->q = calloc(j->q_cap, sizeof *j->q);
  if (!j->tr || !j->agg || !j->plans || !j->q) {
    rc = -ENOMEM;
    goto fail;
  }
  /* metrics */
  j->g_iteration = metrics_gauge(reg, "iteration", NULL, "iterations every trainer has finished");
  j->g_sps = metrics_gauge(reg, "samples_per_second", NULL, "training throughput (moving average)");
  j->g_loss = metrics_gauge(reg, "train_loss", NULL, "mean training loss of the last iteration");
  j->g_test_loss = metrics_gauge(reg, "test_logloss", NULL, "logloss of the last evaluation");
  j->g_test_auc = metrics_gauge(reg, "test_auc", NULL, "ROC AUC of the last evaluation");
  j->g_state = metrics_gauge(reg, "job_state", NULL, "0 waiting, 1 training, 2 done, 3 failed, 4 stopped");
  j->g_lookahead = metrics_gauge(reg, "lookahead", NULL, "lookahead L in force (the cacher may lower it)");
  j->g_slots = metrics_gauge(reg, "cache_slots_used", NULL,
                             "trainer cache slots holding a row or waiting out L batches before reuse");
  for (int k = 0; k < N_PH; k++) {
    char lab[64];
    snprintf(lab, sizeof lab, "phase=\"%s\"", phase_names[k]);
    j->h_phase[k] = metrics_histogram(reg, "phase_seconds", lab, "trainer time per iteration and phase",
                                      metrics_latency_bounds, metrics_latency_n);
  }
  j->h_plan = metrics_histogram(reg, "plan_seconds", NULL, "time to plan one global batch", metrics_latency_bounds,
                                metrics_latency_n);
  j->h_iter = metrics_histogram(reg, "iteration_seconds", NULL, "time between consecutive finished iterations",
                                metrics_latency_bounds, metrics_latency_n);
  j->c_steps = metrics_counter(reg, "steps_sent_total", NULL, "Step items sent to trainers");
  j->c_reports = metrics_counter(reg, "reports_total", NULL, "Reports received from trainers");
  j->c_batches = metrics_counter(reg, "batches_fetched_total", NULL, "train batches received from data processors");
  j->c_rows_fetched = metrics_counter(reg, "rows_fetched_total", NULL, "embedding rows the trainers fetched");
  j->c_rows_synced = metrics_counter(reg, "rows_synced_total", NULL, "embedding rows the trainers synchronized");
  j->c_rows_replicated = metrics_counter(reg, "rows_replicated_total", NULL,
                                         "of the rows synchronized, owned rows handed to every trainer");
  j->c_rows_synced_delayed = metrics_counter(reg, "rows_synced_delayed_total", NULL,
                                             "of the rows synchronized, those synchronized in the background");
  j->c_rows_wb = metrics_counter(reg, "rows_written_back_total", NULL, "embedding rows the trainers wrote back");
  j->c_evals = metrics_counter(reg, "evaluations_total", NULL, "evaluations completed");
  /* handles: unref'd, so that they never keep a draining daemon's loop alive */
  uv_async_init(loop, &j->async, on_async);
  j->async.data = j;
  uv_unref((uv_handle_t *)&j->async);
  uv_timer_init(loop, &j->start_timer);
  j->start_timer.data = j;
  uv_timer_start(&j->start_timer, on_start_timeout, (uint64_t)cfg_int(cfg, "oracle.start_timeout_ms"), 0);
  uv_unref((uv_handle_t *)&j->start_timer);
  j->handles_open = 2;
  log_info("job created job_id=%s trainers=%u batch_size=%u iterations=%llu allocation=%s mode=%s lookahead=%s "
           "eval_every=%llu eval_batches=%llu dataprocs=%u",
           j->job_id, j->P, j->B, (unsigned long long)j->iterations, j->allocation, j->mode,
           j->ideal ? "0 (ideal)" : j->lookahead_cfg, (unsigned long long)j->eval_every,
           (unsigned long long)j->eval_batches, j->n_dpc);
  /* the cacher: now for lookahead = 0, else once the probe batches are planned (start_auto) */
  if (!j->ideal && !j->auto_l && (rc = set_lookahead(j, 0)) != 0) {
    snprintf(err, err_len, "out of memory creating the cacher");
    goto fail;
  }
  *out = j;
  return 0;
fail:
  oracle_job_destroy(j);
  return rc;
}

static void on_closed(uv_handle_t *h) {
  oracle_job_t *j = h->data;
  j->handles_open--;
}

void oracle_job_destroy(oracle_job_t *j) {
  if (!j) return;
  /* ocache_auto may still read the probe plans on the worker pool, and
   * Info still be asked there (stop ends its retries) */
  j->destroying = 1;
  pthread_mutex_lock(&j->mu);
  j->stop = 1;
  pthread_cond_broadcast(&j->cv_space);
  pthread_mutex_unlock(&j->mu);
  while (j->auto_running || j->info_running) uv_run(j->loop, UV_RUN_ONCE);
  int stuck = 0;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += j->drain_ms / 1000 + 1;
  for (uint32_t i = 0; i < j->n_threads; i++)
    if (pthread_timedjoin_np(j->threads[i], NULL, &dl) != 0) stuck++;
  if (j->handles_open) {
    uv_close((uv_handle_t *)&j->async, on_closed);
    uv_close((uv_handle_t *)&j->start_timer, on_closed);
    while (j->handles_open) uv_run(j->loop, UV_RUN_NOWAIT);
  }
  if (stuck) {
    /* they still use the dpc and the queue: leave those to the process exit */
    log_warn("batch fetch threads still retrying a data processor at exit threads=%d; leaving them", stuck);
    return;
  }
  dpc_destroy(j->dpc);
  for (uint32_t i = 0; j->q && i < j->q_cap; i++)
    if (j->q[i]) {
      data_batch_free(j->q[i]);
      free(j->q[i]);
    }
  free(j->q);
  release_plans(j);
  free(j->plans);
  ocache_destroy(j->cache);
  laia_destroy(j->laia);
  if (j->eval_pending) {
    oracle_plan_close(j->eval_pending);
    free(j->eval_pending);
  }
  free(j->eval_labels_pending);
  oracle_plan_close(&j->eval_plan);
  free(j->eval_labels);
  free(j->eval_off);
  while (j->rounds) {
    eval_round_t *r = j->rounds;
    j->rounds = r->next;
    eval_free(r);
  }
  free(j->agg);
  free(j->tr);
  free(j->threads);
  free(j->fetchers);
  pthread_cond_destroy(&j->cv_space);
  pthread_mutex_destroy(&j->mu);
  pthread_mutex_destroy(&j->laia_mu);
  pthread_cond_destroy(&j->laia_cv);
  free(j);
}

/* ---- accessors and the summary */

const char *oracle_job_id(const oracle_job_t *j) { return j->job_id; }
int oracle_job_state(const oracle_job_t *j) { return j->state; }
const char *oracle_job_message(const oracle_job_t *j) { return j->message; }
uint64_t oracle_job_done(const oracle_job_t *j) { return j->done; }
uint64_t oracle_job_iterations(const oracle_job_t *j) { return j->iterations; }
uint64_t oracle_job_rank_reported(const oracle_job_t *j, uint32_t rank) {
  return rank < j->P ? j->tr[rank].reported : 0;
}
int oracle_job_rank_attached(const oracle_job_t *j, uint32_t rank) { return rank < j->P && j->tr[rank].call; }

typedef struct sbuf_s {
  char *s;
  size_t n, cap;
  int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

/* A JSON number, or null when not finite. */
static void sb_num(sbuf_t *b, const char *key, double v) {
  if (isfinite(v)) sb_printf(b, "\"%s\": %.10g", key, v);
  else sb_printf(b, "\"%s\": null", key);
}

/* A JSON string. */
static void sb_str_value(sbuf_t *b, const char *v) {
  sb_printf(b, "\"");
  for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
    if (*p == '"' || *p == '\\') sb_printf(b, "\\%c", *p);
    else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
    else sb_printf(b, "%c", *p);
  }
  sb_printf(b, "\"");
}

static void sb_str(sbuf_t *b, const char *key, const char *v) {
  sb_printf(b, "\"%s\": ", key);
  sb_str_value(b, v);
}

char *oracle_job_summary(const oracle_job_t *j) {
  sbuf_t b = {0};
  double n = (double)j->done;
  double end = is_over(j) ? j->t_last : now_s();
  if (j->state == ORACLE_TRAINING && j->done == 0) end = now_s();
  double span = j->t_start > 0 ? end - j->t_start : 0;
  double sps = span > 0 && j->done ? n * j->B / span : 0;
  double train_loss = NAN;
  if (j->done > 0) {
    if (j->tail_n && j->done == j->iterations) {
      train_loss = j->tail_loss_sum / (double)j->tail_n;
    } else {
      uint64_t k = j->done / 10;
      if (k == 0) k = 1;
      if (k > LOSS_RING) k = LOSS_RING;
      double s = 0;
      for (uint64_t i = j->done - k; i < j->done; i++) s += j->loss_ring[i % LOSS_RING];
      train_loss = s / (double)k;
    }
  }
  sb_printf(&b, "{");
  sb_printf(&b, "\"iterations\": %llu, ", (unsigned long long)j->done);
  sb_num(&b, "samples_per_sec", sps);
  sb_printf(&b, ", ");
  sb_num(&b, "train_logloss", train_loss);
  {
    /* what train_logloss is once the job is done (before: the same over the iterations done so far) */
    char def[256];
    oracle_train_logloss_definition(j->iterations, def, sizeof def);
    sb_printf(&b, ", \"train_logloss_iterations\": %llu, ", (unsigned long long)oracle_train_tail(j->iterations));
    sb_str(&b, "train_logloss_definition", def);
  }
  sb_printf(&b, ", ");
  sb_num(&b, "test_logloss", j->n_evals ? j->last_test_logloss : NAN);
  sb_printf(&b, ", ");
  sb_num(&b, "test_auc", j->n_evals ? j->last_test_auc : NAN);
  sb_printf(&b, ", ");
  /* each evaluation scores these, each test sample at most once */
  sb_num(&b, "test_samples_scored", j->eval_ready ? (double)j->eval_n : NAN);
  sb_printf(&b, ", ");
  sb_str(&b, "dense_sha256", j->dense_hex);
  sb_printf(&b, ", ");
  sb_num(&b, "rows_fetched", n > 0 ? j->sum_rows_fetched / n : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "rows_synced", n > 0 ? j->sum_rows_synced / n : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "rows_synced_delayed", n > 0 ? j->sum_rows_synced_delayed / n : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "rows_replicated", n > 0 ? j->sum_rows_replicated / n : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "rows_written_back", n > 0 ? j->sum_rows_written_back / n : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "cache_hits", n > 0 ? j->sum_cache_hits / n : 0);
  sb_printf(&b, ", \"phase_seconds\": {");
  for (int k = 0; k < N_PH; k++) {
    if (k) sb_printf(&b, ", ");
    sb_num(&b, phase_names[k], n > 0 ? j->sum_t[k] / n : 0);
  }
  sb_printf(&b, "}, ");
  /* the start-up (iteration 0: planning the probe, choosing L, the first decisions and fetches) and the rest */
  {
    double first = j->done && j->t_start > 0 ? j->t_first_done - j->t_start : NAN;
    double rest = j->done > 1 ? end - j->t_first_done : 0;
    sb_num(&b, "first_iteration_seconds", first);
    sb_printf(&b, ", ");
    sb_num(&b, "steady_samples_per_sec", rest > 0 ? (n - 1) * j->B / rest : NAN);
    sb_printf(&b, ", ");
    sb_num(&b, "steady_iteration_seconds", n > 1 ? (j->sum_t[PH_TOTAL] - j->first_t[PH_TOTAL]) / (n - 1) : NAN);
    sb_printf(&b, ", ");
  }
  sb_num(&b, "unique_keys", j->plans_done ? j->sum_unique / (double)j->plans_done : 0);
  sb_printf(&b, ", ");
  sb_num(&b, "plan_seconds", j->plans_done ? j->plan_secs_sum / (double)j->plans_done : 0);
  /* lookahead: in force at the end (or now); lookahead_start: given, or chosen by auto (0 until then) */
  sb_printf(&b,
            ", \"trainers\": %u, \"batch_size\": %u, \"lookahead\": %u, \"lookahead_start\": %u, \"cache_rows\": %llu, "
            "\"slots_peak\": %llu, ",
            j->P, j->B, j->L_now, j->L_start, (unsigned long long)j->cache_rows, (unsigned long long)j->slots_peak);
  sb_str(&b, "lookahead_config", j->ideal ? "0" : j->lookahead_cfg);
  sb_printf(&b, ", ");
  sb_str(&b, "mode", j->mode);
  sb_printf(&b, ", ");
  sb_str(&b, "allocation", j->allocation);
  if (j->laia) {
    /* of the samples allocated: those some trainer held a row of, those placed on a trainer holding most of them */
    laia_stats_t ls;
    pthread_mutex_lock((pthread_mutex_t *)&j->laia_mu);
    laia_stats(j->laia, &ls);
    double laia_secs = j->laia_secs;
    pthread_mutex_unlock((pthread_mutex_t *)&j->laia_mu);
    double ns = ls.samples ? (double)ls.samples : 1;
    sb_printf(&b, ", \"laia\": {");
    sb_num(&b, "samples_scored", (double)ls.scored / ns);
    sb_printf(&b, ", ");
    sb_num(&b, "samples_on_holder", (double)ls.best / ns);
    sb_printf(&b, ", ");
    sb_num(&b, "seconds_per_batch", ls.batches ? laia_secs / (double)ls.batches : 0);
    sb_printf(&b, ", \"rows_held\": %zu, \"tables_scored\": %u, \"tables\": %u}", ls.rows_held, ls.tables_scored,
              ls.tables);
  }
  sb_printf(&b, ", \"target_iterations\": %llu, ", (unsigned long long)j->iterations);
  sb_str(&b, "state", oracle_state_name(j->state));
  sb_printf(&b, ", ");
  sb_str(&b, "job_id", j->job_id);
  sb_printf(&b, ", ");
  sb_num(&b, "train_seconds", span);
  /* said once at start: a batch larger than a split */
  sb_printf(&b, ", \"warnings\": [");
  for (int k = 0; k < j->n_warnings; k++) {
    if (k) sb_printf(&b, ", ");
    sb_str_value(&b, j->warnings[k]);
  }
  sb_printf(&b, "], \"evals\": [");
  uint64_t first = j->n_evals > EVAL_HISTORY ? j->n_evals - EVAL_HISTORY : 0;
  for (uint64_t i = first; i < j->n_evals; i++) {
    const eval_rec_t *e = &j->evals[i % EVAL_HISTORY];
    sb_printf(&b, "%s{\"round\": %llu, \"after_iteration\": %llu, ", i > first ? ", " : "",
              (unsigned long long)e->round, (unsigned long long)e->after);
    sb_num(&b, "logloss", e->logloss);
    sb_printf(&b, ", ");
    sb_num(&b, "auc", e->auc);
    sb_printf(&b, "}");
  }
  sb_printf(&b, "]}");
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}
