/*
 * store_blob: named blobs (the oracle's and trainers' small state: dense
 * parameters, optimizer state, cursors), kept in the "blobs" column family
 * under their name ([A-Za-z0-9._-]{1,128}), the value as given.  They are
 * part of every checkpoint, as the rows are.
 */
#include "store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

int store_put_blob(store_t *s, const char *name, const void *data, size_t len, char *why,
                       size_t why_len) {
  char *err = NULL;
  if (!store__valid_name(name, BLOB_NAME_MAX)) {
    store__set_why(why, why_len,
                   "blob name \"%.140s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ -",
                   name ? name : "(null)", BLOB_NAME_MAX);
    return -EINVAL;
  }
  if (len && !data) {
    store__set_why(why, why_len, "blob \"%s\" has %zu bytes but no data", name, len);
    return -EINVAL;
  }
  int rc = store__enter_shared(s, why, why_len);
  if (rc) return rc;
  if ((rc = store__stopped(s, why, why_len)) == 0) {
    rocksdb_put_cf(s->db, s->wo, s->cf[CF_BLOBS], name, strlen(name), len ? data : "", len, &err);
    if (err) rc = store__nospace(s, store__kv_fail("put_blob", err, why, why_len));
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

int store__blob_copy(rocksdb_pinnableslice_t *v, void **data, size_t *len) {
  size_t vl = 0;
  const char *p = rocksdb_pinnableslice_value(v, &vl);
  void *copy = malloc(vl ? vl : 1);
  int rc = copy ? 0 : -ENOMEM;
  if (copy) {
    if (vl) memcpy(copy, p, vl);
    *data = copy;
    *len = vl;
  }
  rocksdb_pinnableslice_destroy(v);
  return rc;
}

int store_get_blob(store_t *s, const char *name, void **data, size_t *len) {
  char *err = NULL;
  *data = NULL;
  *len = 0;
  if (!store__valid_name(name, BLOB_NAME_MAX)) return -EINVAL;
  int rc = store__enter_shared(s, NULL, 0);
  if (rc) return rc;
  rocksdb_pinnableslice_t *v =
      rocksdb_get_pinned_cf(s->db, s->ro, s->cf[CF_BLOBS], name, strlen(name), &err);
  if (err) {
    rc = store__kv_fail("get_blob", err, NULL, 0);
  } else if (!v) {
    rc = ERR_NOTFOUND;
  } else {
    rc = store__blob_copy(v, data, len);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}
