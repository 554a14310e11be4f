#!/usr/bin/env bash
# Integration: the sharding cost model and planner through the CLI
# (chanter shard fit | plan, common/plan/shard_*):
#   - `shard fit` on a `chanter bench tables` dataset (here a synthetic one
#     with a known non-additive cost) writes a model, prints the fitted and
#     held-out errors next to the additive baseline's; two fits give the
#     same model file but for the label's date; a malformed dataset is
#     refused naming file:line and the field;
#   - `shard plan` on deploy/job.example.ini with that model (--model, and
#     shard.cost_model): every algorithm per trainer and per server, text
#     and --json (which parses: every table placed once, balances in
#     [0, 1], the trainers' memory limit kept); the same plan twice;
#   - a table that fits on no trainer, a missing model file and a model
#     file with a bad line are refused saying why.
source "$(dirname "$0")/lib.sh"

DATA=$WORK/tables.txt
python3 - "$DATA" <<'PY'
import math, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    f.write("# chanter bench tables v1\n# cpu: synthetic (test_shard_plan)\n")
    for i in range(240):
        kind = "server" if i % 3 == 0 else "trainer"
        k, B = random.randint(1, 6), random.choice([1024, 4096])
        tabs, work, touched = [], 0.0, 0.0
        for _ in range(k):
            rows = int(math.exp(random.uniform(math.log(1e3), math.log(5e6))))
            dim, h = random.choice([8, 16, 32, 64]), random.randint(1, 30)
            a, opt = random.choice([0, 0.9, 1.05]), random.choice(["sgd", "adagrad"])
            st = 2 if opt == "adagrad" else 1
            d = min(rows, B * h)
            work += 3 + 1e-3 * B * h * dim + 4e-3 * d * dim * st
            touched += d * dim * 4 * st
            tabs.append(f"{rows} {dim} {h} {a} {opt}")
        c = 10 + work * (1 + 0.5 * max(0, math.log2(touched / (8 << 20)))) if kind == "trainer" else 30 + 2e-3 * touched
        f.write(f"{kind} {B} {c:.3f} {k} {' '.join(tabs)}\n")
PY

C() { "$CHANTER" --config "$ROOT/deploy/job.example.ini" "$@"; }

"$CHANTER" shard fit --data "$DATA" --out "$WORK/m1.txt" >"$WORK/fit.out" 2>&1
expect "shard fit writes a model"
check "shard fit prints the held-out and the additive errors" grep -q "additive" "$WORK/fit.out"
check "the model is labelled with the dataset's machine" grep -q "^label measured on synthetic (test_shard_plan)" "$WORK/m1.txt"
"$CHANTER" --json shard fit --data "$DATA" --out "$WORK/m2.txt" >"$WORK/fit.json" 2>&1
expect "shard fit --json"
held=$(jf "$WORK/fit.json" "d['kinds']['trainer']['model']['held']['median_rel']")
check "held-out median relative error in the JSON (${held})" python3 -c "import sys; sys.exit(not 0 <= float('$held') < 0.5)"
check "two fits give the same model but for the label" cmp -s <(grep -v '^label' "$WORK/m1.txt") <(grep -v '^label' "$WORK/m2.txt")

printf '# chanter bench tables v1\ntrainer 4096 10 2 100 8 1 0 sgd 100 eight 1 0 sgd\n' >"$WORK/bad.txt"
"$CHANTER" shard fit --data "$WORK/bad.txt" >"$WORK/bad.out" 2>&1
rc=$?
check "a malformed dataset is refused" test "$rc" -ne 0
check "  naming file:line and the field" grep -q "bad.txt:2: field 'dim' of table 2 is 'eight'" "$WORK/bad.out"

C shard plan --model "$WORK/m1.txt" >"$WORK/plan.txt" 2>&1
expect "shard plan on deploy/job.example.ini"
for w in autoshard lookup_greedy size_greedy random current "trainer 1" "server 1" balance; do
  check "  text names $w" grep -q "$w" "$WORK/plan.txt"
done
C --set shard.cost_model="$WORK/m1.txt" --json shard plan >"$WORK/plan.json" 2>&1
expect "shard plan --json with shard.cost_model"
python3 - "$WORK/plan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
T = d["tables"]
for side, algos in (("trainers", 4), ("servers", 5)):
    s = d[side]
    assert len(s["plans"]) == algos, (side, list(s["plans"]))
    for name, p in s["plans"].items():
        assert len(p["owner"]) == len(s["tables"]) and 0 <= p["balance"] <= 1, (side, name)
        assert all(-1 <= o < s["devices"] for o in p["owner"]), (side, name)
        assert len(p["cost_us"]) == s["devices"] and all(c > 0 for c in p["cost_us"]), (side, name)
        if side == "trainers":
            assert all(m <= s["mem_limit_mib"] for m in p["mib"]), (side, name)
assert len(d["trainers"]["tables"]) == T
PY
expect "  the JSON parses: every table placed, balances in [0, 1], the memory limit kept"
C --json shard plan --model "$WORK/m1.txt" >"$WORK/plan2.json" 2>&1
check "  the same plan twice" cmp -s <(jf "$WORK/plan.json" "d['trainers']['plans']['autoshard']['owner']") \
  <(jf "$WORK/plan2.json" "d['trainers']['plans']['autoshard']['owner']")
C shard plan --model "$WORK/m1.txt" --trainers 4 --servers 3 >"$WORK/plan4.txt" 2>&1
expect "shard plan --trainers 4 --servers 3"
check "  four trainers" grep -q "trainer 3 " "$WORK/plan4.txt"
check "  three servers" grep -q "server 2 " "$WORK/plan4.txt"

C --set strategy.partition_mb=100 --set table_strategy=partition shard plan --model "$WORK/m1.txt" >"$WORK/nofit.out" 2>&1
rc=$?
check "a table over strategy.partition_mb is refused" test "$rc" -ne 0
check "  saying which and why" grep -q "fits on no trainer" "$WORK/nofit.out"
C shard plan --model "$WORK/none.txt" >"$WORK/none.out" 2>&1
rc=$?
check "a missing model file is refused" test "$rc" -ne 0
check "  naming it" grep -q "none.txt" "$WORK/none.out"
sed 's/^w2 /w9 /' "$WORK/m1.txt" >"$WORK/badm.txt"
C shard plan --model "$WORK/badm.txt" >"$WORK/badm.out" 2>&1
rc=$?
check "a model file with a bad line is refused" test "$rc" -ne 0
check "  naming file:line" grep -q "badm.txt:[0-9]*: unknown entry 'w9'" "$WORK/badm.out"
finish
