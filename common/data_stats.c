/*
 * data_stats: what `chanter data stats` reports about a dataset's access
 * pattern -- the numbers that decide how much a lookahead cache can save:
 * per-table distinct rows, how concentrated accesses are (share of the
 * top 0.1% / 1% of rows), and distinct rows per batch at several batch
 * sizes.  Reads every sample once (records, then hash % table_rows).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "err.h"

/* open addressing, key + 1 stored (0 = empty) */
typedef struct cmap_s {
  uint64_t *keys, *cnt;
  size_t cap, n;
} cmap_t;

static int cmap_init(cmap_t *m, size_t cap) {
  m->cap = 16;
  while (m->cap < cap) m->cap <<= 1;
  m->n = 0;
  m->keys = calloc(m->cap, sizeof *m->keys);
  m->cnt = calloc(m->cap, sizeof *m->cnt);
  return m->keys && m->cnt ? 0 : -ENOMEM;
}

static void cmap_free(cmap_t *m) {
  free(m->keys);
  free(m->cnt);
  memset(m, 0, sizeof *m);
}

static void cmap_clear(cmap_t *m) {
  memset(m->keys, 0, m->cap * sizeof *m->keys);
  memset(m->cnt, 0, m->cap * sizeof *m->cnt);
  m->n = 0;
}

static int cmap_add(cmap_t *m, uint64_t key, uint64_t c) {
  if (2 * (m->n + 1) > m->cap) {
    cmap_t b;
    if (cmap_init(&b, m->cap * 2)) return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) cmap_add(&b, m->keys[i] - 1, m->cnt[i]);
    cmap_free(m);
    *m = b;
  }
  size_t mask = m->cap - 1, i = (size_t)tbl_mix64(key) & mask;
  while (m->keys[i] && m->keys[i] != key + 1) i = (i + 1) & mask;
  if (!m->keys[i]) {
    m->keys[i] = key + 1;
    m->n++;
  }
  m->cnt[i] += c;
  return 0;
}

static int desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* top shares from counts (sorted here) */
static void shares(uint64_t *c, size_t n, uint64_t rows, uint64_t total, data_table_profile_t *p) {
  qsort(c, n, sizeof *c, desc);
  uint64_t k01 = (rows + 999) / 1000, k1 = (rows + 99) / 100, s = 0;
  p->top_0_1 = p->top_1 = total ? 1.0 : 0.0;
  for (size_t i = 0; i < n; i++) {
    if (i == k01) p->top_0_1 = (double)s / (double)total;
    if (i == k1) p->top_1 = (double)s / (double)total;
    s += c[i];
  }
}

void data_profile_close(data_profile_t *p) {
  free(p->tables);
  p->tables = NULL;
}

int data_profile(data_source_t *d, data_profile_t *p, char *err, size_t err_len) {
  const data_schema_t *s = &d->schema;
  static const uint32_t sizes[DATA_PROFILE_BATCH_SIZES] = {1024, 4096, 16384};
  cmap_t *maps = NULL, set = {0};
  uint8_t *scratch = NULL;
  uint64_t *all = NULL;
  int rc = 0;
  memset(p, 0, sizeof *p);
  data_stats(d, &p->stats);
  p->n_tables = s->n_tables;
  p->tables = calloc(s->n_tables, sizeof *p->tables);
  maps = calloc(s->n_tables, sizeof *maps);
  scratch = malloc(d->record_bytes);
  if (!p->tables || !maps || !scratch) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint32_t t = 0; t < s->n_tables; t++)
    if ((rc = cmap_init(&maps[t], 1024)) != 0) goto out;
  const size_t hoff = 4 + 4 * (size_t)s->n_dense;
  for (uint64_t i = 0; i < d->samples; i++) {
    const uint8_t *rec;
    if ((rc = d->ops->rec(d, i, scratch, &rec, err, err_len)) != 0) goto out;
    const uint8_t *h = rec + hoff;
    for (uint32_t t = 0; t < s->n_tables; t++)
      for (uint32_t k = 0; k < s->hotness[t]; k++, h += 8) {
        uint64_t v;
        memcpy(&v, h, 8);
        if ((rc = cmap_add(&maps[t], v % s->table_rows[t], 1)) != 0) goto out;
      }
  }
  size_t total_distinct = 0;
  for (uint32_t t = 0; t < s->n_tables; t++) total_distinct += maps[t].n;
  if (!(all = malloc((total_distinct + 1) * sizeof *all))) {
    rc = -ENOMEM;
    goto out;
  }
  size_t na = 0;
  for (uint32_t t = 0; t < s->n_tables; t++) {
    data_table_profile_t *tp = &p->tables[t];
    uint64_t *c = all + na;
    size_t n = 0;
    for (size_t i = 0; i < maps[t].cap; i++)
      if (maps[t].keys[i]) c[n++] = maps[t].cnt[i];
    tp->rows = s->table_rows[t];
    tp->accesses = d->samples * s->hotness[t];
    tp->distinct = n;
    shares(c, n, tp->rows, tp->accesses, tp);
    na += n;
    p->overall.rows += tp->rows;
    p->overall.accesses += tp->accesses;
    p->overall.distinct += n;
    cmap_free(&maps[t]);
  }
  shares(all, na, p->overall.rows, p->overall.accesses, &p->overall);
  /* distinct keys per train batch */
  if (d->n_train) {
    for (int b = 0; b < DATA_PROFILE_BATCH_SIZES; b++) {
      uint32_t bs = sizes[b];
      uint64_t nb = d->n_train / bs, sum = 0;
      if (nb < 1) nb = 1;
      if (nb > 16) nb = 16;
      p->batch[b].batch_size = bs;
      p->batch[b].batches = (uint32_t)nb;
      p->batch[b].ids_per_batch = (double)bs * d->ids;
      if (!set.keys && (rc = cmap_init(&set, (size_t)2 * bs * d->ids)) != 0) goto out;
      for (uint64_t x = 0; x < nb; x++) {
        data_batch_t batch;
        if ((rc = data_read_batch(d, DATA_TRAIN, x, bs, &batch, err, err_len)) != 0) goto out;
        cmap_clear(&set);
        for (uint32_t t = 0; t < s->n_tables && !rc; t++)
          for (size_t i = batch.ids_off[t]; i < batch.ids_off[t + 1] && !rc; i++)
            rc = cmap_add(&set, TBL_KEY(t, batch.ids[i]), 1);
        data_batch_free(&batch);
        if (rc) goto out;
        sum += set.n;
      }
      p->batch[b].unique_rows = (double)sum / (double)nb;
    }
  }
out:
  if (rc == -ENOMEM) err_set(err, err_len, rc, "out of memory counting rows");
  if (maps)
    for (uint32_t t = 0; t < s->n_tables; t++) cmap_free(&maps[t]);
  free(maps);
  cmap_free(&set);
  free(scratch);
  free(all);
  if (rc) data_profile_close(p);
  return rc;
}
