/*
 * chanter embedding ...: talk to running embedding servers the way a
 * trainer does (through embc), for operators and tests.
 */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "embc.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "le.h"

/* "T:R" or a raw uint64. */
static int parse_key(const char *s, uint64_t *key) {
  char *end;
  errno = 0;
  if (strchr(s, ':')) {
    unsigned long long t = strtoull(s, &end, 10);
    if (errno || *end != ':' || end == s) return -EINVAL;
    const char *r = end + 1;
    unsigned long long row = strtoull(r, &end, 10);
    if (errno || *end || end == r || t >= TABLE_MAX || row > TABLE_ROW_MASK) return -EINVAL;
    *key = TABLE_KEY(t, row);
    return 0;
  }
  unsigned long long k = strtoull(s, &end, 10);
  if (errno || *end || end == s || s[0] == '-') return -EINVAL;
  *key = k;
  return 0;
}

static void print_row(FILE *f, const float *r, uint32_t n, int json) {
  for (uint32_t i = 0; i < n; i++) fprintf(f, json ? "%s%.9g" : "%s%.9g", i ? (json ? ", " : " ") : "", (double)r[i]);
}

static int do_lookup(cli_t *cli, embc_t *c) {
  char err[1024];
  size_t n = (size_t)cli->argc, bytes;
  if (n == 0) {
    fprintf(stderr, "chanter embedding lookup: give at least one KEY (TABLE:ROW or uint64)\n");
    return 2;
  }
  uint64_t *keys = calloc(n, sizeof *keys);
  float *rows = NULL;
  int rc = 1;
  for (size_t i = 0; i < n; i++)
    if (parse_key(cli->argv[i], &keys[i])) {
      fprintf(stderr, "chanter embedding lookup: argument %zu '%s' is not TABLE:ROW or a uint64 key\n", i + 1,
              cli->argv[i]);
      rc = 2;
      goto out;
    }
  if (embc_rows_bytes(c, keys, n, &bytes, err, sizeof err)) {
    fprintf(stderr, "chanter embedding lookup: %s\n", err);
    goto out;
  }
  rows = malloc(bytes ? bytes : 1);
  if (embc_lookup(c, keys, n, rows, err, sizeof err)) {
    fprintf(stderr, "chanter embedding lookup: %s\n", err);
    goto out;
  }
  const table_layout_t *l = embc_layout(c);
  size_t o = 0;
  if (cli->json) printf("{\"rows\": [");
  for (size_t i = 0; i < n; i++) {
    uint32_t t = TABLE_ID(keys[i]), f = table_row_floats(l, t);
    uint32_t srv = shard_of(embc_shard_map(c), keys[i]);
    if (cli->json) {
      printf("%s\n  {\"key\": %" PRIu64 ", \"table\": %u, \"row\": %" PRIu64 ", \"server\": %u, \"dim\": %u, \"values\": [",
             i ? "," : "", keys[i], t, TABLE_ROW(keys[i]), srv, l->tables[t].dim);
      print_row(stdout, rows + o, f, 1);
      printf("]}");
    } else {
      printf("%u:%" PRIu64 "\t", t, TABLE_ROW(keys[i]));
      print_row(stdout, rows + o, f, 0);
      printf("\n");
    }
    o += f;
  }
  if (cli->json) printf("\n]}\n");
  rc = 0;
out:
  free(keys);
  free(rows);
  return rc;
}

static int do_write(cli_t *cli, embc_t *c) {
  char err[1024];
  size_t n = (size_t)cli->argc;
  if (n == 0) {
    fprintf(stderr, "chanter embedding write: give at least one KEY=V,V,... (the full row: vector then optimizer state)\n");
    return 2;
  }
  const table_layout_t *l = embc_layout(c);
  uint64_t *keys = calloc(n, sizeof *keys);
  size_t cap = n * table_max_row_floats(l), o = 0;
  float *rows = calloc(cap ? cap : 1, sizeof *rows);
  int rc = 2;
  for (size_t i = 0; i < n; i++) {
    char *arg = strdup(cli->argv[i]), *eq = strchr(arg, '=');
    if (!eq) {
      fprintf(stderr, "chanter embedding write: argument %zu '%s' is not KEY=V,V,...\n", i + 1, cli->argv[i]);
      free(arg);
      goto out;
    }
    *eq = 0;
    char why[256];
    if (parse_key(arg, &keys[i]) || table_check_key(l, keys[i], why, sizeof why)) {
      fprintf(stderr, "chanter embedding write: argument %zu: '%s' is not a valid key of this job's tables\n", i + 1, arg);
      free(arg);
      goto out;
    }
    uint32_t want = table_row_floats(l, TABLE_ID(keys[i])), got = 0;
    char *save = NULL;
    for (char *tok = strtok_r(eq + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *end;
      float v = strtof(tok, &end);
      if (end == tok || *end) {
        fprintf(stderr, "chanter embedding write: argument %zu: value %u '%s' is not a number\n", i + 1, got + 1, tok);
        free(arg);
        goto out;
      }
      if (got < want) rows[o + got] = v;
      got++;
    }
    free(arg);
    if (got != want) {
      fprintf(stderr,
              "chanter embedding write: argument %zu: table %u rows have %u floats (dim %u + %u optimizer state), got %u\n",
              i + 1, TABLE_ID(keys[i]), want, l->tables[TABLE_ID(keys[i])].dim,
              l->tables[TABLE_ID(keys[i])].state_floats, got);
      goto out;
    }
    o += want;
  }
  rc = 1;
  if (embc_write(c, keys, n, rows, err, sizeof err)) {
    fprintf(stderr, "chanter embedding write: %s\n", err);
    goto out;
  }
  if (cli->json)
    printf("{\"rows_written\": %zu}\n", n);
  else
    printf("wrote %zu rows (durable)\n", n);
  rc = 0;
out:
  free(keys);
  free(rows);
  return rc;
}

static int do_digest(cli_t *cli, embc_t *c) {
  char err[1024];
  uint32_t n = embc_servers(c);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  uint64_t total = 0, lane[4] = {0, 0, 0, 0};
  int rc = 0;
  if (cli->json) printf("{\"servers\": [");
  for (uint32_t s = 0; s < n; s++) {
    Chanter__Embedding__V1__DigestRequest req = CHANTER__EMBEDDING__V1__DIGEST_REQUEST__INIT;
    Chanter__Embedding__V1__DigestResponse *d = NULL;
    if ((rc = embc_digest(c, s, &req, &d, err, sizeof err)) != 0) {
      fprintf(stderr, "chanter embedding digest: %s\n", err);
      break;
    }
    EVP_DigestUpdate(md, d->sha256.data, d->sha256.len);
    total += d->rows;
    /* the set digest: lane-wise sum of the servers' (the same for any sharding) */
    char set_hex[65] = "";
    if (d->set_sha256.len == 32) {
      le_lanes_add(lane, d->set_sha256.data);
      for (int i = 0; i < 32; i++) snprintf(set_hex + 2 * i, 3, "%02x", d->set_sha256.data[i]);
    }
    if (cli->json)
      printf("%s\n  {\"server\": %u, \"address\": \"%s\", \"rows\": %" PRIu64 ", \"sha256\": \"%s\", \"set_sha256\": \"%s\"}",
             s ? "," : "", s, embc_address(c, s), d->rows, d->hex, set_hex);
    else
      printf("server %u (%s): rows=%" PRIu64 " sha256=%s set=%s\n", s, embc_address(c, s), d->rows, d->hex, set_hex);
    protobuf_c_message_free_unpacked(&d->base, NULL);
  }
  uint8_t h[32];
  unsigned hl = 0;
  EVP_DigestFinal_ex(md, h, &hl);
  EVP_MD_CTX_free(md);
  if (rc) {
    if (cli->json) printf("\n]}\n");
    return 1;
  }
  char hex[65], set_hex[65];
  uint8_t set[32];
  le_lanes_put(set, lane);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
  for (int i = 0; i < 32; i++) snprintf(set_hex + 2 * i, 3, "%02x", set[i]);
  /* the combined digest: SHA-256 over the servers' digests in shard order */
  if (cli->json)
    printf("\n], \"rows\": %" PRIu64 ", \"digest\": \"%s\", \"set_sha256\": \"%s\"}\n", total, hex, set_hex);
  else
    printf("combined: rows=%" PRIu64 " digest=%s set=%s\n", total, hex, set_hex);
  return 0;
}

static int do_stats(cli_t *cli, embc_t *c) {
  char err[1024];
  if (cli->json) printf("{\"servers\": [");
  for (uint32_t s = 0; s < embc_servers(c); s++) {
    Chanter__Embedding__V1__StatsRequest req = CHANTER__EMBEDDING__V1__STATS_REQUEST__INIT;
    Chanter__Embedding__V1__StatsResponse *r = NULL;
    if (embc_stats(c, s, &req, &r, err, sizeof err)) {
      fprintf(stderr, "chanter embedding stats: %s\n", err);
      if (cli->json) printf("\n]}\n");
      return 1;
    }
    char fence[256] = "none";
    if (r->fence_id && *r->fence_id)
      snprintf(fence, sizeof fence, "%.128s (after iteration %" PRIu64 ", %" PRIu64 " write-backs held)", r->fence_id,
               r->fence_iteration, r->fence_held);
    if (cli->json)
      printf("%s\n  {\"server\": %u, \"address\": \"%s\", \"shard\": %u, \"shards\": %u, \"hot_rows\": %" PRIu64
             ", \"hot_bytes\": %" PRIu64 ", \"hot_capacity_bytes\": %" PRIu64 ", \"hot_evictions\": %" PRIu64
             ", \"lookup_calls\": %" PRIu64 ", \"lookup_rows\": %" PRIu64 ", \"hot_hits\": %" PRIu64
             ", \"kv_reads\": %" PRIu64 ", \"lazy_inits\": %" PRIu64 ", \"writeback_calls\": %" PRIu64
             ", \"writeback_rows\": %" PRIu64 ", \"rejected_calls\": %" PRIu64 ", \"stored_rows_estimate\": %" PRIu64
             ", \"layout_hash\": \"%016" PRIx64 "\", \"data_dir\": \"%s\", \"has_rows\": %s, \"has_blobs\": %s"
             ", \"incarnation\": \"%016" PRIx64 "\", \"epoch\": %" PRIu64 ", \"fence_id\": \"%s\", \"fence_iteration\": %" PRIu64
             ", \"fence_held\": %" PRIu64 "}",
             s ? "," : "", s, embc_address(c, s), r->shard, r->shards, r->hot_rows, r->hot_bytes, r->hot_capacity_bytes,
             r->hot_evictions, r->lookup_calls, r->lookup_rows, r->hot_hits, r->kv_reads, r->lazy_inits,
             r->write_back_calls, r->write_back_rows, r->rejected_calls, r->stored_rows_estimate, r->layout_hash,
             r->data_dir, r->has_rows ? "true" : "false", r->has_blobs ? "true" : "false", r->incarnation, r->write_epoch,
             r->fence_id ? r->fence_id : "", r->fence_iteration, r->fence_held);
    else
      printf("server %u (%s) shard %u/%u\n  lookups: %" PRIu64 " calls, %" PRIu64 " rows (%" PRIu64 " from memory, %" PRIu64
             " from RocksDB, %" PRIu64 " lazily initialized)\n  write-backs: %" PRIu64 " calls, %" PRIu64
             " rows\n  memory tier: %" PRIu64 " rows, %.1f of %.1f MiB, %" PRIu64 " evictions\n  stored rows (estimate): %" PRIu64
             "\n  stored: %s, %s\n  rejected calls: %" PRIu64 "\n  data dir: %s\n  incarnation %016" PRIx64
             ", write epoch %" PRIu64 ", fence %s\n",
             s, embc_address(c, s), r->shard, r->shards, r->lookup_calls, r->lookup_rows, r->hot_hits, r->kv_reads,
             r->lazy_inits, r->write_back_calls, r->write_back_rows, r->hot_rows, (double)r->hot_bytes / 1048576.0,
             (double)r->hot_capacity_bytes / 1048576.0, r->hot_evictions, r->stored_rows_estimate,
             r->has_rows ? "rows" : "no rows", r->has_blobs ? "blobs" : "no blobs", r->rejected_calls, r->data_dir,
             r->incarnation, r->write_epoch, fence);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  if (cli->json) printf("\n]}\n");
  return 0;
}

static int do_checkpoint(cli_t *cli, embc_t *c, int restore) {
  char err[1024];
  const char *what = restore ? "restore" : "checkpoint";
  if (cli->argc != 1) {
    fprintf(stderr, "chanter embedding %s: give exactly one checkpoint ID\n", what);
    return 2;
  }
  if (cli->json) printf("{\"servers\": [");
  for (uint32_t s = 0; s < embc_servers(c); s++) {
    Chanter__Embedding__V1__RestoreResponse *rr = NULL;
    Chanter__Embedding__V1__CheckpointResponse *cr = NULL;
    int rc;
    if (restore) {
      Chanter__Embedding__V1__RestoreRequest req = CHANTER__EMBEDDING__V1__RESTORE_REQUEST__INIT;
      req.id = cli->argv[0];
      rc = embc_restore(c, s, &req, &rr, err, sizeof err);
    } else {
      Chanter__Embedding__V1__CheckpointRequest req = CHANTER__EMBEDDING__V1__CHECKPOINT_REQUEST__INIT;
      req.id = cli->argv[0];
      rc = embc_checkpoint(c, s, &req, &cr, err, sizeof err);
    }
    if (rc) {
      fprintf(stderr, "chanter embedding %s: %s\n", what, err);
      if (cli->json) printf("\n]}\n");
      return 1;
    }
    if (restore) {
      if (cli->json)
        printf("%s\n  {\"server\": %u, \"restored\": \"%s\"}", s ? "," : "", s, cli->argv[0]);
      else
        printf("server %u (%s): restored %s\n", s, embc_address(c, s), cli->argv[0]);
      protobuf_c_message_free_unpacked(&rr->base, NULL);
    } else {
      Chanter__Embedding__V1__CheckpointInfo *ci = cr->checkpoint;
      if (cli->json)
        printf("%s\n  {\"server\": %u, \"id\": \"%s\", \"path\": \"%s\", \"bytes\": %" PRIu64 "}", s ? "," : "", s,
               ci ? ci->id : "", ci ? ci->path : "", ci ? ci->bytes : 0);
      else
        printf("server %u (%s): checkpoint %s at %s (%" PRIu64 " bytes)\n", s, embc_address(c, s), ci ? ci->id : "",
               ci ? ci->path : "", ci ? ci->bytes : 0);
      protobuf_c_message_free_unpacked(&cr->base, NULL);
    }
  }
  if (cli->json) printf("\n]}\n");
  return 0;
}

static int do_list(cli_t *cli, embc_t *c) {
  char err[1024];
  if (cli->json) printf("{\"servers\": [");
  for (uint32_t s = 0; s < embc_servers(c); s++) {
    Chanter__Embedding__V1__ListCheckpointsRequest req = CHANTER__EMBEDDING__V1__LIST_CHECKPOINTS_REQUEST__INIT;
    Chanter__Embedding__V1__ListCheckpointsResponse *r = NULL;
    if (embc_list_checkpoints(c, s, &req, &r, err, sizeof err)) {
      fprintf(stderr, "chanter embedding checkpoints: %s\n", err);
      if (cli->json) printf("\n]}\n");
      return 1;
    }
    if (cli->json) printf("%s\n  {\"server\": %u, \"checkpoints\": [", s ? "," : "", s);
    for (size_t i = 0; i < r->n_checkpoints; i++) {
      Chanter__Embedding__V1__CheckpointInfo *ci = r->checkpoints[i];
      if (cli->json)
        printf("%s{\"id\": \"%s\", \"path\": \"%s\", \"created_unix\": %" PRIu64 ", \"bytes\": %" PRIu64
               ", \"sealed\": %s}",
               i ? ", " : "", ci->id, ci->path, ci->created_unix, ci->bytes, ci->sealed ? "true" : "false");
      else
        printf("server %u: %s\t%" PRIu64 " bytes\tcreated %" PRIu64 "\t%s\t%s\n", s, ci->id, ci->bytes,
               ci->created_unix, ci->sealed ? "sealed" : "unsealed", ci->path);
    }
    if (cli->json) printf("]}");
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  if (cli->json) printf("\n]}\n");
  return 0;
}

/* reshape N: the servers of cluster.embedding (the old and the new ones)
 * move their rows onto the first N, server to server. */
static int do_reshape(cli_t *cli, embc_t *c) {
  char err[1024], *end;
  errno = 0;
  unsigned long n = strtoul(cli->argv[0], &end, 10);
  if (errno || *end || end == cli->argv[0] || n < 1 || n > embc_servers(c)) {
    fprintf(stderr, "chanter embedding reshape: '%s' is not a server count from 1 to %u (the addresses in "
            "cluster.embedding)\n", cli->argv[0], embc_servers(c));
    return 2;
  }
  embc_reshape_stats_t *per = calloc(embc_servers(c), sizeof *per), st;
  if (!per || embc_reshape_all(c, (uint32_t)n, 0, per, &st, err, sizeof err)) {
    fprintf(stderr, "chanter embedding reshape: %s\n", per ? err : "out of memory");
    free(per);
    return 1;
  }
  if (cli->json) printf("{\"servers\": %lu, \"rows_moved\": %" PRIu64 ", \"bytes_moved\": %" PRIu64
                        ", \"seconds\": %.3f, \"per_server\": [", n, st.rows_moved, st.bytes_moved, st.seconds);
  for (uint32_t s = 0; s < embc_servers(c); s++)
    if (cli->json)
      printf("%s{\"server\": %u, \"rows_moved\": %" PRIu64 ", \"bytes_moved\": %" PRIu64 ", \"seconds\": %.3f}",
             s ? ", " : "", s, per[s].rows_moved, per[s].bytes_moved, per[s].seconds);
    else
      printf("server %u (%s): moved %" PRIu64 " rows (%" PRIu64 " bytes) in %.3f s\n", s, embc_address(c, s),
             per[s].rows_moved, per[s].bytes_moved, per[s].seconds);
  if (cli->json) printf("]}\n");
  else printf("reshaped onto %lu servers: %" PRIu64 " rows (%" PRIu64 " bytes) moved server to server in %.3f s\n", n,
              st.rows_moved, st.bytes_moved, st.seconds);
  free(per);
  return 0;
}

int cmd_embedding(cli_t *cli) {
  char err[1024];
  if (cli->argc < 1) return cli_usage_error(cli, "expected lookup, write, digest, stats, checkpoint, checkpoints, restore or reshape");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  static const char *const subs[] = {"lookup", "write", "digest", "stats", "checkpoint", "restore", "checkpoints", "reshape"};
  int known = 0;
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) known |= !strcmp(sub, subs[i]);
  if (!known) return cli_usage_error(cli, "unknown subcommand '%s'", sub);
  int n_pos = !strcmp(sub, "checkpoint") || !strcmp(sub, "restore") || !strcmp(sub, "reshape") ? 1 : !strcmp(sub, "lookup") || !strcmp(sub, "write") ? -1 : 0;
  if (n_pos >= 0 && cli_args(cli, n_pos, n_pos, sub, !n_pos ? "no arguments" : !strcmp(sub, "reshape") ? "one server count N" : "one checkpoint ID")) return 2;
  if (n_pos < 0 && cli_args(cli, 1, 1 << 30, sub, !strcmp(sub, "lookup") ? "KEY..." : "KEY=V,V,...")) return 2;
  embc_t *c;
  if (embc_create(cli->cfg, &c, err, sizeof err)) {
    fprintf(stderr, "chanter embedding %s: %s\n", sub, err);
    return 1;
  }
  int rc;
  if (!strcmp(sub, "lookup"))
    rc = do_lookup(cli, c);
  else if (!strcmp(sub, "write"))
    rc = do_write(cli, c);
  else if (!strcmp(sub, "digest"))
    rc = do_digest(cli, c);
  else if (!strcmp(sub, "stats"))
    rc = do_stats(cli, c);
  else if (!strcmp(sub, "checkpoint"))
    rc = do_checkpoint(cli, c, 0);
  else if (!strcmp(sub, "restore"))
    rc = do_checkpoint(cli, c, 1);
  else if (!strcmp(sub, "checkpoints"))
    rc = do_list(cli, c);
  else if (!strcmp(sub, "reshape"))
    rc = do_reshape(cli, c);
  else
    rc = 2; /* not reached: checked above */
  embc_destroy(c);
  return rc;
}
