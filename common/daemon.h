/*
 * daemon: what every chanter daemon does around its own service.
 *
 * One libuv loop, one gRPC server on it, a Prometheus registry served over
 * HTTP, systemd readiness and watchdog, and SIGTERM/SIGINT handling that
 * stops accepting, lets in-flight calls finish (a drain deadline from the
 * configuration), and returns from daemon_run() so main() can close its
 * stores.  main() of each daemon is then: daemon_parse_args, daemon_init,
 * add its service, daemon_start, daemon_run, close its own things,
 * daemon_close, daemon_args_close.
 *
 * A daemon that serves no RPC (the trainer: its work is a training loop on
 * its own thread) passes listen = NULL to daemon_init and sets stop_cb: the
 * first signal calls stop_cb instead of draining a server, and the daemon
 * calls daemon_done() on the loop thread once its work has returned.  A
 * daemon with a server may set stop_cb too: it runs first, then the drain
 * (after linger_ms, which stop_cb may set).
 */
#ifndef CHANTER_DAEMON_H
#define CHANTER_DAEMON_H

#include <stdio.h>
#include <uv.h>

#include "cfg.h"
#include "metrics.h"
#include "rpc.h"

/* ---- command line: the options every daemon shares
 *
 *   --config FILE, --set key=value  the job (cfg_parse_args)
 *   --listen HOST:PORT              the RPC address (not with DAEMON_ARGS_NO_LISTEN)
 *   --metrics-port P                the Prometheus port
 *   --ready-file PATH               the JSON file written once serving
 *   --help                          the daemon's usage on stdout, exit 0
 *
 * and the daemon's own options (--index, --shard, --rank, ...) as a table. */

/* Parses one option's argument into out: 0, or a negative error after
 * logging why (the daemon then exits 1). */
typedef int (*daemon_opt_cb)(const char *arg, void *out);

/* One option of the daemon's own, "--name ARG"; a table of them ends with
 * a {NULL} entry. */
typedef struct daemon_opt_s {
  const char *name;  /* "shard", without the dashes */
  daemon_opt_cb parse;
  void *out;
} daemon_opt_t;

/* Ready-made parsers: atoi() into an int; the argument itself into a
 * const char * (pointing into argv). */
int daemon_opt_int(const char *arg, void *out);
int daemon_opt_str(const char *arg, void *out);

/* daemon_parse_args's flags. */
#define DAEMON_ARGS_NO_LISTEN 1u /* the daemon serves no RPC: no --listen */

typedef struct daemon_args_s {
  cfg_t *cfg;             /* the job; owned (daemon_args_close frees it) */
  const char *listen;     /* --listen, or NULL; points into argv */
  const char *ready_file; /* --ready-file, or NULL; points into argv */
  int metrics_port;       /* --metrics-port, or -1 */
  int help;               /* --help printed the usage: exit 0 */
} daemon_args_t;

/* Reads the job (--config, --set: "bad configuration: ..." on an error),
 * sets the log level from it, then the shared options and opts (may be
 * NULL).  usage(f) prints the daemon's usage: on stdout for --help, on
 * stderr after a bad option or a stray argument.  Returns 0 (run, or exit 0
 * when a->help), or a negative error, logged except -ENOMEM from
 * cfg_create (exit 1); in both cases call daemon_args_close.  Main thread,
 * once (getopt). */
int daemon_parse_args(daemon_args_t *a, int argc, char **argv, unsigned flags, const daemon_opt_t *opts,
                      void (*usage)(FILE *f));

/* Frees what daemon_parse_args made (the configuration). */
void daemon_args_close(daemon_args_t *a);

/* ---- the daemon */

typedef struct daemon_s daemon_t;

/* Called on the loop thread at the first SIGTERM/SIGINT (after systemd is
 * told STOPPING=1, before a server starts draining). */
typedef void (*daemon_stop_cb)(daemon_t *d, int signum, void *data);

struct daemon_s {
  const char *name;          /* "chanter-embedding" */
  const cfg_t *cfg;
  uv_loop_t *loop;
  rpc_server_t *server;
  metrics_registry_t *reg;
  metrics_counter_t *denied; /* rpc_denied_total, from rpc_server_denied at each scrape */
  metrics_http_t *http;
  uv_signal_t sigterm, sigint;
  int stopping;
  int drain_ms;
  char listen[256];
  char status[256];          /* STATUS= line once serving */
  int serves_rpc;            /* daemon_init was given an address */
  daemon_stop_cb stop_cb;    /* set before daemon_start; NULL: none */
  void *stop_data;
  /* after the first signal, keep serving this long before draining (the
   * oracle: trainers that missed StopWork learn from a heartbeat that the
   * job is over); 0: drain at once */
  int linger_ms;
  uv_timer_t linger;
};

/* The role this process presents to its peers: the {role} of
 * tls.cert_file and tls.key_file, and what authorization (authz.h) checks.
 * "admin" until set: the chanter CLI; daemon_init sets it from the
 * daemon's name ("chanter-trainer" -> "trainer").  Before any channel. */
void daemon_set_role(const char *role);
const char *daemon_role(void);

/* TLS options of the job (tls.*), for a server or a client; NULL fields
 * when plaintext.  {role} in tls.cert_file / tls.key_file becomes
 * daemon_role(); the strings point into cfg or into per-thread buffers
 * that the next call on this thread reuses (rpc_tls_t's strings are read
 * when the server or channel is created and not kept). */
void daemon_tls(const cfg_t *cfg, rpc_tls_t *out, int server);

/* Creates the loop (the default loop), the RPC server on listen (none when
 * listen is NULL: a daemon that serves no RPC) and the metrics registry
 * "<metrics_prefix>_...".  With TLS the server checks every caller's role
 * (authz.h; refusals counted in <prefix>_rpc_denied_total); without it a
 * listen address that is not loopback is refused unless tls.insecure.
 * 0 or an error (logged). */
int daemon_init(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                const char *metrics_prefix);

/* daemon_init, with the largest request the server accepts (0: as
 * daemon_init, rpc.max_message_mb; never more than it): a daemon whose
 * requests are bounded by its own limits passes their largest, so that gRPC
 * refuses anything bigger before reading it. */
int daemon_init_max_receive(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                            const char *metrics_prefix, size_t max_receive_bytes);

/* Starts serving: binds (a clear error if the address is in use), starts
 * the metrics endpoint on metrics_port (or RPC port + port_offset when
 * metrics_port < 0; port 0 = any), signals, watchdog; writes ready_file
 * (JSON: pid, address, rpc_port, metrics_port, then extra_json fields if
 * given, e.g. "\"shard\": 1"; without a server: pid, rpc_port 0,
 * metrics_port, extra_json) -- the one ready-file writer -- and tells
 * systemd READY=1 and status ("<status> on port N" with a server). */
int daemon_start(daemon_t *d, int metrics_port, int port_offset, const char *ready_file, const char *extra_json,
                 const char *status);

/* Runs the loop until a signal has drained the server (or, without one,
 * until daemon_done).  Returns 0. */
int daemon_run(daemon_t *d);

/* Closes the daemon's own handles (signals, watchdog) so that daemon_run
 * can return once the daemon's other handles are closed too.  The drained
 * server calls it; a daemon without a server calls it when its work has
 * ended.  Loop thread. */
void daemon_done(daemon_t *d);

/* Frees what daemon_init made (safe after a failed init/start). */
void daemon_close(daemon_t *d);

#endif
