/*
 * chanter local up|down|status: a whole cluster on this machine, under a
 * supervisor that restarts the daemons that fail.
 *
 *   chanter [--config job.ini] [--set k=v ...] local up --workdir DIR
 *
 * writes DIR/job.ini (the effective configuration) and starts the
 * supervisor (supervise.c: `chanter --config DIR/job.ini local supervise
 * --workdir DIR`, a process of its own session, logging to
 * DIR/logs/supervisor.log), which starts the job's data processors,
 * embedding servers, the oracle and the trainers on 127.0.0.1 with ports
 * the kernel picks (each daemon reports its port through --ready-file), in
 * dependency order, and fills every cluster.* address into DIR/job.ini:
 * what `chanter --config DIR/job.ini ...` (and `chanter train --workdir
 * DIR`) then use.  `local up` waits until the supervisor reports every
 * daemon ready, prints them and exits; the supervisor stays, restarting a
 * daemon that fails (local.restart_ms, local.restart_burst,
 * local.restart_window_s) or falls silent (local.watchdog_ms).  A daemon
 * that dies or does not become ready in time stops the whole start-up:
 * what was started is stopped and its log's tail printed.  Logs go to
 * DIR/logs/, pids to DIR/pids.
 *
 * `local up --hosts N|auto --link RATE,DELAY[,LOSS]` (local.hosts,
 * local.link) runs the daemons on emulated hosts instead: network
 * namespaces on a bridge of their own, with fixed addresses filled into
 * DIR/job.ini before the supervisor starts (hosts.h); `local down` removes
 * them after the daemons.
 *
 * `local down` asks the supervisor to stop everything (SIGTERM, then
 * SIGKILL after a grace period) and waits for it; `local status` says who
 * is alive, how often each was restarted and why it last exited.  Both
 * also work on a cluster without a (live) supervisor, from DIR/pids.
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
#include "clock.h"
#include "err.h"
#include "hosts.h"
#include "json.h"
#include "supervise.h"

#define DOWN_GRACE_MS 15000 /* SIGTERM, then SIGKILL: the supervisor's and ours */

static void self_exe(char *out, size_t n) {
  ssize_t l = readlink("/proc/self/exe", out, n - 1);
  out[l > 0 ? l : 0] = 0;
}

static void self_dir(char *out, size_t n) {
  self_exe(out, n);
  char *s = strrchr(out, '/');
  if (s) *s = 0;
}

/* SIGTERM (and SIGCONT, for a stopped one) in reverse start order, wait up
 * to grace_ms, then SIGKILL: for a cluster whose supervisor is gone. */
static int stop_all(supervise_proc_t *ps, int n, int grace_ms) {
  for (int i = n - 1; i >= 0; i--)
    if (supervise_alive(ps[i].pid)) {
      kill(ps[i].pid, SIGTERM);
      kill(ps[i].pid, SIGCONT);
    }
  double until = clock_mono_s() + grace_ms / 1000.0;
  int left;
  do {
    left = 0;
    for (int i = 0; i < n; i++) left += supervise_alive(ps[i].pid);
    if (left) usleep(20000);
  } while (left && clock_mono_s() < until);
  int killed = 0;
  for (int i = 0; i < n; i++)
    if (supervise_alive(ps[i].pid)) {
      fprintf(stderr, "chanter local: %s (pid %d) ignored SIGTERM for %d ms; killing it\n", ps[i].name, (int)ps[i].pid,
              grace_ms);
      kill(ps[i].pid, SIGKILL);
      killed++;
    }
  for (int i = 0; i < n; i++) waitpid(ps[i].pid, NULL, WNOHANG);
  return killed;
}

/* Writes the effective configuration to path (supervise_write_job: a
 * durable replace) and reads it back first as every daemon will: a file
 * they would refuse stops `local up` here, saying why, instead of as a
 * daemon that exits during start-up. */
static int write_job(const cfg_t *cfg, const char *path) {
  char err[1024];
  int rc = supervise_write_job(cfg, path, err, sizeof err);
  if (rc && (rc <= -4096 || rc == -ENOMEM))
    fprintf(stderr, "chanter local up: the job file written for the daemons does not read back: %s\n", err);
  return rc;
}

static volatile sig_atomic_t g_interrupted;
static void on_interrupt(int sig) { g_interrupted = sig; }

/* Starts the supervisor (its own session, stdout and stderr to its log,
 * the pipe's write end as fd 3): its pid, or -1. */
static pid_t start_supervisor(const char *workdir, const char *job, int pipe_w) {
  char exe[4096], logf[4200];
  self_exe(exe, sizeof exe);
  snprintf(logf, sizeof logf, "%s/logs/supervisor.log", workdir);
  pid_t pid = fork();
  if (pid != 0) return pid;
  setsid();
  if (pipe_w != 3) dup2(pipe_w, 3); /* first: it may be any fd, even 0 when stdin was closed */
  int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  int nul = open("/dev/null", O_RDONLY);
  if (nul >= 0) dup2(nul, 0);
  for (int i = 4; i < 1024; i++) close(i); /* nothing of this command's but the pipe */
  unsetenv("JOURNAL_STREAM"); /* its stderr (and the daemons') is a file now: log lines keep their time */
  char *argv[] = {exe, "--config", (char *)job, "local", "supervise", "--workdir", (char *)workdir,
                  "--report-fd", "3", NULL};
  execv(exe, argv);
  fprintf(stderr, "chanter local up: cannot run the supervisor %s: %s\n", exe, strerror(errno));
  _exit(127);
}

/* Where p listens: "ADDR:PORT" (ADDR from W/run/hosts on emulated hosts,
 * else 127.0.0.1), the host alone for a trainer on one, or "". */
static const char *daemon_addr(const char *workdir, const supervise_proc_t *p, char *out, size_t n) {
  char path[4200], line[512], name[64], ns[128], a[64] = "";
  int host;
  snprintf(path, sizeof path, "%s/run/hosts", workdir);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "%63s %d %127s %63s", name, &host, ns, a) == 4 && !strcmp(name, p->name)) break;
    else a[0] = 0;
  if (f) fclose(f);
  if (p->port > 0) snprintf(out, n, "%s:%d", *a ? a : "127.0.0.1", p->port);
  else snprintf(out, n, "%s", a);
  return out;
}

/* Mutual TLS unless --insecure or the job names its own certificates: a
 * CA and a certificate per role in W/certs (made once, kept across up and
 * down), named by the job file the daemons read ({role} in the paths:
 * each daemon presents its own, the CLI the admin one). */
static int local_tls(cli_t *cli, const char *workdir, int insecure) {
  if (insecure || cfg_tls_on(cli->cfg)) return 0;
  char dir[4200], abs[4096], kv[4400], err[512];
  if (!realpath(workdir, abs)) snprintf(abs, sizeof abs, "%s", workdir);
  snprintf(dir, sizeof dir, "%s/certs", abs);
  if (certs_local(dir)) {
    fprintf(stderr, "chanter local up: cannot make the cluster's certificates in %s (--insecure runs without TLS)\n",
            dir);
    return 1;
  }
  static const char *kvs[][2] = {{"tls.ca_file", "ca.pem"}, {"tls.cert_file", "{role}.pem"}, {"tls.key_file", "{role}.key"}};
  for (size_t i = 0; i < 3; i++) {
    snprintf(kv, sizeof kv, "%s=%s/%s", kvs[i][0], dir, kvs[i][1]);
    if (cfg_set(cli->cfg, kv, "chanter local up", err, sizeof err)) {
      fprintf(stderr, "chanter local up: %s\n", err);
      return 1;
    }
  }
  return 0;
}

/* Emulated hosts (hosts.h): the plan checked, root checked, stale
 * namespaces of this W removed, the cluster's addresses and TLS settings
 * in the job, the namespaces made.  0, or 1 after saying why. */
static int local_hosts(cli_t *cli, const char *workdir, int insecure, hosts_plan_t *hp) {
  char err[1024];
  if (hosts_plan(cli->cfg, workdir, hp, err, sizeof err)) {
    fprintf(stderr, "chanter local up: %s\n", err);
    return 1;
  }
  if (!hp->n_hosts) return 0;
  int stale = hosts_down(workdir);
  if (stale < 0) return 1;
  if (stale) fprintf(stderr, "chanter local up: removed %d network namespace(s) left by an earlier cluster of %s\n", stale, workdir);
  if (hosts_set_cluster(hp, cli->cfg, err, sizeof err)) {
    fprintf(stderr, "chanter local up: %s\n", err);
    return 1;
  }
  /* off loopback: TLS, with the certificates' name (DNS:localhost), or plaintext when asked for */
  const char *kv = insecure ? "tls.insecure=true" : cfg_tls_on(cli->cfg) && !*cfg_str(cli->cfg, "tls.server_name") ? "tls.server_name=localhost" : NULL;
  if (kv && cfg_set(cli->cfg, kv, "chanter local up --hosts", err, sizeof err)) {
    fprintf(stderr, "chanter local up: %s\n", err);
    return 1;
  }
  if (hosts_up(hp, workdir, err, sizeof err)) {
    fprintf(stderr, "chanter local up: cannot make the emulated hosts: %s\n", err);
    hosts_down(workdir);
    return 1;
  }
  return 0;
}

static int local_up(cli_t *cli, const char *workdir, int insecure) {
  char path[4200], job[4200];
  if (*cfg_str(cli->cfg, "local.hosts") && strcmp(cfg_str(cli->cfg, "local.hosts"), "0") && geteuid() != 0) {
    fprintf(stderr, "chanter local up: emulated hosts (--hosts, local.hosts) need root: they are network namespaces "
                    "joined by veth pairs to a bridge, shaped with tc; run it as root, or without --hosts\n");
    return 1;
  }
  mkdir(workdir, 0755);
  snprintf(path, sizeof path, "%s/logs", workdir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/run", workdir);
  mkdir(path, 0755);
  snprintf(job, sizeof job, "%s/job.ini", workdir);
  supervise_proc_t old[SUPERVISE_MAX];
  int n_old = supervise_pids_load(workdir, old, SUPERVISE_MAX);
  for (int i = 0; i < n_old; i++)
    if (supervise_alive(old[i].pid)) {
      fprintf(stderr, "chanter local up: %s already runs a cluster (%s, pid %d alive); run `chanter local down --workdir %s` first\n",
              workdir, old[i].name, (int)old[i].pid, workdir);
      return 1;
    }
  pid_t sup = supervise_running(workdir);
  if (sup) {
    fprintf(stderr, "chanter local up: %s already runs a cluster (its supervisor, pid %d, is alive); run `chanter local down --workdir %s` first\n",
            workdir, (int)sup, workdir);
    return 1;
  }
  if (local_tls(cli, workdir, insecure)) return 1;
  hosts_plan_t hp;
  if (local_hosts(cli, workdir, insecure, &hp)) return 1;
  cfg_t *cfg = cli->cfg;
  int rc = write_job(cfg, job);
  if (rc) {
    fprintf(stderr, "chanter local up: cannot write %s: %s\n", job, err_str(rc));
    hosts_down(workdir);
    return 1;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    fprintf(stderr, "chanter local up: cannot create a pipe: %s\n", strerror(errno));
    return 1;
  }
  int fl = fcntl(fds[1], F_GETFD);
  fcntl(fds[1], F_SETFD, fl & ~FD_CLOEXEC); /* the supervisor's end survives its exec */
  fflush(stdout);
  fflush(stderr);
  sup = start_supervisor(workdir, job, fds[1]);
  close(fds[1]);
  if (sup < 0) {
    fprintf(stderr, "chanter local up: cannot start the supervisor: %s\n", strerror(errno));
    close(fds[0]);
    hosts_down(workdir);
    return 1;
  }
  /* Ctrl-C (or SIGTERM) while it starts: the supervisor stops what it started */
  struct sigaction sa = {.sa_handler = on_interrupt}, old_int, old_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  FILE *r = fdopen(fds[0], "r");
  char line[4400];
  int up = 0, failed = 0, told = 0;
  for (;;) {
    if (g_interrupted && !told) {
      kill(sup, SIGTERM);
      told = 1;
    }
    if (!fgets(line, sizeof line, r)) {
      if (ferror(r) && errno == EINTR) {
        clearerr(r);
        continue;
      }
      break;
    }
    line[strcspn(line, "\n")] = 0;
    if (!strncmp(line, "say ", 4)) fprintf(stderr, "%s\n", line + 4);
    else if (!strncmp(line, "tail ", 5)) cli_tail_file(line + 5);
    else if (!strcmp(line, "up")) up = 1;
    else if (!strcmp(line, "fail")) failed = 1;
  }
  fclose(r);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (!up || failed) {
    int st = 0;
    while (waitpid(sup, &st, 0) < 0 && errno == EINTR) {
    }
    if (!failed) { /* it died without a word: say so, and clean up after it */
      snprintf(path, sizeof path, "%s/logs/supervisor.log", workdir);
      fprintf(stderr, "chanter local up: the supervisor (pid %d) ended during start-up (%s %d)\n", (int)sup,
              WIFSIGNALED(st) ? "killed by signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      cli_tail_file(path);
      supervise_proc_t ps[SUPERVISE_MAX];
      int n = supervise_pids_load(workdir, ps, SUPERVISE_MAX);
      if (n > 0) stop_all(ps, n, 5000);
    }
    hosts_down(workdir); /* the supervisor stopped (or we did) every daemon in them */
    return 1;
  }
  supervise_proc_t ps[SUPERVISE_MAX];
  int n = supervise_pids_load(workdir, ps, SUPERVISE_MAX);
  if (n < 0) n = 0;
  int nd = (int)cfg_int(cfg, "dataprocs"), ne = (int)cfg_int(cfg, "embedding_servers"), nt = (int)cfg_int(cfg, "trainers");
  if (cli->json) {
    printf("{\"workdir\": \"%s\", \"config\": \"%s\", \"supervisor_pid\": %d, \"daemons\": [", workdir, job, (int)sup);
    for (int i = 0; i < n; i++)
      printf("%s{\"name\": \"%s\", \"pid\": %d, \"port\": %d, \"addr\": \"%s\"}", i ? ", " : "", ps[i].name,
             (int)ps[i].pid, ps[i].port, daemon_addr(workdir, &ps[i], path, sizeof path));
    printf("], \"hosts\": %d}\n", hp.n_hosts);
  } else {
    for (int i = 0; i < n; i++)
      printf("%-14s pid %-7d %s\n", ps[i].name, (int)ps[i].pid, daemon_addr(workdir, &ps[i], path, sizeof path));
    printf("cluster up: %d data processor(s), %d embedding server(s), oracle, %d trainer(s)\n"
           "config: %s   logs: %s/logs/\n"
           "supervisor: pid %d restarts a daemon that fails (log: %s/logs/supervisor.log)\n",
           nd, ne, nt, job, workdir, (int)sup, workdir);
    if (hp.n_hosts) {
      char ops[64];
      hosts_ns_name(&hp, -1, ops, sizeof ops);
      printf("emulated hosts: %d (network namespaces %s-h1..h%d on the bridge of %s-br, 10.77.0.1..%d/24), "
             "link %s; the CLI joins %s (%s) for this work dir\n",
             hp.n_hosts, hp.tag, hp.n_hosts, hp.tag, hp.n_hosts, *cfg_str(cfg, "local.link") ? cfg_str(cfg, "local.link") : "unshaped",
             ops, HOSTS_OPS_ADDR);
    }
  }
  return 0;
}

static int local_down(cli_t *cli, const char *workdir) {
  supervise_proc_t ps[SUPERVISE_MAX];
  int n = supervise_pids_load(workdir, ps, SUPERVISE_MAX);
  pid_t sup = supervise_running(workdir);
  if (n < 0 && !sup) {
    int gone = hosts_down(workdir); /* a start-up that crashed before any daemon */
    if (gone > 0) {
      printf("cluster down: no daemons; removed %d network namespace(s)\n", gone);
      return 0;
    }
    fprintf(stderr, "chanter local down: no cluster in %s (no pids file)\n", workdir);
    return 1;
  }
  if (n < 0) n = 0;
  int was = 0, killed = 0;
  for (int i = 0; i < n; i++) was += supervise_alive(ps[i].pid);
  if (sup) {
    /* the supervisor stops them in reverse start order and reaps them */
    kill(sup, SIGTERM);
    double until = clock_mono_s() + DOWN_GRACE_MS / 1000.0 + 15;
    while (supervise_alive(sup) && clock_mono_s() < until) usleep(20000);
    if (supervise_alive(sup)) {
      fprintf(stderr, "chanter local down: the supervisor (pid %d) did not stop within %d s; killing it and stopping "
                      "the daemons directly\n", (int)sup, DOWN_GRACE_MS / 1000 + 15);
      kill(sup, SIGKILL);
    } else {
      supervise_info_t info;
      supervise_entry_t e[1];
      if (supervise_status_read(workdir, &info, e, 0) >= 0) killed = info.killed;
    }
    n = supervise_pids_load(workdir, ps, SUPERVISE_MAX); /* its last word */
    if (n < 0) n = 0;
  }
  killed += stop_all(ps, n, DOWN_GRACE_MS); /* without a supervisor; after one, nothing is left to stop */
  int left = 0;
  for (int i = 0; i < n; i++) left += supervise_alive(ps[i].pid);
  char path[4200];
  snprintf(path, sizeof path, "%s/pids", workdir);
  if (!left) unlink(path);
  /* the emulated hosts: only once nothing runs in them */
  int netns = left ? 0 : hosts_down(workdir);
  if (cli->json)
    printf("{\"stopped\": %d, \"killed\": %d, \"left\": %d, \"supervisor\": %s, \"netns_removed\": %d}\n", was,
           killed, left, sup ? "true" : "false", netns);
  else
    printf("cluster down: %d daemon(s) stopped%s%s\n", was, killed ? " (some had to be killed)" : "",
           netns > 0 ? (snprintf(path, sizeof path, "; %d network namespace(s) removed", netns), path) : "");
  return left || netns < 0 ? 1 : 0;
}

static int local_status(cli_t *cli, const char *workdir) {
  supervise_proc_t ps[SUPERVISE_MAX];
  int n = supervise_pids_load(workdir, ps, SUPERVISE_MAX);
  if (n < 0) {
    fprintf(stderr, "chanter local status: no cluster in %s\n", workdir);
    return 1;
  }
  static supervise_entry_t es[SUPERVISE_MAX];
  supervise_info_t info;
  int ne = supervise_status_read(workdir, &info, es, SUPERVISE_MAX);
  if (ne < 0) ne = 0;
  pid_t sup = supervise_running(workdir);
  int up = 0;
  if (cli->json) printf("{\"daemons\": [");
  for (int i = 0; i < n; i++) {
    int a = supervise_alive(ps[i].pid);
    up += a;
    const supervise_entry_t *e = NULL;
    for (int k = 0; k < ne && !e; k++)
      if (!strcmp(es[k].name, ps[i].name)) e = &es[k];
    char addr[64];
    daemon_addr(workdir, &ps[i], addr, sizeof addr);
    if (!*addr) snprintf(addr, sizeof addr, "-");
    if (cli->json) {
      char le[400], st[600];
      json_escape(le, sizeof le, e ? e->last_exit : "");
      json_escape(st, sizeof st, e ? e->status : "");
      printf("%s{\"name\": \"%s\", \"pid\": %d, \"port\": %d, \"alive\": %s, \"state\": \"%s\", \"restarts\": %d, "
             "\"last_exit\": \"%s\", \"status\": \"%s\"}",
             i ? ", " : "", ps[i].name, (int)ps[i].pid, ps[i].port, a ? "true" : "false", e ? e->state : "",
             e ? e->restarts : 0, le, st);
    } else {
      printf("%-14s pid %-7d %-4s %-16s restarts %-2d %-12s last exit: %-30s %s%s%s\n", ps[i].name, (int)ps[i].pid,
             a ? "up" : "DOWN", addr, e ? e->restarts : 0, e ? e->state : "-",
             e && e->last_exit[0] ? e->last_exit : "-", e && e->status[0] ? "\"" : "", e ? e->status : "",
             e && e->status[0] ? "\"" : "");
    }
  }
  if (cli->json) {
    printf("], \"alive\": %d, \"total\": %d, \"supervisor_pid\": %d, \"supervisor\": %s}\n", up, n, (int)sup,
           sup ? "true" : "false");
  } else {
    char wd[32] = "off";
    if (info.watchdog_ms > 0) snprintf(wd, sizeof wd, "%d ms", info.watchdog_ms);
    if (sup)
      printf("supervisor: pid %d, restarts a daemon that fails (after %d ms; watchdog %s)\n", (int)sup,
             info.restart_ms, wd);
    else
      printf("supervisor: not running (nothing restarts a daemon that fails; `local down` stops them from %s/pids)\n",
             workdir);
    printf("%d of %d daemons alive\n", up, n);
  }
  return up == n ? 0 : 1;
}

int cmd_local(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected up, down or status, with --workdir DIR");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (strcmp(sub, "up") && strcmp(sub, "down") && strcmp(sub, "status") && strcmp(sub, "supervise"))
    return cli_usage_error(cli, "unknown subcommand '%s'", sub);
  const char *workdir = cli_opt(cli, "--workdir");
  const char *report = !strcmp(sub, "supervise") ? cli_opt(cli, "--report-fd") : NULL;
  int insecure = !strcmp(sub, "up") && cli_flag(cli, "--insecure");
  const char *hosts = !strcmp(sub, "up") ? cli_opt(cli, "--hosts") : NULL;
  const char *link = !strcmp(sub, "up") ? cli_opt(cli, "--link") : NULL;
  if (cli_done(cli, sub)) return 2;
  if (!workdir)
    return cli_usage_error(cli, "--workdir DIR is required (the cluster's config, logs and pids live there)");
  if (!strcmp(sub, "up")) {
    char kv[512], err[512];
    if (link && !hosts && !*cfg_str(cli->cfg, "local.hosts"))
      return cli_usage_error(cli, "--link shapes the links of emulated hosts: it needs --hosts N (or auto)");
    const char *sets[2][2] = {{"local.hosts", hosts}, {"local.link", link}};
    for (int i = 0; i < 2; i++) {
      if (!sets[i][1]) continue;
      snprintf(kv, sizeof kv, "%s=%s", sets[i][0], sets[i][1]);
      if (cfg_set(cli->cfg, kv, i ? "--link" : "--hosts", err, sizeof err)) return cli_usage_error(cli, "%s", err);
    }
    return local_up(cli, workdir, insecure);
  }
  if (!strcmp(sub, "down")) return local_down(cli, workdir);
  if (!strcmp(sub, "supervise")) {
    char bindir[4096];
    self_dir(bindir, sizeof bindir);
    return supervise_run(cli->cfg, workdir, bindir, report ? atoi(report) : -1);
  }
  return local_status(cli, workdir);
}
