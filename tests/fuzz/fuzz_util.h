/*
 * fuzz_util: what the libFuzzer targets of tests/fuzz/ share.  Each target
 * is one fuzz_*.c with LLVMFuzzerTestOneInput (built and run by `make
 * fuzz`, its seeds replayed by tests/integration/test_fuzz_corpus.sh).
 *
 *   fuzz_rpc_requests(): the first byte picks one RPC of a protobuf-c
 *   service descriptor; the rest is unpacked as that RPC's request message,
 *   as the server's rpc layer does when a call arrives.  A message that
 *   unpacks is packed again (as a reply or a forwarded message would be)
 *   to the size it announces.  Not required: that the packed bytes unpack
 *   again -- libprotobuf-c keeps unknown fields such as field number 0 and
 *   packs them back as it got them, which its own unpack then refuses.
 *
 *   fuzz_tmpfile_write(): the parsers that only take a path (the job file,
 *   the datasets) read the input from one temporary file per process,
 *   rewritten for every input.
 *
 *   fuzz_quiet(): the parsers log what they refuse; at warn level that is
 *   most of the run time, so the targets log errors only.
 */
#ifndef CHANTER_FUZZ_UTIL_H
#define CHANTER_FUZZ_UTIL_H

#include <protobuf-c/protobuf-c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with a message (libFuzzer saves the input as a crash). */
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);       \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

static inline void fuzz_quiet(void) {
  static int done;
  if (!done) {
    log_set_level_str("error");
    done = 1;
  }
}

static inline void fuzz_roundtrip(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  FUZZ_CHECK(buf != NULL);
  FUZZ_CHECK(protobuf_c_message_pack(m, buf) == n);
  free(buf);
}

/* data[0] % n_methods picks the RPC; data[1..] is its request. */
static inline int fuzz_rpc_requests(const ProtobufCServiceDescriptor *svc, const uint8_t *data, size_t size) {
  if (size < 1 || svc->n_methods == 0) return 0;
  const ProtobufCMethodDescriptor *m = &svc->methods[data[0] % svc->n_methods];
  ProtobufCMessage *req = protobuf_c_message_unpack(m->input, NULL, size - 1, data + 1);
  if (!req) return 0; /* the server answers INVALID_ARGUMENT */
  fuzz_roundtrip(req);
  protobuf_c_message_free_unpacked(req, NULL);
  return 0;
}

/* The path of this process's temporary file, holding data[0, size). */
static inline const char *fuzz_tmpfile_write(const uint8_t *data, size_t size, const char *suffix) {
  static char path[128];
  static int fd = -1;
  if (fd < 0) {
    snprintf(path, sizeof path, "/tmp/chanter-fuzz-XXXXXX%s", suffix);
    fd = mkstemps(path, (int)strlen(suffix));
    FUZZ_CHECK(fd >= 0);
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  size_t off = 0;
  while (off < size) {
    ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
    FUZZ_CHECK(w > 0);
    off += (size_t)w;
  }
  return path;
}

#endif
