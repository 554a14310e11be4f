/*
 * Unit tests of the embedding store on a full disk (store.h, "a full
 * disk"): on a small tmpfs, writes go on until RocksDB says "No space left
 * on device"; that write and every later one (RocksDB stopped: its
 * background error) answer -ENOSPC with a sentence naming it, reads go on,
 * a checkpoint fails the same way, store_space reports the mark and what a
 * reopen needs, store_resume waits for that room; once the tmpfs is grown
 * (the space came back) store_resume reopens the store, it takes writes
 * again, and every row acknowledged before the disk filled reads back, also
 * after a close and an open.
 *
 * Mounting needs root (CAP_SYS_ADMIN): without it each test says so and
 * is skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "err.h"
#include "store.h"
#include "table.h"
#include "testutil.h"

#define DIM 254 /* + 2 floats of Adam-like state: 1 KiB a row */
#define BATCH 64

typedef struct fx_s {
  char dir[64];
  char data[96];
  int mounted;
  table_layout_t layout;
} fx_t;

static int mount_tmpfs(const char *dir, unsigned mb, int remount) {
  char opt[32];
  snprintf(opt, sizeof opt, "size=%um", mb);
  return mount("tmpfs", dir, "tmpfs", remount ? MS_REMOUNT : 0, opt);
}

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f || testutil_tmpdir(f->dir, sizeof f->dir, "storespace")) return -1;
  if (mount_tmpfs(f->dir, 8, 0) == 0) f->mounted = 1;
  else fprintf(stderr, "# cannot mount a tmpfs on %s (%s): these tests need root\n", f->dir, strerror(errno));
  snprintf(f->data, sizeof f->data, "%s/data", f->dir);
  assert_int_equal(table_layout_init(&f->layout, 1, 11), 0);
  f->layout.tables[0] = (table_info_t){.rows = 1u << 20, .dim = DIM, .state_floats = 2};
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  if (f->mounted) umount2(f->dir, MNT_DETACH);
  testutil_rmtree(f->dir);
  table_layout_close(&f->layout);
  free(f);
  return 0;
}

static store_t *open_store(fx_t *f) {
  store_opts_t o = {.data_dir = f->data, .layout = &f->layout, .hot_bytes = 1u << 20,
                    .block_cache_bytes = 4u << 20, .sync_writes = 1};
  store_t *s = NULL;
  char why[1024] = "";
  int rc = store_open(&o, &s, why, sizeof why);
  if (rc) fprintf(stderr, "open failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
  return s;
}

/* the row of key k: a value of its own in every float */
static void row_of(uint64_t k, float *r) {
  for (int i = 0; i < DIM + 2; i++) r[i] = (float)k + (float)i / 512.0f;
}

/* writes batches of rows from key *next on until one fails; returns that
 * error, *next = the first key not acknowledged */
static int fill(store_t *s, uint64_t *next, char *why, size_t why_len) {
  static float rows[BATCH * (DIM + 2)];
  uint64_t keys[BATCH];
  for (;;) {
    for (int i = 0; i < BATCH; i++) {
      keys[i] = *next + (uint64_t)i;
      row_of(keys[i], rows + (size_t)i * (DIM + 2));
    }
    int rc = store_write(s, keys, BATCH, rows, sizeof rows, 0, why, why_len);
    if (rc) return rc;
    *next += BATCH;
    if (*next > (1u << 20) - BATCH) return 0;
  }
}

/* every key below n reads back as written */
static void expect_rows(store_t *s, uint64_t n) {
  float got[DIM + 2], want[DIM + 2];
  char why[512];
  for (uint64_t k = 0; k < n; k += 97) {
    assert_int_equal(store_lookup(s, &k, 1, got, sizeof got, STORE_LOOKUP_NO_HOT, NULL, why, sizeof why), 0);
    row_of(k, want);
    assert_memory_equal(got, want, sizeof got);
  }
  uint64_t last = n - 1;
  assert_int_equal(store_lookup(s, &last, 1, got, sizeof got, STORE_LOOKUP_NO_HOT, NULL, why, sizeof why), 0);
  row_of(last, want);
  assert_memory_equal(got, want, sizeof got);
}

static void test_full_then_resume(void **state) {
  fx_t *f = *state;
  if (!f->mounted) skip();
  store_t *s = open_store(f);
  uint64_t acked = 0;
  char why[1024] = "";
  assert_int_equal(fill(s, &acked, why, sizeof why), -ENOSPC);
  assert_true(acked > 0);
  assert_non_null(strstr(why, "No space left on device"));
  /* stopped: a small write fails too, reads go on */
  float r[DIM + 2];
  uint64_t k = acked;
  row_of(k, r);
  assert_int_equal(store_write(s, &k, 1, r, sizeof r, 0, why, sizeof why), -ENOSPC);
  expect_rows(s, acked);
  store_checkpoint_info_t ci;
  assert_int_equal(store_checkpoint(s, "c1", &ci, why, sizeof why), -ENOSPC);
  store_space_t sp;
  assert_int_equal(store_space(s, &sp), 0);
  assert_int_equal(sp.nospace, 1);
  assert_true(sp.need_bytes > sp.free_bytes);
  assert_true(sp.total_bytes >= 7u << 20 && sp.total_bytes <= 9u << 20);
  int reopened = -1;
  assert_int_equal(store_resume(s, &reopened, why, sizeof why), -ENOSPC);
  assert_int_equal(reopened, 0);
  assert_non_null(strstr(why, "needs"));
  /* the space comes back */
  assert_int_equal(mount_tmpfs(f->dir, 64, 1), 0);
  assert_int_equal(store_resume(s, &reopened, why, sizeof why), 0);
  assert_int_equal(reopened, 1);
  assert_int_equal(store_space(s, &sp), 0);
  assert_int_equal(sp.nospace, 0);
  assert_int_equal(store_resume(s, &reopened, why, sizeof why), 0);
  assert_int_equal(reopened, 0);
  expect_rows(s, acked);
  assert_int_equal(store_write(s, &k, 1, r, sizeof r, 0, why, sizeof why), 0);
  assert_int_equal(store_checkpoint(s, "c1", &ci, why, sizeof why), 0);
  store_close(s);
  s = open_store(f);
  expect_rows(s, acked + 1);
  store_close(s);
}

/* A full disk while the store is idle, then filled again after a resume:
 * the mark comes and goes each time, and nothing acknowledged is lost. */
static void test_full_twice(void **state) {
  fx_t *f = *state;
  if (!f->mounted) skip();
  store_t *s = open_store(f);
  uint64_t acked = 0;
  char why[1024] = "";
  int reopened = 0;
  assert_int_equal(fill(s, &acked, why, sizeof why), -ENOSPC);
  uint64_t first = acked;
  assert_int_equal(mount_tmpfs(f->dir, 24, 1), 0);
  assert_int_equal(store_resume(s, &reopened, why, sizeof why), 0);
  assert_int_equal(reopened, 1);
  assert_int_equal(fill(s, &acked, why, sizeof why), -ENOSPC);
  assert_true(acked > first);
  assert_int_equal(mount_tmpfs(f->dir, 96, 1), 0);
  assert_int_equal(store_resume(s, &reopened, why, sizeof why), 0);
  assert_int_equal(reopened, 1);
  expect_rows(s, acked);
  store_close(s);
  s = open_store(f);
  expect_rows(s, acked);
  store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_full_then_resume, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_twice, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
