/* Unit tests of manifest (a whole-job checkpoint's manifest): the text
 * round trip, and every way a damaged or cut manifest is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "manifest.h"

static void fill(manifest_t *m, uint64_t *bytes) {
  memset(m, 0, sizeof *m);
  snprintf(m->id, sizeof m->id, "seed42-20261124T000000Z-000000000020");
  snprintf(m->job_id, sizeof m->job_id, "seed42-20261124T000000Z");
  m->iteration = 19;
  m->created_unix = 1795000000;
  snprintf(m->model, sizeof m->model, "dlrm");
  snprintf(m->model_shape, sizeof m->model_shape, "bottom_mlp=32;top_mlp=32");
  snprintf(m->optimizer, sizeof m->optimizer, "adam");
  snprintf(m->embedding_optimizer, sizeof m->embedding_optimizer, "rowwise_adagrad");
  snprintf(m->dataset, sizeof m->dataset, "/data/criteo day 0.tsv");
  snprintf(m->allocation, sizeof m->allocation, "laia");
  snprintf(m->lookahead, sizeof m->lookahead, "auto");
  snprintf(m->shard_rule, sizeof m->shard_rule, "consistent");
  m->layout_hash = 0x0123456789abcdefULL;
  m->schema_hash = 0xfedcba9876543210ULL;
  m->seed = 42;
  m->batch_size = 1024;
  m->iterations = 600;
  m->trainers = 2;
  m->servers = 3;
  m->cache_rows = 1000000;
  m->dense_server = 0;
  snprintf(m->dense_blob, sizeof m->dense_blob, "ckpt.%s.dense", m->id);
  snprintf(m->oracle_blob, sizeof m->oracle_blob, "ckpt.%s.oracle", m->id);
  snprintf(m->oracle_sha256, sizeof m->oracle_sha256, "%064d", 7);
  m->rows_flushed = 17804;
  bytes[0] = 4000000, bytes[1] = 2700000, bytes[2] = 1;
  m->server_bytes = bytes;
}

static void test_round_trip(void **st) {
  (void)st;
  manifest_t m, back;
  uint64_t bytes[3];
  fill(&m, bytes);
  size_t len = 0;
  char *text = manifest_format(&m, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  char err[256] = "";
  assert_int_equal(manifest_parse(text, len, &back, err, sizeof err), 0);
  assert_string_equal(back.id, m.id);
  assert_string_equal(back.job_id, m.job_id);
  assert_string_equal(back.dataset, m.dataset);
  assert_string_equal(back.embedding_optimizer, m.embedding_optimizer);
  assert_int_equal(back.iteration, 19);
  assert_int_equal(back.layout_hash, m.layout_hash);
  assert_int_equal(back.schema_hash, m.schema_hash);
  assert_int_equal(back.servers, 3);
  assert_int_equal(back.rows_flushed, 17804);
  assert_non_null(back.server_bytes);
  for (int s = 0; s < 3; s++) assert_int_equal(back.server_bytes[s], bytes[s]);
  /* the same text again: formatting is a function of the fields */
  back.server_bytes[2] = 1;
  size_t len2 = 0;
  char *text2 = manifest_format(&back, &len2);
  assert_int_equal(len2, len);
  assert_memory_equal(text2, text, len);
  assert_string_equal(back.shard_rule, "consistent");
  manifest_free(&back);
  free(text2);
  free(text);
  /* a manifest from before shard.rule (no shard_rule line): its rows went by modulo */
  m.shard_rule[0] = 0;
  text = manifest_format(&m, &len);
  assert_null(strstr(text, "shard_rule="));
  assert_int_equal(manifest_parse(text, len, &back, err, sizeof err), 0);
  assert_string_equal(back.shard_rule, "modulo");
  manifest_free(&back);
  free(text);
}

static void test_refused(void **st) {
  (void)st;
  manifest_t m, back;
  uint64_t bytes[3];
  fill(&m, bytes);
  size_t len = 0;
  char *text = manifest_format(&m, &len);
  char err[256];
  /* every single changed byte before the checksum line is caught */
  const char *sha = strstr(text, "sha256=");
  size_t body = (size_t)(sha - text);
  for (size_t i = 0; i < body; i++) {
    char *t = malloc(len);
    memcpy(t, text, len);
    t[i] ^= 0x01;
    err[0] = 0;
    assert_int_equal(manifest_parse(t, len, &back, err, sizeof err), ERR_BADMSG);
    assert_true(strstr(err, "damaged") || strstr(err, "no sha256") || strstr(err, "lacks"));
    free(t);
  }
  /* cut short anywhere */
  for (size_t cut = 0; cut < len - 1; cut += 7) {
    err[0] = 0;
    assert_int_equal(manifest_parse(text, cut, &back, err, sizeof err), ERR_BADMSG);
    assert_true(err[0] != 0);
  }
  /* a checksum that matches but fields missing: refused, not half-read */
  const char *lonely = "chanter_checkpoint=1\nid=x\n";
  char buf[512];
  manifest_t tiny = {0};
  snprintf(tiny.id, sizeof tiny.id, "x");
  size_t tl = 0;
  char *tt = manifest_format(&tiny, &tl); /* servers = 0: refused */
  assert_int_equal(manifest_parse(tt, tl, &back, err, sizeof err), ERR_BADMSG);
  assert_non_null(strstr(err, "lacks"));
  free(tt);
  snprintf(buf, sizeof buf, "%s", lonely);
  assert_int_equal(manifest_parse(buf, strlen(buf), &back, err, sizeof err), ERR_BADMSG);
  assert_int_equal(manifest_parse("", 0, &back, err, sizeof err), ERR_BADMSG);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
