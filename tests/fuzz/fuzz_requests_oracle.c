/*
 * fuzz_requests_oracle: every request message of the Oracle service
 * (proto/oracle.proto: JoinRequest, HeartbeatRequest, KvSet/KvGet, the
 * TrainerMessage of a Work stream, Status, Stop, Start, CheckpointNow),
 * unpacked as the server's rpc layer unpacks them.  What the oracle then
 * checks (a Report or EvalResult: oracle_report__message) needs a running
 * job (oracle_job_t), so the target stops at the unpack; the first byte
 * picks the RPC (fuzz_util.h).
 */
#include "fuzz_util.h"
#include "oracle.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  return fuzz_rpc_requests(&chanter__oracle__v1__oracle__descriptor, data, size);
}
