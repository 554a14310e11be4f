/*
 * batch_pb: the one codec between a batch (data_batch_t, data.h) and the
 * two messages that carry one: the data processors' Batch
 * (dataproc.proto: a whole batch, with its number and split) and the
 * oracle's Samples (oracle.proto: a trainer's share of a global batch, in
 * a Step or an Eval; the same fields without number and split).  Keys and
 * floats travel as the bytes of the host's arrays (little-endian hosts
 * only, as the protocols say).
 *
 * Encoding never copies: the message points into the batch's arrays (the
 * batch must outlive the message's use), which is what the data
 * processor's and the oracle's sends need on their hot paths.  Decoding
 * checks every size first and says what is wrong in err; a Batch is
 * checked against itself (its own n_tables and hotness) and copied into a
 * batch that owns its arrays; Samples are checked against the job's schema
 * (the trainer's work items, trainer_work.h) and laid out once in memory
 * the caller owns (one block per work item), the batch a view of it.
 *
 * Errors: 0 or ERR_BADMSG / -ENOMEM with a sentence in err.  Pure
 * functions; any thread.
 */
#ifndef CHANTER_BATCH_PB_H
#define CHANTER_BATCH_PB_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "dataproc.pb-c.h"
#include "oracle.pb-c.h"

/* pb (initialized here) points into b's arrays: no copy. */
void batch_pb_encode_batch(const data_batch_t *b, Chanter__Dataproc__V1__Batch *pb);
void batch_pb_encode_samples(const data_batch_t *b, Chanter__Oracle__V1__Samples *pb);

/* Copies a received Batch into *out (which owns its arrays: free with
 * data_batch_free), checking every size; ERR_BADMSG with err if the
 * message is inconsistent, -ENOMEM. */
int batch_pb_decode_batch(const Chanter__Dataproc__V1__Batch *pb, data_batch_t *out, char *err, size_t err_len);

/* Checks Samples s (NULL: no samples) against schema: at most max_n
 * samples (UINT32_MAX: any number), the schema's dense features, tables
 * and hotness, and byte lengths that match.  *n gets the samples, *n_ids
 * their ids over all tables.  0 or ERR_BADMSG with the bare sentence in
 * err ("samples carry 2 hotness entries for 3 tables"). */
int batch_pb_check_samples(const Chanter__Oracle__V1__Samples *s, const data_schema_t *schema, uint32_t max_n,
                           uint32_t *n, size_t *n_ids, char *err, size_t err_len);
/* Bytes batch_pb_lay_out_samples needs for n checked samples. */
size_t batch_pb_samples_bytes(uint32_t n, const data_schema_t *schema);
/* Copies the n samples of s (checked by batch_pb_check_samples; s may be
 * NULL when n = 0) into mem (8-byte aligned, batch_pb_samples_bytes of
 * room) and makes *out a view of them (data.h: freed with mem, never with
 * data_batch_free): n, n_dense, n_tables and hotness of the schema, dense
 * NULL without dense features; iteration 0 and split DATA_TRAIN, for the
 * caller to set. */
void batch_pb_lay_out_samples(const Chanter__Oracle__V1__Samples *s, uint32_t n, const data_schema_t *schema,
                              void *mem, data_batch_t *out);

#endif
