/*
 * manifest: see manifest.h.
 */
#include "manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "sbuf.h"

void manifest_sha256_hex(const void *p, size_t n, char out[65]) {
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(p, n, h, &hl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

char *manifest_format(const manifest_t *m, size_t *len) {
  sbuf_t b = {0};
  sb_printf(&b, "chanter_checkpoint=1\n");
  sb_printf(&b, "id=%s\njob_id=%s\niteration=%" PRIu64 "\ncreated_unix=%" PRIu64 "\n", m->id, m->job_id, m->iteration,
      m->created_unix);
  sb_printf(&b, "model=%s\nmodel_shape=%s\noptimizer=%s\nembedding_optimizer=%s\n", m->model, m->model_shape, m->optimizer,
      m->embedding_optimizer);
  sb_printf(&b, "layout_hash=%016" PRIx64 "\nschema_hash=%016" PRIx64 "\n", m->layout_hash, m->schema_hash);
  sb_printf(&b, "dataset=%s\nseed=%" PRIu64 "\nbatch_size=%" PRIu64 "\niterations=%" PRIu64 "\n", m->dataset, m->seed,
      m->batch_size, m->iterations);
  sb_printf(&b, "trainers=%" PRIu64 "\nembedding_servers=%" PRIu64 "\nallocation=%s\nlookahead=%s\ncache_rows=%" PRIu64 "\n",
      m->trainers, m->servers, m->allocation, m->lookahead, m->cache_rows);
  if (m->shard_rule[0]) sb_printf(&b, "shard_rule=%s\n", m->shard_rule);
  sb_printf(&b, "dense_server=%" PRIu64 "\ndense_blob=%s\noracle_blob=%s\noracle_sha256=%s\nrows_flushed=%" PRIu64 "\n",
      m->dense_server, m->dense_blob, m->oracle_blob, m->oracle_sha256, m->rows_flushed);
  for (uint64_t s = 0; s < m->servers && m->server_bytes; s++)
    sb_printf(&b, "server.%" PRIu64 ".bytes=%" PRIu64 "\n", s, m->server_bytes[s]);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  char h[65];
  manifest_sha256_hex(b.s, b.n, h);
  sb_printf(&b, "sha256=%s\n", h);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  *len = b.n;
  return b.s;
}

void manifest_free(manifest_t *m) {
  free(m->server_bytes);
  m->server_bytes = NULL;
}

int manifest_parse(const char *text, size_t len, manifest_t *m, char *err, size_t err_len) {
  memset(m, 0, sizeof *m);
  const char *sha = NULL;
  for (size_t i = 0; i + 7 <= len; i++)
    if ((i == 0 || text[i - 1] == '\n') && !strncmp(text + i, "sha256=", 7)) sha = text + i;
  if (!sha || len - (size_t)(sha - text) < 7 + 64)
    return err_set(err, err_len, ERR_BADMSG, "the manifest has no sha256 line (it is cut short, or not a manifest)");
  char h[65];
  manifest_sha256_hex(text, (size_t)(sha - text), h);
  if (strncmp(sha + 7, h, 64) != 0)
    return err_set(err, err_len, ERR_BADMSG, "the manifest is damaged: its sha256 line does not match its content");
  int got = 0, magic = 0, lineno = 0;
  size_t sb_cap = 0; /* entries of m->server_bytes */
  for (const char *p = text; p < sha;) {
    const char *e = memchr(p, '\n', (size_t)(sha - p));
    if (!e) break;
    lineno++;
    char ln[2048];
    size_t l = (size_t)(e - p) < sizeof ln - 1 ? (size_t)(e - p) : sizeof ln - 1;
    memcpy(ln, p, l);
    ln[l] = 0;
    p = e + 1;
    char *v = strchr(ln, '=');
    if (!v) continue;
    *v++ = 0;
    if (!strcmp(ln, "chanter_checkpoint")) {
      magic = !strcmp(v, "1");
      continue;
    }
    if (!strcmp(ln, "shard_rule")) { /* optional: manifests before it placed rows by modulo */
      snprintf(m->shard_rule, sizeof m->shard_rule, "%s", v);
      continue;
    }
#define MS(k, f)                                  \
  if (!strcmp(ln, k)) {                           \
    snprintf(m->f, sizeof m->f, "%s", v);         \
    got++;                                        \
    continue;                                     \
  }
#define MU(k, f, base)                            \
  if (!strcmp(ln, k)) {                           \
    m->f = strtoull(v, NULL, base);               \
    got++;                                        \
    continue;                                     \
  }
    MS("id", id) MS("job_id", job_id) MS("model", model) MS("model_shape", model_shape) MS("optimizer", optimizer)
    MS("embedding_optimizer", embedding_optimizer) MS("dataset", dataset) MS("allocation", allocation)
    MS("lookahead", lookahead) MS("dense_blob", dense_blob) MS("oracle_blob", oracle_blob)
    MS("oracle_sha256", oracle_sha256) MU("iteration", iteration, 10) MU("created_unix", created_unix, 10)
    MU("layout_hash", layout_hash, 16) MU("schema_hash", schema_hash, 16) MU("seed", seed, 10)
    MU("batch_size", batch_size, 10) MU("iterations", iterations, 10) MU("trainers", trainers, 10)
    MU("embedding_servers", servers, 10) MU("cache_rows", cache_rows, 10) MU("dense_server", dense_server, 10)
    MU("rows_flushed", rows_flushed, 10)
#undef MS
#undef MU
    unsigned long long s, bytes;
    /* the per-server sizes go into an array of the servers counted when the
     * first of them came: a later embedding_servers line may not grow it
     * (found by tests/fuzz: a forged manifest wrote past its end) */
    if (sscanf(ln, "server.%llu.bytes", &s) == 1 && m->servers && m->servers <= MANIFEST_MAX_SERVERS &&
        s < m->servers) {
      if (!m->server_bytes) {
        if (!(m->server_bytes = calloc(m->servers, sizeof *m->server_bytes))) return -ENOMEM;
        sb_cap = m->servers;
      }
      if (s >= sb_cap) {
        manifest_free(m);
        return err_set(err, err_len, ERR_BADMSG,
                       "line %d: server.%llu.bytes, but embedding_servers changed after the first server.N.bytes "
                       "line (from %llu): a damaged or forged manifest",
                       lineno, s, (unsigned long long)sb_cap);
      }
      bytes = strtoull(v, NULL, 10);
      m->server_bytes[s] = bytes;
    }
  }
  if (m->server_bytes && sb_cap != m->servers) { /* its readers index it up to servers */
    manifest_free(m);
    return err_set(err, err_len, ERR_BADMSG,
                   "embedding_servers = %llu, but the server.N.bytes lines were counted for %llu servers: a damaged "
                   "or forged manifest",
                   (unsigned long long)m->servers, (unsigned long long)sb_cap);
  }
  if (!m->shard_rule[0]) snprintf(m->shard_rule, sizeof m->shard_rule, "modulo");
  if (!magic || got < 24 || !m->id[0] || !m->dense_blob[0] || !m->oracle_blob[0] || m->servers == 0 ||
      m->servers > MANIFEST_MAX_SERVERS) {
    manifest_free(m);
    return err_set(err, err_len, ERR_BADMSG, "the manifest lacks fields (%d of 24 found%s)", got,
                   magic ? "" : ", no chanter_checkpoint=1 line");
  }
  return 0;
}
