/* err: descriptions and gRPC mapping for the project's error codes. */
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

int err_set(char *err, size_t n, int rc, const char *fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
  }
  return rc;
}

const char *err_str(int err) {
  if (err == 0) return "ok";
  switch (err) {
#define ERR_CASE(name, val, gs, msg) \
  case name:                         \
    return msg;
    ERR_MAP(ERR_CASE)
#undef ERR_CASE
  default:
    break;
  }
  if (err < 0 && err > -4096) return strerror(-err);
  return "unknown error";
}

int err_grpc_status(int err) {
  switch (err) {
  case 0: return 0;
#define ERR_GS(name, val, gs, msg) \
  case name:                       \
    return gs;
    ERR_MAP(ERR_GS)
#undef ERR_GS
  case -EINVAL: case -ERANGE: case -E2BIG: return 3;   /* INVALID_ARGUMENT */
  case -ENOENT: return 5;                              /* NOT_FOUND */
  case -EEXIST: return 6;                              /* ALREADY_EXISTS */
  case -ENOMEM: case -ENOSPC: return 8;                /* RESOURCE_EXHAUSTED */
  case -EBUSY: case -EAGAIN: return 14;                /* UNAVAILABLE */
  case -ETIMEDOUT: return 4;                           /* DEADLINE_EXCEEDED */
  case -ECANCELED: return 1;                           /* CANCELLED */
  case -EPERM: case -EACCES: return 7;                 /* PERMISSION_DENIED */
  default: return 13;                                  /* INTERNAL */
  }
}

int err_from_grpc_status(int status) {
  switch (status) {
  case 0: return 0;
  case 1: return ERR_CANCELLED;
  case 3: return -EINVAL;
  case 4: return ERR_DEADLINE;
  case 5: return ERR_NOTFOUND;
  case 6: return ERR_EXISTS;
  case 7: return -EACCES;
  case 8: return -ENOMEM;
  case 9: return ERR_PRECONDITION; /* the status message says which (a layout mismatch, a job state) */
  case 14: return ERR_UNAVAILABLE;
  case 16: return ERR_TLS;
  default: return ERR_RPC;
  }
}
