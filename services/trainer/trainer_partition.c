/*
 * trainer_partition: the partitioned tables (contract in trainer_partition.h).
 *
 * The two buffers of one step, sample-major like the model's input:
 *   gbuf, the owner's side: [global batch x n_mine x dim], the global
 *     samples in trainer order, so rank r's block is contiguous;
 *   lbuf, every rank's side: owner o's block [n x ntab[o] x dim] after
 *     owner o-1's.
 * The forward AlltoAll sends gbuf into lbuf, the backward lbuf into gbuf.
 *
 * A partition_rows table is held by every rank (strategy.h: row r on rank
 * r mod P, at local index r / P), so it is among every rank's n_mine and
 * every owner's block: each rank's gbuf holds its partial sums over the
 * global batch (the ids of other ranks' rows point at one extra local row
 * of zeros, which the fold never updates), and the receiving rank adds the
 * blocks of rank 0, 1, ... in that order.  In the backward every rank gets
 * the whole batch's gradients of those tables and folds its own rows.
 */
#include "trainer_partition.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "embag.h"
#include "embdev.h"
#include "err.h"
#include "log.h"
#include "trainer_state.h"
#include "strategy.h"

#define FLUSH_CHUNK 65536 /* rows per write-back call */

/* table t's rows held here, and the local index of row r (strategy.h) */
static uint64_t local_rows(const trainer_partition_t *p, uint32_t t) {
  return strategy_local_rows(p->owner[t], p->rank, p->P, p->schema->table_rows[t]);
}
static uint64_t local_of(const trainer_partition_t *p, uint32_t t, uint64_t r) {
  return p->owner[t] == STRATEGY_OWNER_ALL ? r / p->P : r;
}
static uint64_t global_of(const trainer_partition_t *p, uint32_t t, uint64_t l) {
  return p->owner[t] == STRATEGY_OWNER_ALL ? l * p->P + p->rank : l;
}

int trainer_partition_init(trainer_partition_t *p, const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                      uint32_t rank, int ideal, char *err, size_t err_len) {
  memset(p, 0, sizeof *p);
  p->T = schema->n_tables;
  p->P = (uint32_t)cfg_int(cfg, "trainers");
  p->rank = rank;
  p->schema = schema;
  p->dim = layout->tables[0].dim;
  p->iterations = (uint64_t)cfg_int(cfg, "iterations");
  atomic_init(&p->final_seen, 0);
  p->rf = table_row_floats(layout, 0);
  p->want_dev = !strcmp(cfg_str(cfg, "device"), "cuda") && strcmp(cfg_str(cfg, "strategy.partition_on_device"), "off");
  if (opt_kind_parse(cfg_str(cfg, "embedding_optimizer"), &p->kind) == 0)
    opt_hparams_from_cfg(cfg, p->kind, &p->hp);
  else
    p->want_dev = 0; /* trainer_step refuses the job anyway */
  uint8_t *strat = malloc(p->T ? p->T : 1);
  if (!strat) return -ENOMEM;
  int rc = strategy_parse(cfg, p->T, strat, err, err_len);
  p->any = !rc && !ideal && strategy_any_partitioned(strat, p->T);
  free(strat);
  if (rc) return rc;
  p->owner = malloc(p->T * sizeof *p->owner);
  p->partitioned = calloc(p->T, 1);
  p->mine = malloc(p->T * sizeof *p->mine);
  p->ntab = calloc(p->P, sizeof *p->ntab);
  p->rows = calloc(p->T, sizeof *p->rows);
  p->loaded = calloc(p->T, sizeof *p->loaded);
  p->dirty = calloc(p->T, sizeof *p->dirty);
  p->last = calloc(p->T, sizeof *p->last);
  p->sb = calloc(p->P, sizeof *p->sb);
  p->rb = calloc(p->P, sizeof *p->rb);
  p->mbase = calloc(p->T, sizeof *p->mbase);
  p->midx = calloc(p->T, sizeof *p->midx);
  p->mhot = calloc(p->T, sizeof *p->mhot);
  p->kof = calloc(p->T, sizeof *p->kof);
  if (!p->kof || !p->owner || !p->partitioned || !p->mine || !p->ntab || !p->rows || !p->loaded || !p->dirty ||
      !p->last || !p->sb || !p->rb ||
      !p->mbase || !p->midx || !p->mhot) {
    trainer_partition_close(p);
    return -ENOMEM;
  }
  return 0;
}

void trainer_partition_reset(trainer_partition_t *p) {
  trainer_partition_writer_stop(p); /* it reads the rows and marks freed here */
  /* (every array: an init that ran out of memory comes here too) */
  for (uint32_t t = 0; p->rows && p->loaded && p->dirty && p->last && t < p->T; t++) {
    free(p->rows[t]);
    free(p->loaded[t]);
    free(p->dirty[t]);
    free(p->last[t]);
    p->rows[t] = NULL;
    p->loaded[t] = p->dirty[t] = NULL;
    p->last[t] = NULL;
  }
  atomic_store(&p->final_seen, 0);
  embag_destroy(p->eb); /* sized for this placement's tables */
#ifdef CHANTER_CUDA
  embdev_set_destroy(p->ds);
#endif
  p->ds = NULL;
  p->direct = 0;
  p->eb = NULL;
  p->eb_batch = 0;
  p->tables_x = 0;
  p->placed = 0;
  p->partitioned_applied = 0;
  p->n_mine = p->n_partitioned = 0;
  p->rows_loaded = p->rows_flushed = p->rows_retired = 0;
}

void trainer_partition_close(trainer_partition_t *p) {
  trainer_partition_reset(p);
  free(p->owner), free(p->partitioned), free(p->mine), free(p->ntab);
  free(p->rows), free(p->loaded), free(p->dirty), free(p->last);
  free(p->sb), free(p->rb);
  free(p->lkeys), free(p->lrows);
  free(p->gbuf), free(p->lbuf), free(p->mbase), free(p->midx), free(p->mhot), free(p->lidx);
  free(p->kof), free(p->ltab), free(p->lat), free(p->fbuf);
  memset(p, 0, sizeof *p);
}

/* device = cuda: this rank's tables in GPU memory (p->ds), or 0 with
 * them left to the host when they do not fit (logged). */
static void place_on_device(trainer_partition_t *p, const trainer_work_step_t *st) {
#ifdef CHANTER_CUDA
  uint32_t n = p->n_mine;
  uint64_t *rows = malloc(n * sizeof *rows), *lim = malloc(n * sizeof *lim);
  uint32_t *hot = malloc(n * sizeof *hot), *col = malloc(n * sizeof *col);
  if (rows && lim && hot && col) {
    /* one trainer: the model's layout [n x T x dim] (no exchange);
     * else gbuf's [B x n_mine x dim] */
    int direct = p->P == 1;
    for (uint32_t k = 0; k < n; k++) {
      uint32_t t = p->mine[k];
      lim[k] = local_rows(p, t);
      rows[k] = lim[k] + (p->owner[t] == STRATEGY_OWNER_ALL); /* partition_rows: the row of zeros */
      hot[k] = p->schema->hotness[t];
      col[k] = direct ? t : k;
    }
    char why[512] = "";
    int rc = embdev_set_create(n, rows, lim, hot, col, (direct ? p->T : n) * p->dim, p->dim, p->kind, &p->hp, &p->ds,
                               why, sizeof why);
    if (rc) {
      p->ds = NULL;
      log_warn("partitioned tables: %u tables of rank %u stay in host memory (strategy.partition_on_device = auto): "
               "%s",
               n, p->rank, why);
    } else {
      p->direct = direct;
      log_info("partitioned tables: %u tables of rank %u in GPU memory (%.1f MiB)%s", n, p->rank,
               (double)embdev_set_bytes(p->ds) / (1 << 20), direct ? ", pooled into the model's input" : "");
    }
  }
  free(rows), free(lim), free(hot), free(col);
  (void)st;
#else
  (void)p;
  (void)st;
#endif
}

/* The first Step's placement: this rank's tables get their arrays. */
static int place(trainer_partition_t *p, const trainer_work_step_t *st, char *err, size_t err_len) {
  memcpy(p->owner, st->partition_owner, p->T * sizeof *p->owner);
  memset(p->ntab, 0, p->P * sizeof *p->ntab);
  p->n_mine = p->n_partitioned = 0;
  for (uint32_t t = 0; t < p->T; t++) {
    uint32_t o = p->owner[t];
    p->partitioned[t] = o != STRATEGY_OWNER_NONE;
    if (o == STRATEGY_OWNER_NONE) continue;
    if (o != STRATEGY_OWNER_ALL && o >= p->P)
      return err_set(err, err_len, ERR_BADMSG, "table %u's owner is trainer %u, only %u trainers", t, o, p->P);
    p->n_partitioned++;
    for (uint32_t q = 0; q < p->P; q++) p->ntab[q] += strategy_holds(o, q);
    if (!strategy_holds(o, p->rank)) continue;
    p->kof[t] = p->n_mine;
    p->mine[p->n_mine++] = t;
  }
  if (p->want_dev && p->n_mine) place_on_device(p, st);
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k], o = p->owner[t];
    uint64_t R = local_rows(p, t); /* partition_rows: and one row of zeros after them */
    if (!p->ds)
      p->rows[t] = o == STRATEGY_OWNER_ALL ? embag_rows_alloc(((size_t)R + 1) * p->rf * sizeof(float), 1)
                                   : embag_rows_alloc((size_t)R * p->rf * sizeof(float), 0);
    p->loaded[t] = calloc((size_t)R + 1, 1);
    p->dirty[t] = calloc((size_t)R + 1, 1);
    /* the last uses, for the writer of retired rows (host rows; iterations + 1 must fit) */
    int track = !p->ds && p->iterations < UINT32_MAX;
    if (track) p->last[t] = calloc((size_t)R + 1, sizeof *p->last[t]);
    if ((!p->ds && !p->rows[t]) || !p->loaded[t] || !p->dirty[t] || (track && !p->last[t]))
      return err_set(err, err_len, -ENOMEM,
                     "out of memory for partitioned table %u (%" PRIu64 " rows, %.1f MiB) on rank %u: give it "
                     "table_strategy = cache, or more trainers",
                     t, R, (double)R * p->rf * 4 / (1 << 20), p->rank);
  }
  p->placed = 1;
  return 0;
}

int trainer_partition_load(trainer_partition_t *p, const trainer_work_step_t *st, embc_t *embc, char *err, size_t err_len) {
  if (!st->partition_owner) {
    if (p->any)
      return err_set(err, err_len, ERR_BADMSG,
                     "iteration %" PRIu64 ": the job partitions tables (table_strategy) but the Step names no owner; "
                     "do the oracle and this trainer read the same job file?",
                     st->iteration);
    return 0;
  }
  if (!p->any)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": the Step partitions tables but this trainer's table_strategy does not; "
                   "do the oracle and this trainer read the same job file?",
                   st->iteration);
  int rc;
  if (!p->placed) {
    if ((rc = place(p, st, err, err_len)) != 0) return rc;
  } else if (memcmp(p->owner, st->partition_owner, p->T * sizeof *p->owner) != 0) {
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": the partitioned tables' owners changed mid-run",
                   st->iteration);
  }
  uint64_t B = st->global_batch_size;
  size_t n = 0, o = 0;
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k];
    size_t m = (size_t)B * p->schema->hotness[t];
    uint32_t *last = p->last[t];
    if (trainer_grow((void **)&p->lkeys, &p->cap_lkeys, n + m, sizeof *p->lkeys))
      return err_set(err, err_len, -ENOMEM, "out of memory listing rows to read");
    for (size_t j = 0; j < m; j++) {
      uint64_t r = st->partition_ids[o + j];
      if (!strategy_holds_row(p->owner[t], p->rank, p->P, r)) continue; /* partition_rows: another rank's */
      uint64_t l = local_of(p, t, r);
      if (last) last[l] = (uint32_t)(st->iteration + 1);
      if (p->loaded[t][l]) continue;
      p->loaded[t][l] = 1;
      p->lkeys[n++] = TABLE_KEY(t, r);
    }
    o += m;
  }
  p->embc = embc;
  /* the job's last Step: every row's last use is known (the writer of
   * retired rows reads last[] from now on; rows this Step reads are not
   * among those it writes before the Step is trained) */
  if (st->iteration + 1 == p->iterations) atomic_store_explicit(&p->final_seen, 1, memory_order_release);
  if (!n) return 0;
  if (trainer_grow((void **)&p->lrows, &p->cap_lrows, n * p->rf, sizeof(float)))
    return err_set(err, err_len, -ENOMEM, "out of memory for %zu rows read", n);
  char why[768] = "";
  if ((rc = embc_lookup(embc, p->lkeys, n, p->lrows, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": reading %zu rows of partitioned tables failed: %s",
                   st->iteration, n, why);
  if (p->ds) {
#ifdef CHANTER_CUDA
    if (trainer_grow((void **)&p->ltab, &p->cap_ltab, n, sizeof *p->ltab) ||
        trainer_grow((void **)&p->lat, &p->cap_lat, n, sizeof *p->lat))
      return err_set(err, err_len, -ENOMEM, "out of memory for %zu rows read", n);
    for (size_t i = 0; i < n; i++) {
      uint32_t t = TABLE_ID(p->lkeys[i]);
      p->ltab[i] = p->kof[t];
      p->lat[i] = local_of(p, t, TABLE_ROW(p->lkeys[i]));
    }
    if ((rc = embdev_set_write_rows(p->ds, n, p->ltab, p->lat, p->lrows)) != 0)
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": copying %zu rows of partitioned tables to the GPU failed: %s",
                     st->iteration, n, embdev_set_error(p->ds));
#endif
    p->rows_loaded += n;
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t t = TABLE_ID(p->lkeys[i]);
    memcpy(p->rows[t] + (size_t)local_of(p, t, TABLE_ROW(p->lkeys[i])) * p->rf, p->lrows + i * p->rf,
           p->rf * sizeof(float));
  }
  p->rows_loaded += n;
  return 0;
}

/* One AlltoAll of send (blocks of p->sb bytes) into recv (p->rb): on c,
 * or as the scheduler's operation `which` of iteration x. */
static int exchange(trainer_partition_t *p, coll_t *c, const float *send, float *recv, uint64_t x, uint32_t which,
                    const char *what, char *err, size_t err_len) {
  int rc = trainer_sched_alltoallv(p->sched, c, trainer_sched_id(TRAINER_SCHED_NEXT, x, which), send, p->sb, recv,
                                   p->rb);
  if (rc)
    return err_set(err, err_len, rc,
                   "iteration %" PRIu64 ": AlltoAll of the partitioned tables' %s among %u trainers failed: %s", x,
                   what, p->P, err_str(rc));
  return 0;
}

/* The partitioned tables' columns of the model's layout [n x T x dim]
 * (model) against lbuf's owner blocks: into lbuf (to_blocks; a
 * partition_rows column into every block), or out of it into model (a
 * partition_rows column: the sum of the blocks, rank 0's first). */
static void columns(const trainer_partition_t *p, uint32_t n, float *model, float *lbuf, int to_blocks) {
  size_t d = p->dim, width = (size_t)p->T * d;
  float *blk = lbuf;
  for (uint32_t q = 0; q < p->P; q++) {
    size_t nq = p->ntab[q], kk = 0;
    for (uint32_t t = 0; t < p->T && kk < nq; t++) {
      if (!strategy_holds(p->owner[t], q)) continue;
      int add = !to_blocks && q > 0 && p->owner[t] == STRATEGY_OWNER_ALL;
      for (uint32_t i = 0; i < n; i++) {
        float *m = model + i * width + t * d, *b = blk + (i * nq + kk) * d;
        if (add)
          for (size_t k = 0; k < d; k++) m[k] += b[k];
        else
          memcpy(to_blocks ? b : m, to_blocks ? m : b, d * sizeof(float));
      }
      kk++;
    }
    blk += (size_t)n * nq * d;
  }
}

/* The byte counts of the two sides for st (sb: forward's send, gbuf;
 * rb: forward's receive, lbuf; the backward swaps them) and room for both
 * buffers.  0 or -ENOMEM. */
static int sizes(trainer_partition_t *p, const trainer_work_step_t *st, uint32_t n, int backward) {
  size_t d = p->dim, w = (size_t)p->n_mine * d, g = 0, l = 0;
  for (uint32_t q = 0; q < p->P; q++) {
    size_t gq = (size_t)st->partition_counts[q] * w * sizeof(float), lq = (size_t)n * p->ntab[q] * d * sizeof(float);
    if (p->direct) gq = lq = 0; /* the rows are pooled into the model's device input: an empty exchange */
    p->sb[q] = backward ? lq : gq;
    p->rb[q] = backward ? gq : lq;
    g += gq, l += lq;
  }
  return trainer_grow((void **)&p->gbuf, &p->cap_g, g / sizeof(float) + 1, sizeof(float)) ||
                 trainer_grow((void **)&p->lbuf, &p->cap_l, l / sizeof(float) + 1, sizeof(float))
             ? -ENOMEM
             : 0;
}

/* This rank's tables for embag: their rows and st's ids (partition_ids: table
 * mine[k]'s B * hotness ids after table mine[k-1]'s), and embag's scratch
 * for a global batch of B.  0 or -ENOMEM. */
static int tables(trainer_partition_t *p, const trainer_work_step_t *st) {
  if (p->tables_x == st->iteration + 1) return 0; /* the backward of the Step the forward mapped */
  uint64_t B = st->global_batch_size;
  size_t o = 0, nmap = 0;
  for (uint32_t k = 0; k < p->n_mine; k++)
    if (p->owner[p->mine[k]] == STRATEGY_OWNER_ALL) nmap += (size_t)B * p->schema->hotness[p->mine[k]];
  if (nmap && trainer_grow((void **)&p->lidx, &p->cap_lidx, nmap, sizeof *p->lidx)) return -ENOMEM;
  nmap = 0;
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k];
    size_t m = (size_t)B * p->schema->hotness[t];
    p->mbase[k] = p->rows[t];
    p->midx[k] = st->partition_ids + o;
    p->mhot[k] = p->schema->hotness[t];
    if (p->owner[t] == STRATEGY_OWNER_ALL) { /* local indices; another rank's row: the row of zeros */
      uint64_t zero = local_rows(p, t), *li = p->lidx + nmap;
      for (size_t j = 0; j < m; j++) {
        uint64_t r = st->partition_ids[o + j];
        li[j] = strategy_holds_row(STRATEGY_OWNER_ALL, p->rank, p->P, r) ? r / p->P : zero;
      }
      p->midx[k] = li;
      nmap += m;
    }
    o += m;
  }
  if (p->n_mine && !p->ds && (!p->eb || p->eb_batch < B)) { /* (on the GPU: embdev_set's buffers) */
    embag_destroy(p->eb);
    p->eb_batch = 0;
    if (embag_create_tables(p->n_mine, p->mhot, p->dim, B ? (uint32_t)B : 1, &p->eb) != 0) {
      p->eb = NULL;
      return -ENOMEM;
    }
    p->eb_batch = B;
  }
  p->tables_x = st->iteration + 1;
  return 0;
}

/* The pool's threads: table k's row step (trainer_step_row_update only
 * reads ts) and its own dirty marks. */
typedef struct row_ctx_s {
  trainer_partition_t *p;
  trainer_step_t *ts;
  atomic_size_t zero_rows; /* folds of the row of zeros (not updates) */
} row_ctx_t;

static void row_update(void *ud, uint32_t k, uint64_t r, float *row, const float *grad) {
  row_ctx_t *c = ud;
  uint32_t t = c->p->mine[k];
  if (c->p->owner[t] == STRATEGY_OWNER_ALL && r == local_rows(c->p, t)) { /* the row of zeros: stays zero */
    atomic_fetch_add(&c->zero_rows, 1);
    return;
  }
  trainer_step_row_update(c->ts, row, grad);
  c->p->dirty[t][r] = 1;
}

/* The host threads of the model (on device = cuda the host's CPUs; NULL:
 * this thread alone). */
static struct pool_s *threads(trainer_step_t *ts) { return trainer_step_pool(ts); }

#ifdef CHANTER_CUDA
/* The dirty marks of the rows the global batch of B uses (p->midx; the
 * row of zeros is never updated): the device path's, whose rows are not
 * visited on the host. */
static void mark_dirty(trainer_partition_t *p, uint64_t B) {
  for (uint32_t k = 0; k < p->n_mine; k++) {
    uint32_t t = p->mine[k];
    uint64_t R = local_rows(p, t);
    const uint64_t *ids = p->midx[k];
    uint8_t *dirty = p->dirty[t];
    for (size_t j = 0, m = (size_t)B * p->mhot[k]; j < m; j++)
      if (ids[j] < R) dirty[ids[j]] = 1;
  }
}
#endif

int trainer_partition_forward(trainer_partition_t *p, trainer_step_t *ts, coll_t *c, const trainer_work_step_t *st,
                         const data_batch_t *b, char *err, size_t err_len) {
  p->t_compute = 0;
  if (!st->partition_owner || !p->n_partitioned) return 0; /* (table_strategy = auto may have partitioned none) */
  int rc;
  if (!p->partitioned_applied) {
    if ((rc = trainer_step_set_partitioned(ts, p->partitioned, err, err_len)) != 0) return rc;
    trainer_step_set_partitioned_on_device(ts, p->direct);
    p->partitioned_applied = 1;
  }
  if (p->direct && st->global_batch_size != b->n)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": the only trainer got %u of a global batch of %" PRIu64 " samples", st->iteration,
                   b->n, (uint64_t)st->global_batch_size);
  double t0 = clock_mono_s();
  if (sizes(p, st, b->n, 0) || tables(p, st))
    return err_set(err, err_len, -ENOMEM, "out of memory for the pooled embeddings");
  /* this rank's tables over the global batch, in trainer order: gbuf [B x n_mine x dim] */
  if (p->ds) {
#ifdef CHANTER_CUDA
    /* on the GPU: into the model's device input (one trainer) or gbuf */
    if ((rc = embdev_set_pool(p->ds, (uint32_t)st->global_batch_size, p->midx, p->direct ? trainer_step_emb_dev(ts) : NULL,
                              p->gbuf, 1)) != 0)
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": pooling the partitioned tables on the GPU failed: %s",
                     st->iteration, embdev_set_error(p->ds));
#endif
  } else if (p->n_mine) {
    embag_fwd(p->eb, threads(ts), (uint32_t)st->global_batch_size, p->mbase, p->rf, p->midx, NULL, p->gbuf);
  }
  double t1 = clock_mono_s();
  p->t_compute = t1 - t0;
  if ((rc = exchange(p, c, p->gbuf, p->lbuf, st->iteration, TRAINER_SCHED_A2A_FWD, "pooled embeddings", err,
                     err_len)) != 0)
    return rc;
  double t2 = clock_mono_s();
  if (!p->direct) columns(p, b->n, trainer_step_emb_in(ts), p->lbuf, 0);
  log_debug("part forward x=%" PRIu64 " pool_ms=%.2f exchange_ms=%.2f unpack_ms=%.2f", st->iteration, 1e3 * (t1 - t0),
            1e3 * (t2 - t1), 1e3 * (clock_mono_s() - t2));
  return 0;
}

int trainer_partition_backward(trainer_partition_t *p, trainer_step_t *ts, coll_t *c, const trainer_work_step_t *st,
                          const data_batch_t *b, size_t *updated, char *err, size_t err_len) {
  *updated = 0;
  if (!st->partition_owner || !p->n_partitioned) return 0;
  double t0 = clock_mono_s();
  /* the gradients of our samples' pooled embeddings, by owner, back to the owners */
  if (sizes(p, st, b->n, 1))
    return err_set(err, err_len, -ENOMEM, "out of memory for the pooled embeddings' gradients");
  if (!p->direct) columns(p, b->n, (float *)trainer_step_d_emb(ts) /* only read: to_blocks */, p->lbuf, 1);
  double t1 = clock_mono_s();
  int rc = exchange(p, c, p->lbuf, p->gbuf, st->iteration, TRAINER_SCHED_A2A_BWD, "gradients", err, err_len);
  if (rc) return rc;
  double t2 = clock_mono_s();
  /* gbuf: [B x n_mine x dim], global samples in trainer order; each
   * table folded per row in that order and its rows updated */
  if (tables(p, st)) return err_set(err, err_len, -ENOMEM, "out of memory folding the partitioned tables' gradients");
  if (p->ds) {
#ifdef CHANTER_CUDA
    /* on the GPU, the same fold order (sorted by row, stable: sample
     * order); the dirty marks from the ids meanwhile (every id's row is
     * folded and updated, but the row of zeros) */
    if ((rc = embdev_set_fold(p->ds, (uint32_t)st->global_batch_size, p->direct ? trainer_step_demb_dev(ts) : NULL,
                              p->gbuf)) != 0)
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": folding the partitioned tables on the GPU failed: %s",
                     st->iteration, embdev_set_error(p->ds));
    mark_dirty(p, st->global_batch_size);
    if ((rc = embdev_set_sync(p->ds, updated)) != 0)
      return err_set(err, err_len, rc, "iteration %" PRIu64 ": updating the partitioned tables on the GPU failed: %s",
                     st->iteration, embdev_set_error(p->ds));
#endif
    p->t_compute += clock_mono_s() - t2;
    log_debug("part backward x=%" PRIu64 " pack_ms=%.2f exchange_ms=%.2f fold_update_ms=%.2f (GPU)", st->iteration,
              1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (clock_mono_s() - t2));
    return 0;
  }
  row_ctx_t ctx = {.p = p, .ts = ts};
  atomic_init(&ctx.zero_rows, 0);
  if (p->n_mine)
    *updated = embag_bwd_each(p->eb, threads(ts), (uint32_t)st->global_batch_size, p->gbuf, p->midx, NULL, p->mbase,
                              p->rf, row_update, &ctx) -
               atomic_load(&ctx.zero_rows);
  double t3 = clock_mono_s();
  p->t_compute += t3 - t2;
  log_debug("part backward x=%" PRIu64 " pack_ms=%.2f exchange_ms=%.2f fold_update_ms=%.2f", st->iteration,
            1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2));
  trainer_partition_retire(p, st->iteration); /* x's rows are updated: those no later Step uses may go */
  return 0;
}

/* Writes the n rows of keys / rows back and clears their dirty marks. */
static int write_chunk(trainer_partition_t *p, embc_t *embc, const uint64_t *keys, const float *rows, size_t *n,
                       uint64_t done, size_t *total, char *why, size_t why_len) {
  if (!*n) return 0;
  int rc = embc_write_done(embc, keys, *n, rows, done, why, why_len);
  if (rc) return rc;
  for (size_t i = 0; i < *n; i++) {
    uint32_t t = TABLE_ID(keys[i]);
    p->dirty[t][local_of(p, t, TABLE_ROW(keys[i]))] = 0;
  }
  *total += *n;
  *n = 0;
  return 0;
}

int trainer_partition_flush(trainer_partition_t *p, embc_t *embc, uint64_t done, size_t *n_out, char *err, size_t err_len) {
  *n_out = 0;
  if (!p->placed) return 0;
  trainer_partition_writer_drain(p); /* what it wrote is not dirty; the marks are this thread's again */
  uint64_t *keys = malloc(FLUSH_CHUNK * sizeof *keys);
  float *rows = malloc((size_t)FLUSH_CHUNK * p->rf * sizeof(float));
  if (!keys || !rows) {
    free(keys), free(rows);
    return err_set(err, err_len, -ENOMEM, "out of memory writing back the partitioned tables");
  }
  int rc = 0;
  size_t n = 0, total = 0;
  char why[768] = "";
  if (p->ds && !p->fbuf && !(p->fbuf = malloc((size_t)FLUSH_CHUNK * p->rf * sizeof(float)))) {
    free(keys), free(rows);
    return err_set(err, err_len, -ENOMEM, "out of memory writing back the partitioned tables");
  }
  for (uint32_t k = 0; k < p->n_mine && !rc; k++) {
    uint32_t t = p->mine[k];
    uint64_t R = local_rows(p, t);
    for (uint64_t l0 = 0; l0 < R && !rc; l0 += FLUSH_CHUNK) {
      uint64_t l1 = R - l0 < FLUSH_CHUNK ? R : l0 + FLUSH_CHUNK;
      const float *src = p->rows[t] ? p->rows[t] + (size_t)l0 * p->rf : NULL;
      if (p->ds) { /* the block's rows from the GPU, when one of them is dirty */
        uint64_t l = l0;
        while (l < l1 && !p->dirty[t][l]) l++;
        if (l == l1) continue;
#ifdef CHANTER_CUDA
        if ((rc = embdev_set_read_rows(p->ds, k, l0, l1 - l0, p->fbuf)) != 0) {
          snprintf(why, sizeof why, "copying rows from the GPU: %s", embdev_set_error(p->ds));
          break;
        }
#endif
        src = p->fbuf;
      }
      for (uint64_t l = l0; l < l1 && !rc; l++) {
        if (!p->dirty[t][l]) continue;
        keys[n] = TABLE_KEY(t, global_of(p, t, l));
        memcpy(rows + n * p->rf, src + (size_t)(l - l0) * p->rf, p->rf * sizeof(float));
        if (++n == FLUSH_CHUNK) rc = write_chunk(p, embc, keys, rows, &n, done, &total, why, sizeof why);
      }
    }
  }
  if (!rc) rc = write_chunk(p, embc, keys, rows, &n, done, &total, why, sizeof why); /* the rest */
  free(keys), free(rows);
  if (rc)
    return err_set(err, err_len, rc, "writing back the partitioned tables' rows (after iteration %" PRIu64 ") failed: %s",
                   done ? done - 1 : 0, why);
  p->rows_flushed += total;
  *n_out = total;
  return 0;
}
