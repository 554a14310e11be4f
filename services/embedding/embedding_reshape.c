/* embedding_reshape: see embedding_reshape.h. */
#include "embedding_reshape.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "embc.h"
#include "err.h"
#include "log.h"
#include "manifest.h"
#include "shard.h"

#define BATCH_ROWS 16384 /* rows read, sent and deleted at a time */

/* One batch of move_rows: the rows read, sent and deleted in epoch e0, or
 * nothing when the server is in a later one.  The number of rows, 0 at the
 * end, or an error with why. */
static int move_batch(embc_t *c, store_t *store, const embedding_reshape_fence_t *fence, uint64_t e0, uint64_t *from,
                      uint64_t *keys, uint8_t *buf, size_t cap, size_t *lens, embedding_reshape_result_t *res,
                      char *why, size_t why_len) {
  if (fence) pthread_rwlock_rdlock(fence->lock);
  uint64_t e = fence ? atomic_load(fence->epoch) : e0;
  size_t used = 0;
  uint64_t owned = 0;
  int n = 0, rc = 0;
  if (e != e0) {
    rc = err_set(why, why_len, ERR_PRECONDITION,
                 "this server went from write epoch %" PRIu64 " to %" PRIu64 " during the move (it was restored or "
                 "cleared: the oracle rolled the job back); the move is abandoned",
                 e0, e);
    goto out;
  }
  n = store_foreign_rows(store, from, keys, buf, cap, lens, BATCH_ROWS, &used, &owned);
  res->rows_kept += owned;
  if (n < 0) rc = err_set(why, why_len, n, "reading the rows to move: %s", err_str(n));
  if (n <= 0) goto out;
  char e2[768];
  if ((rc = embc_write(c, keys, (size_t)n, (const float *)buf, e2, sizeof e2)) != 0) {
    err_set(why, why_len, rc, "sending %d rows to their new owners: %s", n, e2);
    goto out;
  }
  if ((rc = store_delete_rows(store, keys, (size_t)n, e2, sizeof e2)) != 0) {
    err_set(why, why_len, rc, "deleting %d rows sent to their new owners: %s", n, e2);
    goto out;
  }
  res->rows_moved += (uint64_t)n;
  res->bytes_moved += used;
out:
  if (fence) pthread_rwlock_unlock(fence->lock);
  return rc ? rc : n;
}

/* Sends the rows the store does not own to their owners, then deletes them. */
static int move_rows(embc_t *c, store_t *store, const table_layout_t *l, const embedding_reshape_fence_t *fence,
                     uint64_t e0, embedding_reshape_result_t *res, char *why, size_t why_len) {
  size_t cap = (size_t)BATCH_ROWS * table_max_row_floats(l) * sizeof(float);
  uint64_t *keys = malloc(BATCH_ROWS * sizeof *keys), from = 0;
  size_t *lens = malloc(BATCH_ROWS * sizeof *lens);
  uint8_t *buf = malloc(cap ? cap : 1);
  int rc = 0;
  if (!keys || !lens || !buf) rc = err_set(why, why_len, -ENOMEM, "out of memory for a batch of %d rows", BATCH_ROWS);
  while (!rc && from != STORE_SCAN_END) {
    int n = move_batch(c, store, fence, e0, &from, keys, buf, cap, lens, res, why, why_len);
    if (n <= 0) {
      rc = n;
      break;
    }
    /* fault injection for the tests (docs/reference.md): CHANTER_FAULT_RESHAPE_PAUSE=MS pauses a move MS ms after
     * its first batch was sent and deleted, so that a test can kill a server in the middle of it */
    const char *fault = getenv("CHANTER_FAULT_RESHAPE_PAUSE");
    unsigned ms = 0;
    if (res->rows_moved == (uint64_t)n && fault && sscanf(fault, "%u", &ms) == 1 && ms) {
      log_warn("reshape: pausing %u ms after the first %d rows moved (CHANTER_FAULT_RESHAPE_PAUSE)", ms, n);
      struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  free(keys);
  free(lens);
  free(buf);
  return rc;
}

int embedding_reshape_run(const cfg_t *cfg, store_t *store, uint32_t shard, const embedding_reshape_fence_t *fence,
                          const Chanter__Embedding__V1__ReshapeRequest *req, embedding_reshape_result_t *res, char *why,
                          size_t why_len) {
  memset(res, 0, sizeof *res);
  double t0 = clock_mono_s();
  if (!cfg) return err_set(why, why_len, ERR_PRECONDITION, "this server was started without its job configuration");
  if (req->servers < 1 || req->servers > MANIFEST_MAX_SERVERS)
    return err_set(why, why_len, -EINVAL, "servers = %u: a job has 1 to %d embedding servers", req->servers,
                   MANIFEST_MAX_SERVERS);
  if (req->n_peers != req->servers)
    return err_set(why, why_len, -EINVAL, "%zu peer addresses for %u servers: give one address per server, by shard",
                   req->n_peers, req->servers);
  for (size_t i = 0; i < req->n_peers; i++)
    if (!req->peers[i] || !*req->peers[i])
      return err_set(why, why_len, -EINVAL, "peer address %zu is empty", i);
  uint64_t e = fence ? atomic_load(fence->epoch) : 0;
  if (req->write_epoch && fence && e != req->write_epoch)
    return err_set(why, why_len, ERR_PRECONDITION,
                   "the move is of write epoch %" PRIu64 ", but this server is at %" PRIu64
                   " (it was restored or cleared for another run of the job): refused",
                   req->write_epoch, e);
  table_layout_t l = {0};
  shard_map_t map = {0};
  embc_t *c = NULL;
  char e2[768];
  int rc = cfg_layout(cfg, &l, e2, sizeof e2);
  if (rc) {
    err_set(why, why_len, rc, "the job configuration's layout: %s", e2);
    goto out;
  }
  if ((rc = shard_map_from_cfg(&map, cfg, &l, req->servers, e2, sizeof e2)) != 0) {
    err_set(why, why_len, rc, "cannot place the tables on %u servers: %s", req->servers, e2);
    goto out;
  }
  if ((rc = store_set_shard_map(store, &map, shard, e2, sizeof e2)) != 0) {
    err_set(why, why_len, rc, "%s", e2);
    goto out;
  }
  log_info("reshape: shard map of %u servers taken (this is shard %u%s)", req->servers, shard,
           shard < req->servers ? "" : ", which owns nothing now");
  if (!req->move) goto out;
  if ((rc = embc_create_peers(cfg, req->servers, (const char *const *)req->peers, &c, e2, sizeof e2)) != 0) {
    err_set(why, why_len, rc, "a client of the peers: %s", e2);
    goto out;
  }
  embc_set_write_epoch(c, req->write_epoch);
  rc = move_rows(c, store, &l, req->write_epoch ? fence : NULL, req->write_epoch, res, why, why_len);
  res->seconds = clock_mono_s() - t0;
  if (!rc)
    log_info("reshape: moved rows=%" PRIu64 " bytes=%" PRIu64 " to their owners among %u servers, kept rows=%" PRIu64
             " seconds=%.3f",
             res->rows_moved, res->bytes_moved, req->servers, res->rows_kept, res->seconds);
out:
  res->seconds = clock_mono_s() - t0;
  embc_destroy(c);
  shard_map_close(&map);
  table_layout_close(&l);
  return rc;
}

int embedding_rows_finite(const table_layout_t *l, const Chanter__Embedding__V1__WriteBackRequest *r, char *why,
                          size_t why_len) {
  size_t n = r->keys.len / 8, nf = r->rows.len / 4, o = 0;
  for (size_t i = 0; i < n && o < nf; i++) {
    uint64_t k;
    memcpy(&k, r->keys.data + 8 * i, 8);
    if (TABLE_ID(k) >= l->n_tables) return 0;
    uint32_t f = table_row_floats(l, TABLE_ID(k));
    for (uint32_t j = 0; j < f && o + j < nf; j++) {
      float v;
      memcpy(&v, r->rows.data + 4 * (o + j), 4);
      if (isfinite(v)) continue;
      return err_set(why, why_len, -EINVAL,
                     "rows hold %s at key index %zu (key %u:%llu), float %u of its row (%s): nothing was written",
                     isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", i, (unsigned)TABLE_ID(k),
                     (unsigned long long)TABLE_ROW(k), j, j < l->tables[TABLE_ID(k)].dim ? "vector" : "optimizer state");
    }
    o += f;
  }
  return 0;
}
