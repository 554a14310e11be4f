/*
 * trainer_step: the math of one distributed training step, without any
 * communication and without any wire type -- what chanter-trainer does
 * between the oracle's Step item and its Report, with the fetch, the
 * all-reduces and the write-back left to the caller (trainer_exec.c and
 * trainer_pipeline.c drive them over embc / coll, on the plain arrays
 * trainer_work.h decoded from the oracle's messages; the unit tests drive
 * them by hand to simulate several trainers in one process).
 *
 * Rows live in a dense SLOT ARRAY: slot i holds the row (vector + optimizer
 * state, tbl_row_floats floats) of slot_keys[i], the sorted keys fetched
 * for the step.  Every table must have the same row floats (the models
 * need one embedding dim, so they do): the array has one uniform stride
 * and is exactly the packed reply of embc_lookup, which fills it in place.
 * Sample ids (rows of their table, key = TBL_KEY(t, row)) are mapped to
 * slots by binary search; the pooled embeddings are nn_embedding_bag_fwd
 * over (slot array, slot indices).  Two ways to hold rows:
 *
 * The key path (mode = ideal, whose rows live in the trainer, and
 * evaluation): the step's sorted keys are the slots.
 *   tstep_set_slots       keys to hold; returns the array to fill
 *   tstep_forward         map ids -> slots, pool, model_forward
 *   tstep_backward        model_backward(scale = 1/global_batch), then per
 *                         table nn_embedding_bag_bwd (coalesced, in sample
 *                         order) into a per-slot gradient (zeroed first)
 *   [all-reduce tstep_grads() over the trainers]
 *   tstep_update          dense optimizer step; row optimizer on every
 *                         slot with a gradient
 * With one trainer this is exactly the arithmetic of `chanter train
 * --local` (same pooling, same gradients, same per-row sums in sample
 * order, same updates), so the results are bit-identical.
 *
 * The cache (every other mode, below): slots the oracle assigns for the
 * whole job, shared rows' gradients packed and all-reduced by slot.
 *
 * Errors: 0 or a negative code with a sentence in err (naming the key, the
 * sample, the table).  A tstep_t is used by one thread at a time (the
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

typedef struct tstep_s tstep_t;

/* A batch as the step reads it: n samples, labels[n], dense[n * n_dense],
 * ids table-major (table t's n * hotness[t] rows at ids + ids_off[t],
 * sample-major inside), with hotness and ids_off of the job's schema and
 * this n.  Views into buffers owned by someone else (a decoded work item,
 * trainer_work.h; tests: their own arrays). */
typedef struct tstep_batch_s {
  uint32_t n;
  const float *labels;
  const float *dense;
  const uint64_t *ids;
  const size_t *ids_off; /* n_tables + 1 entries */
} tstep_batch_t;

/* Builds the model of cfg (model_create with the schema's n_dense /
 * n_tables, the layout's dim, max_batch), model_init(seed), the dense
 * optimizer ("optimizer") and the row optimizer ("embedding_optimizer").
 * schema and layout are copied.  0, or ERR_CONFIG / -EINVAL / -ENOMEM
 * with err. */
int tstep_create(const cfg_t *cfg, const data_schema_t *schema, const tbl_layout_t *layout, uint32_t max_batch,
                 tstep_t **out, char *err, size_t err_len);
void tstep_destroy(tstep_t *ts);

/* The CPU model (device = cpu), NULL on device = cuda. */
model_t *tstep_model(tstep_t *ts);
/* The dense parameters and gradients (host arrays of tstep_n_params
 * floats, authoritative on either device: the all-reduce, the optimizer
 * and the digest use them). */
float *tstep_params(tstep_t *ts);
float *tstep_grads(tstep_t *ts);
size_t tstep_n_params(const tstep_t *ts);
int tstep_is_cuda(const tstep_t *ts);
/* After tstep_params changed outside a step (a broadcast, a restore):
 * the GPU sees them.  0 or ERR_CUDA; nothing to do on the CPU. */
int tstep_params_changed(tstep_t *ts);
/* A device failure since the last call (the GPU build records the first
 * one instead of stopping a thread mid-step): 0, or its code with a
 * sentence in err.  The training thread checks it once a step. */
int tstep_device_status(tstep_t *ts, char *err, size_t err_len);
/* The calling thread's part, once at its start: the prefetch and the
 * background threads (the GPU cache gives each its own staging buffers and
 * stream); the training thread is TSTEP_ROLE_TRAIN by default.  Changes
 * nothing on the CPU. */
enum { TSTEP_ROLE_TRAIN = 0, TSTEP_ROLE_PREFETCH = 1, TSTEP_ROLE_BACKGROUND = 2, TSTEP_ROLES = 3 };
void tstep_cache_thread(int role);
opt_t *tstep_dense_opt(tstep_t *ts);
uint32_t tstep_dim(const tstep_t *ts);
uint32_t tstep_row_floats(const tstep_t *ts);
uint32_t tstep_max_batch(const tstep_t *ts);

/* The sorted unique keys of b's ids (ideal mode computes its own fetch
 * list); *keys is owned by ts until the next call.  0 or -ENOMEM. */
int tstep_batch_keys(tstep_t *ts, const tstep_batch_t *b, const uint64_t **keys, size_t *n);

/* Sets the step's slots to keys[0..n) (strictly ascending; copied) and returns in *rows the slot array (n * row_floats
 * floats, uninitialized) for the caller to fill (embc_lookup into it).
 * 0, -EINVAL (unsorted, or a table with another row size), -ENOMEM. */
int tstep_set_slots(tstep_t *ts, const uint64_t *keys, size_t n, float **rows, char *err, size_t err_len);
size_t tstep_slots(const tstep_t *ts);
const uint64_t *tstep_slot_keys(const tstep_t *ts);
float *tstep_slot_rows(tstep_t *ts);
/* Slot of key, or -1. */
long tstep_slot_of(const tstep_t *ts, uint64_t key);

/* Maps b's ids to slots (-ENOENT with err naming the sample, table and key
 * when a row was not fetched), pools, runs model_forward.  n == 0 is fine
 * (nothing runs).  Logits: tstep_logits. */
int tstep_forward(tstep_t *ts, const tstep_batch_t *b, char *err, size_t err_len);
const float *tstep_logits(const tstep_t *ts);
/* Backward of the last tstep_forward: model_grads() = (1/global_batch) *
 * gradient of the sum of b's losses (all zeros when n == 0), and each
 * slot's row gradient (zero for slots no sample of b uses).  Returns the
 * sum of b's BCE losses. */
double tstep_backward(tstep_t *ts, const tstep_batch_t *b, uint32_t global_batch);

/* The optimizer: opt_step on the dense parameters with tstep_grads();
 * opt_row_update on every slot that has a gradient (used by b).  Returns
 * the number of rows updated. */
size_t tstep_update(tstep_t *ts);

/* ---- the cache (lookahead; DESIGN.md 3-4, services/oracle/oracle_cache.h).
 * Rows live for the whole job in one dense array of cache_rows slots
 * (host memory; with device = cuda in GPU memory, tcache_cuda.h, the
 * model's input pooled there and its gradient folded there, only the
 * compact row gradients coming back for the all-reduce); the oracle names
 * the slot of every id, of every row to prefetch, synchronize, write back.
 * A step in cache mode:
 *   tstep_cache_forward   ids given as slots
 *   tstep_backward        (as above) row gradients per touched slot, compact
 *   tstep_cache_pack      gradients of a slot list (zeros for slots this
 *                         trainer did not touch) into a buffer, in order
 *   [all-reduce it]
 *   tstep_cache_unpack    the sums become those slots' gradients
 *   tstep_cache_update    dense step; row step on every slot with a
 *                         gradient except the ones listed (delayed ones,
 *                         updated later by tstep_cache_update_rows)
 * tstep_cache_scatter / _gather / _update_rows touch only the slots they
 * are given and no other state of ts, so the prefetch and background
 * threads may call them on slots the training thread does not use (the
 * oracle guarantees disjointness) while it trains.  Everything else: the
 * training thread.  Slots are uint32 indices < cache_rows (the oracle's
 * lists, checked when they arrived: trainer_work.h). */
int tstep_cache_init(tstep_t *ts, uint64_t cache_rows, char *err, size_t err_len);
uint64_t tstep_cache_size(const tstep_t *ts);
float *tstep_cache_rows(tstep_t *ts);
int tstep_cache_forward(tstep_t *ts, const tstep_batch_t *b, const uint32_t *slots, char *err, size_t err_len);
int tstep_cache_pack(tstep_t *ts, const uint32_t *slots, size_t n, float *buf);
void tstep_cache_unpack(tstep_t *ts, const uint32_t *slots, size_t n, const float *buf);
size_t tstep_cache_update(tstep_t *ts, const uint32_t *skip_slots, size_t n_skip);
void tstep_cache_update_rows(tstep_t *ts, const uint32_t *slots, size_t n, const float *grads);
void tstep_cache_scatter(tstep_t *ts, const uint32_t *slots, size_t n, const float *rows);
void tstep_cache_gather(tstep_t *ts, const uint32_t *slots, size_t n, float *rows);

/* Forward only over b (any n: run in chunks of max_batch), logits into
 * out[b->n].  Changes no parameter. */
int tstep_eval(tstep_t *ts, const tstep_batch_t *b, float *out, char *err, size_t err_len);

/* SHA-256 of the dense parameter bytes (model_params, native float32). */
void tstep_dense_sha256(tstep_t *ts, uint8_t out[32]);

#endif
