/*
 * supervise: see supervise.h.
 *
 * One libuv loop on one thread.  The daemons are libuv child processes
 * (uv_spawn, each in its own session as before: UV_PROCESS_DETACHED),
 * reaped by libuv, whose exit callback applies the restart policy.  Their
 * sd_notify datagrams arrive on a unix datagram socket with SO_PASSCRED,
 * so that each carries its sender's pid.  A 25 ms tick does what waits:
 * ready files during start-up and after a restart, delayed restarts,
 * watchdog deadlines, and SIGKILL after a grace period.
 *
 * The policy, per daemon, as systemd's:
 *   exit 0 or 3                 stays down (0: its job ended; 3: a trainer
 *                               whose job another daemon failed)
 *   other exit, or a signal     restarted after local.restart_ms with the
 *                               same command line and the ports it had
 *                               (--listen 127.0.0.1:PORT --metrics-port P),
 *                               so its clients, who have that address in
 *                               W/job.ini, reconnect; unless it was already
 *                               restarted local.restart_burst times within
 *                               local.restart_window_s: "give_up", down
 *   pinged (WATCHDOG=1 or       killed with SIGABRT (and SIGCONT, so that a
 *   READY=1), then silent for   stopped process dies too), SIGKILL 2 s
 *   local.watchdog_ms           later; then restarted as above
 * A daemon that exits before its first ready file fails the start-up.
 */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "clock.h"
#include "err.h"
#include "hosts.h"
#include "log.h"

extern char **environ;

#define TICK_MS 25
#define READY_TIMEOUT_S 60.0   /* a daemon not ready in this time fails the start-up */
#define WD_KILL_S 2.0          /* SIGABRT, then SIGKILL this much later (systemd's) */
#define STOP_GRACE_MS 15000    /* SIGTERM, then SIGKILL (local down) */
#define FAIL_GRACE_MS 5000     /* the same after a failed start-up */
#define KILL_WAIT_S 5.0        /* after SIGKILL, how long to wait for the exit */
#define STATUS_EVERY_S 0.25    /* W/run/status at most this often for STATUS= changes */
#define MAX_ARGS 24

/* ---- the supervisor */

enum { D_STARTING, D_UP, D_WAIT, D_DONE, D_GAVE_UP, D_STOPPING, D_STOPPED, D_FAILED };
static const char *const state_names[] = {"starting", "up",       "restarting", "done",
                                          "gave_up",  "stopping", "stopped",    "failed"};
enum { P_START, P_RUN, P_STOP, P_DONE };
static const char *const phase_names[] = {"starting", "running", "stopping", "stopped"};

typedef struct sup_s sup_t;

typedef struct child_s {
  sup_t *sup;
  char name[64];
  char path[4200];            /* the binary */
  char *argv[MAX_ARGS + 4];   /* argv[0] = path; the rest owned */
  int argc;
  int listen_at;              /* index of --listen's value in argv, or 0 */
  int port, mport;            /* as its first ready file said */
  char ready[4200], logf[4200];
  uv_process_t *proc;         /* while it runs (closed in its exit callback) */
  pid_t pid;                  /* the last process, running or not */
  int state;
  int ever_ready;             /* it was ready once: the policy applies */
  int restarts;
  double *recent;             /* times of the last restart_burst restarts, a ring */
  double exited_at, restart_at, kill_at, last_ping;
  int armed;                  /* pinged since it started: the watchdog applies */
  int wd_fired, wd_killed;
  int surplus;                /* a trainer beyond the job's count since chanter scale: never restarted */
  char how[128];              /* how its last process ended: "exit 1", "killed by signal 9 (SIGKILL)" */
  char last_exit[160];        /* the same, "watchdog, " first when the watchdog killed it */
  char status[256];           /* its last STATUS= */
} child_t;

struct sup_s {
  uv_loop_t *loop;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint, sighup;
  uv_poll_t notify_poll;
  int notify_fd;
  char notify_path[4200];     /* the socket's file, removed at the end ("" when abstract) */
  cfg_t *cfg;
  const char *workdir;
  char job[4200], bindir[4096];
  int report_fd;
  child_t *ch;
  int n;
  int phase, group, group_first;
  double group_deadline, stop_deadline, kill_deadline;
  int stop_grace_ms, stop_killed, killed, rc;
  int restart_ms, burst, window_s, watchdog_ms;
  char **env;
  int status_dirty;
  double status_at;
  hosts_plan_t hp;            /* emulated hosts (hp.n_hosts > 0): the daemons run in their namespaces */
  char self[4096];            /* this binary: `chanter local exec-in NS -- ...` */
  char listen_next[280];      /* SIGHUP: the address of the server add_child starts ("": a free port) */
};

static const struct group_s {
  const char *kind, *bin, *count_key, *index_flag;
  int listens, data_dir;
} groups[] = {
    {"dataproc", "chanter-dataproc", "dataprocs", "--index", 1, 0},
    {"embedding", "chanter-embedding", "embedding_servers", "--shard", 1, 1},
    {"oracle", "chanter-oracle", NULL, NULL, 1, 0},
    {"trainer", "chanter-trainer", "trainers", "--rank", 0, 0},
};
#define N_GROUPS ((int)(sizeof groups / sizeof groups[0]))

/* A line for `local up` (during start-up) and the log. */
static void say(sup_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(sup_t *s, const char *fmt, ...) {
  char msg[2048], line[2100];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log_info("%s", msg);
  if (s->report_fd < 0) return;
  int n = snprintf(line, sizeof line, "say %s\n", msg);
  if (write(s->report_fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0) {
    /* `local up` went away: the log has it */
  }
}

static void report(sup_t *s, const char *what, const char *arg) {
  if (s->report_fd < 0) return;
  char line[4400];
  int n = snprintf(line, sizeof line, "%s%s%s\n", what, arg ? " " : "", arg ? arg : "");
  if (write(s->report_fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0) {
    /* as in say() */
  }
}

static void save_pids(sup_t *s) {
  supervise_proc_t ps[SUPERVISE_MAX];
  for (int i = 0; i < s->n; i++) {
    snprintf(ps[i].name, sizeof ps[i].name, "%s", s->ch[i].name);
    ps[i].pid = s->ch[i].pid;
    ps[i].port = s->ch[i].port;
  }
  char why[4400];
  if (supervise_pids_save(s->workdir, ps, s->n, why, sizeof why)) log_error("%s", why);
}

static void save_status(sup_t *s) {
  supervise_info_t info = {
      .pid = getpid(), .killed = s->killed, .restart_ms = s->restart_ms, .watchdog_ms = s->watchdog_ms};
  snprintf(info.phase, sizeof info.phase, "%s", phase_names[s->phase]);
  supervise_entry_t *es = calloc((size_t)(s->n ? s->n : 1), sizeof *es);
  char why[4400];
  if (!es) {
    log_error("cannot write %s/run/status: out of memory", s->workdir);
  } else {
    for (int i = 0; i < s->n; i++) {
      const child_t *c = &s->ch[i];
      supervise_entry_t *e = &es[i];
      snprintf(e->name, sizeof e->name, "%s", c->name);
      e->pid = c->pid;
      e->port = c->port;
      snprintf(e->state, sizeof e->state, "%s", state_names[c->state]);
      e->restarts = c->restarts;
      snprintf(e->last_exit, sizeof e->last_exit, "%s", c->last_exit);
      snprintf(e->status, sizeof e->status, "%s", c->status);
    }
    if (supervise_status_write(s->workdir, &info, es, s->n, why, sizeof why)) log_error("%s", why);
    free(es);
  }
  s->status_dirty = 0;
  s->status_at = clock_mono_s();
}

/* One line of W/run/events; new_pid <= 0 is null. */
static void event(sup_t *s, const char *ev, const child_t *c, pid_t pid, pid_t new_pid, const char *how) {
  int rc = supervise_event_append(s->workdir, ev, c->name, pid, new_pid, how, c->restarts);
  if (rc) log_error("cannot append to %s/run/events: %s", s->workdir, strerror(-rc));
}

/* ---- processes */

static void free_handle_cb(uv_handle_t *h) { free(h); }
static void on_exit_cb(uv_process_t *p, int64_t exit_status, int term_signal);

static char *set_arg(child_t *c, int i, const char *v) {
  free(c->argv[i]);
  return c->argv[i] = strdup(v);
}

static void add_arg(child_t *c, const char *v) {
  if (c->argc < MAX_ARGS + 3) {
    c->argv[c->argc++] = strdup(v);
    c->argv[c->argc] = NULL;
  }
}

/* Starts c's process (its log appended to, its ready file removed first):
 * 0 or a negative errno. */
static int spawn(sup_t *s, child_t *c) {
  int fd = open(c->logf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  uv_process_t *p = calloc(1, sizeof *p);
  if (!p) {
    close(fd);
    return -ENOMEM;
  }
  uv_stdio_container_t io[3] = {{.flags = UV_IGNORE},
                                {.flags = UV_INHERIT_FD, .data.fd = fd},
                                {.flags = UV_INHERIT_FD, .data.fd = fd}};
  uv_process_options_t o = {.exit_cb = on_exit_cb,
                            .file = c->path,
                            .args = c->argv,
                            .env = s->env,
                            .flags = UV_PROCESS_DETACHED,
                            .stdio_count = 3,
                            .stdio = io};
  unlink(c->ready);
  p->data = c;
  int rc = uv_spawn(s->loop, p, &o);
  close(fd);
  if (rc) {
    uv_close((uv_handle_t *)p, free_handle_cb);
    return rc;
  }
  c->proc = p;
  c->pid = p->pid;
  c->state = D_STARTING;
  c->armed = c->wd_fired = c->wd_killed = 0;
  c->status[0] = 0;
  return 0;
}

static void begin_stop(sup_t *s, int grace_ms);

/* Start-up failed: say so, stop what was started, exit 1 when done. */
static void fail_start(sup_t *s, int rc) {
  say(s, "chanter local up: start-up failed (%s); stopping what was started", err_str(rc));
  report(s, "fail", NULL);
  s->rc = 1;
  begin_stop(s, FAIL_GRACE_MS);
}

static void policy(sup_t *s, child_t *c, int64_t status, int sig);

/* Restart c now (its delay is over). */
static void restart(sup_t *s, child_t *c) {
  pid_t old = c->pid;
  if (c->listen_at) {
    char v[64];
    snprintf(v, sizeof v, "127.0.0.1:%d", c->port);
    set_arg(c, c->listen_at, v);
  }
  if (c->mport > 0) { /* the metrics endpoint where it was, too */
    char v[16];
    snprintf(v, sizeof v, "%d", c->mport);
    int at = 0;
    for (int i = 1; i < c->argc; i++)
      if (!strcmp(c->argv[i], "--metrics-port") && i + 1 < c->argc) at = i + 1;
    if (at) set_arg(c, at, v);
    else {
      add_arg(c, "--metrics-port");
      add_arg(c, v);
    }
  }
  if (s->burst > 0) c->recent[c->restarts % s->burst] = clock_mono_s();
  c->restarts++;
  int rc = spawn(s, c);
  int after_ms = (int)((clock_mono_s() - c->exited_at) * 1000 + 0.5);
  if (rc) {
    /* a restart that failed at once: the policy again, and the burst limit ends it */
    log_error("restart name=%s old_pid=%d how=\"%s\" failed: cannot start %s: %s restarts=%d", c->name, (int)old,
              c->last_exit, c->path, err_str(rc), c->restarts);
    snprintf(c->how, sizeof c->how, "cannot start: %s", err_str(rc));
    snprintf(c->last_exit, sizeof c->last_exit, "%s", c->how);
    event(s, "exit", c, old, 0, c->how);
    policy(s, c, 127, 0);
    save_status(s);
    return;
  }
  log_info("restart name=%s old_pid=%d how=\"%s\" new_pid=%d restarts=%d after_ms=%d", c->name, (int)old, c->last_exit,
           (int)c->pid, c->restarts, after_ms);
  event(s, "restart", c, old, c->pid, c->last_exit);
  save_pids(s);
  save_status(s);
}

/* What the policy does with c, which has just exited (c->last_exit says how). */
static void policy(sup_t *s, child_t *c, int64_t status, int sig) {
  double now = clock_mono_s();
  c->exited_at = now;
  if (s->phase == P_STOP || s->phase == P_DONE) {
    c->state = D_STOPPED;
    log_info("stopped name=%s pid=%d how=\"%s\"", c->name, (int)c->pid, c->last_exit);
    return;
  }
  int port, mport;
  if (!c->ever_ready && supervise_ready_read(c->ready, &port, &mport) == 0) { /* ready, and gone before the tick saw it */
    c->ever_ready = 1;
    c->port = port;
    c->mport = mport;
  }
  if (!c->ever_ready) { /* during start-up: the start-up fails (the tick says so) */
    c->state = D_FAILED;
    log_error("exit name=%s pid=%d how=\"%s\" before it was ready", c->name, (int)c->pid, c->last_exit);
    return;
  }
  if (c->surplus) { /* chanter scale left its rank out of the job */
    c->state = D_DONE;
    log_info("exit name=%s pid=%d how=\"%s\" action=none: the job was scaled below its rank", c->name, (int)c->pid,
             c->last_exit);
    return;
  }
  if (!sig && (status == 0 || status == 3)) {
    c->state = D_DONE;
    log_info("exit name=%s pid=%d how=\"%s\" action=none: exit %d is not a failure (%s), so it is not restarted",
             c->name, (int)c->pid, c->last_exit, (int)status,
             status == 0 ? "its work ended" : "its job was failed by another daemon");
    return;
  }
  if (s->burst == 0 || (c->restarts >= s->burst && now - c->recent[c->restarts % s->burst] < s->window_s)) {
    c->state = D_GAVE_UP;
    if (s->burst == 0)
      log_error("give_up name=%s pid=%d how=\"%s\" restarts=%d: restarts are off (local.restart_burst = 0); it stays "
                "down -- see %s",
                c->name, (int)c->pid, c->last_exit, c->restarts, c->logf);
    else
      log_error("give_up name=%s pid=%d how=\"%s\" restarts=%d: it failed again after %d restarts within %d s "
                "(local.restart_burst, local.restart_window_s); it stays down -- see %s, fix the cause, then "
                "`chanter local down` and `local up` again",
                c->name, (int)c->pid, c->last_exit, c->restarts, s->burst, s->window_s, c->logf);
    event(s, "give_up", c, c->pid, 0, c->last_exit);
    return;
  }
  c->state = D_WAIT;
  c->restart_at = now + s->restart_ms / 1000.0;
  log_info("exit name=%s pid=%d how=\"%s\" action=restart restart_in_ms=%d", c->name, (int)c->pid, c->last_exit,
           s->restart_ms);
}

static void on_exit_cb(uv_process_t *p, int64_t exit_status, int term_signal) {
  if (!p) return;
  child_t *c = p->data;
  sup_t *s = c->sup;
  uv_close((uv_handle_t *)p, free_handle_cb);
  c->proc = NULL;
  if (term_signal) {
    const char *abbr = sigabbrev_np(term_signal);
    snprintf(c->how, sizeof c->how, "killed by signal %d (SIG%s)", term_signal, abbr ? abbr : "?");
  } else {
    snprintf(c->how, sizeof c->how, "exit %d", (int)exit_status);
  }
  if (c->wd_fired) snprintf(c->last_exit, sizeof c->last_exit, "watchdog, %s", c->how);
  else snprintf(c->last_exit, sizeof c->last_exit, "%s", c->how);
  if (s->phase != P_STOP && s->phase != P_DONE) event(s, "exit", c, c->pid, 0, c->last_exit);
  policy(s, c, exit_status, term_signal);
  save_pids(s);
  save_status(s);
}

/* ---- sd_notify */

static child_t *child_of(sup_t *s, pid_t pid) {
  for (int i = 0; i < s->n; i++)
    if (s->ch[i].proc && s->ch[i].pid == pid) return &s->ch[i];
  return NULL;
}

static void watchdog_fire(sup_t *s, child_t *c, const char *why) {
  char how[256];
  snprintf(how, sizeof how, "%s; sending SIGABRT (SIGKILL in %.0f s)", why, WD_KILL_S);
  log_warn("watchdog name=%s pid=%d: %s", c->name, (int)c->pid, how);
  event(s, "watchdog", c, c->pid, 0, how);
  c->wd_fired = 1;
  c->kill_at = clock_mono_s() + WD_KILL_S;
  kill(c->pid, SIGABRT);
  kill(c->pid, SIGCONT); /* a stopped process must be able to die of it */
}

static void on_datagram(sup_t *s, pid_t pid, char *msg) {
  child_t *c = child_of(s, pid);
  if (!c) {
    log_debug("notify from pid=%d, not a daemon of this cluster; ignored", (int)pid);
    return;
  }
  for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strcmp(line, "WATCHDOG=1") || !strcmp(line, "READY=1")) {
      c->armed = 1;
      c->last_ping = clock_mono_s();
    } else if (!strcmp(line, "WATCHDOG=trigger")) {
      if (!c->wd_fired) watchdog_fire(s, c, "the daemon asked for it (WATCHDOG=trigger)");
    } else if (!strncmp(line, "STATUS=", 7)) {
      snprintf(c->status, sizeof c->status, "%s", line + 7);
      s->status_dirty = 1;
    }
  }
}

static void on_notify(uv_poll_t *h, int status, int events) {
  sup_t *s = h->data;
  if (status < 0) return;
  for (;;) {
    char buf[8192];
    union {
      struct cmsghdr h;
      char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * 32)];
    } cm;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &cm, .msg_controllen = sizeof cm};
    ssize_t n = recvmsg(s->notify_fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    buf[n] = 0;
    pid_t pid = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_CREDENTIALS) {
        struct ucred u;
        memcpy(&u, CMSG_DATA(c), sizeof u);
        pid = u.pid;
      } else if (c->cmsg_type == SCM_RIGHTS) { /* FDSTORE=1: we keep no fds */
        int nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < nfd; i++) {
          int fd;
          memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          close(fd);
        }
      }
    }
    if (pid > 0) on_datagram(s, pid, buf);
  }
}

/* ---- start-up: the groups in order */

static int set_addrs(sup_t *s, const char *key, int first, int count) {
  char kv[16384], err[512];
  int o = snprintf(kv, sizeof kv, "%s=", key);
  for (int i = 0; i < count && o < (int)sizeof kv - 32; i++)
    o += snprintf(kv + o, sizeof kv - (size_t)o, "%s127.0.0.1:%d", i ? "," : "", s->ch[first + i].port);
  int rc = cfg_set(s->cfg, kv, "chanter local up", err, sizeof err);
  if (rc) say(s, "chanter local up: %s", err);
  return rc;
}

static int write_job(sup_t *s) {
  char err[1024];
  int rc = supervise_write_job(s->cfg, s->job, err, sizeof err);
  if (rc && rc > -4096 && rc != -ENOMEM) return rc; /* an errno: the caller says it */
  if (rc) say(s, "chanter local up: the job file written for the daemons does not read back: %s", err);
  return rc;
}

/* Daemon i of group g, started (appended to s->ch).  0 or an error (said). */
static int add_child(sup_t *s, int g, int i) {
  const struct group_s *gr = &groups[g];
  {
    if (s->n >= SUPERVISE_MAX) {
      say(s, "chanter local up: more than %d daemons", SUPERVISE_MAX);
      return -E2BIG;
    }
    child_t *c = &s->ch[s->n++];
    memset(c, 0, sizeof *c);
    c->sup = s;
    if (s->burst > 0 && !(c->recent = calloc((size_t)s->burst, sizeof *c->recent))) return -ENOMEM;
    snprintf(c->name, sizeof c->name, "%s-%d", gr->kind, i);
    snprintf(c->path, sizeof c->path, "%s/%s", s->bindir, gr->bin);
    snprintf(c->ready, sizeof c->ready, "%s/run/%s.ready", s->workdir, c->name);
    snprintf(c->logf, sizeof c->logf, "%s/logs/%s.log", s->workdir, c->name);
    char idx[16];
    snprintf(idx, sizeof idx, "%d", i);
    c->argv[c->argc++] = c->path;
    c->argv[c->argc] = NULL;
    if (s->hp.n_hosts) { /* in its host's namespace, as its systemd unit's ExecStart= says */
      char ns[64], err[1024], *words[MAX_ARGS];
      int h = hosts_of(&s->hp, gr->kind, i);
      int nw = hosts_unit_argv(s->bindir, s->job, gr->kind, i, words, MAX_ARGS - 8, err, sizeof err);
      if (nw < 0) {
        c->state = D_FAILED;
        say(s, "chanter local up: cannot start %s: %s", c->name, err);
        return ERR_CONFIG;
      }
      hosts_ns_name(&s->hp, h, ns, sizeof ns);
      snprintf(c->path, sizeof c->path, "%s", s->self);
      add_arg(c, "local");
      add_arg(c, "exec-in");
      add_arg(c, ns);
      add_arg(c, "--");
      for (int w = 0; w < nw; w++) {
        add_arg(c, words[w]);
        free(words[w]);
      }
      add_arg(c, "--ready-file");
      add_arg(c, c->ready);
      if (gr->data_dir) {
        char dd[4200];
        snprintf(dd, sizeof dd, "%s/embedding-%d", s->workdir, i);
        add_arg(c, "--data-dir");
        add_arg(c, dd);
      }
      char cmd[8192];
      size_t o = 0;
      for (int a = 5; a < c->argc && o < sizeof cmd - 1; a++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o, "%s%s", a > 5 ? " " : "", c->argv[a]);
      log_info("host name=%s host=%d ns=%s cmd=\"%s\"", c->name, h, ns, cmd);
    } else {
    add_arg(c, "--config");
    add_arg(c, s->job);
    if (gr->index_flag) {
      add_arg(c, gr->index_flag);
      add_arg(c, idx);
    }
    add_arg(c, "--ready-file");
    add_arg(c, c->ready);
    if (gr->listens) {
      add_arg(c, "--listen");
      c->listen_at = c->argc;
      add_arg(c, s->listen_next[0] ? s->listen_next : "127.0.0.1:0");
    }
    if (gr->data_dir) {
      char dd[4200];
      snprintf(dd, sizeof dd, "%s/embedding-%d", s->workdir, i);
      add_arg(c, "--data-dir");
      add_arg(c, dd);
    }
    }
    int rc = spawn(s, c);
    if (rc) {
      c->state = D_FAILED;
      say(s, "chanter local up: cannot start %s (%s): %s", c->name, c->path, err_str(rc));
      return ERR_UNAVAILABLE;
    }
    log_info("start name=%s pid=%d", c->name, (int)c->pid);
  }
  return 0;
}

static int start_group(sup_t *s, int g) {
  int rc, count = groups[g].count_key ? (int)cfg_int(s->cfg, groups[g].count_key) : 1;
  s->group = g;
  s->group_first = s->n;
  for (int i = 0; i < count; i++)
    if ((rc = add_child(s, g, i)) != 0) return rc;
  s->group_deadline = clock_mono_s() + READY_TIMEOUT_S;
  save_pids(s);
  save_status(s);
  return 0;
}

/* After group g is ready: give its addresses to the next ones. */
static int after_group(sup_t *s, int g) {
  int nd = (int)cfg_int(s->cfg, "dataprocs"), ne = (int)cfg_int(s->cfg, "embedding_servers"), rc = 0;
  if (g == 1) {
    /* on emulated hosts the job file has every address already (fixed ports) */
    if (!s->hp.n_hosts && ((rc = set_addrs(s, "cluster.dataproc", 0, nd)) ||
                           (rc = set_addrs(s, "cluster.embedding", nd, ne)) || (rc = write_job(s))))
      return rc;
    if (!*cfg_str(s->cfg, "oracle.state_dir")) { /* the oracle's copy of every checkpoint manifest */
      char kv[4300], err[512];
      snprintf(kv, sizeof kv, "oracle.state_dir=%s/oracle", s->workdir);
      if ((rc = cfg_set(s->cfg, kv, "chanter local up", err, sizeof err))) say(s, "chanter local up: %s", err);
      else rc = write_job(s);
    }
  } else if (g == 2 && !s->hp.n_hosts) {
    if (!(rc = set_addrs(s, "cluster.oracle", nd + ne, 1))) rc = write_job(s);
  }
  return rc;
}

/* The start-up's part of a tick. */
static void tick_start(sup_t *s, double now) {
  int pending = 0;
  for (int i = s->group_first; i < s->n; i++) {
    child_t *c = &s->ch[i];
    if (c->ever_ready) continue;
    if (supervise_ready_read(c->ready, &c->port, &c->mport) == 0) {
      c->ever_ready = 1;
      if (c->state == D_STARTING) c->state = D_UP;
      log_info("ready name=%s pid=%d port=%d metrics_port=%d", c->name, (int)c->pid, c->port, c->mport);
      continue;
    }
    if (c->state == D_FAILED) {
      say(s, "chanter local up: %s exited during start-up", c->name);
      report(s, "tail", c->logf);
      fail_start(s, ERR_UNAVAILABLE);
      return;
    }
    if (now > s->group_deadline) {
      say(s, "chanter local up: %s not ready after %.0f s", c->name, READY_TIMEOUT_S);
      report(s, "tail", c->logf);
      fail_start(s, ERR_DEADLINE);
      return;
    }
    pending++;
  }
  if (pending) return;
  save_pids(s);
  save_status(s);
  int rc = after_group(s, s->group);
  if (!rc && s->group + 1 < N_GROUPS) rc = start_group(s, s->group + 1);
  else if (!rc) {
    s->phase = P_RUN;
    save_status(s);
    log_info("cluster up daemons=%d restart_ms=%d restart_burst=%d restart_window_s=%d watchdog_ms=%d", s->n,
             s->restart_ms, s->burst, s->window_s, s->watchdog_ms);
    report(s, "up", NULL);
    close(s->report_fd);
    s->report_fd = -1;
    return;
  }
  if (rc) fail_start(s, rc);
}

/* ---- the stop */

static void close_all(sup_t *s) {
  s->phase = P_DONE;
  uv_timer_stop(&s->tick);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_signal_stop(&s->sigterm);
  uv_signal_stop(&s->sigint);
  uv_signal_stop(&s->sighup);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->sighup, NULL);
  if (s->notify_fd >= 0) {
    uv_poll_stop(&s->notify_poll);
    uv_close((uv_handle_t *)&s->notify_poll, NULL);
  }
  uv_stop(s->loop);
}

static void begin_stop(sup_t *s, int grace_ms) {
  if (s->phase == P_STOP || s->phase == P_DONE) return;
  s->phase = P_STOP;
  s->stop_deadline = clock_mono_s() + grace_ms / 1000.0;
  s->stop_grace_ms = grace_ms;
  s->stop_killed = 0;
  for (int i = s->n - 1; i >= 0; i--) {
    child_t *c = &s->ch[i];
    if (c->state == D_WAIT) c->state = D_STOPPED; /* its restart is off */
    if (!c->proc) continue;
    c->state = D_STOPPING;
    kill(c->pid, SIGTERM);
    kill(c->pid, SIGCONT); /* as systemd: a stopped daemon must see its SIGTERM */
  }
  log_info("stopping daemons=%d grace_ms=%d", s->n, grace_ms);
  save_status(s);
}

static void tick_stop(sup_t *s, double now) {
  int left = 0;
  for (int i = 0; i < s->n; i++) left += s->ch[i].proc != NULL;
  if (left && now > s->stop_deadline && !s->stop_killed) {
    for (int i = 0; i < s->n; i++) {
      child_t *c = &s->ch[i];
      if (!c->proc) continue;
      log_warn("chanter local: %s (pid %d) ignored SIGTERM for %d ms; killing it", c->name, (int)c->pid,
               s->stop_grace_ms);
      kill(c->pid, SIGKILL);
      s->killed++;
    }
    s->stop_killed = 1;
    s->kill_deadline = now + KILL_WAIT_S;
  }
  if (left && s->stop_killed && now > s->kill_deadline) {
    for (int i = 0; i < s->n; i++)
      if (s->ch[i].proc)
        log_error("%s (pid %d) is still there %.0f s after SIGKILL (stuck in the kernel?); leaving it", s->ch[i].name,
                  (int)s->ch[i].pid, KILL_WAIT_S);
    left = 0;
  }
  if (left) return;
  log_info("stopped daemons=%d killed=%d", s->n, s->killed);
  close_all(s);
  save_pids(s);
  save_status(s);
}

/* ---- the tick: what waits */

static void on_tick(uv_timer_t *t) {
  sup_t *s = t->data;
  double now = clock_mono_s();
  if (s->phase == P_STOP) {
    tick_stop(s, now);
    return;
  }
  for (int i = 0; i < s->n && s->phase != P_STOP; i++) {
    child_t *c = &s->ch[i];
    if (c->state == D_WAIT && now >= c->restart_at) restart(s, c);
    if (c->state == D_STARTING && c->ever_ready && c->proc) { /* restarted: ready again? */
      int port, mport;
      if (supervise_ready_read(c->ready, &port, &mport) == 0) {
        c->state = D_UP;
        if (c->listen_at && !c->port) { /* one SIGHUP started: its port from now on, the one its clients have */
          c->port = port;
          c->mport = mport;
        } else if (c->listen_at && port != c->port)
          log_warn("ready name=%s pid=%d on port %d, not its port %d: its clients will not find it", c->name,
                   (int)c->pid, port, c->port);
        char how[256];
        snprintf(how, sizeof how, "ready %d ms after the exit (%s)", (int)((now - c->exited_at) * 1000 + 0.5), c->last_exit);
        log_info("ready name=%s pid=%d port=%d since_exit_ms=%d", c->name, (int)c->pid, port,
                 (int)((now - c->exited_at) * 1000 + 0.5));
        event(s, "ready", c, c->pid, 0, how);
        save_status(s);
      }
    }
    if (s->watchdog_ms > 0 && c->proc && c->armed) {
      if (!c->wd_fired && now - c->last_ping > s->watchdog_ms / 1000.0) {
        char why[160];
        snprintf(why, sizeof why, "no WATCHDOG=1 for %d ms (local.watchdog_ms = %d)",
                 (int)((now - c->last_ping) * 1000), s->watchdog_ms);
        watchdog_fire(s, c, why);
      } else if (c->wd_fired && !c->wd_killed && now >= c->kill_at) {
        log_warn("watchdog name=%s pid=%d: still there %.0f s after SIGABRT; sending SIGKILL", c->name, (int)c->pid,
                 WD_KILL_S);
        kill(c->pid, SIGKILL);
        c->wd_killed = 1;
      }
    }
  }
  if (s->phase == P_START) tick_start(s, now);
  if (s->phase == P_STOP) return;
  if (s->status_dirty && now - s->status_at >= STATUS_EVERY_S) save_status(s);
}

static void on_signal(uv_signal_t *h, int signum) {
  sup_t *s = h->data;
  if (s->phase == P_STOP) {
    log_info("signal=%d while stopping; still stopping", signum);
    return;
  }
  log_info("stop requested signal=%d (SIG%s)", signum, sigabbrev_np(signum));
  if (s->phase == P_START) {
    say(s, "chanter local up: stopped by signal %d (SIG%s) during start-up", signum, sigabbrev_np(signum));
    report(s, "fail", NULL);
    s->rc = 1;
  }
  begin_stop(s, STOP_GRACE_MS);
}

/* SIGHUP (chanter scale --workdir): W/job.ini says how many trainers and
 * embedding servers the job has now; 0..N-1 of each run (the new ones
 * started, a new server at its address in cluster.embedding; one that
 * ended is started again), those beyond are not restarted (trainers exit
 * 0 once the oracle tells them; a server beyond the count, drained by the
 * scale before the CLI sends this, is stopped). */
static void on_sighup(uv_signal_t *h, int signum) {
  sup_t *s = h->data;
  (void)signum;
  cfg_t *c = NULL;
  char err[1024] = "", **addrs = NULL;
  size_t n_addrs = 0;
  int rc = s->phase == P_RUN ? cfg_create(&c) : -EAGAIN;
  if (!rc) rc = cfg_load_file(c, s->job, err, sizeof err);
  if (!rc) rc = cfg_list(c, "cluster.embedding", &addrs, &n_addrs);
  for (int g = 1; g < N_GROUPS && !rc; g += 2) { /* embedding, trainer */
    int n = (int)cfg_int(c, groups[g].count_key), have = 0;
    size_t kl = strlen(groups[g].kind);
    log_info("SIGHUP: %s says %s = %d; running %s 0..%d", s->job, groups[g].count_key, n, groups[g].kind, n - 1);
    for (int i = 0; i < s->n; i++) {
      child_t *ch = &s->ch[i];
      int idx = strncmp(ch->name, groups[g].kind, kl) || ch->name[kl] != '-' ? -1 : atoi(ch->name + kl + 1);
      if (idx < 0) continue;
      have++;
      ch->surplus = idx >= n;
      if (ch->surplus && g == 1 && ch->proc) kill(ch->pid, SIGTERM);
      if (!ch->surplus && !ch->proc && (ch->state == D_DONE || ch->state == D_GAVE_UP)) restart(s, ch);
    }
    for (int i = have; i < n && !rc; i++) {
      snprintf(s->listen_next, sizeof s->listen_next, "%s", g == 1 && (size_t)i < n_addrs ? addrs[i] : "");
      if ((rc = add_child(s, g, i)) != 0) break;
      s->ch[s->n - 1].ever_ready = 1; /* (started after the start-up: the restart policy applies to it at once) */
      s->ch[s->n - 1].exited_at = clock_mono_s();
    }
  }
  s->listen_next[0] = 0;
  cfg_list_free(addrs, n_addrs);
  cfg_destroy(c);
  if (rc) log_warn("SIGHUP: the daemons stay as they are: %s", rc == -EAGAIN ? "the cluster is not running" : err);
  save_pids(s);
  save_status(s);
}

/* ---- the whole */

int supervise_run(cfg_t *cfg, const char *workdir, const char *bindir, int report_fd) {
  sup_t s;
  memset(&s, 0, sizeof s);
  s.cfg = cfg;
  s.workdir = workdir;
  s.report_fd = report_fd;
  s.notify_fd = -1;
  s.restart_ms = (int)cfg_int(cfg, "local.restart_ms");
  s.burst = (int)cfg_int(cfg, "local.restart_burst");
  s.window_s = (int)cfg_int(cfg, "local.restart_window_s");
  s.watchdog_ms = (int)cfg_int(cfg, "local.watchdog_ms");
  snprintf(s.job, sizeof s.job, "%s/job.ini", workdir);
  snprintf(s.bindir, sizeof s.bindir, "%s", bindir);
  log_set_name("chanter-supervisor");
  log_level = LOG_INFO;
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  if (report_fd >= 0) fcntl(report_fd, F_SETFD, FD_CLOEXEC); /* the daemons must not hold `local up`'s pipe */

  char path[4200];
  snprintf(path, sizeof path, "%s/run/supervisor.pid", workdir);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
  }
  log_info("supervisor started pid=%d workdir=%s restart_ms=%d restart_burst=%d restart_window_s=%d watchdog_ms=%d",
           (int)getpid(), workdir, s.restart_ms, s.burst, s.window_s, s.watchdog_ms);

  s.ch = calloc(SUPERVISE_MAX, sizeof *s.ch);
  s.loop = uv_default_loop();
  char herr[1024];
  if (hosts_plan(cfg, workdir, &s.hp, herr, sizeof herr)) {
    say(&s, "chanter local up: %s", herr);
    report(&s, "fail", NULL);
    return 1;
  }
  ssize_t sl = readlink("/proc/self/exe", s.self, sizeof s.self - 1);
  s.self[sl > 0 ? sl : 0] = 0;
  char notify[4300] = "";
  int rc = supervise_notify_open(workdir, s.notify_path, sizeof s.notify_path, notify, sizeof notify, &s.notify_fd);
  if (rc) {
    log_warn("no notify socket in %s/run (%s): the daemons run without STATUS and watchdog", workdir, err_str(rc));
    notify[0] = 0;
  } else if (s.hp.n_hosts && notify[0] == '@') { /* an abstract name belongs to this network namespace */
    log_warn("the path %s/run/notify is too long for a unix socket and an abstract one does not reach the emulated "
             "hosts' namespaces: the daemons run without STATUS and watchdog (use a shorter work dir)", workdir);
    notify[0] = 0;
  }
  s.env = supervise_env(notify, s.watchdog_ms);
  if (!s.ch || !s.env) {
    say(&s, "chanter local up: out of memory");
    report(&s, "fail", NULL);
    return 1;
  }
  uv_timer_init(s.loop, &s.tick);
  uv_signal_init(s.loop, &s.sigterm);
  uv_signal_init(s.loop, &s.sigint);
  uv_signal_init(s.loop, &s.sighup);
  s.tick.data = s.sigterm.data = s.sigint.data = s.sighup.data = &s;
  uv_signal_start(&s.sigterm, on_signal, SIGTERM);
  uv_signal_start(&s.sigint, on_signal, SIGINT);
  uv_signal_start(&s.sighup, on_sighup, SIGHUP);
  if (s.notify_fd >= 0) {
    uv_poll_init(s.loop, &s.notify_poll, s.notify_fd);
    s.notify_poll.data = &s;
    uv_poll_start(&s.notify_poll, UV_READABLE, on_notify);
  }
  uv_timer_start(&s.tick, on_tick, TICK_MS, TICK_MS);
  s.phase = P_START;
  if ((rc = start_group(&s, 0)) != 0) fail_start(&s, rc);
  uv_run(s.loop, UV_RUN_DEFAULT);
  uv_run(s.loop, UV_RUN_NOWAIT); /* the closes */

  if (s.notify_fd >= 0) close(s.notify_fd);
  if (s.notify_path[0]) unlink(s.notify_path);
  if (s.report_fd >= 0) close(s.report_fd);
  unlink(path);
  for (int i = 0; i < s.n; i++) {
    for (int a = 1; a < s.ch[i].argc; a++) free(s.ch[i].argv[a]);
    free(s.ch[i].recent);
  }
  for (char **e = s.env; *e; e++) free(*e);
  free(s.env);
  free(s.ch);
  log_info("supervisor exits status=%d", s.rc);
  return s.rc;
}
