/* dpc: see dpc.h. */
#include "dpc.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch_pb.h"
#include "clock.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "rpc.h"
#include "table.h"

#define DP_DESC(name) (&chanter__dataproc__v1__##name##__descriptor)

struct dpc_s {
  data_schema_t schema;
  uint64_t schema_hash;
  uint32_t n;
  char **addrs;
  size_t n_addrs;
  rpc_channel_t **ch;
  int64_t timeout_ms;
  const char *p_get, *p_stream, *p_info;
};

static void sleep_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

uint64_t dpc_schema_hash(const data_schema_t *s) {
  uint64_t h = table_mix64(UINT64_C(0x64617461) ^ s->n_dense);
  h = table_mix64(h ^ s->n_tables);
  h = table_mix64(h ^ s->hash_seed);
  for (uint32_t t = 0; t < s->n_tables; t++) {
    h = table_mix64(h ^ s->table_rows[t]);
    h = table_mix64(h ^ s->hotness[t]);
  }
  return h ? h : 1;
}

void dpc_batch_digest(const data_batch_t *b, char hex[65]) {
  uint8_t h[32];
  unsigned hl = 0;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, b->labels, (size_t)b->n * 4);
  EVP_DigestUpdate(md, b->dense, (size_t)b->n * b->n_dense * 4);
  EVP_DigestUpdate(md, b->ids, data_batch_n_ids(b) * 8);
  EVP_DigestFinal_ex(md, h, &hl);
  EVP_MD_CTX_free(md);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

int dpc_create(const cfg_t *cfg, dpc_t **out, char *err, size_t err_len) {
  dpc_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  int rc = data_schema_from_cfg(cfg, &c->schema, err, err_len);
  if (rc) {
    free(c);
    return rc;
  }
  c->schema_hash = dpc_schema_hash(&c->schema);
  if ((rc = cfg_list(cfg, "cluster.dataproc", &c->addrs, &c->n_addrs)) != 0) goto fail;
  if (c->n_addrs == 0) {
    rc = err_set(err, err_len, ERR_CONFIG, "cluster.dataproc (from %s) lists no data processor",
                 cfg_origin(cfg, "cluster.dataproc"));
    goto fail;
  }
  c->n = (uint32_t)c->n_addrs;
  c->timeout_ms = cfg_int(cfg, "rpc.timeout_ms");
  if (!(c->ch = calloc(c->n, sizeof *c->ch))) {
    rc = -ENOMEM;
    goto fail;
  }
  rpc_tls_t tls;
  daemon_tls(cfg, &tls, 0);
  for (uint32_t i = 0; i < c->n; i++) {
    if ((rc = rpc_channel_create(c->addrs[i], tls.ca_file ? &tls : NULL,
                                 (size_t)cfg_int(cfg, "rpc.max_message_mb") << 20, &c->ch[i])) != 0) {
      err_set(err, err_len, rc, "cannot create a channel to data processor %u at %s: %s", i, c->addrs[i], err_str(rc));
      goto fail;
    }
  }
  c->p_get = rpc_method_path(DP_DESC(data_proc), "GetBatch");
  c->p_stream = rpc_method_path(DP_DESC(data_proc), "StreamBatches");
  c->p_info = rpc_method_path(DP_DESC(data_proc), "Info");
  *out = c;
  return 0;
fail:
  dpc_destroy(c);
  return rc;
}

void dpc_destroy(dpc_t *c) {
  if (!c) return;
  for (uint32_t i = 0; c->ch && i < c->n; i++)
    if (c->ch[i]) rpc_channel_destroy(c->ch[i]);
  free(c->ch);
  cfg_list_free(c->addrs, c->n_addrs);
  data_schema_close(&c->schema);
  free(c);
}

uint32_t dpc_servers(const dpc_t *c) { return c->n; }

int dpc_get_batch(dpc_t *c, int split, uint64_t iteration, uint32_t batch_size, data_batch_t *out, char *err, size_t err_len) {
  Chanter__Dataproc__V1__GetBatchRequest req = CHANTER__DATAPROC__V1__GET_BATCH_REQUEST__INIT;
  req.iteration = iteration;
  req.batch_size = batch_size;
  req.split = split == DATA_TEST ? CHANTER__DATAPROC__V1__SPLIT__TEST : CHANTER__DATAPROC__V1__SPLIT__TRAIN;
  req.schema_hash = c->schema_hash;
  int64_t deadline = clock_mono_ms() + c->timeout_ms, backoff = 20;
  uint32_t first = (uint32_t)(iteration % c->n);
  for (uint32_t attempt = 0;; attempt++) {
    uint32_t i = (first + attempt) % c->n;
    rpc_status_t st = {0};
    ProtobufCMessage *resp = NULL;
    int64_t left = deadline - clock_mono_ms();
    int rc = rpc_unary(c->ch[i], c->p_get, &req.base, DP_DESC(batch), left > 1 ? left : 1, &resp, &st);
    if (rc == 0) {
      rc = batch_pb_decode_batch((const Chanter__Dataproc__V1__Batch *)resp, out, err, err_len);
      protobuf_c_message_free_unpacked(resp, NULL);
      return rc;
    }
    if (rc != ERR_UNAVAILABLE || clock_mono_ms() + backoff >= deadline) {
      return err_set(err, err_len, rc, "data processor %u (%s), batch %llu: %s%s%s", i, c->addrs[i],
                     (unsigned long long)iteration, err_str(rc), st.message[0] ? ": " : "", st.message);
    }
    /* this one is down: try the next at once; back off after a full round */
    if ((attempt + 1) % c->n == 0) {
      sleep_ms(backoff);
      if (backoff < 1000) backoff *= 2;
    }
  }
}

int dpc_stream(dpc_t *c, int split, uint64_t first, uint64_t count, uint32_t batch_size, dpc_batch_cb cb, void *ud,
               uint32_t *restarts, char *err, size_t err_len) {
  uint64_t next = first, end = first + count;
  int64_t progress_at = clock_mono_ms(), backoff = 20;
  uint32_t srv = (uint32_t)(first % c->n), opened = 0;
  int rc = 0;
  if (restarts) *restarts = 0;
  if (err && err_len) err[0] = 0;
  while (next < end) {
    if (clock_mono_ms() - progress_at > c->timeout_ms) {
      char last[512];
      snprintf(last, sizeof last, "%s", err && *err ? err : "no answer");
      return err_set(err, err_len, rc ? rc : ERR_DEADLINE,
                     "no data processor delivered batch %llu within rpc.timeout_ms = %lld ms (last: %s)",
                     (unsigned long long)next, (long long)c->timeout_ms, last);
    }
    rpc_stream_t *s = NULL;
    rc = rpc_stream_open(c->ch[srv], c->p_stream, DP_DESC(batch), 0, &s);
    if (rc == 0) {
      if (opened++ && restarts) (*restarts)++;
      /* ask in chunks of at most 1024 batches, all up front: the server
       * produces with backpressure, we read */
      for (uint64_t x = next; x < end && rc == 0; x += 1024) {
        Chanter__Dataproc__V1__StreamRequest req = CHANTER__DATAPROC__V1__STREAM_REQUEST__INIT;
        req.first = x;
        req.count = (uint32_t)(end - x < 1024 ? end - x : 1024);
        req.batch_size = batch_size;
        req.split = split == DATA_TEST ? CHANTER__DATAPROC__V1__SPLIT__TEST : CHANTER__DATAPROC__V1__SPLIT__TRAIN;
        req.schema_hash = c->schema_hash;
        rc = rpc_stream_write(s, &req.base);
      }
      if (rc == 0) rc = rpc_stream_writes_done(s);
      while (rc == 0 && next < end) {
        ProtobufCMessage *m = NULL;
        int r = rpc_stream_read(s, &m);
        if (r != 0) {
          rc = r < 0 ? r : ERR_UNAVAILABLE; /* ended early: treat as a break */
          break;
        }
        data_batch_t b;
        int e = batch_pb_decode_batch((const Chanter__Dataproc__V1__Batch *)m, &b, err, err_len);
        protobuf_c_message_free_unpacked(m, NULL);
        if (e) {
          rpc_stream_cancel(s);
          rpc_stream_destroy(s);
          return e;
        }
        if (b.iteration != next) {
          err_set(err, err_len, ERR_BADMSG, "data processor %s sent batch %llu where %llu was due", c->addrs[srv],
                  (unsigned long long)b.iteration, (unsigned long long)next);
          data_batch_free(&b);
          rpc_stream_cancel(s);
          rpc_stream_destroy(s);
          return ERR_BADMSG;
        }
        int stop = cb(&b, ud);
        data_batch_free(&b);
        next++;
        progress_at = clock_mono_ms();
        backoff = 20;
        if (stop) {
          rpc_stream_cancel(s);
          rpc_stream_destroy(s);
          return 0;
        }
      }
      rpc_status_t st = {0};
      if (next >= end) {
        ProtobufCMessage *m = NULL;
        if (rpc_stream_read(s, &m) == 0) protobuf_c_message_free_unpacked(m, NULL);
        rc = rpc_stream_finish(s, &st);
        rpc_stream_destroy(s);
        return rc;
      }
      rpc_stream_cancel(s);
      int fr = rpc_stream_finish(s, &st);
      rpc_stream_destroy(s);
      if (fr && fr != ERR_CANCELLED && fr != ERR_UNAVAILABLE && fr != ERR_DEADLINE) {
        /* refused (bad request, other schema): retrying will not help */
        return err_set(err, err_len, fr, "data processor %u (%s): %s%s%s", srv, c->addrs[srv], err_str(fr),
                       st.message[0] ? ": " : "", st.message);
      }
      err_set(err, err_len, rc ? rc : fr, "data processor %u (%s): stream broke at batch %llu (%s)", srv, c->addrs[srv],
              (unsigned long long)next, err_str(rc ? rc : fr));
      log_info("batch stream broke; resuming server=%s next=%llu", c->addrs[srv], (unsigned long long)next);
    } else {
      err_set(err, err_len, rc, "data processor %u (%s): %s", srv, c->addrs[srv], err_str(rc));
    }
    srv = (srv + 1) % c->n;
    if (srv == (uint32_t)(first % c->n)) {
      sleep_ms(backoff);
      if (backoff < 1000) backoff *= 2;
    }
  }
  return 0;
}

int dpc_info(dpc_t *c, uint32_t i, Chanter__Dataproc__V1__InfoResponse **out, char *err, size_t err_len) {
  Chanter__Dataproc__V1__InfoRequest req = CHANTER__DATAPROC__V1__INFO_REQUEST__INIT;
  rpc_status_t st = {0};
  if (i >= c->n) return -EINVAL;
  int rc = rpc_unary(c->ch[i], c->p_info, &req.base, DP_DESC(info_response), c->timeout_ms, (ProtobufCMessage **)out,
                     &st);
  if (rc)
    err_set(err, err_len, rc, "data processor %u (%s): %s%s%s", i, c->addrs[i], err_str(rc), st.message[0] ? ": " : "",
            st.message);
  return rc;
}
