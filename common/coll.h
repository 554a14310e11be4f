/*
 * coll: collective communication among the trainers of a job.
 *
 * One interface, two implementations chosen at coll_create() time:
 *   "gloo"  CPU buffers, TCP (Debian's libgloo, behind the extern "C"
 *           wrapper common/coll_gloo.cc), used by CPU trainers and tests;
 *   "nccl"  CUDA device buffers (common/coll_nccl.c, built only when CUDA
 *           is on; one process per GPU: two ranks on one GPU are refused
 *           by NCCL, so callers pick it with coll_nccl_eligible).
 * A group is formed from a rendezvous store (coll_store_t): the oracle
 * serves one over RPC; tests and single-host runs use the file-backed
 * store below.  Every key the group writes is "<prefix>/<backend>/<key>",
 * so a group re-formed after a failure under a new prefix (job id plus
 * generation) never reads a dead generation's addresses.
 *
 * Determinism.  coll_allreduce_sum_f32 on the Gloo backend is Gloo's ring
 * algorithm (gloo::allreduce, Algorithm::RING, 1 MiB segments) with a plain
 * element-wise float add, so every element's sum is formed in an order
 * fixed by (P, n) alone -- never by timing -- and the result is copied, not
 * recomputed, to the other ranks.  Hence: bit-identical on every rank, and
 * bit-identical across runs with the same P, n and inputs.  The order:
 *   S     = roundup_P(max(ceil(4n / 1 MiB), 2P))    segments, multiple of P
 *   seg   = round4(ceil(4n / S))                    bytes per segment
 *   chunk c(j) = floor(4j / seg) / (S / P)          in [0, P)
 *   sum_j = x[c] + (x[c+1] + (... + (x[c-2] + x[c-1])))   (ranks mod P)
 * i.e. the partial sum starts at rank c-1, travels down the ring adding
 * each rank's value, and rank c adds its own last.  For P <= 2 this is the
 * single, correctly rounded x0 + x1.  For P >= 3 an element's order
 * depends on its chunk, i.e. on its offset and on n: re-bucketing the same
 * gradients (other bucket boundaries) or another P can round differently
 * (within the usual (P-1) * eps * sum|x| bound), so the trainer keeps its
 * bucket layout fixed for a job.  tests/unit/test_coll.c
 * checks this formula bitwise against Gloo, so a Gloo upgrade that changes
 * it is caught.
 *
 * Errors.  Every function returns 0 or a negative code (err.h):
 *   -EINVAL          bad arguments (root out of range, unknown backend ...)
 *   ERR_DEADLINE     the store or a peer did not answer within timeout_ms
 *   ERR_UNAVAILABLE  a peer closed its connection (died) or was unreachable
 *   ERR_NOGPU        backend "nccl" without a CUDA device
 *   ERR_CONFIG       backend not compiled in (nccl with CUDA=0), or an
 *                    iface_addr this host cannot listen on
 *   ERR_RPC          any other transport or library failure
 * and logs one log_error line naming the operation, rank, size and the
 * library's own message.  A failed collective leaves the group unusable
 * (peers may be mid-operation): later calls return the same error at
 * once; coll_destroy() it and form a new group under a new prefix.  A peer
 * that vanishes mid-collective yields an error within timeout_ms (sooner
 * when its kernel closes the sockets), never a hang.
 *
 * Threads: a coll_t is used by one thread at a time (calls must be issued
 * in the same order on every rank).  For overlap, give the communication
 * its own thread, or form several groups under distinct prefixes.
 */
#ifndef CHANTER_COLL_H
#define CHANTER_COLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct coll_s coll_t;

/* The rendezvous store a group bootstraps from.  set publishes a value
 * (copied); get blocks until the key exists or timeout_ms passes and hands
 * back a malloc'd copy (caller frees).  Both return 0 or a negative code;
 * get returns ERR_DEADLINE (or -ETIMEDOUT) on timeout.  Called only from
 * the thread inside coll_create(). */
typedef struct coll_store_s {
  int (*set)(void *ud, const char *key, const void *val, size_t len);
  int (*get)(void *ud, const char *key, void **val /* malloc'd */, size_t *len,
             int64_t timeout_ms);
  void *ud;
} coll_store_t;

typedef struct coll_opts_s {
  int rank, size;         /* 0 <= rank < size */
  const char *backend;    /* "gloo" | "nccl"; NULL = "gloo" */
  const char *iface_addr; /* address to listen on; NULL = "127.0.0.1" */
  const char *prefix;     /* key namespace (job id + generation); NULL = "chanter" */
  int64_t timeout_ms;     /* rendezvous and per-operation; <= 0 = 30000 */
} coll_opts_t;

/* Forms the group: publishes this rank's address in the store, waits for
 * every other rank's, connects a full mesh.  Blocks up to about timeout_ms
 * (rendezvous) plus the connection time.  On failure returns a negative
 * code, *out = NULL, and a one-line reason in err (if err_len > 0).
 * Sets SIGPIPE to SIG_IGN if it is still SIG_DFL (as proc_init() does):
 * a write to a dead peer must fail the collective, not kill the process. */
int coll_create(const coll_opts_t *o, const coll_store_t *store, coll_t **out,
                char *err, size_t err_len);
/* Closes the connections and frees c (NULL is fine).  Peers still inside a
 * collective with this rank get an error. */
void coll_destroy(coll_t *c);

int coll_rank(const coll_t *c);
int coll_size(const coll_t *c);
const char *coll_backend(const coll_t *c); /* "gloo" or "nccl" */

/* In-place sum of buf[0..n) over the group; every rank passes the same n.
 * Order and determinism: see the top of this file.  Gloo: host memory;
 * NCCL: device memory, complete when the call returns. */
int coll_allreduce_sum_f32(coll_t *c, float *buf, size_t n);
/* The same sum formed in rank order, ((x0 + x1) + x2) + ..., for every
 * element wherever it sits in buf (an allgather, then the sum on each
 * rank): bit-identical results for the same values whatever the buffer's
 * layout -- what the trainers use for embedding rows, whose position in the
 * packed buffer depends on the lookahead.  For P <= 2 it equals
 * coll_allreduce_sum_f32 bit for bit.  Moves P * n floats per rank instead
 * of about 2n; host memory (gloo) only for now (-EINVAL otherwise). */
int coll_allreduce_sum_f32_ordered(coll_t *c, float *buf, size_t n);
/* Copies root's buf[0..bytes) to every other rank's buf. */
int coll_broadcast(coll_t *c, void *buf, size_t bytes, int root);
/* out[r*bytes_each .. +bytes_each) = rank r's in, on every rank.  out holds
 * size*bytes_each bytes; in may be out + rank*bytes_each (in place) but
 * must not otherwise overlap out. */
int coll_allgather(coll_t *c, const void *in, size_t bytes_each, void *out);
/* Returns once every rank has entered the barrier. */
int coll_barrier(coll_t *c);
/* Personalised exchange with per-peer sizes: this rank sends
 * send[soff[r] .. soff[r] + sbytes[r]) to rank r and receives rank r's
 * block into recv[roff[r] .. roff[r] + rbytes[r]), for every r including
 * itself (its own block is copied locally).  Blocks are packed in rank
 * order, so the offsets are the prefix sums soff[r] = sbytes[0] + ... +
 * sbytes[r-1] (roff likewise) and the call takes only the sizes: sbytes
 * and rbytes have size entries each; send holds the sum of sbytes, recv
 * the sum of rbytes, and they must not overlap.  Any block may be empty,
 * all of them too (send/recv may then be NULL), but every rank must still
 * make the call: a rank cannot know that the others have nothing to move.
 * Gloo: host memory; NCCL: device memory, complete when the call returns.
 * Determinism: bytes are copied, never combined: the result is exact and
 * independent of timing and of the backend.
 *
 * size == 1: a local copy.
 *
 * The contract: sbytes[r] on rank q == rbytes[q] on rank r, for every
 * pair (and sbytes[rank] == rbytes[rank]).  Gloo checks it: the sizes go
 * first, in one extra round of 16 bytes per pair (Gloo itself aborts the
 * process that receives too much and completes a short block silently).
 * A mismatched pair moves nothing between its two ranks -- their blocks
 * for each other stay untouched in recv -- and both return -EINVAL (a log
 * line naming the peer and both sizes); every other block arrives, on
 * those two ranks too, the other ranks return 0, and the group stays
 * usable (no latch: every rank is still in step, as after a bad broadcast
 * root).  NCCL does not check (ncclSend/ncclRecv counts must match): a
 * mismatch is undefined -- it may corrupt recv or time out (ERR_DEADLINE
 * after timeout_ms, group failed), never hang.  A NULL send/recv with
 * bytes to move, or NULL size arrays, fail (-EINVAL) on this rank alone
 * and latch, as for the other collectives.  Other failures as for every
 * collective (top of file). */
int coll_alltoallv(coll_t *c, const void *send, const size_t *sbytes,
                   void *recv, const size_t *rbytes);

/* 1 when backend name ("gloo", "nccl") is compiled into this binary
 * (nccl: CUDA builds only), else 0.  Says nothing about a GPU. */
int coll_backend_built(const char *name);

/* Whether a group of n ranks may all-reduce over NCCL, given the device
 * each rank computes on: ids[r] is rank r's device identity
 * (cuda_check_device_id: "GPU-<uuid>"), NULL or "" for a rank without
 * one.  NCCL needs one GPU per rank, so: 1 when n >= 2, every rank has an
 * id and no two ids are equal; else 0, with the first reason in why (if
 * why_len > 0) naming the ranks, e.g. "trainers 0 and 1 share GPU
 * GPU-5a1c...", "trainer 2 has no GPU identity (...)" or "a group of one
 * has nothing to all-reduce"; *a and *b (either may be NULL) get the two
 * ranks (or the one, twice; -1 for a group of one).  A pure function of
 * its arguments: it touches no device, so every rank, given the same
 * ids, reaches the same answer. */
int coll_nccl_eligible(const char *const *ids, int n, int *a, int *b, char *why, size_t why_len);

/* A file-backed store for tests and single-host use: each key is a file
 * under dir (written to a temporary name, then renamed, so a reader sees
 * all of a value or none); get polls.  dir must exist and is shared by
 * every rank.  _init works on the caller's s; _close frees what init
 * allocated (the files stay). */
int coll_file_store_init(coll_store_t *s, const char *dir);
void coll_file_store_close(coll_store_t *s);

/* ---- internal: the backend interface (coll.c dispatches to these) ----
 * Each backend converts its library's errors (C++ exceptions, ncclResult_t,
 * cudaError_t) into our codes in its own file and writes the library's
 * message into what[0..what_len).  Never called with zero-length
 * buffers, nor with size == 1 for allreduce, broadcast and barrier (no-ops
 * that coll.c answers); allgather and alltoallv with size == 1 are the
 * backend's copy (host or device memory).  alltoallv is called whatever
 * the sizes (all zero included: the peers cannot know); it sets *in_step
 * when its error left every rank in step (a size mismatch that moved
 * nothing), so coll.c does not latch it. */
typedef struct coll__backend_s {
  const char *name;
  int (*create)(const coll_opts_t *o, const coll_store_t *store, void **impl,
                char *what, size_t what_len);
  void (*destroy)(void *impl);
  int (*allreduce_sum_f32)(void *impl, float *buf, size_t n, char *what,
                           size_t what_len);
  int (*broadcast)(void *impl, void *buf, size_t bytes, int root, char *what,
                   size_t what_len);
  int (*allgather)(void *impl, const void *in, size_t bytes_each, void *out,
                   char *what, size_t what_len);
  int (*barrier)(void *impl, char *what, size_t what_len);
  int (*alltoallv)(void *impl, const void *send, const size_t *sbytes,
                   void *recv, const size_t *rbytes, int *in_step, char *what,
                   size_t what_len);
} coll__backend_t;

extern const coll__backend_t coll__gloo_backend;
#ifdef CHANTER_CUDA
extern const coll__backend_t coll__nccl_backend;
#endif

#ifdef __cplusplus
}
#endif

#endif
