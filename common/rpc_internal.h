/*
 * rpc_internal: what rpc.c, rpc_server.c (with rpc_call.c) and rpc_client.c
 * share and nobody else uses: completion-queue tags, packing protobuf-c
 * messages into gRPC byte buffers and back, TLS file loading, channel
 * arguments and deadlines.
 */
#ifndef CHANTER_RPC_INTERNAL_H
#define CHANTER_RPC_INTERNAL_H

#include "rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stddef.h>

#define RPC__DEFAULT_MAX_MESSAGE ((size_t)256 << 20)
#define RPC__DEFAULT_UNARY_TIMEOUT_MS 30000

#define rpc__container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* Every tag handed to a completion queue points at one of these; the
 * thread that dequeues it calls fn(tag, ok). */
typedef struct rpc__tag_s rpc__tag_t;
struct rpc__tag_s {
  void (*fn)(rpc__tag_t *tag, int ok);
};

/* A new byte buffer holding msg packed (caller destroys it); NULL if out
 * of memory. */
grpc_byte_buffer *rpc__pack(const ProtobufCMessage *msg);
/* A new byte buffer holding a copy of n bytes at p. */
grpc_byte_buffer *rpc__bytes(const void *p, size_t n);
/* Unpacks bb as a desc message (caller frees it with
 * protobuf_c_message_free_unpacked); NULL if it does not parse.  *nbytes
 * gets the payload size either way.  bb stays the caller's. */
ProtobufCMessage *rpc__unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                              size_t *nbytes);

/* Reads a whole PEM file into a malloc'd NUL-terminated string.  Returns 0,
 * -errno when it cannot be read, ERR_TLS when it holds no PEM block; each
 * failure is logged with the file name and what it was for. */
int rpc__read_pem(const char *what, const char *path, char **out);

/* Fills st (if not NULL) with code and the text of details. */
void rpc__set_status(rpc_status_t *st, int code, const grpc_slice *details);
void rpc__set_status_str(rpc_status_t *st, int code, const char *msg);

/* max_message_bytes as a channel-arg int: 0 => default, capped at INT_MAX. */
int rpc__max_msg(size_t n);

/* Absolute deadline timeout_ms from now; timeout_ms <= 0 => infinite. */
gpr_timespec rpc__deadline(int64_t timeout_ms);

/* rpc_global_init/shutdown bookkeeping for the client poller. */
void rpc__client_poller_stop(void);

#endif
