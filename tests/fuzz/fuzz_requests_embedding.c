/*
 * fuzz_requests_embedding: every request message of the Embedding service
 * (proto/embedding.proto), unpacked as the server's rpc layer unpacks it.
 * The service's own checks of a request (the layout hash, key and row
 * shapes: embedding_service.c's check_layout and the handlers) are static
 * and need a running store, so this target stops at the unpack; the first
 * byte picks the RPC (fuzz_util.h).
 */
#include "embedding.pb-c.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  return fuzz_rpc_requests(&chanter__embedding__v1__embedding__descriptor, data, size);
}
