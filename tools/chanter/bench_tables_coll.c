/*
 * bench tables, the collectives: what one call of the trainers' two
 * collectives costs on this machine, for table_strategy = auto's weighing
 * of the cache against partitioning (strategy_auto.h, shard_cost.h's
 * "coll" lines).  `ranks` processes (this one and ranks - 1 children
 * forked before any thread exists) form a Gloo group over loopback, as
 * trainers do (coll_create, a file store in a temporary directory), and
 * time, for each size:
 *   allreduce  coll_allreduce_sum_f32_ordered of a buffer of that many
 *              bytes (the cache's sum of embedding-row gradients);
 *   alltoall   coll_alltoallv where each rank sends that many bytes in
 *              all, split evenly over the other ranks (partitioning's
 *              exchange of pooled embeddings and their gradients).
 * Each size: 3 warm-up calls, then REPS calls, each entered together
 * (a barrier first, not timed); a round's cost is rank 0's median, and the
 * whole schedule runs ROUNDS times, keeping each size's smallest median:
 * on a machine of few cores one busy process deschedules a rank for
 * milliseconds, and what the model wants is the collective's own cost.
 * One dataset line per (collective, size):
 *   coll <op> <ranks> <bytes> <cost_us>.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_tables_coll.h"
#include "bench_util.h"
#include "clock.h"
#include "coll.h"
#include "fsio.h"

#define WARM 3
#define REPS 15
#define REPS_QUICK 5
#define ROUNDS 3

static const size_t sizes[] = {4096, 32768, 262144, 1048576, 4194304};
static const size_t sizes_quick[] = {4096, 262144, 1048576};

/* One collective of `bytes` (per the header) on c. */
static int one_call(coll_t *c, int op, size_t bytes, void *send, void *recv, size_t *sb, size_t *rb) {
  int P = coll_size(c), me = coll_rank(c);
  if (op == 0) return coll_allreduce_sum_f32_ordered(c, send, bytes / sizeof(float));
  size_t each = bytes / (size_t)(P - 1);
  for (int r = 0; r < P; r++) sb[r] = rb[r] = r == me ? 0 : each;
  return coll_alltoallv(c, send, sb, recv, rb);
}

/* The whole schedule, on every rank alike; rank 0 writes the least median
 * of the rounds into us[op][size] (NULL elsewhere).  0 or the first failing call's code. */
static int schedule(coll_t *c, const size_t *sz, size_t nsz, int reps, double (*us)[8]) {
  int P = coll_size(c);
  size_t max = sz[nsz - 1];
  float *send = calloc(max / sizeof(float) + 1, sizeof(float)), *recv = calloc(max / sizeof(float) + 1, sizeof(float));
  size_t *sb = calloc((size_t)P, sizeof *sb), *rb = calloc((size_t)P, sizeof *rb);
  double t[REPS];
  int rc = send && recv && sb && rb ? 0 : -ENOMEM;
  for (int round = 0; round < ROUNDS && !rc; round++)
    for (int op = 0; op < 2 && !rc; op++)
      for (size_t i = 0; i < nsz && !rc; i++) {
        for (int k = 0; k < WARM + reps && !rc; k++) {
          for (size_t f = 0; f < sz[i] / sizeof(float); f++) send[f] = (float)(f % 7) * 0.5f; /* finite, fresh each call */
          if ((rc = coll_barrier(c))) break;
          double t0 = clock_mono_s();
          rc = one_call(c, op, sz[i], send, recv, sb, rb);
          if (k >= WARM) t[k - WARM] = (clock_mono_s() - t0) * 1e6;
        }
        if (!rc && us) {
          double med = bench_median(t, (size_t)reps);
          if (!round || med < us[op][i]) us[op][i] = med;
        }
      }
  free(send), free(recv), free(sb), free(rb);
  return rc;
}

static int join(int rank, int ranks, const char *dir, coll_t **c, char *why, size_t why_len) {
  coll_store_t st;
  if (coll_file_store_init(&st, dir) < 0) {
    snprintf(why, why_len, "cannot use %s as the group's store", dir);
    return -EIO;
  }
  coll_opts_t o = {.rank = rank, .size = ranks, .prefix = "bench-tables", .timeout_ms = 60000};
  int rc = coll_create(&o, &st, c, why, why_len);
  coll_file_store_close(&st);
  return rc;
}

int bench_tables_coll(uint32_t ranks, int quick, sbuf_t *body, char *why, size_t why_len) {
  const size_t *sz = quick ? sizes_quick : sizes;
  size_t nsz = quick ? sizeof sizes_quick / sizeof *sizes_quick : sizeof sizes / sizeof *sizes;
  int reps = quick ? REPS_QUICK : REPS;
  char dir[] = "/tmp/chanter-bench-coll-XXXXXX";
  if (!mkdtemp(dir)) {
    snprintf(why, why_len, "cannot create a directory in /tmp: %s", strerror(errno));
    return -errno;
  }
  fflush(NULL);
  pid_t *kid = calloc(ranks, sizeof *kid);
  int rc = kid ? 0 : -ENOMEM;
  for (uint32_t r = 1; r < ranks && !rc; r++) {
    kid[r] = fork();
    if (kid[r] < 0) {
      rc = -errno;
      snprintf(why, why_len, "fork: %s", strerror(errno));
    } else if (kid[r] == 0) {
      coll_t *c = NULL;
      char e[256];
      int x = join((int)r, (int)ranks, dir, &c, e, sizeof e) || schedule(c, sz, nsz, reps, NULL);
      coll_destroy(c);
      _exit(x ? 1 : 0);
    }
  }
  double us[2][8];
  coll_t *c = NULL;
  if (!rc && (rc = join(0, (int)ranks, dir, &c, why, why_len)) == 0 && (rc = schedule(c, sz, nsz, reps, us)) != 0)
    snprintf(why, why_len, "a timed collective failed: %s", strerror(rc < 0 ? -rc : rc));
  coll_destroy(c);
  for (uint32_t r = 1; kid && r < ranks; r++) {
    int st = 0;
    if (kid[r] <= 0) continue;
    if (rc) kill(kid[r], SIGKILL);
    if (waitpid(kid[r], &st, 0) == kid[r] && !rc && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      rc = -EIO;
      snprintf(why, why_len, "rank %u of the collectives' group failed", r);
    }
  }
  free(kid);
  char e[256];
  fsio_remove_tree(dir, e, sizeof e);
  if (rc) return rc;
  static const char *const name[2] = {"allreduce", "alltoall"};
  printf("collectives over %u ranks (Gloo, loopback), the least of %d rounds' medians of %d calls:\n  %-9s", ranks, ROUNDS,
         reps, "bytes");
  for (size_t i = 0; i < nsz; i++) printf(" %10zu", sz[i]);
  for (int op = 0; op < 2; op++) {
    printf("\n  %-9s", name[op]);
    for (size_t i = 0; i < nsz; i++) {
      printf(" %8.1fus", us[op][i]);
      sb_printf(body, "coll %s %u %zu %.1f\n", name[op], ranks, sz[i], us[op][i]);
    }
  }
  printf("\n");
  return 0;
}
