/*
 * Unit tests of the embedding server's storage engine (embedding_store):
 * lazy init, write/lookup through the memory tier and RocksDB, eviction
 * under a tiny budget, durability across kill -9, checkpoint/restore, blobs,
 * rejection of bad requests, layout checks, digests, concurrency, sealing
 * (manifests, and the sweep of an interrupted seal's temporaries),
 * checkpoint deletion, clear, the set digest across
 * shardings, reading a checkpoint from disk (store_reader_*) and clear that
 * keeps the checkpoints.  Each test works in its own mkdtemp dir under /tmp.
 *
 * The kill -9 test re-executes this binary (/proc/self/exe) with
 * "--durability-child DIR FD" so that the child starts RocksDB in a fresh
 * process instead of a fork of one that already has RocksDB threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "store.h"
#include "err.h"
#include "log.h"
#include "shard.h"
#include "table.h"
#include "testutil.h"

/* ------------------------------------------------------------ fixtures */

/* t0: small, SGD; t1: big, row-wise Adagrad; t2: Adam-ish state = dim */
static void make_layout(table_layout_t *l, uint64_t seed) {
  assert_int_equal(table_layout_init(l, 3, seed), 0);
  l->tables[0] = (table_info_t){.rows = 1000, .dim = 8, .state_floats = 0};
  l->tables[1] = (table_info_t){.rows = 100000, .dim = 16, .state_floats = 1};
  l->tables[2] = (table_info_t){.rows = 50000, .dim = 4, .state_floats = 4};
}

typedef struct fx_s {
  char dir[64];
  table_layout_t layout;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f) return -1;
  if (testutil_tmpdir(f->dir, sizeof f->dir, "embstore")) return -1;
  make_layout(&f->layout, 42);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  testutil_rmtree(f->dir);
  table_layout_close(&f->layout);
  free(f);
  return 0;
}

static store_t *open_full(const char *dir, const table_layout_t *l, size_t hot_bytes, int sync,
                              const shard_map_t *map, uint32_t shard) {
  store_opts_t o = {.data_dir = dir,
                        .layout = l,
                        .shard_map = map,
                        .shard = shard,
                        .hot_bytes = hot_bytes,
                        .block_cache_bytes = 8u << 20,
                        .sync_writes = sync};
  store_t *s = NULL;
  char why[512] = "";
  int rc = store_open(&o, &s, why, sizeof why);
  if (rc) fprintf(stderr, "open failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
  assert_non_null(s);
  return s;
}

static store_t *open_store(fx_t *f, size_t hot_bytes) {
  return open_full(f->dir, &f->layout, hot_bytes, 0, NULL, 0);
}

/* A deterministic finite value for (key, float index, version). */
static float val(uint64_t key, uint32_t j, uint32_t ver) {
  uint64_t h = table_mix64(key * 1000003u + j * 7919u + (uint64_t)ver * 104729u + 1);
  return (float)((int32_t)(h & 0xffffff) - 0x800000) / 65536.0f;
}

static size_t total_floats(const table_layout_t *l, const uint64_t *keys, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; i++) t += table_row_floats(l, TABLE_ID(keys[i]));
  return t;
}

/* rows for keys at version ver (packed); caller frees */
static float *make_rows(const table_layout_t *l, const uint64_t *keys, size_t n, uint32_t ver) {
  float *r = malloc((total_floats(l, keys, n) + 1) * sizeof(float));
  assert_non_null(r);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t nf = table_row_floats(l, TABLE_ID(keys[i]));
    for (uint32_t j = 0; j < nf; j++) r[at + j] = val(keys[i], j, ver);
    at += nf;
  }
  return r;
}

/* initial rows (lazy init) for keys; caller frees */
static float *init_rows(const table_layout_t *l, const uint64_t *keys, size_t n) {
  float *r = malloc((total_floats(l, keys, n) + 1) * sizeof(float));
  assert_non_null(r);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    table_init_row(l, keys[i], r + at);
    at += table_row_floats(l, TABLE_ID(keys[i]));
  }
  return r;
}

static void write_ok(store_t *s, const table_layout_t *l, const uint64_t *keys, size_t n,
                     const float *rows, int flags) {
  char why[512] = "";
  int rc = store_write(s, keys, n, rows, total_floats(l, keys, n) * sizeof(float), flags, why,
                           sizeof why);
  if (rc) fprintf(stderr, "write failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
}

/* Looks keys up and asserts the result equals expect bit for bit. */
static void expect_rows(store_t *s, const table_layout_t *l, const uint64_t *keys, size_t n,
                        const float *expect, int flags, store_lookup_info_t *info) {
  size_t bytes = total_floats(l, keys, n) * sizeof(float);
  float *got = malloc(bytes + sizeof(float));
  assert_non_null(got);
  char why[512] = "";
  int rc = store_lookup(s, keys, n, got, bytes, flags, info, why, sizeof why);
  if (rc) fprintf(stderr, "lookup failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
  assert_memory_equal(got, expect, bytes);
  free(got);
}

static void digest_of(store_t *s, uint8_t d[32], uint64_t *rows) {
  assert_int_equal(store_digest(s, d, NULL, rows), 0);
}

/* keys spread over the three tables */
static uint64_t *mixed_keys(size_t n, uint64_t salt) {
  uint64_t *k = malloc(n * sizeof *k);
  assert_non_null(k);
  const uint64_t rows[3] = {1000, 100000, 50000};
  for (size_t i = 0; i < n; i++) {
    uint32_t t = (uint32_t)(i % 3);
    k[i] = TABLE_KEY(t, (i * 7919 + salt) % rows[t]);
  }
  return k;
}

/* n keys of tables 1 and 2 that are not in avoid[] */
static uint64_t *fresh_keys(size_t n, const uint64_t *avoid, size_t navoid) {
  uint64_t *k = malloc(n * sizeof *k);
  assert_non_null(k);
  size_t got = 0;
  for (uint64_t r = 0; got < n; r++) {
    uint64_t c = TABLE_KEY(1 + r % 2, 20011 + r * 3);
    int dup = 0;
    for (size_t i = 0; i < navoid && !dup; i++) dup = avoid[i] == c;
    if (!dup) k[got++] = c;
  }
  return k;
}

/* ------------------------------------------------------------ 1. lazy init */

static void test_lazy_init(void **state) {
  fx_t *f = *state;
  size_t n = 300;
  uint64_t *keys = mixed_keys(n, 1);
  float *init = init_rows(&f->layout, keys, n);
  store_t *s = open_store(f, 1u << 20);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys, n, init, 0, &info);
  assert_int_equal(info.lazy_inits, n);
  assert_int_equal(info.hot_hits, 0);
  expect_rows(s, &f->layout, keys, n, init, 0, &info); /* second time: the memory tier */
  assert_int_equal(info.hot_hits, n);
  expect_rows(s, &f->layout, keys, n, init, STORE_LOOKUP_NO_HOT, &info);
  assert_int_equal(info.lazy_inits, n);
  assert_int_equal(info.kv_reads, 0);
  uint64_t rows = 99;
  uint8_t d[32];
  digest_of(s, d, &rows);
  assert_int_equal(rows, 0); /* lazy init stores nothing */
  store_close(s);

  s = open_store(f, 1u << 20);
  expect_rows(s, &f->layout, keys, n, init, 0, &info);
  assert_int_equal(info.lazy_inits, n);
  digest_of(s, d, &rows);
  assert_int_equal(rows, 0);
  store_stats_t st;
  store_stats(s, &st);
  assert_int_equal(st.lookup_calls, 1);
  assert_int_equal(st.lazy_inits, n);
  assert_int_equal(st.write_rows, 0);
  store_close(s);
  free(init);
  free(keys);
}

/* ------------------------------------------------------------ 2. write/lookup */

static void test_write_lookup(void **state) {
  fx_t *f = *state;
  size_t n = 600;
  uint64_t *keys = mixed_keys(n, 5);
  float *rows = make_rows(&f->layout, keys, n, 1);
  rows[0] = -0.0f; /* bit-exact, not just == */
  uint32_t nan_bits = 0x7fc01234u;
  memcpy(&rows[3], &nan_bits, 4);
  store_t *s = open_store(f, 1u << 20);
  size_t need = 0;
  char why[512];
  assert_int_equal(store_rows_bytes(s, keys, n, &need, why, sizeof why), 0);
  assert_int_equal(need, total_floats(&f->layout, keys, n) * sizeof(float));
  write_ok(s, &f->layout, keys, n, rows, 0);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys, n, rows, 0, &info);
  assert_int_equal(info.hot_hits, n); /* writes upsert the memory tier */
  expect_rows(s, &f->layout, keys, n, rows, STORE_LOOKUP_NO_HOT, &info);
  assert_int_equal(info.kv_reads, n);
  assert_int_equal(info.hot_hits, 0);

  /* a subset, reversed, with a duplicate and a never-written key */
  uint64_t sub[4] = {keys[10], keys[4], keys[10], TABLE_KEY(2, 49999)};
  float *exp = malloc(total_floats(&f->layout, sub, 4) * sizeof(float));
  size_t at = 0;
  for (int i = 0; i < 3; i++) {
    size_t src = 0, idx = i == 1 ? 4 : 10;
    for (size_t j = 0; j < idx; j++) src += table_row_floats(&f->layout, TABLE_ID(keys[j]));
    uint32_t nf = table_row_floats(&f->layout, TABLE_ID(sub[i]));
    memcpy(exp + at, rows + src, nf * sizeof(float));
    at += nf;
  }
  table_init_row(&f->layout, sub[3], exp + at);
  expect_rows(s, &f->layout, sub, 4, exp, STORE_LOOKUP_NO_HOT, &info);
  assert_int_equal(info.kv_reads, 3);
  assert_int_equal(info.lazy_inits, 1);

  /* overwrite a few through STORE_WRITE_NO_HOT: the cached copy must not be stale */
  float *rows2 = make_rows(&f->layout, keys, 30, 2);
  write_ok(s, &f->layout, keys, 30, rows2, STORE_WRITE_NO_HOT);
  expect_rows(s, &f->layout, keys, 30, rows2, 0, NULL);
  memcpy(rows, rows2, total_floats(&f->layout, keys, 30) * sizeof(float));

  uint8_t d1[32], d2[32];
  uint64_t c1, c2;
  digest_of(s, d1, &c1);
  assert_int_equal(c1, n);
  store_close(s);

  s = open_store(f, 1u << 20);
  expect_rows(s, &f->layout, keys, n, rows, STORE_LOOKUP_NO_HOT, &info);
  assert_int_equal(info.kv_reads, n);
  expect_rows(s, &f->layout, keys, n, rows, 0, &info);
  expect_rows(s, &f->layout, keys, n, rows, 0, &info);
  assert_int_equal(info.hot_hits, n);
  digest_of(s, d2, &c2);
  assert_int_equal(c2, n);
  assert_memory_equal(d1, d2, 32);
  store_stats_t st;
  store_stats(s, &st);
  assert_true(st.stored_rows_estimate > 0);
  assert_true(st.hot_rows >= n && st.hot_bytes <= st.hot_capacity_bytes);
  store_close(s);
  /* n == 0 is a no-op */
  s = open_store(f, 0);
  assert_int_equal(store_write(s, keys, 0, rows, 0, 0, why, sizeof why), 0);
  assert_int_equal(store_lookup(s, keys, 0, rows, 0, 0, NULL, why, sizeof why), 0);
  expect_rows(s, &f->layout, keys, n, rows, 0, &info); /* no memory tier at all */
  assert_int_equal(info.kv_reads, n);
  store_close(s);
  free(rows2);
  free(exp);
  free(rows);
  free(keys);
}

/* ------------------------------------------------------------ 3. tiny memory tier */

static void test_hot_eviction(void **state) {
  fx_t *f = *state;
  const size_t n = 20000, batch = 1000;
  uint64_t *keys = malloc(n * sizeof *keys);
  for (size_t i = 0; i < n; i++) keys[i] = TABLE_KEY(1, i * 3);
  float *rows = make_rows(&f->layout, keys, n, 7);
  store_t *s = open_store(f, 64u << 10);
  size_t rf = table_row_floats(&f->layout, 1);
  for (size_t b = 0; b < n; b += batch) write_ok(s, &f->layout, keys + b, batch, rows + b * rf, 0);
  store_stats_t st;
  store_stats(s, &st);
  assert_true(st.hot_evictions > 0);
  assert_true(st.hot_bytes <= st.hot_capacity_bytes);
  assert_int_equal(st.hot_capacity_bytes, 64u << 10);
  for (size_t b = 0; b < n; b += batch)
    expect_rows(s, &f->layout, keys + b, batch, rows + b * rf, 0, NULL);
  /* a small working set read repeatedly stays hot */
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys + 100, 50, rows + 100 * rf, 0, NULL);
  expect_rows(s, &f->layout, keys + 100, 50, rows + 100 * rf, 0, &info);
  assert_true(info.hot_hits > 25);
  store_stats(s, &st);
  assert_true(st.hot_bytes <= st.hot_capacity_bytes);
  assert_true(st.hot_rows > 0 && st.hot_rows < 1000);
  assert_int_equal(st.lookup_rows, n + 100);
  assert_int_equal(st.write_rows, n);
  store_close(s);
  free(rows);
  free(keys);
}

/* ------------------------------------------------------------ 4. kill -9 */

#define DURA_N 3000
static uint64_t dura_key(size_t i) { return TABLE_KEY(i % 3, (i * 13) % 1000); }

/* The child: open, write DURA_N rows in batches with sync_writes=1, report
 * "ok" after the last call returned, then wait to be killed. */
static int durability_child(const char *dir, int fd) {
  table_layout_t l;
  make_layout(&l, 42);
  store_opts_t o = {.data_dir = dir, .layout = &l, .hot_bytes = 1u << 20, .sync_writes = 1};
  store_t *s = NULL;
  char why[512];
  if (store_open(&o, &s, why, sizeof why) != 0) return 2;
  uint64_t keys[DURA_N];
  for (size_t i = 0; i < DURA_N; i++) keys[i] = dura_key(i);
  for (size_t b = 0; b < DURA_N; b += 500) {
    size_t nb = 500;
    size_t floats = 0;
    for (size_t i = 0; i < nb; i++) floats += table_row_floats(&l, TABLE_ID(keys[b + i]));
    float *rows = malloc(floats * sizeof(float));
    size_t at = 0;
    for (size_t i = 0; i < nb; i++) {
      uint32_t nf = table_row_floats(&l, TABLE_ID(keys[b + i]));
      for (uint32_t j = 0; j < nf; j++) rows[at + j] = val(keys[b + i], j, 9);
      at += nf;
    }
    int rc = store_write(s, keys + b, nb, rows, floats * sizeof(float), 0, why, sizeof why);
    free(rows);
    if (rc) return 3;
  }
  if (write(fd, "ok", 2) != 2) return 4;
  for (;;) pause();
}

static void test_kill9_durability(void **state) {
  fx_t *f = *state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", p[1]);
    execl("/proc/self/exe", "test_embedding_store", "--durability-child", f->dir, fdbuf,
          (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  char buf[3] = "";
  ssize_t r;
  do r = read(p[0], buf, 2);
  while (r < 0 && errno == EINTR);
  close(p[0]);
  assert_int_equal(r, 2);
  assert_memory_equal(buf, "ok", 2);
  assert_int_equal(kill(pid, SIGKILL), 0);
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);

  uint64_t keys[DURA_N];
  for (size_t i = 0; i < DURA_N; i++) keys[i] = dura_key(i);
  /* dura_key is injective on [0, DURA_N) (CRT: 3 and 1000 are coprime) */
  float *exp = make_rows(&f->layout, keys, DURA_N, 9);
  store_t *s = open_store(f, 1u << 20);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys, DURA_N, exp, STORE_LOOKUP_NO_HOT, &info);
  assert_int_equal(info.kv_reads, DURA_N);
  assert_int_equal(info.lazy_inits, 0);
  store_close(s);
  free(exp);
}

/* ------------------------------------------------------------ 5. checkpoint/restore */

static void test_checkpoint_restore(void **state) {
  fx_t *f = *state;
  size_t n = 400;
  uint64_t *keys = mixed_keys(n, 11);
  float *v1 = make_rows(&f->layout, keys, n, 1);
  store_t *s = open_store(f, 1u << 20);
  char why[512] = "";
  write_ok(s, &f->layout, keys, n, v1, 0);
  assert_int_equal(store_put_blob(s, "dense.trainer0", "before", 6, why, sizeof why), 0);
  uint8_t dck[32], d[32];
  uint64_t cck, c;
  digest_of(s, dck, &cck);
  assert_int_equal(cck, n);
  store_checkpoint_info_t ci;
  time_t t0 = time(NULL);
  assert_int_equal(store_checkpoint(s, "iter-100.a_B", &ci, why, sizeof why), 0);
  assert_string_equal(ci.id, "iter-100.a_B");
  assert_true(ci.bytes > 0);
  assert_true(ci.created_unix >= (uint64_t)t0 - 1 && ci.created_unix <= (uint64_t)time(NULL) + 1);
  struct stat sb;
  assert_int_equal(stat(ci.path, &sb), 0);
  assert_true(S_ISDIR(sb.st_mode));
  assert_non_null(strstr(ci.path, "/checkpoints/iter-100.a_B"));

  /* rejected ids */
  assert_int_equal(store_checkpoint(s, "iter-100.a_B", NULL, why, sizeof why), ERR_EXISTS);
  assert_non_null(strstr(why, "already exists"));
  assert_int_equal(store_checkpoint(s, "bad/id", NULL, why, sizeof why), -EINVAL);
  assert_non_null(strstr(why, "not valid"));
  assert_int_equal(store_checkpoint(s, "", NULL, why, sizeof why), -EINVAL);
  assert_int_equal(store_checkpoint(s, "..", NULL, why, sizeof why), -EINVAL);
  char long_id[66];
  memset(long_id, 'x', 65);
  long_id[65] = 0;
  assert_int_equal(store_checkpoint(s, long_id, NULL, why, sizeof why), -EINVAL);
  long_id[64] = 0; /* 64 chars is fine */
  assert_int_equal(store_checkpoint(s, long_id, NULL, why, sizeof why), 0);

  /* after the checkpoint: overwrite half, add new keys, change the blob */
  float *v2 = make_rows(&f->layout, keys, n / 2, 2);
  write_ok(s, &f->layout, keys, n / 2, v2, 0);
  uint64_t *fresh = fresh_keys(100, keys, n);
  float *fv = make_rows(&f->layout, fresh, 100, 3);
  write_ok(s, &f->layout, fresh, 100, fv, 0);
  assert_int_equal(store_put_blob(s, "dense.trainer0", "after!", 6, why, sizeof why), 0);
  expect_rows(s, &f->layout, keys, n / 2, v2, 0, NULL);
  expect_rows(s, &f->layout, fresh, 100, fv, 0, NULL); /* both now in the memory tier */
  digest_of(s, d, &c);
  assert_memory_not_equal(d, dck, 32);

  /* list */
  store_checkpoint_info_t *list = NULL;
  size_t nl = 0;
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 2);
  assert_string_equal(list[0].id, "iter-100.a_B"); /* sorted by id */
  assert_string_equal(list[1].id, long_id);
  assert_int_equal(list[0].bytes, ci.bytes);
  assert_int_equal(list[0].created_unix, ci.created_unix);
  assert_string_equal(list[0].path, ci.path);
  free(list);

  /* restore errors */
  assert_int_equal(store_restore(s, "nope", why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "nope"));
  assert_int_equal(store_restore(s, "a b", why, sizeof why), -EINVAL);

  /* restore */
  assert_int_equal(store_restore(s, "iter-100.a_B", why, sizeof why), 0);
  float *finit = init_rows(&f->layout, fresh, 100);
  expect_rows(s, &f->layout, keys, n, v1, 0, NULL); /* overwritten rows are back */
  expect_rows(s, &f->layout, keys, n, v1, STORE_LOOKUP_NO_HOT, NULL);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, fresh, 100, finit, 0, &info); /* new rows: lazy init again */
  assert_int_equal(info.lazy_inits, 100);
  digest_of(s, d, &c);
  assert_int_equal(c, n);
  assert_memory_equal(d, dck, 32);
  void *blob = NULL;
  size_t bl = 0;
  assert_int_equal(store_get_blob(s, "dense.trainer0", &blob, &bl), 0);
  assert_int_equal(bl, 6);
  assert_memory_equal(blob, "before", 6);
  free(blob);
  /* the store keeps working after a restore, and the restore persists */
  write_ok(s, &f->layout, fresh, 10, fv, 0);
  store_close(s);
  s = open_store(f, 1u << 20);
  expect_rows(s, &f->layout, keys, n, v1, 0, NULL);
  expect_rows(s, &f->layout, fresh, 10, fv, 0, NULL);
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 2);
  free(list);
  /* no leftovers of the restore next to db/ */
  char p[256];
  snprintf(p, sizeof p, "%s/db.restore", f->dir);
  assert_int_not_equal(stat(p, &sb), 0);
  store_close(s);
  free(finit);
  free(fv);
  free(fresh);
  free(v2);
  free(v1);
  free(keys);
}

/* ------------------------------------------------------------ 6. blobs */

static void test_blobs(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f, 0);
  char why[512] = "";
  size_t big_len = 5u << 20;
  uint8_t *big = malloc(big_len);
  for (size_t i = 0; i < big_len; i++) big[i] = (uint8_t)(table_mix64(i) >> 56);
  assert_int_equal(store_put_blob(s, "cache.trainer-1", big, big_len, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "small", "abc", 3, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "empty", NULL, 0, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "small", "xyz!", 4, why, sizeof why), 0); /* overwrite */
  assert_int_equal(store_put_blob(s, "bad name", "x", 1, why, sizeof why), -EINVAL);
  assert_non_null(strstr(why, "not valid"));
  char long_name[130];
  memset(long_name, 'n', 129);
  long_name[129] = 0;
  assert_int_equal(store_put_blob(s, long_name, "x", 1, why, sizeof why), -EINVAL);
  long_name[128] = 0;
  assert_int_equal(store_put_blob(s, long_name, "x", 1, why, sizeof why), 0);
  for (int round = 0; round < 2; round++) {
    void *d = NULL;
    size_t len = 0;
    assert_int_equal(store_get_blob(s, "cache.trainer-1", &d, &len), 0);
    assert_int_equal(len, big_len);
    assert_memory_equal(d, big, big_len);
    free(d);
    assert_int_equal(store_get_blob(s, "small", &d, &len), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(d, "xyz!", 4);
    free(d);
    assert_int_equal(store_get_blob(s, "empty", &d, &len), 0);
    assert_int_equal(len, 0);
    assert_non_null(d);
    free(d);
    assert_int_equal(store_get_blob(s, long_name, &d, &len), 0);
    free(d);
    assert_int_equal(store_get_blob(s, "missing", &d, &len), ERR_NOTFOUND);
    assert_null(d);
    assert_int_equal(store_get_blob(s, "../etc", &d, &len), -EINVAL);
    store_close(s);
    s = open_store(f, 0);
  }
  uint64_t rows;
  uint8_t dg[32];
  digest_of(s, dg, &rows);
  assert_int_equal(rows, 0); /* blobs are not rows */
  store_close(s);
  free(big);
}

/* ------------------------------------------------------------ 7. bad input */

static void test_bad_input(void **state) {
  fx_t *f = *state;
  shard_map_t map;
  /* t0 (1000 rows) goes whole to one server, t1/t2 are spread row-wise */
  assert_int_equal(shard_map_init(&map, &f->layout, 2, 2000), 0);
  /* pick keys of server 0 and one of server 1 */
  uint64_t mine[8], theirs = 0;
  size_t nm = 0;
  for (uint64_t r = 0; nm < 8 || !theirs; r++) {
    uint64_t k = TABLE_KEY(1, r);
    if (shard_of(&map, k) == 0 && nm < 8) mine[nm++] = k;
    if (shard_of(&map, k) == 1 && !theirs) theirs = k;
  }
  store_t *s = open_full(f->dir, &f->layout, 1u << 20, 0, &map, 0);
  float *v1 = make_rows(&f->layout, mine, 8, 1);
  write_ok(s, &f->layout, mine, 8, v1, 0);
  uint8_t d0[32], d1[32];
  uint64_t c0, c1;
  digest_of(s, d0, &c0);
  assert_int_equal(c0, 8);

  char why[512];
  size_t rf = table_row_floats(&f->layout, 1);
  float *v2 = make_rows(&f->layout, mine, 8, 2); /* what a partial write would leave */
  float *buf = calloc(8 * 64, sizeof(float));
  uint64_t req[4] = {mine[0], mine[1], mine[2], mine[3]};
  size_t bytes = 4 * rf * sizeof(float);

  /* unknown table at index 2 */
  req[2] = TABLE_KEY(7, 1);
  assert_int_equal(store_write(s, req, 4, v2, bytes, 0, why, sizeof why), -ENOENT);
  assert_non_null(strstr(why, "request index 2"));
  assert_non_null(strstr(why, "table 7"));
  assert_int_equal(store_lookup(s, req, 4, buf, bytes, 0, NULL, why, sizeof why), -ENOENT);
  assert_non_null(strstr(why, "request index 2"));
  size_t need = 1;
  assert_int_equal(store_rows_bytes(s, req, 4, &need, why, sizeof why), -ENOENT);
  assert_non_null(strstr(why, "request index 2"));

  /* row out of range at index 1 */
  req[2] = mine[2];
  req[1] = TABLE_KEY(1, 100000);
  assert_int_equal(store_write(s, req, 4, v2, bytes, 0, why, sizeof why), -ERANGE);
  assert_non_null(strstr(why, "request index 1"));
  assert_non_null(strstr(why, "row 100000"));
  assert_int_equal(store_lookup(s, req, 4, buf, bytes, 0, NULL, why, sizeof why), -ERANGE);

  /* key of the other server at index 3 */
  req[1] = mine[1];
  req[3] = theirs;
  assert_int_equal(store_write(s, req, 4, v2, bytes, 0, why, sizeof why), ERR_WRONGSHARD);
  assert_non_null(strstr(why, "request index 3"));
  assert_non_null(strstr(why, "embedding server 1"));
  assert_int_equal(store_lookup(s, req, 4, buf, bytes, 0, NULL, why, sizeof why),
                   ERR_WRONGSHARD);
  assert_int_equal(store_rows_bytes(s, req, 4, &need, why, sizeof why), ERR_WRONGSHARD);

  /* rows_bytes short by 4 */
  req[3] = mine[3];
  assert_int_equal(store_write(s, req, 4, v2, bytes - 4, 0, why, sizeof why), -EINVAL);
  assert_non_null(strstr(why, "short by 4"));
  assert_int_equal(store_lookup(s, req, 4, buf, bytes - 4, 0, NULL, why, sizeof why), -EINVAL);
  assert_int_equal(store_rows_bytes(s, req, 4, &need, why, sizeof why), 0);
  assert_int_equal(need, bytes);

  /* nothing of any rejected request was written: not in RocksDB, not in the memory tier */
  digest_of(s, d1, &c1);
  assert_int_equal(c1, 8);
  assert_memory_equal(d0, d1, 32);
  expect_rows(s, &f->layout, mine, 8, v1, 0, NULL);
  expect_rows(s, &f->layout, mine, 8, v1, STORE_LOOKUP_NO_HOT, NULL);
  store_close(s);

  /* a bad shard index is refused at open */
  store_opts_t o = {.data_dir = f->dir, .layout = &f->layout, .shard_map = &map, .shard = 2};
  store_t *s2 = NULL;
  assert_int_equal(store_open(&o, &s2, why, sizeof why), -EINVAL);
  assert_null(s2);
  shard_map_close(&map);
  free(buf);
  free(v2);
  free(v1);
}

/* ------------------------------------------------------------ 8. layout */

static void test_layout_mismatch(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f, 0);
  uint64_t k = TABLE_KEY(0, 1);
  float *v = make_rows(&f->layout, &k, 1, 1);
  write_ok(s, &f->layout, &k, 1, v, 0);
  store_close(s);

  char why[1024];
  table_layout_t other;
  store_opts_t o = {.data_dir = f->dir};
  store_t *s2 = NULL;

  make_layout(&other, 43); /* other seed */
  o.layout = &other;
  assert_int_equal(store_open(&o, &s2, why, sizeof why), ERR_LAYOUT);
  assert_null(s2);
  assert_non_null(strstr(why, "different table layout"));
  assert_non_null(strstr(why, "seed is 42"));
  table_layout_close(&other);

  make_layout(&other, 42); /* other dim */
  other.tables[1].dim = 32;
  assert_int_equal(store_open(&o, &s2, why, sizeof why), ERR_LAYOUT);
  assert_non_null(strstr(why, "different table layout"));
  assert_non_null(strstr(why, "table 1"));
  assert_non_null(strstr(why, "dim 32"));
  table_layout_close(&other);

  assert_int_equal(table_layout_init(&other, 2, 42), 0); /* other table count */
  other.tables[0] = f->layout.tables[0];
  other.tables[1] = f->layout.tables[1];
  assert_int_equal(store_open(&o, &s2, why, sizeof why), ERR_LAYOUT);
  assert_non_null(strstr(why, "3 tables"));
  table_layout_close(&other);

  /* the right layout still opens, with the data intact */
  s = open_store(f, 0);
  expect_rows(s, &f->layout, &k, 1, v, 0, NULL);
  /* a second store on the same dir is refused while the first is open */
  o.layout = &f->layout;
  assert_int_equal(store_open(&o, &s2, why, sizeof why), -EBUSY);
  store_close(s);
  free(v);
}

/* ------------------------------------------------------------ 9. digest */

static void test_digest_order(void **state) {
  fx_t *f = *state;
  char da[128], db[128];
  snprintf(da, sizeof da, "%s/a", f->dir);
  snprintf(db, sizeof db, "%s/b", f->dir);
  size_t n = 500;
  uint64_t *keys = mixed_keys(n, 3);
  float *v = make_rows(&f->layout, keys, n, 1);
  store_t *a = open_full(da, &f->layout, 1u << 20, 0, NULL, 0);
  store_t *b = open_full(db, &f->layout, 0, 0, NULL, 0);
  write_ok(a, &f->layout, keys, n, v, 0);
  /* b: garbage first, then the rows in reverse order, in batches of 7 */
  float *junk = make_rows(&f->layout, keys, n, 99);
  write_ok(b, &f->layout, keys, n, junk, 0);
  size_t *off = malloc((n + 1) * sizeof *off);
  off[0] = 0;
  for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + table_row_floats(&f->layout, TABLE_ID(keys[i]));
  for (size_t end = n; end > 0;) {
    size_t start = end >= 7 ? end - 7 : 0;
    for (size_t i = end; i-- > start;) write_ok(b, &f->layout, &keys[i], 1, v + off[i], 0);
    end = start;
  }
  uint8_t ha[32], hb[32];
  uint64_t ca, cb;
  digest_of(a, ha, &ca);
  digest_of(b, hb, &cb);
  assert_int_equal(ca, n);
  assert_int_equal(cb, n);
  assert_memory_equal(ha, hb, 32);
  /* one float differs -> the digest differs */
  float x = v[off[17]] + 1.0f;
  float *row = malloc((off[18] - off[17]) * sizeof(float));
  memcpy(row, v + off[17], (off[18] - off[17]) * sizeof(float));
  row[0] = x;
  write_ok(b, &f->layout, &keys[17], 1, row, 0);
  digest_of(b, hb, &cb);
  assert_memory_not_equal(ha, hb, 32);
  store_close(a);
  store_close(b);
  free(row);
  free(off);
  free(junk);
  free(v);
  free(keys);
}

/* ------------------------------------------------------------ 10. concurrency */

#define CT_THREADS 4
#define CT_KEYS 400
#define CT_ITERS 150

typedef struct ct_arg_s {
  store_t *s;
  const table_layout_t *l;
  int id;
  uint32_t ver[CT_KEYS]; /* 0 = never written */
  int failures;
} ct_arg_t;

static uint64_t ct_key(int id, size_t i) {
  /* tables 1 and 2 alternate so rows of different sizes mix in one call */
  return i % 2 ? TABLE_KEY(1, (uint64_t)id * 10000 + i) : TABLE_KEY(2, (uint64_t)id * 10000 + i);
}

static void *ct_worker(void *p) {
  ct_arg_t *a = p;
  uint64_t rng = table_mix64((uint64_t)a->id + 1);
  uint64_t keys[32];
  size_t idx[32];
  float *rows = malloc(32 * 17 * sizeof(float)), *got = malloc(32 * 17 * sizeof(float));
  float *exp = malloc(32 * 17 * sizeof(float));
  char why[256];
  for (int it = 0; it < CT_ITERS; it++) {
    size_t nk = 1 + (rng = table_mix64(rng)) % 32;
    for (size_t i = 0; i < nk; i++) {
      /* distinct indices within a request keep the model simple */
      idx[i] = ((rng = table_mix64(rng)) % (CT_KEYS / 32)) * 32 + i;
      keys[i] = ct_key(a->id, idx[i]);
    }
    size_t floats = total_floats(a->l, keys, nk), at = 0;
    if (it % 3 == 0) { /* write */
      uint32_t v = (uint32_t)it + 1;
      for (size_t i = 0; i < nk; i++) {
        uint32_t nf = table_row_floats(a->l, TABLE_ID(keys[i]));
        for (uint32_t j = 0; j < nf; j++) rows[at + j] = val(keys[i], j, v);
        at += nf;
      }
      int flags = it % 9 == 0 ? STORE_WRITE_NO_HOT : 0;
      if (store_write(a->s, keys, nk, rows, floats * sizeof(float), flags, why, sizeof why))
        a->failures++;
      for (size_t i = 0; i < nk; i++) a->ver[idx[i]] = v;
    } else { /* lookup and check against the model */
      for (size_t i = 0; i < nk; i++) {
        uint32_t nf = table_row_floats(a->l, TABLE_ID(keys[i]));
        if (a->ver[idx[i]])
          for (uint32_t j = 0; j < nf; j++) exp[at + j] = val(keys[i], j, a->ver[idx[i]]);
        else
          table_init_row(a->l, keys[i], exp + at);
        at += nf;
      }
      int flags = it % 7 == 0 ? STORE_LOOKUP_NO_HOT : 0;
      if (store_lookup(a->s, keys, nk, got, floats * sizeof(float), flags, NULL, why,
                           sizeof why) ||
          memcmp(got, exp, floats * sizeof(float)) != 0)
        a->failures++;
    }
  }
  free(rows);
  free(got);
  free(exp);
  return NULL;
}

static void test_concurrency(void **state) {
  fx_t *f = *state;
  /* a budget small enough that threads evict each other's rows */
  store_t *s = open_store(f, 48u << 10);
  ct_arg_t args[CT_THREADS];
  pthread_t th[CT_THREADS];
  memset(args, 0, sizeof args);
  for (int i = 0; i < CT_THREADS; i++) {
    args[i] = (ct_arg_t){.s = s, .l = &f->layout, .id = i};
    assert_int_equal(pthread_create(&th[i], NULL, ct_worker, &args[i]), 0);
  }
  /* digests, stats, blobs and a checkpoint run alongside */
  for (int i = 0; i < 5; i++) {
    uint8_t d[32];
    uint64_t c;
    digest_of(s, d, &c);
    store_stats_t st;
    store_stats(s, &st);
    assert_true(st.hot_bytes <= st.hot_capacity_bytes);
    char name[16], why[256];
    snprintf(name, sizeof name, "b%d", i);
    assert_int_equal(store_put_blob(s, name, name, strlen(name), why, sizeof why), 0);
  }
  char why[256];
  assert_int_equal(store_checkpoint(s, "during", NULL, why, sizeof why), 0);
  for (int i = 0; i < CT_THREADS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(args[i].failures, 0);
  }
  store_stats_t st;
  store_stats(s, &st);
  assert_true(st.hot_evictions > 0);
  store_close(s);

  /* final state, from disk */
  s = open_store(f, 0);
  uint64_t stored = 0;
  for (int t = 0; t < CT_THREADS; t++) {
    for (size_t i = 0; i < CT_KEYS; i++) {
      uint64_t k = ct_key(t, i);
      uint32_t nf = table_row_floats(&f->layout, TABLE_ID(k));
      float exp[17];
      if (args[t].ver[i]) {
        for (uint32_t j = 0; j < nf; j++) exp[j] = val(k, j, args[t].ver[i]);
        stored++;
      } else {
        table_init_row(&f->layout, k, exp);
      }
      expect_rows(s, &f->layout, &k, 1, exp, 0, NULL);
    }
  }
  uint8_t d[32];
  uint64_t c;
  digest_of(s, d, &c);
  assert_int_equal(c, stored);
  store_close(s);
}

/* ------------------------------------------------------------ 11. sealing */

static const store_checkpoint_info_t *find_cp(const store_checkpoint_info_t *list, size_t n,
                                              const char *id) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(list[i].id, id)) return &list[i];
  return NULL;
}

static void expect_manifest(store_t *s, const char *id, const char *want, size_t want_len) {
  void *m = NULL;
  size_t len = 99;
  assert_int_equal(store_get_manifest(s, id, &m, &len), 0);
  assert_non_null(m);
  assert_int_equal(len, want_len);
  if (want_len) assert_memory_equal(m, want, want_len);
  free(m);
}

static int in_dir(const char *dir, const char *sub, const char *name) {
  char p[512];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s/%s", dir, sub, name);
  return stat(p, &sb) == 0;
}

static void test_seal_manifest(void **state) {
  fx_t *f = *state;
  size_t n = 200;
  uint64_t *keys = mixed_keys(n, 21);
  float *v1 = make_rows(&f->layout, keys, n, 1), *v2 = make_rows(&f->layout, keys, n, 2);
  store_t *s = open_store(f, 1u << 20);
  char why[512] = "";
  write_ok(s, &f->layout, keys, n, v1, 0);
  uint8_t dck[32], d[32];
  digest_of(s, dck, NULL);
  assert_int_equal(store_checkpoint(s, "a", NULL, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "b", NULL, why, sizeof why), 0);

  store_checkpoint_info_t *list = NULL;
  size_t nl = 0;
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 2);
  assert_int_equal(list[0].sealed, 0);
  assert_int_equal(list[1].sealed, 0);
  free(list);
  void *m = (void *)1;
  size_t ml = 7;
  assert_int_equal(store_get_manifest(s, "a", &m, &ml), ERR_NOTFOUND); /* not sealed yet */
  assert_null(m);
  assert_int_equal(ml, 0);

  assert_int_equal(store_seal_checkpoint(s, "a", "manifest-v1", 11, why, sizeof why), 0);
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 2);
  assert_int_equal(find_cp(list, nl, "a")->sealed, 1);
  assert_int_equal(find_cp(list, nl, "b")->sealed, 0);
  free(list);
  expect_manifest(s, "a", "manifest-v1", 11);
  /* sealing again overwrites, and leaves no temporary file */
  assert_int_equal(store_seal_checkpoint(s, "a", "the second manifest", 19, why, sizeof why), 0);
  expect_manifest(s, "a", "the second manifest", 19);
  assert_false(in_dir(f->dir, "checkpoints/a", "MANIFEST.tmp"));
  assert_int_equal(store_seal_checkpoint(s, "b", NULL, 0, why, sizeof why), 0); /* empty is fine */
  expect_manifest(s, "b", "", 0);

  /* errors */
  assert_int_equal(store_seal_checkpoint(s, "nosuch", "x", 1, why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "no checkpoint \"nosuch\""));
  assert_int_equal(store_get_manifest(s, "nosuch", &m, &ml), ERR_NOTFOUND);
  assert_int_equal(store_seal_checkpoint(s, "a", NULL, 3, why, sizeof why), -EINVAL);
  char long_id[66];
  memset(long_id, 'x', 65);
  long_id[65] = 0;
  const char *bad[] = {"bad/id", "", "..", ".", "a b", long_id, "../a"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = 0;
    assert_int_equal(store_seal_checkpoint(s, bad[i], "x", 1, why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "not valid"));
    assert_int_equal(store_get_manifest(s, bad[i], &m, &ml), -EINVAL);
    why[0] = 0;
    assert_int_equal(store_delete_checkpoint(s, bad[i], why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "not valid"));
  }
  assert_int_equal(store_seal_checkpoint(s, NULL, "x", 1, why, sizeof why), -EINVAL);

  /* what an interrupted seal leaves (the temporary of fsio_replace, or
   * the MANIFEST.tmp of earlier versions) must not reach the live db either */
  char p[512];
  const char *strays[] = {"MANIFEST.tmp", "MANIFEST.tmp.4242"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/checkpoints/a/%s", f->dir, strays[i]);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("torn", fp);
    fclose(fp);
  }

  /* restore: the rows come back, the manifest stays with the checkpoint only */
  write_ok(s, &f->layout, keys, n, v2, 0);
  assert_int_equal(store_restore(s, "a", why, sizeof why), 0);
  expect_rows(s, &f->layout, keys, n, v1, STORE_LOOKUP_NO_HOT, NULL);
  digest_of(s, d, NULL);
  assert_memory_equal(d, dck, 32);
  assert_false(in_dir(f->dir, "db", "MANIFEST"));
  assert_false(in_dir(f->dir, "db", "MANIFEST.tmp"));
  assert_false(in_dir(f->dir, "db", "MANIFEST.tmp.4242"));
  assert_false(in_dir(f->dir, "db", "CHANTER_CHECKPOINT"));
  assert_true(in_dir(f->dir, "db", "CURRENT")); /* RocksDB's own files did come */
  expect_manifest(s, "a", "the second manifest", 19);
  store_close(s);

  /* reopen: the stray temporaries are swept, the seal survives */
  s = open_store(f, 1u << 20);
  assert_false(in_dir(f->dir, "checkpoints/a", "MANIFEST.tmp"));
  assert_false(in_dir(f->dir, "checkpoints/a", "MANIFEST.tmp.4242"));
  expect_manifest(s, "a", "the second manifest", 19);
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 2);
  assert_int_equal(list[0].sealed, 1);
  assert_int_equal(list[1].sealed, 1);
  free(list);
  store_close(s);
  free(v2);
  free(v1);
  free(keys);
}

/* ------------------------------------------------------------ 12. delete */

static void unlink_meta(const char *dir, const char *id) {
  char p[512];
  snprintf(p, sizeof p, "%s/checkpoints/%s/CHANTER_CHECKPOINT", dir, id);
  assert_int_equal(unlink(p), 0);
}

static void expect_ids(store_t *s, const char *const *ids, size_t n) {
  store_checkpoint_info_t *list = NULL;
  size_t nl = 99;
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, n);
  for (size_t i = 0; i < n; i++) assert_string_equal(list[i].id, ids[i]);
  free(list);
}

static void test_delete_checkpoint(void **state) {
  fx_t *f = *state;
  uint64_t k = TABLE_KEY(1, 77);
  float *v = make_rows(&f->layout, &k, 1, 1);
  store_t *s = open_store(f, 0);
  char why[512] = "";
  write_ok(s, &f->layout, &k, 1, v, 0);
  const char *all[] = {"w", "x", "y", "z"};
  for (int i = 0; i < 4; i++) assert_int_equal(store_checkpoint(s, all[i], NULL, why, sizeof why), 0);
  assert_int_equal(store_seal_checkpoint(s, "y", "m", 1, why, sizeof why), 0);

  /* delete: gone from the list, from the disk, from every other call */
  assert_int_equal(store_delete_checkpoint(s, "y", why, sizeof why), 0);
  expect_ids(s, (const char *[]){"w", "x", "z"}, 3);
  assert_false(in_dir(f->dir, "checkpoints", "y"));
  void *m = NULL;
  size_t ml = 0;
  assert_int_equal(store_get_manifest(s, "y", &m, &ml), ERR_NOTFOUND);
  assert_int_equal(store_restore(s, "y", why, sizeof why), ERR_NOTFOUND);
  why[0] = 0;
  assert_int_equal(store_delete_checkpoint(s, "y", why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "no checkpoint \"y\""));
  assert_int_equal(store_delete_checkpoint(s, "nosuch", why, sizeof why), ERR_NOTFOUND);

  /* a checkpoint whose CHANTER_CHECKPOINT is gone (a delete interrupted after
   * its first step) is not listed, not sealable, not restorable... */
  unlink_meta(f->dir, "z");
  expect_ids(s, (const char *[]){"w", "x"}, 2);
  assert_int_equal(store_seal_checkpoint(s, "z", "m", 1, why, sizeof why), ERR_NOTFOUND);
  assert_int_equal(store_restore(s, "z", why, sizeof why), ERR_NOTFOUND);
  /* ...and its id can be taken again */
  assert_int_equal(store_checkpoint(s, "z", NULL, why, sizeof why), 0);
  expect_ids(s, (const char *[]){"w", "x", "z"}, 3);
  /* deleting such remains finishes the job and succeeds */
  unlink_meta(f->dir, "x");
  expect_ids(s, (const char *[]){"w", "z"}, 2);
  assert_int_equal(store_delete_checkpoint(s, "x", why, sizeof why), 0);
  assert_false(in_dir(f->dir, "checkpoints", "x"));
  /* and the next open removes any it finds */
  unlink_meta(f->dir, "w");
  store_close(s);
  assert_true(in_dir(f->dir, "checkpoints", "w"));
  s = open_store(f, 0);
  assert_false(in_dir(f->dir, "checkpoints", "w"));
  expect_ids(s, (const char *[]){"z"}, 1);
  /* the live data never noticed */
  expect_rows(s, &f->layout, &k, 1, v, STORE_LOOKUP_NO_HOT, NULL);
  assert_int_equal(store_restore(s, "z", why, sizeof why), 0);
  expect_rows(s, &f->layout, &k, 1, v, STORE_LOOKUP_NO_HOT, NULL);
  store_close(s);
  free(v);
}

/* ------------------------------------------------------------ 13. clear */

static void expect_has(store_t *s, int rows, int blobs) {
  int r = -1, b = -1;
  assert_int_equal(store_has_rows(s, &r, &b), 0);
  assert_int_equal(r, rows);
  assert_int_equal(b, blobs);
}

static void test_clear(void **state) {
  fx_t *f = *state;
  size_t n = 3000;
  uint64_t *keys = mixed_keys(n, 9);
  float *v = make_rows(&f->layout, keys, n, 1), *init = init_rows(&f->layout, keys, n);
  store_t *s = open_store(f, 1u << 20);
  char why[512] = "";
  expect_has(s, 0, 0);
  assert_int_equal(store_has_rows(s, NULL, NULL), 0);
  assert_int_equal(store_clear(s, 0, why, sizeof why), 0); /* an empty store clears too */
  assert_int_equal(store_put_blob(s, "dense", "d", 1, why, sizeof why), 0);
  expect_has(s, 0, 1);
  write_ok(s, &f->layout, keys, n / 2, v, 0);
  /* a checkpoint flushes: part of the data is in SST files, part in memtables */
  assert_int_equal(store_checkpoint(s, "c1", NULL, why, sizeof why), 0);
  assert_int_equal(store_seal_checkpoint(s, "c1", "m", 1, why, sizeof why), 0);
  write_ok(s, &f->layout, keys, n, v, 0);
  assert_int_equal(store_checkpoint(s, "c2", NULL, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "cache.trainer-0", "cc", 2, why, sizeof why), 0);
  expect_has(s, 1, 1);
  int r = -1;
  assert_int_equal(store_has_rows(s, &r, NULL), 0);
  assert_int_equal(r, 1);
  expect_rows(s, &f->layout, keys, n, v, 0, NULL); /* all in the memory tier now */

  assert_int_equal(store_clear(s, 0, why, sizeof why), 0);
  expect_has(s, 0, 0);
  expect_ids(s, NULL, 0);
  assert_false(in_dir(f->dir, "checkpoints", "c1"));
  uint8_t d[32], set[32], zero[32] = {0};
  uint64_t c = 99;
  assert_int_equal(store_digest(s, d, set, &c), 0);
  assert_int_equal(c, 0);
  assert_memory_equal(set, zero, 32);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys, n, init, 0, &info); /* memory tier emptied too */
  assert_int_equal(info.hot_hits, 0);
  assert_int_equal(info.lazy_inits, n);
  void *b = NULL;
  size_t bl = 0;
  assert_int_equal(store_get_blob(s, "dense", &b, &bl), ERR_NOTFOUND);
  store_stats_t st;
  store_stats(s, &st);
  assert_int_equal(st.stored_rows_estimate, 0); /* the space came back */

  /* the store works on; the layout stays; the clear is durable */
  write_ok(s, &f->layout, keys, 10, v, 0);
  expect_has(s, 1, 0);
  assert_int_equal(store_checkpoint(s, "c1", NULL, why, sizeof why), 0); /* the id is free again */
  store_close(s);
  table_layout_t other;
  make_layout(&other, 43);
  store_opts_t o = {.data_dir = f->dir, .layout = &other};
  store_t *s2 = NULL;
  assert_int_equal(store_open(&o, &s2, why, sizeof why), ERR_LAYOUT);
  table_layout_close(&other);
  s = open_store(f, 0);
  expect_has(s, 1, 0);
  assert_int_equal(store_digest(s, d, NULL, &c), 0);
  assert_int_equal(c, 10);
  expect_rows(s, &f->layout, keys, 10, v, 0, NULL);
  expect_rows(s, &f->layout, keys + 10, n - 10, init + total_floats(&f->layout, keys, 10), 0, NULL);
  expect_ids(s, (const char *[]){"c1"}, 1);
  store_close(s);
  free(init);
  free(v);
  free(keys);
}

/* ------------------------------------------------------------ 14. set digest */

/* The set digest by its definition, from the rows themselves. */
static void set_digest_ref(const table_layout_t *l, const uint64_t *keys, size_t n,
                           const float *rows, uint8_t out[32]) {
  uint64_t lane[4] = {0, 0, 0, 0};
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t nb = table_row_bytes(l, TABLE_ID(keys[i]));
    uint8_t buf[8 + 256], h[32];
    assert_true(nb <= 256);
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)(keys[i] >> (8 * b));
    memcpy(buf + 8, rows + at, nb);
    unsigned int hl = 0;
    assert_int_equal(EVP_Digest(buf, 8 + nb, h, &hl, EVP_sha256(), NULL), 1);
    for (int j = 0; j < 4; j++) {
      uint64_t x = 0;
      for (int b = 7; b >= 0; b--) x = x << 8 | h[8 * j + b];
      lane[j] += x;
    }
    at += nb / sizeof(float);
  }
  for (int j = 0; j < 32; j++) out[j] = (uint8_t)(lane[j / 8] >> (8 * (j % 8)));
}

static void set_add(uint8_t acc[32], const uint8_t x[32]) {
  for (int j = 0; j < 4; j++) {
    uint64_t a = 0, b = 0;
    for (int k = 7; k >= 0; k--) {
      a = a << 8 | acc[8 * j + k];
      b = b << 8 | x[8 * j + k];
    }
    a += b;
    for (int k = 0; k < 8; k++) acc[8 * j + k] = (uint8_t)(a >> (8 * k));
  }
}

static int key_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void test_set_digest(void **state) {
  fx_t *f = *state;
  size_t n = 900;
  uint64_t *keys = mixed_keys(n, 17);
  qsort(keys, n, sizeof *keys, key_cmp); /* key order: the ordered digest's order */
  for (size_t i = 1; i < n; i++) assert_true(keys[i] != keys[i - 1]);
  float *v = make_rows(&f->layout, keys, n, 1);
  size_t *off = malloc((n + 1) * sizeof *off);
  off[0] = 0;
  for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + table_row_floats(&f->layout, TABLE_ID(keys[i]));
  uint8_t want[32], zero[32] = {0}, d[32], set[32];
  uint64_t c;
  set_digest_ref(&f->layout, keys, n, v, want);
  assert_memory_not_equal(want, zero, 32);

  /* one store holding everything: both digests match their definitions */
  char dir[128];
  snprintf(dir, sizeof dir, "%s/one", f->dir);
  store_t *one = open_full(dir, &f->layout, 0, 0, NULL, 0);
  assert_int_equal(store_digest(one, d, set, &c), 0);
  assert_memory_equal(set, zero, 32); /* no rows: zero */
  write_ok(one, &f->layout, keys, n, v, 0);
  assert_int_equal(store_digest(one, d, set, &c), 0);
  assert_int_equal(c, n);
  assert_memory_equal(set, want, 32);
  uint8_t ordered[32], d2[32];
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  assert_int_equal(EVP_DigestInit_ex(md, EVP_sha256(), NULL), 1);
  for (size_t i = 0; i < n; i++) {
    uint8_t le[8];
    for (int b = 0; b < 8; b++) le[b] = (uint8_t)(keys[i] >> (8 * b));
    EVP_DigestUpdate(md, le, 8);
    EVP_DigestUpdate(md, v + off[i], (off[i + 1] - off[i]) * sizeof(float));
  }
  unsigned int hl = 0;
  assert_int_equal(EVP_DigestFinal_ex(md, ordered, &hl), 1);
  EVP_MD_CTX_free(md);
  assert_memory_equal(d, ordered, 32); /* the ordered digest did not change */
  assert_int_equal(store_digest(one, d2, NULL, NULL), 0); /* nor with no set digest asked */
  assert_memory_equal(d2, ordered, 32);
  store_close(one);

  /* the same rows on 2 and 3 servers, split by the shard map: same sum */
  for (uint32_t k = 2; k <= 3; k++) {
    shard_map_t map;
    assert_int_equal(shard_map_init(&map, &f->layout, k, 2000), 0);
    store_t *st[3];
    uint8_t sum[32] = {0};
    uint64_t total = 0;
    for (uint32_t srv = 0; srv < k; srv++) {
      snprintf(dir, sizeof dir, "%s/k%u-%u", f->dir, k, srv);
      st[srv] = open_full(dir, &f->layout, 1u << 20, 0, &map, srv);
      for (size_t i = 0; i < n; i++) /* one row at a time: order must not matter */
        if (shard_of(&map, keys[n - 1 - i]) == srv)
          write_ok(st[srv], &f->layout, &keys[n - 1 - i], 1, v + off[n - 1 - i], 0);
      assert_int_equal(store_digest(st[srv], d, set, &c), 0);
      assert_true(c > 0 && c < n); /* every server holds a real part */
      assert_memory_not_equal(d, ordered, 32);
      set_add(sum, set);
      total += c;
    }
    assert_int_equal(total, n);
    assert_memory_equal(sum, want, 32);
    /* one float of one row changes: the sum changes */
    size_t i = n / 2;
    uint32_t owner = shard_of(&map, keys[i]);
    float *row = malloc((off[i + 1] - off[i]) * sizeof(float));
    memcpy(row, v + off[i], (off[i + 1] - off[i]) * sizeof(float));
    row[0] += 1.0f;
    write_ok(st[owner], &f->layout, &keys[i], 1, row, 0);
    memset(sum, 0, sizeof sum);
    for (uint32_t srv = 0; srv < k; srv++) {
      assert_int_equal(store_digest(st[srv], NULL, set, NULL), 0);
      set_add(sum, set);
    }
    assert_memory_not_equal(sum, want, 32);
    for (uint32_t srv = 0; srv < k; srv++) store_close(st[srv]);
    free(row);
    shard_map_close(&map);
  }
  free(off);
  free(v);
  free(keys);
}

/* ------------------------------------------------------------ 15. reading a checkpoint */

typedef struct snap_entry_s {
  char name[256];
  off_t size;
  struct timespec mtime;
  uint8_t sha[32];
} snap_entry_t;

/* A flat directory as it is on disk: every entry's name, size, mtime and
 * (files) SHA-256 of the bytes, sorted by name, and the directory's mtime. */
typedef struct dir_snap_s {
  snap_entry_t *e;
  size_t n;
  struct timespec mtime;
} dir_snap_t;

static void sha_file(const char *path, uint8_t out[32]) {
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  assert_int_equal(EVP_DigestInit_ex(md, EVP_sha256(), NULL), 1);
  char buf[1 << 14];
  size_t r;
  while ((r = fread(buf, 1, sizeof buf, fp)) > 0) assert_int_equal(EVP_DigestUpdate(md, buf, r), 1);
  unsigned int hl = 0;
  assert_int_equal(EVP_DigestFinal_ex(md, out, &hl), 1);
  EVP_MD_CTX_free(md);
  fclose(fp);
}

static int snap_cmp(const void *a, const void *b) {
  return strcmp(((const snap_entry_t *)a)->name, ((const snap_entry_t *)b)->name);
}

static void snap_dir(const char *dir, dir_snap_t *sn) {
  memset(sn, 0, sizeof *sn);
  struct stat st;
  assert_int_equal(stat(dir, &st), 0);
  sn->mtime = st.st_mtim;
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    sn->e = realloc(sn->e, (sn->n + 1) * sizeof *sn->e);
    assert_non_null(sn->e);
    snap_entry_t *e = &sn->e[sn->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", de->d_name);
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    assert_int_equal(lstat(p, &st), 0);
    e->size = st.st_size;
    e->mtime = st.st_mtim;
    if (S_ISREG(st.st_mode)) sha_file(p, e->sha);
  }
  closedir(d);
  qsort(sn->e, sn->n, sizeof *sn->e, snap_cmp);
}

static void expect_same_dir(const dir_snap_t *a, const dir_snap_t *b) {
  if (a->n != b->n)
    for (size_t i = 0; i < b->n; i++) fprintf(stderr, "now: %s\n", b->e[i].name);
  assert_int_equal(a->n, b->n);
  for (size_t i = 0; i < a->n; i++) {
    assert_string_equal(a->e[i].name, b->e[i].name);
    assert_int_equal(a->e[i].size, b->e[i].size);
    assert_int_equal(a->e[i].mtime.tv_sec, b->e[i].mtime.tv_sec);
    assert_int_equal(a->e[i].mtime.tv_nsec, b->e[i].mtime.tv_nsec);
    assert_memory_equal(a->e[i].sha, b->e[i].sha, 32);
  }
  assert_int_equal(a->mtime.tv_sec, b->mtime.tv_sec);
  assert_int_equal(a->mtime.tv_nsec, b->mtime.tv_nsec);
}

/* The rows a checkpoint must give back: keys sorted and distinct, rows[]
 * packed in that order, off[i] the byte offset of row i (off[n] = total). */
typedef struct want_rows_s {
  const uint64_t *keys;
  const uint8_t *rows;
  size_t *off;
  size_t n;
} want_rows_t;

static void want_init(want_rows_t *w, const table_layout_t *l, const uint64_t *keys, size_t n,
                      const float *rows) {
  for (size_t i = 1; i < n; i++) assert_true(keys[i - 1] < keys[i]);
  w->keys = keys;
  w->rows = (const uint8_t *)rows;
  w->n = n;
  w->off = malloc((n + 1) * sizeof *w->off);
  assert_non_null(w->off);
  w->off[0] = 0;
  for (size_t i = 0; i < n; i++) w->off[i + 1] = w->off[i] + table_row_bytes(l, TABLE_ID(keys[i]));
}

/* Reads every row of checkpoint dir with batches of at most max rows and cap
 * bytes, asserts they are exactly w's, and returns the number of calls that
 * gave rows. */
static size_t read_all(const char *dir, size_t max, size_t cap, const want_rows_t *w) {
  store_reader_t *r = NULL;
  char why[512] = "";
  int rc = store_reader_open(dir, &r, why, sizeof why);
  if (rc) fprintf(stderr, "reader open failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
  uint64_t *keys = malloc(max * sizeof *keys);
  size_t *lens = malloc(max * sizeof *lens);
  uint8_t *buf = malloc(cap);
  assert_true(keys && lens && buf);
  size_t got = 0, calls = 0, used = 0;
  for (;;) {
    int k = store_reader_next_rows(r, keys, buf, cap, lens, max, &used);
    assert_true(k >= 0);
    if (k == 0) break;
    calls++;
    assert_true((size_t)k <= max);
    assert_true(used <= cap);
    size_t at = 0;
    for (size_t i = 0; i < (size_t)k; i++, got++) {
      assert_true(got < w->n);
      assert_int_equal(keys[i], w->keys[got]);
      assert_int_equal(lens[i], w->off[got + 1] - w->off[got]);
      assert_memory_equal(buf + at, w->rows + w->off[got], lens[i]);
      at += lens[i];
    }
    assert_int_equal(at, used);
  }
  assert_int_equal(used, 0);
  assert_int_equal(got, w->n);
  assert_int_equal(store_reader_next_rows(r, keys, buf, cap, lens, max, &used), 0); /* stays at the end */
  store_reader_close(r);
  free(buf);
  free(lens);
  free(keys);
  return calls;
}

static void expect_reader_blob(store_reader_t *r, const char *name, const void *want, size_t len) {
  void *b = NULL;
  size_t bl = 99;
  assert_int_equal(store_reader_get_blob(r, name, &b, &bl), 0);
  assert_non_null(b);
  assert_int_equal(bl, len);
  if (len) assert_memory_equal(b, want, len);
  free(b);
}

static void expect_reader_blob_names(store_reader_t *r, const char *const *want, size_t n) {
  char **names = NULL;
  size_t nn = 99;
  assert_int_equal(store_reader_blobs(r, &names, &nn), 0);
  assert_int_equal(nn, n);
  if (n == 0) assert_null(names);
  for (size_t i = 0; i < nn; i++) {
    assert_string_equal(names[i], want[i]);
    free(names[i]);
  }
  free(names);
}

/* n distinct keys of every table, sorted */
static uint64_t *sorted_keys(size_t n, uint64_t salt) {
  uint64_t *keys = mixed_keys(n, salt);
  qsort(keys, n, sizeof *keys, key_cmp);
  for (size_t i = 1; i < n; i++) assert_true(keys[i] != keys[i - 1]);
  return keys;
}

static void test_reader(void **state) {
  fx_t *f = *state;
  size_t n = 3000;
  uint64_t *keys = sorted_keys(n, 5);
  float *v1 = make_rows(&f->layout, keys, n, 1), *v2 = make_rows(&f->layout, keys, n / 2, 2);
  uint8_t *big = malloc(200000);
  assert_non_null(big);
  for (size_t i = 0; i < 200000; i++) big[i] = (uint8_t)(i * 31 + 7);
  store_t *s = open_store(f, 1u << 20);
  char why[512] = "", cdir[256], c2dir[256];
  /* written in two batches, the later one first: the reader's order is the key order */
  write_ok(s, &f->layout, keys + n / 2, n - n / 2, v1 + total_floats(&f->layout, keys, n / 2), 0);
  write_ok(s, &f->layout, keys, n / 2, v1, 0);
  assert_int_equal(store_put_blob(s, "dense", "dense-v1", 8, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "empty", NULL, 0, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "oracle.state", big, 200000, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "c1", NULL, why, sizeof why), 0);
  assert_int_equal(store_seal_checkpoint(s, "c1", "manifest-c1", 11, why, sizeof why), 0);
  /* after the checkpoint: new versions, new rows, a changed and a new blob */
  write_ok(s, &f->layout, keys, n / 2, v2, 0);
  uint64_t *fresh = fresh_keys(100, keys, n);
  float *vf = make_rows(&f->layout, fresh, 100, 3);
  write_ok(s, &f->layout, fresh, 100, vf, 0);
  assert_int_equal(store_put_blob(s, "dense", "dense-v2", 8, why, sizeof why), 0);
  assert_int_equal(store_put_blob(s, "after", "a", 1, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "c2", NULL, why, sizeof why), 0); /* not sealed */
  snprintf(cdir, sizeof cdir, "%s/checkpoints/c1", f->dir);
  snprintf(c2dir, sizeof c2dir, "%s/checkpoints/c2", f->dir);
  dir_snap_t before, after;
  snap_dir(cdir, &before);

  want_rows_t w;
  want_init(&w, &f->layout, keys, n, v1);
  /* read while the store serves the data dir; batches bounded by rows, by bytes, by neither */
  assert_int_equal(read_all(cdir, 1, 68, &w), n);              /* one row (the largest) per call */
  assert_int_equal(read_all(cdir, 7, 4096, &w), (n + 6) / 7);  /* max rows per call */
  assert_int_equal(read_all(cdir, n + 10, 1u << 20, &w), 1);   /* everything at once */
  size_t calls = read_all(cdir, n, 100, &w);                   /* cap: 1 to 3 rows per call */
  assert_true(calls > n / 3 && calls < n);

  store_reader_t *r = NULL, *r2 = NULL;
  assert_int_equal(store_reader_open(cdir, &r, why, sizeof why), 0);
  assert_int_equal(store_reader_open(cdir, &r2, why, sizeof why), 0); /* readers share a checkpoint */
  uint64_t k[4] = {0};
  size_t lens[4] = {0}, used = 0, first = table_row_bytes(&f->layout, TABLE_ID(keys[0]));
  uint8_t buf[256];
  /* a buffer too small for one row: -ENOBUFS, the size it needs, nothing consumed */
  assert_int_equal(store_reader_next_rows(r, k, buf, first - 1, lens, 4, &used), -ENOBUFS);
  assert_int_equal(used, first);
  assert_int_equal(store_reader_next_rows(r, k, NULL, 0, lens, 4, &used), -ENOBUFS);
  assert_int_equal(used, first);
  assert_int_equal(store_reader_next_rows(r, k, buf, sizeof buf, lens, 0, &used), -EINVAL);
  assert_int_equal(store_reader_next_rows(r, NULL, buf, sizeof buf, lens, 4, &used), -EINVAL);
  assert_int_equal(store_reader_next_rows(r, k, buf, first, lens, 4, &used), 1);
  assert_int_equal(k[0], keys[0]);
  assert_int_equal(lens[0], first);
  assert_int_equal(used, first);
  assert_memory_equal(buf, v1, first);
  assert_int_equal(store_reader_next_rows(r2, k, buf, sizeof buf, lens, 2, &used), 2);
  assert_int_equal(k[0], keys[0]);
  assert_int_equal(k[1], keys[1]);
  assert_int_equal(store_reader_next_rows(r, k, buf, sizeof buf, lens, 1, &used), 1);
  assert_int_equal(k[0], keys[1]); /* r went on where it was */
  store_reader_close(r2);

  /* blobs as of the checkpoint */
  expect_reader_blob_names(r, (const char *[]){"dense", "empty", "oracle.state"}, 3);
  expect_reader_blob(r, "dense", "dense-v1", 8);
  expect_reader_blob(r, "empty", "", 0);
  expect_reader_blob(r, "oracle.state", big, 200000);
  void *b = (void *)1;
  size_t bl = 7;
  assert_int_equal(store_reader_get_blob(r, "after", &b, &bl), ERR_NOTFOUND);
  assert_null(b);
  assert_int_equal(bl, 0);
  assert_int_equal(store_reader_get_blob(r, "bad/name", &b, &bl), -EINVAL);
  assert_int_equal(store_reader_get_blob(r, "", &b, &bl), -EINVAL);

  /* the layout it was written for, and the row count */
  uint64_t h = 0;
  assert_int_equal(store_reader_layout_hash(r, &h), 0);
  assert_int_equal(h, table_layout_hash(&f->layout));
  const table_layout_t *l = store_reader_layout(r);
  assert_int_equal(l->n_tables, f->layout.n_tables);
  assert_int_equal(l->seed, f->layout.seed);
  for (uint32_t t = 0; t < l->n_tables; t++) {
    assert_int_equal(l->tables[t].rows, f->layout.tables[t].rows);
    assert_int_equal(l->tables[t].dim, f->layout.tables[t].dim);
    assert_int_equal(l->tables[t].state_floats, f->layout.tables[t].state_floats);
  }
  assert_int_equal(store_reader_rows_estimate(r), n); /* flushed, one version per key */
  store_reader_close(r);
  store_reader_close(NULL);

  /* the manifest: sealed c1 has it, c2 not */
  void *m = NULL;
  size_t ml = 0;
  assert_int_equal(store_reader_manifest(cdir, &m, &ml), 0);
  assert_int_equal(ml, 11);
  assert_memory_equal(m, "manifest-c1", 11);
  free(m);
  m = (void *)1;
  assert_int_equal(store_reader_manifest(c2dir, &m, &ml), ERR_NOTFOUND);
  assert_null(m);
  assert_int_equal(ml, 0);

  /* with no store open at all */
  store_close(s);
  assert_int_equal(read_all(cdir, 1000, 1u << 17, &w), 3); /* 1000 rows of each table */
  snap_dir(cdir, &after);
  expect_same_dir(&before, &after); /* reading wrote nothing, not even a LOCK or a LOG */
  assert_false(in_dir(f->dir, "checkpoints/c1", "LOCK"));
  assert_false(in_dir(f->dir, "checkpoints/c1", "LOG"));

  /* c2 holds what was written after c1 */
  assert_int_equal(store_reader_open(c2dir, &r, why, sizeof why), 0);
  assert_int_equal(store_reader_rows_estimate(r) >= n + 100, 1);
  expect_reader_blob(r, "dense", "dense-v2", 8);
  expect_reader_blob(r, "after", "a", 1);
  size_t total = 0;
  uint64_t *kk = malloc(512 * sizeof *kk);
  size_t *ll = malloc(512 * sizeof *ll);
  uint8_t *bb = malloc(512 * 68);
  int got;
  while ((got = store_reader_next_rows(r, kk, bb, 512 * 68, ll, 512, &used)) > 0) {
    size_t at = 0;
    for (int i = 0; i < got; i++) {
      const float *want = NULL;
      for (size_t j = 0; j < n / 2 && !want; j++) /* the first half has version 2 */
        if (keys[j] == kk[i]) want = v2 + total_floats(&f->layout, keys, j);
      for (size_t j = n / 2; j < n && !want; j++) /* the second half: version 1 */
        if (keys[j] == kk[i]) want = v1 + total_floats(&f->layout, keys, j);
      for (size_t j = 0; j < 100 && !want; j++)
        if (fresh[j] == kk[i]) want = vf + total_floats(&f->layout, fresh, j);
      assert_non_null(want);
      assert_memory_equal(bb + at, want, ll[i]);
      at += ll[i];
    }
    total += (size_t)got;
  }
  assert_int_equal(got, 0);
  assert_int_equal(total, n + 100);
  store_reader_close(r);
  free(bb);
  free(ll);
  free(kk);

  free(before.e);
  free(after.e);
  free(w.off);
  free(vf);
  free(fresh);
  free(big);
  free(v2);
  free(v1);
  free(keys);
}

static void test_reader_errors(void **state) {
  fx_t *f = *state;
  char why[512] = "", p[256];
  store_reader_t *r = (store_reader_t *)1;
  void *m = NULL;
  size_t ml = 0;

  /* a missing dir, a dir that is not a checkpoint, a file */
  snprintf(p, sizeof p, "%s/checkpoints/nosuch", f->dir);
  assert_int_equal(store_reader_open(p, &r, why, sizeof why), ERR_NOTFOUND);
  assert_null(r);
  assert_non_null(strstr(why, "no checkpoint directory"));
  assert_int_equal(store_reader_manifest(p, &m, &ml), ERR_NOTFOUND);
  why[0] = 0;
  assert_int_equal(store_reader_open(f->dir, &r, why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "CHANTER_CHECKPOINT"));
  assert_int_equal(store_reader_open("", &r, why, sizeof why), -EINVAL);

  uint64_t k = TABLE_KEY(2, 9);
  float *v = make_rows(&f->layout, &k, 1, 1);
  store_t *s = open_store(f, 0);
  write_ok(s, &f->layout, &k, 1, v, 0);
  assert_int_equal(store_checkpoint(s, "c", NULL, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "d", NULL, why, sizeof why), 0);
  store_close(s);
  /* the live db is a RocksDB db but not a checkpoint: refused, untouched */
  snprintf(p, sizeof p, "%s/db", f->dir);
  dir_snap_t before, after;
  snap_dir(p, &before);
  why[0] = 0;
  assert_int_equal(store_reader_open(p, &r, why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "not a checkpoint"));
  assert_int_equal(store_reader_manifest(p, &m, &ml), ERR_NOTFOUND);
  snap_dir(p, &after);
  expect_same_dir(&before, &after);
  free(before.e);
  free(after.e);
  snprintf(p, sizeof p, "%s/checkpoints/c/CURRENT", f->dir);
  assert_int_equal(store_reader_open(p, &r, why, sizeof why), ERR_NOTFOUND); /* a file */

  /* a damaged checkpoint: RocksDB's own complaint comes back */
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fputs("MANIFEST-999999\n", fp);
  fclose(fp);
  snprintf(p, sizeof p, "%s/checkpoints/c", f->dir);
  why[0] = 0;
  assert_int_equal(store_reader_open(p, &r, why, sizeof why), ERR_KV);
  assert_null(r);
  assert_non_null(strstr(why, "storage engine failed"));
  assert_non_null(strstr(why, "MANIFEST-999999"));
  /* a checkpoint whose delete was interrupted (no CHANTER_CHECKPOINT) */
  unlink_meta(f->dir, "d");
  snprintf(p, sizeof p, "%s/checkpoints/d", f->dir);
  assert_int_equal(store_reader_open(p, &r, why, sizeof why), ERR_NOTFOUND);
  free(v);
}

/* ------------------------------------------------------------ 16. clear, keeping checkpoints */

static void test_clear_keep_checkpoints(void **state) {
  fx_t *f = *state;
  size_t n = 1000;
  uint64_t *keys = sorted_keys(n, 3);
  float *v1 = make_rows(&f->layout, keys, n, 1), *v2 = make_rows(&f->layout, keys, n, 2);
  float *init = init_rows(&f->layout, keys, n);
  store_t *s = open_store(f, 1u << 20);
  char why[512] = "", cdir[256];
  write_ok(s, &f->layout, keys, n, v1, 0);
  assert_int_equal(store_put_blob(s, "dense", "d1", 2, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "c1", NULL, why, sizeof why), 0);
  assert_int_equal(store_seal_checkpoint(s, "c1", "m", 1, why, sizeof why), 0);
  write_ok(s, &f->layout, keys, n, v2, 0);
  assert_int_equal(store_put_blob(s, "late", "l", 1, why, sizeof why), 0);
  expect_rows(s, &f->layout, keys, n, v2, 0, NULL); /* in the memory tier */
  snprintf(cdir, sizeof cdir, "%s/checkpoints/c1", f->dir);
  dir_snap_t before, after;
  snap_dir(cdir, &before);

  assert_int_equal(store_clear(s, 1, why, sizeof why), 0);
  /* the live rows and blobs are gone... */
  expect_has(s, 0, 0);
  uint64_t c = 99;
  uint8_t d[32];
  assert_int_equal(store_digest(s, d, NULL, &c), 0);
  assert_int_equal(c, 0);
  store_lookup_info_t info;
  expect_rows(s, &f->layout, keys, n, init, 0, &info);
  assert_int_equal(info.hot_hits, 0);
  void *b = NULL;
  size_t bl = 0;
  assert_int_equal(store_get_blob(s, "dense", &b, &bl), ERR_NOTFOUND);
  assert_int_equal(store_get_blob(s, "late", &b, &bl), ERR_NOTFOUND);
  /* ...the checkpoint stays: listed, sealed, untouched on disk, readable */
  store_checkpoint_info_t *list = NULL;
  size_t nl = 0;
  assert_int_equal(store_list_checkpoints(s, &list, &nl), 0);
  assert_int_equal(nl, 1);
  assert_string_equal(list[0].id, "c1");
  assert_int_equal(list[0].sealed, 1);
  free(list);
  expect_manifest(s, "c1", "m", 1);
  snap_dir(cdir, &after);
  expect_same_dir(&before, &after);
  want_rows_t w;
  want_init(&w, &f->layout, keys, n, v1);
  assert_int_equal(read_all(cdir, 256, 1u << 16, &w), (n + 255) / 256);
  store_reader_t *r = NULL;
  assert_int_equal(store_reader_open(cdir, &r, why, sizeof why), 0);
  expect_reader_blob_names(r, (const char *[]){"dense"}, 1);
  expect_reader_blob(r, "dense", "d1", 2);
  store_reader_close(r);
  /* ...and restorable, also after a reopen */
  store_close(s);
  s = open_store(f, 0);
  expect_has(s, 0, 0);
  expect_ids(s, (const char *[]){"c1"}, 1);
  assert_int_equal(store_restore(s, "c1", why, sizeof why), 0);
  expect_rows(s, &f->layout, keys, n, v1, 0, NULL);
  expect_has(s, 1, 1);
  /* a clear that keeps nothing still removes them */
  assert_int_equal(store_clear(s, 0, why, sizeof why), 0);
  expect_ids(s, NULL, 0);
  assert_false(in_dir(f->dir, "checkpoints", "c1"));
  expect_has(s, 0, 0);
  store_close(s);
  free(before.e);
  free(after.e);
  free(w.off);
  free(init);
  free(v2);
  free(v1);
  free(keys);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--durability-child"))
    return log_level = LOG_WARN, durability_child(argv[2], atoi(argv[3]));
  log_level = LOG_WARN; /* keep the test output readable */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lazy_init, setup, teardown),
      cmocka_unit_test_setup_teardown(test_write_lookup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hot_eviction, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill9_durability, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_restore, setup, teardown),
      cmocka_unit_test_setup_teardown(test_blobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
      cmocka_unit_test_setup_teardown(test_layout_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_digest_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrency, setup, teardown),
      cmocka_unit_test_setup_teardown(test_seal_manifest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_delete_checkpoint, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clear, setup, teardown),
      cmocka_unit_test_setup_teardown(test_set_digest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reader, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reader_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clear_keep_checkpoints, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
