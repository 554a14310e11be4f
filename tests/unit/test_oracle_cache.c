/*
 * test_oracle_cache: the oracle's cacher (common/plan/cacher.c):
 * lookahead, time-to-live, slot assignment, LRPP ownership and
 * replication, the critical / delayed split, the prefetch gate, the exact
 * slot count (cacher_need), auto L (cacher_auto) and lowering L under a
 * cache_rows limit.
 *
 * Why: the cacher's decisions are what keep L > 0 training identical to
 * synchronous training; a wrong slot, a missed write-back, a row fetched
 * before its last write-back, an owned row used by another trainer without
 * being replicated first, or a stale copy not marked stale silently
 * corrupts the model.  So besides the worked example of the Bagpipe paper
 * (Figure 6, checked decision by decision, with lrpp = 0 for the paper's
 * critical / delayed lists and lrpp = 1 for ownership) and a two-trainer
 * LRPP case by hand (owned, taken over, stale, replicated, shared), random
 * skewed streams are run for many (P, L, lrpp, delayed) and the decisions
 * alone drive a simulation of every trainer's cache and of the backing
 * store, with a version counter per row: a trainer's cache gets a row only
 * from its fetch list (or a replication); an owned row is updated by its
 * owner alone, a shared row identically everywhere; stale_slots mark the
 * other trainers' copies of a row taken over; replication copies the
 * owner's current row to every trainer.  Every id a trainer trains must
 * find its row at the slot the cacher named, holding the value synchronous
 * training would have (every earlier update applied), and every row
 * written back must be that value; after every batch a checkpoint
 * (cacher_flush's lists written over the store, nothing evicted) must
 * leave every row of the store at synchronous training's value, each row
 * listed by one trainer.  The rules of cacher.h (slot reuse after L
 * batches, the gate, write-back owners, which rows are owned and never
 * synchronized, which are replicated, the slot count) are checked along
 * the way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "cacher.h"
#include "plan.h"
#include "table.h"

#include "batch_util.h"

#define NONE UINT32_MAX
#define NOKEY UINT64_MAX

/* ------------------------------------------------------------------ helpers */

/* A stream of batches and their KEYS plans. */
typedef struct stream_s {
  uint32_t P, n_tables, B;
  uint32_t hot[4];
  uint64_t rows[4], max_rows;
  size_t n;
  data_batch_t *b;
  plan_t *pl;
} stream_t;

static void stream_plan(stream_t *s, int policy) {
  s->pl = calloc(s->n, sizeof *s->pl);
  for (size_t x = 0; x < s->n; x++)
    assert_int_equal(plan_build(&s->b[x], s->P, policy, 7, PLAN_KEYS, &s->pl[x]), 0);
}

/* n batches of B samples, ids skewed: row = floor(rows * u^3). */
static void stream_random(stream_t *s, uint64_t seed, size_t n, uint32_t P, uint32_t n_tables, uint32_t B,
                          uint32_t hotness, int policy) {
  memset(s, 0, sizeof *s);
  sm_state = seed;
  s->P = P;
  s->n_tables = n_tables;
  s->B = B;
  s->n = n;
  static const uint64_t rows[4] = {2000, 300, 40, 1000};
  for (uint32_t t = 0; t < n_tables; t++) {
    s->hot[t] = hotness;
    s->rows[t] = rows[t];
    if (rows[t] > s->max_rows) s->max_rows = rows[t];
  }
  s->b = calloc(n, sizeof *s->b);
  uint64_t *ids = malloc((size_t)B * hotness * n_tables * sizeof *ids);
  for (size_t x = 0; x < n; x++) {
    size_t o = 0;
    for (uint32_t t = 0; t < n_tables; t++)
      for (uint32_t i = 0; i < B * hotness; i++) {
        double u = unif();
        ids[o++] = (uint64_t)((double)s->rows[t] * u * u * u);
      }
    make_batch(&s->b[x], x, B, n_tables, s->hot, ids);
  }
  free(ids);
  stream_plan(s, policy);
}

static void stream_free(stream_t *s) {
  for (size_t x = 0; x < s->n; x++) {
    plan_close(&s->pl[x]);
    data_batch_free(&s->b[x]);
  }
  free(s->pl);
  free(s->b);
  memset(s, 0, sizeof *s);
}

/* What one run produced: the decisions and, after each, the cacher's own
 * counters. */
typedef struct run_s {
  cacher_dec_t *d;
  size_t n; /* decided */
  size_t *cached_after;
  uint64_t *used_after;
  uint64_t peak;
  size_t cached_end;
  cacher_flush_t **fl; /* fl[x]: cacher_flush after deciding x, P lists */
  int rc;
  char err[256];
} run_t;

/* Pushes the stream in order, deciding whatever is ready after each push,
 * as the oracle does. */
static void run_cache(const stream_t *s, const cacher_opts_t *o, run_t *r) {
  memset(r, 0, sizeof *r);
  r->d = calloc(s->n, sizeof *r->d);
  r->cached_after = calloc(s->n, sizeof *r->cached_after);
  r->used_after = calloc(s->n, sizeof *r->used_after);
  r->fl = calloc(s->n, sizeof *r->fl);
  cacher_t *c;
  assert_int_equal(cacher_create(o, &c), 0);
  for (size_t x = 0; x < s->n && !r->rc; x++) {
    assert_int_equal(cacher_push(c, &s->pl[x]), 0);
    if (x + 1 == s->n) cacher_end(c);
    while (cacher_ready(c)) {
      r->rc = cacher_decide(c, &r->d[r->n], r->err, sizeof r->err);
      if (r->rc) break;
      assert_int_equal(r->d[r->n].iteration, r->n);
      r->cached_after[r->n] = cacher_cached(c);
      r->used_after[r->n] = cacher_slots_used(c);
      /* what a checkpoint at this batch would write back (check_run checks it) */
      r->fl[r->n] = calloc(o->trainers, sizeof **r->fl);
      assert_int_equal(cacher_flush(c, r->fl[r->n]), 0);
      assert_true(cacher_lookahead(c) == r->d[r->n].lookahead);
      r->n++;
    }
    if (r->rc) break;
    /* the window never holds more than L + 1 batches once decided: exactly
     * the L batches the next decision waits for */
    assert_true(cacher_window(c) <= (size_t)o->lookahead + 1);
    assert_int_equal(cacher_window(c), x + 1 - r->n);
    if (x + 1 < s->n) {
      uint32_t Lc = cacher_lookahead(c);
      size_t wait = (size_t)Lc;
      assert_int_equal(cacher_window(c), x + 1 < wait ? x + 1 : wait);
      assert_int_equal(cacher_decide(c, &(cacher_dec_t){0}, r->err, sizeof r->err), -EAGAIN);
    }
  }
  if (!r->rc) assert_int_equal(r->n, s->n);
  r->peak = cacher_slots_peak(c);
  r->cached_end = cacher_cached(c);
  cacher_destroy(c);
}

static void run_free(run_t *r) {
  for (size_t x = 0; x < r->n; x++) {
    cacher_flush_free(r->fl[x], r->d[x].trainers);
    free(r->fl[x]);
    cacher_dec_free(&r->d[x]);
  }
  free(r->fl);
  free(r->d);
  free(r->cached_after);
  free(r->used_after);
  memset(r, 0, sizeof *r);
}

static int find_key(const uint64_t *keys, size_t n, uint64_t k) {
  for (size_t i = 0; i < n; i++)
    if (keys[i] == k) return (int)i;
  return -1;
}

static void assert_keys(const uint64_t *got, size_t n, const uint64_t *want, size_t n_want) {
  assert_int_equal(n, n_want);
  for (size_t i = 0; i < n; i++) assert_true(got[i] == want[i]);
}

static void assert_u32s(const uint32_t *got, size_t n, const uint32_t *want, size_t n_want) {
  assert_int_equal(n, n_want);
  for (size_t i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
}

/* ------------------------------------------------------------------ simulation */

/* What the simulation found over a run. */
typedef struct sim_out_s {
  uint64_t max_slot1; /* max slot index + 1 */
  int lowered;        /* some batch ran at a lower L */
  uint64_t fetched, synced;
  uint64_t owned_kept; /* rows taking an owner and staying cached (owned_slots entries) */
  uint64_t taken_over; /* ... of those, cached shared rows taken over (stale_slots entries on the others) */
  uint64_t replicated; /* replicate entries */
  uint64_t owned_hits; /* hits on a row owned by its (only) user */
  uint64_t flushed_owned, flushed_shared; /* cacher_flush entries over the run, by kind */
} sim_out_t;

#define SHARED_OWNER UINT32_MAX

/* Replays r's decisions over s as the trainers and the store would, and
 * checks every rule of cacher.h (see the file comment).  Per trainer
 * and slot the simulation holds the key, a version counter (the number of
 * updates its copy has seen) and a stale mark; per key, the number of
 * updates synchronous training would have applied (true_cnt), the store's
 * version and, while cached, its owner (one trainer, or every trainer). */
static void check_run(const stream_t *s, const cacher_opts_t *o, const run_t *r, sim_out_t *out) {
  uint32_t P = s->P, L0 = o->lookahead, full = (1u << P) - 1;
  size_t n = s->n, NK = (size_t)s->n_tables * s->max_rows;
  size_t SMAX = 1;
  for (size_t x = 0; x < n; x++) SMAX += s->pl[x].n_unique;
#define KI(k) ((size_t)TABLE_ID(k) * s->max_rows + (size_t)TABLE_ROW(k))
  uint32_t *key_slot = malloc(NK * sizeof *key_slot);
  uint64_t *true_cnt = calloc(NK, sizeof *true_cnt), *store = calloc(NK, sizeof *store);
  int64_t *last_use = malloc(NK * sizeof *last_use), *last_write_back = malloc(NK * sizeof *last_write_back);
  uint32_t *n_fetch_ev = calloc(NK, sizeof *n_fetch_ev), *n_write_back_ev = calloc(NK, sizeof *n_write_back_ev);
  uint32_t *umask = calloc(n * NK, sizeof *umask); /* umask[x * NK + k]: the trainers batch x has use key k */
  uint32_t *fetch_by = calloc(NK, sizeof *fetch_by), *owner_of = malloc(NK * sizeof *owner_of);
  uint8_t *cls = calloc(NK, 1), *in_x = calloc(NK, 1), *cached_before = calloc(NK, 1), *write_back_seen = calloc(NK, 1);
  uint8_t *new_owned = calloc(NK, 1); /* at x: 1 fetched for its one user and owned, 2 taken over from every trainer */
  uint64_t *slot_key = malloc(SMAX * sizeof *slot_key);
  int64_t *freed_at = malloc(SMAX * sizeof *freed_at);
  uint8_t *listed = calloc(SMAX, 1);
  uint8_t *flushed = calloc(NK, 1);
  uint64_t *ck = malloc(NK * sizeof *ck); /* the store as a checkpoint leaves it */
  uint64_t **tc_key = calloc(P, sizeof *tc_key), **tc_val = calloc(P, sizeof *tc_val);
  uint8_t **tc_stale = calloc(P, sizeof *tc_stale);
  for (size_t i = 0; i < NK; i++) {
    key_slot[i] = NONE;
    owner_of[i] = SHARED_OWNER;
    last_use[i] = last_write_back[i] = -1;
  }
  for (size_t i = 0; i < SMAX; i++) {
    slot_key[i] = NOKEY;
    freed_at[i] = -1;
  }
  for (uint32_t q = 0; q < P; q++) {
    tc_key[q] = malloc(SMAX * sizeof **tc_key);
    tc_val[q] = calloc(SMAX, sizeof **tc_val);
    tc_stale[q] = calloc(SMAX, 1);
    for (size_t i = 0; i < SMAX; i++) tc_key[q][i] = NOKEY;
  }
  /* who uses what, from the shares' ids (the plans' users are checked against it) */
  for (size_t x = 0; x < n; x++) {
    const plan_t *pl = &s->pl[x];
    for (size_t i = 0; i < pl->n_unique; i++) {
      if (i) assert_true(pl->ukeys[i - 1] < pl->ukeys[i]);
      in_x[KI(pl->ukeys[i])] = 1;
    }
    for (uint32_t q = 0; q < P; q++) {
      const data_batch_t *sh = &pl->shares[q].batch;
      size_t oo = 0;
      for (uint32_t t = 0; t < pl->n_tables; t++) {
        size_t m = (size_t)sh->n * pl->hotness[t];
        for (size_t j = 0; j < m; j++) {
          size_t k = KI(TABLE_KEY(t, sh->ids[oo + j]));
          assert_true(in_x[k]);
          umask[x * NK + k] |= 1u << q;
        }
        oo += m;
      }
    }
    for (size_t i = 0; i < pl->n_unique; i++) {
      size_t k = KI(pl->ukeys[i]);
      uint32_t msk = umask[x * NK + k];
      assert_true(msk != 0);
      assert_int_equal(pl->users[i], __builtin_popcount(msk) == 1 ? (uint32_t)__builtin_ctz(msk) : UINT32_MAX);
      in_x[k] = 0;
    }
  }
  memset(out, 0, sizeof *out);
  uint32_t prevL = L0;
  assert_int_equal(r->n, n);

  for (size_t x = 0; x < n; x++) {
    const plan_t *pl = &s->pl[x];
    const cacher_dec_t *d = &r->d[x];
    const uint32_t *mask = umask + x * NK;
    assert_int_equal(d->iteration, x);
    assert_int_equal(d->trainers, P);
    /* L never rises, and the gate follows it */
    uint32_t Lx = d->lookahead;
    assert_true(Lx <= prevL);
    prevL = Lx;
    if (Lx < L0) out->lowered = 1;
    uint64_t gate = x > Lx ? x - Lx : 0;
    assert_int_equal(d->gate, gate);
    /* the keys of x; an owned row is only ever used by its owner (the
     * replication after x - 1 made every other row used here shared) */
    assert_int_equal(d->n_unique, pl->n_unique);
    for (size_t i = 0; i < pl->n_unique; i++) {
      size_t k = KI(pl->ukeys[i]);
      in_x[k] = 1;
      fetch_by[k] = 0;
      cls[k] = 0;
      write_back_seen[k] = 0;
      new_owned[k] = 0;
      cached_before[k] = key_slot[k] != NONE;
      if (cached_before[k] && owner_of[k] != SHARED_OWNER) {
        assert_true(o->lrpp);
        assert_int_equal(mask[k], 1u << owner_of[k]);
      }
      if (!cached_before[k]) assert_int_equal(owner_of[k], SHARED_OWNER);
    }
    /* fetches: only rows not cached, into a free slot that has waited out
     * L batches, after the row's last write-back and before the gate; the
     * trainer's cache gets the store's row there */
    size_t n_new = 0;
    for (uint32_t q = 0; q < P; q++) {
      const cacher_tr_t *t = &d->tr[q];
      for (size_t i = 0; i < t->n_fetch; i++) {
        uint64_t key = t->fetch_keys[i];
        uint32_t sl = t->fetch_slots[i];
        size_t k = KI(key);
        if (i) assert_true(t->fetch_keys[i - 1] < key);
        assert_true(in_x[k]);
        assert_false(cached_before[k]);
        assert_true(sl < SMAX);
        fetch_by[k] |= 1u << q;
        if (key_slot[k] == NONE) { /* the first trainer fetching it this batch */
          assert_true(slot_key[sl] == NOKEY);       /* the slot holds no row */
          if (freed_at[sl] >= 0) assert_true((uint64_t)freed_at[sl] + Lx + 1 <= x); /* slot reuse rule */
          if (last_use[k] >= 0) {
            assert_true((uint64_t)last_use[k] + 1 <= gate); /* written back before the gate */
            assert_true(x - (uint64_t)last_use[k] > Lx);
            assert_int_equal(last_write_back[k], last_use[k]);
          }
          assert_true(store[k] == true_cnt[k]); /* the store is up to date */
          slot_key[sl] = key;
          key_slot[k] = sl;
          n_new++;
          n_fetch_ev[k]++;
          if (sl + 1 > out->max_slot1) out->max_slot1 = sl + 1;
          if (o->cache_rows) assert_true(sl < o->cache_rows);
        } else {
          assert_int_equal(key_slot[k], sl);
        }
        assert_true(tc_key[q][sl] == NOKEY);
        tc_key[q][sl] = key;
        tc_val[q][sl] = store[k];
        tc_stale[q][sl] = 0;
      }
      out->fetched += t->n_fetch;
    }
    assert_int_equal(d->n_new, n_new);
    /* critical / delayed: ascending, disjoint, keys of x at their slots */
    for (size_t i = 0; i < d->n_critical; i++) {
      size_t k = KI(d->critical_keys[i]);
      if (i) assert_true(d->critical_keys[i - 1] < d->critical_keys[i]);
      assert_true(in_x[k]);
      assert_int_equal(cls[k], 0);
      cls[k] = 1;
      assert_int_equal(d->critical[i], key_slot[k]);
    }
    for (size_t i = 0; i < d->n_delayed; i++) {
      size_t k = KI(d->delayed_keys[i]);
      if (i) assert_true(d->delayed_keys[i - 1] < d->delayed_keys[i]);
      assert_true(in_x[k]);
      assert_int_equal(cls[k], 0);
      cls[k] = 2;
      assert_int_equal(d->delayed[i], key_slot[k]);
    }
    out->synced += d->n_critical + d->n_delayed;
    int split = o->delayed && Lx >= 1 && x + 1 < n;
    if (!split) assert_int_equal(d->n_delayed, 0);
    /* LRPP: a row one trainer uses is owned by it (never synchronized,
     * fetched by it alone); a row several use (or any row, lrpp = 0) is
     * shared (synchronized, fetched by all) */
    size_t owned_cnt[8] = {0};
    for (size_t i = 0; i < pl->n_unique; i++) {
      size_t k = KI(pl->ukeys[i]);
      int nusers = __builtin_popcount(mask[k]);
      int owned = o->lrpp && nusers == 1;
      assert_int_not_equal(key_slot[k], NONE); /* every key of x has a slot when x trains */
      assert_int_equal(cls[k] == 0, owned);     /* synchronized iff shared */
      if (!cached_before[k]) assert_int_equal(fetch_by[k], owned ? mask[k] : full);
      if (owned) {
        uint32_t u = (uint32_t)__builtin_ctz(mask[k]);
        owned_cnt[u]++;
        if (!cached_before[k]) { /* fetched by its user alone: its own */
          owner_of[k] = u;
          new_owned[k] = 1;
        } else if (owner_of[k] == SHARED_OWNER) { /* every copy current: u takes it over */
          owner_of[k] = u;
          new_owned[k] = 2;
        } else {
          assert_int_equal(owner_of[k], u);
          out->owned_hits++;
        }
      } else {
        assert_int_equal(owner_of[k], SHARED_OWNER);
        if (split) assert_int_equal(cls[k] == 1, (x + 1 < n && umask[(x + 1) * NK + k] != 0));
      }
      if (cached_before[k]) { /* a hit: used within the window that kept it */
        assert_true(last_use[k] >= 0);
        assert_true(x - (uint64_t)last_use[k] <= L0);
      }
    }
    /* each trainer: per-id slots hold the row, up to date, not stale */
    for (uint32_t q = 0; q < P; q++) {
      const cacher_tr_t *t = &d->tr[q];
      const data_batch_t *sh = &pl->shares[q].batch;
      assert_int_equal(t->n_ids, data_batch_n_ids(sh));
      size_t nk = 0, nh = 0;
      for (size_t i = 0; i < pl->n_unique; i++) {
        size_t k = KI(pl->ukeys[i]);
        if (mask[k] >> q & 1) {
          nk++;
          nh += cached_before[k];
        }
      }
      assert_int_equal(t->n_keys, nk);
      assert_int_equal(t->n_hits, nh);
      assert_int_equal(t->n_owned, owned_cnt[q]);
      size_t oo = 0;
      for (uint32_t tb = 0; tb < pl->n_tables; tb++) {
        size_t m = (size_t)sh->n * pl->hotness[tb];
        for (size_t j = 0; j < m; j++) {
          uint64_t key = TABLE_KEY(tb, sh->ids[oo + j]);
          size_t k = KI(key);
          uint32_t sl = t->slots[oo + j];
          assert_int_equal(key_slot[k], sl);
          assert_true(tc_key[q][sl] == key);
          assert_true(tc_val[q][sl] == true_cnt[k]);
          assert_false(tc_stale[q][sl]);
        }
        oo += m;
      }
    }
    /* training x: an owned row on its owner alone; a shared row everywhere
     * (every copy current before, the same update on each) */
    for (size_t i = 0; i < pl->n_unique; i++) {
      size_t k = KI(pl->ukeys[i]);
      uint32_t sl = key_slot[k];
      true_cnt[k]++;
      if (cls[k] == 0) {
        uint32_t u = owner_of[k];
        assert_true(tc_key[u][sl] == pl->ukeys[i]);
        tc_val[u][sl]++;
      } else {
        for (uint32_t q = 0; q < P; q++) {
          assert_true(tc_key[q][sl] == pl->ukeys[i]);
          assert_false(tc_stale[q][sl]);
          assert_true(tc_val[q][sl] + 1 == true_cnt[k]);
          tc_val[q][sl]++;
        }
      }
    }
    /* write-backs: each evicted key once, by its owner (shared: table_mix64
     * % P), the trained value */
    size_t n_write_back = 0;
    for (uint32_t q = 0; q < P; q++) {
      const cacher_tr_t *t = &d->tr[q];
      for (size_t i = 0; i < t->n_write_back; i++) {
        uint64_t key = t->write_back_keys[i];
        size_t k = KI(key);
        if (i) assert_true(t->write_back_keys[i - 1] < key);
        assert_true(in_x[k]);
        assert_int_equal(key_slot[k], t->write_back_slots[i]);
        assert_int_equal(write_back_seen[k], 0);
        write_back_seen[k] = 1;
        if (cls[k] == 0)
          assert_int_equal(q, owner_of[k]);
        else
          assert_int_equal(q, (uint32_t)(table_mix64(key) % P));
        assert_true(tc_key[q][t->write_back_slots[i]] == key);
        store[k] = tc_val[q][t->write_back_slots[i]];
        assert_true(store[k] == true_cnt[k]);
        n_write_back++;
      }
    }
    assert_int_equal(d->n_evicted, n_write_back);
    /* owned / stale: the rows taking an owner at x and staying cached go to
     * the owner's owned_slots; those taken over from every trainer go to the
     * others' stale_slots (their copies missed x's update), and the others
     * mark them stale */
    for (uint32_t q = 0; q < P; q++) {
      const cacher_tr_t *t = &d->tr[q];
      size_t want_owned = 0, want_stale = 0;
      for (size_t i = 0; i < pl->n_unique; i++) {
        size_t k = KI(pl->ukeys[i]);
        if (!new_owned[k] || write_back_seen[k]) continue;
        want_owned += owner_of[k] == q;
        want_stale += new_owned[k] == 2 && owner_of[k] != q;
      }
      assert_int_equal(t->n_owned_slots, want_owned);
      for (size_t i = 0; i < t->n_owned_slots; i++) {
        uint32_t sl = t->owned_slots[i];
        assert_true(sl < SMAX && slot_key[sl] != NOKEY);
        size_t k = KI(slot_key[sl]);
        assert_true(in_x[k] && new_owned[k] && !write_back_seen[k]);
        assert_int_equal(owner_of[k], q);
        assert_int_equal(listed[sl], 0);
        listed[sl] = 1;
      }
      for (size_t i = 0; i < t->n_owned_slots; i++) listed[t->owned_slots[i]] = 0;
      out->owned_kept += t->n_owned_slots;
      assert_int_equal(t->n_stale, want_stale);
      for (size_t i = 0; i < t->n_stale; i++) {
        uint32_t sl = t->stale_slots[i];
        assert_true(sl < SMAX && slot_key[sl] != NOKEY);
        size_t k = KI(slot_key[sl]);
        assert_true(in_x[k] && new_owned[k] == 2 && !write_back_seen[k]);
        assert_int_not_equal(owner_of[k], q);
        assert_int_equal(listed[sl], 0);
        listed[sl] = 1;
        assert_true(tc_key[q][sl] == slot_key[sl]); /* it held the shared row */
        tc_stale[q][sl] = 1;
      }
      for (size_t i = 0; i < t->n_stale; i++) listed[t->stale_slots[i]] = 0;
    }
    for (size_t i = 0; i < pl->n_unique; i++) {
      size_t k = KI(pl->ukeys[i]);
      out->taken_over += new_owned[k] == 2 && !write_back_seen[k];
    }
    /* evictions: the slot is freed on every trainer (an owned row's other
     * copies, stale or absent, go with it); kept rows are used again */
    for (size_t i = 0; i < pl->n_unique; i++) {
      uint64_t key = pl->ukeys[i];
      size_t k = KI(key);
      size_t next = x + 1;
      while (next < n && !umask[next * NK + k]) next++;
      if (write_back_seen[k]) { /* evicted: no use in [x + 1, x + L] */
        assert_true(next >= n || next > x + Lx);
        uint32_t sl = key_slot[k];
        for (uint32_t q = 0; q < P; q++) {
          if (cls[k] != 0 || q == owner_of[k]) assert_true(tc_key[q][sl] == key);
          assert_true(tc_key[q][sl] == key || tc_key[q][sl] == NOKEY);
          tc_key[q][sl] = NOKEY;
          tc_stale[q][sl] = 0;
        }
        slot_key[sl] = NOKEY;
        freed_at[sl] = (int64_t)x;
        key_slot[k] = NONE;
        owner_of[k] = SHARED_OWNER;
        last_write_back[k] = (int64_t)x;
        n_write_back_ev[k]++;
      } else { /* kept: used again, within L unless L was lowered */
        assert_true(next < n);
        if (!out->lowered) assert_true(next <= x + L0);
      }
      last_use[k] = (int64_t)x;
      in_x[k] = 0;
    }
    /* a checkpoint at x (cacher_flush between x's decision and x + 1's):
     * every row cached after x is in exactly one trainer's list -- its
     * owner's, or table_mix64 % P's when shared --, at its slot, and that
     * trainer's copy is current; with the lists written over the store
     * (nothing evicted) the store holds, for every key, what synchronous
     * training has after x.  Every third batch the lists go to the store
     * itself, as a checkpoint does, and the run goes on from there. */
    const cacher_flush_t *fl = r->fl[x];
    memcpy(ck, store, NK * sizeof *ck);
    size_t n_flushed = 0;
    for (uint32_t q = 0; q < P; q++)
      for (size_t i = 0; i < fl[q].n; i++) {
        uint64_t key = fl[q].keys[i];
        uint32_t sl = fl[q].slots[i];
        size_t k = KI(key);
        if (i) assert_true(fl[q].keys[i - 1] < key);
        assert_int_equal(key_slot[k], sl);
        if (flushed[k]) fail_msg("batch %zu: key %#" PRIx64 " in two trainers' flush lists", x, key);
        flushed[k] = 1;
        if (owner_of[k] == SHARED_OWNER) {
          assert_int_equal(q, (uint32_t)(table_mix64(key) % P));
          out->flushed_shared++;
        } else {
          assert_int_equal(q, owner_of[k]);
          out->flushed_owned++;
        }
        assert_true(tc_key[q][sl] == key);
        assert_false(tc_stale[q][sl]);
        ck[k] = tc_val[q][sl];
        if (x % 3 == 1) store[k] = tc_val[q][sl];
        n_flushed++;
      }
    assert_int_equal(n_flushed, r->cached_after[x]);
    if (L0 == 0) assert_int_equal(n_flushed, 0); /* (an L lowered to 0 leaves earlier rows cached) */
    for (size_t k = 0; k < NK; k++) {
      if (ck[k] != true_cnt[k])
        fail_msg("checkpoint at batch %zu: table %zu row %zu holds %" PRIu64 " updates, synchronous training %" PRIu64,
                 x, k / s->max_rows, k % s->max_rows, ck[k], true_cnt[k]);
      flushed[k] = 0;
    }
    /* replication: after x's update, each row x + 1's decision lists
     * (cached, owned by the listed trainer, used at x + 1 by another
     * trainer or by several) goes from its owner, current, to every
     * trainer; it is shared again.  Batch 0's decision lists nothing. */
    if (x == 0) assert_int_equal(d->n_replicate, 0);
    const cacher_dec_t *dn = x + 1 < n ? &r->d[x + 1] : NULL;
    size_t n_replicate = dn ? dn->n_replicate : 0;
    if (!o->lrpp) assert_int_equal(n_replicate, 0);
    out->replicated += n_replicate;
    for (size_t i = 0; i < n_replicate; i++) {
      uint64_t key = dn->replicate_keys[i];
      size_t k = KI(key);
      uint32_t sl = dn->replicate_slots[i], u = dn->replicate_owners[i];
      assert_true(u < P);
      assert_int_equal(key_slot[k], sl); /* cached after x */
      assert_int_equal(owner_of[k], u);    /* owned by u (and not listed twice: then it is shared) */
      uint32_t m1 = umask[(x + 1) * NK + k];
      assert_true(m1 != 0 && m1 != 1u << u);
      assert_true(tc_key[u][sl] == key);
      assert_true(tc_val[u][sl] == true_cnt[k]);
      assert_false(tc_stale[u][sl]);
      for (uint32_t q = 0; q < P; q++) {
        tc_key[q][sl] = key;
        tc_val[q][sl] = tc_val[u][sl];
        tc_stale[q][sl] = 0;
      }
      owner_of[k] = SHARED_OWNER;
    }
    /* every owned row x + 1 uses is used by its owner alone */
    if (x + 1 < n) {
      const plan_t *p1 = &s->pl[x + 1];
      for (size_t i = 0; i < p1->n_unique; i++) {
        size_t k = KI(p1->ukeys[i]);
        if (key_slot[k] != NONE && owner_of[k] != SHARED_OWNER)
          assert_int_equal(umask[(x + 1) * NK + k], 1u << owner_of[k]);
      }
    }
    /* the cacher's counters: rows cached, slots held or waiting; every
     * cached row: a shared one current on every trainer, an owned one
     * current on its owner, and a copy is stale-marked iff it is not current */
    size_t held = 0, waiting = 0;
    for (size_t sl = 0; sl < out->max_slot1; sl++) {
      if (slot_key[sl] != NOKEY) {
        size_t k = KI(slot_key[sl]);
        held++;
        for (uint32_t q = 0; q < P; q++) {
          int has = tc_key[q][sl] == slot_key[sl];
          assert_true(has || tc_key[q][sl] == NOKEY);
          if (owner_of[k] == SHARED_OWNER || owner_of[k] == q) assert_true(has);
          if (has) assert_int_equal(tc_stale[q][sl], tc_val[q][sl] != true_cnt[k]);
          if (has && owner_of[k] != SHARED_OWNER && owner_of[k] != q) assert_true(tc_stale[q][sl]);
        }
      } else {
        for (uint32_t q = 0; q < P; q++) assert_true(tc_key[q][sl] == NOKEY);
        if (freed_at[sl] >= 0 && (uint64_t)freed_at[sl] + Lx + 1 > x + 1) waiting++;
      }
    }
    assert_int_equal(r->cached_after[x], held);
    assert_int_equal(r->used_after[x], held + waiting);
    assert_int_equal(d->slots_used, held + waiting);
  }
  /* the end: nothing cached, every fetched row written back */
  assert_int_equal(r->cached_end, 0);
  assert_int_equal(r->peak, out->max_slot1);
  for (size_t k = 0; k < NK; k++) {
    assert_int_equal(key_slot[k], NONE);
    assert_int_equal(n_fetch_ev[k], n_write_back_ev[k]);
    assert_true(store[k] == true_cnt[k]);
  }
#undef KI
  for (uint32_t q = 0; q < P; q++) {
    free(tc_key[q]);
    free(tc_val[q]);
    free(tc_stale[q]);
  }
  free(tc_key);
  free(tc_val);
  free(tc_stale);
  free(key_slot);
  free(true_cnt);
  free(store);
  free(last_use);
  free(last_write_back);
  free(n_fetch_ev);
  free(n_write_back_ev);
  free(umask);
  free(fetch_by);
  free(owner_of);
  free(cls);
  free(in_x);
  free(cached_before);
  free(write_back_seen);
  free(new_owned);
  free(slot_key);
  free(freed_at);
  free(listed);
  free(flushed);
  free(ck);
}

/* ------------------------------------------------------------------ Figure 6 */

/* One table, one trainer, batch 2, one id per sample: rows {3,9} {3,4}
 * {3,6} {6,1}. */
static void stream_fig6(stream_t *s) {
  static const uint64_t rows[4][2] = {{3, 9}, {3, 4}, {3, 6}, {6, 1}};
  memset(s, 0, sizeof *s);
  s->P = 1;
  s->n_tables = 1;
  s->B = 2;
  s->hot[0] = 1;
  s->rows[0] = s->max_rows = 16;
  s->n = 4;
  s->b = calloc(s->n, sizeof *s->b);
  for (size_t x = 0; x < 4; x++) make_batch(&s->b[x], x, 2, 1, s->hot, rows[x]);
  stream_plan(s, PLAN_ALLOC_CONTIGUOUS);
}

#define K(r) TABLE_KEY(0, (r))

/* The per-id slots of the single trainer: sample j -> the slot of its key. */
static void assert_id_slots(const stream_t *s, const cacher_dec_t *d, const uint64_t *key_of_slot, size_t n_slots) {
  const data_batch_t *sh = &s->pl[d->iteration].shares[0].batch;
  assert_int_equal(d->tr[0].n_ids, 2);
  for (size_t j = 0; j < 2; j++) {
    uint32_t sl = d->tr[0].slots[j];
    assert_true(sl < n_slots);
    assert_true(key_of_slot[sl] == K(sh->ids[j]));
  }
}

/* Figure 6, L = 1, run with lrpp = 0 and lrpp = 1.  The fetches, slots,
 * write-backs, gates and hits do not depend on LRPP and are checked for
 * both.  lrpp = 0: every row is shared, so the critical / delayed lists are
 * the paper's (a row batch x + 1 uses is critical, the rest delayed; the
 * last batch's are all critical).  lrpp = 1: the single trainer owns every
 * row -- nothing is synchronized, nothing replicated or stale, and its
 * owned_slots list the rows it fetches and keeps (3 at x = 0, 6 at x = 2). */
static void test_figure6(void **state) {
  (void)state;
  stream_t s;
  stream_fig6(&s);
  sim_out_t so;
  run_t r;
  uint64_t need;
  for (int lrpp = 0; lrpp <= 1; lrpp++) {
    cacher_opts_t o = {.trainers = 1, .lookahead = 1, .cache_rows = 0, .lrpp = lrpp, .delayed = 1};
    run_cache(&s, &o, &r);
    assert_int_equal(r.rc, 0);
    const cacher_dec_t *d = r.d;
    /* x = 0: fetch 3 -> 0, 9 -> 1; 9 evicted after 0 */
    assert_keys(d[0].tr[0].fetch_keys, d[0].tr[0].n_fetch, (uint64_t[]){K(3), K(9)}, 2);
    assert_u32s(d[0].tr[0].fetch_slots, d[0].tr[0].n_fetch, (uint32_t[]){0, 1}, 2);
    assert_keys(d[0].tr[0].write_back_keys, d[0].tr[0].n_write_back, (uint64_t[]){K(9)}, 1);
    assert_u32s(d[0].tr[0].write_back_slots, d[0].tr[0].n_write_back, (uint32_t[]){1}, 1);
    assert_int_equal(d[0].gate, 0);
    assert_int_equal(d[0].lookahead, 1);
    assert_int_equal(d[0].tr[0].n_hits, 0);
    assert_int_equal(d[0].tr[0].n_keys, 2);
    assert_int_equal(d[0].n_new, 2);
    assert_int_equal(d[0].n_evicted, 1);
    assert_id_slots(&s, &d[0], (uint64_t[]){K(3), K(9)}, 2);
    /* x = 1: slot 1 (freed after 0) is reusable only from batch 2: 4 -> 2 */
    assert_keys(d[1].tr[0].fetch_keys, d[1].tr[0].n_fetch, (uint64_t[]){K(4)}, 1);
    assert_u32s(d[1].tr[0].fetch_slots, d[1].tr[0].n_fetch, (uint32_t[]){2}, 1);
    assert_int_equal(d[1].tr[0].n_hits, 1);
    assert_keys(d[1].tr[0].write_back_keys, d[1].tr[0].n_write_back, (uint64_t[]){K(4)}, 1);
    assert_u32s(d[1].tr[0].write_back_slots, d[1].tr[0].n_write_back, (uint32_t[]){2}, 1);
    assert_int_equal(d[1].gate, 0);
    assert_id_slots(&s, &d[1], (uint64_t[]){K(3), K(9), K(4)}, 3);
    /* x = 2: 6 -> slot 1; 3 hit, evicted after 2 */
    assert_keys(d[2].tr[0].fetch_keys, d[2].tr[0].n_fetch, (uint64_t[]){K(6)}, 1);
    assert_u32s(d[2].tr[0].fetch_slots, d[2].tr[0].n_fetch, (uint32_t[]){1}, 1);
    assert_int_equal(d[2].tr[0].n_hits, 1);
    assert_keys(d[2].tr[0].write_back_keys, d[2].tr[0].n_write_back, (uint64_t[]){K(3)}, 1);
    assert_u32s(d[2].tr[0].write_back_slots, d[2].tr[0].n_write_back, (uint32_t[]){0}, 1);
    assert_int_equal(d[2].gate, 1);
    assert_id_slots(&s, &d[2], (uint64_t[]){K(3), K(6), K(4)}, 3);
    /* x = 3: 1 -> slot 2 (freed after 1); 6 hit; both written back */
    assert_keys(d[3].tr[0].fetch_keys, d[3].tr[0].n_fetch, (uint64_t[]){K(1)}, 1);
    assert_u32s(d[3].tr[0].fetch_slots, d[3].tr[0].n_fetch, (uint32_t[]){2}, 1);
    assert_int_equal(d[3].tr[0].n_hits, 1);
    assert_keys(d[3].tr[0].write_back_keys, d[3].tr[0].n_write_back, (uint64_t[]){K(1), K(6)}, 2);
    assert_u32s(d[3].tr[0].write_back_slots, d[3].tr[0].n_write_back, (uint32_t[]){2, 1}, 2);
    assert_int_equal(d[3].gate, 2);
    assert_id_slots(&s, &d[3], (uint64_t[]){K(3), K(6), K(1)}, 3);
    for (size_t x = 0; x < 4; x++) {
      assert_int_equal(d[x].n_replicate, 0); /* one trainer: nobody else to hand a row to */
      assert_int_equal(d[x].tr[0].n_stale, 0);
    }
    if (!lrpp) {
      /* x = 0: 3 critical (used by 1), 9 delayed */
      assert_keys(d[0].critical_keys, d[0].n_critical, (uint64_t[]){K(3)}, 1);
      assert_u32s(d[0].critical, d[0].n_critical, (uint32_t[]){0}, 1);
      assert_keys(d[0].delayed_keys, d[0].n_delayed, (uint64_t[]){K(9)}, 1);
      assert_u32s(d[0].delayed, d[0].n_delayed, (uint32_t[]){1}, 1);
      /* x = 1: 3 critical, 4 delayed */
      assert_keys(d[1].critical_keys, d[1].n_critical, (uint64_t[]){K(3)}, 1);
      assert_u32s(d[1].critical, d[1].n_critical, (uint32_t[]){0}, 1);
      assert_keys(d[1].delayed_keys, d[1].n_delayed, (uint64_t[]){K(4)}, 1);
      assert_u32s(d[1].delayed, d[1].n_delayed, (uint32_t[]){2}, 1);
      /* x = 2: 6 critical, 3 delayed */
      assert_keys(d[2].critical_keys, d[2].n_critical, (uint64_t[]){K(6)}, 1);
      assert_u32s(d[2].critical, d[2].n_critical, (uint32_t[]){1}, 1);
      assert_keys(d[2].delayed_keys, d[2].n_delayed, (uint64_t[]){K(3)}, 1);
      assert_u32s(d[2].delayed, d[2].n_delayed, (uint32_t[]){0}, 1);
      /* x = 3, the last batch: both critical */
      assert_keys(d[3].critical_keys, d[3].n_critical, (uint64_t[]){K(1), K(6)}, 2);
      assert_u32s(d[3].critical, d[3].n_critical, (uint32_t[]){2, 1}, 2);
      assert_int_equal(d[3].n_delayed, 0);
      for (size_t x = 0; x < 4; x++) {
        assert_int_equal(d[x].tr[0].n_owned, 0);
        assert_int_equal(d[x].tr[0].n_owned_slots, 0);
      }
    } else {
      /* every row owned by the trainer: never synchronized */
      for (size_t x = 0; x < 4; x++) {
        assert_int_equal(d[x].n_critical, 0);
        assert_int_equal(d[x].n_delayed, 0);
        assert_int_equal(d[x].tr[0].n_owned, 2);
      }
      /* rows taking their owner and staying cached: 3 (slot 0) at x = 0,
       * 6 (slot 1) at x = 2; 3 at x = 1 and 2 and 6 at x = 3 are its
       * already, 9, 4 and 1 are evicted */
      assert_u32s(d[0].tr[0].owned_slots, d[0].tr[0].n_owned_slots, (uint32_t[]){0}, 1);
      assert_int_equal(d[1].tr[0].n_owned_slots, 0);
      assert_u32s(d[2].tr[0].owned_slots, d[2].tr[0].n_owned_slots, (uint32_t[]){1}, 1);
      assert_int_equal(d[3].tr[0].n_owned_slots, 0);
    }
    assert_int_equal(r.peak, 3);
    check_run(&s, &o, &r, &so);
    assert_int_equal(so.synced, lrpp ? 0 : 8);
    run_free(&r);
    assert_int_equal(cacher_need(s.pl, s.n, 1, 1, lrpp, &need), 0);
    assert_int_equal(need, 3);

    /* L = 2: key 3 stays cached from x = 0 through x = 2 */
    o.lookahead = 2;
    run_cache(&s, &o, &r);
    assert_int_equal(r.rc, 0);
    assert_int_equal(find_key(r.d[0].tr[0].fetch_keys, r.d[0].tr[0].n_fetch, K(3)), 0);
    for (size_t x = 0; x < 3; x++) {
      assert_int_equal(find_key(r.d[x].tr[0].fetch_keys, r.d[x].tr[0].n_fetch, K(3)) >= 0, x == 0);
      assert_int_equal(find_key(r.d[x].tr[0].write_back_keys, r.d[x].tr[0].n_write_back, K(3)) >= 0, x == 2);
    }
    assert_int_equal(r.d[1].tr[0].n_hits, 1);
    assert_int_equal(r.d[2].tr[0].n_hits, 1);
    assert_int_equal(r.d[3].tr[0].n_hits, 1); /* 6, fetched at 2 */
    assert_int_equal(r.d[2].gate, 0);
    assert_int_equal(r.d[3].gate, 1);
    check_run(&s, &o, &r, &so);
    run_free(&r);
  }

  /* L = 0: every key fetched in its batch and written back after it (with
   * LRPP too, though batch x + 1 is then in the window when x is decided) */
  for (int lrpp = 0; lrpp <= 1; lrpp++) {
    cacher_opts_t o = {.trainers = 1, .lookahead = 0, .cache_rows = 0, .lrpp = lrpp, .delayed = 1};
    run_cache(&s, &o, &r);
    assert_int_equal(r.rc, 0);
    for (size_t x = 0; x < 4; x++) {
      const cacher_tr_t *t = &r.d[x].tr[0];
      assert_int_equal(t->n_fetch, 2);
      assert_int_equal(t->n_write_back, 2);
      assert_int_equal(t->n_hits, 0);
      assert_int_equal(r.d[x].gate, x);
      assert_int_equal(r.d[x].lookahead, 0);
      assert_keys(t->fetch_keys, 2, s.pl[x].ukeys, 2);
      assert_keys(t->write_back_keys, 2, s.pl[x].ukeys, 2);
      for (size_t i = 0; i < 2; i++) assert_true(t->fetch_slots[i] < 2);
      if (lrpp) { /* owned, evicted: nothing synchronized, nothing kept */
        assert_int_equal(r.d[x].n_critical, 0);
        assert_int_equal(t->n_owned, 2);
      } else { /* shared: L = 0, all critical */
        assert_keys(r.d[x].critical_keys, r.d[x].n_critical, s.pl[x].ukeys, 2);
        assert_int_equal(t->n_owned, 0);
      }
      assert_int_equal(r.d[x].n_delayed + r.d[x].n_replicate + t->n_owned_slots + t->n_stale, 0);
    }
    check_run(&s, &o, &r, &so);
    run_free(&r);
    assert_int_equal(cacher_need(s.pl, s.n, 1, 0, lrpp, &need), 0);
    assert_int_equal(need, 2);
  }
  stream_free(&s);
}

/* ------------------------------------------------------------------ LRPP by hand */

/* Two trainers, contiguous allocation, batch 4 (trainer 0: samples 0, 1;
 * trainer 1: samples 2, 3), one table of hotness 2, L = 1:
 *   x = 0: {1,2} {3,4} | {2,4} {5,5}   t0 uses 1 2 3 4, t1 uses 2 4 5
 *   x = 1: {3,6} {6,3} | {3,4} {5,7}   t0 uses 3 6,     t1 uses 3 4 5 7
 *   x = 2: {6,8} {8,6} | {4,8} {4,4}   t0 uses 6 8,     t1 uses 4 8
 * Slots (fresh in key order; slots freed after 0 are reusable from 2):
 * 1 -> 0, 2 -> 1, 3 -> 2, 4 -> 3, 5 -> 4, 6 -> 5, 7 -> 6, 8 -> 0.
 *   x = 0: 1 t0's, evicted: fetched by t0 alone, written back by t0.
 *          2 shared, not used at 1: fetched by both, delayed, evicted,
 *          written back by table_mix64 % 2.
 *          3 t0's, kept (used at 1): fetched by t0 alone, not synchronized,
 *          in t0's owned_slots; batch 1 has both use it: replicated after 0,
 *          listed in batch 1's decision
 *          (owner t0), shared at 1.
 *          4 shared, used at 1: fetched by both, critical, kept.
 *          5 t1's, kept (used by t1 alone at 1): in t1's owned_slots, not
 *          replicated.
 *   x = 1: 3 shared (a hit for both), delayed, evicted (table_mix64 % 2).
 *          4 a cached shared row t1 alone uses, kept (used at 2): taken
 *          over by t1 -- t1's owned_slots, t0's stale_slots.
 *          5 t1's hit, evicted by t1; 7 t1's, fetched and evicted by t1.
 *          6 t0's, fetched by t0 alone, kept: t0's owned_slots.
 *   x = 2: 6 t0's hit, 4 t1's hit, each written back by its owner; 8 shared,
 *          fetched by both, critical (the last batch). */
static void test_lrpp_by_hand(void **state) {
  (void)state;
  static const uint64_t ids[3][8] = {{1, 2, 3, 4, 2, 4, 5, 5}, {3, 6, 6, 3, 3, 4, 5, 7}, {6, 8, 8, 6, 4, 8, 4, 4}};
  stream_t s;
  memset(&s, 0, sizeof s);
  s.P = 2;
  s.n_tables = 1;
  s.B = 4;
  s.hot[0] = 2;
  s.rows[0] = s.max_rows = 16;
  s.n = 3;
  s.b = calloc(3, sizeof *s.b);
  for (size_t x = 0; x < 3; x++) make_batch(&s.b[x], x, 4, 1, s.hot, ids[x]);
  stream_plan(&s, PLAN_ALLOC_CONTIGUOUS);
  uint32_t mix2 = (uint32_t)(table_mix64(K(2)) % 2), mix3 = (uint32_t)(table_mix64(K(3)) % 2),
           mix8 = (uint32_t)(table_mix64(K(8)) % 2);
  uint64_t want[2][4];
  size_t nw[2];
#define WRITE_BACK_RESET() (nw[0] = nw[1] = 0)
#define WRITE_BACK(q, k) (want[q][nw[q]++] = (k)) /* trainer q writes back k (in ascending key order) */
#define WRITE_BACK_CHECK(d) \
  for (uint32_t q_ = 0; q_ < 2; q_++) assert_keys((d)->tr[q_].write_back_keys, (d)->tr[q_].n_write_back, want[q_], nw[q_])

  cacher_opts_t o = {.trainers = 2, .lookahead = 1, .cache_rows = 0, .lrpp = 1, .delayed = 1};
  run_t r;
  sim_out_t so;
  run_cache(&s, &o, &r);
  assert_int_equal(r.rc, 0);
  /* x = 0 */
  const cacher_dec_t *d = &r.d[0];
  assert_keys(d->tr[0].fetch_keys, d->tr[0].n_fetch, (uint64_t[]){K(1), K(2), K(3), K(4)}, 4);
  assert_u32s(d->tr[0].fetch_slots, d->tr[0].n_fetch, (uint32_t[]){0, 1, 2, 3}, 4);
  assert_keys(d->tr[1].fetch_keys, d->tr[1].n_fetch, (uint64_t[]){K(2), K(4), K(5)}, 3);
  assert_u32s(d->tr[1].fetch_slots, d->tr[1].n_fetch, (uint32_t[]){1, 3, 4}, 3);
  assert_keys(d->critical_keys, d->n_critical, (uint64_t[]){K(4)}, 1);
  assert_u32s(d->critical, d->n_critical, (uint32_t[]){3}, 1);
  assert_keys(d->delayed_keys, d->n_delayed, (uint64_t[]){K(2)}, 1);
  assert_u32s(d->delayed, d->n_delayed, (uint32_t[]){1}, 1);
  assert_int_equal(d->tr[0].n_owned, 2); /* 1, 3 */
  assert_int_equal(d->tr[1].n_owned, 1); /* 5 */
  assert_u32s(d->tr[0].owned_slots, d->tr[0].n_owned_slots, (uint32_t[]){2}, 1); /* 3 */
  assert_u32s(d->tr[1].owned_slots, d->tr[1].n_owned_slots, (uint32_t[]){4}, 1); /* 5 */
  assert_int_equal(d->tr[0].n_stale + d->tr[1].n_stale, 0);
  assert_int_equal(d->n_replicate, 0); /* nothing before batch 0 */
  WRITE_BACK_RESET();
  WRITE_BACK(0, K(1));
  WRITE_BACK(mix2, K(2));
  WRITE_BACK_CHECK(d);
  assert_int_equal(d->n_evicted, 2);
  /* x = 1 */
  d = &r.d[1];
  assert_keys(d->tr[0].fetch_keys, d->tr[0].n_fetch, (uint64_t[]){K(6)}, 1);
  assert_u32s(d->tr[0].fetch_slots, d->tr[0].n_fetch, (uint32_t[]){5}, 1);
  assert_keys(d->tr[1].fetch_keys, d->tr[1].n_fetch, (uint64_t[]){K(7)}, 1);
  assert_u32s(d->tr[1].fetch_slots, d->tr[1].n_fetch, (uint32_t[]){6}, 1);
  assert_int_equal(d->n_critical, 0);
  assert_keys(d->delayed_keys, d->n_delayed, (uint64_t[]){K(3)}, 1); /* shared again after the replication */
  assert_u32s(d->delayed, d->n_delayed, (uint32_t[]){2}, 1);
  assert_int_equal(d->tr[0].n_hits, 1); /* 3 */
  assert_int_equal(d->tr[1].n_hits, 3); /* 3 4 5 */
  assert_int_equal(d->tr[0].n_owned, 1); /* 6 */
  assert_int_equal(d->tr[1].n_owned, 3); /* 4 5 7 */
  assert_u32s(d->tr[0].owned_slots, d->tr[0].n_owned_slots, (uint32_t[]){5}, 1);   /* 6 */
  assert_u32s(d->tr[1].owned_slots, d->tr[1].n_owned_slots, (uint32_t[]){3}, 1);   /* 4, taken over */
  assert_u32s(d->tr[0].stale_slots, d->tr[0].n_stale, (uint32_t[]){3}, 1); /* ... so t0's copy is stale */
  assert_int_equal(d->tr[1].n_stale, 0);
  assert_int_equal(d->n_replicate, 1); /* 3 went from t0 to both after batch 0: batch 1 lists it */
  assert_int_equal(d->replicate_keys[0], K(3));
  assert_int_equal(d->replicate_slots[0], 2);
  assert_int_equal(d->replicate_owners[0], 0);
  WRITE_BACK_RESET();
  WRITE_BACK(mix3, K(3));
  WRITE_BACK(1, K(5));
  WRITE_BACK(1, K(7));
  WRITE_BACK_CHECK(d);
  /* x = 2 */
  d = &r.d[2];
  for (uint32_t q = 0; q < 2; q++) {
    assert_keys(d->tr[q].fetch_keys, d->tr[q].n_fetch, (uint64_t[]){K(8)}, 1);
    assert_u32s(d->tr[q].fetch_slots, d->tr[q].n_fetch, (uint32_t[]){0}, 1);
    assert_int_equal(d->tr[q].n_hits, 1);
    assert_int_equal(d->tr[q].n_owned, 1);
    assert_int_equal(d->tr[q].n_owned_slots + d->tr[q].n_stale, 0);
  }
  assert_keys(d->critical_keys, d->n_critical, (uint64_t[]){K(8)}, 1);
  assert_int_equal(d->n_delayed, 0);
  assert_int_equal(d->n_replicate, 0); /* 4 and 6 are used at 2 by their owners alone */
  WRITE_BACK_RESET();
  if (mix8 == 0) { /* ascending key order per trainer */
    WRITE_BACK(0, K(6));
    WRITE_BACK(0, K(8));
    WRITE_BACK(1, K(4));
  } else {
    WRITE_BACK(0, K(6));
    WRITE_BACK(1, K(4));
    WRITE_BACK(1, K(8));
  }
  WRITE_BACK_CHECK(d);
  check_run(&s, &o, &r, &so);
  assert_int_equal(so.replicated, 1);
  assert_int_equal(so.taken_over, 1);
  assert_int_equal(so.owned_kept, 4);
  run_free(&r);

  /* delayed = 0: the same, the shared rows all critical */
  o.delayed = 0;
  run_cache(&s, &o, &r);
  assert_int_equal(r.rc, 0);
  assert_keys(r.d[0].critical_keys, r.d[0].n_critical, (uint64_t[]){K(2), K(4)}, 2);
  assert_keys(r.d[1].critical_keys, r.d[1].n_critical, (uint64_t[]){K(3)}, 1);
  assert_keys(r.d[2].critical_keys, r.d[2].n_critical, (uint64_t[]){K(8)}, 1);
  for (size_t x = 0; x < 3; x++) assert_int_equal(r.d[x].n_delayed, 0);
  assert_int_equal(r.d[1].n_replicate, 1);
  assert_u32s(r.d[1].tr[0].stale_slots, r.d[1].tr[0].n_stale, (uint32_t[]){3}, 1);
  check_run(&s, &o, &r, &so);
  run_free(&r);

  /* lrpp = 0: every key shared -- fetched by both, synchronized, written
   * back by table_mix64 % 2; nothing owned, stale or replicated */
  o.delayed = 1;
  o.lrpp = 0;
  run_cache(&s, &o, &r);
  assert_int_equal(r.rc, 0);
  static const uint64_t fetch0[] = {K(1), K(2), K(3), K(4), K(5)}, fetch1[] = {K(6), K(7)}, fetch2[] = {K(8)};
  static const uint64_t crit[3][3] = {{K(3), K(4), K(5)}, {K(4), K(6)}, {K(4), K(6), K(8)}};
  static const uint64_t del[3][3] = {{K(1), K(2)}, {K(3), K(5), K(7)}, {0}};
  static const size_t n_crit[3] = {3, 2, 3}, n_del[3] = {2, 3, 0}, n_ev[3] = {2, 3, 3};
  for (size_t x = 0; x < 3; x++) {
    d = &r.d[x];
    for (uint32_t q = 0; q < 2; q++) {
      if (x == 0) assert_keys(d->tr[q].fetch_keys, d->tr[q].n_fetch, fetch0, 5);
      if (x == 1) assert_keys(d->tr[q].fetch_keys, d->tr[q].n_fetch, fetch1, 2);
      if (x == 2) assert_keys(d->tr[q].fetch_keys, d->tr[q].n_fetch, fetch2, 1);
      assert_int_equal(d->tr[q].n_owned, 0);
      assert_int_equal(d->tr[q].n_owned_slots + d->tr[q].n_stale, 0);
      for (size_t i = 0; i < d->tr[q].n_write_back; i++) assert_int_equal(table_mix64(d->tr[q].write_back_keys[i]) % 2, q);
    }
    assert_keys(d->critical_keys, d->n_critical, crit[x], n_crit[x]);
    assert_keys(d->delayed_keys, d->n_delayed, del[x], n_del[x]);
    assert_int_equal(d->tr[0].n_write_back + d->tr[1].n_write_back, n_ev[x]);
    assert_int_equal(d->n_replicate, 0);
  }
  check_run(&s, &o, &r, &so);
  run_free(&r);

  /* other lookaheads, under the simulation's rules */
  for (uint32_t L = 0; L <= 2; L += 2)
    for (int lrpp = 0; lrpp <= 1; lrpp++) {
      cacher_opts_t o2 = {.trainers = 2, .lookahead = L, .cache_rows = 0, .lrpp = lrpp, .delayed = 1};
      run_cache(&s, &o2, &r);
      assert_int_equal(r.rc, 0);
      check_run(&s, &o2, &r, &so);
      run_free(&r);
    }
#undef WRITE_BACK_RESET
#undef WRITE_BACK
#undef WRITE_BACK_CHECK
  stream_free(&s);
}

/* ------------------------------------------------------------------ random streams */

static void assert_same_decisions(const run_t *a, const run_t *b) {
  assert_int_equal(a->n, b->n);
  for (size_t x = 0; x < a->n; x++) {
    const cacher_dec_t *p = &a->d[x], *q = &b->d[x];
    assert_int_equal(p->lookahead, q->lookahead);
    assert_int_equal(p->gate, q->gate);
    assert_keys(p->critical_keys, p->n_critical, q->critical_keys, q->n_critical);
    assert_u32s(p->critical, p->n_critical, q->critical, q->n_critical);
    assert_keys(p->delayed_keys, p->n_delayed, q->delayed_keys, q->n_delayed);
    assert_u32s(p->delayed, p->n_delayed, q->delayed, q->n_delayed);
    assert_int_equal(p->slots_used, q->slots_used);
    assert_u32s(p->replicate_slots, p->n_replicate, q->replicate_slots, q->n_replicate);
    assert_u32s(p->replicate_owners, p->n_replicate, q->replicate_owners, q->n_replicate);
    assert_keys(p->replicate_keys, p->n_replicate, q->replicate_keys, q->n_replicate);
    for (uint32_t t = 0; t < p->trainers; t++) {
      const cacher_tr_t *u = &p->tr[t], *v = &q->tr[t];
      assert_u32s(u->slots, u->n_ids, v->slots, v->n_ids);
      assert_keys(u->fetch_keys, u->n_fetch, v->fetch_keys, v->n_fetch);
      assert_u32s(u->fetch_slots, u->n_fetch, v->fetch_slots, v->n_fetch);
      assert_keys(u->write_back_keys, u->n_write_back, v->write_back_keys, v->n_write_back);
      assert_u32s(u->write_back_slots, u->n_write_back, v->write_back_slots, v->n_write_back);
      assert_u32s(u->owned_slots, u->n_owned_slots, v->owned_slots, v->n_owned_slots);
      assert_u32s(u->stale_slots, u->n_stale, v->stale_slots, v->n_stale);
      assert_int_equal(u->n_owned, v->n_owned);
    }
  }
}

/* Every (P, L, lrpp, delayed) over random streams, unlimited cache. */
static void test_properties(void **state) {
  (void)state;
  static const uint32_t Ls[] = {0, 1, 3, 8};
  int runs = 0, any_hit = 0, any_owned = 0, any_delayed = 0;
  uint64_t owned_kept = 0, taken_over = 0, replicated = 0, owned_hits = 0; /* P > 1 */
  for (uint32_t P = 1; P <= 3; P++)
    for (uint32_t hot = 1; hot <= 2; hot++) {
      stream_t s;
      uint32_t B = 32 + 16 * (P + hot) % 33;
      stream_random(&s, 1000 + P * 10 + hot, 60, P, 2 + (P + hot) % 2, B, hot,
                    (P + hot) % 2 ? PLAN_ALLOC_RANDOM : PLAN_ALLOC_CONTIGUOUS);
      for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
        for (int lrpp = 0; lrpp <= 1; lrpp++)
          for (int delayed = 0; delayed <= 1; delayed++) {
            cacher_opts_t o = {.trainers = P, .lookahead = Ls[li], .lrpp = lrpp, .delayed = delayed};
            run_t r;
            run_cache(&s, &o, &r);
            assert_int_equal(r.rc, 0);
            sim_out_t so;
            check_run(&s, &o, &r, &so);
            assert_false(so.lowered);
            uint64_t need;
            assert_int_equal(cacher_need(s.pl, s.n, P, Ls[li], lrpp, &need), 0);
            assert_int_equal(need, so.max_slot1);
            assert_int_equal(need, r.peak);
            if (!lrpp) assert_int_equal(so.owned_kept + so.taken_over + so.replicated + so.owned_hits, 0);
            if (P == 1) assert_int_equal(so.taken_over + so.replicated + (lrpp ? so.synced : 0), 0);
            if (P > 1) {
              owned_kept += so.owned_kept;
              taken_over += so.taken_over;
              replicated += so.replicated;
              owned_hits += so.owned_hits;
            }
            for (size_t x = 0; x < r.n; x++) {
              any_hit |= r.d[x].tr[0].n_hits > 0;
              any_owned |= r.d[x].tr[0].n_owned > 0 && P > 1;
              any_delayed |= r.d[x].n_delayed > 0;
            }
            if (li == 2 && lrpp && delayed) { /* determinism */
              run_t r2;
              run_cache(&s, &o, &r2);
              assert_same_decisions(&r, &r2);
              run_free(&r2);
            }
            run_free(&r);
            runs++;
          }
      /* need grows with L */
      for (int lrpp = 0; lrpp <= 1; lrpp++) {
        uint64_t prev = 0;
        for (uint32_t L = 0; L <= 10; L++) {
          uint64_t need;
          assert_int_equal(cacher_need(s.pl, s.n, P, L, lrpp, &need), 0);
          assert_true(need >= prev);
          prev = need;
        }
      }
      stream_free(&s);
    }
  /* the streams exercise what they should */
  assert_true(any_hit && any_owned && any_delayed);
  assert_true(owned_kept > 0 && taken_over > 0 && replicated > 0 && owned_hits > 0);
  assert_int_equal(runs, 3 * 2 * 4 * 2 * 2);
}

/* cacher_flush, the write-back of a checkpoint: for every (P, L, lrpp,
 * delayed) check_run takes a checkpoint after every batch (on a copy of
 * the store, and every third batch on the store itself) and checks it
 * against synchronous training; here: the lists hold both kinds of rows
 * where both exist, and nothing with L = 0. */
static void test_flush(void **state) {
  (void)state;
  static const uint32_t Ls[] = {0, 1, 4, 16};
  int runs = 0;
  for (uint32_t P = 1; P <= 3; P++) {
    stream_t s;
    stream_random(&s, 3100 + P, 50, P, 3, 40, 1 + P % 2, P == 2 ? PLAN_ALLOC_RANDOM : PLAN_ALLOC_CONTIGUOUS);
    for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++)
      for (int lrpp = 0; lrpp <= 1; lrpp++)
        for (int delayed = 0; delayed <= 1; delayed++) {
          cacher_opts_t o = {.trainers = P, .lookahead = Ls[li], .lrpp = lrpp, .delayed = delayed};
          run_t r;
          sim_out_t so;
          run_cache(&s, &o, &r);
          assert_int_equal(r.rc, 0);
          check_run(&s, &o, &r, &so);
          if (Ls[li] == 0) {
            assert_int_equal(so.flushed_owned + so.flushed_shared, 0);
          } else {
            assert_int_equal(so.flushed_shared > 0, !lrpp || P > 1); /* with LRPP one trainer owns every row */
            assert_int_equal(so.flushed_owned > 0, lrpp);
          }
          run_free(&r);
          runs++;
        }
    /* the lists of a cacher that failed, and before any decision */
    cacher_opts_t o = {.trainers = P, .lookahead = 2, .cache_rows = 1, .lrpp = 1, .delayed = 1};
    cacher_t *c;
    cacher_flush_t fl[3];
    assert_int_equal(cacher_create(&o, &c), 0);
    assert_int_equal(cacher_flush(c, fl), 0);
    for (uint32_t q = 0; q < P; q++) assert_int_equal(fl[q].n, 0);
    cacher_flush_free(fl, P);
    for (size_t x = 0; x < 3; x++) assert_int_equal(cacher_push(c, &s.pl[x]), 0);
    cacher_dec_t d;
    char err[256];
    assert_int_equal(cacher_decide(c, &d, err, sizeof err), ERR_CONFIG);
    assert_int_equal(cacher_flush(c, fl), -EINVAL);
    for (uint32_t q = 0; q < P; q++) assert_null(fl[q].keys);
    cacher_destroy(c);
    stream_free(&s);
  }
  assert_int_equal(runs, 3 * 4 * 2 * 2);
}

/* cache_rows limits: = need never lowers L; = need - 1 lowers it and stays
 * within the limit; < need(0) fails with ERR_CONFIG. */
static void test_capacity(void **state) {
  (void)state;
  static const uint32_t Ls[] = {1, 3, 8};
  int lowered_runs = 0;
  for (uint32_t P = 1; P <= 3; P++) {
    stream_t s;
    stream_random(&s, 5000 + P, 60, P, 3, 48, 1 + P % 2, PLAN_ALLOC_CONTIGUOUS);
    uint64_t need0;
    assert_int_equal(cacher_need(s.pl, s.n, P, 0, 1, &need0), 0);
    for (size_t li = 0; li < 3; li++) {
      uint32_t L = Ls[li];
      uint64_t need;
      assert_int_equal(cacher_need(s.pl, s.n, P, L, 1, &need), 0);
      cacher_opts_t o = {.trainers = P, .lookahead = L, .cache_rows = need, .lrpp = 1, .delayed = 1};
      run_t r;
      sim_out_t so;
      run_cache(&s, &o, &r);
      assert_int_equal(r.rc, 0);
      check_run(&s, &o, &r, &so);
      assert_false(so.lowered);
      run_free(&r);
      if (need > need0) {
        o.cache_rows = need - 1;
        run_cache(&s, &o, &r);
        assert_int_equal(r.rc, 0);
        check_run(&s, &o, &r, &so);
        assert_true(so.lowered);
        assert_true(so.max_slot1 <= need - 1);
        run_free(&r);
        lowered_runs++;
      }
      /* even L = 0 does not fit */
      o.cache_rows = need0 - 1;
      run_cache(&s, &o, &r);
      assert_int_equal(r.rc, ERR_CONFIG);
      assert_non_null(strstr(r.err, "cache_rows"));
      run_free(&r);
    }
    cacher_opts_t o = {.trainers = P, .lookahead = 0, .cache_rows = need0 - 1, .lrpp = 1, .delayed = 1};
    run_t r;
    run_cache(&s, &o, &r);
    assert_int_equal(r.rc, ERR_CONFIG);
    assert_non_null(strstr(r.err, "cache_rows"));
    run_free(&r);
    /* after a failure the cacher is unusable */
    cacher_t *c;
    assert_int_equal(cacher_create(&o, &c), 0);
    int rc = 0;
    char err[256];
    size_t x = 0;
    cacher_dec_t d;
    for (; x < s.n && !rc; x++) {
      assert_int_equal(cacher_push(c, &s.pl[x]), 0);
      while (!rc && cacher_ready(c)) {
        rc = cacher_decide(c, &d, err, sizeof err);
        if (!rc) cacher_dec_free(&d);
      }
    }
    assert_int_equal(rc, ERR_CONFIG);
    assert_false(cacher_ready(c));
    if (x < s.n) assert_int_equal(cacher_push(c, &s.pl[x]), -EINVAL);
    assert_int_not_equal(cacher_decide(c, &d, err, sizeof err), 0);
    cacher_destroy(c);
    stream_free(&s);
  }
  assert_true(lowered_runs > 0);
}

/* cacher_auto: the largest L <= max_l whose need fits. */
static void test_auto(void **state) {
  (void)state;
  for (uint32_t P = 1; P <= 3; P += 2) {
    stream_t s;
    stream_random(&s, 9000 + P, 60, P, 2, 40, 1, PLAN_ALLOC_CONTIGUOUS);
    uint64_t need[13];
    for (uint32_t L = 0; L <= 12; L++) assert_int_equal(cacher_need(s.pl, s.n, P, L, 1, &need[L]), 0);
    uint64_t rows_list[] = {need[0] - 1, need[0], need[3], need[3] + 1, (need[4] + need[8]) / 2, need[12] - 1,
                            need[12], need[12] * 2};
    for (size_t i = 0; i < sizeof rows_list / sizeof *rows_list; i++) {
      uint64_t rows = rows_list[i], got_need;
      uint32_t l;
      assert_int_equal(cacher_auto(s.pl, s.n, P, rows, 12, 1, &l, &got_need), 0);
      assert_true(l <= 12);
      assert_int_equal(got_need, need[l]);
      if (rows < need[0]) {
        assert_int_equal(l, 0);
        assert_true(got_need > rows);
        continue;
      }
      assert_true(need[l] <= rows);
      if (l < 12) assert_true(need[l + 1] > rows);
    }
    /* max_l bounds it */
    uint32_t l;
    uint64_t nd;
    assert_int_equal(cacher_auto(s.pl, s.n, P, UINT64_MAX, 5, 1, &l, &nd), 0);
    assert_int_equal(l, 5);
    assert_int_equal(nd, need[5]);
    stream_free(&s);
  }
}

/* cacher_needs (one pass, every L at once) gives exactly what
 * cacher_need's full run of the decisions gives, for every L, P and lrpp:
 * on skewed streams (the array of last uses by table and row) and on
 * sparse rows up to 2^40 (the map), starting at batch 0 or later; bad
 * plans are refused. */
static void test_needs_one_pass(void **state) {
  (void)state;
  enum { ML = 20 };
  for (int sparse = 0; sparse <= 1; sparse++)
    for (uint32_t P = 1; P <= 3; P++) {
      stream_t s;
      stream_random(&s, 7100 + P + 10 * (uint64_t)sparse, 70, P, 3, 40, P == 2 ? 2 : 1, PLAN_ALLOC_CONTIGUOUS);
      if (sparse) { /* rows far apart: the rows' array would be too large, the map is used */
        for (size_t x = 0; x < s.n; x++) plan_close(&s.pl[x]);
        free(s.pl);
        for (size_t x = 0; x < s.n; x++) {
          data_batch_t *b = &s.b[x];
          size_t ni = b->ids_off[b->n_tables];
          for (size_t i = 0; i < ni; i++) b->ids[i] = (b->ids[i] * UINT64_C(0x9e3779b97f4a7c15)) & ((UINT64_C(1) << 40) - 1);
        }
        stream_plan(&s, PLAN_ALLOC_CONTIGUOUS);
      }
      for (size_t from = 0; from <= 5; from += 5) { /* plans from batch `from` on (a resumed job's probe) */
        uint64_t got[ML + 1], want;
        assert_int_equal(cacher_needs(s.pl + from, s.n - from, ML, got), 0);
        for (uint32_t L = 0; L <= ML; L++)
          for (int lrpp = 0; lrpp <= 1; lrpp++) {
            assert_int_equal(cacher_need(s.pl + from, s.n - from, P, L, lrpp, &want), 0);
            assert_int_equal(got[L], want);
            if (L) assert_true(got[L] >= got[L - 1]);
          }
        /* a shorter max_l gives the same prefix; a prefix of the batches its own needs */
        uint64_t got0[1], got5[6];
        assert_int_equal(cacher_needs(s.pl + from, s.n - from, 0, got0), 0);
        assert_int_equal(got0[0], got[0]);
        assert_int_equal(cacher_needs(s.pl + from, 9, 5, got5), 0);
        for (uint32_t L = 0; L <= 5; L++) {
          assert_int_equal(cacher_need(s.pl + from, 9, P, L, 1, &want), 0);
          assert_int_equal(got5[L], want);
        }
      }
      uint64_t nd[3];
      assert_int_equal(cacher_needs(s.pl, 0, 2, nd), 0); /* no batch: no slot */
      assert_int_equal(nd[0] + nd[1] + nd[2], 0);
      const plan_t gap[2] = {s.pl[0], s.pl[2]}; /* not consecutive */
      assert_int_equal(cacher_needs(gap, 2, 2, nd), -EINVAL);
      stream_free(&s);
    }
}

/* Bad calls: P = 0, pushes out of order, of another P, of a non-KEYS plan;
 * deciding when nothing is ready. */
static void test_errors(void **state) {
  (void)state;
  cacher_t *c;
  cacher_opts_t o = {.trainers = 0, .lookahead = 1};
  assert_int_equal(cacher_create(&o, &c), -EINVAL);
  assert_null(c);
  stream_t s;
  stream_random(&s, 77, 4, 2, 2, 16, 1, PLAN_ALLOC_CONTIGUOUS);
  o.trainers = 2;
  assert_int_equal(cacher_create(&o, &c), 0);
  char err[128];
  cacher_dec_t d;
  assert_int_equal(cacher_decide(c, &d, err, sizeof err), -EAGAIN);
  assert_int_equal(cacher_push(c, &s.pl[1]), -EINVAL); /* out of order */
  /* a plan built without PLAN_KEYS */
  plan_t plain;
  assert_int_equal(plan_build(&s.b[0], 2, PLAN_ALLOC_CONTIGUOUS, 7, 0, &plain), 0);
  assert_int_equal(cacher_push(c, &plain), -EINVAL);
  plan_close(&plain);
  /* another P */
  plan_t p3;
  assert_int_equal(plan_build(&s.b[0], 3, PLAN_ALLOC_CONTIGUOUS, 7, PLAN_KEYS, &p3), 0);
  assert_int_equal(cacher_push(c, &p3), -EINVAL);
  plan_close(&p3);
  assert_int_equal(cacher_push(c, &s.pl[0]), 0);
  assert_int_equal(cacher_push(c, &s.pl[0]), -EINVAL); /* again */
  assert_int_equal(cacher_push(c, &s.pl[2]), -EINVAL); /* skips 1 */
  assert_int_equal(cacher_window(c), 1);
  assert_false(cacher_ready(c)); /* L = 1: needs batch 1 */
  assert_int_equal(cacher_decide(c, &d, err, sizeof err), -EAGAIN);
  assert_int_equal(cacher_push(c, &s.pl[1]), 0);
  assert_true(cacher_ready(c));
  assert_int_equal(cacher_decide(c, &d, err, sizeof err), 0);
  cacher_dec_free(&d);
  cacher_end(c);
  assert_int_equal(cacher_push(c, &s.pl[2]), -EINVAL); /* after the end */
  assert_true(cacher_ready(c));
  assert_int_equal(cacher_decide(c, &d, err, sizeof err), 0);
  cacher_dec_free(&d);
  assert_false(cacher_ready(c));
  assert_int_equal(cacher_cached(c), 0);
  cacher_destroy(c);
  cacher_destroy(NULL);
  cacher_dec_free(NULL);
  /* ready: L batches after x (LRPP or not); the end lets the rest go */
  for (int lrpp = 0; lrpp <= 1; lrpp++)
    for (uint32_t L = 0; L <= 2; L++) {
      cacher_opts_t o2 = {.trainers = 2, .lookahead = L, .lrpp = lrpp, .delayed = 1};
      size_t wait = L; /* batches after x */
      assert_int_equal(cacher_create(&o2, &c), 0);
      assert_false(cacher_ready(c));
      for (size_t x = 0; x < 4; x++) {
        assert_int_equal(cacher_push(c, &s.pl[x]), 0);
        assert_int_equal(cacher_ready(c), x >= wait);
        if (x >= wait) {
          assert_int_equal(cacher_decide(c, &d, err, sizeof err), 0);
          assert_int_equal(d.iteration, x - wait);
          cacher_dec_free(&d);
        }
        assert_false(cacher_ready(c));
        assert_int_equal(cacher_decide(c, &d, err, sizeof err), -EAGAIN);
      }
      cacher_end(c);
      for (size_t x = 4 - (wait < 4 ? wait : 4); x < 4; x++) {
        assert_true(cacher_ready(c));
        assert_int_equal(cacher_decide(c, &d, err, sizeof err), 0);
        assert_int_equal(d.iteration, x);
        cacher_dec_free(&d);
      }
      assert_false(cacher_ready(c));
      assert_int_equal(cacher_cached(c), 0);
      cacher_destroy(c);
    }
  /* cacher_need over nothing */
  uint64_t need = 99;
  assert_int_equal(cacher_need(s.pl, 0, 2, 3, 1, &need), 0);
  assert_int_equal(need, 0);
  stream_free(&s);
}

/* A plan whose keys are not ascending is refused; an id that is not among
 * its plan's keys (a broken plan) fails the decision instead of getting
 * some other row's slot -- small rows (indexed directly) and large ones
 * (hashed), below, inside and above the keys' range. */
static void test_inconsistent_plans(void **state) {
  (void)state;
  static const uint64_t small_rows[4] = {1, 5, 5, 1}, big_rows[4] = {1000000, 2000000, 1000000, 7};
  static const uint64_t bad_small[] = {3, 100, 0}, bad_big[] = {3000000, 1500000, 6};
  for (int big = 0; big <= 1; big++)
    for (int k = 0; k < 3; k++) {
      data_batch_t b;
      uint32_t hot = 1;
      make_batch(&b, 0, 4, 1, &hot, big ? big_rows : small_rows);
      plan_t pl;
      assert_int_equal(plan_build(&b, 1, PLAN_ALLOC_CONTIGUOUS, 1, PLAN_KEYS, &pl), 0);
      cacher_opts_t o = {.trainers = 1, .lookahead = 0, .lrpp = 1, .delayed = 1};
      cacher_t *c;
      assert_int_equal(cacher_create(&o, &c), 0);
      if (k == 0) { /* keys out of order */
        uint64_t t = pl.ukeys[0];
        pl.ukeys[0] = pl.ukeys[1];
        pl.ukeys[1] = t;
        assert_int_equal(cacher_push(c, &pl), -EINVAL);
        pl.ukeys[1] = pl.ukeys[0];
        pl.ukeys[0] = t;
      }
      assert_int_equal(cacher_push(c, &pl), 0);
      cacher_end(c);
      pl.shares[0].batch.ids[3] = big ? bad_big[k] : bad_small[k];
      cacher_dec_t d;
      char err[256];
      assert_int_equal(cacher_decide(c, &d, err, sizeof err), -EINVAL);
      assert_non_null(strstr(err, "not among"));
      cacher_destroy(c);
      plan_close(&pl);
      data_batch_free(&b);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_figure6),  cmocka_unit_test(test_lrpp_by_hand), cmocka_unit_test(test_properties),
      cmocka_unit_test(test_capacity), cmocka_unit_test(test_auto),         cmocka_unit_test(test_errors),
      cmocka_unit_test(test_inconsistent_plans), cmocka_unit_test(test_flush), cmocka_unit_test(test_needs_one_pass),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
