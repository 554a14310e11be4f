/*
 * log: structured, leveled logging to stderr.
 *
 * Every line starts with a syslog priority prefix ("<3>" error, "<4>" warn,
 * "<6>" info, "<7>" debug) so that journald, which captures a systemd
 * unit's stderr, files each line at the right priority.  When stderr is not
 * journald (a terminal, a test log) a UTC timestamp is added.  The message
 * is a short phrase followed by key=value pairs, e.g.
 *     log_warn("lookup rejected reason=%s keys=%zu", why, n);
 * The macros check the level before formatting anything.  Thread-safe: one
 * write(2) per line.
 */
#ifndef CHANTER_LOG_H
#define CHANTER_LOG_H

#include <stdarg.h>

enum { LOG_ERROR = 3, LOG_WARN = 4, LOG_INFO = 6, LOG_DEBUG = 7 };

extern int log_level; /* lines above this priority are dropped */

/* Set the process name shown on each line (default "chanter"). */
void log_set_name(const char *name);
/* Parse "error|warn|info|debug" (case-insensitive); -EINVAL if unknown. */
int log_set_level_str(const char *s);
void log_write(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vwrite(int prio, const char *fmt, va_list ap);

#define log_at(p, ...)                     \
  do {                                     \
    if ((p) <= log_level) log_write((p), __VA_ARGS__); \
  } while (0)
#define log_error(...) log_at(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_DEBUG, __VA_ARGS__)

#endif
