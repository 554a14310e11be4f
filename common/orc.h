/*
 * orc: the client of the oracle, shared by trainers, the CLI and tests.
 *
 * Unary calls (Join, Heartbeat, KvSet/KvGet, Status, Stop) are blocking,
 * carry rpc.timeout_ms deadlines (KvGet: its own wait plus that), and retry
 * while the oracle is unavailable (restarting).  The Work stream is opened
 * with orc_work_open (which sends Hello); one thread may read WorkItems
 * while another writes Reports.  Thread-safe.
 */
#ifndef CHANTER_ORC_H
#define CHANTER_ORC_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "oracle.pb-c.h"
#include "rpc.h"

typedef struct orc_s orc_t;

/* Channel to addr (NULL: cluster.oracle).  0 or ERR_CONFIG with err. */
int orc_create(const cfg_t *cfg, const char *addr, orc_t **out, char *err, size_t err_len);
void orc_destroy(orc_t *o);
const char *orc_address(const orc_t *o);

int orc_join(orc_t *o, const Chanter__Oracle__V1__JoinRequest *req, Chanter__Oracle__V1__JoinResponse **resp,
             char *err, size_t err_len);
int orc_heartbeat(orc_t *o, Chanter__Oracle__V1__Role role, uint32_t rank, uint64_t iteration, int *stop, char *err,
                  size_t err_len);
int orc_kv_set(orc_t *o, const char *key, const void *val, size_t len, char *err, size_t err_len);
/* *val is malloc'd (caller frees).  ERR_NOTFOUND after timeout_ms. */
int orc_kv_get(orc_t *o, const char *key, void **val, size_t *len, int64_t timeout_ms, char *err, size_t err_len);
/* From any thread: every call retrying an oracle that does not answer,
 * and every later one, gives up with ERR_CANCELLED (a stopping daemon). */
void orc_abort(orc_t *o);
int orc_status(orc_t *o, Chanter__Oracle__V1__StatusResponse **resp, char *err, size_t err_len);
/* The same, tried once: UNAVAILABLE at once while the oracle is down (for
 * a watcher that polls, and decides itself how long to wait). */
int orc_status_once(orc_t *o, Chanter__Oracle__V1__StatusResponse **resp, char *err, size_t err_len);
int orc_stop(orc_t *o, const char *reason, char *err, size_t err_len);
/* Starts a held job: resumed from checkpoint `resume` ("latest" or an id),
 * or fresh (the servers cleared).  *msg (may be NULL) gets the oracle's
 * answer.  0 or the oracle's refusal in err. */
int orc_start(orc_t *o, const char *resume, int fresh, char *msg, size_t msg_len, char *err, size_t err_len);
/* A checkpoint as soon as possible: its id and the iteration it holds. */
int orc_checkpoint(orc_t *o, char *id, size_t id_len, uint64_t *iteration, char *err, size_t err_len);
/* Scale: the trainer group re-forms with `trainers` trainers after
 * checkpoint id (the model after *iteration); or, with trainers 0, the
 * job goes onto `servers` embedding servers (addrs: the old and new ones'
 * addresses, by shard); msg: the oracle's sentence.  0 or an error with
 * err (the oracle's refusal). */
int orc_scale(orc_t *o, uint32_t trainers, uint32_t servers, char **addrs, size_t n_addrs, char *id, size_t id_len,
              uint64_t *iteration, char *msg, size_t msg_len, char *err, size_t err_len);

/* Opens the Work stream of trainer rank and sends Hello. */
int orc_work_open(orc_t *o, uint32_t rank, uint64_t next_iteration, rpc_stream_t **out, char *err, size_t err_len);
/* Next WorkItem (free with protobuf_c_message_free_unpacked); 1 at a clean
 * end of the stream; < 0 on error. */
int orc_work_next(rpc_stream_t *s, Chanter__Oracle__V1__WorkItem **item);
int orc_work_report(rpc_stream_t *s, const Chanter__Oracle__V1__Report *r);
int orc_work_eval(rpc_stream_t *s, const Chanter__Oracle__V1__EvalResult *r);
int orc_work_checkpoint_done(rpc_stream_t *s, const Chanter__Oracle__V1__CheckpointDone *r);

#endif
