/*
 * chanter-trainer: one data-parallel trainer of a job, driven by the
 * oracle's Work stream.
 *
 *   chanter-trainer --config job.ini --rank R [--set key=value ...]
 *                   [--metrics-port P] [--ready-file PATH]
 *                   [--save-dense PATH]
 *
 * Wiring only (the work is in trainer_loop.c, the conductor, and the
 * stages it runs: trainer_state.h says which file does what): parse the
 * configuration, build the trainer, serve Prometheus metrics, then run the
 * training on its own thread while the main thread's libuv loop handles
 * SIGTERM/SIGINT (stop: cancel the Work stream and let the training thread
 * return), the systemd watchdog and the exit.  A trainer serves no RPC.
 * READY=1 (and the ready file) come once the model is built and the
 * metrics endpoint serves -- before the oracle is joined, because the
 * group forms only when every trainer is up, and a launcher that waits for
 * trainer 0 before starting trainer 1 must not deadlock.  STATUS= lines
 * then say what it is doing (joining, forming the group, iteration x/N).
 * Exit status: 0 after StopWork of a finished or stopped job or a
 * requested stop; 1 on a failure of this trainer (systemd restarts it);
 * 3 when the oracle ended the job as failed because of another daemon
 * (the unit's RestartPreventExitStatus=3: restarting cannot help).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "cfg.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "nn.h"
#include "proc.h"
#include "sdn.h"
#include "trainer_loop.h"

/* After a stop signal, how long the training thread may take to return (it
 * may be inside a collective) before the process exits anyway. */
#define STOP_GRACE_MS 10000

typedef struct app_s {
  uv_loop_t *loop;
  uv_signal_t sigterm, sigint;
  uv_async_t done;
  uv_timer_t grace;
  uv_thread_t thread;
  trainer_t *trainer;
  int rc;        /* trainer_run's result */
  int stopping;
} app_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter-trainer --config FILE --rank R [--set key=value ...]\n"
          "                       [--metrics-port P] [--ready-file PATH] [--save-dense PATH]\n"
          "Trains the job's model as trainer R of `trainers`, driven by the oracle (cluster.oracle);\n"
          "rows come from the embedding servers (cluster.embedding).\n"
          "  --rank          this trainer's rank, 0 <= R < trainers (default 0)\n"
          "  --metrics-port  Prometheus port (default trainer.metrics_port; 0 = any free port)\n"
          "  --ready-file    write {\"pid\":..,\"rank\":..,\"metrics_port\":..} here once started\n"
          "  --save-dense    after the last iteration, write the dense parameters (raw float32) here\n");
}

static void train_main(void *arg) {
  app_t *a = arg;
  a->rc = trainer_run(a->trainer);
  uv_async_send(&a->done);
}

static void close_all(app_t *a) {
  uv_signal_stop(&a->sigterm);
  uv_signal_stop(&a->sigint);
  uv_close((uv_handle_t *)&a->sigterm, NULL);
  uv_close((uv_handle_t *)&a->sigint, NULL);
  uv_close((uv_handle_t *)&a->done, NULL);
  if (uv_is_active((uv_handle_t *)&a->grace)) uv_timer_stop(&a->grace);
  uv_close((uv_handle_t *)&a->grace, NULL);
  sdn_watchdog_stop();
}

static void on_done(uv_async_t *h) { close_all(h->data); }

static void on_grace(uv_timer_t *h) {
  (void)h;
  log_error("the training thread did not stop within %d ms (stuck in a collective or an RPC); exiting now",
            STOP_GRACE_MS);
  _exit(1);
}

static void on_signal(uv_signal_t *h, int signum) {
  app_t *a = h->data;
  if (a->stopping++) {
    log_warn("second signal while stopping signal=%d", signum);
    return;
  }
  sdn_stopping();
  char why[64];
  snprintf(why, sizeof why, "signal %d", signum);
  trainer_stop(a->trainer, why);
  uv_timer_start(&a->grace, on_grace, STOP_GRACE_MS, 0);
}

static int write_ready_file(const char *path, uint32_t rank, int metrics_port) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -errno;
  fprintf(f, "{\"pid\": %d, \"rank\": %u, \"rpc_port\": 0, \"metrics_port\": %d}\n", (int)getpid(), rank,
          metrics_port);
  if (fclose(f) != 0) return -errno;
  return rename(tmp, path) ? -errno : 0;
}

int main(int argc, char **argv) {
  cfg_t *cfg = NULL;
  metrics_registry_t *reg = NULL;
  metrics_http_t *http = NULL;
  app_t a;
  memset(&a, 0, sizeof a);
  char err[2048] = "";
  int rc = 1, rank = 0, metrics_port = -1, loop_ready = 0;
  const char *ready_file = NULL, *save_dense = NULL;

  proc_init("chanter-trainer");
  if (cfg_create(&cfg)) return 1;
  if (cfg_parse_args(cfg, &argc, argv, err, sizeof err)) {
    log_error("bad configuration: %s", err);
    goto out;
  }
  log_set_level_str(cfg_str(cfg, "log_level"));
  static const struct option opts[] = {{"rank", required_argument, 0, 'r'},
                                       {"metrics-port", required_argument, 0, 'm'},
                                       {"ready-file", required_argument, 0, 'f'},
                                       {"save-dense", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || v < 0 || v > 65535) {
        log_error("--rank: '%s' is not a rank (0 <= R < trainers)", optarg);
        goto out;
      }
      rank = (int)v;
      break;
    }
    case 'm': metrics_port = atoi(optarg); break;
    case 'f': ready_file = optarg; break;
    case 's': save_dense = optarg; break;
    case 'h': usage(stdout); rc = 0; goto out;
    default: usage(stderr); goto out;
    }
  }
  if (optind < argc) {
    log_error("unexpected argument '%s'", argv[optind]);
    usage(stderr);
    goto out;
  }
  const char *core = nn_blas_better_core();
  if (core)
    log_warn("OpenBLAS picked generic kernels (%s) on this CPU; set OPENBLAS_CORETYPE=%s in the environment "
             "(systemd: Environment=) for ~5x faster matrix products -- on EVERY trainer and in train --local "
             "alike, or results differ in the last bits",
             nn_blas_core(), core);
  if (metrics_port < 0) metrics_port = (int)cfg_int(cfg, "trainer.metrics_port");

  if ((rc = metrics_registry_create("chanter_trainer", &reg)) != 0) {
    log_error("cannot create the metrics registry: %s", err_str(rc));
    rc = 1;
    goto out;
  }
  if ((rc = trainer_create(cfg, (uint32_t)rank, reg, &a.trainer, err, sizeof err)) != 0) {
    log_error("cannot start trainer rank=%d: %s", rank, err[0] ? err : err_str(rc));
    rc = 1;
    goto out;
  }
  if (save_dense && trainer_save_dense_to(a.trainer, save_dense)) {
    log_error("out of memory");
    rc = 1;
    goto out;
  }
  rc = 1;
  if (metrics_http_start(reg, "127.0.0.1", metrics_port, &http)) {
    log_warn("metrics endpoint not started port=%d (in use?); training without it", metrics_port);
    http = NULL;
  }

  a.loop = uv_default_loop();
  uv_signal_init(a.loop, &a.sigterm);
  uv_signal_init(a.loop, &a.sigint);
  uv_async_init(a.loop, &a.done, on_done);
  uv_timer_init(a.loop, &a.grace);
  a.sigterm.data = a.sigint.data = a.done.data = a.grace.data = &a;
  uv_signal_start(&a.sigterm, on_signal, SIGTERM);
  uv_signal_start(&a.sigint, on_signal, SIGINT);
  loop_ready = 1;
  sdn_watchdog_start(a.loop);
  int mport = http ? metrics_http_port(http) : 0;
  if (ready_file && (rc = write_ready_file(ready_file, (uint32_t)rank, mport)) != 0)
    log_warn("cannot write ready file path=%s err=\"%s\"", ready_file, err_str(rc));
  rc = 1;
  sdn_ready();
  sdn_status("starting (rank %d of %lld)", rank, (long long)cfg_int(cfg, "trainers"));
  log_info("started rank=%d trainers=%lld mode=%s model=%s batch_size=%lld iterations=%lld metrics_port=%d oracle=%s",
           rank, (long long)cfg_int(cfg, "trainers"), cfg_str(cfg, "mode"), cfg_str(cfg, "model"),
           (long long)cfg_int(cfg, "batch_size"), (long long)cfg_int(cfg, "iterations"), mport,
           cfg_str(cfg, "cluster.oracle"));
  if (uv_thread_create(&a.thread, train_main, &a) != 0) {
    log_error("cannot start the training thread");
    close_all(&a);
    uv_run(a.loop, UV_RUN_DEFAULT);
    goto out;
  }
  uv_run(a.loop, UV_RUN_DEFAULT);
  uv_thread_join(&a.thread);
  rc = a.rc == TRAINER_JOB_FAILED ? 3 : a.rc ? 1 : 0;
  sdn_status("%s", rc == 3 ? "the job failed (see the oracle's log)" : rc ? "failed (see the log)" : "stopped");
  if (rc == 0) log_info("stopped cleanly rank=%d", rank);
  else log_info("exiting rank=%d status=%d", rank, rc);

out:
  if (loop_ready) uv_loop_close(a.loop);
  metrics_http_stop(http);
  trainer_destroy(a.trainer);
  metrics_registry_destroy(reg);
  cfg_destroy(cfg);
  return rc;
}
