/*
 * nn: the layers the five recommendation models are built from, forward and
 * backward, in plain C over OpenBLAS (cblas_sgemm for every matrix product).
 *
 * Conventions shared by every layer (and by the CUDA mirror nn.cu, which has
 * the same names and argument order over device pointers):
 *  - activations are row-major, one sample per row: x[n x in];
 *  - every buffer is provided by the caller (the model owns its activations
 *    and parameters), nothing here allocates, so a training step does no
 *    malloc;
 *  - backward functions OVERWRITE parameter gradients (each parameter is
 *    used once per model) unless an argument says "accumulate";
 *  - results are deterministic: fixed loop orders, no reassociation (the
 *    build is -std=c11, so no FMA contraction either), and OpenBLAS
 *    partitions a GEMM across its threads by output blocks, never along K,
 *    so the same shapes and thread count give the same bits every run on
 *    one OpenBLAS kernel set (blas_cpu.h: other sets round differently).
 * Functions are reentrant; one call may use OpenBLAS's thread pool.
 */
#ifndef CHANTER_NN_H
#define CHANTER_NN_H

#include <stddef.h>
#include <stdint.h>

typedef enum nn_act_e {
  NN_ACT_NONE = 0,
  NN_ACT_RELU = 1,
} nn_act_t;

/* ---- linear: y[n x out] = act(x[n x in] W^T + b), W row-major [out x in],
 * b[out] (b may be NULL: no bias).  The bias and ReLU are fused into one
 * pass after the GEMM. */
void nn_linear_fwd(const float *x, uint32_t n, uint32_t in, uint32_t out,
                   const float *w, const float *b, nn_act_t act, float *y);
/* Backward of nn_linear_fwd.  y is the forward output (used for the ReLU
 * mask when act == NN_ACT_RELU); dy[n x out] is the gradient w.r.t. y and
 * is modified in place (becomes the gradient before the activation).
 * Writes dw[out x in] = dy^T x and db[out] = column sums of dy (db may be
 * NULL when there is no bias); dx[n x in] = dy W is overwritten, or added
 * to when dx_accumulate, or skipped when dx is NULL. */
void nn_linear_bwd(const float *x, const float *y, float *dy, uint32_t n,
                   uint32_t in, uint32_t out, const float *w, nn_act_t act,
                   float *dw, float *db, float *dx, int dx_accumulate);

/* ---- element-wise, over len = n * width floats (x and y may alias) */
void nn_relu_fwd(const float *x, size_t len, float *y);
/* dx = dy * (y > 0); dx may alias dy. */
void nn_relu_bwd(const float *y, const float *dy, size_t len, float *dx);
void nn_sigmoid_fwd(const float *x, size_t len, float *y);
/* dx = dy * y * (1 - y) from the forward output y; dx may alias dy. */
void nn_sigmoid_bwd(const float *y, const float *dy, size_t len, float *dx);

/* ---- binary cross-entropy with logits, numerically stable:
 * loss_i = max(z,0) - z*t + log1p(exp(-|z|)).  Returns the SUM over the n
 * samples (double).  labels are 0/1 floats (any t in [0,1] works). */
double nn_bce_logits_fwd(const float *logits, const float *labels, uint32_t n);
/* dlogits_i = scale * (sigmoid(z_i) - t_i).  Returns the same sum as _fwd. */
double nn_bce_logits_bwd(const float *logits, const float *labels, uint32_t n,
                         float scale, float *dlogits);

/* ---- concatenation of per-sample row pieces.  Piece p of sample i is
 * src[p][i*src_stride[p] .. + width[p]); it lands at
 * dst[i*dst_stride + sum of width[<p]].  Backward is nn_split: the inverse
 * (dst pieces may be NULL to skip one; accumulate adds instead of copying). */
void nn_concat_fwd(uint32_t n, uint32_t n_pieces, const float *const *src,
                   const size_t *src_stride, const uint32_t *width, float *dst,
                   size_t dst_stride);
void nn_concat_bwd(uint32_t n, uint32_t n_pieces, const float *d_dst,
                   size_t d_dst_stride, const uint32_t *width, float *const *d_src,
                   const size_t *d_src_stride, int accumulate);

/* ---- embedding bag (sum pooling).  Row r of the store starts at
 * base + r * row_stride (row_stride in floats: dim + optimizer state, or
 * anything larger); idx[i*hotness + h] is the h-th row of sample i.
 * out[i*out_stride + d] = sum_h base[idx[i*hotness+h]*row_stride + d],
 * summed in h order (one-hot: a copy). */
void nn_embedding_bag_fwd(const float *base, size_t row_stride,
                          const uint64_t *idx, uint32_t n, uint32_t hotness,
                          uint32_t dim, float *out, size_t out_stride);
/* Bytes of workspace nn_embedding_bag_bwd needs for n * hotness ids. */
size_t nn_embedding_bag_bwd_work_size(uint32_t n, uint32_t hotness);
/* Backward with gradients coalesced per row: writes the sorted unique ids
 * to uniq[] (capacity n * hotness) and one summed gradient row for each,
 * grad[k*grad_stride + d] (grad_stride >= dim floats, capacity
 * n * hotness rows), where the gradient of sample i is
 * d_out[i*d_out_stride + d].  Deterministic: ids ascending, each row's
 * contributions added in sample order (then h order), starting from 0.
 * work: nn_embedding_bag_bwd_work_size() bytes, 8-byte aligned.  Returns
 * the number of unique ids. */
uint32_t nn_embedding_bag_bwd(const float *d_out, size_t d_out_stride,
                              const uint64_t *idx, uint32_t n, uint32_t hotness,
                              uint32_t dim, uint64_t *uniq, float *grad,
                              size_t grad_stride, void *work);

/* ---- DLRM pairwise dot interaction.  Per sample the F = n_vec vectors of
 * dim floats are: vector 0 = bottom[i*bottom_stride ..] when bottom is not
 * NULL, then the n_emb pooled embeddings emb[i*emb_stride + t*dim ..].
 * out[i*out_stride ..] = [bottom vector (dim floats, only when bottom is
 * given), Z] with Z the strictly-lower-triangle dot products in DLRM's
 * order: (1,0), (2,0), (2,1), (3,0), ... i.e. F*(F-1)/2 floats. */
uint32_t nn_interact_out_width(uint32_t n_emb, uint32_t dim, int has_bottom);
/* 1 if the per-sample scratch (kept on the stack) fits this shape: about
 * F <= 90 vectors and F * dim <= 8192 floats. */
int nn_interact_fits(uint32_t n_emb, uint32_t dim, int has_bottom);
void nn_interact_fwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     float *out, size_t out_stride);
/* Gradients: d_bottom (overwritten; may be NULL when bottom was NULL) and
 * d_emb[i*d_emb_stride + t*dim ..] (overwritten), from d_out and the same
 * inputs as forward. */
void nn_interact_bwd(const float *bottom, size_t bottom_stride, const float *emb,
                     size_t emb_stride, uint32_t n, uint32_t n_emb, uint32_t dim,
                     const float *d_out, size_t out_stride, float *d_bottom,
                     float *d_emb, size_t d_emb_stride);

/* ---- factorization machine second-order term over n_emb vectors of dim:
 * out[i] = 0.5 * sum_d ((sum_t v_td)^2 - sum_t v_td^2), v_t = emb[i*emb_stride
 * + t*dim ..].  Backward: d_emb[..t*dim + d] = d_out[i] * (sum_t' v_t'd - v_td),
 * overwritten when !accumulate, else added. */
void nn_fm_fwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
               uint32_t dim, float *out);
void nn_fm_bwd(const float *emb, size_t emb_stride, uint32_t n, uint32_t n_emb,
               uint32_t dim, const float *d_out, float *d_emb,
               size_t d_emb_stride, int accumulate);

/* ---- DCN cross layer over width-d rows:
 * y = x0 * (x . w) + b + x, per sample (x . w a scalar).  s[n] receives the
 * per-sample x . w (needed by backward).  y must not alias x or x0. */
void nn_cross_fwd(const float *x0, const float *x, uint32_t n, uint32_t d,
                  const float *w, const float *b, float *s, float *y);
/* Backward: given dy, writes dw[d], db[d] (overwritten), dx (overwritten;
 * may alias dy) and adds into dx0 (accumulated: x0 feeds every layer).
 * Uses s from forward. */
void nn_cross_bwd(const float *x0, const float *x, const float *s, uint32_t n,
                  uint32_t d, const float *w, const float *dy, float *dw,
                  float *db, float *dx, float *dx0);

/* ---- a stack of L cross layers from x_0 = x0, fused per sample so that
 * the sample's rows stay in cache across layers.  xl[l] (l = 1..L) receive
 * x_l and s[l-1] the per-sample x_{l-1} . w[l-1]; w[l], b[l] are layer l+1's
 * parameters.  Bit for bit the same as L calls of nn_cross_fwd. */
void nn_cross_stack_fwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                        const float *const *w, const float *const *b, float *const *s,
                        float *const *xl);
/* Backward: dy [n x d] holds d x_L (it is used as scratch); dw[l], db[l]
 * are overwritten; dx0 receives, added to what it holds, the gradient
 * through every layer's x0 term and through x_0 itself.  Bit for bit the
 * same as nn_cross_bwd for l = L-1 .. 0 followed by dx0 += (d x_0). */
void nn_cross_stack_bwd(const float *x0, uint32_t n, uint32_t d, uint32_t L,
                        const float *const *w, const float *const *xl,
                        const float *const *s, float *dy, float *const *dw,
                        float *const *db, float *dx0);

/* ---- DCNv2 cross layer (DLRMv2's interaction; Wang et al. 2021, TorchRec's
 * LowRankCrossNet / CrossNet) over width-d rows:
 *   rank r > 0:  t = x V^T [n x r],  z = t U^T + b     (v = V [r x d], w = U [d x r])
 *   rank r = 0:  z = x W^T + b                         (w = W [d x d], v and t unused)
 *   y = x0 * z + x  (element-wise, (x0*z) + x)
 * Both products are GEMMs (nn_linear_fwd).  z [n x d] (and t) are kept for
 * the backward; y must not alias x, x0 or z. */
void nn_cross2_fwd(const float *x0, const float *x, uint32_t n, uint32_t d, uint32_t r,
                   const float *w, const float *v, const float *b, float *t, float *z,
                   float *y);
/* Backward from the same inputs: g [n x d] holds d y on entry and d x on
 * return (in place); dz [n x d] and dt [n x r] are scratch; dw (U or W),
 * dv (r > 0) and db are overwritten; dx0 += g * z (added: x0 feeds every
 * layer of a stack). */
void nn_cross2_bwd(const float *x0, const float *x, const float *t, const float *z,
                   uint32_t n, uint32_t d, uint32_t r, const float *w, const float *v,
                   float *g, float *dz, float *dt, float *dw, float *dv, float *db,
                   float *dx0);

/* The OpenBLAS kernel set a process runs is chosen in blas_cpu.h. */

#endif
