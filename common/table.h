/*
 * table: the layout of the embedding tables shared by every daemon.
 *
 * A key names one embedding row: key = (table << 48) | row.  A stored row is
 * the table's vector (dim floats) followed by its optimizer state
 * (state_floats floats: 0 for SGD, 1 for row-wise Adagrad, dim for Adagrad
 * or Adam's first moment...).  A row never written is initialized from
 * (seed, key) deterministically by table_init_row(), on whichever server owns
 * it, so nothing is preloaded.  The layout comes from the job configuration
 * (cfg_layout()); table_layout_hash() fingerprints it so that a client and a
 * server, or a server and its data directory, can tell that they disagree.
 * Pure functions; safe on any thread.
 */
#ifndef CHANTER_TABLE_H
#define CHANTER_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define TABLE_ROW_BITS 48
#define TABLE_ROW_MASK ((UINT64_C(1) << TABLE_ROW_BITS) - 1)
#define TABLE_MAX 65536
#define TABLE_KEY(t, r) (((uint64_t)(t) << TABLE_ROW_BITS) | ((uint64_t)(r) & TABLE_ROW_MASK))
#define TABLE_ID(k) ((uint32_t)((uint64_t)(k) >> TABLE_ROW_BITS))
#define TABLE_ROW(k) ((uint64_t)(k) & TABLE_ROW_MASK)

typedef struct table_info_s {
  uint64_t rows;          /* rows in the table */
  uint32_t dim;           /* embedding dimension */
  uint32_t state_floats;  /* optimizer state floats stored after the vector */
} table_info_t;

typedef struct table_layout_s {
  uint32_t n_tables;
  table_info_t *tables;    /* n_tables entries, owned by the layout */
  uint64_t seed;          /* job seed: lazy row initialization */
} table_layout_t;

/* Allocates tables[] for n tables (all zero).  0 or -ENOMEM. */
int table_layout_init(table_layout_t *l, uint32_t n_tables, uint64_t seed);
void table_layout_close(table_layout_t *l);
/* Deep copy into dst (caller closes it). */
int table_layout_copy(table_layout_t *dst, const table_layout_t *src);

static inline uint32_t table_row_floats(const table_layout_t *l, uint32_t table) {
  return l->tables[table].dim + l->tables[table].state_floats;
}
static inline size_t table_row_bytes(const table_layout_t *l, uint32_t table) {
  return (size_t)table_row_floats(l, table) * sizeof(float);
}
uint32_t table_max_row_floats(const table_layout_t *l);

/* 0 if key names an existing row; -ENOENT for an unknown table, -ERANGE for
 * a row past the table's end.  `why`, if given, receives a sentence. */
int table_check_key(const table_layout_t *l, uint64_t key, char *why, size_t why_len);

/* Fills out[table_row_floats] with the deterministic initial row of key:
 * vector uniform in [-1/sqrt(rows), 1/sqrt(rows)] (DLRM's initialization),
 * optimizer state zero.  Depends only on (seed, key, layout of its table). */
void table_init_row(const table_layout_t *l, uint64_t key, float *out);

/* 64-bit fingerprint of the layout (tables, rows, dims, state, seed). */
uint64_t table_layout_hash(const table_layout_t *l);

/* The one 64-bit mixer of the project (splitmix64 finalizer). */
static inline uint64_t table_mix64(uint64_t x) {
  x += UINT64_C(0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}
/* SplitMix64 as a generator: the next number of the stream *s, and a
 * double uniform in [0, 1) from it. */
static inline uint64_t table_rng_next(uint64_t *s) {
  uint64_t z = table_mix64(*s);
  *s += UINT64_C(0x9e3779b97f4a7c15);
  return z;
}
static inline double table_rng_unit(uint64_t *s) { return (double)(table_rng_next(s) >> 11) * 0x1.0p-53; }

#endif
