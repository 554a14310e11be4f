/*
 * fuzz_data_binary: chanter's binary dataset reader (common/data_binary.c:
 * the header checks at open, then records read by offset) through
 * data_open, for a job of 2 dense features and 3 tables of hotness 1, 2,
 * 1 (the seeds were written by `chanter data gen --format binary` for that
 * job).  The header ends with an XXH3 checksum that random bytes never
 * match: when the first byte is odd, the target rewrites it to the right
 * one for the header length the input states, so the fields behind it are
 * fuzzed; even, the bytes (after that one) are read as they are.
 */
#include <xxhash.h>

#include "fuzz_data_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (size < 1) return 0;
  size_t n = size - 1;
  uint8_t *buf = malloc(n ? n : 1);
  FUZZ_CHECK(buf != NULL);
  memcpy(buf, data + 1, n);
  if ((data[0] & 1) && n >= 16) {
    uint32_t hdr;
    memcpy(&hdr, buf + 12, 4);
    if (hdr >= 16 && hdr <= n) {
      uint64_t h = XXH3_64bits(buf, hdr - 8);
      memcpy(buf + hdr - 8, &h, 8);
    }
  }
  const char *path = fuzz_tmpfile_write(buf, n, ".bin");
  free(buf);
  static const char *const sets[] = {"dataset_format=binary", "n_dense=2", "table_rows=100,200,300",
                                     "table_hotness=1,2,1", "hash_seed=0"};
  fuzz_data_open_read(path, sets, sizeof sets / sizeof sets[0]);
  return 0;
}
