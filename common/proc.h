/*
 * proc: process-wide set-up every chanter binary does first.
 *
 * proc_init() names the process in logs and tunes glibc malloc for what our
 * processes do all day: allocate and free buffers of a few hundred KiB to
 * tens of MiB (packed keys and rows of RPC messages).  glibc serves those
 * with a fresh mmap each time and returns them with munmap, so every call
 * paid page faults to zero new pages: measured here, a Lookup client spent a
 * quarter of its time in the page-fault handler.  Keeping such buffers in
 * the heap (mmap threshold 32 MiB, trim threshold 256 MiB) made loopback
 * Lookup ~1.5x faster.  Call once from main(), before threads start.
 */
#ifndef CHANTER_PROC_H
#define CHANTER_PROC_H

void proc_init(const char *name);

/* Names the calling thread (what `top -H`, `ps -L` and perf show; at most
 * 15 characters kept): every long-lived thread of a daemon names its role,
 * so that an operator can see which one is busy. */
void proc_name_thread(const char *name);

#endif
