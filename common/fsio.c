/*
 * fsio: see fsio.h.
 */
#include "fsio.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(int rc, char *why, size_t why_len, const char *what, const char *path) {
  if (why && why_len) snprintf(why, why_len, "%s %s: %s", what, path, strerror(-rc));
  return rc;
}

int fsio_read_all(const char *path, size_t max, char **out, size_t *len, char *why, size_t why_len) {
  *out = NULL;
  if (len) *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(-errno, why, why_len, "cannot open", path);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  int rc = buf ? 0 : -ENOMEM;
  while (rc == 0) {
    if (n + 1 >= cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        rc = -ENOMEM;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = -errno;
    else if (r == 0) break;
    else n += (size_t)r;
    if (max && n > max) rc = -EFBIG;
  }
  close(fd);
  if (rc) {
    free(buf);
    return fail(rc, why, why_len, "cannot read", path);
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return 0;
}

int fsio_fsync_path(const char *path, bool dir, char *why, size_t why_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  if (fd < 0) return fail(-errno, why, why_len, "cannot open", path);
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc ? fail(rc, why, why_len, "cannot fsync", path) : 0;
}

int fsio_fsync_parent(const char *path, char *why, size_t why_len) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else if ((size_t)(slash - path) >= sizeof dir) return fail(-ENAMETOOLONG, why, why_len, "path too long:", path);
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  return fsio_fsync_path(dir, true, why, why_len);
}

int fsio_replace_open(fsio_tmp_t *t, const char *path, int mode, char *why, size_t why_len) {
  memset(t, 0, sizeof *t);
  t->path = strdup(path);
  if (!t->path || asprintf(&t->tmp, "%s.tmp", path) < 0) {
    free(t->path);
    t->path = t->tmp = NULL;
    return fail(-ENOMEM, why, why_len, "out of memory writing", path);
  }
  int fd = open(t->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 || !(t->f = fdopen(fd, "w"))) {
    int rc = -errno;
    if (fd >= 0) close(fd);
    fail(rc, why, why_len, "cannot create", t->tmp);
    unlink(t->tmp);
    free(t->path);
    free(t->tmp);
    t->path = t->tmp = NULL;
    return rc;
  }
  return 0;
}

int fsio_replace_commit(fsio_tmp_t *t, bool ok, char *why, size_t why_len) {
  if (!t->f) return fail(-EINVAL, why, why_len, "no open replacement for", t->path ? t->path : "?");
  int rc = 0;
  if (!ok) rc = -ECANCELED;
  if (!rc && (fflush(t->f) != 0 || ferror(t->f))) rc = fail(-(errno ? errno : EIO), why, why_len, "cannot write", t->tmp);
  if (!rc && fsync(fileno(t->f)) != 0) rc = fail(-errno, why, why_len, "cannot fsync", t->tmp);
  if (fclose(t->f) != 0 && !rc) rc = fail(-errno, why, why_len, "cannot close", t->tmp);
  t->f = NULL;
  if (!rc && rename(t->tmp, t->path) != 0) rc = fail(-errno, why, why_len, "cannot rename onto", t->path);
  if (rc) unlink(t->tmp);
  else rc = fsio_fsync_parent(t->path, why, why_len);
  free(t->path);
  free(t->tmp);
  t->path = t->tmp = NULL;
  return rc;
}

int fsio_replace(const char *path, const void *data, size_t len, int mode, char *why, size_t why_len) {
  fsio_tmp_t t;
  int rc = fsio_replace_open(&t, path, mode, why, why_len);
  if (rc) return rc;
  bool ok = len == 0 || fwrite(data, 1, len, t.f) == len;
  if (!ok) snprintf(why, why_len, "cannot write %s: %s", t.tmp, strerror(errno ? errno : EIO));
  rc = fsio_replace_commit(&t, ok, ok ? why : NULL, ok ? why_len : 0);
  return ok ? rc : -EIO;
}

bool fsio_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

int fsio_mkdir_p(const char *path, char *why, size_t why_len) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return fail(-ENAMETOOLONG, why, why_len, "bad directory name", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) return fail(-errno, why, why_len, "cannot create directory", buf);
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(path, &st) != 0) return fail(-errno, why, why_len, "cannot create directory", path);
  return S_ISDIR(st.st_mode) ? 0 : fail(-ENOTDIR, why, why_len, "not a directory:", path);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

int fsio_remove_tree(const char *path, char *why, size_t why_len) {
  if (!fsio_exists(path)) return 0;
  errno = 0;
  if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) return fail(errno ? -errno : -EIO, why, why_len, "cannot remove", path);
  return 0;
}
