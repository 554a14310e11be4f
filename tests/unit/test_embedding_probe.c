/*
 * Unit tests of the embedding server's incarnation and of embc_incarnation,
 * the probe an oracle runs once a second to notice a restarted server:
 * against a real chanter-embedding child on loopback, the incarnation is
 * the same in Stats (brief or not) and in Fence's answer, changes after a
 * kill -9 and a restart on the same port and data dir, and the probe
 * answers fast -- ERR_UNAVAILABLE while the server is down, ERR_DEADLINE
 * within its short deadline when the server is stopped (SIGSTOP), never
 * after rpc.timeout_ms.  The restarted server still holds the fence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "embc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "log.h"
#include "rpc.h"
#include "testutil.h"


static char g_bin[1024], g_dir[64], g_job[256];

static pid_t start_server(int port, int *bound) {
  char ready[256], log[256], listen[64];
  snprintf(ready, sizeof ready, "%s/emb.ready", g_dir);
  snprintf(log, sizeof log, "%s/emb.log", g_dir);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  unlink(ready);
  char *args[] = {"--config", g_job, "--shard", "0", "--listen", listen, "--ready-file", ready, NULL};
  pid_t pid = testutil_spawn(g_bin, "chanter-embedding", args, log);
  assert_true(pid > 0);
  *bound = testutil_wait_ready(ready, pid);
  if (*bound <= 0) fprintf(stderr, "chanter-embedding did not become ready; log %s\n", log);
  assert_true(*bound > 0);
  return pid;
}

static embc_t *client(int port) {
  char cluster[64];
  snprintf(cluster, sizeof cluster, "cluster.embedding=127.0.0.1:%d", port);
  cfg_t *cfg = testutil_cfg("seed=3", "table_rows=1000", "embedding_dim=4", "embedding_servers=1",
                            "rpc.timeout_ms=20000", cluster, NULL);
  embc_t *c = NULL;
  char err[512];
  assert_int_equal(embc_create(cfg, &c, err, sizeof err), 0);
  cfg_destroy(cfg);
  return c;
}

static Chanter__Embedding__V1__StatsResponse *stats(embc_t *c, int brief) {
  Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
  req.brief = brief != 0;
  Chanter__Embedding__V1__StatsResponse *resp = NULL;
  char err[512];
  assert_int_equal(embc_stats(c, 0, &req, &resp, err, sizeof err), 0);
  return resp;
}

static void test_incarnation(void **state) {
  (void)state;
  int port = 0;
  pid_t pid = start_server(0, &port);
  embc_t *c = client(port);
  char err[512];
  uint64_t inc1 = 0, inc2 = 0, again = 0;
  assert_int_equal(embc_incarnation(c, 0, &inc1, err, sizeof err), 0);
  assert_true(inc1 != 0);
  assert_int_equal(embc_incarnation(c, 0, &again, err, sizeof err), 0);
  assert_int_equal(again, inc1);
  assert_int_equal(embc_incarnation(c, 1, &again, err, sizeof err), -EINVAL);

  /* Fence answers the incarnation; Stats shows the fence, brief or not */
  Chanter__Embedding__V1__FenceRequest fr = CHANTER__EMBEDDING__V1__FENCE_REQUEST__INIT;
  fr.id = "cp-probe";
  fr.iteration = 41;
  Chanter__Embedding__V1__FenceResponse *resp = NULL;
  assert_int_equal(embc_fence(c, 0, &fr, &resp, err, sizeof err), 0);
  assert_int_equal(resp->incarnation, inc1);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  for (int brief = 0; brief < 2; brief++) {
    Chanter__Embedding__V1__StatsResponse *s = stats(c, brief);
    assert_int_equal(s->incarnation, inc1);
    assert_string_equal(s->fence_id, "cp-probe");
    assert_int_equal(s->fence_iteration, 41);
    assert_int_equal(s->fence_held, 0);
    assert_int_equal(s->shards, 1);
    protobuf_c_message_free_unpacked(&s->base, NULL);
  }

  /* down: the probe fails at once, it does not wait out rpc.timeout_ms */
  assert_int_equal(testutil_stop(pid, SIGKILL, 5), 128 + SIGKILL);
  double t0 = clock_mono_s();
  assert_int_equal(embc_incarnation(c, 0, &again, err, sizeof err), ERR_UNAVAILABLE);
  assert_true(clock_mono_s() - t0 < 1.5);
  assert_non_null(strstr(err, "embedding server 0"));

  /* restarted on the same port and data dir: a new incarnation, the same fence */
  int port2 = 0;
  pid = start_server(port, &port2);
  assert_int_equal(port2, port);
  assert_int_equal(embc_incarnation(c, 0, &inc2, err, sizeof err), 0);
  assert_true(inc2 != 0 && inc2 != inc1);
  Chanter__Embedding__V1__StatsResponse *s = stats(c, 1);
  assert_int_equal(s->incarnation, inc2);
  assert_string_equal(s->fence_id, "cp-probe");
  assert_int_equal(s->fence_iteration, 41);
  protobuf_c_message_free_unpacked(&s->base, NULL);

  /* hung (SIGSTOP): ERR_DEADLINE within the probe's short deadline */
  assert_int_equal(kill(pid, SIGSTOP), 0);
  t0 = clock_mono_s();
  int rc = embc_incarnation(c, 0, &again, err, sizeof err);
  double took = clock_mono_s() - t0;
  kill(pid, SIGCONT);
  assert_int_equal(rc, ERR_DEADLINE);
  assert_true(took < EMBC_PROBE_TIMEOUT_MS / 1000.0 + 0.5);
  assert_int_equal(embc_incarnation(c, 0, &again, err, sizeof err), 0);
  assert_int_equal(again, inc2);

  embc_destroy(c);
  assert_int_equal(testutil_stop(pid, SIGTERM, 10), 0);
}

static int setup(void **state) {
  (void)state;
  if (testutil_bin_dir(g_bin, sizeof g_bin)) return -1;
  if (testutil_tmpdir(g_dir, sizeof g_dir, "emb-probe")) return -1;
  snprintf(g_job, sizeof g_job, "%s/job.ini", g_dir);
  FILE *f = fopen(g_job, "w");
  if (!f) return -1;
  fprintf(f, "seed = 3\ntable_rows = 1000\nembedding_dim = 4\nembedding_servers = 1\n"
             "[embedding]\ndata_dir = %s/data-%%i\nhot_mb = 4\nblock_cache_mb = 8\nmetrics_port_offset = 0\n"
             "drain_ms = 1000\n", g_dir);
  fclose(f);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  testutil_rmtree(g_dir);
  return 0;
}

int main(void) {
  log_level = LOG_WARN;
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_incarnation),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
