/*
 * chanter dataproc ...: talk to running data processors the way the oracle
 * does (through dpc): info, one batch, a stream of batches.  Batches are
 * printed as one line each with a SHA-256 of their content, so that
 * operators and tests can compare what two processors (or one, before and
 * after a restart) serve.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dpc.h"
#include "err.h"

static void print_batch(const data_batch_t *b, int json, int first) {
  char hex[65];
  dpc_batch_digest(b, hex);
  double pos = 0;
  for (uint32_t i = 0; i < b->n; i++) pos += b->labels[i];
  if (json)
    printf("%s\n  {\"index\": %" PRIu64 ", \"split\": \"%s\", \"samples\": %u, \"positives\": %.0f, \"sha256\": \"%s\"}",
           first ? "" : ",", b->iteration, b->split == DATA_TEST ? "test" : "train", b->n, pos, hex);
  else
    printf("batch %" PRIu64 " %s samples=%u positives=%.0f sha256=%s\n", b->iteration, b->split == DATA_TEST ? "test" : "train",
           b->n, pos, hex);
}

typedef struct stream_ctx_s {
  int json;
  uint64_t seen;
} stream_ctx_t;

static int on_batch(const data_batch_t *b, void *ud) {
  stream_ctx_t *x = ud;
  print_batch(b, x->json, x->seen == 0);
  x->seen++;
  fflush(stdout);
  return 0;
}

int cmd_dataproc(cli_t *cli) {
  char err[1024] = "";
  if (cli->argc < 1) return cli_usage_error(cli, "expected info, batch X or stream FIRST COUNT");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  int split = cli_flag(cli, "--test") ? DATA_TEST : DATA_TRAIN;
  const char *batch_size_s = cli_opt(cli, "--batch-size");
  uint32_t batch_size = batch_size_s ? (uint32_t)strtoul(batch_size_s, NULL, 10) : (uint32_t)cfg_int(cli->cfg, "batch_size");
  int want = !strcmp(sub, "info") ? 0 : !strcmp(sub, "batch") ? 1 : !strcmp(sub, "stream") ? 2 : -1;
  if (want < 0) return cli_usage_error(cli, "unknown subcommand '%s'", sub);
  if (cli_args(cli, want, want, sub, want == 0 ? "no arguments" : want == 1 ? "X" : "FIRST COUNT")) return 2;
  dpc_t *c;
  if (dpc_create(cli->cfg, &c, err, sizeof err)) {
    fprintf(stderr, "chanter dataproc %s: %s\n", sub, err);
    return 1;
  }
  int rc = 0;
  if (!strcmp(sub, "info")) {
    if (cli->json) printf("{\"processors\": [");
    for (uint32_t i = 0; i < dpc_servers(c); i++) {
      Chanter__Dataproc__V1__InfoResponse *r;
      if (dpc_info(c, i, &r, err, sizeof err)) {
        fprintf(stderr, "chanter dataproc info: %s\n", err);
        rc = 1;
        break;
      }
      if (cli->json)
        printf("%s\n  {\"processor\": %u, \"dataset\": \"%s\", \"format\": \"%s\", \"samples\": %" PRIu64
               ", \"train_samples\": %" PRIu64 ", \"test_samples\": %" PRIu64 ", \"bad_records\": %" PRIu64
               ", \"n_dense\": %u, \"n_tables\": %u, \"schema_hash\": \"%016" PRIx64 "\", \"batches_served\": %" PRIu64 "}",
               i ? "," : "", i, r->dataset, r->format, r->samples, r->train_samples, r->test_samples, r->bad_records,
               r->n_dense, r->n_tables, r->schema_hash, r->batches_served);
      else
        printf("processor %u: dataset=%s format=%s samples=%" PRIu64 " (train %" PRIu64 ", test %" PRIu64
               ") bad_records=%" PRIu64 " dense=%u tables=%u schema=%016" PRIx64 " batches_served=%" PRIu64 "\n",
               i, r->dataset, r->format, r->samples, r->train_samples, r->test_samples, r->bad_records, r->n_dense,
               r->n_tables, r->schema_hash, r->batches_served);
      protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    if (cli->json) printf("\n]}\n");
  } else if (!strcmp(sub, "batch")) {
    data_batch_t b;
    if (dpc_get_batch(c, split, strtoull(cli->argv[0], NULL, 10), batch_size, &b, err, sizeof err)) {
      fprintf(stderr, "chanter dataproc batch: %s\n", err);
      rc = 1;
    } else {
      if (cli->json) printf("{\"batches\": [");
      print_batch(&b, cli->json, 1);
      if (cli->json) printf("\n]}\n");
      data_batch_free(&b);
    }
  } else {
    stream_ctx_t x = {.json = cli->json};
    uint32_t restarts = 0;
    if (cli->json) printf("{\"batches\": [");
    rc = dpc_stream(c, split, strtoull(cli->argv[0], NULL, 10), strtoull(cli->argv[1], NULL, 10), batch_size, on_batch, &x,
                    &restarts, err, sizeof err);
    if (cli->json) printf("\n], \"restarts\": %u}\n", restarts);
    else if (!rc) printf("streamed %" PRIu64 " batches, %u stream restarts\n", x.seen, restarts);
    if (rc) {
      fprintf(stderr, "chanter dataproc stream: %s\n", err);
      rc = 1;
    }
  }
  dpc_destroy(c);
  return rc;
}
