/*
 * data: see data.h.  This file holds what every source shares: the schema
 * from the job configuration, the hash, opening a dataset (choosing the
 * reader), the split into train and test, and turning records (see
 * data_internal.h) into batches.  The readers are data_text.c (Criteo TSV,
 * Avazu CSV), data_binary.c (our format) and data_gen.c (synthetic).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "err.h"
#include "log.h"

/* ---- schema ---- */

static int parse_list(const cfg_t *cfg, const char *key, uint64_t **vals, size_t *n, uint64_t min, uint64_t max,
                      char *err, size_t err_len) {
  char **items = NULL;
  int rc = cfg_list(cfg, key, &items, n);
  if (rc) return rc;
  *vals = calloc(*n ? *n : 1, sizeof **vals);
  if (!*vals) {
    cfg_list_free(items, *n);
    return -ENOMEM;
  }
  for (size_t i = 0; i < *n && !rc; i++) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(items[i], &end, 10);
    if (errno || *end || items[i][0] == '-' || x < min || x > max)
      rc = err_set(err, err_len, ERR_CONFIG, "%s (from %s): entry %zu '%s' must be an integer in [%" PRIu64 ", %" PRIu64 "]",
                key, cfg_origin(cfg, key), i, items[i], min, max);
    else
      (*vals)[i] = x;
  }
  cfg_list_free(items, *n);
  if (rc) {
    free(*vals);
    *vals = NULL;
  }
  return rc;
}

int data_schema_from_cfg(const cfg_t *cfg, data_schema_t *out, char *err, size_t err_len) {
  uint64_t *hot = NULL;
  size_t nr = 0, nh = 0;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = cfg_table_rows(cfg, &out->table_rows, &nr, err, err_len)) != 0) goto out;
  if (nr == 0 || nr > TABLE_MAX) {
    rc = err_set(err, err_len, ERR_CONFIG, "table_rows (from %s) lists %zu tables; need 1 to %d",
              cfg_origin(cfg, "table_rows"), nr, TABLE_MAX);
    goto out;
  }
  if ((rc = parse_list(cfg, "table_hotness", &hot, &nh, 1, 4096, err, err_len)) != 0) goto out;
  if (nh && nh != nr) {
    rc = err_set(err, err_len, ERR_CONFIG, "table_hotness (from %s) lists %zu values but table_rows (from %s) lists %zu tables",
              cfg_origin(cfg, "table_hotness"), nh, cfg_origin(cfg, "table_rows"), nr);
    goto out;
  }
  out->n_tables = (uint32_t)nr;
  out->n_dense = (uint32_t)cfg_int(cfg, "n_dense");
  out->hash_seed = (uint64_t)cfg_int(cfg, "hash_seed");
  if (!(out->hotness = calloc(nr, sizeof *out->hotness))) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t t = 0; t < nr; t++) out->hotness[t] = nh ? (uint32_t)hot[t] : 1;
out:
  free(hot);
  if (rc) data_schema_close(out);
  return rc;
}

void data_schema_close(data_schema_t *s) {
  if (!s) return;
  free(s->hotness);
  free(s->table_rows);
  s->hotness = NULL;
  s->table_rows = NULL;
}

int data__schema_copy(data_schema_t *dst, const data_schema_t *src) {
  *dst = *src;
  dst->hotness = malloc(src->n_tables * sizeof *dst->hotness);
  dst->table_rows = malloc(src->n_tables * sizeof *dst->table_rows);
  if (!dst->hotness || !dst->table_rows) {
    data_schema_close(dst);
    return -ENOMEM;
  }
  memcpy(dst->hotness, src->hotness, src->n_tables * sizeof *dst->hotness);
  memcpy(dst->table_rows, src->table_rows, src->n_tables * sizeof *dst->table_rows);
  return 0;
}

uint64_t *data__table_seeds(const data_schema_t *s) {
  uint64_t *ts = malloc(s->n_tables * sizeof *ts);
  if (ts)
    for (uint32_t t = 0; t < s->n_tables; t++) ts[t] = data__table_seed(s->hash_seed, t);
  return ts;
}

uint64_t data_hash64(const data_schema_t *s, uint32_t t, const void *raw, size_t len) {
  return data__hash(data__table_seed(s->hash_seed, t), raw, len);
}

uint64_t data_hash_row(const data_schema_t *s, uint32_t t, const void *raw, size_t len) {
  return data_hash64(s, t, raw, len) % s->table_rows[t];
}

float data_norm_int(double x) { return (float)log1p(x > 0 ? x : 0); }

/* ---- names ---- */

static const char *const fmt_names[] = {"auto", "criteo", "avazu", "binary", "synthetic"};

const char *data_format_name(int fmt) {
  return fmt >= 0 && fmt < (int)(sizeof fmt_names / sizeof fmt_names[0]) ? fmt_names[fmt] : "?";
}

int data_format_parse(const char *name) {
  for (int i = 0; i < (int)(sizeof fmt_names / sizeof fmt_names[0]); i++)
    if (!strcmp(name, fmt_names[i])) return i;
  if (!strcmp(name, "tsv")) return DATA_FMT_CRITEO;
  if (!strcmp(name, "csv")) return DATA_FMT_AVAZU;
  return -1;
}

const char *data_bad_kind_name(int kind) {
  static const char *const n[DATA_BAD_KINDS] = {"fields", "label", "integer", "hex", "long line", "binary/UTF-8",
                                                "truncated"};
  return kind >= 0 && kind < DATA_BAD_KINDS ? n[kind] : "?";
}

/* ---- malformed records ---- */

void data__reporter_init(data_reporter_t *r, const cfg_t *cfg, const char *path, data_stats_t *st, char *err,
                         size_t err_len) {
  memset(r, 0, sizeof *r);
  r->path = path;
  r->strict = cfg_bool(cfg, "strict");
  r->max_reports = (uint64_t)cfg_int(cfg, "data.max_reports");
  r->max_bad_fraction = cfg_float(cfg, "data.max_bad_fraction");
  r->st = st;
  r->err = err;
  r->err_len = err_len;
}

int data__bad(data_reporter_t *r, uint64_t line, int kind, const char *why) {
  r->st->bad_records++;
  r->st->bad_kind[kind]++;
  if (!r->first_line) {
    r->first_line = line;
    snprintf(r->first_why, sizeof r->first_why, "%s", why);
  }
  if (r->strict) return err_set(r->err, r->err_len, -EINVAL, "%s:%" PRIu64 ": %s (strict = true)", r->path, line, why);
  if (r->reported < r->max_reports) {
    r->reported++;
    log_warn("bad record skipped at=%s:%" PRIu64 " why=\"%s\"", r->path, line, why);
  }
  return 0;
}

void data__bad_summary(data_reporter_t *r) {
  if (r->st->bad_records > r->reported)
    log_warn("bad records skipped file=%s count=%" PRIu64 " reported=%" PRIu64 " (data.max_reports)", r->path,
             r->st->bad_records, r->reported);
}

/* 100 x for a message: one decimal ("48.0"), two significant digits under
 * 1 ("0.05"), and more if it would read as the limit it passed ("1.004",
 * never "1.0%, more than 1.0%") */
static void pct(char *out, size_t n, double x, double limit) {
  char b[32];
  if (x > 0 && x < 0.01) snprintf(out, n, "%.2g", 100 * x);
  else snprintf(out, n, "%.1f", 100 * x);
  if (limit >= 0 && x != limit) {
    pct(b, sizeof b, limit, -1);
    if (!strcmp(out, b)) snprintf(out, n, "%.4g", 100 * x);
  }
}

int data__bad_check(data_reporter_t *r, uint64_t valid) {
  uint64_t bad = r->st->bad_records, total = bad + valid;
  if (!bad) return 0;
  if (!valid)
    return err_set(r->err, r->err_len, -EINVAL,
                   "%s: no valid records (%" PRIu64 " malformed; first at %s:%" PRIu64 ": %s)", r->path, bad, r->path,
                   r->first_line, r->first_why);
  double f = (double)bad / (double)total, lim = r->max_bad_fraction;
  if (f <= lim) return 0;
  char fs[32], ls[32];
  pct(fs, sizeof fs, f, lim);
  pct(ls, sizeof ls, lim, -1);
  return err_set(r->err, r->err_len, -EINVAL,
                 "%s: %" PRIu64 " of %" PRIu64 " records are malformed (%s%%, more than data.max_bad_fraction = %s%%); "
                 "first at %s:%" PRIu64 ": %s",
                 r->path, bad, total, fs, ls, r->path, r->first_line, r->first_why);
}

/* ---- text index ---- */

int data__index_push(data_index_t *x, uint64_t off) {
  if (x->n == x->cap) {
    uint64_t cap = x->cap ? x->cap * 2 : 4096;
    if (x->d64) {
      uint64_t *n = realloc(x->d64, cap * sizeof *n);
      if (!n) return -ENOMEM;
      x->d64 = n;
    } else {
      uint32_t *n = realloc(x->d32, cap * sizeof *n);
      if (!n) return -ENOMEM;
      x->d32 = n;
      uint64_t *b = realloc(x->base, (cap >> 10) * sizeof *b);
      if (!b) return -ENOMEM;
      x->base = b;
    }
    x->cap = cap;
  }
  if (!x->d64) {
    if ((x->n & 1023) == 0) x->base[x->n >> 10] = off;
    uint64_t delta = off - x->base[x->n >> 10];
    if (delta <= UINT32_MAX) {
      x->d32[x->n++] = (uint32_t)delta;
      return 0;
    }
    /* a block of 1024 records spans more than 4 GiB (huge bad lines): full offsets */
    uint64_t *full = malloc(x->cap * sizeof *full);
    if (!full) return -ENOMEM;
    for (uint64_t i = 0; i < x->n; i++) full[i] = data__index_get(x, i);
    free(x->d32);
    free(x->base);
    x->d32 = NULL;
    x->base = NULL;
    x->d64 = full;
  }
  x->d64[x->n++] = off;
  return 0;
}

void data__index_free(data_index_t *x) {
  free(x->base);
  free(x->d32);
  free(x->d64);
  memset(x, 0, sizeof *x);
}

/* ---- opening ---- */

int data__detect(const char *path, int want, int *fmt, char *err, size_t err_len) {
  if (want != DATA_FMT_AUTO) {
    *fmt = want;
    return 0;
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); /* a FIFO must not block the open */
  if (fd < 0) return err_set(err, err_len, -errno, "%s: cannot open dataset: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    close(fd);
    return err_set(err, err_len, -EINVAL, "%s: not a regular file", path);
  }
  uint8_t head[8];
  ssize_t n = read(fd, head, sizeof head);
  int e = errno;
  close(fd);
  if (n < 0) return err_set(err, err_len, -e, "%s: cannot read dataset: %s", path, strerror(e));
  size_t l = strlen(path);
  if (data__is_binary(head, (size_t)n))
    *fmt = DATA_FMT_BINARY;
  else if (l >= 4 && !strcasecmp(path + l - 4, ".csv"))
    *fmt = DATA_FMT_AVAZU;
  else
    *fmt = DATA_FMT_CRITEO;
  return 0;
}

int data_open_path(const cfg_t *cfg, const char *path, data_source_t **out, char *err, size_t err_len) {
  int rc;
  *out = NULL;
  data_source_t *d = calloc(1, sizeof *d);
  if (!d) return -ENOMEM;
  if ((rc = data_schema_from_cfg(cfg, &d->schema, err, err_len)) != 0) {
    free(d);
    return rc;
  }
  d->ids = data__ids(&d->schema);
  d->record_bytes = data__record_bytes(&d->schema, d->ids);
  if (!(d->tseed = data__table_seeds(&d->schema))) {
    rc = -ENOMEM;
    goto out;
  }
  if (!path) path = cfg_str(cfg, "dataset");
  int fmt = data_format_parse(cfg_str(cfg, "dataset_format"));
  if (!strcmp(path, "synthetic")) {
    rc = data__open_synthetic(d, cfg, err, err_len);
    fmt = DATA_FMT_SYNTHETIC;
  } else {
    if (!*path) {
      rc = err_set(err, err_len, ERR_CONFIG, "dataset (from %s) is empty: give a path or 'synthetic'",
                cfg_origin(cfg, "dataset"));
      goto out;
    }
    if (!(d->path = strdup(path))) {
      rc = -ENOMEM;
      goto out;
    }
    if ((rc = data__detect(path, fmt, &fmt, err, err_len)) != 0) goto out;
    if (fmt == DATA_FMT_BINARY)
      rc = data__open_binary(d, err, err_len);
    else
      rc = data__open_text(d, fmt, cfg, err, err_len);
  }
  if (rc) goto out;
  if (d->samples == 0) {
    rc = err_set(err, err_len, -EINVAL, "%s: no valid records (%" PRIu64 " malformed)", d->path ? d->path : "synthetic",
              d->stats.bad_records);
    goto out;
  }
  d->n_test = (uint64_t)floor((double)d->samples * cfg_float(cfg, "test_fraction"));
  if (d->n_test > d->samples) d->n_test = d->samples;
  d->n_train = d->samples - d->n_test;
  d->stats.samples = d->samples;
  d->stats.train_samples = d->n_train;
  d->stats.test_samples = d->n_test;
  d->stats.format = fmt;
out:
  if (rc) {
    data_close(d);
    return rc;
  }
  *out = d;
  return 0;
}

int data_open(const cfg_t *cfg, data_source_t **out, char *err, size_t err_len) {
  return data_open_path(cfg, NULL, out, err, err_len);
}

void data_close(data_source_t *d) {
  if (!d) return;
  if (d->ops && d->ops->close) d->ops->close(d);
  data_schema_close(&d->schema);
  free(d->tseed);
  free(d->path);
  free(d);
}

const data_schema_t *data_schema(const data_source_t *d) { return &d->schema; }
void data_stats(const data_source_t *d, data_stats_t *st) { *st = d->stats; }
uint64_t data_samples(const data_source_t *d) { return d->samples; }

/* ---- batches ---- */

void data_batch_free(data_batch_t *b) {
  if (!b) return;
  free(b->hotness);
  free(b->labels);
  free(b->dense);
  free(b->ids);
  free(b->ids_off);
  memset(b, 0, sizeof *b);
}

int data_read_batch(data_source_t *d, int split, uint64_t iteration, uint32_t batch_size, data_batch_t *out, char *err,
                    size_t err_len) {
  const data_schema_t *s = &d->schema;
  const char *name = d->path ? d->path : "synthetic";
  uint64_t n, base;
  uint8_t *scratch = NULL;
  int rc = 0;
  memset(out, 0, sizeof *out);
  switch (split) {
  case DATA_TRAIN: n = d->n_train; base = 0; break;
  case DATA_TEST: n = d->n_test; base = d->n_train; break;
  case DATA_ALL: n = d->samples; base = 0; break;
  default: return err_set(err, err_len, -EINVAL, "unknown split %d", split);
  }
  if (n == 0)
    return err_set(err, err_len, -EINVAL, "%s: the %s split is empty (%" PRIu64 " samples, test_fraction)", name,
                split == DATA_TEST ? "test" : "train", d->samples);
  if (batch_size == 0) return err_set(err, err_len, -EINVAL, "batch size 0");
  out->iteration = iteration;
  out->split = split;
  out->n = batch_size;
  out->n_dense = s->n_dense;
  out->n_tables = s->n_tables;
  out->hotness = malloc(s->n_tables * sizeof *out->hotness);
  out->labels = malloc((size_t)batch_size * sizeof *out->labels);
  out->dense = malloc(((size_t)batch_size * s->n_dense + 1) * sizeof *out->dense);
  out->ids = malloc(((size_t)batch_size * d->ids + 1) * sizeof *out->ids);
  out->ids_off = malloc((s->n_tables + 1) * sizeof *out->ids_off);
  scratch = malloc(d->record_bytes);
  if (!out->hotness || !out->labels || !out->dense || !out->ids || !out->ids_off || !scratch) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory for a batch of %u", batch_size);
    goto out;
  }
  memcpy(out->hotness, s->hotness, s->n_tables * sizeof *out->hotness);
  out->ids_off[0] = 0;
  for (uint32_t t = 0; t < s->n_tables; t++) out->ids_off[t + 1] = out->ids_off[t] + (size_t)batch_size * s->hotness[t];
  uint64_t idx = (uint64_t)(((unsigned __int128)iteration * batch_size) % n);
  const size_t dense_bytes = 4 * (size_t)s->n_dense;
  for (uint32_t j = 0; j < batch_size; j++) {
    const uint8_t *rec;
    if ((rc = d->ops->rec(d, base + idx, scratch, &rec, err, err_len)) != 0) goto out;
    float label;
    memcpy(&label, rec, 4);
    if (label != 0.0f && label != 1.0f) {
      rc = err_set(err, err_len, -EIO, "%s: record %" PRIu64 " is corrupt (label %g)", name, base + idx, (double)label);
      goto out;
    }
    out->labels[j] = label;
    memcpy(out->dense + (size_t)j * s->n_dense, rec + 4, dense_bytes);
    const uint8_t *h = rec + 4 + dense_bytes;
    for (uint32_t t = 0; t < s->n_tables; t++) {
      uint32_t hot = s->hotness[t];
      uint64_t rows = s->table_rows[t], *dst = out->ids + out->ids_off[t] + (size_t)j * hot;
      for (uint32_t k = 0; k < hot; k++, h += 8) {
        uint64_t v;
        memcpy(&v, h, 8);
        dst[k] = v % rows;
      }
    }
    if (++idx == n) idx = 0;
  }
out:
  free(scratch);
  if (rc) data_batch_free(out);
  return rc;
}
