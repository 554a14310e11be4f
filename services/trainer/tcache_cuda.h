/*
 * tcache_cuda: the trainer's embedding cache in GPU memory (device =
 * cuda), the mirror of the host slot array of trainer_step.c's cache mode.
 *
 * The rows (vector + optimizer state, rf floats each) of cache_rows slots
 * live in one cudaMalloc'ed array.  What stays on the host is what the
 * host path already keeps small and compact: the step's per-slot row
 * gradients (copied back after the backward, all-reduced over Gloo like
 * the CPU build's), the slot lists of the oracle.  Each function mirrors
 * one loop of trainer_step.c and gives its bits:
 *   tcache_cuda_scatter      memcpy of prefetched rows into their slots
 *   tcache_cuda_gather       memcpy of slots' rows out (write-back, evaluation)
 *   tcache_cuda_forward      nn_embedding_bag_fwd per table over the slot array,
 *                    into the model's DEVICE input (n x n_tables*dim);
 *                    tcache_cuda_forward_skip leaves the tables embag_fwd's
 *                    skip would leave (trainer_step's partitioned tables)
 *   tcache_cuda_backward     nn_embedding_bag_bwd of one table (ids sorted
 *                    stably, each slot's rows added in sample order), its
 *                    unique slots and their gradients copied to the host
 *   tcache_cuda_update_rows  opt_row_update of each listed slot with its gradient
 *                    (--fmad=false and IEEE sqrt / division: the same
 *                    float operations in the same order as opt.c)
 * Slots are uint32; in `slots` arguments they may be unaligned (they are
 * copied to a staging buffer; trainer_step.h passes aligned arrays).  tcache_cuda_forward and tcache_cuda_backward run on the
 * calling thread's stream (nn_cuda_stream(), the model's), the others on
 * their role's own stream; every call returns once its results are where
 * the caller reads them (host copies done, device writes finished).  Thread-safety: as trainer_step's cache
 * -- scatter / gather / update_rows from the prefetch and background
 * threads on slots the training thread does not use; each call uses its
 * own staging buffers (per calling role: see tcache_cuda_role_t), so they may run
 * concurrently.
 *
 * Compiled only with CUDA (CHANTER_CUDA); no GPU is needed to build it.
 * Errors: 0, or ERR_CUDA / -ENOMEM with a sentence in err (the CUDA
 * error string and what was being done).
 */
#ifndef CHANTER_TCACHE_CUDA_H
#define CHANTER_TCACHE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "opt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tcache_cuda_s tcache_cuda_t;

/* Who calls: each role has its own staging buffers and CUDA stream, so
 * the feeder's scatter, the background thread's update / gather and the
 * training thread never share one. */
typedef enum { TCACHE_CUDA_TRAIN = 0, TCACHE_CUDA_PREFETCH = 1, TCACHE_CUDA_BACKGROUND = 2, TCACHE_CUDA_ROLES = 3 } tcache_cuda_role_t;

/* A cache of cache_rows slots of rf floats (rows zeroed), for batches of up
 * to max_batch samples over n_tables tables of the given hotness, rows of
 * dim floats (+ state: rf - dim).  0, ERR_CUDA or -ENOMEM (err). */
int tcache_cuda_create(uint64_t cache_rows, uint32_t rf, uint32_t dim, uint32_t n_tables, const uint32_t *hotness,
               uint32_t max_batch, tcache_cuda_t **out, char *err, size_t err_len);
void tcache_cuda_destroy(tcache_cuda_t *c);

/* rows[i * rf ..] (host) into slot slots[i], i < n. */
int tcache_cuda_scatter(tcache_cuda_t *c, tcache_cuda_role_t role, const void *slots, size_t n, const float *rows, char *err,
                size_t err_len);
/* slot slots[i]'s row into rows[i * rf ..] (host), i < n. */
int tcache_cuda_gather(tcache_cuda_t *c, tcache_cuda_role_t role, const void *slots, size_t n, float *rows, char *err, size_t err_len);

/* The pooled embeddings of n samples: idx (host) holds the slot of every
 * id, table-major and sample-major inside a table (table t's n *
 * hotness[t] entries at offset sum over t' < t of n * hotness[t']); emb
 * (DEVICE, n rows of n_tables * dim floats) gets table t's sums at column
 * t * dim.  Keeps idx on the device for tcache_cuda_backward.  TCACHE_CUDA_TRAIN. */
int tcache_cuda_forward(tcache_cuda_t *c, const uint64_t *idx, uint32_t n, float *emb, char *err, size_t err_len);
/* As tcache_cuda_forward, but skip[t] != 0 (skip = NULL: none) leaves table
 * t alone, as embag_fwd's skip does: its idx entries name no slot and are
 * neither checked nor pooled (only copied along), its columns of emb are
 * not written, and
 * tcache_cuda_backward refuses it (-EINVAL) until the next forward. */
int tcache_cuda_forward_skip(tcache_cuda_t *c, const uint64_t *idx, uint32_t n, const uint8_t *skip, float *emb,
                             char *err, size_t err_len);

/* Table t of the last tcache_cuda_forward: d_emb (DEVICE, n rows of n_tables * dim
 * floats, the model's input gradient) folded per slot, coalesced in sample
 * order; *n_uniq unique slots ascending into uniq[] and their gradients
 * into grad[k * dim ..] (host; room for n * hotness[t] entries).  A table
 * the last forward skipped: -EINVAL.  TCACHE_CUDA_TRAIN. */
int tcache_cuda_backward(tcache_cuda_t *c, const float *d_emb, uint32_t table, uint64_t *uniq, float *grad, uint32_t *n_uniq,
                 char *err, size_t err_len);

/* opt_row_update(kind, hp, row of slots[i], dim, grads + i * dim) for
 * i < n (slots aligned, host; grads host).  The slots are distinct. */
int tcache_cuda_update_rows(tcache_cuda_t *c, tcache_cuda_role_t role, const uint32_t *slots, size_t n, const float *grads,
                    opt_kind_t kind, const opt_hparams_t *hp, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
