/*
 * embedding_epoch: the write epoch on disk, data_dir/EPOCH ("epoch=N\n").
 * The embedding service refuses write-backs of epochs earlier than it
 * (a rolled-back run of the job); Restore and Clear raise it, durably,
 * before their work, and it is read back at start.
 */
#ifndef CHANTER_EMBEDDING_EPOCH_H
#define CHANTER_EMBEDDING_EPOCH_H

#include <stddef.h>
#include <stdint.h>

/* *e = the epoch stored in data_dir (0 when none).  0, -ENAMETOOLONG, or
 * ERR_BADMSG when the file is damaged (logged, with what to do). */
int embedding_epoch_load(const char *data_dir, uint64_t *e);

/* Stores e in data_dir, durably (fsio_replace).  0 or -errno with why. */
int embedding_epoch_store(const char *data_dir, uint64_t e, char *why, size_t why_len);

#endif
