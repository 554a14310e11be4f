/* Tests for authz: the table of roles per method and its sentences. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "authz.h"

#define EMB "/chanter.embedding.v1.Embedding/"
#define ORC "/chanter.oracle.v1.Oracle/"
#define DP "/chanter.dataproc.v1.DataProc/"

static void test_roles_of_uri(void **state) {
  (void)state;
  assert_int_equal(authz_role_of_uri("chanter://role/trainer"), AUTHZ_TRAINER);
  assert_int_equal(authz_role_of_uri("chanter://role/admin"), AUTHZ_ADMIN);
  assert_int_equal(authz_role_of_uri("chanter://role/root"), 0);
  assert_int_equal(authz_role_of_uri("chanter://role/trainerx"), 0);
  assert_int_equal(authz_role_of_uri("https://role/trainer"), 0);
  assert_int_equal(authz_role_of_uri(NULL), 0);
  assert_string_equal(authz_role_name(AUTHZ_DATAPROC), "dataproc");
  assert_string_equal(authz_role_name(0), "none");
}

/* What the issue asks, method by method. */
static void test_table(void **state) {
  (void)state;
  char why[256];
  assert_int_equal(authz_check(EMB "WriteBack", AUTHZ_TRAINER, why, sizeof why), 0);
  assert_int_equal(authz_check(EMB "WriteBack", AUTHZ_ADMIN, why, sizeof why), 0); /* resharding, embedding write */
  /* embedding servers: a Reshape's rows sent to their new owners */
  assert_int_equal(authz_check(EMB "WriteBack", AUTHZ_EMBEDDING, why, sizeof why), 0);
  assert_int_equal(authz_check(EMB "WriteBack", AUTHZ_ORACLE, why, sizeof why), -EACCES);
  assert_int_equal(authz_check(EMB "WriteBack", AUTHZ_DATAPROC, why, sizeof why), -EACCES);
  const char *state_methods[] = {"Checkpoint", "Restore", "Clear", "Fence", "SealCheckpoint", "DeleteCheckpoint",
                                 "Reshape"};
  for (size_t i = 0; i < sizeof state_methods / sizeof state_methods[0]; i++) {
    char m[96];
    snprintf(m, sizeof m, EMB "%s", state_methods[i]);
    assert_int_equal(authz_check(m, AUTHZ_ORACLE, why, sizeof why), 0);
    assert_int_equal(authz_check(m, AUTHZ_ADMIN, why, sizeof why), 0);
    assert_int_equal(authz_check(m, AUTHZ_TRAINER, why, sizeof why), -EACCES);
    assert_int_equal(authz_check(m, AUTHZ_DATAPROC, why, sizeof why), -EACCES);
  }
  assert_int_equal(authz_check(EMB "Lookup", AUTHZ_TRAINER, why, sizeof why), 0);
  assert_int_equal(authz_check(EMB "Lookup", AUTHZ_ORACLE, why, sizeof why), 0);
  assert_int_equal(authz_check(EMB "Lookup", AUTHZ_DATAPROC, why, sizeof why), -EACCES);
  assert_int_equal(authz_check(ORC "Stop", AUTHZ_ADMIN, why, sizeof why), 0);
  assert_int_equal(authz_check(ORC "Stop", AUTHZ_TRAINER, why, sizeof why), -EACCES);
  assert_int_equal(authz_check(ORC "Work", AUTHZ_TRAINER, why, sizeof why), 0);
  assert_int_equal(authz_check(ORC "Status", AUTHZ_DATAPROC, why, sizeof why), 0);
  for (unsigned r = AUTHZ_TRAINER; r <= AUTHZ_ADMIN; r <<= 1)
    assert_int_equal(authz_check(DP "GetBatch", r, why, sizeof why), 0);
  /* no role at all, and a method nobody named */
  assert_int_equal(authz_check(DP "GetBatch", 0, why, sizeof why), -EACCES);
  assert_int_equal(authz_check(EMB "Nonexistent", AUTHZ_ADMIN, why, sizeof why), -EACCES);
  assert_int_equal(authz_check("garbage", AUTHZ_ADMIN, why, sizeof why), -EACCES);
}

static void test_sentences(void **state) {
  (void)state;
  char why[256];
  authz_check("/chanter.oracle.v1.Oracle/Join", AUTHZ_DATAPROC, why, sizeof why);
  assert_string_equal(why, "Join needs the role trainer; the caller's certificate says dataproc");
  authz_check(EMB "WriteBack", AUTHZ_DATAPROC, why, sizeof why);
  assert_string_equal(why, "WriteBack needs the role trainer, embedding or admin; the caller's certificate says dataproc");
  authz_check(EMB "Stats", 0, why, sizeof why);
  assert_non_null(strstr(why, "Stats needs a certificate naming a role; the caller's certificate names no"));
  authz_check(EMB "Restore", AUTHZ_TRAINER, why, sizeof why);
  assert_string_equal(why, "Restore needs the role oracle or admin; the caller's certificate says trainer");
  authz_check(EMB "Lookup", 0, why, sizeof why);
  assert_non_null(strstr(why, "Lookup needs the role trainer, oracle or admin; the caller's certificate names no"));
  authz_check(EMB "Nope", AUTHZ_ADMIN, why, sizeof why);
  assert_non_null(strstr(why, "open to no role"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roles_of_uri),
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_sentences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
