/*
 * reshard: a whole-job checkpoint taken on S embedding servers, made into
 * one on the S' servers of the running cluster (chanter train --resume
 * onto another embedding_servers; chanter bench checkpoint times it).
 *
 * The CLI reads each old server's RocksDB checkpoint from disk, read-only
 * (store_reader: W/embedding-<i>/checkpoints/<id> for `chanter local`, or
 * the directories --old-data-dirs names), once, and writes every row with
 * its optimizer state once, to its owner under the new shard map (embc
 * routes it); the blobs (the dense state, the oracle's state, the job's
 * stamp) go to the new server 0.  Then every new server takes checkpoint
 * <id>.s<S'> and the manifest -- the old one with the new id, server count
 * and sizes -- is sealed on each: a complete checkpoint of the new shape,
 * which the oracle resumes like any other.  Where a row lives does not
 * change the math, and the digest does not depend on it: the resumed job
 * ends with the digest of the job that never stopped.
 *
 * The new servers' live rows and blobs are cleared first (their
 * checkpoints stay: the old ones may be among them).  Nothing is restored
 * until the oracle resumes from the new checkpoint.
 */
#ifndef CHANTER_RESHARD_H
#define CHANTER_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "manifest.h"

typedef struct reshard_stats_s {
  uint64_t rows, bytes, blobs;
  double seconds, read_seconds, write_seconds, checkpoint_seconds;
} reshard_stats_t;

/* The checkpoint directory of server i for id, from pattern (a path with
 * %i for the server index, e.g. "W/embedding-%i"). */
void reshard_dir(const char *pattern, uint32_t i, const char *id, char *out, size_t n);

/* The checkpoint to resume ("latest" or an id) among those sealed in the
 * old servers' directories: complete when every one of its servers holds
 * the manifest.  0 and *m (manifest_free), or ERR_NOTFOUND with err. */
int reshard_find(const char *pattern, const char *want, manifest_t *m, char *err, size_t err_len);

/* Makes checkpoint m (of m->servers servers, in pattern's directories)
 * into checkpoint new_id on the servers of cfg.  0 or an error with err;
 * st (may be NULL) says what it took. */
int reshard_run(const cfg_t *cfg, const char *pattern, const manifest_t *m, char *new_id, size_t new_id_len,
                reshard_stats_t *st, char *err, size_t err_len);

#endif
