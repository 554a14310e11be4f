/*
 * store_recover: what lets an embedding store come back from kill -9 with
 * nothing acknowledged lost and its checkpoint protocol intact (store.h).
 * The rows, checkpoints and blobs have files of their own
 * (store_internal.h lists them); this file keeps:
 *
 *  - The fence, durably.  data_dir/FENCE is a few "key=value" lines
 *    (format, id, iteration, token, set_unix), replaced whole by
 *    fsio_replace (temporary + fsync + rename + dir fsync), and removed
 *    (unlink + dir fsync) when the fence is lifted: after a crash it is the old fence or
 *    the new one, never a torn one.  The token is random per Fence call and
 *    is written into the CHANTER_CHECKPOINT file of the checkpoint taken
 *    under that fence, so that at open a FENCE whose checkpoint was
 *    completed just before a crash (between the checkpoint's rename and the
 *    fence's removal) is recognized and lifted -- while an older
 *    checkpoint of the same id (a resumed job retakes its ids, deleting
 *    the old one first) is not mistaken for it.
 *  - Whether the previous process closed the store: LOCK, which every
 *    store flock()s while open (the kernel drops the lock when a process
 *    dies, so a kill -9 never leaves the dir locked), holds "pid=N" while
 *    open and is emptied by store_close; a pid found at open means the
 *    previous server died with the dir open and RocksDB replayed its WAL.
 *  - One log line at open with what the dir holds (rows, blobs,
 *    checkpoints, the fence).
 *  - The tests' fault hook inside a checkpoint (store__fault).
 */
#include "clock.h"
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "fsio.h"
#include "log.h"

#define FENCE_FILE "FENCE"
#define FENCE_FORMAT 1
#define FENCE_MAX_BYTES 1024 /* a valid FENCE is ~150 bytes */

/* A random non-zero token (0 means "any fence" to store__fence_lift). */
static uint64_t random_token(void) {
  uint64_t t = 0;
  while (t == 0) {
    if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t) {
      struct timespec ts = clock_wall_ts();
      t = table_mix64((uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32);
    }
  }
  return t;
}

static int fence_path(const store_t *s, const char *name, char *out, size_t len) {
  return (size_t)snprintf(out, len, "%s/%s", s->dir, name) < len ? 0 : -ENAMETOOLONG;
}

/* Writes f as data_dir/FENCE, durably (fsio_replace). */
static int fence_write(store_t *s, const store_fence_t *f) {
  char fin[PATH_MAX], text[256];
  int rc = fence_path(s, FENCE_FILE, fin, sizeof fin);
  if (rc) return rc;
  int n = snprintf(text, sizeof text,
                   "format=%d\nid=%s\niteration=%" PRIu64 "\ntoken=%016" PRIx64 "\nset_unix=%" PRIu64 "\n",
                   FENCE_FORMAT, f->id, f->iteration, f->token, (uint64_t)time(NULL));
  return fsio_replace(fin, text, (size_t)n, 0644, NULL, 0);
}

/* Parses a FENCE file's text; 0, or -EBADMSG with what is wrong in what. */
static int fence_parse(char *text, store_fence_t *f, char *what, size_t what_len) {
  int format = 0, got = 0;
  memset(f, 0, sizeof *f);
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (sscanf(line, "format=%d", &format) == 1) got |= 1;
    else if (sscanf(line, "id=%64[A-Za-z0-9._-]", f->id) == 1) got |= 2;
    else if (sscanf(line, "iteration=%" SCNu64, &f->iteration) == 1) got |= 4;
    else if (sscanf(line, "token=%" SCNx64, &f->token) == 1) got |= 8;
  }
  if ((got & 1) && format != FENCE_FORMAT) {
    snprintf(what, what_len, "format %d, this version reads format %d", format, FENCE_FORMAT);
    return -EBADMSG;
  }
  if (got != 15 || !store__valid_ckpt_id(f->id) || f->token == 0) {
    snprintf(what, what_len, "it lacks a valid %s line", !(got & 1) ? "format=" : !(got & 2) ? "id=" :
             !(got & 4) ? "iteration=" : !(got & 8) || f->token == 0 ? "token=" : "id=");
    return -EBADMSG;
  }
  f->set = 1;
  return 0;
}

int store__fence_load(store_t *s, char *why, size_t why_len) {
  char fin[PATH_MAX], text[FENCE_MAX_BYTES + 1], what[128] = "";
  int rc = fence_path(s, FENCE_FILE, fin, sizeof fin);
  if (rc) return rc;
  memset(&s->fence, 0, sizeof s->fence);
  store__remove_tmps(s->dir, FENCE_FILE, "a fence write that was interrupted");
  int fd = open(fin, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    rc = -errno;
    return err_set(why, why_len, rc, "cannot read the fence file %s: %s; check its permissions", fin,
                   strerror(-rc));
  }
  ssize_t n = read(fd, text, sizeof text);
  rc = n < 0 ? -errno : 0;
  close(fd);
  store_fence_t f;
  if (rc == 0 && n > FENCE_MAX_BYTES) {
    snprintf(what, sizeof what, "more than %d bytes", FENCE_MAX_BYTES);
    rc = -EBADMSG;
  } else if (rc == 0) {
    text[n] = 0;
    rc = fence_parse(text, &f, what, sizeof what);
  } else {
    snprintf(what, sizeof what, "%s", strerror(-rc));
  }
  if (rc)
    return err_set(why, why_len, rc,
                   "the fence file %s is damaged (%s); it names the checkpoint this server's later "
                   "write-backs wait for.  If no whole-job checkpoint was being taken when the server "
                   "stopped, or the job will be resumed from a complete checkpoint or started "
                   "--fresh, remove the file and start the server again",
                   fin, what);
  /* its checkpoint completed just before the crash: the fence has done its work */
  char cdir[PATH_MAX];
  store_fence_t was;
  uint64_t created, bytes;
  if ((size_t)snprintf(cdir, sizeof cdir, "%s/%s", s->ckpt_dir, f.id) < sizeof cdir &&
      store__ckpt_read_meta(cdir, &created, &bytes, &was) == 0 && was.set && was.token == f.token) {
    if (unlink(fin) != 0 || (rc = fsio_fsync_path(s->dir, true, NULL, 0)) != 0) {
      rc = rc ? rc : -errno;
      return err_set(why, why_len, rc, "cannot remove the fence file %s, whose checkpoint %s was taken: %s",
                     fin, f.id, strerror(-rc));
    }
    log_info("fence lifted at start id=%s iteration=%" PRIu64
             ": its checkpoint was taken before the server stopped", f.id, f.iteration);
    return 0;
  }
  s->fence = f;
  log_info("fence restored id=%s iteration=%" PRIu64 " token=%016" PRIx64
           ": write-backs of later iterations wait for checkpoint %s", f.id, f.iteration, f.token, f.id);
  return 0;
}

int store_fence_set(store_t *s, const char *id, uint64_t iteration, char *why, size_t why_len) {
  if (!store__valid_ckpt_id(id))
    return err_set(why, why_len, -EINVAL,
                   "fence id \"%.80s\" is not a valid checkpoint id: use 1 to %d characters from "
                   "A-Z a-z 0-9 . _ - (not \".\" or \"..\")", id ? id : "(null)", CKPT_ID_MAX);
  int rc = 0;
  pthread_mutex_lock(&s->fence_mu);
  if (s->fence.set && !strcmp(s->fence.id, id) && s->fence.iteration == iteration) goto out; /* again */
  store_fence_t f = {.set = 1, .iteration = iteration, .token = random_token()};
  snprintf(f.id, sizeof f.id, "%s", id);
  if ((rc = fence_write(s, &f))) {
    log_error("cannot store the fence id=%s dir=%s error=%s", id, s->dir, strerror(-rc));
    err_set(why, why_len, rc, "cannot store the fence in %s/%s: %s; the fence is not set: check the "
            "disk and fence again", s->dir, FENCE_FILE, strerror(-rc));
    goto out;
  }
  s->fence = f;
  log_debug("fence stored id=%s iteration=%" PRIu64 " token=%016" PRIx64, id, iteration, f.token);
out:
  pthread_mutex_unlock(&s->fence_mu);
  return rc;
}

void store_fence_get(store_t *s, store_fence_t *f) {
  pthread_mutex_lock(&s->fence_mu);
  *f = s->fence;
  pthread_mutex_unlock(&s->fence_mu);
}

void store__fence_of(store_t *s, const char *id, store_fence_t *f) {
  pthread_mutex_lock(&s->fence_mu);
  if (s->fence.set && !strcmp(s->fence.id, id))
    *f = s->fence;
  else
    memset(f, 0, sizeof *f);
  pthread_mutex_unlock(&s->fence_mu);
}

int store__fence_lift(store_t *s, uint64_t token, const char *why) {
  char fin[PATH_MAX];
  int rc = fence_path(s, FENCE_FILE, fin, sizeof fin);
  if (rc) return rc;
  pthread_mutex_lock(&s->fence_mu);
  if (!s->fence.set || (token && s->fence.token != token)) goto out;
  if (unlink(fin) != 0 && errno != ENOENT) rc = -errno;
  if (rc == 0) rc = fsio_fsync_path(s->dir, true, NULL, 0);
  if (rc) {
    log_error("cannot remove the fence file path=%s id=%s error=%s: it stays until removed", fin,
              s->fence.id, strerror(-rc));
    goto out;
  }
  log_debug("fence removed id=%s iteration=%" PRIu64 " (%s)", s->fence.id, s->fence.iteration, why);
  memset(&s->fence, 0, sizeof s->fence);
out:
  pthread_mutex_unlock(&s->fence_mu);
  return rc;
}

/* ------------------------------------------------------------ LOCK's pid */

void store__lock_claim(store_t *s) {
  char buf[64];
  s->unclean_pid = store__lock_holder(s);
  s->lock_held = 1;
  int m = snprintf(buf, sizeof buf, "pid=%ld\n", (long)getpid());
  /* only a diagnostic: the flock is what guards the dir */
  if (ftruncate(s->lock_fd, 0) != 0 || pwrite(s->lock_fd, buf, (size_t)m, 0) != m)
    log_debug("cannot note our pid in the lock file dir=%s error=%s", s->dir, strerror(errno));
}

long store__lock_holder(const store_t *s) {
  char buf[64];
  long pid = 0;
  ssize_t n = s->lock_fd >= 0 ? pread(s->lock_fd, buf, sizeof buf - 1, 0) : -1;
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "pid=%ld", &pid) != 1 || pid < 0) pid = 0;
  }
  return pid;
}

void store__lock_release(store_t *s) {
  if (!s->lock_held) return;
  char buf[64];
  int m = !s->open_done && s->unclean_pid ? snprintf(buf, sizeof buf, "pid=%ld\n", s->unclean_pid) : 0;
  if (ftruncate(s->lock_fd, 0) != 0 || (m && pwrite(s->lock_fd, buf, (size_t)m, 0) != m))
    log_debug("cannot reset the lock file dir=%s error=%s", s->dir, strerror(errno));
}

/* ------------------------------------------------------------ report */

/* Checkpoint directories whose CHANTER_CHECKPOINT exists but cannot be
 * read: never listed or restored, so say so once, naming the file. */
static void warn_damaged_checkpoints(const store_t *s) {
  DIR *d = opendir(s->ckpt_dir);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    char dir[PATH_MAX];
    uint64_t created, bytes;
    if (!store__valid_ckpt_id(de->d_name) ||
        (size_t)snprintf(dir, sizeof dir, "%s/%s", s->ckpt_dir, de->d_name) >= sizeof dir)
      continue;
    int rc = store__ckpt_read_meta(dir, &created, &bytes, NULL);
    if (rc && rc != ERR_NOTFOUND)
      log_warn("checkpoint %s has a damaged %s/%s (%s): it is not listed and cannot be restored; "
               "delete it (DeleteCheckpoint %s) or remove that directory", de->d_name, dir, CKPT_META,
               rc == -EBADMSG ? "its created_unix= or bytes= line is missing" : strerror(-rc),
               de->d_name);
  }
  closedir(d);
}

void store__log_recovered(store_t *s) {
  uint64_t rows = 0, blobs = 0;
  rocksdb_property_int_cf(s->db, s->cf[CF_ROWS], "rocksdb.estimate-num-keys", &rows);
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[CF_BLOBS]);
  for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) blobs++;
  rocksdb_iter_destroy(it);
  store_checkpoint_info_t *cps = NULL;
  size_t n_cps = 0, sealed = 0;
  if (store_list_checkpoints(s, &cps, &n_cps) == 0)
    for (size_t i = 0; i < n_cps; i++) sealed += cps[i].sealed != 0;
  free(cps);
  warn_damaged_checkpoints(s);
  char fence[128] = "none";
  if (s->fence.set) snprintf(fence, sizeof fence, "%s@%" PRIu64, s->fence.id, s->fence.iteration);
  if (s->unclean_pid)
    log_warn("data dir %s was not closed by its previous server (pid %ld was killed or crashed): "
             "RocksDB replayed the write-ahead log, so every acknowledged write-back is back",
             s->dir, s->unclean_pid);
  log_info("embedding store holds dir=%s previous_stop=%s rows_estimate=%" PRIu64 " blobs=%" PRIu64
           " checkpoints=%zu sealed=%zu fence=%s last_sequence=%" PRIu64,
           s->dir, s->unclean_pid ? "unclean" : "clean", rows, blobs, n_cps, sealed, fence,
           rocksdb_get_latest_sequence_number(s->db));
}

/* ------------------------------------------------------------ fault hook */

void store__fault(const char *point) {
  const char *f = getenv("CHANTER_FAULT_STORE_CHECKPOINT");
  if (!f || strcmp(f, point)) return;
  log_warn("killing this process inside a checkpoint at point=%s (CHANTER_FAULT_STORE_CHECKPOINT, for tests)",
           point);
  raise(SIGKILL);
}
