/*
 * trainer_eval: evaluation on a trainer (see trainer_eval.h).  Reads the
 * decoded Eval (its samples and fetch keys were checked when it arrived),
 * the key map and the cache, the embedding servers or the local store;
 * changes no parameter.  The waits that make the model "the one after
 * iteration x" on every trainer are the conductor's (trainer_loop.c),
 * except the barrier, which is this stage's own.
 */
#include "trainer_eval.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "trainer_state.h"

void trainer_eval_close(trainer_t *t) {
  free(t->eval.logits);
  t->eval.logits = NULL;
  t->eval.cap = 0;
}

int trainer_eval_sync(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len) {
  const trainer_work_eval_t *ev = &w->eval;
  uint64_t done = atomic_load(&t->exec.last_done);
  if (done != ev->after_iteration + 1)
    log_warn("eval round %" PRIu64 " asks for the model after iteration %" PRIu64 " but this trainer has finished %"
             PRIu64 " iterations; evaluating the current model",
             ev->round, ev->after_iteration, (uint64_t)done);
  if (t->ideal) return 0;
  /* rows this trainer owns are current only here: to the servers first,
   * so that the other trainers read them there */
  int rc = 0;
  size_t n_owned = trainer_kmap_owned(t->kmap, NULL, NULL, 0);
  if (n_owned) {
    uint32_t rf = trainer_step_row_floats(t->ts);
    uint32_t *os = malloc(n_owned * sizeof *os);
    uint64_t *ok = malloc(n_owned * sizeof *ok);
    float *orow = malloc(n_owned * rf * sizeof(float));
    if (!os || !ok || !orow) {
      free(os), free(ok), free(orow);
      return err_set(err, err_len, -ENOMEM, "out of memory writing back %zu owned rows", n_owned);
    }
    trainer_kmap_owned(t->kmap, os, ok, n_owned);
    trainer_step_cache_gather(t->ts, os, n_owned, orow);
    char why[768] = "";
    /* (any key order: embc routes each key); tagged: a fenced server holds it until its checkpoint */
    rc = embc_write_done(t->embc, ok, n_owned, orow, done, why, sizeof why);
    free(os), free(ok), free(orow);
    if (rc) return err_set(err, err_len, rc, "writing back %zu owned rows before evaluating failed: %s", n_owned, why);
  }
  size_t n_partitioned; /* the partitioned tables' rows this trainer updated: the others read them from the servers */
  if ((rc = trainer_partition_flush(&t->partition, t->embc, done, &n_partitioned, err, err_len)) != 0) return rc;
  if ((rc = trainer_sched_barrier(t->join.sched, t->join.coll,
                                  trainer_sched_id(TRAINER_SCHED_NEXT, ev->after_iteration, TRAINER_SCHED_EVAL))) != 0)
    return err_set(err, err_len, rc, "barrier before evaluating failed among %u trainers: %s", t->trainers,
                   err_str(rc));
  return 0;
}

/* With the cache: the slot array holds the rows of keys, from the cache
 * when cached (the key map; one gather, one copy on a GPU), else from the
 * servers. */
static int cache_rows(trainer_t *t, const trainer_work_eval_t *ev, const uint64_t *keys, size_t n, char *err,
                      size_t err_len) {
  float *rows;
  int rc = trainer_step_set_keys(t->ts, keys, n, &rows, err, err_len);
  if (rc || !n) return rc;
  const uint64_t *sk = trainer_step_keys(t->ts);
  uint32_t rf = trainer_step_row_floats(t->ts);
  size_t miss = 0, hit = 0;
  uint64_t *mk = malloc(n * sizeof *mk);
  size_t *mi = malloc(n * sizeof *mi), *hi = malloc(n * sizeof *hi);
  uint32_t *hs = malloc(n * sizeof *hs);
  float *mr = malloc(n * rf * sizeof(float));
  if (!mk || !mi || !hi || !hs || !mr) {
    free(mk), free(mi), free(hi), free(hs), free(mr);
    return err_set(err, err_len, -ENOMEM, "out of memory for %zu evaluation rows", n);
  }
  for (size_t i = 0; i < n; i++) {
    int64_t sl = trainer_kmap_find(t->kmap, sk[i]);
    if (sl >= 0) {
      hs[hit] = (uint32_t)sl;
      hi[hit++] = i;
    } else {
      mk[miss] = sk[i];
      mi[miss++] = i;
    }
  }
  if (hit) {
    trainer_step_cache_gather(t->ts, hs, hit, mr);
    for (size_t j = 0; j < hit; j++) memcpy(rows + hi[j] * rf, mr + j * rf, rf * sizeof(float));
  }
  if (miss && (rc = embc_lookup(t->embc, mk, miss, mr, err, err_len)) == 0)
    for (size_t j = 0; j < miss; j++) memcpy(rows + mi[j] * rf, mr + j * rf, rf * sizeof(float));
  free(mk), free(mi), free(hi), free(hs), free(mr);
  log_debug("eval round=%" PRIu64 " rows=%zu from_cache=%zu fetched=%zu", ev->round, n, hit, miss);
  return rc;
}

int trainer_eval_answer(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len) {
  const trainer_work_eval_t *ev = &w->eval;
  const data_batch_t *b = &w->batch;
  char why[768] = "";
  int rc;
  const uint64_t *keys;
  size_t n;
  if (t->ideal) {
    if ((rc = trainer_step_batch_keys(t->ts, b, &keys, &n)) != 0) return rc;
    if ((rc = trainer_rows_fetch(t->local, t->ts, keys, n, why, sizeof why)) != 0)
      return err_set(err, err_len, rc, "eval round %" PRIu64 ": fetch of %zu rows failed: %s", ev->round, n, why);
  } else {
    keys = ev->fetch_keys;
    n = ev->n_fetch;
    if ((rc = cache_rows(t, ev, keys, n, why, sizeof why)) != 0)
      return err_set(err, err_len, rc, "eval round %" PRIu64 ": %s", ev->round, why);
  }
  trainer_eval_t *e = &t->eval;
  if (b->n + 1 > e->cap) {
    float *l = realloc(e->logits, (b->n + 1) * sizeof(float));
    if (!l) return -ENOMEM;
    e->logits = l;
    e->cap = b->n + 1;
  }
  if ((rc = trainer_step_eval(t->ts, b, e->logits, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "eval round %" PRIu64 ": %s", ev->round, why);
  Chanter__Oracle__V1__EvalResult r = CHANTER__ORACLE__V1__EVAL_RESULT__INIT;
  r.round = ev->round;
  r.logits.data = (uint8_t *)e->logits;
  r.logits.len = (size_t)b->n * sizeof(float);
  r.labels.data = (uint8_t *)b->labels;
  r.labels.len = (size_t)b->n * sizeof(float);
  if ((rc = orc_work_eval(t->stream, &r)) != 0 && (t->write_failed = 1))
    return err_set(err, err_len, rc, "eval round %" PRIu64 ": cannot send the EvalResult to the oracle at %s: %s",
                   ev->round, orc_address(t->orc), err_str(rc));
  metrics_counter_inc(t->m.evals);
  log_debug("eval round=%" PRIu64 " samples=%u rows=%zu", ev->round, b->n, n);
  return 0;
}
