/* Helpers the benchmarks share: clocks, and starting a real daemon of
 * build/bin/ next to the chanter binary on a kernel-chosen loopback port. */
#ifndef CHANTER_BENCH_UTIL_H
#define CHANTER_BENCH_UTIL_H

#include <stddef.h>
#include <sys/types.h>

double bench_now(void);
/* Starts build/bin/<daemon> (beside this executable) with argv (NULL-
 * terminated, without argv[0]), stderr to logf; waits until it wrote its
 * ready file and returns its RPC port, or -1 (and the pid is reaped). */
int bench_start_daemon(const char *daemon, char *const argv[], const char *ready, const char *logf, pid_t *pid);
/* SIGTERM and wait; 0 if it exited 0. */
int bench_stop_daemon(pid_t pid);

/* The last 12 lines of a log file on stderr, under a header naming it
 * (nothing when it is missing or empty): what a daemon said before it
 * failed. */
void cli_tail_file(const char *path);
/* A whole (small) file as a NUL-terminated string (malloc'd), or NULL. */
char *cli_slurp(const char *path);
/* The string value of "key" in a flat JSON text (our own summaries: the
 * first match, backslash escapes undone) into out; 0, or -1 with out
 * empty when there is none. */
int cli_json_str(const char *json, const char *key, char *out, size_t n);

#endif
