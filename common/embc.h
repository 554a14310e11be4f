/*
 * embc: the client of the embedding servers that trainers, the CLI and the
 * benchmarks share.
 *
 * It owns one channel per server (addresses from cluster.embedding, or
 * given), routes every key with the shard map, sends one batched call per
 * server (in parallel when several servers are involved) and puts the rows
 * back in the caller's key order.  Calls carry the layout fingerprint, so a
 * server with another table layout refuses rather than returning rows of the
 * wrong shape.  A server that is briefly unavailable (restarting) is retried
 * with backoff until rpc.timeout_ms; lookups and write-backs are idempotent,
 * so a retry is safe.  A server whose data dir is full (RESOURCE_EXHAUSTED,
 * "No space left on device") is retried with backoff too, for up to
 * embedding.disk_full_timeout_s and EMBC_DISK_FULL_GRACE_MS: then the call
 * fails with -ENOSPC, its sentence naming the server, its data dir and the
 * free space.  (The grace lets a job's oracle, which watches the servers'
 * disks, end the job first, at the timeout, saying why.)  Any call (the
 * admin ones too) may so wait that long.  Thread-safe: several threads
 * may call at once.
 */
#ifndef CHANTER_EMBC_H
#define CHANTER_EMBC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "embedding.pb-c.h"
#include "rpc.h"
#include "shard.h"
#include "table.h"

typedef struct embc_s embc_t;

#define EMBC_DISK_FULL_GRACE_MS 3000

/* Connects to the servers of cfg (cluster.embedding, which must list
 * embedding_servers addresses).  0, or ERR_CONFIG / -errno with err. */
int embc_create(const cfg_t *cfg, embc_t **out, char *err, size_t err_len);
/* The same for n servers at addrs[0..n) (copied), not the configuration's
 * (an embedding server's client of its peers during a Reshape); the rest
 * (layout, shard map for n servers, TLS, limits) from cfg. */
int embc_create_peers(const cfg_t *cfg, uint32_t n, const char *const *addrs, embc_t **out, char *err,
                      size_t err_len);
void embc_destroy(embc_t *c);

const table_layout_t *embc_layout(const embc_t *c);
const shard_map_t *embc_shard_map(const embc_t *c);
uint32_t embc_servers(const embc_t *c);
const char *embc_address(const embc_t *c, uint32_t server);
/* Total packed bytes of the rows of keys (keys must be valid: -ERANGE /
 * -ENOENT with err otherwise). */
int embc_rows_bytes(const embc_t *c, const uint64_t *keys, size_t n, size_t *bytes, char *err, size_t err_len);

/* Rows of keys, packed in key order into out (embc_rows_bytes bytes).
 * 0, or the first server's error with err naming the server. */
int embc_lookup(embc_t *c, const uint64_t *keys, size_t n, float *out, char *err, size_t err_len);
/* Writes rows back; returns once every involved server made them durable. */
int embc_write(embc_t *c, const uint64_t *keys, size_t n, const float *rows, char *err, size_t err_len);
/* The same, tagged: the rows as of the end of iteration done - 1.  A
 * server fenced for the checkpoint of an earlier iteration holds the write
 * back until that checkpoint is taken (embedding.proto: Fence). */
int embc_write_done(embc_t *c, const uint64_t *keys, size_t n, const float *rows, uint64_t done, char *err,
                    size_t err_len);

/* Calls retrying an unavailable server give up (ERR_CANCELLED) before
 * their next try, now and from now on: a daemon that stops.  Any thread. */
void embc_abort(embc_t *c);
/* Calls retry again (a trainer joining the next generation of its job
 * after embc_abort). */
void embc_unabort(embc_t *c);
/* The write epoch every later WriteBack carries (a Step's epoch: the job
 * run's); a server at a later epoch refuses them (its run was rolled
 * back).  0: none.  Any thread. */
void embc_set_write_epoch(embc_t *c, uint64_t epoch);

/* The embedding service's admin calls, typed: one unary call to one
 * server, retrying UNAVAILABLE like the others (embedding.proto says what
 * each does).  0 with *resp set (free it with
 * protobuf_c_message_free_unpacked), or the error with err naming the
 * server.  This is the only place the embedding wire is built. */
#define EMBC_ADMIN_CALLS(X) \
  X(checkpoint, Checkpoint) \
  X(list_checkpoints, ListCheckpoints) \
  X(restore, Restore) \
  X(put_blob, PutBlob) \
  X(get_blob, GetBlob) \
  X(digest, Digest) \
  X(stats, Stats) \
  X(seal_checkpoint, SealCheckpoint) \
  X(get_manifest, GetManifest) \
  X(delete_checkpoint, DeleteCheckpoint) \
  X(fence, Fence) \
  X(clear, Clear) \
  X(reshape, Reshape)
#define EMBC_DECLARE_CALL(lower, Camel)                                                                  \
  int embc_##lower(embc_t *c, uint32_t server, const Chanter__Embedding__V1__##Camel##Request *req,          \
                   Chanter__Embedding__V1__##Camel##Response **resp, char *err, size_t err_len);
EMBC_ADMIN_CALLS(EMBC_DECLARE_CALL)
#undef EMBC_DECLARE_CALL

/* A running job's rows onto the first n of c's servers (n <= embc_servers(c):
 * c lists the old and the new servers, the longer list of the two), server
 * to server: Reshape without move to every server (each takes the map of n
 * servers), then with move to all of them at once, on a thread each (up
 * to 32 at a time: each sends the rows it no longer owns to their owners
 * and deletes them); no row passes through here.  While no trainer
 * writes.  write_epoch: the RestoreRequest's
 * or ClearRequest's that made every server ready (0: none; a server at
 * another epoch refuses, and one moved past it stops).  per (NULL, or embc_servers(c) entries)
 * gets each server's answer (rows_kept: the rows it found it owns while it
 * sent its own, which may count some another server sent it meanwhile),
 * st the sums (seconds: the
 * whole).  0, or the
 * first error with err naming the server. */
typedef struct embc_reshape_stats_s {
  uint64_t rows_moved, bytes_moved, rows_kept;
  double seconds;
} embc_reshape_stats_t;
int embc_reshape_all(embc_t *c, uint32_t n, uint64_t write_epoch, embc_reshape_stats_t *per, embc_reshape_stats_t *st, char *err,
                     size_t err_len);

/* Asks embedding server `server` (Stats, brief: answered without touching
 * its storage) for its incarnation: a random non-zero number drawn when
 * the server process started, so a new value means it was restarted.  One
 * try with a short deadline (EMBC_PROBE_TIMEOUT_MS, or rpc.timeout_ms if
 * shorter), no retry: a probe, e.g. an oracle's once a second.  Returns 0
 * with *incarnation set (0 from a server too old to report one), or
 * ERR_UNAVAILABLE (not listening: down or restarting), ERR_DEADLINE
 * (listening but not answering), another error, with err naming the
 * server.  Any thread. */
#define EMBC_PROBE_TIMEOUT_MS 1000
int embc_incarnation(embc_t *c, uint32_t server, uint64_t *incarnation, char *err, size_t err_len);

/* The same probe, with what else a brief Stats says: whether the server
 * started on a lost disk (StatsResponse.lost_disk) and the checkpoint it
 * restored from its backups then; whether its data dir is full (its
 * writes wait), since when, its free and total bytes, the data dir.
 * Returns as embc_incarnation. */
typedef struct embc_probe_s {
  uint64_t incarnation;
  int lost_disk;
  char restored[80];
  int disk_full;
  double disk_full_since; /* unix seconds */
  uint64_t disk_free_bytes, disk_total_bytes;
  char data_dir[512];
} embc_probe_t;
int embc_probe(embc_t *c, uint32_t server, embc_probe_t *out, char *err, size_t err_len);

#endif
