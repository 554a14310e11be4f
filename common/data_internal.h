/*
 * data_internal.h: what the data module's files share (data.c, data_text.c,
 * data_binary.c, data_gen.c, data_stats.c).  Not for use outside common/
 * except by tests.
 *
 * Every source presents its samples as *records*, the layout of one record
 * of the binary format (data_binary.c):
 *     float label; float dense[n_dense]; uint64_t hash[sum of hotness]
 * packed, little-endian, hashes table-major (table 0's hotness[0] hashes,
 * then table 1's ...) and *before* the modulo by table_rows.  A source hands
 * out record i (0 .. samples-1 over the whole dataset) and data.c turns
 * records into batches (modulo, table-major transpose).  Text readers parse
 * into a record, the binary reader points into its mapping, the synthetic
 * source generates one: that one layout is why text, binary and synthetic
 * give identical batches.
 */
#ifndef CHANTER_DATA_INTERNAL_H
#define CHANTER_DATA_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "data.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the data module reads and writes little-endian records in place"
#endif

typedef struct data_ops_s {
  /* Record i of the whole dataset: *rec points into the source's mapping
   * or at scratch (record_bytes), filled here.  0 or -EIO with err.
   * Called from any thread. */
  int (*rec)(data_source_t *d, uint64_t i, uint8_t *scratch, const uint8_t **rec, char *err, size_t err_len);
  void (*close)(data_source_t *d);
} data_ops_t;

struct data_source_s {
  const data_ops_t *ops;
  data_schema_t schema;
  char *path;             /* NULL for synthetic */
  uint64_t samples, n_train, n_test;
  data_stats_t stats;
  size_t record_bytes;
  uint32_t ids;           /* ids per sample: sum of hotness */
  uint64_t *tseed;        /* per-table XXH3 seeds */
  void *impl;             /* the format's own state */
};

/* ---- records ---- */
static inline size_t data__record_bytes(const data_schema_t *s, uint32_t ids) {
  return 4 + 4 * (size_t)s->n_dense + 8 * (size_t)ids;
}
static inline uint32_t data__ids(const data_schema_t *s) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < s->n_tables; t++) n += s->hotness[t];
  return n;
}
/* The XXH3 seed of table t: hash_seed and t mixed through table_mix64. */
static inline uint64_t data__table_seed(uint64_t hash_seed, uint32_t t) {
  return table_mix64(hash_seed ^ table_mix64(UINT64_C(0x6368616e74657200) + t));
}
static inline uint64_t data__hash(uint64_t tseed, const void *raw, size_t len) {
  return XXH3_64bits_withSeed(raw, len, tseed);
}
/* Per-table seeds of a schema (malloc'd, n_tables). */
uint64_t *data__table_seeds(const data_schema_t *s);

int data__schema_copy(data_schema_t *dst, const data_schema_t *src);
/* write(2) all n bytes, retrying short writes and EINTR; 0 or -errno. */
int data__write_all(int fd, const void *buf, size_t n);

/* ---- malformed records ---- */
typedef struct data_reporter_s {
  const char *path;
  int strict;
  uint64_t max_reports, reported;
  double max_bad_fraction;
  data_stats_t *st;
  char *err;
  size_t err_len;
  uint64_t first_line;  /* the first bad record (0: none yet) and why */
  char first_why[480];
} data_reporter_t;
/* A reporter for path with cfg's strict, data.max_reports and
 * data.max_bad_fraction, counting into st. */
void data__reporter_init(data_reporter_t *r, const cfg_t *cfg, const char *path, data_stats_t *st, char *err,
                         size_t err_len);
/* Counts one bad record (line is 1-based), remembers the first, and logs it
 * if still under max_reports.  Strict: writes "FILE:LINE: why" to err and
 * returns -EINVAL; otherwise 0 (skip it). */
int data__bad(data_reporter_t *r, uint64_t line, int kind, const char *why);
/* Logs how many were skipped beyond the reported ones. */
void data__bad_summary(data_reporter_t *r);
/* After a scan that found `valid` good records: -EINVAL with err giving
 * the count, the fraction, the limit and the first bad record if more than
 * max_bad_fraction of the records were bad, or if none was valid; else 0. */
int data__bad_check(data_reporter_t *r, uint64_t valid);

/* ---- index of valid records in a text file (offset of each line start) ----
 * 4 bytes per record plus 8 per 1024 records; falls back to 8 bytes per
 * record if records of one block span more than 4 GiB. */
typedef struct data_index_s {
  uint64_t n, cap;
  uint64_t *base;    /* offset of record k*1024 */
  uint32_t *d32;     /* offset - base[k/1024], or NULL after the fallback */
  uint64_t *d64;     /* full offsets (fallback) */
} data_index_t;
int data__index_push(data_index_t *x, uint64_t off);
static inline uint64_t data__index_get(const data_index_t *x, uint64_t i) {
  return x->d64 ? x->d64[i] : x->base[i >> 10] + x->d32[i];
}
void data__index_free(data_index_t *x);

/* ---- text formats (data_text.c) ---- */
typedef struct data_text_s data_text_t;
/* Prepares a parser of the mapped text file buf[0, len) of format fmt
 * (CRITEO or AVAZU) for schema s: checks that the job's schema is what the
 * format holds (ERR_CONFIG naming what each says), reads the Avazu header.
 * *first is where records start; *first_line their line number. */
int data__text_create(const data_schema_t *s, const cfg_t *cfg, int fmt, const char *path, const uint8_t *buf,
                      size_t len, data_text_t **out, size_t *first, uint64_t *first_line, char *err, size_t err_len);
void data__text_destroy(data_text_t *tx);
/* Scans buf[first, len): every valid record is parsed into rec and handed
 * to cb with its line's offset; malformed ones go to r.  Returns 0, the
 * reporter's -EINVAL (strict), or cb's non-zero return. */
typedef int (*data_rec_cb)(void *ctx, uint64_t offset, const uint8_t *rec);
int data__text_scan(data_text_t *tx, const uint8_t *buf, size_t len, size_t first, uint64_t first_line,
                    data_reporter_t *r, data_rec_cb cb, void *ctx);
/* Parses the (valid at scan time) line at offset into rec.  0 or -EIO. */
int data__text_parse_at(data_text_t *tx, const uint8_t *buf, size_t len, uint64_t off, uint8_t *rec);

int data__open_text(data_source_t *d, int fmt, const cfg_t *cfg, char *err, size_t err_len);
/* Maps a whole file read-only (len 0: *buf = NULL).  0 or -errno with err. */
int data__map_file(const char *path, const uint8_t **buf, size_t *len, char *err, size_t err_len);
void data__unmap(const uint8_t *buf, size_t len);

/* The format of path for dataset_format fmt (AUTO: binary magic, then
 * .csv = Avazu, else Criteo).  0 or -errno with err (cannot open). */
int data__detect(const char *path, int fmt, int *out, char *err, size_t err_len);

/* ---- binary (data_binary.c) ---- */
#define DATA_BIN_MAGIC "CHANTERD"
#define DATA_BIN_VERSION 1u
int data__open_binary(data_source_t *d, char *err, size_t err_len);
/* 1 if the first bytes of the file are (any version of) our magic. */
int data__is_binary(const uint8_t *head, size_t n);
typedef struct data_writer_s data_writer_t;
/* Streams records into path (via a temporary, fsio_replace_open).  finish
 * writes the header and replaces path; abort removes the temporary file. */
int data__writer_open(const char *path, const data_schema_t *s, data_writer_t **out, char *err, size_t err_len);
int data__writer_add(data_writer_t *w, const uint8_t *rec);
int data__writer_finish(data_writer_t *w, uint64_t bad_records, char *err, size_t err_len);
void data__writer_abort(data_writer_t *w);

/* ---- synthetic (data_gen.c) ---- */
typedef struct data_synth_s data_synth_t;
int data__synth_create(const cfg_t *cfg, const data_schema_t *s, data_synth_t **out, char *err, size_t err_len);
void data__synth_destroy(data_synth_t *g);
/* Sample i into rec.  If tsv is not NULL (Criteo schema only), also the
 * sample's TSV line (with '\n') into tsv, returning its length in *tsv_len
 * (tsv must hold DATA_SYNTH_TSV_MAX bytes). */
#define DATA_SYNTH_TSV_MAX 1024
void data__synth_sample(const data_synth_t *g, uint64_t i, uint8_t *rec, char *tsv, size_t *tsv_len);
/* The planted logit of sample i (before sigmoid, signal applied): what an
 * ideal model predicts.  For tests. */
double data__synth_logit(const data_synth_t *g, uint64_t i);
/* synthetic.preset = sessions: the user of sample i (a rank, 0 the
 * heaviest; 0 in independent); if slot, which of the active users' slots
 * it is in; if start, the first sample of the log its session spans. */
uint64_t data__synth_user(const data_synth_t *g, uint64_t i, uint64_t *slot, uint64_t *start);
int data__open_synthetic(data_source_t *d, const cfg_t *cfg, char *err, size_t err_len);

/* ---- profile (data_stats.c) ---- */
/* Memory data_profile may take for counting raw values (bytes, all tables):
 * DATA_PROFILE_RAW_BYTES; tests lower it to reach the lower-bound case. */
extern size_t data__profile_raw_bytes;

#endif
