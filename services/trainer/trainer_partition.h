/*
 * trainer_partition: the partitioned tables of a trainer (table_strategy =
 * partition, strategy.h; papers/embrace.txt section 4).
 *
 * A partitioned table's rows live on one trainer, its OWNER, for the whole
 * run: one dense array of table_rows rows (vector + optimizer state), read
 * from the embedding servers the first time a batch uses a row (the
 * feeder, ahead of training: no other trainer writes these rows, so no
 * gate is needed) and written back only at checkpoints, evaluations and
 * the end (trainer_partition_flush) -- the end's rows mostly during the last
 * iterations, once their last use is past (trainer_partition_retire).  A
 * step, on every trainer, around the
 * cache's forward and backward:
 *   trainer_partition_forward    the owner pools its tables for the WHOLE global
 *                           batch (the Step's partition_ids), an AlltoAll sends
 *                           each trainer the pooled embeddings of its own
 *                           samples, which go into the model's input
 *                           (trainer_step_emb_in);
 *   trainer_partition_backward   their gradients (trainer_step_d_emb) go back to
 *                           the owners by AlltoAll; the owner folds them
 *                           per row in global sample order (trainer 0's
 *                           samples first: with contiguous allocation the
 *                           batch's own order) and applies the row
 *                           optimizer.
 * So a partitioned row gets exactly the update one trainer training the
 * whole batch would give it from the same input gradients (same
 * nn_embedding_bag_bwd, same order); the model differs from a one-trainer
 * run only in the dense all-reduce's summation order.  L plays no part:
 * any lookahead gives the bits of L = 0 for the same assignment.
 *
 * Device: either.  On device = cpu, and on device = cuda with
 * trainer.partition_on_device = off (or tables that do not fit the GPU,
 * logged), the rows, the owner's pooling and fold are in host memory, run
 * by embag on the host's threads (trainer_step_pool), and trainer_step
 * copies the pooled columns into the GPU's input before the forward and
 * their gradient back to the host after the backward (trainer_step.h,
 * partitioned tables).  On device = cuda with partition_on_device = auto
 * (the default) this rank's tables live in GPU memory (embdev_set,
 * embdev.h: the same kernels as train --local's device tables): the
 * feeder scatters the rows it reads into them, the owner pools the global
 * batch and folds in global sample order + updates the rows there (the
 * same bits as embag: a stable sort by row keeps the sample order), the
 * dirty marks stay on the host (set from the ids) and trainer_partition_flush
 * reads the dirty rows' blocks back.  The AlltoAlls stay on the Gloo
 * group in host memory: the pooled block comes to gbuf (D2H), the
 * received gradients go back (H2D); with ONE trainer there is no copy:
 * the pooling writes the model's device input and the fold reads its
 * device input gradient (trainer_step_set_partitioned_on_device), and the
 * exchange is an empty one.  partition_rows works the same way on the GPU
 * (the row of zeros is a row past the set's lim, never updated).  The
 * CUDA paths compile, but none of them has run on a GPU yet.
 *
 * Threads: trainer_partition_load is the feeder's (it writes only rows no
 * earlier Step used, and its own bitmap; on the GPU through the set's own
 * stream, waited for before the Step is handed on, so the training
 * thread's pooling sees the rows); everything else the training thread's
 * (on the GPU, its nn_cuda stream: the model's).  Reset and close with both stopped.  Inside trainer_partition_forward
 * and trainer_partition_backward the training thread runs the pooling and the
 * fold + row update on the model's host threads (trainer_step_pool: the
 * CPU model's threads, or on device = cuda a pool of the host's CPUs;
 * only the training thread drives it, the model is idle then), table by
 * table with embag (embag.h): one thread does all of one table -- reads its rows and
 * ids, writes its columns of gbuf, its rows, its dirty marks -- with the
 * single-threaded code, so the bits do not depend on the thread count.
 */
#ifndef CHANTER_TRAINER_PART_H
#define CHANTER_TRAINER_PART_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "coll.h"
#include "data.h"
#include "embc.h"
#include "opt.h"
#include "table.h"
#include "trainer_sched.h"
#include "trainer_step.h"
#include "trainer_work.h"

typedef struct trainer_partition_s {
  int any;                 /* the job partitions some table (mode != ideal) */
  uint32_t T, P, rank, dim, rf;
  const data_schema_t *schema;
  /* the placement, from the first Step (the feeder) */
  int placed;
  uint32_t *owner;         /* T: rank or UINT32_MAX */
  uint8_t *partitioned;            /* T: owner[t] != UINT32_MAX */
  uint32_t *mine, n_mine;  /* the tables this rank holds, ascending */
  uint32_t n_partitioned;         /* tables partitioned (on any rank) */
  uint32_t *ntab;          /* P: tables each rank holds */
  float **rows;            /* T: a held table's rows, else NULL */
  uint8_t **loaded;        /* T: the feeder's: row read from the servers */
  uint8_t **dirty;         /* T: the training thread's: updated since the last flush (and the
                              retired rows' writer's, for rows no later Step uses) */
  uint32_t **last;         /* T: the feeder's: iteration + 1 of the last Step seen using the row
                              (0: none); NULL when iterations do not fit (no retirement) */
  uint64_t iterations;     /* the job's (cfg): the Step of iteration iterations - 1 is the last */
  atomic_int final_seen;   /* the feeder read the last Step: last[] is final (release / acquire) */
  embc_t *embc;            /* the feeder's client (thread-safe), for the writer */
  struct trainer_partition_writer_s *wr; /* the retired rows' writer (trainer_partition_retire.c) */
  int partitioned_applied;         /* the training thread told trainer_step (per model: reset) */
  /* the feeder's scratch */
  uint64_t *lkeys;
  float *lrows;
  size_t cap_lkeys, cap_lrows;
  /* the training thread's scratch */
  float *gbuf, *lbuf; /* the owner's side (global batch) and every rank's (its samples): trainer_partition.c */
  size_t cap_g, cap_l;
  size_t *sb, *rb; /* P */
  /* the pooling and the fold of this rank's tables on the model's threads
   * (embag over n_mine tables, room for eb_batch samples; per placement) */
  struct embag_s *eb;
  uint64_t eb_batch;
  uint64_t tables_x;      /* the iteration + 1 whose ids mbase / midx / mhot (and lidx) hold; 0: none */
  float **mbase;          /* n_mine: rows[mine[k]] */
  const uint64_t **midx;  /* n_mine: table mine[k]'s ids in this Step's partition_ids */
  uint32_t *mhot;         /* n_mine: its hotness */
  uint64_t *lidx;         /* partition_rows tables' ids as local indices (midx points here for them) */
  size_t cap_lidx;
  /* device = cuda with trainer.partition_on_device = auto: this rank's
   * tables in GPU memory (embdev_set, table k = mine[k]; NULL: on the host,
   * rows[]); direct: the only trainer, pooling straight into the model's
   * device input (columns at the tables' own index) and folding its
   * device input gradient, no copy and no exchange */
  int want_dev, direct;
  opt_kind_t kind;        /* the row optimizer (embedding_optimizer) */
  opt_hparams_t hp;
  struct embdev_set_s *ds;
  uint32_t *kof;          /* T: k of a held table in mine */
  uint32_t *ltab;         /* the feeder's: k of each row read (device) */
  uint64_t *lat;          /* and its local index */
  size_t cap_ltab, cap_lat;
  float *fbuf;            /* trainer_partition_flush's rows read from the device */
  /* counters (this generation) */
  uint64_t rows_loaded, rows_flushed, rows_retired;
  double t_compute;       /* the training thread's: this Step's own work on this rank's tables, seconds -- the
                             pooling for the global batch, the fold and the row update, not the AlltoAlls nor the
                             packing (trainer_partition_forward sets it, _backward adds to it; the Report's
                             t_partition_compute) */
  trainer_sched_t *sched; /* the generation's collectives' scheduler (NULL: the AlltoAlls go straight to the
                             group the caller passes) */
} trainer_partition_t;

/* From the job: which tables are partitioned (not where: the oracle places
 * them and every Step says).  0 or ERR_CONFIG with err. */
int trainer_partition_init(trainer_partition_t *p, const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout,
                      uint32_t rank, int ideal, char *err, size_t err_len);
/* Forgets the rows and the placement (a new generation, a rebuilt model). */
void trainer_partition_reset(trainer_partition_t *p);
void trainer_partition_close(trainer_partition_t *p);

/* Feeder, per Step: places the tables on the first one (a later Step with
 * another placement: ERR_BADMSG), then reads the rows of this rank's tables
 * that st uses for the first time.  Nothing without part fields. */
int trainer_partition_load(trainer_partition_t *p, const trainer_work_step_t *st, embc_t *embc, char *err, size_t err_len);

/* Training thread, per Step, before the cache's forward: the pooled
 * embeddings of the partitioned tables for b (st's samples) into
 * trainer_step_emb_in(ts), by AlltoAll on c. */
int trainer_partition_forward(trainer_partition_t *p, trainer_step_t *ts, coll_t *c, const trainer_work_step_t *st,
                         const data_batch_t *b, char *err, size_t err_len);
/* After trainer_step_backward: the gradients back to the owners, folded
 * and applied to this rank's rows (*updated: rows updated here). */
int trainer_partition_backward(trainer_partition_t *p, trainer_step_t *ts, coll_t *c, const trainer_work_step_t *st,
                          const data_batch_t *b, size_t *updated, char *err, size_t err_len);

/* Writes back every row of this rank's tables updated since the last
 * flush, tagged done (embc_write_done: the rows as of the end of
 * iteration done - 1); *n: how many.  Waits for the retired rows' writer
 * first (what it wrote is not dirty any more).  Training thread. */
int trainer_partition_flush(trainer_partition_t *p, embc_t *embc, uint64_t done, size_t *n, char *err, size_t err_len);

/* The end-of-job write-back overlapped with the last iterations
 * (trainer_partition_retire.c).  Once the feeder has read the job's last
 * Step, every held row's last use is known (last[]); after the backward
 * of iteration x the training thread hands the rows whose last use is <= x
 * to a writer thread, which writes the dirty ones back (tagged x + 1: they
 * are the rows as of the end of x, no later Step updates them) and clears
 * their marks while the last iterations train.  The final flush then
 * writes only what the last iterations updated after that.  The bits on
 * the servers are the same: a row's bytes are final at its last use.
 * Host rows only (device-held tables are flushed at the end as before).
 *   trainer_partition_retire        training thread, after x's row updates;
 *   trainer_partition_writer_drain  waits until the writer is idle (every
 *                                   flush does, before reading the marks);
 *   trainer_partition_writer_stop   ends the thread (reset and close do;
 *                                   the failover before embc_unabort, so that a
 *                                   write to a lost server gives up). */
void trainer_partition_retire(trainer_partition_t *p, uint64_t x);
void trainer_partition_writer_drain(trainer_partition_t *p);
void trainer_partition_writer_stop(trainer_partition_t *p);

#endif
