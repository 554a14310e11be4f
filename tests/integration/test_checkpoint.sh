#!/usr/bin/env bash
# Integration: whole-job checkpoints and resume (DESIGN.md section 5) on a
# real local cluster (a data processor, two RocksDB embedding servers, the
# oracle, two trainers over loopback gRPC and Gloo).
#
# The guarantee: a job stopped after its checkpoint at iteration c and
# resumed with `chanter train --resume` ends with the digest -- the dense
# parameters and every embedding row with its optimizer state -- and the
# test loss BIT-identical to a job that never stopped:
#   - for every allocation (contiguous, random, laia), with lookahead 0 and
#     auto (checkpoints taken while the trainers hold rows in their caches,
#     up to L steps ahead: the checkpoint flushed rows, rows_flushed > 0),
#     the laia jobs stopped by a kill -9 of every daemon;
#   - for Adam / Adagrad dense and Adagrad / row-wise Adagrad row state;
#   - with table_strategy = auto: the tables it partitions are written back
#     at the checkpoint and read again, the resumed job keeps its choice;
#   - when the resumed job runs with another lookahead, cache_rows, lrpp
#     and delayed_sync;
#   - with another number of embedding servers (2 -> 3, 3 -> 1): the
#     checkpoint is resharded on resume.
# Checkpoints run while the job trains (an iteration completes during a
# paused one, its write-backs wait at a fenced server); one interrupted by
# a killed server fails the job, is listed NOT complete, and a resume takes
# the one before.  `chanter checkpoint --wait` takes one on demand,
# checkpoint_seconds by time; the oracle exports checkpoints_total,
# checkpoint_stall_seconds and checkpoint_bytes, and chanter train prints a
# line per checkpoint.  checkpoint_keep = 2 with a checkpoint every 5
# iterations keeps exactly the last two on every server.  A job on servers
# that hold state is blocked (its daemons stay up) until --resume or
# --fresh (which trains from iteration 0); bad input is refused with a
# sentence: a missing checkpoint (the servers unchanged), a damaged
# manifest, another model or optimizer (naming the field), another table
# layout (the servers refuse their data dir).  A resume with another
# trainer count trains on, warning that the model is the same only up to
# summation order.
#
# How the job is stopped after c: it is started with iterations = 100000,
# stopped once `chanter checkpoints` lists the checkpoint of iteration 19
# complete, and resumed from that checkpoint with iterations = 60 (a job
# may be resumed with more or fewer iterations); the reference is the same
# job run to 60 without a stop.  The resumes with allowed changes (lookahead,
# trainers, 2 -> 3 servers) resume that stopped job of the defaults again, one
# after the other, from the same checkpoint; 3 -> 1 servers resumes it from the
# checkpoint of iteration 39 its resume on 3 servers took.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
# checkpoints taken while the trainers cache rows (auto would partition the
# tables; the default is resumed below); the stopped jobs run on past
# iteration 19 before the stop: checkpoint_keep keeps its checkpoint
job_preamble "$JOB" table_strategy=cache checkpoint_every=20 checkpoint_seconds=0 checkpoint_keep=1000
kill9() { # every daemon of dir and their supervisor (first: it would restart them), at once; then until none is left
  { cat "$WORK/$1/run/supervisor.pid" 2>/dev/null; awk '{print $2}' "$WORK/$1/pids"; } | xargs -r kill -9 2>/dev/null
  for _ in $(seq 1 100); do
    "$BIN/chanter" local status --workdir "$WORK/$1" --json 2>/dev/null | grep -q '"alive": 0,' && return 0
    sleep 0.1
  done
}
# ckpt_id dir iteration: the id of the complete checkpoint of that iteration, once listed (<= 60 s)
ckpt_id() {
  for _ in $(seq 1 600); do
    local id
    id=$(CW "$1" checkpoints --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
print([c['id'] for c in d['checkpoints'] if c['complete'] and c['iteration']==$2][0])" 2>/dev/null)
    [ -n "$id" ] && { echo "$id"; return 0; }
    sleep 0.1
  done
  return 1
}
ckpt_json() { CW "$1" checkpoints --json 2>/dev/null; }
# stopped dir [--set ...]: a long job stopped (SIGTERM) after its checkpoint of iteration 19; ID holds its id
stopped() {
  local d=$1; shift
  job_up "$d" --set iterations=100000 "$@" || return 1
  ID=$(ckpt_id "$d" 19) || { echo "# no complete checkpoint of iteration 19"; job_down "$d"; return 1; }
  ckpt_json "$d" >"$WORK/$d.ckpts"
  if [ -n "${KILL9:-}" ]; then kill9 "$d"; else job_down "$d"; fi
}
resumed_from() { # dir id: the summary says so, at iteration 20
  [ "$(field "$WORK/$1/summary.json" resumed_from)" = "$2" ] && [ "$(field "$WORK/$1/summary.json" start_iteration)" = 20 ]
}
# again NAME [--set ...]: the job `stopped contiguous_auto` stopped (the defaults: allocation contiguous,
# lookahead auto) up again in its dir with these changes and resumed from its checkpoint of iteration 19
# (CA_ID; AGAIN_ID: another), as a job stopped for NAME would be: its servers hold rows and checkpoints past
# that one (here those of the resumes before); the train's stderr in $WORK/NAME.err, its summary in
# $WORK/NAME/summary.json, the checkpoints listed after it in $WORK/NAME.ckpts
again() {
  local n=$1 w=$WORK/contiguous_auto rc; shift
  mkdir -p "$WORK/$n"
  rm -f "$w/summary.json"
  job_up contiguous_auto "$@" &&
    CW contiguous_auto train --workdir "$w" --quiet --resume "${AGAIN_ID:-$CA_ID}" >"$WORK/$n.out" 2>"$WORK/$n.err"
  rc=$?
  [ $rc -eq 0 ] && ckpt_json contiguous_auto >"$WORK/$n.ckpts"
  job_down contiguous_auto
  [ -f "$w/summary.json" ] && cp "$w/summary.json" "$WORK/$n/summary.json"
  [ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/$n.err" | tail -3
  return $rc
}

# ---- the guarantee, per allocation, lookahead 0 and auto
for al in contiguous random laia; do
  run_job "ref_$al" --set allocation=$al
  expect_rc $? "$al: the uninterrupted job trains to 60 (digest $(field "$WORK/ref_$al/summary.json" digest | cut -c1-16)...)"
  for la in 0 auto; do
    d=${al}_$la
    KILL9=$([ "$al" = laia ] && echo 1) stopped "$d" --set allocation=$al --set lookahead=$la &&
      job_up "$d" --set allocation=$al --set lookahead=$la && job_train "$d" --resume "$ID"
    rc=$?
    [ "$d" = contiguous_auto ] && CA_ID=$ID # resumed again below, with allowed changes
    job_down "$d"
    [ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/$d.err" | tail -3
    expect_rc $rc "$al, lookahead $la: stopped$([ "$al" = laia ] && echo " by kill -9 of every daemon") after the checkpoint of iteration 19, resumed from it to 60"
    same "$d" "ref_$al" && resumed_from "$d" "$ID"
    expect "$al, lookahead $la: BIT-identical digest and test loss to the uninterrupted job"
  done
done
# with lookahead auto the checkpoint was taken while the trainers held rows newer than the servers
python3 -c "
import json; d=json.load(open('$WORK/contiguous_auto.ckpts'))
c=[c for c in d['checkpoints'] if c['iteration']==19][0]
assert c['rows_flushed'] > 0, c
assert all(b > 0 for b in c['bytes_per_server']), c"
expect "lookahead auto: the checkpoint flushed cached rows without evicting them (rows_flushed > 0)"

# ---- optimizer state round trip (Adam and Adagrad dense, Adagrad and row-wise Adagrad rows)
for opt in "adam adagrad" "adagrad rowwise_adagrad"; do
  set -- $opt
  d=opt_$1_$2
  run_job "ref_$d" --set optimizer=$1 --set embedding_optimizer=$2
  stopped "$d" --set optimizer=$1 --set embedding_optimizer=$2 && job_up "$d" --set optimizer=$1 --set embedding_optimizer=$2 &&
    job_train "$d" --resume "$ID"
  rc=$?
  job_down "$d"
  [ $rc -eq 0 ] && same "$d" "ref_$d"
  expect "optimizer = $1, embedding_optimizer = $2: their state after resume equals the uninterrupted run's (same digest)"
done

# ---- the default table_strategy (auto): the tables it partitions are written back at the
# checkpoint, read again on resume, and the resumed job keeps the checkpoint's choice
A=(--set table_strategy=auto)
run_job ref_auto "${A[@]}" && stopped auto "${A[@]}" && job_up auto "${A[@]}" && job_train auto --resume "$ID"
rc=$?
job_down auto
[ $rc -eq 0 ] && same auto ref_auto && resumed_from auto "$ID" && python3 -c "
import json; a=json.load(open('$WORK/ref_auto/summary.json'))['tables']; b=json.load(open('$WORK/auto/summary.json'))['tables']
assert [t['strategy'] for t in a] == [t['strategy'] for t in b] and any(t['strategy'] != 'cache' for t in a), (a, b)"
expect_rc $? "table_strategy = auto ($(python3 -c "import json,collections; print(dict(collections.Counter(t['strategy'] for t in json.load(open('$WORK/auto/summary.json'))['tables'])))" 2>/dev/null)): stopped after the checkpoint of 19, resumed with the same choice, BIT-identical"

# ---- allowed changes on resume: another lookahead, cache_rows, lrpp, delayed_sync keep the bits
# (the stopped job of contiguous_auto, lookahead auto, resumed again: again)
again changed --set lookahead=0 --set lrpp=false --set delayed_sync=false --set cache_rows=60000 &&
  same changed ref_contiguous
expect "resumed with lookahead 0, lrpp and delayed_sync off and another cache_rows: bit-identical"

# ---- another trainer count: allowed, with a warning
again p3 --set trainers=3 && python3 -c "
import json; d=json.load(open('$WORK/p3/summary.json'))
assert any('summation order' in w for w in d['warnings']), d['warnings']
assert d['start_iteration'] == 20 and d['trainers'] == 3, d"
expect "resumed with trainers = 3: trains on, warning that the model is the same only up to summation order"

# ---- a checkpoint interrupted by a killed server is not complete; a resume takes the one before
# (local.restart_burst = 0: the killed server stays down, as the case is about)
CHANTER_FAULT_CHECKPOINT_PAUSE=2:5000 job_up cut --set iterations=100000 --set rpc.timeout_ms=3000 --set local.restart_burst=0
for _ in $(seq 1 300); do grep -qs "pausing" "$WORK/cut/logs/oracle-0.log" && break; sleep 0.1; done
grep -qs "pausing" "$WORK/cut/logs/oracle-0.log"
expect "the second checkpoint pauses after server 0's part (fault injection)"
# training goes on while the checkpoint is written: iteration 40 (after the checkpoint of 39) completes during
# the pause; its write-backs wait at the fenced server 1
mport=$(field "$WORK/cut/run/oracle-0.ready" metrics_port)
for _ in $(seq 1 30); do
  it=$(curl -s "http://127.0.0.1:$mport/metrics" | awk '$1 == "chanter_oracle_iteration" {print $2}')
  [ "${it:-0}" -ge 41 ] && break
  sleep 0.1
done
[ "${it:-0}" -ge 41 ] && grep -q "fence set id=.*000000000040" "$WORK/cut/logs/embedding-1.log"
expect_rc $? "training goes on while the checkpoint of iteration 39 is written (iteration ${it:-?} done during it; server 1 fenced)"
kill -9 "$(awk '$1 == "embedding-1" {print $2}' "$WORK/cut/pids")"
CW cut train --quiet >/dev/null 2>"$WORK/cut.err"
rc=$?
[ $rc -ne 0 ] && grep -q "failed" "$WORK/cut.err" "$WORK/cut/logs/oracle-0.log"
expect_rc $? "the job fails (a server killed in the middle of a checkpoint): $(tail -1 "$WORK/cut.err" | cut -c1-120)"
job_down cut
job_up cut && ckpt_json cut >"$WORK/cut.ckpts"
python3 -c "
import json; d=json.load(open('$WORK/cut.ckpts')); c={x['iteration']: x for x in d['checkpoints'] if x['iteration'] is not None}
ids={x['id']: x for x in d['checkpoints']}
cut=[x for i,x in ids.items() if i.endswith('000000000040')][0]
assert not cut['complete'], cut
assert c[19]['complete'], c"
expect "chanter checkpoints: the interrupted one is listed NOT complete, the one before complete"
job_train cut --resume && same cut ref_contiguous && [ "$(field "$WORK/cut/summary.json" start_iteration)" = 20 ]
expect "--resume (latest) skips the interrupted checkpoint, goes on from iteration 20, bit-identical"
job_down cut

# ---- on demand and by time; the metrics and the progress line
job_up now --set iterations=100000 --set checkpoint_every=0 --set checkpoint_seconds=1
CW now train --workdir "$WORK/now" >/dev/null 2>"$WORK/now.progress" &
watcher=$!
CW now checkpoint --wait --json >"$WORK/now.json" 2>"$WORK/now.err"
rc=$?
[ $rc -eq 0 ] && python3 -c "
import json; d=json.load(open('$WORK/now.json')); assert d['complete'] and d['iteration'] >= 0, d"
expect_rc $? "chanter checkpoint --wait: a checkpoint of the running job, complete when it returns ($(cat "$WORK/now.json"))"
for _ in $(seq 1 100); do
  n=$(ckpt_json now | python3 -c "import json,sys; print(sum(1 for c in json.load(sys.stdin)['checkpoints'] if c['complete']))" 2>/dev/null)
  [ "${n:-0}" -ge 3 ] && break
  sleep 0.1
done
[ "${n:-0}" -ge 3 ]
expect "checkpoint_seconds = 1: checkpoints keep coming while the job trains ($n complete)"
mport=$(field "$WORK/now/run/oracle-0.ready" metrics_port)
curl -s "http://127.0.0.1:$mport/metrics" >"$WORK/now.metrics"
grep -Eq '^chanter_oracle_checkpoints_total [1-9]' "$WORK/now.metrics" && grep -q '^chanter_oracle_checkpoint_stall_seconds ' "$WORK/now.metrics" &&
  grep -q '^chanter_oracle_checkpoint_bytes ' "$WORK/now.metrics"
expect "the oracle's metrics: checkpoints_total, checkpoint_stall_seconds, checkpoint_bytes"
job_down now
wait $watcher 2>/dev/null
grep -q "^checkpoint .*: the model after iteration [0-9]*, written in [0-9]* ms (trainers [0-9]* ms, servers [0-9]* ms) while training went on" "$WORK/now.progress"
expect_rc $? "chanter train prints a line per checkpoint ($(grep -m1 -o '^checkpoint .*' "$WORK/now.progress" | cut -c1-120))"

# ---- servers holding another job's state: blocked, then --fresh
job_up ref_contiguous
CW ref_contiguous train --quiet >/dev/null 2>"$WORK/held.err"
rc=$?
[ $rc -ne 0 ] && grep -q "blocked" "$WORK/held.err" && grep -q -- "--resume" "$WORK/held.err" && grep -q -- "--fresh" "$WORK/held.err"
expect "a job started on servers that hold rows and checkpoints refuses to train over them, saying --resume or --fresh"
"$BIN/chanter" local status --workdir "$WORK/ref_contiguous" --json | python3 -c "import json,sys; d=json.load(sys.stdin); assert d['alive']==d['total'], d"
expect "the blocked job waits (every daemon stays up)"

# ---- bad input: nothing is restored
before=$(CW ref_contiguous embedding digest | tail -1)
CW ref_contiguous train --quiet --resume no-such-checkpoint >/dev/null 2>"$WORK/bad1.err"
[ $? -ne 0 ] && grep -q "no checkpoint no-such-checkpoint" "$WORK/bad1.err" &&
  [ "$(CW ref_contiguous embedding digest | tail -1)" = "$before" ]
expect "--resume of a missing checkpoint: refused by name, the servers unchanged"
job_down ref_contiguous
last=$(ls "$WORK/ref_contiguous/embedding-0/checkpoints" | grep '^seed' | sort | tail -1)
m=$WORK/ref_contiguous/embedding-0/checkpoints/$last/MANIFEST
sed -i 's/^iteration=/iteration=1/' "$m"
job_up ref_contiguous --set iterations=100
CW ref_contiguous train --quiet --resume "$last" >/dev/null 2>"$WORK/bad2.err"
rc=$?
[ $rc -ne 0 ] && grep -q "damaged\|no complete\|not complete" "$WORK/bad2.err"
expect_rc $? "a damaged manifest: refused ($(grep -o 'damaged[^;]*' "$WORK/bad2.err" | head -1))"
job_down ref_contiguous
job_up opt_adam_adagrad --set optimizer=adam --set embedding_optimizer=adagrad --set model=dcn --set iterations=100
CW opt_adam_adagrad train --quiet --resume >/dev/null 2>"$WORK/bad3.err"
[ $? -ne 0 ] && grep -q "another model: its model is dlrm, this job's is dcn" "$WORK/bad3.err"
expect "a checkpoint of another model: refused, naming the field"
job_down opt_adam_adagrad
job_up opt_adam_adagrad --set optimizer=sgd --set embedding_optimizer=adagrad --set iterations=100
CW opt_adam_adagrad train --quiet --resume >/dev/null 2>"$WORK/bad4.err"
[ $? -ne 0 ] && grep -q "its optimizer is adam, this job's is sgd" "$WORK/bad4.err"
expect "a checkpoint of another optimizer: refused, naming the field"
job_train opt_adam_adagrad --fresh && [ "$(field "$WORK/opt_adam_adagrad/summary.json" start_iteration)" = 0 ] &&
  rf=$(field "$WORK/opt_adam_adagrad/summary.json" resumed_from) && [ -z "$rf" ]
expect "--fresh clears the servers and trains from iteration 0"
job_down opt_adam_adagrad
C --set embedding_dim=8 local up --workdir "$WORK/opt_adam_adagrad" >"$WORK/bad5.out" 2>&1
rc=$?
job_down opt_adam_adagrad
[ $rc -ne 0 ] && grep -qi "layout" "$WORK/bad5.out" "$WORK/opt_adam_adagrad/logs/embedding-0.log"
expect "another table layout: the embedding servers refuse their data dir, saying the layout differs"

# ---- another server count: the checkpoint is resharded (each row read once from its old server's
# checkpoint on disk, written once to its new owner) and the job ends BIT-identical
# (the stopped job of contiguous_auto again, the last time: it has 3 servers after)
again rs23 --set embedding_servers=3 && same rs23 ref_contiguous && grep -q "resharded .* rows" "$WORK/rs23.err"
expect_rc $? "2 -> 3 embedding servers: resharded on resume ($(grep -o 'resharded [0-9]* rows[^(]*' "$WORK/rs23.err")), BIT-identical digest"
# 3 -> 1: from the checkpoint of iteration 39 that the job resumed on 3 servers (rs23) took on its 3 servers
RS3_ID=$(python3 -c "
import json; d=json.load(open('$WORK/rs23.ckpts')); assert d['servers'] == 3, d
print([c['id'] for c in d['checkpoints'] if c['complete'] and c['iteration'] == 39 and all(c['bytes_per_server'])][0])" 2>/dev/null)
[ -n "$RS3_ID" ] && AGAIN_ID=$RS3_ID again rs31 --set embedding_servers=1 && same rs31 ref_contiguous &&
  grep -q "resharded .* rows" "$WORK/rs31.err"
expect "3 -> 1 embedding servers: resharded on resume, BIT-identical digest (to the 2-server job that never stopped)"

# ---- checkpoint_keep: older complete checkpoints are removed on every server
job_up keep --set checkpoint_every=5 --set checkpoint_keep=2 && job_train keep && same keep ref_contiguous
expect "a checkpoint every 5 iterations (several under way at once, their flushes waiting at fenced servers): same digest"
# (listed on the job's cluster, once the job is done)
kept() {
  ckpt_json keep >"$WORK/keep.ckpts" && python3 -c "
import json; d=json.load(open('$WORK/keep.ckpts')); c=d['checkpoints']
assert [x['iteration'] for x in c] == [54, 59] and all(x['complete'] for x in c), c"
}
until_ok 50 kept
expect "checkpoint_keep = 2 with a checkpoint every 5 iterations: the servers keep exactly the last two (54, 59)"
job_down keep

finish
