/*
 * trainer_step: the math of one training step (contract in trainer_step.h)
 * -- the key path's row array, the cache's slot array and compact
 * per-slot gradients, forward / backward / optimizer over them, on the CPU
 * here and on the GPU through tcache_cuda.h and model_dev.h, whose calls
 * sit in #ifdef CHANTER_CUDA branches next to the C loops they mirror.
 * Plain arrays in, plain arrays out: trainer_exec.c, trainer_pipeline.c
 * and trainer_eval.c call it with the lists trainer_work.h decoded.
 */
#include "trainer_step.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embag.h"
#include "err.h"
#include "model_dev.h"
#include "nn.h"
#include "pool.h"
#ifdef CHANTER_CUDA
#include "tcache_cuda.h"
#endif

/* The calling thread's part in the cache (trainer_step_cache_thread). */
static _Thread_local int g_role = TRAINER_STEP_ROLE_TRAIN;

struct trainer_step_s {
  uint32_t n_dense, n_tables, dim, rf, max_batch, max_hot;
  uint32_t *hotness;  /* n_tables */
  table_layout_t layout;
  model_dev_t *md;     /* the model on its device */
  model_t *model; /* device = cpu: md's model; else NULL */
  int cuda;       /* device = cuda: the cache in GPU memory (tcache_cuda.h) */
  int coll_on_device; /* the dense all-reduce works on model_dev_grads_dev (trainer_step_set_collective_on_device) */
  int logits_pending; /* device = cuda: the last training forward's logits are still on the device */
#ifdef CHANTER_CUDA
  tcache_cuda_t *dc;
#endif
  uint32_t *aslots[TRAINER_STEP_ROLES]; /* compacted slot lists (trainer_step_cache_update on the GPU), per thread role */
  size_t cap_aslots[TRAINER_STEP_ROLES];
  float *ugrads;                 /* the rows updated by trainer_step_cache_update, compact (device = cuda) */
  size_t cap_ugrads;
  pthread_mutex_t dev_mu;        /* the three below (any thread may record a failure) */
  int dev_mu_ok;
  int dev_rc;                    /* the first device failure since trainer_step_device_status */
  char dev_err[512];
  opt_t *dense_opt;
  opt_kind_t emb_kind;
  opt_hparams_t emb_hp;

  /* the key path: the step's sorted keys and their rows */
  uint64_t *keys;
  float *rows, *grad; /* n_keys x rf, n_keys x dim */
  uint8_t *touched;   /* n_keys: the key has a gradient this step */
  size_t n_keys, cap_keys;

  /* one batch */
  uint64_t *idx;     /* ids mapped to key indices or cache slots, same layout as ids (max_batch samples) */
  float *emb, *d_emb, *logits;
  uint64_t *uniq;
  float *ugrad;
  void *work;
  embag_t *eb;          /* the per-table pooling / fold on the model's threads (device = cpu) */
  const uint64_t **tidx; /* n_tables: table t's part of idx for embag */
  float **tbase;         /* n_tables: the row array (rows or crows) for embag */
  long *bad;             /* n_tables: map_and_pool's first unmapped id of table t, or -1 */
  uint32_t fwd_n;    /* n of the last forward (-1: none) */
  int fwd_ok;

  /* batch keys */
  uint64_t *bkeys;
  size_t cap_bkeys;

  /* the cache: rows of cache_rows slots; the step's gradients compact:
   * cslot[i] has gradient cgrad[i*dim..], cidx[slot] = i or -1 */
  float *crows;
  uint64_t cache_rows;
  int32_t *cidx;
  uint32_t *cslot;
  float *cgrad;
  uint8_t *cskip;
  size_t n_c, cap_c;
  int cache_mode; /* the last forward was trainer_step_cache_forward */

  /* tables whose pooled embeddings the caller supplies (table_strategy =
   * partition: trainer_step_set_partitioned); NULL = none */
  uint8_t *partitioned;
  int partitioned_dev; /* device = cuda: the caller writes their columns of the device input itself
                  (trainer_step_set_partitioned_on_device) */
};

int trainer_step_create(const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout, uint32_t max_batch,
                 trainer_step_t **out, char *err, size_t err_len) {
  *out = NULL;
  if (layout->n_tables != schema->n_tables || !layout->n_tables)
    return err_set(err, err_len, ERR_CONFIG, "the data schema has %u tables but table_rows lists %u",
                   schema->n_tables, layout->n_tables);
  trainer_step_t *ts = calloc(1, sizeof *ts);
  if (!ts) return -ENOMEM;
  if (pthread_mutex_init(&ts->dev_mu, NULL) != 0) {
    free(ts);
    return -ENOMEM;
  }
  ts->dev_mu_ok = 1;
  int rc = 0;
  ts->n_dense = schema->n_dense;
  ts->n_tables = schema->n_tables;
  ts->dim = layout->tables[0].dim;
  ts->rf = table_row_floats(layout, 0);
  ts->max_batch = max_batch;
  for (uint32_t t = 0; t < layout->n_tables; t++) {
    if (layout->tables[t].dim != ts->dim) {
      rc = err_set(err, err_len, ERR_CONFIG,
                   "table %u has dim %u but table 0 has %u: the models need one embedding dim", t,
                   layout->tables[t].dim, ts->dim);
      goto fail;
    }
    if (table_row_floats(layout, t) != ts->rf) {
      rc = err_set(err, err_len, ERR_CONFIG, "table %u has %u floats per row but table 0 has %u", t,
                   table_row_floats(layout, t), ts->rf);
      goto fail;
    }
  }
  if ((rc = table_layout_copy(&ts->layout, layout)) != 0) goto fail;
  ts->hotness = malloc(ts->n_tables * sizeof *ts->hotness);
  if (!ts->hotness) {
    rc = -ENOMEM;
    goto fail;
  }
  size_t ids_per_sample = 0;
  ts->max_hot = 1;
  for (uint32_t t = 0; t < ts->n_tables; t++) {
    ts->hotness[t] = schema->hotness[t];
    ids_per_sample += schema->hotness[t];
    if (schema->hotness[t] > ts->max_hot) ts->max_hot = schema->hotness[t];
  }
  if ((rc = model_dev_create(cfg, ts->n_dense, ts->n_tables, ts->dim, max_batch, &ts->md, err, err_len)) != 0) goto fail;
  model_dev_init(ts->md, (uint64_t)cfg_int(cfg, "seed"));
  ts->model = model_dev_cpu_model(ts->md);
  ts->cuda = model_dev_is_cuda(ts->md);
  if ((rc = opt_create(cfg, model_dev_n_params(ts->md), &ts->dense_opt)) != 0) {
    rc = err_set(err, err_len, rc, "optimizer = %s cannot be used for dense parameters", cfg_str(cfg, "optimizer"));
    goto fail;
  }
  if ((rc = opt_kind_parse(cfg_str(cfg, "embedding_optimizer"), &ts->emb_kind)) != 0 || ts->emb_kind == OPT_ADAM) {
    rc = err_set(err, err_len, ERR_CONFIG, "embedding_optimizer = %s cannot be used for embedding rows",
                 cfg_str(cfg, "embedding_optimizer"));
    goto fail;
  }
  opt_hparams_from_cfg(cfg, ts->emb_kind, &ts->emb_hp);
  size_t width = (size_t)ts->n_tables * ts->dim, max_ids = (size_t)max_batch * ts->max_hot;
  ts->idx = malloc(((size_t)max_batch * ids_per_sample + 1) * sizeof *ts->idx);
  ts->emb = malloc(((size_t)max_batch * width + 1) * sizeof(float));
  ts->d_emb = malloc(((size_t)max_batch * width + 1) * sizeof(float));
  ts->logits = malloc(((size_t)max_batch + 1) * sizeof(float));
  ts->uniq = malloc((max_ids + 1) * sizeof *ts->uniq);
  ts->ugrad = malloc((max_ids * ts->dim + 1) * sizeof(float));
  ts->work = malloc(nn_embedding_bag_bwd_work_size(max_batch, ts->max_hot) + 8);
  ts->tidx = calloc(ts->n_tables, sizeof *ts->tidx);
  ts->tbase = calloc(ts->n_tables, sizeof *ts->tbase);
  ts->bad = calloc(ts->n_tables, sizeof *ts->bad);
  if (!ts->idx || !ts->emb || !ts->d_emb || !ts->logits || !ts->uniq || !ts->ugrad || !ts->work || !ts->tidx ||
      !ts->tbase || !ts->bad || embag_create(ts->n_tables, ts->hotness, ts->dim, max_batch, &ts->eb) != 0) {
    rc = -ENOMEM;
    goto fail;
  }
  ts->fwd_ok = 0;
  *out = ts;
  return 0;
fail:
  trainer_step_destroy(ts);
  return rc;
}

void trainer_step_destroy(trainer_step_t *ts) {
  if (!ts) return;
  model_dev_destroy(ts->md);
#ifdef CHANTER_CUDA
  tcache_cuda_destroy(ts->dc);
#endif
  for (int r = 0; r < TRAINER_STEP_ROLES; r++) free(ts->aslots[r]);
  free(ts->ugrads);
  if (ts->dev_mu_ok) pthread_mutex_destroy(&ts->dev_mu);
  opt_destroy(ts->dense_opt);
  table_layout_close(&ts->layout);
  free(ts->hotness);
  free(ts->partitioned);
  free(ts->keys);
  free(ts->rows);
  free(ts->grad);
  free(ts->touched);
  free(ts->idx);
  free(ts->emb);
  free(ts->d_emb);
  free(ts->logits);
  free(ts->uniq);
  free(ts->ugrad);
  free(ts->work);
  embag_destroy(ts->eb);
  free(ts->tidx);
  free(ts->tbase);
  free(ts->bad);
  free(ts->bkeys);
  free(ts->crows);
  free(ts->cidx);
  free(ts->cslot);
  free(ts->cgrad);
  free(ts->cskip);
  free(ts);
}

model_t *trainer_step_model(trainer_step_t *ts) { return ts->model; }
struct pool_s *trainer_step_pool(trainer_step_t *ts) { return model_dev_pool(ts->md); }
float *trainer_step_params(trainer_step_t *ts) { return model_dev_params(ts->md); }
float *trainer_step_grads(trainer_step_t *ts) { return model_dev_grads(ts->md); }
size_t trainer_step_n_params(const trainer_step_t *ts) { return model_dev_n_params(ts->md); }
int trainer_step_is_cuda(const trainer_step_t *ts) { return ts->cuda; }
void trainer_step_cache_thread(int role) { g_role = role >= 0 && role < TRAINER_STEP_ROLES ? role : TRAINER_STEP_ROLE_TRAIN; }

/* Records the first device failure (rc, "what: the device's message"). */
static void dev_fail(trainer_step_t *ts, int rc, const char *what, const char *msg) {
  pthread_mutex_lock(&ts->dev_mu);
  if (!ts->dev_rc) {
    ts->dev_rc = rc;
    snprintf(ts->dev_err, sizeof ts->dev_err, "%s: %s", what, msg);
  }
  pthread_mutex_unlock(&ts->dev_mu);
}

int trainer_step_device_status(trainer_step_t *ts, char *err, size_t err_len) {
  pthread_mutex_lock(&ts->dev_mu);
  int rc = ts->dev_rc;
  if (rc) err_set(err, err_len, rc, "%s", ts->dev_err);
  ts->dev_rc = 0;
  pthread_mutex_unlock(&ts->dev_mu);
  return rc;
}

int trainer_step_params_changed(trainer_step_t *ts) { return model_dev_params_changed(ts->md); }

void trainer_step_set_collective_on_device(trainer_step_t *ts, int on) { ts->coll_on_device = on != 0; }
float *trainer_step_grads_dev(trainer_step_t *ts) { return model_dev_grads_dev(ts->md); }

int trainer_step_grads_fetch(trainer_step_t *ts) {
  if (!ts->cuda || ts->coll_on_device) return 0;
  return model_dev_grads_to_host(ts->md); /* copies from the device when it is newer */
}

int trainer_step_grads_changed(trainer_step_t *ts) {
  if (!ts->cuda || ts->coll_on_device) return 0;
  return model_dev_grads_changed(ts->md);
}

int trainer_step_dense_sync(trainer_step_t *ts) {
  int rc = model_dev_params_to_host(ts->md);
  return rc ? rc : model_dev_opt_sync(ts->md, ts->dense_opt);
}

int trainer_step_dense_changed(trainer_step_t *ts) {
  int rc = model_dev_params_changed(ts->md);
  return rc ? rc : model_dev_opt_changed(ts->md, ts->dense_opt);
}

/* The dense optimizer step on the model's device (model_dev_opt_step). */
static void dense_step(trainer_step_t *ts) {
  int rc = model_dev_opt_step(ts->md, ts->dense_opt);
  if (rc) dev_fail(ts, rc, "the dense optimizer step on the GPU", err_str(rc));
}

opt_t *trainer_step_dense_opt(trainer_step_t *ts) { return ts->dense_opt; }
uint32_t trainer_step_dim(const trainer_step_t *ts) { return ts->dim; }
uint32_t trainer_step_row_floats(const trainer_step_t *ts) { return ts->rf; }
uint32_t trainer_step_max_batch(const trainer_step_t *ts) { return ts->max_batch; }
size_t trainer_step_n_keys(const trainer_step_t *ts) { return ts->n_keys; }
const uint64_t *trainer_step_keys(const trainer_step_t *ts) { return ts->keys; }
float *trainer_step_key_rows(trainer_step_t *ts) { return ts->rows; }
const float *trainer_step_logits(trainer_step_t *ts) {
  if (ts->logits_pending) { /* the training forward left them on the device (no wait there) */
    int rc = model_dev_logits(ts->md, ts->fwd_n, ts->logits);
    if (rc) dev_fail(ts, rc, "copying the logits from the GPU", err_str(rc));
    ts->logits_pending = 0;
  }
  return ts->logits;
}

/* ---------------------------------------------------------------- batches */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = nc;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int trainer_step_batch_keys(trainer_step_t *ts, const data_batch_t *b, const uint64_t **keys, size_t *n) {
  size_t total = b->n ? b->ids_off[ts->n_tables] : 0;
  if (grow((void **)&ts->bkeys, &ts->cap_bkeys, total + 1, sizeof *ts->bkeys)) return -ENOMEM;
  size_t k = 0;
  for (uint32_t t = 0; t < ts->n_tables && b->n; t++)
    for (size_t i = b->ids_off[t]; i < b->ids_off[t + 1]; i++) ts->bkeys[k++] = TABLE_KEY(t, b->ids[i]);
  qsort(ts->bkeys, k, sizeof *ts->bkeys, cmp_u64);
  size_t u = 0;
  for (size_t i = 0; i < k; i++)
    if (!u || ts->bkeys[u - 1] != ts->bkeys[i]) ts->bkeys[u++] = ts->bkeys[i];
  *keys = ts->bkeys;
  *n = u;
  return 0;
}

/* ---------------------------------------------------------------- the key path's keys */

int trainer_step_set_keys(trainer_step_t *ts, const uint64_t *keys, size_t n, float **rows, char *err, size_t err_len) {
  if (n > ts->cap_keys) {
    size_t nc = ts->cap_keys ? ts->cap_keys : 1024;
    while (nc < n) nc *= 2;
    uint64_t *k = realloc(ts->keys, nc * sizeof *k);
    if (k) ts->keys = k;
    float *r = realloc(ts->rows, nc * ts->rf * sizeof(float));
    if (r) ts->rows = r;
    float *g = realloc(ts->grad, nc * ts->dim * sizeof(float));
    if (g) ts->grad = g;
    uint8_t *tch = realloc(ts->touched, nc);
    if (tch) ts->touched = tch;
    if (!k || !r || !g || !tch) return err_set(err, err_len, -ENOMEM, "out of memory for %zu rows", n);
    ts->cap_keys = nc;
  }
  ts->n_keys = 0;
  ts->fwd_ok = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t k = keys[i];
    if (i && k <= ts->keys[i - 1])
      return err_set(err, err_len, -EINVAL, "fetch keys are not strictly ascending at index %zu (%#" PRIx64
                     " after %#" PRIx64 ")", i, k, ts->keys[i - 1]);
    if (TABLE_ID(k) >= ts->n_tables)
      return err_set(err, err_len, -EINVAL, "fetch key %#" PRIx64 " names table %u; the job has %u tables", k,
                     TABLE_ID(k), ts->n_tables);
    ts->keys[i] = k;
  }
  ts->n_keys = n;
  if (n) memset(ts->touched, 0, n);
  *rows = ts->rows;
  return 0;
}

long trainer_step_key_index(const trainer_step_t *ts, uint64_t key) {
  size_t lo = 0, hi = ts->n_keys;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ts->keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ts->n_keys && ts->keys[lo] == key ? (long)lo : -1;
}

/* ---------------------------------------------------------------- the cache */

int trainer_step_cache_init(trainer_step_t *ts, uint64_t cache_rows, char *err, size_t err_len) {
  if (cache_rows == 0 || cache_rows > UINT32_MAX)
    return err_set(err, err_len, ERR_CONFIG, "cache_rows = %" PRIu64 " is not in [1, 2^32)", cache_rows);
  free(ts->crows);
  free(ts->cidx);
  ts->crows = NULL;
  ts->cidx = malloc(cache_rows * sizeof *ts->cidx);
  if (ts->cuda) {
#ifdef CHANTER_CUDA
    tcache_cuda_destroy(ts->dc);
    ts->dc = NULL;
    int rc = tcache_cuda_create(cache_rows, ts->rf, ts->dim, ts->n_tables, ts->hotness, ts->max_batch, &ts->dc, err, err_len);
    if (rc) return rc;
#endif
  } else {
    ts->crows = calloc(cache_rows, (size_t)ts->rf * sizeof(float));
  }
  if ((!ts->cuda && !ts->crows) || !ts->cidx)
    return err_set(err, err_len, -ENOMEM, "out of memory for a cache of %" PRIu64 " rows of %u floats (%.1f GiB)",
                   cache_rows, ts->rf, (double)cache_rows * ts->rf * 4 / (1 << 30));
  memset(ts->cidx, 0xff, cache_rows * sizeof *ts->cidx);
  ts->cache_rows = cache_rows;
  ts->n_c = 0;
  return 0;
}

uint64_t trainer_step_cache_size(const trainer_step_t *ts) { return ts->cache_rows; }
float *trainer_step_cache_rows(trainer_step_t *ts) { return ts->crows; }

/* Checks slots[0..n) < cache_rows: 0 or ERR_BADMSG naming what and the
 * index (the oracle's lists were checked when they arrived; this guards
 * the ids of a forward, which a caller may build itself). */
static int cache_check(const trainer_step_t *ts, const uint32_t *slots, size_t n, const char *what, char *err,
                       size_t err_len) {
  for (size_t i = 0; i < n; i++) {
    uint32_t s = slots[i];
    if (s >= ts->cache_rows)
      return err_set(err, err_len, ERR_BADMSG, "%s[%zu] = slot %u, beyond the cache of %" PRIu64 " rows", what, i, s,
                     ts->cache_rows);
  }
  return 0;
}

/* forget the last step's gradients (touched entries only) */
static void cache_reset(trainer_step_t *ts) {
  for (size_t i = 0; i < ts->n_c; i++) ts->cidx[ts->cslot[i]] = -1;
  ts->n_c = 0;
}

/* The gradient row of slot s, zeroed when new (ASSERTs room: callers grow). */
static float *cache_grad_of(trainer_step_t *ts, uint32_t s) {
  int32_t i = ts->cidx[s];
  if (i < 0) {
    if (ts->n_c == ts->cap_c) {
      size_t nc = ts->cap_c ? ts->cap_c * 2 : 4096;
      uint32_t *cs = realloc(ts->cslot, nc * sizeof *cs);
      if (cs) ts->cslot = cs;
      float *cg = realloc(ts->cgrad, nc * ts->dim * sizeof(float));
      if (cg) ts->cgrad = cg;
      uint8_t *ck = realloc(ts->cskip, nc);
      if (ck) ts->cskip = ck;
      ASSERT(cs && cg && ck); /* a few MB at most; no recovery from here */
      ts->cap_c = nc;
    }
    i = (int32_t)ts->n_c++;
    ts->cidx[s] = i;
    ts->cslot[i] = s;
    ts->cskip[i] = 0;
    memset(ts->cgrad + (size_t)i * ts->dim, 0, ts->dim * sizeof(float));
  }
  return ts->cgrad + (size_t)i * ts->dim;
}

int trainer_step_cache_forward(trainer_step_t *ts, const data_batch_t *b, const uint32_t *slots, char *err, size_t err_len) {
  ts->fwd_ok = 0;
  ts->cache_mode = 1;
  if (b->n > ts->max_batch)
    return err_set(err, err_len, -EINVAL, "%u samples, more than the model's batch of %u", b->n, ts->max_batch);
  if (b->n) {
    size_t n_ids = b->ids_off[ts->n_tables];
    int rc = 0;
    for (uint32_t t = 0; t < ts->n_tables && !rc; t++) /* a partitioned table's ids have no slot */
      if (!(ts->partitioned && ts->partitioned[t]))
        rc = cache_check(ts, slots + b->ids_off[t], b->ids_off[t + 1] - b->ids_off[t], "slots", err, err_len);
    if (rc) return rc;
    for (size_t i = 0; i < n_ids; i++) ts->idx[i] = slots[i];
    const float *emb = ts->emb;
    if (ts->cuda) {
#ifdef CHANTER_CUDA
      /* pooled on the GPU straight into the model's input; an external
       * table (partitioned) is skipped there too: its columns, which the caller
       * wrote into the host input (trainer_step_emb_in), are copied into
       * the device's input (only those columns) */
      if (!ts->partitioned_dev && (rc = model_dev_emb_cols_in(ts->md, b->n, ts->emb, ts->partitioned)) != 0)
        return err_set(err, err_len, rc, "copying the partitioned tables' pooled embeddings to the GPU failed: %s",
                       err_str(rc));
      if ((rc = tcache_cuda_forward_skip(ts->dc, ts->idx, b->n, ts->partitioned, model_dev_emb_dev(ts->md), err, err_len)) != 0)
        return rc;
      emb = model_dev_emb_dev(ts->md);
#endif
    } else {
      /* table by table on the model's threads; a partitioned table (partitioned) is
       * skipped: its columns are the caller's */
      size_t o = 0;
      for (uint32_t t = 0; t < ts->n_tables; t++) {
        ts->tidx[t] = ts->idx + o;
        ts->tbase[t] = ts->crows;
        o += (size_t)b->n * ts->hotness[t];
      }
      embag_fwd(ts->eb, model_dev_pool(ts->md), b->n, ts->tbase, ts->rf, ts->tidx, ts->partitioned, ts->emb);
    }
    /* on the GPU the logits stay there (trainer_step_logits fetches them): no wait */
    if ((rc = model_dev_forward(ts->md, b->n, b->dense, emb, ts->cuda ? NULL : ts->logits)) != 0)
      return err_set(err, err_len, rc, "the model's forward on the GPU failed: %s", err_str(rc));
  }
  ts->logits_pending = ts->cuda;
  ts->fwd_n = b->n;
  ts->fwd_ok = 1;
  return 0;
}

int trainer_step_cache_pack(trainer_step_t *ts, const uint32_t *slots, size_t n, float *buf) {
  for (size_t i = 0; i < n; i++) {
    uint32_t s = slots[i];
    float *dst = buf + i * ts->dim;
    if (s < ts->cache_rows && ts->cidx[s] >= 0)
      memcpy(dst, ts->cgrad + (size_t)ts->cidx[s] * ts->dim, ts->dim * sizeof(float));
    else
      memset(dst, 0, ts->dim * sizeof(float));
  }
  return 0;
}

void trainer_step_cache_unpack(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *buf) {
  for (size_t i = 0; i < n; i++)
    memcpy(cache_grad_of(ts, slots[i]), buf + i * ts->dim, ts->dim * sizeof(float));
}

#ifdef CHANTER_CUDA
/* The row optimizer on the GPU for slots[0..n) (aligned) with grads. */
static void dev_update_rows(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *grads) {
  char e[400];
  int rc = tcache_cuda_update_rows(ts->dc, (tcache_cuda_role_t)g_role, slots, n, grads, ts->emb_kind, &ts->emb_hp, e, sizeof e);
  if (rc) dev_fail(ts, rc, "updating embedding rows on the GPU", e);
}
#endif

size_t trainer_step_cache_update(trainer_step_t *ts, const uint32_t *skip_slots, size_t n_skip) {
  dense_step(ts);
  for (size_t i = 0; i < n_skip; i++) {
    uint32_t s = skip_slots[i];
    if (s < ts->cache_rows && ts->cidx[s] >= 0) ts->cskip[ts->cidx[s]] = 1;
  }
  size_t updated = 0;
  if (ts->cuda) {
#ifdef CHANTER_CUDA
    /* the rows not skipped, compacted in the same order, updated in one call */
    int r = g_role;
    if (grow((void **)&ts->ugrads, &ts->cap_ugrads, (ts->n_c + 1) * ts->dim, sizeof(float)) ||
        grow((void **)&ts->aslots[r], &ts->cap_aslots[r], ts->n_c + 1, sizeof(uint32_t))) {
      dev_fail(ts, -ENOMEM, "updating embedding rows on the GPU", "out of memory");
    } else {
      uint32_t *sl = ts->aslots[r];
      for (size_t i = 0; i < ts->n_c; i++) {
        if (ts->cskip[i]) continue;
        sl[updated] = ts->cslot[i];
        memcpy(ts->ugrads + updated * ts->dim, ts->cgrad + i * ts->dim, ts->dim * sizeof(float));
        updated++;
      }
      dev_update_rows(ts, sl, updated, ts->ugrads);
    }
#endif
  } else {
    /* every slot with a gradient and no cskip, over the model's threads (slots are distinct) */
    updated = embag_update_rows(model_dev_pool(ts->md), ts->emb_kind, &ts->emb_hp, ts->crows, ts->rf, ts->dim, ts->cslot,
                                ts->cgrad, ts->cskip, 0, ts->n_c);
  }
  ts->fwd_ok = 0;
  return updated;
}

void trainer_step_cache_update_rows(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *grads) {
  if (ts->cuda) {
#ifdef CHANTER_CUDA
    dev_update_rows(ts, slots, n, grads);
#endif
    return;
  }
  for (size_t i = 0; i < n; i++)
    opt_row_update(ts->emb_kind, &ts->emb_hp, ts->crows + (size_t)slots[i] * ts->rf, ts->dim,
                   grads + i * ts->dim);
}

void trainer_step_cache_scatter(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *rows) {
  if (ts->cuda) {
#ifdef CHANTER_CUDA
    char e[400];
    int rc = tcache_cuda_scatter(ts->dc, (tcache_cuda_role_t)g_role, slots, n, rows, e, sizeof e);
    if (rc) dev_fail(ts, rc, "copying fetched rows into the GPU cache", e);
#endif
    return;
  }
  for (size_t i = 0; i < n; i++)
    memcpy(ts->crows + (size_t)slots[i] * ts->rf, rows + i * ts->rf, ts->rf * sizeof(float));
}

void trainer_step_cache_gather(trainer_step_t *ts, const uint32_t *slots, size_t n, float *rows) {
  if (ts->cuda) {
#ifdef CHANTER_CUDA
    char e[400];
    int rc = tcache_cuda_gather(ts->dc, (tcache_cuda_role_t)g_role, slots, n, rows, e, sizeof e);
    if (rc) dev_fail(ts, rc, "copying rows out of the GPU cache", e);
#endif
    return;
  }
  for (size_t i = 0; i < n; i++)
    memcpy(rows + i * ts->rf, ts->crows + (size_t)slots[i] * ts->rf, ts->rf * sizeof(float));
}

/* ---------------------------------------------------------------- forward / backward */

/* Maps samples [i0, i0 + n) of b to key indices (ts->idx, same layout as b's ids
 * for those n samples) and pools them into ts->emb. */
typedef struct map_job_s {
  trainer_step_t *ts;
  const data_batch_t *b;
  uint32_t i0, n;
  atomic_uint next;
} map_job_t;

/* Tables taken in turn: table t's ids to key indices (ts->bad[t] = the
 * first one not fetched, else -1). */
static void map_job(void *arg, uint32_t tid, uint32_t nt) {
  (void)tid;
  (void)nt;
  map_job_t *j = arg;
  trainer_step_t *ts = j->ts;
  for (uint32_t t; (t = atomic_fetch_add(&j->next, 1)) < ts->n_tables;) {
    uint32_t h = ts->hotness[t];
    const uint64_t *ids = j->b->ids + j->b->ids_off[t] + (size_t)j->i0 * h;
    uint64_t *idx = (uint64_t *)ts->tidx[t];
    ts->bad[t] = -1;
    for (size_t k = 0; k < (size_t)j->n * h; k++) {
      uint64_t row = ids[k];
      long s = row <= TABLE_ROW_MASK ? trainer_step_key_index(ts, TABLE_KEY(t, row)) : -1;
      if (s < 0) {
        ts->bad[t] = (long)k;
        break;
      }
      idx[k] = (uint64_t)s;
    }
  }
}

static int map_and_pool(trainer_step_t *ts, const data_batch_t *b, uint32_t i0, uint32_t n, char *err, size_t err_len) {
  /* mapping and pooling table by table on the model's threads; the error
   * names the first unmapped id in table order, as a serial loop would */
  size_t o = 0;
  for (uint32_t t = 0; t < ts->n_tables; t++) {
    ts->tidx[t] = ts->idx + o;
    ts->tbase[t] = ts->rows;
    o += (size_t)n * ts->hotness[t];
  }
  map_job_t j = {.ts = ts, .b = b, .i0 = i0, .n = n};
  atomic_init(&j.next, 0);
  pool_run(model_dev_pool(ts->md), map_job, &j);
  for (uint32_t t = 0; t < ts->n_tables; t++) {
    if (ts->bad[t] < 0) continue;
    uint32_t h = ts->hotness[t];
    size_t k = (size_t)ts->bad[t];
    uint64_t row = b->ids[b->ids_off[t] + (size_t)i0 * h + k];
    return err_set(err, err_len, -ENOENT,
                   "sample %zu, table %u: key %#" PRIx64 " (table %u row %" PRIu64
                   ") is not among the %zu rows fetched for this batch",
                   i0 + k / h, t, TABLE_KEY(t, row), t, row, ts->n_keys);
  }
  embag_fwd(ts->eb, model_dev_pool(ts->md), n, ts->tbase, ts->rf, ts->tidx, NULL, ts->emb);
  return 0;
}

int trainer_step_forward(trainer_step_t *ts, const data_batch_t *b, char *err, size_t err_len) {
  ts->fwd_ok = 0;
  ts->cache_mode = 0;
  if (b->n > ts->max_batch)
    return err_set(err, err_len, -EINVAL, "%u samples, more than the model's batch of %u", b->n, ts->max_batch);
  if (b->n) {
    int rc = map_and_pool(ts, b, 0, b->n, err, err_len);
    if (rc) return rc;
    if ((rc = model_dev_forward(ts->md, b->n, b->dense, ts->emb, ts->cuda ? NULL : ts->logits)) != 0)
      return err_set(err, err_len, rc, "the model's forward on the GPU failed: %s", err_str(rc));
  }
  ts->logits_pending = ts->cuda;
  ts->fwd_n = b->n;
  ts->fwd_ok = 1;
  return 0;
}

double trainer_step_backward(trainer_step_t *ts, const data_batch_t *b, uint32_t global_batch_size) {
  ASSERT(ts->fwd_ok);
  ASSERT_OP(b->n, ==, ts->fwd_n);
  if (ts->cache_mode) cache_reset(ts);
  if (!ts->cache_mode && ts->n_keys) {
    memset(ts->grad, 0, ts->n_keys * ts->dim * sizeof(float));
    memset(ts->touched, 0, ts->n_keys);
  }
  if (!b->n) { /* on both sides: the device optimizer reads the device's */
    int rc = model_dev_grads_zero(ts->md);
    if (rc) dev_fail(ts, rc, "zeroing the dense gradients on the GPU", err_str(rc));
    return 0.0;
  }
  /* the same expression as train --local's 1.0f / (float)b->n */
  /* device = cuda in cache mode: the input gradient stays on the GPU for tcache_cuda_backward */
  int on_dev = ts->cuda && ts->cache_mode;
  double loss = model_dev_backward(ts->md, b->n, b->labels, 1.0f / (float)global_batch_size, on_dev ? NULL : ts->d_emb);
  if (isnan(loss) && ts->cuda) dev_fail(ts, ERR_CUDA, "the model's backward on the GPU", "a CUDA call failed");
  /* on the CPU every table's fold runs first, table by table on the model's
   * threads (into embag's per-table buffers); the tables' rows are then
   * taken in table order, as the serial loop did.  External tables are
   * skipped: the caller takes their gradient from trainer_step_d_emb. */
  if (!on_dev) {
    embag_bwd(ts->eb, model_dev_pool(ts->md), b->n, ts->d_emb, ts->tidx, ts->cache_mode ? ts->partitioned : NULL);
  } else if (ts->partitioned && !ts->partitioned_dev) {
    /* on the GPU the input gradient stayed on the device (folded there
     * below, partitioned tables skipped as on the CPU); the partitioned tables'
     * columns come to the host d_emb, where the CPU's backward wrote them,
     * for trainer_step_d_emb */
    int rc = model_dev_demb_cols_out(ts->md, b->n, ts->d_emb, ts->partitioned);
    if (rc) dev_fail(ts, rc, "copying the partitioned tables' input gradient from the GPU", err_str(rc));
  }
  if (ts->cache_mode) {
    for (uint32_t t = 0; t < ts->n_tables; t++) {
      uint32_t u = 0;
      const uint64_t *uniq = ts->uniq;
      const float *ugrad = ts->ugrad;
      if (ts->partitioned && ts->partitioned[t]) continue;
      if (on_dev) {
#ifdef CHANTER_CUDA
        char e[400];
        int rc = tcache_cuda_backward(ts->dc, model_dev_demb_dev(ts->md), t, ts->uniq, ts->ugrad, &u, e, sizeof e);
        if (rc) {
          dev_fail(ts, rc, "folding embedding gradients on the GPU", e);
          u = 0;
        }
#endif
      } else {
        u = embag_table(ts->eb, t, &uniq, &ugrad);
      }
      for (uint32_t k = 0; k < u; k++) {
        /* keys are per table: each slot appears once, and its gradient is
         * exactly the table's coalesced one (copied, as the key path does) */
        memcpy(cache_grad_of(ts, (uint32_t)uniq[k]), ugrad + (size_t)k * ts->dim, ts->dim * sizeof(float));
      }
    }
    return loss;
  }
  for (uint32_t t = 0; t < ts->n_tables; t++) {
    const uint64_t *uniq;
    const float *ugrad;
    uint32_t u = embag_table(ts->eb, t, &uniq, &ugrad);
    for (uint32_t k = 0; k < u; k++) {
      size_t s = (size_t)uniq[k];
      float *g = ts->grad + s * ts->dim;
      const float *src = ugrad + (size_t)k * ts->dim;
      if (ts->touched[s]) { /* keys are per table, so this does not happen; kept for safety */
        for (uint32_t d = 0; d < ts->dim; d++) g[d] += src[d];
      } else {
        memcpy(g, src, ts->dim * sizeof(float));
        ts->touched[s] = 1;
      }
    }
  }
  return loss;
}

/* ---------------------------------------------------------------- update / write-back */

size_t trainer_step_update(trainer_step_t *ts) {
  dense_step(ts);
  /* every touched key's row, over the model's threads */
  size_t updated = embag_update_rows(model_dev_pool(ts->md), ts->emb_kind, &ts->emb_hp, ts->rows, ts->rf, ts->dim, NULL,
                                     ts->grad, ts->touched, 1, ts->n_keys);
  ts->fwd_ok = 0;
  return updated;
}

/* ---------------------------------------------------------------- partitioned tables */

int trainer_step_set_partitioned(trainer_step_t *ts, const uint8_t *partitioned, char *err, size_t err_len) {
  int any = 0;
  for (uint32_t t = 0; partitioned && t < ts->n_tables; t++) any |= partitioned[t] != 0;
  if (!any) {
    free(ts->partitioned);
    ts->partitioned = NULL;
    return 0;
  }
  if (!ts->partitioned && !(ts->partitioned = calloc(ts->n_tables, 1)))
    return err_set(err, err_len, -ENOMEM, "out of memory for the partitioned tables' flags");
  memcpy(ts->partitioned, partitioned, ts->n_tables);
  return 0;
}

void trainer_step_set_partitioned_on_device(trainer_step_t *ts, int on) { ts->partitioned_dev = ts->cuda && on; }
float *trainer_step_emb_dev(trainer_step_t *ts) { return model_dev_emb_dev(ts->md); }
const float *trainer_step_demb_dev(trainer_step_t *ts) { return model_dev_demb_dev(ts->md); }
void trainer_step_row_opt(const trainer_step_t *ts, opt_kind_t *kind, opt_hparams_t *hp) {
  *kind = ts->emb_kind;
  *hp = ts->emb_hp;
}
float *trainer_step_emb_in(trainer_step_t *ts) { return ts->emb; }
void trainer_step_row_update(trainer_step_t *ts, float *row, const float *grad) {
  opt_row_update(ts->emb_kind, &ts->emb_hp, row, ts->dim, grad);
}
const float *trainer_step_d_emb(const trainer_step_t *ts) { return ts->d_emb; }

/* ---------------------------------------------------------------- eval, digest */

int trainer_step_eval(trainer_step_t *ts, const data_batch_t *b, float *out, char *err, size_t err_len) {
  ts->fwd_ok = 0;
  ts->logits_pending = 0; /* the device's logits are the eval's now */
  for (uint32_t i0 = 0; i0 < b->n; i0 += ts->max_batch) {
    uint32_t m = b->n - i0 < ts->max_batch ? b->n - i0 : ts->max_batch;
    int rc = map_and_pool(ts, b, i0, m, err, err_len);
    if (rc) return rc;
    if ((rc = model_dev_forward(ts->md, m, b->dense ? b->dense + (size_t)i0 * ts->n_dense : NULL, ts->emb, out + i0)) != 0)
      return err_set(err, err_len, rc, "the model's forward on the GPU failed: %s", err_str(rc));
  }
  return 0;
}

void trainer_step_dense_sha256(trainer_step_t *ts, uint8_t out[32]) {
  unsigned len = 0;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  ASSERT(md);
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  /* model_dev_params copies the device's parameters over first when they are newer */
  EVP_DigestUpdate(md, model_dev_params(ts->md), model_dev_n_params(ts->md) * sizeof(float));
  EVP_DigestFinal_ex(md, out, &len);
  EVP_MD_CTX_free(md);
}
