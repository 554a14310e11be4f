/*
 * pool: a few persistent worker threads that run one function on every
 * thread and wait for all of them (fork-join), for the CPU training step.
 *
 * The model splits a batch into parts and runs them on a pool; trainers
 * and benchmarks can run per-table embedding work on one.  The caller of
 * pool_run is thread 0 and works too.  Which thread runs which share is
 * the function's business: to stay deterministic, make the result of a
 * share independent of the thread that computes it.  Workers sleep on a
 * condition variable between runs.  A pool is driven by one thread at a
 * time.
 */
#ifndef CHANTER_POOL_H
#define CHANTER_POOL_H

#include <stdint.h>

typedef struct pool_s pool_t;

/* fn(arg, tid, n_threads) runs once on each thread, tid in [0, n_threads). */
typedef void (*pool_fn)(void *arg, uint32_t tid, uint32_t n_threads);

/* A pool of n_threads threads in all, the caller's included (n_threads - 1
 * are started; 0 means pool_default_threads()).  0, -ENOMEM or -EAGAIN. */
int pool_create(uint32_t n_threads, pool_t **out);
void pool_destroy(pool_t *p);
uint32_t pool_threads(const pool_t *p);
/* Runs fn on every thread of the pool and returns when all have returned. */
void pool_run(pool_t *p, pool_fn fn, void *arg);
/* Inside a pool_run function only, called by every thread the same number
 * of times: returns once all the pool's threads have called it (a
 * fork-join step inside one run).  No-op on a single-threaded pool. */
void pool_barrier(pool_t *p);
/* The CPUs in this process's affinity mask (at least 1). */
uint32_t pool_default_threads(void);

#endif
