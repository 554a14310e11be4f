/*
 * model: the five recommendation models (DLRM, Wide&Deep, DeepFM,
 * Deep&Cross, DLRM-DCNv2) over the layers of nn.h, CPU reference
 * implementation.
 *
 * A model sees a batch as dense features [n x n_dense] and the POOLED
 * embeddings of its n_tables tables [n x n_tables*dim] (sample-major: table
 * t of sample i at emb[i*n_tables*dim + t*dim]); gathering rows, pooling
 * them (nn_embedding_bag_fwd) and applying their optimizer is the
 * trainer's job, because rows live in caches or on embedding servers.
 * model_backward hands back d_emb in the same layout for that purpose.
 *
 * All dense parameters live in ONE contiguous float array (model_params),
 * their gradients in another with the same layout (model_grads), so a
 * distributed trainer all-reduces one buffer and the optimizer (opt.h) and
 * the digest see one array.  Layout: the model's linear layers in the order
 * listed below, each as W [out x in] row-major then b [out]; DCN cross
 * layers as w [d0] then b [d0].
 *   dlrm:   bottom MLP (n_dense -> model.bottom_mlp... -> dim, ReLU on every
 *           layer), dot interaction of [bottom, emb_0..] (F = 1 + n_tables
 *           vectors; without dense features F = n_tables and no bottom MLP),
 *           top MLP (dim + F(F-1)/2 -> model.top_mlp... -> 1, ReLU on hidden).
 *   wdl:    x0 = concat(dense, emb); wide linear x0 -> 1; deep MLP
 *           x0 -> model.deep_mlp... -> 1.  logit = wide + deep.
 *   deepfm: x0 as wdl; first-order linear x0 -> 1; FM second-order term over
 *           the n_tables embeddings (no parameters); deep MLP as wdl.
 *           logit = linear + fm + deep.
 *   dcn:    x0 as wdl (width d0 = n_dense + n_tables*dim);
 *           model.cross_layers cross layers; deep MLP x0 -> model.deep_mlp
 *           (hidden sizes, ReLU); final linear concat(x_L, deep) -> 1.
 *   dlrm_dcn: MLPerf DLRMv2 (TorchRec's DLRM_DCN): dlrm's bottom MLP;
 *           x0 = concat(bottom, emb_0..) (d0 = dim + n_tables*dim; emb
 *           alone without dense features); model.cross_layers DCNv2 cross
 *           layers x_{l+1} = x0 * (U_l (V_l^T x_l) + b_l) + x_l of rank
 *           r = model.cross_rank, each laid out V [r x d0], U [d0 x r],
 *           b [d0] (r = 0: full rank, W [d0 x d0], b [d0]:
 *           x_{l+1} = x0 * (W_l x_l + b_l) + x_l) (nn_cross2_fwd); top MLP
 *           x_L -> model.top_mlp... -> 1 (ReLU on hidden).
 *
 * Initialization (model_init, deterministic from the seed alone, no
 * global RNG): weights of a linear layer followed by ReLU (every hidden
 * layer, and DLRM's bottom output) are He-uniform, U(-sqrt(6/in),
 * sqrt(6/in)); of a linear layer producing a logit Xavier-uniform,
 * U(-sqrt(6/(in+out)), sqrt(6/(in+out))); biases 0; cross weights
 * Xavier-uniform over (d0, 1), cross biases 0; DCNv2's V, U and W
 * Xavier-uniform over their (in, out) as linear maps ((d0, r), (r, d0),
 * (d0, d0); TorchRec draws them Xavier-normal, of the same variance),
 * their biases 0.  Each value is
 * table_mix64(seed, tensor number, element index) mapped to [-1, 1) with 24
 * bits, so it does not depend on thread count or call order.
 *
 * Determinism: same config + seed + inputs -> bit-identical logits, losses,
 * gradients and parameters, whatever the thread count (see "threads"
 * below and nn.h) on one OpenBLAS kernel set: each set (blas_cpu.h picks it
 * per process from the CPU's features; summary.json's "blas" names it)
 * rounds its GEMMs differently, so machines whose kernel sets differ agree
 * only to the last bits, and digests compare only on one kernel set.
 *
 * Threads: a model_t is driven by one thread at a time; inside
 * model_forward / model_backward the model runs its own worker threads
 * (below).  Everything a step needs is allocated by model_create: a step
 * does no malloc.
 */
#ifndef CHANTER_MODEL_H
#define CHANTER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"

typedef struct model_s model_t;

typedef enum model_kind_e {
  MODEL_DLRM = 0,
  MODEL_WDL = 1,
  MODEL_DEEPFM = 2,
  MODEL_DCN = 3,
  MODEL_DLRM_DCN = 4,
} model_kind_t;

/* "dlrm" -> MODEL_DLRM ...; -EINVAL for an unknown name. */
int model_kind_parse(const char *name, model_kind_t *out);
const char *model_kind_name(model_kind_t k);

/* Builds the model named by cfg "model" with layer sizes from the model.*
 * keys, for batches of up to max_batch samples, and allocates its
 * parameters, gradients and activations (nothing is allocated later).
 * Parameters are zero until model_init.  Returns 0, -EINVAL or ERR_CONFIG
 * (with a sentence in err) for an unusable shape, -ENOMEM. */
int model_create(const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables,
                 uint32_t dim, uint32_t max_batch, model_t **out, char *err,
                 size_t err_len);
void model_destroy(model_t *m);

/* ---- threads.  A batch is cut into MODEL_PARTS parts of consecutive rows
 * (boundaries depend on n only).  Each part runs forward and backward on
 * its own, writing its parameter gradients to its own buffer; backward then
 * sums them in part order.  The model's threads run the parts (thread t the
 * parts t, t+T, ...), each part's GEMMs single-threaded, so the threads
 * meet only at the end of the forward, of the backward and of the gradient
 * sum (no locking inside a GEMM), and the results are bit-identical for ANY
 * thread count: they depend on MODEL_PARTS, not on T.  With T > 1
 * the model sets OpenBLAS to one thread, process-wide (our threads call
 * sgemm concurrently).  model_create starts T = the CPUs in the process's
 * affinity mask, at most MODEL_PARTS. */
#define MODEL_PARTS 4
/* Restarts the model's threads with n threads in all (the caller's
 * included; 0 = the default above, capped at MODEL_PARTS).  Not during a
 * step.  0 or -EAGAIN (then the model runs single-threaded). */
int model_set_threads(model_t *m, uint32_t n);
uint32_t model_threads(const model_t *m);
/* The model's pool (NULL when single-threaded; pool_run accepts NULL), for
 * a trainer's own parallel work between steps: the optimizer
 * (opt_step_pool), per-table embedding work.  Not during a step. */
struct pool_s *model_pool(model_t *m);

/* Deterministic initialization from seed (see above); also zeroes grads. */
void model_init(model_t *m, uint64_t seed);

model_kind_t model_kind(const model_t *m);
size_t model_n_params(const model_t *m);
/* The one contiguous parameter / gradient arrays (model_n_params floats),
 * owned by the model.  Writing params (restore, optimizer) is allowed
 * between steps. */
float *model_params(model_t *m);
float *model_grads(model_t *m);
uint32_t model_max_batch(const model_t *m);

/* Forward pass over n <= max_batch samples: dense [n x n_dense] (may be
 * NULL when n_dense == 0), emb [n x n_tables*dim] sample-major.  Writes n
 * logits.  Keeps the activations (and pointers to dense / emb, which must
 * stay unchanged until model_backward) for the backward pass. */
void model_forward(model_t *m, uint32_t n, const float *dense, const float *emb,
                   float *logits);

/* Backward pass for the last model_forward (same n).  labels[n] in {0,1}.
 * Writes model_grads (overwritten) = scale * d(sum of BCE losses)/dparams,
 * and d_emb [n x n_tables*dim] (same layout as emb, also scaled; may be
 * NULL).  A trainer of global batch B passes scale = 1/B so that summing
 * gradients across trainers gives the gradient of the mean loss.  Returns
 * the SUM of the n BCE-with-logits losses (unscaled). */
double model_backward(model_t *m, uint32_t n, const float *labels, float scale,
                      float *d_emb);

/* ---- overlapping communication with the backward.  model_backward runs
 * layer by layer, last layer first; parameters are laid out in forward
 * order, so the gradients that are final form a growing suffix of
 * model_grads.  When set, fn(ud, lo) is called on the thread that called
 * model_backward, inside it, each time the suffix [lo, n_params) grows
 * (lo strictly decreasing, the last call with lo = 0), while the model's
 * other threads go on with the next layer: fn may hand grads[lo, ...) to
 * another thread (e.g. to all-reduce it) and must return quickly; nothing
 * in the backward touches grads[lo, n_params) after the call.  NULL
 * removes the hook.  Not during a step. */
typedef void (*model_grad_ready_fn)(void *ud, size_t lo);
void model_set_grad_ready(model_t *m, model_grad_ready_fn fn, void *ud);
/* How many layer stages a backward has (one hook call per stage that owns
 * parameters, at most). */
uint32_t model_backward_stages(const model_t *m);

/* A human-readable one-line description, e.g.
 * "dlrm bottom=13-512-256-64-16 top=367-512-256-1 params=...". */
const char *model_describe(const model_t *m);

/* ---- accounting for benchmarks */
typedef struct model_gemm_s {
  uint32_t m, n, k;      /* C[m x n] = op(A)[m x k] op(B)[k x n], row-major */
  uint8_t trans_a, trans_b;
} model_gemm_t;
/* The GEMMs one forward+backward step over n samples performs, in order
 * (up to cap entries written); returns how many there are. */
size_t model_gemms(const model_t *m, uint32_t n, model_gemm_t *out, size_t cap);
/* Floating-point operations per sample of forward + backward counted from
 * the GEMMs (2*m*n*k / n_samples each); elementwise work is not counted. */
double model_gemm_flops_per_sample(const model_t *m);

#endif
