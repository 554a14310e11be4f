/*
 * hosts: see hosts.h.  The namespaces, veths, bridge and qdiscs are made
 * with iproute2's `ip` and `tc` (tools/install-deps.sh installs it).
 */
#include "hosts.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "err.h"

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
  }
  return ERR_CONFIG;
}

/* ---- parsing */

int hosts_parse_rate(const char *s, long long *bits) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"", 1},           {"bit", 1},           {"kibit", 1024},         {"kbit", 1000},
               {"mibit", 1048576}, {"mbit", 1e6},       {"gibit", 1073741824.0}, {"gbit", 1e9},
               {"tibit", 1099511627776.0}, {"tbit", 1e12}, {"bps", 8},           {"kibps", 8192},
               {"kbps", 8000},    {"mibps", 8388608},   {"mbps", 8e6},           {"gibps", 8589934592.0},
               {"gbps", 8e9},     {"tibps", 8796093022208.0}, {"tbps", 8e12}};
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || v < 0) return -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit)) {
      double b = v * units[i].mult;
      if (b > 1e15) return -1;
      *bits = (long long)(b + 0.5);
      return 0;
    }
  return -1;
}

/* a time as tc spells it (0, 10ms, 1.5s, 200us; bare: us) in us; -1 when not one */
static int parse_time_us(const char *s, double *us) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"", 1}, {"us", 1}, {"usec", 1}, {"usecs", 1}, {"ms", 1e3}, {"msec", 1e3}, {"msecs", 1e3},
               {"s", 1e6}, {"sec", 1e6}, {"secs", 1e6}};
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit)) {
      *us = v * units[i].mult;
      return 0;
    }
  return -1;
}

static void trim(char *s) {
  size_t l = strlen(s);
  while (l && isspace((unsigned char)s[l - 1])) s[--l] = 0;
  size_t b = 0;
  while (s[b] && isspace((unsigned char)s[b])) b++;
  memmove(s, s + b, l - b + 1);
}

static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

int hosts_plan(const cfg_t *cfg, const char *workdir, hosts_plan_t *p, char *err, size_t err_len) {
  memset(p, 0, sizeof *p);
  p->n_dp = (int)cfg_int(cfg, "dataprocs");
  p->n_emb = (int)cfg_int(cfg, "embedding_servers");
  p->n_tr = (int)cfg_int(cfg, "trainers");
  int slots = 1 + p->n_emb + p->n_tr;
  char h[64];
  snprintf(h, sizeof h, "%s", cfg_str(cfg, "local.hosts"));
  trim(h);
  const char *link = cfg_str(cfg, "local.link");
  if (!*h || !strcmp(h, "0")) {
    if (*link)
      return fail(err, err_len, "local.link = '%s' (from %s) shapes the links of emulated hosts: it needs local.hosts "
                  "(--hosts N or auto)", link, cfg_origin(cfg, "local.link"));
    return 0;
  }
  if (!strcasecmp(h, "auto")) p->n_hosts = slots;
  else {
    char *end;
    long v = strtol(h, &end, 10);
    if (*end || v < 1)
      return fail(err, err_len, "local.hosts = '%s' (from %s): expected auto or a number of hosts >= 1", h,
                  cfg_origin(cfg, "local.hosts"));
    if (v > slots)
      return fail(err, err_len, "local.hosts = %ld (from %s): this job places its daemons on at most %d hosts (1 for "
                  "the oracle and the data processors, %d embedding server(s), %d trainer(s)); use auto for that",
                  v, cfg_origin(cfg, "local.hosts"), slots, p->n_emb, p->n_tr);
    p->n_hosts = (int)v;
  }
  if (p->n_hosts > HOSTS_MAX)
    return fail(err, err_len, "local.hosts: %d hosts, at most %d fit the emulated subnet 10.77.0.0/24", p->n_hosts,
                HOSTS_MAX);
  char abs[PATH_MAX];
  if (!realpath(workdir, abs)) snprintf(abs, sizeof abs, "%s", workdir);
  snprintf(p->tag, sizeof p->tag, "ch%08x", fnv1a(abs));
  if (*link) {
    char l[256], *f[4] = {0};
    snprintf(l, sizeof l, "%s", link);
    int nf = 0;
    for (char *s = l, *c; nf < 4; s = c + 1) {
      f[nf++] = s;
      if (!(c = strchr(s, ','))) break;
      *c = 0;
    }
    for (int i = 0; i < nf; i++) trim(f[i]);
    const char *o = cfg_origin(cfg, "local.link");
    if (nf > 3)
      return fail(err, err_len, "local.link = '%s' (from %s): expected RATE,DELAY[,LOSS] (e.g. 1gbit,0)", link, o);
    if (hosts_parse_rate(f[0], &p->rate_bits) || (p->rate_bits > 0 && p->rate_bits < 8000))
      return fail(err, err_len, "local.link = '%s' (from %s): the rate '%s' is not one tc reads (1gbit, 100mbit, "
                  "500kbit, 10mbps; at least 8kbit)", link, o, f[0]);
    double us = 0;
    if (nf > 1 && parse_time_us(f[1], &us))
      return fail(err, err_len, "local.link = '%s' (from %s): the delay '%s' is not a time (0, 10ms, 1s)", link, o,
                  f[1]);
    if (us > 0)
      return fail(err, err_len, "local.link = '%s' (from %s): a delay of %s needs the netem qdisc, which this kernel "
                  "does not have (no sch_netem); only a delay of 0 is possible: RATE,0", link, o, f[1]);
    if (nf > 2) {
      char *end;
      double loss = strtod(f[2], &end);
      if (end == f[2] || (*end && strcmp(end, "%")) || loss < 0 || loss > 100)
        return fail(err, err_len, "local.link = '%s' (from %s): the loss '%s' is not a percentage (0, 0.1%%)", link,
                    o, f[2]);
      if (loss > 0)
        return fail(err, err_len, "local.link = '%s' (from %s): a loss of %s needs the netem qdisc, which this kernel "
                    "does not have (no sch_netem); only a loss of 0 is possible", link, o, f[2]);
    }
  }
  return 0;
}

int hosts_of(const hosts_plan_t *p, const char *kind, int i) {
  int slot = 0;
  if (!strcmp(kind, "embedding")) slot = 1 + i;
  else if (!strcmp(kind, "trainer")) slot = 1 + p->n_emb + i;
  return p->n_hosts > 0 ? slot % p->n_hosts + 1 : 0;
}

void hosts_ns_name(const hosts_plan_t *p, int host, char *out, size_t n) {
  if (host == 0) snprintf(out, n, "%s-br", p->tag);
  else if (host < 0) snprintf(out, n, "%s-ops", p->tag);
  else snprintf(out, n, "%s-h%d", p->tag, host);
}

void hosts_addr(int host, char *out, size_t n) {
  if (host < 0) snprintf(out, n, "%s", HOSTS_OPS_ADDR);
  else snprintf(out, n, "10.77.0.%d", host);
}

int hosts_set_cluster(const hosts_plan_t *p, cfg_t *cfg, char *err, size_t err_len) {
  static const struct {
    const char *key, *kind;
    int port;
  } ks[] = {{"cluster.oracle", "oracle", HOSTS_ORACLE_PORT},
            {"cluster.dataproc", "dataproc", HOSTS_DATAPROC_PORT},
            {"cluster.embedding", "embedding", HOSTS_EMBEDDING_PORT},
            {"cluster.trainers", "trainer", 0}};
  for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
    int count = k == 0 ? 1 : k == 1 ? p->n_dp : k == 2 ? p->n_emb : p->n_tr;
    size_t cap = 64 + (size_t)count * 24, o;
    char *kv = malloc(cap), a[32];
    if (!kv) return fail(err, err_len, "out of memory");
    o = (size_t)snprintf(kv, cap, "%s=", ks[k].key);
    for (int i = 0; i < count; i++) {
      hosts_addr(hosts_of(p, ks[k].kind, i), a, sizeof a);
      if (ks[k].port) o += (size_t)snprintf(kv + o, cap - o, "%s%s:%d", i ? "," : "", a, ks[k].port + i);
      else o += (size_t)snprintf(kv + o, cap - o, "%s%s", i ? "," : "", a);
    }
    int rc = cfg_set(cfg, kv, "chanter local up --hosts", err, err_len);
    free(kv);
    if (rc) return rc;
  }
  return 0;
}

/* ---- running ip and tc */

/* Runs the words of cmd (split on spaces): 0, or 1 with what it said on
 * stderr in err. */
static int run(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *err, size_t err_len, const char *fmt, ...) {
  char cmd[1024], *argv[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char copy[1024];
  snprintf(copy, sizeof copy, "%s", cmd);
  int argc = 0;
  for (char *s = strtok(copy, " "); s && argc < 63; s = strtok(NULL, " ")) argv[argc++] = s;
  argv[argc] = NULL;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) return fail(err, err_len, "`%s`: cannot create a pipe: %s", cmd, strerror(errno)), 1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return fail(err, err_len, "`%s`: cannot fork: %s", cmd, strerror(errno)), 1;
  }
  if (pid == 0) {
    dup2(fds[1], 2);
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
      dup2(nul, 0);
      dup2(nul, 1);
    }
    execvp(argv[0], argv);
    static const char *dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
    char path[256];
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
      snprintf(path, sizeof path, "%s/%s", dirs[i], argv[0]);
      execv(path, argv);
    }
    fprintf(stderr, "%s not found: install iproute2 (tools/install-deps.sh)", argv[0]);
    _exit(127);
  }
  close(fds[1]);
  char out[768];
  size_t got = 0;
  ssize_t r;
  while ((r = read(fds[0], out + got, sizeof out - 1 - got)) > 0 || (r < 0 && errno == EINTR))
    if (r > 0) got += (size_t)r;
  out[got] = 0;
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  trim(out);
  for (char *c = out; *c; c++)
    if (*c == '\n') *c = ' ';
  fail(err, err_len, "`%s` failed: %s", cmd, *out ? out : "(no message)");
  return 1;
}

static int ns_exists(const char *ns) {
  char path[512];
  snprintf(path, sizeof path, "/run/netns/%s", ns);
  return access(path, F_OK) == 0;
}

/* A namespace: recorded in W/run/netns first, a stale one of the same
 * name (this W's, from a run whose record is lost) removed, lo up. */
static int make_ns(FILE *rec, const char *ns, char *err, size_t err_len) {
  fprintf(rec, "%s\n", ns);
  fflush(rec);
  fsync(fileno(rec));
  if (ns_exists(ns) && run(err, err_len, "ip netns del %s", ns)) return 1;
  if (run(err, err_len, "ip netns add %s", ns)) return 1;
  return run(err, err_len, "ip -n %s link set lo up", ns);
}

/* tbf on dev in ns: burst 10 ms of the rate (at least 32 KiB), a queue of
 * 100 ms */
static int shape(const hosts_plan_t *p, const char *ns, const char *dev, char *err, size_t err_len) {
  if (p->rate_bits <= 0) return 0;
  long long burst = p->rate_bits / 8 / 100;
  if (burst < 32768) burst = 32768;
  return run(err, err_len, "tc -n %s qdisc add dev %s root tbf rate %lldbit burst %lld latency 100ms", ns, dev,
             p->rate_bits, burst);
}

/* One host (host > 0) or the ops namespace (host < 0) on the bridge. */
static int attach(const hosts_plan_t *p, FILE *rec, int host, char *err, size_t err_len) {
  char ns[64], br[64], addr[32], peer[32];
  hosts_ns_name(p, host, ns, sizeof ns);
  hosts_ns_name(p, 0, br, sizeof br);
  hosts_addr(host, addr, sizeof addr);
  if (host > 0) snprintf(peer, sizeof peer, "vh%d", host);
  else snprintf(peer, sizeof peer, "vops");
  if (make_ns(rec, ns, err, err_len) ||
      run(err, err_len, "ip -n %s link add %s type veth peer name eth0 netns %s", br, peer, ns) ||
      run(err, err_len, "ip -n %s link set %s master br0 up", br, peer) ||
      run(err, err_len, "ip -n %s addr add %s/24 dev eth0", ns, addr) ||
      run(err, err_len, "ip -n %s link set eth0 up", ns))
    return 1;
  if (host < 0) return 0;
  return shape(p, ns, "eth0", err, err_len) || shape(p, br, peer, err, err_len);
}

int hosts_up(const hosts_plan_t *p, const char *workdir, char *err, size_t err_len) {
  char path[4200], br[64], ns[64];
  if (geteuid() != 0)
    return fail(err, err_len, "emulated hosts (--hosts, local.hosts) need root: network namespaces, veth pairs and "
                "tc qdiscs; run `chanter local up` as root, or without --hosts"), 1;
  snprintf(path, sizeof path, "%s/run/netns", workdir);
  FILE *rec = fopen(path, "a");
  if (!rec) return fail(err, err_len, "cannot write %s: %s", path, strerror(errno)), 1;
  hosts_ns_name(p, 0, br, sizeof br);
  int rc = make_ns(rec, br, err, err_len);
  if (rc && strstr(err, "ip netns add")) {
    char e2[700];
    snprintf(e2, sizeof e2, "%s", err);
    fail(err, err_len, "cannot make a network namespace (%s); emulated hosts need `ip netns` to work here", e2);
  }
  if (!rc)
    rc = run(err, err_len, "ip -n %s link add br0 type bridge", br) ||
         run(err, err_len, "ip -n %s link set br0 up", br);
  for (int k = 1; k <= p->n_hosts && !rc; k++) rc = attach(p, rec, k, err, err_len);
  if (!rc) rc = attach(p, rec, -1, err, err_len);
  fclose(rec);
  if (rc) return 1;
  /* W/run/hosts: where each daemon runs */
  snprintf(path, sizeof path, "%s/run/hosts", workdir);
  FILE *f = fopen(path, "w");
  if (f) {
    static const char *kinds[] = {"dataproc", "embedding", "oracle", "trainer"};
    for (int k = 0; k < 4; k++) {
      int count = k == 0 ? p->n_dp : k == 1 ? p->n_emb : k == 2 ? 1 : p->n_tr;
      for (int i = 0; i < count; i++) {
        int h = hosts_of(p, kinds[k], i);
        char a[32];
        hosts_ns_name(p, h, ns, sizeof ns);
        hosts_addr(h, a, sizeof a);
        fprintf(f, "%s-%d %d %s %s\n", kinds[k], i, h, ns, a);
      }
    }
    fclose(f);
  }
  snprintf(path, sizeof path, "%s/run/netns-ops", workdir);
  if (!(f = fopen(path, "w"))) return fail(err, err_len, "cannot write %s: %s", path, strerror(errno)), 1;
  hosts_ns_name(p, -1, ns, sizeof ns);
  fprintf(f, "%s\n", ns);
  if (fclose(f)) return fail(err, err_len, "cannot write %s: %s", path, strerror(errno)), 1;
  return 0;
}

int hosts_down(const char *workdir) {
  char path[4200], line[256], err[1024];
  snprintf(path, sizeof path, "%s/run/netns-ops", workdir);
  unlink(path); /* first: the CLI stops joining it */
  snprintf(path, sizeof path, "%s/run/hosts", workdir);
  unlink(path);
  snprintf(path, sizeof path, "%s/run/netns", workdir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int removed = 0, failed = 0;
  while (fgets(line, sizeof line, f)) {
    trim(line);
    if (!*line || strchr(line, '/') || strchr(line, ' ')) continue;
    if (!ns_exists(line)) continue;
    if (run(err, sizeof err, "ip netns del %s", line)) {
      fprintf(stderr, "chanter local: cannot remove the network namespace %s: %s\n", line, err);
      failed++;
    } else {
      removed++;
    }
  }
  fclose(f);
  if (failed) return -1;
  unlink(path);
  return removed;
}

int hosts_count(const char *workdir) {
  char path[4200], line[256];
  snprintf(path, sizeof path, "%s/run/netns", workdir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    trim(line);
    const char *h = strrchr(line, '-');
    if (h && h[1] == 'h' && h[2] >= '0' && h[2] <= '9' && !strchr(line, '/')) n++;
  }
  fclose(f);
  return n;
}

void hosts_embedding_addr(int n_hosts, int i, char *out, size_t n) {
  hosts_plan_t p = {.n_hosts = n_hosts};
  char a[32];
  hosts_addr(hosts_of(&p, "embedding", i), a, sizeof a);
  snprintf(out, n, "%s:%d", a, HOSTS_EMBEDDING_PORT + i);
}

/* ---- the units' command lines */

static const char *unit_dirs[] = {"../systemd", "../../systemd", "../share/chanter/systemd"};

int hosts_unit_argv(const char *bindir, const char *job, const char *kind, int index, char **argv, int cap,
                    char *err, size_t err_len) {
  char unit[64], path[4300] = "", tried[2048] = "";
  snprintf(unit, sizeof unit, strcmp(kind, "oracle") ? "chanter-%s@.service" : "chanter-%s.service", kind);
  const char *env = getenv("CHANTER_SYSTEMD_DIR");
  FILE *f = NULL;
  for (int i = env && *env ? -1 : 0; i < (int)(sizeof unit_dirs / sizeof unit_dirs[0]) + 1 && !f; i++) {
    if (i < 0) snprintf(path, sizeof path, "%s/%s", env, unit);
    else if (i < (int)(sizeof unit_dirs / sizeof unit_dirs[0])) snprintf(path, sizeof path, "%s/%s/%s", bindir, unit_dirs[i], unit);
    else snprintf(path, sizeof path, "/usr/local/share/chanter/systemd/%s", unit);
    size_t o = strlen(tried);
    snprintf(tried + o, sizeof tried - o, "%s%s", o ? ", " : "", path);
    f = fopen(path, "r");
  }
  if (!f) {
    fail(err, err_len, "cannot find the unit %s (whose ExecStart= the daemons on emulated hosts run; tried %s; "
         "CHANTER_SYSTEMD_DIR names its directory)", unit, tried);
    return -1;
  }
  char line[2048], exec[2048] = "";
  int in_service = 0;
  while (fgets(line, sizeof line, f)) {
    trim(line);
    if (line[0] == '[') in_service = !strcmp(line, "[Service]");
    else if (in_service && !strncmp(line, "ExecStart=", 10)) snprintf(exec, sizeof exec, "%s", line + 10);
  }
  fclose(f);
  char *e = exec;
  while (*e && strchr("-@:+!", *e)) e++;
  if (!*e) {
    fail(err, err_len, "%s has no ExecStart= in [Service]", path);
    return -1;
  }
  int n = 0;
  for (char *w = strtok(e, " \t"); w; w = strtok(NULL, " \t")) {
    char out[4400];
    size_t o = 0;
    if (!strcmp(w, "/etc/chanter/job.ini")) snprintf(out, sizeof out, "%s", job);
    else {
      const char *s = w;
      if (!strncmp(s, "/usr/local/bin/", 15)) {
        o = (size_t)snprintf(out, sizeof out, "%s/", bindir);
        s += 15;
      }
      for (; *s && o + 16 < sizeof out; s++) {
        if (*s != '%') {
          out[o++] = *s;
          continue;
        }
        if (s[1] == 'i') o += (size_t)snprintf(out + o, sizeof out - o, "%d", index);
        else if (s[1] == '%') out[o++] = '%';
        else {
          for (int i = 0; i < n; i++) free(argv[i]);
          fail(err, err_len, "%s: ExecStart= has the specifier %%%c, which chanter local does not know (only %%i)",
               path, s[1]);
          return -1;
        }
        s++;
      }
      out[o] = 0;
    }
    if (n + 1 >= cap || !(argv[n] = strdup(out))) {
      for (int i = 0; i < n; i++) free(argv[i]);
      fail(err, err_len, "%s: ExecStart= has too many words", path);
      return -1;
    }
    n++;
  }
  argv[n] = NULL;
  return n;
}

/* ---- joining a namespace */

static int join(const char *ns, char *err, size_t err_len) {
  char path[512];
  snprintf(path, sizeof path, "/run/netns/%s", ns);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(err, err_len, "cannot open %s: %s", path, strerror(errno)), 1;
  int rc = setns(fd, CLONE_NEWNET);
  int e = errno;
  close(fd);
  if (rc) return fail(err, err_len, "cannot join the network namespace %s: %s%s", ns, strerror(e),
                      e == EPERM ? " (it needs root)" : ""), 1;
  return 0;
}

int hosts_exec_in(int argc, char **argv) {
  /* argv: chanter local exec-in NS -- PROGRAM ARGS... */
  char err[512];
  if (argc < 6 || strcmp(argv[4], "--")) {
    fprintf(stderr, "usage: chanter local exec-in NS -- PROGRAM [ARGS...]  (the supervisor's, for emulated hosts)\n");
    return 2;
  }
  if (join(argv[3], err, sizeof err)) {
    fprintf(stderr, "chanter local exec-in: %s\n", err);
    return 127;
  }
  execv(argv[5], argv + 5);
  fprintf(stderr, "chanter local exec-in: cannot run %s: %s\n", argv[5], strerror(errno));
  return 127;
}

int hosts_join_ops(int argc, char **argv) {
  const char *workdir = NULL, *config = NULL, *cmd = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if ((!strcmp(a, "--config") || !strcmp(a, "--workdir")) && i + 1 < argc) {
      if (a[2] == 'c') config = argv[++i];
      else workdir = argv[++i];
    } else if (!strncmp(a, "--config=", 9)) config = a + 9;
    else if (!strncmp(a, "--workdir=", 10)) workdir = a + 10;
    else if (!strcmp(a, "--set") && i + 1 < argc) i++;
    else if (a[0] != '-' && !cmd) cmd = a;
  }
  if (!cmd || !strcmp(cmd, "local")) return 0; /* local up/down/status/supervise stay here */
  char dir[4200], path[4300], ns[256] = "";
  if (workdir) snprintf(dir, sizeof dir, "%s", workdir);
  else if (config) {
    snprintf(dir, sizeof dir, "%s", config);
    char *s = strrchr(dir, '/');
    if (s) *s = 0;
    else snprintf(dir, sizeof dir, ".");
  } else return 0;
  snprintf(path, sizeof path, "%s/run/netns-ops", dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (!fgets(ns, sizeof ns, f)) ns[0] = 0;
  fclose(f);
  trim(ns);
  if (!*ns) return 0;
  char err[512];
  if (join(ns, err, sizeof err)) {
    fprintf(stderr, "chanter: the cluster of %s runs on emulated hosts (chanter local up --hosts), reachable only "
            "from its network namespace %s: %s\n", dir, ns, err);
    return 1;
  }
  return 0;
}
