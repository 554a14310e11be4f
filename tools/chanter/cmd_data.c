/* chanter data: placeholder until the data module lands (issue 3). */
#include <stdio.h>

#include "cli.h"

int cmd_data(cli_t *cli) {
  (void)cli;
  fprintf(stderr, "chanter data: not built yet\n");
  return 2;
}
