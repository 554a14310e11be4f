/*
 * trainer_ar: bucketed dense all-reduce overlapped with the backward (see
 * trainer_ar.h).  One communication thread per trainer, woken by the
 * model's hook; counters under one mutex say how many buckets are ready,
 * started and done.
 */
#include "trainer_ar.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct trainer_ar_s {
  coll_t *c;
  float *g;
  size_t n, B, nb; /* floats, bucket floats (0 = one, no thread), buckets */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t ready, started, done; /* buckets */
  int rc;                      /* first failure; sticky */
  int quit;
  double t_comm;
  pthread_t th;
  int threaded;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t bucket_hi(const trainer_ar_t *a, size_t k) { return a->n - k * a->B; }
static size_t bucket_lo(const trainer_ar_t *a, size_t k) {
  size_t hi = bucket_hi(a, k);
  return hi > a->B ? hi - a->B : 0;
}

static void *comm_main(void *arg) {
  trainer_ar_t *a = arg;
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->quit && a->started >= a->ready) pthread_cond_wait(&a->cv, &a->mu);
    if (a->quit) break;
    size_t k = a->started++;
    int failed = a->rc != 0;
    pthread_mutex_unlock(&a->mu);
    int rc = 0;
    double t0 = now_s();
    /* after a failure the group is unusable: the rest are skipped */
    if (!failed) rc = coll_allreduce_sum_f32(a->c, a->g + bucket_lo(a, k), bucket_hi(a, k) - bucket_lo(a, k));
    double dt = now_s() - t0;
    pthread_mutex_lock(&a->mu);
    a->t_comm += dt;
    if (rc && !a->rc) a->rc = rc;
    a->done++;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

int trainer_ar_create(coll_t *c, float *grads, size_t n, size_t bucket_floats, trainer_ar_t **out) {
  *out = NULL;
  trainer_ar_t *a = calloc(1, sizeof(*a));
  if (!a) return -ENOMEM;
  a->c = c;
  a->g = grads;
  a->n = n;
  a->B = bucket_floats && bucket_floats < n ? bucket_floats : n;
  a->nb = a->B ? (n + a->B - 1) / a->B : 0;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  if (bucket_floats && a->nb) {
    if (pthread_create(&a->th, NULL, comm_main, a) != 0) {
      trainer_ar_destroy(a);
      return -EAGAIN;
    }
    a->threaded = 1;
  }
  *out = a;
  return 0;
}

void trainer_ar_destroy(trainer_ar_t *a) {
  if (!a) return;
  if (a->threaded) {
    pthread_mutex_lock(&a->mu);
    a->quit = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
  }
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

size_t trainer_ar_buckets(const trainer_ar_t *a) { return a->nb; }

void trainer_ar_begin(trainer_ar_t *a) {
  pthread_mutex_lock(&a->mu);
  a->ready = a->started = a->done = 0;
  a->t_comm = 0;
  pthread_mutex_unlock(&a->mu);
}

void trainer_ar_ready(void *arg, size_t lo) {
  trainer_ar_t *a = arg;
  if (!a->threaded) return;
  pthread_mutex_lock(&a->mu);
  size_t k = a->ready;
  while (k < a->nb && bucket_lo(a, k) >= lo) k++;
  if (k > a->ready) {
    a->ready = k;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
}

int trainer_ar_finish(trainer_ar_t *a, double *t_comm) {
  if (!a->threaded) {
    double t0 = now_s();
    int rc = a->rc;
    if (!rc && a->n) rc = a->rc = coll_allreduce_sum_f32(a->c, a->g, a->n);
    if (t_comm) *t_comm = now_s() - t0;
    return rc;
  }
  pthread_mutex_lock(&a->mu);
  if (a->ready < a->nb) {
    a->ready = a->nb;
    pthread_cond_broadcast(&a->cv);
  }
  while (a->done < a->nb) pthread_cond_wait(&a->cv, &a->mu);
  int rc = a->rc;
  if (t_comm) *t_comm = a->t_comm;
  pthread_mutex_unlock(&a->mu);
  return rc;
}
