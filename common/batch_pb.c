/* batch_pb: see batch_pb.h. */
#include "batch_pb.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "batches travel as the bytes of little-endian arrays");

/* ------------------------------------------------------------------ encode */

/* The fields both messages share, pointing into b. */
static void encode(const data_batch_t *b, uint32_t *n, uint32_t *n_dense, uint32_t *n_tables, size_t *n_hotness,
                   uint32_t **hotness, ProtobufCBinaryData *labels, ProtobufCBinaryData *dense,
                   ProtobufCBinaryData *ids) {
  *n = b->n;
  *n_dense = b->n_dense;
  *n_tables = b->n_tables;
  *n_hotness = b->n_tables;
  *hotness = b->hotness;
  labels->data = (uint8_t *)b->labels;
  labels->len = (size_t)b->n * sizeof(float);
  dense->data = (uint8_t *)b->dense;
  dense->len = (size_t)b->n * b->n_dense * sizeof(float);
  ids->data = (uint8_t *)b->ids;
  ids->len = data_batch_n_ids(b) * sizeof(uint64_t);
}

void batch_pb_encode_batch(const data_batch_t *b, Chanter__Dataproc__V1__Batch *pb) {
  chanter__dataproc__v1__batch__init(pb);
  pb->iteration = b->iteration;
  pb->split = b->split == DATA_TEST ? CHANTER__DATAPROC__V1__SPLIT__TEST : CHANTER__DATAPROC__V1__SPLIT__TRAIN;
  encode(b, &pb->n, &pb->n_dense, &pb->n_tables, &pb->n_hotness, &pb->hotness, &pb->labels, &pb->dense, &pb->ids);
}

void batch_pb_encode_samples(const data_batch_t *b, Chanter__Oracle__V1__Samples *pb) {
  chanter__oracle__v1__samples__init(pb);
  encode(b, &pb->n, &pb->n_dense, &pb->n_tables, &pb->n_hotness, &pb->hotness, &pb->labels, &pb->dense, &pb->ids);
}

/* ------------------------------------------------------------------ decode a Batch */

int batch_pb_decode_batch(const Chanter__Dataproc__V1__Batch *pb, data_batch_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  if (pb->n_hotness != pb->n_tables)
    return err_set(err, err_len, ERR_BADMSG, "batch %llu: %zu hotness entries for %u tables",
                   (unsigned long long)pb->iteration, pb->n_hotness, pb->n_tables);
  size_t ids = 0;
  for (uint32_t t = 0; t < pb->n_tables; t++) ids += (size_t)pb->n * pb->hotness[t];
  if (pb->labels.len != (size_t)pb->n * 4 || pb->dense.len != (size_t)pb->n * pb->n_dense * 4 ||
      pb->ids.len != ids * 8)
    return err_set(err, err_len, ERR_BADMSG,
                   "batch %llu: sizes do not match n=%u n_dense=%u (labels %zu bytes, dense %zu bytes, ids %zu "
                   "bytes; expected %zu, %zu, %zu)",
                   (unsigned long long)pb->iteration, pb->n, pb->n_dense, pb->labels.len, pb->dense.len, pb->ids.len,
                   (size_t)pb->n * 4, (size_t)pb->n * pb->n_dense * 4, ids * 8);
  out->iteration = pb->iteration;
  out->split = pb->split == CHANTER__DATAPROC__V1__SPLIT__TEST ? DATA_TEST : DATA_TRAIN;
  out->n = pb->n;
  out->n_dense = pb->n_dense;
  out->n_tables = pb->n_tables;
  out->hotness = malloc((pb->n_tables ? pb->n_tables : 1) * sizeof *out->hotness);
  out->labels = malloc(pb->labels.len ? pb->labels.len : 1);
  out->dense = malloc(pb->dense.len ? pb->dense.len : 1);
  out->ids = malloc(pb->ids.len ? pb->ids.len : 1);
  out->ids_off = malloc((pb->n_tables + 1) * sizeof *out->ids_off);
  if (!out->hotness || !out->labels || !out->dense || !out->ids || !out->ids_off) {
    data_batch_free(out);
    return -ENOMEM;
  }
  memcpy(out->hotness, pb->hotness, pb->n_tables * sizeof *out->hotness);
  memcpy(out->labels, pb->labels.data, pb->labels.len);
  memcpy(out->dense, pb->dense.data, pb->dense.len);
  memcpy(out->ids, pb->ids.data, pb->ids.len);
  out->ids_off[0] = 0;
  for (uint32_t t = 0; t < pb->n_tables; t++) out->ids_off[t + 1] = out->ids_off[t] + (size_t)pb->n * pb->hotness[t];
  return 0;
}

/* ------------------------------------------------------------------ decode Samples */

int batch_pb_check_samples(const Chanter__Oracle__V1__Samples *s, const data_schema_t *sc, uint32_t max_n,
                           uint32_t *n_out, size_t *n_ids_out, char *err, size_t err_len) {
  uint32_t n = s ? s->n : 0;
  if (n > max_n)
    return err_set(err, err_len, ERR_BADMSG, "%u samples for one trainer, more than the global batch_size %u", n,
                   max_n);
  if (n) {
    if (s->n_dense != sc->n_dense || s->n_tables != sc->n_tables)
      return err_set(err, err_len, ERR_BADMSG,
                     "samples have %u dense features and %u tables, the job's schema %u and %u (same job file?)",
                     s->n_dense, s->n_tables, sc->n_dense, sc->n_tables);
    if (s->n_hotness != sc->n_tables)
      return err_set(err, err_len, ERR_BADMSG, "samples carry %zu hotness entries for %u tables", s->n_hotness,
                     sc->n_tables);
    for (uint32_t t = 0; t < sc->n_tables; t++)
      if (s->hotness[t] != sc->hotness[t])
        return err_set(err, err_len, ERR_BADMSG, "table %u: samples have hotness %u, the job's schema %u", t,
                       s->hotness[t], sc->hotness[t]);
  }
  size_t n_ids = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) n_ids += (size_t)n * sc->hotness[t];
  if (n && (s->labels.len != (size_t)n * 4 || s->dense.len != (size_t)n * sc->n_dense * 4 || s->ids.len != n_ids * 8))
    return err_set(err, err_len, ERR_BADMSG,
                   "samples of %u: %zu label bytes (want %zu), %zu dense bytes (want %zu), %zu id bytes (want %zu)", n,
                   s->labels.len, (size_t)n * 4, s->dense.len, (size_t)n * sc->n_dense * 4, s->ids.len, n_ids * 8);
  *n_out = n;
  *n_ids_out = n_ids;
  return 0;
}

static size_t al8(size_t n) { return (n + 7) & ~(size_t)7; }

/* The lay-out, in order: labels, dense, hotness, ids_off, ids. */
size_t batch_pb_samples_bytes(uint32_t n, const data_schema_t *sc) {
  size_t n_ids = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) n_ids += (size_t)n * sc->hotness[t];
  return al8((size_t)n * 4) + al8((size_t)n * sc->n_dense * 4) + al8((size_t)sc->n_tables * 4) +
         (sc->n_tables + 1) * sizeof(size_t) + n_ids * 8;
}

void batch_pb_lay_out_samples(const Chanter__Oracle__V1__Samples *s, uint32_t n, const data_schema_t *sc, void *mem,
                              data_batch_t *out) {
  uint8_t *p = mem;
  memset(out, 0, sizeof *out);
  out->split = DATA_TRAIN;
  out->n = n;
  out->n_dense = sc->n_dense;
  out->n_tables = sc->n_tables;
  out->labels = (float *)p;
  if (n) memcpy(p, s->labels.data, (size_t)n * 4);
  p += al8((size_t)n * 4);
  if (n) memcpy(p, s->dense.data, (size_t)n * sc->n_dense * 4);
  out->dense = sc->n_dense ? (float *)p : NULL;
  p += al8((size_t)n * sc->n_dense * 4);
  out->hotness = (uint32_t *)p;
  if (sc->n_tables) memcpy(p, sc->hotness, (size_t)sc->n_tables * 4);
  p += al8((size_t)sc->n_tables * 4);
  size_t *off = (size_t *)p;
  off[0] = 0;
  for (uint32_t t = 0; t < sc->n_tables; t++) off[t + 1] = off[t] + (size_t)n * sc->hotness[t];
  out->ids_off = off;
  p += (sc->n_tables + 1) * sizeof(size_t);
  out->ids = (uint64_t *)p;
  if (n) memcpy(p, s->ids.data, s->ids.len);
}
