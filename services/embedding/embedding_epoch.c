/*
 * embedding_epoch: see embedding_epoch.h.
 */
#include "embedding_epoch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "err.h"
#include "fsio.h"
#include "log.h"

static int epoch_path(const char *data_dir, char *out, size_t n) {
  return snprintf(out, n, "%s/EPOCH", data_dir) >= (int)n ? -ENAMETOOLONG : 0;
}

int embedding_epoch_store(const char *data_dir, uint64_t e, char *why, size_t why_len) {
  char path[4200], text[64];
  if (epoch_path(data_dir, path, sizeof path))
    return err_set(why, why_len, -ENAMETOOLONG, "the data dir's path is too long");
  int n = snprintf(text, sizeof text, "epoch=%" PRIu64 "\n", e);
  int rc = fsio_replace(path, text, (size_t)n, 0644, NULL, 0);
  if (rc) return err_set(why, why_len, rc, "cannot store the write epoch in %s: %s", path, strerror(-rc));
  return 0;
}

int embedding_epoch_load(const char *data_dir, uint64_t *e) {
  char path[4200];
  *e = 0;
  if (epoch_path(data_dir, path, sizeof path)) return -ENAMETOOLONG;
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fscanf(f, "epoch=%" SCNu64, e) == 1;
  fclose(f);
  if (!ok) {
    log_error("%s is damaged (expected one line \"epoch=N\"): the server cannot tell which job run may write; "
              "remove it only if no job is running on this server",
              path);
    return ERR_BADMSG;
  }
  if (*e) log_info("write epoch %" PRIu64 " (from %s)", *e, path);
  return 0;
}
