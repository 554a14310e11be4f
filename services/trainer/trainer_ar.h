/*
 * trainer_ar: the dense-gradient all-reduce of a trainer, in buckets,
 * overlapped with the backward pass.
 *
 * The model's backward finishes gradients as a growing suffix of its one
 * gradient array (model_set_grad_ready).  The array is cut into fixed
 * BUCKETS of bucket_floats floats counted from its end (bucket 0 =
 * [n - B, n), bucket 1 = [n - 2B, n - B), ..., the last one starting at 0),
 * so the layout depends on (n, B) only, never on timing.  A bucket is
 * handed to this module's communication thread as soon as all of it is
 * final, and all-reduced there (coll_allreduce_sum_f32, in bucket order,
 * on the trainer's one group) while the backward computes earlier layers;
 * trainer_ar_finish waits for the rest.
 *
 * Determinism: for P <= 2 every element's sum is the single rounded
 * x0 + x1, whatever the buckets; for P >= 3 Gloo's ring order depends on
 * an element's offset inside its buffer (coll.h), so the bucket size is
 * part of the job's configuration (trainer.bucket_kb): the same job gives
 * the same bits, another bucket size may differ in the last bits.
 *
 * With trainer.comm_schedule = priority there is no thread here: a ready
 * bucket k of iteration x is the scheduler's operation (DENSE, x, k), run
 * by its communication thread between more urgent ones (trainer_sched.h).
 *
 * device = cuda: grads is the trainer's HOST mirror of gradients that
 * live on the GPU (model_dev.h), and the GPU model has no grad-ready hook,
 * so nothing is handed over before trainer_ar_finish; the caller brings
 * the gradients to the mirror just before it and sends the sums back just
 * after (trainer_exec.c's dense_finish: trainer_step_grads_fetch /
 * trainer_step_grads_changed).
 *
 * Threads: trainer_ar_begin / trainer_ar_finish on the training thread; trainer_ar_ready from
 * inside model_backward (the same thread).  The group (coll_t) is used by
 * the communication thread only between trainer_ar_begin and trainer_ar_finish, and by
 * the training thread otherwise (the hand-off is a mutex: happens-before).
 */
#ifndef CHANTER_TRAINER_AR_H
#define CHANTER_TRAINER_AR_H

#include <stddef.h>

#include "coll.h"
#include "trainer_sched.h"

typedef struct trainer_ar_s trainer_ar_t;

/* Over grads[0..n) on group c.  bucket_floats == 0: one bucket of the
 * whole array, all-reduced by trainer_ar_finish on the calling thread after the
 * backward (no overlap, no thread).  sched (trainer.comm_schedule =
 * priority): no thread here; each bucket, once ready, is an operation of
 * class DENSE in the scheduler's queue (trainer_sched.h), which owns the
 * group.  0, -ENOMEM, -EAGAIN. */
int trainer_ar_create(coll_t *c, trainer_sched_t *sched, float *grads, size_t n, size_t bucket_floats,
                      trainer_ar_t **out);
void trainer_ar_destroy(trainer_ar_t *a);
size_t trainer_ar_buckets(const trainer_ar_t *a);

/* Before the backward of iteration x: nothing is ready yet. */
void trainer_ar_begin(trainer_ar_t *a, uint64_t x);
/* The model's hook (model_grad_ready_fn): grads[lo, n) are final. */
void trainer_ar_ready(void *a, size_t lo);
/* After the backward: waits until every bucket is all-reduced (doing any
 * the hook did not see, e.g. without overlap).  0 or the first failed
 * all-reduce's code (the group is then unusable, coll.h).  *t_comm: the
 * seconds the communication thread spent in all-reduces this step (the
 * overlapped part included). */
int trainer_ar_finish(trainer_ar_t *a, double *t_comm);

#endif
