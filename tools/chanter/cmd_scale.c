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
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "err.h"
#include "json.h"
#include "orc.h"
#include "supervise.h"

/* W/job.ini says trainers = n (as every daemon reads it), and the
 * supervisor is told.  0, or 1 after saying why. */
static int local_scale(const char *workdir, uint32_t n) {
  char path[4200], kv[64], err[1024];
  snprintf(path, sizeof path, "%s/job.ini", workdir);
  snprintf(kv, sizeof kv, "trainers=%u", n);
  cfg_t *c = NULL;
  int rc = cfg_create(&c);
  if (!rc) rc = cfg_load_file(c, path, err, sizeof err);
  if (!rc) rc = cfg_set(c, kv, "chanter scale", err, sizeof err);
  if (!rc) rc = supervise_write_job(c, path, err, sizeof err);
  cfg_destroy(c);
  if (rc) {
    fprintf(stderr, "chanter scale: the oracle scales the job, but %s was not updated: %s\n", path,
            rc < 0 && rc > -4096 && !err[0] ? strerror(-rc) : err);
    return 1;
  }
  pid_t sup = supervise_running(workdir);
  if (!sup || kill(sup, SIGHUP) != 0) {
    fprintf(stderr, "chanter scale: %s says trainers = %u, but no supervisor runs in %s to start or retire trainers\n",
            path, n, workdir);
    return 1;
  }
  return 0;
}

/* Until the job trains on n trainers after iteration c (its summary's
 * scale line), or ends: 0, or 1 after saying why. */
static int wait_scaled(orc_t *o, uint32_t n, uint64_t c, char *line, size_t line_len) {
  char want[128], err[1024];
  snprintf(want, sizeof want, "to %u trainers after iteration %" PRIu64 ":", n, c);
  for (double until = clock_mono_s() + 600;;) {
    Chanter__Oracle__V1__StatusResponse *st = NULL;
    if (orc_status(o, &st, err, sizeof err) == 0) {
      int over = !strcmp(st->state, "failed") || !strcmp(st->state, "stopped") || !strcmp(st->state, "done");
      line[0] = 0;
      json_get_str(st->summary_json ? st->summary_json : "", "scale", line, line_len);
      int done = !strncmp(line, "scaled", 6) && strstr(line, want);
      if (over && !done)
        fprintf(stderr, "chanter scale: the job is %s before it trained on %u trainers: %s\n", st->state, n,
                st->message);
      protobuf_c_message_free_unpacked(&st->base, NULL);
      if (done) return 0;
      if (over) return 1;
    }
    if (clock_mono_s() > until) {
      fprintf(stderr, "chanter scale: the job does not train on %u trainers 600 s after the request\n", n);
      return 1;
    }
    usleep(200000);
  }
}

int cmd_scale(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir"), *tr = cli_opt(cli, "--trainers");
  int wait = cli_flag(cli, "--wait");
  if (cli_done(cli, NULL)) return 2;
  char *end = NULL;
  unsigned long n = tr ? strtoul(tr, &end, 10) : 0;
  if (!tr || !*tr || *end || n > UINT32_MAX) return cli_usage_error(cli, "--trainers needs a count (got '%s')", tr ? tr : "");
  char err[1024] = "", id[128] = "", msg[1024] = "", line[512] = "";
  int owned = 0, rc = 1;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter scale: %s\n", err);
    return 1;
  }
  orc_t *o = NULL;
  uint64_t it = 0;
  if (orc_create(cfg, NULL, &o, err, sizeof err) || orc_scale(o, (uint32_t)n, id, sizeof id, &it, msg, sizeof msg, err,
                                                               sizeof err)) {
    fprintf(stderr, "chanter scale: %s\n", err);
    goto out;
  }
  if (!cli->json) printf("%s\n", msg);
  if (workdir && local_scale(workdir, (uint32_t)n)) goto out;
  if (wait && wait_scaled(o, (uint32_t)n, it, line, sizeof line)) goto out;
  if (cli->json)
    printf("{\"trainers\": %lu, \"checkpoint\": \"%s\", \"at_iteration\": %" PRIu64 ", \"done\": %s}\n", n, id, it,
           wait ? "true" : "false");
  else if (wait)
    printf("%s\n", line);
  rc = 0;
out:
  orc_destroy(o);
  if (owned) cfg_destroy(cfg);
  return rc;
}
