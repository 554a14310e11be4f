/*
 * chanter train: starts the job on a cluster (`chanter local up`, or the
 * oracle named by cluster.oracle) and watches it to its end -- progress,
 * checkpoints, warnings, the summary and the digest -- with --resume and
 * --fresh; `--local` trains in this process instead (train_local.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "err.h"
#include "embc.h"
#include "embedding.pb-c.h"
#include "fsio.h"
#include "json.h"
#include "le.h"
#include "orc.h"
#include "reshard.h"
#include "sbuf.h"
#include "supervise.h"

void train_progress(int tty, uint64_t it, uint64_t total, double sps, double loss, double eta) {
  if (tty) {
    int width = 30, filled = total ? (int)((double)it * width / (double)total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %" PRIu64 "/%" PRIu64 "  %.0f samples/s  loss %.4f  ETA %.0fs   ", bar, it, total, sps, loss,
            eta);
  } else {
    fprintf(stderr, "iteration %" PRIu64 "/%" PRIu64 " samples/s=%.0f loss=%.4f eta_s=%.0f\n", it, total, sps, loss, eta);
  }
}

/* ---- the cluster: watch the oracle's job to its end */

/* The embedding digest: the servers' set digests (each the lane-wise sum
 * mod 2^64 of SHA-256(key, row) over its rows) summed lane by lane, then
 * hashed -- the same however the rows are spread over the servers, so a
 * job resumed onto another server count keeps its digest -- and the
 * stored rows. */
static int embedding_digest(const cfg_t *cfg, char hex[65], uint64_t *rows, char *err, size_t n) {
  embc_t *c;
  int rc = embc_create(cfg, &c, err, n);
  if (rc) return rc;
  uint64_t lane[4] = {0, 0, 0, 0};
  *rows = 0;
  for (uint32_t s = 0; s < embc_servers(c) && !rc; s++) {
    Chanter__Embedding__V1__DigestRequest req = CHANTER__EMBEDDING__V1__DIGEST_REQUEST__INIT;
    Chanter__Embedding__V1__DigestResponse *d = NULL;
    rc = embc_digest(c, s, &req, &d, err, n);
    if (rc) break;
    if (d->set_sha256.len != 32) {
      rc = err_set(err, n, ERR_BADMSG, "embedding server %u sent a set digest of %zu bytes, not 32", s, d->set_sha256.len);
    } else {
      le_lanes_add(lane, d->set_sha256.data);
    }
    *rows += d->rows;
    protobuf_c_message_free_unpacked(&d->base, NULL);
  }
  uint8_t buf[32], h[32];
  le_lanes_put(buf, lane);
  unsigned hl = 0;
  EVP_Digest(buf, sizeof buf, h, &hl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
  embc_destroy(c);
  return rc;
}

/* Says what a checkpoint took, once per new one. */
static void checkpoint_line(int tty, const char *summary, double *seen) {
  double n = cli_json_num(summary, "checkpoints");
  if (isnan(n) || n <= *seen) return;
  *seen = n;
  const char *o = strstr(summary, "\"checkpoint\": {");
  if (!o) return;
  char id[128] = "";
  json_get_str(o, "id", id, sizeof id);
  double it = cli_json_num(o, "iteration"), target = cli_json_num(summary, "target_iterations");
  fprintf(stderr, "%scheckpoint %s: the model after iteration %.0f, written in %.0f ms (trainers %.0f ms, servers %.0f "
                  "ms) %s, %.1f MB on the servers\n",
          tty ? "\r" : "", id, it, 1e3 * cli_json_num(o, "total_seconds"), 1e3 * cli_json_num(o, "trainers_seconds"),
          1e3 * cli_json_num(o, "servers_seconds"), it + 1 >= target ? "at the end of the job" : "while training went on",
          cli_json_num(o, "bytes") / 1e6);
}

/* --resume onto another embedding_servers count: when the old servers'
 * directories are readable here, the checkpoint is resharded first
 * (reshard.h) and the job resumes from the resharded one; *resume then
 * names it (in buf).  0, or 1 after saying why not. */
static int maybe_reshard(const cfg_t *cfg, const char *pattern, const char **resume, char *buf, size_t n, int quiet) {
  manifest_t m;
  char err[1024];
  if (reshard_find(pattern, *resume, &m, err, sizeof err) != 0) return 0; /* not here: the oracle resolves it */
  uint64_t S = (uint64_t)cfg_int(cfg, "embedding_servers");
  if (m.servers == S) {
    manifest_free(&m);
    return 0;
  }
  (void)quiet; /* said even with --quiet: it changes the servers */
  fprintf(stderr, "chanter train: checkpoint %s was taken on %" PRIu64 " embedding servers, this job has %" PRIu64
                    ": resharding it (reading %s)\n",
            m.id, m.servers, S, pattern);
  reshard_stats_t st;
  int rc = reshard_run(cfg, pattern, &m, buf, n, &st, err, sizeof err);
  manifest_free(&m);
  if (rc) {
    fprintf(stderr, "chanter train: resharding failed: %s (nothing was restored; the job is still blocked)\n", err);
    return 1;
  }
  fprintf(stderr, "chanter train: resharded %" PRIu64 " rows (%.1f MB) and %" PRIu64 " blobs into checkpoint %s in %.2f s "
                    "(%.2f s per million rows: read %.2f s, write %.2f s, checkpoint %.2f s)\n",
            st.rows, (double)st.bytes / 1e6, st.blobs, buf, st.seconds, st.rows ? st.seconds * 1e6 / (double)st.rows : 0,
            st.read_seconds, st.write_seconds, st.checkpoint_seconds);
  *resume = buf;
  return 0;
}

/* What watching a job remembers from one poll of the oracle to the next. */
typedef struct watch_s {
  const cfg_t *cfg;
  orc_t *o;
  const char *workdir, *resume, *old_dirs;
  int quiet, fresh, tty;
  int asked;    /* --resume / --fresh sent */
  int answered; /* the oracle answered once: it is there, and may come back after a restart */
  int local;    /* workdir held a local cluster (its pids file) when the watch began */
  double progress_at, last_print, ckpt_seen, unreachable_since;
  uint64_t last_it;
  size_t warned; /* the job's warnings printed so far: each once, as soon as the oracle has it */
  char last_why[200], recovery_said[512], scale_said[512];
  char reshard_id[128]; /* what resume names after maybe_reshard */
} watch_t;

/* The oracle does not answer (err says why) after it did: killed and
 * restarting (it recovers the job), or gone for good.  1 to wait for it,
 * 0 (said) once trainer.rejoin_timeout_ms has passed. */
static int oracle_gone(watch_t *w, const char *err) {
  double now = clock_mono_s(), limit = (double)cfg_int(w->cfg, "trainer.rejoin_timeout_ms") / 1e3;
  if (w->local && supervise_pids_load(w->workdir, NULL, 0) < 0 && supervise_running(w->workdir) <= 0) {
    /* `local down` removed the pids file, and no supervisor restarts the oracle */
    fprintf(stderr, "%schanter train: the oracle does not answer (%s), and the local cluster in %s is down: nothing "
                    "will restart it\n",
            w->tty ? "\n" : "", err, w->workdir);
    return 0;
  }
  if (!w->unreachable_since) {
    w->unreachable_since = now;
    fprintf(stderr, "%schanter train: the oracle does not answer (%s); waiting up to %.0f s for it to come back "
                    "(a restarted oracle recovers the job)\n",
            w->tty ? "\n" : "", err, limit);
  }
  if (now - w->unreachable_since > limit) {
    fprintf(stderr, "chanter train: the oracle has not answered for %.0f s (trainer.rejoin_timeout_ms): %s\n",
            now - w->unreachable_since, err);
    return 0;
  }
  return 1;
}

/* The job's news in the oracle's summary: a recovery (each new line
 * once) and the warnings not printed yet. */
static void say_news(watch_t *w, const char *summary) {
  char line[512] = "";
  json_get_str(summary, "recovery", line, sizeof line);
  if (line[0] && strcmp(line, w->recovery_said) && (strstr(line, "recovered") || !w->recovery_said[0])) {
    if (!w->quiet || strstr(line, "caught up")) fprintf(stderr, "%schanter train: %s\n", w->tty ? "\n" : "", line);
    snprintf(w->recovery_said, sizeof w->recovery_said, "%s", line);
  }
  json_get_str(summary, "scale", line, sizeof line); /* chanter scale: once it is done */
  if (strstr(line, "scaled") && strcmp(line, w->scale_said)) {
    fprintf(stderr, "%schanter train: %s\n", w->tty ? "\n" : "", line);
    snprintf(w->scale_said, sizeof w->scale_said, "%s", line);
  }
  char warning[1024];
  for (; json_get_str_at(summary, "warnings", w->warned, warning, sizeof warning) == 0; w->warned++)
    fprintf(stderr, "%schanter train: warning: %s\n", w->tty && w->last_print > 0 ? "\n" : "", warning);
}

/* The job is blocked: the embedding servers hold another job's state.
 * Goes on from a checkpoint (--resume; resharded first when the servers
 * changed), or starts over (--fresh), as asked: 1 once asked, 0 (said
 * why) when the job cannot go on. */
static int unblock(watch_t *w, const Chanter__Oracle__V1__StatusResponse *st) {
  if (!w->resume && !w->fresh) {
    fprintf(stderr, "%schanter train: the job is blocked: %s\n", w->tty && w->last_print > 0 ? "\n" : "", st->message);
    return 0;
  }
  if (w->asked) { /* refused (the message says why), or not yet applied */
    fprintf(stderr, "%schanter train: %s\n", w->tty && w->last_print > 0 ? "\n" : "", st->message);
    return 0;
  }
  char msg[1536], pattern[4200], err[1024] = "";
  if (w->resume) { /* the old servers' data dirs: where chanter local keeps them, or as given, or the job's */
    if (w->old_dirs) snprintf(pattern, sizeof pattern, "%s", w->old_dirs);
    else if (w->workdir) snprintf(pattern, sizeof pattern, "%s/embedding-%%i", w->workdir);
    else snprintf(pattern, sizeof pattern, "%s", cfg_str(w->cfg, "embedding.data_dir"));
    if (maybe_reshard(w->cfg, pattern, &w->resume, w->reshard_id, sizeof w->reshard_id, w->quiet)) return 0;
  }
  if (orc_start(w->o, w->resume, w->fresh, msg, sizeof msg, err, sizeof err)) {
    fprintf(stderr, "chanter train: %s\n", err);
    return 0;
  }
  w->asked = 1;
  if (!w->quiet) fprintf(stderr, "chanter train: %s\n", msg);
  return 1;
}

/* The progress line, or what the job waits for: at most every 0.25 s on
 * a terminal (5 s otherwise), and at once at the end or for a new stage
 * of lookahead's start-up. */
static void progress(watch_t *w, const Chanter__Oracle__V1__StatusResponse *st, int finished, double now) {
  /* while lookahead = auto measures its first batches and chooses L, the progress
   * line says so; a new stage of it is shown at once */
  char why[200] = "";
  int startup = !w->quiet && st->iteration == 0 && strcmp(st->state, "waiting") &&
                json_get_str(st->summary_json, "startup", why, sizeof why) == 0 && *why;
  /* a server's full disk holds the job: said at once when it starts, then as often as the progress */
  char paused[640] = "";
  if (!w->quiet && !strcmp(st->state, "training")) json_get_str(st->summary_json, "paused", paused, sizeof paused);
  int new_stage = (startup && strncmp(why, w->last_why, 40) != 0) || (*paused && strncmp(paused, w->last_why, 40) != 0);
  if (startup || *paused) snprintf(w->last_why, sizeof w->last_why, "%.150s", startup ? why : paused);
  else w->last_why[0] = 0;
  if (w->quiet || !(finished || new_stage || now - w->last_print > (w->tty ? 0.25 : 5.0))) return;
  int tty = w->tty;
  double sps = cli_json_num(st->summary_json, "samples_per_sec"), loss = cli_json_num(st->summary_json, "train_logloss");
  double eta = sps > 0 ? (double)(st->iterations - st->iteration) * (double)cfg_int(w->cfg, "batch_size") / sps : 0;
  if (!strcmp(st->state, "waiting"))
    fprintf(stderr, tty ? "\rwaiting for the job to start (%zu members)...   " : "waiting for the job to start (%zu members)\n",
            st->n_members);
  else if (*paused) /* a server's full disk holds it: said, not drawn as a bar that stopped */
    fprintf(stderr, tty ? "\rpaused at iteration %llu/%llu: %s   " : "paused at iteration %llu/%llu: %s\n",
            (unsigned long long)st->iteration, (unsigned long long)st->iterations, paused);
  else if (startup)
    fprintf(stderr, tty ? "\r%s ...   " : "%s\n", why); /* lookahead's start-up: why no Step yet */
  else {
    train_progress(tty, st->iteration, st->iterations, isnan(sps) ? 0 : sps, isnan(loss) ? 0 : loss, eta);
    double hits = cli_json_num(st->summary_json, "cache_hits"), fet = cli_json_num(st->summary_json, "rows_fetched");
    double la = cli_json_num(st->summary_json, "lookahead");
    if (!isnan(hits) && !isnan(fet) && hits + fet > 0 && !isnan(la))
      fprintf(stderr, tty ? "L=%.0f hit %.0f%%   " : "  lookahead=%.0f cache_hit_pct=%.0f\n", la,
              100.0 * hits / (hits + fet));
  }
  w->last_print = now;
}

/* Polls the oracle until the job ends: 0 with *out its last status (the
 * caller frees it), or 1 after saying why not. */
static int watch_job(watch_t *w, Chanter__Oracle__V1__StatusResponse **out) {
  Chanter__Oracle__V1__StatusResponse *st = NULL;
  char err[1024] = "";
  int rc = 1;
  for (;;) {
    if (st) protobuf_c_message_free_unpacked(&st->base, NULL);
    st = NULL;
    /* retried inside while the oracle has not answered yet (it may be starting); then once a poll, so that
     * oracle_gone judges each failure */
    int src = w->answered ? orc_status_once(w->o, &st, err, sizeof err) : orc_status(w->o, &st, err, sizeof err);
    if ((src == ERR_UNAVAILABLE || src == ERR_DEADLINE) && w->answered) {
      if (!oracle_gone(w, err)) goto out;
      usleep(500000);
      continue;
    }
    if (src) {
      fprintf(stderr, "%schanter train: %s\n", w->tty ? "\n" : "", err);
      goto out;
    }
    w->answered = 1;
    if (w->unreachable_since) {
      if (!w->quiet)
        fprintf(stderr, "chanter train: the oracle answers again after %.1f s\n", clock_mono_s() - w->unreachable_since);
      w->unreachable_since = 0;
      w->progress_at = clock_mono_s();
    }
    say_news(w, st->summary_json);
    double now = clock_mono_s();
    if (st->iteration != w->last_it) {
      w->last_it = st->iteration;
      w->progress_at = now;
    }
    char paused[8] = "";
    /* a job paused for a full disk waits as long as it says (embedding.disk_full_timeout_s), not 180 s */
    if (json_get_str(st->summary_json, "paused", paused, sizeof paused) == 0 && *paused) w->progress_at = now;
    if (!strcmp(st->state, "blocked")) {
      if (!unblock(w, st)) goto out;
      usleep(100000);
      continue;
    }
    if (w->resume && !w->asked && strcmp(st->state, "waiting") != 0) {
      fprintf(stderr, "chanter train: --resume: the job did not wait for it: it is %s%s%s (the embedding servers held no "
                      "state, so it started at iteration 0)\n",
              st->state, st->message && *st->message ? ": " : "", st->message ? st->message : "");
      goto out;
    }
    if (!w->quiet) checkpoint_line(w->tty, st->summary_json, &w->ckpt_seen);
    int finished = !strcmp(st->state, "done") || !strcmp(st->state, "failed") || !strcmp(st->state, "stopped");
    progress(w, st, finished, now);
    if (finished) {
      rc = 0;
      break;
    }
    if (now - w->progress_at > 180) {
      fprintf(stderr, "%schanter train: no progress for 180 s (state %s, iteration %llu); see `chanter local status` and "
                      "the daemons' logs\n",
              w->tty ? "\n" : "", st->state, (unsigned long long)st->iteration);
      goto out;
    }
    usleep(200000);
  }
out:
  if (rc && st) {
    protobuf_c_message_free_unpacked(&st->base, NULL);
    st = NULL;
  }
  *out = st;
  return rc;
}

/* The finished job's summary for a person, on stdout. */
static void print_job_summary(const cfg_t *cfg, const Chanter__Oracle__V1__StatusResponse *st, const char *summary,
                              const char *digest_hex, const char *dense_hex, const char *emb_hex, uint64_t stored) {
  printf("iterations        %llu (batch %lld, %lld trainers)\n", (unsigned long long)st->iterations,
         (long long)cfg_int(cfg, "batch_size"), (long long)cfg_int(cfg, "trainers"));
  printf("samples/s         %.0f\n", cli_json_num(summary, "samples_per_sec"));
  char ll_def[256] = "";
  json_get_str(summary, "train_logloss_definition", ll_def, sizeof ll_def);
  printf("train logloss     %.4f%s%s%s\n", cli_json_num(summary, "train_logloss"), ll_def[0] ? " (" : "", ll_def,
         ll_def[0] ? ")" : "");
  double tl = cli_json_num(summary, "test_logloss"), ta = cli_json_num(summary, "test_auc");
  double scored = cli_json_num(summary, "test_samples_scored");
  if (isnan(tl) && isnan(ta)) {
    printf("test logloss/AUC  none (no evaluation ran: eval_batches = %lld)\n", (long long)cfg_int(cfg, "eval_batches"));
  } else {
    if (!isnan(scored)) printf("test logloss      %.4f (scored %.0f test samples)\n", tl, scored);
    else printf("test logloss      %.4f\n", tl);
    printf("test AUC          %.4f\n", ta);
  }
  printf("rows / iteration  fetched %.0f, cache hits %.0f, synchronized %.0f (delayed %.0f, handed over %.0f), "
         "written back %.0f\n",
         cli_json_num(summary, "rows_fetched"), cli_json_num(summary, "cache_hits"), cli_json_num(summary, "rows_synced"),
         cli_json_num(summary, "rows_synced_delayed"), cli_json_num(summary, "rows_replicated"),
         cli_json_num(summary, "rows_written_back"));
  double first = cli_json_num(summary, "first_iteration_seconds");
  if (!isnan(first))
    printf("start-up          %.2f s to the first iteration; %.0f samples/s after it\n", first,
           cli_json_num(summary, "steady_samples_per_sec"));
  double la = cli_json_num(summary, "lookahead");
  if (!isnan(la))
    printf("lookahead         L = %.0f (started at %.0f), cache_rows %.0f, slots used at most %.0f\n", la,
           cli_json_num(summary, "lookahead_start"), cli_json_num(summary, "cache_rows"),
           cli_json_num(summary, "slots_peak"));
  printf("digest            %s (dense %s, embeddings %s over %llu stored rows)\n", digest_hex, dense_hex, emb_hex,
         (unsigned long long)stored);
}

/* The job is done: its digests, summary.json (the oracle's summary plus
 * the digests) in workdir, and the summary on stdout (--json: the same
 * text).  0, or 1 after saying why not. */
static int job_done(const cli_t *cli, const cfg_t *cfg, const Chanter__Oracle__V1__StatusResponse *st,
                    const char *workdir) {
  char err[1024] = "", emb_hex[65], dense_hex[80] = "", digest_hex[65];
  uint64_t stored = 0;
  /* a local cluster's job file as it is now: chanter scale may have changed its embedding servers */
  char job[4200];
  cfg_t *now = NULL;
  snprintf(job, sizeof job, "%s/job.ini", workdir ? workdir : "");
  if (workdir && (cfg_create(&now) || cfg_load_file(now, job, err, sizeof err))) {
    cfg_destroy(now);
    now = NULL;
  }
  int drc = embedding_digest(now ? now : cfg, emb_hex, &stored, err, sizeof err);
  cfg_destroy(now);
  if (drc) {
    fprintf(stderr, "chanter train: embedding digest: %s\n", err);
    return 1;
  }
  json_get_str(st->summary_json, "dense_sha256", dense_hex, sizeof dense_hex);
  /* the model digest: SHA-256 of "<dense sha256 hex>:<embedding digest hex>" */
  {
    char both[160];
    uint8_t h[32];
    unsigned hl = 0;
    int bl = snprintf(both, sizeof both, "%s:%s", dense_hex, emb_hex);
    EVP_Digest(both, (size_t)bl, h, &hl, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) snprintf(digest_hex + 2 * i, 3, "%02x", h[i]);
  }
  /* the oracle's summary, its closing brace replaced by the digests' keys */
  size_t sl = strlen(st->summary_json);
  while (sl && st->summary_json[sl - 1] != '}') sl--;
  if (sl) sl--;
  sbuf_t b = {0};
  sb_printf(&b, "%.*s, \"digest\": \"%s\", \"embedding_digest\": \"%s\", \"stored_rows\": %llu}\n", (int)sl,
            st->summary_json, digest_hex, emb_hex, (unsigned long long)stored);
  if (b.oom) {
    fprintf(stderr, "chanter train: out of memory\n");
    free(b.s);
    return 1;
  }
  int rc = 0;
  if (workdir) {
    char path[4096];
    mkdir(workdir, 0755);
    snprintf(path, sizeof path, "%s/summary.json", workdir);
    if ((rc = fsio_replace(path, b.s, b.n, 0666, NULL, 0)) != 0)
      fprintf(stderr, "chanter train: cannot write %s: %s\n", path, strerror(-rc));
  }
  if (!rc && cli->json) fputs(b.s, stdout);
  else if (!rc) print_job_summary(cfg, st, b.s, digest_hex, dense_hex, emb_hex, stored);
  free(b.s);
  return rc ? 1 : 0;
}

static int train_cluster(cli_t *cli, const char *workdir, int quiet, const char *resume, int fresh,
                         const char *old_dirs) {
  char err[1024] = "";
  int owned = 0, rc = 1;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter train: %s\n", err);
    return 1;
  }
  watch_t w = {.cfg = cfg,
               .workdir = workdir,
               .resume = resume,
               .old_dirs = old_dirs,
               .quiet = quiet,
               .fresh = fresh,
               .tty = isatty(2),
               .progress_at = clock_mono_s(),
               .last_it = UINT64_MAX};
  w.local = workdir && supervise_pids_load(workdir, NULL, 0) >= 0;
  Chanter__Oracle__V1__StatusResponse *st = NULL;
  if (orc_create(cfg, NULL, &w.o, err, sizeof err)) {
    fprintf(stderr, "chanter train: %s (start a cluster with `chanter local up --workdir DIR`, or set cluster.oracle)\n",
            err);
    goto out;
  }
  if (watch_job(&w, &st)) goto out;
  if (!quiet && w.tty) fputc('\n', stderr);
  if (strcmp(st->state, "done") != 0) {
    fprintf(stderr, "chanter train: the job %s: %s\n", st->state, st->message && *st->message ? st->message : "(no message)");
    goto out;
  }
  rc = job_done(cli, cfg, st, workdir);
out:
  if (st) protobuf_c_message_free_unpacked(&st->base, NULL);
  orc_destroy(w.o);
  if (owned) cfg_destroy(cfg);
  return rc;
}

int cmd_train(cli_t *cli) {
  int local = cli_flag(cli, "--local");
  const char *workdir = cli_opt(cli, "--workdir");
  int quiet = cli_flag(cli, "--quiet");
  int fresh = cli_flag(cli, "--fresh");
  const char *old_dirs = cli_opt(cli, "--old-data-dirs");
  /* --resume [latest|ID]: the value is optional */
  const char *resume = NULL;
  for (int i = 0; i < cli->argc; i++) {
    if (strcmp(cli->argv[i], "--resume") != 0) continue;
    int has = i + 1 < cli->argc && cli->argv[i + 1][0] != '-';
    resume = has ? cli->argv[i + 1] : "latest";
    int k = has ? 2 : 1;
    memmove(&cli->argv[i], &cli->argv[i + k], (size_t)(cli->argc - i - k + 1) * sizeof(char *));
    cli->argc -= k;
    break;
  }
  if (cli_done(cli, NULL)) return 2;
  if (resume && fresh) return cli_usage_error(cli, "--resume and --fresh exclude each other");
  if (local && (resume || fresh)) return cli_usage_error(cli, "--resume and --fresh act on a cluster's job, not --local");
  if (!local) return train_cluster(cli, workdir, quiet, resume, fresh, old_dirs);
  return train_local(cli, workdir, quiet);
}
