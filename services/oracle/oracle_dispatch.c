/*
 * oracle_dispatch: the third stage of a job (oracle_job_internal.h): what
 * goes to the trainers on their Work streams.  The only file that knows
 * the wire shape of a WorkItem (Step, Eval, StopWork, CheckpointWork,
 * ResumeWork); the other stages hand it plain C (plans, the cacher's
 * decisions, the evaluation set, a checkpoint; oracle_ckpt__dispatch says
 * when a checkpoint's item goes).
 *
 * Trainer p gets Step x once x is planned (and decided), x < (the
 * iterations every trainer has reported) + window, window = max(
 * oracle.window, L + 2) so that trainers can prefetch L batches ahead, and
 * its send queue holds fewer than 2 messages (rpc_call_queued; a message
 * sent and every report run the conductor again).  An Eval item follows
 * Step x directly on the stream when an evaluation is due after x, so a
 * trainer evaluates the model exactly as it is after x without the oracle
 * stalling.
 *
 * A Step carries, besides the samples: the slot of each id (of the cached
 * tables' ids only when the job partitions tables: partition_fields); the rows to
 * fetch and their slots; the rows to write back and their slots; the slots
 * all-reduced before the next step (sync_critical) and in the background
 * (sync_delayed), both the same on every trainer; every slot freed after
 * the step (evict_slots: all trainers' write-back slots, in rank order);
 * the prefetch gate; L; the trainer's cache hits; the rows x + 1 has
 * replicated after x.  Slots are little-endian uint32, keys little-endian
 * uint64.  sync_keys stays empty.  j->dispatch is this file's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch_pb.h"
#include "err.h"
#include "log.h"
#include "oracle_job_internal.h"
#include "strategy.h"

/* Slots and keys go on the wire as the bytes of uint32_t / uint64_t arrays
 * (protobuf-c packs a bytes field by pointer, with no copy), and the
 * protocol says little-endian: like the floats of Samples, that holds only
 * on a little-endian host (batch_pb.h encodes the samples the same way). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the oracle's wire format assumes a little-endian host");

#define SEND_QUEUE_MAX 2 /* messages queued on one stream before dispatch waits for on_sent */

/* Arrays as bytes fields, by pointer (little-endian host: see the top). */
static ProtobufCBinaryData keys_pb(const uint64_t *k, size_t n) {
  ProtobufCBinaryData d = {n * sizeof(uint64_t), (uint8_t *)k};
  return d;
}

static ProtobufCBinaryData slots_pb(const uint32_t *v, size_t n) {
  ProtobufCBinaryData d = {n * sizeof(uint32_t), (uint8_t *)v};
  return d;
}

/* The partitioned tables' part of Step x for trainer p (strategy.h): the
 * owners, every trainer's sample count, and the ids of the whole global
 * batch of each table p holds (its own, and every partition_rows table),
 * in trainer order, less p's own samples' ids (the trainer has them in its
 * samples: with one trainer nothing is left); and the slots of the cached
 * tables' ids only (a partitioned table's id has none).  At batch 16384 on
 * 26 partitioned tables that leaves 4.3 of 9.4 MB for one trainer.
 * slots: the cacher's, one per id of p's samples.  *ids / *counts /
 * *cslots are malloc'd (the caller frees them after the send).  0 or
 * -ENOMEM. */
static int partition_fields(oracle_job_t *j, uint32_t p, const plan_t *pl, const uint32_t *slots,
                            Chanter__Oracle__V1__Step *st, uint64_t **ids, uint32_t **counts, uint32_t **cslots) {
  const data_batch_t *mine = &pl->shares[p].batch;
  size_t n = 0, ns = 0;
  for (uint32_t t = 0; t < j->n_tables; t++) {
    uint32_t o = j->partition_owner[t];
    if (strategy_holds(o, p)) n += (size_t)(pl->batch - mine->n) * pl->hotness[t];
    if (o == STRATEGY_OWNER_NONE) ns += (size_t)mine->n * pl->hotness[t];
  }
  *counts = malloc(j->P * sizeof **counts);
  *ids = malloc((n ? n : 1) * sizeof **ids);
  *cslots = malloc((ns ? ns : 1) * sizeof **cslots);
  if (!*counts || !*ids || !*cslots) return -ENOMEM;
  for (uint32_t q = 0; q < j->P; q++) (*counts)[q] = pl->shares[q].batch.n;
  size_t o = 0, k = 0;
  for (uint32_t t = 0; t < j->n_tables; t++) {
    if (j->partition_owner[t] == STRATEGY_OWNER_NONE) {
      size_t m = mine->ids_off[t + 1] - mine->ids_off[t];
      memcpy(*cslots + k, slots + mine->ids_off[t], m * sizeof **cslots);
      k += m;
    }
    if (!strategy_holds(j->partition_owner[t], p)) continue;
    for (uint32_t q = 0; q < j->P; q++) {
      if (q == p) continue;
      const data_batch_t *b = &pl->shares[q].batch;
      size_t m = (size_t)b->n * pl->hotness[t];
      memcpy(*ids + o, b->ids + b->ids_off[t], m * sizeof **ids);
      o += m;
    }
  }
  st->partition_owner = slots_pb(j->partition_owner, j->n_tables);
  st->partition_counts = slots_pb(*counts, j->P);
  st->partition_ids = keys_pb(*ids, o);
  st->slots = slots_pb(*cslots, k);
  return 0;
}

static int send_step(oracle_job_t *j, uint32_t p, const oracle_entry_t *s) {
  const plan_t *pl = &s->plan;
  const plan_share_t *sh = &pl->shares[p];
  uint64_t *partition_ids = NULL;
  uint32_t *partition_counts = NULL, *cslots = NULL;
  Chanter__Oracle__V1__Samples smp;
  batch_pb_encode_samples(&sh->batch, &smp);
  Chanter__Oracle__V1__Step st = CHANTER__ORACLE__V1__STEP__INIT;
  st.iteration = s->iteration;
  st.global_batch = pl->batch;
  st.samples = &smp;
  if (j->ideal) {
    /* no embedding traffic: the plan's lists are empty */
    st.fetch_keys = keys_pb(sh->fetch, sh->n_fetch);
    st.sync_keys = keys_pb(pl->sync, pl->n_sync);
    st.write_back_keys = keys_pb(sh->write_back, sh->n_write_back);
  } else {
    /* the cacher's decisions: rows by slot; sync_keys stays empty */
    const cacher_dec_t *d = &s->dec;
    const cacher_tr_t *t = &d->tr[p];
    ASSERT_OP(t->n_ids, ==, data_batch_n_ids(&sh->batch));
    st.slots = slots_pb(t->slots, t->n_ids);
    st.fetch_keys = keys_pb(t->fetch_keys, t->n_fetch);
    st.fetch_slots = slots_pb(t->fetch_slots, t->n_fetch);
    st.write_back_keys = keys_pb(t->write_back_keys, t->n_write_back);
    st.write_back_slots = slots_pb(t->write_back_slots, t->n_write_back);
    st.sync_critical = slots_pb(d->critical, d->n_critical);
    st.sync_delayed = slots_pb(d->delayed, d->n_delayed);
    st.evict_slots = slots_pb(s->evict, s->n_evict);
    st.prefetch_gate = d->gate;
    st.write_epoch = j->write_epoch;
    st.lookahead = d->lookahead;
    st.cache_hits = t->n_hits;
    if (s->iteration + 1 < j->iterations) { /* after x's update: what x + 1's decision lists (dispatch waited for it) */
      const cacher_dec_t *dn = &oracle_pipeline__decided(j, s->iteration + 1)->dec;
      st.replicate_slots = slots_pb(dn->replicate_slots, dn->n_replicate);
      st.replicate_owners = slots_pb(dn->replicate_owners, dn->n_replicate);
      st.replicate_keys = keys_pb(dn->replicate_keys, dn->n_replicate);
    }
    st.owned_slots = slots_pb(t->owned_slots, t->n_owned_slots);
    st.stale_slots = slots_pb(t->stale_slots, t->n_stale);
    if (j->part_any && partition_fields(j, p, pl, t->slots, &st, &partition_ids, &partition_counts, &cslots) != 0) {
      free(partition_ids), free(partition_counts), free(cslots);
      return -ENOMEM;
    }
  }
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_STEP;
  w.step = &st;
  int rc = rpc_call_send(j->tr[p].call, &w.base); /* packed now */
  free(partition_ids), free(partition_counts), free(cslots);
  return rc;
}

static int send_eval(oracle_job_t *j, uint32_t p, uint64_t round) {
  const plan_t *ep = &j->fetch.eval.plan;
  const plan_share_t *sh = &ep->shares[p];
  Chanter__Oracle__V1__Samples smp;
  batch_pb_encode_samples(&sh->batch, &smp);
  Chanter__Oracle__V1__Eval ev = CHANTER__ORACLE__V1__EVAL__INIT;
  ev.round = round;
  ev.after_iteration = oracle_report__round_after(j, round);
  ev.samples = &smp;
  ev.fetch_keys = keys_pb(sh->fetch, sh->n_fetch);
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_EVAL;
  w.eval = &ev;
  return rpc_call_send(j->tr[p].call, &w.base);
}

/* Fills rank p's send queue; whether a Step went out. */
static int dispatch(oracle_job_t *j, uint32_t p) {
  oracle_dispatch_rank_t *t = &j->dispatch.rank[p];
  rpc_call_t *call = j->tr[p].call;
  int stepped = 0;
  while (call && rpc_call_queued(call) < SEND_QUEUE_MAX) {
    /* an evaluation due after the last Step sent goes first */
    if (t->next_step > 0 && t->evals_sent < oracle_report__rounds_upto(j, t->next_step - 1)) {
      if (!j->fetch.eval.ready) break; /* the eval set is still on its way: its arrival dispatches */
      if (send_eval(j, p, t->evals_sent) != 0) break;
      t->evals_sent++;
      continue;
    }
    uint64_t x = t->next_step;
    /* a resumed job's ResumeWork first; the CheckpointWork after c; Step
     * c + 1 only once the checkpoint of c is complete */
    int ck = oracle_ckpt__dispatch(j, p, x);
    if (ck > 0) continue;
    if (ck < 0) break;
    if (x >= j->iterations || x >= j->report.done + j->pipe.window) break;
    const oracle_entry_t *s = oracle_pipeline__decided(j, x);
    if (!s) break; /* planning or the cacher wake us */
    /* the rows x + 1 needs replicated after x are in x + 1's decision */
    if (!j->ideal && x + 1 < j->iterations && !oracle_pipeline__decided(j, x + 1)) break;
    int rc = send_step(j, p, s);
    if (rc) {
      log_warn("cannot queue a step rank=%u iteration=%llu err=\"%s\"", p, (unsigned long long)x, err_str(rc));
      break; /* the stream is ending; its cancel handler says why */
    }
    metrics_counter_inc(j->m.steps);
    t->next_step++;
    stepped = 1;
  }
  return stepped;
}

int oracle_dispatch__run(oracle_job_t *j) {
  int changed = 0;
  for (uint32_t p = 0; p < j->P; p++)
    if (dispatch(j, p)) changed = ORACLE_CH_SENT;
  return changed;
}

void oracle_dispatch__stop_work(rpc_call_t *call, const char *reason, int state) {
  Chanter__Oracle__V1__StopWork sw = CHANTER__ORACLE__V1__STOP_WORK__INIT;
  sw.reason = (char *)reason;
  sw.job_state = (char *)oracle_state_name(state);
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_STOP;
  w.stop = &sw;
  rpc_call_send(call, &w.base);
}

int oracle_dispatch__checkpoint(oracle_job_t *j, uint32_t p, const oracle_cp_t *cp) {
  Chanter__Oracle__V1__CheckpointWork cw = CHANTER__ORACLE__V1__CHECKPOINT_WORK__INIT;
  char blob[160];
  snprintf(blob, sizeof blob, "ckpt.%s.dense", cp->id);
  cw.id = (char *)cp->id;
  cw.iteration = cp->iteration;
  cw.flush_keys.data = (uint8_t *)cp->flush[p].keys;
  cw.flush_keys.len = cp->flush[p].n * sizeof(uint64_t);
  cw.flush_slots.data = (uint8_t *)cp->flush[p].slots;
  cw.flush_slots.len = cp->flush[p].n * sizeof(uint32_t);
  cw.dense_blob = p == 0 ? blob : "";
  cw.dense_server = 0;
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_CHECKPOINT;
  w.checkpoint = &cw;
  return rpc_call_send(j->tr[p].call, &w.base);
}

int oracle_dispatch__resume(oracle_job_t *j, uint32_t p) {
  Chanter__Oracle__V1__ResumeWork rw = CHANTER__ORACLE__V1__RESUME_WORK__INIT;
  rw.id = j->ckpt.resume_id;
  rw.start_iteration = j->ckpt.start;
  rw.dense_blob = j->ckpt.resume_blob;
  rw.dense_server = j->ckpt.resume_server;
  rw.write_epoch = j->write_epoch;
  Chanter__Oracle__V1__WorkItem w = CHANTER__ORACLE__V1__WORK_ITEM__INIT;
  w.kind_case = CHANTER__ORACLE__V1__WORK_ITEM__KIND_RESUME;
  w.resume = &rw;
  return rpc_call_send(j->tr[p].call, &w.base);
}

int oracle_dispatch__init(oracle_job_t *j) {
  j->dispatch.rank = calloc(j->P, sizeof *j->dispatch.rank);
  return j->dispatch.rank ? 0 : -ENOMEM;
}

void oracle_dispatch__restore(oracle_job_t *j, const oracle_ostate_t *o) {
  for (uint32_t p = 0; p < j->P; p++) {
    j->dispatch.rank[p].next_step = o->iteration + 1;
    j->dispatch.rank[p].evals_sent = oracle_report__rounds_upto(j, o->iteration);
  }
}

void oracle_dispatch__close(oracle_job_t *j) {
  free(j->dispatch.rank);
  j->dispatch.rank = NULL;
}
