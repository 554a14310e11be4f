/*
 * oracle_plan: what the oracle decides for one global batch, with
 * lookahead L = 0 (DESIGN.md sections 3 and 4, baseline).
 *
 * Sample allocation: which trainer trains which sample of batch x.
 * `contiguous` gives sample i to trainer i*P/B; `random` draws a
 * permutation seeded from (seed, x) and gives its contiguous chunks to the
 * trainers the same way (position j -> trainer j*P/B); `laia` is decided
 * by laia.h and given to plan_build_owned.  A trainer's
 * samples keep their order in the batch.
 *
 * What the oracle uses: PLAN_KEYS (the batch's distinct keys and
 * their users, for the cacher, cacher.h), PLAN_IDEAL and
 * PLAN_EVAL.  The key lists below (flags 0) are the synchronous
 * baseline written out directly, without the cacher: the tests check the
 * cacher's L = 0 decisions and the users against them.
 *
 * Key lists: K_p is the set of rows (key = TABLE_KEY(table, row)) the
 * samples of trainer p use.  A key in exactly one K_p is owned by p; a
 * key in two or more is shared.  Trainer p fetches sorted(K_p U shared)
 * before the step (every trainer holds every shared row, so that each
 * applies the same all-reduced update), all-reduces the gradients of
 * sorted(shared) (the same list on every trainer), and writes back its
 * owned keys plus the shared keys k with table_mix64(k) % P == p: every key
 * the batch touches is written back by exactly one trainer.  Lists are
 * sorted ascending; with `ideal` they are empty (rows live in the trainer).
 *
 * Cost: one pass over the batch's ids into an open-addressing hash table
 * (one table at a time, so that it stays in cache), an LSD radix sort of
 * each table's distinct rows, linear merges: O(ids + P * shared).
 *
 * Pure functions on caller-owned inputs; thread-safe (the oracle runs them
 * on libuv worker threads).
 */
#ifndef CHANTER_PLAN_H
#define CHANTER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"

enum { PLAN_ALLOC_CONTIGUOUS = 0, PLAN_ALLOC_RANDOM = 1, PLAN_ALLOC_LAIA = 2 /* laia.h */ };
#define PLAN_MAX_TRAINERS 16384 /* P of plan_build (the job allows 4096) */

/* plan_build flags */
#define PLAN_IDEAL 1u /* no fetch / sync / write-back lists */
#define PLAN_EVAL 2u  /* fetch = exactly the keys each share uses; no sync, no write-back */
#define PLAN_KEYS 4u  /* no fetch / sync / write-back lists: ukeys / users for the cacher (cacher.h) */

/* One trainer's part of a batch: its samples, a batch of their own (same
 * number, split and schema; owned by the plan), and its key lists. */
typedef struct plan_share_s {
  data_batch_t batch;      /* this trainer's samples, in the order of the global batch */
  uint64_t *fetch;         /* sorted keys to fetch before the step */
  size_t n_fetch;
  uint64_t *write_back;    /* sorted keys this trainer writes back */
  size_t n_write_back;
  size_t n_owned;        /* keys only this trainer uses */
} plan_share_t;

typedef struct plan_s {
  uint64_t iteration;      /* the batch number */
  uint32_t batch;          /* B: samples in the global batch */
  uint32_t trainers;       /* P */
  uint32_t n_dense, n_tables;
  uint32_t *hotness;       /* n_tables */
  plan_share_t *shares;  /* P */
  uint64_t *sync;          /* sorted shared keys, the same list for every trainer */
  size_t n_sync;
  size_t n_unique;         /* distinct keys in the batch (0 with PLAN_IDEAL) */
  uint64_t *ukeys;         /* PLAN_KEYS: the n_unique distinct keys, ascending ... */
  uint32_t *users;         /* ... and the trainer using each, UINT32_MAX when several do */
  uint8_t *partitioned;            /* n_tables, or NULL: tables outside the cache (plan_drop_tables) */
} plan_t;

/* Fills owner[0..batch_size) with the trainer of each sample of batch
 * `iteration`.  policy is PLAN_ALLOC_CONTIGUOUS or _RANDOM; random depends
 * only on (seed, iteration, batch_size, P).  0, or -EINVAL (P = 0, another policy: laia needs the history of
 * the batches before, laia.h). */
int plan_alloc(int policy, uint64_t seed, uint64_t iteration, uint32_t batch_size, uint32_t P, uint32_t *owner);

/* "contiguous" / "random" / "laia" -> PLAN_ALLOC_*; -EINVAL for
 * anything else. */
int plan_alloc_parse(const char *name);

/* Plans batch b for P trainers (see the file comment).  out is filled and
 * owned by the caller (plan_close).  0, -EINVAL (P = 0 or above
 * PLAN_MAX_TRAINERS, bad policy)
 * or -ENOMEM.  Any thread.  policy is contiguous or random; a laia
 * allocation (or any other) goes through plan_build_owned. */
int plan_build(const data_batch_t *b, uint32_t P, int policy, uint64_t seed, unsigned flags,
                      plan_t *out);
/* The same with sample i of b given to trainer owner[i] (< P, else
 * -EINVAL). */
int plan_build_owned(const data_batch_t *b, uint32_t P, const uint32_t *owner, unsigned flags,
                            plan_t *out);
/* plan_build (given NULL) or plan_build_owned (given: the trainer of each
 * sample) with skip: with PLAN_KEYS, the tables with skip[t] != 0 are left
 * out of the keys from the start -- the plan that plan_drop_tables(skip)
 * leaves of the whole one, bit for bit, without sorting those tables'
 * keys first (the oracle, once every table's strategy is known).  skip
 * NULL: plan_build / plan_build_owned. */
int plan_build_skip(const data_batch_t *b, uint32_t P, int policy, uint64_t seed, const uint32_t *given, unsigned flags,
                    const uint8_t *skip, plan_t *out);
void plan_close(plan_t *p);

/* Takes the tables with partitioned[t] != 0 (table_strategy = partition, strategy.h)
 * out of a PLAN_KEYS plan: their keys leave ukeys / users (n_unique
 * shrinks) and p->partitioned keeps a copy of partitioned, so that the cacher gives their
 * ids no slot (CACHER_NO_SLOT) and never caches their rows.  The shares'
 * batches keep every table.  partitioned NULL or all zero: nothing changes.
 * 0 or -ENOMEM. */
int plan_drop_tables(plan_t *p, const uint8_t *partitioned);

/* Sorts v[0..n) ascending (LSD radix sort; tmp holds n entries, or NULL to
 * allocate).  0 or -ENOMEM. */
int plan_sort_u64(uint64_t *v, size_t n, uint64_t *tmp);

/* Concatenates batches[0..n) (same schema) into *out (free with
 * data_batch_free); index = that of the first.  0, -EINVAL (schemas
 * differ, n = 0) or -ENOMEM. */
int plan_batch_concat(const data_batch_t *batches, size_t n, data_batch_t *out);

/* The first m samples of b (m <= b->n) as a batch of their own in *out
 * (free with data_batch_free).  0, -EINVAL (m > b->n) or -ENOMEM. */
int plan_batch_head(const data_batch_t *b, uint32_t m, data_batch_t *out);

#endif
