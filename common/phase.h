/*
 * phase: the one list of the phases whose seconds the project measures --
 * a trainer's step (the Report's t_<name> fields, oracle.proto; the
 * trainer's last_phase_seconds gauge and progress line), the oracle's
 * phase_seconds histograms and summary.json's phase_seconds, and `chanter
 * train --local`'s phase_seconds_per_iteration.  The names are what those
 * print; they never change (users read them).
 *
 * The list, in order:
 *   - the phases of a trainer's step (PHASE_N_STEP of them): each second
 *     of a step is in exactly one, total is their sum;
 *   - parts of those, reported too (up to PHASE_N_REPORT): they show
 *     whether the lookahead hides the traffic and what the rest costs
 *     (prefetch_wait of fetch: blocked on this step's rows; sync_wait of
 *     the step's start: blocked on the previous step's background work;
 *     sync_critical of allreduce: the critical rows; replicate of update:
 *     owned rows replicated; alltoall of forward and backward: the
 *     partitioned tables' pooled embeddings and their gradients);
 *   - the phases of `chanter train --local` that a cluster step does not
 *     have (it also has forward and backward; its order is cmd_train.c's).
 *
 * PHASE_LIST(X) calls X(ID, name) for each: PHASE_<ID> is its index and
 * phase_name() its name; PHASE_REPORT_LIST(X) only for those a Report
 * carries (a Report's field t_<name> holds its seconds), PHASE_LOCAL_LIST(X)
 * for the rest.
 */
#ifndef CHANTER_PHASE_H
#define CHANTER_PHASE_H

#define PHASE_REPORT_LIST(X)                                                                                       \
  /* a trainer's step */                                                                                           \
  X(WAIT, wait)                                                                                                    \
  X(FETCH, fetch)                                                                                                  \
  X(FORWARD, forward)                                                                                              \
  X(BACKWARD, backward)                                                                                            \
  X(ALLREDUCE, allreduce)                                                                                          \
  X(UPDATE, update)                                                                                                \
  X(WRITE_BACK, write_back)                                                                                        \
  X(TOTAL, total)                                                                                                  \
  /* parts of the above, reported */                                                                               \
  X(PREFETCH_WAIT, prefetch_wait)                                                                                  \
  X(SYNC_WAIT, sync_wait)                                                                                          \
  X(SYNC_CRITICAL, sync_critical)                                                                                  \
  X(REPLICATE, replicate)                                                                                          \
  X(ALLTOALL, alltoall)

#define PHASE_LOCAL_LIST(X)                                                                                        \
  X(DATA, data)                                                                                                    \
  X(GATHER, gather)                                                                                                \
  X(DENSE_UPDATE, dense_update)                                                                                    \
  X(EMBEDDING_UPDATE, embedding_update)                                                                            \
  X(EVAL, eval)

#define PHASE_LIST(X) PHASE_REPORT_LIST(X) PHASE_LOCAL_LIST(X)

enum {
#define PHASE_ENUM(id, name) PHASE_##id,
  PHASE_LIST(PHASE_ENUM)
#undef PHASE_ENUM
  PHASE_N
};
#define PHASE_N_STEP (PHASE_TOTAL + 1)       /* the phases of a trainer's step: [0, PHASE_N_STEP) */
#define PHASE_N_REPORT (PHASE_ALLTOALL + 1) /* what a Report carries: [0, PHASE_N_REPORT) */

/* The name of phase p (< PHASE_N), as summary.json, the metrics and the
 * logs print it. */
const char *phase_name(int p);

#endif
