/*
 * chanter local up|down|status: a whole cluster on this machine.
 *
 *   chanter [--config job.ini] [--set k=v ...] local up --workdir DIR
 *
 * starts the job's data processors, embedding servers, the oracle and the
 * trainers on 127.0.0.1 with ports the kernel picks (each daemon reports
 * its port through --ready-file), in dependency order, and writes
 * DIR/job.ini: the effective configuration with every cluster.* address
 * filled in, which is what `chanter --config DIR/job.ini ...` (and
 * `chanter train --workdir DIR`) then use.  Logs go to DIR/logs/, pids to
 * DIR/pids.  A daemon that dies or does not become ready in time stops the
 * whole start-up, tears down what was started and prints its log's tail.
 * `local down` stops everything (SIGTERM, then SIGKILL after a grace
 * period) and leaves no process behind; `local status` says who is alive.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "err.h"
#include "orc.h"

typedef struct proc_s {
  char name[64];
  pid_t pid;
  int port;
} proc_t;

static void self_dir(char *out, size_t n) {
  ssize_t l = readlink("/proc/self/exe", out, n - 1);
  out[l > 0 ? l : 0] = 0;
  char *s = strrchr(out, '/');
  if (s) *s = 0;
}


/* Starts one daemon detached (own session, outlives this command). */
static pid_t spawn(const char *dir, const char *bin, char *const args[], const char *logf) {
  char path[8300];
  snprintf(path, sizeof path, "%s/%s", dir, bin);
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, 0);
    char *argv[40];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(path, argv);
    _exit(127);
  }
  return pid;
}

static int read_ready_port(const char *ready) {
  FILE *f = fopen(ready, "r");
  if (!f) return -1;
  char buf[512] = "";
  size_t r = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[r] = 0;
  char *p = strstr(buf, "\"rpc_port\": ");
  return p ? atoi(p + 12) : 0; /* ready, serving no RPC of its own */
}

static int save_pids(const char *workdir, proc_t *ps, int n) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/pids", workdir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -errno;
  for (int i = 0; i < n; i++) fprintf(f, "%s %d %d\n", ps[i].name, (int)ps[i].pid, ps[i].port);
  if (fclose(f)) return -errno;
  return rename(tmp, path) ? -errno : 0;
}

static int load_pids(const char *workdir, proc_t *ps, int cap) {
  char path[4096];
  snprintf(path, sizeof path, "%s/pids", workdir);
  FILE *f = fopen(path, "r");
  if (!f) return -errno;
  int n = 0, pid, port;
  char name[64];
  while (n < cap && fscanf(f, "%63s %d %d", name, &pid, &port) == 3) {
    snprintf(ps[n].name, sizeof ps[n].name, "%s", name);
    ps[n].pid = pid;
    ps[n].port = port;
    n++;
  }
  fclose(f);
  return n;
}

/* A zombie is dead: in a container whose init does not reap orphans (no
 * tini), a daemon killed with SIGKILL after `local up` exited stays a
 * zombie, and `local up` must not take it for a running cluster. */
static int alive(pid_t pid) {
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

/* SIGTERM in reverse start order, wait up to grace_ms, then SIGKILL. */
static int stop_all(proc_t *ps, int n, int grace_ms) {
  for (int i = n - 1; i >= 0; i--)
    if (alive(ps[i].pid)) kill(ps[i].pid, SIGTERM);
  double until = bench_now() + grace_ms / 1000.0;
  int left;
  do {
    left = 0;
    for (int i = 0; i < n; i++) left += alive(ps[i].pid);
    if (left) usleep(20000);
  } while (left && bench_now() < until);
  int killed = 0;
  for (int i = 0; i < n; i++)
    if (alive(ps[i].pid)) {
      fprintf(stderr, "chanter local: %s (pid %d) ignored SIGTERM for %d ms; killing it\n", ps[i].name, (int)ps[i].pid,
              grace_ms);
      kill(ps[i].pid, SIGKILL);
      killed++;
    }
  for (int i = 0; i < n; i++) waitpid(ps[i].pid, NULL, WNOHANG);
  return killed;
}

/* Writes the effective configuration to path (through path.tmp and a
 * rename) and reads it back first as every daemon will: a file they would
 * refuse stops `local up` here, saying why, instead of as a daemon that
 * exits during start-up. */
static int write_job(const cfg_t *cfg, const char *path) {
  char tmp[4200], err[1024] = "out of memory";
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -errno;
  fprintf(f, "; written by chanter local up: the job's configuration with the cluster's addresses\n");
  cfg_dump(cfg, f, 0);
  if (fclose(f)) return -errno;
  cfg_t *back = NULL;
  int rc = cfg_create(&back);
  if (!rc && (rc = cfg_load_file(back, tmp, err, sizeof err)) == 0) rc = cfg_validate(back, err, sizeof err);
  cfg_destroy(back);
  if (rc) {
    fprintf(stderr, "chanter local up: the job file written for the daemons does not read back: %s\n", err);
    return rc;
  }
  return rename(tmp, path) ? -errno : 0;
}

#define MAXP 512

typedef struct up_s {
  const char *workdir;
  char bindir[4096], job[4096];
  proc_t ps[MAXP];
  int n;
} up_t;

/* Starts group members [first, first+count) named kind-i and waits for all
 * their ready files; fills ports. */
static int start_group(up_t *u, const char *kind, const char *bin, int count, const char *index_flag,
                       int (*extra)(up_t *, int, char **, int)) {
  int first = u->n;
  for (int i = 0; i < count; i++) {
    if (u->n >= MAXP) return -E2BIG;
    proc_t *p = &u->ps[u->n++];
    snprintf(p->name, sizeof p->name, "%s-%d", kind, i);
    char ready[4200], logf[4200], idx[16];
    snprintf(ready, sizeof ready, "%s/run/%s.ready", u->workdir, p->name);
    snprintf(logf, sizeof logf, "%s/logs/%s.log", u->workdir, p->name);
    snprintf(idx, sizeof idx, "%d", i);
    unlink(ready);
    char *args[24];
    int a = 0;
    args[a++] = "--config";
    args[a++] = u->job;
    if (index_flag) {
      args[a++] = (char *)index_flag;
      args[a++] = idx;
    }
    args[a++] = "--ready-file";
    args[a++] = ready;
    if (extra) a = extra(u, i, args, a);
    args[a] = NULL;
    p->pid = spawn(u->bindir, bin, args, logf);
  }
  double until = bench_now() + 60;
  for (int i = first; i < u->n; i++) {
    proc_t *p = &u->ps[i];
    char ready[4200], logf[4200];
    snprintf(ready, sizeof ready, "%s/run/%s.ready", u->workdir, p->name);
    snprintf(logf, sizeof logf, "%s/logs/%s.log", u->workdir, p->name);
    while ((p->port = read_ready_port(ready)) < 0) {
      if (!alive(p->pid)) {
        fprintf(stderr, "chanter local up: %s exited during start-up\n", p->name);
        cli_tail_file(logf);
        return ERR_UNAVAILABLE;
      }
      if (bench_now() > until) {
        fprintf(stderr, "chanter local up: %s not ready after 60 s\n", p->name);
        cli_tail_file(logf);
        return ERR_DEADLINE;
      }
      usleep(20000);
    }
  }
  return 0;
}

static char g_datadir[MAXP][4200];
static int emb_extra(up_t *u, int i, char **args, int a) {
  snprintf(g_datadir[i], sizeof g_datadir[i], "%s/embedding-%d", u->workdir, i);
  args[a++] = "--listen";
  args[a++] = "127.0.0.1:0";
  args[a++] = "--data-dir";
  args[a++] = g_datadir[i];
  return a;
}
static int listen_extra(up_t *u, int i, char **args, int a) {
  args[a++] = "--listen";
  args[a++] = "127.0.0.1:0";
  return a;
}

static int set_addrs(cfg_t *cfg, const char *key, proc_t *ps, int n) {
  char kv[8192], err[512];
  int o = snprintf(kv, sizeof kv, "%s=", key);
  for (int i = 0; i < n && o < (int)sizeof kv - 32; i++) o += snprintf(kv + o, sizeof kv - (size_t)o, "%s127.0.0.1:%d", i ? "," : "", ps[i].port);
  int rc = cfg_set(cfg, kv, "chanter local up", err, sizeof err);
  if (rc) fprintf(stderr, "chanter local up: %s\n", err);
  return rc;
}

static int local_up(cli_t *cli, const char *workdir) {
  up_t u = {.workdir = workdir};
  char path[4200];
  mkdir(workdir, 0755);
  snprintf(path, sizeof path, "%s/logs", workdir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/run", workdir);
  mkdir(path, 0755);
  snprintf(u.job, sizeof u.job, "%s/job.ini", workdir);
  self_dir(u.bindir, sizeof u.bindir);
  proc_t old[MAXP];
  int n_old = load_pids(workdir, old, MAXP);
  for (int i = 0; i < n_old; i++)
    if (alive(old[i].pid)) {
      fprintf(stderr, "chanter local up: %s already runs a cluster (%s, pid %d alive); run `chanter local down --workdir %s` first\n",
              workdir, old[i].name, (int)old[i].pid, workdir);
      return 1;
    }
  cfg_t *cfg = cli->cfg;
  int rc = write_job(cfg, u.job);
  if (rc) {
    fprintf(stderr, "chanter local up: cannot write %s: %s\n", u.job, err_str(rc));
    return 1;
  }
  int nd = (int)cfg_int(cfg, "dataprocs"), ne = (int)cfg_int(cfg, "embedding_servers"), nt = (int)cfg_int(cfg, "trainers");
  if ((rc = start_group(&u, "dataproc", "chanter-dataproc", nd, "--index", listen_extra)) ||
      (rc = start_group(&u, "embedding", "chanter-embedding", ne, "--shard", emb_extra)))
    goto fail;
  if ((rc = set_addrs(cfg, "cluster.dataproc", u.ps, nd)) || (rc = set_addrs(cfg, "cluster.embedding", u.ps + nd, ne)) ||
      (rc = write_job(cfg, u.job)))
    goto fail;
  if (!*cfg_str(cfg, "oracle.state_dir")) { /* the oracle's copy of every checkpoint manifest */
    char kv[4300], e2[512];
    snprintf(kv, sizeof kv, "oracle.state_dir=%s/oracle", workdir);
    if ((rc = cfg_set(cfg, kv, "chanter local up", e2, sizeof e2)) || (rc = write_job(cfg, u.job))) goto fail;
  }
  if ((rc = start_group(&u, "oracle", "chanter-oracle", 1, NULL, listen_extra))) goto fail;
  if ((rc = set_addrs(cfg, "cluster.oracle", u.ps + nd + ne, 1)) || (rc = write_job(cfg, u.job))) goto fail;
  if ((rc = start_group(&u, "trainer", "chanter-trainer", nt, "--rank", NULL))) goto fail;
  if ((rc = save_pids(workdir, u.ps, u.n)) != 0) goto fail;
  if (cli->json) {
    printf("{\"workdir\": \"%s\", \"config\": \"%s\", \"daemons\": [", workdir, u.job);
    for (int i = 0; i < u.n; i++)
      printf("%s{\"name\": \"%s\", \"pid\": %d, \"port\": %d}", i ? ", " : "", u.ps[i].name, (int)u.ps[i].pid, u.ps[i].port);
    printf("]}\n");
  } else {
    for (int i = 0; i < u.n; i++)
      printf("%-14s pid %-7d %s\n", u.ps[i].name, (int)u.ps[i].pid,
             u.ps[i].port > 0 ? (snprintf(path, sizeof path, "127.0.0.1:%d", u.ps[i].port), path) : "");
    printf("cluster up: %d data processor(s), %d embedding server(s), oracle, %d trainer(s)\n"
           "config: %s   logs: %s/logs/\n",
           nd, ne, nt, u.job, workdir);
  }
  return 0;
fail:
  fprintf(stderr, "chanter local up: start-up failed (%s); stopping what was started\n", err_str(rc));
  save_pids(workdir, u.ps, u.n);
  stop_all(u.ps, u.n, 5000);
  return 1;
}

static int local_down(cli_t *cli, const char *workdir) {
  proc_t ps[MAXP];
  int n = load_pids(workdir, ps, MAXP);
  if (n < 0) {
    fprintf(stderr, "chanter local down: no cluster in %s (no pids file)\n", workdir);
    return 1;
  }
  int was = 0;
  for (int i = 0; i < n; i++) was += alive(ps[i].pid);
  int killed = stop_all(ps, n, 15000);
  int left = 0;
  for (int i = 0; i < n; i++) left += alive(ps[i].pid);
  char path[4200];
  snprintf(path, sizeof path, "%s/pids", workdir);
  if (!left) unlink(path);
  if (cli->json)
    printf("{\"stopped\": %d, \"killed\": %d, \"left\": %d}\n", was, killed, left);
  else
    printf("cluster down: %d daemon(s) stopped%s\n", was, killed ? " (some had to be killed)" : "");
  return left ? 1 : 0;
}

static int local_status(cli_t *cli, const char *workdir) {
  proc_t ps[MAXP];
  int n = load_pids(workdir, ps, MAXP);
  if (n < 0) {
    fprintf(stderr, "chanter local status: no cluster in %s\n", workdir);
    return 1;
  }
  int up = 0;
  if (cli->json) printf("{\"daemons\": [");
  for (int i = 0; i < n; i++) {
    int a = alive(ps[i].pid);
    up += a;
    if (cli->json)
      printf("%s{\"name\": \"%s\", \"pid\": %d, \"port\": %d, \"alive\": %s}", i ? ", " : "", ps[i].name, (int)ps[i].pid,
             ps[i].port, a ? "true" : "false");
    else
      printf("%-14s pid %-7d %-6s %s\n", ps[i].name, (int)ps[i].pid, a ? "up" : "DOWN",
             ps[i].port > 0 ? "" : "");
  }
  if (cli->json) printf("], \"alive\": %d, \"total\": %d}\n", up, n);
  else printf("%d of %d daemons alive\n", up, n);
  return up == n ? 0 : 1;
}

int cmd_local(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected up, down or status, with --workdir DIR");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (strcmp(sub, "up") && strcmp(sub, "down") && strcmp(sub, "status"))
    return cli_usage_error(cli, "unknown subcommand '%s'", sub);
  const char *workdir = cli_opt(cli, "--workdir");
  if (cli_done(cli, sub)) return 2;
  if (!workdir)
    return cli_usage_error(cli, "--workdir DIR is required (the cluster's config, logs and pids live there)");
  if (!strcmp(sub, "up")) return local_up(cli, workdir);
  if (!strcmp(sub, "down")) return local_down(cli, workdir);
  return local_status(cli, workdir);
}
