/*
 * sbuf: see sbuf.h.
 */
#include "sbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

void sb_num(sbuf_t *b, const char *key, double v) {
  if (isfinite(v)) sb_printf(b, "\"%s\": %.10g", key, v);
  else sb_printf(b, "\"%s\": null", key);
}

void sb_str_value(sbuf_t *b, const char *v) {
  sb_printf(b, "\"");
  for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
    if (*p == '"' || *p == '\\') sb_printf(b, "\\%c", *p);
    else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
    else sb_printf(b, "%c", *p);
  }
  sb_printf(b, "\"");
}

void sb_str(sbuf_t *b, const char *key, const char *v) {
  sb_printf(b, "\"%s\": ", key);
  sb_str_value(b, v);
}
