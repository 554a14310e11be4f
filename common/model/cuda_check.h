/*
 * cuda_check: may this process compute with device = cuda, and the one
 * place where the CUDA runtime's and cuBLAS's status codes become project
 * errors (STYLE.md: every foreign error shape is converted in exactly one
 * wrapper file).
 *
 * Plain C with no CUDA types in this header, so the CLI and the tests
 * include it whether or not the build has CUDA.  In a CUDA=0 build (or one
 * without nvcc) cuda_check always refuses, with a sentence saying
 * so; the trainer never falls back to the CPU silently.
 */
#ifndef CHANTER_CUDA_CHECK_H
#define CHANTER_CUDA_CHECK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 0 when a CUDA device is usable by this build: one is visible, its
 * context can be created and its compute capability is one the build has
 * code for (7.5 or newer).  Otherwise ERR_NOGPU with one sentence in err
 * saying why and what to do, e.g. "no CUDA device found
 * (cudaGetDeviceCount: ...): this machine cannot run device = cuda; use
 * device = cpu".  Never crashes on a machine without a driver or GPU.
 * Checks the calling thread's current device (0 unless the caller chose
 * another with cudaSetDevice), whose context it creates.  Any thread. */
int cuda_check(char *err, size_t err_len);

/* A printable identity of the device this process computes on (the
 * calling thread's current device, as cuda_check): "GPU-<uuid>" in
 * nvidia-smi's spelling (cudaDeviceProp.uuid), which names one physical
 * GPU (or one MIG instance) whatever CUDA_VISIBLE_DEVICES renumbers, so
 * two processes that print the same id share a GPU.  pci, when not NULL,
 * gets its PCI bus id ("0000:65:00.0"; "" if the runtime has none).
 * 0, or ERR_NOGPU with cuda_check's sentence in err (no device, no
 * driver, or a build without CUDA: "this chanter was built without
 * CUDA ...").  id_len >= 41 holds any id.  Any thread. */
int cuda_check_device_id(char *id, size_t id_len, char *pci, size_t pci_len, char *err, size_t err_len);

/* 1 when this chanter was built with CUDA (CHANTER_CUDA), else 0. */
int cuda_check_built(void);

/* Conversion of a cudaError_t / cublasStatus_t (passed as int) made by the
 * call named `what`: 0 for success, else ERR_CUDA with "what: <the
 * library's message> (code N)" in err.  Any thread. */
int cuda_check_error(int cuda_status, const char *what, char *err, size_t err_len);
int cuda_check_cublas_error(int cublas_status, const char *what, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
