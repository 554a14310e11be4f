/*
 * store_internal: what the files of the embedding store share.  Not part
 * of the API: nothing outside common/store/ includes it.
 *
 *   store.c         open, close, clear; the RocksDB options; the helpers
 *                   every file uses (why, the RocksDB error wrapper, names)
 *   store_dir.c     the data dir on disk: its entries, the checkpoint
 *                   directories and their files, what an interrupted
 *                   checkpoint, delete, seal or restore left
 *   store_layout.c  the table layout metadata in the "default" column family
 *   store_rows.c    key checks, Lookup and WriteBack of rows
 *   store_ckpt.c    checkpoints: take, list, restore, seal, manifest, delete
 *   store_blob.c    named blobs
 *   store_digest.c  the digest of the rows, has_rows, the counters
 *   store_reader.c  reading a checkpoint offline (no store open)
 *   store_reshape.c a running store onto another count of servers
 *   store_recover.c the durable fence, LOCK's pid, the log line at open,
 *                   the tests' fault hook
 *   store_backup.c  backups of sealed checkpoints (RocksDB's BackupEngine)
 *   store_hot.c     the memory tier
 *
 * Lock order: lock (rwlock) -> ckpt_mu -> fence_mu.  fence_mu guards
 * `fence` and the FENCE file and is never held across RocksDB calls.
 */
#ifndef CHANTER_STORE_INTERNAL_H
#define CHANTER_STORE_INTERNAL_H

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"
#include "store_hot.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows are stored as raw little-endian float32: port the row encoding first"
#endif

enum { CF_META, CF_ROWS, CF_BLOBS, CF_N };
/* the column families' names, by CF_* */
extern const char *const store__cf_names[CF_N];

#define CKPT_META "CHANTER_CHECKPOINT"
/* RocksDB's own manifests are MANIFEST-<number>: these names never clash */
#define CKPT_MANIFEST "MANIFEST"
#define CKPT_ID_MAX 64
#define BLOB_NAME_MAX 128
/* the key of the layout metadata in the "default" column family */
#define META_LAYOUT_KEY "layout"

struct store_s {
  char *dir, *db_path, *ckpt_dir, *ckpt_tmp_dir, *restore_path;
  table_layout_t layout;
  shard_map_t shard_map;
  int has_shard_map;
  uint32_t shard;
  int sync_writes;
  int lock_fd; /* flock on data_dir/LOCK: one store per data dir, across processes;
                  holds "pid=N" while open, emptied by store_close */
  int lock_held;    /* the flock is ours (store__lock_claim) */
  int open_done;    /* store_open succeeded */
  long unclean_pid; /* > 0: the previous process of this dir did not close it (its pid) */

  pthread_rwlock_t lock;  /* restore: exclusive; every other call: shared */
  pthread_mutex_t ckpt_mu; /* one checkpoint creation at a time */
  pthread_mutex_t fence_mu; /* fence and data_dir/FENCE */
  store_fence_t fence;

  /* A RocksDB write failed for lack of space (store__kv_fail said -ENOSPC):
   * the DB may have stopped writing (a background error), so store_resume
   * closes and reopens it once space is back.  reopen_failed: that reopen
   * did not open (db is NULL until the next one does). */
  _Atomic int nospace;
  int reopen_failed;
  /* RocksDB.  db is NULL only after a restore failed to reopen anything, or
   * while a reopen after a full disk has not succeeded yet (reopen_failed). */
  rocksdb_t *db;
  rocksdb_column_family_handle_t *cf[CF_N];
  rocksdb_options_t *dbo; /* the DB's options, also used for every CF */
  rocksdb_block_based_table_options_t *bbto;
  rocksdb_cache_t *cache;
  rocksdb_readoptions_t *ro, *ro_scan;
  rocksdb_writeoptions_t *wo, *wo_sync;

  store_hot_t *hot; /* NULL: no memory tier */
  _Atomic uint64_t hot_hits, kv_reads, lazy_inits, lookup_calls, lookup_rows, write_calls,
      write_rows;
};

/* A row's key in the "rows" column family: 8 bytes big-endian, so that
 * iteration order is numeric key order. */
static inline void key_be(uint64_t k, char out[8]) {
  for (int i = 0; i < 8; i++) out[i] = (char)(uint8_t)(k >> (56 - 8 * i));
}
static inline uint64_t key_from_be(const char *p) {
  uint64_t k = 0;
  for (int i = 0; i < 8; i++) k = k << 8 | (uint8_t)p[i];
  return k;
}

/* store.c */

/* snprintf into why (nothing when why is NULL or why_len 0). */
__attribute__((format(printf, 3, 4))) void store__set_why(char *why, size_t why_len,
                                                          const char *fmt, ...);
/* The one place a RocksDB error string becomes a code: logged, copied into
 * why, freed.  Returns -ENOSPC for RocksDB's "No space left on device" (a
 * full disk: the caller marks the store with store__nospace), else ERR_KV. */
int store__kv_fail(const char *op, char *err, char *why, size_t why_len);
/* rc; when it is -ENOSPC, the store is marked for store_resume. */
int store__nospace(store_t *s, int rc);
/* -ENOSPC with why when the store is so marked (RocksDB takes no writes
 * until reopened: a write answers at once, without RocksDB's error and its
 * log line), else 0. */
int store__stopped(store_t *s, char *why, size_t why_len);
/* [A-Za-z0-9._-]{1,max}, and not "." or ".." (they name directories). */
bool store__valid_name(const char *s, size_t max);
/* "a/b", malloc'ed; NULL when out of memory. */
char *store__path_join(const char *a, const char *b);
/* RocksDB's max_open_files: half the soft fd limit, 64 to 4096. */
int store__open_files_budget(void);
/* Opens db_path with our column families and checks (or writes) the
 * layout.  store__db_close closes it (nothing when it is closed). */
int store__db_open(store_t *s, char *why, size_t why_len);
void store__db_close(store_t *s);
/* Takes the shared lock; fails (lock not held) if a restore left no db. */
int store__enter_shared(store_t *s, char *why, size_t why_len);

/* store_dir.c */

/* Sets s->dir and the paths of its entries; 0 or -ENOMEM (the caller
 * frees what was set). */
int store__dir_paths(store_t *s, const char *data_dir);
typedef char store_ckpt_name_t[CKPT_ID_MAX + 1];

/* [A-Za-z0-9._-]{1,64}, not "." or "..". */
bool store__valid_ckpt_id(const char *id);
/* Whether name is a temporary file of base that a replace left when
 * interrupted: "<base>.tmp.<pid>" (fsio_replace's), or the "<base>.tmp"
 * of earlier versions. */
bool store__is_tmp_of(const char *name, const char *base);
/* Removes dir's temporaries of base (store__is_tmp_of), each logged as
 * `what`; how many were removed. */
int store__remove_tmps(const char *dir, const char *base, const char *what);
/* Whether checkpoint directory dir has its CKPT_META (exists, complete). */
bool store__ckpt_has_meta(const char *dir);
/* Reads checkpoint dir's CKPT_META: 0, ERR_NOTFOUND (no such file: not a
 * complete checkpoint), -EBADMSG (damaged), -errno.  fence (may be NULL)
 * receives the fence the checkpoint was taken under (set = 0 if none). */
int store__ckpt_read_meta(const char *dir, uint64_t *created, uint64_t *bytes,
                          store_fence_t *fence);
/* Creates dir's CKPT_META (fsynced; the caller fsyncs dir).  fence: the
 * fence the checkpoint is taken under (NULL: none). */
int store__ckpt_write_meta(const char *dir, const char *id, uint64_t created, uint64_t bytes,
                           uint64_t layout_hash, const store_fence_t *fence);
/* *data = a malloc'ed copy of checkpoint dir's manifest (non-NULL when
 * empty), *len its size; ERR_NOTFOUND when dir is no complete checkpoint
 * or is not sealed. */
int store__ckpt_read_manifest(const char *dir, void **data, size_t *len);
/* Renames a complete checkpoint dir from checkpoints.tmp/ to its place in
 * checkpoints/, then fsyncs checkpoints/.  0 or -errno. */
int store__ckpt_publish(const char *stage, const char *final);
/* Removes checkpoint directory dir, CKPT_META first (durably); the caller
 * fsyncs the parent. */
int store__ckpt_remove(const char *dir);
/* The names in checkpoints/ that could be checkpoints; *names malloc'ed. */
int store__ckpt_names(const store_t *s, store_ckpt_name_t **names, size_t *n);
/* At open: removes interrupted deletes and seals in checkpoints/ (logged). */
void store__ckpt_sweep(const store_t *s);
/* At open, and after a restore: undoes what an interrupted checkpoint or
 * restore left (db.old/, db.restore/, checkpoints.tmp/). */
int store__recover_leftovers(store_t *s);
/* Total bytes of the regular files in dir. */
uint64_t store__dir_bytes(const char *dir);
/* Builds db dir dst (must not exist) from checkpoint dir src. */
int store__build_db_copy(const char *src, const char *dst);
/* Swaps db/ and db.restore/; *exchanged: 1 by RENAME_EXCHANGE, 0 by the
 * two-rename fallback. */
int store__swap_db(store_t *s, int *exchanged);
/* After a swap whose db does not open: puts the old db back as db/ (what
 * is left, store__recover_leftovers removes). */
void store__swap_back(store_t *s);

/* store_layout.c */

/* Reads the stored layout and compares it with s->layout (ERR_LAYOUT with
 * why saying what differs); writes ours (fsynced) into a fresh db. */
int store__layout_check_or_init(store_t *s, char *why, size_t why_len);
/* Decodes stored layout metadata; ERR_LAYOUT if it is not that.  *l is
 * the caller's to close on success. */
int store__layout_decode(const uint8_t *p, size_t len, table_layout_t *l, uint64_t *hash);

/* store_blob.c */

/* A blob's value, read pinned, as a malloc'ed copy (non-NULL even for 0
 * bytes); v is destroyed.  0 or -ENOMEM. */
int store__blob_copy(rocksdb_pinnableslice_t *v, void **data, size_t *len);

/* store_recover.c */

/* After the data dir lock is taken: notes whether the previous process
 * closed the store (s->unclean_pid) and writes our pid into LOCK. */
void store__lock_claim(store_t *s);
/* The pid that LOCK names (the store holding the dir), 0 if none. */
long store__lock_holder(const store_t *s);
/* Closing after the db is closed: LOCK emptied if it is ours, so the next
 * open knows we closed cleanly; after a failed open, LOCK is put back as
 * it was (an unclean stop stays on record for the next try). */
void store__lock_release(store_t *s);
/* At open, before the db: reads data_dir/FENCE into s->fence; a fence
 * whose checkpoint was taken before a crash is lifted.  ERR_KV with why
 * naming the file and what to do when FENCE is damaged. */
int store__fence_load(store_t *s, char *why, size_t why_len);
/* *f = the fence if it is set for checkpoint id, else f->set = 0. */
void store__fence_of(store_t *s, const char *id, store_fence_t *f);
/* Lifts the fence durably if it is set and (token == 0 or it is the
 * fence of that token).  0 or -errno (the fence then stays). */
int store__fence_lift(store_t *s, uint64_t token, const char *why);
/* At open, after the db: one log line with what the data dir holds. */
void store__log_recovered(store_t *s);
/* Fault injection for the tests: CHANTER_FAULT_STORE_CHECKPOINT=POINT
 * kills this process (SIGKILL, as kill -9 would) when a checkpoint
 * reaches POINT ("staged": made in checkpoints.tmp, no marker yet;
 * "complete": in checkpoints/, its fence not lifted yet). */
void store__fault(const char *point);

#endif
