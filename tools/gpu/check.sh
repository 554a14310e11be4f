#!/usr/bin/env bash
# tools/gpu/check.sh: the device check of a GPU machine, in one short
# bounded run (under 6 minutes: every step has a timeout, cut to what is
# left of the whole budget).  Run from the repository root -- a checkout
# with build/, or the directory a pack was unpacked into:
#
#   here:    PACK_EXTRA="tests/integration tools/gpu" ../shared/gpu/pack.sh build gpu-pack.tar.xz
#   there:   mkdir -p p && tar -C p -xJf gpu-pack.tar.xz && cd p && tools/gpu/check.sh
#
# (the pack's layout, bin/ holding the daemons, the CLI and the test
# binaries, and env.sh, is found and sourced here; in a checkout build/bin
# and build/tests are used).  Everything goes to the terminal and to
# $OUT/check.log ($OUT: set by the device tool; /tmp otherwise).  Steps:
#   1. the GPU (nvidia-smi's one line);
#   2. the GPU unit tests: test_trainer_cuda, test_*embdev* if any,
#      test_coll (NCCL on one GPU), test_model_devid (the GPU identity);
#   3. tests/integration/test_gpu.sh (cuda against cpu, digests, local up);
#   4. `chanter bench model --device cuda`, if this chanter has the option;
#   5. `chanter train --local` on the issue's shape -- DLRM, 26 tables x
#      100000 rows, dim 16, uniform ids (synthetic.alpha = 0), 200
#      iterations -- at batch 2048 and 16384, samples/s from summary.json;
#   6. the plain-PyTorch baseline of the same model and shape
#      (tools/gpu/torch_dlrm.py, eager, FP32, SGD);
#   7. a `local up` cluster, 1 trainer on cuda, batch 16384: samples/s and
#      the phase split per iteration from summary.json;
# then a table of the figures.  Exit status: 0 when every step passed.
set -u
BUDGET=${CHECK_BUDGET_S:-340}
T_END=$((SECONDS + BUDGET))
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
LOG=$OUT/check.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
cd "$ROOT" || exit 2

if [ -f "$ROOT/env.sh" ] && [ -x "$ROOT/bin/chanter" ]; then # an unpacked pack
  [ -n "${CHANTER_PACK:-}" ] || . "$ROOT/env.sh"
  export CHANTER_BUILD=$ROOT # lib.sh: $CHANTER_BUILD/bin
  BIN=$ROOT/bin TESTS=$ROOT/bin
else
  export CHANTER_BUILD=${CHANTER_BUILD:-$ROOT/build}
  BIN=$CHANTER_BUILD/bin TESTS=$CHANTER_BUILD/tests
fi
C=$BIN/chanter
W=$(mktemp -d /tmp/chanter-check-XXXXXX)
FIG=$W/figures
: >"$FIG"
FAILED=()
fig() { printf '%-58s %s\n' "$1" "$2" >>"$FIG"; }
say() { printf '\n=== %s  (t=%ds)\n' "$*" "$SECONDS"; }
# step NAME LIMIT_S CMD...: CMD under timeout (LIMIT_S, cut to the budget left)
step() {
  local name=$1 lim=$2 left=$((T_END - SECONDS)) rc
  shift 2
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 5 ]; then
    echo "SKIP $name: the check's ${BUDGET}s budget is spent"
    FAILED+=("$name(no time)")
    return 1
  fi
  timeout -k 5 "$lim" "$@"
  rc=$?
  [ $rc -eq 124 ] && echo "TIMEOUT $name after ${lim}s"
  [ $rc -ne 0 ] && FAILED+=("$name(rc=$rc)")
  echo "--- $name: rc=$rc"
  return $rc
}
# jf FILE EXPR: a Python expression over the summary d, printed
jf() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "?"; }

say "1. the GPU"
step nvidia-smi 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fig "GPU" "${GPU:-none}"
echo "chanter: $C; host: $(hostname), $(nproc) CPUs"

say "2. GPU unit tests"
for t in "$TESTS"/test_trainer_cuda "$TESTS"/test_*embdev* "$TESTS"/test_coll "$TESTS"/test_model_devid; do
  [ -x "$t" ] || { [[ "$t" == *'*'* ]] || echo "(no $t)"; continue; }
  n=$(basename "$t")
  step "$n" 90 "$t"
  rc=$?
  fig "unit $n" "$([ $rc -eq 0 ] && echo pass || echo "FAIL (rc=$rc)")"
done

say "3. tests/integration/test_gpu.sh"
step test_gpu.sh 150 bash "$ROOT/tests/integration/test_gpu.sh"
rc=$?
fig "integration test_gpu.sh" "$([ $rc -eq 0 ] && echo pass || echo "FAIL (rc=$rc)")"

say "4. chanter bench model --device cuda"
if "$C" bench model --help 2>&1 | grep -q -- "--device"; then
  step "bench model" 45 "$C" bench model --device cuda --models dlrm --seconds 4
else
  echo "this chanter's bench model has no --device option: skipped"
fi

ROWS=$(python3 -c "print(','.join(['100000'] * 26))")
SHAPE=(--set model=dlrm --set table_rows="$ROWS" --set embedding_dim=16 --set synthetic.alpha=0
       --set synthetic.samples=4000000 --set iterations=200 --set eval_batches=1 --set eval_every=0)
say "5. chanter train --local, DLRM 26 x 100000 x 16, uniform ids, 200 iterations"
for b in 2048 16384; do
  step "train --local b=$b" 90 "$C" "${SHAPE[@]}" --set batch_size=$b --set device=cuda train --local --quiet \
    --workdir "$W/local$b" >/dev/null
  s=$W/local$b/summary.json
  echo "batch $b: samples/s $(jf "$s" "d['samples_per_sec']"); phases/iteration $(jf "$s" "d['phase_seconds_per_iteration']")"
  fig "chanter train --local cuda b=$b samples/s" "$(jf "$s" "round(d['samples_per_sec'])")"
done

say "6. plain PyTorch, the same model and shape"
step torch_dlrm 90 python3 "$HERE/torch_dlrm.py" --batch 2048 16384 --iters 100 >"$W/torch.jsonl"
cat "$W/torch.jsonl"
for b in 2048 16384; do
  fig "pytorch eager b=$b samples/s" \
    "$(python3 -c "import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get('batch') == $b: print(round(d['samples_per_sec']))" "$W/torch.jsonl" 2>/dev/null | head -1)"
done

say "7. local up: 1 trainer on cuda, batch 16384"
step "local up" 30 "$C" "${SHAPE[@]}" --set batch_size=16384 --set iterations=100 --set device=cuda \
  --set trainers=1 --set embedding_servers=1 --set dataprocs=2 --set lookahead=auto local up --workdir "$W/cl"
if [ $? -eq 0 ]; then
  step "local train" 120 "$C" --config "$W/cl/job.ini" train --workdir "$W/cl" --quiet >/dev/null
  timeout 30 "$C" local down --workdir "$W/cl" >/dev/null 2>&1
  s=$W/cl/summary.json
  echo "cluster: samples/s $(jf "$s" "d['samples_per_sec']") steady $(jf "$s" "d.get('steady_samples_per_sec')")"
  echo "cluster: phase seconds per iteration $(jf "$s" "d['phase_seconds']")"
  fig "chanter local up 1 trainer cuda b=16384 samples/s" "$(jf "$s" "round(d['samples_per_sec'])")"
  fig "  steady samples/s" "$(jf "$s" "round(d['steady_samples_per_sec'])")"
  fig "  ms/iteration by phase" "$(jf "$s" "' '.join('%s=%.1f' % (k, 1e3 * v) for k, v in d['phase_seconds'].items())")"
  fig "  steady ms/iteration by phase" "$(jf "$s" "' '.join('%s=%.1f' % (k, 1e3 * v) for k, v in d['steady_phase_seconds'].items() if v)")"
  tail -3 "$W/cl/logs/"trainer-0.log 2>/dev/null
fi

say "7b. local up: 1 trainer on cuda, batch 16384, table_strategy = auto"
step "local up auto" 30 "$C" "${SHAPE[@]}" --set batch_size=16384 --set iterations=100 --set device=cuda \
  --set trainers=1 --set embedding_servers=1 --set dataprocs=2 --set lookahead=auto --set table_strategy=auto \
  local up --workdir "$W/cla"
if [ $? -eq 0 ]; then
  step "local train auto" 120 "$C" --config "$W/cla/job.ini" train --workdir "$W/cla" --quiet >/dev/null
  timeout 30 "$C" local down --workdir "$W/cla" >/dev/null 2>&1
  s=$W/cla/summary.json
  fig "chanter local up 1 trainer cuda b=16384 auto samples/s" "$(jf "$s" "round(d['samples_per_sec'])")"
  fig "  steady samples/s" "$(jf "$s" "round(d['steady_samples_per_sec'])")"
  fig "  ms/iteration by phase" "$(jf "$s" "' '.join('%s=%.1f' % (k, 1e3 * v) for k, v in d['phase_seconds'].items())")"
  fig "  steady ms/iteration by phase" "$(jf "$s" "' '.join('%s=%.1f' % (k, 1e3 * v) for k, v in d['steady_phase_seconds'].items() if v)")"
fi

say "figures (t=${SECONDS}s; log: $LOG)"
cat "$FIG"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}  (work dir kept: $W)"
  exit 1
fi
rm -rf "$W"
echo "all steps passed"
