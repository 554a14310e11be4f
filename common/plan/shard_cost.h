/*
 * shard_cost: the cost model of AutoShard (papers/autoshard.txt 4.2,
 * appendix B.2): what a SET of embedding tables placed on one device costs
 * per iteration, predicted from the tables' features, as fitted by
 * shard_fit.h to what `chanter bench tables` measured on one machine.
 *
 * Two kinds of device, each with its own parameters (one model file holds
 * both): SHARD_KIND_TRAINER, one trainer's forward + backward of its
 * partitioned tables for the global batch (pool, fold, row update), and
 * SHARD_KIND_SERVER, an embedding server's Lookup + WriteBack of one
 * iteration's distinct keys of its tables.
 *
 * The model.  Each table gives SHARD_FEATURES numbers (shard_cost_features:
 * log rows, dim, hotness, log bytes, the Zipf exponent, the expected
 * distinct rows a batch touches, the share of accesses the hottest 1% and
 * 10% of rows take, work terms, the optimizer), standardized with the
 * fitted means.  A per-table network phi, shared by every table, maps them
 * to E positive numbers; phi is SUMMED over the set's tables into S; a
 * readout rho maps S to the log of the cost:
 *
 *   phi(x)   = exp(W2 tanh(W1 x + b1) + Sk x + b2)          (E numbers > 0)
 *   S        = sum over the set's tables t of phi(x_t)
 *   log cost = log(sum over k of exp(om_k) S_k)              the additive part
 *            + w4 . tanh(W3 log S + b3) + v . log S + b4     the interaction
 *
 * Why this shape.  The paper's is MLP, sum, MLP.  A cost that is the sum of
 * the tables' costs is the case where the interaction is constant: each
 * channel k of phi is then a per-table cost term (exp of a linear function
 * of log features is a power law in rows, dim, hotness, distinct rows: what
 * per-table work terms are), and the additive part adds them up.  A set's
 * cost is NOT that sum: tables on one device share its caches and memory
 * bandwidth (a set whose rows touched per batch outgrow the last-level
 * cache pays more per row than each table alone; a small table beside a big
 * one pays less than alone, its fixed overheads hidden), and a server's
 * calls carry fixed costs shared by every table of a call.  S holds such
 * aggregates (rows touched, bytes, work) exactly as they add up over tables,
 * and the interaction term -- a small MLP on log S -- multiplies the
 * additive cost by whatever factor they imply (a capacity crossed, a max
 * over tables: log-sum-exp of scaled channels).  Reading log S rather than
 * S keeps rho on the scale of the aggregates, so sets larger than the ones
 * measured move it by log 2 per doubling, which extrapolates far better
 * than an MLP of the raw sum.  (A first version, MLP-sum-MLP on log S with
 * softplus outputs and no additive part, had about twice the held-out
 * median error on test_plan_shard's synthetic non-additive costs.)  The target is the log
 * of the cost, so the squared loss is a relative error: a 10% error on a
 * 50 us set weighs as much as on a 5 ms one.
 *
 * Everything is deterministic: the features are closed-form (no sampling),
 * a prediction is a fixed sequence of double operations, so the planner
 * (shard_plan.h) built on it is a pure function of its inputs.
 *
 * File format (text, versioned; shard_cost_save writes it, shard_cost_load
 * reads it and names file:line of anything wrong):
 *
 *   chanter shard cost model v1
 *   label <one line: machine, date, dataset size, held-out error>
 *   features 18
 *   kind trainer                      (then server, when fitted)
 *   shape H1 E H2
 *   fitted SETS_FIT SETS_HELD MEDIAN_REL_HELD P90_REL_HELD
 *   mean 18 numbers / sd 18 numbers   (each "name count values...")
 *   w1 b1 w2 s b2 om w3 b3 w4 v b4    (the parameters, the same way)
 *   end
 *   coll allreduce RANKS POINTS ALPHA_US US_PER_MB MED_REL   (when measured)
 *   coll alltoall  RANKS POINTS ALPHA_US US_PER_MB MED_REL
 *
 * The collectives.  A coll line is a straight line fitted to the timed
 * calls of one collective between RANKS trainer processes on the machine
 * (shard_fit.h): a call moving b bytes per rank costs ALPHA_US + b x
 * US_PER_MB / 2^20 microseconds.  allreduce is the trainers' ordered sum
 * of embedding-row gradients (coll_allreduce_sum_f32_ordered), b its
 * buffer; alltoall their exchange of pooled embeddings (coll_alltoallv),
 * b what a rank sends to the others.  table_strategy = auto weighs the
 * cache against partitioning with them (strategy_auto.h).
 *
 * Numbers are written with 17 significant digits, so a saved model loads
 * back to the same bits.  Thread safety: a loaded model is read-only; any
 * thread may predict with it.
 */
#ifndef CHANTER_SHARD_COST_H
#define CHANTER_SHARD_COST_H

#include <stddef.h>
#include <stdint.h>

enum { SHARD_KIND_TRAINER = 0, SHARD_KIND_SERVER = 1, SHARD_KINDS = 2 };
/* The row optimizers (embedding_optimizer): the features' one-hot is
 * (sgd, adagrad), rowwise_adagrad being neither (its state: 1 float a row). */
enum { SHARD_OPT_SGD = 0, SHARD_OPT_ADAGRAD = 1, SHARD_OPT_ROWWISE_ADAGRAD = 2 };
#define SHARD_FEATURES 18

/* One table as the model sees it.  hotness is ids per sample (a fraction
 * for a table's share on one device of a row-wise split table); alpha the
 * Zipf exponent of its rows' popularity (0 = uniform). */
typedef struct shard_table_s {
  uint64_t rows;
  uint32_t dim;
  double hotness;
  double alpha;
  int opt; /* SHARD_OPT_* */
} shard_table_t;

enum { SHARD_COLL_ALLREDUCE = 0, SHARD_COLL_ALLTOALL = 1, SHARD_COLLS = 2 };

/* A collective's fitted line (the "coll" lines above). */
typedef struct shard_coll_s {
  int present;
  uint32_t ranks, points; /* ranks it was timed with; calls timed */
  double alpha_us, us_per_mb, med_rel; /* med_rel: the line's median relative error on its points */
} shard_coll_t;

/* "allreduce" / "alltoall", and back (-1 when neither). */
const char *shard_coll_name(int op);
int shard_coll_parse(const char *s);

/* "trainer" / "server", and back (-1 when neither). */
const char *shard_kind_name(int kind);
int shard_kind_parse(const char *s);
/* "sgd" / "adagrad" / "rowwise_adagrad", and back (-1 when none). */
const char *shard_opt_name(int opt);
int shard_opt_parse(const char *s);

/* ---- features (pure, any thread) */

/* The expected number of distinct rows that `draws` independent draws hit
 * in a table of `rows` rows whose row r (1-based rank) is drawn with
 * probability r^-alpha / H(rows, alpha): the exact sum over the first 1024
 * ranks, a quadrature of its continuous form over the rest (within 1% of
 * the exact sum; test_plan_shard checks it). */
double shard_cost_distinct(uint64_t rows, double alpha, double draws);
/* The share of draws that land on the k most popular rows: H(k)/H(rows). */
double shard_cost_top_share(uint64_t rows, double alpha, uint64_t k);
/* The SHARD_FEATURES raw (unstandardized) features of t at global batch
 * `batch`, into out.  Names for messages: shard_cost_feature_name(i). */
void shard_cost_features(const shard_table_t *t, uint32_t batch, double out[SHARD_FEATURES]);
const char *shard_cost_feature_name(int i);

/* ---- the model */

typedef struct shard_cost_s shard_cost_t;

/* The model file at path, or with path NULL or "" the default one built
 * into the binary (deploy/shard/cost_model.txt of the tree it was built
 * from, when that tree had one).  0, or ERR_CONFIG / -errno with err naming
 * path:line and what is wrong, or saying that this build carries no
 * default model and how to fit one.  The caller destroys *out. */
int shard_cost_load(const char *path, shard_cost_t **out, char *err, size_t err_len);
/* Whether this build carries a default model. */
int shard_cost_have_default(void);
/* The same from text (name for messages). */
int shard_cost_parse(const char *text, const char *name, shard_cost_t **out, char *err, size_t err_len);
/* Writes m to path (fsio_replace: the old file or the new, never a torn
 * one).  0 or -errno with err. */
int shard_cost_save(const shard_cost_t *m, const char *path, char *err, size_t err_len);
/* Gives back the caller's hold of m: frees it unless shard_cost_share
 * gave others a hold that they still keep. */
void shard_cost_destroy(shard_cost_t *m);
/* m for one more owner (each owner calls shard_cost_destroy once; the
 * last one frees it), so a loaded model serves two users (the oracle's
 * placement and table_strategy = auto) without a second load.  Not
 * atomic: the owners take and give back their holds on one thread.
 * Returns m. */
shard_cost_t *shard_cost_share(shard_cost_t *m);

/* Whether m has parameters for kind; its label line. */
int shard_cost_has(const shard_cost_t *m, int kind);
const char *shard_cost_label(const shard_cost_t *m);
/* Replaces the label (one line: newlines become blanks; cut at 511 bytes). */
void shard_cost_set_label(shard_cost_t *m, const char *label);

/* The predicted cost in microseconds of the n tables t[] together on one
 * device of kind at global batch `batch`: 0 for n = 0; NAN when m has no
 * parameters for kind. */
double shard_cost_predict(const shard_cost_t *m, int kind, const shard_table_t *t, uint32_t n, uint32_t batch);

/* Microseconds of one call of collective op moving `bytes` per rank: NAN
 * when m has no line for op.  shard_cost_coll_line: the line (NULL when
 * absent); shard_cost_set_coll: sets it (shard_fit). */
double shard_cost_coll(const shard_cost_t *m, int op, double bytes);
const shard_coll_t *shard_cost_coll_line(const shard_cost_t *m, int op);
void shard_cost_set_coll(shard_cost_t *m, int op, const shard_coll_t *line);

/* The planner's way to the same number without recomputing every table:
 * shard_cost_embed writes a table's representation phi (shard_cost_width
 * numbers); shard_cost_readout turns the sum of a set's representations
 * into its cost (0 us when the sum is all zero: the empty set).  Summing
 * the representations in table-index order and reading out gives exactly
 * shard_cost_predict of the tables in that order. */
uint32_t shard_cost_width(const shard_cost_t *m, int kind);
void shard_cost_embed(const shard_cost_t *m, int kind, const shard_table_t *t, uint32_t batch, double *rep);
double shard_cost_readout(const shard_cost_t *m, int kind, const double *sum);

#endif
