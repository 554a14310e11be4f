/*
 * err: the project's error codes.
 *
 * Every function in chanter returns 0 on success or a negative number on
 * failure: either a negative errno (-EINVAL, -EIO, ...) or one of the
 * project codes below, which live above the errno range.  err_str() turns
 * either kind into a short English phrase, and err_grpc_status() is the one
 * table that maps them onto gRPC status codes at the RPC edge.
 */
#ifndef CHANTER_ERR_H
#define CHANTER_ERR_H

#include <stdio.h>
#include <stdlib.h>

/* X(name, value, grpc_status_code, message) */
#define ERR_MAP(X)                                                              \
  X(ERR_RPC,          -10001, 13, "rpc failure")                                \
  X(ERR_DEADLINE,     -10002,  4, "deadline exceeded")                          \
  X(ERR_UNAVAILABLE,  -10003, 14, "peer unavailable")                           \
  X(ERR_BADMSG,       -10004,  3, "malformed message")                          \
  X(ERR_KV,           -10005, 13, "storage engine error")                       \
  X(ERR_CONFIG,       -10006,  3, "invalid configuration")                      \
  X(ERR_LAYOUT,       -10007,  9, "table layout mismatch")                      \
  X(ERR_NOTFOUND,     -10008,  5, "not found")                                  \
  X(ERR_EXISTS,       -10009,  6, "already exists")                             \
  X(ERR_WRONGSHARD,   -10010,  9, "key routed to the wrong shard")              \
  X(ERR_CANCELLED,    -10011,  1, "cancelled")                                  \
  X(ERR_SHUTDOWN,     -10012, 14, "shutting down")                              \
  X(ERR_TLS,          -10013, 16, "TLS credentials rejected")                   \
  X(ERR_CUDA,         -10014, 13, "CUDA failure")                               \
  X(ERR_NOGPU,        -10015,  9, "no CUDA device")                             \
  X(ERR_PRECONDITION, -10016,  9, "not possible in this state")

enum {
#define ERR_ENUM(name, val, gs, msg) name = val,
  ERR_MAP(ERR_ENUM)
#undef ERR_ENUM
};

/* Writes the sentence fmt, ... into err[0..n) (when err and n are given)
 * and returns rc: `return err_set(err, err_len, -EINVAL, "...", ...);` --
 * the one helper every function that reports "code + sentence" uses. */
int err_set(char *err, size_t n, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A static, never-NULL description of err (0, -errno or a project code). */
const char *err_str(int err);

/* The gRPC status code (grpc_status_code as int) that err maps to. */
int err_grpc_status(int err);

/* The project code (or -errno) for a gRPC status code; 0 for OK. */
int err_from_grpc_status(int status);

/* Always-on assertion for programmer errors: prints file, line and both
 * operands, then aborts. */
#define ASSERT(expr)                                                           \
  do {                                                                         \
    if (!(expr)) {                                                             \
      fprintf(stderr, "<2>%s:%d: assertion failed: %s\n", __FILE__, __LINE__, \
              #expr);                                                          \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define ASSERT_OP(a, op, b)                                                    \
  do {                                                                         \
    long long a_ = (long long)(a), b_ = (long long)(b);                        \
    if (!(a_ op b_)) {                                                         \
      fprintf(stderr, "<2>%s:%d: assertion failed: %s %s %s (%lld vs %lld)\n",\
              __FILE__, __LINE__, #a, #op, #b, a_, b_);                        \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#endif
