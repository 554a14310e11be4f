/*
 * fuzz_manifest: manifest_parse (common/manifest.c), the reader of a
 * whole-job checkpoint's manifest, which the oracle reads back from an
 * embedding server's blob on resume.  A manifest that parses is formatted
 * again (manifest_format) and must parse again to the same fields.
 *
 * The text ends with a SHA-256 of the rest, which random bytes never
 * match: when the first byte is odd, the target rewrites the hash of the
 * last "sha256=" line to the right one, so the fields behind it are
 * fuzzed; even, the text (after that byte) is parsed as it is.
 */
#include "fuzz_util.h"
#include "manifest.h"

static char *with_right_sha(const uint8_t *data, size_t size) {
  char *t = malloc(size ? size : 1);
  FUZZ_CHECK(t != NULL);
  memcpy(t, data, size);
  size_t sha = SIZE_MAX;
  for (size_t i = 0; i + 7 <= size; i++)
    if ((i == 0 || t[i - 1] == '\n') && !strncmp(t + i, "sha256=", 7)) sha = i;
  if (sha != SIZE_MAX && size - sha >= 7 + 64) {
    char h[65];
    manifest_sha256_hex(t, sha, h);
    memcpy(t + sha + 7, h, 64);
  }
  return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (size < 1) return 0;
  char *in = with_right_sha(data + 1, size - 1);
  if (!(data[0] & 1)) memcpy(in, data + 1, size - 1);
  manifest_t m, m2;
  char err[512];
  memset(&m, 0, sizeof m);
  int rc = manifest_parse(in, size - 1, &m, err, sizeof err);
  free(in);
  if (rc != 0) return 0;
  size_t len = 0;
  char *text = manifest_format(&m, &len);
  FUZZ_CHECK(text != NULL);
  memset(&m2, 0, sizeof m2);
  if (manifest_parse(text, len, &m2, err, sizeof err) != 0) {
    fprintf(stderr, "a formatted manifest does not parse again: %s\n%.*s\n", err, (int)len, text);
    abort();
  }
  FUZZ_CHECK(m2.iteration == m.iteration && m2.servers == m.servers && !strcmp(m2.id, m.id));
  FUZZ_CHECK(!strcmp(m2.dataset, m.dataset) && m2.layout_hash == m.layout_hash);
  for (uint64_t i = 0; m.server_bytes && i < m.servers; i++) FUZZ_CHECK(m2.server_bytes[i] == m.server_bytes[i]);
  free(text);
  manifest_free(&m2);
  manifest_free(&m);
  return 0;
}
