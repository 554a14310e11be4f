/*
 * chanter bench dataproc: how fast batches reach a client.
 *
 * First the data module's own figures (bench_data_parse: TSV parse, binary
 * batches, raw reads), then, on a generated Criteo-shaped binary file
 * (200k samples; 50k with --quick), at batch 4096:
 *   - a raw sequential read(2) of the file (MB/s, and the samples that many
 *     bytes hold),
 *   - data_read_batch in-process (what a processor does per batch),
 *   - the real chanter-dataproc over loopback gRPC: GetBatch with 1 and 2
 *     client threads, and one StreamBatches stream,
 * each as samples/s and as a share of the in-process rate.  Prints only.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "data.h"
#include "dpc.h"
#include "err.h"

#define BATCH_SIZE 4096

typedef struct getter_s {
  dpc_t *c;
  uint64_t nb, first;
  int stride;
  double until;
  uint64_t samples;
  int failed;
} getter_t;

static void *get_worker(void *arg) {
  getter_t *g = arg;
  char err[512];
  for (uint64_t x = g->first; bench_now() < g->until; x += (uint64_t)g->stride) {
    data_batch_t b;
    if (dpc_get_batch(g->c, DATA_TRAIN, x % g->nb, BATCH_SIZE, &b, err, sizeof err)) {
      fprintf(stderr, "bench dataproc: %s\n", err);
      g->failed = 1;
      break;
    }
    g->samples += b.n;
    data_batch_free(&b);
  }
  return NULL;
}

static double get_rate(dpc_t *c, uint64_t nb, int threads, double secs) {
  pthread_t th[8];
  getter_t g[8];
  double t0 = bench_now();
  for (int i = 0; i < threads; i++) {
    g[i] = (getter_t){.c = c, .nb = nb, .first = (uint64_t)i, .stride = threads, .until = t0 + secs};
    pthread_create(&th[i], NULL, get_worker, &g[i]);
  }
  uint64_t total = 0;
  int failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    total += g[i].samples;
    failed |= g[i].failed;
  }
  return failed ? 0 : (double)total / (bench_now() - t0);
}

static int count_cb(const data_batch_t *b, void *ud) {
  *(uint64_t *)ud += b->n;
  return 0;
}

static void row(const char *what, double samples_s, double mb_s, double base) {
  printf("%-44s %14.0f", what, samples_s);
  if (mb_s > 0)
    printf(" %10.1f", mb_s);
  else
    printf(" %10s", "-");
  if (base > 0)
    printf("   %6.1f%%\n", 100.0 * samples_s / base);
  else
    printf("        -\n");
  fflush(stdout);
}

int bench_dataproc(cli_t *cli) {
  int quick = 0;
  for (int i = 0; i < cli->argc; i++)
    if (!strcmp(cli->argv[i], "--quick")) quick = 1;
  int rc = bench_data_parse(cli);
  if (rc) return rc;
  uint64_t samples = quick ? 50000 : 200000;
  double secs = quick ? 0.5 : 2.0;
  char dir[] = "/tmp/chanter-bench-dp-XXXXXX", bin[256], job[256], ready[256], logf[256], err[1024], kv[300];
  if (!mkdtemp(dir)) return 1;
  snprintf(bin, sizeof bin, "%s/criteo.bin", dir);
  snprintf(job, sizeof job, "%s/job.ini", dir);
  snprintf(ready, sizeof ready, "%s/ready.json", dir);
  snprintf(logf, sizeof logf, "%s/dataproc.log", dir);
  cfg_t *cfg = NULL;
  data_source_t *d = NULL;
  dpc_t *c = NULL;
  pid_t pid = 0;
  rc = 1;
  if (cfg_create(&cfg)) goto out;
  snprintf(kv, sizeof kv, "synthetic.samples=%" PRIu64, samples);
  cfg_set(cfg, kv, "bench", err, sizeof err);
  cfg_set(cfg, "test_fraction=0", "bench", err, sizeof err);
  if (data_gen(cfg, bin, DATA_FMT_BINARY, samples, err, sizeof err)) goto fail;
  snprintf(kv, sizeof kv, "dataset=%s", bin);
  cfg_set(cfg, kv, "bench", err, sizeof err);

  printf("\nchanter bench dataproc: batches of %d from a binary file of %" PRIu64 " samples\n\n", BATCH_SIZE, samples);
  printf("%-44s %14s %10s   %7s\n", "path", "samples/s", "MB/s", "vs base");
  /* raw read */
  struct stat sb;
  stat(bin, &sb);
  double per_sample = (double)sb.st_size / (double)samples;
  static char buf[1 << 20];
  double t0 = bench_now();
  uint64_t bytes = 0;
  int fd = open(bin, O_RDONLY);
  ssize_t r;
  while (fd >= 0 && (r = read(fd, buf, sizeof buf)) > 0) bytes += (uint64_t)r;
  if (fd >= 0) close(fd);
  double dt = bench_now() - t0;
  row("raw read(2) of the file (samples it holds)", (double)bytes / per_sample / dt, (double)bytes / dt / 1e6, 0);
  /* in-process */
  if (data_open(cfg, &d, err, sizeof err)) goto fail;
  uint64_t nb = samples / BATCH_SIZE, done = 0;
  t0 = bench_now();
  while (bench_now() - t0 < secs)
    for (uint64_t x = 0; x < nb; x++) {
      data_batch_t b;
      if (data_read_batch(d, DATA_TRAIN, x, BATCH_SIZE, &b, err, sizeof err)) goto fail;
      done += b.n;
      data_batch_free(&b);
    }
  double base = (double)done / (bench_now() - t0);
  row("data_read_batch, in-process (base)", base, 0, 0);
  /* the daemon */
  FILE *f = fopen(job, "w");
  if (!f) goto out;
  fprintf(f, "dataset = %s\ntest_fraction = 0\n[dataproc]\nmetrics_port_offset = 0\n", bin);
  fclose(f);
  char *args[] = {"--config", job, "--listen", "127.0.0.1:0", "--ready-file", ready, NULL};
  int port = bench_start_daemon("chanter-dataproc", args, ready, logf, &pid);
  if (port <= 0) {
    fprintf(stderr, "bench dataproc: the daemon did not start; see %s\n", logf);
    pid = 0;
    goto out;
  }
  snprintf(kv, sizeof kv, "cluster.dataproc=127.0.0.1:%d", port);
  cfg_set(cfg, kv, "bench", err, sizeof err);
  if (dpc_create(cfg, &c, err, sizeof err)) goto fail;
  row("GetBatch over loopback gRPC, 1 thread", get_rate(c, nb, 1, secs), 0, base);
  row("GetBatch over loopback gRPC, 2 threads", get_rate(c, nb, 2, secs), 0, base);
  uint64_t got = 0;
  t0 = bench_now();
  uint64_t count = (uint64_t)((quick ? 0.5 : 2.0) * base / BATCH_SIZE);
  if (count < nb) count = nb;
  if (dpc_stream(c, DATA_TRAIN, 0, count, BATCH_SIZE, count_cb, &got, NULL, err, sizeof err)) goto fail;
  row("StreamBatches over loopback gRPC, 1 stream", (double)got / (bench_now() - t0), 0, base);
  printf("\naim: >= 2M samples/s served from binary\n");
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench dataproc: %s\n", err);
out:
  dpc_destroy(c);
  if (pid > 0 && bench_stop_daemon(pid)) fprintf(stderr, "bench dataproc: the daemon did not stop cleanly; see %s\n", logf);
  data_close(d);
  cfg_destroy(cfg);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "bench dataproc: could not remove %s\n", dir);
  return rc;
}
