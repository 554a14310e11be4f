/*
 * opt: dense and embedding-row optimizers (rules in opt.h).
 *
 * Dense state is one array next to the parameters (adagrad: h[n]; adam:
 * m[n] then v[n]); row state is read and written in the row itself.  Loops
 * are element-wise in index order, so results are deterministic and the
 * same for every clone of a vectorized loop.
 */
#include "opt.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "pool.h"

#if defined(__GNUC__) && !defined(__clang__)
#define OPT_HOT __attribute__((optimize("O3", "no-math-errno")))
#else
#define OPT_HOT
#endif

struct opt_s {
  opt_kind_t kind;
  opt_hparams_t hp;
  size_t n;
  uint64_t t;     /* steps taken */
  float *state;   /* adagrad: h[n]; adam: m[n], v[n] */
  size_t state_n;
};

static const char *const kind_names[] = {"sgd", "adagrad", "rowwise_adagrad", "adam"};

int opt_kind_parse(const char *name, opt_kind_t *out) {
  for (int k = 0; k < 4; k++)
    if (name && strcmp(name, kind_names[k]) == 0) {
      *out = (opt_kind_t)k;
      return 0;
    }
  return -EINVAL;
}

const char *opt_kind_name(opt_kind_t k) {
  return (unsigned)k < 4 ? kind_names[k] : "?";
}

void opt_hparams_from_cfg(const cfg_t *cfg, opt_kind_t kind, opt_hparams_t *hp) {
  memset(hp, 0, sizeof(*hp));
  hp->lr = (float)cfg_float(cfg, "learning_rate");
  hp->beta1 = (float)cfg_float(cfg, "adam_beta1");
  hp->beta2 = (float)cfg_float(cfg, "adam_beta2");
  hp->adagrad_init = (float)cfg_float(cfg, "adagrad_init");
  hp->eps = (float)cfg_float(cfg, kind == OPT_ADAM ? "adam_eps" : "adagrad_eps");
}

int opt_create_kind(opt_kind_t kind, const opt_hparams_t *hp, size_t n_params,
                    opt_t **out) {
  *out = NULL;
  if (kind == OPT_ROWWISE_ADAGRAD || (unsigned)kind > OPT_ADAM) return -EINVAL;
  opt_t *o = calloc(1, sizeof(*o));
  if (!o) return -ENOMEM;
  o->kind = kind;
  o->hp = *hp;
  o->n = n_params;
  o->state_n = kind == OPT_ADAGRAD ? n_params : kind == OPT_ADAM ? 2 * n_params : 0;
  if (o->state_n) {
    o->state = malloc(o->state_n * sizeof(float));
    if (!o->state) {
      free(o);
      return -ENOMEM;
    }
    float init = kind == OPT_ADAGRAD ? hp->adagrad_init : 0.0f;
    for (size_t i = 0; i < o->state_n; i++) o->state[i] = init;
  }
  *out = o;
  return 0;
}

int opt_create(const cfg_t *cfg, size_t n_params, opt_t **out) {
  opt_kind_t kind;
  int rc = opt_kind_parse(cfg_str(cfg, "optimizer"), &kind);
  if (rc < 0) {
    *out = NULL;
    return rc;
  }
  opt_hparams_t hp;
  opt_hparams_from_cfg(cfg, kind, &hp);
  return opt_create_kind(kind, &hp, n_params, out);
}

void opt_destroy(opt_t *o) {
  if (!o) return;
  free(o->state);
  free(o);
}

OPT_HOT static void sgd(float *restrict w, const float *restrict g, size_t n, float lr) {
  for (size_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

OPT_HOT static void adagrad(float *restrict w, float *restrict h, const float *restrict g,
                            size_t n, float lr, float eps) {
  for (size_t i = 0; i < n; i++) {
    h[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (sqrtf(h[i]) + eps);
  }
}

OPT_HOT static void adam(float *restrict w, float *restrict m, float *restrict v,
                         const float *restrict g, size_t n, float b1, float b2,
                         float lr_t, float eps_t) {
  float c1 = 1.0f - b1, c2 = 1.0f - b2;
  for (size_t i = 0; i < n; i++) {
    m[i] = b1 * m[i] + c1 * g[i];
    v[i] = b2 * v[i] + c2 * (g[i] * g[i]);
    w[i] -= lr_t * m[i] / (sqrtf(v[i]) + eps_t);
  }
}

void opt_adam_bias(const opt_hparams_t *hp, uint64_t t, float *lr_t, float *eps_t) {
  double td = (double)t;
  double bc1 = 1.0 - pow(hp->beta1, td), bc2 = 1.0 - pow(hp->beta2, td);
  *lr_t = (float)(hp->lr * sqrt(bc2) / bc1);
  *eps_t = (float)(hp->eps * sqrt(bc2));
}

/* Elements [lo, hi) of step t. */
static void step_range(opt_t *o, float *params, const float *grads, size_t lo, size_t hi) {
  size_t n = hi - lo;
  switch (o->kind) {
    case OPT_SGD:
      sgd(params + lo, grads + lo, n, o->hp.lr);
      break;
    case OPT_ADAGRAD:
      adagrad(params + lo, o->state + lo, grads + lo, n, o->hp.lr, o->hp.eps);
      break;
    case OPT_ADAM: {
      float lr_t, eps_t;
      opt_adam_bias(&o->hp, o->t, &lr_t, &eps_t);
      adam(params + lo, o->state + lo, o->state + o->n + lo, grads + lo, n, o->hp.beta1,
           o->hp.beta2, lr_t, eps_t);
      break;
    }
    default:
      ASSERT(!"bad dense optimizer");
  }
}

void opt_step(opt_t *o, float *params, const float *grads) {
  o->t++;
  step_range(o, params, grads, 0, o->n);
}

typedef struct step_job_s {
  opt_t *o;
  float *params;
  const float *grads;
} step_job_t;

static void step_job(void *arg, uint32_t tid, uint32_t nt) {
  step_job_t *j = arg;
  size_t n = j->o->n, lo = n * tid / nt, hi = n * (tid + 1) / nt;
  lo &= ~(size_t)15; /* slices on cache lines */
  if (tid + 1 < nt) hi &= ~(size_t)15;
  step_range(j->o, j->params, j->grads, lo, hi);
}

void opt_step_pool(opt_t *o, float *params, const float *grads, struct pool_s *pool) {
  o->t++;
  step_job_t j = {o, params, grads};
  pool_run(pool, step_job, &j);
}

opt_kind_t opt_kind(const opt_t *o) { return o->kind; }
float *opt_state(opt_t *o) { return o->state; }
size_t opt_state_floats(const opt_t *o) { return o->state_n; }
uint64_t opt_steps(const opt_t *o) { return o->t; }
void opt_set_steps(opt_t *o, uint64_t t) { o->t = t; }
size_t opt_n_params(const opt_t *o) { return o->n; }
const opt_hparams_t *opt_hparams(const opt_t *o) { return &o->hp; }

uint32_t opt_row_state_floats(opt_kind_t kind, uint32_t dim) {
  switch (kind) {
    case OPT_ADAGRAD: return dim;
    case OPT_ROWWISE_ADAGRAD: return 1;
    default: return 0;
  }
}

OPT_HOT void opt_row_update(opt_kind_t kind, const opt_hparams_t *hp, float *row,
                            uint32_t dim, const float *grad) {
  switch (kind) {
    case OPT_SGD:
      sgd(row, grad, dim, hp->lr);
      break;
    case OPT_ADAGRAD:
      adagrad(row, row + dim, grad, dim, hp->lr, hp->eps);
      break;
    case OPT_ROWWISE_ADAGRAD: {
      float ss = 0.0f;
      for (uint32_t d = 0; d < dim; d++) ss += grad[d] * grad[d];
      float h = row[dim] + ss / (float)dim;
      row[dim] = h;
      float step = hp->lr / (sqrtf(h) + hp->eps);
      for (uint32_t d = 0; d < dim; d++) row[d] -= step * grad[d];
      break;
    }
    default:
      ASSERT(!"bad embedding optimizer");
  }
}
