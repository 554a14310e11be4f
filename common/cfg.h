/*
 * cfg: the one job configuration every daemon, the CLI and every test read.
 *
 * The job file is INI.  Keys before any section are the job keys of
 * DESIGN.md section 6 (model, batch_size, ...); keys in a section are named
 * "section.key" (e.g. [embedding] hot_mb = 512 is embedding.hot_mb).  Every
 * key is declared once in the table in cfg.c with its type, default, bounds
 * and help; `chanter config keys` prints that table.  Values are read in
 * this order, later winning: defaults, the file (--config FILE), then each
 * --set key=value.  Errors name the file and line (or the --set argument)
 * and what was wrong.  A cfg_t is read-only after loading and safe to read
 * from any thread.
 *
 * Lines may be up to CFG_MAX_LINE characters; an indented line continues
 * the previous key's value (a long list over several lines).  List keys
 * (table_rows, cluster.embedding, ...) are read strictly: an empty entry
 * ("1,,2", a trailing comma) or, in a list of integers, a non-number is an
 * error naming the key, the line and the entry (counted from 0).  Every
 * file cfg_dump writes reads back to the same values.
 *
 * A renamed key keeps its old name as an alias (cfg_keys.h): a file or
 * --set naming the old key sets the new one and logs a deprecation
 * warning once per old name ("deprecated key oracle.auto_probe (at
 * job.ini:12): it is oracle.measure_batches now ..."); setting both the
 * old and the new name is an error naming both places.  cfg_dump and the
 * getters use the new names only.
 */
#ifndef CHANTER_CFG_H
#define CHANTER_CFG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "table.h"

typedef struct cfg_s cfg_t;

/* The longest line a job file may have (8 MiB: 65536 tables of any size). */
#define CFG_MAX_LINE (8 << 20)
/* The largest job file (16 MiB), fixed at compile time: a key could not
 * limit the file that sets it.  A larger file is refused before it is read
 * ("job.ini: 2.0 GiB; a job file is at most 16 MiB"), and no more than
 * this is ever read, even of a file that grows meanwhile. */
#define CFG_MAX_FILE (16 << 20)

/* A config holding every key's default.  0 or -ENOMEM. */
int cfg_create(cfg_t **out);
void cfg_destroy(cfg_t *c);

/* Reads an INI job file.  On error returns ERR_CONFIG (or -errno for a
 * file that cannot be opened, -ENOMEM) and writes "FILE:LINE: what" into
 * err; a list error is "FILE:LINE: key: entry N is empty" with the line of
 * that entry.  Refused before anything is parsed, with "FILE: what": a path
 * that is not a regular file ("FILE: is a directory, not a job file"; also
 * devices such as /dev/null and /dev/zero, FIFOs and sockets, checked on
 * the opened fd, and a FIFO's open does not block), a file over
 * CFG_MAX_FILE, and a NUL byte ("FILE:LINE:COLUMN: a NUL byte (a binary
 * file?)", the column counted in bytes from 1).  A section header without
 * its ']' ("FILE:LINE: missing ] in the section header '[oracle'"), with
 * anything after its ']', or naming a section no key has is refused at its
 * own line.  Reads the file on the calling thread (blocking I/O). */
int cfg_load_file(cfg_t *c, const char *path, char *err, size_t err_len);
/* Applies one "key=value" override; origin names where it came from. */
int cfg_set(cfg_t *c, const char *kv, const char *origin, char *err, size_t err_len);
/* Consumes --config FILE / --config=FILE and --set k=v (repeatable) from
 * argv (they are removed; argc updated), loading the file first and then
 * the overrides in order.  Then validates.  0 or ERR_CONFIG with err. */
int cfg_parse_args(cfg_t *c, int *argc, char **argv, char *err, size_t err_len);
/* Cross-key checks (e.g. cluster address count vs server count). */
int cfg_validate(const cfg_t *c, char *err, size_t err_len);
/* cfg_net.c: metrics.listen is an address; the tls.* files come as a set;
 * and without TLS every cluster address is loopback unless tls.insecure.
 * Part of cfg_validate. */
int cfg_check_net(const cfg_t *c, char *err, size_t err_len);
/* 1 when "host:port" (or a bare host) is a loopback address: 127.0.0.0/8,
 * ::1, localhost.  An empty host ("":port, every interface) is not. */
int cfg_addr_loopback(const char *addr);
/* 1 when the job names a certificate (the daemons speak TLS). */
int cfg_tls_on(const cfg_t *c);

/* Typed getters; naming an undeclared key or the wrong type is a
 * programmer error (ASSERT). */
int64_t cfg_int(const cfg_t *c, const char *key);
double cfg_float(const cfg_t *c, const char *key);
int cfg_bool(const cfg_t *c, const char *key);
const char *cfg_str(const cfg_t *c, const char *key);   /* strings and enums */
/* 1 when name is a declared job key ("seed", "embedding.hot_mb") or the
 * old name of one ("oracle.auto_probe"). */
int cfg_is_key(const char *name);
/* Where the value came from: "default", "FILE:LINE" or "--set" (also when
 * it was set by the key's old name). */
const char *cfg_origin(const cfg_t *c, const char *key);
/* The i-th deprecation warning this config gave (an old key name used;
 * each also logged when given), or NULL past the last. */
const char *cfg_warning(const cfg_t *c, size_t i);

/* Splits a comma-separated list key into *n malloc'd strings (trimmed);
 * free with cfg_list_free.  An empty value gives n = 0.  cfg_str of a list
 * key gives it as "a,b,c". */
int cfg_list(const cfg_t *c, const char *key, char ***items, size_t *n);
void cfg_list_free(char **items, size_t n);

/* The row count of every table as the job uses it: table_rows, each
 * divided by table_scale (rounded down, at least 1).  The one place the
 * scale is applied: the layout below and the data schema (data.h) both
 * read the rows here.  *rows is malloc'd (*n entries); 0 or ERR_CONFIG
 * (err names the entry) / -ENOMEM. */
int cfg_table_rows(const cfg_t *c, uint64_t **rows, size_t *n, char *err, size_t err_len);
/* The embedding table layout: table_rows (scaled), embedding_dim / table_dims,
 * embedding_optimizer (-> state floats) and seed.  Caller closes it. */
int cfg_layout(const cfg_t *c, table_layout_t *out, char *err, size_t err_len);
/* Optimizer state floats per row for an embedding optimizer name. */
int cfg_state_floats(const char *embedding_optimizer, uint32_t dim);

/* Prints the effective configuration as an INI job file that
 * cfg_load_file reads back to the same values: the job keys, then each
 * section once; lists longer than a line go on over indented continuation
 * lines.  With verbose, each key's help and origin as a comment.
 * cfg_print_keys prints every declared key with type, default, bounds and
 * help, then the renamed keys (old -> new). */
void cfg_dump(const cfg_t *c, FILE *f, int verbose);
void cfg_print_keys(FILE *f);

/* The one expander of the placeholders a job file's paths may hold:
 * "{role}" becomes role (when role is not NULL: the process's role, e.g.
 * tls.cert_file = certs/{role}.pem), "%i" the instance index (when index
 * >= 0: a server's shard, as systemd's instance specifier in
 * chanter-embedding@.service; e.g. embedding.data_dir = /var/lib/x-%i).
 * Every occurrence is replaced; anything else is copied.  0, or
 * -ENAMETOOLONG when the result does not fit out[n] (out then holds a
 * truncated copy). */
int cfg_path_expand(const char *tmpl, const char *role, long index, char *out, size_t n);

#endif
