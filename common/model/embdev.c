/*
 * embdev.c: which embedding tables go to the device (embdev.h), pure C in
 * every build so that the CPU tests pin it; the tables and the step are
 * in embdev.cu (their storage in embdev_alloc.cu).
 */
#include "embdev.h"

#include <stdlib.h>

uint64_t embdev_margin(uint64_t total_bytes) {
  uint64_t m = total_bytes / 20, floor = UINT64_C(512) << 20;
  return m > floor ? m : floor;
}

uint64_t embdev_budget(int64_t device_mb, uint64_t free_bytes, uint64_t total_bytes) {
  if (device_mb > 0) return (uint64_t)device_mb << 20;
  if (device_mb == 0) return 0;
  uint64_t m = embdev_margin(total_bytes);
  return free_bytes > m ? free_bytes - m : 0;
}

uint64_t embdev_table_bytes(const table_layout_t *l, uint32_t t) {
  return l->tables[t].rows * table_row_floats(l, t) * (uint64_t)sizeof(float);
}

typedef struct by_size_s {
  uint64_t bytes;
  uint32_t t;
} by_size_t;

static int cmp_size(const void *a, const void *b) {
  const by_size_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? -1 : 1;
  return (x->t > y->t) - (x->t < y->t);
}

uint32_t embdev_plan(const table_layout_t *l, uint64_t budget, uint8_t *on_dev, uint64_t *bytes) {
  uint32_t n = l->n_tables, taken = 0;
  uint64_t used = 0;
  for (uint32_t t = 0; t < n; t++) on_dev[t] = 0;
  by_size_t *s = malloc((n ? n : 1) * sizeof *s);
  if (s) { /* no memory for the order: every table stays on the host */
    for (uint32_t t = 0; t < n; t++) s[t] = (by_size_t){embdev_table_bytes(l, t), t};
    qsort(s, n, sizeof *s, cmp_size);
    /* smallest first, while they fit: once one does not, no larger one does */
    for (uint32_t k = 0; k < n && s[k].bytes <= budget - used; k++) {
      on_dev[s[k].t] = 1;
      used += s[k].bytes;
      taken++;
    }
    free(s);
  }
  if (bytes) *bytes = used;
  return taken;
}
