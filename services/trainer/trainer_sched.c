/*
 * trainer_sched: the priority queue of a trainer's collectives and the
 * rounds that agree on its order (see trainer_sched.h).
 */
#include "trainer_sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "proc.h"

#define OFFER 32 /* ids a rank offers per round */
#define NONE UINT64_MAX

struct trainer_sched_s {
  coll_t *c;
  int P;
  int (*cancelled)(void *);
  void *cud;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  trainer_sched_op_t *pending; /* ascending id */
  uint64_t target;             /* after a round with no common id: the lowest offered */
  int held;                    /* trainer_sched_hold: no round starts */
  int quit, rc;
  trainer_sched_stats_t st;
  uint64_t *mine, *all; /* OFFER, P * OFFER */
  uint64_t common[OFFER]; /* a round's ids every rank offered */
  pthread_t th;
};

uint64_t trainer_sched_id(int cls, uint64_t iteration, uint32_t index) {
  return (uint64_t)cls << 60 | (iteration & ((UINT64_C(1) << 40) - 1)) << 20 | (index & ((1u << 20) - 1));
}

/* under mu: every pending operation fails with rc (sticky) */
static void fail_all(trainer_sched_t *s, int rc) {
  if (!s->rc) s->rc = rc;
  for (trainer_sched_op_t *op = s->pending; op; op = op->next) {
    op->rc = rc;
    op->done = 1;
  }
  s->pending = NULL;
  pthread_cond_broadcast(&s->cv);
}

static trainer_sched_op_t *find(trainer_sched_t *s, uint64_t id) {
  for (trainer_sched_op_t *op = s->pending; op && op->id <= id; op = op->next)
    if (op->id == id) return op;
  return NULL;
}

static void unlink_op(trainer_sched_t *s, trainer_sched_op_t *op) {
  for (trainer_sched_op_t **pp = &s->pending; *pp; pp = &(*pp)->next)
    if (*pp == op) {
      *pp = op->next;
      return;
    }
}

static int offered_by(const uint64_t *list, uint64_t id) {
  for (int i = 0; i < OFFER && list[i] <= id; i++)
    if (list[i] == id) return 1;
  return 0;
}

/* under mu: may a round start? (something pending, and the target, if
 * any, among it) */
static int can_offer(trainer_sched_t *s) {
  return !s->held && s->pending && (s->target == NONE || find(s, s->target) != NULL);
}

static void *comm_main(void *arg) {
  proc_name_thread("trainer-sched");
  trainer_sched_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->quit && !can_offer(s)) {
      if (s->pending && s->cancelled && s->cancelled(s->cud)) {
        fail_all(s, ERR_CANCELLED);
        continue;
      }
      struct timespec dl = clock_deadline_rt(20);
      pthread_cond_timedwait(&s->cv, &s->mu, &dl);
    }
    if (s->quit) break;
    int n = 0;
    for (trainer_sched_op_t *op = s->pending; op && n < OFFER; op = op->next) s->mine[n++] = op->id;
    for (int i = n; i < OFFER; i++) s->mine[i] = NONE;
    pthread_mutex_unlock(&s->mu);

    double t0 = clock_mono_s();
    int rc = coll_allgather(s->c, s->mine, OFFER * sizeof(uint64_t), s->all);
    double t1 = clock_mono_s();
    /* every id all ranks offered, most urgent first: run in that order
     * (one round for all of them; an id submitted meanwhile waits for the
     * next round) */
    int n_common = 0;
    uint64_t lowest = NONE;
    if (!rc) {
      for (int i = 0; i < n; i++) {
        int everywhere = 1;
        for (int r = 0; r < s->P && everywhere; r++) everywhere = offered_by(s->all + (size_t)r * OFFER, s->mine[i]);
        if (everywhere) s->common[n_common++] = s->mine[i];
      }
      for (int r = 0; r < s->P; r++)
        if (s->all[(size_t)r * OFFER] < lowest) lowest = s->all[(size_t)r * OFFER];
    }

    pthread_mutex_lock(&s->mu);
    s->st.rounds++;
    s->st.t_agree += t1 - t0;
    if (rc) {
      log_error("collective scheduler: the round that agrees on the next operation failed among %d trainers: %s",
                s->P, err_str(rc));
      fail_all(s, rc);
      continue;
    }
    if (!n_common) {
      s->st.empty_rounds++;
      s->target = lowest;
      continue;
    }
    s->target = NONE;
    for (int i = 0; i < n_common && !s->rc; i++) {
      trainer_sched_op_t *op = find(s, s->common[i]); /* pending: only this thread takes operations out */
      unlink_op(s, op);
      pthread_mutex_unlock(&s->mu);

      double t2 = clock_mono_s();
      rc = op->fn(s->c, op->ud);
      double dt = clock_mono_s() - t2;

      pthread_mutex_lock(&s->mu);
      s->st.ops++;
      s->st.t_ops += dt;
      op->seconds = dt;
      op->rc = rc;
      op->done = 1;
      if (rc) fail_all(s, rc);
      pthread_cond_broadcast(&s->cv);
    }
  }
  fail_all(s, ERR_CANCELLED);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int trainer_sched_create(coll_t *c, int (*cancelled)(void *), void *ud, trainer_sched_t **out) {
  *out = NULL;
  trainer_sched_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->c = c;
  s->P = coll_size(c);
  s->cancelled = cancelled;
  s->cud = ud;
  s->target = NONE;
  s->mine = malloc(OFFER * sizeof(uint64_t));
  s->all = malloc((size_t)s->P * OFFER * sizeof(uint64_t));
  if (!s->mine || !s->all) {
    free(s->mine), free(s->all), free(s);
    return -ENOMEM;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->th, NULL, comm_main, s) != 0) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->mine), free(s->all), free(s);
    return -EAGAIN;
  }
  *out = s;
  return 0;
}

void trainer_sched_destroy(trainer_sched_t *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->quit = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->th, NULL);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->mine), free(s->all), free(s);
}

void trainer_sched_submit(trainer_sched_t *s, trainer_sched_op_t *op, uint64_t id, trainer_sched_fn fn, void *ud) {
  op->id = id;
  op->fn = fn;
  op->ud = ud;
  op->done = 0;
  op->rc = 0;
  op->seconds = 0;
  op->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->rc || s->quit) {
    op->rc = s->rc ? s->rc : ERR_CANCELLED;
    op->done = 1;
  } else {
    trainer_sched_op_t **pp = &s->pending;
    while (*pp && (*pp)->id < id) pp = &(*pp)->next;
    ASSERT(!*pp || (*pp)->id != id); /* two pending operations with one id: a caller's bug */
    op->next = *pp;
    *pp = op;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void trainer_sched_hold(trainer_sched_t *s) {
  pthread_mutex_lock(&s->mu);
  s->held++;
  pthread_mutex_unlock(&s->mu);
}

void trainer_sched_release(trainer_sched_t *s) {
  pthread_mutex_lock(&s->mu);
  s->held--;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int trainer_sched_wait(trainer_sched_t *s, trainer_sched_op_t *op) {
  pthread_mutex_lock(&s->mu);
  while (!op->done) pthread_cond_wait(&s->cv, &s->mu);
  int rc = op->rc;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int trainer_sched_run(trainer_sched_t *s, coll_t *direct, uint64_t id, trainer_sched_fn fn, void *ud) {
  if (!s) return fn(direct, ud);
  trainer_sched_op_t op;
  trainer_sched_submit(s, &op, id, fn, ud);
  return trainer_sched_wait(s, &op);
}

void trainer_sched_stats(trainer_sched_t *s, trainer_sched_stats_t *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ the collectives as operations */

typedef struct sum_arg_s {
  float *buf;
  size_t n;
} sum_arg_t;

static int sum_op(coll_t *c, void *ud) {
  sum_arg_t *a = ud;
  return coll_allreduce_sum_f32_ordered(c, a->buf, a->n);
}

int trainer_sched_sum_ordered(trainer_sched_t *s, coll_t *direct, uint64_t id, float *buf, size_t n) {
  sum_arg_t a = {buf, n};
  return trainer_sched_run(s, direct, id, sum_op, &a);
}

typedef struct gather_arg_s {
  const void *in;
  size_t bytes;
  void *out;
} gather_arg_t;

static int gather_op(coll_t *c, void *ud) {
  gather_arg_t *a = ud;
  return coll_allgather(c, a->in, a->bytes, a->out);
}

int trainer_sched_allgather(trainer_sched_t *s, coll_t *direct, uint64_t id, const void *in, size_t bytes_each,
                            void *out) {
  gather_arg_t a = {in, bytes_each, out};
  return trainer_sched_run(s, direct, id, gather_op, &a);
}

typedef struct a2a_arg_s {
  const void *send;
  const size_t *sb;
  void *recv;
  const size_t *rb;
} a2a_arg_t;

static int a2a_op(coll_t *c, void *ud) {
  a2a_arg_t *a = ud;
  return coll_alltoallv(c, a->send, a->sb, a->recv, a->rb);
}

int trainer_sched_alltoallv(trainer_sched_t *s, coll_t *direct, uint64_t id, const void *send, const size_t *send_bytes,
                            void *recv, const size_t *recv_bytes) {
  a2a_arg_t a = {send, send_bytes, recv, recv_bytes};
  return trainer_sched_run(s, direct, id, a2a_op, &a);
}

static int barrier_op(coll_t *c, void *ud) {
  (void)ud;
  return coll_barrier(c);
}

int trainer_sched_barrier(trainer_sched_t *s, coll_t *direct, uint64_t id) {
  return trainer_sched_run(s, direct, id, barrier_op, NULL);
}

int trainer_sched_chunks_submit(trainer_sched_t *s, trainer_sched_chunks_t *ch, int cls, uint64_t iteration, float *buf,
                                size_t n, size_t chunk) {
  ch->buf = buf;
  ch->n = n;
  ch->n_ops = 0;
  if (!s || !n) return 0;
  if (!chunk) chunk = n;
  size_t k = (n + chunk - 1) / chunk;
  if (k > ch->cap) {
    trainer_sched_op_t *ops = realloc(ch->ops, k * sizeof *ops);
    if (ops) ch->ops = ops;
    sum_arg_t *args = ops ? realloc(ch->args, k * sizeof *args) : NULL;
    if (!ops || !args) return -ENOMEM;
    ch->args = args;
    ch->cap = k;
  }
  sum_arg_t *args = ch->args;
  for (size_t i = 0; i < k; i++) {
    size_t lo = i * chunk, hi = lo + chunk < n ? lo + chunk : n;
    args[i] = (sum_arg_t){buf + lo, hi - lo};
  }
  ch->n_ops = k;
  trainer_sched_hold(s);
  for (size_t i = 0; i < k; i++)
    trainer_sched_submit(s, &ch->ops[i], trainer_sched_id(cls, iteration, (uint32_t)i), sum_op, &args[i]);
  trainer_sched_release(s);
  return 0;
}

int trainer_sched_chunks_wait(trainer_sched_t *s, coll_t *direct, trainer_sched_chunks_t *ch) {
  if (!s) return ch->n ? coll_allreduce_sum_f32_ordered(direct, ch->buf, ch->n) : 0;
  int rc = 0;
  for (size_t i = 0; i < ch->n_ops; i++) {
    int r = trainer_sched_wait(s, &ch->ops[i]);
    if (r && !rc) rc = r;
  }
  ch->n_ops = 0;
  return rc;
}

void trainer_sched_chunks_free(trainer_sched_chunks_t *ch) {
  free(ch->ops), free(ch->args);
  memset(ch, 0, sizeof *ch);
}
