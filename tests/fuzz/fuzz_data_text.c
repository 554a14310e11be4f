/*
 * fuzz_data_text: the text dataset readers (common/data_text.c: Criteo
 * TSV and Avazu CSV, indexed and validated at open) through data_open, and
 * batch reads of what opened.  The first byte picks the job:
 *   bit 0  avazu (22 tables, no dense features) instead of criteo;
 *   bit 1  strict = true (the first malformed record fails the open);
 *   bit 2  data.max_bad_fraction = 1 (otherwise the default 1%);
 *   bit 3  dataset_format = auto (decide by content) instead of naming it.
 */
#include "fuzz_data_util.h"

#define AVAZU_ROWS "table_rows=1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (size < 1) return 0;
  uint8_t mode = data[0];
  int avazu = mode & 1;
  const char *path = fuzz_tmpfile_write(data + 1, size - 1, avazu ? ".csv" : ".tsv");
  const char *sets[8];
  size_t n = 0;
  sets[n++] = (mode & 8) ? "dataset_format=auto" : avazu ? "dataset_format=avazu" : "dataset_format=criteo";
  if (avazu) {
    sets[n++] = "n_dense=0";
    sets[n++] = AVAZU_ROWS;
  }
  sets[n++] = (mode & 2) ? "strict=true" : "strict=false";
  if (mode & 4) sets[n++] = "data.max_bad_fraction=1";
  fuzz_data_open_read(path, sets, n);
  return 0;
}
