/*
 * embag: a training step's embedding-table work -- pooling, the
 * per-row coalesced gradient fold, the row optimizer -- run table by table
 * on the model's threads (pool.h), and the whole CPU step of `chanter
 * train --local` over in-memory tables, which `chanter bench model` times
 * as it is.
 *
 * Tables are independent: each table's pooling, fold (nn_embedding_bag_bwd:
 * rows ascending, each row's contributions in sample order) and row updates
 * are computed by one thread with the single-threaded code, into its own
 * buffers, so the results are bit-identical to a loop over the tables on
 * one thread, for any thread count and any assignment of tables to
 * threads (threads take the next table from a shared counter).  Row
 * updates over a list of distinct rows are cut into one contiguous range
 * per thread (element-wise, so the same bits again).
 *
 * An embag_t holds the scratch for one batch of up to max_batch samples of
 * a schema (n_tables tables of the given hotness): every table's fold
 * results side by side, so a caller may read them after the fold, and the
 * model's input, input gradient and logits for embag_train_step (not
 * with embag_create_tables: the per-table work only, for a caller with
 * buffers of its own, as a partitioned table's owner pooling the global
 * batch into its AlltoAll buffer).  A step allocates nothing.  One thread
 * drives an embag_t at a time (the pool's threads run inside the calls);
 * pool may be NULL (single-threaded).
 */
#ifndef CHANTER_EMBAG_H
#define CHANTER_EMBAG_H

#include <stddef.h>
#include <stdint.h>

#include "opt.h"

typedef struct embag_s embag_t;
struct pool_s;
struct model_dev_s;

/* Scratch for batches of up to max_batch samples of n_tables tables of
 * dim floats (hotness copied).  0 or -ENOMEM / -EINVAL. */
int embag_create(uint32_t n_tables, const uint32_t *hotness, uint32_t dim, uint32_t max_batch, embag_t **out);
/* The same without the model's input, gradient and logits (embag_emb,
 * embag_d_emb, embag_logits return NULL; no embag_train_step). */
int embag_create_tables(uint32_t n_tables, const uint32_t *hotness, uint32_t dim, uint32_t max_batch, embag_t **out);
void embag_destroy(embag_t *e);
/* Storage for a table's rows (bytes of them): 2 MiB aligned and, from
 * 2 MiB on, advised onto transparent huge pages, since the gather, the fold
 * and the row update touch rows at random and a large table on 4 KiB pages
 * costs a TLB miss (a page walk) per row.  zero: calloc's zeroed memory
 * instead, on ordinary pages -- a huge page is resident whole once touched,
 * and zeroing would make every row resident at once, where calloc's pages
 * stay untouched until a row is used (a table spread over the trainers,
 * most of whose rows one trainer never sees).  Free with free(); NULL when
 * out of memory.  Any thread. */
float *embag_rows_alloc(size_t bytes, int zero);

/* The tables of one batch of n samples: idx[t] = table t's n * hotness[t]
 * row indices (sample-major), base[t] = its row store (row r at
 * base[t] + r * row_stride floats).  skip (NULL: none): skip[t] != 0
 * leaves table t alone (its columns of out and its fold untouched). */

/* out[i * n_tables * dim + t * dim ..] = nn_embedding_bag_fwd of table t. */
void embag_fwd(embag_t *e, struct pool_s *pool, uint32_t n, float *const *base, size_t row_stride,
               const uint64_t *const *idx, const uint8_t *skip, float *out);
/* The fold of d_out (same layout as embag_fwd's out) per table, kept in e
 * until the next fold: embag_table gives table t's sorted unique rows and
 * their summed gradients (dim floats each, packed). */
void embag_bwd(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
               const uint8_t *skip);
uint32_t embag_table(const embag_t *e, uint32_t t, const uint64_t **uniq, const float **grad);
/* The fold and then opt_row_update of each folded row in place, table by
 * table on the pool's threads (train --local: rows are the tables' own).
 * Returns the rows updated. */
size_t embag_bwd_update(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
                        const uint8_t *skip, float *const *base, size_t row_stride, opt_kind_t kind,
                        const opt_hparams_t *hp);
/* The fold, then the caller's row step: cb(ud, t, r, base[t] + r *
 * row_stride, grad) for each folded row r of table t, rows ascending, on
 * the thread that folded the table (for rows whose optimizer or marks the
 * caller keeps: a partitioned table's owner).  cb runs on the pool's
 * threads, for different tables at once, never for two rows of one table
 * at once: it may write what belongs to table t alone.  Returns the rows
 * folded. */
typedef void (*embag_row_cb)(void *ud, uint32_t t, uint64_t r, float *row, const float *grad);
size_t embag_bwd_each(embag_t *e, struct pool_s *pool, uint32_t n, const float *d_out, const uint64_t *const *idx,
                      const uint8_t *skip, float *const *base, size_t row_stride, embag_row_cb cb, void *ud);
/* opt_row_update of rows[at[i] * row_stride] (at = NULL: row i) with
 * grads[i * dim] for every i < n with mask[i] == want (mask = NULL: all),
 * over contiguous ranges on the pool's threads.  The rows must be
 * distinct.  Returns how many were updated. */
size_t embag_update_rows(struct pool_s *pool, opt_kind_t kind, const opt_hparams_t *hp, float *rows,
                         size_t row_stride, uint32_t dim, const uint32_t *at, const float *grads,
                         const uint8_t *mask, uint8_t want, size_t n);

/* ---- the step of `chanter train --local` (and of `chanter bench model`):
 * embag_fwd into embag_emb, model_dev_forward, model_dev_backward (scale)
 * into embag_d_emb, the dense optimizer over the model's threads, then
 * embag_bwd_update on the tables.  sec[EMBAG_PHASE_*] receive (added) the
 * seconds of each part.  Returns the sum of the n losses, NaN when the
 * model failed on its device. */
enum { EMBAG_PHASE_GATHER, EMBAG_PHASE_FORWARD, EMBAG_PHASE_BACKWARD, EMBAG_PHASE_DENSE_UPDATE,
       EMBAG_PHASE_EMBEDDING_UPDATE, EMBAG_PHASES };
double embag_train_step(embag_t *e, struct model_dev_s *md, opt_t *dense_opt, opt_kind_t kind,
                        const opt_hparams_t *hp, float *const *tables, size_t row_stride, uint32_t n,
                        const float *dense, const float *labels, const uint64_t *const *idx, float scale,
                        double sec[EMBAG_PHASES]);
/* Adds the seconds between the step's six instants t[0..EMBAG_PHASES] to
 * sec[EMBAG_PHASE_*] (gather, forward, backward, dense update, embedding
 * update); sec NULL: nothing.  The GPU's step (embdev) times the same parts. */
void embag_phases_add(double sec[EMBAG_PHASES], const double t[EMBAG_PHASES + 1]);
/* The model's input [max_batch x n_tables * dim], its gradient, and
 * max_batch logits (owned by e). */
float *embag_emb(embag_t *e);
float *embag_d_emb(embag_t *e);
float *embag_logits(embag_t *e);

#endif
