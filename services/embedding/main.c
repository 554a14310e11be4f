/*
 * chanter-embedding: one shard of the embedding tables.
 *
 *   chanter-embedding --config job.ini --shard N [--set key=value ...]
 *                     [--listen HOST:PORT] [--data-dir DIR]
 *                     [--metrics-port P] [--ready-file PATH]
 *
 * Wiring only: read the job configuration, open the store, start the gRPC
 * server and the Prometheus endpoint, tell systemd we are ready, ping its
 * watchdog, and on SIGTERM/SIGINT drain in-flight calls and close RocksDB.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cfg.h"
#include "embedding_service.h"
#include "embedding_store.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "proc.h"
#include "rpc.h"
#include "sdn.h"
#include "shard.h"

typedef struct daemon_s {
  uv_loop_t *loop;
  cfg_t *cfg;
  rpc_server_t *server;
  emb_store_t *store;
  emb_service_t *svc;
  metrics_registry_t *reg;
  metrics_http_t *http;
  uv_signal_t sigterm, sigint;
  int stopping;
  uint32_t shard;
} daemon_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: chanter-embedding --config FILE --shard N [--set key=value ...]\n"
          "                         [--listen HOST:PORT] [--data-dir DIR] [--metrics-port P]\n"
          "                         [--ready-file PATH]\n"
          "Serves shard N of the embedding tables described by the job configuration.\n"
          "  --listen      address to bind (default: entry N of cluster.embedding)\n"
          "  --data-dir    RocksDB directory (default: embedding.data_dir, %%i = shard)\n"
          "  --metrics-port  Prometheus port (default: RPC port + embedding.metrics_port_offset)\n"
          "  --ready-file  write {\"rpc_port\":..,\"metrics_port\":..} here once serving\n");
}

static void on_drained(rpc_server_t *s, void *ud) {
  daemon_t *d = ud;
  log_info("drained; closing store");
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
  log_info("stopping signal=%d inflight=%llu drain_ms=%lld", signum, (unsigned long long)rpc_server_inflight(d->server),
           (long long)cfg_int(d->cfg, "embedding.drain_ms"));
  sdn_stopping();
  rpc_server_shutdown(d->server, (int)cfg_int(d->cfg, "embedding.drain_ms"), on_drained, d);
}

static int write_ready_file(const char *path, daemon_t *d, const char *addr) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -errno;
  fprintf(f, "{\"pid\": %d, \"shard\": %u, \"address\": \"%s\", \"rpc_port\": %d, \"metrics_port\": %d}\n", (int)getpid(),
          d->shard, addr, rpc_server_port(d->server), d->http ? metrics_http_port(d->http) : 0);
  if (fclose(f) != 0) return -errno;
  return rename(tmp, path) ? -errno : 0;
}

static int port_of(const char *addr) {
  const char *c = strrchr(addr, ':');
  return c ? atoi(c + 1) : -1;
}

int main(int argc, char **argv) {
  daemon_t d = {0};
  char err[1024];
  int rc = 1, shard = -1, metrics_port = -1;
  const char *listen = NULL, *data_dir_arg = NULL, *ready_file = NULL;
  char listen_buf[256], data_dir[4096];
  char **addrs = NULL;
  size_t n_addrs = 0;
  tbl_layout_t layout = {0};
  shard_map_t map = {0};

  proc_init("chanter-embedding");
  if (cfg_create(&d.cfg)) return 1;
  if (cfg_parse_args(d.cfg, &argc, argv, err, sizeof err)) {
    log_error("bad configuration: %s", err);
    goto out;
  }
  log_set_level_str(cfg_str(d.cfg, "log_level"));
  static const struct option opts[] = {{"shard", required_argument, 0, 's'},    {"listen", required_argument, 0, 'l'},
                                       {"data-dir", required_argument, 0, 'd'}, {"metrics-port", required_argument, 0, 'm'},
                                       {"ready-file", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 's': shard = atoi(optarg); break;
    case 'l': listen = optarg; break;
    case 'd': data_dir_arg = optarg; break;
    case 'm': metrics_port = atoi(optarg); break;
    case 'r': ready_file = optarg; break;
    case 'h': usage(stdout); rc = 0; goto out;
    default: usage(stderr); goto out;
    }
  }
  if (optind < argc) {
    log_error("unexpected argument '%s'", argv[optind]);
    usage(stderr);
    goto out;
  }
  int64_t n_shards = cfg_int(d.cfg, "embedding_servers");
  if (shard < 0 || shard >= n_shards) {
    log_error("--shard must be given and in [0, %lld) (embedding_servers = %lld from %s)", (long long)n_shards,
              (long long)n_shards, cfg_origin(d.cfg, "embedding_servers"));
    goto out;
  }
  d.shard = (uint32_t)shard;
  if (cfg_list(d.cfg, "cluster.embedding", &addrs, &n_addrs)) goto out;
  if (!listen) {
    if ((size_t)shard >= n_addrs) {
      log_error("no address for shard %d: set cluster.embedding in the job file or pass --listen HOST:PORT", shard);
      goto out;
    }
    listen = addrs[shard];
  }
  snprintf(listen_buf, sizeof listen_buf, "%s", listen);
  /* data dir: %i -> shard */
  const char *tmpl = data_dir_arg ? data_dir_arg : cfg_str(d.cfg, "embedding.data_dir");
  size_t o = 0;
  for (const char *p = tmpl; *p && o + 12 < sizeof data_dir; p++) {
    if (p[0] == '%' && p[1] == 'i') {
      o += (size_t)snprintf(data_dir + o, sizeof data_dir - o, "%d", shard);
      p++;
    } else {
      data_dir[o++] = *p;
    }
  }
  data_dir[o] = 0;

  if (cfg_layout(d.cfg, &layout, err, sizeof err)) {
    log_error("bad table layout: %s", err);
    goto out;
  }
  if (shard_map_init(&map, &layout, (uint32_t)n_shards, (uint64_t)cfg_int(d.cfg, "shard.table_wise_max_rows"))) goto out;

  emb_store_opts_t so = {
      .data_dir = data_dir,
      .layout = &layout,
      .shard_map = &map,
      .shard = (uint32_t)shard,
      .hot_bytes = (size_t)cfg_int(d.cfg, "embedding.hot_mb") << 20,
      .block_cache_bytes = (size_t)cfg_int(d.cfg, "embedding.block_cache_mb") << 20,
      .sync_writes = cfg_bool(d.cfg, "embedding.sync_writes"),
  };
  if ((rc = emb_store_open(&so, &d.store, err, sizeof err)) != 0) {
    log_error("cannot open the store data_dir=%s: %s (%s)", data_dir, err, err_str(rc));
    rc = 1;
    goto out;
  }
  rc = 1;

  d.loop = uv_default_loop();
  if (rpc_global_init()) goto out;
  rpc_server_opts_t ro = {
      .listen = listen_buf,
      .tls = {.ca_file = *cfg_str(d.cfg, "tls.ca_file") ? cfg_str(d.cfg, "tls.ca_file") : NULL,
              .cert_file = *cfg_str(d.cfg, "tls.cert_file") ? cfg_str(d.cfg, "tls.cert_file") : NULL,
              .key_file = *cfg_str(d.cfg, "tls.key_file") ? cfg_str(d.cfg, "tls.key_file") : NULL,
              .require_client_cert = *cfg_str(d.cfg, "tls.cert_file") && cfg_bool(d.cfg, "tls.require_client_cert")},
      .max_message_bytes = (size_t)cfg_int(d.cfg, "rpc.max_message_mb") << 20,
  };
  if (rpc_server_create(d.loop, &ro, &d.server)) {
    log_error("cannot create the RPC server listen=%s", listen_buf);
    goto out_rpc;
  }
  if (metrics_registry_create("chanter_embedding", &d.reg)) goto out_rpc;
  if (emb_service_create(d.loop, d.server, d.store, &layout, (uint32_t)shard, (uint32_t)n_shards, d.reg, &d.svc))
    goto out_rpc;
  if (rpc_server_start(d.server)) {
    log_error("cannot listen on %s (address in use, or not an address of this host?)", listen_buf);
    goto out_rpc;
  }
  int port = rpc_server_port(d.server);
  if (metrics_port < 0) {
    int64_t off = cfg_int(d.cfg, "embedding.metrics_port_offset");
    metrics_port = (off == 0 || port_of(listen_buf) == 0) ? 0 : port + (int)off;
  }
  if (metrics_http_start(d.reg, "127.0.0.1", metrics_port, &d.http)) {
    log_warn("metrics endpoint not started port=%d (in use?); serving without it", metrics_port);
    d.http = NULL;
  }
  uv_signal_init(d.loop, &d.sigterm);
  uv_signal_init(d.loop, &d.sigint);
  d.sigterm.data = d.sigint.data = &d;
  uv_signal_start(&d.sigterm, on_signal, SIGTERM);
  uv_signal_start(&d.sigint, on_signal, SIGINT);
  sdn_watchdog_start(d.loop);
  if (ready_file && write_ready_file(ready_file, &d, listen_buf)) log_warn("cannot write ready file path=%s", ready_file);
  log_info("serving shard=%d/%lld listen=%s port=%d metrics_port=%d data_dir=%s tables=%u layout_hash=%016llx tls=%s",
           shard, (long long)n_shards, listen_buf, port, d.http ? metrics_http_port(d.http) : 0, data_dir,
           layout.n_tables, (unsigned long long)tbl_layout_hash(&layout), ro.tls.cert_file ? "on" : "off");
  sdn_ready();
  sdn_status("serving shard %d of %lld on port %d", shard, (long long)n_shards, port);

  uv_run(d.loop, UV_RUN_DEFAULT);
  rc = 0;

out_rpc:
  if (d.server) {
    rpc_server_destroy(d.server);
    uv_run(d.loop, UV_RUN_NOWAIT); /* let the server's handles close */
  }
  if (d.http) metrics_http_stop(d.http);
  emb_service_destroy(d.svc);
  if (d.store) emb_store_close(d.store);
  if (d.reg) metrics_registry_destroy(d.reg);
  rpc_global_shutdown();
  if (d.loop) uv_loop_close(d.loop);
  if (rc == 0) log_info("stopped cleanly");
out:
  shard_map_close(&map);
  tbl_layout_close(&layout);
  cfg_list_free(addrs, n_addrs);
  cfg_destroy(d.cfg);
  return rc;
}
