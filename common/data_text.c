/*
 * data_text: the Criteo TSV and Avazu CSV readers.
 *
 * A text file is memory-mapped and scanned once at open: each line is
 * validated and fully parsed (so open measures the real parse cost), the
 * byte offset of every valid record goes into an index, and malformed lines
 * are counted, reported and skipped (data__bad).  Batch reads then parse
 * the lines they need again, by offset: random access without holding the
 * parsed dataset in memory.  `chanter data convert` uses the same scanner
 * with a callback that writes each record out, in one streaming pass.
 *
 * Criteo (Kaggle train.txt and Terabyte day_N share the layout):
 *   label \t I1 .. I13 \t C1 .. C26
 * label 0/1; I* decimal integers (optionally negative; empty = 0); C* hex
 * strings (any length, empty allowed), hashed as the raw bytes.  A short
 * line (2 to 39 fields: copies of Criteo often strip trailing empty fields)
 * is read as if the missing fields were there and empty: the same record,
 * bit for bit, as the line with its tabs.  A lone label (1 field) carries
 * no feature and is rather a stray line: malformed.  So is a short last
 * line without its newline, which is what a cut file looks like.
 * Avazu: CSV with a header naming the columns; `click` is the label, `id`
 * is ignored, every other column is a categorical hashed as its raw bytes
 * (any valid UTF-8 without control characters).  No quoting (Avazu has
 * none).  Every line must have every column of the header: Avazu has no
 * empty trailing columns to strip, and with columns known by name a short
 * line is more likely cut than abbreviated, so it is malformed.
 * Both: lines end in \n or \r\n, the last line may lack its newline, a
 * UTF-8 byte-order mark at the start is skipped, empty lines are skipped
 * (not counted), a line longer than DATA_MAX_LINE bytes is malformed.
 *
 * The hot loop scans each field byte by byte exactly once with table
 * lookups; only a line that fails goes through the slow diagnosis that
 * names what is wrong.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "err.h"

#define CRITEO_DENSE 13
#define CRITEO_TABLES 26
#define CRITEO_FIELDS (1 + CRITEO_DENSE + CRITEO_TABLES)

enum { COL_ID = -1, COL_CLICK = -2 };

struct data_text_s {
  int fmt;
  char *path;
  uint32_t n_dense, n_tables, ids;
  size_t record_bytes;
  uint64_t *tseed;
  uint64_t *empty; /* criteo: hash of the empty value per table (short lines) */
  /* avazu */
  uint32_t ncols;
  int32_t *col;    /* per column: table index, COL_ID or COL_CLICK */
  char **names;    /* column names (for messages) */
};

static const uint8_t is_hex[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1,
    ['E'] = 1, ['F'] = 1};

/* ---- validation helpers (slow path) ---- */

/* Offset of the first byte that is not valid UTF-8 text (control bytes
 * other than tab count as binary), or -1 if [p, e) is clean. */
static long first_garbage(const uint8_t *p, const uint8_t *e) {
  const uint8_t *s = p;
  while (p < e) {
    uint8_t c = *p;
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) return p - s;
      p++;
      continue;
    }
    int n;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
    else return p - s;
    if (e - p <= n) return p - s;
    for (int i = 1; i <= n; i++) {
      if ((p[i] & 0xc0) != 0x80) return p - s;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return p - s;
    p += n + 1;
  }
  return -1;
}

static uint32_t count_fields(const uint8_t *p, const uint8_t *e, uint8_t sep) {
  uint32_t n = 1;
  for (; p < e; p++) n += *p == sep;
  return n;
}

/* Field f (0-based) of the line, for messages: clipped, printable. */
static void field_text(const uint8_t *p, const uint8_t *e, uint8_t sep, uint32_t f, char *out, size_t n) {
  for (uint32_t i = 0; i < f && p < e; p++)
    if (*p == sep) i++;
  size_t k = 0;
  for (; p < e && *p != sep && k + 1 < n; p++) {
    if (k + 4 >= n) {
      out[k++] = '.', out[k++] = '.';
      break;
    }
    out[k++] = (*p >= 0x20 && *p < 0x7f) ? (char)*p : '?';
  }
  out[k] = 0;
}

/* ---- Criteo ---- */

/* Parses one line [p, e) (no newline, no CR) into rec.  0 (*is_short set
 * if trailing fields were missing and read as empty), or the kind of
 * failure + 1 with *field the 0-based field that failed. */
static int parse_criteo(const data_text_t *tx, const uint8_t *p, const uint8_t *e, uint8_t *rec, uint32_t *field,
                        int *is_short) {
  float label, dense[CRITEO_DENSE];
  uint8_t *h = rec + 4 + 4 * CRITEO_DENSE;
  uint32_t j = 0, t = 0;
  if (p >= e || (*p != '0' && *p != '1') || (p + 1 < e && p[1] != '\t')) {
    *field = 0;
    return DATA_BAD_LABEL + 1;
  }
  label = (float)(*p - '0');
  p++;
  if (p >= e) return DATA_BAD_FIELDS + 1; /* a lone label */
  for (; j < CRITEO_DENSE; j++) {
    if (p >= e) goto pad;
    p++; /* the tab */
    int neg = 0;
    if (p < e && *p == '-') neg = 1, p++;
    const uint8_t *q = p;
    uint64_t v = 0;
    while (p < e && (unsigned)(*p - '0') < 10u) v = v * 10 + (unsigned)(*p++ - '0');
    size_t nd = (size_t)(p - q);
    if ((p < e && *p != '\t') || (neg && nd == 0) || nd > 18) {
      *field = 1 + j;
      return DATA_BAD_INT + 1;
    }
    dense[j] = neg || v == 0 ? 0.0f : data_norm_int((double)v);
  }
  for (; t < CRITEO_TABLES; t++) {
    if (p >= e) goto pad;
    p++;
    const uint8_t *q = p;
    while (p < e && is_hex[*p]) p++;
    if (p < e && *p != '\t') {
      *field = 1 + CRITEO_DENSE + t;
      return DATA_BAD_HEX + 1;
    }
    uint64_t v = data__hash(tx->tseed[t], q, (size_t)(p - q));
    memcpy(h + 8 * t, &v, 8);
  }
  if (p != e) return DATA_BAD_FIELDS + 1;
  goto done;
pad: /* a short line: the missing fields are empty, as an explicit empty field reads */
  *is_short = 1;
  for (; j < CRITEO_DENSE; j++) dense[j] = 0.0f;
  for (; t < CRITEO_TABLES; t++) memcpy(h + 8 * t, &tx->empty[t], 8);
done:
  memcpy(rec, &label, 4);
  memcpy(rec + 4, dense, sizeof dense);
  return 0;
}

static const char *criteo_field_name(uint32_t f, char *buf, size_t n) {
  if (f == 0) snprintf(buf, n, "label");
  else if (f <= CRITEO_DENSE) snprintf(buf, n, "integer I%u", f);
  else snprintf(buf, n, "categorical C%u", f - CRITEO_DENSE);
  return buf;
}

/* ---- Avazu ---- */

static int parse_avazu(const data_text_t *tx, const uint8_t *p, const uint8_t *e, uint8_t *rec, uint32_t *field) {
  uint8_t *h = rec + 4;
  float label = 0;
  unsigned weird = 0;
  for (uint32_t c = 0; c < tx->ncols; c++) {
    if (c) {
      if (p >= e) return DATA_BAD_FIELDS + 1;
      p++; /* the comma */
    }
    const uint8_t *q = p;
    while (p < e && *p != ',') weird |= (unsigned)(*p < 0x20 || *p >= 0x7f), p++;
    int32_t col = tx->col[c];
    if (col >= 0) {
      uint64_t v = data__hash(tx->tseed[col], q, (size_t)(p - q));
      memcpy(h + 8 * (size_t)col, &v, 8);
    } else if (col == COL_CLICK) {
      if (p - q != 1 || (*q != '0' && *q != '1')) {
        *field = c;
        return DATA_BAD_LABEL + 1;
      }
      label = (float)(*q - '0');
    }
  }
  if (p != e) return DATA_BAD_FIELDS + 1;
  memcpy(rec, &label, 4);
  return weird ? -1 : 0; /* -1: the caller checks the line for binary data */
}

/* ---- the scanner ---- */

static int parse_line(const data_text_t *tx, const uint8_t *p, const uint8_t *e, uint8_t *rec, uint32_t *field,
                      int *is_short) {
  *is_short = 0;
  if (tx->fmt == DATA_FMT_CRITEO) return parse_criteo(tx, p, e, rec, field, is_short);
  int rc = parse_avazu(tx, p, e, rec, field);
  if (rc == -1) return first_garbage(p, e) >= 0 ? DATA_BAD_BINARY + 1 : 0;
  return rc;
}

/* Why line [p, e) failed with fast code rc (kind + 1): the kind and a sentence. */
static int diagnose(const data_text_t *tx, const uint8_t *p, const uint8_t *e, int rc, uint32_t field, char *why,
                    size_t n) {
  long g = first_garbage(p, e);
  if (g >= 0) {
    snprintf(why, n, "invalid UTF-8 or binary data (byte 0x%02x at column %ld)", p[g], g + 1);
    return DATA_BAD_BINARY;
  }
  uint8_t sep = tx->fmt == DATA_FMT_CRITEO ? '\t' : ',';
  uint32_t want = tx->fmt == DATA_FMT_CRITEO ? CRITEO_FIELDS : tx->ncols;
  uint32_t got = count_fields(p, e, sep);
  /* Criteo: fewer fields is fine (a short line) unless a lone label; what
   * failed is then a field's value */
  if (rc == DATA_BAD_FIELDS + 1 || got > want || (got < want && tx->fmt != DATA_FMT_CRITEO)) {
    if (tx->fmt == DATA_FMT_CRITEO)
      snprintf(why, n, "%u field%s, expected %u (label, 13 integers, 26 categoricals, tab-separated)", got,
               got == 1 ? "" : "s", want);
    else
      snprintf(why, n, "%u fields, expected %u (the header's columns)", got, want);
    return DATA_BAD_FIELDS;
  }
  const char *hint =
      tx->fmt == DATA_FMT_CRITEO && got == want - 1 ? "; 39 fields: Kaggle's test.txt has no labels" : "";
  char txt[48], fname[48];
  field_text(p, e, sep, field, txt, sizeof txt);
  int kind = rc - 1;
  if (tx->fmt == DATA_FMT_CRITEO) criteo_field_name(field, fname, sizeof fname);
  else snprintf(fname, sizeof fname, "%s", tx->names[field]);
  switch (kind) {
  case DATA_BAD_LABEL: snprintf(why, n, "field %u (%s) '%s' is not 0 or 1%s", field + 1, fname, txt, hint); break;
  case DATA_BAD_INT:
    snprintf(why, n, "field %u (%s) '%s' is not an integer (or out of range)%s", field + 1, fname, txt, hint);
    break;
  case DATA_BAD_HEX: snprintf(why, n, "field %u (%s) '%s' is not hexadecimal%s", field + 1, fname, txt, hint); break;
  default: snprintf(why, n, "malformed"); break;
  }
  return kind;
}

int data__text_scan(data_text_t *tx, const uint8_t *buf, size_t len, size_t first, uint64_t first_line,
                    data_reporter_t *r, data_rec_cb cb, void *ctx) {
  uint64_t rec_store[(4 + 4 * 64 + 8 * 64) / 8 + 1];
  uint8_t *rec = tx->record_bytes <= sizeof rec_store ? (uint8_t *)rec_store : malloc(tx->record_bytes);
  int rc = 0;
  if (!rec) return -ENOMEM;
  size_t pos = first;
  uint64_t line = first_line;
  const size_t win_max = DATA_MAX_LINE + 2; /* the longest line, its \r and its \n */
  while (pos < len) {
    const uint8_t *p = buf + pos, *e;
    size_t rem = len - pos, win = rem < win_max ? rem : win_max, next;
    const uint8_t *nl = memchr(p, '\n', win);
    int has_nl = nl != NULL;
    if (nl) {
      e = nl;
      next = (size_t)(nl - buf) + 1;
    } else if (rem > win_max) {
      nl = memchr(p + win, '\n', rem - win);
      next = nl ? (size_t)(nl - buf) + 1 : len;
      if ((rc = data__bad(r, line, DATA_BAD_LONG, "line longer than 65536 bytes")) != 0) break;
      line++;
      pos = next;
      continue;
    } else {
      e = buf + len;
      next = len;
    }
    if (e > p && e[-1] == '\r') e--;
    if (e - p > DATA_MAX_LINE) {
      if ((rc = data__bad(r, line, DATA_BAD_LONG, "line longer than 65536 bytes")) != 0) break;
    } else if (e > p) {
      uint32_t field = 0;
      int is_short = 0;
      int bad = parse_line(tx, p, e, rec, &field, &is_short);
      if (!bad && is_short && !has_nl) {
        /* a short last line without its newline: a cut file, not a stripped line */
        char why[160];
        snprintf(why, sizeof why, "truncated last record (no newline at end of file): %u fields, expected %u",
                 count_fields(p, e, '\t'), CRITEO_FIELDS);
        if ((rc = data__bad(r, line, DATA_BAD_TRUNCATED, why)) != 0) break;
      } else if (!bad) {
        r->st->short_lines += (uint64_t)is_short;
        if (cb && (rc = cb(ctx, pos, rec)) != 0) break;
      } else {
        char why[400], full[480];
        int kind = diagnose(tx, p, e, bad, field, why, sizeof why);
        if (!has_nl) {
          snprintf(full, sizeof full, "truncated last record (no newline at end of file): %s", why);
          kind = DATA_BAD_TRUNCATED;
        } else {
          snprintf(full, sizeof full, "%s", why);
        }
        if ((rc = data__bad(r, line, kind, full)) != 0) break;
      }
    }
    line++;
    pos = next;
  }
  if ((uint8_t *)rec_store != rec) free(rec);
  return rc;
}

int data__text_parse_at(data_text_t *tx, const uint8_t *buf, size_t len, uint64_t off, uint8_t *rec) {
  if (off >= len) return -EIO;
  const uint8_t *p = buf + off;
  size_t rem = len - off, win = rem < DATA_MAX_LINE + 2 ? rem : DATA_MAX_LINE + 2;
  const uint8_t *e = memchr(p, '\n', win);
  if (!e) e = p + win;
  if (e > p && e[-1] == '\r') e--;
  uint32_t field;
  int is_short;
  return parse_line(tx, p, e, rec, &field, &is_short) ? -EIO : 0;
}

/* ---- setup ---- */

void data__text_destroy(data_text_t *tx) {
  if (!tx) return;
  if (tx->names)
    for (uint32_t c = 0; c < tx->ncols; c++) free(tx->names[c]);
  free(tx->names);
  free(tx->col);
  free(tx->tseed);
  free(tx->empty);
  free(tx->path);
  free(tx);
}

static int one_hot(const data_schema_t *s) {
  for (uint32_t t = 0; t < s->n_tables; t++)
    if (s->hotness[t] != 1) return 0;
  return 1;
}

static const char *origin(const cfg_t *cfg, const char *key) { return cfg ? cfg_origin(cfg, key) : "the job"; }

int data__text_create(const data_schema_t *s, const cfg_t *cfg, int fmt, const char *path, const uint8_t *buf,
                      size_t len, data_text_t **out, size_t *first, uint64_t *first_line, char *err,
                      size_t err_len) {
  int rc = 0;
  *out = NULL;
  *first = 0;
  *first_line = 1;
  data_text_t *tx = calloc(1, sizeof *tx);
  if (!tx) return -ENOMEM;
  tx->fmt = fmt;
  tx->n_dense = s->n_dense;
  tx->n_tables = s->n_tables;
  tx->ids = data__ids(s);
  tx->record_bytes = data__record_bytes(s, tx->ids);
  if (!(tx->path = strdup(path)) || !(tx->tseed = data__table_seeds(s))) {
    rc = -ENOMEM;
    goto out;
  }
  if (len >= 3 && buf[0] == 0xef && buf[1] == 0xbb && buf[2] == 0xbf) *first = 3; /* UTF-8 BOM */
  if (fmt == DATA_FMT_CRITEO) {
    if (s->n_dense != CRITEO_DENSE || s->n_tables != CRITEO_TABLES || !one_hot(s)) {
      rc = err_set(err, err_len, ERR_CONFIG,
                "%s: Criteo TSV holds %d integer features and %d one-hot categoricals, but the job says n_dense = %u "
                "(from %s) and %u tables in table_rows (from %s)%s: set n_dense = %d and %d table_rows",
                path, CRITEO_DENSE, CRITEO_TABLES, s->n_dense, origin(cfg, "n_dense"), s->n_tables,
                origin(cfg, "table_rows"), one_hot(s) ? "" : " with multi-hot table_hotness", CRITEO_DENSE,
                CRITEO_TABLES);
      goto out;
    }
    if (!(tx->empty = malloc(CRITEO_TABLES * sizeof *tx->empty))) {
      rc = -ENOMEM;
      goto out;
    }
    for (uint32_t t = 0; t < CRITEO_TABLES; t++) tx->empty[t] = data__hash(tx->tseed[t], "", 0);
    goto out;
  }
  if (fmt != DATA_FMT_AVAZU) {
    rc = err_set(err, err_len, -EINVAL, "%s: not a text format (%s)", path, data_format_name(fmt));
    goto out;
  }
  /* the Avazu header */
  if (len <= *first) {
    rc = err_set(err, err_len, -EINVAL, "%s: empty file (Avazu CSV starts with a header: id,click,...)", path);
    goto out;
  }
  const uint8_t *p = buf + *first, *e;
  size_t rem = len - *first, win = rem < DATA_MAX_LINE + 2 ? rem : DATA_MAX_LINE + 2;
  const uint8_t *nl = memchr(p, '\n', win);
  if (!nl && rem > win) {
    rc = err_set(err, err_len, -EINVAL, "%s:1: the Avazu CSV header is longer than 65536 bytes", path);
    goto out;
  }
  e = nl ? nl : p + rem;
  *first = nl ? (size_t)(nl - buf) + 1 : len;
  *first_line = 2;
  if (e > p && e[-1] == '\r') e--;
  if (e == p) {
    rc = err_set(err, err_len, -EINVAL, "%s:1: empty file or empty header (Avazu CSV starts with a header: id,click,...)",
              path);
    goto out;
  }
  if (first_garbage(p, e) >= 0) {
    rc = err_set(err, err_len, -EINVAL, "%s:1: the Avazu CSV header holds binary data or invalid UTF-8", path);
    goto out;
  }
  tx->ncols = count_fields(p, e, ',');
  tx->col = calloc(tx->ncols, sizeof *tx->col);
  tx->names = calloc(tx->ncols, sizeof *tx->names);
  if (!tx->col || !tx->names) {
    rc = -ENOMEM;
    goto out;
  }
  int click = -1, id = -1;
  uint32_t ncat = 0;
  for (uint32_t c = 0; c < tx->ncols; c++) {
    const uint8_t *q = p;
    while (p < e && *p != ',') p++;
    if (!(tx->names[c] = strndup((const char *)q, (size_t)(p - q)))) {
      rc = -ENOMEM;
      goto out;
    }
    p++;
    if (!strcmp(tx->names[c], "click") && click < 0) click = (int)c, tx->col[c] = COL_CLICK;
    else if (!strcmp(tx->names[c], "id") && id < 0) id = (int)c, tx->col[c] = COL_ID;
    else tx->col[c] = (int32_t)ncat++;
  }
  if (click < 0) {
    rc = err_set(err, err_len, -EINVAL,
              "%s:1: the Avazu CSV header has no 'click' column (the label); first column '%s'%s", path,
              tx->names[0], tx->ncols < 2 ? " (is this CSV?)" : "");
    goto out;
  }
  if (s->n_dense != 0 || s->n_tables != ncat || !one_hot(s)) {
    rc = err_set(err, err_len, ERR_CONFIG,
              "%s: this Avazu CSV has no dense features and %u one-hot categorical columns (all but%s click), but the "
              "job says n_dense = %u (from %s) and %u tables in table_rows (from %s)%s: set n_dense = 0 and %u "
              "table_rows",
              path, ncat, id >= 0 ? " id and" : "", s->n_dense, origin(cfg, "n_dense"), s->n_tables,
              origin(cfg, "table_rows"), one_hot(s) ? "" : " with multi-hot table_hotness", ncat);
    goto out;
  }
out:
  if (rc) {
    data__text_destroy(tx);
    return rc;
  }
  *out = tx;
  return 0;
}

/* ---- the text source ---- */

int data__map_file(const char *path, const uint8_t **buf, size_t *len, char *err, size_t err_len) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); /* a FIFO must not block the open */
  *buf = NULL;
  *len = 0;
  if (fd < 0) return err_set(err, err_len, -errno, "%s: cannot open dataset: %s", path, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) < 0) {
    rc = err_set(err, err_len, -errno, "%s: cannot stat: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = err_set(err, err_len, -EINVAL, "%s: not a regular file", path);
  } else if (st.st_size > 0) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      rc = err_set(err, err_len, -errno, "%s: cannot map: %s", path, strerror(errno));
    } else {
      *buf = m;
      *len = (size_t)st.st_size;
    }
  }
  close(fd);
  return rc;
}

void data__unmap(const uint8_t *buf, size_t len) {
  if (buf && len) munmap((void *)buf, len);
}

typedef struct text_src_s {
  data_text_t *tx;
  const uint8_t *buf;
  size_t len;
  data_index_t idx;
} text_src_t;

static int text_rec(data_source_t *d, uint64_t i, uint8_t *scratch, const uint8_t **rec, char *err, size_t err_len) {
  text_src_t *ts = d->impl;
  if (data__text_parse_at(ts->tx, ts->buf, ts->len, data__index_get(&ts->idx, i), scratch))
    return err_set(err, err_len, -EIO, "%s: record %" PRIu64 " no longer parses (was the file changed after open?)",
                d->path, i);
  *rec = scratch;
  return 0;
}

static void text_close(data_source_t *d) {
  text_src_t *ts = d->impl;
  if (!ts) return;
  data__text_destroy(ts->tx);
  data__unmap(ts->buf, ts->len);
  data__index_free(&ts->idx);
  free(ts);
  d->impl = NULL;
}

static const data_ops_t text_ops = {text_rec, text_close};

static int index_cb(void *ctx, uint64_t off, const uint8_t *rec) {
  (void)rec;
  return data__index_push(ctx, off);
}

int data__open_text(data_source_t *d, int fmt, const cfg_t *cfg, char *err, size_t err_len) {
  text_src_t *ts = calloc(1, sizeof *ts);
  if (!ts) return -ENOMEM;
  d->ops = &text_ops;
  d->impl = ts;
  int rc = data__map_file(d->path, &ts->buf, &ts->len, err, err_len);
  if (rc) return rc;
  d->stats.bytes = ts->len;
  size_t first;
  uint64_t first_line;
  if ((rc = data__text_create(&d->schema, cfg, fmt, d->path, ts->buf, ts->len, &ts->tx, &first, &first_line, err,
                              err_len)) != 0)
    return rc;
  if (ts->len) madvise((void *)ts->buf, ts->len, MADV_SEQUENTIAL);
  data_reporter_t r;
  data__reporter_init(&r, cfg, d->path, &d->stats, err, err_len);
  rc = data__text_scan(ts->tx, ts->buf, ts->len, first, first_line, &r, index_cb, &ts->idx);
  if (rc == -ENOMEM) err_set(err, err_len, rc, "%s: out of memory indexing records", d->path);
  if (rc) return rc;
  data__bad_summary(&r);
  if ((rc = data__bad_check(&r, ts->idx.n)) != 0) return rc;
  if (ts->len) madvise((void *)ts->buf, ts->len, MADV_NORMAL);
  d->samples = ts->idx.n;
  return 0;
}
