#!/usr/bin/env bash
# tools/gpu/quick.sh PACK.tar.xz: the short device check (about 70 s on an H200): the GPU unit tests,
# train --local at batch 2048 and 16384, a 1-trainer auto cluster at 16384, then tests/integration/test_gpu.sh.
# Pack as for check.sh (PACK_EXTRA="tests/integration tools/gpu" ../shared/gpu/pack.sh build PACK.tar.xz);
# logs go to $OUT (the device tool's; /tmp otherwise).  docs/gpu.md's run 3 is this script.
PACK=${1:-gpupack/gpu-pack.tar.xz}
OUT=${OUT:-/tmp}
set -u
mkdir -p /tmp/p && tar -C /tmp/p -xJf "$PACK" && cd /tmp/p && . ./env.sh >/dev/null
unset OPENBLAS_CORETYPE
export CHANTER_BUILD=/tmp/p
grep -m1 "model name" /proc/cpuinfo
for t in test_trainer_cuda test_trainer_embdev; do timeout 30 bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$? $(grep -E 'PASSED|FAILED' $OUT/$t.log | tr '\n' ' ')"; grep -E "^\[  (FAILED|ERROR) \]|GPU .* CPU" $OUT/$t.log | head -5; done
timeout 60 bin/test_trainer_nn 2>&1 | grep -iE "blas|kernel|chosen" | head -3
ROWS=$(python3 -c "print(','.join(['100000'] * 26))")
S=(--set model=dlrm --set table_rows=$ROWS --set embedding_dim=16 --set synthetic.alpha=0 --set synthetic.samples=4000000 --set eval_batches=1 --set eval_every=0)
for b in 2048 16384; do timeout 30 bin/chanter "${S[@]}" --set iterations=300 --set batch_size=$b --set device=cuda train --local --quiet --workdir /tmp/l$b >/dev/null 2>$OUT/local$b.err; echo "local b=$b rc=$? $(python3 -c "import json;d=json.load(open('/tmp/l$b/summary.json'));print(round(d['samples_per_sec']), d['phase_seconds_per_iteration'], d.get('blas'))")"; done
timeout 30 bin/chanter "${S[@]}" --set batch_size=16384 --set iterations=100 --set device=cuda --set trainers=1 --set embedding_servers=1 --set dataprocs=2 --set table_strategy=auto local up --workdir /tmp/cla >/dev/null 2>&1 && timeout 60 bin/chanter --config /tmp/cla/job.ini train --workdir /tmp/cla --quiet >/dev/null 2>$OUT/cla.err; echo "cluster auto rc=$?"; timeout 20 bin/chanter local down --workdir /tmp/cla >/dev/null 2>&1
python3 -c "import json;d=json.load(open('/tmp/cla/summary.json'));print(round(d['samples_per_sec']), round(d['steady_samples_per_sec']), {k: round(1e3*v,1) for k,v in d['phase_seconds'].items()}, 'steady', {k: round(1e3*v,1) for k,v in d['steady_phase_seconds'].items() if v})"
cp /tmp/cla/logs/trainer-0.log $OUT/ 2>/dev/null; true
timeout 75 bash tests/integration/test_gpu.sh > $OUT/test_gpu.log 2>&1; echo "test_gpu rc=$?"; grep -E "^(ok|not ok)|^# " $OUT/test_gpu.log | cut -c1-220
