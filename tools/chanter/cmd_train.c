/*
 * chanter train --local: one process, no daemons.
 *
 * Reads the job's dataset with the data module (the same readers the data
 * processors use), keeps every embedding table in memory (rows initialized
 * exactly as the embedding servers would: tbl_init_row from (seed, key)),
 * trains the configured model with the configured optimizers, evaluates on
 * the held-out split, prints a progress bar and a summary, and writes
 * summary.json into --workdir when given.  Same seed, same config ->
 * bit-identical digest (SHA-256 of the dense parameters, then of every
 * embedding row as (key, row) in key order).
 *
 * The distributed `chanter train` (oracle, trainers, embedding servers)
 * arrives with the synchronous-training issue; this is its reference.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "data.h"
#include "err.h"
#include "eval.h"
#include "log.h"
#include "model.h"
#include "nn.h"
#include "opt.h"
#include "table.h"

enum { PH_DATA, PH_GATHER, PH_FWD, PH_BWD, PH_DENSE_OPT, PH_EMB_OPT, PH_EVAL, PH_N };
static const char *phase_names[PH_N] = {"data", "gather", "forward", "backward", "dense_update", "embedding_update",
                                        "eval"};

typedef struct local_s {
  const cfg_t *cfg;
  data_source_t *data;
  const data_schema_t *schema;
  tbl_layout_t layout;
  float **tables;      /* per table: rows x row_floats */
  model_t *model;
  opt_t *dense_opt;
  opt_kind_t emb_kind;
  opt_hparams_t emb_hp;
  uint32_t dim, bs;
  float *emb, *d_emb, *logits;
  uint64_t *uniq;
  float *grad;
  void *work;
  size_t max_ids;
  double phase[PH_N];
} local_t;

static int set_err(char *err, size_t n, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int set_err(char *err, size_t n, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return rc;
}

static int local_open(local_t *L, const cfg_t *cfg, char *err, size_t n) {
  memset(L, 0, sizeof *L);
  L->cfg = cfg;
  int rc = data_open(cfg, &L->data, err, n);
  if (rc) return rc;
  L->schema = data_schema(L->data);
  if ((rc = cfg_layout(cfg, &L->layout, err, n)) != 0) return rc;
  if (L->layout.n_tables != L->schema->n_tables)
    return set_err(err, n, ERR_CONFIG, "the dataset has %u tables but table_rows lists %u", L->schema->n_tables,
                   L->layout.n_tables);
  L->dim = L->layout.tables[0].dim;
  uint64_t total = 0;
  for (uint32_t t = 0; t < L->layout.n_tables; t++) {
    if (L->layout.tables[t].dim != L->dim)
      return set_err(err, n, ERR_CONFIG, "table %u has dim %u but table 0 has %u: the models need one embedding dim", t,
                     L->layout.tables[t].dim, L->dim);
    total += L->layout.tables[t].rows * tbl_row_floats(&L->layout, t);
  }
  if (total * 4 > (UINT64_C(16) << 30))
    return set_err(err, n, -ENOMEM,
                   "the tables need %.1f GiB: too large for train --local (use the distributed trainer)",
                   (double)total * 4 / (1 << 30));
  L->tables = calloc(L->layout.n_tables, sizeof *L->tables);
  if (!L->tables) return -ENOMEM;
  for (uint32_t t = 0; t < L->layout.n_tables; t++) {
    uint32_t rf = tbl_row_floats(&L->layout, t);
    L->tables[t] = malloc(L->layout.tables[t].rows * rf * sizeof(float));
    if (!L->tables[t]) return set_err(err, n, -ENOMEM, "out of memory for table %u", t);
    for (uint64_t r = 0; r < L->layout.tables[t].rows; r++) tbl_init_row(&L->layout, TBL_KEY(t, r), L->tables[t] + r * rf);
  }
  L->bs = (uint32_t)cfg_int(cfg, "batch_size");
  if ((rc = model_create(cfg, L->schema->n_dense, L->schema->n_tables, L->dim, L->bs, &L->model, err, n)) != 0)
    return rc;
  model_init(L->model, (uint64_t)cfg_int(cfg, "seed"));
  if ((rc = opt_create(cfg, model_n_params(L->model), &L->dense_opt)) != 0)
    return set_err(err, n, rc, "optimizer = %s cannot be used for dense parameters", cfg_str(cfg, "optimizer"));
  if ((rc = opt_kind_parse(cfg_str(cfg, "embedding_optimizer"), &L->emb_kind)) != 0) return rc;
  opt_hparams_from_cfg(cfg, L->emb_kind, &L->emb_hp);
  size_t width = (size_t)L->schema->n_tables * L->dim;
  uint32_t max_hot = 1;
  for (uint32_t t = 0; t < L->schema->n_tables; t++)
    if (L->schema->hotness[t] > max_hot) max_hot = L->schema->hotness[t];
  L->max_ids = (size_t)L->bs * max_hot;
  L->emb = malloc((size_t)L->bs * width * sizeof(float));
  L->d_emb = malloc((size_t)L->bs * width * sizeof(float));
  L->logits = malloc((size_t)L->bs * sizeof(float));
  L->uniq = malloc(L->max_ids * sizeof *L->uniq);
  L->grad = malloc(L->max_ids * L->dim * sizeof(float));
  L->work = malloc(nn_embedding_bag_bwd_work_size(L->bs, max_hot));
  if (!L->emb || !L->d_emb || !L->logits || !L->uniq || !L->grad || !L->work) return -ENOMEM;
  return 0;
}

static void local_close(local_t *L) {
  for (uint32_t t = 0; L->tables && t < L->layout.n_tables; t++) free(L->tables[t]);
  free(L->tables);
  free(L->emb);
  free(L->d_emb);
  free(L->logits);
  free(L->uniq);
  free(L->grad);
  free(L->work);
  opt_destroy(L->dense_opt);
  model_destroy(L->model);
  tbl_layout_close(&L->layout);
  data_close(L->data);
}

static void gather(local_t *L, const data_batch_t *b) {
  size_t width = (size_t)b->n_tables * L->dim;
  for (uint32_t t = 0; t < b->n_tables; t++)
    nn_embedding_bag_fwd(L->tables[t], tbl_row_floats(&L->layout, t), b->ids + b->ids_off[t], b->n, b->hotness[t],
                         L->dim, L->emb + (size_t)t * L->dim, width);
}

/* One training step; returns the sum of losses. */
static double step(local_t *L, const data_batch_t *b) {
  double t0 = bench_now();
  gather(L, b);
  double t1 = bench_now();
  model_forward(L->model, b->n, b->dense, L->emb, L->logits);
  double t2 = bench_now();
  double loss = model_backward(L->model, b->n, b->labels, 1.0f / (float)b->n, L->d_emb);
  double t3 = bench_now();
  opt_step_pool(L->dense_opt, model_params(L->model), model_grads(L->model), model_pool(L->model));
  double t4 = bench_now();
  size_t width = (size_t)b->n_tables * L->dim;
  for (uint32_t t = 0; t < b->n_tables; t++) {
    uint32_t rf = tbl_row_floats(&L->layout, t);
    uint32_t u = nn_embedding_bag_bwd(L->d_emb + (size_t)t * L->dim, width, b->ids + b->ids_off[t], b->n, b->hotness[t],
                                      L->dim, L->uniq, L->grad, L->dim, L->work);
    for (uint32_t k = 0; k < u; k++)
      opt_row_update(L->emb_kind, &L->emb_hp, L->tables[t] + L->uniq[k] * rf, L->dim, L->grad + (size_t)k * L->dim);
  }
  double t5 = bench_now();
  L->phase[PH_GATHER] += t1 - t0;
  L->phase[PH_FWD] += t2 - t1;
  L->phase[PH_BWD] += t3 - t2;
  L->phase[PH_DENSE_OPT] += t4 - t3;
  L->phase[PH_EMB_OPT] += t5 - t4;
  return loss;
}

static int evaluate(local_t *L, uint64_t batches, double *logloss, double *acc, double *auc, char *err, size_t n) {
  eval_acc_t a;
  eval_acc_init(&a);
  double t0 = bench_now();
  int rc = 0;
  for (uint64_t x = 0; x < batches && !rc; x++) {
    data_batch_t b;
    if ((rc = data_read_batch(L->data, DATA_TEST, x, L->bs, &b, err, n)) != 0) break;
    gather(L, &b);
    model_forward(L->model, b.n, b.dense, L->emb, L->logits);
    rc = eval_acc_add(&a, L->logits, b.labels, b.n);
    data_batch_free(&b);
  }
  if (!rc) rc = eval_acc_result(&a, logloss, acc, auc);
  eval_acc_close(&a);
  L->phase[PH_EVAL] += bench_now() - t0;
  return rc;
}

static void digest(local_t *L, char hex[65]) {
  uint8_t h[32];
  unsigned hl = 0;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, model_params(L->model), model_n_params(L->model) * sizeof(float));
  for (uint32_t t = 0; t < L->layout.n_tables; t++) {
    uint32_t rf = tbl_row_floats(&L->layout, t);
    for (uint64_t r = 0; r < L->layout.tables[t].rows; r++) {
      uint64_t key = TBL_KEY(t, r);
      EVP_DigestUpdate(md, &key, 8);
      EVP_DigestUpdate(md, L->tables[t] + r * rf, rf * sizeof(float));
    }
  }
  EVP_DigestFinal_ex(md, h, &hl);
  EVP_MD_CTX_free(md);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

static void progress(int tty, uint64_t it, uint64_t total, double sps, double loss, double eta) {
  if (tty) {
    int width = 30, filled = total ? (int)((double)it * width / (double)total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %" PRIu64 "/%" PRIu64 "  %.0f samples/s  loss %.4f  ETA %.0fs   ", bar, it, total, sps, loss,
            eta);
  } else {
    fprintf(stderr, "iteration %" PRIu64 "/%" PRIu64 " samples/s=%.0f loss=%.4f eta_s=%.0f\n", it, total, sps, loss, eta);
  }
}

int cmd_train(cli_t *cli) {
  char err[1024] = "";
  int local = cli_flag(cli, "--local");
  const char *workdir = cli_opt(cli, "--workdir");
  int quiet = cli_flag(cli, "--quiet");
  if (!local) {
    fprintf(stderr, "chanter train: only --local exists yet (the distributed trainer arrives with the oracle)\n");
    return 2;
  }
  if (cli->argc) {
    fprintf(stderr, "chanter train: unexpected argument '%s'\n", cli->argv[0]);
    return 2;
  }
  if (!strcmp(cfg_str(cli->cfg, "device"), "cuda")) {
    fprintf(stderr, "chanter train --local: device = cuda is not available yet: the CUDA model library is not built; "
                    "use device = cpu\n");
    return 1;
  }
  local_t L;
  int rc = local_open(&L, cli->cfg, err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter train --local: %s\n", err[0] ? err : err_str(rc));
    local_close(&L);
    return 1;
  }
  uint64_t iters = (uint64_t)cfg_int(cli->cfg, "iterations"), eval_every = (uint64_t)cfg_int(cli->cfg, "eval_every");
  uint64_t eval_batches = (uint64_t)cfg_int(cli->cfg, "eval_batches");
  data_stats_t ds;
  data_stats(L.data, &ds);
  if (!quiet)
    fprintf(stderr, "train --local: %s, dataset %s (%" PRIu64 " train / %" PRIu64 " test samples), batch %u, %" PRIu64
                    " iterations, optimizer %s / %s\n",
            model_describe(L.model), cfg_str(cli->cfg, "dataset"), ds.train_samples, ds.test_samples, L.bs, iters,
            cfg_str(cli->cfg, "optimizer"), cfg_str(cli->cfg, "embedding_optimizer"));
  int tty = isatty(2);
  double t_start = bench_now(), last_print = 0, loss_window = 0, train_loss_sum = 0;
  uint64_t window_n = 0, samples = 0, train_n = 0;
  double test_ll = NAN, test_acc = NAN, test_auc = NAN;
  for (uint64_t it = 0; it < iters; it++) {
    double t0 = bench_now();
    data_batch_t b;
    if ((rc = data_read_batch(L.data, DATA_TRAIN, it, L.bs, &b, err, sizeof err)) != 0) break;
    L.phase[PH_DATA] += bench_now() - t0;
    double loss = step(&L, &b);
    samples += b.n;
    loss_window += loss;
    window_n += b.n;
    train_loss_sum += loss;
    train_n += b.n;
    data_batch_free(&b);
    if (eval_every && (it + 1) % eval_every == 0 && it + 1 < iters) {
      if ((rc = evaluate(&L, eval_batches, &test_ll, &test_acc, &test_auc, err, sizeof err)) != 0) break;
      if (!quiet)
        fprintf(stderr, "%seval at iteration %" PRIu64 ": test logloss %.4f  AUC %.4f  accuracy %.4f\n", tty ? "\n" : "",
                it + 1, test_ll, test_auc, test_acc);
    }
    double now = bench_now();
    if (!quiet && (now - last_print > (tty ? 0.2 : 5.0) || it + 1 == iters)) {
      double el = now - t_start, sps = samples / el;
      progress(tty, it + 1, iters, sps, window_n ? loss_window / window_n : 0, sps > 0 ? (iters - it - 1) * L.bs / sps : 0);
      last_print = now;
      loss_window = 0;
      window_n = 0;
    }
  }
  if (!quiet && tty) fputc('\n', stderr);
  if (rc) {
    fprintf(stderr, "chanter train --local: %s\n", err);
    local_close(&L);
    return 1;
  }
  double elapsed = bench_now() - t_start;
  if (eval_batches && (rc = evaluate(&L, eval_batches, &test_ll, &test_acc, &test_auc, err, sizeof err)) != 0) {
    fprintf(stderr, "chanter train --local: evaluation: %s\n", err);
    local_close(&L);
    return 1;
  }
  char hex[65];
  digest(&L, hex);
  double sps = elapsed > 0 ? samples / elapsed : 0, train_ll = train_n ? train_loss_sum / train_n : NAN;
  char summary[4096];
  int o = snprintf(summary, sizeof summary,
                   "{\"mode\": \"local\", \"model\": \"%s\", \"iterations\": %" PRIu64 ", \"batch_size\": %u, "
                   "\"samples_per_sec\": %.1f, \"train_logloss\": %.6f, \"test_logloss\": %.6f, \"test_auc\": %.6f, "
                   "\"test_accuracy\": %.6f, \"digest\": \"%s\", \"seconds\": %.3f, \"phase_seconds_per_iteration\": {",
                   cfg_str(cli->cfg, "model"), iters, L.bs, sps, train_ll, test_ll, test_auc, test_acc, hex, elapsed);
  for (int p = 0; p < PH_N; p++)
    o += snprintf(summary + o, sizeof summary - (size_t)o, "%s\"%s\": %.6f", p ? ", " : "", phase_names[p],
                  iters ? L.phase[p] / (double)iters : 0);
  snprintf(summary + o, sizeof summary - (size_t)o, "}}\n");
  if (cli->json) {
    fputs(summary, stdout);
  } else {
    printf("iterations        %" PRIu64 " (batch %u)\n", iters, L.bs);
    printf("samples/s         %.0f\n", sps);
    printf("train logloss     %.4f (mean over all iterations)\n", train_ll);
    printf("test logloss      %.4f\n", test_ll);
    printf("test AUC          %.4f\n", test_auc);
    printf("test accuracy     %.4f\n", test_acc);
    printf("time per phase    ");
    for (int p = 0; p < PH_N; p++) printf("%s%s %.2f ms", p ? ", " : "", phase_names[p], iters ? 1e3 * L.phase[p] / iters : 0);
    printf(" (per iteration)\n");
    printf("digest            %s\n", hex);
  }
  if (workdir) {
    char path[4096];
    mkdir(workdir, 0755);
    snprintf(path, sizeof path, "%s/summary.json", workdir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(summary, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "chanter train --local: cannot write %s: %s\n", path, strerror(errno));
      local_close(&L);
      return 1;
    }
  }
  local_close(&L);
  return 0;
}
