/* chanter bench model: placeholder until the model library lands (issue 4). */
#include <stdio.h>

#include "cli.h"

int bench_model(cli_t *cli) {
  (void)cli;
  fprintf(stderr, "chanter bench model: not built yet\n");
  return 2;
}
