/*
 * reshard: see reshard.h.
 */
#include "reshard.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "embc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "store.h"

#define BATCH_ROWS 65536 /* rows read and written per call */

void reshard_dir(const char *pattern, uint32_t i, const char *id, char *out, size_t n) {
  char base[4096];
  cfg_path_expand(pattern, NULL, (long)i, base, sizeof base);
  snprintf(out, n, "%s/checkpoints/%s", base, id);
}

/* The MANIFEST of checkpoint id in server i's directory, parsed.  0, or
 * ERR_NOTFOUND (not there or not sealed), or ERR_BADMSG (damaged). */
static int read_manifest(const char *pattern, uint32_t i, const char *id, manifest_t *m, char *err, size_t err_len) {
  char dir[4400];
  reshard_dir(pattern, i, id, dir, sizeof dir);
  void *data = NULL;
  size_t len = 0;
  int rc = store_reader_manifest(dir, &data, &len);
  if (rc) return err_set(err, err_len, rc, "%s: %s", dir, rc == ERR_NOTFOUND ? "no sealed checkpoint there" : err_str(rc));
  char why[512];
  rc = manifest_parse(data, len, m, why, sizeof why);
  free(data);
  if (rc) return err_set(err, err_len, rc, "%s: %s", dir, why);
  return 0;
}

int reshard_find(const char *pattern, const char *want, manifest_t *best, char *err, size_t err_len) {
  memset(best, 0, sizeof *best);
  char dir0[4400];
  reshard_dir(pattern, 0, "", dir0, sizeof dir0);
  DIR *d = opendir(dir0);
  if (!d) return err_set(err, err_len, ERR_NOTFOUND, "no checkpoints in %s: %s", dir0, strerror(errno));
  int latest = !want || !*want || !strcmp(want, "latest"), found = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.' || (!latest && strcmp(de->d_name, want))) continue;
    manifest_t m;
    char e2[512];
    if (read_manifest(pattern, 0, de->d_name, &m, e2, sizeof e2)) continue;
    int complete = 1;
    for (uint32_t s = 1; s < m.servers && complete; s++) {
      manifest_t o;
      if (read_manifest(pattern, s, de->d_name, &o, e2, sizeof e2)) complete = 0;
      else manifest_free(&o);
    }
    if (complete && (!found || m.iteration > best->iteration)) {
      manifest_free(best);
      *best = m;
      found = 1;
    } else {
      manifest_free(&m);
    }
  }
  closedir(d);
  if (!found)
    return err_set(err, err_len, ERR_NOTFOUND, "no complete checkpoint%s%s sealed on every server under %s",
                   latest ? "" : " ", latest ? "" : want, pattern);
  return 0;
}

int reshard_run(const cfg_t *cfg, const char *pattern, const manifest_t *m, char *new_id, size_t new_id_len,
                reshard_stats_t *st, char *err, size_t err_len) {
  reshard_stats_t z = {0};
  if (!st) st = &z;
  memset(st, 0, sizeof *st);
  double t0 = clock_mono_s();
  embc_t *c = NULL;
  int rc = embc_create(cfg, &c, err, err_len);
  if (rc) return rc;
  uint32_t S = embc_servers(c);
  snprintf(new_id, new_id_len, "%.56s.s%u", m->id, S);
  uint64_t *keys = malloc(BATCH_ROWS * sizeof *keys);
  size_t *lens = malloc(BATCH_ROWS * sizeof *lens);
  size_t cap = (size_t)BATCH_ROWS * 4096;
  uint8_t *buf = malloc(cap);
  uint64_t *bytes = calloc(S, sizeof *bytes);
  store_reader_t *r = NULL;
  if (!keys || !lens || !buf || !bytes) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory");
    goto out;
  }
  /* 1. the new servers' live data goes (their checkpoints stay) */
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__ClearRequest req = CHANTER__EMBEDDING__V1__CLEAR_REQUEST__INIT;
    req.keep_checkpoints = 1;
    Chanter__Embedding__V1__ClearResponse *resp = NULL;
    if ((rc = embc_clear(c, s, &req, &resp, err, err_len)) != 0) goto out;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  /* 2. every row once, from its old server's checkpoint to its new owner */
  for (uint32_t i = 0; i < m->servers; i++) {
    char dir[4400], why[1024] = "";
    reshard_dir(pattern, i, m->id, dir, sizeof dir);
    if ((rc = store_reader_open(dir, &r, why, sizeof why)) != 0) {
      err_set(err, err_len, rc, "old server %u's checkpoint: %s", i, why);
      goto out;
    }
    for (;;) {
      double tr = clock_mono_s();
      size_t n = 0, used = 0;
      int k = store_reader_next_rows(r, keys, buf, cap, lens, BATCH_ROWS, &used);
      st->read_seconds += clock_mono_s() - tr;
      if (k < 0) {
        rc = err_set(err, err_len, k, "reading %s: %s", dir, err_str(k));
        goto out;
      }
      n = (size_t)k;
      if (n == 0) break;
      double tw = clock_mono_s();
      if ((rc = embc_write(c, keys, n, (const float *)buf, why, sizeof why)) != 0) {
        err_set(err, err_len, rc, "writing %zu rows to the new servers: %s", n, why);
        goto out;
      }
      st->write_seconds += clock_mono_s() - tw;
      st->rows += n;
      st->bytes += used;
    }
    /* the blobs live on the dense server (0): the dense state, the oracle's state, the stamp */
    if (i == m->dense_server) {
      char **names = NULL;
      size_t nn = 0;
      if ((rc = store_reader_blobs(r, &names, &nn)) != 0) {
        err_set(err, err_len, rc, "listing the blobs of %s: %s", dir, err_str(rc));
        goto out;
      }
      for (size_t b = 0; b < nn && !rc; b++) {
        void *data = NULL;
        size_t len = 0;
        if ((rc = store_reader_get_blob(r, names[b], &data, &len)) != 0) {
          err_set(err, err_len, rc, "reading blob %s of %s: %s", names[b], dir, err_str(rc));
        } else {
          Chanter__Embedding__V1__PutBlobRequest req = CHANTER__EMBEDDING__V1__PUT_BLOB_REQUEST__INIT;
          req.name = names[b];
          req.data.data = data;
          req.data.len = len;
          Chanter__Embedding__V1__PutBlobResponse *resp = NULL;
          if ((rc = embc_put_blob(c, 0, &req, &resp, err, err_len)) == 0) {
            protobuf_c_message_free_unpacked(&resp->base, NULL);
            st->blobs++;
          }
        }
        free(data);
      }
      for (size_t b = 0; b < nn; b++) free(names[b]);
      free(names);
      if (rc) goto out;
    }
    store_reader_close(r);
    r = NULL;
  }
  /* 3. a checkpoint of the new shape on every server, and its manifest */
  double tc = clock_mono_s();
  for (uint32_t s = 0; s < S; s++) {
    Chanter__Embedding__V1__DeleteCheckpointRequest del = CHANTER__EMBEDDING__V1__DELETE_CHECKPOINT_REQUEST__INIT;
    del.id = new_id; /* a reshard tried before and cut short */
    char e2[512];
    Chanter__Embedding__V1__DeleteCheckpointResponse *dr = NULL;
    if (embc_delete_checkpoint(c, s, &del, &dr, e2, sizeof e2) == 0) protobuf_c_message_free_unpacked(&dr->base, NULL);
    Chanter__Embedding__V1__CheckpointRequest req = CHANTER__EMBEDDING__V1__CHECKPOINT_REQUEST__INIT;
    req.id = new_id;
    Chanter__Embedding__V1__CheckpointResponse *cr = NULL;
    if ((rc = embc_checkpoint(c, s, &req, &cr, err, err_len)) != 0) goto out;
    bytes[s] = cr->checkpoint ? cr->checkpoint->bytes : 0;
    protobuf_c_message_free_unpacked(&cr->base, NULL);
  }
  manifest_t nm = *m;
  snprintf(nm.id, sizeof nm.id, "%s", new_id);
  nm.servers = S;
  snprintf(nm.shard_rule, sizeof nm.shard_rule, "%s", cfg_str(cfg, "shard.rule")); /* the rows went by this job's rule */
  nm.server_bytes = bytes;
  size_t tl = 0;
  char *text = manifest_format(&nm, &tl);
  if (!text) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory");
    goto out;
  }
  for (uint32_t s = 0; s < S && !rc; s++) {
    Chanter__Embedding__V1__SealCheckpointRequest req = CHANTER__EMBEDDING__V1__SEAL_CHECKPOINT_REQUEST__INIT;
    req.id = new_id;
    req.manifest.data = (uint8_t *)text;
    req.manifest.len = tl;
    Chanter__Embedding__V1__SealCheckpointResponse *resp = NULL;
    if ((rc = embc_seal_checkpoint(c, s, &req, &resp, err, err_len)) == 0)
      protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  free(text);
  st->checkpoint_seconds = clock_mono_s() - tc;
out:
  store_reader_close(r);
  st->seconds = clock_mono_s() - t0;
  free(keys);
  free(lens);
  free(buf);
  free(bytes);
  embc_destroy(c);
  return rc;
}
