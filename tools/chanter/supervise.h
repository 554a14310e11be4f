/*
 * supervise: the supervisor of a local cluster (`chanter local`), which
 * does for its daemons what systemd's Restart=on-failure, RestartSec=,
 * RestartPreventExitStatus=3, StartLimitBurst= and WatchdogSec= do for the
 * units in systemd/.
 *
 * `chanter local up` starts it as a process of its own session
 * (`chanter --config W/job.ini local supervise --workdir W`; its log is
 * W/logs/supervisor.log, its pid in W/run/supervisor.pid).  It starts the
 * daemons as its own children in dependency order and tells `local up`
 * over a pipe how start-up went; then it restarts the ones that fail,
 * watches their sd_notify pings, and on SIGTERM (`local down`) stops them
 * all, reaps them and exits.  supervise.c says how; supervise_files.c
 * holds the formats of the files below (both the writing and the reading).
 *
 * Files in the work directory W, which the CLI reads:
 *   W/pids           "name pid port" per daemon, in start order; replaced
 *                    (durably: fsio_replace) on every restart.  Older clusters wrote the
 *                    same, without a supervisor.
 *   W/run/status     the supervisor's view, tab-separated: a first line
 *                    "supervisor PID PHASE KILLED RESTART_MS WATCHDOG_MS",
 *                    then "NAME PID PORT STATE RESTARTS LAST_EXIT STATUS" per
 *                    daemon (LAST_EXIT and STATUS free text without tabs,
 *                    "-" when empty); replaced as W/pids is.
 *   W/run/events     one JSON object per line, appended: {"t": unix seconds
 *                    with ms, "event": "exit"|"restart"|"ready"|"give_up"|
 *                    "watchdog", "name", "pid", "new_pid", "how", "restarts"}.
 *   W/run/notify     the NOTIFY_SOCKET the daemons send to.
 */
#ifndef CHANTER_SUPERVISE_H
#define CHANTER_SUPERVISE_H

#include <stddef.h>
#include <sys/types.h>

#include "cfg.h"

#define SUPERVISE_MAX 512 /* daemons of one local cluster */

typedef struct supervise_proc_s {
  char name[64];
  pid_t pid;
  int port; /* RPC port, 0 when it serves none */
} supervise_proc_t;

/* W/pids: replace it (fsio_replace_open/commit: 0, or a negative errno
 * with why saying what failed on which path); read up to cap lines (extra
 * fields after the port are ignored): the count, or a negative errno
 * (-ENOENT: no cluster was started there). */
int supervise_pids_save(const char *workdir, const supervise_proc_t *ps, int n, char *why, size_t why_len);
int supervise_pids_load(const char *workdir, supervise_proc_t *ps, int cap);

/* 1 when pid is a process that has not exited.  A zombie is dead: where
 * init does not reap orphans (this container), a daemon whose parent went
 * away stays a zombie after it exits.  Reaps pid if it is our child. */
int supervise_alive(pid_t pid);

/* The pid of W's supervisor when it runs (W/run/supervisor.pid names a live
 * `chanter ... local supervise` process), else 0. */
pid_t supervise_running(const char *workdir);

/* One daemon as W/run/status says. */
typedef struct supervise_entry_s {
  char name[64];
  pid_t pid;
  int port;
  char state[16];      /* starting up restarting done gave_up stopping stopped failed */
  int restarts;
  char last_exit[160]; /* "" or "killed by signal 9 (SIGKILL)", "exit 1", "watchdog, ..." */
  char status[256];    /* its last STATUS= */
} supervise_entry_t;

typedef struct supervise_info_s {
  pid_t pid;
  char phase[16]; /* starting running stopping stopped */
  int killed;     /* daemons that needed SIGKILL at the stop */
  int restart_ms, watchdog_ms;
} supervise_info_t;

/* Reads W/run/status: the number of entries (<= cap), or a negative errno
 * (-ENOENT: no supervisor ever ran there). */
int supervise_status_read(const char *workdir, supervise_info_t *info, supervise_entry_t *es, int cap);
/* Replaces W/run/status with info and es[0..n) (0, or a negative errno
 * with why).  LAST_EXIT and STATUS have their tabs and line breaks made
 * blanks. */
int supervise_status_write(const char *workdir, const supervise_info_t *info, const supervise_entry_t *es, int n,
                           char *why, size_t why_len);

/* Appends one line to W/run/events (the format above; t is now, new_pid
 * <= 0 is null, how is escaped); 0 or a negative errno. */
int supervise_event_append(const char *workdir, const char *ev, const char *name, pid_t pid, pid_t new_pid,
                           const char *how, int restarts);

/* A daemon's ready file at path: 0 once it exists, with its rpc_port and
 * metrics_port (0 when it names none: ready, serving no RPC of its own);
 * -1 before. */
int supervise_ready_read(const char *path, int *port, int *mport);

/* The supervisor itself: cfg is the job (W/job.ini as `local up` wrote
 * it; the supervisor fills cluster.* in and rewrites the file), bindir
 * holds the daemons' binaries, report_fd is the pipe to `local up` (lines
 * "say TEXT", "tail PATH", then "up" or "fail"; closed after start-up), or
 * -1.  Runs until stopped; returns the process's exit status: 0 after a
 * stop, 1 when start-up failed (everything started was stopped again). */
int supervise_run(cfg_t *cfg, const char *workdir, const char *bindir, int report_fd);

/* Writes cfg to path (fsio_replace_open/commit) after reading it back
 * as every daemon will: a file they would refuse is an error here, with
 * the sentence in err, not a daemon that exits during start-up.  0, a
 * negative errno, or the reader's error. */
int supervise_write_job(const cfg_t *cfg, const char *path, char *err, size_t err_len);

/* The socket the daemons' sd_notify sends to: W/run/notify (its path in
 * path, removed at the end), or an abstract name (path "") when that is
 * too long; env_value: NOTIFY_SOCKET's value; *fd_out: the socket.  0 or a
 * negative errno.  supervise_env: the daemons' environment (malloc'ed,
 * NULL-terminated), ours with NOTIFY_SOCKET and WATCHDOG_USEC set. */
int supervise_notify_open(const char *workdir, char *path, size_t path_len, char *env_value, size_t n, int *fd_out);
char **supervise_env(const char *notify, int watchdog_ms);

#endif
