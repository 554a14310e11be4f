/*
 * sdn: see sdn.h.
 *
 * The only #ifdef for libsystemd is the block below that defines the two
 * primitives everything else is built on: send one notification, and read
 * the watchdog deadline.  Without libsystemd they report "not under
 * systemd" and every call becomes a no-op returning 0.
 */
#include "sdn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"

#ifndef CHANTER_NO_SYSTEMD
#include <systemd/sd-daemon.h>
/* >0 sent, 0 no NOTIFY_SOCKET, <0 -errno */
static int sys_notify(const char *state) { return sd_notify(0, state); }
/* >0 enabled for this process (*usec set), 0 not, <0 -errno */
static int sys_watchdog_usec(uint64_t *usec) {
  return sd_watchdog_enabled(0, usec);
}
#else
static int sys_notify(const char *state) {
  (void)state;
  return 0;
}
static int sys_watchdog_usec(uint64_t *usec) {
  (void)usec;
  return 0;
}
#endif

static int notify(const char *state) {
  int rc = sys_notify(state);
  return rc < 0 ? rc : 0;
}

int sdn_ready(void) { return notify("READY=1"); }
int sdn_stopping(void) { return notify("STOPPING=1"); }
int sdn_watchdog(void) { return notify("WATCHDOG=1"); }

int sdn_status(const char *fmt, ...) {
  char *msg = NULL;
  va_list ap;
  va_start(ap, fmt);
  char *body = NULL;
  int n = vasprintf(&body, fmt, ap);
  va_end(ap);
  if (n < 0) return -ENOMEM;
  for (char *p = body; *p; p++)
    if (*p == '\n') *p = ' '; /* a newline would start a new assignment */
  int rc = asprintf(&msg, "STATUS=%s", body) < 0 ? -ENOMEM : notify(msg);
  free(body);
  free(msg);
  return rc;
}

uint64_t sdn_watchdog_interval_us(void) {
  uint64_t usec = 0;
  if (sys_watchdog_usec(&usec) <= 0) return 0;
  return usec / 2;
}

/* ---- the watchdog timer: one per process, heap-allocated so that a stop
 * (whose close completes later on the loop) and a new start do not share
 * storage. */

static uv_timer_t *wd_timer; /* running timer, or NULL */

static void wd_close_cb(uv_handle_t *h) { free(h); }

static void wd_tick_cb(uv_timer_t *t) {
  (void)t;
  int rc = sdn_watchdog();
  if (rc < 0) log_warn("watchdog ping failed err=%s", err_str(rc));
}

int sdn_watchdog_start(uv_loop_t *loop) {
  int rc = 0;
  uv_timer_t *t = NULL;
  if (wd_timer) goto out;
  uint64_t us = sdn_watchdog_interval_us();
  if (us == 0) goto out;
  t = malloc(sizeof *t);
  if (!t) {
    rc = -ENOMEM;
    goto out;
  }
  rc = uv_timer_init(loop, t);
  if (rc < 0) goto out;
  uint64_t ms = us / 1000 ? us / 1000 : 1;
  rc = uv_timer_start(t, wd_tick_cb, 0, ms);
  if (rc < 0) {
    uv_close((uv_handle_t *)t, wd_close_cb);
    t = NULL;
    goto out;
  }
  uv_unref((uv_handle_t *)t);
  wd_timer = t;
  t = NULL;
  log_info("watchdog pings started interval_ms=%llu", (unsigned long long)ms);
out:
  free(t);
  if (rc < 0) log_error("watchdog start failed err=%s", err_str(rc));
  return rc;
}

void sdn_watchdog_stop(void) {
  if (!wd_timer) return;
  uv_timer_stop(wd_timer);
  uv_close((uv_handle_t *)wd_timer, wd_close_cb);
  wd_timer = NULL;
}
