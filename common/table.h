/*
 * table: the layout of the embedding tables shared by every daemon.
 *
 * A key names one embedding row: key = (table << 48) | row.  A stored row is
 * the table's vector (dim floats) followed by its optimizer state
 * (state_floats floats: 0 for SGD, 1 for row-wise Adagrad, dim for Adagrad
 * or Adam's first moment...).  A row never written is initialized from
 * (seed, key) deterministically by tbl_init_row(), on whichever server owns
 * it, so nothing is preloaded.  The layout comes from the job configuration
 * (cfg_layout()); tbl_layout_hash() fingerprints it so that a client and a
 * server, or a server and its data directory, can tell that they disagree.
 * Pure functions; safe on any thread.
 */
#ifndef CHANTER_TABLE_H
#define CHANTER_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define TBL_ROW_BITS 48
#define TBL_ROW_MASK ((UINT64_C(1) << TBL_ROW_BITS) - 1)
#define TBL_MAX_TABLES 65536
#define TBL_KEY(t, r) (((uint64_t)(t) << TBL_ROW_BITS) | ((uint64_t)(r) & TBL_ROW_MASK))
#define TBL_TABLE(k) ((uint32_t)((uint64_t)(k) >> TBL_ROW_BITS))
#define TBL_ROW(k) ((uint64_t)(k) & TBL_ROW_MASK)

typedef struct tbl_table_s {
  uint64_t rows;          /* rows in the table */
  uint32_t dim;           /* embedding dimension */
  uint32_t state_floats;  /* optimizer state floats stored after the vector */
} tbl_table_t;

typedef struct tbl_layout_s {
  uint32_t n_tables;
  tbl_table_t *tables;    /* n_tables entries, owned by the layout */
  uint64_t seed;          /* job seed: lazy row initialization */
} tbl_layout_t;

/* Allocates tables[] for n tables (all zero).  0 or -ENOMEM. */
int tbl_layout_init(tbl_layout_t *l, uint32_t n_tables, uint64_t seed);
void tbl_layout_close(tbl_layout_t *l);
/* Deep copy into dst (caller closes it). */
int tbl_layout_copy(tbl_layout_t *dst, const tbl_layout_t *src);

static inline uint32_t tbl_row_floats(const tbl_layout_t *l, uint32_t table) {
  return l->tables[table].dim + l->tables[table].state_floats;
}
static inline size_t tbl_row_bytes(const tbl_layout_t *l, uint32_t table) {
  return (size_t)tbl_row_floats(l, table) * sizeof(float);
}
uint32_t tbl_max_row_floats(const tbl_layout_t *l);

/* 0 if key names an existing row; -ENOENT for an unknown table, -ERANGE for
 * a row past the table's end.  `why`, if given, receives a sentence. */
int tbl_check_key(const tbl_layout_t *l, uint64_t key, char *why, size_t why_len);

/* Fills out[tbl_row_floats] with the deterministic initial row of key:
 * vector uniform in [-1/sqrt(rows), 1/sqrt(rows)] (DLRM's initialization),
 * optimizer state zero.  Depends only on (seed, key, layout of its table). */
void tbl_init_row(const tbl_layout_t *l, uint64_t key, float *out);

/* 64-bit fingerprint of the layout (tables, rows, dims, state, seed). */
uint64_t tbl_layout_hash(const tbl_layout_t *l);

/* The one 64-bit mixer of the project (splitmix64 finalizer). */
static inline uint64_t tbl_mix64(uint64_t x) {
  x += UINT64_C(0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}

#endif
