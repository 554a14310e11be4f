/*
 * trainer_ckpt: a trainer's part of a whole-job checkpoint, and of a
 * resume from one (DESIGN.md section 5).
 *
 * A checkpoint at iteration c reaches the trainer as a CheckpointWork item
 * after Step c (and the evaluations due after c).  The conductor first
 * waits for c's background work (its delayed synchronization and
 * write-backs); then trainer_ckpt_take writes back the rows the oracle
 * listed -- the rows this trainer holds newer than the servers' copy and
 * is the one to write back (cacher_flush) -- WITHOUT evicting them, stores
 * the dense state as a blob when it is this trainer's part, and answers
 * CheckpointDone.  Nothing in the cache or the model changes, so training
 * goes on with the same bits.
 *
 * A resumed job starts with a ResumeWork item: the dense state is loaded
 * from its blob and the job goes on at its start iteration with an empty
 * cache (the oracle's decisions start from an empty cache too).
 *
 * The dense state blob: "CHDENSE1", then little-endian u32 opt kind, u64
 * optimizer steps, u64 parameters, u64 optimizer state floats, the
 * parameters and the state as float32, then the SHA-256 of everything
 * before it.  The same bytes on every trainer (the dense all-reduce makes
 * the parameters and the dense optimizer's state identical everywhere).
 *
 * Training thread only.
 */
#ifndef CHANTER_TRAINER_CKPT_H
#define CHANTER_TRAINER_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "trainer_loop.h"
#include "trainer_work.h"
#include "trainer_step.h"

/* The checkpoint item w (its background work already waited for): the
 * flush, the dense blob, CheckpointDone.  0 or an error with err. */
int trainer_ckpt_take(trainer_t *t, const trainer_work_t *w, char *err, size_t err_len);

/* The resume item w: loads the dense state; *expect = the start
 * iteration.  0 or an error with err (a missing or damaged blob, another
 * model or optimizer). */
int trainer_ckpt_resume(trainer_t *t, const trainer_work_t *w, uint64_t *expect, char *err, size_t err_len);

/* The dense state of ts as a blob (*buf malloc'ed; on device = cuda
 * copied from the GPU first).  0, -ENOMEM or ERR_CUDA. */
int trainer_ckpt_dense_encode(trainer_step_t *ts, uint8_t **buf, size_t *len);
/* Loads a dense-state blob into ts.  0, or ERR_BADMSG / ERR_CONFIG with a
 * sentence in err; ts is unchanged on failure. */
int trainer_ckpt_dense_decode(trainer_step_t *ts, const uint8_t *buf, size_t len, char *err, size_t err_len);

#endif
