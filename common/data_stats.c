/*
 * data_stats: what `chanter data stats` reports about a dataset's access
 * pattern -- the numbers that decide how much a lookahead cache can save:
 * per-table distinct rows, how concentrated accesses are (share of the
 * top 0.1% / 1% of rows), and distinct rows per batch at several batch
 * sizes -- and whether table_rows is too small for the data: distinct raw
 * values against rows, and the share of accesses landing on rows that
 * several raw values were merged into by the modulo.  Reads every sample
 * once (records, then hash % table_rows).
 *
 * Merged rows cost one 64-bit hash per row seen: each row keeps the first
 * raw value's hash that reached it, and is merged as soon as another one
 * does.  Counting distinct raw values also needs every other value of a
 * merged row, in a per-table hash set of 8-byte entries, within
 * data__profile_raw_bytes over all tables (see data.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "err.h"

size_t data__profile_raw_bytes = DATA_PROFILE_RAW_BYTES;

/* Counts by key: open addressing, key + 1 stored (0 = empty).  A map that
 * tracks (per-table rows) also keeps, per key, the first hash seen and
 * whether another one came. */
typedef struct cmap_s {
  uint64_t *keys, *cnt;
  uint64_t *first; /* tracking maps only */
  uint8_t *merged; /* tracking maps only */
  size_t cap, n;
} cmap_t;

static void cmap_free(cmap_t *m) {
  free(m->keys);
  free(m->cnt);
  free(m->first);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

static int cmap_init(cmap_t *m, size_t cap, int track) {
  memset(m, 0, sizeof *m);
  m->cap = 16;
  while (m->cap < cap) m->cap <<= 1;
  m->keys = calloc(m->cap, sizeof *m->keys);
  m->cnt = calloc(m->cap, sizeof *m->cnt);
  if (track) {
    m->first = calloc(m->cap, sizeof *m->first);
    m->merged = calloc(m->cap, sizeof *m->merged);
  }
  if (m->keys && m->cnt && (!track || (m->first && m->merged))) return 0;
  cmap_free(m);
  return -ENOMEM;
}

static void cmap_clear(cmap_t *m) {
  memset(m->keys, 0, m->cap * sizeof *m->keys);
  memset(m->cnt, 0, m->cap * sizeof *m->cnt);
  m->n = 0;
}

/* key's slot, or the empty slot where it goes */
static size_t cmap_slot(const cmap_t *m, uint64_t key) {
  size_t mask = m->cap - 1, i = (size_t)table_mix64(key) & mask;
  while (m->keys[i] && m->keys[i] != key + 1) i = (i + 1) & mask;
  return i;
}

/* Adds c to key's count; *slot (if given) is its slot.  1 if key is new,
 * 0 if not, -ENOMEM. */
static int cmap_add(cmap_t *m, uint64_t key, uint64_t c, size_t *slot) {
  if (2 * (m->n + 1) > m->cap) {
    cmap_t b;
    if (cmap_init(&b, m->cap * 2, m->first != NULL)) return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) {
        size_t j = cmap_slot(&b, m->keys[i] - 1);
        b.keys[j] = m->keys[i];
        b.cnt[j] = m->cnt[i];
        if (b.first) b.first[j] = m->first[i], b.merged[j] = m->merged[i];
      }
    b.n = m->n;
    cmap_free(m);
    *m = b;
  }
  size_t i = cmap_slot(m, key);
  int fresh = !m->keys[i];
  if (fresh) {
    m->keys[i] = key + 1;
    m->n++;
  }
  m->cnt[i] += c;
  if (slot) *slot = i;
  return fresh;
}

/* A set of 64-bit hashes: 8 bytes an entry, load at most 0.7, 0 kept
 * aside.  Grows only while *budget (bytes, shared by all tables) allows. */
typedef struct hset_s {
  uint64_t *keys;
  size_t cap, n; /* n counts the zero key too */
  int has_zero;
} hset_t;

/* 0: key present or added; 1: absent and no room left within the budget
 * (not counted); -ENOMEM. */
static int hset_add(hset_t *h, uint64_t key, size_t *budget) {
  if (key == 0) {
    h->n += !h->has_zero;
    h->has_zero = 1;
    return 0;
  }
  int full = 10 * (h->n + 1) > 7 * h->cap;
  if (full) {
    size_t cap = h->cap ? 2 * h->cap : 1024, need = (cap - h->cap) * sizeof *h->keys;
    if (need <= *budget) {
      uint64_t *k = calloc(cap, sizeof *k);
      if (!k) return -ENOMEM;
      for (size_t i = 0; i < h->cap; i++)
        if (h->keys[i]) {
          size_t j = (size_t)table_mix64(h->keys[i]) & (cap - 1);
          while (k[j]) j = (j + 1) & (cap - 1);
          k[j] = h->keys[i];
        }
      free(h->keys);
      h->keys = k;
      h->cap = cap;
      *budget -= need;
      full = 0;
    }
  }
  if (!h->cap) return 1;
  size_t mask = h->cap - 1, i = (size_t)table_mix64(key) & mask;
  while (h->keys[i] && h->keys[i] != key) i = (i + 1) & mask;
  if (h->keys[i]) return 0;
  if (full) return 1;
  h->keys[i] = key;
  h->n++;
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
  hset_t *raw = NULL; /* per table: raw values (hashes) of merged rows but their row's first */
  int *inexact = NULL;
  size_t budget = data__profile_raw_bytes;
  uint8_t *scratch = NULL;
  uint64_t *all = NULL;
  int rc = 0;
  memset(p, 0, sizeof *p);
  data_stats(d, &p->stats);
  p->n_tables = s->n_tables;
  p->tables = calloc(s->n_tables, sizeof *p->tables);
  maps = calloc(s->n_tables, sizeof *maps);
  raw = calloc(s->n_tables, sizeof *raw);
  inexact = calloc(s->n_tables, sizeof *inexact);
  scratch = malloc(d->record_bytes);
  if (!p->tables || !maps || !raw || !inexact || !scratch) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint32_t t = 0; t < s->n_tables; t++)
    if ((rc = cmap_init(&maps[t], 1024, 1)) != 0) goto out;
  const size_t hoff = 4 + 4 * (size_t)s->n_dense;
  for (uint64_t i = 0; i < d->samples; i++) {
    const uint8_t *rec;
    if ((rc = d->ops->rec(d, i, scratch, &rec, err, err_len)) != 0) goto out;
    const uint8_t *h = rec + hoff;
    for (uint32_t t = 0; t < s->n_tables; t++)
      for (uint32_t k = 0; k < s->hotness[t]; k++, h += 8) {
        uint64_t v;
        size_t at;
        memcpy(&v, h, 8);
        int fresh = cmap_add(&maps[t], v % s->table_rows[t], 1, &at);
        if (fresh < 0) {
          rc = fresh;
          goto out;
        }
        if (fresh) {
          maps[t].first[at] = v;
        } else if (maps[t].first[at] != v) {
          maps[t].merged[at] = 1;
          int r = hset_add(&raw[t], v, &budget);
          if (r < 0) {
            rc = r;
            goto out;
          }
          inexact[t] |= r;
        }
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
      if (maps[t].keys[i]) {
        c[n++] = maps[t].cnt[i];
        if (maps[t].merged[i]) {
          tp->merged_rows++;
          tp->merged_accesses += maps[t].cnt[i];
        }
      }
    tp->rows = s->table_rows[t];
    tp->accesses = d->samples * s->hotness[t];
    tp->distinct = n;
    /* each row seen holds its first raw value; the set holds the others */
    tp->raw_values = n + raw[t].n;
    tp->raw_exact = !inexact[t];
    tp->merged_share = tp->accesses ? (double)tp->merged_accesses / (double)tp->accesses : 0;
    shares(c, n, tp->rows, tp->accesses, tp);
    na += n;
    p->overall.rows += tp->rows;
    p->overall.accesses += tp->accesses;
    p->overall.distinct += n;
    p->overall.raw_values += tp->raw_values;
    p->overall.merged_rows += tp->merged_rows;
    p->overall.merged_accesses += tp->merged_accesses;
    cmap_free(&maps[t]);
    free(raw[t].keys);
    raw[t].keys = NULL;
  }
  shares(all, na, p->overall.rows, p->overall.accesses, &p->overall);
  p->overall.raw_exact = 1;
  for (uint32_t t = 0; t < s->n_tables; t++) p->overall.raw_exact &= p->tables[t].raw_exact;
  p->overall.merged_share =
      p->overall.accesses ? (double)p->overall.merged_accesses / (double)p->overall.accesses : 0;
  /* distinct keys per train batch */
  if (d->n_train) {
    for (int b = 0; b < DATA_PROFILE_BATCH_SIZES; b++) {
      uint32_t batch_size = sizes[b];
      uint64_t nb = d->n_train / batch_size, sum = 0;
      if (nb < 1) nb = 1;
      if (nb > 16) nb = 16;
      p->batch[b].batch_size = batch_size;
      p->batch[b].batches = (uint32_t)nb;
      p->batch[b].ids_per_batch = (double)batch_size * d->ids;
      if (!set.keys && (rc = cmap_init(&set, (size_t)2 * batch_size * d->ids, 0)) != 0) goto out;
      for (uint64_t x = 0; x < nb; x++) {
        data_batch_t batch;
        if ((rc = data_read_batch(d, DATA_TRAIN, x, batch_size, &batch, err, err_len)) != 0) goto out;
        cmap_clear(&set);
        for (uint32_t t = 0; t < s->n_tables && !rc; t++)
          for (size_t i = batch.ids_off[t]; i < batch.ids_off[t + 1] && !rc; i++)
            rc = cmap_add(&set, TABLE_KEY(t, batch.ids[i]), 1, NULL) < 0 ? -ENOMEM : 0;
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
  if (raw)
    for (uint32_t t = 0; t < s->n_tables; t++) free(raw[t].keys);
  free(raw);
  free(inexact);
  cmap_free(&set);
  free(scratch);
  free(all);
  if (rc) data_profile_close(p);
  return rc;
}

int data_locality(data_source_t *d, uint32_t batch_size, uint32_t trainers, uint32_t window, uint32_t batches,
                  data_locality_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  out->batch_size = batch_size;
  out->trainers = trainers;
  out->window = window;
  if (!batch_size || !trainers || !window)
    return err_set(err, err_len, -EINVAL, "locality: batch size, trainers and window must be > 0");
  uint64_t avail = d->n_train / batch_size, total = (uint64_t)window + batches;
  if (total > avail) total = avail;
  if (total <= window) return 0;
  const data_schema_t *s = &d->schema;
  cmap_t *last = calloc(trainers, sizeof *last); /* per trainer: key -> last batch that used it, + 1 */
  int rc = last ? 0 : -ENOMEM;
  for (uint32_t r = 0; r < trainers && !rc; r++) rc = cmap_init(&last[r], 1024, 0);
  for (uint64_t x = 0; x < total && !rc; x++) {
    data_batch_t b;
    if ((rc = data_read_batch(d, DATA_TRAIN, x, batch_size, &b, err, err_len)) != 0) break;
    for (uint32_t r = 0; r < trainers && !rc; r++) {
      uint64_t lo = (uint64_t)r * batch_size / trainers, hi = (uint64_t)(r + 1) * batch_size / trainers;
      for (uint32_t t = 0; t < s->n_tables && !rc; t++) {
        uint32_t h = b.hotness[t];
        for (size_t i = b.ids_off[t] + lo * h; i < b.ids_off[t] + hi * h; i++) {
          size_t at;
          int fresh = cmap_add(&last[r], TABLE_KEY(t, b.ids[i]), 0, &at);
          if (fresh < 0) {
            rc = -ENOMEM;
            break;
          }
          /* 0: never, else 2 * (last batch + 1) + whether that batch found it in its window */
          uint64_t prev = last[r].cnt[at], pb = prev >> 1;
          if (pb == x + 1) { /* again in this batch */
            if (x >= window) out->accesses++, out->reused_accesses += prev & 1;
            continue;
          }
          int hit = pb && x - (pb - 1) <= window;
          if (x >= window) out->rows++, out->reused += hit, out->accesses++, out->reused_accesses += hit;
          last[r].cnt[at] = 2 * (x + 1) + (uint64_t)hit;
        }
      }
    }
    data_batch_free(&b);
  }
  if (!rc) {
    out->batches = (uint32_t)(total - window);
    out->share = out->rows ? (double)out->reused / (double)out->rows : 0;
    out->access_share = out->accesses ? (double)out->reused_accesses / (double)out->accesses : 0;
  } else if (rc == -ENOMEM) {
    err_set(err, err_len, rc, "out of memory measuring locality");
  }
  if (last)
    for (uint32_t r = 0; r < trainers; r++) cmap_free(&last[r]);
  free(last);
  return rc;
}

int data_floor(data_source_t *d, uint32_t batch_size, uint32_t trainers, uint32_t window, uint32_t batches,
               data_floor_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  out->batch_size = batch_size;
  out->trainers = trainers;
  out->window = window;
  if (!batch_size || !trainers) return err_set(err, err_len, -EINVAL, "floor: batch size and trainers must be > 0");
  uint64_t avail = d->n_train / batch_size, n = batches < avail ? batches : avail;
  const data_schema_t *s = &d->schema;
  cmap_t last, in; /* key -> last batch that used it + 1; key -> 1 + the first trainer using it in this batch */
  int rc = cmap_init(&last, 1 << 16, 0);
  if (!rc && (rc = cmap_init(&in, 1 << 14, 0)) != 0) cmap_free(&last);
  if (rc) return err_set(err, err_len, -ENOMEM, "out of memory measuring the traffic floor");
  for (uint64_t x = 0; x < n && !rc; x++) {
    data_batch_t b;
    if ((rc = data_read_batch(d, DATA_TRAIN, x, batch_size, &b, err, err_len)) != 0) break;
    cmap_clear(&in);
    for (uint32_t r = 0; r < trainers && !rc; r++) {
      uint64_t lo = (uint64_t)r * batch_size / trainers, hi = (uint64_t)(r + 1) * batch_size / trainers;
      for (uint32_t t = 0; t < s->n_tables && !rc; t++) {
        uint32_t h = b.hotness[t];
        for (size_t i = b.ids_off[t] + lo * h; i < b.ids_off[t] + hi * h; i++) {
          uint64_t key = TABLE_KEY(t, b.ids[i]);
          size_t at;
          int fresh = cmap_add(&in, key, 0, &at);
          if (fresh < 0) {
            rc = -ENOMEM;
            break;
          }
          if (!fresh) { /* seen in this batch: by another trainer for the first time? */
            if (in.cnt[at] != r + 1 && in.cnt[at] != UINT64_MAX) out->shared++, in.cnt[at] = UINT64_MAX;
            continue;
          }
          in.cnt[at] = r + 1;
          size_t la;
          if ((fresh = cmap_add(&last, key, 0, &la)) < 0) {
            rc = -ENOMEM;
            break;
          }
          uint64_t pb = last.cnt[la]; /* 0: never */
          if (!pb || x - (pb - 1) > window) out->first_use++;
          last.cnt[la] = x + 1;
        }
      }
    }
    data_batch_free(&b);
  }
  if (!rc) {
    out->batches = (uint32_t)n;
    out->per_iteration = n ? (double)(out->first_use + out->shared) / (double)n : 0;
  } else if (rc == -ENOMEM) {
    err_set(err, err_len, rc, "out of memory measuring the traffic floor");
  }
  cmap_free(&in);
  cmap_free(&last);
  return rc;
}
