/*
 * store_layout: the table layout a data dir was created for, kept under
 * META_LAYOUT_KEY in the "default" column family.  It is written (fsynced)
 * when a fresh db is opened, compared with the configured layout at every
 * open (a data dir is never used with another layout), and decoded by the
 * offline checkpoint reader (store_reader.c), which has no configuration.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "le.h"
#include "log.h"

#define LAYOUT_FORMAT 1

/* format u32, n_tables u32, seed u64, hash u64, then per table rows u64,
 * dim u32, state_floats u32; all little-endian. */
static uint8_t *layout_encode(const table_layout_t *l, size_t *len) {
  *len = 24 + (size_t)l->n_tables * 16;
  uint8_t *p = malloc(*len);
  if (!p) return NULL;
  put_le32(p, LAYOUT_FORMAT);
  put_le32(p + 4, l->n_tables);
  put_le64(p + 8, l->seed);
  put_le64(p + 16, table_layout_hash(l));
  for (uint32_t t = 0; t < l->n_tables; t++) {
    uint8_t *q = p + 24 + (size_t)t * 16;
    put_le64(q, l->tables[t].rows);
    put_le32(q + 8, l->tables[t].dim);
    put_le32(q + 12, l->tables[t].state_floats);
  }
  return p;
}

/* 0 if the stored layout equals ours, else ERR_LAYOUT with why saying what
 * differs. */
static int layout_compare(const store_t *s, const uint8_t *p, size_t len, char *why,
                          size_t why_len) {
  const table_layout_t *l = &s->layout;
  uint64_t want_hash = table_layout_hash(l);
  if (len < 24 || get_le32(p) != LAYOUT_FORMAT ||
      len != 24 + (size_t)get_le32(p + 4) * 16) {
    store__set_why(why, why_len,
                   "data dir %s holds table layout metadata this version cannot read "
                   "(%zu bytes, format %u); use a data dir created by this version",
                   s->dir, len, len >= 4 ? get_le32(p) : 0);
    return ERR_LAYOUT;
  }
  uint32_t n = get_le32(p + 4);
  uint64_t seed = get_le64(p + 8), hash = get_le64(p + 16);
  char diff[512] = "";
  if (n != l->n_tables) {
    snprintf(diff, sizeof diff, "it has %u tables, the configuration has %u", n, l->n_tables);
  } else if (seed != l->seed) {
    snprintf(diff, sizeof diff, "its seed is %" PRIu64 ", the configuration's is %" PRIu64, seed,
             l->seed);
  } else {
    for (uint32_t t = 0; t < n; t++) {
      const uint8_t *q = p + 24 + (size_t)t * 16;
      uint64_t rows = get_le64(q);
      uint32_t dim = get_le32(q + 8), st = get_le32(q + 12);
      if (rows != l->tables[t].rows || dim != l->tables[t].dim ||
          st != l->tables[t].state_floats) {
        snprintf(diff, sizeof diff,
                 "its table %u has %" PRIu64 " rows, dim %u, %u state floats; "
                 "the configuration's has %" PRIu64 " rows, dim %u, %u state floats",
                 t, rows, dim, st, l->tables[t].rows, l->tables[t].dim,
                 l->tables[t].state_floats);
        break;
      }
    }
  }
  if (!diff[0] && hash != want_hash)
    snprintf(diff, sizeof diff, "the layout fingerprints differ");
  if (!diff[0]) return 0;
  store__set_why(why, why_len,
                 "data dir %s was created for a different table layout: %s (stored layout hash "
                 "%016" PRIx64 ", configured %016" PRIx64 "); start with the job's own data dir "
                 "or an empty one",
                 s->dir, diff, hash, want_hash);
  return ERR_LAYOUT;
}

int store__layout_check_or_init(store_t *s, char *why, size_t why_len) {
  char *err = NULL;
  rocksdb_pinnableslice_t *v = rocksdb_get_pinned_cf(
      s->db, s->ro, s->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY), &err);
  if (err) return store__kv_fail("reading the layout metadata", err, why, why_len);
  if (v) {
    size_t len;
    const char *p = rocksdb_pinnableslice_value(v, &len);
    int rc = layout_compare(s, (const uint8_t *)p, len, why, why_len);
    rocksdb_pinnableslice_destroy(v);
    return rc;
  }
  size_t len;
  uint8_t *enc = layout_encode(&s->layout, &len);
  if (!enc) return -ENOMEM;
  rocksdb_put_cf(s->db, s->wo_sync, s->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY),
                 (const char *)enc, len, &err);
  free(enc);
  if (err) return store__kv_fail("writing the layout metadata", err, why, why_len);
  log_info("embedding store initialized dir=%s tables=%u layout_hash=%016" PRIx64, s->dir,
           s->layout.n_tables, table_layout_hash(&s->layout));
  return 0;
}

/* Decodes what layout_encode wrote; ERR_LAYOUT if it is not that (the
 * stored fingerprint must match the decoded layout). */
int store__layout_decode(const uint8_t *p, size_t len, table_layout_t *l, uint64_t *hash) {
  if (len < 24 || get_le32(p) != LAYOUT_FORMAT || get_le32(p + 4) == 0 ||
      len != 24 + (size_t)get_le32(p + 4) * 16)
    return ERR_LAYOUT;
  int rc = table_layout_init(l, get_le32(p + 4), get_le64(p + 8));
  if (rc) return rc == -EINVAL ? ERR_LAYOUT : rc; /* more tables than a layout can have */
  for (uint32_t t = 0; t < l->n_tables; t++) {
    const uint8_t *q = p + 24 + (size_t)t * 16;
    l->tables[t] = (table_info_t){
        .rows = get_le64(q), .dim = get_le32(q + 8), .state_floats = get_le32(q + 12)};
  }
  *hash = get_le64(p + 16);
  if (table_layout_hash(l) != *hash) {
    table_layout_close(l);
    return ERR_LAYOUT;
  }
  return 0;
}
