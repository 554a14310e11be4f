/*
 * coll_gloo: the Gloo backend of coll.h, and the one place where Gloo's C++
 * exceptions become our error codes.  Every entry point is noexcept and
 * catches everything (convert_exception); nothing C++ crosses into C.
 *
 * A group is a gloo::rendezvous::Context over one TCP device bound to
 * iface_addr.  It bootstraps through CStore, a gloo::rendezvous::Store that
 * forwards to the caller's coll_store_t callbacks under
 * "<prefix>/gloo/".  The collectives are Gloo's own algorithms:
 * gloo::allreduce (RING, segments of at most 1 MiB: the summation order
 * is fixed by P and n, see coll.h), gloo::broadcast (binomial tree),
 * gloo::allgather (ring), gloo::barrier (dissemination), gloo::alltoallv
 * (every pair at once, after a gloo::alltoall of the block sizes: see
 * gloo_alltoallv).  Every operation
 * carries the group's timeout, so a silent peer gives Gloo's "Timed out
 * waiting ..." IoException (ERR_DEADLINE) and a dead one a read error on
 * the socket (ERR_UNAVAILABLE).
 *
 * Errors map as: StoreError -> the store's code (ERR_DEADLINE for a key
 * that never came); any failure to create the TCP device (bind to
 * iface_addr) -> ERR_CONFIG; gloo::IoException -> ERR_DEADLINE if Gloo
 * timed out, else ERR_UNAVAILABLE; gloo::InvalidOperationException -> -EINVAL;
 * gloo::EnforceNotMet and other gloo::Exception -> ERR_RPC;
 * std::bad_alloc -> -ENOMEM; anything else -> ERR_RPC.  what() is copied
 * into the caller's buffer for coll.c's log line.
 */
#include "coll.h"
extern "C" {
#include "err.h" /* a C header without extern "C" guards */
}

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

namespace {

using ms = std::chrono::milliseconds;

/* Gloo's default ring segment, pinned here: the summation order depends on
 * it (coll.h), so a change of Gloo's default must not silently change it. */
constexpr size_t kSegmentBytes = 1 << 20;

/* A failure of the caller's store, carrying our code. */
struct StoreError : std::runtime_error {
  int rc;
  StoreError(int code, const std::string &msg)
      : std::runtime_error(msg), rc(code) {}
};

/* A bad option found by Gloo (ERR_CONFIG). */
struct ConfigError : std::runtime_error {
  explicit ConfigError(const std::string &msg) : std::runtime_error(msg) {}
};

class CStore : public gloo::rendezvous::Store {
 public:
  CStore(const coll_store_t &s, const std::string &prefix, ms timeout)
      : s_(s), prefix_(prefix + "/gloo/"), timeout_(timeout) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    const std::string k = prefix_ + key;
    int rc = s_.set(s_.ud, k.c_str(), data.data(), data.size());
    if (rc < 0)
      throw StoreError(rc, "rendezvous store: set of key '" + k +
                               "' failed: " + err_str(rc));
  }

  std::vector<char> get(const std::string &key) override {
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    return fetch(key, timeout_);
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, timeout_);
  }

  void wait(const std::vector<std::string> &keys, const ms &timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto &key : keys) {
      if (cache_.count(key)) continue;
      auto left = std::chrono::duration_cast<ms>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) left = ms(0);
      cache_[key] = fetch(key, left);
    }
  }

 private:
  std::vector<char> fetch(const std::string &key, ms timeout) {
    const std::string k = prefix_ + key;
    void *val = nullptr;
    size_t len = 0;
    int rc = s_.get(s_.ud, k.c_str(), &val, &len, timeout.count());
    if (rc < 0) {
      free(val);
      if (rc == -ETIMEDOUT) rc = ERR_DEADLINE;
      std::string who;
      if (!key.empty() &&
          key.find_first_not_of("0123456789") == std::string::npos)
        who = " (rank " + key + "'s address: has that rank started, with the "
              "same prefix and size?)";
      if (rc == ERR_DEADLINE)
        throw StoreError(rc, "rendezvous timed out after " +
                                 std::to_string(timeout_.count()) +
                                 " ms waiting for key '" + k + "'" + who);
      throw StoreError(rc, "rendezvous store: get of key '" + k +
                               "' failed: " + err_str(rc));
    }
    std::vector<char> out(static_cast<char *>(val),
                          static_cast<char *>(val) + len);
    free(val);
    return out;
  }

  coll_store_t s_;
  std::string prefix_;
  ms timeout_;
  std::map<std::string, std::vector<char>> cache_;
};

struct Group {
  int rank = 0, size = 0;
  ms timeout{0};
  uint32_t tag = 0; /* per-operation tag: same sequence on every rank */
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
};

void copy_what(char *what, size_t len, const char *msg) {
  if (what && len) snprintf(what, len, "%s", msg);
}

/* Call only inside a catch block: maps the exception in flight. */
int convert_exception(char *what, size_t len) noexcept {
  try {
    throw;
  } catch (const StoreError &e) {
    copy_what(what, len, e.what());
    return e.rc;
  } catch (const ConfigError &e) {
    copy_what(what, len, e.what());
    return ERR_CONFIG;
  } catch (const gloo::IoException &e) {
    copy_what(what, len, e.what());
    return strstr(e.what(), "Timed out") ? ERR_DEADLINE : ERR_UNAVAILABLE;
  } catch (const gloo::InvalidOperationException &e) {
    copy_what(what, len, e.what());
    return -EINVAL;
  } catch (const gloo::EnforceNotMet &e) {
    copy_what(what, len, e.what());
    return ERR_RPC;
  } catch (const gloo::Exception &e) {
    copy_what(what, len, e.what());
    return ERR_RPC;
  } catch (const std::bad_alloc &) {
    copy_what(what, len, "out of memory");
    return -ENOMEM;
  } catch (const std::exception &e) {
    copy_what(what, len, e.what());
    return ERR_RPC;
  } catch (...) {
    copy_what(what, len, "unknown C++ exception");
    return ERR_RPC;
  }
}

void sum_f32(void *c, const void *a, const void *b, size_t n) {
  float *o = static_cast<float *>(c);
  const float *x = static_cast<const float *>(a);
  const float *y = static_cast<const float *>(b);
  for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

int gloo_create(const coll_opts_t *o, const coll_store_t *store, void **impl,
                char *what, size_t what_len) noexcept {
  Group *g = nullptr;
  try {
    g = new Group;
    g->rank = o->rank;
    g->size = o->size;
    g->timeout = ms(o->timeout_ms);
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = o->iface_addr;
      g->dev = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::bad_alloc &) {
      throw;
    } catch (const std::exception &e) {
      /* Nothing remote yet: an address this host cannot listen on. */
      throw ConfigError(std::string("cannot listen on iface_addr ") +
                        o->iface_addr + ": " + e.what());
    }
    g->ctx = std::make_shared<gloo::rendezvous::Context>(o->rank, o->size);
    g->ctx->setTimeout(g->timeout);
    CStore cstore(*store, o->prefix, g->timeout);
    g->ctx->connectFullMesh(cstore, g->dev);
    *impl = g;
    return 0;
  } catch (...) {
    int rc = convert_exception(what, what_len);
    delete g;
    return rc;
  }
}

void gloo_destroy(void *impl) noexcept {
  try {
    delete static_cast<Group *>(impl);
  } catch (...) {
    /* Destructors should not throw; if Gloo's does, there is nobody to
     * tell but the log of coll.c's caller, and leaking beats terminating. */
  }
}

int gloo_allreduce_sum_f32(void *impl, float *buf, size_t n, char *what,
                           size_t what_len) noexcept {
  Group *g = static_cast<Group *>(impl);
  try {
    gloo::AllreduceOptions opts(g->ctx);
    opts.setOutput(buf, n);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(sum_f32);
    opts.setMaxSegmentSize(kSegmentBytes);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    gloo::allreduce(opts);
    return 0;
  } catch (...) {
    return convert_exception(what, what_len);
  }
}

int gloo_broadcast(void *impl, void *buf, size_t bytes, int root, char *what,
                   size_t what_len) noexcept {
  Group *g = static_cast<Group *>(impl);
  try {
    gloo::BroadcastOptions opts(g->ctx);
    opts.setOutput(static_cast<uint8_t *>(buf), bytes);
    opts.setRoot(root);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    gloo::broadcast(opts);
    return 0;
  } catch (...) {
    return convert_exception(what, what_len);
  }
}

int gloo_allgather(void *impl, const void *in, size_t bytes_each, void *out,
                   char *what, size_t what_len) noexcept {
  Group *g = static_cast<Group *>(impl);
  uint8_t *o = static_cast<uint8_t *>(out);
  uint8_t *mine = o + (size_t)g->rank * bytes_each;
  try {
    if (g->size == 1) {
      if (in != mine) memmove(mine, in, bytes_each);
      return 0;
    }
    gloo::AllgatherOptions opts(g->ctx);
    /* In place when the input already sits at this rank's slot. */
    if (in != mine)
      opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                    bytes_each);
    opts.setOutput(o, bytes_each * (size_t)g->size);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    gloo::allgather(opts);
    return 0;
  } catch (...) {
    return convert_exception(what, what_len);
  }
}

/* Gloo 0.5 cannot be trusted with a size mismatch: a block longer than the
 * receive posted for it fails a GLOO_ENFORCE on Gloo's device thread, where
 * nothing catches it -- std::terminate, the process aborts -- and a shorter
 * one completes the receive silently, its tail left stale (both seen with a
 * two-process probe).  So the sizes go first, in one round of 16 bytes per
 * pair (gloo::alltoall): rank r learns (sbytes[me], rbytes[me]) of every
 * peer and checks both directions of each pair.  The two ranks of a
 * mismatched pair both see it and agree to move 0 bytes between them; then
 * every rank runs the same gloo::alltoallv (a rank with a mismatch repacks
 * its agreed blocks into scratch buffers first, since Gloo's offsets are the
 * prefix sums of its counts, and unpacks what it got), so the tags stay in
 * step, nobody waits for a block that never comes, every agreed block
 * arrives, and *in_step tells coll.c not to latch the error.  Zero counts
 * are fine for Gloo: an empty send/recv pair is still posted and completes
 * (tested); only the pointers must not be NULL. */
int gloo_alltoallv(void *impl, const void *send, const size_t *sbytes,
                   void *recv, const size_t *rbytes, int *in_step, char *what,
                   size_t what_len) noexcept {
  Group *g = static_cast<Group *>(impl);
  const size_t P = (size_t)g->size, me = (size_t)g->rank;
  *in_step = 0;
  try {
    size_t stot = 0, rtot = 0;
    for (size_t r = 0; r < P; r++) {
      stot += sbytes[r];
      rtot += rbytes[r];
    }
    if (P == 1) {
      if (sbytes[0] != rbytes[0]) {
        snprintf(what, what_len,
                 "size mismatch: the own block is %zu bytes to send but %zu "
                 "to receive",
                 sbytes[0], rbytes[0]);
        *in_step = 1;
        return -EINVAL;
      }
      if (sbytes[0]) memcpy(recv, send, sbytes[0]);
      return 0;
    }
    /* Sizes: to peer r, (what I send it, what I expect from it). */
    std::vector<uint64_t> mine(2 * P), theirs(2 * P);
    for (size_t r = 0; r < P; r++) {
      mine[2 * r] = sbytes[r];
      mine[2 * r + 1] = rbytes[r];
    }
    {
      gloo::AlltoallOptions opts(g->ctx);
      opts.setInput(mine.data(), mine.size());
      opts.setOutput(theirs.data(), theirs.size());
      opts.setTag(g->tag++);
      opts.setTimeout(g->timeout);
      gloo::alltoall(opts);
    }
    std::vector<int64_t> scount(P), rcount(P);
    std::string bad;
    size_t nbad = 0;
    for (size_t r = 0; r < P; r++) {
      /* Peer r sends me theirs[2r] and expects theirs[2r+1] from me. */
      uint64_t out_ok = r == me ? rbytes[me] : theirs[2 * r + 1];
      uint64_t in_ok = r == me ? sbytes[me] : theirs[2 * r];
      bool ok = sbytes[r] == out_ok && rbytes[r] == in_ok;
      scount[r] = ok ? (int64_t)sbytes[r] : 0;
      rcount[r] = ok ? (int64_t)rbytes[r] : 0;
      if (!ok && nbad++ < 4) {
        char b[200];
        if (r == me)
          snprintf(b, sizeof b,
                   "%sthe own block: %zu bytes to send, %zu to receive",
                   bad.empty() ? "" : "; ", sbytes[r], rbytes[r]);
        else
          snprintf(b, sizeof b,
                   "%srank %zu: I send %zu and it expects %llu, it sends %llu "
                   "and I expect %zu",
                   bad.empty() ? "" : "; ", r, sbytes[r],
                   (unsigned long long)out_ok, (unsigned long long)in_ok,
                   rbytes[r]);
        bad += b;
      }
    }
    static uint8_t empty; /* Gloo wants a pointer even for 0 bytes */
    std::vector<uint8_t> sscratch, rscratch;
    uint8_t *in = static_cast<uint8_t *>(const_cast<void *>(send));
    uint8_t *out = static_cast<uint8_t *>(recv);
    if (nbad) { /* repack the agreed blocks (Gloo's offsets are prefix sums) */
      size_t s = 0, t = 0, so = 0;
      for (size_t r = 0; r < P; r++) {
        s += (size_t)scount[r];
        t += (size_t)rcount[r];
      }
      sscratch.resize(s);
      rscratch.resize(t);
      s = 0;
      for (size_t r = 0; r < P; so += sbytes[r], r++) {
        if (scount[r]) memcpy(sscratch.data() + s, in + so, (size_t)scount[r]);
        s += (size_t)scount[r];
      }
      in = sscratch.data();
      out = rscratch.data();
      stot = s;
      rtot = t;
    }
    if (stot == 0 || !in) in = &empty;
    if (rtot == 0 || !out) out = &empty;
    gloo::AlltoallvOptions opts(g->ctx);
    opts.setInput(in, scount);
    opts.setOutput(out, rcount);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    gloo::alltoallv(opts);
    if (nbad) { /* the agreed blocks to their places; the others untouched */
      uint8_t *dst = static_cast<uint8_t *>(recv);
      size_t ro = 0, t = 0;
      for (size_t r = 0; r < P; ro += rbytes[r], r++) {
        if (rcount[r]) memcpy(dst + ro, rscratch.data() + t, (size_t)rcount[r]);
        t += (size_t)rcount[r];
      }
      snprintf(what, what_len, "size mismatch with %zu rank%s (nothing moved "
               "with %s): %s%s", nbad, nbad == 1 ? "" : "s",
               nbad == 1 ? "it" : "them", bad.c_str(), nbad > 4 ? "; ..." : "");
      *in_step = 1;
      return -EINVAL;
    }
    return 0;
  } catch (...) {
    return convert_exception(what, what_len);
  }
}

int gloo_barrier(void *impl, char *what, size_t what_len) noexcept {
  Group *g = static_cast<Group *>(impl);
  try {
    gloo::BarrierOptions opts(g->ctx);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    gloo::barrier(opts);
    return 0;
  } catch (...) {
    return convert_exception(what, what_len);
  }
}

} // namespace

extern "C" const coll__backend_t coll__gloo_backend = {
    "gloo",          gloo_create,    gloo_destroy,  gloo_allreduce_sum_f32,
    gloo_broadcast,  gloo_allgather, gloo_barrier,  gloo_alltoallv,
};
