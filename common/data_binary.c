/*
 * data_binary: chanter's own dataset format, its memory-mapped reader, its
 * streaming writer, and `chanter data convert`.
 *
 * The format (version 1), all integers little-endian:
 *
 *   offset  size            field
 *   0       8               magic "CHANTERD"
 *   8       4   u32         format version (1)
 *   12      4   u32         header_bytes H: where records start (multiple of 8)
 *   16      4   u32         n_dense
 *   20      4   u32         n_tables
 *   24      4   u32         record_bytes R = 4 + 4 * n_dense + 8 * sum(hotness)
 *   28      4   u32         flags (0; a reader refuses flags it does not know)
 *   32      8   u64         hash_seed the hashes were computed with
 *   40      8   u64         samples (records)
 *   48      8   u64         malformed records skipped when the file was written (information)
 *   56      4*n_tables u32  hotness of each table
 *   ...     zero padding to a multiple of 8
 *   H-8     8   u64         XXH3-64 (seed 0) of bytes [0, H-8): the header's checksum
 *   H       R * samples     records
 *
 * A record is what data_internal.h calls a record: float32 label (0 or 1),
 * float32 dense[n_dense] already normalized (log(1 + max(x, 0))), then for
 * each table t in order hotness[t] uint64 hashes of the raw values
 * (data_hash64: XXH3 seeded with hash_seed and t) *before* the modulo, so
 * a file does not depend on table_rows: row = hash % table_rows[t] at read
 * time.  Packed: no padding between records or fields.
 *
 * The reader maps the file and checks, at open, magic, version, checksum,
 * that the header matches the job (n_dense, tables, hotness, hash_seed) and
 * that the size is exactly H + R * samples; record i is then at H + R * i.
 * Labels are checked as batches are read (a corrupt record is -EIO).  The
 * writer streams records to a temporary beside OUT (fsio_replace_open) and
 * writes the header (with the sample count) and replaces OUT when done
 * (fsio_replace_commit), so a reader never sees a half file.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data_internal.h"
#include "err.h"
#include "fsio.h"

#define HDR_FIXED 56

static size_t header_bytes(uint32_t n_tables) { return ((HDR_FIXED + 4 * (size_t)n_tables + 7) & ~(size_t)7) + 8; }

static uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

int data__is_binary(const uint8_t *head, size_t n) { return n >= 7 && !memcmp(head, DATA_BIN_MAGIC, 7); }

/* ---- reader ---- */

typedef struct bin_src_s {
  const uint8_t *buf;
  size_t len, hdr;
} bin_src_t;

static int bin_rec(data_source_t *d, uint64_t i, uint8_t *scratch, const uint8_t **rec, char *err, size_t err_len) {
  (void)scratch;
  (void)err;
  (void)err_len;
  bin_src_t *b = d->impl;
  *rec = b->buf + b->hdr + i * d->record_bytes;
  return 0;
}

static void bin_close(data_source_t *d) {
  bin_src_t *b = d->impl;
  if (!b) return;
  data__unmap(b->buf, b->len);
  free(b);
  d->impl = NULL;
}

static const data_ops_t bin_ops = {bin_rec, bin_close};

static void list_u32(char *out, size_t n, const uint32_t *v, uint32_t k) {
  size_t o = 0;
  out[0] = 0;
  for (uint32_t i = 0; i < k && o + 16 < n; i++) o += (size_t)snprintf(out + o, n - o, "%s%u", i ? "," : "", v[i]);
}

int data__open_binary(data_source_t *d, char *err, size_t err_len) {
  bin_src_t *b = calloc(1, sizeof *b);
  if (!b) return -ENOMEM;
  d->ops = &bin_ops;
  d->impl = b;
  const char *path = d->path;
  const data_schema_t *s = &d->schema;
  int rc = data__map_file(path, &b->buf, &b->len, err, err_len);
  if (rc) return rc;
  d->stats.bytes = b->len;
  const uint8_t *h = b->buf;
  if (b->len < 16 || memcmp(h, DATA_BIN_MAGIC, 8) != 0) {
    char m[9] = {0};
    for (size_t i = 0; i < 8 && i < b->len; i++) m[i] = (h[i] >= 0x20 && h[i] < 0x7f) ? (char)h[i] : '?';
    return err_set(err, err_len, -EINVAL, "%s: not a chanter binary dataset (starts with '%s', expected magic '%s')", path,
                m, DATA_BIN_MAGIC);
  }
  uint32_t version = rd32(h + 8);
  if (version != DATA_BIN_VERSION)
    return err_set(err, err_len, -EINVAL,
                "%s: binary dataset format version %u; this chanter reads version %u (convert the source again with "
                "this chanter)",
                path, version, DATA_BIN_VERSION);
  if (b->len < HDR_FIXED + 8) return err_set(err, err_len, -EINVAL, "%s: truncated header (%zu bytes)", path, b->len);
  uint32_t hdr = rd32(h + 12), n_dense = rd32(h + 16), n_tables = rd32(h + 20), rec_bytes = rd32(h + 24),
           flags = rd32(h + 28);
  if (n_tables == 0 || n_tables > TABLE_MAX || hdr != header_bytes(n_tables))
    return err_set(err, err_len, -EINVAL, "%s: corrupt header (%u tables, header of %u bytes)", path, n_tables, hdr);
  if (b->len < hdr)
    return err_set(err, err_len, -EINVAL, "%s: truncated header (%zu bytes, the header says %u)", path, b->len, hdr);
  if (XXH3_64bits(h, hdr - 8) != rd64(h + hdr - 8))
    return err_set(err, err_len, -EINVAL, "%s: header checksum mismatch (corrupt file)", path);
  if (flags != 0)
    return err_set(err, err_len, -EINVAL, "%s: header flags 0x%x unknown to this chanter (version %u has none)", path, flags,
                DATA_BIN_VERSION);
  uint64_t seed = rd64(h + 32), samples = rd64(h + 40), bad = rd64(h + 48);
  uint32_t *hot = malloc(n_tables * sizeof *hot);
  if (!hot) return -ENOMEM;
  uint64_t ids = 0;
  for (uint32_t t = 0; t < n_tables; t++) ids += hot[t] = rd32(h + HDR_FIXED + 4 * (size_t)t);
  int same_hot = n_tables == s->n_tables;
  for (uint32_t t = 0; same_hot && t < n_tables; t++) same_hot = hot[t] == s->hotness[t];
  if (n_dense != s->n_dense || !same_hot || seed != s->hash_seed) {
    char fh[200], jh[200];
    list_u32(fh, sizeof fh, hot, n_tables);
    list_u32(jh, sizeof jh, s->hotness, s->n_tables);
    rc = err_set(err, err_len, ERR_CONFIG,
              "%s: written for n_dense = %u, %u tables with hotness %s, hash_seed = %" PRIu64
              "; the job says n_dense = %u, %u tables with hotness %s, hash_seed = %" PRIu64,
              path, n_dense, n_tables, fh, seed, s->n_dense, s->n_tables, jh, s->hash_seed);
    free(hot);
    return rc;
  }
  free(hot);
  if ((uint64_t)rec_bytes != 4 + 4 * (uint64_t)n_dense + 8 * ids || rec_bytes != d->record_bytes)
    return err_set(err, err_len, -EINVAL, "%s: corrupt header (record of %u bytes for %u dense and %" PRIu64 " ids)", path,
                rec_bytes, n_dense, ids);
  uint64_t body = b->len - hdr;
  if (samples > body / rec_bytes || body != samples * rec_bytes) {
    if (body / rec_bytes < samples || body % rec_bytes)
      return err_set(err, err_len, -EINVAL,
                  "%s: truncated: %" PRIu64 " bytes of records hold %" PRIu64 " complete records (%" PRIu64
                  " bytes left over); the header says %" PRIu64,
                  path, body, body / rec_bytes, body % rec_bytes, samples);
    return err_set(err, err_len, -EINVAL,
                "%s: %" PRIu64 " bytes after the %" PRIu64 " records the header announces (not written by a finished "
                "chanter data convert/gen?)",
                path, body - samples * rec_bytes, samples);
  }
  b->hdr = hdr;
  d->samples = samples;
  d->stats.bad_records = bad;
  return 0;
}

/* ---- writer ---- */

#define WBUF (1u << 20)

struct data_writer_s {
  fsio_tmp_t t; /* the temporary beside path (t.f open until finished or aborted) */
  int fd;       /* fileno(t.f): records go out with write(2), the header with pwrite(2) */
  data_schema_t s;
  size_t rec_bytes, hdr, used;
  uint64_t samples;
  uint8_t *buf;
  int failed;
};

int data__write_all(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

void data__writer_abort(data_writer_t *w) {
  if (!w) return;
  if (w->t.f) fsio_replace_commit(&w->t, false, NULL, 0); /* closes and removes the temporary */
  free(w->buf);
  data_schema_close(&w->s);
  free(w);
}

int data__writer_open(const char *path, const data_schema_t *s, data_writer_t **out, char *err, size_t err_len) {
  data_writer_t *w = calloc(1, sizeof *w);
  int rc = 0;
  if (!w) return -ENOMEM;
  w->fd = -1;
  w->hdr = header_bytes(s->n_tables);
  w->rec_bytes = data__record_bytes(s, data__ids(s));
  w->buf = malloc(WBUF > w->hdr ? WBUF : w->hdr);
  if (!w->buf || data__schema_copy(&w->s, s)) {
    rc = -ENOMEM;
    goto out;
  }
  if (w->rec_bytes > WBUF || w->hdr > WBUF) {
    rc = err_set(err, err_len, -EINVAL, "%s: records of %zu bytes are too large", path, w->rec_bytes);
    goto out;
  }
  if ((rc = fsio_replace_open(&w->t, path, 0644, err, err_len)) != 0) goto out;
  w->fd = fileno(w->t.f);
  memset(w->buf, 0, w->hdr); /* the header is written at the end */
  w->used = w->hdr;
out:
  if (rc) {
    data__writer_abort(w);
    return rc;
  }
  *out = w;
  return 0;
}

int data__writer_add(data_writer_t *w, const uint8_t *rec) {
  if (w->failed) return w->failed;
  if (w->used + w->rec_bytes > WBUF) {
    int rc = data__write_all(w->fd, w->buf, w->used);
    if (rc) return w->failed = rc;
    w->used = 0;
  }
  memcpy(w->buf + w->used, rec, w->rec_bytes);
  w->used += w->rec_bytes;
  w->samples++;
  return 0;
}

int data__writer_finish(data_writer_t *w, uint64_t bad_records, char *err, size_t err_len) {
  int rc = w->failed;
  if (!rc && w->used) rc = data__write_all(w->fd, w->buf, w->used);
  if (rc) {
    err_set(err, err_len, rc, "%s: write failed: %s", w->t.tmp, strerror(-rc));
    data__writer_abort(w);
    return rc;
  }
  uint8_t *h = calloc(1, w->hdr);
  if (!h) {
    data__writer_abort(w);
    return -ENOMEM;
  }
  memcpy(h, DATA_BIN_MAGIC, 8);
  wr32(h + 8, DATA_BIN_VERSION);
  wr32(h + 12, (uint32_t)w->hdr);
  wr32(h + 16, w->s.n_dense);
  wr32(h + 20, w->s.n_tables);
  wr32(h + 24, (uint32_t)w->rec_bytes);
  wr32(h + 28, 0);
  wr64(h + 32, w->s.hash_seed);
  wr64(h + 40, w->samples);
  wr64(h + 48, bad_records);
  for (uint32_t t = 0; t < w->s.n_tables; t++) wr32(h + HDR_FIXED + 4 * (size_t)t, w->s.hotness[t]);
  wr64(h + w->hdr - 8, XXH3_64bits(h, w->hdr - 8));
  ssize_t n = pwrite(w->fd, h, w->hdr, 0);
  free(h);
  if (n != (ssize_t)w->hdr) {
    rc = err_set(err, err_len, n < 0 ? -errno : -EIO, "%s: cannot write the header: %s", w->t.tmp,
              n < 0 ? strerror(errno) : "short write");
  } else {
    rc = fsio_replace_commit(&w->t, true, err, err_len); /* fsync, rename onto the path, fsync the directory */
  }
  data__writer_abort(w); /* after a commit, nothing left to remove */
  return rc;
}

/* ---- convert ---- */

static int write_cb(void *ctx, uint64_t off, const uint8_t *rec) {
  (void)off;
  return data__writer_add(ctx, rec);
}

int data_convert(const cfg_t *cfg, const char *in, const char *out, data_stats_t *st, char *err, size_t err_len) {
  data_schema_t s = {0};
  data_stats_t local = {0};
  data_writer_t *w = NULL;
  data_text_t *tx = NULL;
  data_source_t *d = NULL;
  const uint8_t *buf = NULL;
  size_t len = 0;
  int fmt, rc;
  if (!in) in = cfg_str(cfg, "dataset");
  if (!st) st = &local;
  memset(st, 0, sizeof *st);
  if ((rc = data_schema_from_cfg(cfg, &s, err, err_len)) != 0) return rc;
  if (!strcmp(in, "synthetic")) fmt = DATA_FMT_SYNTHETIC;
  else if ((rc = data__detect(in, data_format_parse(cfg_str(cfg, "dataset_format")), &fmt, err, err_len)) != 0) goto out;
  st->format = fmt;
  if (fmt == DATA_FMT_CRITEO || fmt == DATA_FMT_AVAZU) {
    /* one streaming pass: parse, write */
    size_t first;
    uint64_t first_line;
    if ((rc = data__map_file(in, &buf, &len, err, err_len)) != 0) goto out;
    st->bytes = len;
    if ((rc = data__text_create(&s, cfg, fmt, in, buf, len, &tx, &first, &first_line, err, err_len)) != 0) goto out;
    if ((rc = data__writer_open(out, &s, &w, err, err_len)) != 0) goto out;
    if (len) madvise((void *)buf, len, MADV_SEQUENTIAL);
    data_reporter_t r;
    data__reporter_init(&r, cfg, in, st, err, err_len);
    rc = data__text_scan(tx, buf, len, first, first_line, &r, write_cb, w);
    if (rc && rc != -EINVAL) err_set(err, err_len, rc, "%s: write failed: %s", out, strerror(-rc));
    if (rc) goto out;
    data__bad_summary(&r);
    st->samples = w->samples;
    if ((rc = data__bad_check(&r, w->samples)) != 0) goto out; /* nothing written: the temporary is removed */
  } else {
    /* binary or synthetic: copy records */
    if ((rc = data_open_path(cfg, in, &d, err, err_len)) != 0) goto out;
    data_stats(d, st);
    uint8_t *scratch = malloc(d->record_bytes);
    if (!scratch) {
      rc = -ENOMEM;
      goto out;
    }
    if ((rc = data__writer_open(out, &s, &w, err, err_len)) == 0)
      for (uint64_t i = 0; i < d->samples && !rc; i++) {
        const uint8_t *rec;
        if ((rc = d->ops->rec(d, i, scratch, &rec, err, err_len)) == 0 && (rc = data__writer_add(w, rec)) != 0)
          err_set(err, err_len, rc, "%s: write failed: %s", out, strerror(-rc));
      }
    free(scratch);
    if (rc) goto out;
  }
  if (w->samples == 0) {
    rc = err_set(err, err_len, -EINVAL, "%s: no valid records (%" PRIu64 " malformed); %s not written", in, st->bad_records,
              out);
    goto out;
  }
  rc = data__writer_finish(w, st->bad_records, err, err_len);
  w = NULL;
out:
  data__writer_abort(w);
  data__text_destroy(tx);
  data__unmap(buf, len);
  data_close(d);
  data_schema_close(&s);
  return rc;
}
