/*
 * chanter bench e2e: the whole cluster, baseline against ideal.
 *
 * Runs the same job twice on a local cluster (`chanter local up`: one data
 * processor, two embedding servers, the oracle, two trainers): mode =
 * normal with lookahead 0 (the baseline: every row fetched for its batch
 * and written back after it) and mode = ideal (no embedding traffic at all,
 * the lower bound of iteration time), and prints samples/s and the time per
 * phase side by side.  This is the table the lookahead cache must beat.
 * The job comes from --config/--set (defaults: DLRM, batch 1024, 200
 * iterations; --quick: 60).  Prints only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

/* up, train, down in dir; returns the summary text (caller frees) */
static char *run(cli_t *cli, const char *self, const char *dir, const char *mode, int iters) {
  char cmd[8192];
  int o = snprintf(cmd, sizeof cmd, "'%s'", self);
  if (cli->config_path) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  o += snprintf(cmd + o, sizeof cmd - (size_t)o,
                " --set mode=%s --set lookahead=0 --set iterations=%d --set trainers=2 --set embedding_servers=2"
                " --set dataprocs=1 --set eval_batches=0 local up --workdir '%s' >'%s.up' 2>&1",
                mode, iters, dir, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench e2e: local up failed; see %s.up\n", dir);
    return NULL;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench e2e: local down reported a problem in %s\n", dir);
  if (rc != 0) {
    fprintf(stderr, "bench e2e: the %s job failed; see %s.train and %s/logs/\n", mode, dir, dir);
    return NULL;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  return slurp(path);
}

int bench_e2e(cli_t *cli) {
  int quick = cli_flag(cli, "--quick");
  int iters = quick ? 60 : 200;
  char self[4096], tmp[] = "/tmp/chanter-bench-e2e-XXXXXX", dn[4200], di[4200];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) return 1;
  snprintf(dn, sizeof dn, "%s/baseline", tmp);
  snprintf(di, sizeof di, "%s/ideal", tmp);
  printf("chanter bench e2e: local cluster (1 data processor, 2 embedding servers, oracle, 2 trainers), %d iterations, "
         "batch %lld\n\n",
         iters, (long long)cfg_int(cli->cfg, "batch_size"));
  char *sn = run(cli, self, dn, "normal", iters), *si = run(cli, self, di, "ideal", iters);
  int rc = 1;
  if (sn && si) {
    static const char *ph[] = {"wait", "fetch", "forward", "backward", "allreduce", "update", "write_back", "total"};
    static const char *names[] = {"data wait", "fetch", "forward", "backward", "all-reduce", "update", "write-back",
                                  "iteration"};
    double a = cli_json_num(sn, "samples_per_sec"), b = cli_json_num(si, "samples_per_sec");
    printf("%-28s %14s %14s %9s\n", "", "baseline L=0", "ideal", "ideal/base");
    printf("%-28s %14.0f %14.0f %8.2fx\n", "samples/s", a, b, b / a);
    const char *pa = strstr(sn, "\"phase_seconds\""), *pb = strstr(si, "\"phase_seconds\"");
    for (int i = 0; i < 8; i++)
      printf("%-28s %12.2f ms %11.2f ms\n", names[i], 1e3 * cli_json_num(pa, ph[i]), 1e3 * cli_json_num(pb, ph[i]));
    printf("%-28s %14.0f %14.0f\n", "rows fetched / iteration", cli_json_num(sn, "rows_fetched"),
           cli_json_num(si, "rows_fetched"));
    printf("%-28s %14.0f %14.0f\n", "rows synchronized / iter.", cli_json_num(sn, "rows_synced"),
           cli_json_num(si, "rows_synced"));
    printf("%-28s %14.0f %14.0f\n", "rows written back / iter.", cli_json_num(sn, "rows_written_back"),
           cli_json_num(si, "rows_written_back"));
    printf("\n(per-phase times are means over trainers and iterations; ideal keeps every row in the trainer and is "
           "not a correct distributed model, only the lower bound of iteration time)\n");
    rc = 0;
  }
  free(sn);
  free(si);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (rc == 0 && system(cmd) != 0) fprintf(stderr, "bench e2e: could not remove %s\n", tmp);
  return rc;
}
