/*
 * cfg: see cfg.h.  The table in cfg_keys.h is the single declaration of
 * every key: name, type, default, bounds (numbers) or choices (enums),
 * help.  Adding a key is adding a line there; README.md's key list is
 * printed from it by `chanter config keys`.  Renaming a key is moving its
 * line and adding {old, new} to the aliases there: set_named below reads
 * the old name for the new key, with a warning.
 */
#include "cfg.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cfg_keys.h"
#include "err.h"
#include "log.h"
#include "strategy.h"

typedef struct value_s {
  char *str;
  int64_t i;
  double f;
  char origin[160];
  const char *via; /* the old name (aliases) it was set by, or NULL */
  int set;         /* set by a file or --set: not the default */
} value_t;

struct cfg_s {
  value_t v[N_ENTRIES];
  uint8_t warned[N_ALIASES]; /* this old name's deprecation warning was given */
  char *warn[N_ALIASES];     /* those warnings, in the order given */
  size_t n_warn;
};

static int find(const char *name) {
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (strcmp(entries[i].name, name) == 0) return (int)i;
  return -1;
}

/* The key a file or --set names: a key, or an old name of one (*alias =
 * its index in aliases, else -1).  -1 when neither. */
static int resolve(const char *name, int *alias) {
  int idx = find(name);
  *alias = -1;
  for (size_t a = 0; idx < 0 && a < N_ALIASES; a++)
    if (!strcmp(aliases[a].old, name)) {
      *alias = (int)a;
      idx = find(aliases[a].now);
      ASSERT(idx >= 0); /* an alias of an undeclared key is a bug in the table */
    }
  return idx;
}

int cfg_is_key(const char *name) {
  int alias;
  return resolve(name, &alias) >= 0;
}

static int fmt_err(char *err, size_t n, const char *fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
  }
  return ERR_CONFIG;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

/* Checks a list value (T_LIST, T_INTS) and writes its canonical form
 * "a,b,c" (entries trimmed) into out, which has strlen(raw) + 1 bytes.  An
 * empty (or all-blank) value is the empty list.  Entries count from 0, like
 * tables, shards and ranks.  On error writes "key: entry N ..." to err and
 * sets *at to the entry's offset in raw (the loader turns it into a line). */
static int check_list(const entry_t *e, const char *raw, char *out, size_t *at, char *err, size_t n) {
  const char *p = raw;
  size_t k = 0, o = 0;
  while (isspace((unsigned char)*p)) p++;
  if (!*p) {
    out[0] = 0;
    return 0;
  }
  for (p = raw;; p++, k++) {
    const char *comma = strchr(p, ','), *a = p, *b = comma ? comma : p + strlen(p);
    while (a < b && isspace((unsigned char)*a)) a++;
    while (b > a && isspace((unsigned char)b[-1])) b--;
    if (a == b) {
      *at = (size_t)(p - raw);
      return fmt_err(err, n, "%s: entry %zu is empty%s", e->name, k,
                     !comma ? " (the list ends with a comma)" : k == 0 ? " (the list starts with a comma)" : "");
    }
    for (const char *q = a; e->type == T_INTS && q < b; q++)
      if (!isdigit((unsigned char)*q)) {
        *at = (size_t)(a - raw);
        int l = b - a > 40 ? 40 : (int)(b - a);
        return fmt_err(err, n, "%s: entry %zu '%.*s%s' must be an integer >= 0", e->name, k, l, a,
                       b - a > 40 ? "..." : "");
      }
    if (o) out[o++] = ',';
    memcpy(out + o, a, (size_t)(b - a));
    o += (size_t)(b - a);
    if (!comma) break;
    p = comma;
  }
  out[o] = 0;
  return 0;
}

/* Every value must survive cfg_dump and a reload: no line breaks, and no
 * ';' after a blank, which a job file reads as the start of a comment.
 * Only --set can bring such a value (the reader never yields one). */
static const char *unwritable(const char *v) {
  for (const char *p = v; *p; p++) {
    if (*p == '\n' || *p == '\r') return "contains a line break";
    if (*p == ';' && p > v && isspace((unsigned char)p[-1]))
      return "has a ';' after a blank, which a job file would read as a comment";
  }
  return NULL;
}

/* Parses raw into slot idx; on error writes "key = 'raw': why" (lists:
 * "key: entry N ...", with its offset in raw in *at when at is not NULL). */
static int assign(cfg_t *c, int idx, const char *raw, const char *origin, size_t *at, char *err, size_t n) {
  const entry_t *e = &entries[idx];
  value_t nv = {0};
  char *end = NULL;
  size_t bad_at = 0;
  const char *why = unwritable(raw);
  if (why) return fmt_err(err, n, "%s = '%s' %s", e->name, raw, why);
  switch (e->type) {
  case T_INT: {
    errno = 0;
    long long x = strtoll(raw, &end, 10);
    if (errno || end == raw || *end) return fmt_err(err, n, "%s = '%s' is not an integer", e->name, raw);
    if ((double)x < e->min || (double)x > e->max)
      return fmt_err(err, n, "%s = %lld is out of range [%.0f, %.0f]", e->name, x, e->min, e->max);
    nv.i = x;
    nv.f = (double)x;
    break;
  }
  case T_FLOAT: {
    errno = 0;
    double x = strtod(raw, &end);
    if (errno || end == raw || *end || !isfinite(x))
      return fmt_err(err, n, "%s = '%s' is not a number", e->name, raw);
    if (x < e->min || x > e->max)
      return fmt_err(err, n, "%s = %g is out of range [%g, %g]", e->name, x, e->min, e->max);
    nv.f = x;
    break;
  }
  case T_BOOL:
    if (!strcmp(raw, "true") || !strcmp(raw, "1") || !strcmp(raw, "yes") || !strcmp(raw, "on"))
      nv.i = 1;
    else if (!strcmp(raw, "false") || !strcmp(raw, "0") || !strcmp(raw, "no") || !strcmp(raw, "off"))
      nv.i = 0;
    else
      return fmt_err(err, n, "%s = '%s' is not a boolean (true/false)", e->name, raw);
    break;
  case T_ENUM: {
    size_t len = strlen(raw);
    const char *p = e->choices;
    int ok = 0;
    while (p && *p) {
      const char *bar = strchr(p, '|');
      size_t l = bar ? (size_t)(bar - p) : strlen(p);
      if (l == len && strncmp(p, raw, l) == 0) ok = 1;
      p = bar ? bar + 1 : NULL;
    }
    if (!ok) return fmt_err(err, n, "%s = '%s' is not one of %s", e->name, raw, e->choices);
    break;
  }
  case T_STR:
    break;
  case T_LIST:
  case T_INTS: {
    if (!(nv.str = malloc(strlen(raw) + 1))) return -ENOMEM;
    int rc = check_list(e, raw, nv.str, &bad_at, err, n);
    if (rc) {
      free(nv.str);
      if (at) *at = bad_at;
      return rc;
    }
    break;
  }
  }
  if (!strcmp(e->name, "lookahead") && strcmp(raw, "auto") != 0) {
    errno = 0;
    long long x = strtoll(raw, &end, 10);
    if (errno || end == raw || *end || x < 0)
      return fmt_err(err, n, "lookahead = '%s' is neither a number >= 0 nor 'auto'", raw);
  }
  if (!strcmp(e->name, "table_strategy")) { /* each word; their count against table_rows: strategy_parse */
    char tw[256];
    uint32_t k;
    if (strategy_words(raw, NULL, 0, &k, tw, sizeof tw) != 0) return fmt_err(err, n, "table_strategy = '%s': %s", raw, tw);
  }
  if (!nv.str && !(nv.str = strdup(raw))) return -ENOMEM;
  snprintf(nv.origin, sizeof nv.origin, "%s", origin);
  free(c->v[idx].str);
  c->v[idx] = nv;
  return 0;
}

/* Sets key idx as a file or --set names it (alias >= 0: by that old name).
 * The same key set under two names (its old and its new one) is an error
 * naming both places, whichever came first; an old name sets the key and
 * warns, once per old name (logged, and kept for cfg_warning). */
static int set_named(cfg_t *c, int idx, int alias, const char *raw, const char *origin, size_t *at, char *err,
                     size_t n) {
  value_t *v = &c->v[idx];
  const char *name = alias >= 0 ? aliases[alias].old : entries[idx].name, *was = v->via ? v->via : entries[idx].name;
  if (v->set && strcmp(name, was) != 0)
    return fmt_err(err, n, "%s (at %s) and %s (at %s) both set %s (%s is its old name): keep only %s", was, v->origin,
                   name, origin, entries[idx].name, alias >= 0 ? name : was, entries[idx].name);
  int rc = assign(c, idx, raw, origin, at, err, n);
  if (rc) return rc;
  v->set = 1;
  v->via = alias >= 0 ? aliases[alias].old : NULL;
  if (alias >= 0 && !c->warned[alias]) {
    char w[512];
    snprintf(w, sizeof w, "deprecated key %s (at %s): it is %s now; the old name is still read", name, origin,
             entries[idx].name);
    log_warn("%s", w);
    c->warned[alias] = 1;
    if ((c->warn[c->n_warn] = strdup(w)) != NULL) c->n_warn++; /* (logged either way) */
  }
  return 0;
}

const char *cfg_warning(const cfg_t *c, size_t i) { return i < c->n_warn ? c->warn[i] : NULL; }

int cfg_create(cfg_t **out) {
  cfg_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  for (size_t i = 0; i < N_ENTRIES; i++) {
    char err[256];
    int rc = assign(c, (int)i, entries[i].def, "default", NULL, err, sizeof err);
    ASSERT(rc == 0); /* a default that does not parse is a bug in the table */
  }
  *out = c;
  return 0;
}

void cfg_destroy(cfg_t *c) {
  if (!c) return;
  for (size_t i = 0; i < N_ENTRIES; i++) free(c->v[i].str);
  for (size_t i = 0; i < c->n_warn; i++) free(c->warn[i]);
  free(c);
}

/* ---- the job file reader ----
 *
 * A small INI reader of its own: inih, as Debian builds it, cuts lines at
 * 200 characters, and a job with many large tables needs more.  It reads
 * what inih read: "; " and "# " comment lines, "[section]" ("[]" is the job
 * keys again), "key = value" (or "key: value"), an inline comment after a
 * blank and ';', and an indented line continuing the previous key's value
 * (blank and comment lines may sit in between; a section header ends it).
 * The pieces of a continued value are joined with ',' unless one of them
 * already has it there, so "1, 2,\n    3" and "1, 2\n    3" are both
 * "1,2,3".  A key is assigned once its whole value is read; a list error
 * names the line of the offending entry.  Unlike inih it reads the whole
 * file first (at most CFG_MAX_FILE bytes, a regular file, no NUL byte), and
 * a malformed section header is named as such, at its own line. */

typedef struct load_s {
  cfg_t *c;
  const char *path;
  int idx;          /* the key being read (-1: none) */
  int alias;        /* ... named by this old name (aliases; -1: by its own) */
  int key_line;
  char *val;        /* its value so far */
  size_t len, cap;
  size_t *piece_at; /* where each line's piece starts in val ... */
  int *piece_line;  /* ... and that line */
  size_t n_pieces, cap_pieces;
  char msg[512];
} load_t;

/* What a file that is not a regular file is, for "PATH: is ..., not a job file". */
static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

/* A size in binary units with one decimal ("2.0 GiB"), rounded up, so that
 * a file over the limit never reads as within it ("16.1 MiB", not "16.0"). */
static void fmt_size(char *out, size_t n, double bytes) {
  static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    u++;
  }
  if (u == 0) snprintf(out, n, "%.0f bytes", bytes);
  else snprintf(out, n, "%.1f %s", ceil(bytes * 10) / 10, unit[u]);
}

/* Reads the whole job file at path into *text (malloc'd, NUL-terminated,
 * *len bytes; the caller frees it).  Before reading it refuses what is not
 * a regular file (a directory, /dev/zero, a FIFO, a socket): the open is
 * O_NONBLOCK, so that a FIFO without a writer does not block it, and the
 * check is fstat on that fd, so that what is read is what was checked.  It
 * refuses a file over CFG_MAX_FILE, and reads at most CFG_MAX_FILE + 1
 * bytes, so that a file growing while read is refused too, not read for
 * ever.  It refuses a NUL byte, naming its line and (byte) column.
 * 0, -errno when the file cannot be opened, -ENOMEM, or ERR_CONFIG; err
 * says what and where. */
static int read_all(const char *path, char **text, size_t *len, char *err, size_t err_len) {
  char *buf = NULL, size[32];
  size_t n = 0, cap;
  struct stat st;
  int rc = 0, fl, fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    fmt_err(err, err_len, "%s: cannot open job configuration: %s", path, strerror(-rc));
    goto out;
  }
  if (fstat(fd, &st) != 0 || (fl = fcntl(fd, F_GETFL)) < 0) goto io_error;
  if (!S_ISREG(st.st_mode)) {
    rc = fmt_err(err, err_len, "%s: is %s, not a job file", path, file_kind(st.st_mode));
    goto out;
  }
  if (st.st_size > CFG_MAX_FILE) {
    fmt_size(size, sizeof size, (double)st.st_size);
    rc = fmt_err(err, err_len, "%s: %s; a job file is at most %d MiB", path, size, CFG_MAX_FILE >> 20);
    goto out;
  }
  if (fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) goto io_error;
  /* room for the file as fstat saw it, one byte more to see that it ended,
   * and the terminating NUL; grown (to CFG_MAX_FILE + 2 at most) only for a
   * file that grows or whose size fstat does not know (/proc) */
  cap = (size_t)st.st_size + 2;
  for (;;) {
    if (cap - n < 2 || !buf) {
      size_t nc = !buf ? cap : cap * 2 > (size_t)CFG_MAX_FILE + 2 ? (size_t)CFG_MAX_FILE + 2 : cap * 2;
      char *nb = realloc(buf, nc);
      if (!nb) {
        rc = -ENOMEM;
        fmt_err(err, err_len, "%s: out of memory", path);
        goto out;
      }
      buf = nb;
      cap = nc;
    }
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) goto io_error;
    if (r == 0) break;
    n += (size_t)r;
    if (n > CFG_MAX_FILE) {
      rc = fmt_err(err, err_len, "%s: more than %d MiB (it grew while being read); a job file is at most %d MiB",
                   path, CFG_MAX_FILE >> 20, CFG_MAX_FILE >> 20);
      goto out;
    }
  }
  buf[n] = 0;
  const char *nul = memchr(buf, 0, n);
  if (nul) {
    int line = 1;
    const char *bol = buf;
    for (const char *p = buf; p < nul; p++)
      if (*p == '\n') {
        line++;
        bol = p + 1;
      }
    rc = fmt_err(err, err_len, "%s:%d:%zu: a NUL byte (a binary file?)", path, line, (size_t)(nul - bol) + 1);
  }
  goto out;
io_error:
  rc = fmt_err(err, err_len, "%s: cannot read job configuration: %s", path, strerror(errno));
out:
  if (fd >= 0) close(fd);
  if (rc) {
    free(buf);
    buf = NULL;
    n = 0;
  }
  *text = buf;
  *len = n;
  return rc;
}

/* The next line of text (len bytes) from *at, its newline cut; advances *at.
 * 1 = a line, 0 = the end, -E2BIG = longer than CFG_MAX_LINE. */
static int next_line(char *text, size_t len, size_t *at, char **line) {
  if (*at >= len) return 0;
  char *s = text + *at, *nl = memchr(s, '\n', len - *at);
  size_t n = nl ? (size_t)(nl - s) : len - *at;
  if (nl) *nl = 0;
  *at += n + (nl != NULL);
  *line = s;
  return n > CFG_MAX_LINE ? -E2BIG : 1;
}

/* 1 when some key (or old name) is "name.something": name is a section. */
static int is_section(const char *name) {
  size_t l = strlen(name);
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (!strncmp(entries[i].name, name, l) && entries[i].name[l] == '.') return 1;
  for (size_t a = 0; a < N_ALIASES; a++)
    if (!strncmp(aliases[a].old, name, l) && aliases[a].old[l] == '.') return 1;
  return 0;
}

/* Reads the section header t ("[oracle]"; "[]" is the job keys again) into
 * section.  ERR_CONFIG, with the sentence in x->msg, for a header without
 * its ']', with something after the ']', or naming a section no key has. */
static int section_header(load_t *x, char *t, char *section, size_t n) {
  char *close = strchr(t, ']');
  if (!close) {
    const char *name = t + 1;
    while (*name == ' ' || *name == '\t') name++;
    size_t w = (size_t)(name - t - 1) + strcspn(name, " \t=:");
    snprintf(x->msg, sizeof x->msg, "missing ] in the section header '[%.*s'", (int)(w < 100 ? w : 100), t + 1);
    return ERR_CONFIG;
  }
  char *after = trim(close + 1);
  *close = 0;
  char *name = trim(t + 1);
  if (*after) {
    snprintf(x->msg, sizeof x->msg, "'%.100s' after the section header '[%.100s]' (a section header is a line of its own)",
             after, name);
    return ERR_CONFIG;
  }
  if (*name && !is_section(name)) {
    snprintf(x->msg, sizeof x->msg, "unknown section [%.100s] (see `chanter config keys`)", name);
    return ERR_CONFIG;
  }
  snprintf(section, n, "%s", name);
  return 0;
}

/* Cuts s at an inline comment: a ';' after a blank. */
static void strip_comment(char *s) {
  for (size_t i = 1; s[i]; i++)
    if (s[i] == ';' && isspace((unsigned char)s[i - 1])) {
      s[i] = 0;
      return;
    }
}

/* Appends one line's piece (trimmed) of the current key's value. */
static int add_piece(load_t *x, const char *piece, int line) {
  size_t pl = strlen(piece);
  int sep = x->len && pl && x->val[x->len - 1] != ',' && piece[0] != ',';
  if (x->len + (size_t)sep + pl + 1 > x->cap) {
    size_t nc = (x->len + (size_t)sep + pl + 1) * 2;
    char *nv = realloc(x->val, nc);
    if (!nv) return -ENOMEM;
    x->val = nv;
    x->cap = nc;
  }
  if (x->n_pieces == x->cap_pieces) {
    size_t nc = x->cap_pieces ? x->cap_pieces * 2 : 16;
    size_t *na = realloc(x->piece_at, nc * sizeof *na);
    if (na) x->piece_at = na;
    int *nl = realloc(x->piece_line, nc * sizeof *nl);
    if (nl) x->piece_line = nl;
    if (!na || !nl) return -ENOMEM;
    x->cap_pieces = nc;
  }
  if (sep) x->val[x->len++] = ',';
  x->piece_at[x->n_pieces] = x->len;
  x->piece_line[x->n_pieces++] = line;
  memcpy(x->val + x->len, piece, pl + 1);
  x->len += pl;
  return 0;
}

/* Assigns the key read so far, if any.  On error sets *bad to the line to
 * blame: the key's, or for a list the line of the offending entry. */
static int flush(load_t *x, int *bad) {
  if (x->idx < 0) return 0;
  int idx = x->idx;
  x->idx = -1;
  char origin[160];
  snprintf(origin, sizeof origin, "%s:%d", x->path, x->key_line);
  size_t at = SIZE_MAX;
  int rc = set_named(x->c, idx, x->alias, x->val, origin, &at, x->msg, sizeof x->msg);
  if (rc) {
    *bad = x->key_line;
    for (size_t i = 0; at != SIZE_MAX && i < x->n_pieces && x->piece_at[i] <= at; i++) *bad = x->piece_line[i];
  }
  x->len = 0;
  x->n_pieces = 0;
  return rc;
}

int cfg_load_file(cfg_t *c, const char *path, char *err, size_t err_len) {
  char *text, *t, section[256] = "";
  size_t len, at = 0;
  int rc = read_all(path, &text, &len, err, err_len);
  if (rc) return rc;
  load_t x = {.c = c, .path = path, .idx = -1, .alias = -1};
  int line = 0, bad = 0;
  while ((rc = next_line(text, len, &at, &t)) == 1) {
    if (++line == 1 && !strncmp(t, "\xEF\xBB\xBF", 3)) t += 3; /* a UTF-8 BOM */
    int indented = *t == ' ' || *t == '\t';
    t = trim(t);
    if (!*t || *t == ';' || *t == '#') continue;
    strip_comment(t);
    t = trim(t);
    if (indented && x.idx >= 0) {
      if ((rc = add_piece(&x, t, line)) != 0) break;
      continue;
    }
    if ((rc = flush(&x, &bad)) != 0) break;
    if (*t == '[') {
      if ((rc = section_header(&x, t, section, sizeof section)) != 0) {
        bad = line;
        break;
      }
      continue;
    }
    char *sep = t + strcspn(t, "=:");
    if (!*sep || sep == t) {
      size_t tl = strlen(t);
      if (!*sep && tl > 1 && t[tl - 1] == ']')
        snprintf(x.msg, sizeof x.msg, "missing [ in the section header '%.100s'", t);
      else
        snprintf(x.msg, sizeof x.msg, "syntax error (expected 'key = value' or '[section]')");
      rc = ERR_CONFIG;
      bad = line;
      break;
    }
    *sep = 0;
    char key[512], *name = trim(t);
    snprintf(key, sizeof key, "%s%s%s", section, *section ? "." : "", name);
    if ((x.idx = resolve(key, &x.alias)) < 0) {
      snprintf(x.msg, sizeof x.msg, "unknown key '%.100s'%s%s%s (see `chanter config keys`)", name,
               *section ? " in section [" : "", section, *section ? "]" : "");
      rc = ERR_CONFIG;
      bad = line;
      break;
    }
    x.key_line = line;
    if ((rc = add_piece(&x, trim(sep + 1), line)) != 0) break;
  }
  if (rc == 0) rc = flush(&x, &bad);
  free(text);
  free(x.val);
  free(x.piece_at);
  free(x.piece_line);
  if (rc == -E2BIG)
    return fmt_err(err, err_len, "%s:%d: line longer than %d characters (split long lists over indented continuation lines)",
                   path, line + 1, CFG_MAX_LINE);
  if (rc == -ENOMEM) {
    fmt_err(err, err_len, "%s:%d: out of memory", path, line);
    return rc;
  }
  if (rc) return fmt_err(err, err_len, "%s:%d: %s", path, bad, x.msg);
  return 0;
}

int cfg_set(cfg_t *c, const char *kv, const char *origin, char *err, size_t err_len) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv) return fmt_err(err, err_len, "%s '%s': expected key=value", origin, kv);
  char key[256];
  size_t kl = (size_t)(eq - kv);
  if (kl >= sizeof key) return fmt_err(err, err_len, "%s '%s': key too long", origin, kv);
  memcpy(key, kv, kl);
  key[kl] = 0;
  char *k = trim(key);
  int alias, idx = resolve(k, &alias);
  if (idx < 0) return fmt_err(err, err_len, "%s %s: unknown key '%s' (see `chanter config keys`)", origin, kv, k);
  char *v = strdup(eq + 1);
  if (!v) return -ENOMEM;
  char msg[400];
  int rc = set_named(c, idx, alias, trim(v), origin, NULL, msg, sizeof msg);
  free(v);
  if (rc) return fmt_err(err, err_len, "%s %s: %s", origin, kv, msg);
  return 0;
}

int cfg_parse_args(cfg_t *c, int *argc, char **argv, char *err, size_t err_len) {
  int out = 1, rc = 0;
  const char *file = NULL;
  /* first pass: find --config (the file is applied before any --set) */
  for (int i = 1; i < *argc; i++) {
    if (!strcmp(argv[i], "--config")) {
      if (i + 1 >= *argc) return fmt_err(err, err_len, "--config needs a file argument");
      file = argv[++i];
    } else if (!strncmp(argv[i], "--config=", 9)) {
      file = argv[i] + 9;
    } else if (!strcmp(argv[i], "--")) {
      break;
    }
  }
  if (file && (rc = cfg_load_file(c, file, err, err_len)) != 0) return rc;
  for (int i = 1; i < *argc; i++) {
    if (!strcmp(argv[i], "--config")) {
      i++;
    } else if (!strncmp(argv[i], "--config=", 9)) {
    } else if (!strcmp(argv[i], "--set")) {
      if (i + 1 >= *argc) return fmt_err(err, err_len, "--set needs a key=value argument");
      if ((rc = cfg_set(c, argv[++i], "--set", err, err_len)) != 0) return rc;
    } else if (!strncmp(argv[i], "--set=", 6)) {
      if ((rc = cfg_set(c, argv[i] + 6, "--set", err, err_len)) != 0) return rc;
    } else {
      argv[out++] = argv[i];
    }
  }
  argv[out] = NULL;
  *argc = out;
  return cfg_validate(c, err, err_len);
}

#define TY(t) (1u << (t))
static const value_t *get(const cfg_t *c, const char *key, unsigned types) {
  int idx = find(key);
  if (idx < 0) {
    fprintf(stderr, "<2>cfg: undeclared key '%s'\n", key);
    ASSERT(idx >= 0);
  }
  ASSERT((types & TY(entries[idx].type)) != 0);
  return &c->v[idx];
}

int64_t cfg_int(const cfg_t *c, const char *key) { return get(c, key, TY(T_INT) | TY(T_BOOL))->i; }
double cfg_float(const cfg_t *c, const char *key) { return get(c, key, TY(T_FLOAT) | TY(T_INT))->f; }
int cfg_bool(const cfg_t *c, const char *key) { return (int)get(c, key, TY(T_BOOL))->i; }
const char *cfg_str(const cfg_t *c, const char *key) {
  return get(c, key, TY(T_STR) | TY(T_ENUM) | TY(T_LIST) | TY(T_INTS))->str;
}

const char *cfg_origin(const cfg_t *c, const char *key) {
  int idx = find(key);
  ASSERT(idx >= 0);
  return c->v[idx].origin;
}

static int split(const char *s, char ***items, size_t *n) {
  *items = NULL;
  *n = 0;
  char *dup = strdup(s), *save = NULL;
  if (!dup) return -ENOMEM;
  size_t cap = 0;
  int rc = 0;
  for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *t = trim(tok);
    if (!*t) continue;
    if (*n == cap) {
      cap = cap ? cap * 2 : 8;
      char **ni = realloc(*items, cap * sizeof *ni);
      if (!ni) { rc = -ENOMEM; break; }
      *items = ni;
    }
    if (!((*items)[*n] = strdup(t))) { rc = -ENOMEM; break; }
    (*n)++;
  }
  free(dup);
  if (rc) { cfg_list_free(*items, *n); *items = NULL; *n = 0; }
  return rc;
}

int cfg_list(const cfg_t *c, const char *key, char ***items, size_t *n) {
  return split(cfg_str(c, key), items, n);
}

void cfg_list_free(char **items, size_t n) {
  for (size_t i = 0; i < n; i++) free(items[i]);
  free(items);
}

int cfg_state_floats(const char *opt, uint32_t dim) {
  if (!strcmp(opt, "sgd")) return 0;
  if (!strcmp(opt, "adagrad")) return (int)dim;
  if (!strcmp(opt, "rowwise_adagrad")) return 1;
  return -EINVAL;
}

static int parse_u64_list(const cfg_t *c, const char *key, uint64_t **vals, size_t *n, uint64_t min,
                          uint64_t max, char *err, size_t err_len) {
  char **items;
  int rc = cfg_list(c, key, &items, n);
  if (rc) return rc;
  *vals = calloc(*n ? *n : 1, sizeof **vals);
  if (!*vals) { cfg_list_free(items, *n); return -ENOMEM; }
  for (size_t i = 0; i < *n; i++) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(items[i], &end, 10);
    if (errno || *end || items[i][0] == '-' || x < min || x > max) {
      rc = fmt_err(err, err_len, "%s (from %s): entry %zu '%s' must be an integer in [%llu, %llu]", key,
                   cfg_origin(c, key), i, items[i], (unsigned long long)min, (unsigned long long)max);
      break;
    }
    (*vals)[i] = x;
  }
  cfg_list_free(items, *n);
  if (rc) { free(*vals); *vals = NULL; }
  return rc;
}

int cfg_table_rows(const cfg_t *c, uint64_t **rows, size_t *n, char *err, size_t err_len) {
  int rc = parse_u64_list(c, "table_rows", rows, n, 1, TABLE_ROW_MASK, err, err_len);
  if (rc) return rc;
  uint64_t scale = (uint64_t)cfg_int(c, "table_scale");
  for (size_t t = 0; t < *n && scale > 1; t++) (*rows)[t] = (*rows)[t] / scale ? (*rows)[t] / scale : 1;
  return 0;
}

int cfg_layout(const cfg_t *c, table_layout_t *out, char *err, size_t err_len) {
  uint64_t *rows = NULL, *dims = NULL;
  size_t nr = 0, nd = 0;
  int rc = cfg_table_rows(c, &rows, &nr, err, err_len);
  if (rc) return rc;
  if ((rc = parse_u64_list(c, "table_dims", &dims, &nd, 1, 65536, err, err_len)) != 0) goto out;
  if (nr == 0) { rc = fmt_err(err, err_len, "table_rows (from %s) is empty", cfg_origin(c, "table_rows")); goto out; }
  if (nr > TABLE_MAX) { rc = fmt_err(err, err_len, "table_rows lists %zu tables; at most %d", nr, TABLE_MAX); goto out; }
  if (nd && nd != nr) {
    rc = fmt_err(err, err_len, "table_dims (from %s) lists %zu dimensions but table_rows lists %zu tables",
                 cfg_origin(c, "table_dims"), nd, nr);
    goto out;
  }
  if ((rc = table_layout_init(out, (uint32_t)nr, (uint64_t)cfg_int(c, "seed"))) != 0) goto out;
  for (size_t t = 0; t < nr; t++) {
    uint32_t dim = nd ? (uint32_t)dims[t] : (uint32_t)cfg_int(c, "embedding_dim");
    out->tables[t].rows = rows[t];
    out->tables[t].dim = dim;
    out->tables[t].state_floats = (uint32_t)cfg_state_floats(cfg_str(c, "embedding_optimizer"), dim);
  }
out:
  free(rows);
  free(dims);
  return rc;
}

int cfg_validate(const cfg_t *c, char *err, size_t err_len) {
  table_layout_t l;
  int rc = cfg_layout(c, &l, err, err_len);
  if (rc) return rc;
  table_layout_close(&l);
  char **addrs;
  size_t n;
  if ((rc = cfg_list(c, "cluster.embedding", &addrs, &n)) != 0) return rc;
  for (size_t i = 0; i < n && !rc; i++)
    if (!strchr(addrs[i], ':'))
      rc = fmt_err(err, err_len, "cluster.embedding (from %s): entry %zu '%s' is not host:port",
                   cfg_origin(c, "cluster.embedding"), i, addrs[i]);
  if (!rc && n && (int64_t)n != cfg_int(c, "embedding_servers"))
    rc = fmt_err(err, err_len, "cluster.embedding (from %s) lists %zu servers but embedding_servers (from %s) is %lld",
                 cfg_origin(c, "cluster.embedding"), n, cfg_origin(c, "embedding_servers"),
                 (long long)cfg_int(c, "embedding_servers"));
  cfg_list_free(addrs, n);
  if (rc) return rc;
  return cfg_check_net(c, err, err_len);
}

/* Writes "key = value"; a list that would pass DUMP_WIDTH columns goes on
 * over indented continuation lines, each ending in its ',' (which the
 * reader does not double).  What the reader would take for a comment stays
 * off the start of a value (";x": "key =;x") and of a line (an entry
 * beginning with ';' or '#' is not moved to the next line). */
#define DUMP_WIDTH 80
static void dump_value(FILE *f, const entry_t *e, const char *key, const char *v) {
  if (!*v) {
    fprintf(f, "%s =\n", key);
    return;
  }
  int col = fprintf(f, "%s =%s", key, v[0] == ';' ? "" : " ");
  if (e->type != T_LIST && e->type != T_INTS) {
    fprintf(f, "%s\n", v);
    return;
  }
  for (const char *p = v; *p;) {
    size_t l = strcspn(p, ",");
    int last = p[l] == 0;
    if (p != v && (size_t)col + l + 1 > DUMP_WIDTH && *p != ';' && *p != '#') {
      fputs("\n    ", f);
      col = 4;
    }
    col += fprintf(f, "%.*s%s", (int)l, p, last ? "" : ",");
    p += l + !last;
  }
  fputc('\n', f);
}

static size_t section_len(const char *name) {
  const char *dot = strchr(name, '.');
  return dot ? (size_t)(dot - name) : 0;
}

static int same_section(const char *a, const char *b) {
  size_t l = section_len(a);
  return l == section_len(b) && strncmp(a, b, l) == 0;
}

void cfg_dump(const cfg_t *c, FILE *f, int verbose) {
  /* the job keys, then each section once, in the table's order */
  for (size_t i = 0; i < N_ENTRIES; i++) {
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = same_section(entries[i].name, entries[j].name);
    if (seen) continue;
    size_t sl = section_len(entries[i].name);
    if (sl) fprintf(f, "\n[%.*s]\n", (int)sl, entries[i].name);
    for (size_t j = i; j < N_ENTRIES; j++) {
      if (!same_section(entries[i].name, entries[j].name)) continue;
      if (verbose)
        fprintf(f, "# %s (from %s%s%s)\n", entries[j].help, c->v[j].origin, c->v[j].via ? ", as " : "",
                c->v[j].via ? c->v[j].via : "");
      dump_value(f, &entries[j], entries[j].name + (sl ? sl + 1 : 0), c->v[j].str);
    }
  }
}

void cfg_print_keys(FILE *f) {
  static const char *tn[] = {"int", "float", "bool", "string", "enum", "list", "ints"};
  for (size_t i = 0; i < N_ENTRIES; i++) {
    const entry_t *e = &entries[i];
    fprintf(f, "%-30s %-6s default=%s", e->name, tn[e->type], *e->def ? e->def : "''");
    if (e->type == T_ENUM) fprintf(f, " {%s}", e->choices);
    if (e->type == T_INT || e->type == T_FLOAT) fprintf(f, " [%g, %g]", e->min, e->max);
    fprintf(f, "\n    %s\n", e->help);
  }
  fprintf(f, "\nrenamed keys (the old name is still read, with a warning; setting both is an error):\n");
  for (size_t a = 0; a < N_ALIASES; a++) fprintf(f, "    %-30s -> %s\n", aliases[a].old, aliases[a].now);
}

int cfg_path_expand(const char *tmpl, const char *role, long index, char *out, size_t n) {
  if (!n) return -ENAMETOOLONG;
  size_t o = 0;
  int rc = 0;
  for (const char *p = tmpl; *p && !rc;) {
    char num[24];
    const char *put = NULL;
    size_t skip = 1;
    if (role && !strncmp(p, "{role}", 6)) put = role, skip = 6;
    else if (index >= 0 && p[0] == '%' && p[1] == 'i') snprintf(num, sizeof num, "%ld", index), put = num, skip = 2;
    size_t k = put ? strlen(put) : 1;
    if (o + k >= n) rc = -ENAMETOOLONG;
    else memcpy(out + o, put ? put : p, k), o += k;
    p += skip;
  }
  out[o] = 0;
  return rc;
}
