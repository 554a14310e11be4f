/*
 * embedding_disk: an embedding server whose data dir is full.
 *
 * A full disk is not the caller's failure.  A call whose work met -ENOSPC
 * (a write-back, a checkpoint's flush, a seal, the fence or epoch file)
 * writes nothing and is answered RESOURCE_EXHAUSTED with the sentence
 * embedding_disk_full() makes: this server, its data dir, the free space,
 * and strerror(ENOSPC), which the clients look for (they wait and retry:
 * embc.c).  The server is then disk-full (Stats says so, for the oracle's
 * probe; two gauges).  While it is, a timer reads the space every second;
 * once the data dir has what store_resume() needs, the store is reopened
 * on a worker thread (RocksDB stopped taking writes at its NoSpace error)
 * and the mark goes.  Everything here runs on the loop thread, but the
 * reopen (the worker pool).
 */
#ifndef CHANTER_EMBEDDING_DISK_H
#define CHANTER_EMBEDDING_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "metrics.h"
#include "store.h"

typedef struct embedding_disk_s {
  uv_loop_t *loop;
  store_t *store;
  uint32_t shard;
  double full_since;   /* unix seconds; 0: not full */
  store_space_t space; /* the last statvfs of the data dir */
  uv_timer_t timer;
  int timer_open, resuming, stopping;
  metrics_gauge_t *g_full, *g_free; /* chanter_embedding_disk_full, _disk_free_bytes {shard} */
} embedding_disk_t;

/* Reads the space, registers the gauges (reg may be NULL) and starts the
 * once-a-second timer (unreferenced: it keeps no loop alive). */
void embedding_disk_init(embedding_disk_t *d, uv_loop_t *loop, store_t *store, uint32_t shard,
                         metrics_registry_t *reg);

/* A call of `method` met -ENOSPC: the server is disk-full from now on
 * (logged once), and why (the store's words) becomes the sentence the
 * caller gets.  Returns 1 when it was disk-full already (the caller need
 * not log the refusal again), else 0. */
int embedding_disk_full(embedding_disk_t *d, const char *method, char *why, size_t why_len);

/* Closes the timer: after the loop ran, before its last run (which
 * completes the close).  A reopen on the pool still finishes. */
void embedding_disk_stop(embedding_disk_t *d);

#endif
