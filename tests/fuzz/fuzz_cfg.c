/*
 * fuzz_cfg: the job file reader, through its public API only (cfg.h):
 * cfg_load_file on the input (written to a temporary file: the reader
 * takes a path), then what a daemon does with a job that loaded --
 * cfg_validate, the table layout (cfg_layout) and the data schema
 * (data_schema_from_cfg), which parse the list keys -- and cfg_dump.
 */
#include "cfg.h"
#include "data.h"
#include "fuzz_util.h"
#include "table.h"

static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (!devnull) devnull = fopen("/dev/null", "w");
  const char *path = fuzz_tmpfile_write(data, size, ".ini");
  cfg_t *c = NULL;
  char err[1024];
  FUZZ_CHECK(cfg_create(&c) == 0);
  err[0] = 0;
  if (cfg_load_file(c, path, err, sizeof err) == 0) {
    if (cfg_validate(c, err, sizeof err) == 0) {
      table_layout_t l;
      memset(&l, 0, sizeof l);
      if (cfg_layout(c, &l, err, sizeof err) == 0) table_layout_close(&l);
      data_schema_t s;
      memset(&s, 0, sizeof s);
      if (data_schema_from_cfg(c, &s, err, sizeof err) == 0) data_schema_close(&s);
    }
    cfg_dump(c, devnull, 1);
  } else {
    FUZZ_CHECK(err[0] != 0); /* errors name the file and line */
  }
  cfg_destroy(c);
  return 0;
}
