/*
 * coll: the collective interface (coll.h) -- argument checks, dispatch to
 * a backend (coll_gloo.cc, coll_nccl.c), the size-1 shortcuts, the
 * "group failed" latch, and the one log line per failure.  The backends
 * convert their libraries' errors to our codes; this file adds who failed
 * (operation, rank, size, backend) and logs it.  Also the file-backed
 * rendezvous store used by tests and single-host runs.
 */
#include "coll.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "log.h"
#include "proc.h"

struct coll_s {
  const coll__backend_t *be;
  void *impl;
  int rank, size;
  int failed; /* the first error of a collective; 0 while healthy */
};

static const coll__backend_t *find_backend(const char *name) {
  if (strcmp(name, "gloo") == 0) return &coll__gloo_backend;
#ifdef CHANTER_CUDA
  if (strcmp(name, "nccl") == 0) return &coll__nccl_backend;
#endif
  return NULL;
}

/* Gloo writes its sockets with writev(2): a write to a peer that died
 * raises SIGPIPE, whose default action kills this process instead of
 * failing the collective.  proc_init() ignores it in our daemons; do the
 * same for every other caller (tests, tools) unless it chose a handler. */
static void ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
}

int coll_backend_built(const char *name) { return name && find_backend(name) != NULL; }

int coll_nccl_eligible(const char *const *ids, int n, int *a, int *b, char *why, size_t why_len) {
  int ra = -1, rb = -1, ok = 0;
  char dummy[1];
  if (!why || !why_len) why = dummy, why_len = sizeof dummy;
  if (n < 2) {
    snprintf(why, why_len, "a group of one has nothing to all-reduce");
    goto out;
  }
  for (int r = 0; r < n; r++)
    if (!ids || !ids[r] || !ids[r][0]) {
      ra = rb = r;
      snprintf(why, why_len, "trainer %d has no GPU identity (no usable CUDA device)", r);
      goto out;
    }
  for (int r = 0; r < n; r++)
    for (int q = 0; q < r; q++)
      if (strcmp(ids[q], ids[r]) == 0) {
        ra = q, rb = r;
        snprintf(why, why_len, "trainers %d and %d share GPU %s", q, r, ids[r]);
        goto out;
      }
  ok = 1;
  why[0] = 0;
out:
  if (a) *a = ra;
  if (b) *b = rb;
  return ok;
}

int coll_create(const coll_opts_t *o, const coll_store_t *store, coll_t **out,
                char *err, size_t err_len) {
  char what[512] = "";
  coll_t *c = NULL;
  int rc = 0;
  if (out) *out = NULL;
  if (!o || !store || !store->set || !store->get || !out) {
    snprintf(what, sizeof what, "missing options, store or output pointer");
    rc = -EINVAL;
    goto out;
  }
  const char *backend = o->backend ? o->backend : "gloo";
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size) {
    snprintf(what, sizeof what, "rank %d outside group of size %d", o->rank,
             o->size);
    rc = -EINVAL;
    goto out;
  }
  coll_opts_t opts = *o;
  opts.backend = backend;
  if (!opts.iface_addr || !*opts.iface_addr) opts.iface_addr = "127.0.0.1";
  if (!opts.prefix) opts.prefix = "chanter";
  if (opts.timeout_ms <= 0) opts.timeout_ms = 30000;

  const coll__backend_t *be = find_backend(backend);
  if (!be) {
    if (strcmp(backend, "nccl") == 0) {
      snprintf(what, sizeof what,
               "backend nccl is not built into this binary (built with CUDA=0 "
               "or without nvcc); use backend gloo");
      rc = ERR_CONFIG;
    } else {
      snprintf(what, sizeof what, "unknown backend '%s' (gloo or nccl)",
               backend);
      rc = -EINVAL;
    }
    goto out;
  }
  c = calloc(1, sizeof *c);
  if (!c) {
    rc = -ENOMEM;
    snprintf(what, sizeof what, "out of memory");
    goto out;
  }
  ignore_sigpipe();
  c->be = be;
  c->rank = opts.rank;
  c->size = opts.size;
  /* the threads the backend starts (Gloo's transport loop, NCCL's proxy)
   * would take the calling thread's name: they get one of their own, and
   * the caller gets its own back */
  char caller[16] = "";
  pthread_getname_np(pthread_self(), caller, sizeof caller);
  proc_name_thread(strcmp(be->name, "nccl") ? "coll-gloo" : "coll-nccl");
  rc = be->create(&opts, store, &c->impl, what, sizeof what);
  if (caller[0]) proc_name_thread(caller);
  if (rc < 0) goto out;
  log_debug("coll group formed backend=%s rank=%d size=%d prefix=%s", be->name,
            c->rank, c->size, opts.prefix);
  *out = c;
  c = NULL;
out:
  if (rc < 0) {
    log_error("coll create failed backend=%s rank=%d size=%d err=%s what=%s",
              o && o->backend ? o->backend : "gloo", o ? o->rank : -1,
              o ? o->size : -1, err_str(rc), what);
    if (err && err_len) snprintf(err, err_len, "%s", what);
  }
  free(c);
  return rc;
}

void coll_destroy(coll_t *c) {
  if (!c) return;
  if (c->impl) c->be->destroy(c->impl);
  free(c);
}

int coll_rank(const coll_t *c) { return c->rank; }
int coll_size(const coll_t *c) { return c->size; }
const char *coll_backend(const coll_t *c) { return c->be->name; }

/* Shared prologue: a group that failed stays failed (its peers may still
 * be inside the operation that broke). */
static int check_healthy(coll_t *c, const char *op) {
  if (!c->failed) return 0;
  log_error("coll %s refused: the group failed earlier rank=%d size=%d "
            "backend=%s err=%s",
            op, c->rank, c->size, c->be->name, err_str(c->failed));
  return c->failed;
}

static int finish(coll_t *c, const char *op, int rc, const char *what) {
  if (rc < 0) {
    c->failed = rc;
    log_error("coll %s failed rank=%d size=%d backend=%s err=%s what=%s", op,
              c->rank, c->size, c->be->name, err_str(rc), what);
  }
  return rc;
}

int coll_allreduce_sum_f32(coll_t *c, float *buf, size_t n) {
  char what[512] = "";
  int rc = check_healthy(c, "allreduce");
  if (rc < 0) return rc;
  if (n == 0) return 0;
  if (!buf) return finish(c, "allreduce", -EINVAL, "NULL buffer");
  if (c->size == 1) return 0;
  rc = c->be->allreduce_sum_f32(c->impl, buf, n, what, sizeof what);
  return finish(c, "allreduce", rc, what);
}

int coll_allreduce_sum_f32_ordered(coll_t *c, float *buf, size_t n) {
  int rc = check_healthy(c, "allreduce_ordered");
  if (rc < 0) return rc;
  if (n == 0 || c->size == 1) return 0;
  if (!buf) return finish(c, "allreduce_ordered", -EINVAL, "NULL buffer");
  if (strcmp(c->be->name, "gloo") != 0) /* device memory: summed by a kernel, not here */
    return finish(c, "allreduce_ordered", -EINVAL, "host buffers only (gloo backend)");
  float *all = malloc((size_t)c->size * n * sizeof(float));
  if (!all) return finish(c, "allreduce_ordered", -ENOMEM, "out of memory for the gathered buffers");
  if ((rc = coll_allgather(c, buf, n * sizeof(float), all)) == 0) {
    /* ((x0 + x1) + x2) + ... : rank order, whatever the element's offset */
    memcpy(buf, all, n * sizeof(float));
    for (int r = 1; r < c->size; r++) {
      const float *x = all + (size_t)r * n;
      for (size_t i = 0; i < n; i++) buf[i] += x[i];
    }
  }
  free(all);
  return rc;
}

int coll_broadcast(coll_t *c, void *buf, size_t bytes, int root) {
  char what[512] = "";
  int rc = check_healthy(c, "broadcast");
  if (rc < 0) return rc;
  if (root < 0 || root >= c->size) {
    /* A caller bug, not a broken group: do not latch. */
    log_error("coll broadcast refused: root %d outside group rank=%d size=%d",
              root, c->rank, c->size);
    return -EINVAL;
  }
  if (bytes == 0) return 0;
  if (!buf) return finish(c, "broadcast", -EINVAL, "NULL buffer");
  if (c->size == 1) return 0;
  rc = c->be->broadcast(c->impl, buf, bytes, root, what, sizeof what);
  return finish(c, "broadcast", rc, what);
}

int coll_allgather(coll_t *c, const void *in, size_t bytes_each, void *out) {
  char what[512] = "";
  int rc = check_healthy(c, "allgather");
  if (rc < 0) return rc;
  if (bytes_each == 0) return 0;
  if (!in || !out) return finish(c, "allgather", -EINVAL, "NULL buffer");
  rc = c->be->allgather(c->impl, in, bytes_each, out, what, sizeof what);
  return finish(c, "allgather", rc, what);
}

int coll_alltoallv(coll_t *c, const void *send, const size_t *sbytes,
                   void *recv, const size_t *rbytes) {
  char what[1024] = "";
  int in_step = 0;
  int rc = check_healthy(c, "alltoallv");
  if (rc < 0) return rc;
  if (!sbytes || !rbytes)
    return finish(c, "alltoallv", -EINVAL, "NULL size array");
  /* Every rank enters the backend whatever its sizes: an all-zero rank
   * cannot know that the others have nothing for each other. */
  size_t stot = 0, rtot = 0;
  for (int r = 0; r < c->size; r++) {
    if (sbytes[r] > (size_t)INT64_MAX - stot || rbytes[r] > (size_t)INT64_MAX - rtot)
      return finish(c, "alltoallv", -EINVAL, "total size overflows");
    stot += sbytes[r];
    rtot += rbytes[r];
  }
  if ((stot && !send) || (rtot && !recv))
    return finish(c, "alltoallv", -EINVAL, "NULL buffer");
  rc = c->be->alltoallv(c->impl, send, sbytes, recv, rbytes, &in_step, what,
                        sizeof what);
  if (rc < 0 && in_step) {
    /* A caller bug that left every rank in step: do not latch. */
    log_error("coll alltoallv refused rank=%d size=%d backend=%s err=%s what=%s",
              c->rank, c->size, c->be->name, err_str(rc), what);
    return rc;
  }
  return finish(c, "alltoallv", rc, what);
}

int coll_barrier(coll_t *c) {
  char what[512] = "";
  int rc = check_healthy(c, "barrier");
  if (rc < 0) return rc;
  if (c->size == 1) return 0;
  rc = c->be->barrier(c->impl, what, sizeof what);
  return finish(c, "barrier", rc, what);
}

/* ---- the file-backed store ----
 * A key becomes a file name: [A-Za-z0-9._-] stay, every other byte is
 * %XX, and a leading '.' too.  A value is written to "<file>.tmp.<pid>"
 * first (fsio_replace); no key the collectives use ends that way. */

static int key_path(const char *dir, const char *key, char *path, size_t len) {
  size_t n = (size_t)snprintf(path, len, "%s/", dir);
  if (n >= len || !*key) return -EINVAL;
  for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
    int plain = (*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') ||
                (*k >= '0' && *k <= '9') || *k == '_' || *k == '-' ||
                (*k == '.' && k != (const unsigned char *)key);
    if (n + 4 >= len) return -ENAMETOOLONG;
    if (plain)
      path[n++] = (char)*k;
    else
      n += (size_t)snprintf(path + n, len - n, "%%%02X", *k);
  }
  path[n] = '\0';
  return 0;
}

/* Each key is set once, by one rank: its file appears whole (fsio_replace),
 * so a reader polling for it never sees a part. */
static int file_store_set(void *ud, const char *key, const void *val,
                          size_t len) {
  const char *dir = ud;
  char path[4096];
  int rc = key_path(dir, key, path, sizeof path);
  if (rc == 0) rc = fsio_replace(path, val, len, 0644, NULL, 0);
  if (rc < 0) log_error("coll file store set failed key=%s err=%s", key, err_str(rc));
  return rc;
}

static int file_store_get(void *ud, const char *key, void **val, size_t *len,
                          int64_t timeout_ms) {
  const char *dir = ud;
  char path[4096];
  int rc = key_path(dir, key, path, sizeof path);
  if (rc < 0) return rc;
  int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  long sleep_us = 500;
  for (;;) {
    char *buf;
    rc = fsio_read_all(path, 0, &buf, len, NULL, 0); /* -ENOENT: not set yet */
    if (rc == 0) *val = buf;
    if (rc != -ENOENT) return rc;
    if (clock_mono_ms() >= deadline) return ERR_DEADLINE;
    usleep((useconds_t)sleep_us);
    if (sleep_us < 20000) sleep_us *= 2;
  }
}

int coll_file_store_init(coll_store_t *s, const char *dir) {
  struct stat st;
  if (!s || !dir) return -EINVAL;
  if (stat(dir, &st) < 0) return -errno;
  if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
  char *d = strdup(dir);
  if (!d) return -ENOMEM;
  s->set = file_store_set;
  s->get = file_store_get;
  s->ud = d;
  return 0;
}

void coll_file_store_close(coll_store_t *s) {
  if (!s) return;
  free(s->ud);
  s->ud = NULL;
}
