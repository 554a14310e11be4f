/* oracle_recover: see oracle_recover.h. */
#include "oracle_recover.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "json.h"
#include "log.h"
#include "manifest.h"

static double unix_now(void) { return clock_wall_s(); }

/* ------------------------------------------------------------------ files */

/* dir/name replaced durably (fsio_replace: temporary, fsync, rename,
 * fsync the directory). */
static int write_atomic(const char *dir, const char *name, const char *text, size_t len, char *err, size_t err_len) {
  char path[4300];
  int rc = fsio_mkdir_p(dir, err, err_len);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return fsio_replace(path, text, len, 0644, err, err_len);
}

void oracle_record_config_hash(const cfg_t *cfg, char out[65]) { oracle_record_config_hash_as(cfg, NULL, 0, out); }

void oracle_record_config_hash_as(const cfg_t *cfg, const char *key, uint32_t value, char out[65]) {
  char *buf = NULL, *kept = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f) {
    cfg_dump(cfg, f, 0);
    fclose(f);
  }
  /* without [cluster], [tls], [metrics] and [local]: where the daemons
   * are, how they prove who they are, where they are scraped and how they
   * are supervised is not what the job is (the oracle's own address comes
   * into the job file only after it started; certificates are renewed) */
  size_t o = 0, kl = key ? strlen(key) : 0;
  int skip = 0, top = 1;
  if (buf && !(kept = malloc(len + kl + 32))) { /* (+ the key's line with a longer value) */
    free(buf);
    buf = NULL;
  }
  for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
    nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
    if (line[0] == '[') top = 0;
    if (line[0] == '[')
      skip = !strncmp(line, "[cluster]", 9) || !strncmp(line, "[tls]", 5) || !strncmp(line, "[metrics]", 9) ||
             !strncmp(line, "[local]", 7);
    if (skip) continue;
    if (key && top && !strncmp(line, key, kl) && !strncmp(line + kl, " = ", 3))
      o += (size_t)snprintf(kept + o, kl + 32, "%s = %u\n", key, value);
    else
      memcpy(kept + o, line, n), o += n;
  }
  manifest_sha256_hex(kept ? kept : "", o, out);
  free(kept);
  free(buf);
}

int oracle_record_write(const char *dir, const char *job_id, const char *state, const char *config,
                        const oracle_record_scale_t *scale, char *err, size_t err_len) {
  size_t cap = 1024 + (scale && scale->addrs ? strlen(scale->addrs) : 0);
  char *text = malloc(cap);
  if (!text) return err_set(err, err_len, -ENOMEM, "out of memory for the job record");
  int n = snprintf(text, cap,
                   "; chanter-oracle's record of its job: state=training when it stops means it was killed in the "
                   "middle of the job, and the next oracle with the same configuration recovers it\njob_id=%s\n"
                   "state=%s\nconfig=%s\n",
                   job_id, state, config);
  if (scale && scale->to)
    n += snprintf(text + n, cap - (size_t)n,
                  "; a scale of the embedding servers under way: the next oracle (with either configuration) "
                  "carries it out from the old servers' latest complete checkpoint\nscale_servers_from=%u\n"
                  "scale_servers_to=%u\nscale_servers_at=%" PRIu64 "\nscale_servers_asked=%.3f\n"
                  "scale_servers_config=%s\nscale_servers_addrs=%s\n",
                  scale->from, scale->to, scale->at, scale->asked, scale->config, scale->addrs);
  int rc = write_atomic(dir, "job", text, (size_t)n, err, err_len);
  free(text);
  return rc;
}

void oracle_record_scale_free(oracle_record_scale_t *s) {
  free(s->addrs);
  memset(s, 0, sizeof *s);
}

int oracle_record_read(const char *dir, char *job_id, size_t id_len, char *state, size_t state_len, char *config,
                       size_t config_len, oracle_record_scale_t *scale, char *err, size_t err_len) {
  char path[4300], *line = NULL;
  size_t cap = 0;
  snprintf(path, sizeof path, "%s/job", dir);
  if (scale) memset(scale, 0, sizeof *scale);
  FILE *f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT) return ERR_NOTFOUND;
    return err_set(err, err_len, -errno, "cannot read %s: %s", path, strerror(errno));
  }
  job_id[0] = state[0] = config[0] = 0;
  while (getline(&line, &cap, f) > 0) {
    line[strcspn(line, "\r\n")] = 0;
    if (!strncmp(line, "job_id=", 7)) snprintf(job_id, id_len, "%s", line + 7);
    else if (!strncmp(line, "state=", 6)) snprintf(state, state_len, "%s", line + 6);
    else if (!strncmp(line, "config=", 7)) snprintf(config, config_len, "%s", line + 7);
    else if (!scale) continue;
    else if (!strncmp(line, "scale_servers_from=", 19)) scale->from = (uint32_t)strtoul(line + 19, NULL, 10);
    else if (!strncmp(line, "scale_servers_to=", 17)) scale->to = (uint32_t)strtoul(line + 17, NULL, 10);
    else if (!strncmp(line, "scale_servers_at=", 17)) scale->at = strtoull(line + 17, NULL, 10);
    else if (!strncmp(line, "scale_servers_asked=", 20)) scale->asked = strtod(line + 20, NULL);
    else if (!strncmp(line, "scale_servers_config=", 21)) snprintf(scale->config, sizeof scale->config, "%s", line + 21);
    else if (!strncmp(line, "scale_servers_addrs=", 20) && !scale->addrs) scale->addrs = strdup(line + 20);
  }
  free(line);
  fclose(f);
  if (scale && scale->to && (!scale->from || !scale->addrs || !scale->addrs[0] || !scale->config[0])) {
    log_warn("%s: its scale_servers_* lines are incomplete; the scale they began is not carried out", path);
    oracle_record_scale_free(scale);
  }
  if (!job_id[0] || !state[0])
    return err_set(err, err_len, ERR_BADMSG,
                   "%s has no job_id= or state= line: it is damaged; remove it to let this oracle start a new job", path);
  return 0;
}

/* One record a line: the numbers, then the checkpoint id and the reason
 * (tabs and newlines in them become spaces). */
static void save(oracle_recoveries_t *rs) {
  if (!rs->state_dir[0]) return;
  size_t cap = 1024 * ORACLE_RECOVERIES_KEPT + 64, o = 0;
  char *text = malloc(cap);
  if (!text) return;
  uint64_t first = rs->n > ORACLE_RECOVERIES_KEPT ? rs->n - ORACLE_RECOVERIES_KEPT : 0;
  o += (size_t)snprintf(text + o, cap - o, "chanter-recoveries 1 %" PRIu64 "\n", rs->n);
  for (uint64_t i = first; i < rs->n && o < cap; i++) {
    const oracle_recovery_t *r = &rs->r[i % ORACLE_RECOVERIES_KEPT];
    char why[512];
    snprintf(why, sizeof why, "%s", r->why);
    for (char *p = why; *p; p++)
      if (*p == '\t' || *p == '\n') *p = ' ';
    o += (size_t)snprintf(text + o, cap - o,
                          "%s\t%s\t%d\t%u\t%" PRIu64 "\t%" PRId64 "\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\n", r->kind,
                          r->who, r->lost_rank, r->generation, r->done_at_loss, r->rollback_to, r->t_detected,
                          r->t_rolled_back, r->t_resumed, r->t_first, r->t_caught_up,
                          r->checkpoint[0] ? r->checkpoint : "-", why);
  }
  char err[512];
  if (o < cap && write_atomic(rs->state_dir, "recoveries", text, o, err, sizeof err))
    log_warn("the record of recoveries was not saved: %s", err);
  free(text);
}

/* state_dir/name, a record of name (its first line "chanter-<name> 1 N"):
 * open at its second line with *n = N, or NULL (none, or said why). */
static FILE *open_record(const char *state_dir, const char *name, uint64_t *n, char *path, size_t path_len) {
  char line[128], magic[64];
  snprintf(path, path_len, "%s/%s", state_dir, name);
  snprintf(magic, sizeof magic, "chanter-%s 1 %%" SCNu64, name);
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  if (!fgets(line, sizeof line, f) || sscanf(line, magic, n) != 1) {
    log_warn("%s is not a record of %s; ignoring it", path, name);
    fclose(f);
    return NULL;
  }
  return f;
}

static void load(oracle_recoveries_t *rs) {
  char path[4300], line[2048];
  uint64_t n = 0;
  FILE *f = open_record(rs->state_dir, "recoveries", &n, path, sizeof path);
  if (!f) return;
  uint64_t first = n > ORACLE_RECOVERIES_KEPT ? n - ORACLE_RECOVERIES_KEPT : 0, i = first;
  while (i < n && fgets(line, sizeof line, f)) {
    oracle_recovery_t *r = &rs->r[i % ORACLE_RECOVERIES_KEPT];
    memset(r, 0, sizeof *r);
    char cp[96] = "", *why = NULL;
    int used = 0;
    if (sscanf(line, "%15[^\t]\t%31[^\t]\t%d\t%u\t%" SCNu64 "\t%" SCNd64 "\t%lf\t%lf\t%lf\t%lf\t%lf\t%95[^\t]\t%n",
               r->kind, r->who, &r->lost_rank, &r->generation, &r->done_at_loss, &r->rollback_to, &r->t_detected,
               &r->t_rolled_back, &r->t_resumed, &r->t_first, &r->t_caught_up, cp, &used) < 12 ||
        !used) {
      log_warn("%s: line %" PRIu64 " is damaged; keeping the %" PRIu64 " records before it", path, i - first + 2,
               i - first);
      break;
    }
    why = line + used;
    why[strcspn(why, "\n")] = 0;
    snprintf(r->why, sizeof r->why, "%s", why);
    snprintf(r->checkpoint, sizeof r->checkpoint, "%s", strcmp(cp, "-") ? cp : "");
    i++;
  }
  rs->n = i;
  fclose(f);
  if (rs->n) log_info("recoveries of this job so far: %" PRIu64 " (from %s)", rs->n, path);
}

/* The scales (oracle_scale.c keeps them): one a line, numbers then the
 * checkpoint id ("-": none) and what ("-": trainers). */
void oracle_scales_save(const oracle_recoveries_t *rs) {
  if (!rs->state_dir[0]) return;
  size_t cap = 512 * ORACLE_SCALES_KEPT + 64, o = 0;
  char *text = malloc(cap);
  if (!text) return;
  uint64_t first = rs->n_scales > ORACLE_SCALES_KEPT ? rs->n_scales - ORACLE_SCALES_KEPT : 0;
  o += (size_t)snprintf(text + o, cap - o, "chanter-scales 1 %" PRIu64 "\n", rs->n_scales);
  for (uint64_t i = first; i < rs->n_scales && o < cap; i++) {
    const oracle_scale_t *s = &rs->s[i % ORACLE_SCALES_KEPT];
    o += (size_t)snprintf(text + o, cap - o,
                          "%u\t%u\t%" PRIu64 "\t%u\t%" PRIu64 "\t%" PRIu64 "\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\n",
                          s->from, s->to, s->at_iteration, s->generation, s->rows_moved, s->bytes_moved,
                          s->move_seconds, s->t_asked, s->t_ended, s->t_trained, s->t_first, s->t_c,
                          s->checkpoint[0] ? s->checkpoint : "-", s->what[0] ? s->what : "-");
  }
  char err[512];
  if (o < cap && write_atomic(rs->state_dir, "scales", text, o, err, sizeof err))
    log_warn("the record of scales was not saved: %s", err);
  free(text);
}

static void load_scales(oracle_recoveries_t *rs) {
  char path[4300], line[1024];
  uint64_t n = 0;
  FILE *f = open_record(rs->state_dir, "scales", &n, path, sizeof path);
  if (!f) return;
  uint64_t first = n > ORACLE_SCALES_KEPT ? n - ORACLE_SCALES_KEPT : 0, i = first;
  while (i < n && fgets(line, sizeof line, f)) {
    oracle_scale_t *s = &rs->s[i % ORACLE_SCALES_KEPT];
    memset(s, 0, sizeof *s);
    char cp[96] = "", what[20] = "";
    if (sscanf(line,
               "%u\t%u\t%" SCNu64 "\t%u\t%" SCNu64 "\t%" SCNu64 "\t%lf\t%lf\t%lf\t%lf\t%lf\t%lf\t%95[^\t]\t%19[^\t\n]",
               &s->from, &s->to, &s->at_iteration, &s->generation, &s->rows_moved, &s->bytes_moved, &s->move_seconds,
               &s->t_asked, &s->t_ended, &s->t_trained, &s->t_first, &s->t_c, cp, what) != 14) {
      log_warn("%s: line %" PRIu64 " is damaged; keeping the %" PRIu64 " scales before it", path, i - first + 2,
               i - first);
      break;
    }
    snprintf(s->checkpoint, sizeof s->checkpoint, "%s", strcmp(cp, "-") ? cp : "");
    snprintf(s->what, sizeof s->what, "%s", strcmp(what, "-") ? what : "");
    i++;
  }
  rs->n_scales = i;
  fclose(f);
}

/* ------------------------------------------------------------------ records */

int oracle_recoveries_init(oracle_recoveries_t *rs, const cfg_t *cfg, metrics_registry_t *reg, char *err,
                           size_t err_len) {
  (void)err;
  (void)err_len;
  memset(rs, 0, sizeof *rs);
  snprintf(rs->state_dir, sizeof rs->state_dir, "%s", cfg_str(cfg, "oracle.state_dir"));
  rs->max = cfg_int(cfg, "oracle.max_recoveries");
  rs->window_s = cfg_int(cfg, "oracle.recovery_window_s");
  rs->reg = reg;
  static const double bounds[] = {0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300};
  rs->m_seconds = metrics_histogram(reg, "recovery_seconds", NULL,
                                    "from a lost daemon noticed to the first replayed iteration done", bounds,
                                    sizeof bounds / sizeof bounds[0]);
  rs->m_scales = metrics_counter(reg, "scales_total", NULL, "trainer group re-formed with another count (chanter scale)");
  rs->m_scale_pause = metrics_gauge(reg, "scale_pause_seconds", NULL,
                                    "the last scale: from iteration c done on the old shape to c + 1 done on the new one");
  rs->m_scale_rows = metrics_gauge(reg, "scale_rows_moved", NULL,
                                   "the last scale of the embedding servers: rows moved server to server");
  rs->m_scale_bytes = metrics_gauge(reg, "scale_bytes_moved", NULL, "... and their bytes");
  static const char *kinds[] = {"trainer", "hang", "oracle", "embedding"};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) { /* every kind shows, at 0 */
    char lab[64];
    snprintf(lab, sizeof lab, "kind=\"%s\"", kinds[i]);
    metrics_counter(reg, "recoveries_total", lab, "recoveries started, by what was lost");
  }
  if (rs->state_dir[0]) load(rs);
  if (rs->state_dir[0]) load_scales(rs);
  return 0;
}

oracle_recovery_t *oracle_recoveries_begin(oracle_recoveries_t *rs, const char *kind, const char *who, int lost_rank,
                                           uint64_t done, const char *why, char *limit, size_t limit_len) {
  double now = unix_now();
  if (rs->max > 0) { /* how many began within the window */
    int64_t in_window = 0;
    uint64_t first = rs->n > ORACLE_RECOVERIES_KEPT ? rs->n - ORACLE_RECOVERIES_KEPT : 0;
    for (uint64_t i = first; i < rs->n; i++)
      if (now - rs->r[i % ORACLE_RECOVERIES_KEPT].t_detected <= (double)rs->window_s) in_window++;
    if (in_window >= rs->max) {
      snprintf(limit, limit_len,
               "%s was lost (%s), but the job already recovered %lld times within oracle.recovery_window_s = %lld s "
               "(oracle.max_recoveries = %lld): giving up; find out why it keeps failing (its log), then `chanter "
               "train --resume`",
               who, why, (long long)in_window, (long long)rs->window_s, (long long)rs->max);
      return NULL;
    }
  }
  oracle_recovery_t *r = &rs->r[rs->n++ % ORACLE_RECOVERIES_KEPT];
  memset(r, 0, sizeof *r);
  snprintf(r->kind, sizeof r->kind, "%s", kind);
  snprintf(r->who, sizeof r->who, "%s", who);
  snprintf(r->why, sizeof r->why, "%s", why);
  r->lost_rank = lost_rank;
  r->done_at_loss = done;
  r->rollback_to = -1;
  r->t_detected = now;
  char lab[64];
  snprintf(lab, sizeof lab, "kind=\"%s\"", kind);
  metrics_counter_inc(metrics_counter(rs->reg, "recoveries_total", lab, "recoveries started, by what was lost"));
  log_warn("recovery %" PRIu64 " started: %s lost (%s) after %" PRIu64 " iterations; rolling back to the last complete "
           "checkpoint, then the job replays from there",
           rs->n, who, why, done);
  save(rs);
  return r;
}

oracle_recovery_t *oracle_recoveries_current(oracle_recoveries_t *rs) {
  if (!rs->n) return NULL;
  oracle_recovery_t *r = &rs->r[(rs->n - 1) % ORACLE_RECOVERIES_KEPT];
  return r->t_caught_up ? NULL : r;
}

void oracle_recovery_rolled_back(oracle_recoveries_t *rs, oracle_recovery_t *r, const char *id, int64_t c) {
  r->t_rolled_back = unix_now();
  r->rollback_to = c;
  snprintf(r->checkpoint, sizeof r->checkpoint, "%s", id ? id : "");
  if (c >= 0)
    log_info("recovery: rolled back to checkpoint %s (the model after iteration %lld) in %.2f s since the loss was "
             "noticed",
             r->checkpoint, (long long)c, r->t_rolled_back - r->t_detected);
  else
    log_info("recovery: no complete checkpoint of this job: rolled back to its start (the servers cleared) in %.2f s",
             r->t_rolled_back - r->t_detected);
  save(rs);
}

void oracle_recovery_resumed(oracle_recoveries_t *rs, oracle_recovery_t *r, uint32_t generation) {
  r->t_resumed = unix_now();
  r->generation = generation;
  log_info("recovery: every trainer joined generation %u, %.2f s after the loss was noticed; replaying from iteration "
           "%lld",
           generation, r->t_resumed - r->t_detected, (long long)(r->rollback_to + 1));
  save(rs);
}

void oracle_recovery_first(oracle_recoveries_t *rs, oracle_recovery_t *r, uint64_t done) {
  r->t_first = unix_now();
  metrics_hist_observe(rs->m_seconds, r->t_first - r->t_detected);
  log_info("recovery: first replayed iteration %" PRIu64 " done, %.2f s after the loss was noticed", done - 1,
           r->t_first - r->t_detected);
  save(rs);
}

void oracle_recovery_caught_up(oracle_recoveries_t *rs, oracle_recovery_t *r, uint64_t done) {
  r->t_caught_up = unix_now();
  uint64_t replayed = r->done_at_loss > (uint64_t)(r->rollback_to + 1) ? r->done_at_loss - (uint64_t)(r->rollback_to + 1) : 0;
  log_info("recovery: caught up at %" PRIu64 " iterations, %.2f s after the loss was noticed (%" PRIu64
           " iterations computed twice)",
           done, r->t_caught_up - r->t_detected, replayed);
  save(rs);
}

void oracle_recoveries_json(const oracle_recoveries_t *rs, char *out, size_t cap) {
  size_t o = 0;
  uint64_t first = rs->n > ORACLE_RECOVERIES_KEPT ? rs->n - ORACLE_RECOVERIES_KEPT : 0;
  o += (size_t)snprintf(out + o, cap - o, "[");
  for (uint64_t i = first; i < rs->n && o < cap; i++) {
    const oracle_recovery_t *r = &rs->r[i % ORACLE_RECOVERIES_KEPT];
    char why[600];
    json_escape(why, sizeof why, r->why);
    uint64_t replayed =
        r->done_at_loss > (uint64_t)(r->rollback_to + 1) ? r->done_at_loss - (uint64_t)(r->rollback_to + 1) : 0;
#define T(x) (r->x ? r->x - r->t_detected : -1.0)
    o += (size_t)snprintf(out + o, cap - o,
                          "%s{\"kind\": \"%s\", \"who\": \"%s\", \"why\": \"%s\", \"detected_unix\": %.3f, "
                          "\"iterations_done\": %" PRIu64 ", \"rollback_to\": %" PRId64 ", \"checkpoint\": \"%s\", "
                          "\"generation\": %u, \"rolled_back_s\": %.3f, \"resumed_s\": %.3f, \"first_replayed_s\": "
                          "%.3f, \"caught_up_s\": %.3f, \"iterations_replayed\": %" PRIu64 "}",
                          i > first ? ", " : "", r->kind, r->who, why, r->t_detected, r->done_at_loss, r->rollback_to,
                          r->checkpoint, r->generation, T(t_rolled_back), T(t_resumed), T(t_first), T(t_caught_up),
                          replayed);
#undef T
  }
  if (o < cap) snprintf(out + o, cap - o, "]");
}

void oracle_recoveries_line(const oracle_recoveries_t *rs, char *out, size_t cap) {
  out[0] = 0;
  if (!rs->n) return;
  const oracle_recovery_t *r = &rs->r[(rs->n - 1) % ORACLE_RECOVERIES_KEPT];
  uint64_t replay =
      r->done_at_loss > (uint64_t)(r->rollback_to + 1) ? r->done_at_loss - (uint64_t)(r->rollback_to + 1) : 0;
  if (!r->t_first)
    snprintf(out, cap, "recovering from the loss of %s (%.1f s so far)", r->who, unix_now() - r->t_detected);
  else
    snprintf(out, cap, "recovered from the loss of %s in %.1f s, replaying %" PRIu64 " iterations%s", r->who,
             r->t_first - r->t_detected, replay, r->t_caught_up ? " (caught up)" : "");
}
