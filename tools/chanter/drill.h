/*
 * drill: one failover rehearsal on a local cluster (DESIGN.md 5), shared by
 * `chanter drill` (cmd_drill.c) and `chanter bench recovery`.
 *
 * A drill starts the job's cluster with `chanter local up` (whose
 * supervisor restarts what dies, as systemd's Restart=on-failure does),
 * trains it with `chanter train`, and while it trains kills the chosen
 * daemon -- kill -9, or kill -STOP for a hang, which the supervisor's
 * watchdog ends -- at the chosen iteration, K times.  It then reads when
 * each kill was noticed and how the job recovered (summary.json's
 * "recoveries"), when the supervisor restarted the daemon (DIR/run/events),
 * and compares the job's digest with the reference (an uninterrupted run
 * of the same job, which it runs itself unless given).
 */
#ifndef CHANTER_DRILL_H
#define CHANTER_DRILL_H

#include <stdint.h>

#include "cli.h"

#define DRILL_MAX_KILLS 64

typedef struct drill_opts_s {
  const char *kind;      /* kill-trainer | kill-oracle | kill-embedding | kill-dataproc | hang-trainer |
                          * hang-embedding | lose-disk | chaos (| restart-all: bench recovery's baseline) */
  int rank;              /* which trainer / server / processor (-1: the last trainer, server 0, processor 0) */
  int64_t at;            /* the iteration of the first kill (-1: a third of the job) */
  int times;             /* kills (each next one while the job replays after the one before) */
  double duration, every; /* chaos: a random daemon every `every` s for `duration` s */
  const char *reference; /* the uninterrupted job's digest, or NULL: run it */
  const char *workdir;   /* the drill's directory (clusters, logs, summaries) */
  int quiet;
} drill_opts_t;

typedef struct drill_kill_s {
  char who[32];           /* "trainer-1" */
  int pid, new_pid;
  int64_t at;             /* the iteration every trainer had finished when it was killed */
  double t_kill;          /* unix seconds */
  /* seconds after t_kill; < 0: did not happen (or not known) */
  double detected, restarted, rolled_back, resumed, first, caught_up;
  int64_t rollback_to;    /* -2: no rollback */
  int64_t replayed;       /* iterations computed twice */
  char kind[16], why[512];
} drill_kill_t;

typedef struct drill_result_s {
  int pass;               /* the job completed and its digest is the reference's */
  char digest[65], reference[65];
  int n_kills;
  drill_kill_t kills[DRILL_MAX_KILLS];
  int n_recoveries;
  double seconds;         /* the drill job's wall time */
  char error[1024];       /* why it could not run, when it could not */
} drill_result_t;

/* The uninterrupted job's digest in out (runs it in dir).  0 or 1 (said). */
int drill_reference(cli_t *cli, const char *self, const char *dir, char out[65]);
/* One drill (opts->reference must be set).  0 when it ran (r->pass says
 * whether it passed), else 1 with r->error. */
int drill_run(cli_t *cli, const char *self, const drill_opts_t *o, drill_result_t *r);
/* The timeline and the verdict, as text or JSON, on stdout. */
void drill_print(const drill_opts_t *o, const drill_result_t *r, int json);

#endif
