/*
 * test_oracle_ckpt_state: the oracle's state blob in a checkpoint
 * (services/oracle/oracle_ckpt_state.c).
 *
 * Why: a resumed or recovered job takes c, the evaluation record and the
 * summary's counters from this blob, so what is written must come back
 * field for field.  The blob carries a version: a checkpoint from a
 * chanter of another version must be refused with a sentence naming both
 * versions (not "malformed"), the unversioned layout older chanters wrote
 * must still be read, and a truncated or damaged blob must be refused,
 * never read past its end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "le.h"
#include "oracle_job_internal.h"

#define NP 2

/* A job with only what the blob reads and writes: no laia, no auto
 * tables, no evaluation rounds. */
static oracle_job_t *job_new(void) {
  oracle_job_t *j = calloc(1, sizeof *j);
  assert_non_null(j);
  j->P = NP;
  j->iterations = 1000;
  j->dispatch.rank = calloc(NP, sizeof *j->dispatch.rank);
  j->report.rank = calloc(NP, sizeof *j->report.rank);
  assert_non_null(j->dispatch.rank);
  assert_non_null(j->report.rank);
  return j;
}

static void job_free(oracle_job_t *j) {
  free(j->dispatch.rank);
  free(j->report.rank);
  free(j);
}

/* A blob of a job after iteration 41 with every counter set. */
static void encode_sample(uint8_t **blob, size_t *len) {
  oracle_job_t *j = job_new();
  oracle_report_t *rp = &j->report;
  rp->done = 42;
  rp->evals_done = 3;
  rp->n_evals = 3;
  for (uint64_t i = 0; i < 3; i++)
    rp->evals[i] = (oracle_eval_rec_t){.round = i, .after = 10 * i + 9, .logloss = 0.5 + 0.01 * (double)i,
                                       .auc = 0.7 + 0.01 * (double)i};
  rp->last_test_logloss = 0.52;
  rp->last_test_auc = 0.72;
  rp->loss_last = 0.61;
  rp->tail_loss_sum = 6.5;
  rp->tail_n = 11;
  for (uint64_t i = 0; i < 42; i++) rp->loss_ring[i] = 0.7 - 0.001 * (double)i;
  rp->sum_rows_fetched = 100;
  rp->sum_rows_synced = 200;
  rp->sum_rows_synced_delayed = 300;
  rp->sum_rows_replicated = 400;
  rp->sum_rows_written_back = 500;
  rp->sum_cache_hits = 600;
  for (int i = 0; i < PHASE_N_REPORT; i++) rp->sum_t[i] = 0.25 * i, rp->first_t[i] = 0.125 * i;
  rp->seconds_before = 7;
  rp->t_start = 10;
  rp->t_last = 13.5;
  j->pipe.L_start = 31;
  j->ckpt.n_done = 4;
  j->ckpt.stall_sum = 1.5;
  j->ckpt.total_sum = 2.5;
  oracle_cp_t cp = {.iteration = 41};
  assert_int_equal(oracle_ckpt__state_encode(j, &cp, blob, len), 0);
  job_free(j);
}

/* The SHA-256 trailer made right again after an edit. */
static void reseal(uint8_t *p, size_t n) {
  unsigned hl = 0;
  EVP_Digest(p, n - 32, p + n - 32, &hl, EVP_sha256(), NULL);
  assert_int_equal(hl, 32);
}

static void assert_loaded(const oracle_job_t *j) {
  const oracle_report_t *rp = &j->report;
  assert_int_equal(rp->done, 42);
  assert_int_equal(rp->start, 42);
  assert_int_equal(j->pipe.next, 42);
  assert_int_equal(j->fetch.start, 42);
  assert_int_equal(j->ckpt.start, 42);
  for (uint32_t p = 0; p < NP; p++) {
    assert_int_equal(j->dispatch.rank[p].next_step, 42);
    assert_int_equal(rp->rank[p].reported, 42);
  }
  assert_int_equal(rp->evals_done, 3);
  assert_int_equal(rp->n_evals, 3);
  for (uint64_t i = 0; i < 3; i++) {
    assert_int_equal(rp->evals[i].round, i);
    assert_int_equal(rp->evals[i].after, 10 * i + 9);
    assert_true(rp->evals[i].logloss == 0.5 + 0.01 * (double)i);
    assert_true(rp->evals[i].auc == 0.7 + 0.01 * (double)i);
  }
  assert_true(rp->last_test_logloss == 0.52);
  assert_true(rp->last_test_auc == 0.72);
  assert_true(rp->loss_last == 0.61);
  assert_true(rp->tail_loss_sum == 6.5);
  assert_int_equal(rp->tail_n, 11);
  for (uint64_t i = 0; i < 42; i++) assert_true(rp->loss_ring[i] == 0.7 - 0.001 * (double)i);
  assert_true(rp->sum_rows_fetched == 100);
  assert_true(rp->sum_rows_synced == 200);
  assert_true(rp->sum_rows_synced_delayed == 300);
  assert_true(rp->sum_rows_replicated == 400);
  assert_true(rp->sum_rows_written_back == 500);
  assert_true(rp->sum_cache_hits == 600);
  for (int i = 0; i < PHASE_N_REPORT; i++) {
    assert_true(rp->sum_t[i] == 0.25 * i);
    assert_true(rp->first_t[i] == 0.125 * i);
  }
  assert_true(rp->seconds_before == 10.5); /* 7 before + 3.5 in the checkpointed run */
  assert_int_equal(j->ckpt.n_done, 5);      /* this checkpoint counted */
  assert_true(j->ckpt.stall_sum == 1.5);
  assert_true(j->ckpt.total_sum == 2.5);
}

static void test_round_trip(void **state) {
  (void)state;
  uint8_t *blob;
  size_t n;
  encode_sample(&blob, &n);
  assert_true(n > 12 + 32);
  assert_memory_equal(blob, "CHORACLV", 8);
  assert_int_equal(get_le32(blob + 8), 2); /* the version, first after the magic */
  oracle_job_t *j = job_new();
  char err[512] = "";
  assert_int_equal(oracle_ckpt__state_load(j, blob, n, err, sizeof err), 0);
  assert_loaded(j);
  job_free(j);
  free(blob);
}

static void test_other_version(void **state) {
  (void)state;
  uint8_t *blob;
  size_t n;
  encode_sample(&blob, &n);
  static const uint32_t others[] = {1, 3, 0xffffffffu};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    put_le32(blob + 8, others[i]);
    reseal(blob, n); /* a sound blob, only of another version */
    oracle_job_t *j = job_new();
    char err[512] = "", want[64];
    assert_int_equal(oracle_ckpt__state_load(j, blob, n, err, sizeof err), ERR_CONFIG);
    snprintf(want, sizeof want, "is version %u and this chanter reads version 2", others[i]);
    if (!strstr(err, want)) fail_msg("want \"%s\" in: %s", want, err);
    assert_null(strstr(err, "malformed"));
    job_free(j);
  }
  free(blob);
}

/* The unversioned layout of older chanters: "CHORACL1", then the same
 * fields at once. */
static void test_unversioned(void **state) {
  (void)state;
  uint8_t *blob;
  size_t n;
  encode_sample(&blob, &n);
  uint8_t *old = malloc(n - 4);
  assert_non_null(old);
  memcpy(old, "CHORACL1", 8);
  memcpy(old + 8, blob + 12, n - 12);
  reseal(old, n - 4);
  oracle_job_t *j = job_new();
  char err[512] = "";
  assert_int_equal(oracle_ckpt__state_load(j, old, n - 4, err, sizeof err), 0);
  assert_loaded(j);
  job_free(j);
  free(old);
  free(blob);
}

static void test_truncated(void **state) {
  (void)state;
  uint8_t *blob;
  size_t n;
  encode_sample(&blob, &n);
  /* every length short of the whole, resealed or not: refused, with a sentence */
  for (size_t k = 0; k < n; k++) {
    uint8_t *t = malloc(k ? k : 1);
    assert_non_null(t);
    memcpy(t, blob, k);
    for (int seal = 0; seal < 2; seal++) {
      if (seal && k >= 12 + 32) reseal(t, k);
      oracle_job_t *j = job_new();
      char err[512] = "";
      int rc = oracle_ckpt__state_load(j, t, k, err, sizeof err);
      if (rc != ERR_BADMSG) fail_msg("%zu of %zu bytes (resealed %d): rc %d: %s", k, n, seal, rc, err);
      assert_true(strlen(err) > 0);
      job_free(j);
    }
    free(t);
  }
  /* the message says what: cut inside the header, inside the fields */
  oracle_job_t *j = job_new();
  char err[512] = "";
  assert_int_equal(oracle_ckpt__state_load(j, blob, 10, err, sizeof err), ERR_BADMSG);
  assert_non_null(strstr(err, "truncated"));
  assert_int_equal(oracle_ckpt__state_load(j, blob, n - 8, err, sizeof err), ERR_BADMSG);
  assert_non_null(strstr(err, "truncated"));
  job_free(j);
  free(blob);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_other_version),
      cmocka_unit_test(test_unversioned),
      cmocka_unit_test(test_truncated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
