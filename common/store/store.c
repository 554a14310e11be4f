/*
 * embedding_store: the embedding server's storage engine (see
 * store.h for the API).
 *
 * On disk, data_dir holds:
 *   db/                 the live RocksDB database
 *   LOCK                flock'ed while a store has the dir open; holds the
 *                       owner's pid, emptied by a clean close (store_recover.c)
 *   FENCE               the fence, while one is set (store_recover.c)
 *   checkpoints/<id>/   complete RocksDB checkpoints (+ CHANTER_CHECKPOINT:
 *                       creation time and size, and the fence it was taken
 *                       under if any; + MANIFEST once sealed, and
 *                       MANIFEST.tmp while a seal is being written); nothing
 *                       else appears here.  CHANTER_CHECKPOINT is what makes
 *                       a checkpoint exist: it is the last file created and
 *                       the first one deleted, and a directory without it
 *                       (an interrupted delete) is removed at open
 *   checkpoints.tmp/    checkpoints being built (renamed into checkpoints/
 *                       when complete; leftovers are removed at open)
 *   db.restore/         a restore being built, or the old db after the swap
 *                       (removed at open)
 * RocksDB column families: "default" holds metadata (the layout the dir was
 * created for), "rows" the rows (key: 8-byte big-endian uint64 so iteration
 * order is numeric key order; value: the raw little-endian float32 row),
 * "blobs" named blobs.
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
 * Every RocksDB error string is turned into ERR_KV in kv_fail() and nowhere
 * else.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store_internal.h"
#include "err.h"
#include "le.h"
#include "log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows are stored as raw little-endian float32: port the row encoding first"
#endif

static const char *const cf_names[CF_N] = {"default", "rows", "blobs"};

#define META_LAYOUT_KEY "layout"
#define LAYOUT_FORMAT 1
#define BLOB_NAME_MAX 128
#define DEFAULT_BLOCK_CACHE (64u << 20)

/* ------------------------------------------------------------------ helpers */

__attribute__((format(printf, 3, 4))) static void set_why(char *why, size_t why_len,
                                                          const char *fmt, ...) {
  if (!why || why_len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
}

/* The one place a RocksDB error string becomes a code: logged, copied into
 * why, freed. */
static int kv_fail(const char *op, char *err, char *why, size_t why_len) {
  log_error("rocksdb call failed op=%s error=\"%s\"", op, err ? err : "unknown");
  set_why(why, why_len, "the storage engine failed during %s: %s", op, err ? err : "unknown error");
  rocksdb_free(err);
  return ERR_KV;
}

static inline void key_be(uint64_t k, char out[8]) {
  for (int i = 0; i < 8; i++) out[i] = (char)(uint8_t)(k >> (56 - 8 * i));
}
static inline uint64_t key_from_be(const char *p) {
  uint64_t k = 0;
  for (int i = 0; i < 8; i++) k = k << 8 | (uint8_t)p[i];
  return k;
}

/* [A-Za-z0-9._-]{1,max}, and not "." or ".." (they name directories). */
static bool valid_name(const char *s, size_t max) {
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

static char *path_join(const char *a, const char *b) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", a, b) < 0) return NULL;
  return p;
}

static bool path_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return -ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -errno;
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(path, &st) != 0) return -errno;
  return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf; 0 if path is gone. */
static int remove_tree(const char *path) {
  if (!path_exists(path)) return 0;
  if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) return errno ? -errno : -EIO;
  return 0;
}

static int fsync_path(const char *path, bool dir) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  if (fd < 0) return -errno;
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

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
static uint64_t dir_bytes(const char *dir) {
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

/* Creates or truncates path with len bytes of data, fsynced. */
static int write_file_sync(const char *path, const void *data, size_t len) {
  int rc = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, (const char *)data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      rc = -errno;
      goto out;
    }
    off += (size_t)w;
  }
  if (fsync(fd) != 0) rc = -errno;
out:
  if (close(fd) != 0 && rc == 0) rc = -errno;
  return rc;
}

/* *data = a malloc'ed copy of the whole file (1 byte allocated when empty).
 * Only for files that are replaced by rename, never changed in place, so the
 * size seen at open is the size to read. */
static int read_file(const char *path, void **data, size_t *len) {
  int rc = 0;
  char *buf = NULL;
  struct stat st;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    goto out;
  }
  size_t n = (size_t)st.st_size;
  if (!(buf = malloc(n ? n : 1))) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t off = 0; off < n;) {
    ssize_t r = read(fd, buf + off, n - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = r < 0 ? -errno : -EIO; /* shorter than fstat said: not ours to read */
      goto out;
    }
    off += (size_t)r;
  }
  *data = buf;
  *len = n;
  buf = NULL;
out:
  free(buf);
  close(fd);
  return rc;
}

/* ------------------------------------------------------ checkpoint files */

static bool ckpt_has_meta(const char *dir) {
  char *p = path_join(dir, CKPT_META);
  bool yes = p && path_exists(p);
  free(p);
  return yes;
}

/* Removes checkpoint directory dir so that it is never seen half-removed:
 * CKPT_META goes first and its removal is made durable (listing, restoring
 * and sealing all need it), then the rest.  The caller fsyncs the parent. */
static int ckpt_remove(const char *dir) {
  char *meta = path_join(dir, CKPT_META);
  if (!meta) return -ENOMEM;
  int rc = unlink(meta) == 0 || errno == ENOENT ? 0 : -errno;
  free(meta);
  if (rc == 0) rc = fsync_path(dir, true);
  if (rc == 0) rc = remove_tree(dir);
  return rc;
}

typedef char ckpt_name_t[CKPT_ID_MAX + 1];

/* The names of the directories in checkpoints/ that could be checkpoints
 * (read before anything is removed: removing entries of a directory being
 * read has unspecified effects on readdir).  *names is malloc'ed. */
static int ckpt_names(const store_t *s, ckpt_name_t **names, size_t *n) {
  *names = NULL;
  *n = 0;
  ckpt_name_t *v = NULL;
  size_t cnt = 0, cap = 0;
  int rc = 0;
  DIR *d = opendir(s->ckpt_dir);
  if (!d) return errno == ENOENT ? 0 : -errno;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!valid_name(de->d_name, CKPT_ID_MAX)) continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
      continue;
    if (cnt == cap) {
      size_t nc = cap ? 2 * cap : 8;
      ckpt_name_t *nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        rc = -ENOMEM;
        break;
      }
      v = nv;
      cap = nc;
    }
    size_t len = strlen(de->d_name); /* valid_name: <= CKPT_ID_MAX */
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
 * without CKPT_META) or seal (MANIFEST.tmp) left.  Failures are only logged:
 * such leftovers are never listed or restored, they only take space. */
static void sweep_checkpoints(const store_t *s) {
  ckpt_name_t *names = NULL;
  size_t n = 0;
  int rc = ckpt_names(s, &names, &n);
  if (rc) {
    log_warn("cannot read the checkpoints dir dir=%s error=%s", s->ckpt_dir, strerror(-rc));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char *p = path_join(s->ckpt_dir, names[i]), *tmp = p ? path_join(p, CKPT_MANIFEST_TMP) : NULL;
    if (!p || !tmp) {
      free(p);
      break;
    }
    if (!ckpt_has_meta(p)) {
      log_warn("removing the remains of an interrupted checkpoint delete id=%s path=%s", names[i], p);
      if ((rc = remove_tree(p)))
        log_warn("cannot remove path=%s error=%s", p, strerror(-rc));
    } else if (unlink(tmp) == 0) {
      log_warn("removed the manifest of an interrupted seal id=%s path=%s", names[i], tmp);
    }
    free(tmp);
    free(p);
  }
  free(names);
}

/* ------------------------------------------------------------ key checking */

static int check_key(const store_t *s, size_t i, uint64_t key, char *why, size_t why_len) {
  char buf[256];
  int rc = table_check_key(&s->layout, key, buf, sizeof buf);
  if (rc) {
    set_why(why, why_len, "request index %zu: %s", i, buf);
    return rc;
  }
  if (s->has_shard_map) {
    uint32_t owner = shard_of(&s->shard_map, key);
    if (owner != s->shard) {
      set_why(why, why_len,
              "request index %zu: key %" PRIu64 " (table %u, row %" PRIu64
              ") belongs to embedding server %u, but this is server %u of %u; "
              "the client's shard map differs from this server's",
              i, key, TABLE_ID(key), TABLE_ROW(key), owner, s->shard, s->shard_map.n_servers);
      return ERR_WRONGSHARD;
    }
  }
  return 0;
}

/* Validates every key; off (if given) receives each row's float offset in a
 * packed buffer; *floats the total. */
static int check_keys(const store_t *s, const uint64_t *keys, size_t n, size_t *off,
                      size_t *floats, char *why, size_t why_len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = check_key(s, i, keys[i], why, why_len);
    if (rc) return rc;
    if (off) off[i] = total;
    total += table_row_floats(&s->layout, TABLE_ID(keys[i]));
  }
  *floats = total;
  return 0;
}

/* ---------------------------------------------------------------- metadata */

/* format u32, n_tables u32, seed u64, hash u64, then per table rows u64,
 * dim u32, state_floats u32; all little-endian. */
static uint8_t *layout_encode(const table_layout_t *l, size_t *len) {
  *len = 24 + (size_t)l->n_tables * 16;
  uint8_t *p = malloc(*len);
  if (!p) return NULL;
  put_le32(p, LAYOUT_FORMAT);
  put_le32(p + 4, l->n_tables);
  put_le64(p + 8, l->seed);
  put_le64(p + 16, table_layout_hash(l));
  for (uint32_t t = 0; t < l->n_tables; t++) {
    uint8_t *q = p + 24 + (size_t)t * 16;
    put_le64(q, l->tables[t].rows);
    put_le32(q + 8, l->tables[t].dim);
    put_le32(q + 12, l->tables[t].state_floats);
  }
  return p;
}

/* 0 if the stored layout equals ours, else ERR_LAYOUT with why saying what
 * differs. */
static int layout_compare(const store_t *s, const uint8_t *p, size_t len, char *why,
                          size_t why_len) {
  const table_layout_t *l = &s->layout;
  uint64_t want_hash = table_layout_hash(l);
  if (len < 24 || get_le32(p) != LAYOUT_FORMAT ||
      len != 24 + (size_t)get_le32(p + 4) * 16) {
    set_why(why, why_len,
            "data dir %s holds table layout metadata this version cannot read "
            "(%zu bytes, format %u); use a data dir created by this version",
            s->dir, len, len >= 4 ? get_le32(p) : 0);
    return ERR_LAYOUT;
  }
  uint32_t n = get_le32(p + 4);
  uint64_t seed = get_le64(p + 8), hash = get_le64(p + 16);
  char diff[512] = "";
  if (n != l->n_tables) {
    snprintf(diff, sizeof diff, "it has %u tables, the configuration has %u", n, l->n_tables);
  } else if (seed != l->seed) {
    snprintf(diff, sizeof diff, "its seed is %" PRIu64 ", the configuration's is %" PRIu64, seed,
             l->seed);
  } else {
    for (uint32_t t = 0; t < n; t++) {
      const uint8_t *q = p + 24 + (size_t)t * 16;
      uint64_t rows = get_le64(q);
      uint32_t dim = get_le32(q + 8), st = get_le32(q + 12);
      if (rows != l->tables[t].rows || dim != l->tables[t].dim ||
          st != l->tables[t].state_floats) {
        snprintf(diff, sizeof diff,
                 "its table %u has %" PRIu64 " rows, dim %u, %u state floats; "
                 "the configuration's has %" PRIu64 " rows, dim %u, %u state floats",
                 t, rows, dim, st, l->tables[t].rows, l->tables[t].dim,
                 l->tables[t].state_floats);
        break;
      }
    }
  }
  if (!diff[0] && hash != want_hash)
    snprintf(diff, sizeof diff, "the layout fingerprints differ");
  if (!diff[0]) return 0;
  set_why(why, why_len,
          "data dir %s was created for a different table layout: %s (stored layout hash "
          "%016" PRIx64 ", configured %016" PRIx64 "); start with the job's own data dir "
          "or an empty one",
          s->dir, diff, hash, want_hash);
  return ERR_LAYOUT;
}

/* Reads the stored layout; writes ours (fsynced) into a fresh db. */
static int meta_check_or_init(store_t *s, char *why, size_t why_len) {
  char *err = NULL;
  rocksdb_pinnableslice_t *v = rocksdb_get_pinned_cf(
      s->db, s->ro, s->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY), &err);
  if (err) return kv_fail("reading the layout metadata", err, why, why_len);
  if (v) {
    size_t len;
    const char *p = rocksdb_pinnableslice_value(v, &len);
    int rc = layout_compare(s, (const uint8_t *)p, len, why, why_len);
    rocksdb_pinnableslice_destroy(v);
    return rc;
  }
  size_t len;
  uint8_t *enc = layout_encode(&s->layout, &len);
  if (!enc) return -ENOMEM;
  rocksdb_put_cf(s->db, s->wo_sync, s->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY),
                 (const char *)enc, len, &err);
  free(enc);
  if (err) return kv_fail("writing the layout metadata", err, why, why_len);
  log_info("embedding store initialized dir=%s tables=%u layout_hash=%016" PRIx64, s->dir,
           s->layout.n_tables, table_layout_hash(&s->layout));
  return 0;
}

/* -------------------------------------------------------------- db open/close */

static int open_files_budget(void) {
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
  rocksdb_options_set_max_open_files(o, open_files_budget()); /* table readers stay open */
  rocksdb_options_set_keep_log_file_num(o, 5);           /* RocksDB's own LOG: bounded */
  rocksdb_options_set_max_log_file_size(o, 16u << 20);
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

static void db_close(store_t *s) {
  if (!s->db) return;
  for (int i = 0; i < CF_N; i++) {
    if (s->cf[i]) rocksdb_column_family_handle_destroy(s->cf[i]);
    s->cf[i] = NULL;
  }
  rocksdb_close(s->db);
  s->db = NULL;
}

/* Opens db_path with our column families and checks (or writes) the layout. */
static int db_open(store_t *s, char *why, size_t why_len) {
  char *err = NULL;
  const rocksdb_options_t *cfo[CF_N] = {s->dbo, s->dbo, s->dbo};
  s->db = rocksdb_open_column_families(s->dbo, s->db_path, CF_N, cf_names, cfo, s->cf, &err);
  if (err || !s->db) {
    s->db = NULL;
    memset(s->cf, 0, sizeof s->cf);
    return kv_fail("open", err, why, why_len);
  }
  int rc = meta_check_or_init(s, why, why_len);
  if (rc) db_close(s);
  return rc;
}

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
static int recover_leftovers(store_t *s) {
  int rc = 0;
  char *old = path_join(s->dir, "db.old");
  if (!old) return -ENOMEM;
  if (!path_exists(s->db_path) && path_exists(old)) {
    log_warn("restore was interrupted; rolling back to the previous db dir=%s", s->dir);
    if (rename(old, s->db_path) != 0) rc = -errno;
  }
  if (rc == 0) rc = remove_tree(old);
  if (rc == 0) rc = remove_tree(s->restore_path);
  if (rc == 0 && dir_has_entries(s->ckpt_tmp_dir))
    log_info("removing checkpoints that were being taken when the store was last closed or killed "
             "path=%s: none of them was complete; a retried Checkpoint takes them anew", s->ckpt_tmp_dir);
  if (rc == 0) rc = remove_tree(s->ckpt_tmp_dir);
  free(old);
  return rc;
}

static void store_free(store_t *s) {
  db_close(s);
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
    set_why(why, why_len, "the store needs a data dir and a layout with at least one table");
    return -EINVAL;
  }
  if (o->shard_map && (o->shard_map->n_servers == 0 || o->shard >= o->shard_map->n_servers)) {
    set_why(why, why_len, "shard %u is not an index of a shard map of %u servers", o->shard,
            o->shard_map->n_servers);
    return -EINVAL;
  }
  if (strlen(o->data_dir) > PATH_MAX - 128) {
    set_why(why, why_len, "data dir path is too long (%zu bytes)", strlen(o->data_dir));
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
  s->dir = strdup(o->data_dir);
  s->db_path = path_join(o->data_dir, "db");
  s->ckpt_dir = path_join(o->data_dir, "checkpoints");
  s->ckpt_tmp_dir = path_join(o->data_dir, "checkpoints.tmp");
  s->restore_path = path_join(o->data_dir, "db.restore");
  if (!s->dir || !s->db_path || !s->ckpt_dir || !s->ckpt_tmp_dir || !s->restore_path) {
    rc = -ENOMEM;
    goto out;
  }
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
  if ((rc = mkdir_p(s->dir)) || (rc = mkdir_p(s->ckpt_dir))) {
    set_why(why, why_len, "cannot create data dir %s: %s", s->dir, strerror(-rc));
    goto out;
  }
  char *lock_path = path_join(s->dir, "LOCK");
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
      set_why(why, why_len, "data dir %s is in use by another embedding store (%s%ld): stop it, or "
              "give this server a data dir of its own", s->dir, pid ? "pid " : "this process, pid ",
              pid ? pid : (long)getpid());
    else
      set_why(why, why_len, "cannot lock %s/LOCK: %s; check that this user may write the data dir",
              s->dir, strerror(-rc));
    goto out;
  }
  store__lock_claim(s);
  if ((rc = recover_leftovers(s))) {
    set_why(why, why_len, "cannot clean up an interrupted restore or checkpoint in %s: %s", s->dir,
            strerror(-rc));
    goto out;
  }
  sweep_checkpoints(s);
  if ((rc = store__fence_load(s, why, why_len))) goto out;
  if (o->hot_bytes && (rc = store_hot_create(o->hot_bytes, &s->hot))) goto out;
  if ((rc = options_create(s, o->block_cache_bytes))) goto out;
  if ((rc = db_open(s, why, why_len))) {
    if (rc == ERR_KV && why) {
      size_t n = strnlen(why, why_len);
      set_why(why + n, why_len - n,
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
    if (rc == -ENOMEM) set_why(why, why_len, "out of memory opening the embedding store");
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

const char *store_dir(const store_t *s) { return s->dir; }

/* Takes the shared lock; fails if a restore left no db. */
static int enter_shared(store_t *s, char *why, size_t why_len) {
  pthread_rwlock_rdlock(&s->lock);
  if (s->db) return 0;
  pthread_rwlock_unlock(&s->lock);
  set_why(why, why_len, "the store of %s is unusable after a failed restore; restart the server",
          s->dir);
  return ERR_KV;
}

/* ------------------------------------------------------------ rows */

int store_rows_bytes(store_t *s, const uint64_t *keys, size_t n, size_t *bytes, char *why,
                         size_t why_len) {
  size_t floats = 0;
  int rc = check_keys(s, keys, n, NULL, &floats, why, why_len);
  *bytes = rc ? 0 : floats * sizeof(float);
  return rc;
}

/* One batched MultiGet for the keys keys[idx[0..m)]; found rows are copied
 * to out at their offsets, the others lazily initialized. */
static int kv_read_rows(store_t *s, const uint64_t *keys, const size_t *idx, size_t m,
                        const size_t *off, float *out, store_lookup_info_t *li, char *why,
                        size_t why_len) {
  int rc = 0;
  char *kbuf = malloc(m * 8);
  const char **kp = malloc(m * sizeof *kp);
  size_t *ks = malloc(m * sizeof *ks);
  rocksdb_pinnableslice_t **vals = calloc(m, sizeof *vals);
  char **errs = calloc(m, sizeof *errs);
  if (!kbuf || !kp || !ks || !vals || !errs) {
    rc = -ENOMEM;
    set_why(why, why_len, "out of memory reading %zu rows", m);
    goto out;
  }
  for (size_t j = 0; j < m; j++) {
    key_be(keys[idx[j]], kbuf + 8 * j);
    kp[j] = kbuf + 8 * j;
    ks[j] = 8;
  }
  rocksdb_batched_multi_get_cf(s->db, s->ro, s->cf[CF_ROWS], m, kp, ks, vals, errs, false);
  for (size_t j = 0; j < m; j++) {
    size_t i = idx[j];
    uint64_t key = keys[i];
    if (errs[j]) {
      if (rc == 0)
        rc = kv_fail("multi_get", errs[j], why, why_len);
      else
        rocksdb_free(errs[j]);
      errs[j] = NULL;
    } else if (vals[j]) {
      size_t vlen = 0, want = table_row_bytes(&s->layout, TABLE_ID(key));
      const char *v = rocksdb_pinnableslice_value(vals[j], &vlen);
      if (vlen != want) {
        log_error("stored row has the wrong size key=%" PRIu64 " bytes=%zu expected=%zu", key,
                  vlen, want);
        if (rc == 0) {
          set_why(why, why_len, "stored row of key %" PRIu64 " has %zu bytes, the layout says %zu",
                  key, vlen, want);
          rc = ERR_KV;
        }
      } else {
        memcpy(out + off[i], v, want);
        li->kv_reads++;
      }
    } else {
      table_init_row(&s->layout, key, out + off[i]);
      li->lazy_inits++;
    }
    if (vals[j]) rocksdb_pinnableslice_destroy(vals[j]);
  }
out:
  free(kbuf);
  free(kp);
  free(ks);
  free(vals);
  free(errs);
  return rc;
}

int store_lookup(store_t *s, const uint64_t *keys, size_t n, float *out, size_t out_bytes,
                     int flags, store_lookup_info_t *info, char *why, size_t why_len) {
  store_lookup_info_t li = {0, 0, 0};
  size_t *off = NULL, *miss = NULL;
  uint32_t *ver = NULL, *nf = NULL; /* per key: version seen on a miss, row floats */
  uint8_t *hit = NULL;
  size_t floats = 0, m = 0;
  if (info) *info = li;
  int rc = enter_shared(s, why, why_len);
  if (rc) return rc;
  off = malloc((n ? n : 1) * sizeof *off);
  miss = malloc((n ? n : 1) * sizeof *miss);
  ver = malloc((n ? n : 1) * sizeof *ver);
  if (!off || !miss || !ver) {
    rc = -ENOMEM;
    set_why(why, why_len, "out of memory looking up %zu keys", n);
    goto out;
  }
  if ((rc = check_keys(s, keys, n, off, &floats, why, why_len))) goto out;
  if (floats * sizeof(float) != out_bytes) {
    set_why(why, why_len, "the output buffer has %zu bytes but the %zu keys need %zu", out_bytes, n,
            floats * sizeof(float));
    rc = -EINVAL;
    goto out;
  }
  if (n == 0) goto out;
  bool use_hot = s->hot && !(flags & STORE_LOOKUP_NO_HOT);
  if (use_hot) {
    if (!(nf = malloc(n * sizeof *nf)) || !(hit = malloc(n))) {
      rc = -ENOMEM;
      set_why(why, why_len, "out of memory looking up %zu keys", n);
      goto out;
    }
    for (size_t i = 0; i < n; i++) nf[i] = table_row_floats(&s->layout, TABLE_ID(keys[i]));
    li.hot_hits = store_hot_get_many(s->hot, keys, n, out, off, nf, hit, ver);
    for (size_t i = 0; i < n; i++)
      if (!hit[i]) miss[m++] = i;
  } else {
    for (size_t i = 0; i < n; i++) miss[m++] = i;
  }
  if (m) {
    if ((rc = kv_read_rows(s, keys, miss, m, off, out, &li, why, why_len))) goto out;
    if (use_hot)
      for (size_t j = 0; j < m; j++) {
        size_t i = miss[j];
        store_hot_fill(s->hot, keys[i], out + off[i], nf[i], ver[i]);
      }
  }
  atomic_fetch_add_explicit(&s->lookup_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lookup_rows, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->hot_hits, li.hot_hits, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->kv_reads, li.kv_reads, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lazy_inits, li.lazy_inits, memory_order_relaxed);
  if (info) *info = li;
out:
  pthread_rwlock_unlock(&s->lock);
  free(off);
  free(miss);
  free(ver);
  free(nf);
  free(hit);
  return rc;
}

int store_write(store_t *s, const uint64_t *keys, size_t n, const float *rows,
                    size_t rows_bytes, int flags, char *why, size_t why_len) {
  size_t floats = 0;
  char *err = NULL;
  rocksdb_writebatch_t *wb = NULL;
  int rc = enter_shared(s, why, why_len);
  if (rc) return rc;
  if ((rc = check_keys(s, keys, n, NULL, &floats, why, why_len))) goto out;
  if (floats * sizeof(float) != rows_bytes) {
    size_t need = floats * sizeof(float);
    set_why(why, why_len,
            "rows_bytes is %zu but the %zu keys need %zu bytes (%s by %zu); nothing was written",
            rows_bytes, n, need, rows_bytes < need ? "short" : "over", 
            rows_bytes < need ? need - rows_bytes : rows_bytes - need);
    rc = -EINVAL;
    goto out;
  }
  if (n == 0) goto out;
  if (!(wb = rocksdb_writebatch_create())) {
    rc = -ENOMEM;
    goto out;
  }
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    char k[8];
    size_t nb = table_row_bytes(&s->layout, TABLE_ID(keys[i]));
    key_be(keys[i], k);
    rocksdb_writebatch_put_cf(wb, s->cf[CF_ROWS], k, 8, (const char *)(rows + at), nb);
    at += nb / sizeof(float);
  }
  rocksdb_write(s->db, s->wo, wb, &err);
  if (err) {
    rc = kv_fail("write", err, why, why_len);
    goto out;
  }
  /* after the batch is durable: the memory tier never runs ahead of the WAL */
  if (s->hot) {
    at = 0;
    for (size_t i = 0; i < n; i++) {
      uint32_t nf = table_row_floats(&s->layout, TABLE_ID(keys[i]));
      if (flags & STORE_WRITE_NO_HOT)
        store_hot_drop(s->hot, keys[i]);
      else
        store_hot_upsert(s->hot, keys[i], rows + at, nf);
      at += nf;
    }
  }
  atomic_fetch_add_explicit(&s->write_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->write_rows, n, memory_order_relaxed);
out:
  if (wb) rocksdb_writebatch_destroy(wb);
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

/* ------------------------------------------------------------ checkpoints */

bool store__valid_ckpt_id(const char *id) { return valid_name(id, CKPT_ID_MAX); }

int store__ckpt_read_meta(const char *dir, uint64_t *created, uint64_t *bytes,
                          store_fence_t *fence) {
  char *p = path_join(dir, CKPT_META);
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

/* fence: the fence the checkpoint is taken under (NULL: none). */
static int ckpt_write_meta(const char *dir, const char *id, uint64_t created, uint64_t bytes,
                           uint64_t layout_hash, const store_fence_t *fence) {
  int rc = 0;
  char *p = path_join(dir, CKPT_META);
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

int store_checkpoint(store_t *s, const char *id, store_checkpoint_info_t *info, char *why,
                         size_t why_len) {
  char *final = NULL, *stage = NULL, *err = NULL;
  rocksdb_checkpoint_t *cp = NULL;
  if (!valid_name(id, CKPT_ID_MAX)) {
    set_why(why, why_len,
            "checkpoint id \"%.80s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ - "
            "(not \".\" or \"..\")",
            id ? id : "(null)", CKPT_ID_MAX);
    return -EINVAL;
  }
  int rc = enter_shared(s, why, why_len);
  if (rc) return rc;
  pthread_mutex_lock(&s->ckpt_mu);
  final = path_join(s->ckpt_dir, id);
  stage = path_join(s->ckpt_tmp_dir, id);
  if (!final || !stage) {
    rc = -ENOMEM;
    goto out;
  }
  store_fence_t fence, was;
  uint64_t created = 0, bytes = 0;
  int retried = 0, lifted = 0;
  store__fence_of(s, id, &fence);
  if (path_exists(final) && ckpt_has_meta(final)) {
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
    set_why(why, why_len, "checkpoint \"%s\" already exists in %s; choose another id", id,
            s->ckpt_dir);
    rc = ERR_EXISTS;
    goto out;
  }
  if (path_exists(final)) { /* not a checkpoint: what a failed delete left */
    log_warn("removing the remains of an interrupted checkpoint delete id=%s path=%s", id, final);
    if ((rc = remove_tree(final))) {
      set_why(why, why_len, "cannot remove %s, left by an interrupted delete of checkpoint \"%s\": %s",
              final, id, strerror(-rc));
      goto out;
    }
  }
  if ((rc = mkdir_p(s->ckpt_tmp_dir)) || (rc = remove_tree(stage))) {
    set_why(why, why_len, "cannot prepare %s: %s", s->ckpt_tmp_dir, strerror(-rc));
    goto out;
  }
  cp = rocksdb_checkpoint_object_create(s->db, &err);
  if (err) {
    rc = kv_fail("checkpoint_object_create", err, why, why_len);
    goto out;
  }
  /* log_size_for_flush 0: flush memtables first, so the checkpoint is SSTs */
  rocksdb_checkpoint_create(cp, stage, 0, &err);
  if (err) {
    rc = kv_fail("checkpoint_create", err, why, why_len);
    goto out;
  }
  store__fault("staged");
  created = (uint64_t)time(NULL);
  bytes = dir_bytes(stage);
  if ((rc = ckpt_write_meta(stage, id, created, bytes, table_layout_hash(&s->layout),
                            fence.set ? &fence : NULL)) ||
      (rc = fsync_path(stage, true)) || (rename(stage, final) != 0 && (rc = -errno)) ||
      (rc = fsync_path(s->ckpt_dir, true))) {
    set_why(why, why_len, "cannot finish checkpoint \"%s\" in %s: %s", id, s->ckpt_dir,
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
    if (stage) remove_tree(stage);
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
    if (!valid_name(de->d_name, CKPT_ID_MAX)) continue;
    char *p = path_join(s->ckpt_dir, de->d_name);
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
      memcpy(e->id, de->d_name, strlen(de->d_name)); /* valid_name: <= 64 chars */
      snprintf(e->path, sizeof e->path, "%s", p);
      e->created_unix = created;
      e->bytes = bytes;
      char *m = path_join(p, CKPT_MANIFEST);
      e->sealed = m && path_exists(m);
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

/* Builds dst (must not exist) from checkpoint dir src: SSTs hard-linked
 * (immutable, same file system), everything else copied and fsynced, except
 * our own files (they describe the checkpoint, not the db). */
static int build_db_copy(const char *src, const char *dst) {
  int rc = 0;
  if (mkdir(dst, 0755) != 0) return -errno;
  DIR *d = opendir(src);
  if (!d) return -errno;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, CKPT_META) ||
        !strcmp(de->d_name, CKPT_MANIFEST) || !strcmp(de->d_name, CKPT_MANIFEST_TMP))
      continue;
    char *a = path_join(src, de->d_name), *b = path_join(dst, de->d_name);
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
  if (rc == 0) rc = fsync_path(dst, true);
  return rc;
}

/* Atomically swaps db/ and db.restore/.  *exchanged tells which way it went:
 * 1 = renameat2(RENAME_EXCHANGE) (the old db is now db.restore/), 0 = the
 * two-rename fallback (the old db is now db.old/; a crash between the two
 * renames is rolled back at open by recover_leftovers). */
static int swap_db(store_t *s, int *exchanged) {
  if (renameat2(AT_FDCWD, s->restore_path, AT_FDCWD, s->db_path, RENAME_EXCHANGE) == 0) {
    *exchanged = 1;
  } else {
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -errno;
    *exchanged = 0;
    int rc = 0;
    char *old = path_join(s->dir, "db.old");
    if (!old) return -ENOMEM;
    if (rename(s->db_path, old) != 0 || rename(s->restore_path, s->db_path) != 0) rc = -errno;
    /* the old db moves to db.restore/ like after an exchange; if this fails,
     * recover_leftovers removes db.old/ instead */
    if (rc == 0 && rename(old, s->restore_path) != 0)
      log_warn("cannot move the old db aside path=%s error=%s", old, strerror(errno));
    free(old);
    if (rc) return rc;
  }
  /* the swap is done either way; a failed fsync only weakens crash safety */
  int frc = fsync_path(s->dir, true);
  if (frc) log_warn("cannot fsync data dir after restore dir=%s error=%s", s->dir, strerror(-frc));
  return 0;
}

int store_restore(store_t *s, const char *id, char *why, size_t why_len) {
  int rc = 0;
  char *src = NULL;
  if (!valid_name(id, CKPT_ID_MAX)) {
    set_why(why, why_len,
            "checkpoint id \"%.80s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ -",
            id ? id : "(null)", CKPT_ID_MAX);
    return -EINVAL;
  }
  pthread_rwlock_wrlock(&s->lock);
  if (!(src = path_join(s->ckpt_dir, id))) {
    rc = -ENOMEM;
    goto out;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(src, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      set_why(why, why_len, "there is no checkpoint \"%s\" in %s", id, s->ckpt_dir);
    else
      set_why(why, why_len, "checkpoint \"%s\" in %s is unreadable: %s", id, s->ckpt_dir,
              err_str(rc));
    goto out;
  }
  if ((rc = remove_tree(s->restore_path)) || (rc = build_db_copy(src, s->restore_path))) {
    set_why(why, why_len, "cannot copy checkpoint \"%s\" to %s: %s", id, s->restore_path,
            strerror(-rc));
    remove_tree(s->restore_path);
    goto out;
  }
  /* From here the live db is closed; every way out reopens one. */
  db_close(s);
  int exchanged = 0;
  if ((rc = swap_db(s, &exchanged))) {
    set_why(why, why_len, "cannot move the restored db into place in %s: %s", s->dir,
            strerror(-rc));
    log_error("restore swap failed id=%s dir=%s error=%s", id, s->dir, strerror(-rc));
    recover_leftovers(s);
  } else if ((rc = db_open(s, why, why_len))) {
    /* the checkpoint does not open: put the old db back */
    log_error("restored db does not open; rolling back id=%s dir=%s", id, s->dir);
    if (renameat2(AT_FDCWD, s->restore_path, AT_FDCWD, s->db_path, RENAME_EXCHANGE) != 0) {
      char *old = path_join(s->dir, "db.old");
      if (old && rename(s->db_path, old) == 0) rename(s->restore_path, s->db_path);
      free(old);
    }
    recover_leftovers(s);
  } else {
    recover_leftovers(s); /* removes the old db */
  }
  if (!s->db) {
    char why2[256];
    if (db_open(s, why2, sizeof why2) != 0)
      log_error("store unusable after failed restore dir=%s reason=%s", s->dir, why2);
  }
  if (s->hot) store_hot_clear(s->hot);
  if (rc == 0) log_info("checkpoint restored id=%s dir=%s bytes=%" PRIu64, id, s->dir, bytes);
  if (rc == 0 && (rc = store__fence_lift(s, 0, "the store was restored")))
    set_why(why, why_len, "checkpoint \"%s\" was restored but the fence file in %s cannot be "
            "removed: %s; restore again", id, s->dir, strerror(-rc));
out:
  pthread_rwlock_unlock(&s->lock);
  free(src);
  return rc;
}

/* -EINVAL with the rule an id must follow. */
static int bad_ckpt_id(const char *id, char *why, size_t why_len) {
  set_why(why, why_len,
          "checkpoint id \"%.80s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ - "
          "(not \".\" or \"..\")",
          id ? id : "(null)", CKPT_ID_MAX);
  return -EINVAL;
}

int store_seal_checkpoint(store_t *s, const char *id, const void *manifest, size_t len,
                              char *why, size_t why_len) {
  int rc = 0;
  char *dir = NULL, *tmp = NULL, *fin = NULL;
  if (!valid_name(id, CKPT_ID_MAX)) return bad_ckpt_id(id, why, why_len);
  if (len && !manifest) {
    set_why(why, why_len, "the manifest of checkpoint \"%s\" has %zu bytes but no data", id, len);
    return -EINVAL;
  }
  pthread_rwlock_rdlock(&s->lock);
  pthread_mutex_lock(&s->ckpt_mu); /* not while this checkpoint is created or deleted */
  dir = path_join(s->ckpt_dir, id);
  tmp = dir ? path_join(dir, CKPT_MANIFEST_TMP) : NULL;
  fin = dir ? path_join(dir, CKPT_MANIFEST) : NULL;
  if (!dir || !tmp || !fin) {
    rc = -ENOMEM;
    set_why(why, why_len, "out of memory sealing checkpoint \"%s\"", id);
    goto out;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(dir, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      set_why(why, why_len, "there is no checkpoint \"%s\" in %s to seal; take it first", id,
              s->ckpt_dir);
    else
      set_why(why, why_len, "checkpoint \"%s\" in %s is unreadable: %s", id, s->ckpt_dir,
              err_str(rc));
    goto out;
  }
  /* tmp + fsync + rename + dir fsync: a crash leaves the old manifest or the
   * new one, never a torn one (a stray MANIFEST.tmp is removed at open) */
  if ((rc = write_file_sync(tmp, manifest, len)) || (rename(tmp, fin) != 0 && (rc = -errno)) ||
      (rc = fsync_path(dir, true))) {
    set_why(why, why_len, "cannot write the manifest of checkpoint \"%s\" to %s: %s", id, fin,
            strerror(-rc));
    unlink(tmp);
    goto out;
  }
  log_info("checkpoint sealed id=%s manifest_bytes=%zu path=%s", id, len, fin);
out:
  if (rc && rc != ERR_NOTFOUND)
    log_error("checkpoint seal failed id=%s reason=\"%s\"", id, err_str(rc));
  pthread_mutex_unlock(&s->ckpt_mu);
  pthread_rwlock_unlock(&s->lock);
  free(dir);
  free(tmp);
  free(fin);
  return rc;
}

int store_get_manifest(store_t *s, const char *id, void **data, size_t *len) {
  int rc = 0;
  *data = NULL;
  *len = 0;
  if (!valid_name(id, CKPT_ID_MAX)) return -EINVAL;
  pthread_rwlock_rdlock(&s->lock);
  char *dir = path_join(s->ckpt_dir, id), *fin = dir ? path_join(dir, CKPT_MANIFEST) : NULL;
  if (!dir || !fin) {
    rc = -ENOMEM;
  } else if (!ckpt_has_meta(dir)) {
    rc = ERR_NOTFOUND; /* no checkpoint, or one being deleted */
  } else if ((rc = read_file(fin, data, len)) == -ENOENT) {
    rc = ERR_NOTFOUND; /* not sealed */
  } else if (rc) {
    log_error("cannot read a checkpoint manifest path=%s error=%s", fin, strerror(-rc));
  }
  pthread_rwlock_unlock(&s->lock);
  free(dir);
  free(fin);
  return rc;
}

int store_delete_checkpoint(store_t *s, const char *id, char *why, size_t why_len) {
  int rc = 0;
  if (!valid_name(id, CKPT_ID_MAX)) return bad_ckpt_id(id, why, why_len);
  pthread_rwlock_rdlock(&s->lock);
  pthread_mutex_lock(&s->ckpt_mu); /* not while it is created, sealed or listed */
  char *dir = path_join(s->ckpt_dir, id);
  if (!dir) {
    rc = -ENOMEM;
    set_why(why, why_len, "out of memory deleting checkpoint \"%s\"", id);
    goto out;
  }
  if (!path_exists(dir)) {
    set_why(why, why_len, "there is no checkpoint \"%s\" in %s", id, s->ckpt_dir);
    rc = ERR_NOTFOUND;
    goto out;
  }
  bool complete = ckpt_has_meta(dir);
  if ((rc = ckpt_remove(dir)) || (rc = fsync_path(s->ckpt_dir, true))) {
    set_why(why, why_len, "cannot delete checkpoint \"%s\" in %s: %s; delete it again", id,
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
  const int cfs[] = {CF_ROWS, CF_BLOBS};
  rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
  if (!wb) return -ENOMEM;
  for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++)
    rocksdb_writebatch_delete_range_cf(wb, s->cf[cfs[i]], "", 0, key_space_end,
                                       sizeof key_space_end - 1);
  rocksdb_write(s->db, s->wo_sync, wb, &err);
  rocksdb_writebatch_destroy(wb);
  if (err) return kv_fail("clear (delete range)", err, why, why_len);
  for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
    rocksdb_delete_file_in_range_cf(s->db, s->cf[cfs[i]], NULL, 0, NULL, 0, &err); /* all */
    if (err) {
      log_warn("clear: cannot drop files, their space comes back with compaction cf=%s error=\"%s\"",
               cf_names[cfs[i]], err);
      rocksdb_free(err);
      err = NULL;
    }
    rocksdb_compact_range_cf(s->db, s->cf[cfs[i]], NULL, 0, NULL, 0);
  }
  return 0;
}

int store_clear(store_t *s, int keep_checkpoints, char *why, size_t why_len) {
  int rc = 0;
  ckpt_name_t *names = NULL;
  size_t n = 0, removed = 0;
  pthread_rwlock_wrlock(&s->lock);
  if (!s->db) {
    set_why(why, why_len, "the store of %s is unusable after a failed restore; restart the server",
            s->dir);
    rc = ERR_KV;
    goto out;
  }
  /* checkpoints first: once the live data is gone (what has_rows reports),
   * no checkpoint of it is left either -- unless the caller keeps them */
  if (!keep_checkpoints && (rc = ckpt_names(s, &names, &n))) {
    set_why(why, why_len, "cannot read the checkpoints in %s: %s", s->ckpt_dir, strerror(-rc));
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char *p = path_join(s->ckpt_dir, names[i]);
    rc = p ? ckpt_remove(p) : -ENOMEM;
    free(p);
    if (rc) {
      set_why(why, why_len, "cannot delete checkpoint \"%s\" in %s: %s; rows and blobs were not "
              "cleared yet: clear again", names[i], s->ckpt_dir, strerror(-rc));
      goto out;
    }
    removed++;
  }
  /* no checkpoint is being built (that holds the shared lock): what is in
   * checkpoints.tmp is a crashed build's leftover, never a checkpoint */
  if ((!keep_checkpoints && (rc = fsync_path(s->ckpt_dir, true))) ||
      (rc = remove_tree(s->ckpt_tmp_dir))) {
    set_why(why, why_len, "cannot finish deleting the checkpoints in %s: %s; clear again",
            s->ckpt_dir, strerror(-rc));
    goto out;
  }
  if ((rc = clear_live(s, why, why_len))) goto out;
  if (s->hot) store_hot_clear(s->hot);
  if ((rc = store__fence_lift(s, 0, "the store was cleared"))) {
    set_why(why, why_len, "the store was cleared but the fence file in %s cannot be removed: %s; "
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

/* ------------------------------------------------------------ blobs */

int store_put_blob(store_t *s, const char *name, const void *data, size_t len, char *why,
                       size_t why_len) {
  char *err = NULL;
  if (!valid_name(name, BLOB_NAME_MAX)) {
    set_why(why, why_len,
            "blob name \"%.140s\" is not valid: use 1 to %d characters from A-Z a-z 0-9 . _ -",
            name ? name : "(null)", BLOB_NAME_MAX);
    return -EINVAL;
  }
  if (len && !data) {
    set_why(why, why_len, "blob \"%s\" has %zu bytes but no data", name, len);
    return -EINVAL;
  }
  int rc = enter_shared(s, why, why_len);
  if (rc) return rc;
  rocksdb_put_cf(s->db, s->wo, s->cf[CF_BLOBS], name, strlen(name), len ? data : "", len, &err);
  if (err) rc = kv_fail("put_blob", err, why, why_len);
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

/* A blob's value, read pinned, as a malloc'ed copy (non-NULL even for 0
 * bytes); v is destroyed.  0 or -ENOMEM. */
static int blob_copy(rocksdb_pinnableslice_t *v, void **data, size_t *len) {
  size_t vl = 0;
  const char *p = rocksdb_pinnableslice_value(v, &vl);
  void *copy = malloc(vl ? vl : 1);
  int rc = copy ? 0 : -ENOMEM;
  if (copy) {
    if (vl) memcpy(copy, p, vl);
    *data = copy;
    *len = vl;
  }
  rocksdb_pinnableslice_destroy(v);
  return rc;
}

int store_get_blob(store_t *s, const char *name, void **data, size_t *len) {
  char *err = NULL;
  *data = NULL;
  *len = 0;
  if (!valid_name(name, BLOB_NAME_MAX)) return -EINVAL;
  int rc = enter_shared(s, NULL, 0);
  if (rc) return rc;
  rocksdb_pinnableslice_t *v =
      rocksdb_get_pinned_cf(s->db, s->ro, s->cf[CF_BLOBS], name, strlen(name), &err);
  if (err) {
    rc = kv_fail("get_blob", err, NULL, 0);
  } else if (!v) {
    rc = ERR_NOTFOUND;
  } else {
    rc = blob_copy(v, data, len);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

/* ------------------------------------------------------------ digest, stats */

int store_digest(store_t *s, uint8_t sha256[32], uint8_t set_sha256[32], uint64_t *rows) {
  uint64_t count = 0, lane[4] = {0, 0, 0, 0};
  char *err = NULL;
  /* one row's hash starts as a copy of row_init: a third of the cost per
   * row of EVP_DigestInit_ex, which looks the algorithm up each time */
  EVP_MD_CTX *md = EVP_MD_CTX_new(), *row_md = NULL, *row_init = NULL;
  if (set_sha256) {
    row_md = EVP_MD_CTX_new();
    row_init = EVP_MD_CTX_new();
  }
  int rc = !md || (set_sha256 && (!row_md || !row_init)) ? -ENOMEM : enter_shared(s, NULL, 0);
  if (rc) {
    EVP_MD_CTX_free(md);
    EVP_MD_CTX_free(row_md);
    EVP_MD_CTX_free(row_init);
    return rc;
  }
  /* an iterator reads an implicit snapshot: concurrent writes do not tear it */
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[CF_ROWS]);
  if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
      (row_init && EVP_DigestInit_ex(row_init, EVP_sha256(), NULL) != 1)) {
    rc = -EIO;
    goto out;
  }
  for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    const char *v = rocksdb_iter_value(it, &vl);
    if (kl != 8) {
      log_error("malformed key in rows column family bytes=%zu dir=%s", kl, s->dir);
      rc = ERR_KV;
      goto out;
    }
    uint8_t le[8];
    put_le64(le, key_from_be(k));
    if (EVP_DigestUpdate(md, le, 8) != 1 || EVP_DigestUpdate(md, v, vl) != 1) {
      rc = -EIO;
      goto out;
    }
    if (row_md) {
      /* addition mod 2^64 commutes: the sum does not depend on which server
       * holds which row, nor on the order */
      uint8_t rh[32];
      unsigned int rl = 0;
      if (EVP_MD_CTX_copy_ex(row_md, row_init) != 1 ||
          EVP_DigestUpdate(row_md, le, 8) != 1 || EVP_DigestUpdate(row_md, v, vl) != 1 ||
          EVP_DigestFinal_ex(row_md, rh, &rl) != 1 || rl != 32) {
        rc = -EIO;
        goto out;
      }
      le_lanes_add(lane, rh);
    }
    count++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) {
    rc = kv_fail("digest scan", err, NULL, 0);
    goto out;
  }
  uint8_t h[32];
  unsigned int hl = 0;
  if (EVP_DigestFinal_ex(md, h, &hl) != 1 || hl != 32) {
    rc = -EIO;
    goto out;
  }
  if (sha256) memcpy(sha256, h, 32);
  if (set_sha256)
    le_lanes_put(set_sha256, lane);
  if (rows) *rows = count;
out:
  rocksdb_iter_destroy(it);
  pthread_rwlock_unlock(&s->lock);
  EVP_MD_CTX_free(md);
  EVP_MD_CTX_free(row_md);
  EVP_MD_CTX_free(row_init);
  return rc;
}

int store_has_rows(store_t *s, int *has_rows, int *has_blobs) {
  const int cfs[2] = {CF_ROWS, CF_BLOBS};
  int *out[2] = {has_rows, has_blobs};
  int rc = enter_shared(s, NULL, 0);
  if (rc) return rc;
  for (int i = 0; i < 2 && rc == 0; i++) {
    if (!out[i]) continue;
    char *err = NULL;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_scan, s->cf[cfs[i]]);
    rocksdb_iter_seek_to_first(it);
    *out[i] = rocksdb_iter_valid(it) ? 1 : 0;
    rocksdb_iter_get_error(it, &err);
    if (err) rc = kv_fail("has_rows seek", err, NULL, 0);
    rocksdb_iter_destroy(it);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

void store_stats(store_t *s, store_stats_t *st) {
  memset(st, 0, sizeof *st);
  if (s->hot) {
    store_hot_stats_t hs;
    store_hot_stats(s->hot, &hs);
    st->hot_rows = hs.rows;
    st->hot_bytes = hs.bytes;
    st->hot_capacity_bytes = hs.capacity_bytes;
    st->hot_evictions = hs.evictions;
  }
  st->hot_hits = atomic_load_explicit(&s->hot_hits, memory_order_relaxed);
  st->kv_reads = atomic_load_explicit(&s->kv_reads, memory_order_relaxed);
  st->lazy_inits = atomic_load_explicit(&s->lazy_inits, memory_order_relaxed);
  st->lookup_calls = atomic_load_explicit(&s->lookup_calls, memory_order_relaxed);
  st->lookup_rows = atomic_load_explicit(&s->lookup_rows, memory_order_relaxed);
  st->write_calls = atomic_load_explicit(&s->write_calls, memory_order_relaxed);
  st->write_rows = atomic_load_explicit(&s->write_rows, memory_order_relaxed);
  pthread_rwlock_rdlock(&s->lock);
  if (s->db) {
    uint64_t est = 0;
    if (rocksdb_property_int_cf(s->db, s->cf[CF_ROWS], "rocksdb.estimate-num-keys", &est) == 0)
      st->stored_rows_estimate = est;
  }
  pthread_rwlock_unlock(&s->lock);
}

/* ------------------------------------------------ reading a checkpoint offline */

/* The options differ from the store's on purpose: the reader scans once, in
 * key order, and must write nothing.  Read-only open: no LOCK taken, no
 * info LOG (RocksDB creates none for a read-only db), no OPTIONS file, no
 * flush or compaction; a WAL the checkpoint holds is replayed into a
 * memtable only.  The comparator is the default bytewise one, as in the
 * store, and SST files carry their own table format, so no table options
 * are needed to read them; the scan does not fill the block cache and
 * reads ahead 2 MiB per file. */
struct store_reader_s {
  char *dir;
  rocksdb_t *db;
  rocksdb_column_family_handle_t *cf[CF_N];
  rocksdb_options_t *dbo;
  rocksdb_readoptions_t *ro;
  rocksdb_iterator_t *rows_it; /* created by the first store_reader_next_rows */
  table_layout_t layout;
  uint64_t layout_hash;
};

/* Decodes what layout_encode wrote; ERR_LAYOUT if it is not that (the
 * stored fingerprint must match the decoded layout).  *l is the caller's to
 * close on success. */
static int layout_decode(const uint8_t *p, size_t len, table_layout_t *l, uint64_t *hash) {
  if (len < 24 || get_le32(p) != LAYOUT_FORMAT || get_le32(p + 4) == 0 ||
      len != 24 + (size_t)get_le32(p + 4) * 16)
    return ERR_LAYOUT;
  int rc = table_layout_init(l, get_le32(p + 4), get_le64(p + 8));
  if (rc) return rc == -EINVAL ? ERR_LAYOUT : rc; /* more tables than a layout can have */
  for (uint32_t t = 0; t < l->n_tables; t++) {
    const uint8_t *q = p + 24 + (size_t)t * 16;
    l->tables[t] = (table_info_t){
        .rows = get_le64(q), .dim = get_le32(q + 8), .state_floats = get_le32(q + 12)};
  }
  *hash = get_le64(p + 16);
  if (table_layout_hash(l) != *hash) {
    table_layout_close(l);
    return ERR_LAYOUT;
  }
  return 0;
}

static int reader_read_layout(store_reader_t *r, char *why, size_t why_len) {
  char *err = NULL;
  rocksdb_pinnableslice_t *v = rocksdb_get_pinned_cf(
      r->db, r->ro, r->cf[CF_META], META_LAYOUT_KEY, strlen(META_LAYOUT_KEY), &err);
  if (err) return kv_fail("reading the layout metadata of a checkpoint", err, why, why_len);
  if (!v) {
    set_why(why, why_len, "checkpoint %s holds no table layout metadata; it was not written by "
            "an embedding store", r->dir);
    return ERR_LAYOUT;
  }
  size_t len = 0;
  const char *p = rocksdb_pinnableslice_value(v, &len);
  int rc = layout_decode((const uint8_t *)p, len, &r->layout, &r->layout_hash);
  rocksdb_pinnableslice_destroy(v);
  if (rc == ERR_LAYOUT)
    set_why(why, why_len, "checkpoint %s holds table layout metadata this version cannot read "
            "(%zu bytes); read it with the version that wrote it", r->dir, len);
  return rc;
}

void store_reader_close(store_reader_t *r) {
  if (!r) return;
  if (r->rows_it) rocksdb_iter_destroy(r->rows_it);
  for (int i = 0; i < CF_N; i++)
    if (r->cf[i]) rocksdb_column_family_handle_destroy(r->cf[i]);
  if (r->db) rocksdb_close(r->db);
  if (r->ro) rocksdb_readoptions_destroy(r->ro);
  if (r->dbo) rocksdb_options_destroy(r->dbo);
  table_layout_close(&r->layout);
  free(r->dir);
  free(r);
}

int store_reader_open(const char *checkpoint_dir, store_reader_t **out, char *why,
                      size_t why_len) {
  int rc = 0;
  char *err = NULL;
  store_reader_t *r = NULL;
  *out = NULL;
  if (!checkpoint_dir || !checkpoint_dir[0]) {
    set_why(why, why_len, "no checkpoint directory given");
    return -EINVAL;
  }
  struct stat st;
  int serr = stat(checkpoint_dir, &st) == 0 ? 0 : errno;
  if (serr && serr != ENOENT && serr != ENOTDIR) {
    set_why(why, why_len, "cannot read checkpoint directory %s: %s", checkpoint_dir,
            strerror(serr));
    return -serr;
  }
  if (serr || !S_ISDIR(st.st_mode)) {
    set_why(why, why_len, "there is no checkpoint directory %s", checkpoint_dir);
    return ERR_NOTFOUND;
  }
  uint64_t created = 0, bytes = 0;
  if ((rc = store__ckpt_read_meta(checkpoint_dir, &created, &bytes, NULL))) {
    if (rc == ERR_NOTFOUND)
      set_why(why, why_len, "%s is not a checkpoint: it has no %s file (not a checkpoint "
              "directory, or one whose delete was interrupted)", checkpoint_dir, CKPT_META);
    else
      set_why(why, why_len, "the %s file of checkpoint %s is unreadable: %s", CKPT_META,
              checkpoint_dir, rc == -EBADMSG ? "it lacks created_unix or bytes" : strerror(-rc));
    return rc;
  }
  if (!(r = calloc(1, sizeof *r)) || !(r->dir = strdup(checkpoint_dir)) ||
      !(r->dbo = rocksdb_options_create()) || !(r->ro = rocksdb_readoptions_create())) {
    rc = -ENOMEM;
    set_why(why, why_len, "out of memory opening checkpoint %s", checkpoint_dir);
    goto out;
  }
  rocksdb_options_set_create_if_missing(r->dbo, 0);
  rocksdb_options_set_max_open_files(r->dbo, open_files_budget());
  rocksdb_readoptions_set_fill_cache(r->ro, 0);            /* every block is read once */
  rocksdb_readoptions_set_readahead_size(r->ro, 2u << 20); /* a sequential scan */
  const rocksdb_options_t *cfo[CF_N] = {r->dbo, r->dbo, r->dbo};
  r->db = rocksdb_open_for_read_only_column_families(r->dbo, checkpoint_dir, CF_N, cf_names, cfo,
                                                     r->cf, 0, &err);
  if (err || !r->db) { /* the C API gives a db only on success */
    r->db = NULL;
    memset(r->cf, 0, sizeof r->cf);
    rc = kv_fail("the read-only open of a checkpoint", err, why, why_len);
    goto out;
  }
  if ((rc = reader_read_layout(r, why, why_len))) goto out;
  log_info("checkpoint opened for reading path=%s tables=%u layout_hash=%016" PRIx64
           " created_unix=%" PRIu64 " bytes=%" PRIu64,
           r->dir, r->layout.n_tables, r->layout_hash, created, bytes);
out:
  if (rc) {
    store_reader_close(r);
    return rc;
  }
  *out = r;
  return 0;
}

int store_reader_next_rows(store_reader_t *r, uint64_t *keys, uint8_t *buf, size_t cap,
                           size_t *lens, size_t max, size_t *used) {
  int rc = 0;
  char *err = NULL;
  size_t n = 0, at = 0;
  if (used) *used = 0;
  if (!r || !keys || !lens || !used || max == 0 || (cap && !buf)) return -EINVAL;
  if (max > INT_MAX) max = INT_MAX; /* the count is returned as an int */
  if (!r->rows_it) {
    r->rows_it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[CF_ROWS]);
    rocksdb_iter_seek_to_first(r->rows_it);
  }
  rocksdb_iterator_t *it = r->rows_it;
  /* the iterator moves past a row only once it is copied: a row that does
   * not fit stays next */
  for (; n < max && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    const char *v = rocksdb_iter_value(it, &vl);
    if (kl != 8) {
      log_error("malformed key in a checkpoint's rows bytes=%zu path=%s", kl, r->dir);
      rc = ERR_KV;
      goto out;
    }
    uint64_t key = key_from_be(k);
    uint32_t t = TABLE_ID(key);
    if (t >= r->layout.n_tables || vl != table_row_bytes(&r->layout, t)) {
      log_error("a checkpoint's row does not match its layout key=%" PRIu64 " table=%u bytes=%zu "
                "expected=%zu path=%s", key, t, vl,
                t < r->layout.n_tables ? table_row_bytes(&r->layout, t) : (size_t)0, r->dir);
      rc = ERR_KV;
      goto out;
    }
    if (vl > cap - at) {
      if (n == 0) {
        at = vl; /* what the caller must make room for */
        rc = -ENOBUFS;
      }
      goto out;
    }
    if (vl) memcpy(buf + at, v, vl);
    keys[n] = key;
    lens[n] = vl;
    at += vl;
    n++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) rc = kv_fail("a checkpoint's row scan", err, NULL, 0);
out:
  if (rc == 0 || rc == -ENOBUFS) *used = at;
  return rc ? rc : (int)n;
}

int store_reader_blobs(store_reader_t *r, char ***names, size_t *n) {
  int rc = 0;
  char *err = NULL, **v = NULL;
  size_t cnt = 0, cap = 0;
  *names = NULL;
  *n = 0;
  rocksdb_iterator_t *it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[CF_BLOBS]);
  for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    if (cnt == cap) {
      size_t nc = cap ? 2 * cap : 8;
      char **nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        rc = -ENOMEM;
        goto out;
      }
      v = nv;
      cap = nc;
    }
    if (!(v[cnt] = strndup(k, kl))) {
      rc = -ENOMEM;
      goto out;
    }
    cnt++;
  }
  rocksdb_iter_get_error(it, &err);
  if (err) rc = kv_fail("a checkpoint's blob scan", err, NULL, 0);
out:
  rocksdb_iter_destroy(it);
  if (rc) {
    for (size_t i = 0; i < cnt; i++) free(v[i]);
    free(v);
    return rc;
  }
  if (cnt == 0) {
    free(v);
    v = NULL;
  }
  *names = v;
  *n = cnt;
  return 0;
}

int store_reader_get_blob(store_reader_t *r, const char *name, void **data, size_t *len) {
  char *err = NULL;
  *data = NULL;
  *len = 0;
  if (!valid_name(name, BLOB_NAME_MAX)) return -EINVAL;
  rocksdb_pinnableslice_t *v =
      rocksdb_get_pinned_cf(r->db, r->ro, r->cf[CF_BLOBS], name, strlen(name), &err);
  if (err) return kv_fail("a checkpoint's get_blob", err, NULL, 0);
  if (!v) return ERR_NOTFOUND;
  return blob_copy(v, data, len);
}

int store_reader_manifest(const char *checkpoint_dir, void **data, size_t *len) {
  int rc = 0;
  *data = NULL;
  *len = 0;
  if (!checkpoint_dir || !checkpoint_dir[0]) return -EINVAL;
  char *fin = path_join(checkpoint_dir, CKPT_MANIFEST);
  if (!fin) {
    rc = -ENOMEM;
  } else if (!ckpt_has_meta(checkpoint_dir)) {
    rc = ERR_NOTFOUND; /* not a checkpoint, or one being deleted */
  } else if ((rc = read_file(fin, data, len)) == -ENOENT) {
    rc = ERR_NOTFOUND; /* not sealed */
  } else if (rc) {
    log_error("cannot read a checkpoint manifest path=%s error=%s", fin, strerror(-rc));
  }
  free(fin);
  return rc;
}

uint64_t store_reader_rows_estimate(store_reader_t *r) {
  uint64_t est = 0;
  if (rocksdb_property_int_cf(r->db, r->cf[CF_ROWS], "rocksdb.estimate-num-keys", &est) != 0)
    return 0;
  return est;
}

int store_reader_layout_hash(store_reader_t *r, uint64_t *hash) {
  *hash = r->layout_hash;
  return 0;
}

const table_layout_t *store_reader_layout(const store_reader_t *r) { return &r->layout; }
