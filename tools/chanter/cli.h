/*
 * The chanter command-line tool: shared declarations of its subcommands.
 * main.c parses the common options (--config, --set, --json) and dispatches.
 */
#ifndef CHANTER_CLI_H
#define CHANTER_CLI_H

#include <stdint.h>

#include "cfg.h"

typedef struct cli_s {
  cfg_t *cfg;
  const char *config_path;  /* --config as given, or NULL */
  char **sets;              /* every --set key=value, in order */
  int n_sets;
  int json;
  const char *cmd;   /* the command being run ("data"), for messages */
  const char *sub;   /* and its subcommand ("gen") once known, or NULL */
  int argc;     /* the subcommand's own arguments, after the common ones */
  char **argv;
} cli_t;

int cmd_config(cli_t *cli);
int cmd_embedding(cli_t *cli);
int cmd_bench(cli_t *cli);
int cmd_data(cli_t *cli);
int cmd_dataproc(cli_t *cli);
int cmd_train(cli_t *cli);
/* train_local.c: `chanter train --local` (cmd_train passes it on);
 * 0, or 1 after saying why on stderr. */
int train_local(cli_t *cli, const char *workdir, int quiet);
/* cmd_train.c: the progress line of a job at iteration it of total, a bar
 * on a terminal, a line every few seconds otherwise. */
void train_progress(int tty, uint64_t it, uint64_t total, double sps, double loss, double eta);
int cmd_local(cli_t *cli);         /* cmd_local.c: local up | down | status */
int cmd_checkpoint(cli_t *cli);    /* cmd_checkpoint.c: a checkpoint of the running job */
int cmd_checkpoints(cli_t *cli);
int cmd_scale(cli_t *cli);         /* cmd_scale.c: the running job goes on with another trainer count */   /* cmd_checkpoint.c: the checkpoints on the servers */
int cmd_drill(cli_t *cli);
int cmd_certs(cli_t *cli);
int cmd_report(cli_t *cli);        /* cmd_report.c: plots of a job from its oracle's timeline */
int cmd_shard(cli_t *cli);         /* cmd_shard.c: shard fit | plan (the cost model, the planner) */
int bench_shard(cli_t *cli);       /* bench_shard.c: the planner's time and predicted balance */
int bench_placement(cli_t *cli);   /* bench_placement.c: autoshard vs lookup_greedy on a cluster, measured */
int bench_scale(cli_t *cli);       /* bench_scale.c: chanter scale's pause and samples/s around it */
int cmd_prometheus(cli_t *cli);    /* cmd_prometheus.c: a Prometheus scrape configuration of the job */         /* cmd_certs.c: a job CA and role certificates for mutual TLS */
/* cmd_certs.c: what `chanter local up` uses: a CA in dir (made unless
 * there) and a certificate per role, dir/<role>.pem and .key (each made
 * unless there).  0, or 1 after saying why on stderr. */
int certs_local(const char *dir);
int bench_recovery(cli_t *cli);    /* bench_recovery.c: recovery time per daemon kind */
int bench_data_parse(cli_t *cli);  /* bench_data.c: parse rates (part of `bench dataproc`) */
int bench_model(cli_t *cli);
int bench_dataproc(cli_t *cli);
int bench_cluster_feed(cli_t *cli); /* bench_feed.c: each daemon thread's CPU per batch fed to one trainer */
int bench_oracle(cli_t *cli);      /* bench_oracle.c: samples/s the oracle decides (plan + cacher) */
int bench_e2e(cli_t *cli);         /* bench_e2e.c: the local cluster, baseline vs ideal */
int bench_tables(cli_t *cli);      /* bench_tables.c: the cost model's dataset (docs/autoshard.md) */
int bench_checkpoint(cli_t *cli);  /* bench_checkpoint.c: whole-job checkpoints: stall, cost, time vs rows changed */

/* The configuration a cluster command should use: --config if given, else
 * DIR/job.ini when workdir has one (written by `chanter local up`), else
 * the defaults; the --set overrides are applied on top either way.  The
 * result is cli->cfg or a new config the caller destroys (*owned = 1). */
cfg_t *cli_cluster_cfg(cli_t *cli, const char *workdir, int *owned, char *err, size_t err_len);

/* The number value of "key" in a flat JSON text (json.h's json_get_num:
 * the first match) as an expression: NAN when absent or null.  For our
 * own summaries, not general JSON. */
double cli_json_num(const char *json, const char *key);

/* An argument error of the running command: prints "chanter CMD SUB: what"
 * (and, when what names an argument that is a job key, the one-line hint
 * "use --set key=value"), then the command's usage once, all on stderr.
 * Returns 2, the exit code of a usage error. */
int cli_usage_error(cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* After a subcommand took its options: 0 when nothing is left, else
 * cli_usage_error naming the first leftover argument ("unexpected
 * argument '--seed'", with the --set hint when it is a job key). */
int cli_done(cli_t *cli, const char *sub);
/* The positional arguments left after the options were taken: 0 when
 * there are min..max of them and none is an option, else the usage error
 * ("expected WHAT, got N arguments", or the leftover option). */
int cli_args(cli_t *cli, int min, int max, const char *sub, const char *what);

/* Removes a boolean flag from cli->argv; 1 if it was there. */
int cli_flag(cli_t *cli, const char *name);
/* Removes "--name VALUE" / "--name=VALUE"; returns VALUE or NULL. */
const char *cli_opt(cli_t *cli, const char *name);

#endif
