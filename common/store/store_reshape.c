/*
 * store_reshape: a running store onto another count of servers (the
 * embedding server's Reshape): its shard map replaced, the rows it holds
 * but no longer owns read out in key order, and deleted once their new
 * owners have them.
 */
#include "store_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"

int store_set_shard_map(store_t *s, const shard_map_t *m, uint32_t shard, char *why, size_t why_len) {
  if (!m || m->n_servers == 0 || m->n_tables != s->layout.n_tables) {
    store__set_why(why, why_len, "a shard map of %u tables for %u servers does not fit a layout of %u tables",
                   m ? m->n_tables : 0, m ? m->n_servers : 0, s->layout.n_tables);
    return -EINVAL;
  }
  pthread_rwlock_wrlock(&s->lock);
  if (!s->has_shard_map) {
    s->shard_map.table_server = malloc((m->n_tables ? m->n_tables : 1) * sizeof(uint32_t));
    if (!s->shard_map.table_server) {
      pthread_rwlock_unlock(&s->lock);
      store__set_why(why, why_len, "out of memory");
      return -ENOMEM;
    }
    s->has_shard_map = 1;
  }
  /* the same array, rewritten: store_rows_bytes reads it without the lock */
  memcpy(s->shard_map.table_server, m->table_server, m->n_tables * sizeof(uint32_t));
  s->shard_map.n_tables = m->n_tables;
  s->shard_map.n_servers = m->n_servers;
  s->shard = shard;
  pthread_rwlock_unlock(&s->lock);
  return 0;
}

int store_foreign_rows(store_t *s, uint64_t *from, uint64_t *keys, uint8_t *buf, size_t cap, size_t *lens, size_t max,
                       size_t *used, uint64_t *owned) {
  if (!from || !keys || !buf || !lens || !used || max == 0) return -EINVAL;
  *used = 0;
  if (owned) *owned = 0;
  if (*from == STORE_SCAN_END) return 0;
  int rc = store__enter_shared(s, NULL, 0);
  if (rc) return rc;
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[CF_ROWS]);
  char k0[8];
  key_be(*from, k0);
  size_t n = 0, at = 0;
  uint64_t next = STORE_SCAN_END; /* the end, unless the batch stops before it */
  for (rocksdb_iter_seek(it, k0, 8); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    if (kl != 8) {
      log_error("malformed key in rows column family bytes=%zu dir=%s", kl, s->dir);
      rc = ERR_KV;
      break;
    }
    uint64_t key = key_from_be(k);
    if (n == max) { /* full: the next call starts here */
      next = key;
      break;
    }
    if (s->has_shard_map && shard_of(&s->shard_map, key) == s->shard) {
      if (owned) (*owned)++;
      continue;
    }
    const char *v = rocksdb_iter_value(it, &vl);
    if (at + vl > cap) {
      next = key;
      if (n == 0) {
        *used = vl;
        rc = -ENOBUFS;
      }
      break;
    }
    memcpy(buf + at, v, vl);
    keys[n] = key;
    lens[n++] = vl;
    at += vl;
  }
  if (!rc) {
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err) rc = store__kv_fail("reshape scan", err, NULL, 0);
  }
  rocksdb_iter_destroy(it);
  pthread_rwlock_unlock(&s->lock);
  if (rc) return rc;
  *used = at;
  *from = next;
  return (int)n;
}

int store_delete_rows(store_t *s, const uint64_t *keys, size_t n, char *why, size_t why_len) {
  if (n == 0) return 0;
  int rc = store__enter_shared(s, why, why_len);
  if (rc) return rc;
  rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
  if (!wb) {
    pthread_rwlock_unlock(&s->lock);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    char k[8];
    key_be(keys[i], k);
    rocksdb_writebatch_delete_cf(wb, s->cf[CF_ROWS], k, 8);
  }
  char *err = NULL;
  rocksdb_write(s->db, s->wo, wb, &err);
  rocksdb_writebatch_destroy(wb);
  if (err) rc = store__nospace(s, store__kv_fail("delete rows", err, why, why_len));
  else if (s->hot)
    for (size_t i = 0; i < n; i++) store_hot_drop(s->hot, keys[i]);
  pthread_rwlock_unlock(&s->lock);
  return rc;
}
