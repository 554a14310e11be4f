/*
 * chanter checkpoint: a whole-job checkpoint of the running job, now.
 * chanter checkpoints: the checkpoints on the embedding servers.
 *
 * A checkpoint (DESIGN.md section 5) is a RocksDB checkpoint with the same
 * id on every embedding server, plus the manifest the oracle seals into
 * each of them once all took theirs (manifest.h).  It is complete -- a
 * resume may use it -- exactly when every server of the job has it sealed.
 * This lists them from the servers themselves: nothing here depends on the
 * oracle being up, and says which are backed up (checkpoint.backup_dir) on
 * every server: those survive the loss of a server's disk.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "embc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "manifest.h"
#include "orc.h"

typedef struct cp_row_s {
  char id[96];
  int complete;          /* sealed on every server */
  int have_manifest;
  manifest_t m;          /* when have_manifest */
  uint64_t created_unix; /* the servers' (the manifest's when there is one) */
  uint64_t *bytes;       /* per server; UINT64_MAX where the server lacks it */
  uint32_t present, sealed, backed_up;
} cp_row_t;

static int row_cmp(const void *a, const void *b) {
  const cp_row_t *x = a, *y = b;
  if (x->have_manifest && y->have_manifest && x->m.iteration != y->m.iteration)
    return x->m.iteration < y->m.iteration ? -1 : 1;
  if (x->created_unix != y->created_unix) return x->created_unix < y->created_unix ? -1 : 1;
  return strcmp(x->id, y->id);
}

static cp_row_t *find_row(cp_row_t *rows, size_t n, const char *id) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(rows[i].id, id)) return &rows[i];
  return NULL;
}

/* Every checkpoint on the servers of cfg, oldest first.  0 or an error with err. */
static int collect(const cfg_t *cfg, cp_row_t **out, size_t *n_out, uint32_t *S_out, char *err, size_t err_len) {
  embc_t *c;
  int rc = embc_create(cfg, &c, err, err_len);
  if (rc) return rc;
  uint32_t S = embc_servers(c);
  cp_row_t *rows = NULL;
  size_t n = 0, cap = 0;
  for (uint32_t s = 0; s < S && !rc; s++) {
    Chanter__Embedding__V1__ListCheckpointsRequest req = CHANTER__EMBEDDING__V1__LIST_CHECKPOINTS_REQUEST__INIT;
    Chanter__Embedding__V1__ListCheckpointsResponse *l = NULL;
    char why[1024];
    if ((rc = embc_list_checkpoints(c, s, &req, &l, why, sizeof why)) != 0) {
      err_set(err, err_len, rc, "embedding server %u (%s): %s", s, embc_address(c, s), why);
      break;
    }
    for (size_t i = 0; i < l->n_checkpoints && !rc; i++) {
      const Chanter__Embedding__V1__CheckpointInfo *ci = l->checkpoints[i];
      cp_row_t *r = find_row(rows, n, ci->id);
      if (!r) {
        if (n == cap) {
          size_t nc = cap ? cap * 2 : 16;
          cp_row_t *q = realloc(rows, nc * sizeof *q);
          if (!q) {
            rc = -ENOMEM;
            break;
          }
          rows = q;
          cap = nc;
        }
        r = &rows[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->id, sizeof r->id, "%s", ci->id);
        r->created_unix = ci->created_unix;
        if (!(r->bytes = malloc(S * sizeof *r->bytes))) {
          rc = -ENOMEM;
          break;
        }
        for (uint32_t k = 0; k < S; k++) r->bytes[k] = UINT64_MAX;
      }
      r->bytes[s] = ci->bytes;
      r->present++;
      if (ci->sealed) r->sealed++;
      if (ci->backed_up) r->backed_up++;
      if (ci->sealed && !r->have_manifest) {
        Chanter__Embedding__V1__GetManifestRequest g = CHANTER__EMBEDDING__V1__GET_MANIFEST_REQUEST__INIT;
        g.id = ci->id;
        Chanter__Embedding__V1__GetManifestResponse *m = NULL;
        if (embc_get_manifest(c, s, &g, &m, why, sizeof why) == 0) {
          if (manifest_parse((const char *)m->manifest.data, m->manifest.len, &r->m, why, sizeof why) == 0) {
            r->have_manifest = 1;
            r->created_unix = r->m.created_unix;
          } else {
            fprintf(stderr, "chanter checkpoints: %s on server %u: %s\n", ci->id, s, why);
          }
          protobuf_c_message_free_unpacked(&m->base, NULL);
        }
      }
    }
    protobuf_c_message_free_unpacked(&l->base, NULL);
  }
  embc_destroy(c);
  for (size_t i = 0; i < n; i++) rows[i].complete = rows[i].sealed == S && rows[i].have_manifest && rows[i].m.servers == S;
  if (n) qsort(rows, n, sizeof *rows, row_cmp);
  *out = rows;
  *n_out = n;
  *S_out = S;
  return rc;
}

static void free_rows(cp_row_t *rows, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(rows[i].bytes);
    manifest_free(&rows[i].m);
  }
  free(rows);
}

int cmd_checkpoints(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir");
  if (cli_done(cli, NULL)) return 2;
  char err[1024] = "";
  int owned = 0;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter checkpoints: %s\n", err);
    return 1;
  }
  cp_row_t *rows = NULL;
  size_t n = 0;
  uint32_t S = 0;
  int rc = collect(cfg, &rows, &n, &S, err, sizeof err);
  if (owned) cfg_destroy(cfg);
  if (rc) {
    fprintf(stderr, "chanter checkpoints: %s\n", err);
    free_rows(rows, n);
    return 1;
  }
  if (cli->json) {
    printf("{\"servers\": %u, \"checkpoints\": [", S);
    for (size_t i = 0; i < n; i++) {
      cp_row_t *r = &rows[i];
      printf("%s{\"id\": \"%s\", \"complete\": %s, ", i ? ", " : "", r->id, r->complete ? "true" : "false");
      if (r->have_manifest)
        printf("\"iteration\": %" PRIu64 ", \"job_id\": \"%s\", \"trainers\": %" PRIu64 ", \"rows_flushed\": %" PRIu64
               ", ",
               r->m.iteration, r->m.job_id, r->m.trainers, r->m.rows_flushed);
      else
        printf("\"iteration\": null, ");
      printf("\"backed_up\": %s, \"backed_up_servers\": %u, ", r->backed_up == S ? "true" : "false", r->backed_up);
      printf("\"created_unix\": %" PRIu64 ", \"bytes_per_server\": [", r->created_unix);
      for (uint32_t s = 0; s < S; s++) {
        if (r->bytes[s] == UINT64_MAX) printf("%snull", s ? ", " : "");
        else printf("%s%" PRIu64, s ? ", " : "", r->bytes[s]);
      }
      printf("]}");
    }
    printf("]}\n");
  } else if (!n) {
    printf("no checkpoints on the %u embedding server(s)\n", S);
  } else {
    printf("%-40s %10s  %-20s %-9s %-9s %s\n", "ID", "ITERATION", "TIME (UTC)", "COMPLETE", "BACKED UP", "MB PER SERVER");
    for (size_t i = 0; i < n; i++) {
      cp_row_t *r = &rows[i];
      char ts[32] = "?", it[24] = "?";
      time_t t = (time_t)r->created_unix;
      struct tm tm;
      if (t && gmtime_r(&t, &tm)) strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
      if (r->have_manifest) snprintf(it, sizeof it, "%" PRIu64, r->m.iteration);
      char bk[24];
      if (r->backed_up == S) snprintf(bk, sizeof bk, "yes");
      else if (r->backed_up) snprintf(bk, sizeof bk, "%u of %u", r->backed_up, S);
      else snprintf(bk, sizeof bk, "no");
      printf("%-40s %10s  %-20s %-9s %-9s", r->id, it, ts, r->complete ? "yes" : "NO", bk);
      for (uint32_t s = 0; s < S; s++) {
        if (r->bytes[s] == UINT64_MAX) printf(" %s-", s ? "/ " : "");
        else printf(" %s%.1f", s ? "/ " : "", (double)r->bytes[s] / 1e6);
      }
      if (!r->complete) printf("  (on %u of %u servers, sealed on %u: interrupted, not usable)", r->present, S, r->sealed);
      printf("\n");
    }
    printf("a checkpoint holds the model after ITERATION; `chanter train --resume [ID]` goes on from it\n");
  }
  free_rows(rows, n);
  return 0;
}

int cmd_checkpoint(cli_t *cli) {
  const char *workdir = cli_opt(cli, "--workdir");
  int wait = cli_flag(cli, "--wait");
  if (cli_done(cli, NULL)) return 2;
  char err[1024] = "";
  int owned = 0, rc = 1;
  cfg_t *cfg = cli_cluster_cfg(cli, workdir, &owned, err, sizeof err);
  if (!cfg) {
    fprintf(stderr, "chanter checkpoint: %s\n", err);
    return 1;
  }
  orc_t *o = NULL;
  char id[128];
  uint64_t it = 0;
  if (orc_create(cfg, NULL, &o, err, sizeof err)) {
    fprintf(stderr, "chanter checkpoint: %s\n", err);
    goto out;
  }
  /* a job still starting (its trainers connecting, the servers checked) is waited for, up to 60 s */
  for (double until = clock_mono_s() + 60;;) {
    int crc = orc_checkpoint(o, id, sizeof id, &it, err, sizeof err);
    if (!crc) break;
    if (crc != ERR_PRECONDITION || !strstr(err, "is waiting") || clock_mono_s() > until) {
      fprintf(stderr, "chanter checkpoint: %s\n", err);
      goto out;
    }
    usleep(200000);
  }
  if (!wait) {
    if (cli->json) printf("{\"id\": \"%s\", \"iteration\": %" PRIu64 ", \"complete\": false}\n", id, it);
    else printf("checkpoint %s will hold the model after iteration %" PRIu64 " (`chanter checkpoints` lists it once complete)\n", id, it);
    rc = 0;
    goto out;
  }
  for (double until = clock_mono_s() + 600;;) {
    cp_row_t *rows = NULL;
    size_t n = 0;
    uint32_t S = 0;
    int crc = collect(cfg, &rows, &n, &S, err, sizeof err);
    cp_row_t *r = crc ? NULL : find_row(rows, n, id);
    int done = r && r->complete;
    free_rows(rows, n);
    if (crc) {
      fprintf(stderr, "chanter checkpoint: %s\n", err);
      goto out;
    }
    if (done) break;
    Chanter__Oracle__V1__StatusResponse *st = NULL;
    if (orc_status(o, &st, err, sizeof err) == 0) {
      int over = !strcmp(st->state, "failed") || !strcmp(st->state, "stopped");
      if (over) fprintf(stderr, "chanter checkpoint: the job %s before checkpoint %s was complete: %s\n", st->state, id, st->message);
      protobuf_c_message_free_unpacked(&st->base, NULL);
      if (over) goto out;
    }
    if (clock_mono_s() > until) {
      fprintf(stderr, "chanter checkpoint: %s is not complete after 600 s\n", id);
      goto out;
    }
    usleep(200000);
  }
  if (cli->json) printf("{\"id\": \"%s\", \"iteration\": %" PRIu64 ", \"complete\": true}\n", id, it);
  else printf("checkpoint %s is complete: it holds the model after iteration %" PRIu64 "\n", id, it);
  rc = 0;
out:
  orc_destroy(o);
  if (owned) cfg_destroy(cfg);
  return rc;
}
