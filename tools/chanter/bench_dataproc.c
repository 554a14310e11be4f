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
 * each as samples/s and as a share of the in-process rate.  Then the feed
 * of a GPU trainer: synthetic data of the job the trainers' figures use
 * (26 tables x 100k rows, uniform ids), batch 16384: what one batch costs
 * in each step of its way (generate, encode + pack, unpack + decode, plan
 * for one trainer), and StreamBatches from two processors, one with
 * dataproc.build_threads = 1 (the base) and one with the default, in turn,
 * 1 and 2 streams at once (the oracle keeps 2 per processor).  Prints only.
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
#include <uv.h>

#include "batch_pb.h"
#include "bench_util.h"
#include "cli.h"
#include "clock.h"
#include "data.h"
#include "dpc.h"
#include "err.h"
#include "plan.h"

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
  for (uint64_t x = g->first; clock_mono_s() < g->until; x += (uint64_t)g->stride) {
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
  double t0 = clock_mono_s();
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
  return failed ? 0 : (double)total / (clock_mono_s() - t0);
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

/* ---- the feed of a GPU trainer: batch 16384 of synthetic data */

#define FEED_B 16384

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_ms(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return 1e3 * v[n / 2];
}

typedef struct streamer_s {
  dpc_t *c;
  uint64_t first, count, got;
  int rc;
  char err[512];
} streamer_t;

static void *stream_worker(void *arg) {
  streamer_t *s = arg;
  s->rc = dpc_stream(s->c, DATA_TRAIN, s->first, s->count, FEED_B, count_cb, &s->got, NULL, s->err, sizeof s->err);
  return NULL;
}

/* samples/s of `streams` streams of `count` batches each from c; 0 on error */
static double stream_rate(dpc_t *c, int streams, uint64_t count, uint64_t first) {
  pthread_t th[4];
  streamer_t s[4];
  double t0 = clock_mono_s();
  for (int i = 0; i < streams; i++) {
    s[i] = (streamer_t){.c = c, .first = first + (uint64_t)i * count, .count = count};
    pthread_create(&th[i], NULL, stream_worker, &s[i]);
  }
  uint64_t got = 0;
  int rc = 0;
  for (int i = 0; i < streams; i++) {
    pthread_join(th[i], NULL);
    got += s[i].got;
    if (s[i].rc) {
      fprintf(stderr, "bench dataproc: %s\n", s[i].err);
      rc = s[i].rc;
    }
  }
  return rc ? 0 : (double)got / (clock_mono_s() - t0);
}

static int feed_cfg(cfg_t *cfg, char *err, size_t n) {
  static const char *kv[] = {"dataset=synthetic", "synthetic.alpha=0", "test_fraction=0", "synthetic.samples=100000000",
                             "table_rows=100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,"
                             "100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,100000,"
                             "100000,100000,100000,100000"};
  for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
    if (cfg_set(cfg, kv[i], "bench", err, n)) return ERR_CONFIG;
  return 0;
}

static int bench_feed(const char *dir, int quick) {
  int reps = quick ? 5 : 15, rc = 1;
  char job[256], ready[2][256], logf[2][256], err[1024], kv[300];
  double gen[16], enc[16], dec[16], pln[16];
  cfg_t *cfg = NULL;
  data_source_t *d = NULL;
  dpc_t *c[2] = {NULL, NULL};
  pid_t pid[2] = {0, 0};
  uint8_t *buf = NULL;
  if (cfg_create(&cfg) || feed_cfg(cfg, err, sizeof err)) goto fail;
  if (data_open(cfg, &d, err, sizeof err)) goto fail;
  printf("\nthe feed of a GPU trainer: batches of %d, synthetic (26 tables x 100k rows, uniform ids), median of %d\n\n",
         FEED_B, reps);
  size_t bytes = 0;
  for (int i = 0; i < reps; i++) {
    data_batch_t b, back;
    plan_t plan;
    double t0 = clock_mono_s();
    if (data_read_batch(d, DATA_TRAIN, (uint64_t)i, FEED_B, &b, err, sizeof err)) goto fail;
    double t1 = clock_mono_s();
    Chanter__Dataproc__V1__Batch pb;
    batch_pb_encode_batch(&b, &pb);
    size_t len = protobuf_c_message_get_packed_size(&pb.base);
    if (!buf && !(buf = malloc(len + 4096))) goto fail;
    protobuf_c_message_pack(&pb.base, buf);
    bytes = len;
    double t2 = clock_mono_s();
    Chanter__Dataproc__V1__Batch *m = chanter__dataproc__v1__batch__unpack(NULL, len, buf);
    if (!m || batch_pb_decode_batch(m, &back, err, sizeof err)) goto fail;
    protobuf_c_message_free_unpacked(&m->base, NULL);
    double t3 = clock_mono_s();
    if (plan_build(&back, 1, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &plan)) goto fail;
    double t4 = clock_mono_s();
    plan_close(&plan);
    data_batch_free(&b);
    data_batch_free(&back);
    gen[i] = t1 - t0;
    enc[i] = t2 - t1;
    dec[i] = t3 - t2;
    pln[i] = t4 - t3;
  }
  printf("%-52s %9s\n", "one batch, in-process", "ms");
  printf("%-52s %9.2f\n", "generate (data_read_batch, 1 thread)", median_ms(gen, reps));
  printf("%-52s %9.2f\n", "encode + pack (batch_pb, protobuf-c)", median_ms(enc, reps));
  printf("%-52s %9.2f\n", "unpack + decode (protobuf-c, batch_pb)", median_ms(dec, reps));
  printf("%-52s %9.2f\n", "plan for 1 trainer (plan_build, PLAN_KEYS)", median_ms(pln, reps));
  printf("%-52s %9.1f\n", "bytes on the wire (MB)", (double)bytes / 1e6);
  /* two processors, build_threads 1 and the default */
  snprintf(job, sizeof job, "%s/feed.ini", dir);
  FILE *f = fopen(job, "w");
  if (!f) goto out;
  fprintf(f, "dataset = synthetic\ntest_fraction = 0\ntable_rows = 100000");
  for (int t = 1; t < 26; t++) fprintf(f, ",100000");
  fprintf(f, "\n[synthetic]\nalpha = 0\nsamples = 100000000\n[dataproc]\nmetrics_port_offset = 0\n");
  fclose(f);
  const char *threads[2] = {"dataproc.build_threads=1", "dataproc.build_threads=0"};
  for (int k = 0; k < 2; k++) {
    snprintf(ready[k], sizeof ready[k], "%s/feed-ready-%d.json", dir, k);
    snprintf(logf[k], sizeof logf[k], "%s/feed-%d.log", dir, k);
    char *args[] = {"--config", job, "--listen", "127.0.0.1:0", "--ready-file", ready[k], "--set", (char *)threads[k], NULL};
    int port = bench_start_daemon("chanter-dataproc", args, ready[k], logf[k], &pid[k]);
    if (port <= 0) {
      fprintf(stderr, "bench dataproc: the daemon did not start; see %s\n", logf[k]);
      pid[k] = 0;
      goto out;
    }
    cfg_t *cc = NULL;
    if (cfg_create(&cc) || feed_cfg(cc, err, sizeof err)) goto fail;
    snprintf(kv, sizeof kv, "cluster.dataproc=127.0.0.1:%d", port);
    cfg_set(cc, kv, "bench", err, sizeof err);
    int r = dpc_create(cc, &c[k], err, sizeof err);
    cfg_destroy(cc);
    if (r) goto fail;
  }
  uint32_t dflt = (uint32_t)uv_available_parallelism();
  if (dflt > 8) dflt = 8;
  printf("\n%-52s %14s %9s   %7s\n", "StreamBatches over loopback gRPC", "samples/s", "ms/batch", "vs base");
  uint64_t count = quick ? 8 : 24;
  for (int streams = 1; streams <= 2; streams++) {
    double r[2] = {0, 0};
    int rounds = quick ? 1 : 3;
    for (int round = 0; round < rounds; round++) /* alternate: base, default, base, ... */
      for (int k = 0; k < 2; k++) r[k] += stream_rate(c[k], streams, count, (uint64_t)(round * 2 + k) * 1000) / rounds;
    char what[96];
    snprintf(what, sizeof what, "%d stream%s, build_threads = 1 (base)", streams, streams > 1 ? "s" : "");
    printf("%-52s %14.0f %9.2f        -\n", what, r[0], r[0] > 0 ? 1e3 * FEED_B / r[0] : 0);
    snprintf(what, sizeof what, "%d stream%s, build_threads = default (%u here)", streams, streams > 1 ? "s" : "",
             dflt);
    printf("%-52s %14.0f %9.2f   %6.2fx\n", what, r[1], r[1] > 0 ? 1e3 * FEED_B / r[1] : 0, r[0] > 0 ? r[1] / r[0] : 0);
    fflush(stdout);
  }
  printf("\naim: a batch of %d every 5 ms (3.3M samples/s) for one GPU trainer\n", FEED_B);
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench dataproc: %s\n", err);
out:
  for (int k = 0; k < 2; k++) {
    dpc_destroy(c[k]);
    if (pid[k] > 0 && bench_stop_daemon(pid[k]))
      fprintf(stderr, "bench dataproc: the daemon did not stop cleanly; see %s\n", logf[k]);
  }
  free(buf);
  data_close(d);
  cfg_destroy(cfg);
  return rc;
}

int bench_dataproc(cli_t *cli) {
  int quick = 0;
  int feed_only = 0;
  for (int i = 0; i < cli->argc; i++) {
    if (!strcmp(cli->argv[i], "--quick")) quick = 1;
    if (!strcmp(cli->argv[i], "--feed")) feed_only = 1;
  }
  int rc;
  if (feed_only) {
    char fdir[] = "/tmp/chanter-bench-feed-XXXXXX", cmd[300];
    if (!mkdtemp(fdir)) return 1;
    rc = bench_feed(fdir, quick);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fdir);
    if (system(cmd) != 0) fprintf(stderr, "bench dataproc: could not remove %s\n", fdir);
    return rc;
  }
  rc = bench_data_parse(cli);
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
  double t0 = clock_mono_s();
  uint64_t bytes = 0;
  int fd = open(bin, O_RDONLY);
  ssize_t r;
  while (fd >= 0 && (r = read(fd, buf, sizeof buf)) > 0) bytes += (uint64_t)r;
  if (fd >= 0) close(fd);
  double dt = clock_mono_s() - t0;
  row("raw read(2) of the file (samples it holds)", (double)bytes / per_sample / dt, (double)bytes / dt / 1e6, 0);
  /* in-process */
  if (data_open(cfg, &d, err, sizeof err)) goto fail;
  uint64_t nb = samples / BATCH_SIZE, done = 0;
  t0 = clock_mono_s();
  while (clock_mono_s() - t0 < secs)
    for (uint64_t x = 0; x < nb; x++) {
      data_batch_t b;
      if (data_read_batch(d, DATA_TRAIN, x, BATCH_SIZE, &b, err, sizeof err)) goto fail;
      done += b.n;
      data_batch_free(&b);
    }
  double base = (double)done / (clock_mono_s() - t0);
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
  t0 = clock_mono_s();
  uint64_t count = (uint64_t)((quick ? 0.5 : 2.0) * base / BATCH_SIZE);
  if (count < nb) count = nb;
  if (dpc_stream(c, DATA_TRAIN, 0, count, BATCH_SIZE, count_cb, &got, NULL, err, sizeof err)) goto fail;
  row("StreamBatches over loopback gRPC, 1 stream", (double)got / (clock_mono_s() - t0), 0, base);
  printf("\naim: >= 2M samples/s served from binary\n");
  rc = bench_feed(dir, quick);
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
