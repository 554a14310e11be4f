/*
 * fuzz_trainer_work: the trainer's WorkItem decoder, trainer_work_decode
 * (services/trainer/trainer_work.c), which checks every Step, Eval,
 * StopWork, CheckpointWork and ResumeWork the oracle streams before the
 * trainer uses it.  The bytes are unpacked as a WorkItem (as the trainer's
 * orc client does) and decoded against limits like those trainer_create
 * sets (trainer_loop.c) for a small job: 2 dense features, 3 tables of
 * hotness 1, 2, 1, at most 64 samples a step, 2 trainers, and 256 cache
 * slots -- or no cache (mode = ideal) when the first byte is odd.  A
 * decoded item's arrays are walked to their stated lengths, under ASan.
 */
#include "fuzz_util.h"
#include "trainer_work.h"

static uint32_t hot[3] = {1, 2, 1};
static uint64_t rows[3] = {100, 200, 300};
static const data_schema_t schema = {.n_dense = 2, .n_tables = 3, .hotness = hot, .table_rows = rows, .hash_seed = 0};

static uint64_t sum32(const uint32_t *p, size_t n, uint64_t below) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) {
    if (below) FUZZ_CHECK(p[i] < below);
    s += p[i];
  }
  return s;
}
static uint64_t sum64(const uint64_t *p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += p[i];
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (size < 1) return 0;
  trainer_work_limits_t lim = {.schema = &schema, .max_batch = 64, .cache_rows = (data[0] & 1) ? 0 : 256, .trainers = 2};
  Chanter__Oracle__V1__WorkItem *item = chanter__oracle__v1__work_item__unpack(NULL, size - 1, data + 1);
  if (!item) return 0;
  trainer_work_t w;
  char err[512];
  memset(&w, 0, sizeof w);
  if (trainer_work_decode(item, &lim, &w, err, sizeof err) == 0) {
    volatile uint64_t s = 0;
    const data_batch_t *b = &w.batch;
    if (w.kind == TRAINER_WORK_STEP || w.kind == TRAINER_WORK_EVAL) {
      FUZZ_CHECK(b->n_tables == schema.n_tables && (b->n == 0 || b->n_dense == schema.n_dense));
      if (w.kind == TRAINER_WORK_STEP) FUZZ_CHECK(b->n <= lim.max_batch);
      for (uint32_t i = 0; i < b->n; i++) s += (uint64_t)b->labels[i];
      for (size_t i = 0; i < (size_t)b->n * b->n_dense; i++) s += (uint64_t)b->dense[i];
      if (b->n) s += sum64(b->ids, data_batch_n_ids(b));
    }
    if (w.kind == TRAINER_WORK_STEP && lim.cache_rows) {
      const trainer_work_step_t *st = &w.step;
      uint64_t c = lim.cache_rows;
      if (b->n) s += sum32(st->slots, data_batch_n_ids(b), c);
      s += sum64(st->fetch_keys, st->n_fetch) + sum32(st->fetch_slots, st->n_fetch, c);
      s += sum64(st->write_back_keys, st->n_write_back) + sum32(st->write_back_slots, st->n_write_back, c);
      s += sum32(st->sync_critical, st->n_critical, c) + sum32(st->sync_delayed, st->n_delayed, c);
      s += sum32(st->evict_slots, st->n_evict, c) + sum32(st->owned_slots, st->n_owned_slots, c);
      s += sum32(st->stale_slots, st->n_stale, c) + sum32(st->replicate_slots, st->n_replicate, c);
      s += sum32(st->replicate_owners, st->n_replicate, lim.trainers) + sum64(st->replicate_keys, st->n_replicate);
    }
    if (w.kind == TRAINER_WORK_EVAL) s += sum64(w.eval.fetch_keys, w.eval.n_fetch);
    if (w.kind == TRAINER_WORK_STOP) s += strlen(w.stop.reason) + strlen(w.stop.job_state);
    if (w.kind == TRAINER_WORK_CHECKPOINT) {
      s += strlen(w.checkpoint.id) + strlen(w.checkpoint.dense_blob);
      s += sum64(w.checkpoint.flush_keys, w.checkpoint.n_flush) + sum32(w.checkpoint.flush_slots, w.checkpoint.n_flush, 0);
    }
    if (w.kind == TRAINER_WORK_RESUME) s += strlen(w.resume.id) + strlen(w.resume.dense_blob);
    (void)s;
    trainer_work_close(&w);
  }
  chanter__oracle__v1__work_item__free_unpacked(item, NULL);
  return 0;
}
