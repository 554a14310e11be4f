/* proc: see proc.h. */
#include "proc.h"

#include <malloc.h>
#include <pthread.h>
#include <string.h>
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

void proc_name_thread(const char *name) {
  char n[16];
  size_t l = strlen(name);
  if (l > 15) l = 15;
  memcpy(n, name, l);
  n[l] = 0;
  pthread_setname_np(pthread_self(), n);
}
