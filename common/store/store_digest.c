/*
 * store_digest: what a store says about its contents -- the digest of
 * every row (one SHA-256 over the rows in key order, and a set hash that
 * does not depend on which server holds which row), whether rows or blobs
 * are stored, and the counters of store_stats.
 */
#include "store_internal.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "le.h"
#include "log.h"

int store_digest(store_t *s, uint8_t sha256[32], uint8_t set_sha256[32], uint64_t *rows) {
  uint64_t count = 0, lane[4] = {0, 0, 0, 0};
  char *err = NULL;
  /* one row's hash starts as a copy of row_init: a third of the cost per
   * row of EVP_DigestInit_ex, which looks the algorithm up each time */
  EVP_MD_CTX *md = EVP_MD_CTX_new(), *row_md = NULL, *row_init = NULL;
  if (set_sha256) {
    row_md = EVP_MD_CTX_new();
    row_init = EVP_MD_CTX_new();
  }
  int rc = !md || (set_sha256 && (!row_md || !row_init)) ? -ENOMEM : store__enter_shared(s, NULL, 0);
  if (rc) {
    EVP_MD_CTX_free(md);
    EVP_MD_CTX_free(row_md);
    EVP_MD_CTX_free(row_init);
    return rc;
  }
  /* an iterator reads an implicit snapshot: concurrent writes do not tear it */
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[CF_ROWS]);
  if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
      (row_init && EVP_DigestInit_ex(row_init, EVP_sha256(), NULL) != 1)) {
    rc = -EIO;
    goto out;
  }
  for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    const char *v = rocksdb_iter_value(it, &vl);
    if (kl != 8) {
      log_error("malformed key in rows column family bytes=%zu dir=%s", kl, s->dir);
      rc = ERR_KV;
      goto out;
    }
    uint8_t le[8];
    put_le64(le, key_from_be(k));
    if (EVP_DigestUpdate(md, le, 8) != 1 || EVP_DigestUpdate(md, v, vl) != 1) {
      rc = -EIO;
      goto out;
    }
    if (row_md) {
      /* addition mod 2^64 commutes: the sum does not depend on which server
       * holds which row, nor on the order */
      uint8_t rh[32];
      unsigned int rl = 0;
      if (EVP_MD_CTX_copy_ex(row_md, row_init) != 1 ||
          EVP_DigestUpdate(row_md, le, 8) != 1 || EVP_DigestUpdate(row_md, v, vl) != 1 ||
          EVP_DigestFinal_ex(row_md, rh, &rl) != 1 || rl != 32) {
        rc = -EIO;
        goto out;
      }
      le_lanes_add(lane, rh);
    }
    count++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) {
    rc = store__kv_fail("digest scan", err, NULL, 0);
    goto out;
  }
  uint8_t h[32];
  unsigned int hl = 0;
  if (EVP_DigestFinal_ex(md, h, &hl) != 1 || hl != 32) {
    rc = -EIO;
    goto out;
  }
  if (sha256) memcpy(sha256, h, 32);
  if (set_sha256)
    le_lanes_put(set_sha256, lane);
  if (rows) *rows = count;
out:
  rocksdb_iter_destroy(it);
  pthread_rwlock_unlock(&s->lock);
  EVP_MD_CTX_free(md);
  EVP_MD_CTX_free(row_md);
  EVP_MD_CTX_free(row_init);
  return rc;
}

int store_has_rows(store_t *s, int *has_rows, int *has_blobs) {
  const int cfs[2] = {CF_ROWS, CF_BLOBS};
  int *out[2] = {has_rows, has_blobs};
  int rc = store__enter_shared(s, NULL, 0);
  if (rc) return rc;
  for (int i = 0; i < 2 && rc == 0; i++) {
    if (!out[i]) continue;
    char *err = NULL;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[cfs[i]]);
    rocksdb_iter_seek_to_first(it);
    *out[i] = rocksdb_iter_valid(it) ? 1 : 0;
    rocksdb_iter_get_error(it, &err);
    if (err) rc = store__kv_fail("has_rows seek", err, NULL, 0);
    rocksdb_iter_destroy(it);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

void store_stats(store_t *s, store_stats_t *st) {
  memset(st, 0, sizeof *st);
  if (s->hot) {
    store_hot_stats_t hs;
    store_hot_stats(s->hot, &hs);
    st->hot_rows = hs.rows;
    st->hot_bytes = hs.bytes;
    st->hot_capacity_bytes = hs.capacity_bytes;
    st->hot_evictions = hs.evictions;
  }
  st->hot_hits = atomic_load_explicit(&s->hot_hits, memory_order_relaxed);
  st->kv_reads = atomic_load_explicit(&s->kv_reads, memory_order_relaxed);
  st->lazy_inits = atomic_load_explicit(&s->lazy_inits, memory_order_relaxed);
  st->lookup_calls = atomic_load_explicit(&s->lookup_calls, memory_order_relaxed);
  st->lookup_rows = atomic_load_explicit(&s->lookup_rows, memory_order_relaxed);
  st->write_calls = atomic_load_explicit(&s->write_calls, memory_order_relaxed);
  st->write_rows = atomic_load_explicit(&s->write_rows, memory_order_relaxed);
  pthread_rwlock_rdlock(&s->lock);
  if (s->db) {
    uint64_t est = 0;
    if (rocksdb_property_int_cf(s->db, s->cf[CF_ROWS], "rocksdb.estimate-num-keys", &est) == 0)
      st->stored_rows_estimate = est;
  }
  pthread_rwlock_unlock(&s->lock);
}
