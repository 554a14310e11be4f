/*
 * embedding_backup: the embedding server's backups of its checkpoints
 * (checkpoint.backup_dir) and its start on a lost disk.  The copying is the
 * store's (store_backup.c); this file decides when, on a thread of its own,
 * so that no RPC answer and no training step waits for a backup.
 *
 * At start, before the store opens, embedding_backup_start opens the
 * backup dir; a data dir without a database (empty or missing: the disk
 * was lost, or the server moved to a new host) whose backup dir holds
 * backups gets its checkpoints back, and the server is "on a lost disk"
 * (data_dir/LOST_DISK, kept across restarts) until the oracle rolls the job
 * back (Restore) or clears it (Clear).  While it is, the service answers
 * the calls that serve the job's live rows with UNAVAILABLE and Stats says
 * lost_disk: the oracle's probe rolls the job back.
 *
 * Then embedding_backup_run starts the thread, which first backs up every
 * sealed checkpoint that has no backup yet and drops the backups of
 * checkpoints no longer in the store, and then works, in order, what the
 * RPC replies queue: a backup after SealCheckpoint, a drop after
 * DeleteCheckpoint, every backup dropped after a Clear of the checkpoints.
 */
#ifndef CHANTER_EMBEDDING_BACKUP_H
#define CHANTER_EMBEDDING_BACKUP_H

#include <stdint.h>

#include "cfg.h"
#include "store.h"

typedef struct embedding_backup_s embedding_backup_t;

/* With checkpoint.backup_dir empty: *out = NULL, 0 (backups off).  Else
 * opens <backup_dir> ("%i" = shard) or <backup_dir>/embedding-<shard>, and
 * restores into data_dir as said above (logged).  Call before store_open.
 * 0, or an error with why (the server does not start: its backups would
 * silently stop).  Main thread. */
int embedding_backup_start(const cfg_t *cfg, uint32_t shard, const char *data_dir, embedding_backup_t **out,
                           char *why, size_t why_len);

/* Starts the thread (store must outlive it: embedding_backup_destroy
 * first).  NULL b: no-op.  0 or -errno. */
int embedding_backup_run(embedding_backup_t *b, store_t *store);

/* Stops the thread (a backup under way completes; what is still queued is
 * done at the next start), closes the backup dir.  NULL is a no-op. */
void embedding_backup_destroy(embedding_backup_t *b);

/* Queue: back up sealed checkpoint id; drop id's backup; drop every
 * backup.  NULL b: no-op.  Any thread; they never wait for a backup. */
void embedding_backup_sealed(embedding_backup_t *b, const char *id);
void embedding_backup_deleted(embedding_backup_t *b, const char *id);
void embedding_backup_cleared(embedding_backup_t *b);

/* 1 when checkpoint id has a valid backup (reads its sidecar).  Any
 * thread. */
int embedding_backup_has(embedding_backup_t *b, const char *id);

/* 1 while the server is on a lost disk (*restored: the newest checkpoint
 * it put back, "" if none).  Any thread; NULL b: 0. */
int embedding_backup_lost(const embedding_backup_t *b, const char **restored);

/* The job was rolled back or cleared on this server (after a successful
 * Restore or Clear, on the worker thread that ran it): the lost disk is
 * behind it, LOST_DISK is removed (durably).  NULL b: no-op. */
void embedding_backup_recovered(embedding_backup_t *b, const char *what);

#endif
