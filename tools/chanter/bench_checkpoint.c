/*
 * chanter bench checkpoint: what whole-job checkpoints (DESIGN.md section
 * 5) cost a training job.
 *
 * Like bench e2e, it runs jobs on a local cluster (`chanter local up`: one
 * data processor, two embedding servers, the oracle, two trainers) by
 * running this chanter binary, and reads DIR/summary.json, the oracle's
 * "checkpoint complete" log lines (one per checkpoint) and `chanter
 * checkpoints --json`.  Each configuration -- the job's tables and tables
 * 10x larger (table_rows), each at the job's cache_rows and at 1/20 of it
 * (--quick: the job's cache_rows only) -- runs twice: with checkpoints off
 * but the one every job takes at its end (the baseline), and with
 * checkpoint_every = iterations / 5.  It prints:
 *  1. samples/s of both and their difference, and per checkpoint the stall
 *     (training held back), the total and servers' time, rows flushed,
 *     bytes written and bytes per server;
 *  2. the throughput cost at checkpoint_seconds, derived from the measured
 *     stall (a bench cannot run for 600 s), against the 1% aim;
 *  3. every checkpoint's time next to the rows it flushed and the bytes
 *     written since the one before, for both table sizes, and how the time
 *     scales with each;
 *  4. resharding (reshard.h): one more job (tables x10, uniform row
 *     popularity, so that its end checkpoint holds many rows) on 2 servers,
 *     then the cluster up again on its work dir with 3 and with 1 servers
 *     and the checkpoint resharded onto each in-process: rows, MB, the time
 *     and its split (read, write, checkpoint), per million rows, rows/s,
 *     next to the job's own end checkpoint.
 * Prints only figures measured in this run.
 */
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "json.h"
#include "fsio.h"
#include "reshard.h"

#define MAX_CP 256
#define MAX_SERVERS 16

typedef struct cp_line_s {
  uint64_t iteration, rows_flushed, bytes;
  double stall_ms, total_ms, servers_ms;
} cp_line_t;

/* One job's results. */
typedef struct run_s {
  char *summary;         /* DIR/summary.json */
  cp_line_t cp[MAX_CP];  /* the oracle's "checkpoint complete" lines, in order */
  int n_cp;
  int kept, kept_complete; /* `chanter checkpoints --json` after the job */
} run_t;

/* One configuration: tables x1 or x10, a cache_rows; run without and with checkpoints. */
typedef struct conf_s {
  int big;
  long long cache_rows;
  run_t off, on;
} conf_t;

/* Means and maxima over a run's checkpoints taken before the end of the job. */
typedef struct cp_stats_s {
  int n, no_stall; /* checkpoints; of them, without a measured stall */
  double stall, stall_max, total, total_max, servers, flushed, written_mb, stall_sum_s;
} cp_stats_t;



/* A failed run: the tail of what the commands said and of every daemon's log. */
static void tail_logs(const char *dir) {
  char path[4300];
  snprintf(path, sizeof path, "%s.up", dir);
  cli_tail_file(path);
  snprintf(path, sizeof path, "%s.train", dir);
  cli_tail_file(path);
  snprintf(path, sizeof path, "%s/logs/*.log", dir);
  glob_t g;
  if (glob(path, 0, NULL, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) cli_tail_file(g.gl_pathv[i]);
    globfree(&g);
  }
}

/* Fills r->cp from DIR/logs/oracle-0.log. */
static void read_cp_lines(const char *dir, run_t *r) {
  char path[4300], line[2048];
  snprintf(path, sizeof path, "%s/logs/oracle-0.log", dir);
  FILE *f = fopen(path, "r");
  r->n_cp = 0;
  if (!f) return;
  while (fgets(line, sizeof line, f) && r->n_cp < MAX_CP) {
    const char *q, *p = strstr(line, "checkpoint stall id=");
    if (p) { /* measured once an iteration after the checkpoint is in: belongs to the one of that iteration */
      uint64_t it;
      double ms;
      if ((q = strstr(p, " iteration=")) && sscanf(q, " iteration=%" SCNu64, &it) == 1 && (q = strstr(p, " stall_ms=")) &&
          sscanf(q, " stall_ms=%lf", &ms) == 1)
        for (int k = r->n_cp - 1; k >= 0; k--)
          if (r->cp[k].iteration == it) {
            r->cp[k].stall_ms = ms;
            break;
          }
      continue;
    }
    p = strstr(line, "checkpoint complete id=");
    if (!p) continue;
    cp_line_t c;
    if (!(q = strstr(p, " iteration=")) || sscanf(q, " iteration=%" SCNu64, &c.iteration) != 1) continue;
    /* the end of the job's says its stall at once; the others' come on their own line */
    if (!(q = strstr(p, " stall_ms=")) || sscanf(q, " stall_ms=%lf", &c.stall_ms) != 1) c.stall_ms = NAN;
    if (!(q = strstr(p, " total_ms=")) || sscanf(q, " total_ms=%lf", &c.total_ms) != 1) continue;
    if (!(q = strstr(p, " servers_ms=")) || sscanf(q, " servers_ms=%lf", &c.servers_ms) != 1) continue;
    if (!(q = strstr(p, " rows_flushed=")) || sscanf(q, " rows_flushed=%" SCNu64, &c.rows_flushed) != 1) continue;
    if (!(q = strstr(p, " bytes=")) || sscanf(q, " bytes=%" SCNu64, &c.bytes) != 1) continue;
    r->cp[r->n_cp++] = c;
  }
  fclose(f);
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* up, train, `checkpoints --json`, down in dir; 0 with *r filled, else 1
 * (the logs' tails printed). */
static int run_job(cli_t *cli, const char *self, const char *dir, const char *extra, int iters, run_t *r) {
  char cmd[16384], path[4300];
  int o = snprintf(cmd, sizeof cmd, "'%s'", self);
  if (cli->config_path) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", cli->sets[i]);
  snprintf(cmd + o, sizeof cmd - (size_t)o,
           " --set iterations=%d --set trainers=2 --set embedding_servers=2"
           " --set dataprocs=1 --set eval_batches=0 %s local up --workdir '%s' >'%s.up' 2>&1",
           iters, extra, dir, dir);
  memset(r, 0, sizeof *r);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench checkpoint: local up failed (%s); see %s.up\n", extra, dir);
    tail_logs(dir);
    return 1;
  }
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd) != 0;
  if (!rc) {
    snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' checkpoints --json --workdir '%s' >'%s.ckpts' 2>&1", self,
             dir, dir, dir);
    if (system(cmd) != 0) fprintf(stderr, "bench checkpoint: chanter checkpoints failed in %s; see %s.ckpts\n", dir, dir);
  }
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench checkpoint: local down reported a problem in %s\n", dir);
  snprintf(path, sizeof path, "%s/summary.json", dir);
  if (rc || fsio_read_all(path, 0, &r->summary, NULL, NULL, 0) != 0) {
    fprintf(stderr, "bench checkpoint: the job (%s) failed; see %s.train and %s/logs/\n", extra, dir, dir);
    tail_logs(dir);
    return 1;
  }
  read_cp_lines(dir, r);
  snprintf(path, sizeof path, "%s.ckpts", dir);
  char *ck = NULL;
  if (fsio_read_all(path, 0, &ck, NULL, NULL, 0) == 0) {
    r->kept = count(ck, "\"id\":");
    r->kept_complete = count(ck, "\"complete\": true");
    free(ck);
  }
  return 0;
}

/* Bytes written since the checkpoint before (the first: since the start, the servers were empty). */
static double written_mb(const run_t *r, int k) {
  return ((double)r->cp[k].bytes - (k ? (double)r->cp[k - 1].bytes : 0.0)) / 1e6;
}

static cp_stats_t stats(const run_t *r, int iters) {
  cp_stats_t s = {0};
  for (int k = 0; k < r->n_cp; k++) {
    const cp_line_t *c = &r->cp[k];
    if (c->iteration + 1 >= (uint64_t)iters) continue; /* the end of the job's: taken in the baseline too */
    s.n++;
    if (isnan(c->stall_ms)) s.no_stall++;
    else s.stall += c->stall_ms;
    s.total += c->total_ms;
    s.servers += c->servers_ms;
    s.flushed += (double)c->rows_flushed;
    s.written_mb += written_mb(r, k);
    if (!isnan(c->stall_ms)) s.stall_sum_s += c->stall_ms / 1e3;
    if (!isnan(c->stall_ms) && c->stall_ms > s.stall_max) s.stall_max = c->stall_ms;
    if (c->total_ms > s.total_max) s.total_max = c->total_ms;
  }
  if (s.n) {
    s.stall = s.n > s.no_stall ? s.stall / (s.n - s.no_stall) : NAN;
    s.total /= s.n;
    s.servers /= s.n;
    s.flushed /= s.n;
    s.written_mb /= s.n;
  } else {
    s.stall = s.stall_max = s.total = s.total_max = s.servers = s.flushed = s.written_mb = NAN;
  }
  return s;
}

/* summary.json's checkpoint.bytes_per_server as "a / b" in MB. */
static void per_server_mb(const char *summary, char *out, size_t cap) {
  snprintf(out, cap, "-");
  size_t o = 0;
  double v;
  for (int s = 0; s < MAX_SERVERS && json_get_num_at(summary, "bytes_per_server", (size_t)s, &v) == 0; s++)
    o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%.1f", s ? "/" : "", v / 1e6);
}

/* table_rows times mult, into out; returns the sum of the rows. */
static double scaled_tables(const char *rows, int mult, char *out, size_t cap) {
  double sum = 0;
  size_t o = 0;
  out[0] = 0;
  for (const char *p = rows; *p;) {
    char *e;
    unsigned long long v = strtoull(p, &e, 10);
    if (e == p) break;
    sum += (double)v * mult;
    o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%llu", o ? "," : "", v * (unsigned long long)mult);
    p = e;
    while (*p == ',' || *p == ' ') p++;
  }
  return sum;
}

/* /proc/loadavg's 1-minute figure: other work on the machine shows in samples/s */
static double loadavg(void) {
  double v = NAN;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f && fscanf(f, "%lf", &v) != 1) v = NAN;
  if (f) fclose(f);
  return v;
}

static void print_num(double v, const char *fmt) {
  if (isnan(v)) printf(" %15s", "-");
  else printf(fmt, v);
}

/* a / b, or NAN when either is missing */
static double ratio(double a, double b) { return b > 0 && !isnan(a) && !isnan(b) ? a / b : NAN; }

/* The scaling of one pair of configurations: the ratios of what changed and of the times. */
static void compare(const char *what, const conf_t *a, const conf_t *b, double rows_a, double rows_b, int iters) {
  cp_stats_t sa = stats(&a->on, iters), sb = stats(&b->on, iters);
  double tbl = rows_b / rows_a, fl = ratio(sb.flushed, sa.flushed), mb = ratio(sb.written_mb, sa.written_mb);
  double st = ratio(cli_json_num(b->on.summary, "stored_rows"), cli_json_num(a->on.summary, "stored_rows"));
  double sv = ratio(sb.servers, sa.servers), sl = ratio(sb.stall, sa.stall), tt = ratio(sb.total, sa.total);
  printf("%s: table rows %.2fx, rows on the servers %.2fx, rows flushed %.2fx, MB written %.2fx\n"
         "  -> servers time %.2fx, stall %.2fx, total %.2fx\n",
         what, tbl, st, fl, mb, sv, sl, tt);
  if (isnan(sv) || isnan(fl) || isnan(mb) || tbl == 1.0) return;
  /* which it is closer to, on a log scale */
  double dt = fabs(log(sv / tbl)), dc = fmin(fabs(log(sv / fl)), mb > 0 ? fabs(log(sv / mb)) : INFINITY);
  if (dc < dt)
    printf("  servers time %.2fx is closer to the rows flushed (%.2fx) / MB written (%.2fx) than to the table size "
           "(%.2fx)\n", sv, fl, mb, tbl);
  else
    printf("  servers time %.2fx is closer to the table size (%.2fx) than to the rows flushed (%.2fx) / MB written "
           "(%.2fx)\n", sv, tbl, fl, mb);
}

/* One reshard of the source job's end checkpoint onto `to` servers. */
typedef struct rs_run_s {
  uint32_t to;
  int done, complete; /* measured; the new checkpoint found complete on the new servers afterwards */
  reshard_stats_t st;
} rs_run_t;

/* `local up` on dir with embedding_servers = to (the job's own config
 * otherwise), the end checkpoint (id, or the latest when id is empty:
 * *id is then set) resharded in-process, checked, `local down`.  0 or 1. */
static int reshard_once(const char *self, const char *dir, char *id, size_t id_len, uint64_t *from, rs_run_t *r) {
  char cmd[9000], path[4300], pattern[4300], err[2048] = "", new_id[160];
  snprintf(cmd, sizeof cmd,
           "'%s' --config '%s/job.ini' --set embedding_servers=%u --set cluster.embedding= local up --workdir '%s'"
           " >'%s.up%u' 2>&1", self, dir,
           r->to, dir, dir, r->to);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench checkpoint: local up with embedding_servers=%u failed; see %s.up%u\n", r->to, dir, r->to);
    snprintf(path, sizeof path, "%s.up%u", dir, r->to);
    cli_tail_file(path);
    snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
    int down = system(cmd); /* up stopped what it started: nothing to report */
    (void)down;
    return 1;
  }
  int rc = 1;
  cfg_t *cfg = NULL;
  manifest_t m;
  memset(&m, 0, sizeof m);
  snprintf(path, sizeof path, "%s/job.ini", dir); /* the cluster's config, as cli_cluster_cfg reads it */
  snprintf(pattern, sizeof pattern, "%s/embedding-%%i", dir);
  if (cfg_create(&cfg) || cfg_load_file(cfg, path, err, sizeof err) || cfg_validate(cfg, err, sizeof err)) {
    fprintf(stderr, "bench checkpoint: %s: %s\n", path, err);
  } else if (reshard_find(pattern, *id ? id : "latest", &m, err, sizeof err)) {
    fprintf(stderr, "bench checkpoint: %s\n", err);
  } else if (reshard_run(cfg, pattern, &m, new_id, sizeof new_id, &r->st, err, sizeof err)) {
    fprintf(stderr, "bench checkpoint: resharding %s onto %u servers: %s\n", m.id, r->to, err);
  } else {
    if (!*id) snprintf(id, id_len, "%s", m.id);
    *from = m.servers;
    manifest_t n;
    if (reshard_find(pattern, new_id, &n, err, sizeof err) == 0) {
      r->complete = n.servers == r->to;
      manifest_free(&n);
    }
    r->done = 1;
    rc = 0;
  }
  manifest_free(&m);
  if (cfg) cfg_destroy(cfg);
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "bench checkpoint: local down reported a problem in %s\n", dir);
  return rc;
}

/* ---- 4. resharding: a job (tables x10, uniform row popularity) ends with
 * a complete checkpoint on 2 servers; the cluster comes up again on the
 * same work dir with 3 servers, then 1, and each time the checkpoint is
 * resharded in-process (reshard.h, what `chanter train --resume` does). */
static int bench_reshard(cli_t *cli, const char *self, const char *tmp, const char *big_rows, long long cache_rows,
                         int quick) {
  int iters = quick ? 100 : 200;
  char dir[1200], extra[9000], id[160] = "";
  snprintf(dir, sizeof dir, "%s/reshard", tmp);
  snprintf(extra, sizeof extra,
           "--set cache_rows=%lld --set 'table_rows=%s' --set synthetic.alpha=0 --set synthetic.hot_share=0"
           " --set checkpoint_seconds=0 --set checkpoint_every=0",
           cache_rows, big_rows);
  printf("Resharding a checkpoint (reshard_find / reshard_run in-process, what `chanter train --resume` does onto\n"
         "another embedding_servers count):\n");
  fflush(stdout);
  run_t job;
  if (run_job(cli, self, dir, extra, iters, &job)) return 1;
  rs_run_t rs[2] = {{.to = 3}, {.to = 1}};
  uint64_t from = 0;
  int rc = 0, n = 2;
  double load0 = loadavg();
  for (int i = 0; i < n && !rc; i++) rc = reshard_once(self, dir, id, sizeof id, &from, &rs[i]);
  double load1 = loadavg();
  double stored = cli_json_num(job.summary, "stored_rows");
  printf("%-38s", "");
  for (int i = 0; i < n; i++) {
    char h[32];
    snprintf(h, sizeof h, "%" PRIu64 " -> %u servers", from, rs[i].to);
    printf(" %15s", h);
  }
  static const char *names[] = {"rows resharded",
                                "MB read (rows with optimizer state)",
                                "blobs",
                                "total",
                                "  read (old checkpoints, from disk)",
                                "  write (embc_write to new owners)",
                                "  checkpoint + seal (new servers)",
                                "  other (connect, clear, blobs)",
                                "total per million rows",
                                "  read per million rows",
                                "  write per million rows",
                                "  checkpoint per million rows",
                                "rows/s"};
  for (int k = 0; k < 13; k++) {
    printf("\n%-38s", names[k]);
    for (int i = 0; i < n; i++) {
      const reshard_stats_t *s = &rs[i].st;
      double M = s->rows ? (double)s->rows / 1e6 : NAN;
      double v[] = {(double)s->rows / 1e6,
                    (double)s->bytes / 1e6,
                    (double)s->blobs,
                    s->seconds,
                    s->read_seconds,
                    s->write_seconds,
                    s->checkpoint_seconds,
                    s->seconds - s->read_seconds - s->write_seconds - s->checkpoint_seconds,
                    s->seconds / M,
                    s->read_seconds / M,
                    s->write_seconds / M,
                    s->checkpoint_seconds / M,
                    s->seconds > 0 ? (double)s->rows / s->seconds : NAN};
      static const char *fmt[] = {" %14.3fM", " %15.1f", " %15.0f", " %13.2f s", " %13.2f s", " %13.2f s", " %13.2f s",
                                  " %13.2f s", " %13.2f s", " %13.2f s", " %13.2f s", " %13.2f s", " %15.0f"};
      print_num(rs[i].done ? v[k] : NAN, fmt[k]);
    }
  }
  printf("\n%-38s", "new checkpoint complete");
  for (int i = 0; i < n; i++) printf(" %15s", !rs[i].done ? "-" : rs[i].complete ? "yes" : "NO");
  printf("\nThe job's own checkpoint at its end (%" PRIu64 " servers, for comparison): ", from);
  double srv = cli_json_num(job.summary, "servers_seconds"), tot = cli_json_num(job.summary, "total_seconds");
  double fl = cli_json_num(job.summary, "rows_flushed"), stall = cli_json_num(job.summary, "stall_seconds");
  printf("servers %.2f s, stall %.2f s, total %.2f s,\n"
         "  %.0f rows flushed by the trainers, %.1f MB on the servers, %.3fM rows on the servers (stored_rows)\n",
         srv, stall, tot, fl, cli_json_num(job.summary, "bytes") / 1e6, stored / 1e6);
  printf("(the checkpoint: the end of a %d-iteration job, batch %lld, tables x10, synthetic.alpha = 0 (uniform row\n"
         " popularity, so that it holds many rows), cache_rows %lld, no checkpoints before the end; then `chanter local\n"
         " down`, `local up --set embedding_servers=S'` on the same work dir, reshard_run from the old servers'\n"
         " checkpoint directories; each reshard starts from that same 2-server checkpoint.  read = store_reader over\n"
         " the old checkpoints; write = embc_write of the rows to their new owners alone, the baseline for writing\n"
         " that many rows; checkpoint = every new server's RocksDB checkpoint and the sealed manifest; load average,\n"
         " 1 min, %.2f before the reshards and %.2f after, on %ld CPUs)\n",
         iters, (long long)cfg_int(cli->cfg, "batch_size"), cache_rows, load0, load1, sysconf(_SC_NPROCESSORS_ONLN));
  free(job.summary);
  return rc;
}

/* The whole bench's configurations, their runs, and what the tables need besides. */
typedef struct cpbench_s {
  cli_t *cli;
  conf_t confs[4];
  int nc, iters, every, quick;
  long long cache0, cache1, interval; /* the job's cache_rows, 1/20 of it; checkpoint_seconds */
  double rows1, rows10;               /* the table rows, x1 and x10 */
  double load0, load1;                /* the load average before and after the runs */
} cpbench_t;

/* 1. the table: per configuration, samples/s with and without checkpoints,
 * and the checkpoints' figures. */
static void print_runs(const cpbench_t *bc) {
  const cli_t *cli = bc->cli;
  const conf_t *confs = bc->confs;
  int nc = bc->nc, iters = bc->iters;
  double rows1 = bc->rows1, rows10 = bc->rows10, load0 = bc->load0, load1 = bc->load1;
  printf("%-38s", "");
  for (int c = 0; c < nc; c++) printf(" %15s", confs[c].big ? "tables x10" : "tables x1");
  printf("\n%-38s", "");
  for (int c = 0; c < nc; c++) {
    char h[32];
    snprintf(h, sizeof h, "cache %lld", confs[c].cache_rows);
    printf(" %15s", h);
  }
  printf("\n%-38s", "table rows (configured)");
  for (int c = 0; c < nc; c++) printf(" %14.2fM", (confs[c].big ? rows10 : rows1) / 1e6);
  printf("\n%-38s", "rows on the servers at the end");
  for (int c = 0; c < nc; c++) print_num(cli_json_num(confs[c].on.summary, "stored_rows") / 1e6, " %14.2fM");
  printf("\n%-38s", "lookahead L");
  for (int c = 0; c < nc; c++) print_num(cli_json_num(confs[c].on.summary, "lookahead"), " %15.0f");
  printf("\n%-38s", "samples/s, checkpoints off (baseline)");
  for (int c = 0; c < nc; c++) print_num(cli_json_num(confs[c].off.summary, "steady_samples_per_sec"), " %15.0f");
  printf("\n%-38s", "samples/s, checkpoint_every");
  for (int c = 0; c < nc; c++) print_num(cli_json_num(confs[c].on.summary, "steady_samples_per_sec"), " %15.0f");
  printf("\n%-38s", "  difference");
  for (int c = 0; c < nc; c++) {
    double b = cli_json_num(confs[c].off.summary, "steady_samples_per_sec");
    print_num(100.0 * (cli_json_num(confs[c].on.summary, "steady_samples_per_sec") / b - 1.0), " %14.1f%%");
  }
  printf("\n%-38s", "  stalls / train time");
  for (int c = 0; c < nc; c++) {
    cp_stats_t s = stats(&confs[c].on, iters);
    print_num(100.0 * s.stall_sum_s / cli_json_num(confs[c].on.summary, "train_seconds"), " %14.1f%%");
  }
  printf("\n%-38s", "checkpoints taken (before the end)");
  for (int c = 0; c < nc; c++) {
    char h[32];
    snprintf(h, sizeof h, "%.0f (%d)", cli_json_num(confs[c].on.summary, "checkpoints"), stats(&confs[c].on, iters).n);
    printf(" %15s", h);
  }
  static const char *names[] = {"stall / checkpoint, mean",  "  max", "total / checkpoint, mean", "  max",
                                "servers / checkpoint, mean", "rows flushed / checkpoint", "MB written / checkpoint"};
  for (int i = 0; i < 7; i++) {
    printf("\n%-38s", names[i]);
    for (int c = 0; c < nc; c++) {
      cp_stats_t s = stats(&confs[c].on, iters);
      double v[] = {s.stall, s.stall_max, s.total, s.total_max, s.servers, s.flushed, s.written_mb};
      print_num(v[i], i < 5 ? " %12.0f ms" : i == 5 ? " %15.0f" : " %15.1f");
    }
  }
  printf("\n%-38s", "MB per server, last checkpoint");
  for (int c = 0; c < nc; c++) {
    char h[64];
    per_server_mb(confs[c].on.summary, h, sizeof h);
    printf(" %15s", h);
  }
  printf("\n%-38s", "kept on the servers, complete");
  for (int c = 0; c < nc; c++) {
    char h[32];
    snprintf(h, sizeof h, "%d of %d", confs[c].on.kept_complete, confs[c].on.kept);
    printf(" %15s", h);
  }
  printf("\n\n(samples/s: after iteration 0 (steady_samples_per_sec), as bench e2e; the difference between two jobs "
         "also holds\n"
         " their run-to-run variation (load average, 1 min, %.2f at the start and %.2f at the end, on %ld CPUs);\n"
         " \"stalls / train time\" is what the checkpoints held back in the checkpoint_every job: the sum of its\n"
         " stalls over its train_seconds.  Per-checkpoint figures: the checkpoint_every job's \"checkpoint complete\"\n"
         " lines of oracle-0.log, over the checkpoints before the end of the job (the end's is taken in the baseline\n"
         " too).  stall = what training lost: the iterations from c to the first one after the checkpoint's end,\n"
         " beyond their pace before c (the \"checkpoint stall\" lines); total = from every trainer's report of c\n"
         " to the end (training went on meanwhile); servers = their part (RocksDB checkpoints, manifest); MB written =\n"
         " growth of the checkpoint's bytes on all servers since the one before; kept: `chanter checkpoints --json`\n"
         " after the job, checkpoint_keep = %lld)\n\n",
         load0, load1, sysconf(_SC_NPROCESSORS_ONLN), (long long)cfg_int(cli->cfg, "checkpoint_keep"));
}

/* 2. the cost at the default interval, derived from the measured stall. */
static void print_interval_cost(const cpbench_t *bc) {
  const conf_t *confs = bc->confs;
  int nc = bc->nc, iters = bc->iters, every = bc->every;
  long long interval = bc->interval;
  if (interval > 0) {
    printf("Throughput cost at checkpoint_seconds = %lld (the default interval): derived from the measured stall, not\n"
           "run (a bench run cannot last %lld s): cost = stall per checkpoint / %lld s.  Aim: under 1%%.\n",
           interval, interval, interval);
    printf("%-38s", "cost from the mean stall");
    for (int c = 0; c < nc; c++) print_num(100.0 * stats(&confs[c].on, iters).stall / 1e3 / (double)interval, " %14.3f%%");
    printf("\n%-38s", "cost from the largest stall");
    for (int c = 0; c < nc; c++)
      print_num(100.0 * stats(&confs[c].on, iters).stall_max / 1e3 / (double)interval, " %14.3f%%");
    printf("\n%-38s", "under 1%");
    for (int c = 0; c < nc; c++) {
      cp_stats_t s = stats(&confs[c].on, iters);
      printf(" %15s", !s.n ? "-" : s.stall / 1e3 / (double)interval < 0.01 ? "yes" : "NO");
    }
    printf("\n(\"stalls / train time\" above is the same derivation at checkpoint_every = %d, next to the measured\n"
           " difference in samples/s)\n\n",
           every);
  } else {
    printf("checkpoint_seconds = 0 in this job: no cost at a default interval to derive\n\n");
  }
}

/* 3. time against rows changed and table size. */
static void print_scaling(const cpbench_t *bc) {
  const conf_t *confs = bc->confs;
  int nc = bc->nc, iters = bc->iters, quick = bc->quick;
  long long cache0 = bc->cache0, cache1 = bc->cache1;
  double rows1 = bc->rows1, rows10 = bc->rows10;
  const conf_t *x1 = &confs[0], *x10 = &confs[quick ? 1 : 2];
  printf("Checkpoint time against rows changed and table size (cache_rows %lld, every checkpoint of the\n"
         "checkpoint_every job, from oracle-0.log):\n",
         cache0);
  printf("%-52s    | %s\n", "tables x1", "tables x10");
  for (int h = 0; h < 2; h++) {
    printf("%6s %9s %8s %8s %8s %8s", "iter.", "flushed", "MB wrtn", "servers", "stall", "total");
    printf(h ? "\n" : "    | ");
  }
  int n = x1->on.n_cp > x10->on.n_cp ? x1->on.n_cp : x10->on.n_cp;
  for (int k = 0; k < n; k++) {
    for (int h = 0; h < 2; h++) {
      const run_t *r = h ? &x10->on : &x1->on;
      if (k < r->n_cp) {
        const cp_line_t *c = &r->cp[k];
        printf("%5" PRIu64 "%s %9" PRIu64 " %8.1f %5.0f ms %5.0f ms %5.0f ms", c->iteration + 1,
               c->iteration + 1 >= (uint64_t)iters ? "e" : " ", c->rows_flushed, written_mb(r, k), c->servers_ms,
               c->stall_ms, c->total_ms);
      } else {
        printf("%52s", "");
      }
      printf(h ? "\n" : "    | ");
    }
  }
  printf("(iter. = iterations the checkpoint holds, e = the end of the job's; flushed = rows the trainers wrote back\n"
         " without evicting; MB wrtn = growth of the checkpoint's bytes since the one before, negative where RocksDB\n"
         " compaction shrank the files)\n");
  for (int c = 0; c + (quick ? 1 : 2) < nc; c++) {
    char what[96];
    snprintf(what, sizeof what, "tables x10 / x1 at cache_rows %lld", confs[c].cache_rows);
    compare(what, &confs[c], &confs[c + (quick ? 1 : 2)], rows1, rows10, iters);
  }
  if (!quick)
    for (int c = 0; c < nc; c += 2) {
      char what[96];
      snprintf(what, sizeof what, "cache_rows %lld / %lld at tables x%d", cache1, cache0, confs[c].big ? 10 : 1);
      compare(what, &confs[c], &confs[c + 1], 1, 1, iters);
    }
  printf("(means over the checkpoints before the end of the job)\n");
}

int bench_checkpoint(cli_t *cli) {
  cpbench_t b = {.cli = cli};
  b.quick = cli_flag(cli, "--quick");
  if (cli_done(cli, "checkpoint")) return 2;
  int quick = b.quick;
  b.iters = quick ? 60 : 200;
  b.every = b.iters / 5;
  b.cache0 = (long long)cfg_int(cli->cfg, "cache_rows");
  b.cache1 = b.cache0 / 20;
  b.interval = (long long)cfg_int(cli->cfg, "checkpoint_seconds");
  const char *rows = cfg_str(cli->cfg, "table_rows");
  char big_rows[8192], one_rows[8192];
  b.rows1 = scaled_tables(rows, 1, one_rows, sizeof one_rows);
  b.rows10 = scaled_tables(rows, 10, big_rows, sizeof big_rows);
  conf_t *confs = b.confs;
  confs[b.nc++] = (conf_t){.big = 0, .cache_rows = b.cache0};
  if (!quick) confs[b.nc++] = (conf_t){.big = 0, .cache_rows = b.cache1};
  confs[b.nc++] = (conf_t){.big = 1, .cache_rows = b.cache0};
  if (!quick) confs[b.nc++] = (conf_t){.big = 1, .cache_rows = b.cache1};

  char self[1024], tmp[] = "/tmp/chanter-bench-checkpoint-XXXXXX", dir[1200];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  self[l > 0 ? l : 0] = 0;
  if (!mkdtemp(tmp)) return 1;
  printf("chanter bench checkpoint: local cluster (1 data processor, 2 embedding servers, oracle, 2 trainers), %d "
         "iterations, batch %lld\n",
         b.iters, (long long)cfg_int(cli->cfg, "batch_size"));
  printf("each configuration runs twice: checkpoints off but the one at the end of the job (checkpoint_every = 0, "
         "checkpoint_seconds = 0; the baseline), and checkpoint_every = %d\n\n",
         b.every);
  fflush(stdout);
  b.load0 = loadavg();
  int rc = 0;
  for (int c = 0; c < b.nc && !rc; c++) {
    char extra[9000];
    int o = snprintf(extra, sizeof extra, "--set cache_rows=%lld", confs[c].cache_rows);
    if (confs[c].big) o += snprintf(extra + o, sizeof extra - (size_t)o, " --set 'table_rows=%s'", big_rows);
    for (int on = 0; on < 2 && !rc; on++) {
      snprintf(extra + o, sizeof extra - (size_t)o, " --set checkpoint_seconds=0 --set checkpoint_every=%d",
               on ? b.every : 0);
      snprintf(dir, sizeof dir, "%s/x%d-cache%lld-%s", tmp, confs[c].big ? 10 : 1, confs[c].cache_rows,
               on ? "every" : "off");
      rc = run_job(cli, self, dir, extra, b.iters, on ? &confs[c].on : &confs[c].off);
    }
  }
  if (rc) goto out;
  b.load1 = loadavg();
  print_runs(&b);
  print_interval_cost(&b);
  print_scaling(&b);
  printf("\n");
  rc = bench_reshard(cli, self, tmp, big_rows, b.cache0, quick);

out:
  for (int c = 0; c < b.nc; c++) {
    free(confs[c].off.summary);
    free(confs[c].on.summary);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (rc == 0 && system(cmd) != 0) fprintf(stderr, "bench checkpoint: could not remove %s\n", tmp);
  return rc;
}
