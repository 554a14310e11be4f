/*
 * oracle_laia: locality-aware sample allocation (allocation = laia;
 * DESIGN.md section 4, papers/herald.txt 4.3).
 *
 * Which trainer trains which sample of batch x.  A row is HELD by trainer
 * t when the last batch that used it, within the last `window` batches,
 * used it from t alone (rows used from several trainers in their last
 * batch are held by nobody, nor are rows unused for longer than window
 * batches).  Samples are placed in batch order: sample i scores each
 * trainer by how many of its ids are rows that trainer holds, and goes to
 * the best-scoring trainer that still has room (equal shares: trainer t
 * gets B/P samples, one more when t < B % P); ties, and samples no trainer
 * holds a row of, go to a trainer drawn from (seed, x, i) among those
 * tied / with room.  Every sample of batch x is scored against the
 * holdings after batch x - 1; the holdings take batch x in only once all
 * its samples are placed.  (Letting the samples placed earlier in the
 * same batch attract the later ones was tried: the batch's hot rows then
 * drown the signal of the rows held from earlier batches, and on
 * Criteo-like data replications fell by 1% instead of 28%.)
 *
 * Why: with lookahead a row every use of which inside its cache lifetime
 * lands on one trainer is owned by it and never synchronized
 * (cacher.h); with `contiguous` or `random` moderately hot rows
 * land on every trainer.  Any allocation gives the same gradient sum, so
 * the model is the same up to the summation order of floating point.  The
 * allocation depends only on the batches, P, window and seed -- not on the
 * lookahead -- so runs with any L, cache policy or delayed sync are still
 * bit-identical to each other.
 *
 * Cost: two hash lookups per id of a scored table (score, then update)
 * and, per sample, work proportional to the trainers its rows touch;
 * independent of window.  With a profile (below) only the tables that
 * decide something are scored.
 * The map keeps the rows used in the last window batches (expired entries
 * are dropped when it grows).  Batches must come in order (x = the
 * previous x + 1, starting anywhere).  Not thread-safe: one caller.
 */
#ifndef CHANTER_LAIA_H
#define CHANTER_LAIA_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"

#define LAIA_WINDOW_MAX 1000000u

typedef struct laia_s laia_t;

typedef struct laia_opts_s {
  uint32_t trainers; /* P >= 1 */
  uint32_t window;   /* 1 .. LAIA_WINDOW_MAX batches */
  uint64_t seed;     /* the job seed: tie-breaking */
  /* Adaptive (Herald's profiler): the first `profile` batches score every
   * table and count, per table, the ids that found a held row; from then
   * on only the tables where at least `min_share` of the ids did are
   * scored and tracked (the others -- tiny tables whose rows every trainer
   * uses, huge ones whose rows are seen once -- cost two lookups an id and
   * decide nothing).  profile = 0: every table, always. */
  uint32_t profile;
  double min_share;
} laia_opts_t;

typedef struct laia_stats_s {
  uint64_t batches, samples;
  uint64_t scored;  /* samples some trainer held a row of */
  uint64_t best;    /* ... placed on a trainer holding the most of its rows (the others being full) */
  size_t rows_held; /* map entries (rows used in the last window batches, at most) */
  uint32_t tables, tables_scored; /* after the profile: the tables still scored */
} laia_stats_t;

/* 0, -EINVAL (P = 0, window out of range) or -ENOMEM. */
int laia_create(const laia_opts_t *o, laia_t **out);
void laia_destroy(laia_t *l);

/* Fills owner[0 .. b->n) for batch b and records its rows.  0, -EINVAL
 * (b->iteration not the one after the previous batch's) or -ENOMEM (the state
 * is unchanged then). */
int laia_assign(laia_t *l, const data_batch_t *b, uint32_t *owner);

void laia_stats(const laia_t *l, laia_stats_t *out);
/* The profile has ended (never without one). */
int laia_profiled(const laia_t *l);
/* Whether table t is scored (every table before the profile ends). */
int laia_table_scored(const laia_t *l, uint32_t t);
/* The share of table t's ids that found a held row during the profile
 * (NaN before it ends or without one). */
double laia_table_share(const laia_t *l, uint32_t t);
/* The iteration laia_assign expects next: the one after the last batch
 * assigned (0 before the first, which may then be any). */
uint64_t laia_next_iteration(const laia_t *l);
/* Makes x the first iteration a fresh allocator (no batch assigned yet)
 * accepts: a job resumed at x without laia's saved state (its checkpoint
 * had another allocation or trainer count) starts over there, and a batch
 * out of order is still refused.  0, or -EINVAL once a batch was assigned. */
int laia_start_at(laia_t *l, uint64_t x);

/* Checkpoints (DESIGN.md 5: the allocation's state is part of the
 * oracle's).  A job resumed after batch c must allocate batches c + 1, ...
 * exactly as the job that never stopped, so the saved state is all of it:
 * the holdings map (entry for entry, at its place, with its capacity, so
 * that even rows_held and when the map grows are the same), the next
 * expected iteration, the profile's counters and the tables it kept
 * scoring, and the statistics.  The ties need no state: each draw is a
 * function of (seed, iteration, sample).  The bytes are an explicit
 * little-endian format (laia.c) with the options the state was made with
 * and a checksum, the same on any host.
 *
 * laia_save: *buf (malloc'ed, *len bytes; the caller frees it).  Cost
 * O(map capacity) time and 24 bytes per map entry: for a checkpoint, not
 * every batch.  0 or -ENOMEM.  Does not change l.
 *
 * laia_load: a new laia_t (*out, laia_destroy) made with *o and holding the
 * state in buf: laia_assign then gives exactly the owners (and statistics)
 * the saved instance would have.  Refused, with a sentence in why:
 * -EINVAL for invalid options (as laia_create), ERR_CONFIG when buf was
 * made with other options (the sentence names the field and both values),
 * -EBADMSG when it is not a laia state, of an unknown version, truncated
 * or corrupt (checksum, or contents that laia_assign could never have
 * left), -ENOMEM.  *out is NULL on failure.  buf is only read; laia_save
 * only reads l, but not while laia_assign runs on it (one caller). */
int laia_save(const laia_t *l, uint8_t **buf, size_t *len);
int laia_load(const laia_opts_t *o, const uint8_t *buf, size_t len, laia_t **out, char *why, size_t why_len);

#endif
