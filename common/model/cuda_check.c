/*
 * cuda_check: the device probe behind device = cuda, and the conversion of
 * CUDA runtime / cuBLAS status codes into ERR_CUDA (see cuda_check.h).
 *
 * Only the CUDA runtime API is used (libcudart): on a machine without the
 * NVIDIA driver, cudaGetDeviceCount returns an error (no driver, or a
 * driver older than the runtime) instead of crashing, and that error is
 * what the refusal sentence quotes.  In a build without CUDA every
 * function still exists, so callers need no #ifdef.
 */
#include "cuda_check.h"

#include <stdio.h>

#include "err.h"

#ifdef CHANTER_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif

/* The oldest compute capability the build carries code for: the Makefile's
 * CUDA_ARCHS start at sm_75 (CUDA 13 dropped everything older). */
#define MIN_CC 75

int cuda_check_built(void) {
#ifdef CHANTER_CUDA
  return 1;
#else
  return 0;
#endif
}

#ifdef CHANTER_CUDA

int cuda_check(char *err, size_t err_len) {
  int n = 0, dev = 0, rc = 0;
  struct cudaDeviceProp prop;
  cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n <= 0) {
    snprintf(err, err_len,
             "no CUDA device found (cudaGetDeviceCount: %s): this machine cannot run device = cuda; "
             "use device = cpu",
             st != cudaSuccess ? cudaGetErrorString(st) : "0 devices");
    rc = ERR_NOGPU;
    goto out;
  }
  /* the calling thread's device: 0 unless the caller picked another */
  if ((st = cudaGetDevice(&dev)) == cudaSuccess) st = cudaGetDeviceProperties(&prop, dev);
  if (st != cudaSuccess) {
    snprintf(err, err_len,
             "CUDA device %d cannot be queried (cudaGetDeviceProperties: %s): this machine cannot run "
             "device = cuda; use device = cpu",
             dev, cudaGetErrorString(st));
    rc = ERR_NOGPU;
    goto out;
  }
  if (prop.major * 10 + prop.minor < MIN_CC) {
    snprintf(err, err_len,
             "CUDA device %d (%s) has compute capability %d.%d; this chanter has GPU code for %d.%d and "
             "newer: use device = cpu",
             dev, prop.name, prop.major, prop.minor, MIN_CC / 10, MIN_CC % 10);
    rc = ERR_NOGPU;
    goto out;
  }
  /* creating the context is what fails on a busy exclusive-process GPU or
   * a driver/runtime mismatch: find out here, not in the first kernel */
  if ((st = cudaFree(NULL)) != cudaSuccess) {
    snprintf(err, err_len,
             "CUDA device %d (%s) is not usable (context creation: %s): this machine cannot run "
             "device = cuda; use device = cpu",
             dev, prop.name, cudaGetErrorString(st));
    rc = ERR_NOGPU;
    goto out;
  }
  if (err_len) err[0] = 0;
out:
  if (rc) (void)cudaGetLastError(); /* do not leave the failure for the next caller */
  return rc;
}

int cuda_check_device_id(char *id, size_t id_len, char *pci, size_t pci_len, char *err, size_t err_len) {
  struct cudaDeviceProp prop;
  int dev = 0, rc = cuda_check(err, err_len);
  if (id_len) id[0] = 0;
  if (pci_len) pci[0] = 0;
  if (rc) return rc;
  cudaError_t st = cudaGetDevice(&dev);
  if (st == cudaSuccess) st = cudaGetDeviceProperties(&prop, dev);
  if (st != cudaSuccess) {
    snprintf(err, err_len, "CUDA device %d cannot be queried (cudaGetDeviceProperties: %s)", dev,
             cudaGetErrorString(st));
    (void)cudaGetLastError();
    return ERR_NOGPU;
  }
  /* nvidia-smi -L's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
  const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
  snprintf(id, id_len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
           u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  if (pci_len && cudaDeviceGetPCIBusId(pci, (int)pci_len, dev) != cudaSuccess) {
    pci[0] = 0;
    (void)cudaGetLastError();
  }
  return 0;
}

int cuda_check_error(int cuda_status, const char *what, char *err, size_t err_len) {
  if (cuda_status == (int)cudaSuccess) return 0;
  snprintf(err, err_len, "%s: %s (%s, code %d)", what, cudaGetErrorString((cudaError_t)cuda_status),
           cudaGetErrorName((cudaError_t)cuda_status), cuda_status);
  return ERR_CUDA;
}

int cuda_check_cublas_error(int cublas_status, const char *what, char *err, size_t err_len) {
  if (cublas_status == (int)CUBLAS_STATUS_SUCCESS) return 0;
  snprintf(err, err_len, "%s: %s (cuBLAS code %d)", what,
           cublasGetStatusString((cublasStatus_t)cublas_status), cublas_status);
  return ERR_CUDA;
}

#else /* !CHANTER_CUDA */

int cuda_check(char *err, size_t err_len) {
  snprintf(err, err_len, "this chanter was built without CUDA (make CUDA=0 or no nvcc): use device = cpu");
  return ERR_NOGPU;
}

int cuda_check_device_id(char *id, size_t id_len, char *pci, size_t pci_len, char *err, size_t err_len) {
  if (id_len) id[0] = 0;
  if (pci_len) pci[0] = 0;
  return cuda_check(err, err_len);
}

int cuda_check_error(int cuda_status, const char *what, char *err, size_t err_len) {
  if (cuda_status == 0) return 0;
  snprintf(err, err_len, "%s: CUDA status %d (this chanter was built without CUDA)", what, cuda_status);
  return ERR_CUDA;
}

int cuda_check_cublas_error(int cublas_status, const char *what, char *err, size_t err_len) {
  if (cublas_status == 0) return 0;
  snprintf(err, err_len, "%s: cuBLAS status %d (this chanter was built without CUDA)", what,
           cublas_status);
  return ERR_CUDA;
}

#endif
