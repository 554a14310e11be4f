/*
 * trainer_step: the math of one distributed training step, without any
 * communication and without any wire type -- what chanter-trainer does
 * between the oracle's Step item and its Report, with the fetch, the
 * all-reduces and the write-back left to the caller (trainer_exec.c and
 * trainer_pipeline.c drive them over embc / coll, on the plain arrays
 * trainer_work.h decoded from the oracle's messages; the unit tests drive
 * them by hand to simulate several trainers in one process).
 *
 * Rows live in a dense ROW ARRAY with one uniform stride (vector +
 * optimizer state, table_row_floats floats: every table must have the
 * same, and the models need one embedding dim, so they do).  Sample ids
 * (rows of their table, key = TABLE_KEY(t, row)) are mapped to indices
 * into it; the pooled embeddings are nn_embedding_bag_fwd over (row array,
 * indices).  Two ways to hold rows:
 *
 * The key path (mode = ideal, whose rows live in the trainer, and
 * evaluation): row i of the array is the row of keys[i], the sorted keys
 * fetched for the step; the array is exactly the packed reply of
 * embc_lookup, which fills it in place; ids are mapped to their key's
 * index by binary search.
 *   trainer_step_set_keys        keys to hold; returns the array to fill
 *   trainer_step_forward         map ids -> key indices, pool, model_forward
 *   trainer_step_backward        model_backward(scale = 1/global_batch_size), then per
 *                         table nn_embedding_bag_bwd (coalesced, in sample
 *                         order) into a per-key gradient (zeroed first)
 *   [all-reduce trainer_step_grads() over the trainers]
 *   trainer_step_update          dense optimizer step; row optimizer on every
 *                         key with a gradient
 * With one trainer this is exactly the arithmetic of `chanter train
 * --local` (same pooling, same gradients, same per-row sums in sample
 * order, same updates), so the results are bit-identical.
 *
 * The cache (every other mode, below): slots the oracle assigns for the
 * whole job, shared rows' gradients packed and all-reduced by slot.
 *
 * Errors: 0 or a negative code with a sentence in err (naming the key, the
 * sample, the table).  A trainer_step_t is used by one thread at a time (the
 * model's own threads run inside forward / backward / update).
 */
#ifndef CHANTER_TRAINER_STEP_H
#define CHANTER_TRAINER_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "data.h"
#include "model.h"
#include "opt.h"
#include "table.h"

typedef struct trainer_step_s trainer_step_t;

/* The step reads a batch (data_batch_t, data.h) of the job's schema: n
 * samples, labels[n], dense[n * n_dense], ids table-major (table t's
 * n * hotness[t] rows at ids + ids_off[t], sample-major inside).  It only
 * reads it: usually a view into a decoded work item (trainer_work.h). */

/* Builds the model of cfg (model_create with the schema's n_dense /
 * n_tables, the layout's dim, max_batch), model_init(seed), the dense
 * optimizer ("optimizer") and the row optimizer ("embedding_optimizer").
 * schema and layout are copied.  0, or ERR_CONFIG / -EINVAL / -ENOMEM
 * with err. */
int trainer_step_create(const cfg_t *cfg, const data_schema_t *schema, const table_layout_t *layout, uint32_t max_batch,
                 trainer_step_t **out, char *err, size_t err_len);
void trainer_step_destroy(trainer_step_t *ts);

/* The CPU model (device = cpu), NULL on device = cuda. */
model_t *trainer_step_model(trainer_step_t *ts);
/* The host threads for embedding work on the host (model_dev_pool: the
 * CPU model's own, or on device = cuda a pool of the host's CPUs), NULL
 * when single-threaded.  The training thread, between model calls. */
struct pool_s *trainer_step_pool(trainer_step_t *ts);
/* The dense parameters and gradients (host arrays of trainer_step_n_params
 * floats, at fixed addresses for ts's life).  On device = cuda they live
 * on the GPU between steps (model_dev.h): each call copies the device's
 * values into the host array first when they are newer, so read through
 * a pointer only right after getting it from one of these calls (or
 * after trainer_step_grads_fetch), and after writing call
 * trainer_step_params_changed / trainer_step_grads_changed. */
float *trainer_step_params(trainer_step_t *ts);
float *trainer_step_grads(trainer_step_t *ts);
size_t trainer_step_n_params(const trainer_step_t *ts);
int trainer_step_is_cuda(const trainer_step_t *ts);
/* After trainer_step_params changed outside a step (a broadcast, a restore):
 * the GPU sees them.  0 or ERR_CUDA; nothing to do on the CPU. */
int trainer_step_params_changed(trainer_step_t *ts);
/* The dense all-reduce of a trainer group over trainer_step_grads (host
 * memory, Gloo), on device = cuda: trainer_step_grads_fetch brings the
 * backward's gradients to the host array before the collective reads it
 * (trainer_ar holds that array since the group formed), and
 * trainer_step_grads_changed sends the reduced sums back before the
 * optimizer step (trainer_step_update / trainer_step_cache_update) runs
 * on the device.  Both: 0 or ERR_CUDA; nothing to do (0) on the CPU or
 * when the collective runs on the device. */
int trainer_step_grads_fetch(trainer_step_t *ts);
int trainer_step_grads_changed(trainer_step_t *ts);
/* on != 0: the group's dense collective reads and writes the DEVICE
 * gradients in place (NCCL, model_dev_grads_dev), so the two calls above
 * do nothing.  Default off.  The training thread, between steps. */
void trainer_step_set_collective_on_device(trainer_step_t *ts, int on);
/* device = cuda: the DEVICE array of the dense gradients (what a
 * collective on device memory reduces in place); NULL on the CPU. */
float *trainer_step_grads_dev(trainer_step_t *ts);
/* The whole dense state -- the parameters and the dense optimizer's state
 * (trainer_step_dense_opt: opt_state; its step count is the host's) --
 * lives on the device with device = cuda: trainer_step_dense_sync copies
 * both into trainer_step_params and opt_state before a reader (a
 * checkpoint), trainer_step_dense_changed sends both after a writer (a
 * restore).  0 or ERR_CUDA; no-ops on the CPU. */
int trainer_step_dense_sync(trainer_step_t *ts);
int trainer_step_dense_changed(trainer_step_t *ts);/* A device failure since the last call (the GPU build records the first
 * one instead of stopping a thread mid-step): 0, or its code with a
 * sentence in err.  The training thread checks it once a step. */
int trainer_step_device_status(trainer_step_t *ts, char *err, size_t err_len);
/* The calling thread's part, once at its start: the prefetch and the
 * background threads (the GPU cache gives each its own staging buffers and
 * stream); the training thread is TRAINER_STEP_ROLE_TRAIN by default.  Changes
 * nothing on the CPU. */
enum { TRAINER_STEP_ROLE_TRAIN = 0, TRAINER_STEP_ROLE_PREFETCH = 1, TRAINER_STEP_ROLE_BACKGROUND = 2, TRAINER_STEP_ROLES = 3 };
void trainer_step_cache_thread(int role);
opt_t *trainer_step_dense_opt(trainer_step_t *ts);
uint32_t trainer_step_dim(const trainer_step_t *ts);
uint32_t trainer_step_row_floats(const trainer_step_t *ts);
uint32_t trainer_step_max_batch(const trainer_step_t *ts);

/* The sorted unique keys of b's ids (ideal mode computes its own fetch
 * list); *keys is owned by ts until the next call.  0 or -ENOMEM. */
int trainer_step_batch_keys(trainer_step_t *ts, const data_batch_t *b, const uint64_t **keys, size_t *n);

/* Sets the step's keys to keys[0..n) (strictly ascending; copied) and returns in *rows the row array (n * row_floats
 * floats, uninitialized) for the caller to fill (embc_lookup into it).
 * 0, -EINVAL (unsorted, or a table with another row size), -ENOMEM. */
int trainer_step_set_keys(trainer_step_t *ts, const uint64_t *keys, size_t n, float **rows, char *err, size_t err_len);
size_t trainer_step_n_keys(const trainer_step_t *ts);
const uint64_t *trainer_step_keys(const trainer_step_t *ts);
float *trainer_step_key_rows(trainer_step_t *ts);
/* Index of key among the step's keys (its row in the row array), or -1. */
long trainer_step_key_index(const trainer_step_t *ts, uint64_t key);

/* Maps b's ids to slots (-ENOENT with err naming the sample, table and key
 * when a row was not fetched), pools, runs model_forward.  n == 0 is fine
 * (nothing runs).  Logits: trainer_step_logits (on device = cuda the
 * forward leaves them on the GPU, without waiting for it, and
 * trainer_step_logits copies them over on its first call after). */
int trainer_step_forward(trainer_step_t *ts, const data_batch_t *b, char *err, size_t err_len);
const float *trainer_step_logits(trainer_step_t *ts);
/* Backward of the last trainer_step_forward: model_grads() = (1/global_batch_size) *
 * gradient of the sum of b's losses (all zeros when n == 0), and each
 * slot's row gradient (zero for slots no sample of b uses).  Returns the
 * sum of b's BCE losses. */
double trainer_step_backward(trainer_step_t *ts, const data_batch_t *b, uint32_t global_batch_size);

/* The optimizer: opt_step on the dense parameters with trainer_step_grads();
 * opt_row_update on every slot that has a gradient (used by b).  Returns
 * the number of rows updated. */
size_t trainer_step_update(trainer_step_t *ts);

/* ---- the cache (lookahead; DESIGN.md 3-4, services/oracle/cacher.h).
 * Rows live for the whole job in one dense array of cache_rows slots
 * (host memory; with device = cuda in GPU memory, tcache_cuda.h, the
 * model's input pooled there and its gradient folded there, only the
 * compact row gradients coming back for the all-reduce); the oracle names
 * the slot of every id, of every row to prefetch, synchronize, write back.
 * A step in cache mode:
 *   trainer_step_cache_forward   ids given as slots
 *   trainer_step_backward        (as above) row gradients per touched slot, compact
 *   trainer_step_cache_pack      gradients of a slot list (zeros for slots this
 *                         trainer did not touch) into a buffer, in order
 *   [all-reduce it]
 *   trainer_step_cache_unpack    the sums become those slots' gradients
 *   trainer_step_cache_update    dense step; row step on every slot with a
 *                         gradient except the ones listed (delayed ones,
 *                         updated later by trainer_step_cache_update_rows)
 * trainer_step_cache_scatter / _gather / _update_rows touch only the slots they
 * are given and no other state of ts, so the prefetch and background
 * threads may call them on slots the training thread does not use (the
 * oracle guarantees disjointness) while it trains.  Everything else: the
 * training thread.  Slots are uint32 indices < cache_rows (the oracle's
 * lists, checked when they arrived: trainer_work.h). */
int trainer_step_cache_init(trainer_step_t *ts, uint64_t cache_rows, char *err, size_t err_len);
uint64_t trainer_step_cache_size(const trainer_step_t *ts);
float *trainer_step_cache_rows(trainer_step_t *ts);
int trainer_step_cache_forward(trainer_step_t *ts, const data_batch_t *b, const uint32_t *slots, char *err, size_t err_len);
int trainer_step_cache_pack(trainer_step_t *ts, const uint32_t *slots, size_t n, float *buf);
void trainer_step_cache_unpack(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *buf);
size_t trainer_step_cache_update(trainer_step_t *ts, const uint32_t *skip_slots, size_t n_skip);
void trainer_step_cache_update_rows(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *grads);
void trainer_step_cache_scatter(trainer_step_t *ts, const uint32_t *slots, size_t n, const float *rows);
void trainer_step_cache_gather(trainer_step_t *ts, const uint32_t *slots, size_t n, float *rows);

/* ---- partitioned tables (table_strategy = partition: the table's rows live
 * on one trainer, which pools them for the whole global batch; the pooled
 * embeddings reach this trainer from outside the cache).  partitioned[t] != 0:
 * trainer_step_cache_forward neither pools table t nor checks its slots
 * (its ids carry none); the caller writes its columns of the model's input
 * (trainer_step_emb_in: sample i, table t at i * n_tables * dim + t * dim)
 * before the forward, and reads their gradient from trainer_step_d_emb
 * (same layout, scaled like every gradient) after trainer_step_backward,
 * which folds only the other tables.  On device = cuda the same, with
 * the same skip rules on the GPU cache (tcache_cuda_forward_skip; the
 * backward's fold loop): both arrays stay host arrays, the forward copies
 * the partitioned tables' columns of trainer_step_emb_in into the device's
 * input before the model runs, and the backward copies their columns of
 * the device's input gradient into trainer_step_d_emb (only those columns
 * are meaningful there on the GPU; the CPU writes every column).  That
 * path compiles but has never run on a GPU.  partitioned = NULL (or all zero):
 * none.  0 or -ENOMEM. */
int trainer_step_set_partitioned(trainer_step_t *ts, const uint8_t *partitioned, char *err, size_t err_len);
float *trainer_step_emb_in(trainer_step_t *ts);
/* device = cuda, on != 0: the caller writes the partitioned tables' columns
 * straight into the model's DEVICE input (trainer_step_emb_dev, same
 * layout; on the training thread's stream, before the forward) and reads
 * their gradient from the device input gradient (trainer_step_demb_dev,
 * left there by trainer_step_backward until the next backward): the
 * forward and the backward copy no external column (a partitioned
 * table's owner that is the only trainer, trainer_partition.h).  Ignored on
 * the CPU.  Default off; the training thread, between steps. */
void trainer_step_set_partitioned_on_device(trainer_step_t *ts, int on);
float *trainer_step_emb_dev(trainer_step_t *ts);
const float *trainer_step_demb_dev(trainer_step_t *ts);
/* The row optimizer's kind and hyper-parameters (embedding_optimizer). */
void trainer_step_row_opt(const trainer_step_t *ts, opt_kind_t *kind, opt_hparams_t *hp);
const float *trainer_step_d_emb(const trainer_step_t *ts);
/* The row optimizer (embedding_optimizer) on one row of row_floats floats
 * held outside the cache, with its dim-float gradient. */
void trainer_step_row_update(trainer_step_t *ts, float *row, const float *grad);

/* Forward only over b (any n: run in chunks of max_batch), logits into
 * out[b->n].  Changes no parameter. */
int trainer_step_eval(trainer_step_t *ts, const data_batch_t *b, float *out, char *err, size_t err_len);

/* SHA-256 of the dense parameter bytes (model_params, native float32;
 * on device = cuda copied from the GPU first when newer). */
void trainer_step_dense_sha256(trainer_step_t *ts, uint8_t out[32]);

#endif
