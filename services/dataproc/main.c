/*
 * chanter-dataproc: serves batches of the job's dataset.
 *
 *   chanter-dataproc --config job.ini --index N [--set key=value ...]
 *                    [--listen HOST:PORT] [--metrics-port P] [--ready-file PATH]
 *
 * Stateless: batch x is a pure function of (dataset, split, x, batch size),
 * so several processors serve one job and a restarted one carries on.
 * Wiring only: open the dataset (validating it), start the gRPC server and
 * the Prometheus endpoint, readiness and watchdog, drain on SIGTERM.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "daemon.h"
#include "data.h"
#include "dataproc_service.h"
#include "dpc.h"
#include "err.h"
#include "log.h"
#include "proc.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter-dataproc --config FILE --index N [--set key=value ...]\n"
          "                        [--listen HOST:PORT] [--metrics-port P] [--ready-file PATH]\n"
          "Serves batches of the job's dataset (the dataset key) to the oracle.\n"
          "  --index       which data processor this is (default 0)\n"
          "  --listen      address to bind (default: entry N of cluster.dataproc)\n"
          "  --metrics-port  Prometheus port (default: RPC port + dataproc.metrics_port_offset)\n"
          "  --ready-file  write {\"rpc_port\":..,\"metrics_port\":..} here once serving\n");
}

int main(int argc, char **argv) {
  daemon_t d = {0};
  daemon_args_t args;
  cfg_t *cfg = NULL;
  data_source_t *src = NULL;
  dataproc_service_t *svc = NULL;
  char err[1024];
  int rc = 1, index = 0;
  const char *listen = NULL;
  char **addrs = NULL;
  size_t n_addrs = 0;

  proc_init("chanter-dataproc");
  const daemon_opt_t opts[] = {{"index", daemon_opt_int, &index}, {NULL}};
  if (daemon_parse_args(&args, argc, argv, 0, opts, usage) || args.help) {
    rc = args.help ? 0 : 1;
    goto out;
  }
  cfg = args.cfg;
  listen = args.listen;
  if (cfg_list(cfg, "cluster.dataproc", &addrs, &n_addrs)) goto out;
  if (!listen) {
    if (index < 0 || (size_t)index >= n_addrs) {
      log_error("no address for data processor %d: set cluster.dataproc in the job file or pass --listen HOST:PORT",
                index);
      goto out;
    }
    listen = addrs[index];
  }
  if ((rc = data_open(cfg, &src, err, sizeof err)) != 0) {
    log_error("cannot open the dataset: %s", err);
    rc = 1;
    goto out;
  }
  rc = 1;
  /* libuv sizes its worker pool from this at the pool's first use (no
   * work was queued yet in this process) */
  uint32_t threads = dataproc_build_threads(cfg);
  char nthreads[16];
  snprintf(nthreads, sizeof nthreads, "%u", threads);
  setenv("UV_THREADPOOL_SIZE", nthreads, 1);
  data_stats_t ds;
  data_stats(src, &ds);
  if (daemon_init_max_receive(&d, "chanter-dataproc", cfg, listen, (int)cfg_int(cfg, "dataproc.drain_ms"),
                              "chanter_dataproc", DATAPROC_MAX_REQUEST))
    goto out_daemon;
  if (dataproc_service_create(d.loop, d.server, src, cfg_str(cfg, "dataset"), dataproc_max_batch(cfg), threads,
                              d.reg, &svc))
    goto out_daemon;
  char extra[64], status[256];
  snprintf(extra, sizeof extra, "\"index\": %d", index);
  snprintf(status, sizeof status, "serving %s (%llu samples)", cfg_str(cfg, "dataset"), (unsigned long long)ds.samples);
  if (daemon_start(&d, args.metrics_port, (int)cfg_int(cfg, "dataproc.metrics_port_offset"), args.ready_file, extra,
                   status))
    goto out_daemon;
  log_info("serving index=%d listen=%s port=%d metrics_port=%d dataset=%s samples=%llu train=%llu test=%llu "
           "bad_records=%llu schema_hash=%016llx build_threads=%u",
           index, d.listen, rpc_server_port(d.server), d.http ? metrics_http_port(d.http) : 0, cfg_str(cfg, "dataset"),
           (unsigned long long)ds.samples, (unsigned long long)ds.train_samples, (unsigned long long)ds.test_samples,
           (unsigned long long)ds.bad_records, (unsigned long long)dpc_schema_hash(data_schema(src)), threads);
  rc = daemon_run(&d);

out_daemon:
  daemon_close(&d);
  dataproc_service_destroy(svc);
  if (src) data_close(src);
  if (rc == 0) log_info("stopped cleanly");
out:
  cfg_list_free(addrs, n_addrs);
  daemon_args_close(&args);
  return rc;
}
