/*
 * daemon: what every chanter daemon does around its own service.
 *
 * One libuv loop, one gRPC server on it, a Prometheus registry served over
 * HTTP, systemd readiness and watchdog, and SIGTERM/SIGINT handling that
 * stops accepting, lets in-flight calls finish (a drain deadline from the
 * configuration), and returns from daemon_run() so main() can close its
 * stores.  main() of each daemon is then: parse config, daemon_init, add its
 * service, daemon_start, daemon_run, close its own things, daemon_close.
 */
#ifndef CHANTER_DAEMON_H
#define CHANTER_DAEMON_H

#include <uv.h>

#include "cfg.h"
#include "metrics.h"
#include "rpc.h"

typedef struct daemon_s {
  const char *name;          /* "chanter-embedding" */
  const cfg_t *cfg;
  uv_loop_t *loop;
  rpc_server_t *server;
  metrics_registry_t *reg;
  metrics_http_t *http;
  uv_signal_t sigterm, sigint;
  int stopping;
  int drain_ms;
  char listen[256];
  char status[256];          /* STATUS= line once serving */
} daemon_t;

/* TLS options of the job (tls.*), for a server or a client; NULL fields
 * when plaintext.  The strings point into cfg. */
void daemon_tls(const cfg_t *cfg, rpc_tls_t *out, int server);

/* Creates the loop (the default loop), the RPC server on listen and the
 * metrics registry "<metrics_prefix>_...".  0 or an error (logged). */
int daemon_init(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                const char *metrics_prefix);

/* Starts serving: binds (a clear error if the address is in use), starts
 * the metrics endpoint on metrics_port (or RPC port + port_offset when
 * metrics_port < 0; port 0 = any), signals, watchdog; writes ready_file
 * (JSON: pid, address, rpc_port, metrics_port, then extra_json fields if
 * given, e.g. "\"shard\": 1"), and tells systemd READY=1 and status. */
int daemon_start(daemon_t *d, int metrics_port, int port_offset, const char *ready_file, const char *extra_json,
                 const char *status);

/* Runs the loop until a signal has drained the server.  Returns 0. */
int daemon_run(daemon_t *d);

/* Frees what daemon_init made (safe after a failed init/start). */
void daemon_close(daemon_t *d);

#endif
