/*
 * clock: the one monotonic clock (and the one wall clock) every file
 * reads.  Durations, deadlines and rates use the monotonic clock; only a
 * time a person reads (a log line, summary.json, a job record) uses the
 * wall clock.
 */
#ifndef CHANTER_CLOCK_H
#define CHANTER_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC (an arbitrary origin; never goes back). */
static inline int64_t clock_mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Milliseconds on CLOCK_MONOTONIC. */
static inline int64_t clock_mono_ms(void) { return clock_mono_ns() / 1000000; }

/* Seconds on CLOCK_MONOTONIC, as a double (about 0.1 us resolution for a
 * year of uptime). */
static inline double clock_mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds since the Unix epoch (CLOCK_REALTIME): for times a person reads. */
static inline double clock_wall_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The wall clock as a timespec (for a timestamp a person reads). */
static inline struct timespec clock_wall_ts(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t;
}

/* The absolute CLOCK_REALTIME deadline ms milliseconds from now, as
 * pthread_cond_timedwait and pthread_timedjoin_np take it (their clock is
 * the wall clock: the one place chanter waits on it). */
static inline struct timespec clock_deadline_rt(int64_t ms) {
  struct timespec t = clock_wall_ts();
  t.tv_sec += (time_t)(ms / 1000);
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
  return t;
}

#endif
