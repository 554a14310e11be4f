/*
 * embag: the embedding-table work of a step on the model's threads (see
 * embag.h).  Each table has its own slice of every scratch array (unique
 * rows, summed gradients, the fold's sort buffer), so which thread folds
 * a table never shows in the result.
 */
#include "embag.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "clock.h"
#include "model_dev.h"
#include "nn.h"
#include "pool.h"

struct embag_s {
  uint32_t n_tables, dim, max_batch;
  uint32_t *hotness;
  size_t *uoff;    /* n_tables + 1: table t's unique rows at uniq + uoff[t], gradients at grad + uoff[t] * dim */
  size_t *woff;    /* n_tables + 1: table t's sort buffer at work + woff[t] bytes */
  uint64_t *uniq;
  float *grad;
  unsigned char *work;
  uint32_t *nu;    /* unique rows of table t's last fold */
  float *emb, *d_emb, *logits;
};

/* with_model: also the model's input, its gradient and the logits */
static int create(uint32_t n_tables, const uint32_t *hotness, uint32_t dim, uint32_t max_batch, int with_model,
                  embag_t **out) {
  *out = NULL;
  if (!n_tables || !dim || !max_batch) return -EINVAL;
  embag_t *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->n_tables = n_tables;
  e->dim = dim;
  e->max_batch = max_batch;
  e->hotness = malloc(n_tables * sizeof *e->hotness);
  e->uoff = malloc((n_tables + 1) * sizeof *e->uoff);
  e->woff = malloc((n_tables + 1) * sizeof *e->woff);
  e->nu = calloc(n_tables, sizeof *e->nu);
  if (!e->hotness || !e->uoff || !e->woff || !e->nu) goto fail;
  e->uoff[0] = e->woff[0] = 0;
  for (uint32_t t = 0; t < n_tables; t++) {
    e->hotness[t] = hotness[t];
    e->uoff[t + 1] = e->uoff[t] + (size_t)max_batch * hotness[t];
    e->woff[t + 1] = e->woff[t] + ((nn_embedding_bag_bwd_work_size(max_batch, hotness[t]) + 63) & ~(size_t)63);
  }
  size_t width = (size_t)n_tables * dim;
  e->uniq = malloc((e->uoff[n_tables] + 1) * sizeof *e->uniq);
  e->grad = malloc((e->uoff[n_tables] * dim + 1) * sizeof *e->grad);
  e->work = aligned_alloc(64, e->woff[n_tables] + 64);
  if (!e->uniq || !e->grad || !e->work) goto fail;
  if (with_model) {
    e->emb = malloc(((size_t)max_batch * width + 1) * sizeof(float));
    e->d_emb = malloc(((size_t)max_batch * width + 1) * sizeof(float));
    e->logits = malloc(((size_t)max_batch + 1) * sizeof(float));
    if (!e->emb || !e->d_emb || !e->logits) goto fail;
  }
  *out = e;
  return 0;
fail:
  embag_destroy(e);
  return -ENOMEM;
}

int embag_create(uint32_t n_tables, const uint32_t *hotness, uint32_t dim, uint32_t max_batch, embag_t **out) {
  return create(n_tables, hotness, dim, max_batch, 1, out);
}

int embag_create_tables(uint32_t n_tables, const uint32_t *hotness, uint32_t dim, uint32_t max_batch, embag_t **out) {
  return create(n_tables, hotness, dim, max_batch, 0, out);
}

void embag_destroy(embag_t *e) {
  if (!e) return;
  free(e->hotness);
  free(e->uoff);
  free(e->woff);
  free(e->nu);
  free(e->uniq);
  free(e->grad);
  free(e->work);
  free(e->emb);
  free(e->d_emb);
  free(e->logits);
  free(e);
}

#define HUGE_BYTES ((size_t)2 << 20)

float *embag_rows_alloc(size_t bytes, int zero) {
  if (zero) return calloc(1, bytes ? bytes : 1);
  if (bytes < HUGE_BYTES) return malloc(bytes ? bytes : 1);
  size_t rounded = (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES; /* aligned_alloc wants a multiple */
  float *p = aligned_alloc(HUGE_BYTES, rounded);
  if (!p) return NULL;
  madvise(p, rounded, MADV_HUGEPAGE); /* only advice: 4 KiB pages where it is not taken */
  return p;
}

float *embag_emb(embag_t *e) { return e->emb; }
float *embag_d_emb(embag_t *e) { return e->d_emb; }
float *embag_logits(embag_t *e) { return e->logits; }

uint32_t embag_table(const embag_t *e, uint32_t t, const uint64_t **uniq, const float **grad) {
  if (uniq) *uniq = e->uniq + e->uoff[t];
  if (grad) *grad = e->grad + e->uoff[t] * e->dim;
  return e->nu[t];
}

/* One pool_run over the tables: threads take the next table from next. */
typedef struct job_s {
  embag_t *e;
  uint32_t n;
  float *const *base;
  size_t row_stride;
  const uint64_t *const *idx;
  const uint8_t *skip;
  float *out;         /* fwd */
  const float *d_out; /* bwd */
  int update;         /* bwd: also the row optimizer (cb == NULL), or cb */
  opt_kind_t kind;
  const opt_hparams_t *hp;
  embag_row_cb cb;
  void *ud;
  atomic_uint next;
  atomic_size_t updated;
} job_t;

static void fwd_job(void *arg, uint32_t tid, uint32_t nt) {
  (void)tid;
  (void)nt;
  job_t *j = arg;
  embag_t *e = j->e;
  size_t width = (size_t)e->n_tables * e->dim;
  for (uint32_t t; (t = atomic_fetch_add(&j->next, 1)) < e->n_tables;) {
    if (j->skip && j->skip[t]) continue;
    nn_embedding_bag_fwd(j->base[t], j->row_stride, j->idx[t], j->n, e->hotness[t], e->dim, j->out + (size_t)t * e->dim,
                         width);
  }
}

void embag_fwd(embag_t *e, struct pool_s *pool, uint32_t n, float *const *base, size_t row_stride,
               const uint64_t *const *idx, const uint8_t *skip, float *out) {
  if (!n) return;
  job_t j = {.e = e, .n = n, .base = base, .row_stride = row_stride, .idx = idx, .skip = skip, .out = out};
  atomic_init(&j.next, 0);
  atomic_init(&j.updated, 0);
  pool_run(pool, fwd_job, &j);
}

static void bwd_job(void *arg, uint32_t tid, uint32_t nt) {
  (void)tid;
  (void)nt;
  job_t *j = arg;
  embag_t *e = j->e;
  size_t width = (size_t)e->n_tables * e->dim, updated = 0;
  uint32_t D = e->dim;
  for (uint32_t t; (t = atomic_fetch_add(&j->next, 1)) < e->n_tables;) {
    if (j->skip && j->skip[t]) {
      e->nu[t] = 0;
      continue;
    }
    uint64_t *uniq = e->uniq + e->uoff[t];
    float *grad = e->grad + e->uoff[t] * D;
    uint32_t u = nn_embedding_bag_bwd(j->d_out + (size_t)t * D, width, j->idx[t], j->n, e->hotness[t], D, uniq, grad, D,
                                      e->work + e->woff[t]);
    e->nu[t] = u;
    if (!j->update) continue;
    float *base = j->base[t];
    for (uint32_t k = 0; k < u; k++) {
      if (k + 8 < u) { /* both ends: a row off a line boundary spans two lines */
        const float *p = base + uniq[k + 8] * j->row_stride;
        __builtin_prefetch(p, 1);
        __builtin_prefetch(p + j->row_stride - 1, 1);
      }
      if (j->cb) j->cb(j->ud, t, uniq[k], base + uniq[k] * j->row_stride, grad + (size_t)k * D);
      else opt_row_update(j->kind, j->hp, base + uniq[k] * j->row_stride, D, grad + (size_t)k * D);
    }
    updated += u;
  }
  atomic_fetch_add(&j->updated, updated);
}

/* The fold (and j->update's row step) of every table; returns the rows
 * folded when updating. */
static size_t run_bwd(struct pool_s *pool, job_t *j) {
  atomic_init(&j->next, 0);
  atomic_init(&j->updated, 0);
  if (!j->n) {
    memset(j->e->nu, 0, j->e->n_tables * sizeof *j->e->nu);
    return 0;
  }
  pool_run(pool, bwd_job, j);
  return atomic_load(&j->updated);
}

void embag_bwd(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
               const uint8_t *skip) {
  job_t j = {.e = e, .n = n, .idx = idx, .skip = skip, .d_out = d_out};
  run_bwd(pool, &j);
}

size_t embag_bwd_update(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
                        const uint8_t *skip, float *const *base, size_t row_stride, opt_kind_t kind,
                        const opt_hparams_t *hp) {
  job_t j = {.e = e, .n = n, .idx = idx, .skip = skip, .d_out = d_out, .update = 1, .base = base,
             .row_stride = row_stride, .kind = kind, .hp = hp};
  return run_bwd(pool, &j);
}

size_t embag_bwd_each(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
                      const uint8_t *skip, float *const *base, size_t row_stride, embag_row_cb cb, void *ud) {
  job_t j = {.e = e, .n = n, .idx = idx, .skip = skip, .d_out = d_out, .update = 1, .base = base,
             .row_stride = row_stride, .cb = cb, .ud = ud};
  return run_bwd(pool, &j);
}

typedef struct rows_job_s {
  opt_kind_t kind;
  const opt_hparams_t *hp;
  float *rows;
  size_t row_stride;
  uint32_t dim;
  const uint32_t *at;
  const float *grads;
  const uint8_t *mask;
  uint8_t want;
  size_t n;
  atomic_size_t updated;
} rows_job_t;

static void rows_job(void *arg, uint32_t tid, uint32_t nt) {
  rows_job_t *j = arg;
  size_t lo = j->n * tid / nt, hi = j->n * (tid + 1) / nt, updated = 0;
  for (size_t i = lo; i < hi; i++) {
    if (j->mask && j->mask[i] != j->want) continue;
    size_t r = j->at ? j->at[i] : i;
    opt_row_update(j->kind, j->hp, j->rows + r * j->row_stride, j->dim, j->grads + i * j->dim);
    updated++;
  }
  atomic_fetch_add(&j->updated, updated);
}

size_t embag_update_rows(struct pool_s *pool, opt_kind_t kind, const opt_hparams_t *hp, float *rows,
                         size_t row_stride, uint32_t dim, const uint32_t *at, const float *grads,
                         const uint8_t *mask, uint8_t want, size_t n) {
  if (!n) return 0;
  rows_job_t j = {.kind = kind, .hp = hp, .rows = rows, .row_stride = row_stride, .dim = dim, .at = at,
                  .grads = grads, .mask = mask, .want = want, .n = n};
  atomic_init(&j.updated, 0);
  /* a wake-up costs some microseconds: small lists stay on this thread */
  if (n < 256) rows_job(&j, 0, 1);
  else pool_run(pool, rows_job, &j);
  return atomic_load(&j.updated);
}

double embag_train_step(embag_t *e, struct model_dev_s *md, opt_t *dense_opt, opt_kind_t kind,
                        const opt_hparams_t *hp, float *const *tables, size_t row_stride, uint32_t n,
                        const float *dense, const float *labels, const uint64_t *const *idx, float scale,
                        double sec[EMBAG_PHASES]) {
  struct pool_s *pool = model_dev_pool(md);
  double t0 = clock_mono_s();
  embag_fwd(e, pool, n, tables, row_stride, idx, NULL, e->emb);
  double t1 = clock_mono_s();
  if (model_dev_forward(md, n, dense, e->emb, e->logits)) return NAN;
  double t2 = clock_mono_s();
  double loss = model_dev_backward(md, n, labels, scale, e->d_emb);
  if (isnan(loss)) return NAN;
  double t3 = clock_mono_s();
  if (model_dev_opt_step(md, dense_opt)) return NAN;
  double t4 = clock_mono_s();
  embag_bwd_update(e, pool, n, e->d_emb, idx, NULL, tables, row_stride, kind, hp);
  double t5 = clock_mono_s();
  embag_phases_add(sec, (const double[EMBAG_PHASES + 1]){t0, t1, t2, t3, t4, t5});
  return loss;
}

void embag_phases_add(double sec[EMBAG_PHASES], const double t[EMBAG_PHASES + 1]) {
  if (!sec) return;
  for (int k = 0; k < EMBAG_PHASES; k++) sec[k] += t[k + 1] - t[k];
}
