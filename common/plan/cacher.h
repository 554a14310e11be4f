/*
 * oracle_cache: the oracle's cacher -- lookahead over a window of future
 * batches, time-to-live of every cached row, cache-slot assignment, LRPP
 * and the critical / delayed split of synchronization (DESIGN.md section 4,
 * papers/bagpipe.txt 3.2-3.3).
 *
 * Batches enter in order (cacher_push: the batch's keys update each key's
 * LAST USE) and are decided in order (cacher_decide), batch x once batches
 * x .. x+L have entered (or the stream ended).  For each distinct key k of
 * batch x, with TTL = last use of k within [x, x+L]:
 *   - k not cached: it gets a free cache slot and is fetched for x;
 *   - TTL == x: k is evicted after x (written back, its slot freed);
 *     else it stays cached, TTL refreshed by later batches.
 * With L = 0 every key of x is evicted after x.
 * LRPP, with OWNERSHIP: a key used by exactly one trainer p in x is OWNED
 * by p: only p fetches it (if it was not cached), p alone updates it, it
 * is never synchronized, and p writes it back when it is evicted -- also
 * while it stays cached across batches, for as long as p is its only
 * user.  A cached key every trainer holds (SHARED) that only p uses at x
 * is taken over by p (owned_slots for p; the others' copies go stale,
 * stale_slots).  When batch x lets another trainer use a key owned by p
 * (or several), deciding x lists it to REPLICATE (hand over; replicate_*): after batch
 * x-1's update p's copy goes to every trainer and the key is SHARED again
 * -- so a decision is complete only with the next one's replicate_* lists: the
 * caller sends batch x-1 once x is decided (or x-1 is the last).  A key several
 * trainers use in x is SHARED: fetched by every trainer (if not cached),
 * its gradient all-reduced in the order below, updated identically
 * everywhere, and, when evicted, written back by table_mix64(k) % P.  With
 * lrpp = 0 every key is shared.  Every trainer's update of a row uses
 * exactly the gradient synchronous training would (the owner's own, or
 * the sum over trainers), so the model does not depend on any of this.
 * Delayed synchronization: a shared key also used by batch x+1 is
 * CRITICAL (synchronized before x+1 starts); the rest are DELAYED
 * (synchronized in the background during x+1's forward).  With L = 0, or
 * delayed = 0, every shared key is critical.  Both lists are in ascending
 * key order, the same on every trainer.
 *
 * Slots.  One slot space for all trainers (a shared row sits at the same
 * slot everywhere),
 * slots 0 .. cache_rows-1 (an owned row's slot is unused on the others).  A slot freed after batch y is reused only by a
 * key first used at y + L + 1 or later: the trainer's prefetch for batch z
 * may run while batches z-L .. z-1 still train, and starts only once every
 * trainer finished batch z - L - 1 (the GATE, below) -- so it never
 * overwrites a slot still in use or not yet written back.  Freed slots are
 * reused in the order they were freed; fresh slots are taken in
 * increasing order.  Everything here is deterministic: the same batches and
 * options give the same decisions.
 *
 * Consistency (DESIGN.md 4): a key not cached at x was last used at some
 * y with y + L < x, and written back after y; the prefetch of x waits for
 * the gate x - L - 1 >= y.  So the decisions plus the gate reproduce
 * synchronous training exactly, whatever L.
 *
 * Capacity.  The slots a run needs (the peak of slots in use or waiting
 * out their L batches) depends on the batches and L; cacher_need runs the
 * decisions over a list of batches and returns it exactly.  It has a
 * closed form, which cacher_needs computes for every L at once: a slot is
 * held by a key from its fetch until it is evicted after its last use u
 * of a run of uses at most L apart, and then waits until u + L + 1; so
 * after deciding x the slots held or waiting are exactly the keys whose
 * latest use u <= x has x - u <= L (each holds one slot, distinct keys
 * distinct slots), and the cacher takes a fresh slot only when every slot
 * is so held -- the need is the largest such count over the batches x,
 * the same for any P and lrpp.  With a
 * cache_rows limit, if a decision would need a slot and none may be used,
 * the cacher LOWERS L (each step lowers the wait of freed slots, so more
 * become usable at once) until it fits, and reports it; L never rises
 * again in a run.  Lowering is safe because a smaller L only makes the
 * gate of later batches later.  If even L = 0 cannot fit the batch,
 * cacher_decide fails with ERR_CONFIG naming cache_rows and the need.
 *
 * Checkpoints (DESIGN.md 5).  A checkpoint at iteration c needs every row
 * some trainer holds newer than the servers' copy written back WITHOUT
 * evicting it, each by exactly one trainer.  Between deciding c and
 * deciding c + 1 the cacher knows which trainer that is for each row
 * cached after c: its owner (LRPP), or table_mix64(k) % P for a shared
 * row -- the trainer that would write it back on eviction (cacher_flush).
 * A shared row no batch has updated since its fetch is listed too (the
 * cacher does not track whether a row changed; writing it again is
 * harmless).  Rows the window holds uncached are on the servers already.
 *
 * Cost: per distinct key of a batch, one hash update when it enters and
 * one lookup when it is decided, plus one lookup per id to map it to its
 * slot; nothing depends on L except the memory of the window (the plans
 * of L + 1 batches, kept by the caller).
 *
 * Threads: an cacher_t is used by one thread at a time.
 */
#ifndef CHANTER_CACHER_H
#define CHANTER_CACHER_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

typedef struct cacher_s cacher_t;

typedef struct cacher_opts_s {
  uint32_t trainers;   /* P >= 1 */
  uint32_t lookahead;  /* L (the start value; may be lowered, see above) */
  uint64_t cache_rows; /* slots; 0 = unlimited (cacher_need) */
  int lrpp;            /* 1: owned keys as above; 0: every key shared (fetched by all, synchronized) */
  int delayed;         /* 1: critical / delayed split; 0: all critical */
  uint64_t first;      /* the first batch pushed (0; a resumed job's c + 1): the cache starts empty there */
  uint64_t expect_keys; /* 0, or about how many distinct keys the first L + 1 batches hold: the map is sized
                           for them at once instead of growing while they enter (no decision depends on it) */
} cacher_opts_t;

/* The slot of an id of a table outside the cache (plan_drop_tables). */
#define CACHER_NO_SLOT UINT32_MAX

/* One trainer's part of the decisions for batch x. */
typedef struct cacher_tr_s {
  uint32_t *slots;          /* slot of each id of its share (the share's ids layout); CACHER_NO_SLOT for a table outside the cache */
  size_t n_ids;
  uint64_t *fetch_keys;     /* ascending: rows to fetch for x ... */
  uint32_t *fetch_slots;    /* ... and the slot each goes to */
  size_t n_fetch;
  uint64_t *write_back_keys;        /* ascending: rows it writes back after x ... */
  uint32_t *write_back_slots;       /* ... from these slots */
  size_t n_write_back;
  size_t n_keys;            /* distinct keys its samples use */
  size_t n_hits;            /* of those, already cached before x */
  size_t n_owned;         /* of those, owned by it (LRPP): updated by it alone */
  uint32_t *owned_slots;      /* rows it owns from x on, still cached after x */
  size_t n_owned_slots;
  uint32_t *stale_slots;    /* rows another trainer owns from x on: its copy is stale */
  size_t n_stale;
} cacher_tr_t;

typedef struct cacher_dec_s {
  uint64_t iteration;
  uint32_t lookahead; /* L in force for this batch */
  uint64_t gate;      /* the prefetch for x may start once every trainer finished the batches < gate (x - L, or 0) */
  uint32_t *critical; /* slots whose gradients are all-reduced before x + 1 (ascending key order) */
  size_t n_critical;
  uint32_t *delayed;  /* slots all-reduced in the background (ascending key order) */
  size_t n_delayed;
  uint64_t *critical_keys, *delayed_keys; /* the same rows' keys */
  uint32_t *replicate_slots;  /* BEFORE x (after x-1's update), these owned rows go from their owner to every trainer ... */
  uint32_t *replicate_owners; /* ... (this one) ... */
  uint64_t *replicate_keys;   /* ... (these keys): batch x has another trainer use them */
  size_t n_replicate;
  cacher_tr_t *tr;    /* P */
  uint32_t trainers;
  size_t n_unique;    /* distinct keys of x */
  size_t n_new;       /* of those, not cached before x */
  size_t n_evicted;   /* evicted after x */
  uint64_t slots_used; /* slots holding a key or waiting to be reusable, after x's decisions */
} cacher_dec_t;

/* 0, -EINVAL (P = 0), -ENOMEM. */
int cacher_create(const cacher_opts_t *o, cacher_t **out);
void cacher_destroy(cacher_t *c);

/* Batch p->iteration enters the window.  p must have been built with
 * PLAN_KEYS, batches must come in order (x = first, first + 1, ...), and p must
 * stay valid until cacher_decide has decided it.  0, -EINVAL (out of
 * order, not a KEYS plan, other P), -ENOMEM. */
int cacher_push(cacher_t *c, const plan_t *p);
/* No batch will be pushed after the last one: the window may run short. */
void cacher_end(cacher_t *c);
/* 1 when the oldest undecided batch can be decided (L batches after it have
 * entered, or the stream ended), else 0. */
int cacher_ready(const cacher_t *c);
/* Batches pushed and not yet decided. */
size_t cacher_window(const cacher_t *c);
/* L in force now (the start value, or lower after an overflow). */
uint32_t cacher_lookahead(const cacher_t *c);
/* Decides the oldest undecided batch into *d (owned by the caller; free
 * with cacher_dec_free).  0, -EAGAIN (not ready), ERR_CONFIG (cache_rows
 * too small even at L = 0; err says the need), -ENOMEM.  After a failure
 * the cacher_t is unusable. */
int cacher_decide(cacher_t *c, cacher_dec_t *d, char *err, size_t err_len);
void cacher_dec_free(cacher_dec_t *d);

/* The rows one trainer writes back for a checkpoint (cacher_flush). */
typedef struct cacher_flush_s {
  uint64_t *keys;  /* ascending ... */
  uint32_t *slots; /* ... and the slot each sits in */
  size_t n;
} cacher_flush_t;

/* What a checkpoint at the last decided batch c must write back: fills
 * fl[0 .. P) (the caller's array; the lists are malloc'ed, free them with
 * cacher_flush_free) with, for each trainer q, every row cached after c
 * whose current copy q holds and that q would write back on eviction --
 * owned by q, or shared with table_mix64(k) % P == q -- in ascending key
 * order, with its slot.  Each cached row is in exactly one list; rows
 * evicted after c (written back by c's decision) and rows of later
 * batches not cached yet are in none, so with L = 0 every list is empty
 * (an L lowered to 0 during the run leaves the rows cached before until
 * their next use).
 * Call it after cacher_decide(c) and before deciding c + 1: the ownership
 * it reads is the one after c (the hand-overs before c + 1 are found
 * while deciding c + 1, and only make a row shared, whose copies are then
 * all equal to the one listed).  The rows stay cached: a checkpoint
 * changes nothing here.  Before any decision every list is empty.
 * Cost O(map capacity + n log n): a whole pass over the map, meant for a
 * checkpoint, not for every batch.  0, -EINVAL (the cacher failed),
 * -ENOMEM (fl is then empty). */
int cacher_flush(const cacher_t *c, cacher_flush_t *fl);
/* Frees the lists of fl[0 .. P) and empties them (not fl itself). */
void cacher_flush_free(cacher_flush_t *fl, uint32_t P);

/* Slots in use now, the peak so far, keys cached now. */
uint64_t cacher_slots_used(const cacher_t *c);
uint64_t cacher_slots_peak(const cacher_t *c);
size_t cacher_cached(const cacher_t *c);

/* The exact slot count the decisions over plans[0..n) (consecutive
 * batches from plans[0].iteration, PLAN_KEYS) need at lookahead L: 0 and *need, or
 * -ENOMEM. */
int cacher_need(const plan_t *plans, size_t n, uint32_t P, uint32_t L, int lrpp, uint64_t *need);
/* need[L] = cacher_need(plans, n, P, L, lrpp) for every L <= max_l
 * (need[0 .. max_l], the caller's), exactly, in ONE pass over the keys
 * (see Capacity): about the cost of one cacher_need, whatever max_l.
 * 0, -EINVAL (plans not consecutive, or keys not ascending), -ENOMEM. */
int cacher_needs(const plan_t *plans, size_t n, uint32_t max_l, uint64_t *need);
/* The largest L <= max_l whose need over plans[0..n) is <= cache_rows
 * (cacher_needs: one pass).  *l = 0 with *need > cache_rows when even
 * L = 0 does not fit.  P and lrpp do not change the need (kept for the
 * callers).  0, -EINVAL or -ENOMEM. */
int cacher_auto(const plan_t *plans, size_t n, uint32_t P, uint64_t cache_rows, uint32_t max_l, int lrpp,
                uint32_t *l, uint64_t *need);

#endif
