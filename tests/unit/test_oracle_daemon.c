/*
 * test_oracle_daemon: the real chanter-oracle (and a real chanter-dataproc)
 * as processes on loopback, driven by fake trainers written here with the
 * oracle client (common/orc.h) the real trainers use.
 *
 * A fake trainer joins, opens its Work stream, checks every Step it gets
 * against the batch fetched straight from the data processor (its samples,
 * its fetch / sync / write-back lists), reports a loss of exactly 0.5 per
 * sample, answers each Eval with logits +1 for positives and -1 for
 * negatives (so the oracle must find AUC 1 and logloss log(1 + e^-1)), and
 * reads on to StopWork.  Around that: a trainer that vanishes mid-job, a
 * data processor that is not there, Stop, bad Joins, the rendezvous store,
 * configurations the oracle refuses, SIGTERM.  The daemons' logs are kept
 * in a temporary directory (removed when everything passed) and must not
 * contain a sanitizer report (CHANTER_KEEP=1 keeps them after a pass too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "data.h"
#include "dpc.h"
#include "err.h"
#include "orc.h"
#include "rpc.h"
#include "table.h"
#include "testutil.h"

#define P 2
#define B 64
#define WINDOW 3
#define ITERS 30
#define EVAL_EVERY 10
#define EVAL_BATCHES 2

static char g_dir[256], g_bin[1024], g_job[512];
static pid_t g_dp_pid;
static int g_dp_port;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- processes */

/* Every daemon started, so that a failed test leaves none behind: the
 * group teardown kills what is still running, and each child gets SIGKILL
 * if this process dies first (PR_SET_PDEATHSIG; spawned from the main
 * thread, which runs every test). */
static pid_t g_pids[64];
static int g_n_pids;

static pid_t spawn(const char *name, char *const args[], const char *log) {
  pid_t pid = testutil_spawn(g_bin, name, args, log);
  if (pid > 0 && g_n_pids < 64) g_pids[g_n_pids++] = pid;
  return pid;
}

static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strstr(buf, needle) != NULL;
}

typedef struct oracle_proc_s {
  pid_t pid;
  int port;
  char addr[64], log[512];
} oracle_proc_t;

/* Starts chanter-oracle with the job and extra --set arguments (NULL-terminated). */
static int start_oracle(oracle_proc_t *o, const char *tag, ...) {
  char ready[512], dp[128];
  snprintf(ready, sizeof ready, "%s/oracle-%s.ready", g_dir, tag);
  snprintf(o->log, sizeof o->log, "%s/oracle-%s.log", g_dir, tag);
  snprintf(dp, sizeof dp, "cluster.dataproc=127.0.0.1:%d", g_dp_port);
  char *args[40] = {"--config", g_job, "--listen", "127.0.0.1:0", "--ready-file", ready, "--set", dp};
  int a = 8;
  va_list ap;
  va_start(ap, tag);
  const char *s;
  while ((s = va_arg(ap, const char *)) != NULL && a < 36) {
    args[a++] = "--set";
    args[a++] = (char *)s;
  }
  va_end(ap);
  args[a] = NULL;
  o->pid = spawn("chanter-oracle", args, o->log);
  if (o->pid < 0) return -1;
  o->port = testutil_wait_ready(ready, o->pid);
  snprintf(o->addr, sizeof o->addr, "127.0.0.1:%d", o->port);
  return o->port > 0 ? 0 : -1;
}

/* SIGTERM: the oracle must exit 0 soon, its log free of sanitizer reports. */
static void stop_oracle(oracle_proc_t *o) {
  int st = testutil_stop(o->pid, SIGTERM, 10);
  assert_int_equal(st, 0);
  assert_false(file_has(o->log, "Sanitizer"));
  assert_true(file_has(o->log, "stopped cleanly"));
}

/* ---- the job as the test sees it */

static cfg_t *job_cfg(const char *oracle_addr, int dp_port) {
  cfg_t *c;
  char err[512], kv[128];
  assert_int_equal(cfg_create(&c), 0);
  assert_int_equal(cfg_load_file(c, g_job, err, sizeof err), 0);
  snprintf(kv, sizeof kv, "cluster.dataproc=127.0.0.1:%d", dp_port);
  assert_int_equal(cfg_set(c, kv, "test", err, sizeof err), 0);
  if (oracle_addr) {
    snprintf(kv, sizeof kv, "cluster.oracle=%s", oracle_addr);
    assert_int_equal(cfg_set(c, kv, "test", err, sizeof err), 0);
  }
  return c;
}

static void hashes(const cfg_t *c, uint64_t *schema, uint64_t *layout) {
  data_schema_t s;
  table_layout_t l;
  char err[256];
  assert_int_equal(data_schema_from_cfg(c, &s, err, sizeof err), 0);
  *schema = dpc_schema_hash(&s);
  data_schema_close(&s);
  assert_int_equal(cfg_layout(c, &l, err, sizeof err), 0);
  *layout = table_layout_hash(&l);
  table_layout_close(&l);
}

/* ---- a fake trainer */

typedef struct step_rec_s {
  int got;
  uint32_t n;
  float *labels, *dense;
  uint64_t *ids, *fetch, *sync, *write_back;
  size_t n_ids, n_fetch, n_sync, n_write_back;
} step_rec_t;

typedef struct trainer_s {
  /* setup */
  const cfg_t *cfg;
  const char *addr;
  uint32_t rank;
  uint64_t die_at;        /* cancel the stream instead of reporting this iteration (UINT64_MAX: never) */
  int hold_first;         /* rank 0: check the window before the first report */
  int no_sha;             /* leave Report.dense_sha256 empty */
  uint8_t sha_byte;       /* the fake dense_sha256 is 32 of these (0: 0xab) */
  uint64_t iterations;
  /* results */
  int join_rc, open_rc, end_rc;
  char err[512];
  step_rec_t *steps;
  uint64_t n_steps, out_of_order;
  uint64_t evals, eval_after[8], eval_samples;
  int stopped;
  char stop_reason[512];
  int window_ok;
  size_t max_ahead;
} trainer_t;

/* a reader thread feeds a queue so that the trainer can wait with a timeout */
typedef struct itemq_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Chanter__Oracle__V1__WorkItem *items[4096];
  size_t head, tail;
  int end; /* read's final rc once the stream ended */
  int ended;
  rpc_stream_t *s;
} itemq_t;

static void *reader_main(void *arg) {
  itemq_t *q = arg;
  for (;;) {
    Chanter__Oracle__V1__WorkItem *it = NULL;
    int rc = orc_work_next(q->s, &it);
    pthread_mutex_lock(&q->mu);
    if (rc != 0) {
      q->end = rc;
      q->ended = 1;
      pthread_cond_broadcast(&q->cv);
      pthread_mutex_unlock(&q->mu);
      return NULL;
    }
    q->items[q->tail++ % 4096] = it;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
}

/* Next item within timeout_s: 0 + *it, 1 at the end (q->end), -1 timeout. */
static int q_pop(itemq_t *q, double timeout_s, Chanter__Oracle__V1__WorkItem **it) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += (time_t)timeout_s;
  dl.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
  if (dl.tv_nsec >= 1000000000L) {
    dl.tv_sec++;
    dl.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&q->mu);
  int rc = 0;
  while (q->head == q->tail && !q->ended && rc == 0) rc = pthread_cond_timedwait(&q->cv, &q->mu, &dl);
  int out;
  if (q->head != q->tail) {
    *it = q->items[q->head++ % 4096];
    out = 0;
  } else {
    out = q->ended ? 1 : -1;
  }
  pthread_mutex_unlock(&q->mu);
  return out;
}

static size_t q_len(itemq_t *q) {
  pthread_mutex_lock(&q->mu);
  size_t n = q->tail - q->head;
  pthread_mutex_unlock(&q->mu);
  return n;
}

static void *copy_bytes(const ProtobufCBinaryData *d) {
  void *p = malloc(d->len ? d->len : 1);
  if (d->len) memcpy(p, d->data, d->len);
  return p;
}

static void record_step(trainer_t *t, const Chanter__Oracle__V1__Step *s) {
  if (s->iteration >= t->iterations) {
    t->out_of_order++;
    return;
  }
  step_rec_t *r = &t->steps[s->iteration];
  if (s->iteration != t->n_steps) t->out_of_order++;
  r->got = 1;
  r->n = s->samples->n;
  r->labels = copy_bytes(&s->samples->labels);
  r->dense = copy_bytes(&s->samples->dense);
  r->ids = copy_bytes(&s->samples->ids);
  r->n_ids = s->samples->ids.len / 8;
  r->fetch = copy_bytes(&s->fetch_keys);
  r->n_fetch = s->fetch_keys.len / 8;
  r->sync = copy_bytes(&s->sync_keys);
  r->n_sync = s->sync_keys.len / 8;
  r->write_back = copy_bytes(&s->write_back_keys);
  r->n_write_back = s->write_back_keys.len / 8;
  t->n_steps++;
}

static void *trainer_main(void *arg) {
  trainer_t *t = arg;
  orc_t *o = NULL;
  itemq_t q = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t reader;
  int reader_on = 0;
  t->steps = calloc(t->iterations + 1, sizeof *t->steps);
  if ((t->join_rc = orc_create(t->cfg, t->addr, &o, t->err, sizeof t->err)) != 0) return NULL;
  uint64_t sh, lh;
  hashes(t->cfg, &sh, &lh);
  Chanter__Oracle__V1__JoinRequest jr = CHANTER__ORACLE__V1__JOIN_REQUEST__INIT;
  jr.role = CHANTER__ORACLE__V1__ROLE__TRAINER;
  jr.rank = t->rank;
  jr.address = "127.0.0.1";
  jr.schema_hash = sh;
  jr.layout_hash = lh;
  jr.pid = (uint32_t)getpid() * 10 + t->rank;
  Chanter__Oracle__V1__JoinResponse *resp = NULL;
  if ((t->join_rc = orc_join(o, &jr, &resp, t->err, sizeof t->err)) != 0) goto out;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  if ((t->open_rc = orc_work_open(o, t->rank, 0, &q.s, t->err, sizeof t->err)) != 0) goto out;
  pthread_create(&reader, NULL, reader_main, &q);
  reader_on = 1;
  t->window_ok = 1;
  int held = 0;
  for (;;) {
    Chanter__Oracle__V1__WorkItem *it = NULL;
    if (t->hold_first && !held) {
      /* the oracle may send WINDOW steps before any report, and no more */
      double t0 = now_s();
      while (q_len(&q) < WINDOW && now_s() - t0 < 10) sleep_ms(5);
      sleep_ms(400);
      t->max_ahead = q_len(&q);
      t->window_ok = t->max_ahead == WINDOW;
      held = 1;
    }
    int rc = q_pop(&q, 60, &it);
    if (rc == 1) {
      t->end_rc = q.end;
      break;
    }
    if (rc < 0) {
      snprintf(t->err, sizeof t->err, "no work item for 60 s");
      t->end_rc = -ETIMEDOUT;
      break;
    }
    switch (it->kind_case) {
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP: {
      const Chanter__Oracle__V1__Step *s = it->step;
      if (s->iteration == t->die_at) { /* vanish: no report, the stream is cancelled */
        protobuf_c_message_free_unpacked(&it->base, NULL);
        rpc_stream_cancel(q.s);
        pthread_join(reader, NULL);
        reader_on = 0;
        t->end_rc = -ECANCELED;
        goto out;
      }
      record_step(t, s);
      Chanter__Oracle__V1__Report r = CHANTER__ORACLE__V1__REPORT__INIT;
      r.iteration = s->iteration;
      r.samples = s->samples->n;
      r.loss_sum = 0.5 * s->samples->n;
      r.rows_fetched = s->fetch_keys.len / 8;
      r.rows_synced = s->sync_keys.len / 8;
      r.rows_written_back = s->write_back_keys.len / 8;
      r.t_fetch = 0.001;
      r.t_forward = 0.002;
      r.t_total = 0.01;
      uint8_t sha[32];
      memset(sha, t->sha_byte ? t->sha_byte : 0xab, sizeof sha);
      if (s->iteration + 1 == t->iterations && !t->no_sha) {
        r.dense_sha256.data = sha;
        r.dense_sha256.len = 32;
      }
      orc_work_report(q.s, &r);
      break;
    }
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_EVAL: {
      const Chanter__Oracle__V1__Eval *e = it->eval;
      uint32_t n = e->samples->n;
      float *logits = malloc((n + 1) * sizeof *logits);
      const float *labels = (const float *)e->samples->labels.data;
      for (uint32_t i = 0; i < n; i++) logits[i] = labels[i] > 0.5f ? 1.0f : -1.0f;
      if (t->evals < 8) t->eval_after[t->evals] = e->after_iteration;
      t->evals++;
      t->eval_samples += n;
      Chanter__Oracle__V1__EvalResult er = CHANTER__ORACLE__V1__EVAL_RESULT__INIT;
      er.round = e->round;
      er.logits.data = (uint8_t *)logits;
      er.logits.len = n * sizeof(float);
      er.labels = e->samples->labels;
      orc_work_eval(q.s, &er);
      free(logits);
      break;
    }
    case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP:
      t->stopped = 1;
      snprintf(t->stop_reason, sizeof t->stop_reason, "%s", it->stop->reason ? it->stop->reason : "");
      break;
    default:
      break;
    }
    protobuf_c_message_free_unpacked(&it->base, NULL);
  }
out:
  if (reader_on) pthread_join(reader, NULL);
  if (q.s) {
    rpc_stream_finish(q.s, NULL);
    rpc_stream_destroy(q.s);
  }
  while (q.head != q.tail) protobuf_c_message_free_unpacked(&q.items[q.head++ % 4096]->base, NULL);
  orc_destroy(o);
  return NULL;
}

static void trainer_free(trainer_t *t) {
  for (uint64_t x = 0; t->steps && x <= t->iterations; x++) {
    step_rec_t *r = &t->steps[x];
    free(r->labels);
    free(r->dense);
    free(r->ids);
    free(r->fetch);
    free(r->sync);
    free(r->write_back);
  }
  free(t->steps);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}
static int has(const uint64_t *v, size_t n, uint64_t k) { return bsearch(&k, v, n, 8, cmp_u64) != NULL; }

static Chanter__Oracle__V1__StatusResponse *status_of(const cfg_t *c, const char *addr) {
  orc_t *o;
  char err[512];
  assert_int_equal(orc_create(c, addr, &o, err, sizeof err), 0);
  Chanter__Oracle__V1__StatusResponse *st = NULL;
  int rc = orc_status(o, &st, err, sizeof err);
  if (rc) fprintf(stderr, "status: %s\n", err);
  assert_int_equal(rc, 0);
  orc_destroy(o);
  return st;
}

/* Waits until the oracle's state is `state` (10 s). */
static Chanter__Oracle__V1__StatusResponse *wait_state(const cfg_t *c, const char *addr, const char *state) {
  for (int i = 0; i < 500; i++) {
    Chanter__Oracle__V1__StatusResponse *st = status_of(c, addr);
    if (!strcmp(st->state, state)) return st;
    protobuf_c_message_free_unpacked(&st->base, NULL);
    sleep_ms(20);
  }
  Chanter__Oracle__V1__StatusResponse *st = status_of(c, addr);
  fprintf(stderr, "state %s, wanted %s: %s\n", st->state, state, st->message);
  return st;
}

static double json_num(const char *json, const char *key) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* ---- tests */

/* A whole job: every Step checked against the data, Eval, StopWork, Status. */
static void test_train_to_done(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "done", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  trainer_t tr[P];
  pthread_t th[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .hold_first = p == 0,
                        .iterations = ITERS};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  for (uint32_t p = 0; p < P; p++) {
    if (tr[p].err[0]) fprintf(stderr, "rank %u: %s\n", p, tr[p].err);
    assert_int_equal(tr[p].join_rc, 0);
    assert_int_equal(tr[p].open_rc, 0);
    assert_int_equal(tr[p].end_rc, 1); /* a clean end of the stream */
    assert_int_equal(tr[p].n_steps, ITERS);
    assert_int_equal(tr[p].out_of_order, 0);
    assert_true(tr[p].stopped);
    assert_non_null(strstr(tr[p].stop_reason, "finished"));
    /* evaluations after iterations 9, 19, 29, the eval set split contiguously */
    assert_int_equal(tr[p].evals, 3);
    assert_int_equal(tr[p].eval_after[0], 9);
    assert_int_equal(tr[p].eval_after[1], 19);
    assert_int_equal(tr[p].eval_after[2], 29);
  }
  assert_int_equal(tr[0].eval_samples + tr[1].eval_samples, 3 * EVAL_BATCHES * B);
  assert_true(tr[0].window_ok); /* exactly WINDOW steps arrived before the first report */
  /* each Step against the batch itself */
  dpc_t *dpc;
  char err[512];
  assert_int_equal(dpc_create(c, &dpc, err, sizeof err), 0);
  double fetched = 0, synced = 0, written = 0;
  for (uint64_t x = 0; x < ITERS; x++) {
    data_batch_t b;
    assert_int_equal(dpc_get_batch(dpc, DATA_TRAIN, x, B, &b, err, sizeof err), 0);
    uint32_t first = 0;
    const step_rec_t *r0 = &tr[0].steps[x], *r1 = &tr[1].steps[x];
    assert_true(r0->got && r1->got);
    /* the sync list: the same on both, sorted */
    assert_int_equal(r0->n_sync, r1->n_sync);
    assert_memory_equal(r0->sync, r1->sync, r0->n_sync * 8);
    uint64_t *all = malloc(b.ids_off[b.n_tables] * 8 + 8);
    size_t n_all = 0;
    for (uint32_t p = 0; p < P; p++) {
      const step_rec_t *r = &tr[p].steps[x];
      uint32_t want_n = (uint32_t)((uint64_t)(p + 1) * B / P) - (uint32_t)((uint64_t)p * B / P);
      assert_int_equal(r->n, want_n); /* contiguous allocation */
      assert_memory_equal(r->labels, b.labels + first, r->n * 4);
      assert_memory_equal(r->dense, b.dense + (size_t)first * b.n_dense, (size_t)r->n * b.n_dense * 4);
      size_t o2 = 0;
      for (uint32_t t = 0; t < b.n_tables; t++) {
        uint32_t h = b.hotness[t];
        assert_memory_equal(r->ids + o2, b.ids + b.ids_off[t] + (size_t)first * h, (size_t)r->n * h * 8);
        for (size_t i = 0; i < (size_t)r->n * h; i++) {
          uint64_t k = TABLE_KEY(t, r->ids[o2 + i]);
          assert_true(has(r->fetch, r->n_fetch, k)); /* the fetch list covers every id */
          all[n_all++] = k;
        }
        o2 += (size_t)r->n * h;
      }
      for (size_t i = 1; i < r->n_fetch; i++) assert_true(r->fetch[i - 1] < r->fetch[i]);
      for (size_t i = 1; i < r->n_write_back; i++) assert_true(r->write_back[i - 1] < r->write_back[i]);
      for (size_t i = 0; i < r->n_sync; i++) assert_true(has(r->fetch, r->n_fetch, r->sync[i]));
      fetched += (double)r->n_fetch;
      if (p == 0) synced += (double)r->n_sync; /* one shared list per iteration, not per trainer */
      written += (double)r->n_write_back;
      first += r->n;
    }
    /* every key the batch touches is written back by exactly one trainer */
    qsort(all, n_all, 8, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < n_all; i++)
      if (!u || all[u - 1] != all[i]) all[u++] = all[i];
    assert_int_equal(r0->n_write_back + r1->n_write_back, u);
    for (size_t i = 0; i < u; i++)
      assert_int_equal(has(r0->write_back, r0->n_write_back, all[i]) + has(r1->write_back, r1->n_write_back, all[i]), 1);
    free(all);
    data_batch_free(&b);
  }
  dpc_destroy(dpc);
  /* the job's end as Status tells it */
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "done");
  assert_string_equal(st->state, "done");
  assert_int_equal(st->iteration, ITERS);
  assert_int_equal(st->iterations, ITERS);
  assert_int_equal(st->n_members, P);
  for (size_t i = 0; i < st->n_members; i++) {
    assert_int_equal(st->members[i]->role, CHANTER__ORACLE__V1__ROLE__TRAINER);
    assert_true(st->members[i]->alive);
    assert_int_equal(st->members[i]->iteration, ITERS);
  }
  const char *js = st->summary_json;
  fprintf(stderr, "# summary: %s\n", js);
  assert_true(json_num(js, "iterations") == ITERS);
  assert_true(fabs(json_num(js, "train_logloss") - 0.5) < 1e-9);
  assert_true(fabs(json_num(js, "test_auc") - 1.0) < 1e-12);
  assert_true(fabs(json_num(js, "test_logloss") - log1p(exp(-1.0))) < 1e-6);
  /* the test split (600 samples) holds the eval set; the batch fits both splits: no warning */
  assert_true(json_num(js, "test_samples_scored") == EVAL_BATCHES * B);
  assert_non_null(strstr(js, "\"warnings\": []"));
  assert_true(json_num(js, "train_logloss_iterations") == ITERS / 10);
  assert_true(fabs(json_num(js, "rows_fetched") - fetched / ITERS) < 1e-6);
  assert_true(fabs(json_num(js, "rows_synced") - synced / ITERS) < 1e-6);
  assert_true(fabs(json_num(js, "rows_written_back") - written / ITERS) < 1e-6);
  assert_true(fabs(json_num(js, "fetch") - 0.001) < 1e-9); /* phase_seconds: mean over trainers */
  assert_true(json_num(js, "samples_per_sec") > 0);
  assert_true(json_num(js, "trainers") == P && json_num(js, "batch_size") == B);
  assert_non_null(strstr(js, "\"dense_sha256\": \"abababab"));
  assert_non_null(strstr(js, "\"mode\": \"normal\""));
  assert_non_null(strstr(js, "\"allocation\": \"contiguous\""));
  assert_true(js[strlen(js) - 1] == '}');
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
  assert_true(file_has(o.log, "evaluation round=2 after_iteration=29"));
}

/* Random allocation and ideal mode: same samples in total, empty key lists. */
static void test_ideal_random(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "ideal", "mode=ideal", "allocation=random", "iterations=6", "eval_every=0", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  trainer_t tr[P];
  pthread_t th[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .iterations = 6, .no_sha = 1};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  dpc_t *dpc;
  char err[512];
  assert_int_equal(dpc_create(c, &dpc, err, sizeof err), 0);
  int differs_from_contiguous = 0;
  for (uint64_t x = 0; x < 6; x++) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < P; p++) {
      const step_rec_t *r = &tr[p].steps[x];
      assert_true(r->got);
      assert_int_equal(r->n_fetch + r->n_sync + r->n_write_back, 0); /* ideal: no embedding traffic */
      n += r->n;
    }
    assert_int_equal(n, B);
    assert_int_equal(tr[0].steps[x].n, B / 2); /* a permutation cut into equal chunks */
    data_batch_t b;
    assert_int_equal(dpc_get_batch(dpc, DATA_TRAIN, x, B, &b, err, sizeof err), 0);
    differs_from_contiguous |= memcmp(tr[0].steps[x].dense, b.dense, (size_t)B / 2 * b.n_dense * 4) != 0;
    data_batch_free(&b);
  }
  dpc_destroy(dpc);
  assert_true(differs_from_contiguous);
  for (uint32_t p = 0; p < P; p++) assert_int_equal(tr[p].evals, 1); /* eval_every = 0: at the end only */
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "done");
  assert_string_equal(st->state, "done");
  assert_non_null(strstr(st->summary_json, "\"mode\": \"ideal\""));
  assert_non_null(strstr(st->summary_json, "\"allocation\": \"random\""));
  assert_non_null(strstr(st->summary_json, "\"dense_sha256\": \"\""));
  assert_non_null(strstr(st->summary_json, "\"rows_fetched\": 0,"));
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
}

/* Replicas that end with different dense parameters fail the job; no evaluation at all. */
static void test_sha_mismatch(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "sha", "iterations=3", "eval_batches=0", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  trainer_t tr[P];
  pthread_t th[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .iterations = 3,
                        .sha_byte = p == 1 ? 0xcd : 0};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  for (uint32_t p = 0; p < P; p++) {
    assert_int_equal(tr[p].n_steps, 3);
    assert_int_equal(tr[p].evals, 0);
    assert_true(tr[p].stopped);
  }
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "failed");
  assert_string_equal(st->state, "failed");
  assert_non_null(strstr(st->message, "differ"));
  assert_non_null(strstr(st->message, "rank 1 (cdcd"));
  assert_non_null(strstr(st->summary_json, "\"test_auc\": null"));
  assert_int_equal(st->iteration, 3);
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
}

/* A trainer vanishes mid-job: the job recovers (DESIGN.md 5).  The
 * survivor's StopWork says "recovering" and names the lost rank; the
 * oracle then waits, in state recovering, for every rank to join the next
 * generation (these stand-in trainers do not), with the loss in the
 * summary's "recoveries". */
static void test_trainer_dies(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "dies", "iterations=1000", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  trainer_t tr[P];
  pthread_t th[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = p == 1 ? 5 : UINT64_MAX, .iterations = 1000};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  assert_true(tr[0].stopped);
  assert_non_null(strstr(tr[0].stop_reason, "trainer-1 lost"));
  assert_int_equal(tr[0].end_rc, 1);
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "recovering");
  assert_string_equal(st->state, "recovering");
  assert_non_null(strstr(st->summary_json, "\"kind\": \"trainer\", \"who\": \"trainer-1\""));
  /* it died on receiving Step 5, having sent Report 4; the oracle sends Step 5 once iteration 2 is done (window
   * 3), and the cancel may overtake the reports still in flight: iteration 3, 4 or 5 */
  assert_true(strstr(st->summary_json, "at iteration 5") || strstr(st->summary_json, "at iteration 4") ||
              strstr(st->summary_json, "at iteration 3"));
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
}

/* No data processor where the job says: failed within rpc.timeout_ms, with the reason. */
static void test_dataproc_down(void **state) {
  (void)state;
  oracle_proc_t o;
  /* a port nobody listens on: bind one, note it, close it */
  char dead[64];
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    snprintf(dead, sizeof dead, "cluster.dataproc=127.0.0.1:%d", ntohs(a.sin_port));
    close(fd);
  }
  assert_int_equal(start_oracle(&o, "nodp", dead, "rpc.timeout_ms=1500", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  trainer_t tr[P];
  pthread_t th[P];
  double t0 = now_s();
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .iterations = ITERS};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  double took = now_s() - t0;
  for (uint32_t p = 0; p < P; p++) {
    assert_true(tr[p].stopped);
    assert_int_equal(tr[p].n_steps, 0);
  }
  assert_true(took < 10);
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "failed");
  assert_string_equal(st->state, "failed");
  fprintf(stderr, "# failed as expected: %s\n", st->message);
  assert_non_null(strstr(st->message, "data processor"));
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
}

typedef struct kvget_s {
  orc_t *o;
  const char *key;
  int64_t timeout_ms;
  int rc;
  char *val;
  size_t len;
  double took;
} kvget_t;

static void *kvget_main(void *arg) {
  kvget_t *g = arg;
  char err[512];
  double t0 = now_s();
  void *v = NULL;
  g->rc = orc_kv_get(g->o, g->key, &v, &g->len, g->timeout_ms, err, sizeof err);
  g->val = v;
  g->took = now_s() - t0;
  return NULL;
}

/* Joins that must be refused, the rendezvous store, Stop, SIGTERM. */
static void test_membership_kv_stop(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "misc", "iterations=100000", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  uint64_t sh, lh;
  hashes(c, &sh, &lh);
  orc_t *cl;
  char err[512];
  assert_int_equal(orc_create(c, o.addr, &cl, err, sizeof err), 0);
  Chanter__Oracle__V1__JoinRequest jr = CHANTER__ORACLE__V1__JOIN_REQUEST__INIT;
  Chanter__Oracle__V1__JoinResponse *resp = NULL;
  jr.role = CHANTER__ORACLE__V1__ROLE__TRAINER;
  jr.address = "127.0.0.1";
  jr.schema_hash = sh ^ 1;
  jr.layout_hash = lh;
  jr.pid = (uint32_t)getpid() * 10; /* what the fake trainer of rank 0 sends, so that its Join is a repeat */
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), ERR_PRECONDITION); /* FAILED_PRECONDITION */
  assert_non_null(strstr(err, "data schema"));
  jr.schema_hash = sh;
  jr.layout_hash = lh + 1;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), ERR_PRECONDITION);
  assert_non_null(strstr(err, "table layout"));
  jr.layout_hash = lh;
  jr.rank = 7;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "outside"));
  jr.rank = 0;
  jr.role = 9;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), -EINVAL);
  jr.role = CHANTER__ORACLE__V1__ROLE__TRAINER;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), 0);
  assert_int_equal(resp->trainers, P);
  assert_non_null(strstr(resp->job_id, "seed5-"));
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), 0); /* the same process again: fine */
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  /* another process for rank 0 while no Work stream of rank 0 is open: it replaces the first (a restarted
   * trainer must not wait for the heartbeat timeout); with a stream open it is refused: one trainer per rank */
  jr.pid = 2;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), 0);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  jr.pid = (uint32_t)getpid() * 10;
  assert_int_equal(orc_join(cl, &jr, &resp, err, sizeof err), 0);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  int stop = -1;
  assert_int_equal(orc_heartbeat(cl, CHANTER__ORACLE__V1__ROLE__TRAINER, 0, 0, &stop, err, sizeof err), 0);
  assert_int_equal(stop, 0);
  assert_int_equal(orc_heartbeat(cl, CHANTER__ORACLE__V1__ROLE__TRAINER, 1, 0, &stop, err, sizeof err), ERR_NOTFOUND);
  /* Work before Join (rank 1), or with a first message other than Hello */
  rpc_stream_t *s = NULL;
  assert_int_equal(orc_work_open(cl, 1, 0, &s, err, sizeof err), 0);
  Chanter__Oracle__V1__WorkItem *it = NULL;
  assert_true(orc_work_next(s, &it) < 0);
  rpc_status_t rs;
  rpc_stream_finish(s, &rs);
  assert_int_equal(rs.code, 9);
  assert_non_null(strstr(rs.message, "Join"));
  rpc_stream_destroy(s);
  /* rendezvous: a waiting KvGet is answered by a later KvSet; a missing key times out */
  kvget_t g = {.o = cl, .key = "gloo/rank0", .timeout_ms = 5000};
  pthread_t th;
  pthread_create(&th, NULL, kvget_main, &g);
  sleep_ms(300);
  assert_int_equal(orc_kv_set(cl, "gloo/rank0", "addr-0", 6, err, sizeof err), 0);
  pthread_join(th, NULL);
  assert_int_equal(g.rc, 0);
  assert_int_equal(g.len, 6);
  assert_memory_equal(g.val, "addr-0", 6);
  assert_true(g.took >= 0.25 && g.took < 3);
  free(g.val);
  kvget_t m = {.o = cl, .key = "nobody/sets/this", .timeout_ms = 400};
  kvget_main(&m);
  assert_int_equal(m.rc, ERR_NOTFOUND);
  assert_true(m.took >= 0.35 && m.took < 3);
  void *v = NULL;
  size_t len = 0;
  assert_int_equal(orc_kv_get(cl, "gloo/rank0", &v, &len, 0, err, sizeof err), 0); /* set: no wait */
  free(v);
  assert_int_equal(orc_kv_set(cl, "", "x", 1, err, sizeof err), -EINVAL);
  /* a job that runs, then Stop: both trainers get StopWork with the reason */
  trainer_t tr[P];
  pthread_t tt[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .iterations = 100000};
    pthread_create(&tt[p], NULL, trainer_main, &tr[p]);
  }
  for (int i = 0; i < 500; i++) { /* let it run a few iterations */
    Chanter__Oracle__V1__StatusResponse *st = status_of(c, o.addr);
    uint64_t done = st->iteration;
    protobuf_c_message_free_unpacked(&st->base, NULL);
    if (done > 5) break;
    sleep_ms(20);
  }
  assert_int_equal(orc_stop(cl, "enough", err, sizeof err), 0);
  for (uint32_t p = 0; p < P; p++) pthread_join(tt[p], NULL);
  for (uint32_t p = 0; p < P; p++) {
    assert_true(tr[p].stopped);
    assert_non_null(strstr(tr[p].stop_reason, "enough"));
    assert_true(tr[p].n_steps > 5);
  }
  Chanter__Oracle__V1__StatusResponse *st = status_of(c, o.addr);
  assert_string_equal(st->state, "stopped");
  assert_non_null(strstr(st->summary_json, "\"train_logloss\": 0.5"));
  protobuf_c_message_free_unpacked(&st->base, NULL);
  assert_int_equal(orc_heartbeat(cl, CHANTER__ORACLE__V1__ROLE__TRAINER, 0, 0, &stop, err, sizeof err), 0);
  assert_int_equal(stop, 1); /* the job is over */
  orc_destroy(cl);
  for (uint32_t p = 0; p < P; p++) trainer_free(&tr[p]);
  cfg_destroy(c);
  stop_oracle(&o);
}

/* SIGTERM while trainers wait for the job to start: StopWork, exit 0. */
static void test_sigterm_while_waiting(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "term", "trainers=3", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port); /* trainers = 3 matters to the oracle only */
  trainer_t tr[P];
  pthread_t th[P];
  for (uint32_t p = 0; p < P; p++) {
    tr[p] = (trainer_t){.cfg = c, .addr = o.addr, .rank = p, .die_at = UINT64_MAX, .iterations = ITERS};
    pthread_create(&th[p], NULL, trainer_main, &tr[p]);
  }
  Chanter__Oracle__V1__StatusResponse *st = NULL;
  for (int i = 0; i < 200; i++) { /* both joined */
    st = status_of(c, o.addr);
    size_t n = st->n_members;
    protobuf_c_message_free_unpacked(&st->base, NULL);
    if (n == P) break;
    sleep_ms(20);
  }
  sleep_ms(200);
  double t0 = now_s();
  stop_oracle(&o);
  assert_true(now_s() - t0 < 5);
  for (uint32_t p = 0; p < P; p++) pthread_join(th[p], NULL);
  for (uint32_t p = 0; p < P; p++) {
    assert_true(tr[p].stopped);
    assert_non_null(strstr(tr[p].stop_reason, "shutting down"));
    trainer_free(&tr[p]);
  }
  cfg_destroy(c);
}

/* A waiting oracle whose trainers never come fails after start_timeout_ms. */
static void test_start_timeout(void **state) {
  (void)state;
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "timeout", "oracle.start_timeout_ms=300", NULL), 0);
  cfg_t *c = job_cfg(o.addr, g_dp_port);
  Chanter__Oracle__V1__StatusResponse *st = wait_state(c, o.addr, "failed");
  assert_string_equal(st->state, "failed");
  assert_non_null(strstr(st->message, "missing ranks: 0, 1"));
  protobuf_c_message_free_unpacked(&st->base, NULL);
  cfg_destroy(c);
  stop_oracle(&o);
}

/* What this oracle cannot do is refused at start, saying so: a lookahead
 * beyond oracle.max_lookahead's hard cap, a cache_rows a trainer cannot
 * hold. */
static void test_refused_configs(void **state) {
  (void)state;
  struct {
    const char *set, *needle;
  } cases[] = {{"lookahead=5000", "lookahead = 5000"}, {"cache_rows=0", "cache_rows"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char log[512], set[64];
    snprintf(log, sizeof log, "%s/refused-%zu.log", g_dir, i);
    snprintf(set, sizeof set, "%s", cases[i].set);
    char *args[] = {"--config", g_job, "--listen", "127.0.0.1:0", "--set", set, NULL};
    pid_t pid = spawn("chanter-oracle", args, log);
    int st = 0;
    double t0 = now_s();
    while (waitpid(pid, &st, WNOHANG) != pid && now_s() - t0 < 10) sleep_ms(20);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    if (!file_has(log, cases[i].needle) || !file_has(log, "not")) fail_msg("%s: the log %s does not say why", set, log);
  }
  /* lookahead = auto and a fixed lookahead start */
  oracle_proc_t o;
  assert_int_equal(start_oracle(&o, "auto", "lookahead=auto", NULL), 0);
  stop_oracle(&o);
  assert_int_equal(start_oracle(&o, "fixed", "lookahead=4", NULL), 0);
  stop_oracle(&o);
  assert_int_equal(start_oracle(&o, "laia", "allocation=laia", NULL), 0);
  stop_oracle(&o);
}

/* ---- setup: the binaries, a job file, one data processor */

static int setup(void **state) {
  (void)state;
  rpc_global_init();
  if (testutil_bin_dir(g_bin, sizeof g_bin)) return -1; /* BUILD/tests/x -> BUILD/bin */
  if (testutil_tmpdir(g_dir, sizeof g_dir, "oracle-test")) return -1;
  snprintf(g_job, sizeof g_job, "%s/job.ini", g_dir);
  FILE *f = fopen(g_job, "w");
  if (!f) return -1;
  fprintf(f,
          "seed = 5\ntrainers = %d\nbatch_size = %d\niterations = %d\neval_every = %d\neval_batches = %d\n"
          "n_dense = 4\ntable_rows = 40, 3000, 7\ntable_hotness = 1, 2, 1\nembedding_dim = 4\nlookahead = 0\ntable_strategy = cache\n"
          "[synthetic]\nsamples = 6000\n[rpc]\ntimeout_ms = 5000\n"
          "[oracle]\nwindow = %d\nstart_timeout_ms = 30000\nmetrics_port_offset = 0\ndrain_ms = 2000\n"
          "heartbeat_timeout_ms = 5000\n[dataproc]\nmetrics_port_offset = 0\ndrain_ms = 1000\n",
          P, B, ITERS, EVAL_EVERY, EVAL_BATCHES, WINDOW);
  fclose(f);
  char ready[512], log[512];
  snprintf(ready, sizeof ready, "%s/dp.ready", g_dir);
  snprintf(log, sizeof log, "%s/dp.log", g_dir);
  char *args[] = {"--config", g_job, "--index", "0", "--listen", "127.0.0.1:0", "--ready-file", ready, NULL};
  g_dp_pid = spawn("chanter-dataproc", args, log);
  if (g_dp_pid < 0) {
    fprintf(stderr, "cannot start %s/chanter-dataproc (run make first)\n", g_bin);
    return -1;
  }
  g_dp_port = testutil_wait_ready(ready, g_dp_pid);
  if (g_dp_port <= 0) {
    fprintf(stderr, "chanter-dataproc did not become ready; log %s\n", log);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (g_dp_pid > 0) testutil_stop(g_dp_pid, SIGTERM, 5);
  for (int i = 0; i < g_n_pids; i++) /* daemons a failed test did not stop */
    if (waitpid(g_pids[i], NULL, WNOHANG) == 0) {
      fprintf(stderr, "# killing leftover daemon pid %d\n", (int)g_pids[i]);
      kill(g_pids[i], SIGKILL);
      waitpid(g_pids[i], NULL, 0);
    }
  rpc_global_shutdown();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_train_to_done),      cmocka_unit_test(test_ideal_random),
      cmocka_unit_test(test_sha_mismatch),       cmocka_unit_test(test_trainer_dies),
      cmocka_unit_test(test_dataproc_down),
      cmocka_unit_test(test_membership_kv_stop), cmocka_unit_test(test_sigterm_while_waiting),
      cmocka_unit_test(test_start_timeout),      cmocka_unit_test(test_refused_configs),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  if (failed == 0 && g_dir[0] && !getenv("CHANTER_KEEP")) {
    if (testutil_rmtree(g_dir) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  } else if (g_dir[0]) {
    fprintf(stderr, "# daemon logs kept in %s\n", g_dir);
  }
  return failed;
}
