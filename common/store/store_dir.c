/*
 * store_dir: the embedding store's data dir on disk -- what each entry is,
 * the checkpoint directories and their files, and what is done at open
 * with what an interrupted checkpoint, delete, seal or restore left.
 *
 * data_dir holds:
 *   db/                 the live RocksDB database
 *   LOCK                flock'ed while a store has the dir open; holds the
 *                       owner's pid, emptied by a clean close (store_recover.c)
 *   FENCE               the fence, while one is set (store_recover.c)
 *   EPOCH               the write epoch (the embedding service's, not ours)
 *   checkpoints/<id>/   complete RocksDB checkpoints (+ CHANTER_CHECKPOINT:
 *                       creation time and size, and the fence it was taken
 *                       under if any; + MANIFEST once sealed, and
 *                       MANIFEST.tmp.<pid> while a seal is being written
 *                       (fsio_replace); nothing else appears here.
 *                       CHANTER_CHECKPOINT is what makes a checkpoint
 *                       exist: it is the last file created and the first
 *                       one deleted, and a directory without it (an
 *                       interrupted delete) is removed at open, as is a
 *                       MANIFEST temporary (an interrupted seal)
 *   checkpoints.tmp/    checkpoints being built (renamed into checkpoints/
 *                       when complete; leftovers are removed at open)
 *   db.restore/         a restore being built, or the old db after the swap
 *                       (removed at open)
 *   db.old/             the old db during the two-rename fallback of the
 *                       restore swap (rolled back or removed at open)
 * Temporaries of a file replaced whole are "<name>.tmp.<pid>"; the
 * "<name>.tmp" that earlier versions used is removed at open as well.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fsio.h"
#include "log.h"

/* ------------------------------------------------------------ paths, files */

const char *store_dir(const store_t *s) { return s->dir; }

int store__dir_paths(store_t *s, const char *data_dir) {
  s->dir = strdup(data_dir);
  s->db_path = store__path_join(data_dir, "db");
  s->ckpt_dir = store__path_join(data_dir, "checkpoints");
  s->ckpt_tmp_dir = store__path_join(data_dir, "checkpoints.tmp");
  s->restore_path = store__path_join(data_dir, "db.restore");
  return s->dir && s->db_path && s->ckpt_dir && s->ckpt_tmp_dir && s->restore_path ? 0 : -ENOMEM;
}

bool store__is_tmp_of(const char *name, const char *base) {
  size_t n = strlen(base);
  return !strncmp(name, base, n) && !strncmp(name + n, ".tmp", 4) &&
         (name[n + 4] == '\0' || name[n + 4] == '.');
}

int store__remove_tmps(const char *dir, const char *base, const char *what) {
  int removed = 0;
  size_t n;
  bool stuck = false;
  /* a batch of names first, then unlink: removing entries of a directory
   * being read has unspecified effects on readdir */
  do {
    char names[8][256];
    n = 0;
    DIR *d = opendir(dir);
    if (!d) break;
    struct dirent *de;
    while (n < 8 && (de = readdir(d)))
      if (store__is_tmp_of(de->d_name, base) && strlen(de->d_name) < sizeof names[0])
        snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    closedir(d);
    for (size_t i = 0; i < n; i++) {
      char *p = store__path_join(dir, names[i]);
      if (p && unlink(p) == 0) {
        log_warn("removed %s path=%s", what, p);
        removed++;
      } else {
        stuck = true; /* it would come back in the next batch */
      }
      free(p);
    }
  } while (n == 8 && !stuck);
  return removed;
}

/* Copies src to dst (which must not exist), fsynced. */
static int copy_file(const char *src, const char *dst) {
  int rc = 0, in = -1, out = -1;
  char *buf = malloc(1 << 20);
  if (!buf) return -ENOMEM;
  in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    rc = -errno;
    goto out;
  }
  out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    rc = -errno;
    goto out;
  }
  for (;;) {
    ssize_t r = read(in, buf, 1 << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      goto out;
    }
    if (r == 0) break;
    for (ssize_t off = 0; off < r;) {
      ssize_t w = write(out, buf + off, (size_t)(r - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        rc = -errno;
        goto out;
      }
      off += w;
    }
  }
  if (fsync(out) != 0) rc = -errno;
out:
  if (in >= 0) close(in);
  if (out >= 0 && close(out) != 0 && rc == 0) rc = -errno;
  free(buf);
  return rc;
}

/* Total bytes of the regular files in dir (RocksDB checkpoints are flat). */
uint64_t store__dir_bytes(const char *dir) {
  uint64_t total = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += (uint64_t)st.st_size;
  }
  closedir(d);
  return total;
}

/* ------------------------------------------------------ checkpoint directories */

bool store__valid_ckpt_id(const char *id) { return store__valid_name(id, CKPT_ID_MAX); }

bool store__ckpt_has_meta(const char *dir) {
  char *p = store__path_join(dir, CKPT_META);
  bool yes = p && fsio_exists(p);
  free(p);
  return yes;
}

/* Removes checkpoint directory dir so that it is never seen half-removed:
 * CKPT_META goes first and its removal is made durable (listing, restoring
 * and sealing all need it), then the rest.  The caller fsyncs the parent. */
int store__ckpt_remove(const char *dir) {
  char *meta = store__path_join(dir, CKPT_META);
  if (!meta) return -ENOMEM;
  int rc = unlink(meta) == 0 || errno == ENOENT ? 0 : -errno;
  free(meta);
  if (rc == 0) rc = fsio_fsync_path(dir, true, NULL, 0);
  if (rc == 0) rc = fsio_remove_tree(dir, NULL, 0);
  return rc;
}

/* The names of the directories in checkpoints/ that could be checkpoints
 * (read before anything is removed: removing entries of a directory being
 * read has unspecified effects on readdir).  *names is malloc'ed. */
int store__ckpt_names(const store_t *s, store_ckpt_name_t **names, size_t *n) {
  *names = NULL;
  *n = 0;
  store_ckpt_name_t *v = NULL;
  size_t cnt = 0, cap = 0;
  int rc = 0;
  DIR *d = opendir(s->ckpt_dir);
  if (!d) return errno == ENOENT ? 0 : -errno;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!store__valid_name(de->d_name, CKPT_ID_MAX)) continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
      continue;
    if (cnt == cap) {
      size_t nc = cap ? 2 * cap : 8;
      store_ckpt_name_t *nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        rc = -ENOMEM;
        break;
      }
      v = nv;
      cap = nc;
    }
    size_t len = strlen(de->d_name); /* store__valid_name: <= CKPT_ID_MAX */
    memcpy(v[cnt], de->d_name, len);
    v[cnt++][len] = '\0';
  }
  closedir(d);
  if (rc) {
    free(v);
    return rc;
  }
  *names = v;
  *n = cnt;
  return 0;
}

/* At open: removes what an interrupted checkpoint delete (a directory
 * without CKPT_META) or seal (a MANIFEST temporary) left.  Failures are
 * only logged: such leftovers are never listed or restored, they only take
 * space. */
void store__ckpt_sweep(const store_t *s) {
  store_ckpt_name_t *names = NULL;
  size_t n = 0;
  int rc = store__ckpt_names(s, &names, &n);
  if (rc) {
    log_warn("cannot read the checkpoints dir dir=%s error=%s", s->ckpt_dir, strerror(-rc));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char *p = store__path_join(s->ckpt_dir, names[i]);
    if (!p) break;
    if (!store__ckpt_has_meta(p)) {
      log_warn("removing the remains of an interrupted checkpoint delete id=%s path=%s", names[i], p);
      if ((rc = fsio_remove_tree(p, NULL, 0)))
        log_warn("cannot remove path=%s error=%s", p, strerror(-rc));
    } else {
      char what[128];
      snprintf(what, sizeof what, "the manifest of an interrupted seal id=%s", names[i]);
      store__remove_tmps(p, CKPT_MANIFEST, what);
    }
    free(p);
  }
  free(names);
}

int store__ckpt_read_meta(const char *dir, uint64_t *created, uint64_t *bytes,
                          store_fence_t *fence) {
  char *p = store__path_join(dir, CKPT_META);
  if (!p) return -ENOMEM;
  FILE *f = fopen(p, "re");
  free(p);
  if (!f) return errno == ENOENT ? ERR_NOTFOUND : -errno;
  char line[256];
  int got = 0;
  store_fence_t fc = {0};
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "created_unix=%" SCNu64, created) == 1) got |= 1;
    if (sscanf(line, "bytes=%" SCNu64, bytes) == 1) got |= 2;
    if (sscanf(line, "fence_id=%64[A-Za-z0-9._-]", fc.id) == 1) got |= 4;
    if (sscanf(line, "fence_iteration=%" SCNu64, &fc.iteration) == 1) got |= 8;
    if (sscanf(line, "fence_token=%" SCNx64, &fc.token) == 1) got |= 16;
  }
  fclose(f);
  fc.set = (got & 28) == 28;
  if (fence) *fence = fc.set ? fc : (store_fence_t){0};
  return (got & 3) == 3 ? 0 : -EBADMSG;
}

/* CKPT_META: "key=value" lines, id, created_unix, bytes, layout_hash, and
 * fence_id, fence_iteration, fence_token when taken under a fence. */
int store__ckpt_write_meta(const char *dir, const char *id, uint64_t created, uint64_t bytes,
                           uint64_t layout_hash, const store_fence_t *fence) {
  int rc = 0;
  char *p = store__path_join(dir, CKPT_META);
  if (!p) return -ENOMEM;
  FILE *f = fopen(p, "wxe");
  if (!f) {
    rc = -errno;
    goto out;
  }
  fprintf(f, "id=%s\ncreated_unix=%" PRIu64 "\nbytes=%" PRIu64 "\nlayout_hash=%016" PRIx64 "\n", id,
          created, bytes, layout_hash);
  if (fence)
    fprintf(f, "fence_id=%s\nfence_iteration=%" PRIu64 "\nfence_token=%016" PRIx64 "\n", fence->id,
            fence->iteration, fence->token);
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) rc = -errno;
  if (fclose(f) != 0 && rc == 0) rc = -errno;
out:
  free(p);
  return rc;
}

int store__ckpt_read_manifest(const char *dir, void **data, size_t *len) {
  char *fin = store__path_join(dir, CKPT_MANIFEST), *buf = NULL;
  int rc = 0;
  if (!fin) {
    rc = -ENOMEM;
  } else if (!store__ckpt_has_meta(dir)) {
    rc = ERR_NOTFOUND; /* not a checkpoint, or one being deleted */
  } else if ((rc = fsio_read_all(fin, 0, &buf, len, NULL, 0)) == -ENOENT) {
    rc = ERR_NOTFOUND; /* not sealed */
  } else if (rc) {
    log_error("cannot read a checkpoint manifest path=%s error=%s", fin, strerror(-rc));
  }
  if (rc == 0) *data = buf;
  free(fin);
  return rc;
}

/* Moves a checkpoint built (and fsynced) in checkpoints.tmp/ into
 * checkpoints/ and makes the move durable. */
int store__ckpt_publish(const char *stage, const char *final) {
  if (rename(stage, final) != 0) return -errno;
  return fsio_fsync_parent(final, NULL, 0);
}

/* ------------------------------------------------------ leftovers, restore swap */

static bool dir_has_entries(const char *path) {
  DIR *d = opendir(path);
  struct dirent *de;
  bool yes = false;
  while (d && !yes && (de = readdir(d))) yes = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  if (d) closedir(d);
  return yes;
}

/* Undo what a crash in the middle of a checkpoint or a restore left behind
 * (see store_restore for the fallback swap that uses db.old). */
int store__recover_leftovers(store_t *s) {
  int rc = 0;
  char *old = store__path_join(s->dir, "db.old");
  if (!old) return -ENOMEM;
  if (!fsio_exists(s->db_path) && fsio_exists(old)) {
    log_warn("restore was interrupted; rolling back to the previous db dir=%s", s->dir);
    if (rename(old, s->db_path) != 0) rc = -errno;
  }
  if (rc == 0) rc = fsio_remove_tree(old, NULL, 0);
  if (rc == 0) rc = fsio_remove_tree(s->restore_path, NULL, 0);
  if (rc == 0 && dir_has_entries(s->ckpt_tmp_dir))
    log_info("removing checkpoints that were being taken when the store was last closed or killed "
             "path=%s: none of them was complete; a retried Checkpoint takes them anew", s->ckpt_tmp_dir);
  if (rc == 0) rc = fsio_remove_tree(s->ckpt_tmp_dir, NULL, 0);
  free(old);
  return rc;
}

/* Builds dst (must not exist) from checkpoint dir src: SSTs hard-linked
 * (immutable, same file system), everything else copied and fsynced, except
 * our own files (they describe the checkpoint, not the db). */
int store__build_db_copy(const char *src, const char *dst) {
  int rc = 0;
  if (mkdir(dst, 0755) != 0) return -errno;
  DIR *d = opendir(src);
  if (!d) return -errno;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, CKPT_META) ||
        !strcmp(de->d_name, CKPT_MANIFEST) || store__is_tmp_of(de->d_name, CKPT_MANIFEST))
      continue;
    char *a = store__path_join(src, de->d_name), *b = store__path_join(dst, de->d_name);
    if (!a || !b) {
      rc = -ENOMEM;
    } else {
      size_t len = strlen(de->d_name);
      bool sst = len > 4 && !strcmp(de->d_name + len - 4, ".sst");
      if (!sst || link(a, b) != 0) rc = copy_file(a, b); /* EXDEV/EPERM: copy */
    }
    free(a);
    free(b);
    if (rc) break;
  }
  closedir(d);
  if (rc == 0) rc = fsio_fsync_path(dst, true, NULL, 0);
  return rc;
}

/* Atomically swaps db/ and db.restore/.  *exchanged tells which way it went:
 * 1 = renameat2(RENAME_EXCHANGE) (the old db is now db.restore/), 0 = the
 * two-rename fallback (the old db is now db.old/; a crash between the two
 * renames is rolled back at open by store__recover_leftovers). */
int store__swap_db(store_t *s, int *exchanged) {
  if (renameat2(AT_FDCWD, s->restore_path, AT_FDCWD, s->db_path, RENAME_EXCHANGE) == 0) {
    *exchanged = 1;
  } else {
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -errno;
    *exchanged = 0;
    int rc = 0;
    char *old = store__path_join(s->dir, "db.old");
    if (!old) return -ENOMEM;
    if (rename(s->db_path, old) != 0 || rename(s->restore_path, s->db_path) != 0) rc = -errno;
    /* the old db moves to db.restore/ like after an exchange; if this fails,
     * store__recover_leftovers removes db.old/ instead */
    if (rc == 0 && rename(old, s->restore_path) != 0)
      log_warn("cannot move the old db aside path=%s error=%s", old, strerror(errno));
    free(old);
    if (rc) return rc;
  }
  /* the swap is done either way; a failed fsync only weakens crash safety */
  int frc = fsio_fsync_parent(s->db_path, NULL, 0);
  if (frc) log_warn("cannot fsync data dir after restore dir=%s error=%s", s->dir, strerror(-frc));
  return 0;
}

void store__swap_back(store_t *s) {
  if (renameat2(AT_FDCWD, s->restore_path, AT_FDCWD, s->db_path, RENAME_EXCHANGE) != 0) {
    char *old = store__path_join(s->dir, "db.old");
    if (old && rename(s->db_path, old) == 0) rename(s->restore_path, s->db_path);
    free(old);
  }
}
