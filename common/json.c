/*
 * json: see json.h.
 */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void json_escape(char *out, size_t n, const char *s) {
  if (!n) return;
  size_t o = 0;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    size_t k;
    if (c == '"' || c == '\\') k = (size_t)snprintf(esc, sizeof esc, "\\%c", c);
    else if (c < 0x20) k = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
    else esc[0] = (char)c, k = 1;
    if (o + k + 1 > n) break;
    memcpy(out + o, esc, k);
    o += k;
  }
  out[o] = 0;
}

/* Just after the ':' (and blanks) of the first "key", or NULL. */
static const char *value_of(const char *json, const char *key) {
  if (!json || !key) return NULL;
  size_t kl = strlen(key);
  for (const char *p = json; (p = strchr(p, '"')); p++) {
    if (strncmp(p + 1, key, kl) != 0 || p[1 + kl] != '"') continue;
    const char *q = p + 2 + kl;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
    if (*q != ':') continue;
    q++;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
    return q;
  }
  return NULL;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Reads the string at p (at its opening quote) into out when out is not
 * NULL; returns just past its closing quote, or NULL when it is not one. */
static const char *read_str(const char *p, char *out, size_t n) {
  if (*p != '"') return NULL;
  size_t o = 0;
  for (p++; *p && *p != '"'; p++) {
    char c = *p;
    if (c == '\\') {
      p++;
      switch (*p) {
      case 'n': c = '\n'; break;
      case 't': c = '\t'; break;
      case 'r': c = '\r'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'u': {
        int v = 0;
        for (int i = 1; i <= 4; i++) {
          int h = hexval(p[i]);
          if (h < 0) return NULL;
          v = v * 16 + h;
        }
        c = v < 0x80 ? (char)v : '?';
        p += 4;
        break;
      }
      case 0: return NULL;
      default: c = *p; /* \" \\ \/ */
      }
    }
    if (out && o + 1 < n) out[o++] = c;
  }
  if (*p != '"') return NULL;
  if (out && n) out[o] = 0;
  return p + 1;
}

int json_get_str(const char *json, const char *key, char *out, size_t n) {
  if (n) out[0] = 0;
  const char *p = value_of(json, key);
  if (!p || !read_str(p, out, n)) {
    if (n) out[0] = 0;
    return -1;
  }
  return 0;
}

int json_get_str_at(const char *json, const char *key, size_t idx, char *out, size_t n) {
  if (n) out[0] = 0;
  const char *p = value_of(json, key);
  if (!p || *p != '[') return -1;
  p++;
  for (size_t k = 0;; k++) {
    while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (*p != '"') break;
    p = read_str(p, k == idx ? out : NULL, n);
    if (!p) break;
    if (k == idx) return 0;
  }
  if (n) out[0] = 0;
  return -1;
}

int json_get_num(const char *json, const char *key, double *v) {
  const char *p = value_of(json, key);
  if (!p) return -1;
  char *end;
  errno = 0;
  double d = strtod(p, &end);
  if (end == p || errno == ERANGE) return -1;
  *v = d;
  return 0;
}

int json_get_i64(const char *json, const char *key, int64_t *v) {
  const char *p = value_of(json, key);
  if (!p) return -1;
  char *end;
  errno = 0;
  long long d = strtoll(p, &end, 10);
  if (end == p || errno == ERANGE) return -1;
  *v = (int64_t)d;
  return 0;
}

int json_get_num_at(const char *json, const char *key, size_t idx, double *v) {
  const char *p = value_of(json, key);
  if (!p || *p != '[') return -1;
  p++;
  for (size_t k = 0;; k++) {
    while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    char *end;
    errno = 0;
    double d = strtod(p, &end);
    if (end == p || errno == ERANGE) return -1;
    if (k == idx) {
      *v = d;
      return 0;
    }
    p = end;
  }
}
