/*
 * store_internal: what store.c (rows, checkpoints, blobs) and
 * store_recover.c (the durable fence, start-up after a crash, fault hooks)
 * share.  Not part of the API: nothing outside common/store/ includes it.
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
#include <stdint.h>

#include "store.h"
#include "store_hot.h"

enum { CF_META, CF_ROWS, CF_BLOBS, CF_N };

#define CKPT_META "CHANTER_CHECKPOINT"
/* RocksDB's own manifests are MANIFEST-<number>: these names never clash */
#define CKPT_MANIFEST "MANIFEST"
#define CKPT_MANIFEST_TMP "MANIFEST.tmp"
#define CKPT_ID_MAX 64

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

  /* RocksDB.  db is NULL only after a restore failed to reopen anything. */
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

/* store.c */

/* [A-Za-z0-9._-]{1,64}, not "." or "..". */
bool store__valid_ckpt_id(const char *id);
/* Reads checkpoint dir's CKPT_META: 0, ERR_NOTFOUND (no such file: not a
 * complete checkpoint), -EBADMSG (damaged), -errno.  fence (may be NULL)
 * receives the fence the checkpoint was taken under (set = 0 if none). */
int store__ckpt_read_meta(const char *dir, uint64_t *created, uint64_t *bytes,
                          store_fence_t *fence);

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
