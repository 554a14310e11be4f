/*
 * chanter scale --trainers N: the running job goes on with N trainers.
 *
 * The oracle takes a checkpoint as soon as possible and, once it is
 * complete, re-forms the trainer group with N trainers there, as a resume
 * of that checkpoint on N trainers would (services/oracle/oracle_scale.c).
 * The trainers below N go on in the new group without restarting; those
 * at or above it leave the job (exit 0).
 *
 * On a local cluster (--workdir W) this also sets trainers = N in W's job
 * file (after the oracle accepted, so that a refusal changes nothing) and
 * tells the supervisor (SIGHUP), which then runs trainers 0..N-1: the new
 * ones are started (they wait in Join until the group re-forms) and the
 * surplus ones are not restarted.  Elsewhere (systemd) the operator edits
 * the job file and starts the new units (docs/reference.md).
 *
 * chanter scale --embedding-servers N: the job goes onto N embedding
 * servers at its next checkpoint, the rows whose owner changes moving
 * server to server (oracle_scale.c).  The oracle gets the addresses of the
 * old and the new servers: the job file's cluster.embedding, and on a
 * local cluster a free port of 127.0.0.1 for each new server, started by
 * the supervisor once the oracle accepted (it reshapes when they answer).
 * Going down, the servers past N are drained by the scale; once it is
 * done the job file says N and the supervisor stops them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "err.h"
#include "hosts.h"
#include "json.h"
#include "orc.h"
#include "supervise.h"

/* W/job.ini says key = value (and cluster.embedding = cluster when not
 * NULL), as every daemon reads it, and the supervisor is told.  0, or 1
 * after saying why. */
static int local_scale(const char *workdir, const char *key, uint32_t n, const char *cluster) {
  char path[4200], kv[64], err[1024] = "";
  snprintf(path, sizeof path, "%s/job.ini", workdir);
  snprintf(kv, sizeof kv, "%s=%u", key, n);
  char *cl = cluster ? malloc(strlen(cluster) + 32) : NULL;
  if (cl) sprintf(cl, "cluster.embedding=%s", cluster);
  cfg_t *c = NULL;
  int rc = cluster && !cl ? -ENOMEM : cfg_create(&c);
  if (!rc) rc = cfg_load_file(c, path, err, sizeof err);
  if (!rc) rc = cfg_set(c, kv, "chanter scale", err, sizeof err);
  if (!rc && cl) rc = cfg_set(c, cl, "chanter scale", err, sizeof err);
  if (!rc) rc = supervise_write_job(c, path, err, sizeof err);
  cfg_destroy(c);
  free(cl);
  if (rc) {
    fprintf(stderr, "chanter scale: the oracle scales the job, but %s was not updated: %s\n", path,
            rc < 0 && rc > -4096 && !err[0] ? strerror(-rc) : err);
    return 1;
  }
  pid_t sup = supervise_running(workdir);
  if (!sup || kill(sup, SIGHUP) != 0) {
    fprintf(stderr, "chanter scale: %s says %s = %u, but no supervisor runs in %s to start or stop daemons\n", path,
            key, n, workdir);
    return 1;
  }
  return 0;
}

/* A port of 127.0.0.1 nothing listens on now (the kernel's choice), or 0. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* The old and new servers' addresses (*addrs, cfg_list_free) and "a,b" of
 * the first n: the job file's, and on a local cluster a free port for each
 * new server.  0, or 1 after saying why. */
static int server_addrs(const cfg_t *cfg, const char *workdir, uint32_t n, char ***addrs, size_t *k, char *cluster,
                        size_t cap) {
  int local = workdir != NULL, n_hosts = local ? hosts_count(workdir) : 0;
  if (cfg_list(cfg, "cluster.embedding", addrs, k) || !*k) {
    fprintf(stderr, "chanter scale: the job file lists no embedding servers (cluster.embedding)\n");
    return 1;
  }
  if (local && n > *k) {
    char **v = realloc(*addrs, n * sizeof *v);
    if (!v) return 1;
    *addrs = v;
    for (; *k < n; (*k)++) {
      int port = n_hosts ? 0 : free_port();
      if ((!n_hosts && !port) || !(v[*k] = malloc(48))) {
        fprintf(stderr, "chanter scale: no free port on 127.0.0.1 for embedding server %zu\n", *k);
        return 1;
      }
      if (n_hosts) hosts_embedding_addr(n_hosts, (int)*k, v[*k], 48); /* its emulated host's, as the supervisor runs it */
      else snprintf(v[*k], 48, "127.0.0.1:%d", port);
    }
  }
  size_t o = 0;
  cluster[0] = 0;
  for (size_t i = 0; i < n && i < *k && o < cap; i++)
    o += (size_t)snprintf(cluster + o, cap - o, "%s%s", i ? "," : "", (*addrs)[i]);
  return 0;
}

/* Until the job trains on n trainers after iteration c (its summary's
 * scale line; an earlier one when the scale's own checkpoint was cut
 * short by an oracle that stopped, and the next one took the scale over),
 * or ends: 0, or 1 after saying why. */
static int wait_scaled(orc_t *o, const char *what, uint32_t n, uint64_t c, char *line, size_t line_len) {
  char want[128], err[1024];
  snprintf(want, sizeof want, "to %u %s after iteration ", n, what);
  for (double until = clock_mono_s() + 600;;) {
    Chanter__Oracle__V1__StatusResponse *st = NULL;
    if (orc_status(o, &st, err, sizeof err) == 0) {
      int over = !strcmp(st->state, "failed") || !strcmp(st->state, "stopped") || !strcmp(st->state, "done");
      line[0] = 0;
      json_get_str(st->summary_json ? st->summary_json : "", "scale", line, line_len);
      const char *at = strstr(line, want);
      int done = !strncmp(line, "scaled", 6) && at && strtoull(at + strlen(want), NULL, 10) <= c;
      if (over && !done)
        fprintf(stderr, "chanter scale: the job is %s before it trained on %u %s: %s\n", st->state, n, what,
                st->message);
      protobuf_c_message_free_unpacked(&st->base, NULL);
      if (done) return 0;
      if (over) return 1;
    }
    if (clock_mono_s() > until) {
      fprintf(stderr, "chanter scale: the job does not train on %u %s 600 s after the request\n", n, what);
      return 1;
    }
    usleep(200000);
  }
}

int cmd_scale(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir"), *tr = cli_opt(cli, "--trainers");
  const char *es = cli_opt(cli, "--embedding-servers"), *arg = tr ? tr : es;
  int wait = cli_flag(cli, "--wait");
  if (cli_done(cli, NULL)) return 2;
  if (!tr == !es) return cli_usage_error(cli, "give one of --trainers N and --embedding-servers N");
  char *end = NULL;
  unsigned long n = strtoul(arg, &end, 10);
  if (!*arg || *end || n > UINT32_MAX)
    return cli_usage_error(cli, "%s needs a count (got '%s')", tr ? "--trainers" : "--embedding-servers", arg);
  const char *what = tr ? "trainers" : "embedding servers", *key = tr ? "trainers" : "embedding_servers";
  char err[1024] = "", id[128] = "", msg[1024] = "", line[512] = "", cluster[8192] = "", **addrs = NULL;
  size_t n_addrs = 0;
  int owned = 0, rc = 1;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter scale: %s\n", err);
    return 1;
  }
  uint32_t m = (uint32_t)cfg_int(cfg, "embedding_servers");
  orc_t *o = NULL;
  uint64_t it = 0;
  if (es && server_addrs(cfg, workdir, (uint32_t)n, &addrs, &n_addrs, cluster, sizeof cluster)) goto out;
  if (orc_create(cfg, NULL, &o, err, sizeof err) ||
      orc_scale(o, tr ? (uint32_t)n : 0, es ? (uint32_t)n : 0, addrs, n_addrs, id, sizeof id, &it, msg, sizeof msg,
                err, sizeof err)) {
    fprintf(stderr, "chanter scale: %s\n", err);
    goto out;
  }
  if (!cli->json) printf("%s\n", msg);
  int down = es && n < m; /* the servers past n are drained first: the job file follows once the scale is done */
  if (workdir && !down && local_scale(workdir, key, (uint32_t)n, es ? cluster : NULL)) goto out;
  if ((wait || (workdir && down)) && wait_scaled(o, what, (uint32_t)n, it, line, sizeof line)) goto out;
  if (workdir && down && local_scale(workdir, key, (uint32_t)n, cluster)) goto out;
  if (cli->json)
    printf("{\"%s\": %lu, \"checkpoint\": \"%s\", \"at_iteration\": %" PRIu64 ", \"done\": %s}\n", key, n, id, it,
           wait ? "true" : "false");
  else if (wait)
    printf("%s\n", line);
  rc = 0;
out:
  cfg_list_free(addrs, n_addrs);
  orc_destroy(o);
  if (owned) cfg_destroy(cfg);
  return rc;
}
