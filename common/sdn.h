/*
 * sdn: telling systemd how a Type=notify daemon is doing.
 *
 * Thin wrappers over sd_notify(3): READY=1 once the daemon serves,
 * STATUS=<what it is doing> as often as useful, WATCHDOG=1 at half the
 * unit's WatchdogSec= (sdn_watchdog_start() does that from the daemon's
 * libuv loop), STOPPING=1 when it starts to drain.  When NOTIFY_SOCKET is
 * unset (not run by systemd, or not Type=notify) every call is a no-op that
 * returns 0, and so is every call in a build with -DCHANTER_NO_SYSTEMD.
 *
 * Every function returns 0 or a negative errno from sending the datagram;
 * callers usually log and carry on.  The sdn_watchdog_start/stop pair must
 * be called from the loop's thread; the others from any thread.
 */
#ifndef CHANTER_SDN_H
#define CHANTER_SDN_H

#include <stdint.h>

#include <uv.h>

/* READY=1 */
int sdn_ready(void);
/* STATUS=<printf result>; newlines in the result are replaced by spaces. */
int sdn_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* STOPPING=1 */
int sdn_stopping(void);
/* WATCHDOG=1 */
int sdn_watchdog(void);

/* Half the watchdog deadline in microseconds (how often to ping), or 0 when
 * the watchdog is not enabled for this process (WATCHDOG_USEC unset, or
 * WATCHDOG_PID names another process). */
uint64_t sdn_watchdog_interval_us(void);

/* If the watchdog is enabled, starts a timer on loop that sends WATCHDOG=1
 * at once and then every sdn_watchdog_interval_us().  The timer is unref'd:
 * it does not keep uv_run() alive on its own.  One watchdog timer per
 * process; starting it again while running is a no-op.  0 (also when the
 * watchdog is disabled), -ENOMEM, or a libuv error (a negative errno). */
int sdn_watchdog_start(uv_loop_t *loop);
/* Stops and closes the timer (the close completes on the loop's next
 * iteration, so run the loop before uv_loop_close()).  No-op if stopped. */
void sdn_watchdog_stop(void);

#endif
