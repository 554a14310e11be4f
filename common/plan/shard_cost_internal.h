/*
 * shard_cost_internal: the parameters of one kind of the cost model, as
 * shard_cost.c evaluates them and shard_fit.c fits them.  Not for other
 * modules: they use shard_cost.h.
 *
 * One flat array p holds, in this order (offsets from shard_net_off):
 *   w1[h1][F] b1[h1]   phi's hidden layer (tanh)
 *   w2[e][h1] s[e][F] b2[e]
 *                      phi's output u = w2 . hidden + s . x + b2, phi = exp(u)
 *   om[e]              rho's additive part: log(sum over k of exp(om_k) S_k), S
 *                      the sum of phi over the set's tables
 *   w3[h2][e] b3[h2]   rho's hidden layer on z = log(S) (tanh)
 *   w4[h2] v[e] b4     rho's output: the additive part + w4 . hidden + v . z + b4,
 *                      the log of the cost in microseconds
 */
#ifndef CHANTER_SHARD_COST_INTERNAL_H
#define CHANTER_SHARD_COST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "shard_cost.h"

#define SHARD_NET_MAX 256 /* the largest h1, e or h2 a file may give */

enum { NET_W1, NET_B1, NET_W2, NET_S, NET_B2, NET_OM, NET_W3, NET_B3, NET_W4, NET_V, NET_B4, NET_PARTS };

typedef struct shard_net_s {
  int present;
  uint32_t h1, e, h2;
  double mean[SHARD_FEATURES], sd[SHARD_FEATURES]; /* feature standardization */
  double *p;                                       /* shard_net_size() parameters */
  uint64_t sets_fit, sets_held;                    /* what it was fitted on, for the file */
  double held_med_rel, held_p90_rel;               /* relative error on the held-out sets (NAN: none) */
} shard_net_t;

struct shard_cost_s {
  char label[512];
  shard_net_t net[SHARD_KINDS];
  shard_coll_t coll[SHARD_COLLS];
  uint32_t extra_owners; /* shard_cost_share's, each given back by one shard_cost_destroy */
};

extern const char *const shard_net_part_name[NET_PARTS];

/* Size of each part, and where it starts in p. */
size_t shard_net_part_len(const shard_net_t *n, int part);
size_t shard_net_off(const shard_net_t *n, int part);
size_t shard_net_size(const shard_net_t *n);

/* Standardized features of t into xs[F]. */
void shard_net_inputs(const shard_net_t *n, const shard_table_t *t, uint32_t batch, double *xs);
/* phi of standardized inputs xs: the hidden layer into a1[h1] (may be
 * NULL: scratch), phi = exp(u) into rep[e] (u capped at SHARD_NET_UMAX). */
#define SHARD_NET_UMAX 60.0
void shard_net_phi(const shard_net_t *n, const double *xs, double *a1, double *rep);
/* rho of a sum s[e] > 0: z[e] = log(s) and the hidden a3[h2] (either may
 * be NULL), the additive part's sum into *add (may be NULL); returns the
 * log of the cost in microseconds. */
double shard_net_rho(const shard_net_t *n, const double *s, double *z, double *a3, double *add);

#endif
