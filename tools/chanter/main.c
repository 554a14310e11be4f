/*
 * chanter: the command-line tool.
 *
 *   chanter [--config FILE] [--set key=value ...] [--json] COMMAND ...
 *
 * Commands: config, embedding, bench (more arrive with the daemons that
 * need them).  Every command reads the same job configuration as the
 * daemons.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "err.h"
#include "log.h"
#include "proc.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter [--config FILE] [--set key=value ...] [--json] COMMAND ...\n"
          "\n"
          "commands:\n"
          "  config keys                      every job key with its type, default and help\n"
          "  config show [--verbose]          the effective configuration (with origins)\n"
          "  local up|down|status --workdir DIR   a whole cluster on this machine (config, logs, pids in DIR)\n"
          "  train [--workdir DIR]            watch the cluster's job to the end; summary.json in DIR\n"
          "  train --local [--workdir DIR]    train the job's model in this process (no daemons)\n"
          "  embedding lookup KEY...          rows of keys (KEY = TABLE:ROW or a raw uint64)\n"
          "  embedding write KEY=V,V,...      write full rows (vector + optimizer state)\n"
          "  embedding digest                 SHA-256 of every stored row, per server and combined\n"
          "  embedding stats                  per-server counters\n"
          "  embedding checkpoint ID          consistent RocksDB checkpoint on every server\n"
          "  embedding checkpoints            list checkpoints\n"
          "  embedding restore ID             restore every server to checkpoint ID\n"
          "  data gen|convert|stats ...       synthetic data, format conversion, dataset statistics\n"
          "  dataproc info                    what each data processor serves\n"
          "  dataproc batch X [--test]        one batch (digest), from processor X mod P or a live one\n"
          "  dataproc stream FIRST COUNT      a range of batches, resuming across processor restarts\n"
          "  bench embedding [--quick]        Lookup/WriteBack rates: RPC vs in-process vs RocksDB\n"
          "\n"
          "Embedding servers are found through cluster.embedding in the job configuration.\n");
}

int cli_flag(cli_t *cli, const char *name) {
  for (int i = 0; i < cli->argc; i++) {
    if (!strcmp(cli->argv[i], name)) {
      memmove(&cli->argv[i], &cli->argv[i + 1], (size_t)(cli->argc - i) * sizeof(char *));
      cli->argc--;
      return 1;
    }
  }
  return 0;
}

const char *cli_opt(cli_t *cli, const char *name) {
  size_t l = strlen(name);
  for (int i = 0; i < cli->argc; i++) {
    if (!strcmp(cli->argv[i], name) && i + 1 < cli->argc) {
      const char *v = cli->argv[i + 1];
      memmove(&cli->argv[i], &cli->argv[i + 2], (size_t)(cli->argc - i - 1) * sizeof(char *));
      cli->argc -= 2;
      return v;
    }
    if (!strncmp(cli->argv[i], name, l) && cli->argv[i][l] == '=') {
      const char *v = cli->argv[i] + l + 1;
      memmove(&cli->argv[i], &cli->argv[i + 1], (size_t)(cli->argc - i) * sizeof(char *));
      cli->argc--;
      return v;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  cli_t cli = {0};
  char err[1024];
  int rc = 2;
  proc_init("chanter");
  log_level = LOG_WARN;
  if (cfg_create(&cli.cfg)) return 1;
  cli.sets = calloc((size_t)argc + 1, sizeof *cli.sets);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) cli.config_path = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9)) cli.config_path = argv[i] + 9;
    else if (!strcmp(argv[i], "--set") && i + 1 < argc) cli.sets[cli.n_sets++] = argv[++i];
    else if (!strncmp(argv[i], "--set=", 6)) cli.sets[cli.n_sets++] = argv[i] + 6;
  }
  if (cfg_parse_args(cli.cfg, &argc, argv, err, sizeof err)) {
    fprintf(stderr, "chanter: %s\n", err);
    goto out;
  }
  cli.argc = argc - 1;
  cli.argv = argv + 1;
  cli.json = cli_flag(&cli, "--json");
  if (cli_flag(&cli, "--verbose-log")) log_level = LOG_DEBUG;
  if (cli.argc < 1 || !strcmp(cli.argv[0], "help") || !strcmp(cli.argv[0], "--help") || !strcmp(cli.argv[0], "-h")) {
    usage(cli.argc < 1 ? stderr : stdout);
    rc = cli.argc < 1 ? 2 : 0;
    goto out;
  }
  const char *cmd = cli.argv[0];
  cli.argc--;
  cli.argv++;
  if (!strcmp(cmd, "config"))
    rc = cmd_config(&cli);
  else if (!strcmp(cmd, "embedding"))
    rc = cmd_embedding(&cli);
  else if (!strcmp(cmd, "data"))
    rc = cmd_data(&cli);
  else if (!strcmp(cmd, "dataproc"))
    rc = cmd_dataproc(&cli);
  else if (!strcmp(cmd, "train"))
    rc = cmd_train(&cli);
  else if (!strcmp(cmd, "local"))
    rc = cmd_local(&cli);
  else if (!strcmp(cmd, "bench"))
    rc = cmd_bench(&cli);
  else {
    fprintf(stderr, "chanter: unknown command '%s'\n\n", cmd);
    usage(stderr);
  }
out:
  cfg_destroy(cli.cfg);
  free(cli.sets);
  return rc;
}

double cli_json_num(const char *json, const char *key) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = json ? strstr(json, pat) : NULL;
  if (!p) return NAN;
  char *end;
  double v = strtod(p + strlen(pat), &end);
  return end == p + strlen(pat) ? NAN : v; /* null (no number): NaN, not 0 */
}

cfg_t *cli_cluster_cfg(cli_t *cli, const char *workdir, int *owned, char *err, size_t err_len) {
  char path[4096];
  *owned = 0;
  if (cli->config_path || !workdir) return cli->cfg;
  snprintf(path, sizeof path, "%s/job.ini", workdir);
  if (access(path, R_OK) != 0) return cli->cfg;
  cfg_t *c;
  if (cfg_create(&c)) return NULL;
  int rc = cfg_load_file(c, path, err, err_len);
  for (int i = 0; i < cli->n_sets && !rc; i++) rc = cfg_set(c, cli->sets[i], "--set", err, err_len);
  if (!rc) rc = cfg_validate(c, err, err_len);
  if (rc) {
    cfg_destroy(c);
    return NULL;
  }
  *owned = 1;
  return c;
}

int cmd_config(cli_t *cli) {
  if (cli->argc < 1) {
    fprintf(stderr, "chanter config: expected 'keys' or 'show'\n");
    return 2;
  }
  if (!strcmp(cli->argv[0], "keys")) {
    cfg_print_keys(stdout);
    return 0;
  }
  if (!strcmp(cli->argv[0], "show")) {
    cli->argc--;
    cli->argv++;
    cfg_dump(cli->cfg, stdout, cli_flag(cli, "--verbose"));
    return 0;
  }
  fprintf(stderr, "chanter config: unknown subcommand '%s'\n", cli->argv[0]);
  return 2;
}
