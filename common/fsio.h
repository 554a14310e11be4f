/*
 * fsio: whole-file reads and the one durable way to replace a file.
 *
 * fsio_replace is the durability rule every file chanter writes for a
 * later process to read follows (the store's metadata, checkpoint
 * manifests, the oracle's job record, the write epoch, ready files,
 * summaries): write a temporary file beside the target, fsync it, rename
 * it over the target, fsync the directory.  A crash at any point leaves
 * either the old file or the new one, never a torn one, and once it
 * returned 0 the new file survives a power loss.
 *
 * Errors: -errno, with why filled with what failed and on which path.
 */
#ifndef CHANTER_FSIO_H
#define CHANTER_FSIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The whole file at path, NUL-terminated (the NUL is not counted in *len;
 * len may be NULL), malloc'd into *out.  At most max bytes (0: no limit);
 * a larger file is -EFBIG. */
int fsio_read_all(const char *path, size_t max, char **out, size_t *len, char *why, size_t why_len);

/* Replaces path with data[0..len) durably (see above).  The temporary
 * file is "<path>.tmp": one name, so a temporary left by a crash is
 * overwritten by the next replace rather than piling up; a path has one
 * writer at a time (two concurrent replaces of one path are a caller's
 * bug).  It is removed on failure.  mode as for open(2). */
int fsio_replace(const char *path, const void *data, size_t len, int mode, char *why, size_t why_len);

/* The same for a writer that streams: fsio_replace_open gives a FILE* on
 * the temporary file; fsio_replace_commit flushes, fsyncs, closes,
 * renames and fsyncs the directory (or, with ok = false, or on any
 * error, closes and removes the temporary).  The fsio_tmp_t holds the
 * names between the two calls. */
typedef struct fsio_tmp_s {
  char *path, *tmp;
  FILE *f;
} fsio_tmp_t;
int fsio_replace_open(fsio_tmp_t *t, const char *path, int mode, char *why, size_t why_len);
int fsio_replace_commit(fsio_tmp_t *t, bool ok, char *why, size_t why_len);

/* fsync of the directory that holds path (of "." for a bare name). */
int fsio_fsync_parent(const char *path, char *why, size_t why_len);
/* fsync of path itself (a file or, with dir, a directory). */
int fsio_fsync_path(const char *path, bool dir, char *why, size_t why_len);
/* mkdir -p (mode 0755); 0 when it exists already as a directory. */
int fsio_mkdir_p(const char *path, char *why, size_t why_len);
/* rm -rf; 0 when path does not exist. */
int fsio_remove_tree(const char *path, char *why, size_t why_len);
bool fsio_exists(const char *path);

#endif
