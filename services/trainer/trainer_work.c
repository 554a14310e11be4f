/*
 * trainer_work: see trainer_work.h.  Each decode runs in two parts: every
 * check first (no allocation), then one block is sized and filled by the
 * same lay-out function run twice (once with no memory, counting; once
 * copying), so the decoded arrays and the checks cannot disagree on a
 * length.
 */
#include "trainer_work.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "batch_pb.h"
#include "err.h"
#include "strategy.h"

/* ------------------------------------------------------------------ checks */

/* A field of uint64 keys: a whole number of them.  *n: how many. */
static int keys_field(const ProtobufCBinaryData *f, const char *name, uint64_t x, size_t *n, char *err,
                      size_t err_len) {
  if (f->len % 8)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, not a multiple of 8", x, name,
                   f->len);
  *n = f->len / 8;
  return 0;
}

/* A field of uint32 slots: want of them (SIZE_MAX: any number), each
 * inside the cache.  *n: how many. */
static int slots_field(const trainer_work_limits_t *lim, const ProtobufCBinaryData *f, size_t want, const char *name,
                       uint64_t x, size_t *n, char *err, size_t err_len) {
  if (want != SIZE_MAX && f->len != want * 4)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, want %zu (4 per entry)", x,
                   name, f->len, want * 4);
  if (f->len % 4)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": %s has %zu bytes, not a multiple of 4", x, name,
                   f->len);
  for (size_t i = 0; i < f->len / 4; i++) {
    uint32_t s;
    memcpy(&s, f->data + 4 * i, 4);
    if (s >= lim->cache_rows)
      return err_set(err, err_len, ERR_BADMSG,
                     "iteration %" PRIu64 ": %s[%zu] = slot %u, beyond the cache of %" PRIu64 " rows", x, name, i, s,
                     lim->cache_rows);
  }
  *n = f->len / 4;
  return 0;
}

/* The samples against the schema (batch_pb.h); *n samples with *n_ids ids
 * in all. */
static int check_samples(const Chanter__Oracle__V1__Samples *s, const trainer_work_limits_t *lim, int allow_large,
                         uint32_t *n_out, size_t *n_ids_out, char *err, size_t err_len) {
  return batch_pb_check_samples(s, lim->schema, allow_large ? UINT32_MAX : lim->max_batch, n_out, n_ids_out, err,
                                err_len);
}

/* ------------------------------------------------------------------ the block */

/* Run once with mem == NULL (adds up size), then with mem (copies). */
typedef struct block_s {
  uint8_t *mem;
  size_t size, off;
} block_t;

static size_t al8(size_t n) { return (n + 7) & ~(size_t)7; }

/* len bytes of src (NULL: uninitialized room) in the block; NULL when
 * counting. */
static void *put(block_t *b, const void *src, size_t len) {
  if (!b->mem) {
    b->size += al8(len);
    return NULL;
  }
  void *p = b->mem + b->off; /* (never NULL, even for 0 bytes) */
  if (len && src) memcpy(p, src, len);
  b->off += al8(len);
  return p;
}

static const void *put_field(block_t *b, const ProtobufCBinaryData *f) { return put(b, f->data, f->len); }

static int block_alloc(block_t *b, char *err, size_t err_len) {
  b->mem = malloc(b->size ? b->size : 1);
  b->off = 0;
  if (!b->mem) return err_set(err, err_len, -ENOMEM, "out of memory for a work item of %zu bytes", b->size);
  return 0;
}

/* The samples (n of them, checked) as the step's batch: a view into the
 * block (batch_pb_lay_out_samples), batch number x of split. */
static void lay_out_samples(block_t *b, const Chanter__Oracle__V1__Samples *s, uint32_t n, uint64_t x, int split,
                            const trainer_work_limits_t *lim, data_batch_t *out) {
  void *mem = put(b, NULL, batch_pb_samples_bytes(n, lim->schema));
  if (!mem) return;
  batch_pb_lay_out_samples(s, n, lim->schema, mem, out);
  out->iteration = x;
  out->split = split;
}

/* ------------------------------------------------------------------ Step */

/* A Step of a job that partitions tables (checked: partition_fields): the
 * owners, the counts, the slots of every id (CACHER_NO_SLOT for a
 * partitioned table's) and the ids of the global batch of the tables we
 * hold, our own samples' taken from the batch laid out already. */
static void lay_out_partitioned(block_t *b, const Chanter__Oracle__V1__Step *st, uint32_t n,
                                const trainer_work_limits_t *lim, trainer_work_t *w) {
  trainer_work_step_t *s = &w->step;
  const data_schema_t *sc = lim->schema;
  size_t n_ids = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) n_ids += (size_t)n * sc->hotness[t];
  uint32_t *slots = put(b, NULL, n_ids * 4);
  s->partition_owner = put_field(b, &st->partition_owner);
  s->partition_counts = put_field(b, &st->partition_counts);
  uint64_t *ids = put(b, NULL, s->n_partition_ids * 8);
  s->slots = slots;
  s->partition_ids = ids;
  if (!b->mem) return;
  const data_batch_t *bt = &w->batch;
  size_t k = 0, i = 0, wi = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) {
    uint32_t o = s->partition_owner[t];
    size_t m = (size_t)n * sc->hotness[t];
    uint32_t *dst = slots + (n ? bt->ids_off[t] : 0);
    if (o == STRATEGY_OWNER_NONE) {
      memcpy(dst, st->slots.data + 4 * k, m * 4);
      k += m;
    } else {
      for (size_t j = 0; j < m; j++) dst[j] = UINT32_MAX; /* CACHER_NO_SLOT */
    }
    if (!strategy_holds(o, lim->rank)) continue;
    for (uint32_t q = 0; q < lim->trainers; q++) {
      size_t mq = (size_t)s->partition_counts[q] * sc->hotness[t];
      if (!mq) continue;
      if (q == lim->rank) memcpy(ids + i, bt->ids + bt->ids_off[t], mq * 8);
      else memcpy(ids + i, st->partition_ids.data + 8 * wi, mq * 8), wi += mq;
      i += mq;
    }
  }
}

static void lay_out_step(block_t *b, const Chanter__Oracle__V1__Step *st, uint32_t n, const trainer_work_limits_t *lim,
                         trainer_work_t *w) {
  lay_out_samples(b, st->samples, n, st->iteration, DATA_TRAIN, lim, &w->batch);
  if (!lim->cache_rows) return;
  trainer_work_step_t *s = &w->step;
  if (st->partition_owner.len) lay_out_partitioned(b, st, n, lim, w);
  else s->slots = put_field(b, &st->slots);
  s->fetch_keys = put_field(b, &st->fetch_keys);
  s->fetch_slots = put_field(b, &st->fetch_slots);
  s->write_back_keys = put_field(b, &st->write_back_keys);
  s->write_back_slots = put_field(b, &st->write_back_slots);
  s->sync_critical = put_field(b, &st->sync_critical);
  s->sync_delayed = put_field(b, &st->sync_delayed);
  s->evict_slots = put_field(b, &st->evict_slots);
  s->owned_slots = put_field(b, &st->owned_slots);
  s->stale_slots = put_field(b, &st->stale_slots);
  s->replicate_slots = put_field(b, &st->replicate_slots);
  s->replicate_owners = put_field(b, &st->replicate_owners);
  s->replicate_keys = put_field(b, &st->replicate_keys);
}

/* The partitioned tables' fields (strategy.h), when partition_owner is not empty:
 * an owner per table (a rank, STRATEGY_OWNER_ALL for partition_rows, or
 * STRATEGY_OWNER_NONE), a count per trainer adding up to the global batch with
 * ours = n; the ids of the whole batch of the tables we hold rows of less
 * our own samples' (which the samples carry), each inside its table, ours
 * included; then the slots of the cached tables' ids only, each inside the
 * cache.  The decoded Step has both in full (lay_out_step): slots for every
 * id (CACHER_NO_SLOT for a partitioned table's), partition_ids with our
 * samples' in place; an index in an error is one of these full arrays. */
static int partition_fields(const Chanter__Oracle__V1__Step *st, const trainer_work_limits_t *lim, uint32_t n,
                       trainer_work_step_t *s, char *err, size_t err_len) {
  const data_schema_t *sc = lim->schema;
  uint64_t x = st->iteration;
  if (st->partition_owner.len != (size_t)sc->n_tables * 4)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": partition_owner has %zu bytes, want %u (4 per table)",
                   x, st->partition_owner.len, sc->n_tables * 4);
  if (st->partition_counts.len != (size_t)lim->trainers * 4)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": partition_counts has %zu bytes, want %u (4 per trainer)", x, st->partition_counts.len,
                   lim->trainers * 4);
  uint64_t sum = 0, want = 0, want_slots = 0;
  for (uint32_t q = 0; q < lim->trainers; q++) {
    uint32_t c;
    memcpy(&c, st->partition_counts.data + 4 * q, 4);
    if (q == lim->rank && c != n)
      return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": partition_counts says %u samples for rank %u, the "
                     "step has %u", x, c, q, n);
    sum += c;
  }
  if (sum != st->global_batch)
    return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": partition_counts add up to %" PRIu64
                   ", global_batch is %u", x, sum, st->global_batch);
  for (uint32_t t = 0; t < sc->n_tables; t++) {
    uint32_t o;
    memcpy(&o, st->partition_owner.data + 4 * t, 4);
    if (o != STRATEGY_OWNER_NONE && o != STRATEGY_OWNER_ALL && o >= lim->trainers)
      return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": partition_owner[%u] = %u, only %u trainers", x, t, o,
                     lim->trainers);
    if (strategy_holds(o, lim->rank)) want += (sum - n) * sc->hotness[t];
    if (o == STRATEGY_OWNER_NONE) want_slots += (uint64_t)n * sc->hotness[t];
  }
  if (st->partition_ids.len != want * 8)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": partition_ids has %zu bytes, want %" PRIu64 " (the global batch's ids of the "
                   "tables rank %u holds rows of, less its own samples', 8 each)", x, st->partition_ids.len, want * 8,
                   lim->rank);
  if (st->slots.len != want_slots * 4)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": slots has %zu bytes, want %" PRIu64 " (4 per id of the cached tables)", x,
                   st->slots.len, want_slots * 4);
  const uint8_t *own = st->samples && n ? st->samples->ids.data : NULL; /* table by table, n * hotness each */
  size_t i = 0, k = 0, w = 0, full = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) {
    uint32_t o;
    memcpy(&o, st->partition_owner.data + 4 * t, 4);
    size_t m = (size_t)n * sc->hotness[t];
    for (size_t j = 0; o == STRATEGY_OWNER_NONE && j < m; j++, k++) { /* the cached tables' slots */
      uint32_t sl;
      memcpy(&sl, st->slots.data + 4 * k, 4);
      if (sl >= lim->cache_rows)
        return err_set(err, err_len, ERR_BADMSG,
                       "iteration %" PRIu64 ": slots[%zu] = %u for table %u, beyond the cache of %" PRIu64 " rows", x,
                       full + j, sl, t, lim->cache_rows);
    }
    if (strategy_holds(o, lim->rank)) {
      for (uint32_t q = 0; q < lim->trainers; q++) {
        uint32_t c;
        memcpy(&c, st->partition_counts.data + 4 * q, 4);
        size_t mq = (size_t)c * sc->hotness[t];
        for (size_t j = 0; j < mq; j++, i++) {
          uint64_t id;
          if (q == lim->rank) memcpy(&id, own + 8 * (full + j), 8);
          else memcpy(&id, st->partition_ids.data + 8 * w++, 8);
          if (id >= sc->table_rows[t])
            return err_set(err, err_len, ERR_BADMSG,
                           "iteration %" PRIu64 ": partition_ids[%zu] = %" PRIu64 " for table %u of %" PRIu64 " rows%s",
                           x, i, id, t, sc->table_rows[t], q == lim->rank ? " (one of this trainer's samples)" : "");
        }
      }
    }
    full += m;
  }
  s->n_partition_ids = i;
  return 0;
}

/* The checks in the order the trainer meets the fields: the prefetch's,
 * the samples', the step's lists, then ownership. */
static int decode_step(const Chanter__Oracle__V1__Step *st, const trainer_work_limits_t *lim, trainer_work_t *w,
                       char *err, size_t err_len) {
  trainer_work_step_t *s = &w->step;
  uint64_t x = st->iteration;
  int rc, cache = lim->cache_rows != 0;
  if (cache && ((rc = keys_field(&st->fetch_keys, "fetch_keys", x, &s->n_fetch, err, err_len)) != 0 ||
                (rc = slots_field(lim, &st->fetch_slots, s->n_fetch, "fetch_slots", x, &s->n_fetch, err, err_len)) != 0))
    return rc;
  uint32_t n;
  size_t n_ids;
  char why[768] = "";
  if ((rc = check_samples(st->samples, lim, 0, &n, &n_ids, why, sizeof why)) != 0)
    return err_set(err, err_len, rc, "iteration %" PRIu64 ": bad samples: %s", x, why);
  if (n && st->global_batch < n)
    return err_set(err, err_len, ERR_BADMSG,
                   "iteration %" PRIu64 ": global_batch %u is smaller than this trainer's %u samples", x,
                   st->global_batch, n);
  if (cache) {
    size_t n_slots;
    if ((rc = st->partition_owner.len ? partition_fields(st, lim, n, s, err, err_len)
                                 : slots_field(lim, &st->slots, n ? n_ids : 0, "slots", x, &n_slots, err, err_len)) ||
        (rc = keys_field(&st->write_back_keys, "write_back_keys", x, &s->n_write_back, err, err_len)) ||
        (rc = slots_field(lim, &st->write_back_slots, s->n_write_back, "write_back_slots", x, &s->n_write_back, err,
                          err_len)) ||
        (rc = slots_field(lim, &st->sync_critical, SIZE_MAX, "sync_critical", x, &s->n_critical, err, err_len)) ||
        (rc = slots_field(lim, &st->sync_delayed, SIZE_MAX, "sync_delayed", x, &s->n_delayed, err, err_len)) ||
        (rc = slots_field(lim, &st->evict_slots, SIZE_MAX, "evict_slots", x, &s->n_evict, err, err_len)) ||
        (rc = slots_field(lim, &st->owned_slots, SIZE_MAX, "owned_slots", x, &s->n_owned_slots, err, err_len)) ||
        (rc = slots_field(lim, &st->stale_slots, SIZE_MAX, "stale_slots", x, &s->n_stale, err, err_len)) ||
        (rc = slots_field(lim, &st->replicate_slots, SIZE_MAX, "replicate_slots", x, &s->n_replicate, err, err_len)))
      return rc;
    size_t nr = s->n_replicate;
    if (st->replicate_owners.len != nr * 4 || st->replicate_keys.len != nr * 8)
      return err_set(err, err_len, ERR_BADMSG,
                     "iteration %" PRIu64 ": %zu replicate slots but %zu owner bytes and %zu key bytes", x, nr,
                     st->replicate_owners.len, st->replicate_keys.len);
    for (size_t i = 0; i < nr; i++) {
      uint32_t o;
      memcpy(&o, st->replicate_owners.data + 4 * i, 4);
      if (o >= lim->trainers)
        return err_set(err, err_len, ERR_BADMSG, "iteration %" PRIu64 ": replicate_owners[%zu] = %u, only %u trainers",
                       x, i, o, lim->trainers);
    }
  }
  s->iteration = x;
  s->global_batch_size = st->global_batch;
  s->prefetch_gate = st->prefetch_gate;
  s->write_epoch = st->write_epoch;
  s->lookahead = st->lookahead;
  s->cache_hits = st->cache_hits;
  block_t b = {0};
  lay_out_step(&b, st, n, lim, w);
  if ((rc = block_alloc(&b, err, err_len)) != 0) return rc;
  lay_out_step(&b, st, n, lim, w);
  w->mem = b.mem;
  return 0;
}

/* ------------------------------------------------------------------ Eval, StopWork */

static void lay_out_eval(block_t *b, const Chanter__Oracle__V1__Eval *ev, uint32_t n, const trainer_work_limits_t *lim,
                         trainer_work_t *w) {
  lay_out_samples(b, ev->samples, n, 0, DATA_TEST, lim, &w->batch);
  w->eval.fetch_keys = put_field(b, &ev->fetch_keys);
}

static int decode_eval(const Chanter__Oracle__V1__Eval *ev, const trainer_work_limits_t *lim, trainer_work_t *w,
                       char *err, size_t err_len) {
  uint32_t n;
  size_t n_ids;
  char why[768] = "";
  int rc = check_samples(ev->samples, lim, 1, &n, &n_ids, why, sizeof why);
  if (rc) return err_set(err, err_len, rc, "eval round %" PRIu64 ": bad samples: %s", ev->round, why);
  if ((rc = keys_field(&ev->fetch_keys, "fetch_keys", ev->after_iteration, &w->eval.n_fetch, err, err_len)) != 0)
    return rc;
  w->eval.round = ev->round;
  w->eval.after_iteration = ev->after_iteration;
  block_t b = {0};
  lay_out_eval(&b, ev, n, lim, w);
  if ((rc = block_alloc(&b, err, err_len)) != 0) return rc;
  lay_out_eval(&b, ev, n, lim, w);
  w->mem = b.mem;
  return 0;
}

static int decode_stop(const Chanter__Oracle__V1__StopWork *sw, trainer_work_t *w, char *err, size_t err_len) {
  const char *reason = sw->reason ? sw->reason : "", *state = sw->job_state ? sw->job_state : "";
  block_t b = {0};
  for (int pass = 0; pass < 2; pass++) {
    w->stop.reason = put(&b, reason, strlen(reason) + 1);
    w->stop.job_state = put(&b, state, strlen(state) + 1);
    int rc;
    if (!pass && (rc = block_alloc(&b, err, err_len)) != 0) return rc;
  }
  w->mem = b.mem;
  return 0;
}

/* ------------------------------------------------------------------ CheckpointWork, ResumeWork */

static int decode_checkpoint(const Chanter__Oracle__V1__CheckpointWork *cw, const trainer_work_limits_t *lim,
                             trainer_work_t *w, char *err, size_t err_len) {
  const char *id = cw->id ? cw->id : "", *blob = cw->dense_blob ? cw->dense_blob : "";
  uint64_t x = cw->iteration;
  size_t nk = 0, ns = 0;
  int rc;
  if (!*id) return err_set(err, err_len, ERR_BADMSG, "checkpoint after iteration %" PRIu64 ": no id", x);
  if ((rc = keys_field(&cw->flush_keys, "flush_keys", x, &nk, err, err_len)) != 0 ||
      (rc = slots_field(lim, &cw->flush_slots, nk, "flush_slots", x, &ns, err, err_len)) != 0)
    return rc;
  block_t b = {0};
  for (int pass = 0; pass < 2; pass++) {
    w->checkpoint.id = put(&b, id, strlen(id) + 1);
    w->checkpoint.dense_blob = put(&b, blob, strlen(blob) + 1);
    w->checkpoint.flush_keys = put_field(&b, &cw->flush_keys);
    w->checkpoint.flush_slots = put_field(&b, &cw->flush_slots);
    if (!pass && (rc = block_alloc(&b, err, err_len)) != 0) return rc;
  }
  w->checkpoint.iteration = x;
  w->checkpoint.dense_server = cw->dense_server;
  w->checkpoint.n_flush = nk;
  w->mem = b.mem;
  return 0;
}

static int decode_resume(const Chanter__Oracle__V1__ResumeWork *rw, trainer_work_t *w, char *err, size_t err_len) {
  const char *id = rw->id ? rw->id : "", *blob = rw->dense_blob ? rw->dense_blob : "";
  if (!*id || !*blob || rw->start_iteration == 0)
    return err_set(err, err_len, ERR_BADMSG,
                   "a resume item needs a checkpoint id, a dense blob and a start iteration >= 1 (got id \"%s\", "
                   "blob \"%s\", start %" PRIu64 ")",
                   id, blob, rw->start_iteration);
  block_t b = {0};
  for (int pass = 0; pass < 2; pass++) {
    w->resume.id = put(&b, id, strlen(id) + 1);
    w->resume.dense_blob = put(&b, blob, strlen(blob) + 1);
    int rc;
    if (!pass && (rc = block_alloc(&b, err, err_len)) != 0) return rc;
  }
  w->resume.start_iteration = rw->start_iteration;
  w->resume.dense_server = rw->dense_server;
  w->resume.write_epoch = rw->write_epoch;
  w->mem = b.mem;
  return 0;
}

/* ------------------------------------------------------------------ API */

int trainer_work_decode(const Chanter__Oracle__V1__WorkItem *item, const trainer_work_limits_t *lim,
                        trainer_work_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  int rc;
  switch (item->kind_case) {
  case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP:
    out->kind = TRAINER_WORK_STEP;
    rc = decode_step(item->step, lim, out, err, err_len);
    break;
  case CHANTER__ORACLE__V1__WORK_ITEM__KIND_EVAL:
    out->kind = TRAINER_WORK_EVAL;
    rc = decode_eval(item->eval, lim, out, err, err_len);
    break;
  case CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP:
    out->kind = TRAINER_WORK_STOP;
    rc = decode_stop(item->stop, out, err, err_len);
    break;
  case CHANTER__ORACLE__V1__WORK_ITEM__KIND_CHECKPOINT:
    out->kind = TRAINER_WORK_CHECKPOINT;
    rc = decode_checkpoint(item->checkpoint, lim, out, err, err_len);
    break;
  case CHANTER__ORACLE__V1__WORK_ITEM__KIND_RESUME:
    out->kind = TRAINER_WORK_RESUME;
    rc = decode_resume(item->resume, out, err, err_len);
    break;
  default:
    rc = err_set(err, err_len, ERR_BADMSG, "the oracle sent an empty or unknown work item (kind %d)",
                 (int)item->kind_case);
    break;
  }
  if (rc) { /* owns nothing, says what it was */
    trainer_work_kind_t kind = out->kind;
    trainer_work_close(out);
    out->kind = kind;
  }
  return rc;
}

int trainer_work_decode_samples(const Chanter__Oracle__V1__Samples *s, const trainer_work_limits_t *lim,
                                int allow_large, trainer_work_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  uint32_t n;
  size_t n_ids;
  int rc = check_samples(s, lim, allow_large, &n, &n_ids, err, err_len);
  if (rc) return rc;
  block_t b = {0};
  lay_out_samples(&b, s, n, 0, DATA_TRAIN, lim, &out->batch);
  if ((rc = block_alloc(&b, err, err_len)) != 0) return rc;
  lay_out_samples(&b, s, n, 0, DATA_TRAIN, lim, &out->batch);
  out->mem = b.mem;
  return 0;
}

void trainer_work_close(trainer_work_t *w) {
  if (!w) return;
  free(w->mem);
  memset(w, 0, sizeof *w);
}
