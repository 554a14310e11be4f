/*
 * fuzz_data_util: the data targets' one job: open the input as a dataset
 * (data_open, the public entry point: the readers take a path) with the
 * given --set overrides, then read a batch or two of each split, as a
 * data processor would.
 */
#ifndef CHANTER_FUZZ_DATA_UTIL_H
#define CHANTER_FUZZ_DATA_UTIL_H

#include "cfg.h"
#include "data.h"
#include "fuzz_util.h"

static inline void fuzz_data_open_read(const char *path, const char *const *sets, size_t n_sets) {
  cfg_t *c = NULL;
  char err[1024], kv[256];
  FUZZ_CHECK(cfg_create(&c) == 0);
  snprintf(kv, sizeof kv, "dataset=%s", path);
  FUZZ_CHECK(cfg_set(c, kv, "fuzz", err, sizeof err) == 0);
  for (size_t i = 0; i < n_sets; i++) {
    if (cfg_set(c, sets[i], "fuzz", err, sizeof err) != 0) {
      fprintf(stderr, "fuzz: --set %s: %s\n", sets[i], err);
      abort();
    }
  }
  data_source_t *d = NULL;
  if (data_open(c, &d, err, sizeof err) == 0) {
    data_stats_t st;
    data_stats(d, &st);
    FUZZ_CHECK(st.train_samples + st.test_samples == st.samples);
    const data_schema_t *s = data_schema(d);
    for (int split = DATA_TRAIN; split <= DATA_TEST; split++) {
      for (uint64_t x = 0; x < 2; x++) {
        data_batch_t b;
        memset(&b, 0, sizeof b);
        if (data_read_batch(d, split, x, 3, &b, err, sizeof err) != 0) break;
        FUZZ_CHECK(b.n == 3 && b.n_tables == s->n_tables && b.n_dense == s->n_dense);
        for (uint32_t i = 0; i < b.n; i++) FUZZ_CHECK(b.labels[i] == 0.0f || b.labels[i] == 1.0f);
        volatile float f = 0;
        for (size_t i = 0; i < (size_t)b.n * b.n_dense; i++) f += b.dense[i];
        (void)f;
        for (uint32_t t = 0; t < b.n_tables; t++)
          for (size_t i = b.ids_off[t]; i < b.ids_off[t + 1]; i++) FUZZ_CHECK(b.ids[i] < s->table_rows[t]);
        data_batch_free(&b);
      }
    }
    data_close(d);
  } else {
    FUZZ_CHECK(err[0] != 0);
  }
  cfg_destroy(c);
}

#endif
