/*
 * store_backup: copies of sealed checkpoints in a second place (another
 * disk, another host's mount), so that a server whose data dir is lost can
 * get its checkpoints back (store.h, "backups").
 *
 * RocksDB's BackupEngine does the copying: each checkpoint directory is
 * opened read-only (its column families, as store_reader.c does) and
 * backed up with rocksdb_backup_engine_create_new_backup_flush (no flush:
 * a checkpoint is already SSTs).  Table files are shared between backups
 * by name, size and checksum, so a backup copies only the SSTs that are
 * new since the one before: incremental, whatever the table size.
 *
 * BackupEngine copies a database's own files only.  What makes a
 * directory one of our checkpoints -- its CHANTER_CHECKPOINT and, once
 * sealed, its MANIFEST -- goes into a sidecar beside the engine's files,
 * backup_dir/<id>.checkpoint:
 *
 *   chanter_checkpoint_backup=1
 *   id=<checkpoint id>
 *   backup_id=<the engine's backup id>
 *   meta_bytes=<n>            the CHANTER_CHECKPOINT file, verbatim
 *   manifest_bytes=<m>        the MANIFEST, verbatim
 *   sha256=<hex of the meta bytes then the manifest bytes>
 *   <empty line>
 *   <meta bytes><manifest bytes>
 *
 * The sidecar is written (fsio_replace) only after the backup was created
 * and verified, so a backup interrupted half-way is never named by one and
 * never restored; a sidecar that does not parse or whose sha256 does not
 * match is logged and ignored.  Backups are created in checkpoint order, so
 * purging keeps every backup from the oldest one a sidecar names
 * (rocksdb_backup_engine_purge_old_backups keeps the newest N).
 *
 * A restore (before the store opens, on an empty data dir) rebuilds each
 * named checkpoint as store_checkpoint() does: the engine restores the
 * database into checkpoints.tmp/<id>, the MANIFEST and CHANTER_CHECKPOINT
 * are written from the sidecar, and the directory is renamed into
 * checkpoints/.  A crash leaves leftovers in checkpoints.tmp/, which the
 * store removes at open, and a restore run again skips what is there.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fsio.h"
#include "log.h"

#define SIDECAR_EXT ".checkpoint"
#define SIDECAR_FORMAT 1
#define SIDECAR_MAX (64u << 20) /* a manifest is a few KiB; anything near this is not a sidecar */

struct store_backup_s {
  char *dir;
  rocksdb_env_t *env;
  rocksdb_backup_engine_options_t *bo;
  rocksdb_backup_engine_t *be;
  pthread_mutex_t mu; /* the engine is used by one thread at a time */
};

/* A sidecar, parsed: meta and manifest point into buf. */
typedef struct sidecar_s {
  char id[CKPT_ID_MAX + 1];
  uint32_t backup_id;
  char *buf;
  const char *meta, *manifest;
  size_t meta_len, manifest_len;
} sidecar_t;

/* ------------------------------------------------------------ helpers */

static void sha256_hex2(const void *a, size_t alen, const void *b, size_t blen, char out[65]) {
  uint8_t md[32];
  unsigned mlen = 0;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  out[0] = 0;
  if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 && EVP_DigestUpdate(c, a, alen) == 1 &&
      EVP_DigestUpdate(c, b, blen) == 1 && EVP_DigestFinal_ex(c, md, &mlen) == 1 && mlen == 32)
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
  EVP_MD_CTX_free(c);
}

static char *sidecar_path(const store_backup_t *b, const char *id) {
  char *p = NULL;
  return asprintf(&p, "%s/%s" SIDECAR_EXT, b->dir, id) < 0 ? NULL : p;
}

/* Bytes and files of the regular files under dir (the engine's tree is
 * two levels deep: meta/, private/<n>/, shared_checksum/). */
static void tree_usage(const char *dir, int depth, uint64_t *bytes, uint64_t *files) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      *bytes += (uint64_t)st.st_size;
      (*files)++;
    } else if (S_ISDIR(st.st_mode) && depth < 4) {
      char *sub = store__path_join(dir, de->d_name);
      if (sub) tree_usage(sub, depth + 1, bytes, files);
      free(sub);
    }
  }
  closedir(d);
}

/* Parses sidecar text (buf, len; taken over by sc on success).  0, or
 * -EBADMSG with what is wrong in what. */
static int sidecar_parse(char *buf, size_t len, sidecar_t *sc, char *what, size_t what_len) {
  memset(sc, 0, sizeof *sc);
  char *body = NULL;
  for (size_t i = 0; i + 1 < len; i++)
    if (buf[i] == '\n' && buf[i + 1] == '\n') {
      body = buf + i + 2;
      buf[i + 1] = 0; /* the header, NUL-terminated, ends with its last '\n' */
      break;
    }
  if (!body) return err_set(what, what_len, -EBADMSG, "no end of header (a truncated file)");
  int format = 0, got = 0;
  uint64_t mlen = 0, flen = 0;
  char sha[65] = "", want[65];
  char *save = NULL;
  for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (sscanf(l, "chanter_checkpoint_backup=%d", &format) == 1) got |= 1;
    else if (sscanf(l, "id=%64[A-Za-z0-9._-]", sc->id) == 1) got |= 2;
    else if (sscanf(l, "backup_id=%" SCNu32, &sc->backup_id) == 1) got |= 4;
    else if (sscanf(l, "meta_bytes=%" SCNu64, &mlen) == 1) got |= 8;
    else if (sscanf(l, "manifest_bytes=%" SCNu64, &flen) == 1) got |= 16;
    else if (sscanf(l, "sha256=%64[0-9a-f]", sha) == 1) got |= 32;
  }
  if (!(got & 1) || format != SIDECAR_FORMAT)
    return err_set(what, what_len, -EBADMSG, "not a sidecar of format %d", SIDECAR_FORMAT);
  if (got != 63 || !store__valid_ckpt_id(sc->id) || sc->backup_id == 0)
    return err_set(what, what_len, -EBADMSG, "its header lacks a valid id, backup_id, meta_bytes, manifest_bytes or sha256");
  size_t have = len - (size_t)(body - buf);
  if (mlen > have || flen != have - mlen)
    return err_set(what, what_len, -EBADMSG, "%zu bytes after the header, not the %" PRIu64 " + %" PRIu64 " it names "
                   "(a truncated or damaged file)", have, mlen, flen);
  sha256_hex2(body, (size_t)mlen, body + mlen, (size_t)flen, want);
  if (strcmp(sha, want)) return err_set(what, what_len, -EBADMSG, "its sha256 does not match its contents");
  sc->buf = buf;
  sc->meta = body;
  sc->meta_len = (size_t)mlen;
  sc->manifest = body + mlen;
  sc->manifest_len = (size_t)flen;
  return 0;
}

/* Reads and checks sidecar path: 0, ERR_NOTFOUND (no such file), -EBADMSG
 * (damaged; what says how), -errno. */
static int sidecar_read(const char *path, sidecar_t *sc, char *what, size_t what_len) {
  char *buf = NULL;
  size_t len = 0;
  int rc = fsio_read_all(path, SIDECAR_MAX, &buf, &len, NULL, 0);
  if (rc == -ENOENT) return ERR_NOTFOUND;
  if (rc) return err_set(what, what_len, rc == -EFBIG ? -EBADMSG : rc, "%s", strerror(-rc));
  if ((rc = sidecar_parse(buf, len, sc, what, what_len))) free(buf);
  return rc;
}

static int sidecar_write(store_backup_t *b, const char *id, uint32_t backup_id, const char *meta, size_t meta_len,
                         const char *manifest, size_t manifest_len, char *why, size_t why_len) {
  char sha[65], head[512];
  sha256_hex2(meta, meta_len, manifest, manifest_len, sha);
  int h = snprintf(head, sizeof head,
                   "chanter_checkpoint_backup=%d\nid=%s\nbackup_id=%" PRIu32 "\nmeta_bytes=%zu\nmanifest_bytes=%zu\n"
                   "sha256=%s\n\n", SIDECAR_FORMAT, id, backup_id, meta_len, manifest_len, sha);
  size_t len = (size_t)h + meta_len + manifest_len;
  char *text = malloc(len), *path = sidecar_path(b, id);
  int rc = text && path ? 0 : -ENOMEM;
  if (!rc) {
    memcpy(text, head, (size_t)h);
    memcpy(text + h, meta, meta_len);
    memcpy(text + h + meta_len, manifest, manifest_len);
    rc = fsio_replace(path, text, len, 0644, why, why_len);
  }
  free(text);
  free(path);
  return rc;
}

/* The engine's backups: ids (ascending) and sizes; *n of them.  -ENOMEM. */
static int engine_backups(store_backup_t *b, uint32_t **ids, uint64_t **sizes, uint32_t **files, int *n) {
  const rocksdb_backup_engine_info_t *bi = rocksdb_backup_engine_get_backup_info(b->be);
  int cnt = bi ? rocksdb_backup_engine_info_count(bi) : 0;
  *ids = calloc((size_t)cnt + 1, sizeof **ids);
  *sizes = calloc((size_t)cnt + 1, sizeof **sizes);
  *files = calloc((size_t)cnt + 1, sizeof **files);
  int rc = *ids && *sizes && *files ? 0 : -ENOMEM;
  for (int i = 0; !rc && i < cnt; i++) {
    (*ids)[i] = rocksdb_backup_engine_info_backup_id(bi, i);
    (*sizes)[i] = rocksdb_backup_engine_info_size(bi, i);
    (*files)[i] = rocksdb_backup_engine_info_number_files(bi, i);
  }
  if (bi) rocksdb_backup_engine_info_destroy(bi);
  *n = rc ? 0 : cnt;
  return rc;
}

/* ------------------------------------------------------------ open, close */

int store_backup_open(const char *backup_dir, store_backup_t **out, char *why, size_t why_len) {
  *out = NULL;
  if (!backup_dir || !backup_dir[0]) return err_set(why, why_len, -EINVAL, "no backup dir given");
  int rc = fsio_mkdir_p(backup_dir, NULL, 0);
  if (rc)
    return err_set(why, why_len, rc, "cannot create the backup dir %s: %s; check that it is mounted and writable",
                   backup_dir, strerror(-rc));
  store_backup_t *b = calloc(1, sizeof *b);
  char *err = NULL;
  if (!b || !(b->dir = strdup(backup_dir)) || !(b->env = rocksdb_create_default_env()) ||
      !(b->bo = rocksdb_backup_engine_options_create(backup_dir))) {
    rc = err_set(why, why_len, -ENOMEM, "out of memory opening the backup dir %s", backup_dir);
    goto out;
  }
  pthread_mutex_init(&b->mu, NULL);
  rocksdb_backup_engine_options_set_share_table_files(b->bo, 1); /* incremental: SSTs shared by checksum */
  rocksdb_backup_engine_options_set_sync(b->bo, 1);              /* a backup survives a power loss */
  rocksdb_backup_engine_options_set_destroy_old_data(b->bo, 0);
  b->be = rocksdb_backup_engine_open_opts(b->bo, b->env, &err);
  if (err || !b->be) {
    b->be = NULL;
    rc = store__kv_fail("opening the backup dir", err, why, why_len);
    size_t n = why ? strnlen(why, why_len) : 0;
    if (why && n < why_len)
      snprintf(why + n, why_len - n, " (backup dir %s: if it holds no backups of this server, point "
               "checkpoint.backup_dir elsewhere)", backup_dir);
  }
out:
  if (rc) {
    store_backup_close(b);
    return rc;
  }
  *out = b;
  return 0;
}

void store_backup_close(store_backup_t *b) {
  if (!b) return;
  if (b->be) rocksdb_backup_engine_close(b->be);
  if (b->bo) {
    rocksdb_backup_engine_options_destroy(b->bo);
    pthread_mutex_destroy(&b->mu);
  }
  if (b->env) rocksdb_env_destroy(b->env);
  free(b->dir);
  free(b);
}

const char *store_backup_dir(const store_backup_t *b) { return b->dir; }

/* ------------------------------------------------------------ backing up */

/* Opens checkpoint dir read-only and backs it up; *backup_id the new
 * backup's id.  Under b->mu. */
static int engine_backup(store_backup_t *b, const char *dir, uint32_t *backup_id, char *why, size_t why_len) {
  char *err = NULL;
  rocksdb_column_family_handle_t *cf[CF_N] = {0};
  rocksdb_options_t *o = rocksdb_options_create();
  if (!o) return -ENOMEM;
  rocksdb_options_set_create_if_missing(o, 0);
  rocksdb_options_set_max_open_files(o, store__open_files_budget());
  const rocksdb_options_t *cfo[CF_N] = {o, o, o};
  int rc = 0;
  rocksdb_t *db = rocksdb_open_for_read_only_column_families(o, dir, CF_N, store__cf_names, cfo, cf, 0, &err);
  if (err || !db) {
    db = NULL;
    rc = store__kv_fail("the read-only open of a checkpoint to back up", err, why, why_len);
    goto out;
  }
  uint32_t *ids = NULL, *nf = NULL;
  uint64_t *sz = NULL;
  int n = 0;
  rocksdb_backup_engine_create_new_backup_flush(b->be, db, 0, &err);
  if (err) {
    rc = store__kv_fail("create_new_backup", err, why, why_len);
  } else if ((rc = engine_backups(b, &ids, &sz, &nf, &n)) == 0) {
    *backup_id = n ? ids[n - 1] : 0; /* the newest is ours: one thread backs up */
    if (!*backup_id) rc = err_set(why, why_len, ERR_KV, "the backup engine lists no backup after creating one");
  }
  free(ids);
  free(sz);
  free(nf);
  if (!rc) {
    rocksdb_backup_engine_verify_backup(b->be, *backup_id, &err);
    if (err) rc = store__kv_fail("verify_backup", err, why, why_len);
  }
out:
  for (int i = 0; i < CF_N; i++)
    if (cf[i]) rocksdb_column_family_handle_destroy(cf[i]);
  if (db) rocksdb_close(db);
  rocksdb_options_destroy(o);
  return rc;
}

int store_backup_checkpoint(store_backup_t *b, store_t *s, const char *id, store_backup_info_t *info, char *why,
                            size_t why_len) {
  char *dir = NULL, *meta_path = NULL, *meta = NULL, *meta2 = NULL, *sc_path = NULL;
  void *manifest = NULL;
  size_t meta_len = 0, meta2_len = 0, manifest_len = 0;
  sidecar_t old = {0};
  char what[256];
  if (!store__valid_ckpt_id(id)) return err_set(why, why_len, -EINVAL, "checkpoint id \"%.80s\" is not valid", id);
  memset(info, 0, sizeof *info);
  snprintf(info->id, sizeof info->id, "%s", id);
  pthread_mutex_lock(&b->mu);
  double t0 = clock_mono_s();
  int rc = (dir = store__path_join(s->ckpt_dir, id)) && (meta_path = store__path_join(dir, CKPT_META)) &&
                   (sc_path = sidecar_path(b, id)) ? 0 : -ENOMEM;
  if (rc) goto out;
  if ((rc = fsio_read_all(meta_path, 1 << 16, &meta, &meta_len, NULL, 0))) {
    rc = rc == -ENOENT ? ERR_NOTFOUND : rc;
    err_set(why, why_len, rc, "there is no checkpoint \"%s\" in %s to back up", id, s->ckpt_dir);
    goto out;
  }
  if ((rc = store__ckpt_read_manifest(dir, &manifest, &manifest_len))) {
    err_set(why, why_len, rc, "checkpoint \"%s\" is not sealed: only sealed checkpoints are backed up", id);
    goto out;
  }
  if (sidecar_read(sc_path, &old, what, sizeof what) == 0 && old.meta_len == meta_len &&
      !memcmp(old.meta, meta, meta_len)) {
    /* backed up already: the same checkpoint; a new manifest (sealed again) only rewrites the sidecar */
    info->backup_id = old.backup_id;
    info->already = old.manifest_len == manifest_len && !memcmp(old.manifest, manifest, manifest_len);
    if (!info->already)
      rc = sidecar_write(b, id, old.backup_id, meta, meta_len, manifest, manifest_len, why, why_len);
    goto out;
  }
  uint64_t b0 = 0, f0 = 0, b1 = 0, f1 = 0;
  tree_usage(b->dir, 0, &b0, &f0);
  if ((rc = engine_backup(b, dir, &info->backup_id, why, why_len))) goto out;
  tree_usage(b->dir, 0, &b1, &f1);
  /* deleted while it was copied (a DeleteCheckpoint races the backup): no sidecar; the purge takes the backup */
  if (fsio_read_all(meta_path, 1 << 16, &meta2, &meta2_len, NULL, 0) != 0 || meta2_len != meta_len ||
      memcmp(meta, meta2, meta_len)) {
    rc = err_set(why, why_len, ERR_NOTFOUND, "checkpoint \"%s\" was deleted while it was backed up", id);
    goto out;
  }
  if ((rc = sidecar_write(b, id, info->backup_id, meta, meta_len, manifest, manifest_len, why, why_len))) goto out;
  uint32_t *ids = NULL, *nf = NULL;
  uint64_t *sz = NULL;
  int n = 0;
  if (engine_backups(b, &ids, &sz, &nf, &n) == 0)
    for (int i = 0; i < n; i++)
      if (ids[i] == info->backup_id) {
        info->bytes = sz[i];
        info->files = nf[i];
      }
  free(ids);
  free(sz);
  free(nf);
  info->bytes_copied = b1 > b0 ? b1 - b0 : 0;
  info->files_copied = f1 > f0 ? f1 - f0 : 0;
  info->seconds = clock_mono_s() - t0;
  log_info("checkpoint backed up id=%s backup_id=%" PRIu32 " files=%" PRIu32 " bytes=%" PRIu64 " files_copied=%" PRIu64
           " bytes_copied=%" PRIu64 " bytes_reused=%" PRIu64 " seconds=%.3f backup_dir=%s",
           id, info->backup_id, info->files, info->bytes, info->files_copied, info->bytes_copied,
           info->bytes > info->bytes_copied ? info->bytes - info->bytes_copied : 0, info->seconds, b->dir);
out:
  pthread_mutex_unlock(&b->mu);
  if (rc) log_warn("checkpoint not backed up id=%s backup_dir=%s reason=\"%s\"", id, b->dir, why ? why : err_str(rc));
  free(old.buf);
  free(dir);
  free(meta_path);
  free(meta);
  free(meta2);
  free(manifest);
  free(sc_path);
  return rc;
}

/* ------------------------------------------------------------ listing, purging */

static int entry_cmp(const void *a, const void *c) {
  uint32_t x = ((const store_backup_entry_t *)a)->backup_id, y = ((const store_backup_entry_t *)c)->backup_id;
  return x < y ? -1 : x > y;
}

int store_backup_list(store_backup_t *b, store_backup_entry_t **list, size_t *n) {
  *list = NULL;
  *n = 0;
  DIR *d = opendir(b->dir);
  if (!d) return -errno;
  store_backup_entry_t *v = NULL;
  size_t cnt = 0, cap = 0, ext = strlen(SIDECAR_EXT);
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) && !rc) {
    size_t len = strlen(de->d_name);
    if (len <= ext || strcmp(de->d_name + len - ext, SIDECAR_EXT)) continue;
    char *p = store__path_join(b->dir, de->d_name), what[256] = "";
    sidecar_t sc;
    int src = p ? sidecar_read(p, &sc, what, sizeof what) : -ENOMEM;
    if (src == 0 && (len - ext != strlen(sc.id) || strncmp(de->d_name, sc.id, len - ext))) {
      snprintf(what, sizeof what, "it names checkpoint %s, not the one of its file name", sc.id);
      free(sc.buf);
      src = -EBADMSG;
    }
    if (src == -ENOMEM) {
      rc = src;
    } else if (src) {
      if (src != ERR_NOTFOUND)
        log_warn("ignoring a damaged backup sidecar path=%s (%s): its checkpoint is not restored from this backup "
                 "dir, and the backup it names may be purged; remove the file", p, what);
    } else {
      if (cnt == cap) {
        size_t nc = cap ? 2 * cap : 8;
        store_backup_entry_t *nv = realloc(v, nc * sizeof *nv);
        if (!nv) rc = -ENOMEM;
        else {
          v = nv;
          cap = nc;
        }
      }
      if (!rc) {
        memset(&v[cnt], 0, sizeof v[cnt]);
        snprintf(v[cnt].id, sizeof v[cnt].id, "%s", sc.id);
        v[cnt].backup_id = sc.backup_id;
        cnt++;
      }
      free(sc.buf);
    }
    free(p);
  }
  closedir(d);
  if (rc) {
    free(v);
    return rc;
  }
  if (cnt) qsort(v, cnt, sizeof *v, entry_cmp);
  *list = v;
  *n = cnt;
  return 0;
}

int store_backup_has(store_backup_t *b, const char *id) {
  char *p = store__valid_ckpt_id(id) ? sidecar_path(b, id) : NULL, what[256];
  sidecar_t sc;
  int yes = p && sidecar_read(p, &sc, what, sizeof what) == 0;
  if (yes) {
    yes = !strcmp(sc.id, id);
    free(sc.buf);
  }
  free(p);
  return yes;
}

/* Keeps every backup from the oldest one a sidecar names (none when no
 * sidecar is left).  Under b->mu. */
static int purge(store_backup_t *b, char *why, size_t why_len) {
  store_backup_entry_t *list = NULL;
  size_t n = 0;
  uint32_t *ids = NULL, *nf = NULL;
  uint64_t *sz = NULL;
  int cnt = 0;
  int rc = store_backup_list(b, &list, &n);
  if (!rc) rc = engine_backups(b, &ids, &sz, &nf, &cnt);
  if (rc) {
    err_set(why, why_len, rc, "cannot list the backups in %s: %s", b->dir, strerror(-rc));
    goto out;
  }
  uint32_t oldest = n ? list[0].backup_id : UINT32_MAX, keep = 0;
  for (int i = 0; i < cnt; i++) keep += ids[i] >= oldest;
  if (keep < (uint32_t)cnt) {
    char *err = NULL;
    rocksdb_backup_engine_purge_old_backups(b->be, keep, &err);
    if (err) rc = store__kv_fail("purge_old_backups", err, why, why_len);
    else log_info("backups purged backup_dir=%s removed=%u kept=%u", b->dir, (unsigned)cnt - keep, keep);
  }
out:
  free(list);
  free(ids);
  free(sz);
  free(nf);
  return rc;
}

int store_backup_drop(store_backup_t *b, const char *id, char *why, size_t why_len) {
  int rc = 0;
  pthread_mutex_lock(&b->mu);
  store_backup_entry_t *list = NULL;
  size_t n = 0;
  if (!id) rc = store_backup_list(b, &list, &n); /* every sidecar */
  for (size_t i = 0; !rc && i < (id ? 1 : n); i++) {
    const char *which = id ? id : list[i].id;
    char *p = store__valid_ckpt_id(which) ? sidecar_path(b, which) : NULL;
    if (!p) rc = err_set(why, why_len, -EINVAL, "checkpoint id \"%.80s\" is not valid", which);
    else if (unlink(p) == 0) log_info("backup of checkpoint dropped id=%s backup_dir=%s", which, b->dir);
    else if (errno != ENOENT) rc = err_set(why, why_len, -errno, "cannot remove %s: %s", p, strerror(errno));
    free(p);
  }
  free(list);
  if (!rc) rc = fsio_fsync_path(b->dir, true, why, why_len);
  if (!rc) rc = purge(b, why, why_len);
  pthread_mutex_unlock(&b->mu);
  return rc;
}

/* ------------------------------------------------------------ restoring */

/* Rebuilds checkpoint sc into data_dir/checkpoints/<id> through
 * checkpoints.tmp/<id>.  Under b->mu. */
static int restore_one(store_backup_t *b, const sidecar_t *sc, const char *ckpt, const char *tmp, char *why,
                       size_t why_len) {
  char *stage = store__path_join(tmp, sc->id), *final = store__path_join(ckpt, sc->id), *err = NULL;
  char *mf = stage ? store__path_join(stage, CKPT_MANIFEST) : NULL, *mt = stage ? store__path_join(stage, CKPT_META) : NULL;
  rocksdb_restore_options_t *ro = rocksdb_restore_options_create();
  int rc = stage && final && mf && mt && ro ? 0 : -ENOMEM;
  if (rc) goto out;
  rocksdb_backup_engine_verify_backup(b->be, sc->backup_id, &err);
  if (err) {
    rc = store__kv_fail("verify_backup", err, why, why_len);
    goto out;
  }
  if ((rc = fsio_remove_tree(stage, why, why_len)) || (rc = fsio_mkdir_p(stage, why, why_len))) goto out;
  rocksdb_backup_engine_restore_db_from_backup(b->be, stage, stage, ro, sc->backup_id, &err);
  if (err) {
    rc = store__kv_fail("restore_db_from_backup", err, why, why_len);
    goto out;
  }
  /* the manifest, then CHANTER_CHECKPOINT (what makes it a checkpoint), then the rename publishes it */
  if ((rc = fsio_replace(mf, sc->manifest, sc->manifest_len, 0644, why, why_len)) ||
      (rc = fsio_replace(mt, sc->meta, sc->meta_len, 0644, why, why_len)) ||
      (rc = fsio_fsync_path(stage, true, why, why_len)))
    goto out;
  if ((rc = store__ckpt_publish(stage, final)))
    err_set(why, why_len, rc, "cannot move %s to %s: %s", stage, final, strerror(-rc));
out:
  if (rc && stage) fsio_remove_tree(stage, NULL, 0);
  if (ro) rocksdb_restore_options_destroy(ro);
  free(stage);
  free(final);
  free(mf);
  free(mt);
  return rc;
}

int store_backup_restore(store_backup_t *b, const char *data_dir, store_backup_restored_t *r, char *why,
                         size_t why_len) {
  store_backup_entry_t *list = NULL;
  size_t n = 0;
  memset(r, 0, sizeof *r);
  char *ckpt = store__path_join(data_dir, "checkpoints"), *tmp = store__path_join(data_dir, "checkpoints.tmp");
  int rc = ckpt && tmp ? 0 : -ENOMEM;
  pthread_mutex_lock(&b->mu);
  if (!rc) rc = store_backup_list(b, &list, &n);
  if (rc) {
    err_set(why, why_len, rc, "cannot read the backup dir %s: %s", b->dir, strerror(-rc));
    goto out;
  }
  r->backups = n;
  if (n && ((rc = fsio_mkdir_p(ckpt, why, why_len)) || (rc = fsio_mkdir_p(tmp, why, why_len)))) goto out;
  for (size_t i = 0; i < n; i++) {
    char *p = sidecar_path(b, list[i].id), *have = store__path_join(ckpt, list[i].id), what[256], e2[1024] = "";
    sidecar_t sc;
    double t0 = clock_mono_s();
    int one = p && have ? sidecar_read(p, &sc, what, sizeof what) : -ENOMEM;
    if (one) {
      snprintf(e2, sizeof e2, "its sidecar %s: %s", p ? p : "", one == -ENOMEM ? "out of memory" : what);
    } else {
      if (store__ckpt_has_meta(have)) {
        log_info("checkpoint restored from backup already id=%s path=%s", sc.id, have);
      } else if ((one = restore_one(b, &sc, ckpt, tmp, e2, sizeof e2)) == 0) {
        log_info("checkpoint restored from backup id=%s backup_id=%" PRIu32 " path=%s bytes=%" PRIu64
                 " seconds=%.3f backup_dir=%s", sc.id, sc.backup_id, have, store__dir_bytes(have),
                 clock_mono_s() - t0, b->dir);
      }
      free(sc.buf);
    }
    if (one) {
      log_warn("checkpoint not restored from backup id=%s backup_dir=%s reason=\"%s\"", list[i].id, b->dir, e2);
      r->failed++;
    } else {
      r->restored++;
      snprintf(r->newest, sizeof r->newest, "%s", list[i].id); /* the list is in backup (= checkpoint) order */
    }
    free(p);
    free(have);
  }
  fsio_remove_tree(tmp, NULL, 0);
out:
  pthread_mutex_unlock(&b->mu);
  free(list);
  free(ckpt);
  free(tmp);
  return rc;
}
