/*
 * test_oracle_recover: the configuration fingerprint a restarted oracle
 * compares with its job's record (services/oracle/oracle_recover.c).
 *
 * Why: an oracle restarted with its job's own configuration recovers the
 * job; one with another configuration finds it blocked.  What the job is
 * (the data, the model, the seed, the tables) must change the fingerprint;
 * where the daemons are, how they prove who they are (certificates are
 * renewed, `chanter local up` writes its own paths), where they are
 * scraped and how they are supervised must not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cfg.h"
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fingerprint),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
