/*
 * chanter prometheus-config: a Prometheus scrape configuration for a job's
 * daemons, on stdout.
 *
 *   chanter [--config job.ini] [--set k=v ...] prometheus-config [--workdir W]
 *           [--job-name NAME] [--scrape-interval DURATION]
 *
 * One target per daemon, labelled job (NAME), role (oracle, embedding,
 * dataproc, trainer) and instance (the daemon's name as `chanter local`
 * spells it: embedding-1).  Where each daemon's /metrics is:
 *   - from the job file: its RPC port plus <role>.metrics_port_offset on
 *     the host of its cluster.* entry, as daemon_start() derives it; a
 *     trainer serves no RPC: trainer.metrics_port on the host of its
 *     cluster.trainers entry.  A daemon whose port is picked at start (an
 *     offset or trainer.metrics_port of 0, or no cluster.* entry) cannot
 *     be named in advance: a comment says so instead of a target.
 *   - with --workdir W (a cluster `chanter local up` started): every
 *     daemon W/pids lists, at the metrics_port of its ready file
 *     W/run/NAME.ready (the supervisor keeps it across restarts).
 * The endpoints are plain HTTP (common/metrics.c serves no TLS, whatever
 * tls.* says for the RPCs), on metrics.listen: a loopback metrics.listen
 * answers only on the daemon's own host, and the output says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "supervise.h"

typedef struct prom_target_s {
  char name[64];  /* instance: "embedding-1" */
  char role[16];  /* "embedding" */
  char host[256]; /* "" when unknown */
  int port;       /* 0 when unknown */
  char why[160];  /* when it cannot be scraped: why */
} prom_target_t;

/* "host:port" or "[v6]:port" -> host (brackets kept, as a target needs
 * them) and port (0 when there is none). */
static void split_addr(const char *addr, char *host, size_t n, int *port) {
  const char *c = strrchr(addr, ':');
  int v6_bare = c && strchr(addr, ':') != c && addr[0] != '['; /* ::1 without a port */
  if (!c || v6_bare) {
    snprintf(host, n, "%s", addr);
    *port = 0;
    return;
  }
  snprintf(host, n, "%.*s", (int)(c - addr), addr);
  *port = atoi(c + 1);
}

/* The cluster.* key of a role: NULL for none. */
static const char *cluster_key(const char *role) {
  if (!strcmp(role, "oracle")) return "cluster.oracle";
  if (!strcmp(role, "embedding")) return "cluster.embedding";
  if (!strcmp(role, "dataproc")) return "cluster.dataproc";
  if (!strcmp(role, "trainer")) return "cluster.trainers";
  return NULL;
}

/* Entry idx of the role's cluster.* list: host and RPC port (a trainer's
 * entry is a host alone).  0, or -1 when the list has no such entry. */
static int cluster_entry(const cfg_t *cfg, const char *role, int idx, char *host, size_t n, int *port) {
  const char *key = cluster_key(role);
  char **items = NULL;
  size_t count = 0;
  host[0] = 0;
  *port = 0;
  if (!key || cfg_list(cfg, key, &items, &count)) return -1;
  int rc = idx >= 0 && (size_t)idx < count && items[idx][0] ? 0 : -1;
  if (!rc) split_addr(items[idx], host, n, port);
  cfg_list_free(items, count);
  return rc;
}

/* The target of daemon role-idx as the job file names it (see the top). */
static void target_from_job(const cfg_t *cfg, const char *role, int idx, prom_target_t *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s-%d", role, idx);
  snprintf(t->role, sizeof t->role, "%s", role);
  int rpc_port = 0;
  int have = cluster_entry(cfg, role, idx, t->host, sizeof t->host, &rpc_port) == 0;
  if (!strcmp(role, "trainer")) {
    if (!have) snprintf(t->host, sizeof t->host, "127.0.0.1"); /* cluster.trainers' default */
    t->port = (int)cfg_int(cfg, "trainer.metrics_port");
    if (!t->port) snprintf(t->why, sizeof t->why, "trainer.metrics_port = 0: a free port, picked at start");
    return;
  }
  char key[64];
  snprintf(key, sizeof key, "%s.metrics_port_offset", role);
  int offset = (int)cfg_int(cfg, key);
  if (!have || !rpc_port) snprintf(t->why, sizeof t->why, "no address in %s (chanter local up picks one)", cluster_key(role));
  else if (!offset) snprintf(t->why, sizeof t->why, "%s = 0: a free port, picked at start", key);
  else t->port = rpc_port + offset;
}

/* The daemons of the job file, in start order as `chanter local up`
 * starts them; *n of them (malloc'd), or NULL on out of memory. */
static prom_target_t *targets_from_job(const cfg_t *cfg, int *n) {
  static const struct { const char *role, *count_key; } groups[] = {
      {"dataproc", "dataprocs"}, {"embedding", "embedding_servers"}, {"oracle", NULL}, {"trainer", "trainers"}};
  int total = 0;
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    total += groups[g].count_key ? (int)cfg_int(cfg, groups[g].count_key) : 1;
  prom_target_t *ts = calloc((size_t)total + 1, sizeof *ts);
  if (!ts) return NULL;
  *n = 0;
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    int count = groups[g].count_key ? (int)cfg_int(cfg, groups[g].count_key) : 1;
    for (int i = 0; i < count; i++) target_from_job(cfg, groups[g].role, i, &ts[(*n)++]);
  }
  return ts;
}

/* The daemons W/pids lists, at their ready files' metrics ports; NULL
 * with *n = -1 when W has no pids file (or on out of memory). */
static prom_target_t *targets_from_workdir(const cfg_t *cfg, const char *workdir, int *n) {
  supervise_proc_t *ps = calloc(SUPERVISE_MAX, sizeof *ps);
  prom_target_t *ts = calloc(SUPERVISE_MAX, sizeof *ts);
  int np = ps && ts ? supervise_pids_load(workdir, ps, SUPERVISE_MAX) : -1;
  if (np < 0) {
    free(ps);
    free(ts);
    *n = -1;
    return NULL;
  }
  for (int i = 0; i < np; i++) {
    prom_target_t *t = &ts[i];
    const char *dash = strrchr(ps[i].name, '-');
    int idx = dash ? atoi(dash + 1) : 0;
    snprintf(t->name, sizeof t->name, "%s", ps[i].name);
    snprintf(t->role, sizeof t->role, "%.*s", dash ? (int)(dash - ps[i].name) : (int)strlen(ps[i].name), ps[i].name);
    int rpc_port;
    if (cluster_entry(cfg, t->role, idx, t->host, sizeof t->host, &rpc_port)) snprintf(t->host, sizeof t->host, "127.0.0.1");
    char ready[4400];
    snprintf(ready, sizeof ready, "%s/run/%s.ready", workdir, ps[i].name);
    int port = 0, mport = 0;
    if (supervise_ready_read(ready, &port, &mport)) snprintf(t->why, sizeof t->why, "not ready yet (no run/%s.ready)", t->name);
    else if (!mport) snprintf(t->why, sizeof t->why, "its ready file names no metrics port (endpoint not started)");
    t->port = mport;
  }
  free(ps);
  *n = np;
  return ts;
}

static int loopback(const char *addr) { return !strncmp(addr, "127.", 4) || !strcmp(addr, "::1") || !strcmp(addr, "[::1]"); }

static void print_config(const cfg_t *cfg, const char *source, const char *job_name, const char *interval,
                         const prom_target_t *ts, int n) {
  const char *listen = cfg_str(cfg, "metrics.listen");
  printf("# Prometheus scrape configuration of a chanter job, written by\n"
         "#   chanter prometheus-config (%s)\n"
         "# One target per daemon, labelled job, role and instance (the daemon's name).\n"
         "# chanter's /metrics endpoints listen on metrics.listen = %s, %s\n",
         source, listen,
         cfg_bool(cfg, "metrics.tls") ? "over HTTPS (metrics.tls): scheme https, the job's CA"
                                      : "plain HTTP (metrics.tls = false): scheme http");
  if (loopback(listen))
    printf("# metrics.listen is a loopback address: each endpoint answers only on its own host\n"
           "# (run Prometheus there, or set metrics.listen = 0.0.0.0 on a trusted network).\n");
  printf("global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", interval, interval);
  printf("scrape_configs:\n  - job_name: '%s'\n    scheme: %s\n    metrics_path: /metrics\n", job_name,
         cfg_bool(cfg, "metrics.tls") ? "https" : "http");
  if (cfg_bool(cfg, "metrics.tls")) {
    const char *ca = cfg_str(cfg, "tls.ca_file"), *name = cfg_str(cfg, "tls.server_name");
    printf("    tls_config:\n      ca_file: '%s'\n", *ca ? ca : "(tls.ca_file is not set)");
    if (*name) printf("      server_name: '%s'\n", name);
  }
  printf("    static_configs:\n");
  int listed = 0;
  for (int i = 0; i < n; i++) {
    const prom_target_t *t = &ts[i];
    if (t->why[0] || !t->port) {
      printf("      # %s: not scraped: %s\n", t->name, t->why[0] ? t->why : "no metrics port");
      continue;
    }
    const char *host = t->host[0] ? t->host : "127.0.0.1";
    printf("      - targets: ['%s:%d']\n        labels: {role: '%s', instance: '%s'}\n", host, t->port, t->role,
           t->name);
    listed++;
  }
  if (!listed) printf("      - targets: []\n");
}

/* A name Prometheus and YAML take unquoted-safe inside single quotes. */
static int plain_word(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || strchr("_.-", *s))) return 0;
  return 1;
}

int cmd_prometheus(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir");
  const char *job_name = cli_opt(cli, "--job-name");
  const char *interval = cli_opt(cli, "--scrape-interval");
  if (!job_name) job_name = "chanter";
  if (!interval) interval = "15s";
  if (cli_done(cli, NULL)) return 2;
  if (!plain_word(job_name)) return cli_usage_error(cli, "--job-name '%s': letters, digits, '_', '.', '-' only", job_name);
  char *end;
  long v = strtol(interval, &end, 10);
  int unit_ok = !strcmp(end, "ms") || !strcmp(end, "s") || !strcmp(end, "m");
  if (end == interval || v <= 0 || !unit_ok)
    return cli_usage_error(cli, "--scrape-interval '%s': a duration as Prometheus spells it (500ms, 1s, 15s, 1m)",
                           interval);
  char err[1024] = "", source[4400];
  int owned = 0, n = 0;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter prometheus-config: %s\n", err[0] ? err : "out of memory");
    return 1;
  }
  prom_target_t *ts;
  if (workdir) {
    ts = targets_from_workdir(cfg, workdir, &n);
    snprintf(source, sizeof source, "from the local cluster in %s", workdir);
  } else {
    ts = targets_from_job(cfg, &n);
    size_t o = (size_t)snprintf(source, sizeof source, "from %s", cli->config_path ? cli->config_path : "the default job");
    for (int i = 0; i < cli->n_sets && o < sizeof source; i++)
      o += (size_t)snprintf(source + o, sizeof source - o, " --set %s", cli->sets[i]);
  }
  int rc = 0;
  if (!ts) {
    if (workdir) fprintf(stderr, "chanter prometheus-config: no cluster in %s (no pids file)\n", workdir);
    else fprintf(stderr, "chanter prometheus-config: out of memory\n");
    rc = 1;
  } else {
    print_config(cfg, source, job_name, interval, ts, n);
    if (fflush(stdout) != 0) rc = 1;
  }
  free(ts);
  if (owned) cfg_destroy(cfg);
  return rc;
}
