/*
 * bench tables' collectives (bench_tables_coll.c): the timed calls of the
 * trainers' all-reduce and AlltoAll that shard fit draws a line through.
 */
#ifndef CHANTER_BENCH_TABLES_COLL_H
#define CHANTER_BENCH_TABLES_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "sbuf.h"

/* Times both collectives over `ranks` processes (forked: call it before
 * any thread exists) and appends a "coll" line per (collective, size) to
 * body; prints a table.  0, or a negative code with why. */
int bench_tables_coll(uint32_t ranks, int quick, sbuf_t *body, char *why, size_t why_len);

#endif
