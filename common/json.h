/*
 * json: the one JSON writer and reader.
 *
 * Writing: summaries and records are built with sbuf (sbuf.h: sb_str,
 * sb_num, sb_str_value); json_escape is the same escaping into a fixed
 * buffer, for a writer without an sbuf.  Escaping: '"' and '\' get a
 * backslash, bytes below 0x20 become \u00XX; everything else is copied.
 *
 * Reading: chanter reads back only the flat JSON it wrote itself (ready
 * files, summary.json, job records), so the reader finds a key's first
 * value by text rather than parsing a tree: "key" followed by ':' and
 * optional blanks.  Escapes are undone: \n \t \r \b \f \/ \" \\ and
 * \uXXXX (below 0x80; others become '?').
 */
#ifndef CHANTER_JSON_H
#define CHANTER_JSON_H

#include <stddef.h>
#include <stdint.h>

/* s escaped as above, NUL-terminated and truncated (at a whole escape) to
 * fit out[n]; no quotes are added. */
void json_escape(char *out, size_t n, const char *s);

/* The string value of the first "key" into out (truncated to fit out[n]);
 * 0, or -1 with out empty when there is none or it is not a string. */
int json_get_str(const char *json, const char *key, char *out, size_t n);
/* The idx-th string of the array value of the first "key"; 0, or -1 with
 * out empty when there is no such element. */
int json_get_str_at(const char *json, const char *key, size_t idx, char *out, size_t n);
/* The number value of the first "key"; 0, or -1 (and *v untouched) when
 * there is none or it is not a number (null included). */
int json_get_num(const char *json, const char *key, double *v);
int json_get_i64(const char *json, const char *key, int64_t *v);
/* The idx-th number of the array value of the first "key"; 0, or -1 (and
 * *v untouched) when there is no such element or it is not a number. */
int json_get_num_at(const char *json, const char *key, size_t idx, double *v);

#endif
