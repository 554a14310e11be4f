/* oracle_laia: see laia.h. */
#include "laia.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "err.h"
#include "le.h"
#include "table.h"

#define HOLD_NONE 0u          /* empty map entry */
#define HOLD_SHARED UINT32_MAX /* last used from several trainers */
/* else holder = trainer + 1 */

typedef struct ent_s {
  uint64_t key;
  uint32_t last;   /* batch of the last use (mod 2^32) */
  uint32_t holder; /* HOLD_* or trainer + 1 */
} ent_t;

struct laia_s {
  laia_opts_t o;
  ent_t *tab;
  size_t cap, mask, count;
  int started;
  uint64_t next_x;
  /* per batch / per sample scratch */
  uint32_t *room;     /* P: samples trainer t may still take */
  uint32_t *open;     /* trainers with room, n_open of them */
  uint32_t *open_pos; /* P: position of t in open */
  uint32_t n_open;
  uint32_t *score;    /* P, zero between samples */
  uint32_t *touched;  /* trainers with a score, this sample */
  uint32_t *ties;
  uint64_t *keys;     /* one sample's keys ... */
  size_t *homes;      /* ... and where their probes start */
  size_t per_cap;
  laia_stats_t st;
  /* the profile: per table, ids seen and ids that found a held row; then
   * which tables are scored (NULL until the first batch gives n_tables) */
  uint32_t n_tables;
  uint64_t *t_ids, *t_hits;
  uint8_t *t_on;
  int profiled;
};

static inline int live(const laia_t *l, const ent_t *e, uint32_t x) {
  return e->holder != HOLD_NONE && (uint32_t)(x - e->last) <= l->o.window;
}

static int rehash(laia_t *l, size_t cap, uint32_t x) {
  ent_t *t = calloc(cap, sizeof *t);
  if (!t) return -ENOMEM;
  size_t mask = cap - 1, n = 0;
  for (size_t i = 0; i < l->cap; i++) {
    const ent_t *e = &l->tab[i];
    if (!live(l, e, x)) continue;
    size_t h = (size_t)table_mix64(e->key) & mask;
    while (t[h].holder != HOLD_NONE) h = (h + 1) & mask;
    t[h] = *e;
    n++;
  }
  free(l->tab);
  l->tab = t;
  l->cap = cap;
  l->mask = mask;
  l->count = n;
  return 0;
}

/* Room for `add` more entries at load <= 1/2: first drop the expired
 * ones, then grow. */
static int reserve(laia_t *l, size_t add, uint32_t x) {
  if ((l->count + add) * 2 <= l->cap) return 0;
  size_t live_n = 0;
  for (size_t i = 0; i < l->cap; i++) live_n += live(l, &l->tab[i], x);
  size_t cap = l->cap ? l->cap : 1024;
  while ((live_n + add) * 4 > cap) cap *= 2; /* load <= 1/4 after a rebuild: rebuilds stay rare */
  return rehash(l, cap, x);
}

/* The entry of key; if absent, inserted as held by nobody and expired
 * (capacity reserved). */
static inline ent_t *entry_at(laia_t *l, uint64_t key, size_t h, uint32_t x) {
  for (;;) {
    ent_t *e = &l->tab[h];
    if (e->holder == HOLD_NONE) {
      e->key = key;
      e->holder = HOLD_SHARED;
      e->last = x - l->o.window - 1;
      l->count++;
      return e;
    }
    if (e->key == key) return e;
    h = (h + 1) & l->mask;
  }
}

/* Where key's probe starts. */
static inline size_t home(const laia_t *l, uint64_t key) { return (size_t)table_mix64(key) & l->mask; }

#define AHEAD 16 /* ids whose map entries are prefetched ahead of their probe (the map is far larger than the caches) */

int laia_create(const laia_opts_t *o, laia_t **out) {
  *out = NULL;
  if (!o->trainers || !o->window || o->window > LAIA_WINDOW_MAX || !(o->min_share >= 0 && o->min_share <= 1))
    return -EINVAL;
  laia_t *l = calloc(1, sizeof *l);
  if (!l) return -ENOMEM;
  l->o = *o;
  uint32_t P = o->trainers;
  l->room = calloc(P, sizeof *l->room);
  l->open = calloc(P, sizeof *l->open);
  l->open_pos = calloc(P, sizeof *l->open_pos);
  l->score = calloc(P, sizeof *l->score);
  l->touched = calloc(P, sizeof *l->touched);
  l->ties = calloc(P, sizeof *l->ties);
  if (!l->room || !l->open || !l->open_pos || !l->score || !l->touched || !l->ties) {
    laia_destroy(l);
    return -ENOMEM;
  }
  *out = l;
  return 0;
}

void laia_destroy(laia_t *l) {
  if (!l) return;
  free(l->tab);
  free(l->room);
  free(l->open);
  free(l->open_pos);
  free(l->score);
  free(l->touched);
  free(l->ties);
  free(l->keys);
  free(l->homes);
  free(l->t_ids);
  free(l->t_hits);
  free(l->t_on);
  free(l);
}

void laia_stats(const laia_t *l, laia_stats_t *out) {
  *out = l->st;
  out->rows_held = l->count;
  out->tables = l->n_tables;
  out->tables_scored = 0;
  for (uint32_t t = 0; t < l->n_tables; t++) out->tables_scored += l->t_on[t];
}

int laia_profiled(const laia_t *l) { return l->profiled; }

int laia_table_scored(const laia_t *l, uint32_t t) { return t < l->n_tables && l->t_on[t]; }

double laia_table_share(const laia_t *l, uint32_t t) {
  if (!l->profiled || t >= l->n_tables || !l->t_ids[t]) return NAN;
  return (double)l->t_hits[t] / (double)l->t_ids[t];
}

uint64_t laia_next_iteration(const laia_t *l) { return l->next_x; }

int laia_start_at(laia_t *l, uint64_t x) {
  if (l->st.batches) return -EINVAL;
  l->started = 1;
  l->next_x = x;
  return 0;
}

/* After the profile's last batch: keep the tables that decide something
 * (at least one, the best, so that laia stays laia). */
static void end_profile(laia_t *l) {
  uint32_t best = 0, kept = 0;
  double best_share = -1;
  for (uint32_t t = 0; t < l->n_tables; t++) {
    double sh = l->t_ids[t] ? (double)l->t_hits[t] / (double)l->t_ids[t] : 0;
    l->t_on[t] = sh >= l->o.min_share && l->t_hits[t] > 0;
    kept += l->t_on[t];
    if (sh > best_share) {
      best_share = sh;
      best = t;
    }
  }
  if (!kept && l->n_tables) l->t_on[best] = 1;
  l->profiled = 1;
}

static void close_trainer(laia_t *l, uint32_t t) {
  uint32_t pos = l->open_pos[t], last = l->open[--l->n_open];
  l->open[pos] = last;
  l->open_pos[last] = pos;
}

int laia_assign(laia_t *l, const data_batch_t *b, uint32_t *owner) {
  if (l->started && b->iteration != l->next_x) return -EINVAL;
  if (!l->t_on) {
    l->t_ids = calloc(b->n_tables + 1, sizeof *l->t_ids);
    l->t_hits = calloc(b->n_tables + 1, sizeof *l->t_hits);
    l->t_on = malloc(b->n_tables + 1);
    if (!l->t_ids || !l->t_hits || !l->t_on) {
      free(l->t_ids), free(l->t_hits), free(l->t_on);
      l->t_ids = l->t_hits = NULL;
      l->t_on = NULL;
      return -ENOMEM;
    }
    memset(l->t_on, 1, b->n_tables + 1);
    l->n_tables = b->n_tables;
  } else if (b->n_tables != l->n_tables) {
    return -EINVAL;
  }
  const int profiling = !l->profiled && l->o.profile > 0;
  const uint32_t P = l->o.trainers, B = b->n, x = (uint32_t)b->iteration;
  size_t per = 0; /* ids per sample */
  for (uint32_t t = 0; t < b->n_tables; t++) per += b->hotness[t];
  if (per > l->per_cap) {
    uint64_t *k = realloc(l->keys, per * sizeof *k);
    if (k) l->keys = k;
    size_t *h = realloc(l->homes, per * sizeof *h);
    if (h) l->homes = h;
    if (!k || !h) return -ENOMEM;
    l->per_cap = per;
  }
  if (reserve(l, (size_t)B * per, x) != 0) return -ENOMEM;
  l->n_open = 0;
  for (uint32_t t = 0; t < P; t++) {
    l->room[t] = B / P + (t < B % P);
    if (l->room[t]) {
      l->open_pos[t] = l->n_open;
      l->open[l->n_open++] = t;
    }
  }
  const uint64_t rs = table_mix64(l->o.seed ^ table_mix64(b->iteration ^ UINT64_C(0x6c61696131)));
  /* 1: place every sample, scored against the holdings after the batch before */
  for (uint32_t i = 0; i < B; i++) {
    uint32_t n_touched = 0;
    /* the sample's keys and their homes, prefetched together */
    size_t k = 0;
    for (uint32_t t = 0; t < b->n_tables; t++) {
      if (!l->t_on[t]) continue;
      uint32_t hot = b->hotness[t];
      const uint64_t *ids = b->ids + b->ids_off[t] + (size_t)i * hot;
      for (uint32_t h = 0; h < hot; h++, k++) {
        l->keys[k] = TABLE_KEY(t, ids[h]);
        l->homes[k] = home(l, l->keys[k]);
        __builtin_prefetch(&l->tab[l->homes[k]]);
      }
    }
    for (size_t a = 0; a < k; a++) {
      const ent_t *e = entry_at(l, l->keys[a], l->homes[a], x);
      if (e->holder == HOLD_SHARED || !live(l, e, x)) continue;
      uint32_t q = e->holder - 1;
      if (profiling) l->t_hits[TABLE_ID(l->keys[a])]++;
      if (!l->score[q]++) l->touched[n_touched++] = q;
    }
    uint32_t best = 0, n_ties = 0;
    for (uint32_t j = 0; j < n_touched; j++) {
      uint32_t q = l->touched[j], s = l->score[q];
      l->score[q] = 0;
      if (!l->room[q] || s < best) continue;
      if (s > best) {
        best = s;
        n_ties = 0;
      }
      l->ties[n_ties++] = q;
    }
    uint64_t r = table_mix64(rs + i);
    uint32_t q;
    if (n_ties) {
      /* the candidates in trainer order, so the draw does not depend on the ids' order */
      for (uint32_t a = 1; a < n_ties; a++)
        for (uint32_t c = a; c > 0 && l->ties[c - 1] > l->ties[c]; c--) {
          uint32_t tmp = l->ties[c];
          l->ties[c] = l->ties[c - 1];
          l->ties[c - 1] = tmp;
        }
      q = l->ties[(uint32_t)(((unsigned __int128)r * n_ties) >> 64)];
    } else {
      q = l->open[(uint32_t)(((unsigned __int128)r * l->n_open) >> 64)];
    }
    l->st.scored += n_touched > 0;
    l->st.best += n_ties > 0;
    owner[i] = q;
    if (!--l->room[q]) close_trainer(l, q);
  }
  /* 2: the batch's rows are now held by their one trainer, or by nobody if several used them */
  for (uint32_t t = 0; t < b->n_tables; t++) {
    if (!l->t_on[t]) continue;
    uint32_t hot = b->hotness[t];
    if (profiling) l->t_ids[t] += (uint64_t)B * hot;
    const uint64_t *ids = b->ids + b->ids_off[t];
    size_t n_ids = (size_t)B * hot;
    for (size_t a = 0; a < n_ids && a < AHEAD; a++) __builtin_prefetch(&l->tab[home(l, TABLE_KEY(t, ids[a]))]);
    for (size_t a = 0; a < n_ids; a++) {
      if (a + AHEAD < n_ids) __builtin_prefetch(&l->tab[home(l, TABLE_KEY(t, ids[a + AHEAD]))]);
      uint32_t q = owner[a / hot] + 1;
      uint64_t key = TABLE_KEY(t, ids[a]);
      ent_t *e = entry_at(l, key, home(l, key), x);
      if (e->last != x) { /* first use in this batch (entries inserted expired never have last == x) */
        e->holder = q;
        e->last = x;
      } else if (e->holder != q) {
        e->holder = HOLD_SHARED;
      }
    }
  }
  l->st.batches++;
  l->st.samples += B;
  if (profiling && l->st.batches >= l->o.profile) end_profile(l);
  l->started = 1;
  l->next_x = b->iteration + 1;
  return 0;
}

/* ------------------------------------------------------------ save, load
 *
 * The format (version 1), all integers little-endian, written byte by
 * byte (no struct is dumped, so it is the same on any host):
 *
 *   offset  size              field
 *   0       8                 magic "CHLAIAST"
 *   8       4   u32           version (1)
 *   12      4   u32           trainers        \
 *   16      4   u32           window           | the options the state was
 *   20      4   u32           profile          | made with: laia_load
 *   24      8   u64           seed             | refuses others
 *   32      8   u64           min_share (IEEE 754 double, its bits)
 *   40      1   u8            flags: 1 started, 2 profiled, 4 tables known (the first batch came)
 *   41      3                 zero
 *   44      4   u32           n_tables
 *   48      8   u64           next iteration
 *   56      32  4 x u64       statistics: batches, samples, scored, best
 *   88      8   u64           map capacity (0, or a power of two)
 *   96      8   u64           rows in the map N
 *   104     17 * n_tables     per table: ids u64, hits u64 (profile counters), scored u8
 *   ...     24 * N            per row, by ascending place: place u64, key u64, last use u32 (mod 2^32),
 *                             holder u32 (trainer + 1, or 2^32 - 1: several)
 *   end-8   8   u64           XXH3-64 (seed 0) of every byte before it
 *
 * A row goes back to its own place, so the map is the saved one bit for
 * bit: lookups, rows_held and the next growth all match.  The loader
 * checks that each row is where its probe finds it (its home up to its
 * place occupied): a map a probe could loop in or miss a row of is
 * refused, even under a valid checksum. */

#define SAVE_MAGIC "CHLAIAST"
#define SAVE_VERSION 1u
#define SAVE_HDR 104
#define SAVE_TABLE 17
#define SAVE_ENT 24
#define F_STARTED 1u
#define F_PROFILED 2u
#define F_TABLES 4u

static uint64_t dbits(double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  return v;
}
static double bitsd(uint64_t v) {
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}

int laia_save(const laia_t *l, uint8_t **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  size_t n = 0;
  for (size_t i = 0; i < l->cap; i++) n += l->tab[i].holder != HOLD_NONE;
  ASSERT_OP(n, ==, l->count);
  int tables = l->t_on != NULL;
  size_t nt = tables ? l->n_tables : 0;
  size_t sz = SAVE_HDR + SAVE_TABLE * nt + SAVE_ENT * n + 8;
  uint8_t *b = calloc(1, sz);
  if (!b) return -ENOMEM;
  memcpy(b, SAVE_MAGIC, 8);
  put_le32(b + 8, SAVE_VERSION);
  put_le32(b + 12, l->o.trainers);
  put_le32(b + 16, l->o.window);
  put_le32(b + 20, l->o.profile);
  put_le64(b + 24, l->o.seed);
  put_le64(b + 32, dbits(l->o.min_share));
  b[40] = (uint8_t)((l->started ? F_STARTED : 0) | (l->profiled ? F_PROFILED : 0) | (tables ? F_TABLES : 0));
  put_le32(b + 44, (uint32_t)nt);
  put_le64(b + 48, l->next_x);
  put_le64(b + 56, l->st.batches);
  put_le64(b + 64, l->st.samples);
  put_le64(b + 72, l->st.scored);
  put_le64(b + 80, l->st.best);
  put_le64(b + 88, l->cap);
  put_le64(b + 96, n);
  uint8_t *p = b + SAVE_HDR;
  for (size_t t = 0; t < nt; t++, p += SAVE_TABLE) {
    put_le64(p, l->t_ids[t]);
    put_le64(p + 8, l->t_hits[t]);
    p[16] = l->t_on[t];
  }
  for (size_t i = 0; i < l->cap; i++) {
    const ent_t *e = &l->tab[i];
    if (e->holder == HOLD_NONE) continue;
    put_le64(p, i);
    put_le64(p + 8, e->key);
    put_le32(p + 16, e->last);
    put_le32(p + 20, e->holder);
    p += SAVE_ENT;
  }
  put_le64(p, XXH3_64bits(b, sz - 8));
  *buf = b;
  *len = sz;
  return 0;
}

/* The options in the header against the job's: ERR_CONFIG naming the
 * first that differs (and the config key it comes from). */
static int check_opts(const laia_opts_t *o, const uint8_t *b, char *why, size_t why_len) {
  static const char *const fmt = "the laia state was saved with %s = %" PRIu64 ", this job has %s = %" PRIu64
                                 " (%s): it would allocate differently";
  struct {
    const char *name, *key;
    uint64_t saved, now;
  } f[] = {
      {"trainers", "the number of cluster.trainers", get_le32(b + 12), o->trainers},
      {"window", "oracle.laia_window", get_le32(b + 16), o->window},
      {"profile", "oracle.laia_profile", get_le32(b + 20), o->profile},
      {"seed", "seed", get_le64(b + 24), o->seed},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].saved != f[i].now)
      return err_set(why, why_len, ERR_CONFIG, fmt, f[i].name, f[i].saved, f[i].name, f[i].now, f[i].key);
  double ms = bitsd(get_le64(b + 32));
  if (dbits(ms) != dbits(o->min_share))
    return err_set(why, why_len, ERR_CONFIG,
                   "the laia state was saved with min_share = %.17g, this job has min_share = %.17g "
                   "(oracle.laia_min_share): it would allocate differently",
                   ms, o->min_share);
  return 0;
}

int laia_load(const laia_opts_t *o, const uint8_t *buf, size_t len, laia_t **out, char *why, size_t why_len) {
  *out = NULL;
  if (why_len) why[0] = 0;
  laia_t *l = NULL;
  int rc = laia_create(o, &l);
  if (rc) {
    rc = err_set(why, why_len, rc, rc == -EINVAL ? "invalid laia options (trainers, window or min_share)"
                                                 : "out of memory loading the laia state");
    goto out;
  }
  if (len < SAVE_HDR + 8) {
    rc = err_set(why, why_len, -EBADMSG, "the laia state is %zu bytes, shorter than its %d-byte header: truncated", len,
                 SAVE_HDR + 8);
    goto out;
  }
  if (memcmp(buf, SAVE_MAGIC, 8)) {
    rc = err_set(why, why_len, -EBADMSG, "not a laia state (no \"%s\" magic)", SAVE_MAGIC);
    goto out;
  }
  uint32_t version = get_le32(buf + 8);
  if (version != SAVE_VERSION) {
    rc = err_set(why, why_len, -EBADMSG, "laia state version %u, this build reads version %u", version, SAVE_VERSION);
    goto out;
  }
  uint64_t sum = XXH3_64bits(buf, len - 8);
  if (sum != get_le64(buf + len - 8)) {
    rc = err_set(why, why_len, -EBADMSG,
                 "the laia state's checksum does not match its %zu bytes (%#" PRIx64 " stored, %#" PRIx64
                 " computed): truncated or corrupt",
                 len, get_le64(buf + len - 8), sum);
    goto out;
  }
  if ((rc = check_opts(o, buf, why, why_len)) != 0) goto out;
  uint8_t flags = buf[40];
  uint32_t nt = get_le32(buf + 44);
  uint64_t cap = get_le64(buf + 88), n = get_le64(buf + 96);
  /* what laia_assign leaves: flags it knows, a power-of-two map at most
   * half full (reserve), no table counters nor profile before the first
   * batch (started may be: laia_start_at) */
  if ((flags & ~(F_STARTED | F_PROFILED | F_TABLES)) || buf[41] || buf[42] || buf[43] ||
      (!(flags & F_TABLES) && (nt || (flags & F_PROFILED))) || (cap & (cap - 1)) || n > cap / 2 ||
      cap > SIZE_MAX / sizeof(ent_t)) {
    rc = err_set(why, why_len, -EBADMSG,
                 "the laia state's header is inconsistent (flags %#x, %u tables, map of %" PRIu64 " places holding %" PRIu64
                 " rows): corrupt",
                 flags, nt, cap, n);
    goto out;
  }
  if ((len - SAVE_HDR - 8) / SAVE_ENT < n || len != SAVE_HDR + (size_t)SAVE_TABLE * nt + SAVE_ENT * (size_t)n + 8) {
    rc = err_set(why, why_len, -EBADMSG,
                 "the laia state is %zu bytes, its header (%u tables, %" PRIu64 " rows) says otherwise: corrupt", len, nt,
                 n);
    goto out;
  }
  l->started = (flags & F_STARTED) != 0;
  l->profiled = (flags & F_PROFILED) != 0;
  l->next_x = get_le64(buf + 48);
  l->st.batches = get_le64(buf + 56);
  l->st.samples = get_le64(buf + 64);
  l->st.scored = get_le64(buf + 72);
  l->st.best = get_le64(buf + 80);
  const uint8_t *p = buf + SAVE_HDR;
  if (flags & F_TABLES) {
    l->t_ids = calloc((size_t)nt + 1, sizeof *l->t_ids);
    l->t_hits = calloc((size_t)nt + 1, sizeof *l->t_hits);
    l->t_on = malloc((size_t)nt + 1);
    if (!l->t_ids || !l->t_hits || !l->t_on) {
      rc = err_set(why, why_len, -ENOMEM, "out of memory loading the laia state");
      goto out;
    }
    memset(l->t_on, 1, (size_t)nt + 1);
    l->n_tables = nt;
    for (uint32_t t = 0; t < nt; t++, p += SAVE_TABLE) {
      l->t_ids[t] = get_le64(p);
      l->t_hits[t] = get_le64(p + 8);
      if (p[16] > 1) {
        rc = err_set(why, why_len, -EBADMSG, "the laia state's table %u has scored = %u: corrupt", t, p[16]);
        goto out;
      }
      l->t_on[t] = p[16];
    }
  }
  if (cap) {
    l->tab = calloc((size_t)cap, sizeof *l->tab);
    if (!l->tab) {
      rc = err_set(why, why_len, -ENOMEM, "out of memory loading the laia state (a map of %" PRIu64 " places)", cap);
      goto out;
    }
    l->cap = (size_t)cap;
    l->mask = l->cap - 1;
  }
  uint64_t prev = 0;
  for (uint64_t i = 0; i < n; i++, p += SAVE_ENT) {
    uint64_t at = get_le64(p);
    uint32_t holder = get_le32(p + 20);
    if (at >= cap || (i && at <= prev) || holder == HOLD_NONE || (holder != HOLD_SHARED && holder > o->trainers)) {
      rc = err_set(why, why_len, -EBADMSG,
                   "the laia state's row %#" PRIx64 " (at place %" PRIu64 " of %" PRIu64
                   ", holder %u) is out of range or out of order: corrupt",
                   get_le64(p + 8), at, cap, holder);
      goto out;
    }
    prev = at;
    ent_t *e = &l->tab[at];
    e->key = get_le64(p + 8);
    e->last = get_le32(p + 16);
    e->holder = holder;
  }
  l->count = (size_t)n;
  /* every row where its probe finds it: its home up to its place
   * occupied, by other keys (the map never becomes full: n <= cap / 2) */
  for (size_t i = 0; i < l->cap; i++) {
    const ent_t *e = &l->tab[i];
    if (e->holder == HOLD_NONE) continue;
    for (size_t h = home(l, e->key); h != i; h = (h + 1) & l->mask)
      if (l->tab[h].holder == HOLD_NONE || l->tab[h].key == e->key) {
        rc = err_set(why, why_len, -EBADMSG,
                     "the laia state's row %#" PRIx64 " at place %zu is not where a lookup finds it: corrupt", e->key, i);
        goto out;
      }
  }
  *out = l;
  l = NULL;
out:
  laia_destroy(l);
  return rc;
}
