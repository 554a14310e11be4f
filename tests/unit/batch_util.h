/*
 * batch_util: what the oracle's unit tests (test_oracle_cache,
 * test_oracle_laia) need to build batch streams by hand -- a seeded
 * splitmix64 stream and a data_batch_t from given ids.  Header-only
 * (static inline), included by the test files; free batches with
 * data_batch_free.
 */
#ifndef CHANTER_TEST_BATCH_UTIL_H
#define CHANTER_TEST_BATCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

/* The stream: set sm_state to seed it. */
static uint64_t sm_state;
static inline uint64_t splitmix(void) {
  uint64_t z = (sm_state += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double unif(void) { return (double)(splitmix() >> 11) * 0x1.0p-53; }

/* Batch x of n samples (no dense features; labels alternate 0, 1) with the
 * given ids (table-major, sample-major inside a table, as data_batch_t). */
static inline void make_batch(data_batch_t *b, uint64_t x, uint32_t n, uint32_t n_tables, const uint32_t *hotness,
                              const uint64_t *ids) {
  memset(b, 0, sizeof *b);
  b->iteration = x;
  b->n = n;
  b->n_tables = n_tables;
  b->hotness = malloc((n_tables + 1) * sizeof *b->hotness);
  memcpy(b->hotness, hotness, n_tables * sizeof *hotness);
  b->ids_off = malloc((n_tables + 1) * sizeof *b->ids_off);
  b->ids_off[0] = 0;
  for (uint32_t t = 0; t < n_tables; t++) b->ids_off[t + 1] = b->ids_off[t] + (size_t)n * hotness[t];
  size_t ni = b->ids_off[n_tables];
  b->labels = malloc((n + 1) * sizeof(float));
  b->dense = malloc(sizeof(float));
  b->ids = malloc((ni + 1) * sizeof(uint64_t));
  for (uint32_t i = 0; i < n; i++) b->labels[i] = (float)(i % 2);
  if (ni) memcpy(b->ids, ids, ni * sizeof *ids);
}

#endif
