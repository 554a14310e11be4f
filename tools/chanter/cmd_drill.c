/*
 * chanter drill: a failover rehearsal (drill.h says what one does).
 *
 *   chanter [--config job.ini] [--set k=v ...] drill KIND [--rank N] [--at ITER] [--times K]
 *           [--reference DIGEST] [--workdir DIR] [--json]
 *   chanter ... drill chaos --duration SECONDS --every SECONDS [...]
 *
 * KIND: kill-trainer, kill-oracle, kill-embedding, kill-dataproc,
 * hang-trainer, hang-embedding, lose-disk (kill -9 an embedding server and
 * delete its data dir: it restarts from its checkpoint.backup_dir, which the
 * drill puts in its own directory), chaos.  Exit status 0 on PASS (the job completed with the
 * reference's digest), 1 on FAIL, 2 on a usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "drill.h"

static const char *kinds[] = {"kill-trainer", "kill-oracle",  "kill-embedding", "kill-dataproc",
                              "hang-trainer", "hang-embedding", "lose-disk", "chaos"};

static int num(cli_t *cli, const char *name, const char *v, double min, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || *end || end == v || d < min) return cli_usage_error(cli, "%s %s: expected a number >= %g", name, v, min);
  *out = d;
  return 0;
}

int cmd_drill(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected what to rehearse: kill-trainer, kill-oracle, kill-embedding, "
                                                 "kill-dataproc, hang-trainer, hang-embedding, lose-disk or chaos");
  drill_opts_t o = {.kind = cli->argv[0], .rank = -1, .at = -1, .times = 1};
  int known = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) known |= !strcmp(o.kind, kinds[i]);
  if (!known)
    return cli_usage_error(cli, "unknown drill '%s': kill-trainer, kill-oracle, kill-embedding, kill-dataproc, "
                                "hang-trainer, hang-embedding, lose-disk or chaos",
                           o.kind);
  cli->sub = o.kind;
  cli->argc--;
  cli->argv++;
  const char *rank = cli_opt(cli, "--rank"), *at = cli_opt(cli, "--at"), *times = cli_opt(cli, "--times");
  const char *duration = cli_opt(cli, "--duration"), *every = cli_opt(cli, "--every");
  o.reference = cli_opt(cli, "--reference");
  const char *workdir = cli_opt(cli, "--workdir");
  if (cli_done(cli, o.kind)) return 2;
  double d;
  if (rank && num(cli, "--rank", rank, 0, &d)) return 2;
  if (rank) o.rank = (int)d;
  if (at && num(cli, "--at", at, 0, &d)) return 2;
  if (at) o.at = (int64_t)d;
  if (times && num(cli, "--times", times, 1, &d)) return 2;
  if (times) o.times = (int)d;
  if (o.times > DRILL_MAX_KILLS) return cli_usage_error(cli, "--times %d: at most %d", o.times, DRILL_MAX_KILLS);
  int chaos = !strcmp(o.kind, "chaos");
  if (chaos && (!duration || !every)) return cli_usage_error(cli, "chaos needs --duration SECONDS and --every SECONDS");
  if (!chaos && (duration || every)) return cli_usage_error(cli, "--duration and --every are chaos's");
  if (duration && num(cli, "--duration", duration, 0.1, &o.duration)) return 2;
  if (every && num(cli, "--every", every, 0.1, &o.every)) return 2;
  if (o.reference && strlen(o.reference) != 64)
    return cli_usage_error(cli, "--reference %s: expected the 64 hex digits of a job's digest (summary.json)", o.reference);

  char dir[4096], self[4096], sub[4200];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (workdir) {
    snprintf(dir, sizeof dir, "%s", workdir);
    if (mkdir(dir, 0755) && errno != EEXIST) {
      fprintf(stderr, "chanter drill: cannot create %s: %s\n", dir, strerror(errno));
      return 1;
    }
  } else {
    snprintf(dir, sizeof dir, "/tmp/chanter-drill-XXXXXX");
    if (!mkdtemp(dir)) {
      fprintf(stderr, "chanter drill: cannot create a directory under /tmp: %s\n", strerror(errno));
      return 1;
    }
  }
  snprintf(sub, sizeof sub, "%s/drill", dir);
  struct stat sb;
  if (stat(sub, &sb) == 0) {
    fprintf(stderr, "chanter drill: %s exists (an earlier drill's cluster): give another --workdir, or remove it\n", sub);
    return 1;
  }
  char ref[65];
  if (!o.reference) {
    char rd[4200];
    snprintf(rd, sizeof rd, "%s/reference", dir);
    if (stat(rd, &sb) == 0) {
      fprintf(stderr, "chanter drill: %s exists: give another --workdir, or --reference DIGEST\n", rd);
      return 1;
    }
    fprintf(stderr, "chanter drill: the reference: the same job without a fault, in %s\n", rd);
    if (drill_reference(cli, self, rd, ref)) return 1;
    o.reference = ref;
  }
  o.workdir = sub;
  o.quiet = cli->json;
  fprintf(stderr, "chanter drill: %s, in %s\n", o.kind, sub);
  drill_result_t *r = calloc(1, sizeof *r);
  if (!r) return 1;
  int rc = drill_run(cli, self, &o, r);
  if (rc) fprintf(stderr, "chanter drill: %s\n", r->error);
  drill_print(&o, r, cli->json);
  rc = rc || !r->pass;
  free(r);
  return rc;
}
