#!/usr/bin/env bash
# Integration: the oracle killed (kill -9) while `chanter scale --trainers
# 3` waits for its checkpoint (held by CHANTER_FAULT_CHECKPOINT_PAUSE), on
# a real local cluster under `chanter local`'s supervisor, which restarts
# the oracle on the job file the scale already set to trainers = 3.  The
# scale recorded the scaled configuration's fingerprint in
# oracle.state_dir, so the restarted oracle recovers the job by itself (a
# recovery of kind oracle) on 3 trainers from its latest complete
# checkpoint c0 (the scale's own was cut short), `chanter train` completes
# without an operator, and the digest and test loss are those of the same
# job stopped at c0 on 2 trainers and resumed with --resume on 3.
#
# And a scale of the embedding servers (2 -> 3; CHANTER_FAULT_RESHAPE_PAUSE
# holds each server's move) with a daemon killed in the middle of the move:
# - the oracle: the scale is in its record (oracle.state_dir/job), so the
#   restarted oracle takes it over by itself -- the servers that were moving
#   are fenced off by the write epoch, and the old servers' latest complete
#   checkpoint moves again;
# - the new server (the receiving end), a trainer and the data processor
#   at once: the server's restart is seen before the moved checkpoint is
#   sealed and the move is made again; the trainer, lost while the job
#   recovers, ends that generation (its group held it) and every trainer
#   joins the next; the data processor needs no roll-back;
# each to the digest and test loss of the job never scaled.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=400 eval_every=0 oracle.max_lookahead=8 checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000
W=$WORK/sc
CHANTER_FAULT_CHECKPOINT_PAUSE=2:3000 job_up sc || { nok "the cluster came up"; finish; exit 1; }
job_train sc &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
CW sc checkpoint --workdir "$W" --wait >/dev/null 2>"$WORK/c0.err"
expect_rc $? "a checkpoint of the job before the scale"
CW sc scale --workdir "$W" --trainers 3 >"$WORK/s1.out" 2>"$WORK/s1.err"
expect_rc $? "chanter scale --trainers 3 accepted: $(head -c 160 "$WORK/s1.out")"
until_ok 300 grep -qs "CHANTER_FAULT_CHECKPOINT_PAUSE" "$W/logs/oracle-0.log"
kill -9 "$(pid_of "$W" oracle-0)"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/sc.err" | tail -3
expect_rc $rc "the job completes without an operator (digest $(field "$W/summary.json" digest | cut -c1-16)...)"
job_down sc
grep -q "was training when the last oracle stopped: recovering it" "$W/logs/oracle-0.log" &&
  grep -q '"event": *"restart", "name": *"oracle-0"' "$W/run/events" &&
  grep -q "job created job_id=.* trainers=3 " "$W/logs/oracle-0.log"
expect "the supervisor restarted the oracle, which recovered the job on 3 trainers"
R=$(jf "$W/summary.json" "d['recoveries'][0]['rollback_to']")
python3 -c "
import json; d=json.load(open('$W/summary.json'))
r = d['recoveries']
assert len(r) == 1 and r[0]['kind'] == 'oracle' and r[0]['rollback_to'] >= 0, r"
expect_rc $? "summary.json lists the oracle's recovery, rolled back to iteration ${R}"
resume_legs ref "2:$((R + 1))" "3:"
expect_rc $? "the reference: the job stopped after iteration ${R} on 2 trainers and resumed on 3"
same sc ref
expect_rc $? "the same digest and test loss as the reference ($(field "$WORK/ref/summary.json" digest | cut -c1-16)...)"

# ---- the oracle killed during a scale of the embedding servers
W=$WORK/es
CHANTER_FAULT_RESHAPE_PAUSE=3000 job_up es || { nok "the cluster came up"; finish; exit 1; }
job_train es &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
CW es scale --workdir "$W" --embedding-servers 3 --wait >"$WORK/s2.out" 2>"$WORK/s2.err" &
sp=$!
until_ok 300 grep -qs "CHANTER_FAULT_RESHAPE_PAUSE" "$W/logs/embedding-0.log"
grep -q "^scale_servers_to=3" "$W/oracle/job"
expect "  the scale is in the oracle's record (oracle.state_dir/job) while it moves"
kill -9 "$(pid_of "$W" oracle-0)"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/es.err" | tail -3
expect_rc $rc "the oracle killed in the middle of the move: the job completes without an operator"
wait $sp
expect_rc $? "  chanter scale --wait saw the job train on 3 servers: $(tail -c 120 "$WORK/s2.out")"
job_down es
grep -q "the last oracle stopped in the middle of a scale from 2 to 3 embedding servers" "$W/logs/oracle-0.log" &&
  grep -q "scale: checkpoint .* of 2 servers is now .*\.s3 of 3" "$W/logs/oracle-0.log" &&
  [ "$(jf "$W/summary.json" "d['scales'][-1]['to']")" = 3 ]
expect "  the restarted oracle took the scale over and moved the rows again; summary.json lists the scale"
run_job ref2 && same es ref2
expect_rc $? "  the digest and test loss of the job never scaled ($(field "$WORK/ref2/summary.json" digest | cut -c1-16)...)"

# ---- the new server killed during the move
W=$WORK/nk
CHANTER_FAULT_RESHAPE_PAUSE=3000 job_up nk || { nok "the cluster came up"; finish; exit 1; }
job_train nk &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
CW nk scale --workdir "$W" --embedding-servers 3 >/dev/null 2>"$WORK/s3.err"
expect_rc $? "chanter scale --embedding-servers 3 accepted"
until_ok 300 grep -qs "CHANTER_FAULT_RESHAPE_PAUSE" "$W/logs/embedding-0.log"
kill -9 "$(pid_of "$W" embedding-2)" "$(pid_of "$W" trainer-1)" "$(pid_of "$W" dataproc-0)"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/nk.err" | tail -3
expect_rc $rc "the new embedding server, trainer 1 and the data processor killed in the middle of the move: the job completes"
job_down nk
grep -q "restarted during the move\|failed part-way" "$W/logs/oracle-0.log"
expect "  the move was made again (oracle log: $(grep -o "restarted during the move[^;]*\|failed part-way ([^)]*" "$W/logs/oracle-0.log" | head -1 | cut -c1-100))"
same nk ref2
expect_rc $? "  the digest and test loss of the job never scaled"
finish
