#!/usr/bin/env bash
# tools/gpu/quick.sh PACK.tar.xz: the short device check, every step under a
# timeout cut to what is left of QUICK_BUDGET_S (default 420 s):
#   1. the GPU unit tests (the kernels against the CPU, the Adagrad golden
#      file, dlrm_dcn, NCCL on one GPU);
#   2. tests/integration/test_gpu.sh (cuda against cpu, digests, local up);
#   3. train --local on docs/gpu.md's shape at batch 2048 and 16384;
#   4. chanter bench model --device cuda (dlrm, dlrm_dcn; and the DLRMv2 job);
#   5. chanter bench feed --quick --device cuda (the one-trainer cluster);
#   6. the default job on a local cluster of 2 trainers sharing the GPU,
#      device = cuda against device = cpu;
#   7. dlrm_dcn against dlrm, train --local on the default job, cpu and cuda.
# Pack as for check.sh (PACK_EXTRA="tests/integration tests/golden tools/gpu deploy/jobs"
# ../shared/gpu/pack.sh build PACK.tar.xz); one log, $OUT/quick.log ($OUT:
# the device tool's; /tmp otherwise).
PACK=${1:-gpupack/gpu-pack.tar.xz}
OUT=${OUT:-/tmp}
BUDGET=${QUICK_BUDGET_S:-420}
set -u
exec > >(tee "$OUT/quick.log") 2>&1
mkdir -p /tmp/p && tar -C /tmp/p -xJf "$PACK" && cd /tmp/p && . ./env.sh >/dev/null || exit 2
unset OPENBLAS_CORETYPE
mkdir -p tests/unit # the golden file is found as tests/unit/../golden, from the root
export CHANTER_BUILD=/tmp/p
# t LIMIT CMD...: CMD under timeout, LIMIT cut to the budget left
t() {
  local lim=$1 left=$((BUDGET - SECONDS))
  shift
  [ "$lim" -gt "$left" ] && lim=$left
  [ "$lim" -lt 3 ] && { echo "SKIP (budget spent): $*"; return 99; }
  timeout -k 3 "$lim" "$@"
}
say() { printf '\n=== %s (t=%ds)\n' "$*" "$SECONDS"; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "?"; }
C=bin/chanter

say "1. GPU unit tests"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc
for u in test_trainer_cuda test_trainer_embdev test_model_adagrad_golden test_model_dlrm_dcn test_coll test_model_devid; do
  t 60 bin/$u >/tmp/$u.log 2>&1
  echo "$u rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/$u.log | tr '\n' ' ')"
  grep -E "^\[  (FAILED|ERROR|  SKIPPED) \]|GPU .* CPU|skip" /tmp/$u.log | head -8
done

say "2. tests/integration/test_gpu.sh"
t 120 bash tests/integration/test_gpu.sh >/tmp/test_gpu.log 2>&1
echo "test_gpu rc=$?"
grep -E "^(ok|not ok)|^# " /tmp/test_gpu.log | cut -c1-240

say "3. train --local, DLRM 26 x 100000 x 16, uniform ids"
ROWS=$(python3 -c "print(','.join(['100000'] * 26))")
S=(--set model=dlrm --set table_rows=$ROWS --set embedding_dim=16 --set synthetic.alpha=0
   --set synthetic.samples=4000000 --set eval_batches=1 --set eval_every=0)
for b in 2048 16384; do
  t 40 $C "${S[@]}" --set iterations=300 --set batch_size=$b --set device=cuda train --local --quiet \
    --workdir /tmp/l$b >/dev/null 2>/tmp/local$b.err
  echo "local b=$b rc=$? samples/s $(js /tmp/l$b/summary.json "round(d['samples_per_sec'])") phases/it $(js /tmp/l$b/summary.json "d['phase_seconds_per_iteration']")"
done

say "4. bench model --device cuda"
t 60 $C bench model --device cuda --models dlrm,dlrm_dcn --seconds 2
t 60 $C --config deploy/jobs/mlperf-dlrmv2.ini bench model --device cuda --models dlrm_dcn --seconds 2

say "5. bench feed --quick --device cuda (one trainer on the GPU, batch 16384)"
t 150 $C bench feed --quick --device cuda

say "6. the default job, 2 trainers sharing the GPU: cuda against cpu"
for dev in cuda cpu; do
  t 30 $C --set device=$dev --set eval_every=0 local up --workdir /tmp/two$dev >/dev/null 2>&1 &&
    t 90 $C --config /tmp/two$dev/job.ini train --workdir /tmp/two$dev --quiet >/dev/null 2>/tmp/two$dev.err
  echo "2 trainers $dev rc=$? samples/s $(js /tmp/two$dev/summary.json "round(d['samples_per_sec']), 'steady', round(d.get('steady_samples_per_sec') or 0), 'AUC', round(d['test_auc'],4)")"
  echo "  ms/it $(js /tmp/two$dev/summary.json "' '.join('%s=%.1f' % (k, 1e3 * v) for k, v in d['phase_seconds'].items() if v > 5e-4)")"
  grep -m2 -iE "gloo|nccl|share" /tmp/two$dev/logs/trainer-0.log | cut -c1-200
  timeout 20 $C local down --workdir /tmp/two$dev >/dev/null 2>&1
done

say "7. dlrm_dcn against dlrm, train --local, the default job"
for m in "dlrm cpu" "dlrm_dcn cpu" "dlrm_dcn cuda"; do
  set -- $m
  t 60 $C --set model=$1 --set device=$2 train --local --quiet --workdir /tmp/m$1$2 >/dev/null 2>/tmp/m$1$2.err
  echo "$1 $2 rc=$? $(js /tmp/m$1$2/summary.json "'AUC', round(d['test_auc'],4), 'logloss', round(d['test_logloss'],4), 'samples/s', round(d['samples_per_sec'])")"
done
say "done"
