/*
 * chanter train --local: one process, no daemons (`cmd_train` hands it
 * `--local`; cmd_train.c watches a cluster's job instead).
 *
 * Reads the job's dataset with the data module (the same readers the data
 * processors use), keeps every embedding table in memory (rows initialized
 * exactly as the embedding servers would: table_init_row from (seed, key);
 * on device = cuda in GPU memory as far as trainer.device_mb allows,
 * embdev.h), trains the configured model with the configured optimizers,
 * evaluates on the held-out split, prints a progress bar and a summary, and
 * writes summary.json into --workdir when given.  Same seed, same config
 * -> bit-identical digest (SHA-256 of the dense parameters, then of every
 * embedding row as (key, row) in key order).  It is the reference the
 * cluster's digest is compared with.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blas_cpu.h"
#include "cli.h"
#include "clock.h"
#include "cuda_check.h"
#include "data.h"
#include "err.h"
#include "embag.h"
#include "embdev.h"
#include "eval.h"
#include "fsio.h"
#include "jobrule.h"
#include "model_dev.h"
#include "nn.h"
#include "nn_cuda.h"
#include "opt.h"
#include "phase.h"
#include "sbuf.h"
#include "table.h"

/* The phases --local measures (phase.h), in the order it prints them. */
static const int local_phases[] = {PHASE_DATA,         PHASE_GATHER,           PHASE_FORWARD, PHASE_BACKWARD,
                                   PHASE_DENSE_UPDATE, PHASE_EMBEDDING_UPDATE, PHASE_EVAL};
#define N_LOCAL_PHASES (sizeof local_phases / sizeof local_phases[0])

typedef struct local_s {
  const cfg_t *cfg;
  data_source_t *data;
  const data_schema_t *schema;
  table_layout_t layout;
  float **tables;      /* per table: rows x row_floats (device = cpu) */
  model_dev_t *model;  /* the model on cfg's device (model_dev.h) */
  embdev_t *ed;        /* device = cuda: the tables and their step (embdev.h), on the GPU as far as they fit */
  opt_t *dense_opt;
  opt_kind_t emb_kind;
  opt_hparams_t emb_hp;
  uint32_t dim, batch_size;
  size_t row_floats;   /* every table's (one dim, one row optimizer) */
  embag_t *eb;         /* device = cpu: the embedding work on the model's threads, and the model's input */
  const uint64_t **idx; /* per table: the batch's ids */
  double phase[PHASE_N]; /* seconds by PHASE_* (the local_phases) */
} local_t;

/* The model on cfg's device, its dense optimizer and the rows' optimizer:
 * what both devices' local_open set up alike. */
static int local_open_model(local_t *L, const cfg_t *cfg, char *err, size_t n) {
  int rc;
  L->batch_size = (uint32_t)cfg_int(cfg, "batch_size");
  if ((rc = model_dev_create(cfg, L->schema->n_dense, L->schema->n_tables, L->dim, L->batch_size, &L->model, err, n)) != 0)
    return rc;
  model_dev_init(L->model, (uint64_t)cfg_int(cfg, "seed"));
  if ((rc = opt_create(cfg, model_dev_n_params(L->model), &L->dense_opt)) != 0)
    return err_set(err, n, rc, "optimizer = %s cannot be used for dense parameters", cfg_str(cfg, "optimizer"));
  if ((rc = opt_kind_parse(cfg_str(cfg, "embedding_optimizer"), &L->emb_kind)) != 0) return rc;
  opt_hparams_from_cfg(cfg, L->emb_kind, &L->emb_hp);
  return 0;
}

/* The rest of local_open for device = cuda: the model, then the tables
 * (embdev: on the GPU as far as trainer.device_mb and the memory left
 * after the model allow, initialized as table_init_row does). */
static int local_open_cuda(local_t *L, const cfg_t *cfg, char *err, size_t n) {
  int rc;
  if ((rc = local_open_model(L, cfg, err, n)) != 0) return rc;
#ifdef CHANTER_CUDA
  int64_t mb = cfg_int(cfg, "trainer.device_mb");
  if ((rc = embdev_create(&L->layout, L->schema->hotness, L->batch_size, L->emb_kind, &L->emb_hp,
                          mb < 0 ? EMBDEV_AUTO : mb * (INT64_C(1) << 20), &L->ed, err, n)) != 0)
    return rc;
#endif
  L->idx = calloc(L->schema->n_tables, sizeof *L->idx);
  if (!L->idx) return -ENOMEM;
  return 0;
}

static int local_open(local_t *L, const cfg_t *cfg, char *err, size_t n) {
  memset(L, 0, sizeof *L);
  L->cfg = cfg;
  int rc = data_open(cfg, &L->data, err, n);
  if (rc) return rc;
  L->schema = data_schema(L->data);
  if ((rc = cfg_layout(cfg, &L->layout, err, n)) != 0) return rc;
  if (L->layout.n_tables != L->schema->n_tables)
    return err_set(err, n, ERR_CONFIG, "the dataset has %u tables but table_rows lists %u", L->schema->n_tables,
                   L->layout.n_tables);
  L->dim = L->layout.tables[0].dim;
  uint64_t total = 0;
  for (uint32_t t = 0; t < L->layout.n_tables; t++) {
    if (L->layout.tables[t].dim != L->dim)
      return err_set(err, n, ERR_CONFIG, "table %u has dim %u but table 0 has %u: the models need one embedding dim", t,
                     L->layout.tables[t].dim, L->dim);
    if (table_row_floats(&L->layout, t) != table_row_floats(&L->layout, 0))
      return err_set(err, n, ERR_CONFIG, "table %u has %u floats per row but table 0 has %u", t,
                     table_row_floats(&L->layout, t), table_row_floats(&L->layout, 0));
    total += L->layout.tables[t].rows * table_row_floats(&L->layout, t);
  }
  L->row_floats = table_row_floats(&L->layout, 0);
  if (total * 4 > (UINT64_C(16) << 30))
    return err_set(err, n, -ENOMEM,
                   "the tables need %.1f GiB: too large for train --local (use the distributed trainer)",
                   (double)total * 4 / (1 << 30));
  if (!strcmp(cfg_str(cfg, "device"), "cuda")) return local_open_cuda(L, cfg, err, n);
  L->tables = calloc(L->layout.n_tables, sizeof *L->tables);
  if (!L->tables) return -ENOMEM;
  for (uint32_t t = 0; t < L->layout.n_tables; t++) {
    uint32_t rf = table_row_floats(&L->layout, t);
    L->tables[t] = embag_rows_alloc(L->layout.tables[t].rows * rf * sizeof(float), 0);
    if (!L->tables[t]) return err_set(err, n, -ENOMEM, "out of memory for table %u", t);
    for (uint64_t r = 0; r < L->layout.tables[t].rows; r++) table_init_row(&L->layout, TABLE_KEY(t, r), L->tables[t] + r * rf);
  }
  if ((rc = local_open_model(L, cfg, err, n)) != 0) return rc;
  if ((rc = embag_create(L->schema->n_tables, L->schema->hotness, L->dim, L->batch_size, &L->eb)) != 0) return rc;
  L->idx = calloc(L->schema->n_tables, sizeof *L->idx);
  if (!L->idx) return -ENOMEM;
  return 0;
}

static void local_close(local_t *L) {
  for (uint32_t t = 0; L->tables && t < L->layout.n_tables; t++) free(L->tables[t]);
  free(L->tables);
#ifdef CHANTER_CUDA
  embdev_destroy(L->ed);
#endif
  embag_destroy(L->eb);
  free(L->idx);
  opt_destroy(L->dense_opt);
  model_dev_destroy(L->model);
  table_layout_close(&L->layout);
  data_close(L->data);
}

/* device = cuda: the sentence of the last CUDA failure of the tables'
 * step or of the model ("" when none is known). */
static const char *local_cuda_error(local_t *L) {
  static char msg[640];
  msg[0] = 0;
#ifdef CHANTER_CUDA
  if (L->ed && embdev_error(L->ed)[0]) snprintf(msg, sizeof msg, "%s", embdev_error(L->ed));
  else if (L->ed) (void)nn_cuda_error(msg, sizeof msg);
#else
  (void)L;
#endif
  return msg;
}

/* device = cuda: the tables on the GPU and their MiB (0 on the CPU). */
static uint32_t local_device_tables(const local_t *L, double *mib) {
  *mib = 0;
#ifdef CHANTER_CUDA
  if (L->ed) {
    *mib = (double)embdev_device_bytes(L->ed) / (1 << 20);
    return embdev_n_device(L->ed);
  }
#else
  (void)L;
#endif
  return 0;
}

/* b's ids, table by table, for embag */
static const uint64_t *const *batch_idx(local_t *L, const data_batch_t *b) {
  for (uint32_t t = 0; t < b->n_tables; t++) L->idx[t] = b->ids + b->ids_off[t];
  return L->idx;
}

/* The logits of test batch b (into a buffer of L's); 0 or ERR_CUDA. */
static int score(local_t *L, const data_batch_t *b, const float **logits) {
#ifdef CHANTER_CUDA
  if (L->ed) { /* pooled on the device, into the model's device input */
    *logits = embdev_logits(L->ed);
    if (embdev_fwd(L->ed, L->model, b->n, batch_idx(L, b), 0) ||
        model_dev_forward(L->model, b->n, b->dense, model_dev_emb_dev(L->model), embdev_logits(L->ed)))
      return ERR_CUDA;
    return 0;
  }
#endif
  embag_fwd(L->eb, model_dev_pool(L->model), b->n, L->tables, L->row_floats, batch_idx(L, b), NULL, embag_emb(L->eb));
  *logits = embag_logits(L->eb);
  return model_dev_forward(L->model, b->n, b->dense, embag_emb(L->eb), embag_logits(L->eb)) ? ERR_CUDA : 0;
}

/* One training step (embag_train_step: the embedding work on the model's
 * threads, as `chanter bench model` times it); returns the sum of losses. */
static double step(local_t *L, const data_batch_t *b) {
  double sec[EMBAG_PHASES] = {0}, loss;
#ifdef CHANTER_CUDA
  if (L->ed)
    loss = embdev_train_step(L->ed, L->model, L->dense_opt, b->n, b->dense, b->labels, batch_idx(L, b),
                             1.0f / (float)b->n, sec);
  else
#endif
    loss = embag_train_step(L->eb, L->model, L->dense_opt, L->emb_kind, &L->emb_hp, L->tables, L->row_floats, b->n,
                            b->dense, b->labels, batch_idx(L, b), 1.0f / (float)b->n, sec);
  L->phase[PHASE_GATHER] += sec[EMBAG_PHASE_GATHER];
  L->phase[PHASE_FORWARD] += sec[EMBAG_PHASE_FORWARD];
  L->phase[PHASE_BACKWARD] += sec[EMBAG_PHASE_BACKWARD];
  L->phase[PHASE_DENSE_UPDATE] += sec[EMBAG_PHASE_DENSE_UPDATE];
  L->phase[PHASE_EMBEDDING_UPDATE] += sec[EMBAG_PHASE_EMBEDDING_UPDATE];
  return loss;
}

/* The training batches, read ahead on threads of their own while the steps
 * run: thread t of k reads iterations t, t + k, t + 2k, ... (data_read_batch
 * is thread-safe and a function of the iteration, so the batches are the
 * ones a serial read gives, whatever k), each into its own slot, and waits
 * for the step to take it before reading its next one.  k = 1 on the CPU
 * (its cores train); on a GPU the host's cores only read and k grows with
 * them (reader_threads), since one thread reads a batch of 16384 synthetic
 * samples in about 30 ms where the GPU trains it in 3. */
typedef struct reader_slot_s {
  uint64_t it;
  int full, rc;
  data_batch_t b;
  char err[512];
} reader_slot_t;

typedef struct reader_s {
  local_t *L;
  uint32_t k, started;
  uint64_t end; /* iterations [0, end) */
  int stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  reader_slot_t *slot;
  pthread_t *th;
} reader_t;

typedef struct reader_arg_s {
  reader_t *r;
  uint32_t t;
} reader_arg_t;

static void *reader_main(void *arg) {
  reader_arg_t *a = arg;
  reader_t *r = a->r;
  uint32_t t = a->t;
  free(a);
  for (uint64_t it = t; it < r->end; it += r->k) {
    pthread_mutex_lock(&r->mu);
    while (r->slot[t].full && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    if (stop) break;
    data_batch_t b;
    char err[512] = "";
    int rc = data_read_batch(r->L->data, DATA_TRAIN, it, r->L->batch_size, &b, err, sizeof err);
    pthread_mutex_lock(&r->mu);
    r->slot[t].it = it;
    r->slot[t].rc = rc;
    if (rc) snprintf(r->slot[t].err, sizeof r->slot[t].err, "%s", err);
    else r->slot[t].b = b;
    r->slot[t].full = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (rc) break;
  }
  return NULL;
}

/* Readers for a device: 1 on the CPU; on a GPU the CPUs of this process
 * less one for the training thread, at most 8. */
static uint32_t reader_threads(const cfg_t *cfg) {
  if (strcmp(cfg_str(cfg, "device"), "cuda") != 0) return 1;
  cpu_set_t set;
  long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
  n -= 1;
  return n < 1 ? 1 : n > 8 ? 8 : (uint32_t)n;
}

/* Starts k readers of iterations [0, end); a thread that cannot start
 * leaves its iterations to the training thread (reader_take reads them). */
static int reader_start(reader_t *r, local_t *L, uint32_t k, uint64_t end) {
  memset(r, 0, sizeof *r);
  r->L = L;
  r->k = k ? k : 1;
  r->end = end;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->slot = calloc(r->k, sizeof *r->slot);
  r->th = calloc(r->k, sizeof *r->th);
  if (!r->slot || !r->th) return -ENOMEM;
  for (uint32_t t = 0; t < r->k && t < end; t++) {
    reader_arg_t *a = malloc(sizeof *a);
    if (!a) break;
    *a = (reader_arg_t){r, t};
    if (pthread_create(&r->th[t], NULL, reader_main, a) != 0) {
      free(a);
      break;
    }
    r->started = t + 1;
  }
  return 0;
}

/* Batch it (the next one in order): 0 with *b (the caller frees it), or
 * the read's error. */
static int reader_take(reader_t *r, uint64_t it, data_batch_t *b, char *err, size_t n) {
  uint32_t t = (uint32_t)(it % r->k);
  if (t >= r->started) return data_read_batch(r->L->data, DATA_TRAIN, it, r->L->batch_size, b, err, n);
  pthread_mutex_lock(&r->mu);
  while (!(r->slot[t].full && r->slot[t].it == it)) pthread_cond_wait(&r->cv, &r->mu);
  int rc = r->slot[t].rc;
  if (rc) snprintf(err, n, "%s", r->slot[t].err);
  else *b = r->slot[t].b;
  r->slot[t].full = rc ? 1 : 0; /* a failed reader has stopped */
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* Stops the readers and frees what they read that no step took. */
static void reader_stop(reader_t *r) {
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  for (uint32_t t = 0; t < r->started; t++) pthread_join(r->th[t], NULL);
  for (uint32_t t = 0; r->slot && t < r->k; t++)
    if (r->slot[t].full && !r->slot[t].rc) data_batch_free(&r->slot[t].b);
  free(r->slot);
  free(r->th);
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
}

/* Scores the first `samples` test samples (jobrule_eval_samples: each at
 * most once) in batches of the training batch size, the last one cut, as
 * the oracle's evaluation set does. */
static int evaluate(local_t *L, uint64_t samples, double *logloss, double *acc, double *auc, char *err, size_t n) {
  eval_acc_t a;
  eval_acc_init(&a);
  double t0 = clock_mono_s();
  int rc = 0;
  uint64_t scored = 0;
  for (uint64_t x = 0; scored < samples && !rc; x++) {
    data_batch_t b;
    if ((rc = data_read_batch(L->data, DATA_TEST, x, L->batch_size, &b, err, n)) != 0) break;
    uint64_t m = samples - scored < b.n ? samples - scored : b.n;
    const float *logits = NULL;
    if ((rc = score(L, &b, &logits)) != 0) snprintf(err, n, "evaluation: a CUDA call failed%s%s", local_cuda_error(L)[0] ? ": " : "", local_cuda_error(L));
    if (!rc) rc = eval_acc_add(&a, logits, b.labels, (size_t)m);
    scored += m;
    data_batch_free(&b);
  }
  if (!rc) rc = eval_acc_result(&a, logloss, acc, auc);
  eval_acc_close(&a);
  L->phase[PHASE_EVAL] += clock_mono_s() - t0;
  return rc;
}

#define DIGEST_ROWS 65536 /* device rows read back per copy */

/* SHA-256 of the dense parameters, then of every row as (key, row) in key
 * order -- the device's rows read back in pieces on device = cuda.  0 or
 * ERR_CUDA / -ENOMEM. */
static int digest(local_t *L, char hex[65]) {
  uint8_t h[32];
  unsigned hl = 0;
  int rc = 0;
  float *buf = L->tables ? NULL : malloc(DIGEST_ROWS * L->row_floats * sizeof(float));
  if (!L->tables && !buf) return -ENOMEM;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, model_dev_params(L->model), model_dev_n_params(L->model) * sizeof(float));
  for (uint32_t t = 0; t < L->layout.n_tables && !rc; t++) {
    uint32_t rf = table_row_floats(&L->layout, t);
    uint64_t rows = L->layout.tables[t].rows;
    for (uint64_t r0 = 0; r0 < rows && !rc; r0 += DIGEST_ROWS) {
      uint64_t m = rows - r0 < DIGEST_ROWS ? rows - r0 : DIGEST_ROWS;
      const float *p = L->tables ? L->tables[t] + r0 * rf : buf;
#ifdef CHANTER_CUDA
      if (L->ed && (rc = embdev_read_rows(L->ed, t, r0, m, buf)) != 0) break;
#endif
      for (uint64_t r = 0; r < m; r++) {
        uint64_t key = TABLE_KEY(t, r0 + r);
        EVP_DigestUpdate(md, &key, 8);
        EVP_DigestUpdate(md, p + r * rf, rf * sizeof(float));
      }
    }
  }
  EVP_DigestFinal_ex(md, h, &hl);
  EVP_MD_CTX_free(md);
  free(buf);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
  return rc;
}

/* A run of train_local: what the job asks for, and what the run measured. */
typedef struct run_s {
  uint64_t iters, eval_every, eval_batches;
  uint64_t eval_samples; /* each evaluation scores these test samples, each at most once */
  uint64_t tail_start;   /* the train logloss is the mean over iterations tail_start.. (jobrule_train_tail) */
  uint64_t samples, train_n;
  double seconds, train_loss_sum, sps, train_ll;
  double test_ll, test_acc, test_auc; /* NAN until an evaluation ran */
  uint32_t dev_tables;                /* device = cuda: the tables on the GPU, and their MiB */
  double dev_mib;
  char notes[2][JOBRULE_NOTE_MAX]; /* jobrule_batch_notes */
  int n_notes;
  char hex[65], dense_hex[65], ll_def[256];
} run_t;

/* What the job will do, on stderr before it starts. */
static void say_job(const cfg_t *cfg, const local_t *L, const data_stats_t *ds, const run_t *r, int quiet) {
  if (!quiet)
    fprintf(stderr, "train --local: %s, dataset %s (%" PRIu64 " train / %" PRIu64 " test samples), batch %u, %" PRIu64
                    " iterations, optimizer %s / %s\n",
            model_dev_describe(L->model), cfg_str(cfg, "dataset"), ds->train_samples, ds->test_samples, L->batch_size,
            r->iters, cfg_str(cfg, "optimizer"), cfg_str(cfg, "embedding_optimizer"));
  if (!quiet || blas_cpu_by() == BLAS_CPU_NOT_FIXED) fprintf(stderr, "train --local: blas: %s\n", blas_cpu_describe());
  if (!quiet && L->ed)
    fprintf(stderr, "train --local: embedding tables: %u of %u on the GPU (%.1f MiB), %u in host memory (trainer.device_mb = %lld)\n",
            r->dev_tables, L->layout.n_tables, r->dev_mib, L->layout.n_tables - r->dev_tables,
            (long long)cfg_int(cfg, "trainer.device_mb"));
}

/* The iterations, the next batches read while each step runs (reader_t),
 * with the evaluations eval_every asks for and the progress line on
 * stderr; r->seconds is the time they took.  0, or an error with err. */
static int train_loop(local_t *L, const cfg_t *cfg, int quiet, run_t *r, char *err, size_t n) {
  int tty = isatty(2), rc;
  double t_start = clock_mono_s(), last_print = 0, loss_window = 0;
  uint64_t window_n = 0;
  reader_t rd;
  if ((rc = reader_start(&rd, L, reader_threads(cfg), r->iters)) != 0) snprintf(err, n, "out of memory");
  for (uint64_t it = 0; it < r->iters && !rc; it++) {
    double t0 = clock_mono_s();
    data_batch_t b;
    if ((rc = reader_take(&rd, it, &b, err, n)) != 0) break;
    L->phase[PHASE_DATA] += clock_mono_s() - t0; /* the wait: what reading costs beyond the step it overlaps */
    int eval_now = r->eval_every && (it + 1) % r->eval_every == 0 && it + 1 < r->iters;
    double loss = step(L, &b);
    if (isnan(loss)) {
      const char *why = local_cuda_error(L);
      if (!strcmp(cfg_str(cfg, "device"), "cuda"))
        snprintf(err, n, "iteration %" PRIu64 ": the cuda model step failed (%s)", it,
                 why[0] ? why : "a CUDA call failed, or the loss is NaN: lower learning_rate?");
      else
        snprintf(err, n, "iteration %" PRIu64 ": the cpu model step failed (loss is NaN: lower learning_rate?)", it);
      data_batch_free(&b);
      rc = -EIO;
      break;
    }
    r->samples += b.n;
    loss_window += loss;
    window_n += b.n;
    if (it >= r->tail_start) {
      r->train_loss_sum += loss / b.n;
      r->train_n++;
    }
    data_batch_free(&b);
    if (eval_now) {
      if ((rc = evaluate(L, r->eval_samples, &r->test_ll, &r->test_acc, &r->test_auc, err, n)) != 0) break;
      if (!quiet)
        fprintf(stderr, "%seval at iteration %" PRIu64 ": test logloss %.4f  AUC %.4f  accuracy %.4f (scored %" PRIu64
                        " test samples)\n",
                tty ? "\n" : "", it + 1, r->test_ll, r->test_auc, r->test_acc, r->eval_samples);
    }
    double now = clock_mono_s();
    if (!quiet && (now - last_print > (tty ? 0.2 : 5.0) || it + 1 == r->iters)) {
      double el = now - t_start, sps = r->samples / el;
      train_progress(tty, it + 1, r->iters, sps, window_n ? loss_window / window_n : 0,
                     sps > 0 ? (r->iters - it - 1) * L->batch_size / sps : 0);
      last_print = now;
      loss_window = 0;
      window_n = 0;
    }
  }
  reader_stop(&rd); /* a failed step may leave reads under way */
  if (!quiet && tty) fputc('\n', stderr);
  r->seconds = clock_mono_s() - t_start;
  return rc;
}

/* r->hex (digest()) and r->dense_hex, the SHA-256 of the dense parameters. */
static int digests(local_t *L, run_t *r) {
  int rc = digest(L, r->hex);
  if (rc) return rc;
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(model_dev_params(L->model), model_dev_n_params(L->model) * sizeof(float), h, &hl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(r->dense_hex + 2 * i, 3, "%02x", h[i]);
  return 0;
}

/* A figure of summary.json: 6 decimals (its format from the start: sb_num
 * writes %.10g), or null for NaN (no evaluation ran). */
static const char *fixed6(char buf[32], double v) {
  if (isnan(v) || isinf(v)) return "null";
  snprintf(buf, 32, "%.6f", v);
  return buf;
}

/* summary.json (the same text --json prints). */
static void summary_json(sbuf_t *b, const cfg_t *cfg, const local_t *L, const run_t *r) {
  char j_tl[32], j_ll[32], j_auc[32], j_acc[32];
  sb_printf(b,
            "{\"mode\": \"local\", \"model\": \"%s\", \"iterations\": %" PRIu64 ", \"batch_size\": %u, "
            "\"samples_per_sec\": %.1f, \"train_logloss\": %s, \"test_logloss\": %s, \"test_auc\": %s, "
            "\"test_accuracy\": %s, \"digest\": \"%s\", \"dense_sha256\": \"%s\", \"seconds\": %.3f, "
            "\"train_logloss_iterations\": %" PRIu64 ", ",
            cfg_str(cfg, "model"), r->iters, L->batch_size, r->sps, fixed6(j_tl, r->train_ll), fixed6(j_ll, r->test_ll),
            fixed6(j_auc, r->test_auc), fixed6(j_acc, r->test_acc), r->hex, r->dense_hex, r->seconds,
            jobrule_train_tail(r->iters));
  sb_str(b, "train_logloss_definition", r->ll_def);
  if (r->eval_batches) sb_printf(b, ", \"test_samples_scored\": %" PRIu64, r->eval_samples);
  else sb_printf(b, ", \"test_samples_scored\": null");
  if (L->ed)
    sb_printf(b, ", \"device_tables\": %u, \"device_tables_mib\": %.1f, \"host_tables\": %u", r->dev_tables, r->dev_mib,
              L->layout.n_tables - r->dev_tables);
  sb_printf(b, ", \"blas\": {");
  sb_str(b, "core", blas_cpu_core());
  sb_printf(b, ", \"chosen_by\": \"%s\", ", blas_cpu_by_name(blas_cpu_by()));
  sb_str(b, "line", blas_cpu_describe());
  sb_printf(b, "}, \"warnings\": [");
  for (int k = 0; k < r->n_notes; k++) {
    if (k) sb_printf(b, ", ");
    sb_str_value(b, r->notes[k]);
  }
  sb_printf(b, "], \"phase_seconds_per_iteration\": {");
  for (size_t k = 0; k < N_LOCAL_PHASES; k++)
    sb_printf(b, "%s\"%s\": %.6f", k ? ", " : "", phase_name(local_phases[k]),
              r->iters ? L->phase[local_phases[k]] / (double)r->iters : 0);
  sb_printf(b, "}}\n");
}

/* The summary for a person, on stdout. */
static void print_summary(const local_t *L, const run_t *r) {
  printf("iterations        %" PRIu64 " (batch %u)\n", r->iters, L->batch_size);
  printf("samples/s         %.0f\n", r->sps);
  printf("train logloss     %.4f (%s)\n", r->train_ll, r->ll_def);
  if (r->eval_batches)
    printf("test logloss      %.4f (scored %" PRIu64 " test samples)\n", r->test_ll, r->eval_samples);
  else printf("test logloss/AUC  none (no evaluation ran: eval_batches = 0)\n");
  if (r->eval_batches) printf("test AUC          %.4f\n", r->test_auc);
  if (r->eval_batches) printf("test accuracy     %.4f\n", r->test_acc);
  printf("time per phase    ");
  for (size_t k = 0; k < N_LOCAL_PHASES; k++)
    printf("%s%s %.2f ms", k ? ", " : "", phase_name(local_phases[k]),
           r->iters ? 1e3 * L->phase[local_phases[k]] / r->iters : 0);
  printf(" (per iteration)\n");
  if (L->ed)
    printf("embedding tables  %u of %u on the GPU (%.1f MiB), %u in host memory\n", r->dev_tables, L->layout.n_tables,
           r->dev_mib, L->layout.n_tables - r->dev_tables);
  printf("digest            %s\n", r->hex);
}

/* The run after local_open: the loop, the final evaluation, the digests,
 * the summary on stdout and in workdir/summary.json.  0, or 1 after
 * saying why on stderr. */
static int train_run(cli_t *cli, local_t *L, const data_stats_t *ds, const char *workdir, int quiet) {
  char err[1024] = "";
  run_t r;
  memset(&r, 0, sizeof r);
  r.iters = (uint64_t)cfg_int(cli->cfg, "iterations");
  r.eval_every = (uint64_t)cfg_int(cli->cfg, "eval_every");
  r.eval_batches = (uint64_t)cfg_int(cli->cfg, "eval_batches");
  r.test_ll = r.test_acc = r.test_auc = NAN;
  r.dev_tables = local_device_tables(L, &r.dev_mib);
  say_job(cli->cfg, L, ds, &r, quiet);
  /* a batch larger than a split: said once here (and in summary.json), or refused with strict = true; the
   * oracle says the same of a cluster's job */
  int strict = cfg_bool(cli->cfg, "strict");
  r.n_notes = jobrule_batch_notes(L->batch_size, ds->train_samples, ds->test_samples, r.eval_batches, strict, r.notes);
  for (int k = 0; k < r.n_notes; k++)
    fprintf(stderr, "chanter train --local: %s%s\n", strict ? "" : "warning: ", r.notes[k]);
  if (strict && r.n_notes) return 1;
  r.eval_samples = r.eval_batches ? jobrule_eval_samples(r.eval_batches, L->batch_size, ds->test_samples) : 0;
  r.tail_start = r.iters - jobrule_train_tail(r.iters);
  int rc = train_loop(L, cli->cfg, quiet, &r, err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter train --local: %s\n", err);
    return 1;
  }
  if (r.eval_batches &&
      (rc = evaluate(L, r.eval_samples, &r.test_ll, &r.test_acc, &r.test_auc, err, sizeof err)) != 0) {
    fprintf(stderr, "chanter train --local: evaluation: %s\n", err);
    return 1;
  }
  if ((rc = digests(L, &r)) != 0) {
    fprintf(stderr, "chanter train --local: digest: reading the tables back failed: %s\n",
            local_cuda_error(L)[0] ? local_cuda_error(L) : err_str(rc));
    return 1;
  }
  r.sps = r.seconds > 0 ? r.samples / r.seconds : 0;
  r.train_ll = r.train_n ? r.train_loss_sum / r.train_n : NAN;
  jobrule_train_logloss_definition(r.iters, r.ll_def, sizeof r.ll_def);
  sbuf_t b = {0};
  summary_json(&b, cli->cfg, L, &r);
  if (b.oom) {
    fprintf(stderr, "chanter train --local: out of memory\n");
    free(b.s);
    return 1;
  }
  if (cli->json) fputs(b.s, stdout);
  else print_summary(L, &r);
  if (workdir) {
    char path[4096];
    mkdir(workdir, 0755);
    snprintf(path, sizeof path, "%s/summary.json", workdir);
    if ((rc = fsio_replace(path, b.s, b.n, 0666, NULL, 0)) != 0)
      fprintf(stderr, "chanter train --local: cannot write %s: %s\n", path, strerror(-rc));
  }
  free(b.s);
  return rc ? 1 : 0;
}

int train_local(cli_t *cli, const char *workdir, int quiet) {
  char err[1024] = "";
  if (!strcmp(cfg_str(cli->cfg, "device"), "cuda")) {
    /* no silent fallback to the CPU: say why not, and stop (before
     * loading the data, so the refusal is immediate) */
    if (cuda_check(err, sizeof err) < 0) {
      fprintf(stderr, "chanter train --local: %s\n", err);
      return 1;
    }
  }
  local_t L;
  int rc = local_open(&L, cli->cfg, err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter train --local: %s\n", err[0] ? err : err_str(rc));
    local_close(&L);
    return 1;
  }
  data_stats_t ds;
  data_stats(L.data, &ds);
  rc = train_run(cli, &L, &ds, workdir, quiet);
  local_close(&L);
  return rc;
}
