/*
 * blas_cpu: choose OpenBLAS's kernel set from the CPU's features (see
 * blas_cpu.h for why and how; NOTES-h4.md for the measurements).
 *
 * The mechanism is a re-exec because OpenBLAS reads OPENBLAS_CORETYPE in
 * its ELF constructor, which glibc runs before main(), and 0.3.21 has no
 * call to switch kernels afterwards.  An ELF constructor of our own that
 * sets the variable would have to run before libopenblas's, which glibc's
 * init order (dependencies first, then reverse load order, re-sorted since
 * glibc 2.35) does not promise for unrelated libraries.
 *
 * Rounding: each kernel set has its own blocking and accumulation order,
 * so two kernel sets give results that differ in the last bits; a process
 * runs one set from start to end, so reruns on one machine are
 * bit-identical, and digests are comparable only on one kernel set.
 */
#include "blas_cpu.h"
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

/* environment: the guard the re-executed process finds (its value: what
 * OpenBLAS picked alone), and the off switch */
#define ENV_GUARD "CHANTER_BLAS_REEXEC_FROM"
#define ENV_SWITCH "CHANTER_BLAS_REEXEC"
#define ENV_CORE "OPENBLAS_CORETYPE"
#define ENV_TEST "CHANTER_BLAS_TEST_FALLBACK"

static struct {
  int done;
  blas_cpu_by_t by;
  char line[512];
} st;

void blas_cpu_probe(blas_cpu_features_t *f) {
  memset(f, 0, sizeof *f);
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  f->osxsave = !!(c & bit_OSXSAVE);
  f->avx = !!(c & bit_AVX);
  f->fma = !!(c & bit_FMA);
  if (f->osxsave) { /* XGETBV faults without OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f->xcr0 = ((unsigned long long)hi << 32) | lo;
  }
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  f->avx2 = !!(b & bit_AVX2);
  f->avx512f = !!(b & bit_AVX512F);
  f->avx512bw = !!(b & bit_AVX512BW);
  f->avx512dq = !!(b & bit_AVX512DQ);
  f->avx512vl = !!(b & bit_AVX512VL);
  f->avx512cd = !!(b & bit_AVX512CD);
  __cpuid_count(7, 1, a, b, c, d);
  f->avx512bf16 = !!(a & (1u << 5));
#endif
}

/* 1 where the OS saves YMM (resp. also opmask + ZMM) state */
static int os_ymm(const blas_cpu_features_t *f) { return f->osxsave && f->avx && (f->xcr0 & 0x6) == 0x6; }
static int os_zmm(const blas_cpu_features_t *f) { return os_ymm(f) && (f->xcr0 & 0xe6) == 0xe6; }
static int has_avx512(const blas_cpu_features_t *f) {
  return os_zmm(f) && f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl && f->avx512cd;
}

const char *blas_cpu_pick(const blas_cpu_features_t *f) {
  /* OpenBLAS's SkylakeX kernels use F, BW, DQ, VL (and it tests CD too);
   * Cooperlake is SkylakeX's sgemm plus BF16 kernels -- the set 0.3.21
   * itself picks on the BF16 CPUs it knows */
  if (has_avx512(f)) return f->avx512bf16 ? "Cooperlake" : "SkylakeX";
  if (os_ymm(f) && f->avx2 && f->fma) return "Haswell";
  return NULL;
}

static int name_in(const char *core, const char *const *list) {
  for (; *list; list++)
    if (strcasecmp(core, *list) == 0) return 1;
  return 0;
}

int blas_cpu_tier(const char *core) {
  static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
  static const char *const avx2[] = {"Haswell", "Zen", "Excavator", NULL};
  if (!core) return 0;
  if (name_in(core, avx512)) return 2;
  if (name_in(core, avx2)) return 1;
  return 0;
}

const char *blas_cpu_core(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

blas_cpu_by_t blas_cpu_by(void) { return st.by; }

const char *blas_cpu_by_name(blas_cpu_by_t by) {
  switch (by) {
  case BLAS_CPU_BY_CHANTER: return "chanter";
  case BLAS_CPU_BY_USER: return "environment";
  case BLAS_CPU_NOT_FIXED: return "not fixed";
  default: return "openblas";
  }
}

/* "avx512f/bw/dq/vl/cd/bf16", "avx2+fma, ..." or "no avx2+fma" */
static void features_str(const blas_cpu_features_t *f, char *s, size_t n) {
  if (has_avx512(f))
    snprintf(s, n, "avx512f/bw/dq/vl/cd%s present", f->avx512bf16 ? "/bf16" : "");
  else if (os_ymm(f) && f->avx2 && f->fma)
    snprintf(s, n, "avx2+fma present, avx512 %s", f->avx512f ? "not enabled by the OS (XCR0)" : "absent");
  else snprintf(s, n, "no usable avx2+fma");
}

/* OpenBLAS 0.3.21's config string starts "OpenBLAS 0.3.21 ..." */
static void lib_version(char *s, size_t n) {
  const char *cfg = openblas_get_config();
  const char *sp = cfg ? strchr(cfg, ' ') : NULL;
  size_t l = sp ? strcspn(sp + 1, " ") : 0;
  snprintf(s, n, "OpenBLAS %.*s", (int)(l ? l : 1), l ? sp + 1 : "?");
}

static void say(const char *why) {
  char lib[64];
  lib_version(lib, sizeof lib);
  snprintf(st.line, sizeof st.line, "%s kernels %s (%s)", lib, blas_cpu_core(), why);
}

void blas_cpu_init(char **argv) {
  if (st.done) return;
  st.done = 1;
  blas_cpu_features_t f;
  blas_cpu_probe(&f);
  char fs[96], why[400];
  features_str(&f, fs, sizeof fs);
  const char *want = blas_cpu_pick(&f), *have = blas_cpu_core();
  const char *from = getenv(ENV_GUARD), *user = getenv(ENV_CORE), *test = getenv(ENV_TEST);
  if (user && test && !strcmp(test, "1")) user = NULL; /* blas_cpu.h: tests only */

  if (from) { /* the re-executed process: restore the environment */
    st.by = BLAS_CPU_BY_CHANTER;
    snprintf(why, sizeof why, "chosen by chanter: %s; OpenBLAS alone picked %s", fs, from);
    if (blas_cpu_tier(have) < blas_cpu_tier(want)) {
      st.by = BLAS_CPU_NOT_FIXED;
      snprintf(why, sizeof why, "chanter asked for %s (%s) but OpenBLAS runs %s", want, fs, have);
    }
    unsetenv(ENV_GUARD);
    unsetenv(ENV_CORE);
    say(why);
    return;
  }
  if (user) {
    st.by = BLAS_CPU_BY_USER;
    snprintf(why, sizeof why, "OPENBLAS_CORETYPE=%s set in the environment%s", user,
             blas_cpu_tier(user) > blas_cpu_tier(want) ? "; this CPU lacks its instructions: expect SIGILL" : "");
    say(why);
    return;
  }
  if (!want || blas_cpu_tier(have) >= blas_cpu_tier(want)) {
    st.by = BLAS_CPU_BY_OPENBLAS;
    snprintf(why, sizeof why, "chosen by OpenBLAS: %s", fs);
    say(why);
    return;
  }
  const char *sw = getenv(ENV_SWITCH);
  if (sw && !strcmp(sw, "0")) {
    st.by = BLAS_CPU_NOT_FIXED;
    snprintf(why, sizeof why, "OpenBLAS picked %s; chanter would run %s (%s) but " ENV_SWITCH "=0", have, want, fs);
    say(why);
    return;
  }
  /* once: the guard stops a second re-exec whatever OpenBLAS then does */
  fflush(NULL);
  if (setenv(ENV_GUARD, have, 1) == 0 && setenv(ENV_CORE, want, 1) == 0) execv("/proc/self/exe", argv);
  int e = errno;
  unsetenv(ENV_GUARD);
  unsetenv(ENV_CORE);
  st.by = BLAS_CPU_NOT_FIXED;
  snprintf(why, sizeof why, "OpenBLAS picked %s; re-running with OPENBLAS_CORETYPE=%s failed: %s", have, want,
           strerror(e));
  say(why);
}

const char *blas_cpu_describe(void) {
  if (!st.line[0]) say("blas_cpu_init not called");
  return st.line;
}
