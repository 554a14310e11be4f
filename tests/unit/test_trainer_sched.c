/*
 * trainer_sched: the collectives' priority queue over a real Gloo group
 * (ranks are threads of this process, meeting through a file store in a
 * temp directory, talking TCP over loopback).
 *
 * What is checked:
 *   - priority: operations pending together run lowest id first (the next
 *     step's class, then dense, then delayed), on every rank, even when
 *     one rank offers them much later than the other;
 *   - agreement under skew: three ranks, three submitting threads each
 *     (one per class, sleeping different, rank-dependent times between
 *     operations) run every operation, in the same order on every rank,
 *     with the right sums;
 *   - the delayed rows' sum cut into chunks gives the bits of one sum;
 *   - failures: a peer that leaves makes the pending operations fail (not
 *     hang), later submissions fail at once, and a cancelled rank fails
 *     what it waits for with ERR_CANCELLED.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

#include "coll.h"
#include "err.h"
#include "testutil.h"
#include "trainer_sched.h"

static char g_dir[256];
static int g_seq;

static float val(int rank, uint64_t op, size_t i) {
  uint64_t x = (uint64_t)rank * 0x9e3779b97f4a7c15ull + op * 0x2545f4914f6cdd1dull + i * 0xbf58476d1ce4e5b9ull + 7;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 3.0f;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

#define MAXP 3
#define NOPS 64

typedef struct rank_s rank_t;

/* one operation: an ordered sum of its own buffer, recording when it ran */
typedef struct op_s {
  rank_t *r;
  uint64_t id;
  float buf[37];
} op_t;

struct rank_s {
  int rank, size;
  char prefix[64];
  coll_t *c;
  trainer_sched_t *s;
  pthread_mutex_t mu;
  uint64_t order[NOPS]; /* ids in the order they ran */
  int n_order;
  atomic_int cancel;
  int scenario;
  int rc;
};

static int record_op(coll_t *c, void *ud) {
  op_t *o = ud;
  pthread_mutex_lock(&o->r->mu);
  if (o->r->n_order < NOPS) o->r->order[o->r->n_order++] = o->id;
  pthread_mutex_unlock(&o->r->mu);
  return coll_allreduce_sum_f32_ordered(c, o->buf, 37);
}

static void fill(op_t *o, rank_t *r, uint64_t id) {
  o->r = r;
  o->id = id;
  for (size_t i = 0; i < 37; i++) o->buf[i] = val(r->rank, id, i);
}

static void check_sum(const op_t *o, int P) {
  for (size_t i = 0; i < 37; i++) {
    float want = val(0, o->id, i);
    for (int q = 1; q < P; q++) want += val(q, o->id, i);
    if (memcmp(&want, &o->buf[i], sizeof want))
      fail_msg("op %016llx element %zu: %a != %a", (unsigned long long)o->id, i, (double)o->buf[i], (double)want);
  }
}

static int is_cancelled(void *ud) { return atomic_load(&((rank_t *)ud)->cancel); }

static int open_rank(rank_t *r) {
  coll_store_t st;
  char err[256];
  if (coll_file_store_init(&st, g_dir) < 0) return -1;
  coll_opts_t o = {.rank = r->rank, .size = r->size, .prefix = r->prefix, .timeout_ms = 5000};
  int rc = coll_create(&o, &st, &r->c, err, sizeof err);
  coll_file_store_close(&st);
  if (rc) {
    fprintf(stderr, "rank %d: %s\n", r->rank, err);
    return rc;
  }
  pthread_mutex_init(&r->mu, NULL);
  return trainer_sched_create(r->c, is_cancelled, r, &r->s);
}

static void close_rank(rank_t *r) {
  trainer_sched_destroy(r->s);
  r->s = NULL;
  coll_destroy(r->c);
  r->c = NULL;
}

/* ---- priority */

static void *prio_main(void *arg) {
  rank_t *r = arg;
  if ((r->rc = open_rank(r)) != 0) return NULL;
  static const int cls[] = {TRAINER_SCHED_DELAYED, TRAINER_SCHED_DELAYED, TRAINER_SCHED_DELAYED,
                            TRAINER_SCHED_DENSE,   TRAINER_SCHED_DENSE,   TRAINER_SCHED_NEXT};
  static const uint32_t idx[] = {0, 1, 2, 0, 1, TRAINER_SCHED_A2A_FWD};
  enum { N = 6 };
  op_t o[N];
  trainer_sched_op_t so[N];
  if (r->rank == 1) sleep_us(100000); /* offers long after rank 0 */
  trainer_sched_hold(r->s);
  for (int i = 0; i < N; i++) {
    uint64_t x = cls[i] == TRAINER_SCHED_DELAYED ? 4 : 5; /* step 4's delayed rows, step 5's dense, 5's AlltoAll */
    fill(&o[i], r, trainer_sched_id(cls[i], x, idx[i]));
    trainer_sched_submit(r->s, &so[i], o[i].id, record_op, &o[i]);
  }
  trainer_sched_release(r->s);
  for (int i = 0; i < N && !r->rc; i++) r->rc = trainer_sched_wait(r->s, &so[i]);
  for (int i = 0; i < N && !r->rc; i++) check_sum(&o[i], r->size);
  trainer_sched_stats_t st;
  trainer_sched_stats(r->s, &st);
  if (st.ops != N) r->rc = -1001;
  close_rank(r);
  return NULL;
}

static void run(int P, int scenario, void *(*fn)(void *), rank_t *rk) {
  pthread_t th[MAXP];
  g_seq++;
  for (int r = 0; r < P; r++) {
    memset(&rk[r], 0, sizeof rk[r]);
    rk[r].rank = r;
    rk[r].size = P;
    rk[r].scenario = scenario;
    snprintf(rk[r].prefix, sizeof rk[r].prefix, "sched-test/%d", g_seq);
  }
  for (int r = 0; r < P; r++) assert_int_equal(pthread_create(&th[r], NULL, fn, &rk[r]), 0);
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
}

static void test_priority(void **state) {
  (void)state;
  rank_t rk[2];
  run(2, 0, prio_main, rk);
  uint64_t want[6] = {trainer_sched_id(TRAINER_SCHED_NEXT, 5, TRAINER_SCHED_A2A_FWD),
                      trainer_sched_id(TRAINER_SCHED_DENSE, 5, 0),
                      trainer_sched_id(TRAINER_SCHED_DENSE, 5, 1),
                      trainer_sched_id(TRAINER_SCHED_DELAYED, 4, 0),
                      trainer_sched_id(TRAINER_SCHED_DELAYED, 4, 1),
                      trainer_sched_id(TRAINER_SCHED_DELAYED, 4, 2)};
  for (int r = 0; r < 2; r++) {
    assert_int_equal(rk[r].rc, 0);
    assert_int_equal(rk[r].n_order, 6);
    for (int i = 0; i < 6; i++) assert_true(rk[r].order[i] == want[i]);
  }
}

/* ---- agreement under skew: per rank, three threads submit a class each */

typedef struct sub_s {
  rank_t *r;
  int cls, n;
  op_t o[16];
  trainer_sched_op_t so[16];
  int rc;
} sub_t;

static void *sub_main(void *arg) {
  sub_t *u = arg;
  rank_t *r = u->r;
  unsigned seed = (unsigned)(r->rank * 131 + u->cls * 17 + 1);
  for (int i = 0; i < u->n; i++) {
    fill(&u->o[i], r, trainer_sched_id(u->cls, (uint64_t)i / 4, (uint32_t)(i % 4)));
    sleep_us((long)(rand_r(&seed) % 3000));
    if (u->cls == TRAINER_SCHED_NEXT) { /* the training thread: one at a time */
      if ((u->rc = trainer_sched_run(r->s, NULL, u->o[i].id, record_op, &u->o[i])) != 0) return NULL;
    } else {
      trainer_sched_submit(r->s, &u->so[i], u->o[i].id, record_op, &u->o[i]);
    }
  }
  if (u->cls != TRAINER_SCHED_NEXT)
    for (int i = 0; i < u->n && !u->rc; i++) u->rc = trainer_sched_wait(r->s, &u->so[i]);
  return NULL;
}

static void *skew_main(void *arg) {
  rank_t *r = arg;
  if ((r->rc = open_rank(r)) != 0) return NULL;
  sub_t *u = calloc(3, sizeof *u);
  pthread_t th[3];
  for (int k = 0; k < 3; k++) {
    u[k].r = r;
    u[k].cls = k;
    u[k].n = 16;
    pthread_create(&th[k], NULL, sub_main, &u[k]);
  }
  for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
  for (int k = 0; k < 3 && !r->rc; k++) r->rc = u[k].rc;
  for (int k = 0; k < 3 && !r->rc; k++)
    for (int i = 0; i < u[k].n; i++) check_sum(&u[k].o[i], r->size);
  free(u);
  close_rank(r);
  return NULL;
}

static void test_skew(void **state) {
  (void)state;
  for (int P = 2; P <= 3; P++) {
    rank_t rk[MAXP];
    run(P, 0, skew_main, rk);
    for (int r = 0; r < P; r++) {
      assert_int_equal(rk[r].rc, 0);
      assert_int_equal(rk[r].n_order, 48);
      assert_memory_equal(rk[r].order, rk[0].order, sizeof rk[0].order);
    }
  }
}

/* ---- chunks */

static void *chunks_main(void *arg) {
  rank_t *r = arg;
  if ((r->rc = open_rank(r)) != 0) return NULL;
  enum { N = 10007 };
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  for (size_t i = 0; i < N; i++) a[i] = b[i] = val(r->rank, 99, i);
  trainer_sched_chunks_t ch = {0};
  r->rc = trainer_sched_chunks_submit(r->s, &ch, TRAINER_SCHED_DELAYED, 3, a, N, 1000);
  if (!r->rc) r->rc = trainer_sched_chunks_wait(r->s, NULL, &ch);
  if (!r->rc) r->rc = trainer_sched_sum_ordered(r->s, NULL, trainer_sched_id(TRAINER_SCHED_NEXT, 4, 0), b, N);
  if (!r->rc && memcmp(a, b, N * sizeof(float))) r->rc = -1002;
  trainer_sched_stats_t st;
  trainer_sched_stats(r->s, &st);
  if (!r->rc && st.ops != 12) r->rc = -1003; /* 11 chunks and the whole */
  trainer_sched_chunks_free(&ch);
  free(a), free(b);
  close_rank(r);
  return NULL;
}

static void test_chunks(void **state) {
  (void)state;
  rank_t rk[2];
  run(2, 0, chunks_main, rk);
  for (int r = 0; r < 2; r++) assert_int_equal(rk[r].rc, 0);
}

/* ---- failures */

static void *gone_main(void *arg) {
  rank_t *r = arg;
  if ((r->rc = open_rank(r)) != 0) return NULL;
  if (r->rank == 1) { /* leaves without a word */
    close_rank(r);
    return NULL;
  }
  op_t o;
  fill(&o, r, trainer_sched_id(TRAINER_SCHED_NEXT, 0, 0));
  r->rc = trainer_sched_run(r->s, NULL, o.id, record_op, &o);
  trainer_sched_op_t later;
  trainer_sched_submit(r->s, &later, trainer_sched_id(TRAINER_SCHED_NEXT, 1, 0), record_op, &o);
  if (trainer_sched_wait(r->s, &later) != r->rc) r->rc = -1004; /* sticky */
  close_rank(r);
  return NULL;
}

static void test_peer_gone(void **state) {
  (void)state;
  rank_t rk[2];
  run(2, 0, gone_main, rk);
  assert_true(rk[0].rc < 0 && rk[0].rc != -1004); /* an error within the 5 s timeout, not a hang */
}

static void *cancel_main(void *arg) {
  rank_t *r = arg;
  if ((r->rc = open_rank(r)) != 0) return NULL;
  /* different ids: no round finds a common one; rank 1 waits for rank 0's
   * (the lowest) which it never submits, until cancelled */
  op_t o;
  fill(&o, r, trainer_sched_id(TRAINER_SCHED_DENSE, 0, (uint32_t)r->rank));
  trainer_sched_op_t so;
  trainer_sched_submit(r->s, &so, o.id, record_op, &o);
  if (r->rank == 1) {
    sleep_us(300000);
    atomic_store(&r->cancel, 1);
  }
  r->rc = trainer_sched_wait(r->s, &so);
  close_rank(r); /* rank 0, in a round, then gets an error */
  return NULL;
}

static void test_cancel(void **state) {
  (void)state;
  rank_t rk[2];
  run(2, 0, cancel_main, rk);
  assert_int_equal(rk[1].rc, ERR_CANCELLED);
  assert_true(rk[0].rc < 0);
}

static int setup(void **state) {
  (void)state;
  return testutil_tmpdir(g_dir, sizeof g_dir, "test-sched") ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  return testutil_rmtree(g_dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_priority), cmocka_unit_test(test_skew),   cmocka_unit_test(test_chunks),
      cmocka_unit_test(test_peer_gone), cmocka_unit_test(test_cancel),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
