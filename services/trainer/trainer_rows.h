/*
 * trainer_rows: a trainer-local store of embedding rows, keyed by key, for
 * mode = ideal.
 *
 * In ideal mode the trainer does no embedding traffic: every row it ever
 * needs lives here, initialized on first use with table_init_row from (seed,
 * key) exactly as an embedding server would initialize it.  Per step the
 * trainer copies its batch's rows from here into the dense row array of
 * trainer_step (the "fetch") and copies them back after the update (the
 * "write-back"), so the step code is the same in both modes.
 *
 * The store is an open-addressing hash table (linear probing) from key to
 * a row index in one growing array of rows.  Used by one thread.
 */
#ifndef CHANTER_TRAINER_ROWS_H
#define CHANTER_TRAINER_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"
#include "trainer_step.h"

typedef struct trainer_rows_s trainer_rows_t;

/* An empty store for rows of layout (every table must have the same row
 * floats: the trainer's uniform row stride).  layout is copied.  0,
 * -EINVAL or -ENOMEM. */
int trainer_rows_create(const table_layout_t *layout, trainer_rows_t **out);
void trainer_rows_destroy(trainer_rows_t *s);

/* Copies the rows of keys[0..n) into out (n * row floats, in key order),
 * inserting (and initializing) the ones never seen.  0, -ENOMEM, or
 * -ENOENT / -ERANGE for a key outside the layout (with why). */
int trainer_rows_gather(trainer_rows_t *s, const uint64_t *keys, size_t n, float *out, char *why, size_t why_len);
/* Stores rows[i] as the row of keys[i] (inserting when new).  0 or
 * -ENOMEM (or a bad key, as above). */
int trainer_rows_scatter(trainer_rows_t *s, const uint64_t *keys, size_t n, const float *rows, char *why, size_t why_len);

/* Ideal mode's "fetch": sets ts's keys to keys[0..n) (strictly
 * ascending, trainer_step_set_keys) and fills them from s.  0 or the error with
 * err (trainer_step_set_keys's, or "local rows: ..."). */
int trainer_rows_fetch(trainer_rows_t *s, trainer_step_t *ts, const uint64_t *keys, size_t n, char *err, size_t err_len);

/* Rows held. */
size_t trainer_rows_count(const trainer_rows_t *s);

#endif
