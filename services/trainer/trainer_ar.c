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

#include "clock.h"
#include "proc.h"

typedef struct bucket_arg_s bucket_arg_t;

struct trainer_ar_s {
  coll_t *c;
  trainer_sched_t *sched;   /* comm_schedule = priority: buckets go to its queue (no thread here) */
  trainer_sched_op_t *ops;  /* nb: the buckets' operations */
  bucket_arg_t *args;       /* nb */
  uint64_t x;               /* the step's iteration (the operations' ids) */
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

static size_t bucket_hi(const trainer_ar_t *a, size_t k) { return a->n - k * a->B; }
static size_t bucket_lo(const trainer_ar_t *a, size_t k) {
  size_t hi = bucket_hi(a, k);
  return hi > a->B ? hi - a->B : 0;
}

static void *comm_main(void *arg) {
  proc_name_thread("trainer-ar");
  trainer_ar_t *a = arg;
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->quit && a->started >= a->ready) pthread_cond_wait(&a->cv, &a->mu);
    if (a->quit) break;
    size_t k = a->started++;
    int failed = a->rc != 0;
    pthread_mutex_unlock(&a->mu);
    int rc = 0;
    double t0 = clock_mono_s();
    /* after a failure the group is unusable: the rest are skipped */
    if (!failed) rc = coll_allreduce_sum_f32(a->c, a->g + bucket_lo(a, k), bucket_hi(a, k) - bucket_lo(a, k));
    double dt = clock_mono_s() - t0;
    pthread_mutex_lock(&a->mu);
    a->t_comm += dt;
    if (rc && !a->rc) a->rc = rc;
    a->done++;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

/* comm_schedule = priority: bucket k as an operation of the scheduler */
struct bucket_arg_s {
  trainer_ar_t *a;
  size_t k;
};

static int bucket_op(coll_t *c, void *ud) {
  const bucket_arg_t *b = ud;
  return coll_allreduce_sum_f32(c, b->a->g + bucket_lo(b->a, b->k), bucket_hi(b->a, b->k) - bucket_lo(b->a, b->k));
}

/* under mu: buckets [started, ready) to the scheduler */
static void submit_ready(trainer_ar_t *a) {
  trainer_sched_hold(a->sched); /* offered together */
  for (; a->started < a->ready; a->started++)
    trainer_sched_submit(a->sched, &a->ops[a->started],
                         trainer_sched_id(TRAINER_SCHED_DENSE, a->x, (uint32_t)a->started), bucket_op,
                         &a->args[a->started]);
  trainer_sched_release(a->sched);
}

int trainer_ar_create(coll_t *c, trainer_sched_t *sched, float *grads, size_t n, size_t bucket_floats,
                      trainer_ar_t **out) {
  *out = NULL;
  trainer_ar_t *a = calloc(1, sizeof(*a));
  if (!a) return -ENOMEM;
  a->c = c;
  a->sched = sched;
  a->g = grads;
  a->n = n;
  a->B = bucket_floats && bucket_floats < n ? bucket_floats : n;
  a->nb = a->B ? (n + a->B - 1) / a->B : 0;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  if (sched && a->nb) {
    a->ops = calloc(a->nb, sizeof *a->ops);
    a->args = calloc(a->nb, sizeof *a->args);
    if (!a->ops || !a->args) {
      trainer_ar_destroy(a);
      return -ENOMEM;
    }
    for (size_t k = 0; k < a->nb; k++) a->args[k] = (bucket_arg_t){.a = a, .k = k};
  } else if (bucket_floats && a->nb) {
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
  free(a->ops), free(a->args);
  free(a);
}

size_t trainer_ar_buckets(const trainer_ar_t *a) { return a->nb; }

void trainer_ar_begin(trainer_ar_t *a, uint64_t x) {
  pthread_mutex_lock(&a->mu);
  a->x = x;
  a->ready = a->started = a->done = 0;
  a->t_comm = 0;
  pthread_mutex_unlock(&a->mu);
}

void trainer_ar_ready(void *arg, size_t lo) {
  trainer_ar_t *a = arg;
  if (!a->threaded && !a->sched) return;
  pthread_mutex_lock(&a->mu);
  size_t k = a->ready;
  while (k < a->nb && bucket_lo(a, k) >= lo) k++;
  if (k > a->ready) {
    a->ready = k;
    if (a->sched) submit_ready(a);
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
}

int trainer_ar_finish(trainer_ar_t *a, double *t_comm) {
  if (a->sched) {
    pthread_mutex_lock(&a->mu);
    a->ready = a->nb;
    submit_ready(a);
    pthread_mutex_unlock(&a->mu);
    int rc = 0;
    double t = 0;
    for (size_t k = 0; k < a->nb; k++) { /* every one: the scheduler holds them until they ran or failed */
      int r = trainer_sched_wait(a->sched, &a->ops[k]);
      if (r && !rc) rc = r;
      t += a->ops[k].seconds;
    }
    if (t_comm) *t_comm = t;
    return rc;
  }
  if (!a->threaded) {
    double t0 = clock_mono_s();
    int rc = a->rc;
    if (!rc && a->n) rc = a->rc = coll_allreduce_sum_f32(a->c, a->g, a->n);
    if (t_comm) *t_comm = clock_mono_s() - t0;
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
