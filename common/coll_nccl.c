/*
 * coll_nccl: the NCCL backend of coll.h (GPU trainers), and the one place
 * where ncclResult_t and cudaError_t from collectives become our codes.
 * Compiled only when CUDA is on (CHANTER_CUDA; the Makefile then adds the
 * CUDA headers and links cudart and nccl).  On a machine without a GPU
 * coll_create refuses with ERR_NOGPU before touching NCCL.
 *
 * A group: rank 0 makes an ncclUniqueId and publishes it in the store
 * under "<prefix>/nccl/id"; the others get it (up to timeout_ms); each
 * rank joins on the CALLING THREAD'S CURRENT DEVICE -- the one its model
 * and buffers live on (cuda_check probes the same one; pin a process to a
 * GPU with CUDA_VISIBLE_DEVICES) -- with ncclCommInitRankConfig on a
 * non-blocking communicator (config.blocking = 0: every call but
 * ncclCommAbort / ncclCommDestroy returns at once, possibly ncclInProgress,
 * and ncclCommGetAsyncError says when it settled).  Two ranks on one GPU
 * are refused by NCCL itself (ncclInvalidUsage, "duplicate GPU"); the
 * trainer never asks for that (trainer_join.c falls back to Gloo).
 *
 * Buffers are device memory.  Each collective is enqueued on the group's
 * own stream, after the work already queued on the legacy default stream
 * (where the model computes: an event orders the two, so a caller need not
 * synchronize first), and waited for here by polling the stream and
 * ncclCommGetAsyncError, so a dead or silent peer ends in ncclCommAbort
 * and an error after timeout_ms instead of a hang.  Barrier is an
 * all-reduce of one float on a device scratch word (NCCL has no barrier);
 * alltoallv is a group of ncclSend/ncclRecv, one pair per peer.
 *
 * Teardown is always ncclCommAbort: every collective here has completed
 * when it returns, so there is nothing for ncclCommFinalize to flush, and
 * Finalize waits until the communicator is GLOBALLY quiescent -- i.e. for
 * the peers, one of which may be dead (a failover closes the generation's
 * groups) -- while Abort frees this rank's side without waiting for
 * anyone.  coll_destroy therefore never blocks on a peer, aborted or not.
 *
 * Determinism: NCCL's reductions are deterministic for a fixed
 * communicator shape, algorithm and protocol.  The first group of a
 * process pins them with NCCL_ALGO=Ring and NCCL_PROTO=Simple, unless the
 * user set either variable (then theirs stand): one set of GPUs gives one
 * digest run to run.  The order differs from the Gloo backend's ring (and
 * from coll.h's formula), so NCCL digests are a family of their own.
 *
 * Status: run on one GPU only (groups of one; a group of two on one GPU is
 * refused, which is checked); never run across two GPUs (no machine here
 * has two).
 */
#ifdef CHANTER_CUDA

#include "coll.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "clock.h"
#include "err.h"

typedef struct nccl_group_s {
  int rank, size, device;
  int64_t timeout_ms;
  ncclComm_t comm; /* NULL once aborted */
  cudaStream_t stream;
  cudaEvent_t legacy; /* the legacy default stream's tail, waited for by stream */
  float *scratch;     /* one device float for the barrier */
} nccl_group_t;

static void pause_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static int cuda_error(cudaError_t e, const char *call, char *what, size_t len) {
  snprintf(what, len, "%s: %s (%s)", call, cudaGetErrorString(e),
           cudaGetErrorName(e));
  switch (e) {
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInvalidDevice:
    return ERR_NOGPU;
  case cudaErrorMemoryAllocation:
    return -ENOMEM;
  default:
    return ERR_CUDA;
  }
}

static int nccl_error(ncclResult_t r, const char *call, ncclComm_t comm,
                      char *what, size_t len) {
  const char *last = comm ? ncclGetLastError(comm) : NULL;
  snprintf(what, len, "%s: %s%s%s", call, ncclGetErrorString(r),
           last && *last ? ": " : "", last ? last : "");
  switch (r) {
  case ncclInvalidArgument:
  case ncclInvalidUsage:
    return -EINVAL;
  case ncclRemoteError:
    return ERR_UNAVAILABLE;
  case ncclUnhandledCudaError:
    return ERR_CUDA;
  default:
    return ERR_RPC;
  }
}

/* After a failure or a timeout nothing on the communicator can be
 * trusted; abort does not wait for peers. */
static void abort_comm(nccl_group_t *g) {
  if (g->comm) ncclCommAbort(g->comm);
  g->comm = NULL;
}

/* Waits while a non-blocking call is in progress (initialization, or
 * enqueueing); 0 once it succeeded. */
static int settle(nccl_group_t *g, ncclResult_t r, const char *call,
                  int64_t deadline, char *what, size_t len) {
  int rc = 0;
  while (r == ncclInProgress) {
    if (clock_mono_ms() > deadline) {
      snprintf(what, len, "%s: timed out after %lld ms", call,
               (long long)g->timeout_ms);
      abort_comm(g);
      return ERR_DEADLINE;
    }
    pause_us(100);
    if (ncclCommGetAsyncError(g->comm, &r) != ncclSuccess) break;
  }
  if (r == ncclSuccess) return 0;
  rc = nccl_error(r, call, g->comm, what, len);
  abort_comm(g);
  return rc;
}

/* r: the result of enqueueing on g->stream.  Waits for the operation with
 * the group's deadline. */
static int finish(nccl_group_t *g, ncclResult_t r, const char *call,
                  char *what, size_t len) {
  int64_t deadline = clock_mono_ms() + g->timeout_ms;
  int rc = settle(g, r, call, deadline, what, len);
  while (rc == 0) {
    cudaError_t e = cudaStreamQuery(g->stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      rc = cuda_error(e, call, what, len);
      abort_comm(g);
      break;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(g->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      rc = nccl_error(async, call, g->comm, what, len);
      abort_comm(g);
      break;
    }
    if (clock_mono_ms() > deadline) {
      snprintf(what, len, "%s: timed out after %lld ms (a peer gone?)", call,
               (long long)g->timeout_ms);
      abort_comm(g);
      rc = ERR_DEADLINE;
      break;
    }
    pause_us(50);
  }
  return rc;
}

static int usable(const nccl_group_t *g, char *what, size_t len) {
  if (g->comm) return 0;
  snprintf(what, len, "the NCCL communicator was aborted after a failure");
  return ERR_UNAVAILABLE;
}

static void nccl_destroy(void *impl) {
  nccl_group_t *g = impl;
  if (!g) return;
  /* Abort, never Finalize + Destroy: see the top of the file. */
  abort_comm(g);
  if (g->scratch) cudaFree(g->scratch);
  if (g->legacy) cudaEventDestroy(g->legacy);
  if (g->stream) cudaStreamDestroy(g->stream);
  (void)cudaGetLastError(); /* leave no failure of ours to the next CUDA caller */
  free(g);
}

/* The calling thread (the trainer's communication thread is not the one
 * that formed the group) works on the group's device, and the group's
 * stream waits for what the legacy default stream holds so far: the
 * kernels that wrote the buffer. */
static int prepare(nccl_group_t *g, const char *call, char *what, size_t len) {
  cudaError_t e = cudaSetDevice(g->device);
  if (e == cudaSuccess) e = cudaEventRecord(g->legacy, cudaStreamLegacy);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(g->stream, g->legacy, 0);
  if (e == cudaSuccess) return 0;
  int rc = cuda_error(e, call, what, len);
  abort_comm(g);
  return rc;
}

/* NCCL_ALGO / NCCL_PROTO pinned before the first communicator (NCCL reads
 * them when it initializes), unless the user chose. */
static void pin_algorithm(void) {
  setenv("NCCL_ALGO", "Ring", 0);
  setenv("NCCL_PROTO", "Simple", 0);
}

/* Rank 0 makes the id and publishes it; the others wait for it. */
static int exchange_id(const coll_opts_t *o, const coll_store_t *store,
                       ncclUniqueId *id, char *what, size_t len) {
  char key[512];
  int rc = 0;
  snprintf(key, sizeof key, "%s/nccl/id", o->prefix);
  if (o->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess) return nccl_error(r, "ncclGetUniqueId", NULL, what, len);
    rc = store->set(store->ud, key, id, sizeof *id);
    if (rc < 0)
      snprintf(what, len, "rendezvous store: set of key '%s' failed: %s", key,
               err_str(rc));
    return rc;
  }
  void *val = NULL;
  size_t vlen = 0;
  rc = store->get(store->ud, key, &val, &vlen, o->timeout_ms);
  if (rc == 0 && vlen != sizeof *id) rc = ERR_BADMSG;
  if (rc == 0) memcpy(id, val, sizeof *id);
  free(val);
  if (rc == -ETIMEDOUT) rc = ERR_DEADLINE;
  if (rc < 0)
    snprintf(what, len,
             "rendezvous: no NCCL id under key '%s' (%s; has rank 0 started "
             "with the same prefix?)",
             key, err_str(rc));
  return rc;
}

static int nccl_create(const coll_opts_t *o, const coll_store_t *store,
                       void **impl, char *what, size_t len) {
  int ndev = 0, rc = 0;
  nccl_group_t *g = NULL;
  ncclUniqueId id;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    snprintf(what, len, "no CUDA device: cudaGetDeviceCount: %s",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return ERR_NOGPU;
  }
  g = calloc(1, sizeof *g);
  if (!g) return -ENOMEM;
  g->rank = o->rank;
  g->size = o->size;
  g->timeout_ms = o->timeout_ms;
  int64_t deadline = clock_mono_ms() + o->timeout_ms;
  /* the caller's device: where the model and the buffers are */
  if ((e = cudaGetDevice(&g->device)) != cudaSuccess) {
    rc = cuda_error(e, "cudaGetDevice", what, len);
    goto out;
  }
  if ((e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) !=
      cudaSuccess) {
    rc = cuda_error(e, "cudaStreamCreateWithFlags", what, len);
    goto out;
  }
  if ((e = cudaEventCreateWithFlags(&g->legacy, cudaEventDisableTiming)) !=
      cudaSuccess) {
    rc = cuda_error(e, "cudaEventCreateWithFlags", what, len);
    goto out;
  }
  if ((e = cudaMalloc((void **)&g->scratch, sizeof(float))) != cudaSuccess) {
    rc = cuda_error(e, "cudaMalloc", what, len);
    goto out;
  }
  rc = exchange_id(o, store, &id, what, len);
  if (rc < 0) goto out;
  pin_algorithm();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&g->comm, o->size, id, o->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = nccl_error(r, "ncclCommInitRankConfig", g->comm, what, len);
    abort_comm(g);
    goto out;
  }
  rc = settle(g, r, "ncclCommInitRankConfig", deadline, what, len);
out:
  if (rc < 0) {
    nccl_destroy(g);
    return rc;
  }
  *impl = g;
  return 0;
}

static int nccl_allreduce_sum_f32(void *impl, float *buf, size_t n,
                                  char *what, size_t len) {
  nccl_group_t *g = impl;
  int rc = usable(g, what, len);
  if (rc == 0) rc = prepare(g, "ncclAllReduce", what, len);
  if (rc < 0) return rc;
  ncclResult_t r =
      ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, g->comm, g->stream);
  return finish(g, r, "ncclAllReduce", what, len);
}

static int nccl_broadcast(void *impl, void *buf, size_t bytes, int root,
                          char *what, size_t len) {
  nccl_group_t *g = impl;
  int rc = usable(g, what, len);
  if (rc == 0) rc = prepare(g, "ncclBroadcast", what, len);
  if (rc < 0) return rc;
  ncclResult_t r =
      ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->comm, g->stream);
  return finish(g, r, "ncclBroadcast", what, len);
}

static int nccl_allgather(void *impl, const void *in, size_t bytes_each,
                          void *out, char *what, size_t len) {
  nccl_group_t *g = impl;
  int rc = usable(g, what, len);
  if (rc == 0) rc = prepare(g, "ncclAllGather", what, len);
  if (rc < 0) return rc;
  char *mine = (char *)out + (size_t)g->rank * bytes_each;
  if (g->size == 1) {
    if (in == mine) return 0;
    cudaError_t e = cudaMemcpyAsync(mine, in, bytes_each,
                                    cudaMemcpyDeviceToDevice, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaMemcpyAsync", what, len);
  }
  ncclResult_t r =
      ncclAllGather(in, out, bytes_each, ncclUint8, g->comm, g->stream);
  return finish(g, r, "ncclAllGather", what, len);
}

/* One ncclSend and one ncclRecv per peer in a group call (NCCL runs them
 * concurrently), including this rank's own block: NCCL pairs a send and a
 * recv to self, and zero counts are legal.  NCCL does not compare the
 * counts of a pair, so *in_step stays 0: see coll.h. */
static int nccl_alltoallv(void *impl, const void *send, const size_t *sbytes,
                          void *recv, const size_t *rbytes, int *in_step,
                          char *what, size_t len) {
  nccl_group_t *g = impl;
  *in_step = 0;
  int rc = usable(g, what, len);
  if (rc == 0) rc = prepare(g, "ncclSend/ncclRecv", what, len);
  if (rc < 0) return rc;
  const char *in = send;
  char *out = recv;
  if (g->size == 1) {
    if (sbytes[0] != rbytes[0]) {
      snprintf(what, len, "size mismatch: the own block is %zu bytes to send "
               "but %zu to receive", sbytes[0], rbytes[0]);
      *in_step = 1;
      return -EINVAL;
    }
    if (sbytes[0] == 0) return 0;
    cudaError_t e = cudaMemcpyAsync(out, in, sbytes[0],
                                    cudaMemcpyDeviceToDevice, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? 0 : cuda_error(e, "cudaMemcpyAsync", what, len);
  }
  ncclResult_t r = ncclGroupStart();
  const char *call = "ncclGroupStart";
  if (r != ncclSuccess) return finish(g, r, call, what, len);
  size_t soff = 0, roff = 0;
  for (int p = 0; p < g->size && (r == ncclSuccess || r == ncclInProgress);
       p++) {
    /* NULL stays NULL when everything is empty (NCCL accepts it for 0). */
    r = ncclSend(in ? in + soff : NULL, sbytes[p], ncclUint8, p, g->comm,
                 g->stream);
    call = "ncclSend";
    if (r == ncclSuccess || r == ncclInProgress) {
      r = ncclRecv(out ? out + roff : NULL, rbytes[p], ncclUint8, p, g->comm,
                   g->stream);
      call = "ncclRecv";
    }
    soff += sbytes[p];
    roff += rbytes[p];
  }
  /* Close the group even after a failed enqueue, then report the first
   * failure; a non-blocking communicator may answer ncclInProgress. */
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) {
    r = end;
    call = "ncclGroupEnd (alltoallv)";
  }
  return finish(g, r, call, what, len);
}

static int nccl_barrier(void *impl, char *what, size_t len) {
  nccl_group_t *g = impl;
  int rc = usable(g, what, len);
  if (rc == 0) rc = prepare(g, "ncclAllReduce (barrier)", what, len);
  if (rc < 0) return rc;
  ncclResult_t r = ncclAllReduce(g->scratch, g->scratch, 1, ncclFloat,
                                 ncclSum, g->comm, g->stream);
  return finish(g, r, "ncclAllReduce (barrier)", what, len);
}

const coll__backend_t coll__nccl_backend = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .allreduce_sum_f32 = nccl_allreduce_sum_f32,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .barrier = nccl_barrier,
    .alltoallv = nccl_alltoallv,
};

#endif /* CHANTER_CUDA */
