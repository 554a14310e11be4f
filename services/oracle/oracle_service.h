/*
 * oracle_service: the chanter.oracle.v1.Oracle RPC handlers.
 *
 * Membership (Join, Heartbeat, the members of Status), the rendezvous
 * store (KvSet, KvGet: an in-memory map; a KvGet of a key not yet set is
 * parked on the loop with a uv timer and answered when the key is set or
 * NOT_FOUND when its timeout passes), Status, Stop, and the Work stream's
 * front: the first message must be Hello from a joined trainer rank, after
 * which the stream belongs to the job (oracle_job.h), which plans, sends
 * and collects.  Every handler runs on the loop thread.  The service
 * also keeps the job's status page (oracle_page.h, on the metrics port)
 * fresh: its once-a-second tick publishes a snapshot of the job and the
 * members.
 */
#ifndef CHANTER_ORACLE_SERVICE_H
#define CHANTER_ORACLE_SERVICE_H

#include <stddef.h>
#include <uv.h>

#include "cfg.h"
#include "metrics.h"
#include "oracle_job.h"
#include "rpc.h"

#define ORACLE_KV_MAX_KEY 4096          /* bytes of a rendezvous key */
#define ORACLE_KV_MAX_VALUE (16u << 20) /* bytes of a rendezvous value */
#define ORACLE_KV_MAX_KEYS 100000

typedef struct oracle_service_s oracle_service_t;

/* Validates the job configuration (oracle_job_check_cfg, the data schema,
 * the table layout, cluster.dataproc), creates the job and registers the
 * handlers on server (before it starts).  cfg must outlive the service,
 * which sets its trainers when chanter scale changes the count (Scale).
 * 0, or an error with a sentence in err. */
int oracle_service_create(uv_loop_t *loop, rpc_server_t *server, cfg_t *cfg, metrics_registry_t *reg,
                          oracle_service_t **out, char *err, size_t err_len);
oracle_job_t *oracle_service_job(oracle_service_t *svc);
/* The address the oracle serves on (host:port, the port bound), once it
 * listens: the status page (oracle_page.h, on the metrics port) shows it. */
void oracle_service_set_address(oracle_service_t *svc, const char *address);
/* How many trainers have their Work stream open now. */
int oracle_service_trainers_attached(oracle_service_t *svc);
/* Milliseconds since the last Status call (chanter train, scale --wait and
 * the drills poll it while they watch the job). */
int64_t oracle_service_status_age_ms(const oracle_service_t *svc);
/* The daemon is going down: stops the job (trainers get StopWork) and
 * answers parked KvGets, so that the server drains at once.  Loop thread. */
void oracle_service_shutdown(oracle_service_t *svc, const char *why);
/* After the loop stopped: frees everything (the job too).  NULL is a no-op. */
void oracle_service_destroy(oracle_service_t *svc);

#endif
