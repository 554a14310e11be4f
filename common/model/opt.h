/*
 * opt: optimizers.  Dense parameters (one contiguous array, model.h) use
 * sgd | adagrad | adam (config "optimizer") with their state held in an
 * opt_t; embedding rows use sgd | adagrad | rowwise_adagrad (config
 * "embedding_optimizer") with their state stored IN THE ROW, right after
 * the dim floats of the vector (table.h), because that is how it travels
 * between trainers, caches and embedding servers.
 *
 * Update rules (g the gradient, lr the learning rate):
 *   sgd:             w -= lr * g
 *   adagrad:         h += g*g;            w -= lr * g / (sqrt(h) + eps)
 *                    (dense h starts at adagrad_init; rows' h starts at 0,
 *                    as table_init_row zeroes the state)
 *   rowwise_adagrad: h += mean_d(g_d^2);  w_d -= lr * g_d / (sqrt(h) + eps)
 *                    (one float per row, FBGEMM's row-wise Adagrad)
 *   adam:            m = b1 m + (1-b1) g; v = b2 v + (1-b2) g*g;
 *                    w -= lr_t * m / (sqrt(v) + eps_t) with the bias
 *                    corrections folded in: lr_t = lr*sqrt(1-b2^t)/(1-b1^t),
 *                    eps_t = eps*sqrt(1-b2^t)  (Kingma & Ba, section 2).
 * Element-wise and in a fixed order: deterministic.  An opt_t is used by
 * one thread at a time.
 */
#ifndef CHANTER_OPT_H
#define CHANTER_OPT_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"

typedef enum opt_kind_e {
  OPT_SGD = 0,
  OPT_ADAGRAD = 1,
  OPT_ROWWISE_ADAGRAD = 2, /* embedding rows only */
  OPT_ADAM = 3,            /* dense only */
} opt_kind_t;

typedef struct opt_hparams_s {
  float lr;
  float eps;          /* adagrad_eps (adagrad, rowwise_adagrad) or adam_eps */
  float beta1, beta2; /* adam */
  float adagrad_init; /* initial dense Adagrad accumulator */
} opt_hparams_t;

/* "sgd" | "adagrad" | "rowwise_adagrad" | "adam" -> kind; -EINVAL. */
int opt_kind_parse(const char *name, opt_kind_t *out);
const char *opt_kind_name(opt_kind_t k);

/* Hyperparameters from cfg (learning_rate, adagrad_eps or adam_eps by
 * kind, adam_beta1/2, adagrad_init). */
void opt_hparams_from_cfg(const cfg_t *cfg, opt_kind_t kind, opt_hparams_t *hp);

/* ---- dense */
typedef struct opt_s opt_t;
/* The dense optimizer named by cfg "optimizer" for n_params parameters; its
 * state is allocated here (0, n or 2n floats) and initialized.  0, -EINVAL,
 * -ENOMEM. */
int opt_create(const cfg_t *cfg, size_t n_params, opt_t **out);
/* Same with an explicit kind and hyperparameters (tests, tools). */
int opt_create_kind(opt_kind_t kind, const opt_hparams_t *hp, size_t n_params,
                    opt_t **out);
void opt_destroy(opt_t *o);
/* One step: params -= update(grads); advances the step count. */
void opt_step(opt_t *o, float *params, const float *grads);
/* The same step with the parameters cut into one slice per thread of pool
 * (element-wise, so the result is that of opt_step, bit for bit). */
struct pool_s;
void opt_step_pool(opt_t *o, float *params, const float *grads, struct pool_s *pool);
opt_kind_t opt_kind(const opt_t *o);
/* The state array (opt_state_floats floats: adagrad h; adam m then v) and
 * step count, for checkpoints and digests.  Writable between steps. */
float *opt_state(opt_t *o);
size_t opt_state_floats(const opt_t *o);
uint64_t opt_steps(const opt_t *o);
void opt_set_steps(opt_t *o, uint64_t t);
/* The number of parameters o steps, and the hyperparameters it was
 * created with (owned by o). */
size_t opt_n_params(const opt_t *o);
const opt_hparams_t *opt_hparams(const opt_t *o);
/* Adam's bias-corrected learning rate and epsilon for step t (the t-th
 * step, counted from 1: opt_step uses opt_steps(o) after advancing it),
 * lr_t = lr*sqrt(1-b2^t)/(1-b1^t) and eps_t = eps*sqrt(1-b2^t) computed
 * in double and rounded to float once.  The one place they are computed:
 * opt_step and its device twin (opt_cuda.h) both call it, so both see
 * the same two floats. */
void opt_adam_bias(const opt_hparams_t *hp, uint64_t t, float *lr_t, float *eps_t);

/* ---- embedding rows */
/* Optimizer state floats stored after a row of dim floats: 0, dim, 1
 * (same as cfg_state_floats). */
uint32_t opt_row_state_floats(opt_kind_t kind, uint32_t dim);
/* Applies one update to row[0..dim) using and updating the state at
 * row[dim..dim+state).  kind is OPT_SGD, OPT_ADAGRAD or OPT_ROWWISE_ADAGRAD
 * (OPT_ADAM is a programmer error). */
void opt_row_update(opt_kind_t kind, const opt_hparams_t *hp, float *row,
                    uint32_t dim, const float *grad);

#endif
