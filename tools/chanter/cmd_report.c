/*
 * chanter report: plots of a finished or running job, as PNG and SVG, and
 * one HTML file that holds them all (for a ticket).
 *
 *   chanter [--config job.ini] report [--workdir W] [--out DIR] [--timeline FILE]
 *
 * What it reads: the oracle's timeline (oracle.state_dir/timeline.jsonl,
 * oracle_timeline.c: samples/s, loss, phases and rows moved about twice a
 * second, evaluations, checkpoints, state changes such as a recovery) and,
 * when there is one, W/summary.json (the job's figures and digest).  The
 * job is summary.json's job_id, else the timeline's last.
 *
 * What it writes in DIR (default W/report, or ./report):
 *   loss.{png,svg}        training loss per iteration; test AUC and logloss
 *   throughput.{png,svg}  samples/s over the job's time, checkpoints and
 *                         state changes (recoveries) marked
 *   phases.{png,svg}      one iteration's time by phase (stacked), per iteration
 *   traffic.{png,svg}     rows fetched, synchronized, written back and cache
 *                         hits per iteration, against the traffic floor of
 *                         the cached tables (the timeline's rows.floor: the
 *                         rows a perfect cache of the last L batches still
 *                         moves; absent in mode ideal)
 *   index.html            the job's figures and the four SVGs inline
 *   *.tsv, report.gp      the data and the gnuplot script that drew them
 *
 * Drawn with gnuplot (Debian's gnuplot-nox): one script gives both PNG
 * (cairo) and SVG, it runs headless, and the data and script stay beside
 * the plots so a person can redraw them; nothing is vendored.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "fsio.h"
#include "json.h"

/* The phases that add up to an iteration (phase.h's report order). */
static const char *const PHASES[] = {"wait", "fetch", "forward", "backward", "allreduce", "update", "write_back"};
#define N_PHASES (sizeof PHASES / sizeof PHASES[0])

#define MAX_MARKS 64 /* checkpoints and state changes drawn (the first ones; all are in marks.tsv) */

typedef struct report_s {
  FILE *iter, *eval, *marks;
  double t0;
  int n_iter, n_eval, n_marks, n_floor; /* n_floor: iteration lines with a floor */
  double mark_t[MAX_MARKS];
  char mark_what[MAX_MARKS][32];
  char last_state[32];
} report_t;

static FILE *open_out(const char *dir, const char *name) {
  char p[4600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return fopen(p, "w");
}

/* One timeline line of job into the data files. */
static void take_line(report_t *r, const char *line, const char *job) {
  char id[256], kind[32];
  double t;
  if (json_get_str(line, "job_id", id, sizeof id) || strcmp(id, job) || json_get_str(line, "kind", kind, sizeof kind) ||
      json_get_num(line, "t", &t))
    return;
  if (r->t0 == 0) r->t0 = t;
  t -= r->t0;
  double v[4];
  if (!strcmp(kind, "iter")) {
    if (json_get_num(line, "iteration", &v[0]) || json_get_num(line, "samples_per_sec", &v[1]) ||
        json_get_num(line, "loss", &v[2]))
      return;
    fprintf(r->iter, "%.3f\t%.0f\t%.1f\t%.6f", t, v[0], v[1], v[2]);
    for (size_t k = 0; k < N_PHASES; k++) {
      double ms = 0;
      json_get_num(line, PHASES[k], &ms);
      fprintf(r->iter, "\t%.4f", ms);
    }
    static const char *const rows[] = {"fetched", "synced", "written_back", "cache_hits"};
    for (size_t k = 0; k < 4; k++) {
      double n = 0;
      json_get_num(line, rows[k], &n);
      fprintf(r->iter, "\t%.1f", n);
    }
    double fl;
    if (!json_get_num(line, "floor", &fl)) {
      fprintf(r->iter, "\t%.1f\n", fl);
      r->n_floor++;
    } else {
      fprintf(r->iter, "\tNaN\n"); /* mode ideal, or a timeline older than the floor */
    }
    r->n_iter++;
  } else if (!strcmp(kind, "eval")) {
    if (json_get_num(line, "after_iteration", &v[0]) || json_get_num(line, "auc", &v[1]) ||
        json_get_num(line, "logloss", &v[2]))
      return;
    fprintf(r->eval, "%.3f\t%.0f\t%.6f\t%.6f\n", t, v[0] + 1, v[1], v[2]);
    r->n_eval++;
  } else if (!strcmp(kind, "checkpoint") || !strcmp(kind, "state")) {
    char what[64] = "checkpoint";
    if (!strcmp(kind, "state") && json_get_str(line, "state", what, sizeof what)) return;
    if (!strcmp(what, "waiting") || !strcmp(what, "training")) return; /* the ordinary start: no mark */
    if (strcmp(what, "checkpoint") && !strcmp(what, r->last_state)) return; /* the same state said by the next run */
    if (strcmp(what, "checkpoint")) snprintf(r->last_state, sizeof r->last_state, "%s", what);
    fprintf(r->marks, "%.3f\t%s\n", t, what);
    if (r->n_marks < MAX_MARKS) {
      r->mark_t[r->n_marks] = t;
      snprintf(r->mark_what[r->n_marks], sizeof r->mark_what[0], "%s", what);
    }
    r->n_marks++;
  }
}

/* The gnuplot script: each plot in both terminals. */
static void write_script(FILE *f, const report_t *r) {
  static const char *const colors[] = {"#9e9e9e", "#ff9800", "#2196f3", "#3f51b5", "#e91e63", "#4caf50", "#795548"};
  fprintf(f, "# chanter report: redraw with `gnuplot report.gp` in this directory\n"
             "set datafile separator '\\t'\nset grid\nset key outside right top\n"
             "# the first point holds the start-up (its wait and fetch): phases and traffic leave it out\n");
  const char *terms[][2] = {{"pngcairo size 960,480 font 'DejaVu Sans,10'", "png"}, {"svg size 960,480 dynamic", "svg"}};
  for (int k = 0; k < 2; k++) {
    fprintf(f, "\nset terminal %s noenhanced\n", terms[k][0]);
    const char *ext = terms[k][1];
    /* loss and AUC */
    fprintf(f, "set output 'loss.%s'\nset title 'Training loss and test metrics'\nset xlabel 'iteration'\n"
               "set ylabel 'logloss'\nset y2label 'AUC'\nset y2tics\nset ytics nomirror\n",
            ext);
    fprintf(f, "plot 'iter.tsv' using 2:4 with lines lw 1.5 title 'training loss'%s\n",
            r->n_eval ? ", 'eval.tsv' using 2:4 with linespoints pt 7 title 'test logloss', "
                        "'eval.tsv' using 2:3 axes x1y2 with linespoints pt 5 title 'test AUC'"
                      : "");
    fprintf(f, "unset y2label\nunset y2tics\nset ytics mirror\n");
    /* samples/s, with the marks */
    fprintf(f, "set output 'throughput.%s'\nset title 'Samples per second'\nset xlabel 'seconds since the start'\n"
               "set ylabel 'samples/s'\nunset arrow\nunset label\n",
            ext);
    for (int i = 0; i < r->n_marks && i < MAX_MARKS; i++)
      fprintf(f,
              "set arrow %d from %.3f, graph 0 to %.3f, graph 1 nohead lc rgb '%s' dt 2\n"
              "set label %d '%s' at %.3f, graph 0.97 rotate by 90 right font ',8'\n",
              i + 1, r->mark_t[i], r->mark_t[i], strcmp(r->mark_what[i], "checkpoint") ? "#e53935" : "#4caf50", i + 1,
              r->mark_what[i], r->mark_t[i]);
    fprintf(f, "plot 'iter.tsv' using 1:3 with lines lw 1.5 title 'samples/s'\nunset arrow\nunset label\n");
    /* phases, stacked: the cumulative sums drawn from the top down */
    fprintf(f, "set output 'phases.%s'\nset title 'One iteration by phase'\nset xlabel 'iteration'\n"
               "set ylabel 'ms per iteration'\nplot ",
            ext);
    for (int p = (int)N_PHASES - 1; p >= 0; p--) {
      fprintf(f, "'iter.tsv' every ::1 using 2:(0");
      for (int q = 0; q <= p; q++) fprintf(f, "+$%d", 5 + q);
      fprintf(f, ") with filledcurves x1 fc rgb '%s' title '%s'%s", colors[p], PHASES[p], p ? ", " : "\n");
    }
    /* rows moved, against the floor */
    fprintf(f, "set output 'traffic.%s'\nset title 'Rows per iteration against the traffic floor'\n"
               "set xlabel 'iteration'\nset ylabel 'rows'\n"
               "plot 'iter.tsv' every ::1 using 2:12 with lines title 'fetched', '' every ::1 using 2:13 with lines title "
               "'synchronized', '' every ::1 using 2:14 with lines title 'written back', '' every ::1 using 2:15 with "
               "lines title 'cache hits'%s\n",
            ext,
            r->n_floor ? ", '' every ::1 using 2:16 with lines dt 2 lw 2 lc rgb 'black' title 'floor (cached tables)'"
                       : "");
  }
}

/* gnuplot report.gp in dir; 0, or -1 after saying why. */
static int run_gnuplot(const char *dir) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (chdir(dir) != 0) _exit(126);
    execlp("gnuplot", "gnuplot", "report.gp", (char *)NULL);
    _exit(errno == ENOENT ? 127 : 126);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
    fprintf(stderr, "chanter report: gnuplot is not installed (Debian's gnuplot-nox: tools/install-deps.sh)\n");
    return -1;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "chanter report: gnuplot failed on %s/report.gp (exit %d)\n", dir, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return -1;
  }
  return 0;
}

/* index.html: the summary's figures and the SVGs inline. */
static int write_html(const char *dir, const char *job, const char *summary) {
  FILE *f = open_out(dir, "index.html");
  if (!f) return -1;
  char e[512];
  json_escape(e, sizeof e, job);
  fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>chanter report: %s</title>\n"
             "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}td{padding:2px 12px}"
             "h2{margin-top:1.5em}</style></head><body>\n<h1>chanter job %s</h1>\n<table>\n",
          e, e);
  static const char *const keys[] = {"state", "iterations", "samples_per_sec", "steady_samples_per_sec", "test_auc",
                                     "test_logloss", "train_logloss", "train_seconds", "checkpoints", "rows_fetched",
                                     "floor_rows", "digest"};
  for (size_t k = 0; summary && k < sizeof keys / sizeof keys[0]; k++) {
    char s[256];
    double v;
    if (!json_get_str(summary, keys[k], s, sizeof s)) fprintf(f, "<tr><td>%s</td><td><code>%s</code></td></tr>\n", keys[k], s);
    else if (!json_get_num(summary, keys[k], &v)) fprintf(f, "<tr><td>%s</td><td>%.10g</td></tr>\n", keys[k], v);
  }
  fprintf(f, "</table>\n");
  static const char *const plots[][2] = {{"loss", "Loss and AUC"},
                                         {"throughput", "Samples per second, checkpoints and recoveries"},
                                         {"phases", "One iteration by phase"},
                                         {"traffic", "Rows moved per iteration, against the floor"}};
  for (size_t k = 0; k < 4; k++) {
    char p[4600], *svg = NULL;
    snprintf(p, sizeof p, "%s/%s.svg", dir, plots[k][0]);
    fprintf(f, "<h2>%s</h2>\n", plots[k][1]);
    if (fsio_read_all(p, 0, &svg, NULL, NULL, 0) == 0) {
      const char *body = strstr(svg, "<svg");
      fputs(body ? body : "", f);
      free(svg);
    }
    fprintf(f, "\n<p><a href=\"%s.png\">PNG</a> <a href=\"%s.svg\">SVG</a></p>\n", plots[k][0], plots[k][0]);
  }
  fprintf(f, "</body></html>\n");
  return fclose(f) == 0 ? 0 : -1;
}

int cmd_report(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir"), *out = cli_opt(cli, "--out"), *tl = cli_opt(cli, "--timeline");
  if (cli_done(cli, NULL)) return 2;
  char err[1024] = "", path[4400], outdir[4096], why[512];
  int owned = 0;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter report: %s\n", err[0] ? err : "out of memory");
    return 1;
  }
  if (tl) snprintf(path, sizeof path, "%s", tl);
  else snprintf(path, sizeof path, "%s/timeline.jsonl", cfg_str(cfg, "oracle.state_dir"));
  int no_dir = !tl && !*cfg_str(cfg, "oracle.state_dir");
  if (owned) cfg_destroy(cfg);
  if (no_dir) {
    fprintf(stderr, "chanter report: the job has no oracle.state_dir, so its oracle keeps no timeline "
                    "(chanter local up sets one; or give --timeline FILE)\n");
    return 1;
  }
  char *text = NULL, *summary = NULL;
  if (fsio_read_all(path, 0, &text, NULL, why, sizeof why)) {
    fprintf(stderr, "chanter report: no timeline: %s\n", why);
    return 1;
  }
  if (workdir) {
    snprintf(outdir, sizeof outdir, "%s/summary.json", workdir);
    fsio_read_all(outdir, 0, &summary, NULL, NULL, 0); /* a running job has none yet */
  }
  snprintf(outdir, sizeof outdir, "%s", out ? out : workdir ? "" : "report");
  if (!out && workdir) snprintf(outdir, sizeof outdir, "%s/report", workdir);
  char job[256] = "";
  if (summary) json_get_str(summary, "job_id", job, sizeof job);
  if (!job[0]) /* the last line's */
    for (char *l = text; *l;) {
      char *nl = strchr(l, '\n');
      if (nl) *nl = 0;
      char id[256];
      if (!json_get_str(l, "job_id", id, sizeof id)) snprintf(job, sizeof job, "%s", id);
      if (!nl) break;
      *nl = '\n';
      l = nl + 1;
    }
  int rc = 1;
  report_t r = {0};
  if (fsio_mkdir_p(outdir, why, sizeof why)) {
    fprintf(stderr, "chanter report: %s\n", why);
    goto out;
  }
  r.iter = open_out(outdir, "iter.tsv");
  r.eval = open_out(outdir, "eval.tsv");
  r.marks = open_out(outdir, "marks.tsv");
  if (!r.iter || !r.eval || !r.marks) {
    fprintf(stderr, "chanter report: cannot write in %s: %s\n", outdir, strerror(errno));
    goto out;
  }
  for (char *l = text, *nl; *l; l = nl + 1) {
    nl = strchr(l, '\n');
    if (nl) *nl = 0;
    take_line(&r, l, job);
    if (!nl) break;
  }
  if (r.n_iter == 0) {
    fprintf(stderr, "chanter report: %s has no iteration of job %s yet\n", path, job[0] ? job : "(none)");
    goto out;
  }
  fclose(r.iter), fclose(r.eval), fclose(r.marks);
  r.iter = r.eval = r.marks = NULL;
  FILE *gp = open_out(outdir, "report.gp");
  if (!gp) goto out;
  write_script(gp, &r);
  if (fclose(gp) != 0 || run_gnuplot(outdir) || write_html(outdir, job, summary)) goto out;
  printf("chanter report: job %s: %d points, %d evaluations, %d marks; %s/index.html\n", job, r.n_iter, r.n_eval,
         r.n_marks, outdir);
  rc = 0;
out:
  if (r.iter) fclose(r.iter);
  if (r.eval) fclose(r.eval);
  if (r.marks) fclose(r.marks);
  free(text);
  free(summary);
  return rc;
}
