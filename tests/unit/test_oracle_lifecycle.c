/*
 * test_oracle_lifecycle: the oracle job's lifecycle (the table at the top
 * of services/oracle/oracle_job.c) walked on real job objects.
 *
 * Each test creates a job object (oracle_job_create, on its own libuv
 * loop) and drives it through its events: trainers attaching (the test
 * sets the attached count: no Work streams here), the start's calls to
 * the embedding servers (answered by a fake on the worker pool,
 * oracle_ckpt__work_fake: empty servers, another job's state, a resume, a
 * roll-back, a refusal), chanter train --resume / --fresh
 * (oracle_job_start_request), the loss of each daemon the oracle recovers
 * from (a trainer whose stream broke, a silent trainer, an embedding
 * server without durable writes, the oracle itself restarted: DESIGN.md
 * 5), Stop, an error, and the end of training; after each loss the
 * job's successor (oracle_job_successor: the next generation, created
 * recovering) rolls back, trains and is stopped.  The job's on_state hook
 * records every state it enters, and each test asserts the exact
 * sequence; the job record in oracle.state_dir must follow (training,
 * then the end), a retired object must be reported as recovering, and the
 * states' reported names must stay what the wire says.  The last test
 * checks that the walks together took every transition of the table, and
 * that the table refuses what it does not list.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "oracle_job_internal.h"
#include "testutil.h"

#define NP 2
#define RESUME_AT 3 /* the checkpoint the fake resume restores: the model after iteration 3 */

/* ---- what the fake embedding servers answer (read on the worker pool
 * while the test thread waits in uv_run) */

static struct {
  int check_rc, empty; /* the check: an error, or whether the servers hold nothing */
  int resume_rc;       /* --resume: an error (refused), or the checkpoint RESUME_AT */
  int recover_rc;      /* a recovery's roll-back: an error, or back to the job's start */
  uint8_t *blob;       /* the oracle's state after RESUME_AT */
  size_t blob_len;
} g_fake;

static void fake_work(ck_work_t *w) {
  switch (w->kind) {
  case W_PREFLIGHT:
    w->rc = g_fake.check_rc;
    w->empty = g_fake.empty;
    if (w->rc) snprintf(w->err, sizeof w->err, "embedding server 0: unreachable (fake)");
    else if (!w->empty) snprintf(w->found, sizeof w->found, "the embedding servers hold another job's state (fake)");
    break;
  case W_FRESH:
    w->write_epoch = 7;
    break;
  case W_RESUME:
    w->rc = g_fake.resume_rc;
    if (w->rc) {
      snprintf(w->err, sizeof w->err, "there is no checkpoint %s (fake)", w->want);
      break;
    }
    w->write_epoch = 8;
    w->ostate = malloc(g_fake.blob_len);
    assert_non_null(w->ostate);
    memcpy(w->ostate, g_fake.blob, g_fake.blob_len);
    w->ostate_len = g_fake.blob_len;
    w->m = w->job;
    snprintf(w->m.id, sizeof w->m.id, "lifecycle-%012d", RESUME_AT + 1);
    snprintf(w->m.dense_blob, sizeof w->m.dense_blob, "ckpt.%s.dense", w->m.id);
    w->m.iteration = RESUME_AT;
    break;
  case W_RECOVER:
    w->rc = g_fake.recover_rc;
    if (w->rc) snprintf(w->err, sizeof w->err, "the embedding servers hold job other's state (fake)");
    w->write_epoch = 9;
    break;
  default: /* a checkpoint's calls: none in these tests */
    w->rc = -EIO;
    break;
  }
}

/* The oracle's state blob after RESUME_AT, as a checkpoint holds it. */
static void make_blob(void) {
  oracle_job_t *s = calloc(1, sizeof *s);
  assert_non_null(s);
  s->P = NP;
  s->report.done = RESUME_AT + 1;
  oracle_cp_t cp = {.iteration = RESUME_AT};
  assert_int_equal(oracle_ckpt__state_encode(s, &cp, &g_fake.blob, &g_fake.blob_len), 0);
  free(s);
}

/* ---- one job object and what it went through */

typedef struct walk_s {
  uv_loop_t loop;
  cfg_t *cfg;
  metrics_registry_t *reg;
  oracle_recoveries_t recs;
  char dir[256];
  oracle_job_t *j;
  char states[512]; /* every state entered: "waiting>checking>..." */
  int recovered;    /* on_recover was called */
} walk_t;

/* Every (from, to) some walk took, for the last test. */
static int g_taken[ORACLE_N_STATES][ORACLE_N_STATES];

static void on_state(oracle_job_t *j, int from, int to, void *ud) {
  walk_t *w = ud;
  (void)j;
  size_t o = strlen(w->states);
  snprintf(w->states + o, sizeof w->states - o, "%s%s", o ? ">" : "", oracle_job__state_label(to));
  g_taken[from][to] = 1;
}

static void on_recover(oracle_job_t *j, void *ud) {
  walk_t *w = ud;
  assert_ptr_equal(j, w->j);
  w->recovered++;
}

/* A job of NP trainers and iterations (0: training ends as soon as it
 * begins); recover: created by a recovery (the oracle restarted). */
static int g_no_servers; /* the next walk's job has no embedding servers */

static void walk_start(walk_t *w, const char *iterations, int recover, const char *max_recoveries) {
  memset(w, 0, sizeof *w);
  assert_int_equal(uv_loop_init(&w->loop), 0);
  assert_int_equal(testutil_tmpdir(w->dir, sizeof w->dir, "lifecycle"), 0);
  char it[64], sd[320], mr[64];
  snprintf(it, sizeof it, "iterations=%s", iterations);
  snprintf(sd, sizeof sd, "oracle.state_dir=%s", w->dir);
  snprintf(mr, sizeof mr, "oracle.max_recoveries=%s", max_recoveries);
  const char *sets[] = {"trainers=2", "batch_size=8", it, "eval_batches=0", "allocation=contiguous",
                        "cache_rows=1000", g_no_servers ? "cluster.embedding=" : "cluster.embedding=127.0.0.1:9,127.0.0.1:19", "cluster.dataproc=127.0.0.1:9",
                        "rpc.timeout_ms=300", "oracle.start_timeout_ms=3600000", sd, mr, NULL};
  w->cfg = testutil_cfg_of(sets);
  assert_int_equal(metrics_registry_create("chanter_oracle", &w->reg), 0);
  char err[1024] = "";
  int rc = oracle_recoveries_init(&w->recs, w->cfg, w->reg, err, sizeof err);
  if (rc) fail_msg("oracle_recoveries_init: %s", err);
  oracle_recovery_t *rec = NULL;
  if (recover) {
    char limit[512];
    rec = oracle_recoveries_begin(&w->recs, "oracle", "oracle", -1, 0, "the oracle restarted (test)", limit,
                                  sizeof limit);
    assert_non_null(rec);
  }
  oracle_job_opts_t o = {.job_id = "lifecycle",
                         .recover = recover,
                         .generation = 3,
                         .recs = &w->recs,
                         .rec = rec,
                         .on_recover = on_recover,
                         .on_state = on_state,
                         .ud = w};
  rc = oracle_job_create(&w->loop, w->cfg, w->reg, &o, &w->j, err, sizeof err);
  if (rc) fail_msg("oracle_job_create: %s", err);
}

static void walk_end(walk_t *w) {
  oracle_job_destroy(w->j);
  uv_run(&w->loop, UV_RUN_NOWAIT);
  assert_int_equal(uv_loop_close(&w->loop), 0);
  metrics_registry_destroy(w->reg);
  cfg_destroy(w->cfg);
  testutil_rmtree(w->dir);
}

/* Runs the loop until the job is in state (its own number) or is retired
 * (state -1); fails after 5 s. */
static void run_until(walk_t *w, int state) {
  double t0 = clock_mono_s();
  while (state >= 0 ? w->j->state != state : !w->j->retired) {
    if (clock_mono_s() - t0 > 5) fail_msg("still %s (%s) after 5 s", oracle_job__state_label(w->j->state), w->states);
    uv_run(&w->loop, UV_RUN_NOWAIT);
    testutil__sleep_ms(1);
  }
}

/* Every trainer (or all but one) attached: the count the Work streams
 * keep (no stream here), then the event's call to advance. */
static void attach_all(walk_t *w, uint32_t n) {
  w->j->attached = n;
  oracle_job__advance(w->j);
}

/* The job record in oracle.state_dir says state. */
static void assert_record(walk_t *w, const char *state) {
  char path[400], *text = NULL, why[256], want[64];
  snprintf(path, sizeof path, "%s/job", w->dir);
  if (fsio_read_all(path, 0, &text, NULL, why, sizeof why)) fail_msg("no job record: %s", why);
  snprintf(want, sizeof want, "\nstate=%s\n", state);
  if (!strstr(text, want)) fail_msg("the job record does not say %s:\n%s", want + 1, text);
  free(text);
}

static void reset_fake(void) {
  g_fake.check_rc = g_fake.resume_rc = g_fake.recover_rc = 0;
  g_fake.empty = 1;
}

/* ---- the walks */

/* Empty servers: checked, stamped, trained, done. */
static void test_start_to_done(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  walk_start(&w, "0", 0, "5");
  assert_string_equal(w.states, "waiting");
  attach_all(&w, NP);
  assert_int_equal(oracle_job_state(w.j), ORACLE_WAITING); /* checking is reported as waiting */
  assert_string_equal(oracle_state_name(oracle_job_state(w.j)), "waiting");
  run_until(&w, ORACLE_DONE);
  assert_string_equal(w.states, "waiting>checking>starting>training>done");
  assert_int_equal(w.j->write_epoch, 7);
  assert_record(&w, "done");
  walk_end(&w);
}

/* Another job's state on the servers: blocked; --resume goes on from the
 * checkpoint (every stage restored at RESUME_AT + 1); the record says
 * training while it trains. */
static void test_blocked_then_resume(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  g_fake.empty = 0;
  walk_start(&w, "100", 0, "5");
  char msg[1024];
  assert_int_equal(oracle_job_start_request(w.j, "latest", 0, msg, sizeof msg), ORACLE_ERR_PRECONDITION);
  attach_all(&w, NP);
  run_until(&w, ORACLE_BLOCKED);
  assert_string_equal(oracle_state_name(oracle_job_state(w.j)), "blocked");
  assert_non_null(strstr(oracle_job_message(w.j), "another job's state"));
  /* a refused resume: blocked again, saying why */
  g_fake.resume_rc = ERR_NOTFOUND;
  assert_int_equal(oracle_job_start_request(w.j, "nope", 0, msg, sizeof msg), 0);
  assert_string_equal(msg, "restoring checkpoint nope");
  run_until(&w, ORACLE_BLOCKED);
  assert_non_null(strstr(oracle_job_message(w.j), "resume refused"));
  g_fake.resume_rc = 0;
  assert_int_equal(oracle_job_start_request(w.j, NULL, 0, msg, sizeof msg), 0);
  run_until(&w, ORACLE_TRAINING);
  assert_string_equal(w.states, "waiting>checking>blocked>starting>blocked>starting>training");
  assert_int_equal(w.j->ckpt.start, RESUME_AT + 1);
  assert_int_equal(w.j->report.done, RESUME_AT + 1);
  assert_int_equal(w.j->pipe.next, RESUME_AT + 1);
  assert_int_equal(w.j->fetch.start, RESUME_AT + 1);
  assert_int_equal(w.j->dispatch.rank[1].next_step, RESUME_AT + 1);
  assert_true(w.j->ckpt.resumed);
  assert_int_equal(w.j->write_epoch, 8);
  assert_record(&w, "training");
  oracle_job_stop(w.j, "test over");
  assert_string_equal(w.states, "waiting>checking>blocked>starting>blocked>starting>training>stopped");
  assert_record(&w, "stopped");
  walk_end(&w);
}

/* Blocked, then --fresh: cleared, trained, done; a trainer that left
 * while the servers were cleared sends the job back to waiting. */
static void test_blocked_then_fresh(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  g_fake.empty = 0;
  walk_start(&w, "0", 0, "5");
  attach_all(&w, NP);
  run_until(&w, ORACLE_BLOCKED);
  char msg[1024];
  assert_int_equal(oracle_job_start_request(w.j, NULL, 1, msg, sizeof msg), 0);
  assert_string_equal(msg, "clearing the embedding servers (--fresh)");
  w.j->attached = NP - 1; /* a trainer left meanwhile */
  run_until(&w, ORACLE_WAITING);
  g_fake.empty = 1; /* (back: the servers hold this job's stamp only, as the fake sees it) */
  attach_all(&w, NP);
  run_until(&w, ORACLE_DONE);
  assert_string_equal(w.states, "waiting>checking>blocked>starting>waiting>checking>starting>training>done");
  walk_end(&w);
}

/* A loss of kind while training: this object retires (reported as
 * recovering, StopWork would say so), on_recover is called, and its state
 * stays what it was: a retired object is not a state. */
static void lose_while_training(const char *kind) {
  walk_t w;
  reset_fake();
  walk_start(&w, "100", 0, "5");
  attach_all(&w, NP);
  run_until(&w, ORACLE_TRAINING);
  if (!strcmp(kind, "embedding"))
    oracle_job__lose(w.j, "embedding", "an embedding server", -1, "restarted without durable writes (test)");
  else
    oracle_job_lose_rank(w.j, 1, kind, "lost (test)");
  oracle_job__advance(w.j);
  assert_true(w.j->retired);
  assert_true(oracle_job_over(w.j));
  assert_int_equal(oracle_job_state(w.j), ORACLE_RECOVERING);
  assert_string_equal(oracle_state_name(oracle_job_state(w.j)), "recovering");
  run_until(&w, -1);
  for (int i = 0; i < 200 && !w.recovered; i++) { /* on_recover comes from the loop */
    uv_run(&w.loop, UV_RUN_NOWAIT);
    testutil__sleep_ms(1);
  }
  assert_int_equal(w.recovered, 1);
  assert_string_equal(w.states, "waiting>checking>starting>training");
  assert_non_null(w.j->rec);
  assert_string_equal(w.j->rec->kind, kind);
  assert_record(&w, "training"); /* the job goes on: a restarted oracle would recover it */
  /* the next run: the job's successor (what the service asks for in its
   * on_recover) is the next generation, created recovering; it rolls the
   * servers back, its trainers attach, it trains (no data processor here:
   * it is stopped there), while the old object frees itself in the loop */
  oracle_job_t *nj = NULL;
  char err[512];
  assert_int_equal(oracle_job_successor(w.j, &nj, err, sizeof err), 0);
  assert_int_equal(oracle_job_generation(nj), 4);
  assert_string_equal(oracle_job_id(nj), oracle_job_id(w.j));
  assert_ptr_equal(nj->rec, w.j->rec);
  w.j = nj;
  for (int i = 0; i < 2000 && !w.j->rolled_back; i++) {
    uv_run(&w.loop, UV_RUN_NOWAIT);
    testutil__sleep_ms(1);
  }
  assert_true(w.j->rolled_back);
  attach_all(&w, NP);
  run_until(&w, ORACLE_TRAINING);
  oracle_job_stop(w.j, "test over");
  assert_string_equal(w.states, "waiting>checking>starting>training>recovering>training>stopped");
  walk_end(&w);
}

static void test_lose_trainer(void **state) {
  (void)state;
  lose_while_training("trainer");
}

static void test_lose_hung_trainer(void **state) {
  (void)state;
  lose_while_training("hang");
}

static void test_lose_embedding_server(void **state) {
  (void)state;
  lose_while_training("embedding");
}

/* No recovery left (oracle.max_recoveries = 1, one already under way): a
 * loss fails the job. */
static void test_lose_without_recoveries_left(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  walk_start(&w, "100", 0, "1");
  attach_all(&w, NP);
  run_until(&w, ORACLE_TRAINING);
  char limit[512];
  assert_non_null(oracle_recoveries_begin(&w.recs, "trainer", "trainer-0", 0, 0, "an earlier loss (test)", limit,
                                          sizeof limit));
  oracle_job_lose_rank(w.j, 0, "trainer", "lost (test)");
  assert_false(w.j->retired);
  assert_string_equal(w.states, "waiting>checking>starting>training>failed");
  assert_record(&w, "failed");
  walk_end(&w);
}

/* The oracle restarted mid-job: the new object starts recovering, rolls
 * the servers back (here before the trainers attach), trains, done. */
static void test_oracle_restart_recovers(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  walk_start(&w, "0", 1, "5");
  assert_string_equal(w.states, "recovering"); /* (created recovering: no waiting before) */
  assert_string_equal(oracle_state_name(oracle_job_state(w.j)), "recovering");
  for (int i = 0; i < 2000 && !w.j->rolled_back; i++) {
    uv_run(&w.loop, UV_RUN_NOWAIT);
    testutil__sleep_ms(1);
  }
  assert_true(w.j->rolled_back);
  assert_int_equal(w.j->state, ORACLE_RECOVERING); /* the trainers of the new generation are not all there */
  attach_all(&w, NP);
  run_until(&w, ORACLE_DONE);
  assert_string_equal(w.states, "recovering>training>done");
  assert_int_equal(w.j->write_epoch, 9);
  walk_end(&w);
}

/* A recovery that finds another job's state on the servers is blocked
 * (an operator decides); --fresh starts the job over. */
static void test_recovering_then_blocked(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  g_fake.recover_rc = ORACLE_ERR_PRECONDITION;
  walk_start(&w, "0", 1, "5");
  attach_all(&w, NP);
  run_until(&w, ORACLE_BLOCKED);
  char msg[1024];
  assert_int_equal(oracle_job_start_request(w.j, NULL, 1, msg, sizeof msg), 0);
  run_until(&w, ORACLE_DONE);
  assert_string_equal(w.states, "recovering>blocked>starting>training>done");
  walk_end(&w);
}

/* No embedding servers: nothing to check, training begins once every
 * trainer attached. */
static void test_no_servers(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  g_no_servers = 1;
  walk_start(&w, "0", 0, "5");
  g_no_servers = 0;
  attach_all(&w, NP);
  assert_string_equal(w.states, "waiting>training>done");
  char msg[512];
  assert_int_equal(oracle_job_start_request(w.j, NULL, 1, msg, sizeof msg), ORACLE_ERR_PRECONDITION);
  walk_end(&w);
}

/* Stop while waiting; an error (the check of the servers failed) while
 * checking. */
static void test_stop_and_fail(void **state) {
  (void)state;
  walk_t w;
  reset_fake();
  walk_start(&w, "0", 0, "5");
  oracle_job_stop(w.j, "stopped by the test");
  assert_string_equal(w.states, "waiting>stopped");
  assert_string_equal(oracle_job_message(w.j), "stopped by the test");
  assert_record(&w, "stopped");
  oracle_job_stop(w.j, "again"); /* over: nothing moves */
  assert_string_equal(w.states, "waiting>stopped");
  walk_end(&w);

  g_fake.check_rc = ERR_UNAVAILABLE;
  walk_start(&w, "0", 0, "5");
  attach_all(&w, NP);
  run_until(&w, ORACLE_FAILED);
  assert_string_equal(w.states, "waiting>checking>failed");
  assert_non_null(strstr(oracle_job_message(w.j), "checking the embedding servers before the job starts"));
  walk_end(&w);
}

/* The walks above took every transition of the table (the ends through
 * fail and stop from the states they name), and the table refuses the
 * rest. */
static void test_every_transition_taken(void **state) {
  (void)state;
  static const int live[] = {ORACLE_WAITING,  ORACLE_CHECKING,   ORACLE_BLOCKED, ORACLE_STARTING,
                             ORACLE_TRAINING, ORACLE_RECOVERING};
  int n = 0;
  for (int from = 0; from < ORACLE_N_STATES; from++)
    for (int ev = 0; ev < ORACLE_N_EVENTS; ev++) {
      int to = oracle_job__next_state(from, ev);
      if (to < 0 || ev == ORACLE_EV_FAIL || ev == ORACLE_EV_STOP || ev == ORACLE_EV_CREATE) continue;
      n++;
      if (!g_taken[from][to])
        fail_msg("no walk took %s --%s--> %s", oracle_job__state_label(from), oracle_job__event_name(ev),
                 oracle_job__state_label(to));
    }
  assert_int_equal(n, 12);
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
    assert_int_equal(oracle_job__next_state(live[i], ORACLE_EV_FAIL), ORACLE_FAILED);
    assert_int_equal(oracle_job__next_state(live[i], ORACLE_EV_STOP), ORACLE_STOPPED);
  }
  /* the ends are ends; training is reached only with the servers ready */
  for (int ev = 0; ev < ORACLE_N_EVENTS; ev++) {
    assert_int_equal(oracle_job__next_state(ORACLE_DONE, ev), -1);
    assert_int_equal(oracle_job__next_state(ORACLE_FAILED, ev), -1);
    assert_int_equal(oracle_job__next_state(ORACLE_STOPPED, ev), -1);
  }
  assert_int_equal(oracle_job__next_state(ORACLE_BLOCKED, ORACLE_EV_READY), -1);
  assert_int_equal(oracle_job__next_state(ORACLE_CHECKING, ORACLE_EV_READY), -1);
  assert_int_equal(oracle_job__next_state(ORACLE_WAITING, ORACLE_EV_FINISHED), -1);
  assert_int_equal(oracle_job__next_state(ORACLE_TRAINING, ORACLE_EV_START), -1);
  /* the names on the wire and in the job_state metric */
  assert_string_equal(oracle_state_name(ORACLE_CHECKING), "waiting");
  assert_string_equal(oracle_state_name(ORACLE_STARTING), "waiting");
  assert_string_equal(oracle_state_name(ORACLE_RECOVERING), "recovering");
  assert_string_equal(oracle_state_name(ORACLE_BLOCKED), "blocked");
  assert_int_equal(ORACLE_BLOCKED, 5);
  assert_int_equal(ORACLE_RECOVERING, 6);
}

static int setup(void **state) {
  (void)state;
  oracle_ckpt__work_fake = fake_work;
  make_blob();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  oracle_ckpt__work_fake = NULL;
  free(g_fake.blob);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_start_to_done),
      cmocka_unit_test(test_blocked_then_resume),
      cmocka_unit_test(test_blocked_then_fresh),
      cmocka_unit_test(test_lose_trainer),
      cmocka_unit_test(test_lose_hung_trainer),
      cmocka_unit_test(test_lose_embedding_server),
      cmocka_unit_test(test_lose_without_recoveries_left),
      cmocka_unit_test(test_oracle_restart_recovers),
      cmocka_unit_test(test_recovering_then_blocked),
      cmocka_unit_test(test_no_servers),
      cmocka_unit_test(test_stop_and_fail),
      cmocka_unit_test(test_every_transition_taken),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
