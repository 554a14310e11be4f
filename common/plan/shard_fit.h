/*
 * shard_fit: the micro-benchmark's dataset (`chanter bench tables`) and the
 * fitting of the cost model (shard_cost.h) to it, for `chanter shard fit`.
 *
 * The dataset is text.  Lines starting with '#' are comments; the first
 * line is "# chanter bench tables v1", a "# cpu: ..." line names the
 * machine.  Every other non-empty line is one measured set:
 *
 *   KIND BATCH COST_US N  ROWS DIM HOTNESS ALPHA OPT  [ROWS DIM HOTNESS ALPHA OPT]...
 *
 * KIND trainer | server, BATCH the global batch, COST_US the median
 * microseconds of one iteration of the set, N its tables, then N groups
 * of five.  OPT sgd | adagrad.  A field that does not parse is an error
 * naming file:line, the field and the table.
 *
 * The fit: the sets of each kind are split into fitted and held-out sets
 * by a seeded shuffle (a fixed fraction, the same split for the same seed
 * and data), the features standardized over the fitted sets' tables, and
 * the network trained with Adam on the squared error of the log cost
 * (minibatches of 32 sets in a seeded order, a cosine learning rate,
 * decoupled weight decay: AdamW).
 * Everything runs in one thread in a fixed order: the same data, options
 * and seed give the same bits.  A plain additive baseline -- each table's
 * cost linear in its work terms (a constant, draws x dim, distinct rows x
 * dim, their optimizer state, bytes), the set's cost their sum, fitted by
 * least squares of the relative error -- is fitted on the same sets, to
 * show what the non-additive model gains.
 */
#ifndef CHANTER_SHARD_FIT_H
#define CHANTER_SHARD_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "shard_cost.h"

#define SHARD_SET_MAX 4096 /* tables in one measured set */

typedef struct shard_set_s {
  int kind;
  uint32_t batch;
  double cost_us;
  uint32_t n;
  shard_table_t *tables; /* n, owned by the dataset */
  unsigned line;         /* in the file, for messages */
} shard_set_t;

/* One timed call of a collective ("coll" lines of the dataset). */
typedef struct shard_coll_point_s {
  int op; /* SHARD_COLL_* */
  uint32_t ranks;
  double bytes, cost_us; /* per rank (shard_cost.h); the call's median time */
  unsigned line;
} shard_coll_point_t;

typedef struct shard_data_s {
  shard_set_t *sets;
  size_t n;
  shard_coll_point_t *coll;
  size_t n_coll;
  char cpu[200];  /* the "# cpu:" comment, or "" */
} shard_data_t;

/* Reads the dataset at path (shard_fit_parse_data on its text).  0, or
 * ERR_CONFIG / -errno with err naming path:line and the field.  The caller
 * closes *d (also after an error). */
int shard_fit_load_data(const char *path, shard_data_t *d, char *err, size_t err_len);
int shard_fit_parse_data(const char *text, const char *name, shard_data_t *d, char *err, size_t err_len);
void shard_fit_data_close(shard_data_t *d);

typedef struct shard_fit_opts_s {
  double holdout;   /* fraction of each kind's sets held out, [0, 0.9] */
  uint64_t seed;    /* the split, the initialization, the minibatch order */
  uint32_t steps;   /* Adam steps per kind (0: 6000) */
  uint32_t h1, e, h2; /* sizes (0: 16, 8, 16) */
  double lr;        /* initial learning rate (0: 0.01) */
  double wd;        /* decoupled weight decay (AdamW), times lr (0: chosen per kind among 0.02, 0.1
                       and 0.5 by the median relative error on a fifth of the fitted sets held back
                       from a trial fit each -- the noisier the measurements, the more a network of
                       this size must be held back) */
  const char *label; /* the model's label line (NULL: one is composed without a date) */
} shard_fit_opts_t;

/* Errors of predicted against measured costs over some sets. */
typedef struct shard_fit_err_s {
  size_t n;
  double mean_abs, med_abs, p90_abs; /* microseconds */
  double med_rel, p90_rel;           /* |predicted - measured| / measured */
} shard_fit_err_t;

typedef struct shard_fit_report_s {
  struct {
    size_t sets_fit, sets_held;
    shard_fit_err_t fit, held;         /* the model */
    shard_fit_err_t add_fit, add_held; /* the additive baseline */
    double add_w[5];                   /* its coefficients (us per unit of each work term) */
    double wd, wd_score;               /* the weight decay used; the validation error that chose it (NAN: given) */
  } kind[SHARD_KINDS];
  shard_coll_t coll[SHARD_COLLS]; /* the collectives' lines (present when the dataset timed them) */
} shard_fit_report_t;

/* Fits a model to d (every kind that has at least 4 sets) into *out and
 * fills rep.  0, -EINVAL with err (no kind has 4 sets, options out of
 * range), -ENOMEM.  The caller destroys *out. */
int shard_fit(const shard_data_t *d, const shard_fit_opts_t *o, shard_cost_t **out, shard_fit_report_t *rep, char *err,
              size_t err_len);

/* The errors of m on the sets of kind in d whose held[] flag is `which`
 * (held NULL: every set of kind).  For `chanter bench shard --data`. */
void shard_fit_errors(const shard_cost_t *m, const shard_data_t *d, int kind, const uint8_t *held, int which,
                      shard_fit_err_t *e);

/* The held-out flags shard_fit uses for d, holdout and seed: held[i] = 1
 * for a held-out set (held has d->n entries). */
void shard_fit_split(const shard_data_t *d, double holdout, uint64_t seed, uint8_t *held);

/* A synthetic dataset, for tests and for a benchmark with no fitted model:
 * a cost that is a known NON-additive function of the sets' tables
 * (shard_fit_synthetic_cost: trainer, 10 us + the tables' work terms x (1 +
 * 0.8 log2 of how far the rows a batch touches exceed 8 MiB), a
 * cache-capacity effect; server, 30 us + bytes touched + a max over the
 * tables), +-2% of noise.  n_trainer then n_server sets of 1 to 8 tables
 * drawn by shard_fit_draw_table (rows 1e3..1e7 log-uniform, dim 8..128,
 * hotness 1..40, alpha 0..1.2, sgd or adagrad), batch 1024 or 4096, from
 * the seed.  The text of a dataset file (malloc'd; NULL when out of
 * memory). */
char *shard_fit_synthetic_text(size_t n_trainer, size_t n_server, uint64_t seed);
double shard_fit_synthetic_cost(int kind, const shard_table_t *t, uint32_t n, uint32_t batch);
void shard_fit_draw_table(uint64_t *s, shard_table_t *t);

/* For tests: the largest relative difference between the fit's analytic
 * gradient and central finite differences, over every parameter of a
 * small network (seeded) on every set of kind in d. */
double shard_fit__grad_check(const shard_data_t *d, int kind, uint64_t seed);

#endif
