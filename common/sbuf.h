/*
 * sbuf: a growing string (printf appends), and the JSON pieces the
 * summaries are written with.  An allocation failure is remembered (oom)
 * and later appends do nothing, so a writer checks once at the end.
 */
#ifndef CHANTER_SBUF_H
#define CHANTER_SBUF_H

#include <stddef.h>

typedef struct sbuf_s {
  char *s; /* NUL-terminated once anything was appended; the caller frees it */
  size_t n, cap;
  int oom;
} sbuf_t;

void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "key": v, or "key": null when v is not finite. */
void sb_num(sbuf_t *b, const char *key, double v);
/* v as a JSON string (quotes and control characters escaped). */
void sb_str_value(sbuf_t *b, const char *v);
/* "key": "v". */
void sb_str(sbuf_t *b, const char *key, const char *v);

#endif
