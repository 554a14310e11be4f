/*
 * oracle_ckpt_work: the checkpoint stage's calls to the embedding servers
 * (oracle_ckpt.c has the whole story), on libuv's worker pool: the check
 * of what the servers hold before a job starts, --fresh (clear, stamp),
 * --resume (find the checkpoint, check its manifest, restore every server,
 * read the oracle's state), and the servers' part of a checkpoint (the
 * oracle's blob, a RocksDB checkpoint on each server, the manifest sealed
 * on each and copied to oracle.state_dir, the old ones removed).  Each
 * work reads the job's immutable shape and its own ck_work_t only; the
 * loop side applies the result: a checkpoint's in oracle_ckpt.c, the
 * start's in the lifecycle's case for the job's state (oracle_job.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "fsio.h"
#include "log.h"
#include "manifest.h"
#include "oracle_job_internal.h"
#include "table.h"

#define JOB_BLOB "job"

/* ------------------------------------------------------------ the servers (worker pool) */

/* A typed admin call's (embc.h) error, prefixed with the server and the
 * method as every message here names them: rc. */
static int srv_said(embc_t *c, uint32_t s, const char *method, int rc, char *err, size_t err_len) {
  if (!rc) return 0;
  char why[1024];
  snprintf(why, sizeof why, "%.1000s", err);
  return err_set(err, err_len, rc, "embedding server %u (%s): %s: %s", s, embc_address(c, s), method, why);
}
/* One unary admin call to server s (embc_<lower>); *resp freed by the
 * caller.  0 or an error with err naming the server. */
#define SRV_CALL(lower, Camel, c, s, req, resp, err, err_len) \
  srv_said((c), (s), #Camel, embc_##lower((c), (s), (req), (resp), (err), (err_len)), (err), (err_len))

static int srv_put_blob(embc_t *c, uint32_t s, const char *name, const void *data, size_t len, char *err,
                        size_t err_len) {
  Chanter__Embedding__V1__PutBlobRequest req = CHANTER__EMBEDDING__V1__PUT_BLOB_REQUEST__INIT;
  req.name = (char *)name;
  req.data.data = (uint8_t *)data;
  req.data.len = len;
  Chanter__Embedding__V1__PutBlobResponse *resp = NULL;
  int rc = SRV_CALL(put_blob, PutBlob, c, s, &req, &resp, err, err_len);
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

/* A blob, or ERR_NOTFOUND (err says so). */
static int srv_get_blob(embc_t *c, uint32_t s, const char *name, uint8_t **data, size_t *len, char *err,
                        size_t err_len) {
  Chanter__Embedding__V1__GetBlobRequest req = CHANTER__EMBEDDING__V1__GET_BLOB_REQUEST__INIT;
  req.name = (char *)name;
  Chanter__Embedding__V1__GetBlobResponse *resp = NULL;
  int rc = SRV_CALL(get_blob, GetBlob, c, s, &req, &resp, err, err_len);
  if (rc) return rc;
  const Chanter__Embedding__V1__GetBlobResponse *g = resp;
  *len = g->data.len;
  *data = malloc(*len ? *len : 1);
  if (*data && *len) memcpy(*data, g->data.data, *len);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return *data ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------ worker-pool work */


/* The job's stamp on every server: its id (w->job's, taken on the loop;
 * the worker never writes the job) and what it is. */
static int stamp(ck_work_t *w) {
  oracle_job_t *j = w->j;
  char txt[512];
  int n = snprintf(txt, sizeof txt, "job_id=%s\nmodel=%s\nseed=%" PRIu64 "\n", w->job.job_id, w->job.model, j->seed);
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    int rc = srv_put_blob(j->ckpt.embc, s, JOB_BLOB, txt, (size_t)n, w->err, sizeof w->err);
    if (rc) return rc;
  }
  return 0;
}

/* The job id in server s's stamp (blob "job", written by stamp()), or ""
 * when it has none (or it is not a stamp). */
static void stamp_of(oracle_job_t *j, uint32_t s, char *out, size_t n) {
  uint8_t *data = NULL;
  size_t len = 0;
  char e2[512], txt[512];
  out[0] = 0;
  if (srv_get_blob(j->ckpt.embc, s, JOB_BLOB, &data, &len, e2, sizeof e2) != 0) return;
  if (len < sizeof txt) { /* the blob is not NUL-terminated */
    memcpy(txt, data, len);
    txt[len] = 0;
    const char *p = strstr(txt, "job_id=");
    if (p) snprintf(out, n, "%.*s", (int)strcspn(p + 7, "\n"), p + 7);
  }
  free(data);
}

/* Every server's checkpoints (list[s], n[s]). */
static int list_of(ck_work_t *w, embc_t *c, uint32_t n, Chanter__Embedding__V1__ListCheckpointsResponse **lists) {
  for (uint32_t s = 0; s < n; s++) {
    Chanter__Embedding__V1__ListCheckpointsRequest req = CHANTER__EMBEDDING__V1__LIST_CHECKPOINTS_REQUEST__INIT;
    Chanter__Embedding__V1__ListCheckpointsResponse *resp = NULL;
    int rc = SRV_CALL(list_checkpoints, ListCheckpoints, c, s, &req, &resp, w->err, sizeof w->err);
    if (rc) return rc;
    lists[s] = resp;
  }
  return 0;
}

static int list_all(ck_work_t *w, Chanter__Embedding__V1__ListCheckpointsResponse **lists) {
  return list_of(w, w->j->ckpt.embc, w->j->ckpt.S, lists);
}

static void free_lists(Chanter__Embedding__V1__ListCheckpointsResponse **lists, uint32_t S) {
  for (uint32_t s = 0; s < S; s++)
    if (lists[s]) protobuf_c_message_free_unpacked(&lists[s]->base, NULL);
}

static const Chanter__Embedding__V1__CheckpointInfo *find_cp(const Chanter__Embedding__V1__ListCheckpointsResponse *l,
                                                            const char *id) {
  for (size_t i = 0; l && i < l->n_checkpoints; i++)
    if (!strcmp(l->checkpoints[i]->id, id)) return l->checkpoints[i];
  return NULL;
}

static int get_manifest_of(ck_work_t *w, embc_t *c, uint32_t s, const char *id, manifest_t *m) {
  Chanter__Embedding__V1__GetManifestRequest req = CHANTER__EMBEDDING__V1__GET_MANIFEST_REQUEST__INIT;
  req.id = (char *)id;
  Chanter__Embedding__V1__GetManifestResponse *resp = NULL;
  int rc = SRV_CALL(get_manifest, GetManifest, c, s, &req, &resp, w->err, sizeof w->err);
  if (rc) return rc;
  const Chanter__Embedding__V1__GetManifestResponse *g = resp;
  char why[512];
  rc = manifest_parse((const char *)g->manifest.data, g->manifest.len, m, why, sizeof why);
  manifest_free(m); /* (the per-server sizes are the CLI's to list) */
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  if (rc) err_set(w->err, sizeof w->err, rc, "checkpoint %s on embedding server %u: %s", id, s, why);
  return rc;
}

static int get_manifest(ck_work_t *w, uint32_t s, const char *id, manifest_t *m) {
  return get_manifest_of(w, w->j->ckpt.embc, s, id, m);
}

static void preflight_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  uint64_t rows = 0, blobs = 0, cps = 0;
  char other_job[160] = "";
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists) {
    w->rc = -ENOMEM;
    return;
  }
  if ((w->rc = list_all(w, lists)) != 0) goto out;
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
    Chanter__Embedding__V1__StatsResponse *resp = NULL;
    if ((w->rc = SRV_CALL(stats, Stats, j->ckpt.embc, s, &req, &resp, w->err,
                          sizeof w->err)) != 0)
      goto out;
    const Chanter__Embedding__V1__StatsResponse *st = resp;
    rows += st->has_rows;
    blobs += st->has_blobs;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (s == 0) cps = lists[0]->n_checkpoints;
    if (!other_job[0]) stamp_of(j, s, other_job, sizeof other_job);
  }
  w->empty = !rows && !blobs && !cps;
  if (!w->empty) {
    /* the latest complete checkpoint, for the message */
    const Chanter__Embedding__V1__CheckpointInfo *best = NULL;
    manifest_t m, bm;
    for (size_t i = 0; i < lists[0]->n_checkpoints; i++) {
      const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
      if (!ci->sealed || get_manifest(w, 0, ci->id, &m) != 0) continue;
      if (!best || m.iteration > bm.iteration) {
        best = ci;
        bm = m;
      }
    }
    size_t o = (size_t)snprintf(w->found, sizeof w->found,
                                "the embedding servers hold another job's state (%s%s%s: rows on %" PRIu64 " of %u "
                                "servers, %" PRIu64 " checkpoints",
                                other_job[0] ? "job " : "no job stamp", other_job, "", rows, S, cps);
    if (best && o < sizeof w->found)
      o += (size_t)snprintf(w->found + o, sizeof w->found - o, "; the latest complete one, %s, holds the model after "
                                                                "iteration %" PRIu64,
                            bm.id, bm.iteration);
    if (o < sizeof w->found)
      snprintf(w->found + o, sizeof w->found - o,
               "); run `chanter train --resume` to go on from %s, or `chanter train --fresh` to clear the servers and "
               "start over",
               best ? "its latest complete checkpoint" : "a checkpoint (none is complete)");
  }
  w->rc = 0;
out:
  free_lists(lists, S);
  free(lists);
}

/* The write epoch of the run about to start: one above every server's
 * (Stats), so that no write-back of an earlier run -- a trainer of a
 * generation that was rolled back -- lands from now on.  0 or an error. */
/* One more than the highest write epoch of servers 0..n-1 of c (the job's
 * own, or a scale's every old and new one), into w->write_epoch; each of
 * the job's servers' incarnation into w->incs.  0 or an error. */
static int next_write_epoch_of(ck_work_t *w, embc_t *c, uint32_t n, uint64_t *all_incs) {
  oracle_job_t *j = w->j;
  uint64_t max = 0;
  for (uint32_t s = 0; s < n; s++) {
    Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
    req.brief = 1;
    Chanter__Embedding__V1__StatsResponse *resp = NULL;
    int rc = SRV_CALL(stats, Stats, c, s, &req, &resp, w->err, sizeof w->err);
    if (rc) return rc;
    uint64_t e = ((const Chanter__Embedding__V1__StatsResponse *)resp)->write_epoch;
    uint64_t inc = ((const Chanter__Embedding__V1__StatsResponse *)resp)->incarnation;
    if (s < j->ckpt.S && s < ORACLE_PROBE_MAX_SERVERS) w->incs[s] = inc;
    if (all_incs) all_incs[s] = inc;
    if (e > max) max = e;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  w->write_epoch = max + 1;
  return 0;
}

static int next_write_epoch(ck_work_t *w) { return next_write_epoch_of(w, w->j->ckpt.embc, w->j->ckpt.S, NULL); }

static void fresh_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  if ((w->rc = next_write_epoch(w)) != 0) return;
  for (uint32_t s = 0; s < j->ckpt.S; s++) {
    Chanter__Embedding__V1__ClearRequest req = CHANTER__EMBEDDING__V1__CLEAR_REQUEST__INIT;
    req.write_epoch = w->write_epoch;
    Chanter__Embedding__V1__ClearResponse *resp = NULL;
    if ((w->rc = SRV_CALL(clear, Clear, j->ckpt.embc, s, &req, &resp, w->err,
                          sizeof w->err)) != 0)
      return;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  w->rc = stamp(w);
}

/* Finds the checkpoint to resume (w->want: "latest" or an id), checks it
 * against this job BEFORE anything is restored, then restores every
 * server and reads the oracle's state. */
static void resume_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists) {
    w->rc = -ENOMEM;
    return;
  }
  if ((w->rc = list_all(w, lists)) != 0) goto out;
  /* complete: sealed on every server; the latest by iteration */
  int latest = !strcmp(w->want, "latest") || !w->want[0];
  int found = 0;
  char skipped[512] = "";
  size_t so = 0;
  for (size_t i = 0; i < lists[0]->n_checkpoints; i++) {
    const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
    if (!latest && strcmp(ci->id, w->want)) continue;
    int complete = ci->sealed;
    for (uint32_t s = 1; s < S && complete; s++) {
      const Chanter__Embedding__V1__CheckpointInfo *o = find_cp(lists[s], ci->id);
      complete = o && o->sealed;
    }
    if (!complete) {
      if (!latest) {
        w->rc = err_set(w->err, sizeof w->err, ERR_NOTFOUND,
                        "checkpoint %s is not complete (it is not sealed on every embedding server: it was "
                        "interrupted); resume from another one (`chanter checkpoints` lists them)",
                        ci->id);
        goto out;
      }
      if (so < sizeof skipped) so += (size_t)snprintf(skipped + so, sizeof skipped - so, "%s%s", so ? ", " : "", ci->id);
      continue;
    }
    manifest_t m;
    if ((w->rc = get_manifest(w, 0, ci->id, &m)) != 0) goto out;
    if (latest && m.servers != S) continue; /* of another server count (a scale's or a reshard's source) */
    if (!found || m.iteration > w->m.iteration) w->m = m;
    found = 1;
  }
  if (!found) {
    w->empty = 2; /* (recover_work: no complete checkpoint, the job's start) */
    w->rc = err_set(w->err, sizeof w->err, ERR_NOTFOUND, "%s%s%s%s%s",
                    latest ? "there is no complete checkpoint on the embedding servers" : "there is no checkpoint ",
                    latest ? "" : w->want, latest ? "" : " on the embedding servers",
                    so ? "; incomplete (interrupted) ones: " : "", skipped);
    goto out;
  }
  if (so) log_warn("incomplete checkpoints are skipped (interrupted while being taken): %s", skipped);
  if ((w->rc = oracle_ckpt__check_manifest(j, &w->m, w->err, sizeof w->err, w->warn, sizeof w->warn)) != 0) goto out;
  /* from here the servers change */
  if ((w->rc = next_write_epoch(w)) != 0) goto out;
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__RestoreRequest req = CHANTER__EMBEDDING__V1__RESTORE_REQUEST__INIT;
    req.id = w->m.id;
    req.write_epoch = w->write_epoch;
    Chanter__Embedding__V1__RestoreResponse *resp = NULL;
    if ((w->rc = SRV_CALL(restore, Restore, j->ckpt.embc, s, &req, &resp, w->err,
                          sizeof w->err)) != 0) {
      if (s) {
        size_t l = strlen(w->err);
        snprintf(w->err + l, sizeof w->err - l, " (servers 0..%u were restored already; run --resume again)", s - 1);
      }
      goto out;
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  if ((w->rc = srv_get_blob(j->ckpt.embc, 0, w->m.oracle_blob, &w->ostate, &w->ostate_len, w->err, sizeof w->err)) != 0)
    goto out;
  char h[65];
  manifest_sha256_hex(w->ostate, w->ostate_len, h);
  if (strcmp(h, w->m.oracle_sha256)) {
    w->rc = err_set(w->err, sizeof w->err, ERR_BADMSG,
                    "checkpoint %s: the oracle's state blob does not match the manifest's oracle_sha256", w->m.id);
    goto out;
  }
  /* the job goes on under the checkpoint's job id, with its stamp (advance renames the job, on the loop) */
  snprintf(w->job.job_id, sizeof w->job.job_id, "%s", w->m.job_id);
  w->rc = stamp(w);
out:
  free_lists(lists, S);
  free(lists);
}

/* An oracle that took over a scale of the embedding servers (its record
 * in oracle.state_dir) knows the old count, not the checkpoint: the
 * latest one sealed on each of the M old servers of u for M servers, into
 * w->reshape_id.  0, ERR_NOTFOUND when there is none, or an error. */
static int latest_of_old(ck_work_t *w, embc_t *u, uint32_t M) {
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(M, sizeof *lists);
  if (!lists) return -ENOMEM;
  int rc = list_of(w, u, M, lists), found = 0;
  uint64_t best = 0;
  for (size_t i = 0; !rc && i < lists[0]->n_checkpoints; i++) {
    const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
    int complete = ci->sealed;
    for (uint32_t s = 1; s < M && complete; s++) {
      const Chanter__Embedding__V1__CheckpointInfo *o = find_cp(lists[s], ci->id);
      complete = o && o->sealed;
    }
    manifest_t m;
    if (!complete || (rc = get_manifest_of(w, u, 0, ci->id, &m)) != 0 || m.servers != M) continue;
    if (!found || m.iteration > best) snprintf(w->reshape_id, sizeof w->reshape_id, "%s", ci->id);
    if (!found || m.iteration > best) best = m.iteration;
    found = 1;
  }
  free_lists(lists, M);
  free(lists);
  if (!rc && !found)
    rc = err_set(w->err, sizeof w->err, ERR_NOTFOUND, "the %u old embedding servers hold no complete checkpoint of "
                 "%u servers", M, M);
  return rc;
}

/* The first of servers 0..n-1 of u whose incarnation differs from
 * incs[] (next_write_epoch_of's, before the move) is an error: a server
 * killed and restarted during the move may have lost the rows it was
 * sent, so the move is made again. */
static int moved_incarnations(ck_work_t *w, embc_t *u, uint32_t n, const uint64_t *incs) {
  for (uint32_t s = 0; s < n; s++) {
    uint64_t inc = 0;
    int rc = embc_incarnation(u, s, &inc, w->err, sizeof w->err);
    if (rc) return rc;
    if (inc != incs[s])
      return err_set(w->err, sizeof w->err, ERR_UNAVAILABLE,
                     "embedding server %u (%s) restarted during the move (incarnation %" PRIu64 ", then %" PRIu64
                     "): the rows it was sent may be lost",
                     s, embc_address(u, s), incs[s], inc);
  }
  return 0;
}

/* One call of the reshape: 0 or an error in w->err naming the server. */
#define RS_CALL(lower, Camel, c, s, req) \
  do { \
    Chanter__Embedding__V1__##Camel##Response *r_ = NULL; \
    if ((w->rc = SRV_CALL(lower, Camel, (c), (s), (req), &r_, w->err, sizeof w->err)) != 0) goto out; \
    protobuf_c_message_free_unpacked(&r_->base, NULL); \
  } while (0)

/* chanter scale --embedding-servers (oracle_scale.c), before the roll-back:
 * checkpoint j->reshape_ckpt of the j->reshape_from old servers is
 * restored on them, the new ones are cleared, the servers move the rows
 * whose owner changes among themselves (embc_reshape_all: nothing passes
 * through here), and the new set takes checkpoint <id>.s<N>, sealed with
 * the old manifest but servers = N; the roll-back then finds it as the
 * latest complete checkpoint of N servers. */
static void reshape_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t M = j->reshape_from, N = j->ckpt.S, L = M > N ? M : N;
  char **addrs = NULL, *text = NULL;
  size_t n_addrs = 0, tl = 0;
  embc_t *u = NULL;
  manifest_t m = {0};
  uint64_t *bytes = calloc(N, sizeof *bytes), *incs = NULL;
  if (!bytes || (w->rc = oracle_scale__split(j->reshape_union, &addrs, &n_addrs)) != 0 || n_addrs != L) {
    w->rc = err_set(w->err, sizeof w->err, w->rc ? w->rc : -EINVAL, "the scale's %zu addresses for %u servers", n_addrs,
                    L);
    goto out;
  }
  if ((w->rc = embc_create_peers(j->cfg, L, (const char *const *)addrs, &u, w->err, sizeof w->err)) != 0) goto out;
  if (j->reshape_ckpt[0]) snprintf(w->reshape_id, sizeof w->reshape_id, "%s", j->reshape_ckpt);
  else if ((w->rc = latest_of_old(w, u, M)) == ERR_NOTFOUND) {
    log_warn("scale: %s; nothing to move: the job goes on from the %u servers' own state", w->err, N);
    w->rc = 0;
    w->err[0] = 0;
    w->reshaped = 2;
    goto out;
  } else if (w->rc)
    goto out;
  const char *id = w->reshape_id;
  Chanter__Embedding__V1__GetManifestRequest gq = CHANTER__EMBEDDING__V1__GET_MANIFEST_REQUEST__INIT;
  gq.id = (char *)id;
  Chanter__Embedding__V1__GetManifestResponse *g = NULL;
  if ((w->rc = SRV_CALL(get_manifest, GetManifest, u, 0, &gq, &g, w->err, sizeof w->err)) != 0) goto out;
  char why[512];
  w->rc = manifest_parse((const char *)g->manifest.data, g->manifest.len, &m, why, sizeof why);
  protobuf_c_message_free_unpacked(&g->base, NULL);
  if (w->rc || m.servers != M || m.dense_server >= N) {
    w->rc = err_set(w->err, sizeof w->err, w->rc ? w->rc : ERR_CONFIG, "checkpoint %s: %s", id,
                    w->rc ? why : "its manifest is not of the old servers, or its dense server is past the new count");
    goto out;
  }
  w->reshape_iter = m.iteration;
  if (!(incs = calloc(L, sizeof *incs))) {
    w->rc = -ENOMEM;
    goto out;
  }
  /* (the drained servers too; each one's incarnation before the move, checked before the seal) */
  if ((w->rc = next_write_epoch_of(w, u, L, incs)) != 0) goto out;
  for (uint32_t s = 0; s < L; s++) { /* the old servers back to the checkpoint, the new ones empty */
    Chanter__Embedding__V1__RestoreRequest rq = CHANTER__EMBEDDING__V1__RESTORE_REQUEST__INIT;
    Chanter__Embedding__V1__ClearRequest cq = CHANTER__EMBEDDING__V1__CLEAR_REQUEST__INIT;
    rq.id = (char *)id;
    rq.write_epoch = cq.write_epoch = w->write_epoch;
    cq.keep_checkpoints = 1;
    if (s < M) RS_CALL(restore, Restore, u, s, &rq);
    else RS_CALL(clear, Clear, u, s, &cq);
  }
  embc_reshape_stats_t st;
  if ((w->rc = embc_reshape_all(u, N, w->write_epoch, NULL, &st, w->err, sizeof w->err)) != 0) goto out;
  w->rows_moved = st.rows_moved;
  w->bytes_moved = st.bytes_moved;
  w->reshaped = -1; /* moved; complete once sealed */
  w->move_seconds = st.seconds;
  snprintf(m.id, sizeof m.id, "%.56s.s%u", id, N);
  for (uint32_t s = 0; s < N; s++) {
    Chanter__Embedding__V1__DeleteCheckpointRequest dq = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
    dq.id = m.id; /* a reshape tried before and cut short */
    Chanter__Embedding__V1__DeleteCheckpointResponse *dr = NULL;
    char e2[512];
    if (embc_delete_checkpoint(u, s, &dq, &dr, e2, sizeof e2) == 0) protobuf_c_message_free_unpacked(&dr->base, NULL);
    Chanter__Embedding__V1__CheckpointRequest kq = CHANTER__EMBEDDING__V1__CHECKPOINT_REQUEST__INIT;
    kq.id = m.id;
    Chanter__Embedding__V1__CheckpointResponse *kr = NULL;
    if ((w->rc = SRV_CALL(checkpoint, Checkpoint, u, s, &kq, &kr, w->err, sizeof w->err)) != 0) goto out;
    bytes[s] = kr->checkpoint ? kr->checkpoint->bytes : 0;
    protobuf_c_message_free_unpacked(&kr->base, NULL);
  }
  if ((w->rc = moved_incarnations(w, u, L, incs)) != 0) goto out; /* (before the seal: a restart after is a loss) */
  free(m.server_bytes);
  m.server_bytes = bytes;
  bytes = NULL;
  m.servers = N;
  if (!(text = manifest_format(&m, &tl))) {
    w->rc = -ENOMEM;
    goto out;
  }
  for (uint32_t s = 0; s < N; s++) {
    Chanter__Embedding__V1__SealCheckpointRequest sq = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_REQUEST__INIT;
    sq.id = m.id;
    sq.manifest.data = (uint8_t *)text;
    sq.manifest.len = tl;
    RS_CALL(seal_checkpoint, SealCheckpoint, u, s, &sq);
  }
  w->reshaped = 1;
  log_info("scale: checkpoint %s of %u servers is now %s of %u: %" PRIu64 " rows (%" PRIu64
           " bytes) moved server to server in %.3f s",
           id, M, m.id, N, st.rows_moved, st.bytes_moved, st.seconds);
out:
  free(incs);
  free(text);
  free(bytes);
  manifest_free(&m);
  embc_destroy(u);
  cfg_list_free(addrs, n_addrs);
}

/* A recovery (oracle_ckpt__rollback): the servers must hold this job's
 * state; back to its latest complete checkpoint, or, when it has none, to
 * its start (the servers cleared and stamped again). */
static void recover_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  if (j->reshape_from && (reshape_work(w), w->rc)) return;
  stamp_of(j, 0, w->stamp_id, sizeof w->stamp_id);
  if (w->stamp_id[0] && strcmp(w->stamp_id, w->job.job_id)) {
    w->rc = err_set(w->err, sizeof w->err, ORACLE_ERR_PRECONDITION,
                    "this oracle was recovering job %s (its record in oracle.state_dir says the job was training), "
                    "but the embedding servers hold job %s's state; run `chanter train --resume` to go on from that "
                    "job's latest complete checkpoint, or `chanter train --fresh` to clear the servers and start over",
                    w->job.job_id, w->stamp_id);
    return;
  }
  resume_work(w);
  if (!w->rc) {
    w->restored = 1;
    return;
  }
  if (w->empty != 2) return;
  log_info("recovering job %s: it has no complete checkpoint; back to its start (clearing the servers)", w->job.job_id);
  w->rc = 0;
  w->err[0] = 0;
  fresh_work(w);
}

/* The manifest's copy in oracle.state_dir/checkpoints (fsio_replace). */
static int write_state_dir(const char *dir, const char *id, const char *text, size_t len, char *err, size_t err_len) {
  char d[4096], path[4300];
  snprintf(d, sizeof d, "%s/checkpoints", dir);
  int rc = fsio_mkdir_p(d, err, err_len);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/%s.manifest", d, id);
  return fsio_replace(path, text, len, 0644, err, err_len);
}

/* Removes the checkpoints of this job beyond the newest `keep` complete
 * ones, and incomplete ones older than the newest complete one. */
static void prune(ck_work_t *w) {
  oracle_job_t *j = w->j;
  uint32_t S = j->ckpt.S;
  Chanter__Embedding__V1__ListCheckpointsResponse **lists = calloc(S, sizeof *lists);
  if (!lists || list_all(w, lists) != 0) goto out;
  /* ids of this job sort by iteration (zero-padded): walk server 0's from the newest */
  size_t n = lists[0]->n_checkpoints, kept = 0, o = 0;
  size_t plen = strlen(j->job_id);
  for (size_t i = n; i-- > 0;) {
    const Chanter__Embedding__V1__CheckpointInfo *ci = lists[0]->checkpoints[i];
    if (strncmp(ci->id, j->job_id, plen) || ci->id[plen] != '-') continue;
    if (ci->sealed && kept < j->ckpt.keep) {
      kept++;
      continue;
    }
    if (!ci->sealed && !kept) continue; /* newer than every complete one: maybe being taken */
    for (uint32_t s = 0; s < S; s++) {
      Chanter__Embedding__V1__DeleteCheckpointRequest req = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
      req.id = ci->id;
      Chanter__Embedding__V1__DeleteCheckpointResponse *resp = NULL;
      char e2[512];
      if (SRV_CALL(delete_checkpoint, DeleteCheckpoint, j->ckpt.embc, s, &req, &resp, e2,
                   sizeof e2) == 0)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
      else if (!strstr(e2, "no checkpoint") && !strstr(e2, "not found"))
        log_warn("cannot remove an old checkpoint: %s", e2);
    }
    if (j->ckpt.state_dir[0]) {
      char path[4400];
      snprintf(path, sizeof path, "%s/checkpoints/%s.manifest", j->ckpt.state_dir, ci->id);
      unlink(path);
    }
    if (o < sizeof w->pruned) o += (size_t)snprintf(w->pruned + o, sizeof w->pruned - o, "%s%s", o ? "," : "", ci->id);
  }
out:
  if (lists) free_lists(lists, S);
  free(lists);
}

/* Fence(c) on every server: from the answer on, a write-back of a later
 * iteration waits at that server until its checkpoint of c is taken, so
 * the trainers may go on training meanwhile. */
static void fence_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  for (uint32_t s = 0; s < j->ckpt.S && !w->rc; s++) {
    Chanter__Embedding__V1__FenceRequest req = CHANTER__EMBEDDING__V1__FENCE_REQUEST__INIT;
    req.id = w->cp->id;
    req.iteration = w->cp->iteration;
    Chanter__Embedding__V1__FenceResponse *resp = NULL;
    if ((w->rc = SRV_CALL(fence, Fence, j->ckpt.embc, s, &req, &resp, w->err, sizeof w->err)) ==
        0)
      protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
}

static void servers_work(ck_work_t *w) {
  oracle_job_t *j = w->j;
  oracle_cp_t *cp = w->cp;
  uint32_t S = j->ckpt.S;
  double t0 = oracle_job__now();
  char name[160];
  snprintf(name, sizeof name, "ckpt.%s.oracle", cp->id);
  if ((w->rc = srv_put_blob(j->ckpt.embc, 0, name, w->oblob, w->oblob_len, w->err, sizeof w->err)) != 0) return;
  /* fault injection for the tests (docs/reference.md): CHANTER_FAULT_CHECKPOINT_PAUSE=K:MS pauses the K-th checkpoint of
   * this oracle MS ms after server 0 took its part, so that a test can kill a server in the middle */
  static int nth;
  unsigned fk = 0, fms = 0;
  const char *fault = getenv("CHANTER_FAULT_CHECKPOINT_PAUSE");
  int pause = ++nth && fault && sscanf(fault, "%u:%u", &fk, &fms) == 2 && (int)fk == nth;
  for (uint32_t s = 0; s < S; s++) {
    /* a resumed job retakes the ids of the run it went back from: that run's later checkpoints are replaced */
    Chanter__Embedding__V1__DeleteCheckpointRequest del = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
    del.id = cp->id;
    Chanter__Embedding__V1__DeleteCheckpointResponse *dresp = NULL;
    char e2[512];
    if (j->ckpt.resumed && embc_delete_checkpoint(j->ckpt.embc, s, &del, &dresp, e2, sizeof e2) == 0) {
      protobuf_c_message_free_unpacked(&dresp->base, NULL);
      log_info("checkpoint %s of the run this job went back from replaced on server %u", cp->id, s);
    }
    Chanter__Embedding__V1__CheckpointRequest req = CHANTER__EMBEDDING__V1__CHECKPOINT_REQUEST__INIT;
    req.id = cp->id;
    Chanter__Embedding__V1__CheckpointResponse *resp = NULL;
    if ((w->rc = SRV_CALL(checkpoint, Checkpoint, j->ckpt.embc, s, &req, &resp, w->err,
                          sizeof w->err)) != 0)
      return;
    const Chanter__Embedding__V1__CheckpointResponse *r = resp;
    w->bytes[s] = r->checkpoint ? r->checkpoint->bytes : 0;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (pause && s == 0) {
      log_warn("checkpoint %s: pausing %u ms after server 0's part (CHANTER_FAULT_CHECKPOINT_PAUSE)", cp->id, fms);
      usleep((useconds_t)fms * 1000);
    }
  }
  manifest_t m = w->job;
  snprintf(m.id, sizeof m.id, "%s", cp->id);
  m.iteration = cp->iteration;
  m.created_unix = (uint64_t)clock_wall_s();
  m.dense_server = 0;
  snprintf(m.dense_blob, sizeof m.dense_blob, "ckpt.%s.dense", cp->id);
  snprintf(m.oracle_blob, sizeof m.oracle_blob, "ckpt.%s.oracle", cp->id);
  manifest_sha256_hex(w->oblob, w->oblob_len, m.oracle_sha256);
  m.rows_flushed = cp->rows_flushed;
  m.server_bytes = w->bytes;
  size_t len = 0;
  char *text = manifest_format(&m, &len);
  if (!text) {
    w->rc = -ENOMEM;
    return;
  }
  for (uint32_t s = 0; s < S && !w->rc; s++) {
    Chanter__Embedding__V1__SealCheckpointRequest req = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_REQUEST__INIT;
    req.id = cp->id;
    req.manifest.data = (uint8_t *)text;
    req.manifest.len = len;
    Chanter__Embedding__V1__SealCheckpointResponse *resp = NULL;
    if ((w->rc = SRV_CALL(seal_checkpoint, SealCheckpoint, j->ckpt.embc, s, &req, &resp,
                          w->err, sizeof w->err)) == 0)
      protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  if (!w->rc && j->ckpt.state_dir[0]) {
    char e2[512];
    if (write_state_dir(j->ckpt.state_dir, cp->id, text, len, e2, sizeof e2))
      log_warn("checkpoint %s: the manifest's copy in oracle.state_dir failed (the servers hold it): %s", cp->id, e2);
  }
  free(text);
  w->secs = oracle_job__now() - t0;
  if (!w->rc) prune(w);
}

void (*oracle_ckpt__work_fake)(ck_work_t *w);

void oracle_ckpt__work(uv_work_t *req) {
  ck_work_t *w = req->data;
  if (oracle_ckpt__work_fake) {
    oracle_ckpt__work_fake(w);
    return;
  }
  switch (w->kind) {
  case W_PREFLIGHT: preflight_work(w); break;
  case W_FRESH: fresh_work(w); break;
  case W_RESUME: resume_work(w); break;
  case W_FENCE: fence_work(w); break;
  case W_SERVERS: servers_work(w); break;
  case W_RECOVER: recover_work(w); break;
  }
}
