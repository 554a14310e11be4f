/*
 * test_coll: the collectives of common/coll.h on real processes.  Every
 * group is P forked copies of this binary, one per rank, meeting through a
 * file store in a fresh temporary directory and talking TCP on 127.0.0.1
 * (the Gloo backend).  Ranks write what they computed to files; the parent
 * compares them with each other and with an independent reference: the
 * all-reduce is checked bitwise against the summation order coll.h
 * documents; alltoallv's blocks are checked byte for byte, sizes agreed or
 * not.  Failures are real too: a peer is SIGKILLed or SIGSTOPped
 * mid-collective and the survivors must fail within a bound, a rank that
 * never starts must time the rendezvous out.  The NCCL backend: its
 * refusal without a GPU (or when not built); on a machine with one GPU a
 * group of one (every operation, device buffers) and two ranks on the one
 * GPU (NCCL refuses them: an error within the timeout, never a hang).
 * Groups of two GPUs cannot run on any machine we have.  The choice
 * between the two backends (coll_nccl_eligible) is a pure function,
 * checked here on any machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "err.h"

#ifdef CHANTER_CUDA
#include <cuda_runtime_api.h>
#endif

/* LeakSanitizer (SANITIZER=address builds): Gloo 0.5 (Debian 12) leaks
 * the getaddrinfo(3) list in tcp::CreateDeviceAttr when bind(2) fails (it
 * throws before freeaddrinfo), which test_bad_iface provokes on purpose.
 * Only that Gloo frame is suppressed; everything of ours stays checked. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:gloo::transport::tcp::CreateDeviceAttr\n";
}

#define MAXP 4
#define GROUP_LIMIT_MS 15000 /* a group that runs longer than this hangs */

static char g_dir[64];
static int g_prefix_seq;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void path_of(char *p, size_t len, const char *name) {
  snprintf(p, len, "%s/%s", g_dir, name);
}

static int write_file(const char *name, const void *buf, size_t len) {
  char p[256], tmp[280];
  path_of(p, sizeof p, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  size_t w = fwrite(buf, 1, len, f);
  if (fclose(f) != 0 || w != len) return -1;
  return rename(tmp, p);
}

/* The whole file, malloc'd and NUL-terminated; NULL if missing. */
static void *read_whole(const char *name, size_t *len) {
  char p[256];
  path_of(p, sizeof p, name);
  FILE *f = fopen(p, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) b[n] = '\0'; /* text files are read as strings */
  if (b && len) *len = (size_t)n;
  return b;
}

static int file_exists(const char *name) {
  char p[256];
  path_of(p, sizeof p, name);
  return access(p, F_OK) == 0;
}

/* ---- process groups ---- */

typedef int (*worker_fn)(coll_t *c, int rank, void *arg);

typedef struct group_s {
  int size;
  int64_t timeout_ms;
  const char *backend;
  const char *iface; /* NULL: 127.0.0.1 */
  char prefix[64];
  pid_t pid[MAXP];
  int status[MAXP]; /* exit code, or 128 + signal */
} group_t;

/* A child: joins the group, runs fn, records create failures in
 * "create.<rank>", exits with fn's code (exit(), not _exit(): so that
 * LeakSanitizer checks the child too). */
static void child_main(group_t *g, int rank, worker_fn fn, void *arg) {
  coll_store_t s;
  coll_t *c = NULL;
  char err[512] = "", name[64];
  int code;
  if (coll_file_store_init(&s, g_dir) < 0) exit(90);
  coll_opts_t o = {.rank = rank, .size = g->size, .backend = g->backend,
                   .iface_addr = g->iface ? g->iface : "127.0.0.1", .prefix = g->prefix,
                   .timeout_ms = g->timeout_ms};
  int rc = coll_create(&o, &s, &c, err, sizeof err);
  if (rc < 0) {
    char line[640];
    int n = snprintf(line, sizeof line, "%d %s", rc, err);
    snprintf(name, sizeof name, "create.%d", rank);
    write_file(name, line, (size_t)n);
    code = 91;
  } else {
    code = fn(c, rank, arg);
    coll_destroy(c);
  }
  coll_file_store_close(&s);
  exit(code);
}

/* Starts ranks [0, nstart) of a group of g->size; a fresh prefix each
 * time, as a re-formed group would use. */
static void group_start(group_t *g, int size, int nstart, int64_t timeout_ms,
                        worker_fn fn, void *arg) {
  g->size = size;
  g->timeout_ms = timeout_ms;
  if (!g->backend) g->backend = "gloo";
  snprintf(g->prefix, sizeof g->prefix, "job-test/gen%d", ++g_prefix_seq);
  fflush(NULL);
  for (int r = 0; r < MAXP; r++) g->pid[r] = -1;
  for (int r = 0; r < nstart; r++) {
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) child_main(g, r, fn, arg);
    g->pid[r] = p;
  }
}

/* Waits for every started rank (killing all after GROUP_LIMIT_MS: a hang
 * is a failure, not a stuck test).  Returns how many ranks exited 0. */
static int group_wait(group_t *g) {
  int64_t deadline = now_ms() + GROUP_LIMIT_MS;
  int left = 0, ok = 0;
  for (int r = 0; r < MAXP; r++) left += g->pid[r] > 0;
  while (left > 0) {
    for (int r = 0; r < MAXP; r++) {
      if (g->pid[r] <= 0) continue;
      int st;
      pid_t w = waitpid(g->pid[r], &st, WNOHANG);
      if (w == 0) continue;
      g->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      ok += g->status[r] == 0;
      g->pid[r] = -1;
      left--;
    }
    if (left == 0) break;
    if (now_ms() > deadline) {
      for (int r = 0; r < MAXP; r++)
        if (g->pid[r] > 0) {
          kill(g->pid[r], SIGKILL);
          waitpid(g->pid[r], NULL, 0);
          g->status[r] = 999;
          g->pid[r] = -1;
        }
      fail_msg("group of %d hung for %d ms", g->size, GROUP_LIMIT_MS);
    }
    usleep(2000);
  }
  return ok;
}

static void group_run(int size, int64_t timeout_ms, worker_fn fn, void *arg) {
  group_t g = {0};
  group_start(&g, size, size, timeout_ms, fn, arg);
  int ok = group_wait(&g);
  for (int r = 0; r < size; r++)
    if (g.status[r] != 0) {
      char name[32];
      snprintf(name, sizeof name, "create.%d", r);
      char *why = read_whole(name, NULL);
      fail_msg("rank %d of %d exited with %d%s%s", r, size, g.status[r],
               why ? ": create failed: " : "", why ? why : "");
    }
  assert_int_equal(ok, size);
}

/* ---- data and the reference sum ---- */

static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Rank r's element i: a random sign and mantissa times 2^[-10, 10], so
 * that the order of summation shows in the last bits. */
static float gen(uint64_t seed, int rank, size_t i) {
  uint64_t z = splitmix(seed * 0x100000001b3ull ^ ((uint64_t)rank << 56) ^ i);
  float m = (float)(z >> 40) / 16777216.0f * 2.0f - 1.0f;
  return ldexpf(m, (int)((z >> 8) % 21) - 10);
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* The order coll.h documents: element j lies in chunk c; its sum starts
 * at rank c-1 and travels down the ring, rank c adding its value last. */
static void ring_reference(int P, size_t n, float *const *x, float *ref) {
  if (P == 1) {
    memcpy(ref, x[0], n * sizeof(float));
    return;
  }
  size_t total = n * sizeof(float), p = (size_t)P;
  size_t S = (total + (1u << 20) - 1) >> 20; /* 1 MiB segments at most */
  if (S < 2 * p) S = 2 * p;
  S = round_up(S, p);
  size_t seg = round_up((total + S - 1) / S, sizeof(float));
  size_t k = S / p;
  for (size_t j = 0; j < n; j++) {
    int c = (int)((j * sizeof(float) / seg) / k);
    float acc = x[(c - 1 + P) % P][j];
    for (int m = 2; m <= P; m++) acc = x[(c - m + P) % P][j] + acc;
    ref[j] = acc;
  }
}

/* ---- all-reduce ---- */

/* 3000001 floats: more than one 1 MiB segment per chunk, a ragged end. */
static const size_t k_sizes[] = {1, 1000, 1u << 20, 3000001};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

typedef struct ar_arg_s {
  uint64_t seed;
  const char *tag;
} ar_arg_t;

static int ar_worker(coll_t *c, int rank, void *arg) {
  ar_arg_t *a = arg;
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = k_sizes[s];
    float *buf = malloc(n * sizeof *buf);
    if (!buf) return 2;
    for (size_t i = 0; i < n; i++) buf[i] = gen(a->seed + n, rank, i);
    if (coll_allreduce_sum_f32(c, buf, n) != 0) return 3;
    char name[64];
    snprintf(name, sizeof name, "ar.%s.%zu.%d", a->tag, n, rank);
    int rc = write_file(name, buf, n * sizeof *buf);
    free(buf);
    if (rc != 0) return 4;
  }
  return 0;
}

/* Checks run `tag` of P ranks: all ranks equal, equal to the reference
 * bitwise.  Returns how many elements of the largest size differ from
 * the naive left-to-right sum (((x0 + x1) + x2) ...). */
static size_t check_allreduce(int P, uint64_t seed, const char *tag) {
  size_t naive_diff = 0;
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = k_sizes[s];
    float *x[MAXP], *out[MAXP];
    float *ref = malloc(n * sizeof *ref);
    assert_non_null(ref);
    for (int r = 0; r < P; r++) {
      x[r] = malloc(n * sizeof(float));
      assert_non_null(x[r]);
      for (size_t i = 0; i < n; i++) x[r][i] = gen(seed + n, r, i);
      char name[64];
      size_t len = 0;
      snprintf(name, sizeof name, "ar.%s.%zu.%d", tag, n, r);
      out[r] = read_whole(name, &len);
      assert_non_null(out[r]);
      assert_int_equal(len, n * sizeof(float));
    }
    ring_reference(P, n, x, ref);
    for (int r = 1; r < P; r++)
      assert_memory_equal(out[r], out[0], n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (memcmp(&out[0][i], &ref[i], sizeof(float)) != 0)
        fail_msg("P=%d n=%zu element %zu: got %a, reference %a", P, n, i,
                 (double)out[0][i], (double)ref[i]);
    if (s == NSIZES - 1)
      for (size_t i = 0; i < n; i++) {
        float naive = x[0][i];
        for (int r = 1; r < P; r++) naive += x[r][i];
        naive_diff += memcmp(&naive, &ref[i], sizeof naive) != 0;
      }
    for (int r = 0; r < P; r++) {
      free(x[r]);
      free(out[r]);
    }
    free(ref);
  }
  return naive_diff;
}

static void allreduce_case(int P) {
  char tag1[16], tag2[16];
  snprintf(tag1, sizeof tag1, "p%da", P);
  snprintf(tag2, sizeof tag2, "p%db", P);
  ar_arg_t a1 = {.seed = 1000 + (uint64_t)P, .tag = tag1};
  ar_arg_t a2 = {.seed = 1000 + (uint64_t)P, .tag = tag2};
  group_run(P, 5000, ar_worker, &a1);
  size_t naive = check_allreduce(P, a1.seed, tag1);
  if (P == 3) assert_true(naive > 0); /* the order check has teeth */
  if (P <= 2) assert_int_equal(naive, 0);
  /* A second, independent run: bit-identical. */
  group_run(P, 5000, ar_worker, &a2);
  check_allreduce(P, a2.seed, tag2);
  for (size_t s = 0; s < NSIZES; s++)
    for (int r = 0; r < P; r++) {
      char n1[64], n2[64];
      size_t l1, l2;
      snprintf(n1, sizeof n1, "ar.%s.%zu.%d", tag1, k_sizes[s], r);
      snprintf(n2, sizeof n2, "ar.%s.%zu.%d", tag2, k_sizes[s], r);
      char *b1 = read_whole(n1, &l1), *b2 = read_whole(n2, &l2);
      assert_non_null(b1);
      assert_non_null(b2);
      assert_int_equal(l1, l2);
      assert_memory_equal(b1, b2, l1);
      free(b1);
      free(b2);
    }
}

/* The rank-ordered sum: equal to ((x0 + x1) + x2) bitwise for every
 * element (where the ring's order would differ for P = 3), the same at any
 * offset: the values at position i of a buffer and at position i + 7 of a
 * longer one sum to the same bits. */
static int ordered_worker(coll_t *c, int rank, void *arg) {
  (void)arg;
  size_t n = 50000;
  float *a = malloc(n * sizeof *a), *b = malloc((n + 7) * sizeof *b);
  if (!a || !b) return 2;
  for (size_t i = 0; i < n; i++) a[i] = b[i + 7] = gen(77, rank, i);
  for (size_t i = 0; i < 7; i++) b[i] = 1.0f;
  if (coll_allreduce_sum_f32_ordered(c, a, n) != 0 || coll_allreduce_sum_f32_ordered(c, b, n + 7) != 0) return 3;
  int bad = memcmp(a, b + 7, n * sizeof *a) != 0;
  for (size_t i = 0; i < n && !bad; i++) {
    float want = gen(77, 0, i);
    for (int r = 1; r < coll_size(c); r++) want += gen(77, r, i);
    bad = memcmp(&want, &a[i], sizeof want) != 0;
  }
  free(a);
  free(b);
  return bad ? 4 : 0;
}

static void test_allreduce_ordered(void **state) {
  (void)state;
  group_run(3, 5000, ordered_worker, NULL);
  group_run(2, 5000, ordered_worker, NULL);
}

static void test_allreduce_p1(void **state) { allreduce_case(1); }
static void test_allreduce_p2(void **state) { allreduce_case(2); }
static void test_allreduce_p3(void **state) { allreduce_case(3); }

/* ---- broadcast, allgather, barrier ---- */

static const size_t k_bytes[] = {1, 1000, 5u << 20};

static uint8_t byte_of(int rank, size_t i) {
  return (uint8_t)(splitmix((uint64_t)rank * 7919 + i) >> 17);
}

static int bcast_worker(coll_t *c, int rank, void *arg) {
  int root = *(int *)arg;
  for (size_t s = 0; s < 3; s++) {
    size_t n = k_bytes[s];
    uint8_t *b = malloc(n);
    if (!b) return 2;
    for (size_t i = 0; i < n; i++) b[i] = byte_of(rank, i);
    if (coll_broadcast(c, b, n, root) != 0) return 3;
    for (size_t i = 0; i < n; i++)
      if (b[i] != byte_of(root, i)) return 4;
    free(b);
  }
  /* A root outside the group is the caller's bug, refused without
   * breaking the group. */
  uint8_t x = 7;
  if (coll_broadcast(c, &x, 1, coll_size(c)) != -EINVAL) return 5;
  if (coll_broadcast(c, &x, 1, -1) != -EINVAL) return 6;
  return coll_barrier(c) == 0 ? 0 : 7;
}

static void test_broadcast(void **state) {
  int root = 1;
  group_run(3, 5000, bcast_worker, &root);
  root = 0;
  group_run(2, 5000, bcast_worker, &root);
  group_run(1, 5000, bcast_worker, &root);
}

static const size_t k_each[] = {1, 13, 100000};

static int gather_worker(coll_t *c, int rank, void *arg) {
  int P = coll_size(c);
  for (size_t s = 0; s < 3; s++) {
    size_t n = k_each[s];
    uint8_t *in = malloc(n), *out = malloc(n * (size_t)P);
    if (!in || !out) return 2;
    for (size_t i = 0; i < n; i++) in[i] = byte_of(rank + 10, i);
    memset(out, 0xAA, n * (size_t)P);
    if (coll_allgather(c, in, n, out) != 0) return 3;
    for (int r = 0; r < P; r++)
      for (size_t i = 0; i < n; i++)
        if (out[(size_t)r * n + i] != byte_of(r + 10, i)) return 4;
    /* In place: the input already at this rank's slot. */
    memset(out, 0x55, n * (size_t)P);
    memcpy(out + (size_t)rank * n, in, n);
    if (coll_allgather(c, out + (size_t)rank * n, n, out) != 0) return 5;
    for (int r = 0; r < P; r++)
      for (size_t i = 0; i < n; i++)
        if (out[(size_t)r * n + i] != byte_of(r + 10, i)) return 6;
    free(in);
    free(out);
  }
  return 0;
}

static void test_allgather(void **state) {
  group_run(3, 5000, gather_worker, NULL);
  group_run(2, 5000, gather_worker, NULL);
  group_run(1, 5000, gather_worker, NULL);
}

/* Rank r arrives r * 300 ms late; nobody may leave before the last one
 * arrived.  Times are CLOCK_MONOTONIC, shared by all processes. */
static int barrier_worker(coll_t *c, int rank, void *arg) {
  usleep((useconds_t)rank * 300000);
  int64_t t[2];
  t[0] = now_ms();
  if (coll_barrier(c) != 0) return 3;
  t[1] = now_ms();
  char name[32];
  snprintf(name, sizeof name, "barrier.%d", rank);
  return write_file(name, t, sizeof t) == 0 ? 0 : 4;
}

static void test_barrier(void **state) {
  const int P = 3;
  group_run(P, 5000, barrier_worker, NULL);
  int64_t last_in = 0, t[MAXP][2];
  for (int r = 0; r < P; r++) {
    char name[32];
    snprintf(name, sizeof name, "barrier.%d", r);
    int64_t *v = read_whole(name, NULL);
    assert_non_null(v);
    t[r][0] = v[0];
    t[r][1] = v[1];
    free(v);
    if (t[r][0] > last_in) last_in = t[r][0];
  }
  for (int r = 0; r < P; r++) assert_true(t[r][1] >= last_in);
  assert_true(t[0][1] - t[0][0] >= 500); /* rank 0 really waited */
}

/* ---- alltoallv ---- */

/* Bytes rank q sends rank r in pattern `pat` of a group of P: 0 uneven
 * with empty blocks (rank 0's own; for P = 3 also 1 -> 2 and 2 -> 0), 1 all
 * empty, 2 only the own block, 3 rank 0 sends and receives nothing, 4 a
 * few MB each way and an empty own block on rank 1 (P = 2). */
static size_t a2a_len(int pat, int P, int q, int r) {
  switch (pat) {
  case 0: return (2 * q + r) % 4 == 0 ? 0 : (size_t)(q * 7 + r * 13 + P) % 37 + 1;
  case 1: return 0;
  case 2: return q == r ? (size_t)(q + 1) * 11 : 0;
  case 3: return q == 0 || r == 0 ? 0 : (size_t)(q * 3 + r) * 101;
  default: return q == r ? (size_t)(2u << 20) * (size_t)(1 - q) : (q == 0 ? (3u << 20) + 1 : (1u << 20) + 3);
  }
}

static uint8_t a2a_byte(int q, int r, size_t i) {
  return (uint8_t)(splitmix((uint64_t)q * 1000003 + (uint64_t)r * 7919 + i * 31) >> 23);
}

#define A2A_GUARD 64 /* bytes after recv that must stay untouched */

/* Runs pattern pat; 0 if every byte of recv is rank r's block for this
 * rank and the guard after it is intact. */
static int a2a_run(coll_t *c, int pat) {
  int P = coll_size(c), me = coll_rank(c), bad = 0;
  size_t sb[MAXP], rb[MAXP], stot = 0, rtot = 0;
  for (int r = 0; r < P; r++) {
    stot += sb[r] = a2a_len(pat, P, me, r);
    rtot += rb[r] = a2a_len(pat, P, r, me);
  }
  uint8_t *send = malloc(stot + 1), *recv = malloc(rtot + A2A_GUARD);
  if (!send || !recv) return 2;
  size_t off = 0;
  for (int r = 0; r < P; off += sb[r], r++)
    for (size_t i = 0; i < sb[r]; i++) send[off + i] = a2a_byte(me, r, i);
  memset(recv, 0xAA, rtot + A2A_GUARD);
  int rc = coll_alltoallv(c, send, sb, recv, rb);
  if (rc != 0) {
    fprintf(stderr, "rank %d pattern %d: %s\n", me, pat, err_str(rc));
    bad = 3;
  }
  off = 0;
  for (int r = 0; r < P && !bad; off += rb[r], r++)
    for (size_t i = 0; i < rb[r] && !bad; i++)
      if (recv[off + i] != a2a_byte(r, me, i)) bad = 4;
  for (size_t i = 0; i < A2A_GUARD && !bad; i++)
    if (recv[rtot + i] != 0xAA) bad = 5;
  free(send);
  free(recv);
  return bad;
}

static int a2a_worker(coll_t *c, int rank, void *arg) {
  (void)rank;
  const int *pats = arg;
  for (int k = 0; pats[k] >= 0; k++) {
    int rc = a2a_run(c, pats[k]);
    if (rc) return 10 * (k + 1) + rc;
  }
  /* NULL buffers are fine when there is nothing to move. */
  size_t zero[MAXP] = {0};
  return coll_alltoallv(c, NULL, zero, NULL, zero) == 0 ? 0 : 9;
}

static void test_alltoallv(void **state) {
  int pats[] = {0, 1, 2, 3, 0, 1, -1};
  group_run(3, 5000, a2a_worker, pats);
  group_run(2, 5000, a2a_worker, pats);
  group_run(1, 5000, a2a_worker, pats);
}

static void test_alltoallv_large(void **state) {
  int pats[] = {4, 0, -1};
  group_run(2, 5000, a2a_worker, pats);
}

/* The contract broken: in a group of 3, rank 0 sends rank 1 one byte
 * more than rank 1 expects, then rank 2's own block disagrees with
 * itself.  The ranks of the bad pair get -EINVAL and nothing from each
 * other, every other block arrives, and the group carries on. */
static int mismatch_worker(coll_t *c, int rank, void *arg) {
  (void)arg;
  const int P = 3;
  for (int round = 0; round < 2; round++) {
    size_t sb[3], rb[3], stot = 0, rtot = 0;
    for (int r = 0; r < P; r++) {
      stot += sb[r] = a2a_len(0, P, rank, r) + 5;
      rtot += rb[r] = a2a_len(0, P, r, rank) + 5;
    }
    int bad_pair = round == 0 ? (rank == 0 || rank == 1) : rank == 2;
    if (round == 0 && rank == 0) stot += 1, sb[1] += 1;
    if (round == 1 && rank == 2) stot += 2, sb[2] += 2;
    uint8_t *send = calloc(stot, 1), *recv = malloc(rtot + A2A_GUARD);
    if (!send || !recv) return 2;
    size_t off = 0;
    for (int r = 0; r < P; off += sb[r], r++)
      for (size_t i = 0; i < sb[r]; i++) send[off + i] = a2a_byte(rank, r, i);
    memset(recv, 0xAA, rtot + A2A_GUARD);
    int rc = coll_alltoallv(c, send, sb, recv, rb);
    if (rc != (bad_pair ? -EINVAL : 0)) return 3 + 10 * round;
    for (size_t i = 0; i < A2A_GUARD; i++)
      if (recv[rtot + i] != 0xAA) return 4 + 10 * round;
    /* Every agreed block arrived; the bad pair's stays untouched. */
    int peer = !bad_pair ? -1 : round == 1 ? 2 : 1 - rank;
    off = 0;
    for (int r = 0; r < P; off += rb[r], r++)
      for (size_t i = 0; i < rb[r]; i++)
        if (recv[off + i] != (r == peer ? 0xAA : a2a_byte(r, rank, i)))
          return 5 + 10 * round;
    free(send);
    free(recv);
  }
  /* Not latched: the group still works, for everyone. */
  int pats[] = {0, -1};
  return a2a_worker(c, rank, pats) == 0 ? 0 : 30;
}

static void test_alltoallv_mismatch(void **state) {
  group_run(3, 5000, mismatch_worker, NULL);
}

/* ---- failures ---- */

/* Every rank all-reduces 1M floats in a loop (or, with arg, alltoallv's
 * the same 4 MiB evenly over the group); the victim (rank 2) marks
 * "ready" after two rounds and keeps going until the parent kills or
 * stops it.  A survivor records (rc, time of failure, rc of the next
 * call) in "fail.<rank>". */
static int loop_worker(coll_t *c, int rank, void *arg) {
  size_t n = 1u << 20;
  float *b = calloc(n, sizeof *b);
  if (!b) return 2;
  int rc = 0;
  int a2a = arg != NULL; /* alltoallv instead of all-reduce */
  size_t sb[MAXP], rb[MAXP];
  uint8_t *out = a2a ? malloc(n * sizeof *b) : NULL;
  for (int r = 0; r < coll_size(c); r++) sb[r] = rb[r] = n * sizeof *b / (size_t)coll_size(c);
  if (a2a && !out) return 2;
  for (int it = 0; it < 100000; it++) {
    rc = a2a ? coll_alltoallv(c, b, sb, out, rb) : coll_allreduce_sum_f32(c, b, n);
    if (rc != 0) break;
    if (rank == 2 && it == 2) write_file("ready", "1", 1);
  }
  int64_t v[3] = {rc, now_ms(), coll_barrier(c)};
  free(b);
  free(out);
  char name[32];
  snprintf(name, sizeof name, "fail.%d", rank);
  write_file(name, v, sizeof v);
  return rc != 0 ? 0 : 5;
}

static void peer_failure_case(int sig, int64_t timeout_ms, void *arg) {
  group_t g = {0};
  const int P = 3;
  group_start(&g, P, P, timeout_ms, loop_worker, arg);
  int64_t t0 = now_ms();
  while (!file_exists("ready")) {
    if (now_ms() - t0 > 10000) {
      for (int r = 0; r < P; r++) kill(g.pid[r], SIGKILL);
      group_wait(&g);
      fail_msg("the victim never got going");
    }
    usleep(1000);
  }
  usleep(20000); /* well inside the loop of all-reduces */
  int64_t t_kill = now_ms();
  assert_int_equal(kill(g.pid[2], sig), 0);
  if (sig == SIGSTOP) {
    /* Survivors must give up on their own; then remove the victim. */
    int64_t until = now_ms() + 12000;
    while ((!file_exists("fail.0") || !file_exists("fail.1")) &&
           now_ms() < until)
      usleep(2000);
    kill(g.pid[2], SIGKILL);
  }
  group_wait(&g);
  assert_int_equal(g.status[2], 128 + SIGKILL);
  int deadlines = 0;
  for (int r = 0; r < 2; r++) {
    char name[32];
    snprintf(name, sizeof name, "fail.%d", r);
    int64_t *v = read_whole(name, NULL);
    if (!v) fail_msg("survivor %d recorded nothing (status %d)", r, g.status[r]);
    int64_t rc = v[0], dt = v[1] - t_kill, next = v[2];
    free(v);
    printf("  survivor %d: %s after %lld ms (timeout %lld ms)\n", r,
           err_str((int)rc), (long long)dt, (long long)timeout_ms);
    assert_int_equal(g.status[r], 0);
    assert_true(rc == ERR_UNAVAILABLE || rc == ERR_DEADLINE);
    deadlines += rc == ERR_DEADLINE;
    assert_true(dt < 10000);
    assert_int_equal(next, rc); /* the group stays failed */
  }
  /* A stopped peer closes nothing: only a timeout can notice it (the
   * other survivor may then see that one hang up). */
  if (sig == SIGSTOP) assert_true(deadlines >= 1);
  char p[256];
  path_of(p, sizeof p, "ready");
  unlink(p);
  for (int r = 0; r < 2; r++) {
    char name[32];
    snprintf(name, sizeof name, "fail.%d", r);
    path_of(p, sizeof p, name);
    unlink(p);
  }
}

/* Killed: the kernel closes its sockets, survivors see it at once. */
static void test_peer_killed(void **state) { peer_failure_case(SIGKILL, 2000, NULL); }
/* Stopped: sockets stay open and silent, only the timeout can tell. */
static void test_peer_stopped(void **state) { peer_failure_case(SIGSTOP, 2000, NULL); }
/* The same two inside alltoallv (4 MiB per rank, split evenly). */
static int g_a2a_flag = 1;
static void test_alltoallv_peer_killed(void **state) {
  peer_failure_case(SIGKILL, 2000, &g_a2a_flag);
}
static void test_alltoallv_peer_stopped(void **state) {
  peer_failure_case(SIGSTOP, 2000, &g_a2a_flag);
}

static int never_worker(coll_t *c, int rank, void *arg) { return 1; }

/* Rank 1 of 2 never starts: rank 0's coll_create times out on the store,
 * with a message naming what it waited for. */
static void test_store_timeout(void **state) {
  group_t g = {0};
  int64_t t0 = now_ms();
  group_start(&g, 2, 1, 1000, never_worker, NULL);
  group_wait(&g);
  int64_t dt = now_ms() - t0;
  assert_int_equal(g.status[0], 91);
  char *why = read_whole("create.0", NULL);
  assert_non_null(why);
  printf("  create: %s (%lld ms)\n", why, (long long)dt);
  assert_int_equal(atoi(why), ERR_DEADLINE);
  assert_non_null(strstr(why, "rank 1"));
  assert_non_null(strstr(why, g.prefix));
  assert_true(dt >= 1000 && dt < 5000);
  free(why);
  char p[256];
  path_of(p, sizeof p, "create.0");
  unlink(p);
}

/* ---- NCCL, arguments, the file store: in this process ---- */

/* Without a GPU (or without CUDA in the build) NCCL is refused at once
 * with a sentence.  With a GPU, rank 1 never starts, so rank 0's
 * communicator cannot initialize: ERR_DEADLINE after the timeout (the
 * abort path), never a hang. */
static void test_nccl_refused(void **state) {
  group_t g = {.backend = "nccl"};
  int64_t t0 = now_ms();
  group_start(&g, 2, 1, 1000, never_worker, NULL);
  group_wait(&g);
  int64_t dt = now_ms() - t0;
  assert_int_equal(g.status[0], 91);
  char *why = read_whole("create.0", NULL);
  assert_non_null(why);
  printf("  nccl: %s (%lld ms)\n", why, (long long)dt);
#ifdef CHANTER_CUDA
  if (atoi(why) == ERR_DEADLINE) { /* a GPU: the communicator waited for rank 1 */
    assert_true(dt >= 1000 && dt < 10000);
  } else {
    assert_int_equal(atoi(why), ERR_NOGPU);
    assert_non_null(strstr(why, "no CUDA device"));
  }
#else
  assert_int_equal(atoi(why), ERR_CONFIG);
  assert_non_null(strstr(why, "not built"));
#endif
  free(why);
  char p[256];
  path_of(p, sizeof p, "create.0");
  unlink(p);
}

static void test_backend_built(void **state) {
  assert_int_equal(coll_backend_built("gloo"), 1);
#ifdef CHANTER_CUDA
  assert_int_equal(coll_backend_built("nccl"), 1);
#else
  assert_int_equal(coll_backend_built("nccl"), 0);
#endif
  assert_int_equal(coll_backend_built("mpi"), 0);
  assert_int_equal(coll_backend_built(NULL), 0);
}

/* The backend choice: NCCL only with a GPU of its own for every rank. */
static void test_nccl_eligible(void **state) {
  char why[256];
  int a = 7, b = 7;
  const char *distinct[] = {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"};
  assert_int_equal(coll_nccl_eligible(distinct, 3, &a, &b, why, sizeof why), 1);
  assert_int_equal(a, -1);
  assert_int_equal(b, -1);
  assert_string_equal(why, "");
  assert_int_equal(coll_nccl_eligible(distinct, 2, NULL, NULL, NULL, 0), 1);

  /* two trainers on one GPU (local up with 2 trainers, or two processes
   * without CUDA_VISIBLE_DEVICES): Gloo, naming both ranks and the GPU */
  const char *shared[] = {"GPU-aaaa", "GPU-bbbb", "GPU-aaaa"};
  assert_int_equal(coll_nccl_eligible(shared, 3, &a, &b, why, sizeof why), 0);
  assert_int_equal(a, 0);
  assert_int_equal(b, 2);
  assert_string_equal(why, "trainers 0 and 2 share GPU GPU-aaaa");
  const char *all_one[] = {"GPU-aaaa", "GPU-aaaa"};
  assert_int_equal(coll_nccl_eligible(all_one, 2, &a, &b, why, sizeof why), 0);
  assert_int_equal(a, 0);
  assert_int_equal(b, 1);

  /* a rank without a device (CUDA=0 build, no GPU): Gloo */
  const char *missing[] = {"GPU-aaaa", "", "GPU-cccc"};
  assert_int_equal(coll_nccl_eligible(missing, 3, &a, &b, why, sizeof why), 0);
  assert_int_equal(a, 1);
  assert_int_equal(b, 1);
  assert_non_null(strstr(why, "trainer 1 has no GPU identity"));
  const char *null_id[] = {NULL, "GPU-bbbb"};
  assert_int_equal(coll_nccl_eligible(null_id, 2, &a, &b, why, sizeof why), 0);
  assert_int_equal(a, 0);
  assert_int_equal(coll_nccl_eligible(NULL, 2, NULL, NULL, why, sizeof why), 0);

  /* one rank: nothing to all-reduce */
  assert_int_equal(coll_nccl_eligible(distinct, 1, &a, &b, why, sizeof why), 0);
  assert_int_equal(a, -1);
  assert_non_null(strstr(why, "group of one"));
  /* a short why is cut, not overrun */
  char tiny[8];
  assert_int_equal(coll_nccl_eligible(shared, 3, NULL, NULL, tiny, sizeof tiny), 0);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
}

#ifdef CHANTER_CUDA
/* A group of one on the GPU: every operation on device buffers, results
 * checked on the host; 0 or the step that failed. */
static int nccl_one_worker(coll_t *c, int rank, void *arg) {
  (void)arg;
  const size_t n = 1000;
  float host[1000], back[1000];
  float *d = NULL, *d2 = NULL;
  int code = 0;
  for (size_t i = 0; i < n; i++) host[i] = (float)i * 0.5f - (float)rank;
  if (strcmp(coll_backend(c), "nccl") != 0) return 10;
  if (cudaMalloc((void **)&d, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&d2, n * sizeof(float)) != cudaSuccess)
    return 11;
  if (cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess) code = 12;
  if (!code && coll_allreduce_sum_f32(c, d, n) != 0) code = 13;
  if (!code && coll_broadcast(c, d, n * sizeof(float), 0) != 0) code = 14;
  if (!code && coll_barrier(c) != 0) code = 15;
  if (!code && coll_allgather(c, d, n * sizeof(float), d2) != 0) code = 16;
  size_t sb[1] = {n * sizeof(float)}, rb[1] = {n * sizeof(float)};
  if (!code && cudaMemset(d, 0, n * sizeof(float)) != cudaSuccess) code = 17;
  if (!code && coll_alltoallv(c, d2, sb, d, rb) != 0) code = 18;
  if (!code && cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost) != cudaSuccess) code = 19;
  if (!code && memcmp(back, host, sizeof back) != 0) code = 20;
  cudaFree(d);
  cudaFree(d2);
  return code;
}

/* Two ranks on the one GPU: NCCL refuses (duplicate GPU) or times out;
 * either way both ranks fail within the timeout, neither hangs. */
static int nccl_never_worker(coll_t *c, int rank, void *arg) {
  (void)c, (void)rank, (void)arg;
  return 30; /* must not be reached */
}
#endif

/* On a machine with a GPU: the NCCL backend for real, as far as one GPU
 * allows.  Elsewhere: a note, nothing to check. */
static void test_nccl_on_gpu(void **state) {
#ifdef CHANTER_CUDA
  group_t g = {.backend = "nccl"};
  group_start(&g, 1, 1, 5000, nccl_one_worker, NULL);
  group_wait(&g);
  char *why = read_whole("create.0", NULL);
  if (why && atoi(why) == ERR_NOGPU) {
    printf("  no GPU here: the NCCL backend is not run (%s)\n", why);
    free(why);
    char p[256];
    path_of(p, sizeof p, "create.0");
    unlink(p);
    return;
  }
  if (why) fail_msg("a group of one on the GPU: create failed: %s", why);
  assert_int_equal(g.status[0], 0);
  printf("  nccl: a group of one ran every operation on the GPU\n");

  group_t g2 = {.backend = "nccl"};
  int64_t t0 = now_ms();
  group_start(&g2, 2, 2, 3000, nccl_never_worker, NULL);
  group_wait(&g2);
  int64_t dt = now_ms() - t0;
  for (int r = 0; r < 2; r++) {
    char name[32];
    snprintf(name, sizeof name, "create.%d", r);
    char *w = read_whole(name, NULL);
    printf("  nccl, two ranks on one GPU: rank %d: %s (%lld ms)\n", r, w ? w : "(created?)", (long long)dt);
    assert_int_equal(g2.status[r], 91);
    free(w);
    char p[256];
    path_of(p, sizeof p, name);
    unlink(p);
  }
  assert_true(dt < 10000);
#else
  printf("  built without CUDA: nothing to run\n");
#endif
}

/* An address this host does not have: a clear error, not a hang. */
static void test_bad_iface(void **state) {
  group_t g = {.iface = "203.0.113.7"}; /* TEST-NET-3 */
  group_start(&g, 1, 1, 1000, never_worker, NULL);
  group_wait(&g);
  assert_int_equal(g.status[0], 91);
  char *why = read_whole("create.0", NULL);
  assert_non_null(why);
  printf("  iface: %s\n", why);
  assert_int_equal(atoi(why), ERR_CONFIG);
  assert_non_null(strstr(why, "203.0.113.7"));
  free(why);
  char p[256];
  path_of(p, sizeof p, "create.0");
  unlink(p);
}

static void test_bad_args(void **state) {
  coll_store_t s;
  coll_t *c = (coll_t *)1;
  char err[256];
  assert_int_equal(coll_file_store_init(&s, g_dir), 0);
  coll_opts_t o = {.rank = 2, .size = 2};
  assert_int_equal(coll_create(&o, &s, &c, err, sizeof err), -EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "rank 2"));
  o = (coll_opts_t){.rank = 0, .size = 1, .backend = "mpi"};
  assert_int_equal(coll_create(&o, &s, &c, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "mpi"));
  assert_int_equal(coll_create(&o, NULL, &c, err, sizeof err), -EINVAL);
  coll_file_store_close(&s);
  assert_int_equal(coll_file_store_init(&s, "/nonexistent/dir"), -ENOENT);
}

static void test_file_store(void **state) {
  coll_store_t s;
  assert_int_equal(coll_file_store_init(&s, g_dir), 0);
  const char *key = "job 7/gen.1/../x%y";
  assert_int_equal(s.set(s.ud, key, "hello", 5), 0);
  void *v = NULL;
  size_t len = 0;
  assert_int_equal(s.get(s.ud, key, &v, &len, 100), 0);
  assert_int_equal(len, 5);
  assert_memory_equal(v, "hello", 5);
  free(v);
  /* Overwrite, and an empty value. */
  assert_int_equal(s.set(s.ud, key, "", 0), 0);
  assert_int_equal(s.get(s.ud, key, &v, &len, 100), 0);
  assert_int_equal(len, 0);
  free(v);
  /* A key that never comes: ERR_DEADLINE after about the timeout. */
  int64_t t0 = now_ms();
  assert_int_equal(s.get(s.ud, "missing", &v, &len, 200), ERR_DEADLINE);
  int64_t dt = now_ms() - t0;
  assert_true(dt >= 200 && dt < 1000);
  /* The key stayed inside the directory. */
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)))
    if (strstr(e->d_name, "job%207%2Fgen.1%2F..%2Fx%25y")) found++;
  closedir(d);
  assert_int_equal(found, 1);
  coll_file_store_close(&s);
}

static int group_setup(void **state) {
  snprintf(g_dir, sizeof g_dir, "/tmp/chanter-coll-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int group_teardown(void **state) {
  DIR *d = opendir(g_dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, "..")))
        continue;
      char p[512];
      snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_file_store),    cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_allreduce_p1),  cmocka_unit_test(test_allreduce_p2),
      cmocka_unit_test(test_allreduce_p3),
      cmocka_unit_test(test_allreduce_ordered),  cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_allgather),     cmocka_unit_test(test_barrier),
      cmocka_unit_test(test_alltoallv),     cmocka_unit_test(test_alltoallv_large),
      cmocka_unit_test(test_alltoallv_mismatch),
      cmocka_unit_test(test_peer_killed),   cmocka_unit_test(test_peer_stopped),
      cmocka_unit_test(test_alltoallv_peer_killed),
      cmocka_unit_test(test_alltoallv_peer_stopped),
      cmocka_unit_test(test_store_timeout), cmocka_unit_test(test_nccl_refused),
      cmocka_unit_test(test_backend_built), cmocka_unit_test(test_nccl_eligible),
      cmocka_unit_test(test_nccl_on_gpu),   cmocka_unit_test(test_bad_iface),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
