/*
 * model_internal: the model's plan and buffers (struct model_s) and the
 * helpers model.c shares with model_dlrm_dcn.c, the one model kept in a
 * file of its own.  Only those two files include it, and model.cu, which
 * takes its plan (model__plan) and initialization (model__init_params)
 * from here rather than keeping copies.
 */
#ifndef CHANTER_MODEL_INTERNAL_H
#define CHANTER_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "model.h"
#include "nn.h"
#include "pool.h"

#define MAX_LAYERS 32
#define MAX_CROSS 64

typedef enum init_e { INIT_ZERO = 0, INIT_HE, INIT_XAVIER } init_t;

/* One parameter tensor: offset and size in the parameter array, how it is
 * initialized (fans for the uniform limits). */
typedef struct tensor_s {
  size_t off, len;
  init_t init;
  uint32_t fan_in, fan_out;
} tensor_t;

typedef struct lin_s {
  uint32_t in, out;
  size_t w, b; /* offsets of W [out x in] and b [out] */
  nn_act_t act;
} lin_t;

typedef struct mlp_s {
  uint32_t n;
  lin_t l[MAX_LAYERS];
  float *y[MAX_LAYERS];  /* outputs [max_batch x out] */
  float *dy[MAX_LAYERS]; /* gradients of the outputs */
} mlp_t;

/* One part of a batch: its rows, and where its parameter gradients go
 * (part 0: the model's grads; the others: private buffers summed into it). */
typedef struct part_s {
  uint32_t i0, n;
  float *g;
  double loss;
} part_t;

struct model_s {
  model_kind_t kind;
  uint32_t n_dense, n_tables, dim, max_batch;
  uint32_t emb_w; /* n_tables * dim */
  uint32_t d0;    /* the concatenated input x0: n_dense + emb_w (wdl, deepfm,
                   * dcn), dim + emb_w (dlrm_dcn: bottom output and emb) */
  size_t n_params;
  float *params, *grads;
  tensor_t tensors[4 * MAX_LAYERS + 3 * MAX_CROSS];
  uint32_t n_tensors;

  mlp_t bottom, top, deep; /* dlrm: bottom, top; others: deep */
  int has_bottom;
  uint32_t inter_w;
  float *inter, *d_inter, *d_emb_scratch;

  lin_t wide; /* wdl wide part / deepfm first-order part */
  float *wide_y, *wide_dy, *fm_y;
  float *x0, *dx0;

  uint32_t n_cross;
  size_t cross_w[MAX_CROSS], cross_b[MAX_CROSS];
  float *xl[MAX_CROSS + 1], *sl[MAX_CROSS], *dxl;
  /* dlrm_dcn: rank (0 = full), V's offset (cross_w holds U or W), each
   * layer's z (and t = x V^T), the backward's scratch dz, dt */
  uint32_t rank;
  size_t cross_v[MAX_CROSS];
  float *zl[MAX_CROSS], *tl[MAX_CROSS], *dz, *dt;
  lin_t final;
  float *cat, *dcat, *final_y;

  float *dlogits;
  float *zbuf;              /* where the forward leaves the logits */
  const float *dense, *emb; /* inputs of the last forward */
  uint32_t n;               /* samples of the last forward */
  const float *labels;      /* arguments of the running backward */
  float scale;
  float *d_emb_out;
  char desc[1024];

  /* parts and threads */
  part_t part[MODEL_PARTS];
  float *pgrads[MODEL_PARTS]; /* [0] = grads */
  pool_t *pool;               /* NULL: single-threaded */
  model_grad_ready_fn ready;  /* model_set_grad_ready */
  void *ready_ud;

  void *allocs[8 * MAX_LAYERS + 4 * MAX_CROSS + 32 + MODEL_PARTS];
  uint32_t n_allocs;
};

/* Rows [i0, i0 + n) of part p in a per-sample buffer of width w. */
#define MODEL_ROWS(buf, w) ((buf) + (size_t)p->i0 * (w))

/* ---- planning (model.c): tensors are added in layout order */
/* Plans the model of cfg's model key into m (zeroed by the caller):
 * kind, shapes, the parameter tensors and layers in layout order,
 * n_params and desc; nothing is allocated and no buffer pointer is set,
 * so a plan-only m is freed with free().  model_create plans with it and
 * model.cu's model_cuda_create copies its fields: one plan for both.
 * 0, or ERR_CONFIG / -EINVAL with err set. */
int model__plan(model_t *m, const cfg_t *cfg, uint32_t n_dense, uint32_t n_tables, uint32_t dim,
                uint32_t max_batch, char *err, size_t err_len);
/* The initial parameters (model.h's initialization) of n_tensors tensors
 * into params (n_params floats, host memory): model_init's, and
 * model_cuda_init's before it copies them to the device. */
void model__init_params(const tensor_t *tensors, uint32_t n_tensors, uint64_t seed, float *params);
size_t model__add_tensor(model_t *m, size_t len, init_t init, uint32_t fan_in, uint32_t fan_out);
/* An MLP in -> sizes[0] -> ... -> sizes[k-1] (-> final_out when > 0);
 * ReLU after every layer except an appended final_out layer. */
int model__plan_mlp(model_t *m, mlp_t *p, uint32_t in, const uint32_t *sizes, size_t k,
                    uint32_t final_out);
/* The comma-separated layer sizes of cfg key (at most MAX_LAYERS - 1). */
int model__parse_sizes(const cfg_t *cfg, const char *key, uint32_t *sizes, size_t *k, char *err,
                       size_t err_len);
void model__describe_mlp(char *buf, size_t len, const char *name, const mlp_t *p);
/* ---- memory: n zeroed floats, 64-byte aligned, owned by m; NULL when out
 * of memory */
float *model__alloc(model_t *m, size_t n);
int model__alloc_mlp(model_t *m, mlp_t *p);
/* ---- layers over part p's rows */
const float *model__mlp_fwd(model_t *m, mlp_t *q, const part_t *p, const float *x);
void model__mlp_bwd_layer(model_t *m, mlp_t *q, const part_t *p, uint32_t i, const float *x,
                          float *dx, int acc);
/* The GEMMs of linear layer l over n samples (dx's when need_dx), appended
 * at out[k] (up to cap); returns the new count. */
size_t model__add_gemms(const lin_t *l, uint32_t n, int need_dx, model_gemm_t *out, size_t cap,
                        size_t k);

/* ---- dlrm_dcn (model_dlrm_dcn.c), called by model.c's switches */
int model__dcn2_plan(model_t *m, const cfg_t *cfg, char *err, size_t err_len);
int model__dcn2_alloc(model_t *m);
void model__dcn2_describe(model_t *m);
void model__dcn2_forward(model_t *m, const part_t *p);
uint32_t model__dcn2_stages(const model_t *m);
size_t model__dcn2_stage_lo(const model_t *m, uint32_t s);
void model__dcn2_backward_stage(model_t *m, part_t *p, uint32_t s, const float *dl, float *d_emb);
size_t model__dcn2_gemms(const model_t *m, uint32_t n, model_gemm_t *out, size_t cap);

#endif
