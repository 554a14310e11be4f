/*
 * test_sdn: the systemd notifications, received the way systemd receives
 * them: a unix datagram socket named by NOTIFY_SOCKET, one datagram per
 * call.  The watchdog part sets WATCHDOG_USEC / WATCHDOG_PID as systemd
 * does and runs the timer on a real libuv loop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "sdn.h"

struct fixture {
  char dir[64];
  char path[96];
  int fd;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  snprintf(f->dir, sizeof f->dir, "/tmp/chanter-sdn-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  snprintf(f->path, sizeof f->path, "%s/notify", f->dir);
  f->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (f->fd < 0) return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", f->path);
  if (bind(f->fd, (struct sockaddr *)&a, sizeof a) < 0) return -1;
  struct timeval tv = {.tv_sec = 2};
  setsockopt(f->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setenv("NOTIFY_SOCKET", f->path, 1);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  close(f->fd);
  unlink(f->path);
  rmdir(f->dir);
  free(f);
  return 0;
}

/* Receives one datagram (blocking up to 2 s) and compares it exactly. */
static void expect_dgram(struct fixture *f, const char *want) {
  char buf[4096];
  ssize_t n = recv(f->fd, buf, sizeof buf - 1, 0);
  if (n < 0) fail_msg("no datagram for '%s': %s", want, strerror(errno));
  buf[n] = '\0';
  assert_string_equal(buf, want);
}

/* Nothing more is waiting. */
static void expect_none(struct fixture *f) {
  char buf[64];
  assert_int_equal(recv(f->fd, buf, sizeof buf, MSG_DONTWAIT), -1);
  assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
}

static void test_notify(void **state) {
  struct fixture *f = *state;
  assert_int_equal(sdn_ready(), 0);
  expect_dgram(f, "READY=1");
  assert_int_equal(sdn_status("serving shard=%d", 3), 0);
  expect_dgram(f, "STATUS=serving shard=3");
  assert_int_equal(sdn_status("two\nlines"), 0);
  expect_dgram(f, "STATUS=two lines");
  assert_int_equal(sdn_watchdog(), 0);
  expect_dgram(f, "WATCHDOG=1");
  assert_int_equal(sdn_stopping(), 0);
  expect_dgram(f, "STOPPING=1");
  expect_none(f);
}

static void test_no_socket(void **state) {
  struct fixture *f = *state;
  unsetenv("NOTIFY_SOCKET");
  assert_int_equal(sdn_ready(), 0);
  assert_int_equal(sdn_status("x=%d", 1), 0);
  assert_int_equal(sdn_watchdog(), 0);
  assert_int_equal(sdn_stopping(), 0);
  expect_none(f);
}

static void test_socket_gone(void **state) {
  (void)state;
  setenv("NOTIFY_SOCKET", "/nonexistent-chanter-dir/notify", 1);
  assert_true(sdn_ready() < 0);
}

static void test_watchdog_interval(void **state) {
  (void)state;
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  assert_int_equal(sdn_watchdog_interval_us(), 0); /* unset */
  setenv("WATCHDOG_USEC", "2000000", 1);
  setenv("WATCHDOG_PID", pid, 1);
  assert_int_equal(sdn_watchdog_interval_us(), 1000000);
  unsetenv("WATCHDOG_PID"); /* no PID: applies to us */
  assert_int_equal(sdn_watchdog_interval_us(), 1000000);
  snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
  setenv("WATCHDOG_PID", pid, 1); /* another process's watchdog */
  assert_int_equal(sdn_watchdog_interval_us(), 0);
}

static void stop_cb(uv_timer_t *t) {
  sdn_watchdog_stop();
  uv_close((uv_handle_t *)t, NULL);
}

static void test_watchdog_timer(void **state) {
  struct fixture *f = *state;
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);

  /* disabled: no timer, nothing sent */
  assert_int_equal(sdn_watchdog_start(&loop), 0);
  assert_int_equal(uv_loop_alive(&loop), 0);
  sdn_watchdog_stop();
  expect_none(f);

  setenv("WATCHDOG_USEC", "200000", 1);
  setenv("WATCHDOG_PID", pid, 1);
  assert_int_equal(sdn_watchdog_start(&loop), 0);
  assert_int_equal(sdn_watchdog_start(&loop), 0); /* already running */
  uv_timer_t stop;
  assert_int_equal(uv_timer_init(&loop, &stop), 0);
  assert_int_equal(uv_timer_start(&stop, stop_cb, 300, 0), 0);
  uint64_t t0 = uv_hrtime();
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  uint64_t ms = (uv_hrtime() - t0) / 1000000;
  assert_true(ms >= 290 && ms < 2000);
  assert_int_equal(uv_loop_close(&loop), 0); /* every handle closed */

  int pings = 0;
  char buf[64];
  ssize_t n;
  while ((n = recv(f->fd, buf, sizeof buf - 1, MSG_DONTWAIT)) > 0) {
    buf[n] = '\0';
    assert_string_equal(buf, "WATCHDOG=1");
    pings++;
  }
  /* at 0, 100, 200 and maybe 300 ms */
  assert_true(pings >= 2);
  assert_true(pings <= 5);

  /* it can be started again on another loop */
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(sdn_watchdog_start(&loop), 0);
  /* the timer is unref'd: it does not keep the loop alive by itself */
  assert_int_equal(uv_loop_alive(&loop), 0);
  assert_int_equal(uv_timer_init(&loop, &stop), 0);
  assert_int_equal(uv_timer_start(&stop, stop_cb, 20, 0), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  expect_dgram(f, "WATCHDOG=1"); /* sent at once on start */
  expect_none(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_notify, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_socket, setup, teardown),
      cmocka_unit_test_setup_teardown(test_socket_gone, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_interval, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_timer, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
