#!/usr/bin/env bash
# Integration: a scale under fault leaves the job recoverable to the same
# digest, on a real local cluster under `chanter local`'s supervisor.
#
# 1. `chanter scale --embedding-servers 3` with embedding server 0 killed
#    (kill -9) in the middle of its move (CHANTER_FAULT_RESHAPE_PAUSE holds
#    each server's move 1.5 s after its first batch), the supervisor
#    restarting it only after local.restart_ms = 3 s, past rpc.timeout_ms =
#    2 s: the move fails part-way, which is a recovery (listed in
#    summary.json); the next run restores the checkpoint on the old servers,
#    clears the new one and moves again, and the job ends with the digest
#    and test loss of the same job never scaled.  While it recovers, a scale
#    of either kind is refused with a sentence.
# 2. A checkpoint c0, then `chanter scale --trainers 3` with trainer 1
#    killed while the scale's checkpoint is held
#    (CHANTER_FAULT_CHECKPOINT_PAUSE): the recovery carries the scale out,
#    on 3 trainers from the checkpoint it rolled back to (c0: the scale's
#    own was not complete), and the job ends with the digest of the same
#    job stopped at that checkpoint on 2 trainers and resumed with --resume
#    on 3.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=400 eval_every=0 oracle.max_lookahead=8 checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000 \
  rpc.timeout_ms=2000 local.restart_ms=3000
W=$WORK/sc
SC() { CW sc scale --workdir "$W" "$@"; }

# ---- 1. an embedding server killed in the middle of the move
CHANTER_FAULT_RESHAPE_PAUSE=1500 job_up sc || { nok "the cluster came up"; finish; exit 1; }
job_train sc &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
SC --embedding-servers 3 --wait --json >"$WORK/s1.json" 2>"$WORK/s1.err" &
sp=$!
until_ok 600 grep -qs "CHANTER_FAULT_RESHAPE_PAUSE" "$W/logs/embedding-0.log"
kill -9 "$(pid_of "$W" embedding-0)"
until_ok 300 grep -qs "recovery 1 started" "$W/logs/oracle-0.log"
SC --trainers 3 >/dev/null 2>"$WORK/rt.err"
[ $? -ne 0 ] && grep -q "the job is recovering from the loss of embedding servers; ask again" "$WORK/rt.err"
expect_rc $? "a scale of the trainers while the job recovers is refused: $(head -c 160 "$WORK/rt.err")"
SC --embedding-servers 2 >/dev/null 2>"$WORK/rs.err"
[ $? -ne 0 ] && grep -q "the job is recovering from the loss of embedding servers; ask again" "$WORK/rs.err"
expect_rc $? "a scale of the embedding servers while the job recovers is refused: $(head -c 160 "$WORK/rs.err")"
wait $sp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/s1.err" | tail -3
expect_rc $rc "chanter scale --embedding-servers 3 --wait: the job trains on 3 servers after the failed move ($(cat "$WORK/s1.json"))"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/sc.err" | tail -3
expect_rc $rc "the job completes (digest $(field "$W/summary.json" digest | cut -c1-16)...)"
job_down sc
grep -q '"event": *"restart", "name": *"embedding-0"' "$W/run/events"
expect "  the supervisor restarted embedding server 0"
python3 -c "
import json; d=json.load(open('$W/summary.json'))
s, r = d['scales'], d['recoveries']
assert [(x['what'], x['from'], x['to']) for x in s] == [('embedding_servers', 2, 3)], s
assert s[0]['rows_moved'] > 0 and s[0]['pause_seconds'] >= 0, s
assert len(r) >= 1 and all(x['kind'] == 'embedding' and 'failed part-way' in x['why'] for x in r), r
assert r[-1]['rollback_to'] == s[0]['at_iteration'] and r[-1]['checkpoint'].endswith('.s3'), r"
expect_rc $? "summary.json lists the scale and $(jf "$W/summary.json" "len(d['recoveries'])") recovery from the failed move, rolled back to $(jf "$W/summary.json" "d['recoveries'][-1]['checkpoint']")"
grep -o "scale: checkpoint .* moved .*" "$W/logs/oracle-0.log" | sed 's/^/# /'
run_job ref && same ref sc
expect_rc $? "the same job never scaled: the same digest and test loss ($(field "$WORK/ref/summary.json" digest | cut -c1-16)...)"

# ---- 2. a trainer killed while a scale of the trainers waits for its checkpoint
job_preamble "$JOB" iterations=400 eval_every=0 oracle.max_lookahead=8 checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000
W=$WORK/tr
ST() { CW tr scale --workdir "$W" "$@"; }
CHANTER_FAULT_CHECKPOINT_PAUSE=2:3000 job_up tr || { nok "the cluster came up"; finish; exit 1; }
job_train tr &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
CW tr checkpoint --workdir "$W" --wait >/dev/null 2>"$WORK/c0.err"
expect_rc $? "a checkpoint of the job before the scale"
ST --trainers 3 --wait --json >"$WORK/t1.json" 2>"$WORK/t1.err" &
sp=$!
until_ok 300 grep -qs "CHANTER_FAULT_CHECKPOINT_PAUSE" "$W/logs/oracle-0.log"
kill -9 "$(pid_of "$W" trainer-1)"
wait $sp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/t1.err" | tail -3
expect_rc $rc "chanter scale --trainers 3 --wait: the recovery carried the scale out ($(cat "$WORK/t1.json"))"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/tr.err" | tail -3
expect_rc $rc "the job completes (digest $(field "$W/summary.json" digest | cut -c1-16)...)"
job_down tr
R=$(jf "$W/summary.json" "d['recoveries'][0]['rollback_to']")
S=$(jf "$W/summary.json" "d['scales'][0]['at_iteration']")
python3 -c "
import json; d=json.load(open('$W/summary.json'))
s, r = d['scales'], d['recoveries']
assert [(x['from'], x['to']) for x in s] == [(2, 3)], s
assert len(r) == 1 and r[0]['kind'] == 'trainer' and 0 <= r[0]['rollback_to'], r
assert s[0]['at_iteration'] == r[0]['rollback_to'] and s[0]['checkpoint'] == r[0]['checkpoint'], (s, r)"
expect_rc $? "summary.json lists the scale and the trainer's recovery, both at the checkpoint rolled back to (${S:-?}, ${R})"
resume_legs ref2 "2:$((R + 1))" "3:"
expect_rc $? "the reference: the job stopped after iteration ${R} on 2 trainers and resumed on 3"
same tr ref2
expect_rc $? "the same digest and test loss as the reference ($(field "$WORK/ref2/summary.json" digest | cut -c1-16)...)"
finish
