/*
 * rpc: process-wide gRPC setup and the helpers the server and the client
 * halves share (message packing, TLS files, method paths).  The server
 * lives in rpc_server.c, the client in rpc_client.c; rpc.h explains the
 * threading of both.
 */
#include "rpc_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <grpc/support/log.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;

/* gRPC's own log lines (peers failing TLS handshakes, transport errors) go
 * through log.h like ours, so journald files them with a priority.  They
 * are mostly about peers, hence an ERROR of gRPC is our warning. */
static void grpc_log_cb(gpr_log_func_args *a) {
  const char *file = strrchr(a->file, '/');
  int prio = a->severity == GPR_LOG_SEVERITY_ERROR  ? LOG_WARN
             : a->severity == GPR_LOG_SEVERITY_INFO ? LOG_INFO
                                                     : LOG_DEBUG;
  log_at(prio, "grpc: %s src=%s:%d", a->message, file ? file + 1 : a->file, a->line);
}

/* gRPC drives a connection attempt from the pollsets of the calls waiting
 * on it.  Our blocking calls each poll a completion queue of their own and
 * fail fast while the peer is down, so once one has given up, the next
 * attempt's socket events (the TCP connect, the TLS handshake) are seen
 * only by gRPC's backup poller, every 5 s by default (grpc/grpc#28866):
 * `chanter train` took 15 s to reach an oracle restarted in 0.5 s.  Every
 * RPC_BACKUP_POLL_MS instead, unless the environment says otherwise; read
 * once, by the process's first grpc_init. */
#define RPC_BACKUP_POLL_ENV "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS"
#define RPC_BACKUP_POLL_MS "100"

int rpc_global_init(void) {
  pthread_mutex_lock(&g_mu);
  if (g_refs == 0) {
    gpr_set_log_function(grpc_log_cb);
    setenv(RPC_BACKUP_POLL_ENV, RPC_BACKUP_POLL_MS, 0); /* 0: a value already there stays */
  }
  if (g_refs++ == 0) grpc_init();
  pthread_mutex_unlock(&g_mu);
  return 0;
}

void rpc_global_shutdown(void) {
  pthread_mutex_lock(&g_mu);
  ASSERT(g_refs > 0);
  if (--g_refs == 0) {
    rpc__client_poller_stop();
    /* Synchronous when called from a non-gRPC thread: by the time it
     * returns gRPC's own threads and globals are gone. */
    grpc_shutdown();
  }
  pthread_mutex_unlock(&g_mu);
}

grpc_byte_buffer *rpc__pack(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  grpc_slice s = grpc_slice_malloc(n);
  size_t w = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  ASSERT_OP(w, ==, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

grpc_byte_buffer *rpc__bytes(const void *p, size_t n) {
  grpc_slice s = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

ProtobufCMessage *rpc__unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                              size_t *nbytes) {
  grpc_byte_buffer_reader r;
  ProtobufCMessage *m = NULL;
  *nbytes = grpc_byte_buffer_length(bb);
  /* One uncompressed slice (small messages): parse in place. */
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    grpc_slice s = bb->data.raw.slice_buffer.slices[0];
    return protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  }
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL; /* bad compression */
  grpc_slice all = grpc_byte_buffer_reader_readall(&r);
  *nbytes = GRPC_SLICE_LENGTH(all);
  m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  grpc_slice_unref(all);
  grpc_byte_buffer_reader_destroy(&r);
  return m;
}

int rpc__read_pem(const char *what, const char *path, char **out) {
  int err = 0;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  FILE *f = fopen(path, "rb");
  *out = NULL;
  if (!f) {
    err = -errno;
    log_error("rpc: cannot open TLS %s file path=%s err=\"%s\"", what, path, strerror(-err));
    goto out;
  }
  for (;;) {
    if (cap - len < 4096) {
      size_t ncap = cap ? cap * 2 : 8192;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        err = -ENOMEM;
        goto out;
      }
      buf = nb;
      cap = ncap;
    }
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0) break;
  }
  if (ferror(f)) {
    err = -EIO;
    log_error("rpc: cannot read TLS %s file path=%s", what, path);
    goto out;
  }
  buf[len] = '\0';
  if (!strstr(buf, "-----BEGIN ")) {
    err = ERR_TLS;
    log_error("rpc: TLS %s file holds no PEM block path=%s", what, path);
    goto out;
  }
  *out = buf;
  buf = NULL;
out:
  if (f) fclose(f);
  free(buf);
  return err;
}

void rpc__set_status_str(rpc_status_t *st, int code, const char *msg) {
  if (!st) return;
  st->code = code;
  snprintf(st->message, sizeof st->message, "%s", msg ? msg : "");
}

void rpc__set_status(rpc_status_t *st, int code, const grpc_slice *details) {
  if (!st) return;
  size_t n = details ? GRPC_SLICE_LENGTH(*details) : 0;
  if (n >= sizeof st->message) n = sizeof st->message - 1;
  st->code = code;
  if (n) memcpy(st->message, GRPC_SLICE_START_PTR(*details), n);
  st->message[n] = '\0';
}

int rpc__max_msg(size_t n) {
  if (n == 0) n = RPC__DEFAULT_MAX_MESSAGE;
  return n > INT_MAX ? INT_MAX : (int)n;
}

gpr_timespec rpc__deadline(int64_t timeout_ms) {
  if (timeout_ms <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* Interned method paths: a list that only grows, so the strings stay valid
 * until exit and equal paths share one pointer (a daemon builds a handful). */
typedef struct path_s {
  struct path_s *next;
  char s[];
} path_t;
static pthread_mutex_t paths_mu = PTHREAD_MUTEX_INITIALIZER;
static path_t *paths;

const char *rpc_method_path(const ProtobufCServiceDescriptor *desc, const char *method) {
  const char *res = NULL;
  unsigned i;
  for (i = 0; i < desc->n_methods; i++)
    if (strcmp(desc->methods[i].name, method) == 0) break;
  if (i == desc->n_methods) return NULL;
  size_t n = strlen(desc->name) + strlen(method) + 3;
  char tmp[512];
  char *want = n <= sizeof tmp ? tmp : malloc(n);
  if (!want) return NULL;
  snprintf(want, n, "/%s/%s", desc->name, method);
  pthread_mutex_lock(&paths_mu);
  for (path_t *p = paths; p; p = p->next)
    if (strcmp(p->s, want) == 0) {
      res = p->s;
      break;
    }
  if (!res) {
    path_t *p = malloc(sizeof *p + n);
    if (p) {
      memcpy(p->s, want, n);
      p->next = paths;
      paths = p;
      res = p->s;
    }
  }
  pthread_mutex_unlock(&paths_mu);
  if (want != tmp) free(want);
  return res;
}
