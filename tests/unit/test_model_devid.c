/*
 * test_model_devid: cuda_check_device_id, the GPU identity that the
 * trainers compare to choose the dense all-reduce's backend (NCCL needs a
 * GPU per trainer: trainer_join.c, coll_nccl_eligible).  Without a usable
 * device -- a CUDA=0 build, no GPU, or every GPU hidden with
 * CUDA_VISIBLE_DEVICES="" -- it refuses with a sentence and an empty id;
 * with one, the id is nvidia-smi's "GPU-<uuid>" and the same on every call.
 * The hidden-device case runs in a child (the variable must be set before
 * the CUDA runtime initializes), so it is checked on GPU machines too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_check.h"
#include "err.h"

static int well_formed(const char *id) {
  if (strncmp(id, "GPU-", 4) != 0 || strlen(id) != 4 + 36) return 0;
  for (int i = 4; id[i]; i++) {
    int dash = i == 12 || i == 17 || i == 22 || i == 27;
    if (dash ? id[i] != '-' : !strchr("0123456789abcdef", id[i])) return 0;
  }
  return 1;
}

/* A child with every device hidden: refused, nothing in id.  Exit code 0
 * when it behaved. */
static void test_hidden_device_refused(void **state) {
  (void)state;
  fflush(NULL);
  pid_t p = fork();
  assert_true(p >= 0);
  if (p == 0) {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char id[64] = "x", pci[32] = "x", err[512] = "";
    int rc = cuda_check_device_id(id, sizeof id, pci, sizeof pci, err, sizeof err);
    printf("  hidden: rc=%d err=%s\n", rc, err);
    fflush(stdout);
    _exit(rc == ERR_NOGPU && id[0] == 0 && pci[0] == 0 && strstr(err, "device = cpu") ? 0 : 1);
  }
  int st = 0;
  assert_int_equal(waitpid(p, &st, 0), p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* This process: an id if there is a device, else the refusal. */
static void test_device_id(void **state) {
  (void)state;
  char id[64] = "x", id2[64] = "", pci[32] = "x", err[512] = "";
  int rc = cuda_check_device_id(id, sizeof id, pci, sizeof pci, err, sizeof err);
  if (!cuda_check_built()) {
    assert_int_equal(rc, ERR_NOGPU);
    assert_non_null(strstr(err, "built without CUDA"));
    assert_string_equal(id, "");
    return;
  }
  if (rc) {
    printf("  no usable GPU here: %s\n", err);
    assert_int_equal(rc, ERR_NOGPU);
    assert_string_equal(id, "");
    assert_string_equal(pci, "");
    assert_non_null(strstr(err, "device = cpu"));
    return;
  }
  printf("  this process computes on %s (PCI %s)\n", id, pci);
  assert_true(well_formed(id));
  assert_int_equal(cuda_check_device_id(id2, sizeof id2, NULL, 0, err, sizeof err), 0);
  assert_string_equal(id, id2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hidden_device_refused),
      cmocka_unit_test(test_device_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
