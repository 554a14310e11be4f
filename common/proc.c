/* proc: see proc.h. */
#include "proc.h"

#include <malloc.h>
#include <signal.h>

#include "log.h"

void proc_init(const char *name) {
  log_set_name(name);
  /* large message buffers stay in the heap instead of mmap/munmap per call */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  /* a peer that closes its socket must be an error return, not a signal */
  signal(SIGPIPE, SIG_IGN);
}
