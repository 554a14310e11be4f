/*
 * store_ckpt: checkpoints of a live store -- take one (a RocksDB checkpoint
 * built in checkpoints.tmp/ and renamed into checkpoints/ once its
 * CHANTER_CHECKPOINT is written), list them, restore one (a copy swapped
 * with db/), seal one with its manifest, read the manifest, delete one.
 * What the directories hold is described in store_dir.c; the fence a
 * checkpoint lifts is kept in store_recover.c.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "err.h"
#include "fsio.h"
#include "log.h"

/* -EINVAL with the rule an id must follow. */
static int bad_ckpt_id(const char *id, char *why, size_t why_len) {
  store__set_why(why, why_len,
                 "checkpoint id \"%.80s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ - "
                 "(not \".\" or \"..\")",
                 id ? id : "(null)", CKPT_ID_MAX);
  return -EINVAL;
}

int store_checkpoint(store_t *s, const char *id, store_checkpoint_info_t *info, char *why,
                     size_t why_len) {
  char *final = NULL, *stage = NULL, *err = NULL;
  rocksdb_checkpoint_t *cp = NULL;
  if (!store__valid_name(id, CKPT_ID_MAX)) return bad_ckpt_id(id, why, why_len);
  int rc = store__enter_shared(s, why, why_len);
  if (rc) return rc;
  pthread_mutex_lock(&s->ckpt_mu);
  final = store__path_join(s->ckpt_dir, id);
  stage = store__path_join(s->ckpt_tmp_dir, id);
  if (!final || !stage) {
    rc = -ENOMEM;
    goto out;
  }
  store_fence_t fence, was;
  uint64_t created = 0, bytes = 0;
  int retried = 0, lifted = 0;
  store__fence_of(s, id, &fence);
  if (fsio_exists(final) && store__ckpt_has_meta(final)) {
    /* Taken under its fence: the oracle's, whose ids are reused only after
     * a DeleteCheckpoint.  So this is a call retried after the server was
     * killed before it answered, and the checkpoint is the answer -- unless
     * a newer fence of the same id waits for a new one. */
    if (store__ckpt_read_meta(final, &created, &bytes, &was) == 0 && was.set &&
        (!fence.set || fence.token == was.token)) {
      lifted = fence.set && store__fence_lift(s, fence.token, "its checkpoint was already taken") == 0;
      retried = 1;
      log_info("checkpoint id=%s was already taken under its fence: a retried call, answered with it", id);
      goto done;
    }
    store__set_why(why, why_len, "checkpoint \"%s\" already exists in %s; choose another id", id,
                   s->ckpt_dir);
    rc = ERR_EXISTS;
    goto out;
  }
  if (fsio_exists(final)) { /* not a checkpoint: what a failed delete left */
    log_warn("removing the remains of an interrupted checkpoint delete id=%s path=%s", id, final);
    if ((rc = fsio_remove_tree(final, NULL, 0))) {
      store__set_why(why, why_len, "cannot remove %s, left by an interrupted delete of checkpoint \"%s\": %s",
                     final, id, strerror(-rc));
      goto out;
    }
  }
  if ((rc = fsio_mkdir_p(s->ckpt_tmp_dir, NULL, 0)) || (rc = fsio_remove_tree(stage, NULL, 0))) {
    store__set_why(why, why_len, "cannot prepare %s: %s", s->ckpt_tmp_dir, strerror(-rc));
    goto out;
  }
  if ((rc = store__stopped(s, why, why_len))) goto out;
  cp = rocksdb_checkpoint_object_create(s->db, &err);
  if (err) {
    rc = store__nospace(s, store__kv_fail("checkpoint_object_create", err, why, why_len));
    goto out;
  }
  /* log_size_for_flush 0: flush memtables first, so the checkpoint is SSTs */
  rocksdb_checkpoint_create(cp, stage, 0, &err);
  if (err) {
    rc = store__nospace(s, store__kv_fail("checkpoint_create", err, why, why_len));
    goto out;
  }
  store__fault("staged");
  created = (uint64_t)time(NULL);
  bytes = store__dir_bytes(stage);
  if ((rc = store__ckpt_write_meta(stage, id, created, bytes, table_layout_hash(&s->layout),
                                    fence.set ? &fence : NULL)) ||
      (rc = fsio_fsync_path(stage, true, NULL, 0)) || (rename(stage, final) != 0 && (rc = -errno)) ||
      (rc = fsio_fsync_parent(final, NULL, 0))) {
    store__set_why(why, why_len, "cannot finish checkpoint \"%s\" in %s: %s", id, s->ckpt_dir,
                   strerror(-rc));
    goto out;
  }
  log_info("checkpoint created id=%s path=%s bytes=%" PRIu64 "%s", id, final, bytes,
           fence.set ? " fenced=1" : "");
  store__fault("complete");
  /* the checkpoint records the fence's token: should this fail (or the
   * process die first), the next open sees it and lifts the fence */
  lifted = fence.set && store__fence_lift(s, fence.token, "its checkpoint was taken") == 0;
done:
  if (info) {
    memset(info, 0, sizeof *info);
    snprintf(info->id, sizeof info->id, "%s", id);
    snprintf(info->path, sizeof info->path, "%s", final);
    info->created_unix = created;
    info->bytes = bytes;
    info->fence_lifted = lifted;
    info->retried = retried;
  }
out:
  if (rc) {
    if (rc != ERR_EXISTS) log_error("checkpoint failed id=%s reason=\"%s\"", id, err_str(rc));
    if (stage) fsio_remove_tree(stage, NULL, 0);
  }
  if (cp) rocksdb_checkpoint_object_destroy(cp);
  pthread_mutex_unlock(&s->ckpt_mu);
  pthread_rwlock_unlock(&s->lock);
  free(final);
  free(stage);
  return rc;
}

static int info_cmp(const void *a, const void *b) {
  return strcmp(((const store_checkpoint_info_t *)a)->id, ((const store_checkpoint_info_t *)b)->id);
}

int store_list_checkpoints(store_t *s, store_checkpoint_info_t **list, size_t *n) {
  *list = NULL;
  *n = 0;
  store_checkpoint_info_t *v = NULL;
  size_t cnt = 0, cap = 0;
  int rc = 0;
  pthread_rwlock_rdlock(&s->lock);
  pthread_mutex_lock(&s->ckpt_mu); /* no half-renamed checkpoint */
  DIR *d = opendir(s->ckpt_dir);
  if (!d) {
    rc = errno == ENOENT ? 0 : -errno;
    goto out;
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!store__valid_name(de->d_name, CKPT_ID_MAX)) continue;
    char *p = store__path_join(s->ckpt_dir, de->d_name);
    if (!p) {
      rc = -ENOMEM;
      break;
    }
    uint64_t created = 0, bytes = 0;
    if (store__ckpt_read_meta(p, &created, &bytes, NULL) == 0) {
      if (cnt == cap) {
        size_t nc = cap ? 2 * cap : 8;
        store_checkpoint_info_t *nv = realloc(v, nc * sizeof *nv);
        if (!nv) {
          free(p);
          rc = -ENOMEM;
          break;
        }
        v = nv;
        cap = nc;
      }
      store_checkpoint_info_t *e = &v[cnt++];
      memset(e, 0, sizeof *e);
      memcpy(e->id, de->d_name, strlen(de->d_name)); /* store__valid_name: <= 64 chars */
      snprintf(e->path, sizeof e->path, "%s", p);
      e->created_unix = created;
      e->bytes = bytes;
      char *m = store__path_join(p, CKPT_MANIFEST);
      e->sealed = m && fsio_exists(m);
      free(m);
    }
    free(p);
  }
  closedir(d);
out:
  pthread_mutex_unlock(&s->ckpt_mu);
  pthread_rwlock_unlock(&s->lock);
  if (rc) {
    free(v);
    return rc;
  }
  if (cnt) qsort(v, cnt, sizeof *v, info_cmp);
  else {
    free(v);
    v = NULL;
  }
  *list = v;
  *n = cnt;
  return 0;
}

int store_restore(store_t *s, const char *id, char *why, size_t why_len) {
  int rc = 0;
  char *src = NULL;
  if (!store__valid_name(id, CKPT_ID_MAX)) {
    store__set_why(why, why_len,
                   "checkpoint id \"%.80s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ -",
                   id ? id : "(null)", CKPT_ID_MAX);
    return -EINVAL;
  }
  pthread_rwlock_wrlock(&s->lock);
  if (!(src = store__path_join(s->ckpt_dir, id))) {
    rc = -ENOMEM;
    goto out;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(src, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      store__set_why(why, why_len, "there is no checkpoint \"%s\" in %s", id, s->ckpt_dir);
    else
      store__set_why(why, why_len, "checkpoint \"%s\" in %s is unreadable: %s", id, s->ckpt_dir,
                     err_str(rc));
    goto out;
  }
  if ((rc = fsio_remove_tree(s->restore_path, NULL, 0)) ||
      (rc = store__build_db_copy(src, s->restore_path))) {
    store__set_why(why, why_len, "cannot copy checkpoint \"%s\" to %s: %s", id, s->restore_path,
                   strerror(-rc));
    fsio_remove_tree(s->restore_path, NULL, 0);
    goto out;
  }
  /* From here the live db is closed; every way out reopens one. */
  store__db_close(s);
  int exchanged = 0;
  if ((rc = store__swap_db(s, &exchanged))) {
    store__set_why(why, why_len, "cannot move the restored db into place in %s: %s", s->dir,
                   strerror(-rc));
    log_error("restore swap failed id=%s dir=%s error=%s", id, s->dir, strerror(-rc));
    store__recover_leftovers(s);
  } else if ((rc = store__db_open(s, why, why_len))) {
    /* the checkpoint does not open: put the old db back */
    log_error("restored db does not open; rolling back id=%s dir=%s", id, s->dir);
    store__swap_back(s);
    store__recover_leftovers(s);
  } else {
    store__recover_leftovers(s); /* removes the old db */
  }
  if (!s->db) {
    char why2[256];
    int r2 = store__db_open(s, why2, sizeof why2);
    if (r2 == -ENOSPC) { /* a full disk: store_resume opens it once there is space */
      s->reopen_failed = 1;
      store__nospace(s, r2);
    }
    if (r2) log_error("store unusable after failed restore dir=%s reason=%s", s->dir, why2);
  }
  if (s->hot) store_hot_clear(s->hot);
  if (rc == 0) log_info("checkpoint restored id=%s dir=%s bytes=%" PRIu64, id, s->dir, bytes);
  if (rc == 0 && (rc = store__fence_lift(s, 0, "the store was restored")))
    store__set_why(why, why_len, "checkpoint \"%s\" was restored but the fence file in %s cannot be "
                   "removed: %s; restore again", id, s->dir, strerror(-rc));
out:
  pthread_rwlock_unlock(&s->lock);
  free(src);
  return rc;
}

int store_seal_checkpoint(store_t *s, const char *id, const void *manifest, size_t len,
                          char *why, size_t why_len) {
  int rc = 0;
  char *dir = NULL, *fin = NULL;
  if (!store__valid_name(id, CKPT_ID_MAX)) return bad_ckpt_id(id, why, why_len);
  if (len && !manifest) {
    store__set_why(why, why_len, "the manifest of checkpoint \"%s\" has %zu bytes but no data", id, len);
    return -EINVAL;
  }
  pthread_rwlock_rdlock(&s->lock);
  pthread_mutex_lock(&s->ckpt_mu); /* not while this checkpoint is created or deleted */
  dir = store__path_join(s->ckpt_dir, id);
  fin = dir ? store__path_join(dir, CKPT_MANIFEST) : NULL;
  if (!dir || !fin) {
    rc = -ENOMEM;
    store__set_why(why, why_len, "out of memory sealing checkpoint \"%s\"", id);
    goto out;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(dir, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      store__set_why(why, why_len, "there is no checkpoint \"%s\" in %s to seal; take it first", id,
                     s->ckpt_dir);
    else
      store__set_why(why, why_len, "checkpoint \"%s\" in %s is unreadable: %s", id, s->ckpt_dir,
                     err_str(rc));
    goto out;
  }
  /* temporary + fsync + rename + dir fsync: a crash leaves the old manifest
   * or the new one, never a torn one (a stray temporary is removed at open) */
  if ((rc = fsio_replace(fin, manifest, len, 0644, NULL, 0))) {
    store__set_why(why, why_len, "cannot write the manifest of checkpoint \"%s\" to %s: %s", id, fin,
                   strerror(-rc));
    goto out;
  }
  log_info("checkpoint sealed id=%s manifest_bytes=%zu path=%s", id, len, fin);
out:
  if (rc && rc != ERR_NOTFOUND)
    log_error("checkpoint seal failed id=%s reason=\"%s\"", id, err_str(rc));
  pthread_mutex_unlock(&s->ckpt_mu);
  pthread_rwlock_unlock(&s->lock);
  free(dir);
  free(fin);
  return rc;
}

int store_get_manifest(store_t *s, const char *id, void **data, size_t *len) {
  int rc = 0;
  *data = NULL;
  *len = 0;
  if (!store__valid_name(id, CKPT_ID_MAX)) return -EINVAL;
  pthread_rwlock_rdlock(&s->lock);
  char *dir = store__path_join(s->ckpt_dir, id);
  rc = dir ? store__ckpt_read_manifest(dir, data, len) : -ENOMEM;
  pthread_rwlock_unlock(&s->lock);
  free(dir);
  return rc;
}

int store_delete_checkpoint(store_t *s, const char *id, char *why, size_t why_len) {
  int rc = 0;
  if (!store__valid_name(id, CKPT_ID_MAX)) return bad_ckpt_id(id, why, why_len);
  pthread_rwlock_rdlock(&s->lock);
  pthread_mutex_lock(&s->ckpt_mu); /* not while it is created, sealed or listed */
  char *dir = store__path_join(s->ckpt_dir, id);
  if (!dir) {
    rc = -ENOMEM;
    store__set_why(why, why_len, "out of memory deleting checkpoint \"%s\"", id);
    goto out;
  }
  if (!fsio_exists(dir)) {
    store__set_why(why, why_len, "there is no checkpoint \"%s\" in %s", id, s->ckpt_dir);
    rc = ERR_NOTFOUND;
    goto out;
  }
  bool complete = store__ckpt_has_meta(dir);
  if ((rc = store__ckpt_remove(dir)) || (rc = fsio_fsync_path(s->ckpt_dir, true, NULL, 0))) {
    store__set_why(why, why_len, "cannot delete checkpoint \"%s\" in %s: %s; delete it again", id,
                   s->ckpt_dir, strerror(-rc));
    log_error("checkpoint delete failed id=%s path=%s error=%s", id, dir, strerror(-rc));
    goto out;
  }
  if (complete)
    log_info("checkpoint deleted id=%s path=%s", id, dir);
  else
    log_info("removed the remains of an interrupted checkpoint delete id=%s path=%s", id, dir);
out:
  pthread_mutex_unlock(&s->ckpt_mu);
  pthread_rwlock_unlock(&s->lock);
  free(dir);
  return rc;
}
