/*
 * store_reader: reading a checkpoint offline, without a store open and
 * without writing anything to it (the CLI's export and inspect): its rows
 * in key order, its blobs, its manifest and the layout it was taken with.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "err.h"
#include "fsio.h"
#include "log.h"

/* The options differ from the store's on purpose: the reader scans once, in
 * key order, and must write nothing.  Read-only open: no LOCK taken, no
 * info LOG (RocksDB creates none for a read-only db), no OPTIONS file, no
 * flush or compaction; a WAL the checkpoint holds is replayed into a
 * memtable only.  The comparator is the default bytewise one, as in the
 * store, and SST files carry their own table format, so no table options
 * are needed to read them; the scan does not fill the block cache and
 * reads ahead 2 MiB per file. */
struct store_reader_s {
  char *dir;
  rocksdb_t *db;
  rocksdb_column_family_handle_t *cf[CF_N];
  rocksdb_options_t *dbo;
  rocksdb_readoptions_t *ro;
  rocksdb_iterator_t *rows_it; /* created by the first store_reader_next_rows */
  table_layout_t layout;
  uint64_t layout_hash;
};

static int reader_read_layout(store_reader_t *r, char *why, size_t why_len) {
  char *err = NULL;
  rocksdb_pinnableslice_t *v = rocksdb_get_pinned_cf(
      r->db, r->ro, r->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY), &err);
  if (err) return store__kv_fail("reading the layout metadata of a checkpoint", err, why, why_len);
  if (!v) {
    store__set_why(why, why_len, "checkpoint %s holds no table layout metadata; it was not written by "
                   "an embedding store", r->dir);
    return ERR_LAYOUT;
  }
  size_t len = 0;
  const char *p = rocksdb_pinnableslice_value(v, &len);
  int rc = store__layout_decode((const uint8_t *)p, len, &r->layout, &r->layout_hash);
  rocksdb_pinnableslice_destroy(v);
  if (rc == ERR_LAYOUT)
    store__set_why(why, why_len, "checkpoint %s holds table layout metadata this version cannot read "
                   "(%zu bytes); read it with the version that wrote it", r->dir, len);
  return rc;
}

void store_reader_close(store_reader_t *r) {
  if (!r) return;
  if (r->rows_it) rocksdb_iter_destroy(r->rows_it);
  for (int i = 0; i < CF_N; i++)
    if (r->cf[i]) rocksdb_column_family_handle_destroy(r->cf[i]);
  if (r->db) rocksdb_close(r->db);
  if (r->ro) rocksdb_readoptions_destroy(r->ro);
  if (r->dbo) rocksdb_options_destroy(r->dbo);
  table_layout_close(&r->layout);
  free(r->dir);
  free(r);
}

int store_reader_open(const char *checkpoint_dir, store_reader_t **out, char *why,
                      size_t why_len) {
  int rc = 0;
  char *err = NULL;
  store_reader_t *r = NULL;
  *out = NULL;
  if (!checkpoint_dir || !checkpoint_dir[0]) {
    store__set_why(why, why_len, "no checkpoint directory given");
    return -EINVAL;
  }
  struct stat st;
  int serr = stat(checkpoint_dir, &st) == 0 ? 0 : errno;
  if (serr && serr != ENOENT && serr != ENOTDIR) {
    store__set_why(why, why_len, "cannot read checkpoint directory %s: %s", checkpoint_dir,
                   strerror(serr));
    return -serr;
  }
  if (serr || !S_ISDIR(st.st_mode)) {
    store__set_why(why, why_len, "there is no checkpoint directory %s", checkpoint_dir);
    return ERR_NOTFOUND;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(checkpoint_dir, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      store__set_why(why, why_len, "%s is not a checkpoint: it has no %s file (not a checkpoint "
                     "directory, or one whose delete was interrupted)", checkpoint_dir, CKPT_META);
    else
      store__set_why(why, why_len, "the %s file of checkpoint %s is unreadable: %s", CKPT_META,
                     checkpoint_dir, rc == -EBADMSG ? "it lacks created_unix or bytes" : strerror(-rc));
    return rc;
  }
  if (!(r = calloc(1, sizeof *r)) || !(r->dir = strdup(checkpoint_dir)) ||
      !(r->dbo = rocksdb_options_create()) || !(r->ro = rocksdb_readoptions_create())) {
    rc = -ENOMEM;
    store__set_why(why, why_len, "out of memory opening checkpoint %s", checkpoint_dir);
    goto out;
  }
  rocksdb_options_set_create_if_missing(r->dbo, 0);
  rocksdb_options_set_max_open_files(r->dbo, store__open_files_budget());
  rocksdb_readoptions_set_fill_cache(r->ro, 0);            /* every block is read once */
  rocksdb_readoptions_set_readahead_size(r->ro, 2u << 20); /* a sequential scan */
  const rocksdb_options_t *cfo[CF_N] = {r->dbo, r->dbo, r->dbo};
  r->db = rocksdb_open_for_read_only_column_families(r->dbo, checkpoint_dir, CF_N, store__cf_names, cfo,
                                                     r->cf, 0, &err);
  if (err || !r->db) { /* the C API gives a db only on success */
    r->db = NULL;
    memset(r->cf, 0, sizeof r->cf);
    rc = store__kv_fail("the read-only open of a checkpoint", err, why, why_len);
    goto out;
  }
  if ((rc = reader_read_layout(r, why, why_len))) goto out;
  log_info("checkpoint opened for reading path=%s tables=%u layout_hash=%016" PRIx64
           " created_unix=%" PRIu64 " bytes=%" PRIu64,
           r->dir, r->layout.n_tables, r->layout_hash, created, bytes);
out:
  if (rc) {
    store_reader_close(r);
    return rc;
  }
  *out = r;
  return 0;
}

int store_reader_next_rows(store_reader_t *r, uint64_t *keys, uint8_t *buf, size_t cap,
                           size_t *lens, size_t max, size_t *used) {
  int rc = 0;
  char *err = NULL;
  size_t n = 0, at = 0;
  if (used) *used = 0;
  if (!r || !keys || !lens || !used || max == 0 || (cap && !buf)) return -EINVAL;
  if (max > INT_MAX) max = INT_MAX; /* the count is returned as an int */
  if (!r->rows_it) {
    r->rows_it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[CF_ROWS]);
    rocksdb_iter_seek_to_first(r->rows_it);
  }
  rocksdb_iterator_t *it = r->rows_it;
  /* the iterator moves past a row only once it is copied: a row that does
   * not fit stays next */
  for (; n < max && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    const char *v = rocksdb_iter_value(it, &vl);
    if (kl != 8) {
      log_error("malformed key in a checkpoint's rows bytes=%zu path=%s", kl, r->dir);
      rc = ERR_KV;
      goto out;
    }
    uint64_t key = key_from_be(k);
    uint32_t t = TABLE_ID(key);
    if (t >= r->layout.n_tables || vl != table_row_bytes(&r->layout, t)) {
      log_error("a checkpoint's row does not match its layout key=%" PRIu64 " table=%u bytes=%zu "
                "expected=%zu path=%s", key, t, vl,
                t < r->layout.n_tables ? table_row_bytes(&r->layout, t) : (size_t)0, r->dir);
      rc = ERR_KV;
      goto out;
    }
    if (vl > cap - at) {
      if (n == 0) {
        at = vl; /* what the caller must make room for */
        rc = -ENOBUFS;
      }
      goto out;
    }
    if (vl) memcpy(buf + at, v, vl);
    keys[n] = key;
    lens[n] = vl;
    at += vl;
    n++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) rc = store__kv_fail("a checkpoint's row scan", err, NULL, 0);
out:
  if (rc == 0 || rc == -ENOBUFS) *used = at;
  return rc ? rc : (int)n;
}

int store_reader_blobs(store_reader_t *r, char ***names, size_t *n) {
  int rc = 0;
  char *err = NULL, **v = NULL;
  size_t cnt = 0, cap = 0;
  *names = NULL;
  *n = 0;
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[CF_BLOBS]);
  for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    if (cnt == cap) {
      size_t nc = cap ? 2 * cap : 8;
      char **nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        rc = -ENOMEM;
        goto out;
      }
      v = nv;
      cap = nc;
    }
    if (!(v[cnt] = strndup(k, kl))) {
      rc = -ENOMEM;
      goto out;
    }
    cnt++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) rc = store__kv_fail("a checkpoint's blob scan", err, NULL, 0);
out:
  rocksdb_iter_destroy(it);
  if (rc) {
    for (size_t i = 0; i < cnt; i++) free(v[i]);
    free(v);
    return rc;
  }
  if (cnt == 0) {
    free(v);
    v = NULL;
  }
  *names = v;
  *n = cnt;
  return 0;
}

int store_reader_get_blob(store_reader_t *r, const char *name, void **data, size_t *len) {
  char *err = NULL;
  *data = NULL;
  *len = 0;
  if (!store__valid_name(name, BLOB_NAME_MAX)) return -EINVAL;
  rocksdb_pinnableslice_t *v =
      rocksdb_get_pinned_cf(r->db, r->ro, r->cf[CF_BLOBS], name, strlen(name), &err);
  if (err) return store__kv_fail("a checkpoint's get_blob", err, NULL, 0);
  if (!v) return ERR_NOTFOUND;
  return store__blob_copy(v, data, len);
}

int store_reader_manifest(const char *checkpoint_dir, void **data, size_t *len) {
  *data = NULL;
  *len = 0;
  if (!checkpoint_dir || !checkpoint_dir[0]) return -EINVAL;
  return store__ckpt_read_manifest(checkpoint_dir, data, len);
}

uint64_t store_reader_rows_estimate(store_reader_t *r) {
  uint64_t est = 0;
  if (rocksdb_property_int_cf(r->db, r->cf[CF_ROWS], "rocksdb.estimate-num-keys", &est) != 0)
    return 0;
  return est;
}

int store_reader_layout_hash(store_reader_t *r, uint64_t *hash) {
  *hash = r->layout_hash;
  return 0;
}

const table_layout_t *store_reader_layout(const store_reader_t *r) { return &r->layout; }
