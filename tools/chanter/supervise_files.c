/*
 * supervise_files: the files of a local cluster's work directory W that
 * the supervisor writes and the CLI reads (supervise.h lists them): W/pids,
 * W/run/status, W/run/events, the daemons' ready files, W/job.ini, and
 * W/run/supervisor.pid's check, and W/run/notify, the daemons' sd_notify
 * socket (with their environment).  Their formats live here, both sides of
 * each; supervise.c, the supervisor's loop, decides when they are written.
 * Every file replaced is replaced durably (fsio_replace); W/run/events is
 * appended to.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "fsio.h"
#include "json.h"
#include "supervise.h"

extern char **environ;

int supervise_pids_save(const char *workdir, const supervise_proc_t *ps, int n, char *why, size_t why_len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/pids", workdir);
  fsio_tmp_t t;
  int rc = fsio_replace_open(&t, path, 0666, why, why_len);
  if (rc) return rc;
  for (int i = 0; i < n; i++) fprintf(t.f, "%s %d %d\n", ps[i].name, (int)ps[i].pid, ps[i].port);
  return fsio_replace_commit(&t, true, why, why_len);
}

int supervise_pids_load(const char *workdir, supervise_proc_t *ps, int cap) {
  char path[4200], line[512];
  snprintf(path, sizeof path, "%s/pids", workdir);
  FILE *f = fopen(path, "r");
  if (!f) return -errno;
  int n = 0, pid, port;
  char name[64];
  while (n < cap && fgets(line, sizeof line, f))
    if (sscanf(line, "%63s %d %d", name, &pid, &port) == 3) {
      snprintf(ps[n].name, sizeof ps[n].name, "%s", name);
      ps[n].pid = pid;
      ps[n].port = port;
      n++;
    }
  fclose(f);
  return n;
}

int supervise_alive(pid_t pid) {
  if (pid <= 0) return 0;
  waitpid(pid, NULL, WNOHANG); /* reap if it is our child */
  if (kill(pid, 0) != 0) return 0;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": the state follows the command's closing parenthesis */
  return !(p && p[1] == ' ' && p[2] == 'Z');
}

pid_t supervise_running(const char *workdir) {
  char path[4200], buf[4096];
  snprintf(path, sizeof path, "%s/run/supervisor.pid", workdir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int pid = 0;
  if (fscanf(f, "%d", &pid) != 1) pid = 0;
  fclose(f);
  if (!supervise_alive(pid)) return 0;
  /* the pid may have been reused since: it must be a supervisor */
  snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
  if (!(f = fopen(path, "r"))) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
    if (!strcmp(buf + i, "supervise")) return pid;
  return 0;
}

/* the next tab-separated field of *p ("-" is empty) into out */
static void field(char **p, char *out, size_t n) {
  char *s = *p, *t = strchr(s, '\t');
  if (t) *t = 0;
  snprintf(out, n, "%s", strcmp(s, "-") ? s : "");
  *p = t ? t + 1 : s + strlen(s);
}

int supervise_status_read(const char *workdir, supervise_info_t *info, supervise_entry_t *es, int cap) {
  char path[4200], line[1024], f[256];
  snprintf(path, sizeof path, "%s/run/status", workdir);
  FILE *fp = fopen(path, "r");
  if (!fp) return -errno;
  memset(info, 0, sizeof *info);
  int n = 0;
  while (fgets(line, sizeof line, fp)) {
    line[strcspn(line, "\n")] = 0;
    char *p = line;
    field(&p, f, sizeof f);
    if (!strcmp(f, "supervisor")) {
      field(&p, f, sizeof f), info->pid = atoi(f);
      field(&p, info->phase, sizeof info->phase);
      field(&p, f, sizeof f), info->killed = atoi(f);
      field(&p, f, sizeof f), info->restart_ms = atoi(f);
      field(&p, f, sizeof f), info->watchdog_ms = atoi(f);
      continue;
    }
    if (n >= cap || !*f) continue;
    supervise_entry_t *e = &es[n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%.63s", f);
    field(&p, f, sizeof f), e->pid = atoi(f);
    field(&p, f, sizeof f), e->port = atoi(f);
    field(&p, e->state, sizeof e->state);
    field(&p, f, sizeof f), e->restarts = atoi(f);
    field(&p, e->last_exit, sizeof e->last_exit);
    field(&p, e->status, sizeof e->status);
  }
  fclose(fp);
  return n;
}

/* free text for a tab-separated field */
static void tsv(FILE *f, const char *text) {
  if (!*text) {
    fputs("\t-", f);
    return;
  }
  fputc('\t', f);
  for (const char *p = text; *p; p++) fputc(*p == '\t' || *p == '\n' || *p == '\r' ? ' ' : *p, f);
}

int supervise_status_write(const char *workdir, const supervise_info_t *info, const supervise_entry_t *es, int n,
                           char *why, size_t why_len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/run/status", workdir);
  fsio_tmp_t t;
  int rc = fsio_replace_open(&t, path, 0666, why, why_len);
  if (rc) return rc;
  fprintf(t.f, "supervisor\t%d\t%s\t%d\t%d\t%d\n", (int)info->pid, info->phase, info->killed, info->restart_ms,
          info->watchdog_ms);
  for (int i = 0; i < n; i++) {
    const supervise_entry_t *e = &es[i];
    fprintf(t.f, "%s\t%d\t%d\t%s\t%d", e->name, (int)e->pid, e->port, e->state, e->restarts);
    tsv(t.f, e->last_exit);
    tsv(t.f, e->status);
    fputc('\n', t.f);
  }
  return fsio_replace_commit(&t, true, why, why_len);
}

int supervise_event_append(const char *workdir, const char *ev, const char *name, pid_t pid, pid_t new_pid,
                           const char *how, int restarts) {
  char path[4200], line[1024], h[512], np[32];
  snprintf(path, sizeof path, "%s/run/events", workdir);
  json_escape(h, sizeof h, how);
  if (new_pid > 0) snprintf(np, sizeof np, "%d", (int)new_pid);
  else snprintf(np, sizeof np, "null");
  int n = snprintf(line, sizeof line,
                   "{\"t\": %.3f, \"event\": \"%s\", \"name\": \"%s\", \"pid\": %d, \"new_pid\": %s, \"how\": \"%s\", "
                   "\"restarts\": %d}\n",
                   clock_wall_s(), ev, name, (int)pid, np, h, restarts);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int rc = fd < 0 || write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0 ? -errno : 0;
  if (fd >= 0) close(fd);
  return rc;
}

int supervise_ready_read(const char *path, int *port, int *mport) {
  char *buf = NULL;
  if (fsio_read_all(path, 0, &buf, NULL, NULL, 0) != 0) return -1;
  int64_t p = 0, m = 0; /* no rpc_port: ready, serving no RPC of its own */
  json_get_i64(buf, "rpc_port", &p);
  json_get_i64(buf, "metrics_port", &m);
  free(buf);
  *port = (int)p;
  *mport = (int)m;
  return 0;
}

/* The job file, read back first as every daemon will (supervise.h). */
int supervise_write_job(const cfg_t *cfg, const char *path, char *err, size_t err_len) {
  fsio_tmp_t t;
  int rc = fsio_replace_open(&t, path, 0666, err, err_len);
  if (rc) return rc;
  fprintf(t.f, "; written by chanter local up: the job's configuration with the cluster's addresses\n");
  cfg_dump(cfg, t.f, 0);
  if (fflush(t.f) != 0) rc = -(errno ? errno : EIO);
  cfg_t *back = NULL;
  if (!rc && (rc = cfg_create(&back)) != 0) snprintf(err, err_len, "out of memory");
  if (!rc && (rc = cfg_load_file(back, t.tmp, err, err_len)) == 0) rc = cfg_validate(back, err, err_len);
  cfg_destroy(back);
  int crc = fsio_replace_commit(&t, rc == 0, rc ? NULL : err, rc ? 0 : err_len);
  return rc ? rc : crc;
}

/* The socket the daemons' sd_notify sends to: W/run/notify (an absolute
 * path: libsystemd refuses relative ones), or an abstract name when that
 * is longer than a sockaddr_un holds.  0, or a negative errno (the cluster
 * then runs without STATUS and watchdog). */
int supervise_notify_open(const char *workdir, char *path, size_t path_len, char *env_value, size_t n, int *fd_out) {
  char dir[4200], abs[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/run", workdir);
  if (!realpath(dir, abs)) return -errno;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  socklen_t len;
  if (strlen(abs) + sizeof "/notify" <= sizeof a.sun_path) {
    snprintf(a.sun_path, sizeof a.sun_path, "%s/notify", abs);
    snprintf(path, path_len, "%s", a.sun_path);
    snprintf(env_value, n, "%s", a.sun_path);
    unlink(a.sun_path);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(a.sun_path) + 1);
  } else {
    char name[64];
    snprintf(name, sizeof name, "chanter-supervisor-%d/notify", (int)getpid());
    memcpy(a.sun_path + 1, name, strlen(name)); /* sun_path[0] = 0: abstract */
    snprintf(env_value, n, "@%s", name);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
  }
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
  if (fd < 0) return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) || bind(fd, (struct sockaddr *)&a, len)) {
    int e = -errno;
    close(fd);
    path[0] = 0;
    return e;
  }
  *fd_out = fd;
  return 0;
}

/* The daemons' environment: ours, with NOTIFY_SOCKET and WATCHDOG_USEC
 * set and WATCHDOG_PID unset (libsystemd's sd_watchdog_enabled then takes
 * the watchdog to be for the process that reads it: the daemon), and
 * without JOURNAL_STREAM (their stderr is a log file: keep the times). */
char **supervise_env(const char *notify, int watchdog_ms) {
  size_t n = 0;
  while (environ[n]) n++;
  char **e = calloc(n + 3, sizeof *e);
  if (!e) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) && strncmp(environ[i], "WATCHDOG_USEC=", 14) &&
        strncmp(environ[i], "WATCHDOG_PID=", 13) && strncmp(environ[i], "JOURNAL_STREAM=", 15))
      e[k++] = strdup(environ[i]);
  if (*notify) {
    if (asprintf(&e[k], "NOTIFY_SOCKET=%s", notify) >= 0) k++;
    if (watchdog_ms > 0 && asprintf(&e[k], "WATCHDOG_USEC=%lld", (long long)watchdog_ms * 1000) >= 0) k++;
  }
  e[k] = NULL;
  return e;
}
