/*
 * blas_cpu: the OpenBLAS kernel set every chanter process that does math
 * runs, chosen from the CPU's features with no setting.
 *
 * OpenBLAS (Debian 12: 0.3.21, DYNAMIC_ARCH) picks its kernel set once, in
 * its library constructor, from the CPU's family/model; a CPU newer than the
 * library (Emerald Rapids, family 6 model 207) gets the generic "Prescott"
 * SSE3 kernels, 3-9x slower than the AVX2/AVX-512 ones.  The only way to
 * change that choice is OPENBLAS_CORETYPE in the environment *before* the
 * library loads, so blas_cpu_init(), the first call of main(), re-executes
 * the program once (same argv, environment, file descriptors, pid) with
 * OPENBLAS_CORETYPE set when OpenBLAS's own pick is of a lower tier
 * (generic < AVX2 < AVX-512) than the CPU supports, and then removes the
 * variable again, so children decide for themselves.  The choice goes by
 * CPU FEATURES (cpuid and the register state the OS enabled, XCR0), never
 * by model number: an AVX-512 kernel set on a CPU or OS without AVX-512
 * dies of SIGILL.  A user's own OPENBLAS_CORETYPE is kept; CHANTER_BLAS_
 * REEXEC=0 turns the re-exec off (for debugging).
 *
 * Rounding: different kernel sets sum the products of a GEMM in different
 * orders (block sizes, FMA or not, vector width), so results differ in the
 * last bits between kernel sets.  Within one process the set is fixed, so
 * a run is bit-identical to a rerun on the same machine; digests are
 * comparable only between runs on the same kernel set (summary.json's
 * "blas" says which).
 */
#ifndef CHANTER_BLAS_CPU_H
#define CHANTER_BLAS_CPU_H

/* What cpuid says (raw bits) and which register state the OS saves
 * (XCR0): an instruction set is usable only with both -- AVX/AVX2/FMA need
 * OSXSAVE and XCR0 bits 1-2 (SSE, YMM), AVX-512 also bits 5-7 (opmask,
 * ZMM_Hi256, Hi16_ZMM). */
typedef struct blas_cpu_features_s {
  int osxsave, avx, avx2, fma;
  int avx512f, avx512bw, avx512dq, avx512vl, avx512cd, avx512bf16;
  unsigned long long xcr0; /* 0 when !osxsave */
} blas_cpu_features_t;

/* Who decided the kernel set this process runs. */
typedef enum {
  BLAS_CPU_BY_OPENBLAS = 0, /* OpenBLAS's own pick, as good as the features allow */
  BLAS_CPU_BY_CHANTER,      /* chanter re-executed with OPENBLAS_CORETYPE */
  BLAS_CPU_BY_USER,         /* OPENBLAS_CORETYPE set in the environment */
  BLAS_CPU_NOT_FIXED,       /* OpenBLAS's pick is below the CPU and stays (re-exec off or failed) */
} blas_cpu_by_t;

/* Reads cpuid and XCR0 into *f (all zero off x86-64).  Any thread. */
void blas_cpu_probe(blas_cpu_features_t *f);

/* The kernel set for these features, a pure function: "Cooperlake"
 * (AVX-512 F/BW/DQ/VL/CD + BF16), "SkylakeX" (AVX-512 F/BW/DQ/VL/CD),
 * "Haswell" (AVX2 + FMA), or NULL (neither: OpenBLAS's pick is kept), each
 * only where XCR0 says the OS enabled the registers.  Static strings. */
const char *blas_cpu_pick(const blas_cpu_features_t *f);

/* The tier of an OpenBLAS kernel-set name: 2 AVX-512 (SkylakeX,
 * Cooperlake, SapphireRapids), 1 AVX2 (Haswell, Zen, ...), 0 anything
 * else (Prescott, Nehalem, Sandybridge, unknown, NULL). */
int blas_cpu_tier(const char *core);

/* The first call of main(), before any thread or socket of ours exists:
 * may re-execute the program (returns only when it did not, or in the
 * re-executed process), records the choice for blas_cpu_describe().  Calls
 * after the first return at once.  Main thread only. */
void blas_cpu_init(char **argv);

/* The kernel set in use ("SkylakeX"), from OpenBLAS.  Any thread. */
const char *blas_cpu_core(void);
/* Who chose it (BLAS_CPU_BY_OPENBLAS before blas_cpu_init ran). */
blas_cpu_by_t blas_cpu_by(void);
/* One line for the log, e.g. "OpenBLAS 0.3.21 kernels SkylakeX (chosen by
 * chanter: avx512f/bw/dq/vl/cd present; OpenBLAS alone picked Prescott)".
 * Static storage, valid for the process's life; any thread after init. */
const char *blas_cpu_describe(void);
/* "chanter", "openblas", "environment" or "not fixed" (for JSON). */
const char *blas_cpu_by_name(blas_cpu_by_t by);

/* Tests only: with CHANTER_BLAS_TEST_FALLBACK=1, an OPENBLAS_CORETYPE in
 * the environment is taken for OpenBLAS's own fallback instead of a
 * user's choice, so the re-exec can be exercised on a CPU OpenBLAS
 * knows (tests/unit/test_trainer_nn.c). */

#endif
