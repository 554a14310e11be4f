/*
 * embdev: the embedding tables of `chanter train --local` with device =
 * cuda, kept in GPU memory with their row-optimizer state, and the step
 * that trains them there (embdev_train_step, which `chanter bench model
 * --device cuda` times as it is) -- the device twin of embag.h's
 * embag_train_step.
 *
 * Which tables live where.  The tables that fit the budget
 * (trainer.device_mb: embdev_budget) go to the device, the smallest first
 * (embdev_plan: every table costs the same per sample, so the most tables
 * for the memory); the others stay in host memory and run embag's CPU
 * code as before, their pooled columns copied into the model's device
 * input and their gradient columns out (model_dev_emb_cols_in / _out),
 * so a job larger than the GPU still runs.  Rows start as table_init_row
 * computes them on the host (uploaded), bit for bit.
 *
 * A step on the device tables: the batch's ids of every device table are
 * copied into one pinned staging buffer and sent with ONE copy; one fused
 * kernel pools every device table straight into the model's device input
 * (model_dev_emb_dev) and writes the sort keys (table, row) with each
 * id's sample; after the model's backward (input gradient left in
 * model_dev_demb_dev) one stable CUB radix sort over all device tables'
 * keys, and one kernel with a thread per sorted position in which the
 * first position of each run of equal keys adds that row's gradient
 * columns in sample order (h order inside a sample) -- nn_embedding_bag_bwd's
 * order -- and applies opt_row_update's expressions to the row.  No atomics
 * and no host sync per table: the same bits as embag on the CPU for the
 * same inputs (--fmad=false, IEEE sqrtf and division), and run to run.
 *
 * Plain C: the pure planning functions exist in every build; the rest
 * only with CHANTER_CUDA (check cuda_check() first).  One thread drives an
 * embdev_t, on the calling thread's nn_cuda stream (the model's).
 */
#ifndef CHANTER_EMBDEV_H
#define CHANTER_EMBDEV_H

#include <stddef.h>
#include <stdint.h>

#include "embag.h"
#include "opt.h"
#include "table.h"

#ifdef __cplusplus
extern "C" {
#endif

struct model_dev_s;

/* ---- planning (pure C, every build) */
/* trainer.device_mb = EMBDEV_AUTO: what the GPU has free (see embdev_budget). */
#define EMBDEV_AUTO (-1)
/* Margin left free on the device with EMBDEV_AUTO: 5% of its memory, at
 * least 512 MiB (cuBLAS workspaces, the allocator's granularity, other
 * processes' contexts). */
uint64_t embdev_margin(uint64_t total_bytes);
/* Bytes for the tables: device_mb > 0: device_mb MiB; 0: none;
 * EMBDEV_AUTO: free_bytes minus embdev_margin(total_bytes) (0 if less). */
uint64_t embdev_budget(int64_t device_mb, uint64_t free_bytes, uint64_t total_bytes);
/* Bytes table t of l takes (rows * row floats * 4). */
uint64_t embdev_table_bytes(const table_layout_t *l, uint32_t t);
/* on_dev[t] = 1 for the tables that go to the device within budget bytes:
 * the smallest first (ties: the lower index), each taken while the sum
 * stays within budget; 0 for the others.  Returns how many; *bytes (may
 * be NULL) their sum. */
uint32_t embdev_plan(const table_layout_t *l, uint64_t budget, uint8_t *on_dev, uint64_t *bytes);

/* ---- the tables (CHANTER_CUDA only) */
typedef struct embdev_s embdev_t;

/* The tables of l (one dim; rows of dim + opt_row_state_floats(kind) floats,
 * as cfg_layout gives for embedding_optimizer = kind), initialized with
 * table_init_row, for batches of up to max_batch samples of the given
 * hotness (n_tables entries).  budget: bytes of device memory for tables,
 * or EMBDEV_AUTO (what is free once the step's buffers are allocated,
 * less embdev_margin); a table whose cudaMalloc fails anyway stays on the
 * host.  0, -EINVAL (err says why), -ENOMEM, ERR_CUDA. */
int embdev_create(const table_layout_t *l, const uint32_t *hotness, uint32_t max_batch, opt_kind_t kind,
                  const opt_hparams_t *hp, int64_t budget, embdev_t **out, char *err, size_t err_len);
void embdev_destroy(embdev_t *e);
/* Tables on the device, and their bytes. */
uint32_t embdev_n_device(const embdev_t *e);
uint64_t embdev_device_bytes(const embdev_t *e);
int embdev_on_device(const embdev_t *e, uint32_t t);
/* Rows [r0, r0 + count) of table t into out (count * row floats),
 * wherever the table lives (the digest).  0 or ERR_CUDA. */
int embdev_read_rows(embdev_t *e, uint32_t t, uint64_t r0, uint64_t count, float *out);
/* The sentence of the first CUDA failure (or ""). */
const char *embdev_error(const embdev_t *e);
/* max_batch host floats for the logits (owned by e). */
float *embdev_logits(embdev_t *e);

/* The embedding work of one batch of n <= max_batch samples, idx[t] =
 * table t's n * hotness[t] ids (host, sample-major):
 * embdev_fwd pools every table into model_dev_emb_dev(md) (train != 0:
 * also keeps what embdev_bwd_update needs); embdev_bwd_update folds the
 * input gradient of the last model_dev_backward (d_emb = NULL: left in
 * model_dev_demb_dev(md)) per table and applies the row optimizer --
 * for the same n and idx as the last embdev_fwd with train.  Both return
 * 0, -EINVAL (no such forward) or ERR_CUDA; embdev_bwd_update waits for
 * the device (a fault shows here, not in a later step). */
int embdev_fwd(embdev_t *e, struct model_dev_s *md, uint32_t n, const uint64_t *const *idx, int train);
int embdev_bwd_update(embdev_t *e, struct model_dev_s *md, uint32_t n, const uint64_t *const *idx);

/* The step of `chanter train --local` with device = cuda (and of `chanter
 * bench model --device cuda`): embdev_fwd, model_dev_forward on the
 * device input, model_dev_backward (scale; gradient left on the device),
 * model_dev_opt_step, embdev_bwd_update.  sec[EMBAG_PHASE_*] receive
 * (added) the seconds of each part (waiting for the device at each
 * boundary; sec = NULL: only at the end).  Returns the sum of the n
 * losses, NaN when a CUDA call failed (embdev_error or nn_cuda_error
 * says which). */
double embdev_train_step(embdev_t *e, struct model_dev_s *md, opt_t *dense_opt, uint32_t n, const float *dense,
                         const float *labels, const uint64_t *const *idx, float scale, double sec[EMBAG_PHASES]);

/* ---- a set of device tables for a caller that keeps rows of its own (a
 * partitioned table's owner, trainer_partition.h), the same kernels at a lower
 * level (CHANTER_CUDA only).  Table k (0 .. n-1) holds rows[k] rows of
 * dim + opt_row_state_floats(kind) floats in GPU memory, zeroed at
 * creation; the caller fills them (embdev_set_write_rows).  Pooling and
 * fold use one layout of W floats per sample, table k's dim columns at
 * col[k] * dim: embdev_set_pool writes those columns of a device buffer
 * (a model's input) or of the set's own and copies them to a host buffer
 * of the same layout; embdev_set_fold reads the gradient in that layout
 * (device, or host copied in), folds each row in sample order (h order
 * inside a sample: nn_embedding_bag_bwd's order, embag's bits) and
 * applies the row optimizer -- except to rows >= lim[k] (lim = NULL:
 * none), which are folded and left as they are (a placeholder row of
 * zeros).  The step's calls (pool, fold, sync, read_rows) are one
 * thread's, on its nn_cuda stream; embdev_set_write_rows may be called
 * by one other thread at the same time, on rows no enqueued step reads
 * (a stream of its own, waited for). */
typedef struct embdev_set_s embdev_set_t;
/* 0, -EINVAL / -ENOMEM / ERR_CUDA with err (a table that does not fit:
 * ERR_CUDA, "out of device memory ..."). */
int embdev_set_create(uint32_t n, const uint64_t *rows, const uint64_t *lim, const uint32_t *hotness,
                      const uint32_t *col, uint32_t width, uint32_t dim, opt_kind_t kind, const opt_hparams_t *hp,
                      embdev_set_t **out, char *err, size_t err_len);
void embdev_set_destroy(embdev_set_t *s);
/* Device bytes of the rows. */
uint64_t embdev_set_bytes(const embdev_set_t *s);
/* The sentence of the first CUDA failure (or ""). */
const char *embdev_set_error(const embdev_set_t *s);
/* count host rows (row_floats floats each, packed) into table tab[i], local
 * row at[i].  Waits.  0, -EINVAL (a table or row out of range), -ENOMEM,
 * ERR_CUDA. */
int embdev_set_write_rows(embdev_set_t *s, size_t count, const uint32_t *tab, const uint64_t *at, const float *rows);
/* Rows [r0, r0 + count) of table k into host out, after the step's work
 * enqueued so far.  Waits.  0, -EINVAL, ERR_CUDA. */
int embdev_set_read_rows(embdev_set_t *s, uint32_t k, uint64_t r0, uint64_t count, float *out);
/* Pools n samples, idx[k] = table k's n * hotness[k] local row indices
 * (host, sample-major), into out (device; n rows of width floats, only the
 * set's columns written) -- or, out = NULL, into host_out (same layout,
 * waits).  train: keeps what embdev_set_fold needs.  0, -EINVAL, -ENOMEM,
 * ERR_CUDA. */
int embdev_set_pool(embdev_set_t *s, uint32_t n, const uint64_t *const *idx, float *out, float *host_out, int train);
/* The fold of the last embdev_set_pool with train (same n) of grad
 * (device) -- or, grad = NULL, of host_grad copied in -- and the row
 * update, enqueued: embdev_set_sync waits for it and gives the rows
 * updated.  0, -EINVAL (no such pool), ERR_CUDA. */
int embdev_set_fold(embdev_set_t *s, uint32_t n, const float *grad, const float *host_grad);
int embdev_set_sync(embdev_set_t *s, size_t *updated);

/* The benchmark's baseline: GFLOP/s of an FP32 cublasSgemm of n x n x n
 * (the handle in default math, as nn.cu's: no TF32), best of a few timed
 * with CUDA events; 0 with err on a failure. */
double embdev_sgemm_gflops(uint32_t n, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
