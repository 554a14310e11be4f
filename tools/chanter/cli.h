/*
 * The chanter command-line tool: shared declarations of its subcommands.
 * main.c parses the common options (--config, --set, --json) and dispatches.
 */
#ifndef CHANTER_CLI_H
#define CHANTER_CLI_H

#include "cfg.h"

typedef struct cli_s {
  cfg_t *cfg;
  int json;
  int argc;     /* the subcommand's own arguments, after the common ones */
  char **argv;
} cli_t;

int cmd_config(cli_t *cli);
int cmd_embedding(cli_t *cli);
int cmd_bench(cli_t *cli);
int cmd_data(cli_t *cli);
int cmd_dataproc(cli_t *cli);
int cmd_train(cli_t *cli);         /* cmd_train.c: train --local */      /* cmd_dataproc.c: info | batch | stream against data processors */          /* cmd_data.c: data gen | convert | stats */
int bench_data_parse(cli_t *cli);  /* bench_data.c: parse rates (part of `bench dataproc`) */
int bench_model(cli_t *cli);
int bench_dataproc(cli_t *cli);    /* bench_dataproc.c: batches over gRPC vs in-process vs raw read */       /* bench_model.c: model step vs sgemm peak */

/* Removes a boolean flag from cli->argv; 1 if it was there. */
int cli_flag(cli_t *cli, const char *name);
/* Removes "--name VALUE" / "--name=VALUE"; returns VALUE or NULL. */
const char *cli_opt(cli_t *cli, const char *name);

#endif
