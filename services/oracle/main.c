/*
 * chanter-oracle: the job's coordinator and the source of every trainer's
 * work (DESIGN.md sections 3 and 4; this is the baseline, lookahead 0).
 *
 *   chanter-oracle --config job.ini [--set key=value ...]
 *                  [--listen HOST:PORT] [--metrics-port P] [--ready-file PATH]
 *
 * Wiring only: validate the job, start the gRPC server with the Oracle
 * service (oracle_service.c) and the job (oracle_job.c), the Prometheus
 * endpoint (with the job's status page: oracle_page.c), readiness and
 * watchdog.  On SIGTERM the job is stopped (the
 * trainers get StopWork; the server keeps answering for two heartbeat
 * periods, so that a trainer that missed it hears it from a heartbeat),
 * then the server drains and the process exits 0.  The
 * daemon keeps serving Status after the job is over, until it is stopped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "oracle_service.h"
#include "proc.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter-oracle --config FILE [--set key=value ...]\n"
          "                      [--listen HOST:PORT] [--metrics-port P] [--ready-file PATH]\n"
          "Coordinates one training job: membership, rendezvous, batches and their plans, reports, evaluation.\n"
          "  --listen        address to bind (default: cluster.oracle)\n"
          "  --metrics-port  Prometheus port (default: RPC port + oracle.metrics_port_offset)\n"
          "  --ready-file    write {\"rpc_port\":..,\"metrics_port\":..,\"job_id\":..} here once serving\n");
}

/* The first SIGTERM/SIGINT (daemon.c), before the server drains: the job
 * stops first, so that the trainers' streams end at once.  A trainer that
 * missed its StopWork (its feeder waiting for a gate) learns from its next
 * heartbeat that the job is over: while trainers are attached, the server
 * keeps answering for two heartbeat periods before it drains.  A client
 * that polls Status (every 200 ms: chanter train, scale --wait) must see
 * the job stopped too, or it waits trainer.rejoin_timeout_ms for an oracle
 * that is gone: `chanter local down` stops the trainers and the oracle at
 * once, and the trainers may be gone first. */
#define WATCHER_LINGER_MS 600

static void on_stop(daemon_t *d, int signum, void *data) {
  oracle_service_t *svc = data;
  int attached = oracle_service_trainers_attached(svc);
  int watched = oracle_service_status_age_ms(svc) < 2000;
  oracle_service_shutdown(svc, signum == SIGTERM ? "the oracle is shutting down (SIGTERM)"
                                                 : "the oracle is shutting down (SIGINT)");
  int ms = (int)(2 * cfg_int(d->cfg, "trainer.heartbeat_ms") + 250);
  d->linger_ms = attached ? (ms > 5000 ? 5000 : ms) : watched ? WATCHER_LINGER_MS : 0;
}

int main(int argc, char **argv) {
  daemon_t d = {0};
  daemon_args_t args;
  cfg_t *cfg = NULL;
  oracle_service_t *svc = NULL;
  char err[1024] = "";
  int rc = 1;
  const char *listen = NULL;

  proc_init("chanter-oracle");
  if (daemon_parse_args(&args, argc, argv, 0, NULL, usage) || args.help) {
    rc = args.help ? 0 : 1;
    goto out;
  }
  cfg = args.cfg;
  listen = args.listen;
  if (!listen) listen = cfg_str(cfg, "cluster.oracle");
  if (!listen || !*listen) {
    log_error("no address to listen on: set cluster.oracle in the job file (from %s) or pass --listen HOST:PORT",
              cfg_origin(cfg, "cluster.oracle"));
    goto out;
  }
  if (oracle_job_check_cfg(cfg, err, sizeof err)) {
    log_error("cannot run this job: %s", err);
    goto out;
  }
  if (daemon_init(&d, "chanter-oracle", cfg, listen, (int)cfg_int(cfg, "oracle.drain_ms"), "chanter_oracle"))
    goto out_daemon;
  if (oracle_service_create(d.loop, d.server, cfg, d.reg, &svc, err, sizeof err)) {
    log_error("cannot start the oracle: %s", err);
    goto out_daemon;
  }
  char extra[160], status[256];
  snprintf(extra, sizeof extra, "\"job_id\": \"%s\"", oracle_job_id(oracle_service_job(svc)));
  snprintf(status, sizeof status, "waiting for %lld trainers (job %s)", (long long)cfg_int(cfg, "trainers"),
           oracle_job_id(oracle_service_job(svc)));
  d.stop_cb = on_stop;
  d.stop_data = svc;
  if (daemon_start(&d, args.metrics_port, (int)cfg_int(cfg, "oracle.metrics_port_offset"), args.ready_file, extra,
                   status))
    goto out_daemon;
  {
    char addr[280]; /* the listen address with the port bound, for the status page */
    const char *colon = strrchr(d.listen, ':');
    snprintf(addr, sizeof addr, "%.*s:%d", colon ? (int)(colon - d.listen) : (int)strlen(d.listen), d.listen,
             rpc_server_port(d.server));
    oracle_service_set_address(svc, addr);
  }
  log_info("serving listen=%s port=%d metrics_port=%d trainers=%lld iterations=%lld batch_size=%lld dataproc=%s",
           d.listen, rpc_server_port(d.server), d.http ? metrics_http_port(d.http) : 0,
           (long long)cfg_int(cfg, "trainers"), (long long)cfg_int(cfg, "iterations"),
           (long long)cfg_int(cfg, "batch_size"), cfg_str(cfg, "cluster.dataproc"));
  rc = daemon_run(&d);

out_daemon:
  oracle_service_destroy(svc);
  daemon_close(&d);
  if (rc == 0) log_info("stopped cleanly");
out:
  daemon_args_close(&args);
  return rc;
}
