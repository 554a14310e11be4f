/*
 * test_oracle_recover: the configuration fingerprint a restarted oracle
 * compares with its job's record (services/oracle/oracle_recover.c).
 *
 * Why: an oracle restarted with its job's own configuration recovers the
 * job; one with another configuration finds it blocked.  What the job is
 * (the data, the model, the seed, the tables) must change the fingerprint;
 * where the daemons are, how they prove who they are (certificates are
 * renewed, `chanter local up` writes its own paths), where they are
 * scraped and how they are supervised must not.  A scale changes
 * trainers, and with it the fingerprint: the job file must follow.
 *
 * And the record of scales (oracle_scale.c): each moment in order, the
 * pause counted from the old run's end, -1 until the first iteration on
 * the new count is done; a moment out of order changes nothing.  They are
 * saved in state_dir/scales and read back by the next oracle, which
 * carries an unfinished one on.  The job record keeps a scale of the
 * embedding servers under way (a restarted oracle takes it over): written
 * and read back whole, with the fingerprint of the configuration after it
 * equal to that configuration's own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "metrics.h"
#include "oracle_recover.h"
#include "testutil.h"

static void hash_of(const char *const *sets, char out[65]) {
  cfg_t *c = testutil_cfg_of(sets);
  oracle_record_config_hash(c, out);
  cfg_destroy(c);
}

static void test_fingerprint(void **state) {
  (void)state;
  char base[65], h[65];
  const char *job[] = {"seed=7", "iterations=100", NULL};
  hash_of(job, base);
  assert_int_equal(strlen(base), 64);
  /* not the job: addresses, certificates, metrics, the supervisor */
  const char *same[] = {"seed=7", "iterations=100", "cluster.oracle=127.0.0.1:7000",
                        "cluster.embedding=127.0.0.1:7100,127.0.0.1:7101", "tls.ca_file=/etc/chanter/tls/ca.pem",
                        "tls.cert_file=/etc/chanter/tls/{role}.pem", "tls.key_file=/etc/chanter/tls/{role}.key",
                        "metrics.listen=0.0.0.0", "local.restart_ms=50", NULL};
  hash_of(same, h);
  assert_string_equal(h, base);
  /* the job */
  const char *seed[] = {"seed=8", "iterations=100", NULL};
  hash_of(seed, h);
  assert_string_not_equal(h, base);
  const char *iters[] = {"seed=7", "iterations=101", NULL};
  hash_of(iters, h);
  assert_string_not_equal(h, base);
  const char *lr[] = {"seed=7", "iterations=100", "learning_rate=0.5", NULL};
  hash_of(lr, h);
  assert_string_not_equal(h, base);
}

static void test_fingerprint_trainers(void **state) {
  (void)state;
  char a[65], b[65];
  const char *two[] = {"trainers=2", NULL}, *three[] = {"trainers=3", NULL};
  hash_of(two, a);
  hash_of(three, b);
  assert_string_not_equal(a, b);
}

static void test_scales(void **state) {
  (void)state;
  oracle_recoveries_t *rs = calloc(1, sizeof *rs); /* no metrics: their updates take NULL */
  assert_non_null(rs);
  char out[2048];
  oracle_scales_json(rs, out, sizeof out);
  assert_string_equal(out, "[]");
  oracle_scales_line(rs, out, sizeof out);
  assert_string_equal(out, "");
  oracle_scales_first(rs, 10); /* nothing under way: nothing changes */
  assert_int_equal(rs->n_scales, 0);
  oracle_scale_t *s = oracle_scales_begin(rs, "", 2, 3, 41, "job-000000000042");
  oracle_scales_trained(rs, 7, 42); /* out of order (the run has not ended): ignored */
  oracle_scales_first(rs, 43);
  assert_true(s->t_trained == 0 && s->t_first == 0);
  oracle_scales_json(rs, out, sizeof out);
  assert_non_null(strstr(out, "\"at_iteration\": 41, \"from\": 2, \"to\": 3"));
  assert_non_null(strstr(out, "\"pause_seconds\": -1.000"));
  oracle_scales_line(rs, out, sizeof out);
  assert_non_null(strstr(out, "scaling from 2 to 3 trainers after iteration 41"));
  oracle_scales_ended(rs);
  oracle_scales_trained(rs, 7, 42);
  oracle_scales_first(rs, 43);
  assert_true(s->t_ended >= s->t_asked && s->t_trained >= s->t_ended && s->t_first >= s->t_trained);
  assert_int_equal(s->generation, 7);
  oracle_scales_line(rs, out, sizeof out);
  assert_non_null(strstr(out, "scaled from 2 to 3 trainers after iteration 41:"));
  oracle_scales_begin(rs, "", 3, 2, 90, "job-000000000091");
  oracle_scales_json(rs, out, sizeof out);
  assert_non_null(strstr(out, "}, {\"at_iteration\": 90, \"from\": 3, \"to\": 2"));
  const char *second = strstr(out, "\"at_iteration\": 90"), *first_pause = strstr(out, "\"pause_seconds\": ");
  assert_true(first_pause && first_pause < second && strncmp(first_pause, "\"pause_seconds\": -1", 19) != 0);
  assert_non_null(strstr(second, "\"pause_seconds\": -1.000")); /* the second is under way */
  free(rs);
}

static void test_fingerprint_as(void **state) {
  (void)state;
  char a[65], b[65];
  const char *three[] = {"seed=7", "embedding_servers=3", NULL}, *two[] = {"seed=7", "embedding_servers=2", NULL};
  hash_of(three, a);
  cfg_t *c = testutil_cfg_of(two);
  oracle_record_config_hash_as(c, "embedding_servers", 3, b);
  assert_string_equal(a, b);
  oracle_record_config_hash_as(c, "trainers", 2, b); /* (the default: the same configuration) */
  hash_of(two, a);
  assert_string_equal(a, b);
  cfg_destroy(c);
}

static void test_record_scale(void **state) {
  (void)state;
  char dir[] = "/tmp/test_oracle_recover.XXXXXX", err[512], id[96], st[32], conf[80];
  assert_non_null(mkdtemp(dir));
  oracle_record_scale_t w = {.from = 2, .to = 3, .at = 128, .asked = 1.5, .addrs = "a:1,b:2,c:3"}, r;
  snprintf(w.config, sizeof w.config, "%064d", 7);
  assert_int_equal(oracle_record_write(dir, "job-1", "training", "f00d", &w, err, sizeof err), 0);
  assert_int_equal(oracle_record_read(dir, id, sizeof id, st, sizeof st, conf, sizeof conf, &r, err, sizeof err), 0);
  assert_string_equal(id, "job-1");
  assert_string_equal(st, "training");
  assert_string_equal(conf, "f00d");
  assert_true(r.from == 2 && r.to == 3 && r.at == 128 && r.asked == 1.5);
  assert_string_equal(r.addrs, "a:1,b:2,c:3");
  assert_string_equal(r.config, w.config);
  oracle_record_scale_free(&r);
  /* the job trains on the new servers: the record without it */
  assert_int_equal(oracle_record_write(dir, "job-1", "training", "beef", NULL, err, sizeof err), 0);
  assert_int_equal(oracle_record_read(dir, id, sizeof id, st, sizeof st, conf, sizeof conf, &r, err, sizeof err), 0);
  assert_int_equal(r.to, 0);
  assert_null(r.addrs);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_scales_saved(void **state) {
  (void)state;
  char dir[] = "/tmp/test_oracle_recover.XXXXXX", kv[128], out[2048];
  assert_non_null(mkdtemp(dir));
  oracle_recoveries_t *rs = calloc(1, sizeof *rs), *back = calloc(1, sizeof *back);
  assert_true(rs && back);
  snprintf(rs->state_dir, sizeof rs->state_dir, "%s", dir);
  oracle_scales_begin(rs, "", 2, 3, 41, "job-000000000042");
  oracle_scales_ended(rs);
  oracle_scales_trained(rs, 7, 42);
  oracle_scales_first(rs, 43);
  oracle_scales_begin(rs, "embedding_servers", 2, 1, 90, "job-000000000091"); /* under way when its oracle stopped */
  snprintf(kv, sizeof kv, "oracle.state_dir=%s", dir);
  const char *sets[] = {kv, NULL};
  cfg_t *c = testutil_cfg_of(sets);
  metrics_registry_t *reg = NULL;
  assert_int_equal(metrics_registry_create("chanter_oracle", &reg), 0);
  char err[256];
  assert_int_equal(oracle_recoveries_init(back, c, reg, err, sizeof err), 0);
  assert_int_equal(back->n_scales, 2);
  assert_true(back->s[0].from == 2 && back->s[0].to == 3 && back->s[0].at_iteration == 41 &&
              back->s[0].generation == 7);
  assert_true(back->s[0].t_first > 0 && back->s[0].t_first - rs->s[0].t_first < 0.001 &&
              rs->s[0].t_first - back->s[0].t_first < 0.001); /* (saved to the millisecond) */
  assert_string_equal(back->s[0].checkpoint, "job-000000000042");
  assert_string_equal(back->s[0].what, "");
  assert_string_equal(back->s[1].what, "embedding_servers");
  assert_true(back->s[1].t_first == 0 && back->s[1].t_ended == 0);
  oracle_scales_restarted(back, NULL); /* the next oracle goes on with the open one */
  assert_true(back->s[1].t_ended > 0);
  oracle_scales_trained(back, 9, 80);
  oracle_scales_first(back, 81);
  oracle_scales_line(back, out, sizeof out);
  assert_non_null(strstr(out, "scaled from 2 to 1 embedding servers after iteration 79:"));
  cfg_destroy(c);
  metrics_registry_destroy(reg);
  free(rs);
  free(back);
  snprintf(kv, sizeof kv, "rm -rf %s", dir);
  assert_int_equal(system(kv), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fingerprint),
      cmocka_unit_test(test_fingerprint_trainers),
      cmocka_unit_test(test_scales),
      cmocka_unit_test(test_fingerprint_as),
      cmocka_unit_test(test_record_scale),
      cmocka_unit_test(test_scales_saved),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
