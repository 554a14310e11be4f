/*
 * Unit tests of the backups of checkpoints (common/store/store_backup.c):
 * two sealed checkpoints backed up, the second incremental (it copies
 * fewer bytes than it holds: the SSTs of the first are shared); a
 * checkpoint backed up again copies nothing; an unsealed one is refused;
 * dropping the first backup keeps the second restorable; a restore into an
 * empty data dir gives checkpoints a store lists sealed, with their
 * manifests, whose rows have the original digest; a damaged or half-written
 * sidecar is ignored with a log line naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fsio.h"
#include "store.h"
#include "table.h"
#include "testutil.h"

typedef struct fx_s {
  char dir[64], data[128], backup[128];
  table_layout_t layout;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f || testutil_tmpdir(f->dir, sizeof f->dir, "storebk")) return -1;
  snprintf(f->data, sizeof f->data, "%s/data", f->dir);
  snprintf(f->backup, sizeof f->backup, "%s/backup", f->dir);
  if (table_layout_init(&f->layout, 1, 7)) return -1;
  f->layout.tables[0] = (table_info_t){.rows = 100000, .dim = 16, .state_floats = 1};
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

static store_t *open_store(fx_t *f, const char *dir) {
  store_opts_t o = {.data_dir = dir, .layout = &f->layout, .block_cache_bytes = 8u << 20};
  store_t *s = NULL;
  char why[1024] = "";
  int rc = store_open(&o, &s, why, sizeof why);
  if (rc) fprintf(stderr, "open %s: %s\n", dir, why);
  assert_int_equal(rc, 0);
  return s;
}

/* Rows first..first+n-1, version v (17 floats each). */
static void put_rows(store_t *s, uint64_t first, size_t n, int v) {
  uint64_t *k = malloc(n * sizeof *k);
  float *r = malloc(n * 17 * sizeof *r);
  assert_non_null(k);
  assert_non_null(r);
  for (size_t i = 0; i < n; i++) {
    k[i] = first + i;
    for (int j = 0; j < 17; j++) r[i * 17 + j] = (float)k[i] * 0.25f + (float)v * 1000.0f + (float)j;
  }
  char why[512] = "";
  assert_int_equal(store_write(s, k, n, r, n * 17 * sizeof *r, 0, why, sizeof why), 0);
  free(k);
  free(r);
}

static void take_and_seal(store_t *s, const char *id, const char *manifest) {
  char why[512] = "";
  assert_int_equal(store_checkpoint(s, id, NULL, why, sizeof why), 0);
  assert_int_equal(store_seal_checkpoint(s, id, manifest, strlen(manifest), why, sizeof why), 0);
}

static void backup_ok(store_backup_t *b, store_t *s, const char *id, store_backup_info_t *info) {
  char why[1024] = "";
  int rc = store_backup_checkpoint(b, s, id, info, why, sizeof why);
  if (rc) fprintf(stderr, "backup %s: %s\n", id, why);
  assert_int_equal(rc, 0);
}

/* The digest of checkpoint id of the store in dir (restored into its live db). */
static void digest_of_checkpoint(fx_t *f, const char *dir, const char *id, uint8_t sha[32], uint64_t *rows) {
  store_t *s = open_store(f, dir);
  char why[512] = "";
  assert_int_equal(store_restore(s, id, why, sizeof why), 0);
  assert_int_equal(store_digest(s, sha, NULL, rows), 0);
  store_close(s);
}

/* store_backup_list with stderr captured into out. */
static size_t list_capturing(store_backup_t *b, store_backup_entry_t **list, char *out, size_t out_len) {
  char path[160];
  snprintf(path, sizeof path, "/tmp/storebk-stderr-%d", (int)getpid());
  fflush(stderr);
  int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  size_t n = 0;
  int rc = store_backup_list(b, list, &n);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  assert_int_equal(rc, 0);
  char *text = NULL;
  assert_int_equal(fsio_read_all(path, 0, &text, NULL, NULL, 0), 0);
  snprintf(out, out_len, "%s", text);
  free(text);
  unlink(path);
  return n;
}

static void test_backup_incremental_restore(void **state) {
  fx_t *f = *state;
  char why[1024] = "";
  store_t *s = open_store(f, f->data);
  store_backup_t *b = NULL;
  assert_int_equal(store_backup_open(f->backup, &b, why, sizeof why), 0);

  put_rows(s, 0, 20000, 1);
  take_and_seal(s, "job-00000010", "manifest of 10\n");
  uint8_t sha1[32], sha2[32], got[32];
  uint64_t rows1 = 0, rows2 = 0, rows = 0;
  assert_int_equal(store_digest(s, sha1, NULL, &rows1), 0);
  store_backup_info_t i1, i2, again;
  backup_ok(b, s, "job-00000010", &i1);
  assert_false(i1.already);
  assert_true(i1.backup_id > 0);
  assert_true(i1.bytes > 20000u * 17 * 4);   /* the rows are in it */
  assert_true(i1.bytes_copied >= i1.bytes);  /* the first copies everything (plus the engine's meta file) */

  put_rows(s, 19900, 500, 2); /* 100 rows rewritten, 400 new */
  take_and_seal(s, "job-00000020", "manifest of 20\n");
  assert_int_equal(store_digest(s, sha2, NULL, &rows2), 0);
  backup_ok(b, s, "job-00000020", &i2);
  assert_true(i2.backup_id > i1.backup_id);
  assert_true(i2.bytes > i1.bytes);
  assert_true(i2.bytes_copied < i2.bytes);            /* incremental: the first one's SSTs are shared */
  assert_true(i2.bytes_copied < i1.bytes_copied / 2); /* and the new ones are a small part */
  assert_true(store_backup_has(b, "job-00000020"));

  backup_ok(b, s, "job-00000010", &again); /* again: nothing copied */
  assert_true(again.already);
  assert_int_equal(again.backup_id, i1.backup_id);

  /* not sealed: refused, no sidecar */
  assert_int_equal(store_checkpoint(s, "job-00000030", NULL, why, sizeof why), 0);
  store_backup_info_t i3;
  assert_int_equal(store_backup_checkpoint(b, s, "job-00000030", &i3, why, sizeof why), ERR_NOTFOUND);
  assert_non_null(strstr(why, "not sealed"));
  assert_false(store_backup_has(b, "job-00000030"));
  store_close(s);

  /* restore everything into an empty data dir */
  char r1[160];
  snprintf(r1, sizeof r1, "%s/restored1", f->dir);
  store_backup_restored_t r;
  assert_int_equal(store_backup_restore(b, r1, &r, why, sizeof why), 0);
  assert_int_equal(r.backups, 2);
  assert_int_equal(r.restored, 2);
  assert_int_equal(r.failed, 0);
  assert_string_equal(r.newest, "job-00000020");
  s = open_store(f, r1);
  store_checkpoint_info_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_list_checkpoints(s, &v, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(v[0].id, "job-00000010");
  assert_true(v[0].sealed && v[1].sealed);
  free(v);
  void *m = NULL;
  size_t mlen = 0;
  assert_int_equal(store_get_manifest(s, "job-00000020", &m, &mlen), 0);
  assert_int_equal(mlen, strlen("manifest of 20\n"));
  assert_memory_equal(m, "manifest of 20\n", mlen);
  free(m);
  int has_rows = 1;
  assert_int_equal(store_has_rows(s, &has_rows, NULL), 0);
  assert_int_equal(has_rows, 0); /* the live db starts empty */
  store_close(s);
  digest_of_checkpoint(f, r1, "job-00000010", got, &rows);
  assert_memory_equal(got, sha1, 32);
  assert_int_equal(rows, rows1);
  digest_of_checkpoint(f, r1, "job-00000020", got, &rows);
  assert_memory_equal(got, sha2, 32);
  assert_int_equal(rows, rows2);

  /* the first backup dropped (pruned): the second, which shares its SSTs, still restores whole */
  assert_int_equal(store_backup_drop(b, "job-00000010", why, sizeof why), 0);
  assert_false(store_backup_has(b, "job-00000010"));
  char r2[160];
  snprintf(r2, sizeof r2, "%s/restored2", f->dir);
  assert_int_equal(store_backup_restore(b, r2, &r, why, sizeof why), 0);
  assert_int_equal(r.restored, 1);
  assert_string_equal(r.newest, "job-00000020");
  digest_of_checkpoint(f, r2, "job-00000020", got, &rows);
  assert_memory_equal(got, sha2, 32);
  store_backup_close(b);
}

static void test_damaged_sidecar_ignored(void **state) {
  fx_t *f = *state;
  char why[1024] = "", log[4096];
  store_t *s = open_store(f, f->data);
  store_backup_t *b = NULL;
  assert_int_equal(store_backup_open(f->backup, &b, why, sizeof why), 0);
  put_rows(s, 0, 1000, 1);
  take_and_seal(s, "job-00000010", "m10\n");
  store_backup_info_t info;
  backup_ok(b, s, "job-00000010", &info);
  store_close(s);

  /* a half-written sidecar (what a copy cut short leaves), and one whose contents were changed */
  char good[256], half[256], bad[256], *text = NULL;
  size_t len = 0;
  snprintf(good, sizeof good, "%s/job-00000010.checkpoint", f->backup);
  snprintf(half, sizeof half, "%s/job-00000020.checkpoint", f->backup);
  snprintf(bad, sizeof bad, "%s/job-00000030.checkpoint", f->backup);
  assert_int_equal(fsio_read_all(good, 0, &text, &len, NULL, 0), 0);
  assert_int_equal(fsio_replace(half, text, len / 2, 0644, NULL, 0), 0);
  char *changed = strstr(text, "id=job-00000010");
  assert_non_null(changed);
  memcpy(changed, "id=job-00000030", 15);
  text[len - 2] ^= 1; /* a byte of the manifest */
  assert_int_equal(fsio_replace(bad, text, len, 0644, NULL, 0), 0);
  free(text);

  store_backup_entry_t *list = NULL;
  size_t n = list_capturing(b, &list, log, sizeof log);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "job-00000010");
  free(list);
  assert_non_null(strstr(log, "ignoring a damaged backup sidecar"));
  assert_non_null(strstr(log, "job-00000020.checkpoint"));
  assert_non_null(strstr(log, "job-00000030.checkpoint"));
  assert_non_null(strstr(log, "sha256"));
  assert_false(store_backup_has(b, "job-00000020"));
  assert_false(store_backup_has(b, "job-00000030"));

  char r1[160];
  snprintf(r1, sizeof r1, "%s/restored", f->dir);
  store_backup_restored_t r;
  assert_int_equal(store_backup_restore(b, r1, &r, why, sizeof why), 0);
  assert_int_equal(r.restored, 1);
  assert_string_equal(r.newest, "job-00000010");
  /* Clear's drop of every sidecar: the damaged ones are not sidecars and stay, the engine is emptied */
  assert_int_equal(store_backup_drop(b, NULL, why, sizeof why), 0);
  assert_false(store_backup_has(b, "job-00000010"));
  assert_int_equal(store_backup_restore(b, r1, &r, why, sizeof why), 0);
  assert_int_equal(r.backups, 0);
  store_backup_close(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_backup_incremental_restore, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damaged_sidecar_ignored, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
