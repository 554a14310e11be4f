/*
 * manifest: the manifest of a whole-job checkpoint (DESIGN.md section 5).
 *
 * One manifest names everything a checkpoint at iteration c holds: the
 * RocksDB checkpoint `id` on every embedding server, the dense state and
 * the oracle's state (blobs inside server dense_server's / 0's checkpoint),
 * and the job it belongs to (what a resume must match).  The oracle seals
 * it into every server's checkpoint once all of them took theirs -- a
 * checkpoint is complete exactly when every server holds its manifest --
 * and keeps a copy in oracle.state_dir; the CLI lists it.
 *
 * Text, one key=value a line, in the order manifest_format writes them,
 * ending with "sha256=" and the SHA-256 (hex) of every byte before that
 * line: a damaged or cut manifest is refused, never half-read.
 */
#ifndef CHANTER_MANIFEST_H
#define CHANTER_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#define MANIFEST_MAX_SERVERS 4096

typedef struct manifest_s {
  char id[96], job_id[96];
  uint64_t iteration;   /* the model after this iteration; a resume goes on at iteration + 1 */
  uint64_t created_unix;
  /* the job: a resume must match these (manifest_check in the oracle) */
  char model[64], model_shape[256], optimizer[32], embedding_optimizer[32], dataset[1024], allocation[32],
      lookahead[32], shard_rule[16]; /* shard.rule; "modulo" when the manifest has none (older) */
  uint64_t layout_hash, schema_hash, seed, batch_size, iterations, trainers, servers, cache_rows;
  /* where the parts are */
  uint64_t dense_server;
  char dense_blob[160], oracle_blob[160], oracle_sha256[65];
  uint64_t rows_flushed;
  uint64_t *server_bytes; /* servers entries (manifest_parse allocates; manifest_free) */
} manifest_t;

/* The text of m (malloc'ed, NUL-terminated; *len without the NUL), or
 * NULL when out of memory. */
char *manifest_format(const manifest_t *m, size_t *len);
/* Parses text[0..len) into *m.  0, or ERR_BADMSG with a sentence (a
 * missing or wrong sha256 line, a missing field), -ENOMEM. */
int manifest_parse(const char *text, size_t len, manifest_t *m, char *err, size_t err_len);
void manifest_free(manifest_t *m);
/* SHA-256 of p[0..n) as 64 hex digits: how a manifest checks itself and
 * names the parts it covers (oracle_sha256). */
void manifest_sha256_hex(const void *p, size_t n, char out[65]);

#endif
