/* orc: see orc.h. */
#include "orc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "err.h"
#include "log.h"

#define OR_DESC(name) (&chanter__oracle__v1__##name##__descriptor)

struct orc_s {
  char *addr;
  rpc_channel_t *ch;
  int64_t timeout_ms;
  volatile int abort; /* orc_abort: retries give up */
};

int orc_create(const cfg_t *cfg, const char *addr, orc_t **out, char *err, size_t err_len) {
  if (!addr) addr = cfg_str(cfg, "cluster.oracle");
  if (!addr || !*addr) {
    return err_set(err, err_len, ERR_CONFIG, "no oracle address: set cluster.oracle (from %s) in the job file",
                   cfg_origin(cfg, "cluster.oracle"));
  }
  orc_t *o = calloc(1, sizeof *o);
  if (!o) return -ENOMEM;
  o->addr = strdup(addr);
  o->timeout_ms = cfg_int(cfg, "rpc.timeout_ms");
  rpc_tls_t tls;
  daemon_tls(cfg, &tls, 0);
  int rc = rpc_channel_create(o->addr, tls.ca_file ? &tls : NULL, (size_t)cfg_int(cfg, "rpc.max_message_mb") << 20,
                              &o->ch);
  if (rc) {
    err_set(err, err_len, rc, "cannot create a channel to the oracle at %s: %s", o->addr, err_str(rc));
    orc_destroy(o);
    return rc;
  }
  *out = o;
  return 0;
}

void orc_destroy(orc_t *o) {
  if (!o) return;
  if (o->ch) rpc_channel_destroy(o->ch);
  free(o->addr);
  free(o);
}

const char *orc_address(const orc_t *o) { return o->addr; }

void orc_abort(orc_t *o) {
  if (o) o->abort = 1;
}

/* A blocking call, retried with backoff while the oracle is unavailable
 * (once: tried once). */
static int call_how(orc_t *o, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd,
                    int64_t extra_ms, int once, ProtobufCMessage **resp, char *err, size_t err_len) {
  const char *path = rpc_method_path(&chanter__oracle__v1__oracle__descriptor, method);
  rpc_status_t st;
  memset(&st, 0, sizeof st);
  int64_t ms = o->timeout_ms + extra_ms;
  int rc = once ? rpc_unary(o->ch, path, req, rd, ms, resp, &st)
                : rpc_unary_retry_abortable(o->ch, path, req, rd, ms, resp, &st, &o->abort);
  if (rc)
    err_set(err, err_len, rc, "oracle %s, %s: %s%s%s", o->addr, method, err_str(rc), st.message[0] ? ": " : "",
            st.message);
  return rc;
}

static int call(orc_t *o, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd,
                int64_t extra_ms, ProtobufCMessage **resp, char *err, size_t err_len) {
  return call_how(o, method, req, rd, extra_ms, 0, resp, err, err_len);
}

int orc_join(orc_t *o, const Chanter__Oracle__V1__JoinRequest *req, Chanter__Oracle__V1__JoinResponse **resp,
             char *err, size_t err_len) {
  return call(o, "Join", &req->base, OR_DESC(join_response), 0, (ProtobufCMessage **)resp, err, err_len);
}

int orc_heartbeat(orc_t *o, Chanter__Oracle__V1__Role role, uint32_t rank, uint64_t iteration, int *stop, char *err,
                  size_t err_len) {
  Chanter__Oracle__V1__HeartbeatRequest req = CHANTER__ORACLE__V1__HEARTBEAT_REQUEST__INIT;
  req.role = role;
  req.rank = rank;
  req.iteration = iteration;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "Heartbeat", &req.base, OR_DESC(heartbeat_response), 0, &resp, err, err_len);
  if (rc == 0) {
    if (stop) *stop = ((Chanter__Oracle__V1__HeartbeatResponse *)resp)->stop;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return rc;
}

int orc_kv_set(orc_t *o, const char *key, const void *val, size_t len, char *err, size_t err_len) {
  Chanter__Oracle__V1__KvSetRequest req = CHANTER__ORACLE__V1__KV_SET_REQUEST__INIT;
  req.key = (char *)key;
  req.value.data = (uint8_t *)val;
  req.value.len = len;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "KvSet", &req.base, OR_DESC(kv_set_response), 0, &resp, err, err_len);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

int orc_kv_get(orc_t *o, const char *key, void **val, size_t *len, int64_t timeout_ms, char *err, size_t err_len) {
  Chanter__Oracle__V1__KvGetRequest req = CHANTER__ORACLE__V1__KV_GET_REQUEST__INIT;
  req.key = (char *)key;
  req.timeout_ms = (uint32_t)(timeout_ms < 0 ? 0 : timeout_ms > UINT32_MAX ? UINT32_MAX : timeout_ms);
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "KvGet", &req.base, OR_DESC(kv_get_response), timeout_ms, &resp, err, err_len);
  if (rc) return rc;
  Chanter__Oracle__V1__KvGetResponse *r = (void *)resp;
  *len = r->value.len;
  *val = malloc(r->value.len ? r->value.len : 1);
  if (*val && r->value.len) memcpy(*val, r->value.data, r->value.len);
  protobuf_c_message_free_unpacked(resp, NULL);
  return *val ? 0 : -ENOMEM;
}

int orc_status(orc_t *o, Chanter__Oracle__V1__StatusResponse **resp, char *err, size_t err_len) {
  Chanter__Oracle__V1__StatusRequest req = CHANTER__ORACLE__V1__STATUS_REQUEST__INIT;
  return call(o, "Status", &req.base, OR_DESC(status_response), 0, (ProtobufCMessage **)resp, err, err_len);
}

int orc_status_once(orc_t *o, Chanter__Oracle__V1__StatusResponse **resp, char *err, size_t err_len) {
  Chanter__Oracle__V1__StatusRequest req = CHANTER__ORACLE__V1__STATUS_REQUEST__INIT;
  return call_how(o, "Status", &req.base, OR_DESC(status_response), 0, 1, (ProtobufCMessage **)resp, err, err_len);
}

int orc_stop(orc_t *o, const char *reason, char *err, size_t err_len) {
  Chanter__Oracle__V1__StopRequest req = CHANTER__ORACLE__V1__STOP_REQUEST__INIT;
  req.reason = (char *)reason;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "Stop", &req.base, OR_DESC(stop_response), 0, &resp, err, err_len);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

int orc_start(orc_t *o, const char *resume, int fresh, char *msg, size_t msg_len, char *err, size_t err_len) {
  Chanter__Oracle__V1__StartRequest req = CHANTER__ORACLE__V1__START_REQUEST__INIT;
  req.resume = (char *)(resume ? resume : "");
  req.fresh = fresh != 0;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "Start", &req.base, OR_DESC(start_response), 0, &resp, err, err_len);
  if (!rc && msg && msg_len) {
    const Chanter__Oracle__V1__StartResponse *r = (const void *)resp;
    snprintf(msg, msg_len, "%s", r->message ? r->message : "");
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

int orc_checkpoint(orc_t *o, char *id, size_t id_len, uint64_t *iteration, char *err, size_t err_len) {
  Chanter__Oracle__V1__CheckpointNowRequest req = CHANTER__ORACLE__V1__CHECKPOINT_NOW_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "Checkpoint", &req.base, OR_DESC(checkpoint_now_response), 0, &resp, err, err_len);
  if (!rc) {
    const Chanter__Oracle__V1__CheckpointNowResponse *r = (const void *)resp;
    snprintf(id, id_len, "%s", r->id ? r->id : "");
    *iteration = r->iteration;
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

int orc_scale(orc_t *o, uint32_t trainers, uint32_t servers, char **addrs, size_t n_addrs, char *id, size_t id_len,
              uint64_t *iteration, char *msg, size_t msg_len, char *err, size_t err_len) {
  Chanter__Oracle__V1__ScaleRequest req = CHANTER__ORACLE__V1__SCALE_REQUEST__INIT;
  req.trainers = trainers;
  req.embedding_servers = servers;
  req.embedding_addresses = addrs;
  req.n_embedding_addresses = n_addrs;
  ProtobufCMessage *resp = NULL;
  int rc = call(o, "Scale", &req.base, OR_DESC(scale_response), 0, &resp, err, err_len);
  if (!rc) {
    const Chanter__Oracle__V1__ScaleResponse *r = (const void *)resp;
    snprintf(id, id_len, "%s", r->checkpoint_id ? r->checkpoint_id : "");
    snprintf(msg, msg_len, "%s", r->message ? r->message : "");
    *iteration = r->iteration;
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

int orc_work_open(orc_t *o, uint32_t rank, uint64_t next_iteration, rpc_stream_t **out, char *err, size_t err_len) {
  const char *path = rpc_method_path(&chanter__oracle__v1__oracle__descriptor, "Work");
  int rc = rpc_stream_open(o->ch, path, OR_DESC(work_item), 0, out);
  if (rc) return err_set(err, err_len, rc, "oracle %s: cannot open the Work stream: %s", o->addr, err_str(rc));
  Chanter__Oracle__V1__Hello hello = CHANTER__ORACLE__V1__HELLO__INIT;
  hello.rank = rank;
  hello.next_iteration = next_iteration;
  Chanter__Oracle__V1__TrainerMessage m = CHANTER__ORACLE__V1__TRAINER_MESSAGE__INIT;
  m.kind_case = CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_HELLO;
  m.hello = &hello;
  if ((rc = rpc_stream_write(*out, &m.base)) != 0) {
    err_set(err, err_len, rc, "oracle %s: cannot send Hello: %s", o->addr, err_str(rc));
    rpc_stream_cancel(*out);
    rpc_stream_destroy(*out);
    *out = NULL;
  }
  return rc;
}

int orc_work_next(rpc_stream_t *s, Chanter__Oracle__V1__WorkItem **item) {
  return rpc_stream_read(s, (ProtobufCMessage **)item);
}

int orc_work_report(rpc_stream_t *s, const Chanter__Oracle__V1__Report *r) {
  Chanter__Oracle__V1__TrainerMessage m = CHANTER__ORACLE__V1__TRAINER_MESSAGE__INIT;
  m.kind_case = CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_REPORT;
  m.report = (Chanter__Oracle__V1__Report *)r;
  return rpc_stream_write(s, &m.base);
}

int orc_work_checkpoint_done(rpc_stream_t *s, const Chanter__Oracle__V1__CheckpointDone *r) {
  Chanter__Oracle__V1__TrainerMessage m = CHANTER__ORACLE__V1__TRAINER_MESSAGE__INIT;
  m.kind_case = CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_CHECKPOINT_DONE;
  m.checkpoint_done = (Chanter__Oracle__V1__CheckpointDone *)r;
  return rpc_stream_write(s, &m.base);
}

int orc_work_eval(rpc_stream_t *s, const Chanter__Oracle__V1__EvalResult *r) {
  Chanter__Oracle__V1__TrainerMessage m = CHANTER__ORACLE__V1__TRAINER_MESSAGE__INIT;
  m.kind_case = CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_EVAL;
  m.eval = (Chanter__Oracle__V1__EvalResult *)r;
  return rpc_stream_write(s, &m.base);
}
