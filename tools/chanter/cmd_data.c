/*
 * chanter data gen | convert | stats | bench: the data module from the
 * command line (common/data.h does the work).
 *
 *   chanter data gen --out FILE [--format tsv|binary] [--samples N]
 *       synthetic samples (sample i from (seed, i)); the format defaults to
 *       binary for a name ending in .bin, else Criteo TSV; N defaults to
 *       synthetic.samples.  Identical to what dataset = synthetic serves.
 *   chanter data convert [IN] OUT
 *       IN (default: the job's dataset, read with dataset_format) into the
 *       binary format; malformed records are counted and reported.
 *   chanter data stats [FILE] [--json]
 *       samples, bad records, short lines, per-table cardinality, raw
 *       values and merged rows (a warning on stderr per table whose merged
 *       share passes 10%: table_rows too small), top-row shares, distinct
 *       rows per batch, and locality: the share of a trainer's rows in a
 *       batch that it used in the previous window (lookahead L if a number
 *       > 0, else oracle.window) batches under contiguous allocation; for
 *       dataset = synthetic, for both synthetic.preset values.
 *   chanter data bench [--quick]
 *       parse rates (the same table as `chanter bench data`).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "clock.h"
#include "data.h"
#include "err.h"

/* prints bad-record counts by kind: " (fields 2, hex 1)" */
static void print_bad(FILE *f, const data_stats_t *st) {
  if (!st->bad_records) return;
  const char *sep = " (";
  for (int k = 0; k < DATA_BAD_KINDS; k++)
    if (st->bad_kind[k]) {
      fprintf(f, "%s%s %" PRIu64, sep, data_bad_kind_name(k), st->bad_kind[k]);
      sep = ", ";
    }
  if (sep[0] == ',') fprintf(f, ")");
}

static void json_bad(FILE *f, const data_stats_t *st) {
  fprintf(f, "\"bad_records\": %" PRIu64 ", \"bad_by_kind\": {", st->bad_records);
  for (int k = 0; k < DATA_BAD_KINDS; k++)
    fprintf(f, "%s\"%s\": %" PRIu64, k ? ", " : "", data_bad_kind_name(k), st->bad_kind[k]);
  fprintf(f, "}, \"short_lines\": %" PRIu64, st->short_lines);
}

/* ", 3 short lines read with empty trailing fields" (nothing if none) */
static void print_short(FILE *f, const data_stats_t *st) {
  if (st->short_lines)
    fprintf(f, ", %" PRIu64 " short line%s read with empty trailing fields", st->short_lines,
            st->short_lines == 1 ? "" : "s");
}

/* "12345" or ">=12345" (a lower bound: the raw-value count ran out of memory) */
static const char *raw_text(const data_table_profile_t *tp, char *buf, size_t n) {
  snprintf(buf, n, "%s%" PRIu64, tp->raw_exact ? "" : ">=", tp->raw_values);
  return buf;
}

static void json_table(FILE *f, const data_table_profile_t *tp) {
  fprintf(f,
          "\"rows\": %" PRIu64 ", \"accesses\": %" PRIu64 ", \"distinct\": %" PRIu64
          ", \"top_0_1pct_share\": %.6f, \"top_1pct_share\": %.6f, \"raw_values\": %" PRIu64
          ", \"raw_values_exact\": %s, \"merged_rows\": %" PRIu64 ", \"merged_accesses\": %" PRIu64
          ", \"merged_share\": %.6f",
          tp->rows, tp->accesses, tp->distinct, tp->top_0_1, tp->top_1, tp->raw_values,
          tp->raw_exact ? "true" : "false", tp->merged_rows, tp->merged_accesses, tp->merged_share);
}

/* One line on stderr per table whose merged share passes
 * DATA_PROFILE_MERGED_WARN.  With n raw values hashed into R rows, a value
 * shares its row with probability 1 - exp(-(n - 1) / R), whatever its
 * popularity: R = (n - 1) / -ln(1 - 0.10) (9.5 n) brings the share to
 * about 10%. */
static void warn_merged(const data_profile_t *p) {
  for (uint32_t t = 0; t < p->n_tables; t++) {
    const data_table_profile_t *tp = &p->tables[t];
    if (tp->merged_share <= DATA_PROFILE_MERGED_WARN) continue;
    char raw[32];
    double want = ceil((double)(tp->raw_values - 1) / -log1p(-DATA_PROFILE_MERGED_WARN));
    fprintf(stderr,
            "chanter data stats: warning: table %u: %.1f%% of accesses land on rows that several raw values share "
            "(%s distinct raw values hashed into table_rows[%u] = %" PRIu64 " row%s); raise table_rows[%u]: about "
            "%.0f rows (9.5x the raw values) would bring it near %.0f%%\n",
            t, 100 * tp->merged_share, raw_text(tp, raw, sizeof raw), t, tp->rows, tp->rows == 1 ? "" : "s", t, want,
            100 * DATA_PROFILE_MERGED_WARN);
  }
}

static int do_gen(cli_t *cli) {
  const char *out = cli_opt(cli, "--out"), *fmt_s = cli_opt(cli, "--format"), *n_s = cli_opt(cli, "--samples");
  char err[1024];
  if (cli_done(cli, "gen")) return 2;
  if (!out) return cli_usage_error(cli, "--out FILE is required");
  size_t l = strlen(out);
  int fmt = l > 4 && !strcmp(out + l - 4, ".bin") ? DATA_FMT_BINARY : DATA_FMT_CRITEO;
  if (fmt_s) {
    fmt = data_format_parse(fmt_s);
    if (fmt != DATA_FMT_CRITEO && fmt != DATA_FMT_BINARY) {
      fprintf(stderr, "chanter data gen: --format '%s' is not tsv or binary\n", fmt_s);
      return 2;
    }
  }
  uint64_t n = (uint64_t)cfg_int(cli->cfg, "synthetic.samples");
  if (n_s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(n_s, &end, 10);
    if (errno || *end || end == n_s || n_s[0] == '-' || v == 0) {
      fprintf(stderr, "chanter data gen: --samples '%s' is not a positive integer\n", n_s);
      return 2;
    }
    n = v;
  }
  double t0 = clock_mono_s();
  int rc = data_gen(cli->cfg, out, fmt, n, err, sizeof err);
  double dt = clock_mono_s() - t0;
  if (rc) {
    fprintf(stderr, "chanter data gen: %s\n", err);
    return 1;
  }
  if (cli->json)
    printf("{\"out\": \"%s\", \"format\": \"%s\", \"samples\": %" PRIu64 ", \"seconds\": %.3f}\n", out,
           fmt == DATA_FMT_BINARY ? "binary" : "tsv", n, dt);
  else
    printf("wrote %" PRIu64 " samples to %s (%s) in %.2f s\n", n, out, fmt == DATA_FMT_BINARY ? "binary" : "Criteo TSV",
           dt);
  return 0;
}

static int do_convert(cli_t *cli) {
  char err[1024];
  if (cli_args(cli, 1, 2, "convert", "[IN] OUT")) return 2;
  const char *in = cli->argc == 2 ? cli->argv[0] : NULL, *out = cli->argv[cli->argc - 1];
  data_stats_t st;
  double t0 = clock_mono_s();
  int rc = data_convert(cli->cfg, in, out, &st, err, sizeof err);
  double dt = clock_mono_s() - t0;
  if (rc) {
    fprintf(stderr, "chanter data convert: %s\n", err);
    return 1;
  }
  if (!in) in = cfg_str(cli->cfg, "dataset");
  if (cli->json) {
    printf("{\"in\": \"%s\", \"out\": \"%s\", \"format\": \"%s\", \"samples\": %" PRIu64 ", ", in, out,
           data_format_name(st.format), st.samples);
    json_bad(stdout, &st);
    printf(", \"seconds\": %.3f}\n", dt);
  } else {
    printf("converted %s (%s) to %s: %" PRIu64 " samples, %" PRIu64 " bad records skipped", in,
           data_format_name(st.format), out, st.samples, st.bad_records);
    print_bad(stdout, &st);
    print_short(stdout, &st);
    printf(", %.2f s", dt);
    if (st.bytes && dt > 0) printf(" (%.0f MB/s)", (double)st.bytes / dt / 1e6);
    printf("\n");
  }
  return 0;
}

#define LOCALITY_BATCHES 64

/* The window of the locality figure: lookahead L when it is a number > 0
 * (a row used in the last L batches is still cached), else oracle.window. */
static uint32_t locality_window(const cfg_t *cfg, const char **key) {
  const char *l = cfg_str(cfg, "lookahead");
  char *end;
  unsigned long v = strtoul(l, &end, 10);
  if (end != l && !*end && v > 0) {
    *key = "lookahead";
    return (uint32_t)v;
  }
  *key = "oracle.window";
  return (uint32_t)cfg_int(cfg, "oracle.window");
}

/* Locality of dataset = synthetic under synthetic.preset = preset (the
 * job's other keys unchanged).  0 or 1 with err. */
static int preset_locality(cli_t *cli, const char *preset, uint32_t window, data_locality_t *out, char *err,
                           size_t err_len) {
  char kv[64], was[64];
  snprintf(was, sizeof was, "synthetic.preset=%s", cfg_str(cli->cfg, "synthetic.preset"));
  snprintf(kv, sizeof kv, "synthetic.preset=%s", preset);
  data_source_t *d;
  int rc = cfg_set(cli->cfg, kv, "data stats", err, err_len);
  if (!rc) rc = data_open_path(cli->cfg, "synthetic", &d, err, err_len);
  if (!rc) {
    rc = data_locality(d, (uint32_t)cfg_int(cli->cfg, "batch_size"), (uint32_t)cfg_int(cli->cfg, "trainers"), window,
                       LOCALITY_BATCHES, out, err, err_len);
    data_close(d);
  }
  char e2[256];
  cfg_set(cli->cfg, was, "data stats", e2, sizeof e2);
  return rc ? 1 : 0;
}

static int do_stats(cli_t *cli) {
  char err[1024];
  if (cli_args(cli, 0, 1, "stats", "at most one FILE")) return 2;
  const char *path = cli->argc ? cli->argv[0] : cfg_str(cli->cfg, "dataset");
  data_source_t *d;
  data_profile_t p;
  int rc = data_open_path(cli->cfg, path, &d, err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter data stats: %s\n", err);
    return 1;
  }
  rc = data_profile(d, &p, err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter data stats: %s\n", err);
    data_close(d);
    return 1;
  }
  const char *wkey;
  uint32_t window = locality_window(cli->cfg, &wkey);
  data_locality_t loc, pre[2];
  static const char *const presets[2] = {"independent", "sessions"};
  int synth = !strcmp(path, "synthetic");
  rc = data_locality(d, (uint32_t)cfg_int(cli->cfg, "batch_size"), (uint32_t)cfg_int(cli->cfg, "trainers"), window,
                     LOCALITY_BATCHES, &loc, err, sizeof err);
  for (int k = 0; k < 2 && synth && !rc; k++) rc = preset_locality(cli, presets[k], window, &pre[k], err, sizeof err);
  if (rc) {
    fprintf(stderr, "chanter data stats: %s\n", err);
    data_profile_close(&p);
    data_close(d);
    return 1;
  }
  const data_schema_t *s = data_schema(d);
  const data_stats_t *st = &p.stats;
  if (cli->json) {
    printf("{\"dataset\": \"%s\", \"format\": \"%s\", \"bytes\": %" PRIu64 ", \"samples\": %" PRIu64
           ", \"train_samples\": %" PRIu64 ", \"test_samples\": %" PRIu64 ", ",
           path, data_format_name(st->format), st->bytes, st->samples, st->train_samples, st->test_samples);
    json_bad(stdout, st);
    printf(",\n \"tables\": [");
    for (uint32_t t = 0; t < p.n_tables; t++) {
      printf("%s\n  {\"table\": %u, \"hotness\": %u, ", t ? "," : "", t, s->hotness[t]);
      json_table(stdout, &p.tables[t]);
      printf("}");
    }
    printf("],\n \"overall\": {");
    json_table(stdout, &p.overall);
    printf("},\n \"unique_per_batch\": [");
    for (int b = 0; b < DATA_PROFILE_BATCH_SIZES && p.batch[b].batch_size; b++)
      printf("%s{\"batch_size\": %u, \"batches\": %u, \"ids_per_batch\": %.0f, \"unique_rows\": %.1f, "
             "\"unique_share\": %.6f}",
             b ? ", " : "", p.batch[b].batch_size, p.batch[b].batches, p.batch[b].ids_per_batch,
             p.batch[b].unique_rows, p.batch[b].unique_rows / p.batch[b].ids_per_batch);
    printf("],\n \"locality\": {\"batch_size\": %u, \"trainers\": %u, \"window\": %u, \"window_key\": \"%s\", "
           "\"batches\": %u, \"rows\": %" PRIu64 ", \"reused\": %" PRIu64 ", \"share\": %.6f, \"access_share\": %.6f",
           loc.batch_size, loc.trainers, loc.window, wkey, loc.batches, loc.rows, loc.reused, loc.share,
           loc.access_share);
    if (synth)
      printf(", \"preset\": \"%s\", \"by_preset\": {\"%s\": {\"share\": %.6f, \"access_share\": %.6f}, "
             "\"%s\": {\"share\": %.6f, \"access_share\": %.6f}}",
             cfg_str(cli->cfg, "synthetic.preset"), presets[0], pre[0].share, pre[0].access_share, presets[1],
             pre[1].share, pre[1].access_share);
    printf("}}\n");
  } else {
    printf("dataset  %s (%s", path, data_format_name(st->format));
    if (st->bytes) printf(", %.1f MB", (double)st->bytes / 1e6);
    printf(")\nsamples  %" PRIu64 " (train %" PRIu64 ", test %" PRIu64 "), bad records skipped %" PRIu64, st->samples,
           st->train_samples, st->test_samples, st->bad_records);
    print_bad(stdout, st);
    print_short(stdout, st);
    char raw[32];
    printf("\n\n%-6s %14s %7s %14s %12s %14s %9s %9s %9s\n", "table", "rows", "hotness", "accesses", "distinct",
           "raw values", "merged", "top0.1%", "top1%");
    for (uint32_t t = 0; t < p.n_tables; t++) {
      const data_table_profile_t *tp = &p.tables[t];
      printf("%-6u %14" PRIu64 " %7u %14" PRIu64 " %12" PRIu64 " %14s %8.1f%% %8.1f%% %8.1f%%\n", t, tp->rows,
             s->hotness[t], tp->accesses, tp->distinct, raw_text(tp, raw, sizeof raw), 100 * tp->merged_share,
             100 * tp->top_0_1, 100 * tp->top_1);
    }
    printf("%-6s %14" PRIu64 " %7s %14" PRIu64 " %12" PRIu64 " %14s %8.1f%% %8.1f%% %8.1f%%\n", "all",
           p.overall.rows, "", p.overall.accesses, p.overall.distinct, raw_text(&p.overall, raw, sizeof raw),
           100 * p.overall.merged_share, 100 * p.overall.top_0_1, 100 * p.overall.top_1);
    printf("\n(distinct: rows used; raw values: distinct raw values (64-bit hashes), \">=\" if counting them ran\n"
           " out of memory; merged: share of accesses landing on rows that more than one raw value maps to;\n"
           " top x%%: share of accesses taken by the most used x%% of the table's rows)\n\n");
    printf("%-10s %8s %14s %14s %8s\n", "batch", "batches", "ids/batch", "unique rows", "unique");
    for (int b = 0; b < DATA_PROFILE_BATCH_SIZES && p.batch[b].batch_size; b++)
      printf("%-10u %8u %14.0f %14.1f %7.1f%%\n", p.batch[b].batch_size, p.batch[b].batches,
             p.batch[b].ids_per_batch, p.batch[b].unique_rows, 100 * p.batch[b].unique_rows / p.batch[b].ids_per_batch);
    printf("\nlocality (batch %u, %u trainers, contiguous, window %u = %s, %u batches): ", loc.batch_size, loc.trainers,
           loc.window, wkey, loc.batches);
    if (!loc.batches)
      printf("n/a (the train split holds at most %u batches)\n", loc.window);
    else
      printf("%.1f%% of a trainer's rows in a batch (%.1f%% of its ids) were used by it in the previous %u "
             "batches\n",
             100 * loc.share, 100 * loc.access_share, loc.window);
    for (int k = 0; k < 2 && synth; k++)
      printf("  synthetic.preset = %-12s rows %5.1f%%  ids %5.1f%%%s\n", presets[k], 100 * pre[k].share,
             100 * pre[k].access_share,
             !strcmp(presets[k], cfg_str(cli->cfg, "synthetic.preset")) ? "  (this job)" : "");
  }
  fflush(stdout);
  warn_merged(&p);
  data_profile_close(&p);
  data_close(d);
  return 0;
}

int cmd_data(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected gen, convert, stats or bench");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  if (!strcmp(sub, "gen")) return do_gen(cli);
  if (!strcmp(sub, "convert")) return do_convert(cli);
  if (!strcmp(sub, "stats")) return do_stats(cli);
  if (!strcmp(sub, "bench")) return bench_data_parse(cli);
  return cli_usage_error(cli, "unknown subcommand '%s'", sub);
}
