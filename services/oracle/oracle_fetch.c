/*
 * oracle_fetch: the first stage of a job (oracle_job_internal.h): pulling
 * batches from the data processors.
 *
 * When training starts, one Info call (worker pool; the processors in
 * turn, retried until rpc.timeout_ms) gives the sizes of the train and
 * test splits: a batch larger than a split is said once
 * (jobrule_batch_notes; strict = true fails the job with it), and the
 * evaluation set is cut to the test split.  Then the fetch threads (2 per
 * data processor, at most 16) pull train batches 0..iterations-1 with
 * dpc_stream in chunks of C batches, C = 1 mod the number of processors,
 * so that chunk k starts on processor k mod n and every processor serves
 * two streams at once.  They put batches into a bounded reorder queue
 * (batch x in entry x mod Q; a thread waits while x >= head + Q) and wake
 * the loop (j->wake: the conductor runs).  One more thread fetches the
 * evaluation set, concatenates it and splits it across trainers.  The
 * loop takes batches in order with oracle_fetch__take (the pipeline does)
 * and the evaluation set and any thread's failure with
 * oracle_fetch__collect.  j->fetch is this file's; the fetch threads touch
 * only the part under j->fetch.mu, the dpc and the job's shape.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "proc.h"

#define QUEUE_BYTES (256u << 20) /* budget of the batch reorder queue */

/* ---- the fetch threads */

static void post_error(oracle_job_t *j, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void post_error(oracle_job_t *j, int rc, const char *fmt, ...) {
  oracle_fetch_t *f = &j->fetch;
  pthread_mutex_lock(&f->mu);
  if (!f->stop && !f->rc) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, sizeof f->err, fmt, ap);
    va_end(ap);
    f->rc = rc ? rc : ERR_RPC;
    uv_async_send(&j->wake);
  }
  pthread_mutex_unlock(&f->mu);
}

static int stopping(oracle_fetch_t *f) {
  pthread_mutex_lock(&f->mu);
  int stop = f->stop;
  pthread_mutex_unlock(&f->mu);
  return stop;
}

static int put_batch(const data_batch_t *b, void *ud) {
  oracle_job_t *j = ((oracle_fetcher_t *)ud)->j;
  oracle_fetch_t *f = &j->fetch;
  data_batch_t *c = malloc(sizeof *c);
  if (!c || plan_batch_concat(b, 1, c) != 0) {
    free(c);
    post_error(j, -ENOMEM, "out of memory copying batch %llu", (unsigned long long)b->iteration);
    return 1;
  }
  metrics_counter_inc(j->m.batches);
  pthread_mutex_lock(&f->mu);
  while (!f->stop && b->iteration >= f->q_head + f->q_cap) pthread_cond_wait(&f->cv_space, &f->mu);
  int stop = f->stop;
  if (!stop) {
    f->q[b->iteration % f->q_cap] = c;
    if (b->iteration == f->q_head) uv_async_send(&j->wake);
  }
  pthread_mutex_unlock(&f->mu);
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
  if (plan_batch_head(b, b->n < left ? b->n : (uint32_t)left, &a->b[a->n]) != 0) return 1;
  a->samples += a->b[a->n].n;
  a->n++;
  return stopping(&a->j->fetch);
}

static void fetch_eval(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  char err[1024] = "";
  evalset_acc_t a = {.j = j, .cap = (size_t)f->eval.batches, .want = f->eval.want};
  data_batch_t all = {0};
  plan_t *plan = calloc(1, sizeof *plan);
  float *labels = NULL;
  int rc = -ENOMEM;
  if (!plan || !(a.b = calloc(a.cap, sizeof *a.b))) goto out;
  uint32_t restarts = 0;
  rc = dpc_stream(f->dpc, DATA_TEST, 0, f->eval.batches, j->B, put_eval, &a, &restarts, err, sizeof err);
  if (rc == 0 && a.n < a.cap) {
    if (stopping(f)) goto out;
    rc = -ENOMEM;
    snprintf(err, sizeof err, "out of memory");
  }
  if (rc) {
    post_error(j, rc, "fetching the evaluation set (%llu test batches of %u, eval_batches = %llu): %s",
               (unsigned long long)f->eval.batches, j->B, (unsigned long long)j->eval_batches,
               err[0] ? err : err_str(rc));
    goto out;
  }
  if ((rc = plan_batch_concat(a.b, a.n, &all)) != 0 ||
      (rc = plan_build(&all, j->P, PLAN_ALLOC_CONTIGUOUS, 0, j->ideal ? PLAN_IDEAL : PLAN_EVAL,
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
  pthread_mutex_lock(&f->mu);
  if (!f->stop) {
    f->eval_pending = plan;
    f->eval_labels_pending = labels;
    f->eval_n_pending = all.n;
    plan = NULL;
    labels = NULL;
    uv_async_send(&j->wake);
  }
  pthread_mutex_unlock(&f->mu);
out:
  for (size_t i = 0; a.b && i < a.n; i++) data_batch_free(&a.b[i]);
  free(a.b);
  data_batch_free(&all);
  if (plan) {
    plan_close(plan);
    free(plan);
  }
  free(labels);
}

static void *fetch_main(void *arg) {
  proc_name_thread("oracle-fetch");
  oracle_fetcher_t *fr = arg;
  oracle_job_t *j = fr->j;
  oracle_fetch_t *f = &j->fetch;
  if (fr->eval) {
    fetch_eval(j);
    return NULL;
  }
  /* chunks k = idx, idx + threads, ...: batches [start + k*C, start + k*C + C) */
  for (uint64_t k = fr->idx;; k += f->n_train_threads) {
    uint64_t first = f->start + k * f->chunk;
    if (first >= j->iterations) break;
    uint64_t count = j->iterations - first < f->chunk ? j->iterations - first : f->chunk;
    if (stopping(f)) break;
    char err[1024] = "";
    uint32_t restarts = 0;
    int rc = dpc_stream(f->dpc, DATA_TRAIN, first, count, j->B, put_batch, fr, &restarts, err, sizeof err);
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
  oracle_fetch_t *f = &j->fetch;
  uint32_t n = f->n_train_threads + (j->eval_batches && j->iterations ? 1 : 0);
  if (j->iterations == 0) n = 0;
  f->threads = calloc(n ? n : 1, sizeof *f->threads);
  f->fetchers = calloc(n ? n : 1, sizeof *f->fetchers);
  if (!f->threads || !f->fetchers) return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    f->fetchers[i] = (oracle_fetcher_t){.j = j, .idx = i, .eval = i == f->n_train_threads};
    int rc = pthread_create(&f->threads[i], NULL, fetch_main, &f->fetchers[i]);
    if (rc) return -rc;
    f->n_threads++;
  }
  return 0;
}

void oracle_fetch__restore(oracle_job_t *j, const oracle_ostate_t *o) {
  j->fetch.q_head = j->fetch.start = o->iteration + 1;
}

void oracle_fetch__warn(oracle_job_t *j, const char *msg) {
  snprintf(j->fetch.warning_resume, sizeof j->fetch.warning_resume, "%s", msg);
}

/* ---- the start: what the data processors serve, then the fetch threads */

/* With the splits' sizes known: says once what a batch larger than a split
 * means (strict refuses it), sizes the evaluation set, starts fetching.
 * 0 or an error (said). */
static int start(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  f->n_warnings = jobrule_batch_notes(j->B, f->train_samples, f->test_samples, j->iterations ? j->eval_batches : 0,
                                      f->strict, f->warnings);
  if (f->strict && f->n_warnings) {
    int rc = oracle_job__error(j, ERR_CONFIG, "%s%s%s", f->warnings[0], f->n_warnings > 1 ? "; " : "",
                               f->n_warnings > 1 ? f->warnings[1] : "");
    f->n_warnings = 0;
    return rc;
  }
  for (int k = 0; k < f->n_warnings; k++) log_warn("%s", f->warnings[k]);
  if (f->warning_resume[0]) memcpy(f->warnings[f->n_warnings++], f->warning_resume, sizeof f->warning_resume);
  if (j->eval_batches && j->iterations) {
    f->eval.want = jobrule_eval_samples(j->eval_batches, j->B, f->test_samples);
    f->eval.batches = (f->eval.want + j->B - 1) / j->B;
    if (f->eval.want < j->eval_batches * j->B)
      log_info("evaluation set: eval_batches x batch_size exceeds the test split; each evaluation scores each test "
               "sample once eval_batches=%llu batch_size=%u test_samples=%llu batches=%llu (the last one cut)",
               (unsigned long long)j->eval_batches, j->B, (unsigned long long)f->test_samples,
               (unsigned long long)f->eval.batches);
  }
  int rc = start_threads(j);
  if (rc) return oracle_job__error(j, rc, "cannot start the batch fetch threads: %s", err_str(rc));
  return 0;
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
  oracle_fetch_t *f = &w->j->fetch;
  double deadline = oracle_job__now() + (double)w->timeout_ms / 1e3, backoff = 0.02;
  char last[768] = "";
  for (uint32_t attempt = 0;; attempt++) {
    Chanter__Dataproc__V1__InfoResponse *r = NULL;
    w->rc = dpc_info(f->dpc, attempt % f->n_dpc, &r, last, sizeof last);
    if (w->rc == 0) {
      w->train = r->train_samples;
      w->test = r->test_samples;
      protobuf_c_message_free_unpacked(&r->base, NULL);
      return;
    }
    if (stopping(f)) return;
    if (w->rc != ERR_UNAVAILABLE) {
      snprintf(w->err, sizeof w->err, "%s", last);
      return;
    }
    if (oracle_job__now() + backoff >= deadline) {
      snprintf(w->err, sizeof w->err, "no data processor answered Info within rpc.timeout_ms = %lld ms (last: %s)",
               (long long)w->timeout_ms, last);
      return;
    }
    if ((attempt + 1) % f->n_dpc == 0) {
      struct timespec ts = {(time_t)backoff, (long)((backoff - (double)(time_t)backoff) * 1e9)};
      nanosleep(&ts, NULL);
      if (backoff < 1) backoff *= 2;
    }
  }
}

static void info_done(uv_work_t *req, int status) {
  info_work_t *w = req->data;
  oracle_job_t *j = w->j;
  oracle_fetch_t *f = &j->fetch;
  f->info_running = 0;
  if (!j->destroying && !oracle_job__over(j)) {
    if (status != 0 || w->rc != 0) {
      oracle_job__error(j, status ? status : w->rc, "asking the data processors what they serve: %s",
                        status != 0 ? uv_strerror(status) : w->err[0] ? w->err : err_str(w->rc));
    } else {
      f->train_samples = w->train;
      f->test_samples = w->test;
      log_info("dataset train_samples=%llu test_samples=%llu", (unsigned long long)w->train,
               (unsigned long long)w->test);
      start(j);
    }
    oracle_job__advance(j);
  }
  free(w);
}

int oracle_fetch__begin(oracle_job_t *j) {
  if (j->iterations == 0) return start(j); /* nothing to fetch: done at once */
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
    return oracle_job__error(j, rc, "cannot ask the data processors what they serve: %s",
                             rc == -ENOMEM ? err_str(rc) : uv_strerror(rc));
  }
  j->fetch.info_running = 1;
  return 0;
}

/* ---- the loop side */

int oracle_fetch__collect(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  char err[sizeof f->err];
  pthread_mutex_lock(&f->mu);
  int rc = f->rc;
  if (rc) memcpy(err, f->err, sizeof err);
  plan_t *ev = f->eval_pending;
  float *labels = f->eval_labels_pending;
  size_t n = f->eval_n_pending;
  f->eval_pending = NULL;
  f->eval_labels_pending = NULL;
  pthread_mutex_unlock(&f->mu);
  int changed = 0;
  if (ev) {
    oracle_eval_set_t *e = &f->eval;
    e->plan = *ev;
    free(ev);
    e->labels = labels;
    e->n = n;
    e->off = calloc((size_t)j->P + 1, sizeof *e->off);
    if (!e->off) return oracle_job__error(j, -ENOMEM, "out of memory preparing the evaluation set");
    for (uint32_t p = 0; p < j->P; p++) e->off[p + 1] = e->off[p] + e->plan.shares[p].batch.n;
    e->ready = 1;
    log_info("evaluation set ready: each evaluation scores %zu test samples batches=%llu eval_batches=%llu "
             "test_samples=%llu unique_keys=%zu",
             n, (unsigned long long)e->batches, (unsigned long long)j->eval_batches,
             (unsigned long long)f->test_samples, e->plan.n_unique);
    changed = ORACLE_CH_EVAL_SET;
  }
  if (rc) return oracle_job__error(j, rc, "%s", err);
  return changed;
}

data_batch_t *oracle_fetch__take(oracle_job_t *j, uint64_t x) {
  oracle_fetch_t *f = &j->fetch;
  data_batch_t *b = NULL;
  pthread_mutex_lock(&f->mu);
  if (f->q_head == x) {
    data_batch_t **e = &f->q[x % f->q_cap];
    if (*e && (*e)->iteration == x) {
      b = *e;
      *e = NULL;
      f->q_head++;
      pthread_cond_broadcast(&f->cv_space);
    }
  }
  pthread_mutex_unlock(&f->mu);
  return b;
}

void oracle_fetch__stop(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  if (!f->open) return;
  pthread_mutex_lock(&f->mu);
  f->stop = 1;
  pthread_cond_broadcast(&f->cv_space);
  pthread_mutex_unlock(&f->mu);
}

int oracle_fetch__join(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  int stuck = 0;
  struct timespec dl = clock_deadline_rt((int64_t)(j->drain_ms / 1000 + 1) * 1000);
  for (uint32_t i = 0; i < f->n_threads; i++)
    if (pthread_timedjoin_np(f->threads[i], NULL, &dl) != 0) stuck++;
  return stuck;
}

/* ---- create / destroy */

int oracle_fetch__init(oracle_job_t *j, char *err, size_t err_len) {
  oracle_fetch_t *f = &j->fetch;
  const cfg_t *cfg = j->cfg;
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv_space, NULL);
  f->open = 1;
  f->strict = cfg_bool(cfg, "strict");
  f->eval.want = j->eval_batches * j->B; /* until the test split's size is known */
  f->eval.batches = j->eval_batches;
  int rc = dpc_create(cfg, &f->dpc, err, err_len);
  if (rc) return rc;
  f->n_dpc = dpc_servers(f->dpc);
  f->n_train_threads = 2 * f->n_dpc > 16 ? 16 : 2 * f->n_dpc;
  f->chunk = 4 * f->n_dpc + 1; /* = 1 mod n: chunk k starts on processor k mod n */
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
  uint64_t want = (uint64_t)f->n_train_threads * f->chunk;
  if (q > want) q = want;
  if (q < 4) q = 4;
  f->q_cap = (uint32_t)q;
  if (!(f->q = calloc(f->q_cap, sizeof *f->q))) return -ENOMEM;
  return 0;
}

void oracle_fetch__close(oracle_job_t *j) {
  oracle_fetch_t *f = &j->fetch;
  if (!f->open) return;
  dpc_destroy(f->dpc);
  for (uint32_t i = 0; f->q && i < f->q_cap; i++)
    if (f->q[i]) {
      data_batch_free(f->q[i]);
      free(f->q[i]);
    }
  free(f->q);
  if (f->eval_pending) {
    plan_close(f->eval_pending);
    free(f->eval_pending);
  }
  free(f->eval_labels_pending);
  plan_close(&f->eval.plan);
  free(f->eval.labels);
  free(f->eval.off);
  free(f->threads);
  free(f->fetchers);
  pthread_cond_destroy(&f->cv_space);
  pthread_mutex_destroy(&f->mu);
  f->open = 0;
}
