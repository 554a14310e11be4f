/* chanter bench data: placeholder until the data module lands (issue 3). */
#include <stdio.h>

#include "cli.h"

int bench_data_parse(cli_t *cli) {
  (void)cli;
  fprintf(stderr, "chanter bench data: not built yet\n");
  return 2;
}
