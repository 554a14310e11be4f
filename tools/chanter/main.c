/*
 * chanter: the command-line tool.
 *
 *   chanter [--config FILE] [--set key=value ...] [--json] COMMAND ...
 *
 * Commands: config, local, train, embedding, data, dataproc, bench (the
 * table `commands` below, with each one's usage).  Every command takes
 * --help.  Every command reads the same job configuration as the daemons;
 * a job key given as an option (--seed 1) is answered with the --set form.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas_cpu.h"
#include "cli.h"
#include "err.h"
#include "hosts.h"
#include "json.h"
#include "log.h"
#include "proc.h"

/* Every command, its usage (printed once: on --help to stdout, after an
 * argument error to stderr) and what runs it. */
typedef struct command_s {
  const char *name;
  int (*run)(cli_t *cli);
  const char *usage;
} command_t;

static const command_t commands[] = {
    {"config", cmd_config,
     "usage: chanter [--config FILE] [--set k=v ...] config keys | show [--verbose]\n"
     "  keys            every job key with its type, default, bounds and help\n"
     "  show            the effective configuration as a job file (--verbose: with origins)\n"},
    {"local", cmd_local,
     "usage: chanter [--config FILE] [--set k=v ...] local up [--insecure] [--hosts N|auto [--link RATE,DELAY[,LOSS]]]\n"
     "                                                  | down | status --workdir DIR [--json]\n"
     "  up              start every daemon of the job on 127.0.0.1 under a supervisor that restarts the ones\n"
     "                  that fail (local.restart_ms, local.restart_burst, local.watchdog_ms); DIR/job.ini has\n"
     "                  their addresses, DIR/logs/supervisor.log what the supervisor did.  They speak mutual\n"
     "                  TLS with a certificate per role from DIR/certs (made once), unless the job names its\n"
     "                  own (tls.*) or --insecure is given\n"
     "  --hosts N|auto  (root) on N emulated hosts: network namespaces on a bridge of their own, 10.77.0.K;\n"
     "                  auto = trainers + embedding servers + 1 (local.hosts); the CLI reaches them through\n"
     "                  the namespace named in DIR/run/netns-ops\n"
     "  --link R,D[,L]  each host's link: rate R as tc spells it (1gbit, 100mbit), shaped with tbf both ways;\n"
     "                  delay D and loss L must be 0: this kernel has no netem (local.link)\n"
     "  down            stop them (SIGTERM, then SIGKILL after 15 s), the supervisor and the emulated hosts\n"
     "  status          which are alive, their restarts, last exit and STATUS\n"
     "  supervise       the supervisor itself (`up` starts it; not run by hand)\n"},
    {"train", cmd_train,
     "usage: chanter [--config FILE] [--set k=v ...] train [--workdir DIR] [--quiet] [--resume [latest|ID] | --fresh]\n"
     "       chanter [--config FILE] [--set k=v ...] train --local [--workdir DIR]\n"
     "  (cluster)       watch the cluster's job to the end; summary in DIR/summary.json\n"
     "  --resume [ID]   the servers hold a stopped job: restore them to its latest (or the named) complete\n"
     "                  checkpoint and go on from it\n"
     "  --old-data-dirs PATTERN  a checkpoint taken on another embedding_servers count is resharded from the old\n"
     "                  servers' data dirs (%i = index; default DIR/embedding-%i with --workdir, else embedding.data_dir)\n"
     "  --fresh         the servers hold another job's state: clear them and start at iteration 0\n"
     "  --local         train the job's model in this process, no daemons\n"},
    {"checkpoint", cmd_checkpoint,
     "usage: chanter [--config FILE] [--set k=v ...] checkpoint [--workdir DIR] [--wait] [--json]\n"
     "  a whole-job checkpoint of the running job, as soon as possible (--wait: until it is complete)\n"},
    {"scale", cmd_scale,
     "usage: chanter [--config FILE] [--set k=v ...] scale --trainers N | --embedding-servers N [--workdir DIR]\n"
     "                                                 [--wait] [--json]\n"
     "  the running job goes on with N trainers (or N embedding servers: the rows whose owner changes move server\n"
     "  to server) from its next checkpoint, as a resume on N would; with --workdir the local cluster's job file\n"
     "  and supervisor follow (--wait: until it trains on them)\n"},
    {"checkpoints", cmd_checkpoints,
     "usage: chanter [--config FILE] [--set k=v ...] checkpoints [--workdir DIR] [--json]\n"
     "  the checkpoints on the embedding servers: id, iteration, time, size per server, complete or not\n"},
    {"certs", cmd_certs,
     "usage: chanter certs init --dir D [--days N]\n"
     "       chanter certs issue --dir D --role trainer|oracle|embedding|dataproc|admin --name N\n"
     "                           [--host H,H...] [--days N]\n"
     "  init            a job CA: D/ca.pem (every host's tls.ca_file) and D/ca.key (keep it off the cluster)\n"
     "  issue           D/N.pem and D/N.key for one host or tool, signed by the CA; the role is in the\n"
     "                  certificate (subjectAltName URI chanter://role/ROLE), with DNS:N, IP:127.0.0.1 and\n"
     "                  each --host; valid --days (825)\n"},
    {"drill", cmd_drill,
     "usage: chanter [--config FILE] [--set k=v ...] drill KIND [--rank N] [--at ITER] [--times K]\n"
     "                                                [--reference DIGEST] [--workdir DIR] [--json]\n"
     "       chanter [--config FILE] [--set k=v ...] drill chaos --duration S --every S [...]\n"
     "  a failover rehearsal: run the job on a local cluster (chanter local up, whose supervisor restarts what\n"
     "  dies), kill a daemon while it trains, and check that the job ends with the digest of a run without the\n"
     "  fault (the reference, run first unless --reference gives its digest); prints the timeline: killed,\n"
     "  detected, restarted, rolled back, first replayed iteration, caught up; exit 0 on PASS, 1 on FAIL\n"
     "  KIND            kill-trainer, kill-oracle, kill-embedding, kill-dataproc (kill -9), hang-trainer,\n"
     "                  hang-embedding (kill -STOP: heartbeats, timeouts and the supervisor's watchdog end it)\n"
     "                  lose-disk (kill -9 of an embedding server and its data dir deleted: it restores its\n"
     "                  checkpoint.backup_dir, kept in the drill's directory, and the job rolls back)\n"
     "  --rank N        which trainer (default the last), embedding server or data processor (default 0)\n"
     "  --at ITER       the first kill once every trainer finished ITER iterations (default a third of the job)\n"
     "  --times K       K kills, each next one while the job replays after the one before (default 1)\n"
     "  chaos           a random daemon every --every seconds for --duration seconds\n"
     "  --workdir DIR   where the clusters and their logs go (default a new /tmp/chanter-drill-*)\n"},
    {"prometheus-config", cmd_prometheus,
     "usage: chanter [--config FILE] [--set k=v ...] prometheus-config [--workdir DIR] [--job-name NAME]\n"
     "                                                [--scrape-interval DURATION]\n"
     "  a Prometheus scrape configuration of the job's daemons on stdout: one target per daemon, labelled job\n"
     "  (NAME, default chanter), role and instance; each /metrics where the job file puts it (RPC port +\n"
     "  <role>.metrics_port_offset, trainer.metrics_port), or with --workdir where the local cluster's ready\n"
     "  files say; --scrape-interval (15s) as Prometheus spells it\n"},
    {"report", cmd_report,
     "usage: chanter [--config FILE] [--set k=v ...] report [--workdir DIR] [--out OUT] [--timeline FILE]\n"
     "  plots of the job (finished or running) from its oracle's timeline (oracle.state_dir/timeline.jsonl):\n"
     "  loss and AUC, samples/s with checkpoints and recoveries marked, time by phase, rows moved; PNG and SVG\n"
     "  (gnuplot) and OUT/index.html with them all; OUT defaults to DIR/report\n"},
    {"shard", cmd_shard,
     "usage: chanter [--config FILE] [--set k=v ...] shard fit --data FILE [--out MODEL] [--holdout 0.2] [--seed S]\n"
     "                                                       [--steps N] [--wd W] [--size H1,E,H2] [--json]\n"
     "       chanter [--config FILE] [--set k=v ...] shard plan [--trainers N] [--servers M] [--model FILE] [--json]\n"
     "  fit             fit the sharding cost model to a `chanter bench tables` dataset; prints the absolute and\n"
     "                  relative error on the fitted and the held-out sets, and an additive baseline's\n"
     "  plan            a dry run: per trainer and per embedding server, the tables placed, the predicted cost and\n"
     "                  the degree of balance, for autoshard, lookup_greedy, size_greedy and random (the model:\n"
     "                  --model, else shard.cost_model, else the one built in)\n"},
    {"embedding", cmd_embedding,
     "usage: chanter [--config FILE] [--set k=v ...] embedding SUBCOMMAND [--json]\n"
     "  lookup KEY...          rows of keys (KEY = TABLE:ROW or a raw uint64)\n"
     "  write KEY=V,V,...      write full rows (vector + optimizer state)\n"
     "  digest                 SHA-256 of every stored row, per server and combined\n"
     "  stats                  per-server counters\n"
     "  checkpoint ID          consistent RocksDB checkpoint on every server\n"
     "  checkpoints            list checkpoints\n"
     "  reshape N              the rows of every server of cluster.embedding onto the first N, server to server\n"
     "  restore ID             restore every server to checkpoint ID\n"
     "Servers are found through cluster.embedding in the job configuration.\n"},
    {"data", cmd_data,
     "usage: chanter [--config FILE] [--set k=v ...] data SUBCOMMAND [--json]\n"
     "  gen --out FILE [--format tsv|binary] [--samples N]   synthetic samples, as dataset = synthetic serves them\n"
     "  convert [IN] OUT                                      a dataset into the binary format\n"
     "  stats [FILE]                                          samples, bad records, per-table statistics\n"
     "  bench [--quick] [--samples N]                         parse rates\n"
     "The schema (n_dense, table_rows, ...) and the seed are job keys: --set seed=7.\n"},
    {"dataproc", cmd_dataproc,
     "usage: chanter [--config FILE] [--set k=v ...] dataproc SUBCOMMAND [--test] [--batch-size B] [--json]\n"
     "  info                   what each data processor serves\n"
     "  batch X                one batch (digest), from processor X mod P or a live one\n"
     "  stream FIRST COUNT     a range of batches, resuming across processor restarts\n"},
    {"bench", cmd_bench,
     "usage: chanter [--config FILE] [--set k=v ...] bench WHAT [--quick]\n"
     "  embedding              Lookup/WriteBack rates: RPC vs in-process vs RocksDB\n"
     "  dataproc [--feed]      batches over gRPC vs in-process vs raw read (and data's parse rates), then a\n"
     "                         GPU trainer's feed at batch 16384: each step's cost, build_threads 1 vs default\n"
     "                         (--feed: only that)\n"
     "  feed [--quick]         a cluster feeding one trainer batches of 16384: each daemon thread's CPU ms per\n"
     "                         batch with mutual TLS and in plaintext, each daemon's peak memory\n"
     "  data [--samples N]     parse rates of every format\n"
     "  model [OPTIONS]        model step vs sgemm peak (chanter bench model --help: its options)\n"
     "  oracle                 samples/s the oracle decides (plan + cacher)\n"
     "  shard [--model FILE] [--data FILE] [--runs N]  the sharding planner's time (100 tables on 8 devices, 856\n"
     "                         on 64) against lookup_greedy's, each algorithm's predicted balance; --data: the\n"
     "                         model's held-out error\n"
     "  placement --job FILE [--trainers 2,4] [--rounds N] [--insecure] [--keep]  the partitioned tables placed by\n"
     "                         autoshard vs lookup_greedy on a local cluster, interleaved: each trainer's measured\n"
     "                         time on its tables, measured and predicted balance, steady samples/s\n"
     "  scale [--table-scales 100,10] [--to 3] [--quick] [--hosts N|auto] [--insecure] [--keep]  chanter scale\n"
     "                         --trainers, then --embedding-servers, on a running job: the pause, rows moved, samples/s\n"
     "  e2e [--data independent|sessions|both] [--hosts N|auto [--link RATE,0]] [--insecure] [--report DIR]\n"
     "                         the cluster: baseline vs lookahead vs partition vs table_strategy = auto vs ideal\n"
     "                         per data generator, rows and bytes\n"
     "                         on and off the critical path, the traffic floor; --hosts: on emulated hosts\n"
     "                         (default link 400mbit,0: README \"The benchmark on emulated hosts\")\n"
     "  checkpoint             whole-job checkpoints: samples/s with and without, stall, cost, time vs rows changed\n"
     "  recovery [--runs N] [--kinds K,...] [--report DIR]  failover per daemon kind: detection, restart,\n"
     "                         rollback, replay, against restarting the whole job\n"
     "  (e2e, recovery) --report DIR: each run's plots in DIR/<run>/ (chanter report)\n"
     "  tables [--kind trainer|server|both] [--sets N] [--server-sets M] [--batch B] [--seed S] [--first K] [--out FILE]\n"
     "                         the cost model's dataset: one iteration of sets of 1..8 tables on a trainer\n"
     "                         (pool, fold, row update) and on a server (Lookup + WriteBack, in process);\n"
     "                         default 400 trainer and 200 server sets into tables.dataset (docs/autoshard.md)\n"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const command_t *find_command(const char *name) {
  for (size_t i = 0; name && i < N_COMMANDS; i++)
    if (!strcmp(commands[i].name, name)) return &commands[i];
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter [--config FILE] [--set key=value ...] [--json] COMMAND ...\n"
          "\n"
          "commands (chanter COMMAND --help for each):\n");
  for (size_t i = 0; i < N_COMMANDS; i++) {
    /* each command's summary lines: its usage without the first line */
    const char *u = strchr(commands[i].usage, '\n');
    fprintf(f, "\n%s%s", commands[i].name, u ? u : "\n");
  }
  fprintf(f, "\nEvery command reads the same job configuration as the daemons: `chanter config keys`.\n");
}

/* "--seed" / "--batch-size=8" / "--embedding.hot-mb" -> the job key it
 * spells ("seed", "batch_size", "embedding.hot_mb") in key, or 0. */
static int arg_as_key(const char *arg, char *key, size_t n) {
  if (strncmp(arg, "--", 2) || !arg[2]) return 0;
  size_t i = 0;
  for (const char *p = arg + 2; *p && *p != '=' && i + 1 < n; p++) key[i++] = *p == '-' ? '_' : *p;
  key[i] = 0;
  return cfg_is_key(key);
}

int cli_usage_error(cli_t *cli, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "chanter%s%s%s%s: ", cli->cmd ? " " : "", cli->cmd ? cli->cmd : "", cli->sub ? " " : "",
          cli->sub ? cli->sub : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  const command_t *c = find_command(cli->cmd);
  if (c) fputs(c->usage, stderr);
  else usage(stderr);
  return 2;
}

/* "chanter CMD SUB: unexpected argument 'A'", or the --set hint when A
 * spells a job key (its value: after '=', else the next argument). */
static int bad_arg(cli_t *cli, int i) {
  const char *a = cli->argv[i];
  char key[128];
  if (arg_as_key(a, key, sizeof key)) {
    const char *eq = strchr(a, '=');
    const char *v = eq ? eq + 1 : i + 1 < cli->argc && strncmp(cli->argv[i + 1], "--", 2) ? cli->argv[i + 1] : "VALUE";
    return cli_usage_error(cli, "'%.*s' is a job key, not an option: use --set %s=%s", eq ? (int)(eq - a) : (int)strlen(a),
                           a, key, v);
  }
  return cli_usage_error(cli, "unexpected argument '%s'", a);
}

int cli_args(cli_t *cli, int min, int max, const char *sub, const char *what) {
  if (sub) cli->sub = sub;
  for (int i = 0; i < cli->argc; i++)
    if (!strncmp(cli->argv[i], "--", 2) && cli->argv[i][2]) return bad_arg(cli, i);
  if (cli->argc > max && max == 0) return bad_arg(cli, 0);
  if (cli->argc < min || cli->argc > max)
    return cli_usage_error(cli, "expected %s, got %d argument%s", what, cli->argc, cli->argc == 1 ? "" : "s");
  return 0;
}

int cli_done(cli_t *cli, const char *sub) { return cli_args(cli, 0, 0, sub, "no more arguments"); }

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
  /* OpenBLAS's kernel set (blas_cpu.h): may re-execute, so first; the
   * `local` commands (supervisor, namespaces) do no math */
  if (!(argc > 1 && !strcmp(argv[1], "local"))) blas_cpu_init(argv);
  /* emulated hosts (hosts.h): the supervisor's way into a host's namespace,
   * and the CLI's into its cluster's ops namespace -- first, before any
   * thread or socket exists */
  if (argc > 2 && !strcmp(argv[1], "local") && !strcmp(argv[2], "exec-in")) return hosts_exec_in(argc, argv);
  if (hosts_join_ops(argc, argv)) return 1;
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
    const command_t *c = cli.argc > 1 ? find_command(cli.argv[1]) : NULL; /* chanter help data */
    if (c) fputs(c->usage, stdout);
    else usage(cli.argc < 1 ? stderr : stdout);
    rc = cli.argc < 1 ? 2 : 0;
    goto out;
  }
  const command_t *c = find_command(cli.argv[0]);
  if (!c) {
    fprintf(stderr, "chanter: unknown command '%s'\n\n", cli.argv[0]);
    usage(stderr);
    goto out;
  }
  cli.cmd = c->name;
  cli.argc--;
  cli.argv++;
  /* --help (or -h, or `help` as the subcommand) anywhere after the
   * command: its usage once, exit 0, before anything opens a dataset or
   * calls a server.  `bench model` has options of its own and says them. */
  int model_bench = !strcmp(c->name, "bench") && cli.argc > 0 && !strcmp(cli.argv[0], "model");
  if (!model_bench && ((cli.argc > 0 && !strcmp(cli.argv[0], "help")) || cli_flag(&cli, "--help") || cli_flag(&cli, "-h"))) {
    fputs(c->usage, stdout);
    rc = 0;
    goto out;
  }
  rc = c->run(&cli);
out:
  cfg_destroy(cli.cfg);
  free(cli.sets);
  return rc;
}

double cli_json_num(const char *json, const char *key) {
  double v;
  return json_get_num(json, key, &v) == 0 ? v : NAN; /* null (no number): NaN, not 0 */
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
  if (cli->argc < 1) return cli_usage_error(cli, "expected 'keys' or 'show'");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (!strcmp(sub, "keys")) {
    if (cli_done(cli, "keys")) return 2;
    cfg_print_keys(stdout);
    return 0;
  }
  if (!strcmp(sub, "show")) {
    int verbose = cli_flag(cli, "--verbose");
    if (cli_done(cli, "show")) return 2;
    cfg_dump(cli->cfg, stdout, verbose);
    return 0;
  }
  return cli_usage_error(cli, "unknown subcommand '%s'", sub);
}
