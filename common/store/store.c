/*
 * store: the embedding server's storage engine (see store.h for the API):
 * opening and closing a store, the RocksDB options, and Clear.  The
 * other concerns have files of their own (store_internal.h lists them);
 * the data dir's layout on disk is described in store_dir.c.
 *
 * RocksDB column families: "default" holds metadata (the layout the dir
 * was created for: store_layout.c), "rows" the rows (store_rows.c),
 * "blobs" named blobs (store_blob.c).
 *
 * RocksDB options, chosen for batched point lookups of small fixed-size rows
 * and for a large fraction of lookups that miss (rows never written, lazily
 * initialized):
 *  - Block-based tables with a full (not block-based) bloom filter, 10
 *    bits/key (~1% false positives): a lookup of a never-written key touches
 *    no data block, only filters.  optimize_filters_for_hits is NOT set: it
 *    drops the last level's filters, exactly the ones our misses need.
 *  - One LRU block cache shared by every column family, sized from the
 *    options; index and filter blocks live in it (bounded memory) at high
 *    priority, with L0's pinned, so a point read costs at most one data block.
 *  - No compression: float32 embeddings do not compress, and decompression
 *    would cost CPU on every block read.
 *  - 4 KiB data blocks with the binary-search-and-hash data block index and
 *    a memtable whole-key bloom: the pieces of OptimizeForPointLookup() that
 *    keep iteration (Digest) working.  We do not call
 *    rocksdb_options_optimize_for_point_lookup() because it would replace our
 *    table factory and block cache with its own.
 *  - 64 MiB write buffers, 3 of them: write-backs arrive in large batches;
 *    bigger memtables mean fewer L0 files for reads to probe.  Level
 *    compaction with dynamic level bytes keeps space amplification ~1.1x.
 *  - WAL on (every acknowledged write-back survives a crash); fsync per write
 *    batch when opts.sync_writes; bytes_per_sync smooths SST writes; a WAL
 *    cap makes the rarely written CFs flush so old WAL files can go.
 *  - max_open_files: half the soft fd limit, at most 4096, so table readers
 *    (index + filter handles) stay open without exhausting descriptors.
 *  - create_if_missing + create_missing_column_families: a fresh dir works.
 *  - Checkpoints flush first (log_size_for_flush = 0) so they are mostly
 *    hard-linked SST files and need no WAL replay.
 * Every RocksDB error string is turned into ERR_KV in store__kv_fail() and
 * nowhere else.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store_internal.h"
#include "err.h"
#include "fsio.h"
#include "log.h"

const char *const store__cf_names[CF_N] = {"default", "rows", "blobs"};

#define DEFAULT_BLOCK_CACHE (64u << 20)

/* ------------------------------------------------------------------ helpers */

void store__set_why(char *why, size_t why_len, const char *fmt, ...) {
  if (!why || why_len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
}

/* The one place a RocksDB error string becomes a code (store_internal.h).
 * RocksDB's C API gives only its status as text: a full disk is
 * "IO error: No space left on device: While appending to file: ..." (its
 * IOStatus NoSpace, strerror(ENOSPC) in it), from the write itself or, once
 * a flush failed for lack of space, from the background error every later
 * write returns. */
int store__kv_fail(const char *op, char *err, char *why, size_t why_len) {
  int nospace = err && (strstr(err, "No space left on device") || strstr(err, "NoSpace"));
  log_error("rocksdb call failed op=%s error=\"%s\"", op, err ? err : "unknown");
  store__set_why(why, why_len, "the storage engine failed during %s: %s", op, err ? err : "unknown error");
  rocksdb_free(err);
  return nospace ? -ENOSPC : ERR_KV;
}

int store__stopped(store_t *s, char *why, size_t why_len) {
  if (!atomic_load(&s->nospace)) return 0;
  store__set_why(why, why_len, "the storage engine stopped taking writes when %s filled up (%s) and takes them "
                 "again once the store is reopened, which waits for room", s->dir, strerror(ENOSPC));
  return -ENOSPC;
}

int store__nospace(store_t *s, int rc) {
  if (rc == -ENOSPC && !atomic_exchange(&s->nospace, 1))
    log_warn("embedding store out of disk space dir=%s: RocksDB takes no writes until the store is reopened "
             "(store_resume, once space is back); reads go on", s->dir);
  return rc;
}

bool store__valid_name(const char *s, size_t max) {
  if (!s) return false;
  size_t n = strnlen(s, max + 1);
  if (n == 0 || n > max) return false;
  if (!strcmp(s, ".") || !strcmp(s, "..")) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

char *store__path_join(const char *a, const char *b) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", a, b) < 0) return NULL;
  return p;
}

/* -------------------------------------------------------------- db open/close */

int store__open_files_budget(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 4096;
  rlim_t half = rl.rlim_cur / 2;
  return half < 64 ? 64 : half > 4096 ? 4096 : (int)half;
}

static int options_create(store_t *s, size_t block_cache_bytes) {
  s->cache = rocksdb_cache_create_lru(block_cache_bytes ? block_cache_bytes : DEFAULT_BLOCK_CACHE);
  s->bbto = rocksdb_block_based_options_create();
  s->dbo = rocksdb_options_create();
  s->ro = rocksdb_readoptions_create();
  s->ro_scan = rocksdb_readoptions_create();
  s->wo = rocksdb_writeoptions_create();
  s->wo_sync = rocksdb_writeoptions_create();
  if (!s->cache || !s->bbto || !s->dbo || !s->ro || !s->ro_scan || !s->wo || !s->wo_sync)
    return -ENOMEM;

  rocksdb_block_based_options_set_block_cache(s->bbto, s->cache);
  /* full-filter bloom, 10 bits/key: misses (never-written rows) skip data blocks */
  rocksdb_block_based_options_set_filter_policy(s->bbto, rocksdb_filterpolicy_create_bloom_full(10));
  rocksdb_block_based_options_set_whole_key_filtering(s->bbto, 1); /* point keys, no prefixes */
  /* index/filter blocks in the bounded cache, high priority, L0's pinned */
  rocksdb_block_based_options_set_cache_index_and_filter_blocks(s->bbto, 1);
  rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(s->bbto, 1);
  rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(s->bbto, 1);
  rocksdb_block_based_options_set_block_size(s->bbto, 4096); /* one page per point read */
  /* hash index inside data blocks: O(1) seek in the block, binary search kept for iterators */
  rocksdb_block_based_options_set_data_block_index_type(
      s->bbto, rocksdb_block_based_table_data_block_index_type_binary_search_and_hash);
  rocksdb_block_based_options_set_data_block_hash_ratio(s->bbto, 0.75);
  rocksdb_block_based_options_set_format_version(s->bbto, 5); /* faster full filters */

  rocksdb_options_t *o = s->dbo;
  rocksdb_options_set_create_if_missing(o, 1);              /* a fresh data dir just works */
  rocksdb_options_set_create_missing_column_families(o, 1); /* "rows"/"blobs" on first open */
  rocksdb_options_set_block_based_table_factory(o, s->bbto);
  rocksdb_options_set_compression(o, rocksdb_no_compression); /* floats don't compress; CPU */
  rocksdb_options_set_write_buffer_size(o, 64u << 20);   /* big write-back batches, few L0 files */
  rocksdb_options_set_max_write_buffer_number(o, 3);     /* keep accepting writes while flushing */
  rocksdb_options_set_max_total_wal_size(o, 512u << 20); /* flush idle CFs so old WALs go */
  rocksdb_options_set_memtable_whole_key_filtering(o, 1); /* bloom in the memtable too... */
  rocksdb_options_set_memtable_prefix_bloom_size_ratio(o, 0.02); /* ...sized 2% of it */
  rocksdb_options_set_level_compaction_dynamic_level_bytes(o, 1); /* ~1.1x space amp */
  rocksdb_options_set_max_background_jobs(o, 4);         /* flush + compaction in parallel */
  rocksdb_options_set_bytes_per_sync(o, 1u << 20);       /* no fsync storms on SST writes */
  rocksdb_options_set_max_open_files(o, store__open_files_budget()); /* table readers stay open */
  rocksdb_options_set_keep_log_file_num(o, 5);           /* RocksDB's own LOG: bounded */
  rocksdb_options_set_max_log_file_size(o, 16u << 20);
  /* RocksDB's LOG holds fatal lines only: Debian's RocksDB 7.8 is built with
   * assertions, and a second line into a LOG whose append failed (a full
   * disk) aborts the process (WritableFileWriter's "sync_without_flush_called_").
   * Every RocksDB error a call meets is in our log (store__kv_fail). */
  rocksdb_options_set_info_log_level(o, 4); /* FATAL_LEVEL */
  /* WAL: on by default and never disabled here; sync per request below */
  rocksdb_writeoptions_set_sync(s->wo, (unsigned char)(s->sync_writes != 0));
  rocksdb_writeoptions_set_sync(s->wo_sync, 1); /* metadata: always durable */
  rocksdb_readoptions_set_fill_cache(s->ro_scan, 0); /* a full scan must not evict hot blocks */
  return 0;
}

static void options_destroy(store_t *s) {
  if (s->wo_sync) rocksdb_writeoptions_destroy(s->wo_sync);
  if (s->wo) rocksdb_writeoptions_destroy(s->wo);
  if (s->ro_scan) rocksdb_readoptions_destroy(s->ro_scan);
  if (s->ro) rocksdb_readoptions_destroy(s->ro);
  if (s->dbo) rocksdb_options_destroy(s->dbo);
  if (s->bbto) rocksdb_block_based_options_destroy(s->bbto);
  if (s->cache) rocksdb_cache_destroy(s->cache);
}

void store__db_close(store_t *s) {
  if (!s->db) return;
  for (int i = 0; i < CF_N; i++) {
    if (s->cf[i]) rocksdb_column_family_handle_destroy(s->cf[i]);
    s->cf[i] = NULL;
  }
  rocksdb_close(s->db);
  s->db = NULL;
}

int store__db_open(store_t *s, char *why, size_t why_len) {
  char *err = NULL;
  const rocksdb_options_t *cfo[CF_N] = {s->dbo, s->dbo, s->dbo};
  s->db = rocksdb_open_column_families(s->dbo, s->db_path, CF_N, store__cf_names, cfo, s->cf, &err);
  if (err || !s->db) {
    s->db = NULL;
    memset(s->cf, 0, sizeof s->cf);
    return store__kv_fail("open", err, why, why_len);
  }
  int rc = store__layout_check_or_init(s, why, why_len);
  if (rc) store__db_close(s);
  return rc;
}

static void store_free(store_t *s) {
  store__db_close(s);
  store__lock_release(s); /* after the db: LOCK then says the dir was closed */
  options_destroy(s);
  store_hot_destroy(s->hot);
  table_layout_close(&s->layout);
  if (s->has_shard_map) shard_map_close(&s->shard_map);
  pthread_rwlock_destroy(&s->lock);
  pthread_mutex_destroy(&s->ckpt_mu);
  pthread_mutex_destroy(&s->fence_mu);
  if (s->lock_fd >= 0) close(s->lock_fd);
  free(s->dir);
  free(s->db_path);
  free(s->ckpt_dir);
  free(s->ckpt_tmp_dir);
  free(s->restore_path);
  free(s);
}

int store_open(const store_opts_t *o, store_t **out, char *why, size_t why_len) {
  int rc = 0;
  *out = NULL;
  if (!o || !o->data_dir || !o->data_dir[0] || !o->layout || o->layout->n_tables == 0) {
    store__set_why(why, why_len, "the store needs a data dir and a layout with at least one table");
    return -EINVAL;
  }
  if (o->shard_map && (o->shard_map->n_servers == 0 || o->shard >= o->shard_map->n_servers)) {
    store__set_why(why, why_len, "shard %u is not an index of a shard map of %u servers", o->shard,
                   o->shard_map->n_servers);
    return -EINVAL;
  }
  if (strlen(o->data_dir) > PATH_MAX - 128) {
    store__set_why(why, why_len, "data dir path is too long (%zu bytes)", strlen(o->data_dir));
    return -ENAMETOOLONG;
  }
  store_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  /* a restore must not starve behind a steady stream of lookups */
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&s->lock, &ra);
  pthread_rwlockattr_destroy(&ra);
  pthread_mutex_init(&s->ckpt_mu, NULL);
  pthread_mutex_init(&s->fence_mu, NULL);
  s->lock_fd = -1;
  s->sync_writes = o->sync_writes;
  s->shard = o->shard;
  if ((rc = store__dir_paths(s, o->data_dir))) goto out;
  if ((rc = table_layout_copy(&s->layout, o->layout))) goto out;
  if (o->shard_map) {
    s->shard_map = *o->shard_map;
    s->shard_map.table_server = malloc((o->shard_map->n_tables ? o->shard_map->n_tables : 1) *
                                       sizeof(uint32_t));
    if (!s->shard_map.table_server) {
      rc = -ENOMEM;
      goto out;
    }
    memcpy(s->shard_map.table_server, o->shard_map->table_server,
           o->shard_map->n_tables * sizeof(uint32_t));
    s->has_shard_map = 1;
  }
  if ((rc = fsio_mkdir_p(s->dir, NULL, 0)) || (rc = fsio_mkdir_p(s->ckpt_dir, NULL, 0))) {
    store__set_why(why, why_len, "cannot create data dir %s: %s", s->dir, strerror(-rc));
    goto out;
  }
  char *lock_path = store__path_join(s->dir, "LOCK");
  if (!lock_path) {
    rc = -ENOMEM;
    goto out;
  }
  s->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  free(lock_path);
  if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
    long pid = rc == -EBUSY ? store__lock_holder(s) : 0;
    if (rc == -EBUSY)
      store__set_why(why, why_len, "data dir %s is in use by another embedding store (%s%ld): stop it, or "
                     "give this server a data dir of its own", s->dir, pid ? "pid " : "this process, pid ",
                     pid ? pid : (long)getpid());
    else
      store__set_why(why, why_len, "cannot lock %s/LOCK: %s; check that this user may write the data dir",
                     s->dir, strerror(-rc));
    goto out;
  }
  store__lock_claim(s);
  if ((rc = store__recover_leftovers(s))) {
    store__set_why(why, why_len, "cannot clean up an interrupted restore or checkpoint in %s: %s", s->dir,
                   strerror(-rc));
    goto out;
  }
  store__ckpt_sweep(s);
  if ((rc = store__fence_load(s, why, why_len))) goto out;
  if (o->hot_bytes && (rc = store_hot_create(o->hot_bytes, &s->hot))) goto out;
  if ((rc = options_create(s, o->block_cache_bytes))) goto out;
  if ((rc = store__db_open(s, why, why_len))) {
    if (rc == ERR_KV && why) {
      size_t n = strnlen(why, why_len);
      store__set_why(why + n, why_len - n,
                     "; the database in %s does not open: if RocksDB names a damaged or missing file "
                     "above, move %s aside and start again (an empty live store; the checkpoints in "
                     "%s stay, so the job can resume from one)", s->db_path, s->db_path, s->ckpt_dir);
    }
    goto out;
  }

  uint64_t est = 0;
  rocksdb_property_int_cf(s->db, s->cf[CF_ROWS], "rocksdb.estimate-num-keys", &est);
  log_info("embedding store opened dir=%s tables=%u shard=%u servers=%u stored_rows_estimate=%" PRIu64
           " hot_bytes=%zu block_cache_bytes=%zu sync_writes=%d",
           s->dir, s->layout.n_tables, s->shard, s->has_shard_map ? s->shard_map.n_servers : 1, est,
           o->hot_bytes, o->block_cache_bytes ? o->block_cache_bytes : (size_t)DEFAULT_BLOCK_CACHE,
           s->sync_writes);
  store__log_recovered(s);
  s->open_done = 1;
out:
  if (rc) {
    if (rc == -ENOMEM) store__set_why(why, why_len, "out of memory opening the embedding store");
    store_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void store_close(store_t *s) {
  if (!s) return;
  log_info("embedding store closed dir=%s", s->dir);
  store_free(s);
}

int store__enter_shared(store_t *s, char *why, size_t why_len) {
  pthread_rwlock_rdlock(&s->lock);
  if (s->db) return 0;
  int reopening = s->reopen_failed;
  pthread_rwlock_unlock(&s->lock);
  if (reopening) {
    store__set_why(why, why_len, "the store of %s is closed until it reopens after its disk was full (%s); "
                   "it reopens by itself once there is space", s->dir, strerror(ENOSPC));
    return -ENOSPC;
  }
  store__set_why(why, why_len, "the store of %s is unusable after a failed restore; restart the server",
                 s->dir);
  return ERR_KV;
}

/* ------------------------------------------------------------ a full disk */

/* Bytes of the write-ahead logs in db/: what a reopen replays and flushes
 * into a table file (uncompressed rows: about as large). */
static uint64_t wal_bytes(const store_t *s) {
  uint64_t n = 0;
  DIR *d = opendir(s->db_path);
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    struct stat st;
    if (l < 5 || strcmp(de->d_name + l - 4, ".log")) continue;
    if (fstatat(dirfd(d), de->d_name, &st, 0) == 0) n += (uint64_t)st.st_size;
  }
  closedir(d);
  return n;
}

int store_space(store_t *s, store_space_t *out) {
  struct statvfs v;
  memset(out, 0, sizeof *out);
  out->nospace = atomic_load(&s->nospace);
  if (statvfs(s->dir, &v) != 0) return -errno;
  out->free_bytes = (uint64_t)v.f_bavail * v.f_frsize;
  out->total_bytes = (uint64_t)v.f_blocks * v.f_frsize;
  if (out->nospace) out->need_bytes = wal_bytes(s) + STORE_RESUME_MARGIN;
  return 0;
}

/* Why a close and an open, not a resume: RocksDB 7.8's C API has no
 * rocksdb_resume, and without an SstFileManager RocksDB does not recover
 * from a NoSpace background error by itself.  Nothing acknowledged is lost:
 * every acknowledged write is in the write-ahead log (the write that failed
 * was not acknowledged; what of it reached the log's tail is a torn record
 * that point-in-time recovery stops at).  The open replays the logs and
 * flushes them into a table file, which is why it waits for their size in
 * free space: an open that still fails leaves the logs as they were, and
 * the next call tries again.  The memory tier stays: it only ever holds
 * rows that were in the log. */
int store_resume(store_t *s, int *reopened, char *why, size_t why_len) {
  store_space_t sp;
  *reopened = 0;
  if (!atomic_load(&s->nospace)) return 0;
  int rc = store_space(s, &sp);
  if (rc) {
    store__set_why(why, why_len, "cannot read the free space of %s: %s", s->dir, strerror(-rc));
    return rc;
  }
  if (sp.free_bytes < sp.need_bytes) {
    store__set_why(why, why_len, "%s has %.1f MiB free; reopening the store needs %.1f MiB (its write-ahead "
                   "logs and a margin)", s->dir, sp.free_bytes / 1048576.0, sp.need_bytes / 1048576.0);
    return -ENOSPC;
  }
  pthread_rwlock_wrlock(&s->lock);
  store__db_close(s);
  rc = store__db_open(s, why, why_len);
  s->reopen_failed = rc != 0;
  if (!rc) atomic_store(&s->nospace, 0);
  pthread_rwlock_unlock(&s->lock);
  if (rc) {
    log_error("embedding store does not reopen after a full disk dir=%s reason=\"%s\": the next try comes "
              "later; the write-ahead logs are kept", s->dir, why ? why : err_str(rc));
    return rc == ERR_KV ? -ENOSPC : rc;
  }
  log_info("embedding store reopened after a full disk dir=%s free_mb=%.1f: it takes writes again", s->dir,
           sp.free_bytes / 1048576.0);
  *reopened = 1;
  return 0;
}

/* ------------------------------------------------------------ clear */

/* Every key of the "rows" and "blobs" column families sorts before this: row
 * keys are 8 bytes, blob names are ASCII. */
static const char key_space_end[] = "\xff\xff\xff\xff\xff\xff\xff\xff\xff";

/* Why clear is a range delete and not a drop and re-create of the column
 * families: one WriteBatch holding a DeleteRange per column family makes
 * "every row and blob gone" a single atomic, fsynced step (dropping two
 * column families is two steps a crash can split), and it costs the same
 * for a thousand rows or a billion.  The space then comes back in two
 * steps that change nothing visible, because the range tombstone already
 * hides everything: DeleteFilesInRange drops every SST file of levels 1 and
 * below without reading it (the bulk of a big table), and CompactRange
 * rewrites only what is left -- memtables and level-0 files, bounded by the
 * write buffers -- so later reads and Digest scans do not step over
 * tombstones.  A failure in those two only costs space: logged, not
 * returned. */
static int clear_live(store_t *s, char *why, size_t why_len) {
  char *err = NULL;
  int rc = store__stopped(s, why, why_len);
  if (rc) return rc;
  const int cfs[] = {CF_ROWS, CF_BLOBS};
  rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
  if (!wb) return -ENOMEM;
  for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++)
    rocksdb_writebatch_delete_range_cf(wb, s->cf[cfs[i]], "", 0, key_space_end,
                                       sizeof key_space_end - 1);
  rocksdb_write(s->db, s->wo_sync, wb, &err);
  rocksdb_writebatch_destroy(wb);
  if (err) return store__nospace(s, store__kv_fail("clear (delete range)", err, why, why_len));
  for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
    rocksdb_delete_file_in_range_cf(s->db, s->cf[cfs[i]], NULL, 0, NULL, 0, &err); /* all */
    if (err) {
      log_warn("clear: cannot drop files, their space comes back with compaction cf=%s error=\"%s\"",
               store__cf_names[cfs[i]], err);
      rocksdb_free(err);
      err = NULL;
    }
    rocksdb_compact_range_cf(s->db, s->cf[cfs[i]], NULL, 0, NULL, 0);
  }
  return 0;
}

int store_clear(store_t *s, int keep_checkpoints, char *why, size_t why_len) {
  int rc = 0;
  store_ckpt_name_t *names = NULL;
  size_t n = 0, removed = 0;
  pthread_rwlock_wrlock(&s->lock);
  if (!s->db) {
    store__set_why(why, why_len, "the store of %s is unusable after a failed restore; restart the server",
                   s->dir);
    rc = ERR_KV;
    goto out;
  }
  /* checkpoints first: once the live data is gone (what has_rows reports),
   * no checkpoint of it is left either -- unless the caller keeps them */
  if (!keep_checkpoints && (rc = store__ckpt_names(s, &names, &n))) {
    store__set_why(why, why_len, "cannot read the checkpoints in %s: %s", s->ckpt_dir, strerror(-rc));
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char *p = store__path_join(s->ckpt_dir, names[i]);
    rc = p ? store__ckpt_remove(p) : -ENOMEM;
    free(p);
    if (rc) {
      store__set_why(why, why_len, "cannot delete checkpoint \"%s\" in %s: %s; rows and blobs were not "
                     "cleared yet: clear again", names[i], s->ckpt_dir, strerror(-rc));
      goto out;
    }
    removed++;
  }
  /* no checkpoint is being built (that holds the shared lock): what is in
   * checkpoints.tmp is a crashed build's leftover, never a checkpoint */
  if ((!keep_checkpoints && (rc = fsio_fsync_path(s->ckpt_dir, true, NULL, 0))) ||
      (rc = fsio_remove_tree(s->ckpt_tmp_dir, NULL, 0))) {
    store__set_why(why, why_len, "cannot finish deleting the checkpoints in %s: %s; clear again",
                   s->ckpt_dir, strerror(-rc));
    goto out;
  }
  if ((rc = clear_live(s, why, why_len))) goto out;
  if (s->hot) store_hot_clear(s->hot);
  if ((rc = store__fence_lift(s, 0, "the store was cleared"))) {
    store__set_why(why, why_len, "the store was cleared but the fence file in %s cannot be removed: %s; "
                   "clear again", s->dir, strerror(-rc));
    goto out;
  }
  log_info("embedding store cleared dir=%s checkpoints_deleted=%zu keep_checkpoints=%d", s->dir,
           removed, keep_checkpoints != 0);
out:
  if (rc) log_error("clear failed dir=%s reason=\"%s\"", s->dir, err_str(rc));
  pthread_rwlock_unlock(&s->lock);
  free(names);
  return rc;
}
