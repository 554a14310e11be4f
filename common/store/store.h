/*
 * embedding_store: the embedding server's storage engine.
 *
 * One store holds this server's shard of the embedding tables: every row
 * ever written back lives durably in RocksDB (column family "rows", key =
 * the 8-byte big-endian uint64 key, value = the raw little-endian float32
 * row: vector then optimizer state); the hot rows are also kept in an
 * in-memory tier in front of it (a lock-striped hash table with CLOCK
 * eviction, bounded by a byte budget).  A row never written is initialized
 * on read with table_init_row() and is not stored.  Checkpoints are RocksDB
 * checkpoints under data_dir/checkpoints/<id>; small named blobs (dense
 * state, trainer cache contents) live in the column family "blobs".  A
 * checkpoint is "sealed" once the oracle stored its manifest next to it
 * (store_seal_checkpoint): the manifest is what makes this server's
 * checkpoint part of a whole-job checkpoint, so an unsealed one may belong
 * to a job checkpoint that never completed.
 *
 * There is no RPC here: the daemon calls this API from its libuv worker
 * threads.  Unless a comment says otherwise, every function may be called
 * from any number of threads at once; store_restore() and store_clear()
 * exclude all the others for their duration (they wait), and store_close()
 * must be called once, after every other call has returned.
 *
 * Errors: 0 or a negative code (err.h): -EINVAL / -ENOENT / -ERANGE /
 * ERR_WRONGSHARD for bad requests, ERR_KV for RocksDB failures (the RocksDB
 * message is logged), -ENOSPC for a full disk (below), ERR_LAYOUT,
 * ERR_NOTFOUND, ERR_EXISTS, -ENOMEM, -errno for file-system failures.  Functions taking `why` fill it (if non-NULL)
 * with a sentence a person can act on whenever they fail.
 */
#ifndef CHANTER_STORE_H
#define CHANTER_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"
#include "table.h"

typedef struct store_s store_t;

/* The fence (embedding.proto Fence): write-backs of iterations after
 * `iteration` wait until checkpoint `id` is taken.  The embedding service
 * parks them; the store keeps the fence durably (data_dir/FENCE) so that a
 * server killed before that checkpoint comes back with it. */
typedef struct store_fence_s {
  int set;            /* 0: no fence (the other fields are then zero) */
  char id[65];        /* the checkpoint it waits for */
  uint64_t iteration; /* write-backs with done > iteration + 1 wait */
  uint64_t token;     /* random, chosen by store_fence_set: the checkpoint taken
                         under this fence records it */
} store_fence_t;

typedef struct store_opts_s {
  const char *data_dir;            /* created if missing; holds db/ and checkpoints/ */
  const table_layout_t *layout;      /* copied */
  const shard_map_t *shard_map;    /* NULL = this server owns every key; else copied */
  uint32_t shard;                  /* this server's index in shard_map */
  size_t hot_bytes;                /* memory-tier budget (0 = no memory tier) */
  size_t block_cache_bytes;        /* RocksDB block cache (0 = a default of 64 MiB) */
  int sync_writes;                 /* 1: store_write fsyncs the WAL before returning;
                                      0: WAL written, not fsynced (survives a process
                                      crash, not a machine crash) */
} store_opts_t;

/* Opens (creating if missing) the store in o->data_dir.  A data dir created
 * for another layout is refused with ERR_LAYOUT and `why` says what differs.
 * After a crash or kill -9: RocksDB replays its write-ahead log (every
 * acknowledged write is back), what an interrupted checkpoint, delete, seal
 * or restore left is removed or rolled back, the fence is restored (and
 * lifted if its checkpoint was already taken), and one log line says what
 * the dir holds.  A damaged FENCE file or database is refused (ERR_KV) with
 * `why` naming the file and what to do.
 * On success *out is the caller's, to be released with store_close().
 * Any thread; one store per data dir (RocksDB locks it: a second open of the
 * same dir fails with ERR_KV). */
int store_open(const store_opts_t *o, store_t **out, char *why, size_t why_len);

/* Flushes nothing extra (the WAL already holds every acknowledged write),
 * closes RocksDB and frees everything.  NULL is a no-op.  Call once, when no
 * other call on s is running. */
void store_close(store_t *s);

/* Validates keys (unknown table -ENOENT, row out of range -ERANGE, key of
 * another shard ERR_WRONGSHARD; `why` names the index and the key) and sets
 * *bytes to the total packed row bytes the keys need (sum of
 * table_row_bytes of each key's table).  n == 0 gives 0.  Any thread. */
int store_rows_bytes(store_t *s, const uint64_t *keys, size_t n, size_t *bytes, char *why,
                         size_t why_len);

/* Lookup flags. */
enum { STORE_LOOKUP_NO_HOT = 1 }; /* bypass the memory tier (benchmarks of raw RocksDB) */

typedef struct store_lookup_info_s {
  uint64_t hot_hits;   /* keys served by the memory tier */
  uint64_t kv_reads;   /* keys found in RocksDB */
  uint64_t lazy_inits; /* keys never written, initialized with table_init_row */
} store_lookup_info_t;

/* Fills out (packed rows in key order, each table_row_floats of its table):
 * memory tier first, then one batched rocksdb_multi_get_cf for the misses,
 * then lazy initialization for keys never written (not stored).  Rows read
 * from RocksDB or initialized enter the memory tier (unless
 * STORE_LOOKUP_NO_HOT).  out_bytes must equal store_rows_bytes() of the
 * keys, else -EINVAL.  Keys are validated first; on any error nothing is
 * guaranteed about out.  info may be NULL.  n == 0 is a no-op.  Duplicate
 * keys are allowed.  Any thread. */
int store_lookup(store_t *s, const uint64_t *keys, size_t n, float *out, size_t out_bytes,
                     int flags, store_lookup_info_t *info, char *why, size_t why_len);

/* Write flags. */
enum { STORE_WRITE_NO_HOT = 1 }; /* do not touch the memory tier (benchmarks of raw RocksDB);
                                  a cached copy of a written key is dropped, never stale */

/* All-or-nothing: validates every key and that rows_bytes equals the sum of
 * row sizes (else -EINVAL / -ENOENT / -ERANGE / ERR_WRONGSHARD and nothing
 * is written), then one RocksDB WriteBatch (WAL fsynced if opts.sync_writes),
 * then upserts the memory tier.  0 = durable in the WAL.  If a key appears
 * twice, the later row wins.  n == 0 is a no-op.  Any thread; concurrent
 * writes of the same key are ordered by RocksDB, and the memory tier may
 * then keep either value -- callers (the oracle) never write one key from
 * two places at once. */
int store_write(store_t *s, const uint64_t *keys, size_t n, const float *rows,
                    size_t rows_bytes, int flags, char *why, size_t why_len);

typedef struct store_checkpoint_info_s {
  char id[65];
  char path[4096];       /* data_dir/checkpoints/<id> */
  uint64_t created_unix; /* seconds since the epoch */
  uint64_t bytes;        /* total size of the checkpoint's files (at creation) */
  int sealed;            /* 1: a manifest is stored (store_seal_checkpoint) */
  int fence_lifted;      /* store_checkpoint: the fence of this id was lifted */
  int retried;           /* store_checkpoint: it had been taken already, under its
                            fence (a call retried after a restart) */
  int backed_up;         /* not the store's: set by whoever keeps its backups
                            (store_backup_has) */
} store_checkpoint_info_t;

/* A consistent RocksDB checkpoint (every write acknowledged before the call
 * started is in it) into data_dir/checkpoints/<id>.  id: [A-Za-z0-9._-]{1,64}
 * and not "." or "..", else -EINVAL.  It is built in checkpoints.tmp/ and
 * renamed into place with its CHANTER_CHECKPOINT marker, so a crash leaves
 * either no checkpoint (the leftovers go at the next open, and calling
 * again takes it) or a complete one.  If the fence is set for id, the
 * checkpoint records it and the fence is lifted (durably) once the
 * checkpoint is complete.  An existing id -> ERR_EXISTS, except a
 * checkpoint taken under a fence of its id (the oracle's, whose ids are
 * reused only after store_delete_checkpoint): then the call is a retry
 * whose answer was lost, answered 0 with that checkpoint (info->retried) --
 * unless a newer fence of the same id is set.  info may be NULL.  Any
 * thread (concurrent with lookups and writes). */
int store_checkpoint(store_t *s, const char *id, store_checkpoint_info_t *info, char *why,
                         size_t why_len);

/* Every complete checkpoint, sorted by id, `sealed` set when it has a
 * manifest.  A checkpoint being deleted is never listed.  *list is malloc'ed
 * (NULL when *n == 0); the caller frees it.  Any thread. */
int store_list_checkpoints(store_t *s, store_checkpoint_info_t **list, size_t *n);

/* Seals checkpoint id: stores manifest (len bytes, opaque to the store: the
 * oracle's description of the whole-job checkpoint) as
 * data_dir/checkpoints/<id>/MANIFEST, atomically (fsio_replace: written to
 * MANIFEST.tmp.<pid>, fsynced, renamed, directory fsynced): after a crash the old manifest or
 * the new one is there, never a torn one.  Sealing again overwrites.  A bad
 * id -> -EINVAL, no such checkpoint -> ERR_NOTFOUND, -errno for file-system
 * failures.  Any thread. */
int store_seal_checkpoint(store_t *s, const char *id, const void *manifest, size_t len,
                              char *why, size_t why_len);

/* *data = a malloc'ed copy of checkpoint id's manifest (the caller frees it;
 * an empty manifest gives a non-NULL 1-byte allocation), *len its size.
 * ERR_NOTFOUND if the checkpoint does not exist or is not sealed, -EINVAL for
 * a bad id.  Any thread. */
int store_get_manifest(store_t *s, const char *id, void **data, size_t *len);

/* Deletes checkpoint id.  Its CHANTER_CHECKPOINT file goes first (and that
 * is fsynced), so a crash part-way leaves a directory that is never listed
 * and is removed at the next open; then the directory.  A bad id -> -EINVAL,
 * no such checkpoint -> ERR_NOTFOUND; the remains of a delete that failed
 * part-way are removed and give 0, so a retry succeeds.  A retry of a
 * delete that did complete (its answer lost) gets ERR_NOTFOUND: the
 * checkpoint is gone either way.  Any thread. */
int store_delete_checkpoint(store_t *s, const char *id, char *why, size_t why_len);

/* Removes every row, every blob and (unless keep_checkpoints) every
 * checkpoint, lifts the fence and empties the memory tier; the layout
 * metadata stays, so the data dir still belongs to the same job (`chanter
 * train --fresh`).  The
 * checkpoints go first, then the live rows and blobs in one atomic, fsynced
 * write: once has_rows and has_blobs say 0 after a clear nothing of the old
 * data is left (but the kept checkpoints), and a clear that failed part-way
 * can simply be run again.  keep_checkpoints != 0 leaves data_dir/checkpoints
 * as it is: every checkpoint stays listed, sealed and restorable (resharding
 * reads them back with store_reader_open).  Its cost does not grow with the
 * number of rows (see store.c's clear_live).  Excludes every other call for its
 * duration. */
int store_clear(store_t *s, int keep_checkpoints, char *why, size_t why_len);

/* *has_rows = 1 if at least one row is stored (written, not lazily
 * initialized), else 0; *has_blobs likewise for blobs; either pointer may be
 * NULL.  Cheap: one iterator seek per column family.  Any thread. */
int store_has_rows(store_t *s, int *has_rows, int *has_blobs);

/* Replaces the live data by checkpoint id (rows and blobs), clears the
 * memory tier, lifts the fence.  Unknown id -> ERR_NOTFOUND.  Excludes every other call for
 * its duration.  Crash-safe: the new db is built in a temporary directory
 * and renamed into place; the old one is kept until the rename is done.  On
 * a failure after the live db was closed the store tries to reopen the old
 * db; if even that fails every later call returns ERR_KV. */
int store_restore(store_t *s, const char *id, char *why, size_t why_len);

/* Stores a named blob (overwrites; durable per opts.sync_writes).  name:
 * [A-Za-z0-9._-]{1,128}, else -EINVAL.  Any thread. */
int store_put_blob(store_t *s, const char *name, const void *data, size_t len, char *why,
                       size_t why_len);

/* *data = a malloc'ed copy (the caller frees it; a zero-length blob gives a
 * non-NULL 1-byte allocation), *len its size.  ERR_NOTFOUND if missing,
 * -EINVAL for a bad name.  Any thread. */
int store_get_blob(store_t *s, const char *name, void **data, size_t *len);

/* sha256: SHA-256 over every stored row in key order: for each, the key as
 * 8 bytes little-endian then the row bytes.  It depends on how the rows are
 * split across servers.
 * set_sha256: a digest of the set of rows that does not: for each stored
 * row h = SHA-256(key as 8 bytes little-endian || row bytes), read as four
 * little-endian uint64 lanes; set_sha256 is the lane-wise sum of every
 * row's h modulo 2^64, written as four little-endian uint64 (all zero for
 * no rows).  Summing the servers' set_sha256 lane-wise gives the same value
 * for any sharding of the same rows, so jobs on clusters of different sizes
 * can be compared.
 * *rows = the number of stored rows.  Lazily initialized rows that were
 * never written are not included.  Any out pointer may be NULL (a NULL
 * set_sha256 also skips the per-row hashing).  Any thread (reads a
 * consistent snapshot). */
int store_digest(store_t *s, uint8_t sha256[32], uint8_t set_sha256[32], uint64_t *rows);

typedef struct store_stats_s {
  uint64_t hot_rows, hot_bytes, hot_capacity_bytes, hot_hits, hot_evictions;
  uint64_t kv_reads, lazy_inits, lookup_calls, lookup_rows, write_calls, write_rows;
  uint64_t stored_rows_estimate; /* RocksDB's rocksdb.estimate-num-keys of "rows" */
} store_stats_t;

/* A snapshot of the counters (each read atomically; not a consistent cut).
 * Any thread. */
void store_stats(store_t *s, store_stats_t *st);

/* ------------------------------------------------------------ reshape
 *
 * A running server onto another count of servers (embedding.proto
 * Reshape; store_reshape.c), while no client writes. */

/* Replaces the shard map (copied; it must have the layout's tables) and
 * this server's index in it; shard >= m->n_servers owns no key (a server a
 * scale-down removes).  From then on keys are checked against it.
 * Excludes every other call; call it while no client looks rows up
 * (store_rows_bytes reads the map without the lock).  0, -EINVAL, -ENOMEM. */
int store_set_shard_map(store_t *s, const shard_map_t *m, uint32_t shard, char *why, size_t why_len);

/* The stored rows from key *from on that this server does not own under
 * its shard map, in key order, as store_reader_next_rows gives them
 * (keys, lens, packed in buf, *used bytes): up to max of them, as many as
 * fit in cap.  *from becomes the key the next call starts at
 * (STORE_SCAN_END once the scan reached the last row: a call then gives
 * 0).  Returns the number, -ENOBUFS (cap cannot hold the next row: *used
 * is its size, *from that row), ERR_KV.  *owned (may be NULL): the rows
 * this call passed over because the server owns them (each counted once
 * over the calls of one scan).  Any thread. */
#define STORE_SCAN_END UINT64_MAX
int store_foreign_rows(store_t *s, uint64_t *from, uint64_t *keys, uint8_t *buf, size_t cap, size_t *lens,
                       size_t max, size_t *used, uint64_t *owned);

/* Deletes the rows of keys (one WriteBatch; the memory tier drops them).
 * Keys are not checked against the shard map.  Any thread. */
int store_delete_rows(store_t *s, const uint64_t *keys, size_t n, char *why, size_t why_len);

/* ------------------------------------------------------------ a full disk
 *
 * A write that fails for lack of space (RocksDB's "No space left on
 * device", also while a checkpoint flushes; a file of our own) returns
 * -ENOSPC with `why` saying so, and nothing of it is acknowledged.  RocksDB
 * then takes no writes (its background error; reads go on) until
 * store_resume() reopens it, which it does once the data dir has the room
 * the reopen needs.  Every acknowledged write survives (the write-ahead
 * log). */

/* free space a reopen needs beyond the write-ahead logs' bytes */
#define STORE_RESUME_MARGIN (4u << 20)

typedef struct store_space_s {
  uint64_t free_bytes, total_bytes; /* statvfs of the data dir: available to us, and the whole */
  uint64_t need_bytes;              /* when nospace: what store_resume waits for */
  int nospace;                      /* a RocksDB write failed for lack of space; not reopened since */
} store_space_t;

/* The data dir's space and whether the store waits to be reopened.  0 or
 * -errno (statvfs).  Any thread. */
int store_space(store_t *s, store_space_t *out);

/* When the store is marked (a RocksDB write met a full disk) and the data
 * dir has need_bytes free: closes RocksDB and opens it again (excluding
 * every other call, as store_restore does) so that it takes writes again;
 * *reopened = 1.  0 with *reopened = 0: nothing to do.  -ENOSPC: not
 * enough space yet, or the open failed (logged; calls then answer -ENOSPC
 * until a later store_resume opens it).  Any thread. */
int store_resume(store_t *s, int *reopened, char *why, size_t why_len);

/* The data dir (owned by s, valid until close).  Any thread. */
const char *store_dir(const store_t *s);

/* Sets the fence for checkpoint id (a valid checkpoint id, else -EINVAL)
 * at iteration, replacing any other, durably: data_dir/FENCE written to a
 * temporary file, fsynced, renamed, the dir fsynced, whatever
 * opts.sync_writes says.  The same id and iteration again keeps the fence
 * as it is.  It is lifted by store_checkpoint(id), store_clear and
 * store_restore, and survives a crash until then.  0 or -errno (the old
 * fence then stays).  Any thread. */
int store_fence_set(store_t *s, const char *id, uint64_t iteration, char *why, size_t why_len);

/* *f = the fence as stored (f->set = 0 if none).  No I/O.  Any thread. */
void store_fence_get(store_t *s, store_fence_t *f);

/* ------------------------------------------------ reading a checkpoint offline
 *
 * A store_reader_t reads one checkpoint (the directory
 * data_dir/checkpoints/<id> that store_checkpoint() made) straight from
 * disk, with no store open and no server running: what `chanter` needs to
 * move a whole-job checkpoint onto another number of embedding servers.
 * The RocksDB checkpoint is opened read-only: no lock is taken, no LOG,
 * OPTIONS or any other file is written, a WAL the checkpoint holds is
 * replayed in memory only.  The directory, its listing and every file's
 * bytes and mtime are the same after reading, and any number of readers may
 * read one checkpoint at once, also while a store serves its data dir.  It
 * lives here, with the store, because it reads exactly what the store writes
 * (the row key encoding, the column families, the layout metadata, the
 * checkpoint's own files).  One reader is used by one thread at a time. */
typedef struct store_reader_s store_reader_t;

/* Opens checkpoint_dir read-only.  A missing directory or one that is not a
 * complete checkpoint (no CHANTER_CHECKPOINT file) -> ERR_NOTFOUND; a
 * checkpoint RocksDB cannot open -> ERR_KV with RocksDB's message in why;
 * table layout metadata missing or unreadable -> ERR_LAYOUT.  why (if
 * non-NULL) says what to do whenever it fails.  On success *out is the
 * caller's, to be released with store_reader_close(). */
int store_reader_open(const char *checkpoint_dir, store_reader_t **out, char *why,
                      size_t why_len);

/* NULL is a no-op. */
void store_reader_close(store_reader_t *r);

/* The next stored rows in key order (each key once; rows never written are
 * not stored, so never returned): up to max rows, as many as fit in cap
 * bytes.  keys[i] is the i-th row's key, lens[i] its size in bytes (the
 * table_row_bytes of its table: raw little-endian float32, vector then
 * optimizer state), and the rows are packed back to back in buf, row i at
 * the sum of lens[0..i); *used = the bytes filled.  Returns the number of
 * rows (at most max and at most INT_MAX), 0 once every row was returned, or
 * a negative error: -EINVAL (max == 0 or a NULL pointer), -ENOBUFS if cap
 * cannot hold even the next row (*used is then the bytes that row needs;
 * nothing is consumed, so a call with a larger buf goes on), ERR_KV for a
 * damaged checkpoint (a key that is not 8 bytes, a row whose size does not
 * match the layout, a RocksDB read error; logged). */
int store_reader_next_rows(store_reader_t *r, uint64_t *keys, uint8_t *buf, size_t cap,
                           size_t *lens, size_t max, size_t *used);

/* *names = every blob name in name order, *n their number: a malloc'ed array
 * of malloc'ed strings; the caller frees both (*names is NULL when
 * *n == 0). */
int store_reader_blobs(store_reader_t *r, char ***names, size_t *n);

/* As store_get_blob(): *data a malloc'ed copy (a non-NULL 1-byte allocation
 * when empty), *len its size; ERR_NOTFOUND if missing, -EINVAL for a bad
 * name. */
int store_reader_get_blob(store_reader_t *r, const char *name, void **data, size_t *len);

/* *data = a malloc'ed copy of the MANIFEST that sealed checkpoint_dir (as
 * store_get_manifest() gives it), *len its size; ERR_NOTFOUND if
 * checkpoint_dir is not a checkpoint or is not sealed.  Needs no reader. */
int store_reader_manifest(const char *checkpoint_dir, void **data, size_t *len);

/* RocksDB's estimate of the number of stored rows
 * (rocksdb.estimate-num-keys of "rows"), 0 if unknown: for sizing buffers
 * and progress, not for counting. */
uint64_t store_reader_rows_estimate(store_reader_t *r);

/* *hash = table_layout_hash() of the layout the checkpoint was written for
 * (what clients send as layout_hash).  Returns 0. */
int store_reader_layout_hash(store_reader_t *r, uint64_t *hash);

/* That layout itself (owned by r, valid until store_reader_close()). */
const table_layout_t *store_reader_layout(const store_reader_t *r);

/* ------------------------------------------------------ backups of checkpoints
 *
 * A store_backup_t keeps copies of sealed checkpoints in a backup dir
 * (checkpoint.backup_dir: another disk or host), with RocksDB's
 * BackupEngine: incremental (an SST already backed up is not copied
 * again), one sidecar per checkpoint (backup_dir/<id>.checkpoint: its
 * CHANTER_CHECKPOINT, its MANIFEST and the engine's backup id) written
 * only once the backup is verified.  store_backup.c has the format.  Every
 * call may come from any thread; they run one at a time (a mutex).  One
 * process per backup dir: the engine does not lock it. */
typedef struct store_backup_s store_backup_t;

typedef struct store_backup_info_s {
  char id[65];
  uint32_t backup_id;     /* the engine's */
  int already;            /* backed up before (nothing copied; the sidecar kept or,
                             after a new seal, rewritten) */
  uint32_t files;         /* the backup's files and bytes (the engine's BackupInfo) */
  uint64_t bytes;
  uint64_t files_copied;  /* what this backup added to the backup dir; the rest */
  uint64_t bytes_copied;  /* (bytes - bytes_copied) was shared with earlier ones */
  double seconds;
} store_backup_info_t;

typedef struct store_backup_entry_s {
  char id[65];
  uint32_t backup_id;
} store_backup_entry_t;

typedef struct store_backup_restored_s {
  size_t backups;   /* valid sidecars found */
  size_t restored;  /* checkpoints now in data_dir/checkpoints (restored, or there already) */
  size_t failed;    /* sidecars whose backup could not be restored (logged) */
  char newest[65];  /* the newest restored checkpoint ("" if none) */
} store_backup_restored_t;

/* Opens (creating if missing) the backup dir.  0, or ERR_KV / -errno with
 * why.  *out is the caller's (store_backup_close). */
int store_backup_open(const char *backup_dir, store_backup_t **out, char *why, size_t why_len);
/* Waits for a running call.  NULL is a no-op. */
void store_backup_close(store_backup_t *b);
const char *store_backup_dir(const store_backup_t *b);

/* Backs up sealed checkpoint id of store s: its directory opened
 * read-only, a new engine backup, verified, then the sidecar.  Logs the
 * backup id, files and bytes copied and reused, and the seconds.  A
 * checkpoint backed up already is not copied again (info->already).
 * ERR_NOTFOUND: no such checkpoint, not sealed, or deleted meanwhile (then
 * no sidecar is written); ERR_KV: the engine failed.  Concurrent with
 * every store call; what it reads is immutable once sealed. */
int store_backup_checkpoint(store_backup_t *b, store_t *s, const char *id, store_backup_info_t *info, char *why,
                            size_t why_len);

/* Every valid sidecar, oldest backup first (*list malloc'ed, NULL when
 * *n == 0).  A damaged or truncated sidecar is logged and left out. */
int store_backup_list(store_backup_t *b, store_backup_entry_t **list, size_t *n);

/* 1 when checkpoint id has a valid sidecar.  Reads one small file; no log. */
int store_backup_has(store_backup_t *b, const char *id);

/* Removes id's sidecar (id NULL: every sidecar), then purges the engine's
 * backups older than the oldest one a sidecar still names (all of them
 * when none is left).  A missing sidecar is no error. */
int store_backup_drop(store_backup_t *b, const char *id, char *why, size_t why_len);

/* Restores every backed-up checkpoint into data_dir/checkpoints/<id> (not
 * open by a store: call it before store_open), each verified, restored into
 * checkpoints.tmp/<id>, given its MANIFEST and CHANTER_CHECKPOINT from the
 * sidecar and renamed into place; one already there is kept.  Each is
 * logged; one that fails is logged and counted in r->failed, and the
 * others go on.  0 (r says what was done), or an error reading the backup
 * dir. */
int store_backup_restore(store_backup_t *b, const char *data_dir, store_backup_restored_t *r, char *why,
                         size_t why_len);

#endif
