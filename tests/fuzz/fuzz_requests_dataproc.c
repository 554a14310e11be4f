/*
 * fuzz_requests_dataproc: the DataProc service's request messages
 * (proto/dataproc.proto: GetBatchRequest, StreamRequest, InfoRequest),
 * unpacked as the server's rpc layer unpacks them -- its check of a
 * request (dataproc_service.c's check_req) is static, and needs an open
 * dataset, so the target stops at the unpack -- and the Batch a data
 * processor sends, which trainers and the oracle decode with
 * batch_pb_decode_batch (common/batch_pb.c): a data processor is another
 * process, its bytes are checked before use.
 *
 * data[0] even: a request (data[0] / 2 picks the RPC); odd: a Batch.
 */
#include "batch_pb.h"
#include "dataproc.pb-c.h"
#include "fuzz_util.h"

static void batch(const uint8_t *data, size_t size) {
  Chanter__Dataproc__V1__Batch *pb = chanter__dataproc__v1__batch__unpack(NULL, size, data);
  if (!pb) return;
  fuzz_roundtrip(&pb->base);
  data_batch_t b;
  char err[256];
  memset(&b, 0, sizeof b);
  if (batch_pb_decode_batch(pb, &b, err, sizeof err) == 0) {
    /* every array is as long as the batch says: touch each element */
    FUZZ_CHECK(b.n == pb->n && b.n_tables == pb->n_tables && b.n_dense == pb->n_dense);
    volatile float f = 0;
    for (uint32_t i = 0; i < b.n; i++) f += b.labels[i];
    for (size_t i = 0; i < (size_t)b.n * b.n_dense; i++) f += b.dense[i];
    volatile uint64_t s = 0;
    for (size_t i = 0; i < data_batch_n_ids(&b); i++) s += b.ids[i];
    for (uint32_t t = 0; t < b.n_tables; t++) FUZZ_CHECK(b.ids_off[t + 1] - b.ids_off[t] == (size_t)b.n * b.hotness[t]);
    (void)f;
    (void)s;
    data_batch_free(&b);
  }
  chanter__dataproc__v1__batch__free_unpacked(pb, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_quiet();
  if (size < 1) return 0;
  if (data[0] & 1) {
    batch(data + 1, size - 1);
    return 0;
  }
  uint8_t pick = data[0] >> 1;
  const ProtobufCServiceDescriptor *svc = &chanter__dataproc__v1__data_proc__descriptor;
  const ProtobufCMethodDescriptor *m = &svc->methods[pick % svc->n_methods];
  ProtobufCMessage *req = protobuf_c_message_unpack(m->input, NULL, size - 1, data + 1);
  if (req) {
    fuzz_roundtrip(req);
    protobuf_c_message_free_unpacked(req, NULL);
  }
  return 0;
}
