#!/usr/bin/env bash
# Integration: the partitioned tables' placement, measured (summary.json's
# partition_compute_seconds and partition_balance; chanter bench placement):
#   - a two-trainer job with every table partitioned: summary.json has one
#     partition_compute_seconds per trainer, > 0 for each trainer that owns
#     a table (the tables list's owners), and partition_balance, min / max
#     of them, in (0, 1];
#   - the same job with every table cached: every trainer's time is 0 and
#     the balance null (no trainer pools a table);
#   - `chanter bench placement` (tiny iterations, one round, two trainers)
#     on a model fitted here: autoshard placed by autoshard, both placements
#     measured and compared, the aims printed, the same digest for both
#     (the placement changes no bits); a job file that does not exist is
#     refused naming it.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=30 eval_batches=0 table_strategy=partition
UP_ARGS=--insecure

run_job p2
expect "two trainers, every table partitioned: trains"
S=$WORK/p2/summary.json
python3 - "$S" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ms, bal = d["partition_compute_seconds"], d["partition_balance"]
owners = {t["owner"] for t in d["tables"] if t["strategy"] == "partition"}
assert len(ms) == d["trainers"] == 2, ms
assert owners, d["tables"]
for r in owners:
    assert ms[r] > 0, (r, ms)
assert 0 < bal <= 1, bal
assert abs(bal - min(ms) / max(ms)) < 1e-6, (bal, ms)
PY
expect_rc $? "per trainer partition_compute_seconds ($(jf "$S" "d['partition_compute_seconds']")) > 0 where it owns tables, partition_balance $(jf "$S" "d['partition_balance']") in (0, 1]"

run_job c2 --set table_strategy=cache
python3 -c "
import json, sys
d = json.load(open('$WORK/c2/summary.json'))
assert d['partition_compute_seconds'] == [0, 0], d['partition_compute_seconds']
assert d['partition_balance'] is None, d['partition_balance']"
expect_rc $? "every table cached: no trainer's partitioned work (zeros, balance null)"

# a model with a cost that grows with a table's ids and rows touched (a
# synthetic dataset, so that autoshard has something to plan with)
DATA=$WORK/tables.txt
python3 - "$DATA" <<'PY'
import math, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    f.write("# chanter bench tables v1\n# cpu: synthetic (test_bench_placement)\n")
    for i in range(160):
        k, B = random.randint(1, 6), random.choice([256, 1024])
        tabs, work = [], 0.0
        for _ in range(k):
            rows = int(math.exp(random.uniform(math.log(1e3), math.log(1e6))))
            dim, h = random.choice([8, 16, 32]), random.randint(1, 30)
            a, opt = random.choice([0, 0.9, 1.05]), random.choice(["sgd", "adagrad"])
            work += 3 + 1e-3 * B * h * dim + 4e-3 * min(rows, B * h) * dim
            tabs.append(f"{rows} {dim} {h} {a} {opt}")
        f.write(f"trainer {B} {10 + work:.3f} {k} {' '.join(tabs)}\n")
PY
"$CHANTER" shard fit --data "$DATA" --out "$WORK/model.txt" >"$WORK/fit.out" 2>&1
expect "a model fitted for the bench"

# every table a hotness of its own: placements that differ
HOT=$(python3 -c "print(','.join(str(1 + (7 * t) % 11) for t in range(26)))")
"$CHANTER" --set iterations=12 --set table_hotness="$HOT" --set shard.cost_model="$WORK/model.txt" \
  bench placement --job "$JOB" --trainers 2 --rounds 1 --insecure >"$WORK/bench.out" 2>"$WORK/bench.err"
rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/bench.err" | tail -5
expect_rc $rc "bench placement: two trainers, one round, 12 iterations"
check "  both placements run and their per-trainer times printed" \
  grep -Eq "^1 +lookup_greedy .*%( +[0-9.]+){2}$" "$WORK/bench.out"
check "  autoshard placed by autoshard (the model named)" \
  grep -Eq "^1 +autoshard .*%( +[0-9.]+){2}$" "$WORK/bench.out"
check "  the ratios with the aims" grep -q "autoshard / lookup_greedy, 2 trainers: measured balance .* (aim: autoshard >= 85%), steady samples/s .* (aim: >= 1.2x)" "$WORK/bench.out"
check "  the same digest for both placements" grep -q "^digest: the same in every run of 2 trainers" "$WORK/bench.out"

"$CHANTER" bench placement --job "$WORK/none.ini" --trainers 2 >"$WORK/none.out" 2>&1
rc=$?
check "a missing job file is refused" test "$rc" -ne 0
check "  naming it" grep -q "none.ini" "$WORK/none.out"
finish
