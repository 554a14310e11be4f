/*
 * bench_data: how fast the data module turns files into batches, single
 * threaded, next to a raw sequential read of the same files in the same
 * run: `chanter bench data` (also `chanter data bench`; part of the
 * dataproc benchmark).
 *
 * In a temporary directory it generates a Criteo-shaped synthetic TSV
 * (200k samples; 50k with --quick, or --samples N), converts it to binary,
 * and measures:
 *   - raw read():  the TSV and the binary file, 1 MiB reads (page cache);
 *   - TSV parse:   data_open, which validates, parses and indexes every line;
 *   - TSV batches: data_read_batch at 4096 over the whole file (parses again);
 *   - convert:     TSV -> binary in one streaming pass;
 *   - binary batches: data_read_batch at 4096 (mapped records -> batches);
 *   - synthetic:   dataset = synthetic batches at 4096 (generation).
 * Each rate is the best of a few repetitions (at least ~0.3 s each) and is
 * shown as a share of the raw read of the same file.  Nothing here is a
 * threshold; the aims are >= 300K samples/s parsing TSV and >= 2M samples/s
 * from binary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "data.h"
#include "err.h"

#define BATCH_SIZE 4096

typedef struct row_s {
  const char *what;
  double mb_s, samples_s, vs_raw; /* < 0: not applicable */
} row_t;

/* MB/s of reading path sequentially with read(2), best of 3 */
static double raw_read(const char *path, uint64_t *bytes) {
  static char buf[1 << 20];
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint64_t n = 0;
    unsigned sum = 0;
    double t0 = clock_mono_s();
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) {
      n += (uint64_t)r;
      sum += (unsigned char)buf[r - 1]; /* touch the data */
    }
    double dt = clock_mono_s() - t0;
    close(fd);
    if (sum == 0xdeadbeef) fprintf(stderr, " ");
    *bytes = n;
    if (dt > 0 && n / dt / 1e6 > best) best = (double)n / dt / 1e6;
  }
  return best;
}

/* samples/s reading every sample of d in batches of BATCH_SIZE, best of reps */
static double batch_rate(data_source_t *d, double min_s, char *err, size_t err_len) {
  uint64_t n = data_samples(d), nb = (n + BATCH_SIZE - 1) / BATCH_SIZE;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = clock_mono_s(), dt;
    uint64_t done = 0;
    do {
      for (uint64_t x = 0; x < nb; x++) {
        data_batch_t b;
        if (data_read_batch(d, DATA_ALL, x, BATCH_SIZE, &b, err, err_len)) return -1;
        done += b.n;
        data_batch_free(&b);
      }
      dt = clock_mono_s() - t0;
    } while (dt < min_s);
    if (done / dt > best) best = (double)done / dt;
  }
  return best;
}

static int set(cfg_t *c, const char *kv) {
  char err[256];
  return cfg_set(c, kv, "bench", err, sizeof err);
}

int bench_data_parse(cli_t *cli) {
  uint64_t samples = 200000;
  if (cli_flag(cli, "--quick")) samples = 50000;
  const char *ns = cli_opt(cli, "--samples");
  if (cli_done(cli, NULL)) return 2;
  if (ns) {
    char *end;
    long long v = strtoll(ns, &end, 10);
    if (*end || end == ns || v <= 0) return cli_usage_error(cli, "--samples '%s' is not a positive integer", ns);
    samples = (uint64_t)v;
  }
  const char *tmp = getenv("TMPDIR");
  char dir[256], tsv[300], bin[300], err[1024], kv[64];
  cfg_t *cfg = NULL;
  data_source_t *d = NULL;
  row_t rows[8];
  int nrows = 0, rc = 1;
  uint64_t tsv_bytes = 0, bin_bytes = 0;
  snprintf(dir, sizeof dir, "%s/chanter-bench-data-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "bench data: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  snprintf(tsv, sizeof tsv, "%s/criteo.tsv", dir);
  snprintf(bin, sizeof bin, "%s/criteo.bin", dir);
  /* the default job (Criteo-shaped, the default skew) with the user's seed */
  if (cfg_create(&cfg)) goto out;
  snprintf(kv, sizeof kv, "synthetic.samples=%" PRIu64, samples);
  if (set(cfg, kv) || set(cfg, "dataset_format=auto") || set(cfg, "test_fraction=0")) goto out;
  snprintf(kv, sizeof kv, "seed=%lld", (long long)cfg_int(cli->cfg, "seed"));
  set(cfg, kv);

  double t0 = clock_mono_s();
  if (data_gen(cfg, tsv, DATA_FMT_CRITEO, samples, err, sizeof err)) goto fail;
  double gen_s = clock_mono_s() - t0;

  double raw_tsv = raw_read(tsv, &tsv_bytes);
  rows[nrows++] = (row_t){"raw read(2) of the TSV", raw_tsv, -1, 1};

  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    data_close(d);
    d = NULL;
    t0 = clock_mono_s();
    if (data_open_path(cfg, tsv, &d, err, sizeof err)) goto fail;
    double dt = clock_mono_s() - t0;
    if (dt < best) best = dt;
  }
  rows[nrows++] = (row_t){"TSV parse + index (data_open)", tsv_bytes / best / 1e6, samples / best,
                          tsv_bytes / best / 1e6 / raw_tsv};
  double r = batch_rate(d, 0.3, err, sizeof err);
  if (r < 0) goto fail;
  rows[nrows++] = (row_t){"TSV batches, bs 4096", r * tsv_bytes / samples / 1e6, r, r * tsv_bytes / samples / 1e6 / raw_tsv};
  data_close(d);
  d = NULL;

  best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    t0 = clock_mono_s();
    if (data_convert(cfg, tsv, bin, NULL, err, sizeof err)) goto fail;
    double dt = clock_mono_s() - t0;
    if (dt < best) best = dt;
  }
  rows[nrows++] = (row_t){"convert TSV -> binary", tsv_bytes / best / 1e6, samples / best,
                          tsv_bytes / best / 1e6 / raw_tsv};

  double raw_bin = raw_read(bin, &bin_bytes);
  rows[nrows++] = (row_t){"raw read(2) of the binary", raw_bin, -1, 1};
  if (data_open_path(cfg, bin, &d, err, sizeof err)) goto fail;
  if ((r = batch_rate(d, 0.5, err, sizeof err)) < 0) goto fail;
  rows[nrows++] = (row_t){"binary batches, bs 4096", r * bin_bytes / samples / 1e6, r,
                          r * bin_bytes / samples / 1e6 / raw_bin};
  data_close(d);
  d = NULL;

  if (data_open_path(cfg, "synthetic", &d, err, sizeof err)) goto fail;
  if ((r = batch_rate(d, 0.3, err, sizeof err)) < 0) goto fail;
  rows[nrows++] = (row_t){"synthetic batches, bs 4096", -1, r, -1};
  data_close(d);
  d = NULL;

  if (cli->json) {
    printf("{\"samples\": %" PRIu64 ", \"tsv_bytes\": %" PRIu64 ", \"binary_bytes\": %" PRIu64
           ", \"gen_tsv_seconds\": %.3f, \"rows\": [",
           samples, tsv_bytes, bin_bytes, gen_s);
    for (int i = 0; i < nrows; i++)
      printf("%s\n  {\"what\": \"%s\", \"mb_per_s\": %.1f, \"samples_per_s\": %.0f, \"vs_raw_read\": %.3f}", i ? "," : "",
             rows[i].what, rows[i].mb_s, rows[i].samples_s, rows[i].vs_raw);
    printf("]}\n");
  } else {
    printf("data parsing, one thread: %" PRIu64 " Criteo-shaped samples, TSV %.1f MB, binary %.1f MB (page cache)\n\n",
           samples, tsv_bytes / 1e6, bin_bytes / 1e6);
    printf("%-32s %10s %14s %12s\n", "measurement", "MB/s", "samples/s", "vs raw read");
    for (int i = 0; i < nrows; i++) {
      printf("%-32s ", rows[i].what);
      if (rows[i].mb_s >= 0) printf("%10.1f ", rows[i].mb_s); else printf("%10s ", "-");
      if (rows[i].samples_s >= 0) printf("%14.0f ", rows[i].samples_s); else printf("%14s ", "-");
      if (rows[i].vs_raw >= 0) printf("%11.3fx\n", rows[i].vs_raw); else printf("%12s\n", "-");
    }
    printf("\n(aims: >= 300K samples/s parsing TSV, >= 2M samples/s from binary; generating the TSV took %.2f s)\n",
           gen_s);
  }
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench data: %s\n", err);
out:
  data_close(d);
  cfg_destroy(cfg);
  unlink(tsv);
  unlink(bin);
  rmdir(dir);
  return rc;
}
