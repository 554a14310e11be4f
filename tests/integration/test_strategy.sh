#!/usr/bin/env bash
# Integration: table_strategy on a real cluster (a data processor, two
# embedding servers, the oracle, one to three trainers over loopback gRPC
# and Gloo).  Half the tables partitioned (their rows live on one trainer
# each; pooled embeddings and their gradients move by AlltoAll), the other
# half cached:
#   - the oracle logs each partitioned table's owner, summary.json times
#     the AlltoAlls;
#   - L = 0 and lookahead = auto give bit-identical digests and test loss
#     (two trainers, and three: the AlltoAll among three ranks); with every
#     table partitioned lookahead = auto takes L = 0 and says why;
#   - the placement of the partitioned tables (shard.placement: autoshard,
#     lookup_greedy) gives the same bits;
#   - trainer.comm_schedule = priority (one queue of collectives per
#     trainer) gives the bits of threads (L = 0 and auto, three trainers);
#   - a one-trainer run with the same tables partitioned gives the bits of
#     a one-trainer run with every table cached (a partitioned row's update
#     folds the same gradients in the same order), and the two-trainer
#     runs the same model up to the dense all-reduce's summation order
#     (test and train loss within 1e-6);
#   - table_strategy = auto chooses per table, alike for L = 0 and
#     lookahead = auto (the same bits), and summary.json lists each table's
#     strategy, owner and the traffic behind the choice (weighing bytes,
#     the default, and on the cost model's predicted microseconds); with a
#     strategy.partition_mb no trainer meets, the big tables are spread over
#     both (partition_rows), L = 0 and auto still bit-identical;
#   - kill -9 of a trainer mid-job (comm_schedule = priority): the job
#     recovers (the partitioned rows are read again from the rolled-back
#     servers) with the reference digest; kill -9 of the oracle under auto:
#     the restarted oracle keeps the checkpoint's choice, the same digest;
#   - partition_rows (a table's rows spread over every trainer, partial
#     sums by AlltoAll) mixed with partition and cache: logged and listed
#     with no single owner, and the same properties (any L with two and
#     three trainers, one trainer = the cached bits, two and three trainers
#     within summation order), and a trainer's kill -9;
#   - a table_strategy list of the wrong length, or an unknown word, is
#     refused naming the key.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
MIXED=$(python3 -c "print(','.join(['partition','cache']*13))")
job_preamble "$JOB" eval_batches=4 eval_every=25 table_strategy="$MIXED"
UP_ARGS=--insecure
close() { # a b: test and train loss within 1e-6
  python3 - "$WORK/$1/summary.json" "$WORK/$2/summary.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("test_logloss", "train_logloss"):
    assert abs(a[k] - b[k]) < 1e-6, (k, a[k], b[k])
PY
}

run_job p0 --set lookahead=0
expect_rc $? "half the tables partitioned, L = 0: trains (digest $(field "$WORK/p0/summary.json" digest | cut -c1-16)...)"
grep -q "table 0: strategy=partition owner=trainer" "$WORK/p0/logs/"oracle*.log &&
  python3 -c "
import json; d=json.load(open('$WORK/p0/summary.json'))
assert d['phase_seconds']['alltoall'] > 0, d['phase_seconds']"
expect "the oracle logs each partitioned table's owner; summary.json times the AlltoAlls (phase alltoall)"

run_job pa --set lookahead=auto && same pa p0
expect_rc $? "lookahead = auto (L = $(field "$WORK/pa/summary.json" lookahead)): bit-identical to L = 0"

# every table partitioned: no row goes through the cache, so lookahead = auto takes L = 0 at once (a larger L
# would only hold L + 2 Steps in each trainer)
run_job pall --set table_strategy=partition --set lookahead=auto &&
  [ "$(field "$WORK/pall/summary.json" lookahead)" = 0 ] &&
  grep -q "lookahead auto: L=0: every table is partitioned" "$WORK/pall/logs/"oracle*.log
expect_rc $? "every table partitioned: lookahead = auto chooses L = 0 and says why (L = $(field "$WORK/pall/summary.json" lookahead))"

run_job p3a --set trainers=3 --set lookahead=0 && run_job p3b --set trainers=3 --set lookahead=auto && same p3a p3b
expect_rc $? "three trainers: L = 0 and lookahead = auto bit-identical"
# the placement of the partition tables (shard.placement; autoshard by default) changes who pools and updates a
# table, never what: lookup_greedy's placement gives the bits of autoshard's
owners() { python3 -c "import json; print([t.get('owner') for t in json.load(open('$WORK/$1/summary.json'))['tables']])"; }
run_job p3g --set trainers=3 --set lookahead=0 --set shard.placement=lookup_greedy && same p3a p3g &&
  [ "$(owners p3a)" != "$(owners p3g)" ] && grep -q "placement: autoshard" "$WORK/p3a/logs/"oracle*.log
expect_rc $? "three trainers: the partition tables placed by autoshard and by lookup_greedy (other owners: $(owners p3a | cut -c1-40)... vs $(owners p3g | cut -c1-40)...) give the same bits"
# the same two through one priority queue of collectives per trainer (L = 0: its gate barriers; eval_every: its
# evaluation barriers; the AlltoAlls, dense buckets, critical and delayed rows)
PRIO="--set trainer.comm_schedule=priority"
run_job p3q --set trainers=3 --set lookahead=0 $PRIO && run_job p3r --set trainers=3 --set lookahead=auto $PRIO &&
  same p3a p3q && same p3a p3r &&
  grep -q "collectives scheduled rank=0 operations=[1-9]" "$WORK/p3q/logs/"trainer-0*.log &&
  grep -q "comm_schedule=threads" "$WORK/p3a/logs/"trainer-0*.log
expect_rc $? "three trainers: the collectives in one priority queue (comm_schedule = priority; L = 0 and auto) give the bits of each thread issuing its own (threads)"

run_job one --set trainers=1 && run_job onec --set trainers=1 --set table_strategy=cache && same one onec
expect_rc $? "one trainer: partitioned tables give the bits of cached ones"

close p0 one && close pa one
expect_rc $? "two trainers, partitioned: the one-trainer model up to summation order (losses within 1e-6)"

# ---- table_strategy = auto: chosen per table from the first batches, the same whatever L
# (strategy.step_kb = 0: each table to its cheaper mechanism, so that this data gets both)
BYTES="--set strategy.auto_cost=bytes --set strategy.step_kb=0"
run_job a0 --set table_strategy=auto --set lookahead=0 $BYTES &&
  run_job aa --set table_strategy=auto --set lookahead=auto $BYTES && same a0 aa
expect_rc $? "table_strategy = auto: L = 0 and lookahead = auto choose alike and give the same bits"
python3 - "$WORK/aa/summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
kinds = {t["strategy"] for t in d["tables"]}
assert kinds == {"cache", "partition"}, kinds  # this data has both kinds of table
for t in d["tables"]:
    assert t["why"].startswith("auto: ") and t["strategy"] in t["why"].split(" moves")[0], t
    assert ("owner" in t) == (t["strategy"] == "partition"), t
PY
expect_rc $? "auto: summary.json lists each table's strategy, owner and the traffic behind the choice ($(python3 -c "import json; print(''.join(t['strategy'][0] for t in json.load(open('$WORK/aa/summary.json'))['tables']))"))"

# auto weighing the cost model's predicted microseconds (strategy.auto_cost = model; the built-in model has the
# collectives' lines): every table's why gives both predictions, and names the mechanism chosen
run_job ma --set table_strategy=auto --set lookahead=auto --set strategy.auto_cost=model &&
  python3 - "$WORK/ma/summary.json" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
for t in d["tables"]:
    m = re.match(r"auto: (partition|the cache) \(predicted: partition ([0-9]+) us a batch, the cache ([0-9]+):", t["why"])
    assert m and (m.group(1) == "partition") == (t["strategy"] == "partition"), t
PY
expect_rc $? "auto on the cost model: each table's predicted microseconds under both mechanisms in summary.json ($(python3 -c "import json; print(''.join(t['strategy'][0] for t in json.load(open('$WORK/ma/summary.json'))['tables']))"))"

# auto with a budget no single trainer meets for the big tables (200k rows x 64 B = 12.8 MB > 8 MB): they are
# spread over both trainers (partition_rows), or cached when even that does not fit; the same bits whatever L
SMALL="--set table_strategy=auto $BYTES --set strategy.partition_mb=8"
run_job b0 $SMALL --set lookahead=0 && run_job ba $SMALL --set lookahead=auto && same b0 ba &&
  python3 - "$WORK/ba/summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [t for t in d["tables"] if t["strategy"] == "partition_rows"]
assert rows and all("spread over all 2" in t["why"] for t in rows), d["tables"]
PY
expect_rc $? "auto, strategy.partition_mb = 8: the tables too big for one trainer spread over both (partition_rows: $(python3 -c "import json; print(sum(t['strategy'] == 'partition_rows' for t in json.load(open('$WORK/ba/summary.json'))['tables']))") tables), L = 0 and auto bit-identical"

# ---- kill -9 of a trainer mid-job: the partitioned rows come back from the servers
D() { C --set lookahead=auto --set checkpoint_every=20 --set checkpoint_seconds=0 --set iterations=60 \
        --set oracle.heartbeat_timeout_ms=2000 --set local.watchdog_ms=2000 "$@"; }
D $PRIO drill kill-trainer --rank 1 --at 33 --workdir "$WORK/kill" --json >"$WORK/kill.json" 2>"$WORK/kill.err"
rc=$?
[ $rc -eq 0 ] || tail -5 "$WORK/kill.err"
expect_rc $rc "kill -9 of trainer 1 at iteration 33 with partitioned tables and comm_schedule = priority: recovered, the reference digest"
D --set table_strategy=auto drill kill-oracle --at 33 --workdir "$WORK/killo" --json >"$WORK/killo.json" 2>"$WORK/killo.err"
rc=$?
[ $rc -eq 0 ] || tail -5 "$WORK/killo.err"
expect_rc $rc "kill -9 of the oracle at iteration 33, table_strategy = auto: the restarted oracle keeps the checkpoint's choice, the reference digest"

# ---- partition_rows: every trainer holds rows r mod P of those tables
ROWS=$(python3 -c "print(','.join((['partition_rows','partition','cache']*9)[:26]))")
run_job r0 --set table_strategy="$ROWS" --set lookahead=0 && run_job ra --set table_strategy="$ROWS" --set lookahead=auto &&
  same r0 ra
expect_rc $? "partition_rows, partition and cache mixed: L = 0 and lookahead = auto bit-identical (digest $(field "$WORK/r0/summary.json" digest | cut -c1-16)...)"
grep -q "table 0: strategy=partition_rows owner=every trainer" "$WORK/r0/logs/"oracle*.log &&
  python3 -c "
import json; d=json.load(open('$WORK/r0/summary.json'))
kinds = [t['strategy'] for t in d['tables']]
assert kinds[:3] == ['partition_rows', 'partition', 'cache'], kinds
assert 'owner' not in d['tables'][0] and 'owner' in d['tables'][1], d['tables'][:2]"
expect "partition_rows: the oracle logs it, summary.json's tables say it (no single owner)"
run_job r3a --set table_strategy="$ROWS" --set trainers=3 --set lookahead=0 &&
  run_job r3b --set table_strategy="$ROWS" --set trainers=3 --set lookahead=auto && same r3a r3b
expect_rc $? "partition_rows among three trainers: L = 0 and lookahead = auto bit-identical"
run_job r1 --set table_strategy="$ROWS" --set trainers=1 && same r1 onec
expect_rc $? "one trainer: partition_rows tables give the bits of cached ones"
close r0 one && close r3a one
expect_rc $? "two and three trainers with partition_rows: the one-trainer model up to summation order (losses within 1e-6)"
# (its reference: the digest of ra, the same job without a fault; the drill's checkpoints, timeouts and TLS change no bit)
D --set table_strategy="$ROWS" drill kill-trainer --rank 0 --at 27 --reference "$(field "$WORK/ra/summary.json" digest)" \
  --workdir "$WORK/killr" --json >"$WORK/killr.json" 2>"$WORK/killr.err"
rc=$?
[ $rc -eq 0 ] || tail -5 "$WORK/killr.err"
expect_rc $rc "kill -9 of trainer 0 at iteration 27 with partition_rows tables: recovered, the reference digest"

# ---- bad input
err=$(UP_ARGS='' job_stderr bad --set table_strategy=cache,partition); rc=$? # the defaults (TLS), as a user's up
[ $rc -ne 0 ] && [[ "$err" == *"table_strategy"*"2 entries"* ]]
expect_rc $? "a table_strategy of 2 entries for 26 tables is refused: $(echo "$err" | grep -m1 table_strategy | cut -c1-140)"
err=$(C --set table_strategy=cache,rowwise status 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"'rowwise' is not cache, partition, partition_rows or auto"* ]]
expect_rc $? "an unknown strategy is refused at once: $(echo "$err" | head -1 | cut -c1-140)"

finish
