/*
 * embedding_backup: see embedding_backup.h.
 *
 * data_dir/LOST_DISK ("restored=<id>\nunix=<seconds>\n", fsio_replace) is
 * written after the restore and before the store creates its database, so
 * a server killed anywhere in between starts on a lost disk again: without
 * a database the restore runs again (what is there already is kept); with
 * one, the file says so.  It is removed once a Restore or Clear succeeded.
 */
#include "embedding_backup.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "fsio.h"
#include "log.h"
#include "proc.h"

#define LOST_FILE "LOST_DISK"

enum { OP_SYNC, OP_BACKUP, OP_DROP, OP_DROP_ALL };

typedef struct op_s {
  struct op_s *next;
  int kind;
  char id[65];
} op_t;

struct embedding_backup_s {
  store_backup_t *sb;
  store_t *store;
  char data_dir[4096];
  char restored[65];
  _Atomic int lost;
  pthread_t th;
  int running;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op_t *head, *tail;
  int stop;
};

/* ------------------------------------------------------------ the lost disk */

static int lost_path(const char *data_dir, char *out, size_t n) {
  return snprintf(out, n, "%s/" LOST_FILE, data_dir) >= (int)n ? -ENAMETOOLONG : 0;
}

/* Whether data_dir holds a database: anything else (missing, empty, only
 * restored checkpoints) is a disk that lost it. */
static int has_db(const char *data_dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/db/CURRENT", data_dir);
  return fsio_exists(p);
}

/* Restores the backups into an empty data dir and marks it (see above). */
static int restore_lost(embedding_backup_t *b, char *why, size_t why_len) {
  store_backup_restored_t r;
  char path[4200], text[160];
  int rc = store_backup_restore(b->sb, b->data_dir, &r, why, why_len);
  if (rc) return rc;
  if (!r.backups) {
    log_info("no backups of this server in %s: the empty data dir %s starts a new store", store_backup_dir(b->sb),
             b->data_dir);
    return 0;
  }
  snprintf(b->restored, sizeof b->restored, "%s", r.newest);
  int n = snprintf(text, sizeof text, "restored=%s\nunix=%lld\n", r.newest, (long long)time(NULL));
  if ((rc = lost_path(b->data_dir, path, sizeof path)) || (rc = fsio_replace(path, text, (size_t)n, 0644, why, why_len)))
    return rc;
  atomic_store(&b->lost, 1);
  if (r.restored)
    log_warn("started on a lost disk: data dir %s had no database; restored %zu checkpoint(s) from %s, the newest %s%s; "
             "the live rows start empty and the writes acknowledged since that checkpoint are gone: this server waits "
             "for the oracle to roll the job back",
             b->data_dir, r.restored, store_backup_dir(b->sb), r.newest,
             r.failed ? " (some backups could not be restored: see above)" : "");
  else
    log_error("started on a lost disk: data dir %s had no database and none of the %zu backups in %s could be "
              "restored (see above): the job goes back to its start",
              b->data_dir, r.backups, store_backup_dir(b->sb));
  return 0;
}

/* A LOST_DISK left by an earlier start: still on a lost disk. */
static void lost_from_file(embedding_backup_t *b) {
  char path[4200], *text = NULL;
  if (lost_path(b->data_dir, path, sizeof path) || fsio_read_all(path, 4096, &text, NULL, NULL, 0)) return;
  const char *p = strstr(text, "restored=");
  if (p) snprintf(b->restored, sizeof b->restored, "%.*s", (int)strcspn(p + 9, "\n"), p + 9);
  atomic_store(&b->lost, 1);
  log_warn("still on a lost disk (%s): the job was not rolled back since checkpoint %s was restored from backup; "
           "this server waits for the oracle's Restore or Clear", path, b->restored[0] ? b->restored : "(none)");
  free(text);
}

int embedding_backup_start(const cfg_t *cfg, uint32_t shard, const char *data_dir, embedding_backup_t **out,
                           char *why, size_t why_len) {
  *out = NULL;
  const char *tmpl = cfg_str(cfg, "checkpoint.backup_dir");
  if (!tmpl || !*tmpl) return 0;
  char dir[4096], t2[4096];
  if (!strstr(tmpl, "%i")) snprintf(t2, sizeof t2, "%s/embedding-%%i", tmpl);
  else snprintf(t2, sizeof t2, "%s", tmpl);
  if (cfg_path_expand(t2, NULL, shard, dir, sizeof dir))
    return err_set(why, why_len, -ENAMETOOLONG, "checkpoint.backup_dir %s is too long", tmpl);
  embedding_backup_t *b = calloc(1, sizeof *b);
  if (!b) return -ENOMEM;
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  snprintf(b->data_dir, sizeof b->data_dir, "%s", data_dir);
  int rc = store_backup_open(dir, &b->sb, why, why_len);
  if (!rc && !has_db(data_dir)) rc = restore_lost(b, why, why_len);
  else if (!rc) lost_from_file(b);
  if (rc) {
    embedding_backup_destroy(b);
    return rc;
  }
  log_info("checkpoint backups on: backup_dir=%s (every sealed checkpoint, incremental)", dir);
  *out = b;
  return 0;
}

int embedding_backup_lost(const embedding_backup_t *b, const char **restored) {
  if (!b || !atomic_load(&b->lost)) return 0;
  if (restored) *restored = b->restored;
  return 1;
}

void embedding_backup_recovered(embedding_backup_t *b, const char *what) {
  char path[4200];
  if (!b || !atomic_load(&b->lost) || lost_path(b->data_dir, path, sizeof path)) return;
  int rc = unlink(path) == 0 || errno == ENOENT ? fsio_fsync_path(b->data_dir, true, NULL, 0) : -errno;
  if (rc) {
    log_error("cannot remove %s (%s): a restart would report the lost disk again", path, strerror(-rc));
    return;
  }
  atomic_store(&b->lost, 0);
  log_info("the lost disk is behind this server: the job %s; it serves again", what);
}

/* ------------------------------------------------------------ the thread */

static void push(embedding_backup_t *b, int kind, const char *id) {
  if (!b) return;
  op_t *o = calloc(1, sizeof *o);
  if (!o) {
    log_error("out of memory queueing a backup operation: it is done at the next start");
    return;
  }
  o->kind = kind;
  if (id) snprintf(o->id, sizeof o->id, "%s", id);
  pthread_mutex_lock(&b->mu);
  if (b->tail) b->tail->next = o;
  else b->head = o;
  b->tail = o;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void embedding_backup_sealed(embedding_backup_t *b, const char *id) { push(b, OP_BACKUP, id); }
void embedding_backup_deleted(embedding_backup_t *b, const char *id) { push(b, OP_DROP, id); }
void embedding_backup_cleared(embedding_backup_t *b) { push(b, OP_DROP_ALL, NULL); }

int embedding_backup_has(embedding_backup_t *b, const char *id) { return b && store_backup_has(b->sb, id); }

static void backup_one(embedding_backup_t *b, const char *id) {
  store_backup_info_t info;
  char why[1024] = "";
  /* (logged by the store, with the bytes copied and reused) */
  if (store_backup_checkpoint(b->sb, b->store, id, &info, why, sizeof why) == 0 && info.already)
    log_debug("checkpoint backed up already id=%s backup_id=%" PRIu32, id, info.backup_id);
}

static void drop(embedding_backup_t *b, const char *id) {
  char why[1024] = "";
  if (store_backup_drop(b->sb, id, why, sizeof why))
    log_warn("cannot drop the backup of %s in %s: %s", id ? id : "every checkpoint", store_backup_dir(b->sb), why);
}

/* At start: what the store holds and the backups agree. */
static void sync_all(embedding_backup_t *b) {
  store_checkpoint_info_t *cps = NULL;
  store_backup_entry_t *bk = NULL;
  size_t n = 0, nb = 0;
  if (store_list_checkpoints(b->store, &cps, &n) || store_backup_list(b->sb, &bk, &nb)) {
    log_warn("cannot list the checkpoints or their backups: what is missing is backed up at the next seal");
    goto out;
  }
  for (size_t i = 0; i < nb; i++) {
    int here = 0;
    for (size_t k = 0; k < n && !here; k++) here = !strcmp(cps[k].id, bk[i].id);
    if (!here) {
      log_info("the backup of checkpoint %s is dropped: the checkpoint was deleted", bk[i].id);
      drop(b, bk[i].id);
    }
  }
  for (size_t k = 0; k < n; k++) /* sorted by id: in checkpoint order within a job */
    if (cps[k].sealed && !store_backup_has(b->sb, cps[k].id)) backup_one(b, cps[k].id);
out:
  free(cps);
  free(bk);
}

static void *thread_main(void *arg) {
  proc_name_thread("emb-backup");
  embedding_backup_t *b = arg;
  for (;;) {
    pthread_mutex_lock(&b->mu);
    while (!b->head && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
    op_t *o = b->stop ? NULL : b->head;
    if (o && !(b->head = o->next)) b->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    if (!o) return NULL;
    switch (o->kind) {
    case OP_SYNC: sync_all(b); break;
    case OP_BACKUP: backup_one(b, o->id); break;
    case OP_DROP: drop(b, o->id); break;
    case OP_DROP_ALL: drop(b, NULL); break;
    }
    free(o);
  }
}

int embedding_backup_run(embedding_backup_t *b, store_t *store) {
  if (!b) return 0;
  b->store = store;
  push(b, OP_SYNC, NULL);
  int rc = pthread_create(&b->th, NULL, thread_main, b);
  if (rc) return -rc;
  b->running = 1;
  return 0;
}

void embedding_backup_destroy(embedding_backup_t *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  if (b->running) pthread_join(b->th, NULL);
  for (op_t *o = b->head, *n; o; o = n) {
    n = o->next;
    free(o);
  }
  store_backup_close(b->sb);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b);
}
