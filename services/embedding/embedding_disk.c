/* embedding_disk: see embedding_disk.h. */
#include "embedding_disk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

static void gauges(embedding_disk_t *d) {
  metrics_gauge_set(d->g_full, d->full_since > 0 ? 1 : 0);
  metrics_gauge_set(d->g_free, (double)d->space.free_bytes);
}

static void space_read(embedding_disk_t *d) {
  store_space_t sp;
  if (store_space(d->store, &sp) == 0) d->space = sp;
  gauges(d);
}

int embedding_disk_full(embedding_disk_t *d, const char *method, char *why, size_t why_len) {
  int known = d->full_since > 0;
  space_read(d);
  if (!known) {
    d->full_since = clock_wall_s();
    gauges(d);
    log_error("disk full: embedding server %u's data dir %s has %.1f MiB free of %.1f MiB (%s during %s); "
              "writes and checkpoints are answered RESOURCE_EXHAUSTED and their callers wait; free space there and "
              "the server takes writes again by itself",
              d->shard, store_dir(d->store), d->space.free_bytes / 1048576.0, d->space.total_bytes / 1048576.0,
              strerror(ENOSPC), method);
  }
  char detail[512];
  snprintf(detail, sizeof detail, "%s", why);
  snprintf(why, why_len,
           "embedding server %u's data dir %s is full (%s; %.1f MiB free of %.1f MiB): nothing of this call was "
           "written; it takes writes again by itself once there is space (%.200s)",
           d->shard, store_dir(d->store), strerror(ENOSPC), d->space.free_bytes / 1048576.0,
           d->space.total_bytes / 1048576.0, detail);
  return known;
}

static void clear(embedding_disk_t *d, const char *how) {
  if (!d->full_since) return;
  log_info("disk space is back: embedding server %u's data dir %s has %.1f MiB free, %s after %.1f s; writes go on",
           d->shard, store_dir(d->store), d->space.free_bytes / 1048576.0, how, clock_wall_s() - d->full_since);
  d->full_since = 0;
  gauges(d);
}

typedef struct resume_work_s {
  uv_work_t req;
  embedding_disk_t *d;
  int rc, reopened;
  char why[512];
} resume_work_t;

static void resume_cb(uv_work_t *req) {
  resume_work_t *r = req->data;
  r->rc = store_resume(r->d->store, &r->reopened, r->why, sizeof r->why);
}

static void resume_after(uv_work_t *req, int status) {
  resume_work_t *r = req->data;
  embedding_disk_t *d = r->d;
  d->resuming = 0;
  space_read(d);
  if (status == 0 && r->rc == 0 && !d->space.nospace) clear(d, "the store was reopened");
  free(r);
}

/* Every second while disk-full: the free space; a reopen once it fits; the
 * mark goes when there is room and the store needs no reopen (the full
 * disk met one of our own files). */
static void on_timer(uv_timer_t *t) {
  embedding_disk_t *d = t->data;
  if (!d->full_since || d->resuming || d->stopping) return;
  space_read(d);
  const store_space_t *sp = &d->space;
  if (!sp->nospace) {
    if (sp->free_bytes >= STORE_RESUME_MARGIN) clear(d, "no reopen needed");
    return;
  }
  if (sp->free_bytes < sp->need_bytes) return;
  resume_work_t *r = calloc(1, sizeof *r);
  if (!r) return;
  r->d = d;
  r->req.data = r;
  if (uv_queue_work(d->loop, &r->req, resume_cb, resume_after)) {
    free(r);
    return;
  }
  d->resuming = 1;
}

void embedding_disk_init(embedding_disk_t *d, uv_loop_t *loop, store_t *store, uint32_t shard,
                         metrics_registry_t *reg) {
  memset(d, 0, sizeof *d);
  d->loop = loop;
  d->store = store;
  d->shard = shard;
  if (reg) {
    char sl[32];
    snprintf(sl, sizeof sl, "shard=\"%u\"", shard);
    d->g_full = metrics_gauge(reg, "disk_full", sl,
                              "1 while the data dir is full: writes are answered RESOURCE_EXHAUSTED and wait");
    d->g_free = metrics_gauge(reg, "disk_free_bytes", sl, "free bytes in the data dir (statvfs)");
  }
  space_read(d);
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  uv_unref((uv_handle_t *)&d->timer);
  uv_timer_start(&d->timer, on_timer, 1000, 1000);
  d->timer_open = 1;
}

void embedding_disk_stop(embedding_disk_t *d) {
  if (d->stopping) return;
  d->stopping = 1;
  if (d->timer_open) uv_close((uv_handle_t *)&d->timer, NULL);
  d->timer_open = 0;
}
