/*
 * chanter bench embedding: how fast the embedding server moves rows.
 *
 * For dims 16 and 64, 4096 keys per call, 1 and 4 client threads, uniform
 * and skewed keys, it measures in one run:
 *   - the memory tier in-process (store_lookup),
 *   - raw RocksDB in-process (MultiGet / WriteBatch, memory tier bypassed),
 *   - the real chanter-embedding daemon over loopback gRPC (through embc,
 *     the client trainers use),
 * and prints rows/s, MB/s and the gRPC figure as a share of the in-process
 * memory tier measured just before.  Nothing is a threshold: this prints.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "clock.h"
#include "embc.h"
#include "store.h"
#include "err.h"
#include "log.h"

#define BATCH 4096

typedef struct bench_s {
  uint64_t rows;     /* rows in the table */
  uint32_t dim;
  double seconds;    /* per measurement */
  int skewed;
  int threads;
  /* target */
  store_t *store;
  int store_flags;
  embc_t *client;
  int write;
  /* results */
  uint64_t done_rows;
  int failed;
  char err[512];
} bench_t;

typedef struct worker_s {
  bench_t *b;
  int id;
  uint64_t rows;
} worker_t;

static uint64_t next_key(bench_t *b, uint64_t *s) {
  *s = table_mix64(*s);
  uint64_t r = *s >> 11;
  if (b->skewed && (r % 100) < 90) /* 90% of accesses to the hottest 1% of rows */
    return TABLE_KEY(0, (r / 100) % (b->rows / 100 ? b->rows / 100 : 1));
  return TABLE_KEY(0, (r / 100) % b->rows);
}

static void *worker(void *arg) {
  worker_t *w = arg;
  bench_t *b = w->b;
  uint64_t keys[BATCH], seed = table_mix64((uint64_t)w->id + 1 + (uint64_t)b->skewed * 1000);
  uint32_t f = b->dim; /* sgd: no optimizer state */
  float *rows = malloc((size_t)BATCH * f * sizeof(float));
  for (size_t i = 0; i < (size_t)BATCH * f; i++) rows[i] = (float)i * 1e-6f;
  double end = clock_mono_s() + b->seconds;
  char why[512];
  while (clock_mono_s() < end && !b->failed) {
    if (b->write) {
      /* a write batch holds each key once (as the trainers' write-backs
       * do): a run of rows from a random start */
      uint64_t base = TABLE_ROW(next_key(b, &seed));
      for (int i = 0; i < BATCH; i++) keys[i] = TABLE_KEY(0, (base + (uint64_t)i) % b->rows);
    } else {
      for (int i = 0; i < BATCH; i++) keys[i] = next_key(b, &seed);
    }
    int rc;
    if (b->client)
      rc = b->write ? embc_write(b->client, keys, BATCH, rows, why, sizeof why)
                    : embc_lookup(b->client, keys, BATCH, rows, why, sizeof why);
    else
      rc = b->write ? store_write(b->store, keys, BATCH, rows, (size_t)BATCH * f * 4, b->store_flags, why, sizeof why)
                    : store_lookup(b->store, keys, BATCH, rows, (size_t)BATCH * f * 4, b->store_flags, NULL, why,
                                       sizeof why);
    if (rc) {
      b->failed = 1;
      snprintf(b->err, sizeof b->err, "%s", why);
      break;
    }
    w->rows += BATCH;
  }
  free(rows);
  return NULL;
}

/* Reads every row once, in order, so that the memory tier holds them all
 * before the Lookup figures (otherwise "memory tier" would partly measure
 * RocksDB misses). */
static int warm(bench_t *b) {
  uint64_t keys[BATCH];
  float *rows = malloc((size_t)BATCH * b->dim * sizeof(float));
  char why[512];
  int rc = 0;
  for (uint64_t r = 0; r < b->rows && !rc; r += BATCH) {
    size_t n = b->rows - r < BATCH ? (size_t)(b->rows - r) : BATCH;
    for (size_t i = 0; i < n; i++) keys[i] = TABLE_KEY(0, r + i);
    rc = b->client ? embc_lookup(b->client, keys, n, rows, why, sizeof why)
                   : store_lookup(b->store, keys, n, rows, n * b->dim * 4, 0, NULL, why, sizeof why);
  }
  if (rc) fprintf(stderr, "bench: warm-up failed: %s\n", why);
  free(rows);
  return rc;
}

/* Runs the configured measurement; returns rows/s. */
static double run(bench_t *b) {
  pthread_t th[16];
  worker_t w[16];
  b->failed = 0;
  double t0 = clock_mono_s();
  for (int i = 0; i < b->threads; i++) {
    w[i] = (worker_t){.b = b, .id = i};
    pthread_create(&th[i], NULL, worker, &w[i]);
  }
  uint64_t total = 0;
  for (int i = 0; i < b->threads; i++) {
    pthread_join(th[i], NULL);
    total += w[i].rows;
  }
  double dt = clock_mono_s() - t0;
  if (b->failed) {
    fprintf(stderr, "bench: measurement failed: %s\n", b->err);
    return 0;
  }
  return (double)total / dt;
}

static void row_out(const char *op, uint32_t dim, const char *keys, int threads, const char *path, double rps,
                    double base) {
  double mbs = rps * dim * 4 / 1e6;
  printf("%-10s %4u  %-8s %3d  %-30s %12.0f %9.1f", op, dim, keys, threads, path, rps, mbs);
  if (base > 0)
    printf("   %5.1f%%\n", 100.0 * rps / base);
  else
    printf("       -\n");
  fflush(stdout);
}

/* certs: NULL = plaintext, else the directory of certs_local's files
 * (mutual TLS: the daemon presents embedding.pem, this bench admin.pem) */
static int write_job(const char *path, uint64_t rows, uint32_t dim, const char *data_dir, int port, const char *certs) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  fprintf(f,
          "table_rows = %" PRIu64 "\nembedding_dim = %u\nembedding_optimizer = sgd\nembedding_servers = 1\n"
          "[cluster]\nembedding = 127.0.0.1:%d\n[embedding]\ndata_dir = %s\nhot_mb = 2048\nblock_cache_mb = 256\n"
          "sync_writes = true\nmetrics_port_offset = 0\n",
          rows, dim, port, data_dir);
  if (certs)
    fprintf(f, "[tls]\nca_file = %s/ca.pem\ncert_file = %s/{role}.pem\nkey_file = %s/{role}.key\n", certs, certs,
            certs);
  return fclose(f) ? -errno : 0;
}

/* The real daemon over loopback gRPC on dir's data, plaintext (certs
 * NULL) or mutual TLS: Lookup at each skew and thread count, WriteBack at
 * each thread count.  Each figure is printed against base (Lookup) and
 * wbase (WriteBack) and stored in got / wgot.  0, or 1 after saying why. */
static int daemon_pass(bench_t *b, const char *dir, uint64_t rows, uint32_t dim, const char *certs,
                       double base[2][3], const double *wbase, double got[2][3], double *wgot) {
  static const int threads[2] = {1, 4};
  char job[600], ready[600], logf[600], err[512];
  snprintf(job, sizeof job, "%s/job.ini", dir);
  snprintf(ready, sizeof ready, "%s/ready.json", dir);
  snprintf(logf, sizeof logf, "%s/daemon.log", dir);
  unlink(ready);
  write_job(job, rows, dim, dir, 0, certs);
  pid_t pid;
  char *dargs[] = {"--config", job, "--shard", "0", "--listen", "127.0.0.1:0", "--ready-file", ready, NULL};
  int port = bench_start_daemon("chanter-embedding", dargs, ready, logf, &pid);
  if (port <= 0) {
    fprintf(stderr, "bench: the daemon did not become ready; see %s\n", logf);
    return 1;
  }
  write_job(job, rows, dim, dir, port, certs);
  cfg_t *cfg;
  cfg_create(&cfg);
  if (cfg_load_file(cfg, job, err, sizeof err) || embc_create(cfg, &b->client, err, sizeof err)) {
    fprintf(stderr, "bench: %s\n", err);
    cfg_destroy(cfg);
    bench_stop_daemon(pid);
    return 1;
  }
  const char *path = certs ? "gRPC loopback, mutual TLS" : "gRPC loopback (daemon)";
  b->write = 0;
  int rc = warm(b); /* the daemon's memory tier, as in-process */
  for (int sk = 0; sk < 2 && !rc; sk++)
    for (int ti = 0; ti < 2; ti++) {
      b->skewed = sk;
      b->threads = threads[ti];
      got[sk][ti] = run(b);
      row_out("Lookup", dim, sk ? "skewed" : "uniform", b->threads, path, got[sk][ti], base[sk][ti]);
    }
  b->write = 1;
  b->skewed = 0;
  for (int ti = 0; ti < 2 && !rc; ti++) {
    b->threads = threads[ti];
    wgot[ti] = run(b);
    row_out("WriteBack", dim, "uniform", b->threads, certs ? "gRPC mutual TLS, durable" : "gRPC loopback, durable (daemon)",
            wgot[ti], wbase[ti]);
  }
  embc_destroy(b->client);
  b->client = NULL;
  cfg_destroy(cfg);
  if (bench_stop_daemon(pid)) fprintf(stderr, "bench: the daemon did not stop cleanly; see %s\n", logf);
  return rc;
}

static int bench_dim(cli_t *cli, const char *tmp, uint32_t dim, uint64_t rows, double secs) {
  char dir[512], why[512];
  int rc = 1;
  snprintf(dir, sizeof dir, "%s/dim%u", tmp, dim);
  mkdir(dir, 0755);
  table_layout_t l;
  table_layout_init(&l, 1, 42);
  l.tables[0] = (table_info_t){.rows = rows, .dim = dim, .state_floats = 0};
  store_opts_t so = {.data_dir = dir, .layout = &l, .hot_bytes = (size_t)2048 << 20,
                         .block_cache_bytes = (size_t)256 << 20, .sync_writes = 1};
  store_t *st = NULL;
  if (store_open(&so, &st, why, sizeof why)) {
    fprintf(stderr, "bench: cannot open store in %s: %s\n", dir, why);
    goto out;
  }
  /* populate every row once (so lookups read stored rows, not lazy init) */
  {
    uint64_t keys[BATCH];
    float *buf = malloc((size_t)BATCH * dim * 4);
    for (size_t i = 0; i < (size_t)BATCH * dim; i++) buf[i] = (float)(i % 977) * 1e-3f;
    for (uint64_t r = 0; r < rows; r += BATCH) {
      size_t n = rows - r < BATCH ? (size_t)(rows - r) : BATCH;
      for (size_t i = 0; i < n; i++) keys[i] = TABLE_KEY(0, r + i);
      if (store_write(st, keys, n, buf, n * dim * 4, STORE_WRITE_NO_HOT, why, sizeof why)) {
        fprintf(stderr, "bench: populate failed: %s\n", why);
        free(buf);
        goto out;
      }
    }
    free(buf);
  }
  bench_t b = {.rows = rows, .dim = dim, .seconds = secs, .store = st};
  double base[2][3] = {{0}}; /* [skewed][threads==4] memory tier rate */
  static const int threads[2] = {1, 4};
  if (warm(&b)) goto out;
  for (int sk = 0; sk < 2; sk++)
    for (int ti = 0; ti < 2; ti++) {
      b.skewed = sk;
      b.threads = threads[ti];
      b.store_flags = 0;
      base[sk][ti] = run(&b);
      row_out("Lookup", dim, sk ? "skewed" : "uniform", b.threads, "memory tier, in-process", base[sk][ti], 0);
      b.store_flags = STORE_LOOKUP_NO_HOT;
      row_out("Lookup", dim, sk ? "skewed" : "uniform", b.threads, "RocksDB MultiGet, in-process", run(&b), base[sk][ti]);
    }
  double wbase[2];
  b.write = 1;
  b.skewed = 0;
  b.store_flags = STORE_WRITE_NO_HOT;
  for (int ti = 0; ti < 2; ti++) {
    b.threads = threads[ti];
    wbase[ti] = run(&b);
    row_out("WriteBack", dim, "uniform", b.threads, "RocksDB WriteBatch+fsync, in-proc", wbase[ti], 0);
  }
  store_close(st);
  st = NULL;

  /* the real daemon over loopback gRPC, on the same data: plaintext
   * against the in-process figures, then mutual TLS (what `chanter local
   * up` runs by default) against plaintext */
  double plain[2][3] = {{0}}, wplain[2] = {0}, tls[2][3] = {{0}}, wtls[2] = {0};
  char certs[600];
  snprintf(certs, sizeof certs, "%s/certs", tmp);
  if (daemon_pass(&b, dir, rows, dim, NULL, base, wbase, plain, wplain)) goto out;
  if (access(certs, F_OK) != 0 && certs_local(certs)) goto out;
  printf("%-10s %4s  %-8s %3s  %-30s (%% = share of plaintext gRPC just above)\n", "", "", "", "", "");
  if (daemon_pass(&b, dir, rows, dim, certs, plain, wplain, tls, wtls)) goto out;
  rc = 0;
out:
  if (st) store_close(st);
  table_layout_close(&l);
  return rc;
}

static int bench_embedding(cli_t *cli) {
  int quick = cli_flag(cli, "--quick");
  if (cli_done(cli, "embedding")) return 2;
  char tmp[] = "/tmp/chanter-bench-XXXXXX";
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    return 1;
  }
  double secs = quick ? 0.3 : 1.5;
  uint64_t rows = quick ? 65536 : 1000000;
  printf("chanter bench embedding: %d keys per call, %s per figure, %" PRIu64 " stored rows per table\n", BATCH,
         quick ? "0.3 s" : "1.5 s", rows);
  printf("skewed = 90%% of reads go to the hottest 1%% of rows; %% = share of the in-process memory tier\n"
         "(Lookup) or of in-process RocksDB WriteBatch (WriteBack) at the same dim, keys and threads\n\n");
  printf("%-10s %4s  %-8s %3s  %-30s %12s %9s   %6s\n", "op", "dim", "keys", "thr", "path", "rows/s", "MB/s",
         "vs base");
  int rc = 0;
  log_level = LOG_WARN;
  for (int d = 0; d < 2 && !rc; d++) rc = bench_dim(cli, tmp, d ? 64 : 16, rows, secs);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "bench: could not remove %s\n", tmp);
  return rc;
}

int cmd_bench(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected what to measure");
  const char *what = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (!strcmp(what, "model")) return bench_model(cli);
  if (!strcmp(what, "embedding")) return bench_embedding(cli);
  if (!strcmp(what, "data")) return bench_data_parse(cli);
  if (!strcmp(what, "dataproc")) return bench_dataproc(cli);
  if (!strcmp(what, "feed")) return bench_cluster_feed(cli);
  if (!strcmp(what, "e2e")) return bench_e2e(cli);
  if (!strcmp(what, "checkpoint")) return bench_checkpoint(cli);
  if (!strcmp(what, "recovery")) return bench_recovery(cli);
  if (!strcmp(what, "oracle")) return bench_oracle(cli);
  if (!strcmp(what, "shard")) return bench_shard(cli);
  if (!strcmp(what, "tables")) return bench_tables(cli);
  if (!strcmp(what, "placement")) return bench_placement(cli);
  if (!strcmp(what, "scale")) return bench_scale(cli);
  return cli_usage_error(cli, "unknown benchmark '%s'", what);
}
