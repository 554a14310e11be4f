/*
 * store_rows: the rows -- key checks, Lookup and WriteBack.  A row lives in
 * the "rows" column family under its key as 8 bytes big-endian (key_be, so
 * that iteration order is numeric key order); its value is the raw
 * little-endian float32 row (the vector, then the optimizer state).  A row
 * never written is initialized lazily from the layout's seed and not
 * stored.  With a memory tier (store_hot.c), a lookup reads it first and
 * fills it with what RocksDB gave; a write updates it only once RocksDB has
 * the batch, so the tier never runs ahead of the WAL.
 */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"

/* ------------------------------------------------------------ key checking */

static int check_key(const store_t *s, size_t i, uint64_t key, char *why, size_t why_len) {
  char buf[256];
  int rc = table_check_key(&s->layout, key, buf, sizeof buf);
  if (rc) {
    store__set_why(why, why_len, "request index %zu: %s", i, buf);
    return rc;
  }
  if (s->has_shard_map) {
    uint32_t owner = shard_of(&s->shard_map, key);
    if (owner != s->shard) {
      store__set_why(why, why_len,
                     "request index %zu: key %" PRIu64 " (table %u, row %" PRIu64
                     ") belongs to embedding server %u, but this is server %u of %u; "
                     "the client's shard map differs from this server's",
                     i, key, TABLE_ID(key), TABLE_ROW(key), owner, s->shard, s->shard_map.n_servers);
      return ERR_WRONGSHARD;
    }
  }
  return 0;
}

/* Validates every key; off (if given) receives each row's float offset in a
 * packed buffer; *floats the total. */
static int check_keys(const store_t *s, const uint64_t *keys, size_t n, size_t *off,
                      size_t *floats, char *why, size_t why_len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = check_key(s, i, keys[i], why, why_len);
    if (rc) return rc;
    if (off) off[i] = total;
    total += table_row_floats(&s->layout, TABLE_ID(keys[i]));
  }
  *floats = total;
  return 0;
}

/* ------------------------------------------------------------ rows */

int store_rows_bytes(store_t *s, const uint64_t *keys, size_t n, size_t *bytes, char *why,
                         size_t why_len) {
  size_t floats = 0;
  int rc = check_keys(s, keys, n, NULL, &floats, why, why_len);
  *bytes = rc ? 0 : floats * sizeof(float);
  return rc;
}

/* One batched MultiGet for the keys keys[idx[0..m)]; found rows are copied
 * to out at their offsets, the others lazily initialized. */
static int kv_read_rows(store_t *s, const uint64_t *keys, const size_t *idx, size_t m,
                        const size_t *off, float *out, store_lookup_info_t *li, char *why,
                        size_t why_len) {
  int rc = 0;
  char *kbuf = malloc(m * 8);
  const char **kp = malloc(m * sizeof *kp);
  size_t *ks = malloc(m * sizeof *ks);
  rocksdb_pinnableslice_t **vals = calloc(m, sizeof *vals);
  char **errs = calloc(m, sizeof *errs);
  if (!kbuf || !kp || !ks || !vals || !errs) {
    rc = -ENOMEM;
    store__set_why(why, why_len, "out of memory reading %zu rows", m);
    goto out;
  }
  for (size_t j = 0; j < m; j++) {
    key_be(keys[idx[j]], kbuf + 8 * j);
    kp[j] = kbuf + 8 * j;
    ks[j] = 8;
  }
  rocksdb_batched_multi_get_cf(s->db, s->ro, s->cf[CF_ROWS], m, kp, ks, vals, errs, false);
  for (size_t j = 0; j < m; j++) {
    size_t i = idx[j];
    uint64_t key = keys[i];
    if (errs[j]) {
      if (rc == 0)
        rc = store__kv_fail("multi_get", errs[j], why, why_len);
      else
        rocksdb_free(errs[j]);
      errs[j] = NULL;
    } else if (vals[j]) {
      size_t vlen = 0, want = table_row_bytes(&s->layout, TABLE_ID(key));
      const char *v = rocksdb_pinnableslice_value(vals[j], &vlen);
      if (vlen != want) {
        log_error("stored row has the wrong size key=%" PRIu64 " bytes=%zu expected=%zu", key,
                  vlen, want);
        if (rc == 0) {
          store__set_why(why, why_len, "stored row of key %" PRIu64 " has %zu bytes, the layout says %zu",
                         key, vlen, want);
          rc = ERR_KV;
        }
      } else {
        memcpy(out + off[i], v, want);
        li->kv_reads++;
      }
    } else {
      table_init_row(&s->layout, key, out + off[i]);
      li->lazy_inits++;
    }
    if (vals[j]) rocksdb_pinnableslice_destroy(vals[j]);
  }
out:
  free(kbuf);
  free(kp);
  free(ks);
  free(vals);
  free(errs);
  return rc;
}

int store_lookup(store_t *s, const uint64_t *keys, size_t n, float *out, size_t out_bytes,
                     int flags, store_lookup_info_t *info, char *why, size_t why_len) {
  store_lookup_info_t li = {0, 0, 0};
  size_t *off = NULL, *miss = NULL;
  uint32_t *ver = NULL, *nf = NULL; /* per key: version seen on a miss, row floats */
  uint8_t *hit = NULL;
  size_t floats = 0, m = 0;
  if (info) *info = li;
  int rc = store__enter_shared(s, why, why_len);
  if (rc) return rc;
  off = malloc((n ? n : 1) * sizeof *off);
  miss = malloc((n ? n : 1) * sizeof *miss);
  ver = malloc((n ? n : 1) * sizeof *ver);
  if (!off || !miss || !ver) {
    rc = -ENOMEM;
    store__set_why(why, why_len, "out of memory looking up %zu keys", n);
    goto out;
  }
  if ((rc = check_keys(s, keys, n, off, &floats, why, why_len))) goto out;
  if (floats * sizeof(float) != out_bytes) {
    store__set_why(why, why_len, "the output buffer has %zu bytes but the %zu keys need %zu", out_bytes, n,
                   floats * sizeof(float));
    rc = -EINVAL;
    goto out;
  }
  if (n == 0) goto out;
  bool use_hot = s->hot && !(flags & STORE_LOOKUP_NO_HOT);
  if (use_hot) {
    if (!(nf = malloc(n * sizeof *nf)) || !(hit = malloc(n))) {
      rc = -ENOMEM;
      store__set_why(why, why_len, "out of memory looking up %zu keys", n);
      goto out;
    }
    for (size_t i = 0; i < n; i++) nf[i] = table_row_floats(&s->layout, TABLE_ID(keys[i]));
    li.hot_hits = store_hot_get_many(s->hot, keys, n, out, off, nf, hit, ver);
    for (size_t i = 0; i < n; i++)
      if (!hit[i]) miss[m++] = i;
  } else {
    for (size_t i = 0; i < n; i++) miss[m++] = i;
  }
  if (m) {
    if ((rc = kv_read_rows(s, keys, miss, m, off, out, &li, why, why_len))) goto out;
    if (use_hot)
      for (size_t j = 0; j < m; j++) {
        size_t i = miss[j];
        store_hot_fill(s->hot, keys[i], out + off[i], nf[i], ver[i]);
      }
  }
  atomic_fetch_add_explicit(&s->lookup_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lookup_rows, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->hot_hits, li.hot_hits, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->kv_reads, li.kv_reads, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lazy_inits, li.lazy_inits, memory_order_relaxed);
  if (info) *info = li;
out:
  pthread_rwlock_unlock(&s->lock);
  free(off);
  free(miss);
  free(ver);
  free(nf);
  free(hit);
  return rc;
}

int store_write(store_t *s, const uint64_t *keys, size_t n, const float *rows,
                    size_t rows_bytes, int flags, char *why, size_t why_len) {
  size_t floats = 0;
  char *err = NULL;
  rocksdb_writebatch_t *wb = NULL;
  int rc = store__enter_shared(s, why, why_len);
  if (rc) return rc;
  if ((rc = check_keys(s, keys, n, NULL, &floats, why, why_len))) goto out;
  if (floats * sizeof(float) != rows_bytes) {
    size_t need = floats * sizeof(float);
    store__set_why(why, why_len,
                   "rows_bytes is %zu but the %zu keys need %zu bytes (%s by %zu); nothing was written",
                   rows_bytes, n, need, rows_bytes < need ? "short" : "over", 
                   rows_bytes < need ? need - rows_bytes : rows_bytes - need);
    rc = -EINVAL;
    goto out;
  }
  if (n == 0) goto out;
  if ((rc = store__stopped(s, why, why_len))) goto out;
  if (!(wb = rocksdb_writebatch_create())) {
    rc = -ENOMEM;
    goto out;
  }
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    char k[8];
    size_t nb = table_row_bytes(&s->layout, TABLE_ID(keys[i]));
    key_be(keys[i], k);
    rocksdb_writebatch_put_cf(wb, s->cf[CF_ROWS], k, 8, (const char *)(rows + at), nb);
    at += nb / sizeof(float);
  }
  rocksdb_write(s->db, s->wo, wb, &err);
  if (err) {
    rc = store__nospace(s, store__kv_fail("write", err, why, why_len));
    goto out;
  }
  /* after the batch is durable: the memory tier never runs ahead of the WAL */
  if (s->hot) {
    at = 0;
    for (size_t i = 0; i < n; i++) {
      uint32_t nf = table_row_floats(&s->layout, TABLE_ID(keys[i]));
      if (flags & STORE_WRITE_NO_HOT)
        store_hot_drop(s->hot, keys[i]);
      else
        store_hot_upsert(s->hot, keys[i], rows + at, nf);
      at += nf;
    }
  }
  atomic_fetch_add_explicit(&s->write_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->write_rows, n, memory_order_relaxed);
out:
  if (wb) rocksdb_writebatch_destroy(wb);
  pthread_rwlock_unlock(&s->lock);
  return rc;
}
