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
 * return), the systemd watchdog and the exit.  A trainer serves no RPC:
 * it is a daemon.c daemon without a server, whose first signal calls
 * on_stop and whose loop ends (daemon_done) when the training thread has
 * returned.
 * READY=1 (and the ready file) come once the model is built and the
 * metrics endpoint serves -- before the oracle is joined, because the
 * group forms only when every trainer is up, and a launcher that waits for
 * trainer 0 before starting trainer 1 must not deadlock.  STATUS= lines
 * then say what it is doing (joining, forming the group, iteration x/N).
 * Exit status: 0 after StopWork of a finished or stopped job or a
 * requested stop; 1 on a failure of this trainer that another process may
 * cure (systemd restarts it) -- the loss of a peer or of the oracle is not
 * one: the trainer stays up and joins the job's next generation; 3 when
 * the oracle ended the job as failed because of another daemon (the
 * unit's RestartPreventExitStatus=3: restarting cannot help).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "blas_cpu.h"
#include "cfg.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "proc.h"
#include "sdn.h"
#include "trainer_loop.h"

/* After a stop signal, how long the training thread may take to return (it
 * may be inside a collective) before the process exits anyway. */
#define STOP_GRACE_MS 10000

typedef struct app_s {
  daemon_t *d;
  uv_async_t done;
  uv_timer_t grace;
  uv_thread_t thread;
  trainer_t *trainer;
  int rc;        /* trainer_run's result */
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
  proc_name_thread("trainer-step");
  app_t *a = arg;
  a->rc = trainer_run(a->trainer);
  uv_async_send(&a->done);
}

static void close_all(app_t *a) {
  daemon_done(a->d);
  uv_close((uv_handle_t *)&a->done, NULL);
  if (uv_is_active((uv_handle_t *)&a->grace)) uv_timer_stop(&a->grace);
  uv_close((uv_handle_t *)&a->grace, NULL);
}

static void on_done(uv_async_t *h) { close_all(h->data); }

static void on_grace(uv_timer_t *h) {
  (void)h;
  log_error("the training thread did not stop within %d ms (stuck in a collective or an RPC); exiting now",
            STOP_GRACE_MS);
  _exit(1);
}

/* The first SIGTERM/SIGINT (daemon.c has told systemd STOPPING=1). */
static void on_stop(daemon_t *d, int signum, void *data) {
  (void)d;
  app_t *a = data;
  char why[64];
  snprintf(why, sizeof why, "signal %d", signum);
  trainer_stop(a->trainer, why);
  uv_timer_start(&a->grace, on_grace, STOP_GRACE_MS, 0);
}

/* --rank R: 0 <= R <= 65535 here; trainer_create checks R < trainers. */
static int parse_rank(const char *arg, void *out) {
  char *end;
  long v = strtol(arg, &end, 10);
  if (*end || v < 0 || v > 65535) {
    log_error("--rank: '%s' is not a rank (0 <= R < trainers)", arg);
    return -EINVAL;
  }
  *(int *)out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  daemon_t d = {0};
  daemon_args_t args;
  cfg_t *cfg = NULL;
  app_t a;
  memset(&a, 0, sizeof a);
  a.d = &d;
  char err[2048] = "";
  int rc = 1, rank = 0, metrics_port = -1;
  const char *save_dense = NULL;

  blas_cpu_init(argv); /* may re-execute: first, before any thread or socket */
  proc_init("chanter-trainer");
  const daemon_opt_t opts[] = {{"rank", parse_rank, &rank}, {"save-dense", daemon_opt_str, &save_dense}, {NULL}};
  if (daemon_parse_args(&args, argc, argv, DAEMON_ARGS_NO_LISTEN, opts, usage) || args.help) {
    rc = args.help ? 0 : 1;
    goto out;
  }
  cfg = args.cfg;
  metrics_port = args.metrics_port;
  /* the kernel set blas_cpu_init chose; every trainer of a job should run
   * the same one, or their results differ in the last bits */
  if (blas_cpu_by() == BLAS_CPU_NOT_FIXED) log_warn("blas: %s: matrix products run 3-9x slower", blas_cpu_describe());
  else log_info("blas: %s", blas_cpu_describe());
  if (metrics_port < 0) metrics_port = (int)cfg_int(cfg, "trainer.metrics_port");

  if (daemon_init(&d, "chanter-trainer", cfg, NULL, 0, "chanter_trainer")) goto out;
  if ((rc = trainer_create(cfg, (uint32_t)rank, d.reg, &a.trainer, err, sizeof err)) != 0) {
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
  /* the handles of the training thread's end and the stop's grace period,
   * before any signal can arrive (signals are handled inside daemon_run) */
  uv_async_init(d.loop, &a.done, on_done);
  uv_timer_init(d.loop, &a.grace);
  a.done.data = a.grace.data = &a;
  d.stop_cb = on_stop;
  d.stop_data = &a;
  char extra[64], status[128];
  snprintf(extra, sizeof extra, "\"rank\": %d", rank);
  snprintf(status, sizeof status, "starting (rank %d of %lld)", rank, (long long)cfg_int(cfg, "trainers"));
  daemon_start(&d, metrics_port, 0, args.ready_file, extra, status); /* without a server it cannot fail */
  int mport = d.http ? metrics_http_port(d.http) : 0;
  log_info("started rank=%d trainers=%lld mode=%s model=%s batch_size=%lld iterations=%lld metrics_port=%d oracle=%s",
           rank, (long long)cfg_int(cfg, "trainers"), cfg_str(cfg, "mode"), cfg_str(cfg, "model"),
           (long long)cfg_int(cfg, "batch_size"), (long long)cfg_int(cfg, "iterations"), mport,
           cfg_str(cfg, "cluster.oracle"));
  if (uv_thread_create(&a.thread, train_main, &a) != 0) {
    log_error("cannot start the training thread");
    close_all(&a);
    daemon_run(&d);
    goto out;
  }
  daemon_run(&d);
  uv_thread_join(&a.thread);
  rc = a.rc == TRAINER_JOB_FAILED ? 3 : a.rc ? 1 : 0;
  sdn_status("%s", rc == 3 ? "the job failed (see the oracle's log)" : rc ? "failed (see the log)" : "stopped");
  if (rc == 0) log_info("stopped cleanly rank=%d", rank);
  else log_info("exiting rank=%d status=%d", rank, rc);

out:
  trainer_destroy(a.trainer); /* the training thread has returned */
  daemon_close(&d);           /* the metrics endpoint, then the registry the trainer's metrics are in */
  daemon_args_close(&args);
  return rc;
}
