/*
 * Unit tests of what lets an embedding store come back from kill -9 with
 * its checkpoint protocol intact (common/store/store_recover.c and the
 * checkpoint paths of store_ckpt.c and store_dir.c): the fence kept in data_dir/FENCE across a
 * reopen, lifted by the checkpoint of its id (and recorded in it), by Clear
 * and by Restore; a Checkpoint retried after its answer was lost; a process
 * killed inside a checkpoint (CHANTER_FAULT_STORE_CHECKPOINT) before and
 * after the checkpoint is complete; the start-up clean-up of half-made
 * checkpoint directories and of interrupted fence writes (FENCE.tmp and
 * fsio_replace's FENCE.tmp.<pid>); a damaged FENCE file refused with the file's
 * name, a database that does not open likewise; Seal and Delete retried;
 * the pid in LOCK.
 *
 * The kill tests re-execute this binary (/proc/self/exe) with
 * "--checkpoint-child DIR ID POINT", so that the child opens RocksDB in a
 * fresh process (not a fork of one that has RocksDB threads) and dies by
 * SIGKILL in the middle of store_checkpoint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "store.h"
#include "table.h"
#include "testutil.h"

typedef struct fx_s {
  char dir[64];
  table_layout_t layout;
} fx_t;

static void make_layout(table_layout_t *l) {
  assert_int_equal(table_layout_init(l, 1, 7), 0);
  l->tables[0] = (table_info_t){.rows = 10000, .dim = 4, .state_floats = 1};
}

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f || testutil_tmpdir(f->dir, sizeof f->dir, "storerec")) return -1;
  make_layout(&f->layout);
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

static int try_open(const char *dir, const table_layout_t *l, store_t **s, char *why, size_t why_len) {
  store_opts_t o = {.data_dir = dir, .layout = l, .hot_bytes = 1u << 20, .block_cache_bytes = 8u << 20,
                    .sync_writes = 1};
  return store_open(&o, s, why, why_len);
}

static store_t *open_store(fx_t *f) {
  store_t *s = NULL;
  char why[1024] = "";
  int rc = try_open(f->dir, &f->layout, &s, why, sizeof why);
  if (rc) fprintf(stderr, "open failed: %s (%s)\n", err_str(rc), why);
  assert_int_equal(rc, 0);
  return s;
}

/* Row of key k at version v: 5 floats. */
static void row_of(uint64_t k, int v, float r[5]) {
  for (int j = 0; j < 5; j++) r[j] = (float)k * 0.5f + (float)v * 100.0f + (float)j;
}

static void put(store_t *s, uint64_t k, int v) {
  float r[5];
  row_of(k, v, r);
  char why[512] = "";
  int rc = store_write(s, &k, 1, r, sizeof r, 0, why, sizeof why);
  if (rc) fprintf(stderr, "write: %s\n", why);
  assert_int_equal(rc, 0);
}

static void expect_row(store_t *s, uint64_t k, int v) {
  float want[5], got[5];
  row_of(k, v, want);
  assert_int_equal(store_lookup(s, &k, 1, got, sizeof got, STORE_LOOKUP_NO_HOT, NULL, NULL, 0), 0);
  assert_memory_equal(got, want, sizeof got);
}

static void fence_ok(store_t *s, const char *id, uint64_t it) {
  char why[512] = "";
  int rc = store_fence_set(s, id, it, why, sizeof why);
  if (rc) fprintf(stderr, "fence: %s\n", why);
  assert_int_equal(rc, 0);
}

static int checkpoint(store_t *s, const char *id, store_checkpoint_info_t *info) {
  char why[512] = "";
  int rc = store_checkpoint(s, id, info, why, sizeof why);
  if (rc && rc != ERR_EXISTS) fprintf(stderr, "checkpoint %s: %s\n", id, why);
  return rc;
}

static int listed(store_t *s, const char *id) {
  store_checkpoint_info_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_list_checkpoints(s, &v, &n), 0);
  int found = 0;
  for (size_t i = 0; i < n; i++) found += !strcmp(v[i].id, id);
  free(v);
  return found;
}

static int file_has(const char *path, const char *needle) {
  char buf[2048] = "";
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  return strstr(buf, needle) != NULL;
}

static int exists(const char *dir, const char *rel) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  return stat(p, &st) == 0;
}

/* ------------------------------------------------------------ the fence */

static void test_fence_persists(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  assert_false(exists(f->dir, "FENCE"));
  fence_ok(s, "job-000000000010", 9);
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 1);
  assert_string_equal(fe.id, "job-000000000010");
  assert_int_equal(fe.iteration, 9);
  assert_true(fe.token != 0);
  uint64_t token = fe.token;
  fence_ok(s, "job-000000000010", 9); /* again: the same fence */
  store_fence_get(s, &fe);
  assert_int_equal(fe.token, token);
  char path[256];
  snprintf(path, sizeof path, "%s/FENCE", f->dir);
  assert_true(file_has(path, "id=job-000000000010\n") && file_has(path, "iteration=9\n"));
  store_close(s);

  s = open_store(f); /* back after a restart */
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 1);
  assert_string_equal(fe.id, "job-000000000010");
  assert_int_equal(fe.iteration, 9);
  assert_int_equal(fe.token, token);
  fence_ok(s, "job-000000000020", 19); /* a new id replaces it */
  store_fence_get(s, &fe);
  assert_string_equal(fe.id, "job-000000000020");
  assert_int_equal(fe.iteration, 19);
  char why[512] = "";
  assert_int_equal(store_fence_set(s, "../x", 1, why, sizeof why), -EINVAL);
  assert_non_null(strstr(why, "not a valid checkpoint id"));
  store_fence_get(s, &fe);
  assert_string_equal(fe.id, "job-000000000020"); /* a refused fence changes nothing */
  store_close(s);
  s = open_store(f);
  store_fence_get(s, &fe);
  assert_string_equal(fe.id, "job-000000000020");
  store_close(s);
}

static void test_checkpoint_lifts_fence(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 1, 1);
  fence_ok(s, "other", 3);
  store_checkpoint_info_t info;
  assert_int_equal(checkpoint(s, "unrelated", &info), 0); /* another id: the fence stays */
  assert_int_equal(info.fence_lifted, 0);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 1);
  fence_ok(s, "cp-b", 5);
  store_fence_get(s, &fe);
  uint64_t token = fe.token;
  assert_int_equal(checkpoint(s, "cp-b", &info), 0);
  assert_int_equal(info.fence_lifted, 1);
  assert_int_equal(info.retried, 0);
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  assert_false(exists(f->dir, "FENCE"));
  char meta[256], tok[64];
  snprintf(meta, sizeof meta, "%s/checkpoints/cp-b/CHANTER_CHECKPOINT", f->dir);
  snprintf(tok, sizeof tok, "fence_token=%016llx\n", (unsigned long long)token);
  assert_true(file_has(meta, "fence_id=cp-b\n") && file_has(meta, "fence_iteration=5\n") && file_has(meta, tok));
  store_close(s);
  s = open_store(f);
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0); /* lifted for good */
  store_close(s);
}

static void test_checkpoint_retried(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 1, 1);
  store_checkpoint_info_t info, again;
  /* not fenced (the CLI's): an existing id stays refused */
  assert_int_equal(checkpoint(s, "plain", &info), 0);
  assert_int_equal(checkpoint(s, "plain", &again), ERR_EXISTS);
  /* fenced (the oracle's): taking it again is a retried call, answered with it */
  fence_ok(s, "cp-r", 1);
  assert_int_equal(checkpoint(s, "cp-r", &info), 0);
  put(s, 1, 2);
  assert_int_equal(checkpoint(s, "cp-r", &again), 0);
  assert_int_equal(again.retried, 1);
  assert_int_equal(again.created_unix, info.created_unix);
  assert_int_equal(again.bytes, info.bytes);
  assert_string_equal(again.path, info.path);
  assert_int_equal(listed(s, "cp-r"), 1);
  /* a NEW fence of the same id waits for a new checkpoint: the old one is not it */
  fence_ok(s, "cp-r", 1);
  assert_int_equal(checkpoint(s, "cp-r", &again), ERR_EXISTS);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 1);
  char why[256];
  assert_int_equal(store_delete_checkpoint(s, "cp-r", why, sizeof why), 0);
  assert_int_equal(checkpoint(s, "cp-r", &again), 0);
  assert_int_equal(again.retried, 0);
  assert_int_equal(again.fence_lifted, 1);
  /* and the new one holds the row as of now */
  assert_int_equal(store_restore(s, "cp-r", why, sizeof why), 0);
  expect_row(s, 1, 2);
  store_close(s);
}

static void test_clear_restore_lift_fence(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  char why[256];
  put(s, 3, 1);
  assert_int_equal(checkpoint(s, "base", NULL), 0);
  fence_ok(s, "next", 4);
  assert_int_equal(store_restore(s, "base", why, sizeof why), 0);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  assert_false(exists(f->dir, "FENCE"));
  fence_ok(s, "next", 4);
  assert_int_equal(store_clear(s, 1, why, sizeof why), 0);
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  store_close(s);
  s = open_store(f);
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  assert_int_equal(listed(s, "base"), 1); /* kept */
  store_close(s);
}

/* ------------------------------------------------------------ kill -9 inside a checkpoint */

static int checkpoint_child(const char *dir, const char *id, const char *point) {
  table_layout_t l;
  make_layout(&l);
  setenv("CHANTER_FAULT_STORE_CHECKPOINT", point, 1);
  store_t *s = NULL;
  if (try_open(dir, &l, &s, NULL, 0)) return 2;
  store_checkpoint(s, id, NULL, NULL, 0);
  return 3; /* not reached: the fault hook kills us */
}

/* Runs the child; asserts it died of SIGKILL. */
static void kill_inside_checkpoint(const char *dir, const char *id, const char *point) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "test_store_recover", "--checkpoint-child", dir, id, point, (char *)NULL);
    _exit(127);
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  if (!WIFSIGNALED(ws)) fprintf(stderr, "child exit status %d\n", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
}

static void test_killed_before_complete(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 5, 1);
  fence_ok(s, "cp-k", 10);
  store_close(s);
  kill_inside_checkpoint(f->dir, "cp-k", "staged");
  assert_true(exists(f->dir, "checkpoints.tmp/cp-k")); /* half made: no marker */
  assert_false(exists(f->dir, "checkpoints.tmp/cp-k/CHANTER_CHECKPOINT"));
  assert_false(exists(f->dir, "checkpoints/cp-k"));
  char lock[256];
  snprintf(lock, sizeof lock, "%s/LOCK", f->dir);
  assert_true(file_has(lock, "pid=")); /* the killed process never emptied it */

  s = open_store(f); /* the dir opens after the kill; the half-made checkpoint is gone */
  assert_false(exists(f->dir, "checkpoints.tmp/cp-k"));
  assert_int_equal(listed(s, "cp-k"), 0);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 1); /* still waiting for cp-k */
  assert_string_equal(fe.id, "cp-k");
  char mine[32];
  snprintf(mine, sizeof mine, "pid=%ld\n", (long)getpid());
  assert_true(file_has(lock, mine));
  put(s, 5, 2); /* what the retried call must take */
  store_checkpoint_info_t info;
  assert_int_equal(checkpoint(s, "cp-k", &info), 0); /* the retried call takes it anew */
  assert_int_equal(info.retried, 0);
  assert_int_equal(info.fence_lifted, 1);
  char why[256];
  put(s, 5, 3);
  assert_int_equal(store_restore(s, "cp-k", why, sizeof why), 0);
  expect_row(s, 5, 2);
  store_close(s);
  assert_false(file_has(lock, "pid=")); /* closed cleanly */
}

static void test_killed_after_complete(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 6, 1);
  fence_ok(s, "cp-c", 10);
  store_close(s);
  kill_inside_checkpoint(f->dir, "cp-c", "complete");
  assert_true(exists(f->dir, "checkpoints/cp-c/CHANTER_CHECKPOINT"));
  assert_true(exists(f->dir, "FENCE")); /* killed before the fence was lifted */

  s = open_store(f); /* its checkpoint is there: the fence is lifted at open */
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  assert_false(exists(f->dir, "FENCE"));
  assert_int_equal(listed(s, "cp-c"), 1);
  put(s, 6, 2);
  store_checkpoint_info_t info;
  assert_int_equal(checkpoint(s, "cp-c", &info), 0); /* the retried call gets the one taken */
  assert_int_equal(info.retried, 1);
  char why[256];
  assert_int_equal(store_restore(s, "cp-c", why, sizeof why), 0);
  expect_row(s, 6, 1);
  store_close(s);
}

/* ------------------------------------------------------------ start-up */

static void test_startup_cleanup(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 7, 1);
  assert_int_equal(checkpoint(s, "good", NULL), 0);
  store_close(s);
  char p[512];
  /* half-made by hand: a build never renamed, a directory without marker, a torn marker */
  snprintf(p, sizeof p, "%s/checkpoints.tmp", f->dir);
  assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
  snprintf(p, sizeof p, "%s/checkpoints.tmp/half-1", f->dir);
  assert_int_equal(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/checkpoints/half-2", f->dir);
  assert_int_equal(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/checkpoints/half-2/000007.sst", f->dir);
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fputs("not a table", fp);
  fclose(fp);
  snprintf(p, sizeof p, "%s/checkpoints/torn", f->dir);
  assert_int_equal(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/checkpoints/torn/CHANTER_CHECKPOINT", f->dir);
  fp = fopen(p, "w");
  assert_non_null(fp);
  fputs("id=torn\ncreated_", fp);
  fclose(fp);
  /* an interrupted fence write: fsio_replace's temporary, and the
   * FENCE.tmp of earlier versions */
  const char *fence_tmps[] = {"FENCE.tmp", "FENCE.tmp.4242"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", f->dir, fence_tmps[i]);
    fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("format=1\nid=x", fp);
    fclose(fp);
  }

  s = open_store(f);
  assert_false(exists(f->dir, "checkpoints.tmp/half-1"));
  assert_false(exists(f->dir, "checkpoints/half-2"));
  assert_false(exists(f->dir, "FENCE.tmp"));
  assert_false(exists(f->dir, "FENCE.tmp.4242"));
  assert_int_equal(listed(s, "good"), 1);
  assert_int_equal(listed(s, "half-2"), 0);
  assert_int_equal(listed(s, "torn"), 0); /* never taken for a finished one */
  char why[256];
  assert_int_equal(store_restore(s, "torn", why, sizeof why), -EBADMSG);
  assert_int_equal(store_seal_checkpoint(s, "torn", "m", 1, why, sizeof why), -EBADMSG);
  void *m = NULL;
  size_t len = 0;
  assert_int_equal(store_get_manifest(s, "half-2", &m, &len), ERR_NOTFOUND);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  /* an id whose build was interrupted is taken normally */
  assert_int_equal(checkpoint(s, "half-1", NULL), 0);
  assert_int_equal(listed(s, "half-1"), 1);
  store_close(s);
}

static void test_damaged_fence(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  fence_ok(s, "cp-d", 2);
  store_close(s);
  char p[512];
  snprintf(p, sizeof p, "%s/FENCE", f->dir);
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fputs("format=1\nid=cp-d\niteration=", fp); /* torn by hand: no iteration, no token */
  fclose(fp);
  char lock[256];
  snprintf(lock, sizeof lock, "%s/LOCK", f->dir);
  fp = fopen(lock, "w"); /* as a killed server leaves it */
  assert_non_null(fp);
  fputs("pid=4242\n", fp);
  fclose(fp);
  char why[1024] = "";
  s = NULL;
  assert_int_equal(try_open(f->dir, &f->layout, &s, why, sizeof why), -EBADMSG);
  assert_null(s);
  assert_true(file_has(lock, "pid=4242\n")); /* a failed open keeps the unclean stop on record */
  assert_non_null(strstr(why, p));
  assert_non_null(strstr(why, "damaged"));
  assert_non_null(strstr(why, "remove the file"));
  fp = fopen(p, "w");
  assert_non_null(fp);
  fputs("format=2\nid=cp-d\niteration=1\ntoken=1\n", fp);
  fclose(fp);
  assert_int_equal(try_open(f->dir, &f->layout, &s, why, sizeof why), -EBADMSG);
  assert_non_null(strstr(why, "format 2"));
  assert_int_equal(unlink(p), 0); /* what the message says to do */
  s = open_store(f);
  store_fence_t fe;
  store_fence_get(s, &fe);
  assert_int_equal(fe.set, 0);
  store_close(s);
}

static void test_damaged_db(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  put(s, 9, 1);
  store_close(s);
  char p[512];
  snprintf(p, sizeof p, "%s/db/CURRENT", f->dir);
  FILE *fp = fopen(p, "w"); /* names a manifest that is not there */
  assert_non_null(fp);
  fputs("MANIFEST-999999\n", fp);
  fclose(fp);
  char why[2048] = "";
  s = NULL;
  assert_int_equal(try_open(f->dir, &f->layout, &s, why, sizeof why), ERR_KV);
  assert_null(s);
  assert_non_null(strstr(why, "MANIFEST-999999")); /* RocksDB names the file */
  snprintf(p, sizeof p, "move %s/db aside", f->dir);
  assert_non_null(strstr(why, p)); /* and we say what to do */
}

static void test_lock_busy(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f), *s2 = NULL;
  char why[1024] = "", want[64];
  assert_int_equal(try_open(f->dir, &f->layout, &s2, why, sizeof why), -EBUSY);
  snprintf(want, sizeof want, "in use by another embedding store (pid %ld)", (long)getpid());
  assert_non_null(strstr(why, want)); /* says who holds it */
  store_close(s);
  s = open_store(f); /* and the refused open left the dir as it was */
  store_close(s);
}

static void test_seal_delete_retried(void **state) {
  fx_t *f = *state;
  store_t *s = open_store(f);
  char why[256];
  put(s, 8, 1);
  assert_int_equal(checkpoint(s, "cp-s", NULL), 0);
  assert_int_equal(store_seal_checkpoint(s, "cp-s", "manifest", 8, why, sizeof why), 0);
  store_close(s);
  s = open_store(f); /* as if the server restarted before answering */
  assert_int_equal(store_seal_checkpoint(s, "cp-s", "manifest", 8, why, sizeof why), 0);
  void *m = NULL;
  size_t len = 0;
  assert_int_equal(store_get_manifest(s, "cp-s", &m, &len), 0);
  assert_int_equal(len, 8);
  assert_memory_equal(m, "manifest", 8);
  free(m);
  assert_int_equal(store_delete_checkpoint(s, "cp-s", why, sizeof why), 0);
  store_close(s);
  s = open_store(f);
  assert_int_equal(store_delete_checkpoint(s, "cp-s", why, sizeof why), ERR_NOTFOUND); /* gone either way */
  assert_int_equal(listed(s, "cp-s"), 0);
  store_close(s);
}

int main(int argc, char **argv) {
  log_level = LOG_WARN;
  if (argc == 5 && !strcmp(argv[1], "--checkpoint-child")) return checkpoint_child(argv[2], argv[3], argv[4]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fence_persists, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_lifts_fence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_retried, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clear_restore_lift_fence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_before_complete, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_after_complete, setup, teardown),
      cmocka_unit_test_setup_teardown(test_startup_cleanup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damaged_fence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damaged_db, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lock_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_seal_delete_retried, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
