/*
 * pool: fork-join worker threads (see pool.h).  One mutex and two
 * condition variables: a run bumps a generation number and broadcasts,
 * each worker runs the function once per generation, the last one to
 * finish signals the caller.  Wake-up costs some microseconds, small
 * against the millisecond-long phases of a training step.
 */
#include "pool.h"
#include "proc.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

typedef struct worker_s {
  pool_t *p;
  uint32_t tid;
  pthread_t th;
} worker_t;

struct pool_s {
  uint32_t n;
  worker_t *w; /* w[1..n-1] */
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  uint64_t gen;
  uint32_t pending;
  int stop;
  pool_fn fn;
  void *arg;
  /* pool_barrier: threads arrived in this round, and the round number */
  pthread_mutex_t bmu;
  pthread_cond_t bcv;
  uint32_t barrived;
  uint64_t bround;
};

uint32_t pool_default_threads(void) {
  cpu_set_t set;
  int n = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  return n < 1 ? 1 : (uint32_t)n;
}

static void *worker_main(void *arg) {
  proc_name_thread("model-pool");
  worker_t *w = arg;
  pool_t *p = w->p;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (p->gen == seen && !p->stop) pthread_cond_wait(&p->cv_work, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->gen;
    pool_fn fn = p->fn;
    void *a = p->arg;
    pthread_mutex_unlock(&p->mu);
    fn(a, w->tid, p->n);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    pthread_mutex_unlock(&p->mu);
  }
}

static void stop_workers(pool_t *p, uint32_t started) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  for (uint32_t t = 1; t < started; t++) pthread_join(p->w[t].th, NULL);
}

int pool_create(uint32_t n_threads, pool_t **out) {
  *out = NULL;
  if (n_threads == 0) n_threads = pool_default_threads();
  pool_t *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  p->n = n_threads;
  p->w = calloc(n_threads, sizeof(worker_t));
  if (!p->w) {
    free(p);
    return -ENOMEM;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  pthread_mutex_init(&p->bmu, NULL);
  pthread_cond_init(&p->bcv, NULL);
  for (uint32_t t = 1; t < n_threads; t++) {
    p->w[t].p = p;
    p->w[t].tid = t;
    if (pthread_create(&p->w[t].th, NULL, worker_main, &p->w[t]) != 0) {
      stop_workers(p, t);
      p->n = 1;
      pool_destroy(p);
      return -EAGAIN;
    }
  }
  *out = p;
  return 0;
}

void pool_destroy(pool_t *p) {
  if (!p) return;
  if (p->n > 1) stop_workers(p, p->n);
  pthread_cond_destroy(&p->bcv);
  pthread_mutex_destroy(&p->bmu);
  pthread_cond_destroy(&p->cv_done);
  pthread_cond_destroy(&p->cv_work);
  pthread_mutex_destroy(&p->mu);
  free(p->w);
  free(p);
}

uint32_t pool_threads(const pool_t *p) { return p ? p->n : 1; }

void pool_run(pool_t *p, pool_fn fn, void *arg) {
  if (!p || p->n <= 1) {
    fn(arg, 0, 1);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->arg = arg;
  p->pending = p->n - 1;
  p->gen++;
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  fn(arg, 0, p->n);
  pthread_mutex_lock(&p->mu);
  while (p->pending) pthread_cond_wait(&p->cv_done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void pool_barrier(pool_t *p) {
  if (!p || p->n <= 1) return;
  pthread_mutex_lock(&p->bmu);
  uint64_t round = p->bround;
  if (++p->barrived == p->n) {
    p->barrived = 0;
    p->bround++;
    pthread_cond_broadcast(&p->bcv);
  } else {
    while (p->bround == round) pthread_cond_wait(&p->bcv, &p->bmu);
  }
  pthread_mutex_unlock(&p->bmu);
}
