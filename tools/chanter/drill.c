/* drill: see drill.h. */
#include "drill.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "json.h"
#include "oracle.pb-c.h"
#include "orc.h"
#include "supervise.h"



/* "'self' [--config X] [--set k=v ...]": the drill's job as the user gave it. */
static void base_cmd(cli_t *cli, const char *self, char *out, size_t cap) {
  int o = snprintf(out, cap, "'%s'", self);
  if (cli->config_path) o += snprintf(out + o, cap - (size_t)o, " --config '%s'", cli->config_path);
  for (int i = 0; i < cli->n_sets && o < (int)cap; i++) o += snprintf(out + o, cap - (size_t)o, " --set '%s'", cli->sets[i]);
}

static void down(const char *self, const char *dir) {
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "'%s' local down --workdir '%s' >/dev/null 2>&1", self, dir);
  if (system(cmd) != 0) fprintf(stderr, "chanter drill: local down reported a problem in %s\n", dir);
}

/* Starts the cluster in dir.  backups: its checkpoint.backup_dir is
 * dir/backup, so that every run of a drill (the reference, the drill) has
 * backups of its own, and lose-disk has some to restore. */
static int up(cli_t *cli, const char *self, const char *dir, int backups, char *err, size_t err_len) {
  char cmd[16384];
  base_cmd(cli, self, cmd, sizeof cmd);
  size_t o = strlen(cmd);
  if (backups) o += (size_t)snprintf(cmd + o, sizeof cmd - o, " --set 'checkpoint.backup_dir=%s/backup'", dir);
  snprintf(cmd + o, sizeof cmd - o, " local up --workdir '%s' >'%s.up' 2>&1", dir, dir);
  if (system(cmd) != 0) {
    char path[4300];
    snprintf(path, sizeof path, "%s.up", dir);
    cli_tail_file(path);
    snprintf(err, err_len, "chanter local up failed in %s (see %s.up)", dir, dir);
    return 1;
  }
  return 0;
}

/* chanter train in the background: its pid. */
static pid_t train_start(const char *self, const char *dir) {
  char job[4300], errf[4300];
  snprintf(job, sizeof job, "%s/job.ini", dir);
  snprintf(errf, sizeof errf, "%s.train", dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int nul = open("/dev/null", O_RDWR);
    if (fd >= 0) dup2(fd, 2);
    if (nul >= 0) {
      dup2(nul, 1);
      dup2(nul, 0);
    }
    execl(self, self, "--config", job, "train", "--workdir", dir, "--quiet", (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int digest_of(const char *dir, char out[65]) {
  char path[4300];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  char *s = NULL;
  out[0] = 0;
  if (fsio_read_all(path, 0, &s, NULL, NULL, 0) == 0) json_get_str(s, "digest", out, 65);
  free(s);
  return out[0] ? 0 : -1;
}

int drill_reference(cli_t *cli, const char *self, const char *dir, char out[65]) {
  char err[1024];
  if (up(cli, self, dir, *cfg_str(cli->cfg, "checkpoint.backup_dir") != 0, err, sizeof err)) {
    fprintf(stderr, "chanter drill: the reference run: %s\n", err);
    return 1;
  }
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "'%s' --config '%s/job.ini' train --workdir '%s' --quiet >/dev/null 2>'%s.train'", self, dir,
           dir, dir);
  int rc = system(cmd) != 0;
  down(self, dir);
  if (rc || digest_of(dir, out)) {
    char path[4300];
    snprintf(path, sizeof path, "%s.train", dir);
    cli_tail_file(path);
    fprintf(stderr, "chanter drill: the reference run (the job without a fault) failed; see %s.train and %s/logs/\n", dir,
            dir);
    return 1;
  }
  return 0;
}

/* The pid of daemon `name` in dir/pids (the supervisor keeps it current
 * across restarts); 0 when it is not there. */
static int pid_of(const char *dir, const char *name) {
  supervise_proc_t ps[64];
  int n = supervise_pids_load(dir, ps, 64);
  for (int i = 0; i < n; i++)
    if (!strcmp(ps[i].name, name)) return (int)ps[i].pid;
  return 0;
}

/* restart-all (the baseline of bench recovery): the supervisor, every
 * daemon and chanter train killed; once none is left, the cluster is
 * started again in the same directory and train with it. */
static int restart_all(cli_t *cli, const char *self, const char *dir, int backups, pid_t *tp, char *err,
                       size_t err_len) {
  supervise_proc_t ps[64];
  int n = supervise_pids_load(dir, ps, 64);
  pid_t sup = supervise_running(dir);
  if (n < 0) n = 0;
  if (sup > 0) kill(sup, SIGKILL);
  for (int i = 0; i < n; i++) kill(ps[i].pid, SIGKILL);
  kill(*tp, SIGKILL);
  waitpid(*tp, NULL, 0);
  for (int k = 0; k < 500; k++) {
    int left = supervise_alive(sup);
    for (int i = 0; i < n; i++) left += supervise_alive(ps[i].pid);
    if (!left) break;
    usleep(10000);
  }
  if (up(cli, self, dir, backups, err, err_len)) return 1;
  *tp = train_start(self, dir);
  return 0;
}

/* The first restart of name at or after t in dir/run/events. */
static void restart_of(const char *dir, drill_kill_t *k) {
  char path[4300], line[2048], ev[32], nm[64];
  snprintf(path, sizeof path, "%s/run/events", dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    double t = cli_json_num(line, "t");
    if (isnan(t) || t < k->t_kill - 0.05 || json_get_str(line, "event", ev, sizeof ev) || strcmp(ev, "restart") ||
        json_get_str(line, "name", nm, sizeof nm) || strcmp(nm, k->who))
      continue;
    k->restarted = t - k->t_kill;
    double np = cli_json_num(line, "new_pid");
    if (!isnan(np)) k->new_pid = (int)np;
    break;
  }
  fclose(f);
}

/* Matches the summary's recoveries to the kills, in order of time. */
static void match_recoveries(const char *summary, drill_result_t *r) {
  const char *p = summary ? strstr(summary, "\"recoveries\": [") : NULL;
  const char *end = p ? strstr(p, "], \"recovery\":") : NULL;
  int used = 0;
  while (p && end && (p = strstr(p + 1, "{\"kind\":")) && p < end) {
    r->n_recoveries++;
    double det = cli_json_num(p, "detected_unix");
    /* the kill this loss follows: the latest one before it (an oracle's own record comes from its restart) */
    drill_kill_t *k = NULL;
    for (int i = used; i < r->n_kills; i++)
      if (r->kills[i].t_kill <= det + 0.05) k = &r->kills[i];
    if (!k) continue;
    used = (int)(k - r->kills) + 1;
    json_get_str(p, "kind", k->kind, sizeof k->kind);
    json_get_str(p, "why", k->why, sizeof k->why);
    k->detected = det - k->t_kill;
#define AT(field, key)                                                                                              \
  do {                                                                                                              \
    double v = cli_json_num(p, key);                                                                                \
    k->field = isnan(v) || v < 0 ? -1 : k->detected + v;                                                            \
  } while (0)
    AT(rolled_back, "rolled_back_s");
    AT(resumed, "resumed_s");
    AT(first, "first_replayed_s");
    AT(caught_up, "caught_up_s");
#undef AT
    double c = cli_json_num(p, "rollback_to");
    k->rollback_to = isnan(c) ? -2 : (int64_t)c;
    k->replayed = k->at >= 0 && k->at > k->rollback_to + 1 ? k->at - (k->rollback_to + 1) : 0;
  }
}

static const char *target(const drill_opts_t *o, int trainers, char *buf, size_t n) {
  if (!strcmp(o->kind, "kill-trainer") || !strcmp(o->kind, "hang-trainer"))
    snprintf(buf, n, "trainer-%d", o->rank >= 0 ? o->rank : trainers - 1);
  else if (!strcmp(o->kind, "kill-oracle")) snprintf(buf, n, "oracle-0");
  else if (!strcmp(o->kind, "kill-embedding") || !strcmp(o->kind, "hang-embedding") || !strcmp(o->kind, "lose-disk"))
    snprintf(buf, n, "embedding-%d", o->rank >= 0 ? o->rank : 0);
  else if (!strcmp(o->kind, "kill-dataproc")) snprintf(buf, n, "dataproc-%d", o->rank >= 0 ? o->rank : 0);
  else buf[0] = 0;
  return buf;
}

int drill_run(cli_t *cli, const char *self, const drill_opts_t *o, drill_result_t *r) {
  memset(r, 0, sizeof *r);
  snprintf(r->reference, sizeof r->reference, "%s", o->reference);
  const char *dir = o->workdir;
  int lose = !strcmp(o->kind, "lose-disk"), backups = lose || *cfg_str(cli->cfg, "checkpoint.backup_dir");
  if (up(cli, self, dir, backups, r->error, sizeof r->error)) return 1;
  char job[4300], err[1024];
  snprintf(job, sizeof job, "%s/job.ini", dir);
  cfg_t *cfg = NULL;
  orc_t *orc = NULL;
  if (cfg_create(&cfg) || cfg_load_file(cfg, job, err, sizeof err) || orc_create(cfg, NULL, &orc, err, sizeof err)) {
    snprintf(r->error, sizeof r->error, "reading %.400s: %.500s", job, err);
    down(self, dir);
    cfg_destroy(cfg);
    return 1;
  }
  int trainers = (int)cfg_int(cfg, "trainers");
  int64_t iterations = cfg_int(cfg, "iterations");
  int64_t at = o->at >= 0 ? o->at : iterations / 3;
  int chaos = !strcmp(o->kind, "chaos"), hang = !strncmp(o->kind, "hang-", 5), all = !strcmp(o->kind, "restart-all");
  char who[32];
  target(o, trainers, who, sizeof who);
  if (all) snprintf(who, sizeof who, "every daemon");
  if (!chaos && !all && !pid_of(dir, who)) {
    snprintf(r->error, sizeof r->error, "the cluster has no daemon %s (see %s/pids)", who, dir);
    orc_destroy(orc);
    cfg_destroy(cfg);
    down(self, dir);
    return 1;
  }
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  double t0 = clock_wall_s(), next_chaos = t0 + o->every;
  pid_t tp = train_start(self, dir);
  int status = 0, n_rec_at_kill = 0;
  for (;;) {
    if (waitpid(tp, &status, WNOHANG) == tp) break;
    Chanter__Oracle__V1__StatusResponse *st = NULL;
    int have = orc_status(orc, &st, err, sizeof err) == 0;
    int training = have && !strcmp(st->state, "training");
    int64_t it = have ? (int64_t)st->iteration : -1;
    int n_rec = 0;
    if (have && st->summary_json)
      for (const char *q = strstr(st->summary_json, "\"recoveries\": ["); q && (q = strstr(q + 1, "{\"kind\":"));) n_rec++;
    if (have) protobuf_c_message_free_unpacked(&st->base, NULL);
    double now = clock_wall_s();
    int fire = 0;
    char name[32];
    snprintf(name, sizeof name, "%s", who);
    if (chaos) {
      if (now < t0 + o->duration && now >= next_chaos && r->n_kills < DRILL_MAX_KILLS) {
        supervise_proc_t every[64];
        int n = supervise_pids_load(dir, every, 64);
        if (n > 0) {
          snprintf(name, sizeof name, "%.31s", every[rand() % n].name);
          fire = 1;
        }
        next_chaos = now + o->every;
      }
    } else if (r->n_kills < (all ? 1 : o->times) && training) {
      if (r->n_kills == 0) {
        fire = it >= at;
      } else { /* the next one while the job replays after the one before (or, with nothing to replay, 2 s on) */
        const drill_kill_t *pk = &r->kills[r->n_kills - 1];
        int back = pid_of(dir, name) != pk->pid;
        fire = back && (n_rec > n_rec_at_kill || now - pk->t_kill > 2.0);
      }
    }
    if (fire) {
      drill_kill_t *k = &r->kills[r->n_kills++];
      memset(k, 0, sizeof *k);
      snprintf(k->who, sizeof k->who, "%s", name);
      k->pid = pid_of(dir, name);
      k->at = it;
      k->detected = k->restarted = k->rolled_back = k->resumed = k->first = k->caught_up = -1;
      k->rollback_to = -2;
      k->t_kill = clock_wall_s();
      n_rec_at_kill = n_rec;
      if (all) {
        orc_destroy(orc);
        orc = NULL;
        int arc = restart_all(cli, self, dir, backups, &tp, r->error, sizeof r->error);
        cfg_destroy(cfg);
        cfg = NULL;
        if (arc || cfg_create(&cfg) || cfg_load_file(cfg, job, err, sizeof err) ||
            orc_create(cfg, NULL, &orc, err, sizeof err)) {
          if (!r->error[0]) snprintf(r->error, sizeof r->error, "starting the cluster again: %.900s", err);
          kill(tp, SIGKILL);
          waitpid(tp, NULL, 0);
          orc_destroy(orc);
          cfg_destroy(cfg);
          down(self, dir);
          return 1;
        }
        continue;
      }
      if (lose && k->pid > 0) {
        /* stopped first, so that the supervisor restarts it only once its data dir is gone */
        char dd[4300], e2[256] = "";
        snprintf(dd, sizeof dd, "%s/%s", dir, name);
        kill(k->pid, SIGSTOP);
        if (fsio_remove_tree(dd, e2, sizeof e2)) fprintf(stderr, "chanter drill: cannot delete %s: %s\n", dd, e2);
      }
      if (k->pid > 0) kill(k->pid, hang && !chaos ? SIGSTOP : SIGKILL);
      if (!o->quiet)
        fprintf(stderr, "chanter drill: %s %s (pid %d) at iteration %" PRId64 "%s\n", hang && !chaos ? "stopped (SIGSTOP)" : "killed (SIGKILL)",
                name, k->pid, it, lose ? ", its data dir deleted" : "");
    }
    usleep(20000);
  }
  r->seconds = clock_wall_s() - t0;
  orc_destroy(orc);
  cfg_destroy(cfg);
  char path[4300];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  char *summary = NULL;
  fsio_read_all(path, 0, &summary, NULL, NULL, 0);
  int trained = WIFEXITED(status) && WEXITSTATUS(status) == 0 && summary;
  if (summary) json_get_str(summary, "digest", r->digest, sizeof r->digest);
  match_recoveries(summary, r);
  free(summary);
  for (int i = 0; i < r->n_kills; i++) restart_of(dir, &r->kills[i]);
  down(self, dir);
  if (!trained) {
    snprintf(path, sizeof path, "%s.train", dir);
    cli_tail_file(path);
    snprintf(r->error, sizeof r->error, "the job did not complete (chanter train exited %d; see %s.train and %s/logs/)",
             WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), dir, dir);
  }
  r->pass = trained && r->digest[0] && !strcmp(r->digest, r->reference) && r->n_kills > 0;
  return 0;
}

static void t_line(const char *what, double s) {
  if (s >= 0) printf("  +%7.2f s  %s\n", s, what);
  else printf("  %10s  %s\n", "-", what);
}

void drill_print(const drill_opts_t *o, const drill_result_t *r, int json) {
  int64_t replayed = 0;
  for (int i = 0; i < r->n_kills; i++) replayed += r->kills[i].replayed;
  if (json) {
    printf("{\"kind\": \"%s\", \"pass\": %s, \"digest\": \"%s\", \"reference\": \"%s\", \"seconds\": %.3f, "
           "\"recoveries\": %d, \"kills\": [",
           o->kind, r->pass ? "true" : "false", r->digest, r->reference, r->seconds, r->n_recoveries);
    for (int i = 0; i < r->n_kills; i++) {
      const drill_kill_t *k = &r->kills[i];
      char why[1100];
      json_escape(why, sizeof why, k->why);
      printf("%s{\"who\": \"%s\", \"pid\": %d, \"new_pid\": %d, \"at_iteration\": %" PRId64 ", \"killed_unix\": %.3f, "
             "\"detected_s\": %.3f, \"restarted_s\": %.3f, \"rolled_back_s\": %.3f, \"resumed_s\": %.3f, "
             "\"first_replayed_s\": %.3f, \"caught_up_s\": %.3f, \"rollback_to\": %" PRId64 ", \"iterations_replayed\": "
             "%" PRId64 ", \"recovery\": \"%s\", \"why\": \"%s\"}",
             i ? ", " : "", k->who, k->pid, k->new_pid, k->at, k->t_kill, k->detected, k->restarted, k->rolled_back,
             k->resumed, k->first, k->caught_up, k->rollback_to, k->replayed, k->kind, why);
    }
    printf("], \"iterations_replayed\": %" PRId64 ", \"acknowledged_rows_lost\": %s, \"error\": \"%s\"}\n",
           replayed, r->pass ? "0" : "null", r->error);
    return;
  }
  for (int i = 0; i < r->n_kills; i++) {
    const drill_kill_t *k = &r->kills[i];
    printf("%s %s (pid %d) at iteration %" PRId64 "\n", !strncmp(o->kind, "hang-", 5) ? "stopped" : "killed", k->who,
           k->pid, k->at);
    t_line("killed", 0);
    char buf[700];
    snprintf(buf, sizeof buf, "detected (%s)", k->why[0] ? k->why : "no recovery was needed");
    t_line(buf, k->detected);
    snprintf(buf, sizeof buf, "restarted by the supervisor (pid %d)", k->new_pid);
    t_line(buf, k->restarted);
    if (k->rollback_to >= -1) {
      if (k->rollback_to >= 0)
        snprintf(buf, sizeof buf, "rolled back to the checkpoint of iteration %" PRId64, k->rollback_to);
      else
        snprintf(buf, sizeof buf, "rolled back to the job's start (no complete checkpoint)");
      t_line(buf, k->rolled_back);
      t_line("every trainer joined the new generation", k->resumed);
      snprintf(buf, sizeof buf, "first replayed iteration (%" PRId64 ") done", k->rollback_to + 1);
      t_line(buf, k->first);
      t_line("caught up", k->caught_up);
    } else {
      t_line("no rollback: the job went on", -1);
    }
  }
  printf("iterations computed twice: %" PRId64 "\n", replayed);
  printf("acknowledged rows lost: %s\n",
         r->pass ? "0 (every embedding row and the dense model equal the reference's, bit for bit)"
                 : "not shown (the digest differs from the reference's, or the job did not complete)");
  printf("digest %.16s... reference %.16s...\n", r->digest[0] ? r->digest : "(none)", r->reference);
  if (r->error[0]) printf("error: %s\n", r->error);
  printf("%s\n", r->pass ? "PASS" : "FAIL");
}
