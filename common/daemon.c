/* daemon: see daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fsio.h"
#include "log.h"
#include "sbuf.h"
#include "sdn.h"

/* ---- command line */

int daemon_opt_int(const char *arg, void *out) {
  *(int *)out = atoi(arg);
  return 0;
}

int daemon_opt_str(const char *arg, void *out) {
  *(const char **)out = arg;
  return 0;
}

enum { OPT_LISTEN = 'l', OPT_METRICS_PORT = 'm', OPT_READY_FILE = 'r', OPT_HELP = 'h', OPT_OWN = 256 };

int daemon_parse_args(daemon_args_t *a, int argc, char **argv, unsigned flags, const daemon_opt_t *opts,
                      void (*usage)(FILE *f)) {
  char err[1024];
  struct option *lo = NULL;
  size_t n_own = 0, n = 0;
  int rc;
  memset(a, 0, sizeof *a);
  a->metrics_port = -1;
  if (cfg_create(&a->cfg)) return -ENOMEM;
  if ((rc = cfg_parse_args(a->cfg, &argc, argv, err, sizeof err)) != 0) {
    log_error("bad configuration: %s", err);
    return rc < 0 ? rc : ERR_CONFIG;
  }
  log_set_level_str(cfg_str(a->cfg, "log_level"));
  while (opts && opts[n_own].name) n_own++;
  if (!(lo = calloc(n_own + 5, sizeof *lo))) return -ENOMEM;
  for (size_t i = 0; i < n_own; i++) lo[n++] = (struct option){opts[i].name, required_argument, 0, OPT_OWN + (int)i};
  if (!(flags & DAEMON_ARGS_NO_LISTEN)) lo[n++] = (struct option){"listen", required_argument, 0, OPT_LISTEN};
  lo[n++] = (struct option){"metrics-port", required_argument, 0, OPT_METRICS_PORT};
  lo[n++] = (struct option){"ready-file", required_argument, 0, OPT_READY_FILE};
  lo[n++] = (struct option){"help", no_argument, 0, OPT_HELP};
  int c;
  rc = 0;
  while (!rc && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case OPT_LISTEN: a->listen = optarg; break;
    case OPT_METRICS_PORT: a->metrics_port = atoi(optarg); break;
    case OPT_READY_FILE: a->ready_file = optarg; break;
    case OPT_HELP:
      usage(stdout);
      a->help = 1;
      goto out;
    default:
      if (c >= OPT_OWN && c < OPT_OWN + (int)n_own) {
        rc = opts[c - OPT_OWN].parse(optarg, opts[c - OPT_OWN].out);
        break;
      }
      usage(stderr); /* getopt said what was wrong */
      rc = -EINVAL;
      goto out;
    }
  }
  if (!rc && optind < argc) {
    log_error("unexpected argument '%s'", argv[optind]);
    usage(stderr);
    rc = -EINVAL;
  }
out:
  free(lo);
  return rc;
}

void daemon_args_close(daemon_args_t *a) {
  cfg_destroy(a->cfg);
  a->cfg = NULL;
}

/* ---- the daemon */

static char g_role[32] = "admin";

void daemon_set_role(const char *role) { snprintf(g_role, sizeof g_role, "%s", role ? role : "admin"); }
const char *daemon_role(void) { return g_role; }

/* path with each {role} replaced by the process's role, in out. */
static const char *with_role(const char *path, char *out, size_t n) {
  if (!strstr(path, "{role}")) return path;
  cfg_path_expand(path, g_role, -1, out, n);
  return out;
}

void daemon_tls(const cfg_t *cfg, rpc_tls_t *out, int server) {
  static _Thread_local char cert_buf[4096], key_buf[4096];
  memset(out, 0, sizeof *out);
  const char *ca = cfg_str(cfg, "tls.ca_file"), *name = cfg_str(cfg, "tls.server_name");
  const char *cert = with_role(cfg_str(cfg, "tls.cert_file"), cert_buf, sizeof cert_buf),
             *key = with_role(cfg_str(cfg, "tls.key_file"), key_buf, sizeof key_buf);
  out->ca_file = *ca ? ca : NULL;
  out->cert_file = *cert ? cert : NULL;
  out->key_file = *key ? key : NULL;
  if (server)
    out->require_client_cert = *cert && cfg_bool(cfg, "tls.require_client_cert");
  else
    out->server_name_override = *name ? name : NULL;
}

static void collect_denied(void *ud) {
  daemon_t *d = ud;
  uint64_t now = rpc_server_denied(d->server), had = metrics_counter_value(d->denied);
  if (d->denied && now > had) metrics_counter_add(d->denied, now - had);
}

int daemon_init(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                const char *metrics_prefix) {
  return daemon_init_max_receive(d, name, cfg, listen, drain_ms, metrics_prefix, 0);
}

int daemon_init_max_receive(daemon_t *d, const char *name, const cfg_t *cfg, const char *listen, int drain_ms,
                            const char *metrics_prefix, size_t max_receive_bytes) {
  memset(d, 0, sizeof *d);
  d->name = name;
  if (name && !strncmp(name, "chanter-", 8)) daemon_set_role(name + 8);
  d->cfg = cfg;
  d->drain_ms = drain_ms;
  snprintf(d->listen, sizeof d->listen, "%s", listen ? listen : "");
  d->loop = uv_default_loop();
  int rc;
  if (listen) {
    if ((rc = rpc_global_init()) != 0) return rc;
    d->serves_rpc = 1;
    size_t max = (size_t)cfg_int(cfg, "rpc.max_message_mb") << 20;
    rpc_server_opts_t ro = {.listen = d->listen,
                            .max_message_bytes = max,
                            .max_receive_bytes = max_receive_bytes && max_receive_bytes < max ? max_receive_bytes : 0};
    daemon_tls(cfg, &ro.tls, 1);
    ro.authorize = ro.tls.require_client_cert;
    if (!ro.tls.cert_file && !cfg_bool(cfg, "tls.insecure") && !cfg_addr_loopback(d->listen)) {
      log_error("refusing to listen on %s in plaintext: it is not a loopback address and the job has no "
                "certificates (tls.ca_file, tls.cert_file, tls.key_file; see `chanter certs`); set tls.insecure = "
                "true to run plaintext on a network you trust",
                d->listen);
      return ERR_CONFIG;
    }
    if (ro.tls.cert_file && !ro.tls.require_client_cert)
      log_warn("TLS without client certificates (tls.require_client_cert = false): any client reaches every "
               "method; roles are not checked");
    if ((rc = rpc_server_create(d->loop, &ro, &d->server)) != 0) {
      log_error("cannot create the RPC server listen=%s: %s", d->listen, err_str(rc));
      return rc;
    }
  }
  if ((rc = metrics_registry_create(metrics_prefix, &d->reg)) != 0) {
    log_error("cannot create the metrics registry: %s", err_str(rc));
    return rc;
  }
  if (d->server) {
    d->denied = metrics_counter(d->reg, "rpc_denied_total", NULL,
                                "calls refused PERMISSION_DENIED: the caller's certificate names a role the method "
                                "does not allow (the log says which)");
    metrics_registry_on_collect(d->reg, collect_denied, d);
  }
  return 0;
}

void daemon_done(daemon_t *d) {
  uv_signal_stop(&d->sigterm);
  uv_signal_stop(&d->sigint);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  sdn_watchdog_stop();
}

static void on_drained(rpc_server_t *s, void *ud) {
  daemon_t *d = ud;
  log_info("drained; stopping");
  rpc_server_destroy(s); /* closes its handles so that uv_run can return */
  d->server = NULL;
  daemon_done(d);
}

static void on_linger(uv_timer_t *t) {
  daemon_t *d = t->data;
  uv_close((uv_handle_t *)t, NULL);
  rpc_server_shutdown(d->server, d->drain_ms, on_drained, d);
}

static void on_signal(uv_signal_t *h, int signum) {
  daemon_t *d = h->data;
  if (d->stopping++) {
    if (d->serves_rpc)
      log_warn("second signal while draining; still waiting for in-flight calls inflight=%llu",
               (unsigned long long)rpc_server_inflight(d->server));
    else
      log_warn("second signal while stopping signal=%d", signum);
    return;
  }
  if (d->serves_rpc)
    log_info("stopping signal=%d inflight=%llu drain_ms=%d", signum,
             (unsigned long long)rpc_server_inflight(d->server), d->drain_ms);
  sdn_stopping();
  if (d->stop_cb) d->stop_cb(d, signum, d->stop_data);
  if (d->serves_rpc && d->linger_ms > 0) {
    log_info("answering for %d ms more before draining (linger)", d->linger_ms);
    uv_timer_init(d->loop, &d->linger);
    d->linger.data = d;
    uv_timer_start(&d->linger, on_linger, (uint64_t)d->linger_ms, 0);
    return;
  }
  if (d->serves_rpc) rpc_server_shutdown(d->server, d->drain_ms, on_drained, d);
}

static int port_of(const char *addr) {
  const char *c = strrchr(addr, ':');
  return c ? atoi(c + 1) : -1;
}

/* The ready file: one flat JSON object a supervisor or a test reads back
 * (json_get_*), replaced durably so a reader never sees half of it. */
static int write_ready_file(daemon_t *d, const char *path, const char *extra) {
  sbuf_t b = {0};
  int mport = d->http ? metrics_http_port(d->http) : 0;
  sb_printf(&b, "{\"pid\": %d, ", (int)getpid());
  if (d->serves_rpc) {
    sb_str(&b, "address", d->listen);
    sb_printf(&b, ", \"rpc_port\": %d, ", rpc_server_port(d->server));
  } else {
    sb_printf(&b, "\"rpc_port\": 0, ");
  }
  sb_printf(&b, "\"metrics_port\": %d%s%s}\n", mport, extra ? ", " : "", extra ? extra : "");
  int rc = b.oom ? -ENOMEM : fsio_replace(path, b.s, b.n, 0644, NULL, 0);
  free(b.s);
  return rc;
}

int daemon_start(daemon_t *d, int metrics_port, int port_offset, const char *ready_file, const char *extra_json,
                 const char *status) {
  int rc, port = 0;
  if (d->serves_rpc) {
    if ((rc = rpc_server_start(d->server)) != 0) {
      log_error("cannot listen on %s (address in use, or not an address of this host?)", d->listen);
      return rc;
    }
    port = rpc_server_port(d->server);
  }
  if (metrics_port < 0) metrics_port = (port_offset == 0 || port_of(d->listen) == 0) ? 0 : port + port_offset;
  const char *maddr = d->cfg ? cfg_str(d->cfg, "metrics.listen") : "127.0.0.1";
  if (!maddr || !*maddr) maddr = "127.0.0.1";
  if (d->cfg && cfg_bool(d->cfg, "metrics.tls")) {
    char cert[4096], key[4096], why[512] = "";
    const char *c = with_role(cfg_str(d->cfg, "tls.cert_file"), cert, sizeof cert),
               *k = with_role(cfg_str(d->cfg, "tls.key_file"), key, sizeof key);
    if (!*c || !*k) {
      log_error("metrics.tls = true (from %s) needs tls.cert_file and tls.key_file: the metrics endpoint serves "
                "the daemon's own certificate",
                cfg_origin(d->cfg, "metrics.tls"));
      return ERR_CONFIG;
    }
    const char *ca = cfg_str(d->cfg, "tls.ca_file");
    if ((rc = metrics_http_tls(d->reg, c, k, why, sizeof why)) != 0 ||
        (*ca && (rc = metrics_http_tls_trust(d->reg, ca, why, sizeof why)) != 0)) {
      log_error("metrics.tls: %s", why);
      return rc < 0 ? rc : ERR_CONFIG;
    }
  }
  if (metrics_http_start(d->reg, maddr, metrics_port, &d->http)) {
    log_warn("metrics endpoint not started addr=%s port=%d (in use, or not an address of this host? metrics.listen); "
             "%s without it",
             maddr, metrics_port, d->serves_rpc ? "serving" : "training");
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
  if (d->serves_rpc) sdn_status("%s on port %d", d->status, port);
  else sdn_status("%s", d->status);
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
    if (d->serves_rpc) rpc_global_shutdown();
    uv_loop_close(d->loop);
    d->loop = NULL;
  }
}
