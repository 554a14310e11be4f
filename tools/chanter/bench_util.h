/* Helpers the benchmarks (and the CLI's cluster commands) share: starting
 * a real daemon of build/bin/ next to the chanter binary on a
 * kernel-chosen loopback port, the tail of a daemon's log, and the median
 * of a set of timings. */
#ifndef CHANTER_BENCH_UTIL_H
#define CHANTER_BENCH_UTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Starts build/bin/<daemon> (beside this executable) with argv (NULL-
 * terminated, without argv[0]), stderr to logf; waits until it wrote its
 * ready file and returns its RPC port, or -1 (and the pid is reaped). */
int bench_start_daemon(const char *daemon, char *const argv[], const char *ready, const char *logf, pid_t *pid);
/* SIGTERM and wait; 0 if it exited 0. */
int bench_stop_daemon(pid_t pid);

/* `chanter report` of the cluster in workdir (its oracle's timeline) into
 * out: the plots of a benchmark's run.  0, or -1 after saying why on
 * stderr (the benchmark goes on). */
int bench_report(const char *self, const char *workdir, const char *out);

/* The last 12 lines of a log file on stderr, under a header naming it
 * (nothing when it is missing or empty): what a daemon said before it
 * failed. */
void cli_tail_file(const char *path);

/* qsort's comparison of two doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);
/* The median of the n values of v (sorted in place: v[0] is then the
 * least); the mean of the middle two for an even n, NAN for none. */
double bench_median(double *v, size_t n);

#endif
