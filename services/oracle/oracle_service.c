/* oracle_service: see oracle_service.h. */
#include "oracle_service.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "data.h"
#include "dpc.h"
#include "err.h"
#include "log.h"
#include "oracle.pb-c.h"
#include "oracle_page.h"
#include "oracle_recover.h"
#include "table.h"

typedef Chanter__Oracle__V1__Role role_t;

typedef struct member_s {
  role_t role;
  uint32_t rank;
  uint32_t pid;
  char *address;
  int64_t last_seen_ms; /* monotonic */
  uint64_t iteration;   /* from heartbeats */
  int warned_silent;
} member_t;

typedef struct kv_s {
  char *key;
  uint8_t *val;
  size_t len;
} kv_t;

typedef struct waiter_s { /* a parked KvGet */
  struct waiter_s *next, *prev;
  oracle_service_t *svc;
  rpc_call_t *call; /* NULL once answered (the timer is closing) */
  char *key;
  uint32_t timeout_ms;
  uv_timer_t timer;
} waiter_t;

struct oracle_service_s {
  uv_loop_t *loop;
  cfg_t *cfg; /* trainers changes with chanter scale (on_recover) */
  metrics_registry_t *reg;
  oracle_job_t *job;
  uint32_t generation; /* the trainer group's: rises at every recovery (unique across this oracle's restarts) */
  oracle_recoveries_t recs;
  uint64_t schema_hash, layout_hash;
  uint32_t trainers;
  int scaled; /* chanter scale changed trainers (JoinResponse.scaled) */
  char **emb_addrs; /* chanter scale changed the embedding servers: theirs (JoinResponse.embedding_addresses) */
  size_t n_emb;
  int64_t hb_timeout_ms;
  member_t *members;
  size_t n_members, cap_members;
  kv_t *kv;
  size_t n_kv, cap_kv;
  waiter_t *waiters;
  size_t open_waiters; /* timers not yet closed */
  uv_timer_t tick;
  int tick_open;
  oracle_page_t *page; /* the status page on the metrics port, refreshed by on_tick */
  char address[280];   /* host:port served on (oracle_service_set_address) */
  int64_t status_at;   /* the last Status call (mono ms): someone watches the job */
  metrics_gauge_t *g_alive, *g_members;
  metrics_counter_t *c_joins, *c_refused, *c_kv_set, *c_kv_get;
};

static int64_t now_ms(void) { return clock_mono_ms(); }

static const char *role_name(role_t r) {
  switch (r) {
  case CHANTER__ORACLE__V1__ROLE__TRAINER: return "trainer";
  case CHANTER__ORACLE__V1__ROLE__DATAPROC: return "dataproc";
  case CHANTER__ORACLE__V1__ROLE__EMBEDDING: return "embedding";
  case CHANTER__ORACLE__V1__ROLE__CLIENT: return "client";
  default: return "unknown";
  }
}

static member_t *find_member(oracle_service_t *svc, role_t role, uint32_t rank) {
  for (size_t i = 0; i < svc->n_members; i++)
    if (svc->members[i].role == role && svc->members[i].rank == rank) return &svc->members[i];
  return NULL;
}

static int member_alive(const oracle_service_t *svc, const member_t *m, int64_t now) {
  return now - m->last_seen_ms <= svc->hb_timeout_ms;
}

/* Trainer rank's process is lost (its stream broke, or a recovery named it): Status shows it
 * dead until it, or its replacement, is heard from (who may join the rank: its stream, on_join). */
static void member_gone(oracle_service_t *svc, uint32_t rank) {
  member_t *mb = find_member(svc, CHANTER__ORACLE__V1__ROLE__TRAINER, rank);
  if (mb) mb->last_seen_ms = now_ms() - svc->hb_timeout_ms - 1;
}

/* ---- Join / Heartbeat */

static void refuse(oracle_service_t *svc, rpc_call_t *call, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(oracle_service_t *svc, rpc_call_t *call, int err, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  metrics_counter_inc(svc->c_refused);
  log_warn("refused method=%s peer=%s why=\"%s\"", rpc_call_method(call), rpc_call_peer(call), msg);
  rpc_call_fail(call, err, "%s", msg);
}

static void on_join(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__JoinRequest *r = (const void *)m;
  int64_t now = now_ms();
  if (r->role < CHANTER__ORACLE__V1__ROLE__TRAINER || r->role > CHANTER__ORACLE__V1__ROLE__CLIENT) {
    refuse(svc, call, -EINVAL, "Join: role %d is not one of TRAINER, DATAPROC, EMBEDDING, CLIENT", (int)r->role);
    return;
  }
  int trainer = r->role == CHANTER__ORACLE__V1__ROLE__TRAINER;
  if (trainer && oracle_job_lost(svc->job)) { /* its group would be of a generation that ends: the next one's */
    refuse(svc, call, ERR_UNAVAILABLE, "Join: generation %u ends (a daemon was lost); retry", oracle_job_generation(svc->job));
    return;
  }
  uint32_t scale_to = oracle_job_scale_to(svc->job);
  if (trainer && scale_to && r->rank >= svc->trainers && r->rank < scale_to) {
    refuse(svc, call, ERR_UNAVAILABLE,
           "Join: the job is being scaled from %u to %u trainers; rank %u joins once the group re-forms: retry",
           svc->trainers, scale_to, r->rank);
    return;
  }
  if (trainer && svc->scaled && !scale_to && r->rank >= svc->trainers) { /* chanter scale left it out: it leaves */
    log_info("Join: trainer rank %u is beyond the job's %u trainers since chanter scale: told to leave", r->rank,
             svc->trainers);
    Chanter__Oracle__V1__JoinResponse out = CHANTER__ORACLE__V1__JOIN_RESPONSE__INIT;
    out.job_id = (char *)oracle_job_id(svc->job);
    out.trainers = svc->trainers;
    out.scaled = 1;
    out.job_state = (char *)oracle_state_name(oracle_job_state(svc->job));
    rpc_call_reply(call, &out.base);
    return;
  }
  if (trainer && r->rank >= svc->trainers) {
    refuse(svc, call, -EINVAL, "Join: trainer rank %u is outside 0..%u: the job has trainers = %u (from %s)", r->rank,
           svc->trainers - 1, svc->trainers, cfg_origin(svc->cfg, "trainers"));
    return;
  }
  if (trainer && (!r->address || !*r->address)) {
    refuse(svc, call, -EINVAL, "Join: trainer rank %u sent no address (the host its collectives bind to)", r->rank);
    return;
  }
  if ((trainer || r->schema_hash) && r->schema_hash != svc->schema_hash) {
    refuse(svc, call, ORACLE_ERR_PRECONDITION,
           "Join: %s %u has data schema hash %016llx but the oracle's is %016llx: both must read the same job "
           "configuration (n_dense, table_rows, table_hotness, hash_seed)",
           role_name(r->role), r->rank, (unsigned long long)r->schema_hash, (unsigned long long)svc->schema_hash);
    return;
  }
  if ((trainer || r->layout_hash) && r->layout_hash != svc->layout_hash) {
    refuse(svc, call, ORACLE_ERR_PRECONDITION,
           "Join: %s %u has table layout hash %016llx but the oracle's is %016llx: both must read the same job "
           "configuration (table_rows, embedding_dim / table_dims, embedding_optimizer, seed)",
           role_name(r->role), r->rank, (unsigned long long)r->layout_hash, (unsigned long long)svc->layout_hash);
    return;
  }
  member_t *old = find_member(svc, r->role, r->rank);
  int js = oracle_job_state(svc->job);
  if (trainer && js == ORACLE_RECOVERING && oracle_job_over(svc->job)) { /* between two generations */
    refuse(svc, call, ERR_UNAVAILABLE, "Join: the job is starting its recovery; retry");
    return;
  }
  if (trainer && js == ORACLE_TRAINING && !(old && old->pid == r->pid && !strcmp(old->address, r->address))) {
    refuse(svc, call, ERR_UNAVAILABLE,
           "Join: the job is training and trainer rank %u is in it (pid %u at %s, last seen %.1f s ago); a new "
           "trainer for this rank joins once the oracle has noticed that one is lost (its stream broke, or it was "
           "silent for oracle.heartbeat_timeout_ms = %lld ms) and recovers: retry",
           r->rank, old ? old->pid : 0, old ? old->address : "?", old ? (double)(now - old->last_seen_ms) / 1e3 : 0.0,
           (long long)svc->hb_timeout_ms);
    return;
  }
  /* another process for a rank: refused while the rank's stream is open
   * (one trainer per rank); before the start, or during a recovery, the
   * newcomer replaces a process that has no stream (lost, or itself about
   * to join again: it then finds the rank taken and waits) */
  if (old && trainer && (old->pid != r->pid || strcmp(old->address, r->address) != 0) &&
      oracle_job_rank_attached(svc->job, r->rank)) {
    refuse(svc, call, ERR_EXISTS,
           "Join: trainer rank %u is held by pid %u at %s (its Work stream is open, last seen %.1f s ago); one "
           "trainer per rank: if that one is gone, the oracle notices (its stream breaks, or it is silent for "
           "oracle.heartbeat_timeout_ms = %lld ms) and this one may join",
           r->rank, old->pid, old->address, (double)(now - old->last_seen_ms) / 1e3, (long long)svc->hb_timeout_ms);
    return;
  }
  if (old && trainer && old->pid != r->pid)
    log_info("trainer rank %u: pid %u at %s replaces pid %u at %s (last seen %.1f s ago)", r->rank, r->pid,
             r->address, old->pid, old->address, (double)(now - old->last_seen_ms) / 1e3);
  if (!old) {
    if (svc->n_members == svc->cap_members) {
      size_t cap = svc->cap_members ? 2 * svc->cap_members : 16;
      member_t *nm = realloc(svc->members, cap * sizeof *nm);
      if (!nm) {
        rpc_call_fail(call, -ENOMEM, "Join: out of memory");
        return;
      }
      svc->members = nm;
      svc->cap_members = cap;
    }
    old = &svc->members[svc->n_members++];
    memset(old, 0, sizeof *old);
    old->role = r->role;
    old->rank = r->rank;
  }
  char *addr = strdup(r->address ? r->address : "");
  if (!addr) {
    rpc_call_fail(call, -ENOMEM, "Join: out of memory");
    return;
  }
  free(old->address);
  old->address = addr;
  old->pid = r->pid;
  old->last_seen_ms = now;
  metrics_counter_inc(svc->c_joins);
  log_info("joined role=%s rank=%u address=%s pid=%u peer=%s", role_name(r->role), r->rank, old->address, r->pid,
           rpc_call_peer(call));
  Chanter__Oracle__V1__JoinResponse resp = CHANTER__ORACLE__V1__JOIN_RESPONSE__INIT;
  resp.job_id = (char *)oracle_job_id(svc->job);
  resp.generation = svc->generation;
  resp.trainers = svc->trainers;
  resp.start_iteration = 0;
  resp.job_state = (char *)oracle_state_name(js);
  resp.scaled = svc->scaled;
  resp.embedding_servers = (uint32_t)svc->n_emb;
  resp.n_embedding_addresses = svc->n_emb;
  resp.embedding_addresses = svc->emb_addrs;
  rpc_call_reply(call, &resp.base);
}

static void on_heartbeat(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__HeartbeatRequest *r = (const void *)m;
  member_t *mb = find_member(svc, r->role, r->rank);
  if (!mb) {
    rpc_call_fail(call, ERR_NOTFOUND, "Heartbeat: %s %u has not joined this oracle (job %s): Join first",
                  role_name(r->role), r->rank, oracle_job_id(svc->job));
    return;
  }
  mb->last_seen_ms = now_ms();
  if (r->iteration > mb->iteration) mb->iteration = r->iteration;
  Chanter__Oracle__V1__HeartbeatResponse resp = CHANTER__ORACLE__V1__HEARTBEAT_RESPONSE__INIT;
  int st = oracle_job_state(svc->job); /* (a job object ended to recover is not the job's end) */
  resp.stop = st == ORACLE_DONE || st == ORACLE_FAILED || st == ORACLE_STOPPED;
  rpc_call_reply(call, &resp.base);
}

/* ---- the rendezvous store */

static kv_t *kv_find(oracle_service_t *svc, const char *key) {
  for (size_t i = 0; i < svc->n_kv; i++)
    if (!strcmp(svc->kv[i].key, key)) return &svc->kv[i];
  return NULL;
}

static void waiter_closed(uv_handle_t *h) {
  waiter_t *w = h->data;
  w->svc->open_waiters--;
  free(w->key);
  free(w);
}

/* Unlinks w, answers it (value, or NOT_FOUND when kv is NULL, or err) and
 * closes its timer. */
static void waiter_answer(waiter_t *w, const kv_t *kv, int err) {
  oracle_service_t *svc = w->svc;
  if (w->prev) w->prev->next = w->next;
  else svc->waiters = w->next;
  if (w->next) w->next->prev = w->prev;
  if (kv) {
    Chanter__Oracle__V1__KvGetResponse resp = CHANTER__ORACLE__V1__KV_GET_RESPONSE__INIT;
    resp.value.data = kv->val;
    resp.value.len = kv->len;
    rpc_call_reply(w->call, &resp.base);
  } else if (err) {
    rpc_call_fail(w->call, err, "KvGet '%s': the oracle is shutting down", w->key);
  } else {
    rpc_call_fail(w->call, ERR_NOTFOUND, "KvGet: key '%s' was not set within %u ms", w->key, w->timeout_ms);
  }
  w->call = NULL;
  uv_timer_stop(&w->timer);
  uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

static void waiter_timeout(uv_timer_t *t) {
  waiter_t *w = t->data;
  if (w->call) waiter_answer(w, NULL, 0);
}

static int check_key(rpc_call_t *call, const char *method, const char *key) {
  size_t n = key ? strlen(key) : 0;
  if (n == 0 || n > ORACLE_KV_MAX_KEY) {
    rpc_call_fail(call, -EINVAL, "%s: the key must have 1..%d bytes (got %zu)", method, ORACLE_KV_MAX_KEY, n);
    return -EINVAL;
  }
  return 0;
}

static void on_kv_set(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__KvSetRequest *r = (const void *)m;
  if (check_key(call, "KvSet", r->key)) return;
  if (r->value.len > ORACLE_KV_MAX_VALUE) {
    rpc_call_fail(call, -EINVAL, "KvSet '%s': the value has %zu bytes; at most %u", r->key, r->value.len,
                  ORACLE_KV_MAX_VALUE);
    return;
  }
  kv_t *kv = kv_find(svc, r->key);
  if (!kv) {
    if (svc->n_kv >= ORACLE_KV_MAX_KEYS) {
      rpc_call_fail(call, -ENOSPC, "KvSet '%s': the store holds %d keys already", r->key, ORACLE_KV_MAX_KEYS);
      return;
    }
    if (svc->n_kv == svc->cap_kv) {
      size_t cap = svc->cap_kv ? 2 * svc->cap_kv : 64;
      kv_t *nk = realloc(svc->kv, cap * sizeof *nk);
      if (!nk) {
        rpc_call_fail(call, -ENOMEM, "KvSet: out of memory");
        return;
      }
      svc->kv = nk;
      svc->cap_kv = cap;
    }
    kv = &svc->kv[svc->n_kv];
    memset(kv, 0, sizeof *kv);
    if (!(kv->key = strdup(r->key))) {
      rpc_call_fail(call, -ENOMEM, "KvSet: out of memory");
      return;
    }
    svc->n_kv++;
  }
  uint8_t *v = malloc(r->value.len ? r->value.len : 1);
  if (!v) {
    rpc_call_fail(call, -ENOMEM, "KvSet: out of memory");
    return;
  }
  if (r->value.len) memcpy(v, r->value.data, r->value.len);
  free(kv->val);
  kv->val = v;
  kv->len = r->value.len;
  metrics_counter_inc(svc->c_kv_set);
  log_debug("kv set key=%s bytes=%zu", kv->key, kv->len);
  for (waiter_t *w = svc->waiters, *next; w; w = next) {
    next = w->next;
    if (!strcmp(w->key, kv->key)) waiter_answer(w, kv, 0);
  }
  Chanter__Oracle__V1__KvSetResponse resp = CHANTER__ORACLE__V1__KV_SET_RESPONSE__INIT;
  rpc_call_reply(call, &resp.base);
}

static void on_kv_get(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__KvGetRequest *r = (const void *)m;
  if (check_key(call, "KvGet", r->key)) return;
  metrics_counter_inc(svc->c_kv_get);
  kv_t *kv = kv_find(svc, r->key);
  if (kv) {
    Chanter__Oracle__V1__KvGetResponse resp = CHANTER__ORACLE__V1__KV_GET_RESPONSE__INIT;
    resp.value.data = kv->val;
    resp.value.len = kv->len;
    rpc_call_reply(call, &resp.base);
    return;
  }
  /* wait, but answer a little before the client's own deadline so that it
   * reads NOT_FOUND rather than DEADLINE_EXCEEDED */
  int64_t wait = r->timeout_ms, left = rpc_call_deadline_ms(call);
  if (left != INT64_MAX && wait > left - 100) wait = left - 100;
  if (wait <= 0) {
    rpc_call_fail(call, ERR_NOTFOUND, "KvGet: key '%s' is not set", r->key);
    return;
  }
  waiter_t *w = calloc(1, sizeof *w);
  if (!w || !(w->key = strdup(r->key))) {
    free(w);
    rpc_call_fail(call, -ENOMEM, "KvGet: out of memory");
    return;
  }
  w->svc = svc;
  w->call = call;
  w->timeout_ms = (uint32_t)wait;
  uv_timer_init(svc->loop, &w->timer);
  w->timer.data = w;
  uv_unref((uv_handle_t *)&w->timer);
  uv_timer_start(&w->timer, waiter_timeout, (uint64_t)wait, 0);
  svc->open_waiters++;
  w->next = svc->waiters;
  if (w->next) w->next->prev = w;
  svc->waiters = w;
}

/* ---- Status / Stop */

static void on_status(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  int64_t now = svc->status_at = now_ms();
  Chanter__Oracle__V1__StatusResponse resp = CHANTER__ORACLE__V1__STATUS_RESPONSE__INIT;
  Chanter__Oracle__V1__Member *mem = calloc(svc->n_members ? svc->n_members : 1, sizeof *mem);
  Chanter__Oracle__V1__Member **ptrs = calloc(svc->n_members ? svc->n_members : 1, sizeof *ptrs);
  char *summary = oracle_job_summary(svc->job);
  if (!mem || !ptrs || !summary) {
    free(mem);
    free(ptrs);
    free(summary);
    rpc_call_fail(call, -ENOMEM, "Status: out of memory");
    return;
  }
  for (size_t i = 0; i < svc->n_members; i++) {
    const member_t *mb = &svc->members[i];
    chanter__oracle__v1__member__init(&mem[i]);
    mem[i].role = mb->role;
    mem[i].rank = mb->rank;
    mem[i].address = mb->address;
    mem[i].alive = member_alive(svc, mb, now);
    mem[i].seconds_since_heartbeat = (double)(now - mb->last_seen_ms) / 1e3;
    mem[i].iteration = mb->iteration;
    if (mb->role == CHANTER__ORACLE__V1__ROLE__TRAINER) {
      uint64_t it = oracle_job_rank_reported(svc->job, mb->rank);
      if (it > mem[i].iteration) mem[i].iteration = it;
    }
    ptrs[i] = &mem[i];
  }
  resp.job_id = (char *)oracle_job_id(svc->job);
  resp.state = (char *)oracle_state_name(oracle_job_state(svc->job));
  resp.message = (char *)oracle_job_message(svc->job);
  resp.iteration = oracle_job_done(svc->job);
  resp.iterations = oracle_job_iterations(svc->job);
  resp.n_members = svc->n_members;
  resp.members = ptrs;
  resp.summary_json = summary;
  rpc_call_reply(call, &resp.base);
  free(summary);
  free(ptrs);
  free(mem);
}

static void on_stop(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__StopRequest *r = (const void *)m;
  char reason[600];
  snprintf(reason, sizeof reason, "stopped by %s: %s", rpc_call_peer(call),
           r->reason && *r->reason ? r->reason : "no reason given");
  if (!oracle_job_over(svc->job)) {
    log_info("stop requested peer=%s reason=\"%s\"", rpc_call_peer(call), r->reason ? r->reason : "");
    oracle_job_stop(svc->job, reason);
  }
  Chanter__Oracle__V1__StopResponse resp = CHANTER__ORACLE__V1__STOP_RESPONSE__INIT;
  rpc_call_reply(call, &resp.base);
}

/* ---- Start / Checkpoint (chanter train --resume / --fresh, chanter checkpoint) */

static void on_start(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__StartRequest *r = (const void *)m;
  char msg[1536];
  log_info("start requested peer=%s resume=%s fresh=%d", rpc_call_peer(call), r->resume ? r->resume : "", r->fresh);
  int rc = oracle_job_start_request(svc->job, r->resume, r->fresh, msg, sizeof msg);
  if (rc) {
    rpc_call_fail(call, rc, "%s", msg);
    return;
  }
  Chanter__Oracle__V1__StartResponse resp = CHANTER__ORACLE__V1__START_RESPONSE__INIT;
  resp.message = msg;
  rpc_call_reply(call, &resp.base);
}

static void on_checkpoint(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  (void)m;
  char id[128], msg[1024];
  uint64_t it = 0;
  int rc = oracle_job_checkpoint_request(svc->job, id, sizeof id, &it, msg, sizeof msg);
  if (rc) {
    rpc_call_fail(call, rc, "%s", msg);
    return;
  }
  Chanter__Oracle__V1__CheckpointNowResponse resp = CHANTER__ORACLE__V1__CHECKPOINT_NOW_RESPONSE__INIT;
  resp.id = id;
  resp.iteration = it;
  rpc_call_reply(call, &resp.base);
}

static void on_scale(rpc_call_t *call, const ProtobufCMessage *m, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__ScaleRequest *r = (const void *)m;
  char id[128] = "", msg[1024];
  uint64_t it = 0;
  log_info("scale requested peer=%s trainers=%u embedding_servers=%u", rpc_call_peer(call), r->trainers,
           r->embedding_servers);
  int rc;
  if (r->trainers && (r->embedding_servers || r->n_embedding_addresses))
    rc = err_set(msg, sizeof msg, -EINVAL, "give one count to scale: trainers or embedding_servers");
  else if (r->embedding_servers || r->n_embedding_addresses)
    rc = oracle_job_scale_servers_request(svc->job, r->embedding_servers, r->embedding_addresses,
                                          r->n_embedding_addresses, id, sizeof id, &it, msg, sizeof msg);
  else
    rc = oracle_job_scale_request(svc->job, r->trainers, id, sizeof id, &it, msg, sizeof msg);
  if (rc) {
    refuse(svc, call, rc, "Scale: %s", msg);
    return;
  }
  log_info("%s", msg);
  Chanter__Oracle__V1__ScaleResponse resp = CHANTER__ORACLE__V1__SCALE_RESPONSE__INIT;
  resp.checkpoint_id = id;
  resp.iteration = it;
  resp.message = msg;
  rpc_call_reply(call, &resp.base);
}

/* chanter scale: the next run has n trainers -- the configuration says so
 * from here on (the job record's fingerprint, Join's answer, a restarted
 * trainer's rank check), and the ranks beyond it are no longer members. */
static void scale_to(oracle_service_t *svc, uint32_t n) {
  char kv[64], err[512];
  snprintf(kv, sizeof kv, "trainers=%u", n);
  if (cfg_set(svc->cfg, kv, "chanter scale", err, sizeof err)) {
    log_error("cannot scale: %s", err); /* (the request checked the bounds) */
    return;
  }
  for (size_t i = 0; i < svc->n_members;) {
    member_t *mb = &svc->members[i];
    if (mb->role != CHANTER__ORACLE__V1__ROLE__TRAINER || mb->rank < n) {
      i++;
      continue;
    }
    free(mb->address);
    *mb = svc->members[--svc->n_members];
  }
  svc->trainers = n;
  svc->scaled = 1;
}

/* chanter scale --embedding-servers: the next run's servers -- the
 * configuration says so from here on (the successor's clients, the job
 * record's fingerprint) and Join tells the trainers. */
static void scale_servers_to(oracle_service_t *svc, uint32_t n, const char *cluster) {
  char kv[64], err[512];
  char *cl = malloc(strlen(cluster) + 32);
  if (!cl) return;
  snprintf(kv, sizeof kv, "embedding_servers=%u", n);
  sprintf(cl, "cluster.embedding=%s", cluster);
  if (cfg_set(svc->cfg, kv, "chanter scale", err, sizeof err) || cfg_set(svc->cfg, cl, "chanter scale", err, sizeof err))
    log_error("cannot scale the embedding servers: %s", err); /* (the request checked them) */
  free(cl);
  cfg_list_free(svc->emb_addrs, svc->n_emb);
  svc->emb_addrs = NULL;
  svc->n_emb = 0;
  if (cfg_list(svc->cfg, "cluster.embedding", &svc->emb_addrs, &svc->n_emb)) svc->n_emb = 0;
}

/* The last oracle was killed in the middle of a scale of the embedding
 * servers (its record): this one carries it out -- the configuration says
 * the new servers, and the job's roll-back first moves the old servers'
 * latest complete checkpoint onto them (make_job). */
static void take_over_scale(oracle_service_t *svc, const oracle_record_scale_t *sc) {
  char *cluster = strdup(sc->addrs);
  if (!cluster) return;
  char *p = cluster;
  for (uint32_t i = 0; i < sc->to && p; i++) p = strchr(p + (i > 0), ',');
  if (p) *p = 0; /* the first sc->to addresses */
  log_warn("the last oracle stopped in the middle of a scale from %u to %u embedding servers (asked for after "
           "iteration %" PRIu64 "): this one carries it out, moving the rows of the old servers' latest complete "
           "checkpoint onto %s",
           sc->from, sc->to, sc->at, cluster);
  scale_servers_to(svc, sc->to, cluster);
  free(cluster);
}

/* ---- the Work stream: the call's data is (rank + 1) once Hello came */

static void w_message(rpc_call_t *call, const ProtobufCMessage *msg, void *ud) {
  oracle_service_t *svc = ud;
  const Chanter__Oracle__V1__TrainerMessage *m = (const void *)msg;
  uintptr_t tag = (uintptr_t)rpc_call_get_data(call);
  if (tag) { /* a message on the Work stream is a sign of life too */
    member_t *mb = find_member(svc, CHANTER__ORACLE__V1__ROLE__TRAINER, (uint32_t)(tag - 1));
    if (mb) mb->last_seen_ms = now_ms();
    oracle_job_on_message(svc->job, (uint32_t)(tag - 1), call, m);
    return;
  }
  if (m->kind_case != CHANTER__ORACLE__V1__TRAINER_MESSAGE__KIND_HELLO) {
    refuse(svc, call, -EINVAL, "Work: the first message must be Hello (got message kind %d)", (int)m->kind_case);
    return;
  }
  const Chanter__Oracle__V1__Hello *h = m->hello;
  member_t *mb = find_member(svc, CHANTER__ORACLE__V1__ROLE__TRAINER, h->rank);
  if (h->rank < svc->trainers && !mb) {
    refuse(svc, call, ORACLE_ERR_PRECONDITION, "Work: trainer rank %u has not joined: call Join before opening Work",
           h->rank);
    return;
  }
  char why[1024];
  int rc = oracle_job_attach(svc->job, h->rank, call, h->next_iteration, why, sizeof why);
  if (rc) {
    refuse(svc, call, rc, "Work: %s", why);
    return;
  }
  mb->last_seen_ms = now_ms();
  rpc_call_set_data(call, (void *)(uintptr_t)(h->rank + 1));
}

static void w_half_close(rpc_call_t *call, void *ud) {
  oracle_service_t *svc = ud;
  uintptr_t tag = (uintptr_t)rpc_call_get_data(call);
  if (tag) oracle_job_detach(svc->job, (uint32_t)(tag - 1), call, 0);
  else rpc_call_finish(call, -EINVAL, "Work: the stream ended before Hello");
}

static void w_cancel(rpc_call_t *call, void *ud) {
  oracle_service_t *svc = ud;
  uintptr_t tag = (uintptr_t)rpc_call_get_data(call);
  if (!tag) return;
  uint32_t rank = (uint32_t)(tag - 1);
  oracle_job_detach(svc->job, rank, call, 1);
  if (!oracle_job_rank_attached(svc->job, rank)) member_gone(svc, rank);
}

static void w_sent(rpc_call_t *call, void *ud) {
  oracle_service_t *svc = ud;
  uintptr_t tag = (uintptr_t)rpc_call_get_data(call);
  if (tag) oracle_job_sent(svc->job, (uint32_t)(tag - 1));
}

static const rpc_stream_handlers_t work_handlers = {NULL, w_message, w_half_close, w_cancel, w_sent};

/* ---- housekeeping: the status page's snapshot (oracle_page.h), the job and the members */
static void page_refresh(oracle_service_t *svc, int64_t now) {
  if (!svc->page) return;
  oracle_page_member_t *pm = calloc(svc->n_members ? svc->n_members : 1, sizeof *pm);
  if (!pm) return;
  for (size_t i = 0; i < svc->n_members; i++) {
    const member_t *mb = &svc->members[i];
    pm[i] = (oracle_page_member_t){.role = role_name(mb->role), .rank = mb->rank, .address = mb->address,
                                   .pid = mb->pid, .alive = member_alive(svc, mb, now),
                                   .seconds_since_heartbeat = (double)(now - mb->last_seen_ms) / 1e3,
                                   .iteration = mb->iteration};
    if (mb->role == CHANTER__ORACLE__V1__ROLE__TRAINER) {
      uint64_t it = oracle_job_rank_reported(svc->job, mb->rank);
      if (it > pm[i].iteration) pm[i].iteration = it;
    }
  }
  oracle_page_refresh(svc->page, svc->job, svc->generation, svc->address, pm, svc->n_members);
  free(pm);
}

static void on_tick(uv_timer_t *t) {
  oracle_service_t *svc = t->data;
  int64_t now = now_ms();
  size_t alive = 0;
  for (size_t i = 0; i < svc->n_members; i++) {
    member_t *m = &svc->members[i];
    int ok = member_alive(svc, m, now);
    alive += ok;
    /* a trainer silent past the timeout while it trains is hung (stopped,
     * or its host is cut off): the job recovers without it */
    if (!ok && !m->warned_silent && m->role == CHANTER__ORACLE__V1__ROLE__TRAINER &&
        oracle_job_state(svc->job) == ORACLE_TRAINING && oracle_job_rank_attached(svc->job, m->rank)) {
      char why[256];
      snprintf(why, sizeof why, "no heartbeat or message for %.1f s (oracle.heartbeat_timeout_ms = %lld): hung",
               (double)(now - m->last_seen_ms) / 1e3, (long long)svc->hb_timeout_ms);
      log_warn("trainer silent rank=%u pid=%u seconds=%.1f heartbeat_timeout_ms=%lld: taking it for lost", m->rank,
               m->pid, (double)(now - m->last_seen_ms) / 1e3, (long long)svc->hb_timeout_ms);
      m->warned_silent = 1;
      oracle_job_lose_rank(svc->job, m->rank, "hang", why);
    }
    if (ok) m->warned_silent = 0;
  }
  metrics_gauge_set(svc->g_alive, (double)alive);
  metrics_gauge_set(svc->g_members, (double)svc->n_members);
  int ckpt;
  long rank;
  oracle_page_take_actions(svc->page, &ckpt, &rank);
  if (ckpt) {
    char id[160] = "", msg[512] = "";
    uint64_t it = 0;
    if (oracle_job_checkpoint_request(svc->job, id, sizeof id, &it, msg, sizeof msg) == 0)
      log_info("status page (admin): checkpoint %s requested after iteration %llu", id, (unsigned long long)it);
    else
      log_warn("status page (admin): no checkpoint: %s", msg);
  }
  if (rank >= 0) {
    if (oracle_job_state(svc->job) == ORACLE_TRAINING && rank < (long)svc->trainers &&
        oracle_job_rank_attached(svc->job, (uint32_t)rank)) {
      log_warn("status page (admin): a drill: trainer %ld taken for lost", rank);
      oracle_job_lose_rank(svc->job, (uint32_t)rank, "drill", "taken for lost by a drill from the status page");
    } else {
      log_warn("status page (admin): no drill: trainer %ld is not training in this job", rank);
    }
  }
  page_refresh(svc, now);
}

static void on_recover(oracle_job_t *old, void *ud);

/* A new job object for the job (opts: new or recovering), hooked to the
 * service. */
static int make_job(oracle_service_t *svc, const char *job_id, int recover, oracle_recovery_t *rec,
                    const oracle_record_scale_t *scale, oracle_job_t **out, char *err, size_t err_len) {
  oracle_job_opts_t o = {.job_id = job_id,
                         .recover = recover,
                         .generation = svc->generation,
                         .recs = &svc->recs,
                         .rec = rec,
                         .on_recover = on_recover,
                         .ud = svc};
  if (scale && scale->to) { /* its roll-back moves the old servers' latest complete checkpoint first */
    o.reshape_from = scale->from;
    o.reshape_ckpt = "";
    o.reshape_union = scale->addrs;
  }
  return oracle_job_create(svc->loop, svc->cfg, svc->reg, &o, out, err, err_len);
}

/* The job object ended to recover (oracle_job.c): the service forgets
 * the lost member and the old generation's rendezvous keys, and the job
 * makes its successor (oracle_job_successor: the next generation), which
 * the service serves from now on; the old object frees itself once idle. */
static void on_recover(oracle_job_t *old, void *ud) {
  oracle_service_t *svc = ud;
  if (old != svc->job) return;
  int lost = oracle_job_lost_rank(old);
  if (lost >= 0) member_gone(svc, (uint32_t)lost);
  for (size_t i = 0; i < svc->n_kv; i++) {
    free(svc->kv[i].key);
    free(svc->kv[i].val);
  }
  svc->n_kv = 0;
  if (oracle_job_scale_to(old)) scale_to(svc, oracle_job_scale_to(old));
  const char *cluster = "";
  uint32_t servers = oracle_job_scale_servers(old, &cluster);
  if (servers) scale_servers_to(svc, servers, cluster);
  oracle_job_t *nj = NULL;
  char err[1024];
  int rc = oracle_job_successor(old, &nj, err, sizeof err);
  if (rc) { /* the old object stays, over: Status says why */
    log_error("cannot recover job %s: %s", oracle_job_id(old), err);
    return;
  }
  svc->job = nj;
  svc->generation = oracle_job_generation(nj);
  log_info("recovering job_id=%s generation=%u: waiting for %u trainers", oracle_job_id(nj), svc->generation,
           svc->trainers);
}

int oracle_service_create(uv_loop_t *loop, rpc_server_t *server, cfg_t *cfg, metrics_registry_t *reg,
                          oracle_service_t **out, char *err, size_t err_len) {
  oracle_service_t *svc = calloc(1, sizeof *svc);
  if (!svc) return -ENOMEM;
  svc->loop = loop;
  svc->cfg = cfg;
  svc->reg = reg;
  svc->generation = (uint32_t)clock_wall_s(); /* above any earlier oracle's of this job: its trainers' keys never mix */
  svc->trainers = (uint32_t)cfg_int(cfg, "trainers");
  svc->hb_timeout_ms = cfg_int(cfg, "oracle.heartbeat_timeout_ms");
  data_schema_t sc;
  table_layout_t lay;
  int rc = data_schema_from_cfg(cfg, &sc, err, err_len);
  if (rc) goto fail;
  svc->schema_hash = dpc_schema_hash(&sc);
  data_schema_close(&sc);
  if ((rc = cfg_layout(cfg, &lay, err, err_len)) != 0) goto fail;
  svc->layout_hash = table_layout_hash(&lay);
  table_layout_close(&lay);
  if ((rc = oracle_recoveries_init(&svc->recs, cfg, reg, err, err_len)) != 0) goto fail;
  {
    /* an oracle killed in the middle of its job left the record "training":
     * this one recovers that job instead of starting a new one over its rows */
    const char *dir = cfg_str(cfg, "oracle.state_dir");
    char id[96] = "", state[32] = "", conf[80] = "", mine[65], e2[1024];
    oracle_record_scale_t rsc = {0};
    int rr = *dir ? oracle_record_read(dir, id, sizeof id, state, sizeof state, conf, sizeof conf, &rsc, e2, sizeof e2)
                  : ERR_NOTFOUND;
    oracle_recovery_t *rec = NULL;
    oracle_record_config_hash(cfg, mine);
    if (rr && rr != ERR_NOTFOUND) log_warn("%s; starting a new job (the servers are checked first)", e2);
    /* killed in the middle of a scale of the embedding servers: the job file may say either count */
    int same = !rr && (!strcmp(conf, mine) || (rsc.to && !strcmp(rsc.config, mine)));
    if (!rr && !strcmp(state, "training") && !same)
      log_warn("job %s was training when the last oracle stopped, but this oracle runs with another configuration "
               "(fingerprint %.12s, the job's %.12s): a new job (the servers are checked first: `chanter train "
               "--resume` goes on from its checkpoint)",
               id, mine, conf);
    if (!rr && !strcmp(state, "training") && same && strcmp(cfg_str(cfg, "mode"), "ideal")) {
      char limit[1024];
      rec = oracle_recoveries_begin(&svc->recs, "oracle", "oracle", -1, 0,
                                    "the oracle restarted while its job was training (oracle.state_dir/job)", limit,
                                    sizeof limit);
      if (!rec) log_error("%s", limit);
      else log_warn("job %s was training when the last oracle stopped: recovering it", id);
    }
    if (rec && rsc.to) take_over_scale(svc, &rsc);
    if (rec) oracle_scales_restarted(&svc->recs, &rsc);
    rc = make_job(svc, rec ? id : NULL, rec != NULL, rec, rec ? &rsc : NULL, &svc->job, err, err_len);
    oracle_record_scale_free(&rsc);
    if (rc) goto fail;
  }
  svc->g_alive = metrics_gauge(reg, "members_alive", NULL, "members seen within oracle.heartbeat_timeout_ms");
  svc->g_members = metrics_gauge(reg, "members", NULL, "members that joined");
  svc->c_joins = metrics_counter(reg, "joins_total", NULL, "Join calls accepted");
  svc->c_refused = metrics_counter(reg, "refused_total", NULL, "calls refused (bad input, wrong schema, duplicate rank)");
  svc->c_kv_set = metrics_counter(reg, "kv_set_total", NULL, "KvSet calls");
  svc->c_kv_get = metrics_counter(reg, "kv_get_total", NULL, "KvGet calls");
  rpc_method_t methods[] = {
      {.name = "Join", .unary = on_join, .ud = svc},
      {.name = "Heartbeat", .unary = on_heartbeat, .ud = svc},
      {.name = "KvSet", .unary = on_kv_set, .ud = svc},
      {.name = "KvGet", .unary = on_kv_get, .ud = svc},
      {.name = "Work", .stream = &work_handlers, .ud = svc},
      {.name = "Status", .unary = on_status, .ud = svc},
      {.name = "Stop", .unary = on_stop, .ud = svc},
      {.name = "Start", .unary = on_start, .ud = svc},
      {.name = "Checkpoint", .unary = on_checkpoint, .ud = svc},
      {.name = "Scale", .unary = on_scale, .ud = svc},
  };
  if ((rc = rpc_server_add_service(server, &chanter__oracle__v1__oracle__descriptor, methods,
                                   sizeof methods / sizeof methods[0])) != 0) {
    snprintf(err, err_len, "cannot register the Oracle service: %s", err_str(rc));
    goto fail;
  }
  { /* the status page is for people: the job runs without it */
    char perr[256];
    if (oracle_page_create(cfg, reg, &svc->page, perr, sizeof perr))
      log_warn("%s; serving without the status page", perr);
  }
  page_refresh(svc, now_ms());
  uv_timer_init(loop, &svc->tick);
  svc->tick.data = svc;
  uv_timer_start(&svc->tick, on_tick, 1000, 1000);
  uv_unref((uv_handle_t *)&svc->tick);
  svc->tick_open = 1;
  log_info("oracle service ready job_id=%s schema_hash=%016llx layout_hash=%016llx", oracle_job_id(svc->job),
           (unsigned long long)svc->schema_hash, (unsigned long long)svc->layout_hash);
  *out = svc;
  return 0;
fail:
  oracle_service_destroy(svc);
  return rc;
}

oracle_job_t *oracle_service_job(oracle_service_t *svc) { return svc->job; }

void oracle_service_set_address(oracle_service_t *svc, const char *address) {
  snprintf(svc->address, sizeof svc->address, "%s", address);
}

int64_t oracle_service_status_age_ms(const oracle_service_t *svc) { return now_ms() - svc->status_at; }

int oracle_service_trainers_attached(oracle_service_t *svc) {
  int n = 0;
  for (uint32_t p = 0; svc->job && p < svc->trainers; p++) n += oracle_job_rank_attached(svc->job, p);
  return n;
}

void oracle_service_shutdown(oracle_service_t *svc, const char *why) {
  if (svc->job) oracle_job_stop(svc->job, why);
  while (svc->waiters) waiter_answer(svc->waiters, NULL, ERR_SHUTDOWN);
}

static void tick_closed(uv_handle_t *h) {
  oracle_service_t *svc = h->data;
  svc->tick_open = 0;
}

void oracle_service_destroy(oracle_service_t *svc) {
  if (!svc) return;
  while (svc->waiters) waiter_answer(svc->waiters, NULL, ERR_SHUTDOWN);
  if (svc->tick_open) {
    uv_timer_stop(&svc->tick);
    uv_close((uv_handle_t *)&svc->tick, tick_closed);
  }
  while (svc->tick_open || svc->open_waiters) uv_run(svc->loop, UV_RUN_NOWAIT);
  oracle_page_destroy(svc->page); /* before the job: no request reads it after this */
  oracle_job_destroy(svc->job);
  for (size_t i = 0; i < svc->n_members; i++) free(svc->members[i].address);
  free(svc->members);
  for (size_t i = 0; i < svc->n_kv; i++) {
    free(svc->kv[i].key);
    free(svc->kv[i].val);
  }
  free(svc->kv);
  cfg_list_free(svc->emb_addrs, svc->n_emb);
  free(svc);
}
