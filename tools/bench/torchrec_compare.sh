#!/usr/bin/env bash
# chanter against TorchRec on the same cores, the comparison of docs/cpu.md:
# the default job's shape (DLRM, batch 2048, 26 tables of ROWS rows, dim
# 16, SGD) with every chanter default, TLS included, interleaved round by
# round so both see the same machine:
#   local:    `chanter train --local` against torchrec_dlrm.py in one process;
#   cluster:  a 2-trainer `local up` cluster against torchrun with 2 processes;
# for uniform ids and Zipf 1.05, at 100k rows, and uniform at 1M rows.
# Steady samples/s (chanter: steady_samples_per_sec; TorchRec: iterations
# 21 on).  Needs a virtual environment with torch, torchrec and
# fbgemm-gpu-cpu (docs/cpu.md says how); TorchRec is not a dependency.
#
#   tools/bench/torchrec_compare.sh VENV [ROUNDS] [ITERATIONS]
# SETUPS="local cluster" and JOBS="100000:0 100000:1.05 1000000:0" (rows:alpha)
# in the environment choose a part.
set -u
VENV=${1:?usage: torchrec_compare.sh VENV [ROUNDS] [ITERATIONS]}
ROUNDS=${2:-3}
ITERS=${3:-150}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CH=$ROOT/build/bin/chanter
PY=$VENV/bin/python
[ -x "$CH" ] || { echo "torchrec_compare: build chanter first (make)" >&2; exit 2; }
"$PY" -c "import torchrec" 2>/dev/null || { echo "torchrec_compare: $PY cannot import torchrec" >&2; exit 2; }
W=$(mktemp -d /tmp/torchrec-compare.XXXXXX)
trap 'rm -rf "$W"' EXIT

rows_of() { python3 -c "print(','.join(['$1']*26))"; }
chanter_local() { # rows alpha
  "$CH" --set batch_size=2048 --set table_rows="$(rows_of "$1")" --set synthetic.alpha="$2" --set iterations="$ITERS" \
    --set eval_batches=0 --json train --local --quiet 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('steady_samples_per_sec') or d['samples_per_sec'])"
}
chanter_cluster() { # rows alpha
  local c=$W/c
  rm -rf "$c"
  "$CH" --set batch_size=2048 --set table_rows="$(rows_of "$1")" --set synthetic.alpha="$2" --set iterations="$ITERS" \
    --set eval_batches=1 local up --workdir "$c" >/dev/null 2>&1 &&
    "$CH" --config "$c/job.ini" train --workdir "$c" --quiet >/dev/null 2>&1
  local rc=$?
  "$CH" local down --workdir "$c" >/dev/null 2>&1
  [ $rc -eq 0 ] && python3 -c "import json; print(json.load(open('$c/summary.json'))['steady_samples_per_sec'])" || echo nan
}
torchrec() { # processes rows alpha
  local n=$1
  shift
  (cd "$W" && if [ "$n" = 1 ]; then
    "$PY" "$ROOT/tools/bench/torchrec_dlrm.py" --rows "$1" --alpha "$2" --iterations "$ITERS"
  else
    "$VENV/bin/torchrun" --nproc-per-node "$n" --master-port 29541 "$ROOT/tools/bench/torchrec_dlrm.py" \
      --rows "$1" --alpha "$2" --iterations "$ITERS"
  fi 2>/dev/null | tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['steady_samples_per_sec'])")
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%FT%TZ); $ROUNDS rounds of $ITERS iterations"
printf "%-8s %-10s %-6s %5s %12s %12s %7s\n" setup rows ids round chanter torchrec ratio
for setup in ${SETUPS:-local cluster}; do
  for job in ${JOBS:-100000:0 100000:1.05 1000000:0}; do
    set -- ${job/:/ }
    ids=$([ "$2" = 0 ] && echo uniform || echo "zipf$2")
    for r in $(seq 1 "$ROUNDS"); do
      if [ $((r % 2)) = 1 ]; then # alternate who goes first
        if [ $setup = local ]; then a=$(chanter_local "$1" "$2"); b=$(torchrec 1 "$1" "$2")
        else a=$(chanter_cluster "$1" "$2"); b=$(torchrec 2 "$1" "$2"); fi
      else
        if [ $setup = local ]; then b=$(torchrec 1 "$1" "$2"); a=$(chanter_local "$1" "$2")
        else b=$(torchrec 2 "$1" "$2"); a=$(chanter_cluster "$1" "$2"); fi
      fi
      printf "%-8s %-10s %-6s %5s %12s %12s %7s\n" $setup "$1" "$ids" "$r" "$a" "$b" \
        "$(python3 -c "print('%.2f' % ($a / $b))" 2>/dev/null || echo nan)"
    done
  done
done
