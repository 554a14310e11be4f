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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "daemon.h"
#include "embedding_service.h"
#include "store.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "proc.h"
#include "rpc.h"
#include "shard.h"

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

/* The limits of the job (cfg). */
static void limits_from_cfg(const cfg_t *cfg, embedding_limits_t *out) {
  out->lookup_keys = (uint64_t)cfg_int(cfg, "embedding.max_lookup_keys");
  out->write_keys = (uint64_t)cfg_int(cfg, "embedding.max_write_keys");
  out->blob_bytes = (uint64_t)cfg_int(cfg, "embedding.max_blob_mb") << 20;
}

/* The largest request a client within the limits sends (a WriteBack of
 * write_keys rows of the layout's largest row, a Lookup, a PutBlob, plus
 * room for the other fields): the server's gRPC receive limit. */
static size_t limits_max_request(const embedding_limits_t *lim, const table_layout_t *layout) {
  uint64_t lookup = lim->lookup_keys * 8;
  uint64_t write = lim->write_keys * (8 + (uint64_t)table_max_row_floats(layout) * 4);
  uint64_t m = lookup > write ? lookup : write;
  if (lim->blob_bytes > m) m = lim->blob_bytes;
  m += 1u << 20; /* names, ids, a manifest, protobuf framing */
  return m > SIZE_MAX ? SIZE_MAX : (size_t)m;
}

int main(int argc, char **argv) {
  daemon_t d = {0};
  daemon_args_t args;
  cfg_t *cfg = NULL;
  store_t *store = NULL;
  embedding_service_t *svc = NULL;
  embedding_backup_t *backup = NULL;
  char err[1024];
  int rc = 1, shard = -1;
  const char *listen = NULL, *data_dir_arg = NULL;
  char data_dir[4096];
  char **addrs = NULL;
  size_t n_addrs = 0;
  table_layout_t layout = {0};
  shard_map_t map = {0};

  proc_init("chanter-embedding");
  const daemon_opt_t opts[] = {{"shard", daemon_opt_int, &shard}, {"data-dir", daemon_opt_str, &data_dir_arg}, {NULL}};
  if (daemon_parse_args(&args, argc, argv, 0, opts, usage) || args.help) {
    rc = args.help ? 0 : 1;
    goto out;
  }
  cfg = args.cfg;
  listen = args.listen;
  int64_t n_shards = cfg_int(cfg, "embedding_servers");
  if (shard < 0 || shard >= n_shards) {
    log_error("--shard must be given and in [0, %lld) (embedding_servers = %lld from %s)", (long long)n_shards,
              (long long)n_shards, cfg_origin(cfg, "embedding_servers"));
    goto out;
  }
  if (cfg_list(cfg, "cluster.embedding", &addrs, &n_addrs)) goto out;
  if (!listen) {
    if ((size_t)shard >= n_addrs) {
      log_error("no address for shard %d: set cluster.embedding in the job file or pass --listen HOST:PORT", shard);
      goto out;
    }
    listen = addrs[shard];
  }
  /* data dir: %i -> shard */
  const char *tmpl = data_dir_arg ? data_dir_arg : cfg_str(cfg, "embedding.data_dir");
  if (cfg_path_expand(tmpl, NULL, shard, data_dir, sizeof data_dir) != 0) {
    log_error("embedding.data_dir %s is too long (over %zu bytes with the shard)", tmpl, sizeof data_dir - 1);
    goto out;
  }

  if (cfg_layout(cfg, &layout, err, sizeof err)) {
    log_error("bad table layout: %s", err);
    goto out;
  }
  if (shard_map_from_cfg(&map, cfg, &layout, (uint32_t)n_shards, err, sizeof err)) {
    log_error("cannot place the tables on the %d embedding servers: %s", (int)n_shards, err);
    goto out;
  }

  /* before the store: a data dir whose disk was lost gets its checkpoints back from checkpoint.backup_dir */
  if (embedding_backup_start(cfg, (uint32_t)shard, data_dir, &backup, err, sizeof err)) {
    log_error("checkpoint.backup_dir: %s", err);
    goto out;
  }
  store_opts_t so = {
      .data_dir = data_dir,
      .layout = &layout,
      .shard_map = &map,
      .shard = (uint32_t)shard,
      .hot_bytes = (size_t)cfg_int(cfg, "embedding.hot_mb") << 20,
      .block_cache_bytes = (size_t)cfg_int(cfg, "embedding.block_cache_mb") << 20,
      .sync_writes = cfg_bool(cfg, "embedding.sync_writes"),
  };
  if ((rc = store_open(&so, &store, err, sizeof err)) != 0) {
    log_error("cannot open the store data_dir=%s: %s (%s)", data_dir, err, err_str(rc));
    rc = 1;
    goto out;
  }
  rc = 1;
  embedding_limits_t lim;
  limits_from_cfg(cfg, &lim);
  if (daemon_init_max_receive(&d, "chanter-embedding", cfg, listen, (int)cfg_int(cfg, "embedding.drain_ms"),
                              "chanter_embedding", limits_max_request(&lim, &layout)))
    goto out_daemon;
  if (embedding_service_create(d.loop, d.server, store, &layout, &lim, (uint32_t)shard, (uint32_t)n_shards, d.reg,
                               &svc))
    goto out_daemon;
  embedding_service_set_backup(svc, backup);
  embedding_service_set_cfg(svc, cfg);
  if (embedding_backup_run(backup, store)) goto out_daemon;
  char extra[64], status[128];
  snprintf(extra, sizeof extra, "\"shard\": %d", shard);
  snprintf(status, sizeof status, "serving shard %d of %lld", shard, (long long)n_shards);
  if (daemon_start(&d, args.metrics_port, (int)cfg_int(cfg, "embedding.metrics_port_offset"), args.ready_file, extra,
                   status))
    goto out_daemon;
  log_info("serving shard=%d/%lld listen=%s port=%d metrics_port=%d data_dir=%s tables=%u layout_hash=%016llx tls=%s "
           "incarnation=%016llx",
           shard, (long long)n_shards, d.listen, rpc_server_port(d.server), d.http ? metrics_http_port(d.http) : 0,
           data_dir, layout.n_tables, (unsigned long long)table_layout_hash(&layout),
           *cfg_str(cfg, "tls.cert_file") ? "on" : "off", (unsigned long long)embedding_service_incarnation(svc));
  rc = daemon_run(&d);

out_daemon:
  embedding_service_stop(svc);
  daemon_close(&d); /* server, metrics endpoint: nothing calls into the store after this */
  embedding_service_destroy(svc);
  embedding_backup_destroy(backup); /* a backup under way completes: it reads the store */
  backup = NULL;
  if (store) store_close(store);
  if (rc == 0) log_info("stopped cleanly");
out:
  embedding_backup_destroy(backup);
  shard_map_close(&map);
  table_layout_close(&layout);
  cfg_list_free(addrs, n_addrs);
  daemon_args_close(&args);
  return rc;
}
