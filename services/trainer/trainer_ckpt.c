/*
 * trainer_ckpt: see trainer_ckpt.h.
 */
#include "trainer_ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "embedding.pb-c.h"
#include "err.h"
#include "le.h"
#include "log.h"
#include "opt.h"
#include "trainer_state.h"

#define DENSE_MAGIC "CHDENSE1"
#define DENSE_HEAD (8 + 4 + 8 + 8 + 8)


/* (float32 arrays travel as their bytes: the project assumes a
 * little-endian host, as the wire format does) */
int trainer_ckpt_dense_encode(trainer_step_t *ts, uint8_t **buf, size_t *len) {
  opt_t *o = trainer_step_dense_opt(ts);
  size_t np = trainer_step_n_params(ts), ns = opt_state_floats(o);
  size_t n = DENSE_HEAD + (np + ns) * sizeof(float) + 32;
  /* device = cuda: the parameters and the optimizer state come from the GPU */
  int rc = trainer_step_dense_sync(ts);
  if (rc) return rc;
  uint8_t *b = malloc(n);
  if (!b) return -ENOMEM;
  memcpy(b, DENSE_MAGIC, 8);
  put_le32(b + 8, (uint32_t)opt_kind(o));
  put_le64(b + 12, opt_steps(o));
  put_le64(b + 20, np);
  put_le64(b + 28, ns);
  memcpy(b + DENSE_HEAD, trainer_step_params(ts), np * sizeof(float));
  if (ns) memcpy(b + DENSE_HEAD + np * sizeof(float), opt_state(o), ns * sizeof(float));
  unsigned hl = 0;
  EVP_Digest(b, n - 32, b + n - 32, &hl, EVP_sha256(), NULL);
  *buf = b;
  *len = n;
  return 0;
}

int trainer_ckpt_dense_decode(trainer_step_t *ts, const uint8_t *b, size_t len, char *err, size_t err_len) {
  opt_t *o = trainer_step_dense_opt(ts);
  size_t np = trainer_step_n_params(ts), ns = opt_state_floats(o);
  if (len < DENSE_HEAD + 32 || memcmp(b, DENSE_MAGIC, 8) != 0)
    return err_set(err, err_len, ERR_BADMSG, "the dense state blob (%zu bytes) is not one chanter wrote (bad magic or too short)",
                   len);
  uint8_t h[32];
  unsigned hl = 0;
  EVP_Digest(b, len - 32, h, &hl, EVP_sha256(), NULL);
  if (memcmp(h, b + len - 32, 32) != 0)
    return err_set(err, err_len, ERR_BADMSG, "the dense state blob (%zu bytes) is damaged: its SHA-256 does not match", len);
  uint32_t kind = get_le32(b + 8);
  uint64_t steps = get_le64(b + 12), bp = get_le64(b + 20), bs = get_le64(b + 28);
  if (kind != (uint32_t)opt_kind(o))
    return err_set(err, err_len, ERR_CONFIG,
                   "the checkpoint's dense optimizer is %s but this job's optimizer is %s: resume with the same optimizer",
                   kind < 16 ? opt_kind_name((opt_kind_t)kind) : "unknown", opt_kind_name(opt_kind(o)));
  if (bp != np || bs != ns)
    return err_set(err, err_len, ERR_CONFIG,
                   "the checkpoint's model has %" PRIu64 " dense parameters (%" PRIu64 " optimizer state floats) but this "
                   "job's model has %zu (%zu): resume with the same model",
                   bp, bs, np, ns);
  if (len != DENSE_HEAD + (np + ns) * sizeof(float) + 32)
    return err_set(err, err_len, ERR_BADMSG, "the dense state blob has %zu bytes, want %zu", len,
                   DENSE_HEAD + (np + ns) * sizeof(float) + 32);
  memcpy(trainer_step_params(ts), b + DENSE_HEAD, np * sizeof(float));
  if (ns) memcpy(opt_state(o), b + DENSE_HEAD + np * sizeof(float), ns * sizeof(float));
  opt_set_steps(o, steps);
  int rc = trainer_step_dense_changed(ts); /* device = cuda: both to the GPU */
  if (rc) return err_set(err, err_len, rc, "loading the dense state onto the device failed: %s", err_str(rc));
  return 0;
}

int trainer_ckpt_take(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len) {
  const trainer_work_checkpoint_t *ck = &w->checkpoint;
  double t0 = clock_mono_s();
  char why[768] = "";
  int rc = 0;
  uint64_t done = atomic_load(&t->exec.last_done);
  if (done != ck->iteration + 1)
    return err_set(err, err_len, ERR_BADMSG,
                   "checkpoint %s is for the model after iteration %" PRIu64 " but this trainer has finished %" PRIu64
                   " iterations",
                   ck->id, ck->iteration, done);
  /* the rows newer than the servers' copy that this trainer writes back: they stay cached */
  if (ck->n_flush) {
    uint32_t rf = trainer_step_row_floats(t->ts);
    float *rows = malloc(ck->n_flush * rf * sizeof(float));
    if (!rows) return err_set(err, err_len, -ENOMEM, "checkpoint %s: out of memory for %zu rows", ck->id, ck->n_flush);
    trainer_step_cache_gather(t->ts, ck->flush_slots, ck->n_flush, rows);
    rc = embc_write_done(t->embc, ck->flush_keys, ck->n_flush, rows, ck->iteration + 1, why, sizeof why);
    free(rows);
    if (rc)
      return err_set(err, err_len, rc, "checkpoint %s: writing back %zu cached rows failed: %s", ck->id, ck->n_flush,
                     why);
  }
  /* the partitioned tables' rows this trainer updated since its last flush */
  size_t n_partitioned;
  if ((rc = trainer_partition_flush(&t->partition, t->embc, ck->iteration + 1, &n_partitioned, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "checkpoint %s: %s", ck->id, why);
  /* the dense state, once for the job */
  size_t dense_bytes = 0;
  if (*ck->dense_blob) {
    uint8_t *buf;
    if ((rc = trainer_ckpt_dense_encode(t->ts, &buf, &dense_bytes)) != 0)
      return err_set(err, err_len, rc, "checkpoint %s: cannot encode the dense state: %s", ck->id,
                     rc == -ENOMEM ? "out of memory" : err_str(rc));
    if (ck->dense_server >= embc_servers(t->embc)) {
      free(buf);
      return err_set(err, err_len, ERR_BADMSG, "checkpoint %s: dense_server %u, but the job has %u embedding servers",
                     ck->id, ck->dense_server, embc_servers(t->embc));
    }
    Chanter__Embedding__V1__PutBlobRequest req = CHANTER__EMBEDDING__V1__PUT_BLOB_REQUEST__INIT;
    req.name = (char *)ck->dense_blob;
    req.data.data = buf;
    req.data.len = dense_bytes;
    Chanter__Embedding__V1__PutBlobResponse *resp = NULL;
    rc = embc_put_blob(t->embc, ck->dense_server, &req, &resp, why, sizeof why);
    free(buf);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (rc)
      return err_set(err, err_len, rc, "checkpoint %s: storing the dense state (%zu bytes) on embedding server %u failed: %s",
                     ck->id, dense_bytes, ck->dense_server, why);
  }
  Chanter__Oracle__V1__CheckpointDone d = CHANTER__ORACLE__V1__CHECKPOINT_DONE__INIT;
  d.id = (char *)ck->id;
  d.iteration = ck->iteration;
  d.rows_flushed = ck->n_flush;
  d.dense_bytes = dense_bytes;
  d.seconds = clock_mono_s() - t0;
  log_info("checkpoint part done rank=%u id=%s iteration=%" PRIu64 " rows_flushed=%zu dense_bytes=%zu ms=%.1f", t->rank,
           ck->id, ck->iteration, ck->n_flush, dense_bytes, 1e3 * d.seconds);
  if ((rc = orc_work_checkpoint_done(t->stream, &d)) != 0 && (t->write_failed = 1))
    return err_set(err, err_len, rc, "checkpoint %s: cannot tell the oracle: %s", ck->id, err_str(rc));
  return 0;
}

int trainer_ckpt_resume(trainer_t *t, const trainer_work_t *w, uint64_t *expect, char *err, size_t err_len) {
  const trainer_work_resume_t *r = &w->resume;
  char why[768] = "";
  if (*expect != 0)
    return err_set(err, err_len, ERR_BADMSG, "a resume item after %" PRIu64 " iterations: only a job's first item may resume it",
                   *expect);
  if (t->ideal || r->dense_server >= embc_servers(t->embc))
    return err_set(err, err_len, ERR_BADMSG, "resume from %s: dense_server %u is not one of the job's embedding servers",
                   r->id, r->dense_server);
  Chanter__Embedding__V1__GetBlobRequest req = CHANTER__EMBEDDING__V1__GET_BLOB_REQUEST__INIT;
  req.name = (char *)r->dense_blob;
  Chanter__Embedding__V1__GetBlobResponse *g = NULL;
  int rc = embc_get_blob(t->embc, r->dense_server, &req, &g, why, sizeof why);
  if (rc)
    return err_set(err, err_len, rc, "resume from %s: reading the dense state (blob %s) from embedding server %u failed: %s",
                   r->id, r->dense_blob, r->dense_server, why);
  rc = trainer_ckpt_dense_decode(t->ts, g->data.data, g->data.len, why, sizeof why);
  protobuf_c_message_free_unpacked(&g->base, NULL);
  if (rc) return err_set(err, err_len, rc, "resume from %s: %s", r->id, why);
  atomic_store(&t->exec.last_done, r->start_iteration);
  *expect = r->start_iteration;
  log_info("resumed rank=%u checkpoint=%s start_iteration=%" PRIu64 " (dense state loaded, cache empty)", t->rank, r->id,
           r->start_iteration);
  return 0;
}
