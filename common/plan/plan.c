/* oracle_plan: see plan.h. */
#include "plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

int plan_alloc_parse(const char *name) {
  if (!name) return -EINVAL;
  if (!strcmp(name, "contiguous")) return PLAN_ALLOC_CONTIGUOUS;
  if (!strcmp(name, "random")) return PLAN_ALLOC_RANDOM;
  if (!strcmp(name, "laia")) return PLAN_ALLOC_LAIA;
  return -EINVAL;
}

/* malloc sizes: never 0 */
static inline size_t nz(size_t n) { return n ? n : 1; }

/* Trainer of position j of B among P: floor(j * P / B). */
static inline uint32_t chunk_of(uint64_t j, uint32_t batch_size, uint32_t P) { return (uint32_t)(j * P / batch_size); }

int plan_alloc(int policy, uint64_t seed, uint64_t iteration, uint32_t batch_size, uint32_t P, uint32_t *owner) {
  if (P == 0) return -EINVAL;
  if (policy == PLAN_ALLOC_CONTIGUOUS) {
    for (uint32_t i = 0; i < batch_size; i++) owner[i] = chunk_of(i, batch_size, P);
    return 0;
  }
  if (policy != PLAN_ALLOC_RANDOM) return -EINVAL;
  if (batch_size == 0) return 0;
  uint32_t *perm = malloc((size_t)batch_size * sizeof *perm);
  if (!perm) return -ENOMEM;
  for (uint32_t i = 0; i < batch_size; i++) perm[i] = i;
  /* Fisher-Yates with a counter-based stream of (seed, iteration) */
  uint64_t s = table_mix64(seed ^ table_mix64(iteration ^ UINT64_C(0x616c6c6f63617465)));
  for (uint32_t j = batch_size - 1; j > 0; j--) {
    uint64_t r = table_mix64(s + j);
    uint32_t k = (uint32_t)(((unsigned __int128)r * (j + 1)) >> 64);
    uint32_t t = perm[j];
    perm[j] = perm[k];
    perm[k] = t;
  }
  for (uint32_t j = 0; j < batch_size; j++) owner[perm[j]] = chunk_of(j, batch_size, P);
  free(perm);
  return 0;
}

/* ---- sorting */

static void insertion_sort(uint64_t *v, size_t n) {
  for (size_t i = 1; i < n; i++) {
    uint64_t k = v[i];
    size_t j = i;
    while (j > 0 && v[j - 1] > k) {
      v[j] = v[j - 1];
      j--;
    }
    v[j] = k;
  }
}

/* LSD radix sort of v on bytes [lo, 8) of each value (lower bytes are
 * ignored: callers keep flags there); passes where every value has the
 * same byte are skipped, so table keys of a few rows sort in a few passes. */
static int radix_sort(uint64_t *v, size_t n, uint64_t *tmp, int lo) {
  if (n < 64) {
    if (lo == 0) {
      insertion_sort(v, n);
    } else {
      for (size_t i = 1; i < n; i++) {
        uint64_t k = v[i];
        size_t j = i;
        while (j > 0 && (v[j - 1] >> (8 * lo)) > (k >> (8 * lo))) {
          v[j] = v[j - 1];
          j--;
        }
        v[j] = k;
      }
    }
    return 0;
  }
  uint64_t *own = NULL;
  if (!tmp && !(tmp = own = malloc(n * sizeof *tmp))) return -ENOMEM;
  size_t (*cnt)[256] = calloc(8, sizeof *cnt);
  if (!cnt) {
    free(own);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t k = v[i];
    for (int b = lo; b < 8; b++) cnt[b][(k >> (8 * b)) & 255]++;
  }
  uint64_t *src = v, *dst = tmp;
  for (int b = lo; b < 8; b++) {
    if (cnt[b][(v[0] >> (8 * b)) & 255] == n) continue; /* every value has the same byte here */
    size_t off = 0;
    for (int d = 0; d < 256; d++) {
      size_t c = cnt[b][d];
      cnt[b][d] = off;
      off += c;
    }
    for (size_t i = 0; i < n; i++) dst[cnt[b][(src[i] >> (8 * b)) & 255]++] = src[i];
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != v) memcpy(v, src, n * sizeof *v);
  free(cnt);
  free(own);
  return 0;
}

int plan_sort_u64(uint64_t *v, size_t n, uint64_t *tmp) { return radix_sort(v, n, tmp, 0); }

/* ---- the key table
 *
 * One table at a time (keys of different tables never collide), so the
 * hash table is sized by the largest table's ids in the batch and stays in
 * cache.  A cell is one uint64: row << 16 | owner << 2 | shared << 1 | 1,
 * 0 when empty (rows < 2^48, owners < 2^14); sorting cell values on their
 * top 6 bytes sorts by row. */

#define CELL_USED 1u
#define CELL_SHARED 2u
#define CELL_OWNER(s) ((uint32_t)(((s) >> 2) & 0x3fff))
#define CELL_ROW(s) ((s) >> 16)

typedef struct keytab_s {
  uint64_t *cells;
  uint64_t mask;
  int shift;
  uint32_t *used; /* cell index of each distinct row, in insertion order */
  size_t n_used;
  uint64_t *vals, *tmp; /* scratch: the distinct cell values, sorted */
} keytab_t;

static int keytab_init(keytab_t *k, size_t max_keys) {
  size_t cap = 16;
  int bits = 4;
  while (cap < 2 * max_keys) {
    cap <<= 1;
    bits++;
  }
  memset(k, 0, sizeof *k);
  k->cells = calloc(cap, sizeof *k->cells);
  k->used = malloc(nz(max_keys) * sizeof *k->used);
  k->vals = malloc(nz(max_keys) * sizeof *k->vals);
  k->tmp = malloc(nz(max_keys) * sizeof *k->tmp);
  if (!k->cells || !k->used || !k->vals || !k->tmp) {
    free(k->cells);
    free(k->used);
    free(k->vals);
    free(k->tmp);
    return -ENOMEM;
  }
  k->mask = cap - 1;
  k->shift = 64 - bits;
  return 0;
}

static void keytab_close(keytab_t *k) {
  free(k->cells);
  free(k->used);
  free(k->vals);
  free(k->tmp);
}

/* Records that trainer `owner` uses row (of the current table). */
static inline void keytab_add(keytab_t *k, uint64_t row, uint32_t owner) {
  uint64_t i = (row * UINT64_C(0x9e3779b97f4a7c15)) >> k->shift;
  for (;; i = (i + 1) & k->mask) {
    uint64_t s = k->cells[i];
    if (!s) {
      k->cells[i] = row << 16 | (uint64_t)owner << 2 | CELL_USED;
      k->used[k->n_used++] = (uint32_t)i;
      return;
    }
    if (CELL_ROW(s) == row) {
      if (CELL_OWNER(s) != owner) k->cells[i] = s | CELL_SHARED;
      return;
    }
  }
}

/* The current table's distinct cell values, sorted by row, into k->vals;
 * empties the table for the next one.  Returns how many. */
static size_t keytab_take(keytab_t *k) {
  size_t n = k->n_used;
  for (size_t i = 0; i < n; i++) {
    k->vals[i] = k->cells[k->used[i]];
    k->cells[k->used[i]] = 0;
  }
  k->n_used = 0;
  radix_sort(k->vals, n, k->tmp, 2);
  return n;
}

/* Sorted distinct keys of one share (eval: exactly what it uses). */
static int share_keys(const data_batch_t *sh, uint32_t n_tables, const uint32_t *hotness, uint64_t **out,
                      size_t *n_out) {
  size_t most = 0;
  for (uint32_t t = 0; t < n_tables; t++)
    if ((size_t)sh->n * hotness[t] > most) most = (size_t)sh->n * hotness[t];
  keytab_t k;
  int rc = keytab_init(&k, most);
  if (rc) return rc;
  uint64_t *v = malloc(nz(data_batch_n_ids(sh)) * sizeof *v);
  if (!v) {
    keytab_close(&k);
    return -ENOMEM;
  }
  size_t o = 0, m = 0;
  for (uint32_t t = 0; t < n_tables; t++) {
    size_t c = (size_t)sh->n * hotness[t];
    for (size_t i = 0; i < c; i++) keytab_add(&k, sh->ids[o + i], 0);
    o += c;
    size_t u = keytab_take(&k);
    for (size_t i = 0; i < u; i++) v[m++] = TABLE_KEY(t, CELL_ROW(k.vals[i]));
  }
  keytab_close(&k);
  *out = v;
  *n_out = m;
  return 0;
}

/* ---- the plan */

void plan_close(plan_t *p) {
  if (!p) return;
  for (uint32_t i = 0; p->shares && i < p->trainers; i++) {
    plan_share_t *s = &p->shares[i];
    data_batch_free(&s->batch);
    free(s->fetch);
    free(s->write_back);
  }
  free(p->shares);
  free(p->hotness);
  free(p->sync);
  free(p->ukeys);
  free(p->users);
  free(p->partitioned);
  memset(p, 0, sizeof *p);
}

int plan_drop_tables(plan_t *p, const uint8_t *partitioned) {
  int any = 0;
  for (uint32_t t = 0; partitioned && t < p->n_tables; t++) any |= partitioned[t] != 0;
  if (!any) return 0;
  if (!p->partitioned && !(p->partitioned = malloc(p->n_tables))) return -ENOMEM;
  memcpy(p->partitioned, partitioned, p->n_tables);
  size_t w = 0;
  for (size_t i = 0; i < p->n_unique; i++) {
    uint64_t t = TABLE_ID(p->ukeys[i]);
    if (t < p->n_tables && partitioned[t]) continue;
    p->ukeys[w] = p->ukeys[i];
    if (p->users) p->users[w] = p->users[i];
    w++;
  }
  p->n_unique = w;
  return 0;
}

/* Gathers each trainer's samples (in batch order) from b. */
static int gather(const data_batch_t *b, const uint32_t *owner, plan_t *p) {
  uint32_t P = p->trainers, n = b->n;
  size_t hot_sum = 0;
  for (uint32_t t = 0; t < b->n_tables; t++) hot_sum += b->hotness[t];
  uint32_t *order = malloc(((size_t)n + 1) * sizeof *order), *start = calloc((size_t)P + 1, sizeof *start);
  if (!order || !start) {
    free(order);
    free(start);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) p->shares[owner[i]].batch.n++;
  for (uint32_t q = 0; q < P; q++) start[q + 1] = start[q] + p->shares[q].batch.n;
  {
    uint32_t *fill = calloc(P, sizeof *fill);
    if (!fill) {
      free(order);
      free(start);
      return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) order[start[owner[i]] + fill[owner[i]]++] = i;
    free(fill);
  }
  int rc = 0;
  for (uint32_t q = 0; q < P && !rc; q++) {
    data_batch_t *s = &p->shares[q].batch;
    size_t m = s->n;
    s->iteration = b->iteration;
    s->split = b->split;
    s->n_dense = b->n_dense;
    s->n_tables = b->n_tables;
    s->hotness = malloc(((size_t)b->n_tables + 1) * sizeof *s->hotness);
    s->ids_off = malloc(((size_t)b->n_tables + 1) * sizeof *s->ids_off);
    s->labels = malloc((m ? m : 1) * sizeof(float));
    s->dense = malloc(nz(m * b->n_dense) * sizeof(float));
    s->ids = malloc(nz(m * hot_sum) * sizeof(uint64_t));
    if (!s->hotness || !s->ids_off || !s->labels || !s->dense || !s->ids) {
      rc = -ENOMEM;
      break;
    }
    memcpy(s->hotness, b->hotness, b->n_tables * sizeof *s->hotness);
    s->ids_off[0] = 0;
    for (uint32_t t = 0; t < b->n_tables; t++) s->ids_off[t + 1] = s->ids_off[t] + m * b->hotness[t];
    const uint32_t *mine = order + start[q];
    for (size_t j = 0; j < m; j++) {
      s->labels[j] = b->labels[mine[j]];
      memcpy(s->dense + j * b->n_dense, b->dense + (size_t)mine[j] * b->n_dense, b->n_dense * sizeof(float));
    }
    size_t o = 0;
    for (uint32_t t = 0; t < b->n_tables; t++) {
      uint32_t h = b->hotness[t];
      const uint64_t *src = b->ids + b->ids_off[t];
      for (size_t j = 0; j < m; j++) {
        memcpy(s->ids + o, src + (size_t)mine[j] * h, h * sizeof(uint64_t));
        o += h;
      }
    }
  }
  free(order);
  free(start);
  return rc;
}

/* out = sorted union of disjoint sorted a and b (b filtered by keep when
 * given: b[i] is taken if b_owner[i] == who). */
static uint64_t *merge(const uint64_t *a, size_t na, const uint64_t *b, size_t nb, const uint32_t *b_owner,
                       uint32_t who, size_t *n_out) {
  size_t cap = na + nb;
  uint64_t *o = malloc((cap ? cap : 1) * sizeof *o);
  if (!o) return NULL;
  size_t i = 0, j = 0, k = 0;
  while (i < na || j < nb) {
    if (j < nb && b_owner && b_owner[j] != who) {
      j++;
      continue;
    }
    if (j >= nb || (i < na && a[i] < b[j])) o[k++] = a[i++];
    else o[k++] = b[j++];
  }
  *n_out = k;
  return o;
}

static int plan_keys(const data_batch_t *b, const uint32_t *owner, unsigned flags, const uint8_t *skip, plan_t *p) {
  uint32_t P = p->trainers;
  size_t total = b->ids_off[b->n_tables], most = 0;
  for (uint32_t t = 0; t < b->n_tables; t++)
    if (b->ids_off[t + 1] - b->ids_off[t] > most) most = b->ids_off[t + 1] - b->ids_off[t];
  keytab_t k;
  int rc = keytab_init(&k, most);
  if (rc) return rc;
  /* every distinct key in ascending order, with its trainer (UINT32_MAX: shared) */
  uint64_t *ukey = malloc(nz(total) * sizeof *ukey);
  uint32_t *uowner = malloc(nz(total) * sizeof *uowner), *sync_write_back = NULL;
  size_t *cnt = calloc(P, sizeof *cnt), *fill = calloc(P, sizeof *fill), n_shared = 0, u = 0;
  uint64_t **owned = calloc(P, sizeof *owned);
  if (!ukey || !uowner || !cnt || !fill || !owned) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint32_t t = 0; t < b->n_tables; t++) {
    if (skip && skip[t]) continue; /* a partitioned table: no key of it goes to the cacher */
    uint32_t h = b->hotness[t];
    const uint64_t *src = b->ids + b->ids_off[t];
    for (uint32_t i = 0; i < b->n; i++) {
      uint32_t o = owner[i];
      for (uint32_t r = 0; r < h; r++) keytab_add(&k, src[(size_t)i * h + r], o);
    }
    size_t m = keytab_take(&k);
    for (size_t i = 0; i < m; i++) {
      uint64_t s = k.vals[i];
      ukey[u] = TABLE_KEY(t, CELL_ROW(s));
      if (s & CELL_SHARED) {
        uowner[u] = UINT32_MAX;
        n_shared++;
      } else {
        uowner[u] = CELL_OWNER(s);
        cnt[uowner[u]]++;
      }
      u++;
    }
  }
  p->n_unique = u;
  if (flags & PLAN_KEYS) { /* the cacher takes it from here */
    p->ukeys = ukey;
    p->users = uowner;
    ukey = NULL;
    uowner = NULL;
    goto out;
  }
  /* split: each trainer's owned keys and the shared ones, still sorted */
  p->sync = malloc(nz(n_shared) * sizeof *p->sync);
  sync_write_back = malloc(nz(n_shared) * sizeof *sync_write_back);
  if (!p->sync || !sync_write_back) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint32_t q = 0; q < P; q++)
    if (!(owned[q] = malloc(nz(cnt[q]) * sizeof **owned))) {
      rc = -ENOMEM;
      goto out;
    }
  for (size_t i = 0; i < u; i++) {
    if (uowner[i] == UINT32_MAX) {
      sync_write_back[p->n_sync] = (uint32_t)(table_mix64(ukey[i]) % P);
      p->sync[p->n_sync++] = ukey[i];
    } else {
      owned[uowner[i]][fill[uowner[i]]++] = ukey[i];
    }
  }
  for (uint32_t q = 0; q < P; q++) {
    plan_share_t *s = &p->shares[q];
    s->n_owned = cnt[q];
    s->fetch = merge(owned[q], cnt[q], p->sync, p->n_sync, NULL, 0, &s->n_fetch);
    s->write_back = merge(owned[q], cnt[q], p->sync, p->n_sync, sync_write_back, q, &s->n_write_back);
    if (!s->fetch || !s->write_back) {
      rc = -ENOMEM;
      goto out;
    }
  }
out:
  for (uint32_t q = 0; owned && q < P; q++) free(owned[q]);
  free(owned);
  free(cnt);
  free(fill);
  free(ukey);
  free(uowner);
  free(sync_write_back);
  keytab_close(&k);
  return rc;
}

/* The plan of b for P trainers, sample i going to trainer owner[i]. */
static int build(const data_batch_t *b, uint32_t P, const uint32_t *owner, unsigned flags, const uint8_t *skip,
                 plan_t *out) {
  out->iteration = b->iteration;
  out->batch = b->n;
  out->trainers = P;
  out->n_dense = b->n_dense;
  out->n_tables = b->n_tables;
  int rc = -ENOMEM;
  out->hotness = malloc(((size_t)b->n_tables + 1) * sizeof *out->hotness);
  out->shares = calloc(P, sizeof *out->shares);
  if (!out->hotness || !out->shares) goto out;
  memcpy(out->hotness, b->hotness, b->n_tables * sizeof *out->hotness);
  if ((rc = gather(b, owner, out)) != 0) goto out;
  if (flags & PLAN_IDEAL) goto out;
  if (flags & PLAN_EVAL) {
    for (uint32_t q = 0; q < P && !rc; q++) {
      plan_share_t *s = &out->shares[q];
      rc = share_keys(&s->batch, b->n_tables, b->hotness, &s->fetch, &s->n_fetch);
      out->n_unique += s->n_fetch;
    }
    goto out;
  }
  if (!(flags & PLAN_KEYS)) skip = NULL;
  rc = plan_keys(b, owner, flags, skip, out);
  /* the skipped tables' mask, as plan_drop_tables leaves it (no key of theirs is left to drop) */
  if (!rc && skip) rc = plan_drop_tables(out, skip);
out:
  if (rc) plan_close(out);
  return rc;
}

int plan_build_skip(const data_batch_t *b, uint32_t P, int policy, uint64_t seed, const uint32_t *given, unsigned flags,
                    const uint8_t *skip, plan_t *out) {
  memset(out, 0, sizeof *out);
  if (P == 0 || P > PLAN_MAX_TRAINERS) return -EINVAL;
  if (given) {
    for (uint32_t i = 0; i < b->n; i++)
      if (given[i] >= P) return -EINVAL;
    return build(b, P, given, flags, skip, out);
  }
  if (policy != PLAN_ALLOC_CONTIGUOUS && policy != PLAN_ALLOC_RANDOM) return -EINVAL;
  uint32_t *owner = malloc(((size_t)b->n + 1) * sizeof *owner);
  if (!owner) return -ENOMEM;
  int rc = plan_alloc(policy, seed, b->iteration, b->n, P, owner);
  if (!rc) rc = build(b, P, owner, flags, skip, out);
  free(owner);
  return rc;
}

int plan_build(const data_batch_t *b, uint32_t P, int policy, uint64_t seed, unsigned flags,
                      plan_t *out) {
  return plan_build_skip(b, P, policy, seed, NULL, flags, NULL, out);
}

int plan_build_owned(const data_batch_t *b, uint32_t P, const uint32_t *owner, unsigned flags,
                            plan_t *out) {
  if (!owner) {
    memset(out, 0, sizeof *out);
    return -EINVAL;
  }
  return plan_build_skip(b, P, PLAN_ALLOC_CONTIGUOUS, 0, owner, flags, NULL, out);
}

int plan_batch_concat(const data_batch_t *batches, size_t n, data_batch_t *out) {
  memset(out, 0, sizeof *out);
  if (n == 0) return -EINVAL;
  const data_batch_t *f = &batches[0];
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const data_batch_t *b = &batches[i];
    if (b->n_dense != f->n_dense || b->n_tables != f->n_tables ||
        memcmp(b->hotness, f->hotness, f->n_tables * sizeof *f->hotness) != 0)
      return -EINVAL;
    total += b->n;
  }
  if (total > UINT32_MAX) return -EINVAL;
  size_t hot_sum = 0;
  for (uint32_t t = 0; t < f->n_tables; t++) hot_sum += f->hotness[t];
  out->iteration = f->iteration;
  out->split = f->split;
  out->n = (uint32_t)total;
  out->n_dense = f->n_dense;
  out->n_tables = f->n_tables;
  out->hotness = malloc(((size_t)f->n_tables + 1) * sizeof *out->hotness);
  out->labels = malloc((total ? total : 1) * sizeof(float));
  out->dense = malloc(nz(total * f->n_dense) * sizeof(float));
  out->ids = malloc(nz(total * hot_sum) * sizeof(uint64_t));
  out->ids_off = malloc(((size_t)f->n_tables + 1) * sizeof *out->ids_off);
  if (!out->hotness || !out->labels || !out->dense || !out->ids || !out->ids_off) {
    data_batch_free(out);
    return -ENOMEM;
  }
  memcpy(out->hotness, f->hotness, f->n_tables * sizeof *out->hotness);
  out->ids_off[0] = 0;
  for (uint32_t t = 0; t < f->n_tables; t++) out->ids_off[t + 1] = out->ids_off[t] + total * f->hotness[t];
  size_t s = 0;
  for (size_t i = 0; i < n; i++) {
    const data_batch_t *b = &batches[i];
    memcpy(out->labels + s, b->labels, (size_t)b->n * sizeof(float));
    memcpy(out->dense + s * f->n_dense, b->dense, (size_t)b->n * f->n_dense * sizeof(float));
    for (uint32_t t = 0; t < f->n_tables; t++)
      memcpy(out->ids + out->ids_off[t] + s * f->hotness[t], b->ids + b->ids_off[t],
             (size_t)b->n * f->hotness[t] * sizeof(uint64_t));
    s += b->n;
  }
  return 0;
}

int plan_batch_head(const data_batch_t *b, uint32_t m, data_batch_t *out) {
  memset(out, 0, sizeof *out);
  if (m > b->n) return -EINVAL;
  /* within a table, ids are sample-major: the first m samples' ids start
   * where the table's do, and concat copies exactly n * hotness[t] of them */
  data_batch_t head = *b;
  head.n = m;
  return plan_batch_concat(&head, 1, out);
}
