/*
 * oracle_recover: what the oracle remembers of a job's recoveries
 * (DESIGN.md 5) and of the job itself across its own restarts.
 *
 * A recovery starts when a daemon is lost (a trainer's Work stream
 * breaks, a trainer falls silent past oracle.heartbeat_timeout_ms, an
 * embedding server is lost without durable writes, the oracle itself
 * restarted in the middle of the job) and ends when the job has caught up
 * with where it was.  Its record holds who was lost and why, the
 * checkpoint rolled back to, and the moments a drill reports: detected,
 * rolled back (every server restored), resumed (every trainer joined the
 * new generation), first replayed iteration done, caught up.  The records
 * go to the log, the metrics (recoveries_total{kind}, recovery_seconds),
 * summary.json ("recoveries") and, with oracle.state_dir, to
 * state_dir/recoveries, so that a restarted oracle keeps the list.
 *
 * The job record, state_dir/job ("job_id=...", "state=...", "config=..."),
 * says which job this oracle ran and whether it was still training: an
 * oracle that starts with the same configuration and finds
 * "state=training" was killed in the middle of that job (and restarted by
 * systemd or chanter local's supervisor): it recovers the job (rolls back
 * to its latest complete checkpoint) instead of starting a new job over
 * its rows.
 *
 * Loop thread only.
 */
#ifndef CHANTER_ORACLE_RECOVER_H
#define CHANTER_ORACLE_RECOVER_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "metrics.h"

#define ORACLE_RECOVERIES_KEPT 64 /* the last records kept (summary, state_dir) */

typedef struct oracle_recovery_s {
  char kind[16];          /* "trainer", "hang", "oracle", "embedding" */
  char who[32];           /* "trainer-1", "oracle", "embedding-0" */
  char why[512];
  int lost_rank;          /* the trainer lost, or -1 */
  uint32_t generation;    /* the trainer group's generation formed after it */
  uint64_t done_at_loss;  /* iterations every trainer had finished when the loss was noticed */
  int64_t rollback_to;    /* the checkpoint's iteration c (the job goes on at c + 1); -1: the job's start */
  char checkpoint[96];    /* its id ("" for the start) */
  /* unix seconds; 0 = not yet */
  double t_detected, t_rolled_back, t_resumed, t_first, t_caught_up;
} oracle_recovery_t;

/* A scale (chanter scale, oracle_scale.c): the trainer group re-formed
 * with another count at a checkpoint, as a resume with that count would.
 * Not a recovery: oracle.max_recoveries does not count it. */
#define ORACLE_SCALES_KEPT 32
typedef struct oracle_scale_s {
  char what[20];         /* "embedding_servers", else "" (trainers) */
  uint64_t rows_moved, bytes_moved; /* (embedding servers) server to server */
  double move_seconds;              /* the move itself (embc_reshape_all) */
  uint32_t from, to;
  uint64_t at_iteration; /* c: the new group goes on from the model after c */
  char checkpoint[96];
  uint32_t generation;   /* the group formed with `to` trainers */
  /* unix seconds; 0 = not yet: asked, the old group's run ended (c complete), the new group trains, its first
   * iteration (c + 1) done */
  double t_asked, t_ended, t_trained, t_first;
  double t_c; /* the old group's iteration c done (it runs no step past c) */
} oracle_scale_t;

/* A scale of the embedding servers under way, in the job record from its
 * request until the job trains on the new servers: an oracle killed in
 * between leaves it to the next one, which moves the rows again from the
 * old servers' latest complete checkpoint (oracle_scale.c).  to = 0: none. */
typedef struct oracle_record_scale_s {
  uint32_t from, to; /* the server counts before and after */
  uint64_t at;       /* the iteration of the scale's checkpoint, as asked */
  double asked;      /* when (unix seconds) */
  char config[80];   /* the fingerprint of the configuration after it (config= is the one before) */
  char *addrs;       /* every old and new server's address, the old first, "a,b,c" (malloc'ed) */
} oracle_record_scale_t;
void oracle_record_scale_free(oracle_record_scale_t *s);

typedef struct oracle_recoveries_s {
  oracle_recovery_t r[ORACLE_RECOVERIES_KEPT]; /* record i in r[i % KEPT] */
  uint64_t n;
  oracle_scale_t s[ORACLE_SCALES_KEPT]; /* scale i in s[i % KEPT] (saved in state_dir/scales) */
  uint64_t n_scales;
  metrics_counter_t *m_scales;
  metrics_gauge_t *m_scale_pause, *m_scale_rows, *m_scale_bytes;
  char state_dir[4096];
  int64_t max, window_s;  /* oracle.max_recoveries in oracle.recovery_window_s */
  metrics_registry_t *reg;
  metrics_hist_t *m_seconds;
} oracle_recoveries_t;

/* Reads the limits, registers the metrics, and loads state_dir/recoveries
 * when there is one (a restarted oracle).  0 or an error with err. */
int oracle_recoveries_init(oracle_recoveries_t *rs, const cfg_t *cfg, metrics_registry_t *reg, char *err,
                           size_t err_len);

/* A new recovery: its record (NULL when oracle.max_recoveries were
 * reached within the window: limit then holds the sentence).  Logged. */
oracle_recovery_t *oracle_recoveries_begin(oracle_recoveries_t *rs, const char *kind, const char *who, int lost_rank,
                                           uint64_t done, const char *why, char *limit, size_t limit_len);
/* The recovery under way (not caught up yet), or NULL. */
oracle_recovery_t *oracle_recoveries_current(oracle_recoveries_t *rs);

/* The moments of r: each sets its time (now), logs it, and saves the
 * records.  rolled_back: to checkpoint id at iteration c (c = -1: the
 * start).  first: the first replayed iteration is done.  caught_up: the
 * job is where it was (the metrics observe recovery_seconds). */
void oracle_recovery_rolled_back(oracle_recoveries_t *rs, oracle_recovery_t *r, const char *id, int64_t c);
void oracle_recovery_resumed(oracle_recoveries_t *rs, oracle_recovery_t *r, uint32_t generation);
void oracle_recovery_first(oracle_recoveries_t *rs, oracle_recovery_t *r, uint64_t done);
void oracle_recovery_caught_up(oracle_recoveries_t *rs, oracle_recovery_t *r, uint64_t done);

/* The "recoveries" list of summary.json (a JSON array, appended to out). */
void oracle_recoveries_json(const oracle_recoveries_t *rs, char *out, size_t cap);
/* One line for the progress display and the log: "recovered from the loss
 * of trainer-1 in 2.3 s, replaying 40 iterations" (empty when none). */
void oracle_recoveries_line(const oracle_recoveries_t *rs, char *out, size_t cap);

/* Scales (oracle_scale.c).  begin: asked (what: "embedding_servers", or "" for trainers), to checkpoint id of iteration
 * c (logged); the moments of the last one not done: its run ended, the
 * new group trains (generation), its first iteration done (the metrics:
 * scales_total, scale_pause_seconds).  json: summary.json's "scales"
 * (appended to out); line: one for the progress display ("" when none). */
oracle_scale_t *oracle_scales_begin(oracle_recoveries_t *rs, const char *what, uint32_t from, uint32_t to, uint64_t c,
                                    const char *id);
/* This oracle restarted while its job was training: the scale the last one began and did not finish (state_dir's
 * record) ended its run there, and goes on with this one's recovery; sc: the job record's scale of the embedding
 * servers, which this oracle takes over (a record of it is made when state_dir had none). */
void oracle_scales_restarted(oracle_recoveries_t *rs, const oracle_record_scale_t *sc);
/* state_dir/scales written again (after each change of a record). */
void oracle_scales_save(const oracle_recoveries_t *rs);
void oracle_scales_ended(oracle_recoveries_t *rs);
void oracle_scales_c_done(oracle_recoveries_t *rs);
void oracle_scales_trained(oracle_recoveries_t *rs, uint32_t generation, uint64_t start);
void oracle_scales_first(oracle_recoveries_t *rs, uint64_t done);
void oracle_scales_json(const oracle_recoveries_t *rs, char *out, size_t cap);
void oracle_scales_line(const oracle_recoveries_t *rs, char *out, size_t cap);


/* The job record in dir/job.  read: 0 with job_id and state (and *scale
 * when not NULL: its to is 0 when the record has none), ERR_NOTFOUND
 * when there is none, or an error with err (a damaged record).  write:
 * atomically (temporary file, fsync, rename); scale NULL or to = 0: none. */
int oracle_record_read(const char *dir, char *job_id, size_t id_len, char *state, size_t state_len, char *config,
                       size_t config_len, oracle_record_scale_t *scale, char *err, size_t err_len);
int oracle_record_write(const char *dir, const char *job_id, const char *state, const char *config,
                        const oracle_record_scale_t *scale, char *err, size_t err_len);
/* The configuration's fingerprint (SHA-256 hex of every effective key but
 * the [cluster] addresses, [tls], [metrics] and [local]):
 * an oracle restarted with the job's own configuration (systemd, chanter
 * local's supervisor) recovers the job; one started with another (an
 * operator's new `chanter local up`, other --set values) finds the job
 * blocked and asks for --resume or --fresh. */
void oracle_record_config_hash(const cfg_t *cfg, char out[65]);
/* ... of cfg with the top-level key (trainers, embedding_servers; NULL: none) = value: chanter scale records the
 * fingerprint of the job's configuration after the scale at once, so that an oracle restarted on the scaled job
 * file recovers the job. */
void oracle_record_config_hash_as(const cfg_t *cfg, const char *key, uint32_t value, char out[65]);

#endif
