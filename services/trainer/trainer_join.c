/*
 * trainer_join: the trainer's membership of its job (trainer_join.h) --
 * Join, the heartbeat thread, the rendezvous store over the oracle's KV
 * and the collective group.  Everything here talks to the oracle or to the
 * peers; nothing touches the cache or the Work stream.  A failover
 * (trainer_loop.c) calls trainer_join_oracle and trainer_join_group_form
 * again for a new generation, after trainer_join_group_close; the
 * heartbeat thread runs across generations, and ends the current one
 * (trainer_abort_generation) when the oracle stops answering.
 *
 * The dense all-reduce's backend.  With device = cuda and two or more
 * trainers, the trainers tell each other (an allgather on the Gloo group)
 * which GPU each computes on; when every one has a GPU of its own
 * (coll_nccl_eligible), they form a second group, NCCL, under the same
 * prefix and through the same rendezvous store, and the dense buckets are
 * all-reduced on it in device memory, on the NCCL group's own stream and
 * trainer_ar's thread.  Otherwise -- two trainers share a GPU (NCCL
 * refuses that), a binary without NCCL, or the NCCL group cannot be formed
 * on some trainer -- every trainer keeps Gloo on the host copies, and
 * each says why in one log line.  All trainers decide from the same
 * gathered facts (and agree on the formation's outcome through the
 * store), so they never disagree on the backend.  The shared rows
 * (critical and delayed), the replicated rows and the partitioned
 * tables' AlltoAlls stay on the Gloo group, on host memory, for now:
 * their buffers are packed on the host (trainer_exec.c, trainer_partition.c).
 */
#include "trainer_join.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "cuda_check.h"
#include "dpc.h"
#include "err.h"
#include "log.h"
#include "proc.h"
#include "sdn.h"
#include "trainer_state.h"

/* ------------------------------------------------------------------ the heartbeat */

int trainer_join_init(trainer_t *t, char *err, size_t err_len) {
  static const char *copy[] = {"cluster.oracle", "rpc.max_message_mb", "tls.ca_file", "tls.cert_file",
                               "tls.key_file",   "tls.server_name"};
  trainer_join_t *j = &t->join;
  int64_t ms = 2 * cfg_int(t->cfg, "trainer.heartbeat_ms");
  if (ms < 1000) ms = 1000;
  if (ms > cfg_int(t->cfg, "rpc.timeout_ms")) ms = cfg_int(t->cfg, "rpc.timeout_ms");
  int rc = cfg_create(&j->hb_cfg);
  if (rc) return rc;
  char kv[8192];
  for (size_t i = 0; i < sizeof copy / sizeof copy[0] && !rc; i++) {
    const char *v = copy[i][0] == 'r' ? NULL : cfg_str(t->cfg, copy[i]);
    if (v)
      snprintf(kv, sizeof kv, "%s=%s", copy[i], v);
    else
      snprintf(kv, sizeof kv, "%s=%lld", copy[i], (long long)cfg_int(t->cfg, copy[i]));
    rc = cfg_set(j->hb_cfg, kv, "heartbeat", err, err_len);
  }
  snprintf(kv, sizeof kv, "rpc.timeout_ms=%lld", (long long)ms);
  if (!rc) rc = cfg_set(j->hb_cfg, kv, "heartbeat", err, err_len);
  if (!rc) rc = orc_create(j->hb_cfg, NULL, &j->hb_orc, err, err_len);
  return rc;
}

void trainer_join_close(trainer_t *t) {
  trainer_join_group_close(t);
  orc_destroy(t->join.hb_orc);
  t->join.hb_orc = NULL;
  cfg_destroy(t->join.hb_cfg);
  t->join.hb_cfg = NULL;
}

static void *heartbeat_main(void *arg) {
  proc_name_thread("trainer-hb");
  trainer_t *t = arg;
  int64_t every = cfg_int(t->cfg, "trainer.heartbeat_ms");
  int failing = 0;
  double fail_since = 0;
  pthread_mutex_lock(&t->mu);
  while (!trainer_stopping(t)) {
    struct timespec ts = clock_deadline_rt(every);
    pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    if (trainer_stopping(t)) break;
    pthread_mutex_unlock(&t->mu);
    unsigned long long done = atomic_load(&t->exec.last_done);
    int stop = 0;
    char err[512] = "";
    int rc = orc_heartbeat(t->join.hb_orc, CHANTER__ORACLE__V1__ROLE__TRAINER, t->rank, done ? done - 1 : 0, &stop,
                           err, sizeof err);
    if (rc && !failing) log_warn("heartbeat failed rank=%u err=\"%s\"", t->rank, err);
    if (!rc && failing) log_info("heartbeat answered again rank=%u", t->rank);
    if (rc && !failing) fail_since = clock_mono_s();
    failing = rc != 0 ? failing + 1 : 0;
    /* the oracle is gone (killed: its stream may not say so while this
     * trainer waits in a gate or a collective): leave the generation and
     * join again once it is back */
    if (failing >= 3 && clock_mono_s() - fail_since >= 2.5 * (double)every / 1e3) {
      pthread_mutex_lock(&t->mu);
      int streaming = t->stream != NULL && !atomic_load(&t->abort_gen);
      pthread_mutex_unlock(&t->mu);
      if (streaming) {
        char why[700];
        snprintf(why, sizeof why, "the oracle has not answered a heartbeat for %.1f s (%s)", clock_mono_s() - fail_since,
                 err);
        trainer_abort_generation(t, why);
      }
    }
    if (!rc && stop) trainer_stop(t, "the oracle answered a heartbeat with stop");
    pthread_mutex_lock(&t->mu);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

void trainer_join_heartbeat_start(trainer_t *t) {
  if (pthread_create(&t->join.hb, NULL, heartbeat_main, t) == 0)
    t->join.hb_running = 1;
  else
    log_warn("cannot start the heartbeat thread rank=%u; training without heartbeats", t->rank);
}

void trainer_join_heartbeat_stop(trainer_t *t) {
  if (t->join.hb_running) pthread_join(t->join.hb, NULL);
  t->join.hb_running = 0;
}

/* ------------------------------------------------------------------ Join */

static int join_once(trainer_t *t, char *err, size_t err_len) {
  Chanter__Oracle__V1__JoinRequest req = CHANTER__ORACLE__V1__JOIN_REQUEST__INIT;
  req.role = CHANTER__ORACLE__V1__ROLE__TRAINER;
  req.rank = t->rank;
  req.address = t->address;
  req.schema_hash = dpc_schema_hash(&t->schema);
  req.layout_hash = table_layout_hash(&t->layout);
  req.pid = (uint32_t)getpid();
  Chanter__Oracle__V1__JoinResponse *resp = NULL;
  sdn_status("joining the oracle at %s", orc_address(t->orc));
  int rc = orc_join(t->orc, &req, &resp, err, err_len);
  if (rc) return rc;
  if (resp->trainers != t->trainers && resp->scaled) { /* chanter scale: adopt the count (trainer_loop.c), or leave */
    t->scale_to = resp->trainers;
    t->scaled_out = t->rank >= resp->trainers;
  }
  if (resp->embedding_servers && t->embc && resp->n_embedding_addresses == resp->embedding_servers) {
    int differs = resp->embedding_servers != embc_servers(t->embc); /* chanter scale --embedding-servers */
    for (size_t i = 0; i < resp->n_embedding_addresses && !differs; i++)
      differs = strcmp(resp->embedding_addresses[i], embc_address(t->embc, (uint32_t)i)) != 0;
    size_t len = 1, o = 0;
    for (size_t i = 0; i < resp->n_embedding_addresses; i++) len += strlen(resp->embedding_addresses[i]) + 1;
    free(t->emb_cluster);
    t->emb_cluster = differs ? malloc(len) : NULL;
    t->emb_to = t->emb_cluster ? resp->embedding_servers : 0;
    for (size_t i = 0; t->emb_cluster && i < resp->n_embedding_addresses; i++)
      o += (size_t)snprintf(t->emb_cluster + o, len - o, "%s%s", i ? "," : "", resp->embedding_addresses[i]);
  }
  if (resp->trainers != t->trainers && !resp->scaled) {
    rc = err_set(err, err_len, ERR_CONFIG,
                 "the oracle at %s runs a job of %u trainers but this trainer's configuration says trainers = %u "
                 "(from %s): do they read the same job file?",
                 orc_address(t->orc), resp->trainers, t->trainers, cfg_origin(t->cfg, "trainers"));
  } else if (resp->start_iteration != 0) { /* (a resumed job's trainers are told by ResumeWork instead) */
    rc = err_set(err, err_len, ERR_CONFIG,
                 "the oracle asks to resume at iteration %" PRIu64 ", but this trainer starts from a fresh model "
                 "(resuming a job is not implemented yet)",
                 resp->start_iteration);
  } else if (!t->scaled_out) {
    snprintf(t->join.prefix, sizeof t->join.prefix, "%s/%u", resp->job_id ? resp->job_id : "", resp->generation);
    snprintf(t->job_state, sizeof t->job_state, "%s", resp->job_state ? resp->job_state : "");
    log_info("joined oracle=%s job_id=%s generation=%u trainers=%u rank=%u address=%s job_state=%s", orc_address(t->orc),
             resp->job_id ? resp->job_id : "", resp->generation, resp->trainers, t->rank, t->address, t->job_state);
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

int trainer_join_oracle(trainer_t *t, int rejoin, char *err, size_t err_len) {
  int64_t limit = cfg_int(t->cfg, "trainer.rejoin_timeout_ms"), backoff = 100;
  double t0 = clock_mono_s();
  int said = 0;
  for (;;) {
    int rc = join_once(t, err, err_len);
    if (!rc || trainer_stopping(t)) return rc;
    /* the oracle is down or restarting, or still recovering, or has not
     * yet noticed that this rank's last process is gone: again (a first
     * join too: this process may be the replacement of a lost one) */
    if (rc != ERR_UNAVAILABLE && rc != ERR_DEADLINE && rc != ERR_EXISTS && !(rejoin && rc == ERR_RPC)) return rc;
    if ((clock_mono_s() - t0) * 1e3 > (double)limit) {
      char last[1024];
      snprintf(last, sizeof last, "%s", err);
      return err_set(err, err_len, rc,
                     "the oracle at %s did not take this trainer back within trainer.rejoin_timeout_ms = %lld ms "
                     "(last answer: %s)",
                     orc_address(t->orc), (long long)limit, last);
    }
    if (!said++)
      log_info("waiting to %s the job rank=%u (retrying for up to %lld s, trainer.rejoin_timeout_ms): %s",
               rejoin ? "rejoin" : "join", t->rank, (long long)(limit / 1000), err);
    sdn_status("rejoining the job through the oracle at %s (%.0f s)", orc_address(t->orc), clock_mono_s() - t0);
    struct timespec ts = clock_deadline_rt(backoff);
    pthread_mutex_lock(&t->mu);
    if (!trainer_stopping(t)) pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    pthread_mutex_unlock(&t->mu);
    if (backoff < 1000) backoff *= 2;
  }
}

int trainer_join_over(const trainer_t *t) {
  return !strcmp(t->job_state, "done") || !strcmp(t->job_state, "stopped") || !strcmp(t->job_state, "failed");
}

/* ------------------------------------------------------------------ the group */

/* The rendezvous store over the oracle's KV. */
static int kv_set(void *ud, const char *key, const void *val, size_t len) {
  trainer_t *t = ud;
  char err[512];
  int rc = orc_kv_set(t->orc, key, val, len, err, sizeof err);
  if (rc) log_error("rendezvous: KvSet failed rank=%u key=%s err=\"%s\"", t->rank, key, err);
  return rc;
}

static int kv_get(void *ud, const char *key, void **val, size_t *len, int64_t timeout_ms) {
  trainer_t *t = ud;
  char err[512];
  int rc = orc_kv_get(t->orc, key, val, len, timeout_ms, err, sizeof err);
  if (rc == ERR_NOTFOUND) return ERR_DEADLINE;
  if (rc) log_error("rendezvous: KvGet failed rank=%u key=%s err=\"%s\"", t->rank, key, err);
  return rc;
}

/* ------------------------------------------------------------------ the dense group on the GPUs */

/* What a trainer tells the others about its device: fixed size, so that
 * every rank gives the allgather the same number of bytes. */
typedef struct dev_ident_s {
  char gpu[48];       /* cuda_check_device_id ("GPU-<uuid>"), "" without one */
  char pci[24];       /* its PCI bus id, for the log */
  char host[64];      /* gethostname, for the log */
  uint8_t nccl_built; /* this binary has the NCCL backend */
  uint8_t pad[7];
} dev_ident_t;

/* on = 1: the step leaves its dense gradients on the device for the
 * collective, and this returns their device array; on = 0: the step
 * fetches them to the host again, NULL. */
static float *collective_on_device(trainer_t *t, int on) {
  trainer_step_set_collective_on_device(t->ts, on);
  return on ? trainer_step_grads_dev(t->ts) : NULL;
}

/* "<prefix>/nccl/ok/<rank>" = "1", or "0 <why>": whether this rank formed
 * its NCCL group; then every rank's.  *all_ok, or the first rank that
 * failed and its reason in why.  The wait is long (twice the group's
 * timeout, plus slack): a rank whose formation failed at once must still
 * hear from one whose formation times out.  0 or the store's error. */
static int agree(const coll_store_t *store, const char *prefix, int rank, int size, int64_t timeout_ms, int ok,
                 const char *mine, int *all_ok, int *bad, char *why, size_t why_len) {
  char key[700], val[600];
  int n = snprintf(val, sizeof val, "%s", ok ? "1" : "0 ");
  if (!ok) snprintf(val + n, sizeof val - (size_t)n, "%s", mine);
  snprintf(key, sizeof key, "%s/nccl/ok/%d", prefix, rank);
  int rc = store->set(store->ud, key, val, strlen(val));
  *all_ok = 1;
  *bad = -1;
  for (int r = 0; r < size && !rc; r++) {
    void *v = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "%s/nccl/ok/%d", prefix, r);
    if ((rc = store->get(store->ud, key, &v, &len, 2 * timeout_ms + 10000)) != 0) break;
    if (*all_ok && !(len >= 1 && ((char *)v)[0] == '1')) {
      *all_ok = 0;
      *bad = r;
      snprintf(why, why_len, "%.*s", len > 2 ? (int)(len - 2) : 0, len > 2 ? (char *)v + 2 : "");
    }
    free(v);
  }
  return rc;
}

/* Device = cuda and 2+ trainers: j->ncoll, the dense all-reduce's NCCL
 * group, when every trainer has a GPU of its own; else NULL and one log
 * line saying why the dense all-reduce stays on Gloo.  Called on the Gloo
 * group j->coll before anything else uses it (the scheduler owns it
 * after).  0, or a negative code with err when the group itself failed
 * (the generation fails; a failed NCCL formation is not a failure). */
static int dense_group(trainer_t *t, const coll_store_t *store, const coll_opts_t *o, char *err, size_t err_len) {
  trainer_join_t *j = &t->join;
  int n = (int)t->trainers, rc = 0, a = -1, b = -1;
  if (!trainer_step_is_cuda(t->ts) || n < 2) return 0;
  dev_ident_t me;
  dev_ident_t *all = calloc((size_t)n, sizeof *all);
  const char **ids = calloc((size_t)n, sizeof *ids);
  char why[600] = "", idwhy[512] = "";
  if (!all || !ids) {
    rc = err_set(err, err_len, -ENOMEM, "out of memory for the trainers' GPU identities");
    goto out;
  }
  memset(&me, 0, sizeof me);
  if (cuda_check_device_id(me.gpu, sizeof me.gpu, me.pci, sizeof me.pci, idwhy, sizeof idwhy) != 0)
    log_warn("no GPU identity rank=%u err=\"%s\"", t->rank, idwhy);
  if (gethostname(me.host, sizeof me.host - 1) != 0) snprintf(me.host, sizeof me.host, "?");
  me.nccl_built = (uint8_t)coll_backend_built("nccl");
  if ((rc = coll_allgather(j->coll, &me, sizeof me, all)) != 0) {
    rc = err_set(err, err_len, rc, "exchanging the trainers' GPU identities failed: %s", err_str(rc));
    goto out;
  }
  for (int r = 0; r < n; r++) {
    all[r].gpu[sizeof all[r].gpu - 1] = all[r].host[sizeof all[r].host - 1] = all[r].pci[sizeof all[r].pci - 1] = 0;
    ids[r] = all[r].gpu;
  }
  if (!coll_nccl_eligible(ids, n, &a, &b, why, sizeof why)) {
    if (a >= 0 && a != b)
      log_info("trainers %d and %d share GPU %s (hosts %s and %s): dense all-reduce over gloo on host copies", a, b,
               all[b].gpu, all[a].host, all[b].host);
    else
      log_warn("%s (host %s): dense all-reduce over gloo on host copies", why, a >= 0 ? all[a].host : "?");
    goto out;
  }
  for (int r = 0; r < n; r++)
    if (!all[r].nccl_built) {
      log_warn("trainer %d (host %s, GPU %s) runs a chanter built without NCCL: dense all-reduce over gloo on host "
               "copies",
               r, all[r].host, all[r].gpu);
      goto out;
    }
  coll_opts_t no = *o;
  no.backend = "nccl";
  coll_t *nc = NULL;
  int frc = coll_create(&no, store, &nc, why, sizeof why);
  int all_ok = 0, bad = -1;
  char bad_why[600] = "";
  if ((rc = agree(store, o->prefix, (int)t->rank, n, o->timeout_ms, frc == 0, why, &all_ok, &bad, bad_why,
                  sizeof bad_why)) != 0) {
    coll_destroy(nc); /* an abort: never waits for the peers */
    rc = err_set(err, err_len, rc, "the trainers could not agree on the dense all-reduce's NCCL group: %s",
                 err_str(rc));
    goto out;
  }
  if (!all_ok) {
    coll_destroy(nc);
    log_warn("the NCCL group of %d trainers could not be formed on trainer %d (host %s, GPU %s: %s): dense "
             "all-reduce over gloo on host copies",
             n, bad, all[bad].host, all[bad].gpu, bad_why);
    goto out;
  }
  j->ncoll = nc;
out:
  free(all);
  free(ids);
  return rc;
}

/* the scheduler's waits give up when the trainer stops or leaves the generation */
static int sched_cancelled(void *ud) { return trainer_halting(ud); }

int trainer_join_group_form(trainer_t *t, char *err, size_t err_len) {
  trainer_join_t *j = &t->join;
  coll_store_t store = {.set = kv_set, .get = kv_get, .ud = t};
  coll_opts_t o = {.rank = (int)t->rank,
                   .size = (int)t->trainers,
                   .backend = "gloo",
                   .iface_addr = t->address,
                   .prefix = j->prefix,
                   .timeout_ms = cfg_int(t->cfg, "trainer.coll_timeout_ms")};
  sdn_status("forming the trainer group (%u trainers, gloo) through the oracle at %s", t->trainers,
             orc_address(t->orc));
  char why[512] = "";
  double t0 = clock_mono_s();
  int rc = coll_create(&o, &store, &j->coll, why, sizeof why);
  if (rc)
    return err_set(err, err_len, rc, "cannot form the group of %u trainers (rank %u, address %s, prefix %s): %s",
                   t->trainers, t->rank, t->address, j->prefix, why[0] ? why : err_str(rc));
  /* every rank initialized identically; make sure anyway */
  model_t *m = trainer_step_model(t->ts); /* the CPU model (its backward's grad-ready hook), or NULL on a GPU */
  if ((rc = coll_broadcast(j->coll, trainer_step_params(t->ts), trainer_step_n_params(t->ts) * sizeof(float), 0)) != 0)
    return err_set(err, err_len, rc, "broadcast of rank 0's dense parameters failed: %s", err_str(rc));
  if ((rc = trainer_step_params_changed(t->ts)) != 0)
    return err_set(err, err_len, rc, "copying the dense parameters to the GPU failed: %s", err_str(rc));
  /* device = cuda: NCCL for the dense all-reduce when every trainer has a GPU of its own */
  if ((rc = dense_group(t, &store, &o, err, err_len)) != 0) return rc;
  float *dense_grads = j->ncoll ? collective_on_device(t, 1) : trainer_step_grads(t->ts);
  if (!dense_grads && trainer_step_n_params(t->ts))
    return err_set(err, err_len, -EINVAL, "the step gave no device array of its dense gradients for the NCCL group");
  /* the dense all-reduce in buckets, overlapped with the backward (one
   * trainer: nothing to reduce, no hook) */
  size_t bucket = (size_t)cfg_int(t->cfg, "trainer.bucket_kb") * 1024 / sizeof(float);
  /* comm_schedule = priority: one queue and one thread own the group;
   * threads: the dense all-reduce's thread, the partitioned tables' own
   * group, the background's delayed rows on the group between them */
  if (t->trainers > 1 && !strcmp(cfg_str(t->cfg, "trainer.comm_schedule"), "priority") &&
      (rc = trainer_sched_create(j->coll, sched_cancelled, t, &j->sched)) != 0)
    return err_set(err, err_len, rc, "cannot start the collectives' scheduler: %s", err_str(rc));
  t->partition.sched = j->sched;
  /* the NCCL group is the all-reduce thread's alone (the scheduler owns the Gloo group) */
  if ((rc = trainer_ar_create(j->ncoll ? j->ncoll : j->coll, j->ncoll ? NULL : j->sched, dense_grads,
                              trainer_step_n_params(t->ts), bucket, &j->dense_ar)) != 0)
    return err_set(err, err_len, rc, "cannot start the all-reduce thread: %s", err_str(rc));
  if (t->partition.any && !j->sched) { /* the partitioned tables' AlltoAlls: their own connections, the training thread's */
    char pprefix[600];
    snprintf(pprefix, sizeof pprefix, "%s/part", j->prefix);
    o.prefix = pprefix;
    if ((rc = coll_create(&o, &store, &j->pcoll, why, sizeof why)) != 0)
      return err_set(err, err_len, rc, "cannot form the partitioned tables' group of %u trainers (rank %u, prefix %s): %s",
                     t->trainers, t->rank, pprefix, why[0] ? why : err_str(rc));
  }
  int overlap = t->trainers > 1 && bucket && m; /* the GPU model's gradients come back after its backward */
  if (overlap) model_set_grad_ready(m, trainer_ar_ready, j->dense_ar);
  log_info("group formed rank=%u size=%u backend=%s dense_backend=%s prefix=%s seconds=%.3f dense_floats=%zu buckets=%zu "
           "overlap=%s comm_schedule=%s",
           t->rank, t->trainers, coll_backend(j->coll), coll_backend(j->ncoll ? j->ncoll : j->coll), j->prefix,
           clock_mono_s() - t0, trainer_step_n_params(t->ts),
           trainer_ar_buckets(j->dense_ar), overlap ? "yes" : "no", j->sched ? "priority" : "threads");
  return 0;
}

void trainer_join_group_close(trainer_t *t) {
  if (t->ts && trainer_step_model(t->ts)) model_set_grad_ready(trainer_step_model(t->ts), NULL, NULL);
  if (t->join.sched) {
    trainer_sched_stats_t st;
    trainer_sched_stats(t->join.sched, &st);
    log_info("collectives scheduled rank=%u operations=%" PRIu64 " rounds=%" PRIu64 " rounds_without_common=%" PRIu64
             " agree_seconds=%.3f operation_seconds=%.3f",
             t->rank, st.ops, st.rounds, st.empty_rounds, st.t_agree, st.t_ops);
  }
  trainer_sched_destroy(t->join.sched); /* first: it may hold the dense buckets' operations */
  t->join.sched = NULL;
  t->partition.sched = NULL;
  trainer_ar_destroy(t->join.dense_ar);
  t->join.dense_ar = NULL;
  coll_destroy(t->join.coll);
  t->join.coll = NULL;
  coll_destroy(t->join.pcoll);
  t->join.pcoll = NULL;
  if (t->join.ncoll) {
    if (t->ts) collective_on_device(t, 0);
    coll_destroy(t->join.ncoll); /* ncclCommAbort: returns without waiting for a peer (coll_nccl.c) */
    t->join.ncoll = NULL;
  }
}
