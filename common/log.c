/* log: see log.h. */
#include "clock.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int log_level = LOG_INFO;
static char log_name[64] = "chanter";
static int log_journal = -1; /* -1 unknown, 0 no, 1 stderr is journald */

void log_set_name(const char *name) {
  snprintf(log_name, sizeof log_name, "%s", name);
}

int log_set_level_str(const char *s) {
  static const struct { const char *n; int v; } t[] = {
      {"error", LOG_ERROR}, {"warn", LOG_WARN}, {"warning", LOG_WARN},
      {"info", LOG_INFO},   {"debug", LOG_DEBUG}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcasecmp(s, t[i].n) == 0) {
      log_level = t[i].v;
      return 0;
    }
  return -EINVAL;
}

void log_vwrite(int prio, const char *fmt, va_list ap) {
  char buf[2048];
  int n = 0;
  if (log_journal < 0) log_journal = getenv("JOURNAL_STREAM") != NULL;
  if (log_journal) {
    n = snprintf(buf, sizeof buf, "<%d>", prio);
  } else {
    struct timespec ts;
    struct tm tm;
    static const char *lv[8] = {"", "", "", "ERROR", "WARN", "", "INFO", "DEBUG"};
    ts = clock_wall_ts();
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(buf, sizeof buf, "<%d>%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                 prio, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, log_name,
                 lv[prio & 7]);
  }
  if (n < 0) n = 0;
  int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  if (m < 0) m = 0;
  n += m;
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
  (void)w;
}

void log_write(int prio, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(prio, fmt, ap);
  va_end(ap);
}
