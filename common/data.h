/*
 * data: samples, batches, and the datasets they come from.
 *
 * A sample is a label (0/1), n_dense floats, and for each of n_tables
 * categorical features hotness[t] row ids (1 for Criteo and Avazu; several
 * for multi-hot features, pooled by sum by the model).  A raw categorical
 * value becomes a row with data_hash_row(): XXH3-64 of the raw bytes seeded
 * with (hash_seed, table), modulo the table's rows.  Integer (count)
 * features become log(1 + max(x, 0)).
 *
 * A dataset is opened once (data_open) and then read by batch number: batch
 * x of split s at batch size B holds samples [x*B, x*B + B) of that split,
 * wrapping around at the end (passes over the data).  A batch is a pure function of
 * (dataset, split, x, B): that is what makes data processors stateless and
 * lets several serve one job.  The last test_fraction of the samples is the
 * test split.
 *
 * Sources (dataset_format / dataset):
 *   - criteo: TSV, label \t 13 integers \t 26 hex categoricals (Kaggle and
 *     Terabyte layouts; empty fields allowed: an empty integer is 0, an
 *     empty categorical hashes the empty string).  A "short line", with
 *     fewer than 40 fields but at least 2 (label and I1), is read as if its
 *     missing trailing fields were there and empty (copies of Criteo with
 *     trailing empty fields stripped), bit-identical to the full line, and
 *     counted in data_stats_t.short_lines; a lone label, a line with more
 *     than 40 fields, or a short last line without its newline (a cut
 *     file) is malformed;
 *   - avazu: CSV with a header (id, click, hour, C1 ... C21): label = click,
 *     no dense features (the job must say n_dense = 0), every other column
 *     but id is a categorical (22 tables); every line has every column
 *     (no short lines: a missing column is malformed);
 *   - binary: our own format, written by `chanter data convert` or
 *     `chanter data gen --format binary`, memory-mapped, batch x read by
 *     offset;
 *   - synthetic: no file; sample i is generated from (seed, i) exactly as
 *     `chanter data gen` would write it.
 * Malformed records are counted and skipped (the first data.max_reports are
 * logged with file:line and why); with strict = true the first one is an
 * error at open naming file:line.  If more than data.max_bad_fraction of a
 * text file's records (valid + malformed; empty lines are not records) are
 * malformed, opening or converting it fails with the count, the fraction,
 * the limit and the first bad record's file:line and why.  A binary file
 * is not checked again (the conversion that wrote it was; its header keeps
 * the count for information).  Text files are indexed (and validated)
 * at open, so batch reads are random-access for every format.  Lines may
 * end in \n or \r\n, the last one may lack it; empty lines are skipped
 * without counting; a line over DATA_MAX_LINE bytes is malformed.  The
 * binary format is described in data_binary.c.
 *
 * Thread-safety: after data_open, data_read_batch may be called from any
 * number of threads at once.
 */
#ifndef CHANTER_DATA_H
#define CHANTER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"

/* Splits.  DATA_ALL is the whole dataset (train then test), for tools. */
enum { DATA_TRAIN = 0, DATA_TEST = 1, DATA_ALL = 2 };

/* Formats (dataset_format; DATA_FMT_AUTO decides by content and name). */
enum { DATA_FMT_AUTO = 0, DATA_FMT_CRITEO, DATA_FMT_AVAZU, DATA_FMT_BINARY, DATA_FMT_SYNTHETIC };

/* Kinds of malformed record (data_stats_t.bad_kind). */
enum {
  DATA_BAD_FIELDS = 0, /* wrong field count */
  DATA_BAD_LABEL,      /* label not 0/1 */
  DATA_BAD_INT,        /* integer field not an integer (or out of int64 range) */
  DATA_BAD_HEX,        /* categorical field not hexadecimal (Criteo) */
  DATA_BAD_LONG,       /* line longer than DATA_MAX_LINE */
  DATA_BAD_BINARY,     /* invalid UTF-8, NUL or control bytes */
  DATA_BAD_TRUNCATED,  /* last line without newline that does not parse */
  DATA_BAD_KINDS
};
#define DATA_MAX_LINE 65536 /* longest accepted text line, bytes without the newline */

typedef struct data_schema_s {
  uint32_t n_dense;
  uint32_t n_tables;
  uint32_t *hotness;     /* n_tables: ids per sample of each table */
  uint64_t *table_rows;  /* n_tables: rows of each table */
  uint64_t hash_seed;
} data_schema_t;

/* One batch, structure-of-arrays: the one batch type of the project -- a
 * batch read from the data, one on the wire (batch_pb.h: the Batch and
 * Samples messages), a trainer's share of a global batch (plan.h), the
 * batch a trainer's step reads.  ids are table-major: table t's ids are
 * ids[ids_off[t] .. ids_off[t] + n * hotness[t]), sample-major inside (the
 * hotness[t] ids of sample 0, then of sample 1...).  ids are rows within
 * their table (the embedding key is TABLE_KEY(t, row)).
 *
 * Ownership: a batch that data_read_batch, batch_pb_decode_batch,
 * plan_build, plan_batch_concat or plan_batch_head filled owns each of its
 * arrays (free with data_batch_free).  A batch laid out inside someone
 * else's memory (a trainer's decoded work item, batch_pb_lay_out_samples;
 * a test's own arrays) is a view: never data_batch_free it, free the
 * memory it lives in. */
typedef struct data_batch_s {
  uint64_t iteration;    /* the batch number */
  int split;             /* DATA_TRAIN or DATA_TEST */
  uint32_t n;            /* samples */
  uint32_t n_dense, n_tables;
  uint32_t *hotness;     /* n_tables (copy) */
  float *labels;         /* n, 0.0f or 1.0f */
  float *dense;          /* n * n_dense, row-major, normalized */
  uint64_t *ids;         /* sum over t of n * hotness[t] */
  size_t *ids_off;       /* n_tables + 1 */
} data_batch_t;

typedef struct data_source_s data_source_t;

typedef struct data_stats_s {
  uint64_t samples;          /* valid samples (train + test) */
  uint64_t train_samples, test_samples;
  uint64_t bad_records;      /* malformed records skipped */
  uint64_t bytes;            /* size of the file(s) read */
  uint64_t bad_kind[DATA_BAD_KINDS]; /* bad_records by kind */
  uint64_t short_lines;      /* valid Criteo lines read with missing trailing fields as empty (in samples;
                                text sources and their conversion only: a binary file does not keep it) */
  int format;                /* DATA_FMT_* actually read */
} data_stats_t;

/* The schema of the job: n_dense, table_rows, table_hotness, hash_seed.
 * Caller closes. */
int data_schema_from_cfg(const cfg_t *cfg, data_schema_t *out, char *err, size_t err_len);
void data_schema_close(data_schema_t *s);

/* Opens cfg's dataset.  0, or -errno / ERR_CONFIG / -EINVAL (bad record in
 * strict mode, wrong binary version...) with err naming file (and line). */
int data_open(const cfg_t *cfg, data_source_t **out, char *err, size_t err_len);
void data_close(data_source_t *d);
const data_schema_t *data_schema(const data_source_t *d);
void data_stats(const data_source_t *d, data_stats_t *st);

/* Batch `iteration` of split at batch_size into *out (allocated here; free
 * with data_batch_free): samples (iteration * batch_size + j) mod (samples of
 * the split), so any iteration is valid and a batch larger than the split wraps.  0, or -EINVAL
 * (empty split, batch_size 0) / -ENOMEM / -EIO (a corrupt binary record, a text
 * file changed since open) with err. */
int data_read_batch(data_source_t *d, int split, uint64_t iteration, uint32_t batch_size, data_batch_t *out, char *err,
                    size_t err_len);
void data_batch_free(data_batch_t *b);
/* The ids of b, over all tables. */
static inline size_t data_batch_n_ids(const data_batch_t *b) { return b->ids_off[b->n_tables]; }

/* The row of a raw categorical value in table t. */
uint64_t data_hash_row(const data_schema_t *s, uint32_t t, const void *raw, size_t len);
/* log(1 + max(x, 0)) */
float data_norm_int(double x);

/* ---- additions: tools (chanter data gen | convert | stats) ---- */

/* As data_open, but reads path (NULL: cfg's dataset; "synthetic" is the
 * generator) with cfg's dataset_format and schema. */
int data_open_path(const cfg_t *cfg, const char *path, data_source_t **out, char *err, size_t err_len);
/* The hash of a raw categorical value in table t before the modulo (what
 * the binary format stores): row = data_hash64() % table_rows[t]. */
uint64_t data_hash64(const data_schema_t *s, uint32_t t, const void *raw, size_t len);
/* "criteo", "avazu", "binary", "synthetic", "auto"; and the reverse (-1 if unknown). */
const char *data_format_name(int fmt);
int data_format_parse(const char *name);
/* "fields", "label", "integer", "hex", "long line", "binary/UTF-8", "truncated". */
const char *data_bad_kind_name(int kind);
/* Whole-dataset samples (train + test). */
uint64_t data_samples(const data_source_t *d);

/* Converts dataset `in` (read with cfg's dataset_format and schema; NULL:
 * cfg's dataset) into the binary format at `out` (written to a temporary, then
 * renamed over it: fsio_replace_open).  Text input is converted in one streaming pass; malformed
 * records are counted, reported and skipped as data_open does (strict, or
 * more than data.max_bad_fraction of them, stops and writes nothing).
 * st (optional) receives the counts.  0 or -errno / ERR_CONFIG / -EINVAL. */
int data_convert(const cfg_t *cfg, const char *in, const char *out, data_stats_t *st, char *err, size_t err_len);

/* The Zipf exponent of each of n_tables tables into out[n_tables]:
 * synthetic.table_alpha (one per table) or else synthetic.alpha for all.
 * 0, or ERR_CONFIG with err naming the entry (not a number in [0, 10], a
 * list of another length than table_rows). */
int data_table_alpha(const cfg_t *cfg, uint32_t n_tables, double *out, char *err, size_t err_len);

/* The synthetic generator's Zipf draw (rejection-inversion, O(1)), for a
 * tool that draws ids as dataset = synthetic does (chanter bench tables):
 * data_zipf_rank gives a rank in [0, rows), 0 the hottest, P(r) ~
 * 1/(r+1)^alpha (alpha 0: uniform), advancing *state (any 64-bit seed).
 * Pure; any thread. */
typedef struct data_zipf_s {
  uint64_t rows;
  double alpha, hx1, hn, s;
} data_zipf_t;
void data_zipf_init(data_zipf_t *z, uint64_t rows, double alpha);
uint64_t data_zipf_rank(const data_zipf_t *z, uint64_t *state);

/* Writes `samples` synthetic samples (sample i from (seed, i), exactly the
 * samples of dataset = synthetic with synthetic.samples = samples) to out as
 * Criteo TSV (DATA_FMT_CRITEO: needs n_dense = 13, 26 one-hot tables) or
 * binary (DATA_FMT_BINARY: any schema).  Same config, same bytes. */
int data_gen(const cfg_t *cfg, const char *out, int format, uint64_t samples, char *err, size_t err_len);

/* Access statistics of a whole dataset (chanter data stats).
 *
 * Raw values and merged rows: every source's records hold each categorical
 * value's 64-bit hash before the modulo (text: hashed as read; binary: as
 * stored; synthetic: as generated), so distinct raw values are counted as
 * distinct 64-bit hashes (two raw values of one table sharing a 64-bit
 * hash is negligible: ~n^2 / 2^65).  A merged row is a row that more than
 * one distinct raw value maps to (hash % table_rows); merged_share is the
 * share of accesses that land on merged rows.  Counting raw values takes
 * memory for each value beyond the first of its row (a hash set of 8-byte
 * entries), at most DATA_PROFILE_RAW_BYTES over all tables; past that a
 * table's raw_values is a lower bound (raw_exact = 0).  merged_share is
 * always exact (it needs one hash per row). */
#define DATA_PROFILE_BATCH_SIZES 3 /* 1024, 4096, 16384 */
#define DATA_PROFILE_RAW_BYTES ((size_t)1 << 30)
#define DATA_PROFILE_MERGED_WARN 0.10 /* chanter data stats warns past this merged_share */
typedef struct data_table_profile_s {
  uint64_t rows;             /* table_rows */
  uint64_t accesses;         /* ids read (samples * hotness) */
  uint64_t distinct;         /* distinct rows seen */
  double top_0_1, top_1;     /* share of accesses taken by the ceil(0.1% / 1% of rows) most used rows */
  uint64_t raw_values;       /* distinct raw values (64-bit hashes); a lower bound if !raw_exact */
  int raw_exact;
  uint64_t merged_rows;      /* rows seen that more than one raw value maps to */
  uint64_t merged_accesses;  /* accesses landing on them */
  double merged_share;       /* merged_accesses / accesses (0 if no accesses) */
} data_table_profile_t;
typedef struct data_profile_s {
  data_stats_t stats;
  uint32_t n_tables;
  data_table_profile_t *tables; /* n_tables */
  data_table_profile_t overall; /* all tables: rows = sum of table_rows, top k of all rows; raw values,
                                   merged rows and accesses summed */
  struct {
    uint32_t batch_size;
    uint32_t batches;          /* train batches averaged (at most 16) */
    double ids_per_batch;      /* batch_size * sum of hotness */
    double unique_rows;        /* mean distinct keys per batch */
  } batch[DATA_PROFILE_BATCH_SIZES];
} data_profile_t;
/* Locality (chanter data stats): how much of a trainer's batch it used
 * just before.  Train batches 0 .. window + batches - 1 at batch_size, split
 * contiguously (trainer r gets samples [r*B/P, (r+1)*B/P) of each batch,
 * allocation = contiguous); for each batch x >= window and trainer r, the
 * distinct keys (table, row) of r's share, and those of them r also used in
 * batches x - window .. x - 1.  share = the latter over the former, summed
 * over trainers and batches: the rows a cache of the last `window` batches
 * would already hold.  access_share weighs each key by its ids in the
 * share (what a cache hit rate per lookup would be).  Fewer batches if the train split is shorter (none
 * if it holds at most `window` batches: batches = 0, share = 0). */
typedef struct data_locality_s {
  uint32_t batch_size, trainers, window, batches; /* batches measured */
  uint64_t rows, reused;                          /* summed distinct keys, and reused ones */
  double share;                                   /* reused / rows */
  uint64_t accesses, reused_accesses;             /* the same per id read (a row used k times counts k) */
  double access_share;                            /* reused_accesses / accesses */
} data_locality_t;
int data_locality(data_source_t *d, uint32_t batch_size, uint32_t trainers, uint32_t window, uint32_t batches,
                  data_locality_t *out, char *err, size_t err_len);

/* The traffic floor of a cached, lookahead-planned job (chanter bench
 * e2e): train batches 0 .. batches - 1 at batch_size, split contiguously
 * over trainers.  first_use counts, per batch, the distinct keys no
 * trainer used in the previous `window` batches (they must come from the
 * embedding servers, whatever the cache); shared the keys two or more
 * trainers use in the same batch (they must travel between trainers, or
 * be pooled).  per_iteration = (first_use + shared) / batches: the rows a
 * perfect cache of the window would still move each iteration. */
typedef struct data_floor_s {
  uint32_t batch_size, trainers, window, batches;
  uint64_t first_use, shared;
  double per_iteration;
} data_floor_t;
int data_floor(data_source_t *d, uint32_t batch_size, uint32_t trainers, uint32_t window, uint32_t batches,
               data_floor_t *out, char *err, size_t err_len);

/* Reads every sample of d once.  Caller frees with data_profile_close. */
int data_profile(data_source_t *d, data_profile_t *p, char *err, size_t err_len);
void data_profile_close(data_profile_t *p);

#endif
