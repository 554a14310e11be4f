/* daemon: see daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "sdn.h"

void daemon_tls(const cfg_t *cfg, rpc_tls_t *out, int server) {
  memset(out, 0, sizeof *out);
  const char *ca = cfg_str(cfg, "tls.ca_file"), *cert = cfg_str(cfg, "tls.cert_file"),
             *key = cfg_str(cfg, "tls.key_file"), *name = cfg_str(cfg, "tls.server_name");
  out->ca_file = *ca ? ca : NULL;
  out->cert_file = *cert ? cert : NULL;
  out->key_file = *key ? key : NULL;
  if (server)
    out->require_client_cert = *cert && cfg_bool(cfg, "tls.require_client_cert");
  else
    out->server_name_override = *name ? name : NULL;
}

int daemon_init(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                const char *metrics_prefix) {
  memset(d, 0, sizeof *d);
  d->name = name;
  d->cfg = cfg;
  d->drain_ms = drain_ms;
  snprintf(d->listen, sizeof d->listen, "%s", listen);
  d->loop = uv_default_loop();
  int rc = rpc_global_init();
  if (rc) return rc;
  rpc_server_opts_t ro = {.listen = d->listen, .max_message_bytes = (size_t)cfg_int(cfg, "rpc.max_message_mb") << 20};
  daemon_tls(cfg, &ro.tls, 1);
  if ((rc = rpc_server_create(d->loop, &ro, &d->server)) != 0) {
    log_error("cannot create the RPC server listen=%s: %s", d->listen, err_str(rc));
    return rc;
  }
  if ((rc = metrics_registry_create(metrics_prefix, &d->reg)) != 0) return rc;
  return 0;
}

static void on_drained(rpc_server_t *s, void *ud) {
  daemon_t *d = ud;
  log_info("drained; stopping");
  rpc_server_destroy(s); /* closes its handles so that uv_run can return */
  d->server = NULL;
  uv_signal_stop(&d->sigterm);
  uv_signal_stop(&d->sigint);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  sdn_watchdog_stop();
}

static void on_signal(uv_signal_t *h, int signum) {
  daemon_t *d = h->data;
  if (d->stopping++) {
    log_warn("second signal while draining; still waiting for in-flight calls inflight=%llu",
             (unsigned long long)rpc_server_inflight(d->server));
    return;
  }
  log_info("stopping signal=%d inflight=%llu drain_ms=%d", signum, (unsigned long long)rpc_server_inflight(d->server),
           d->drain_ms);
  sdn_stopping();
  rpc_server_shutdown(d->server, d->drain_ms, on_drained, d);
}

static int port_of(const char *addr) {
  const char *c = strrchr(addr, ':');
  return c ? atoi(c + 1) : -1;
}

static int write_ready_file(daemon_t *d, const char *path, const char *extra) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -errno;
  fprintf(f, "{\"pid\": %d, \"address\": \"%s\", \"rpc_port\": %d, \"metrics_port\": %d%s%s}\n", (int)getpid(),
          d->listen, rpc_server_port(d->server), d->http ? metrics_http_port(d->http) : 0, extra ? ", " : "",
          extra ? extra : "");
  if (fclose(f) != 0) return -errno;
  return rename(tmp, path) ? -errno : 0;
}

int daemon_start(daemon_t *d, int metrics_port, int port_offset, const char *ready_file, const char *extra_json,
                 const char *status) {
  int rc = rpc_server_start(d->server);
  if (rc) {
    log_error("cannot listen on %s (address in use, or not an address of this host?)", d->listen);
    return rc;
  }
  int port = rpc_server_port(d->server);
  if (metrics_port < 0) metrics_port = (port_offset == 0 || port_of(d->listen) == 0) ? 0 : port + port_offset;
  if (metrics_http_start(d->reg, "127.0.0.1", metrics_port, &d->http)) {
    log_warn("metrics endpoint not started port=%d (in use?); serving without it", metrics_port);
    d->http = NULL;
  }
  uv_signal_init(d->loop, &d->sigterm);
  uv_signal_init(d->loop, &d->sigint);
  d->sigterm.data = d->sigint.data = d;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  sdn_watchdog_start(d->loop);
  if (ready_file && (rc = write_ready_file(d, ready_file, extra_json)) != 0)
    log_warn("cannot write ready file path=%s err=\"%s\"", ready_file, err_str(rc));
  snprintf(d->status, sizeof d->status, "%s", status ? status : "serving");
  sdn_ready();
  sdn_status("%s on port %d", d->status, port);
  return 0;
}

int daemon_run(daemon_t *d) {
  uv_run(d->loop, UV_RUN_DEFAULT);
  return 0;
}

void daemon_close(daemon_t *d) {
  if (d->server) {
    rpc_server_destroy(d->server);
    d->server = NULL;
  }
  if (d->loop) uv_run(d->loop, UV_RUN_NOWAIT); /* let handles close */
  if (d->http) metrics_http_stop(d->http);
  d->http = NULL;
  if (d->reg) metrics_registry_destroy(d->reg);
  d->reg = NULL;
  if (d->loop) {
    rpc_global_shutdown();
    uv_loop_close(d->loop);
    d->loop = NULL;
  }
}
