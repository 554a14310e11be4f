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
# And the oracle killed in the middle of a scale's move of the embedding
# servers (2 -> 3; CHANTER_FAULT_RESHAPE_PAUSE holds each server's move):
# not recovered by itself (the restarted oracle, on the job file of 3
# servers, finds the job blocked and chanter train says so); the operator's
# way out, as docs/reference.md gives it -- `local down`, `local up` with the
# job file of before the scale, `train --resume` -- goes on from the scale's
# checkpoint on the old servers, to the digest of the job never scaled.
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
CW es scale --workdir "$W" --embedding-servers 3 >/dev/null 2>"$WORK/s2.err"
expect_rc $? "chanter scale --embedding-servers 3 accepted"
until_ok 300 grep -qs "CHANTER_FAULT_RESHAPE_PAUSE" "$W/logs/embedding-0.log"
kill -9 "$(pid_of "$W" oracle-0)"
wait $tp; rc=$?
[ $rc -ne 0 ] && grep -q "the job is blocked: the embedding servers hold another job's state" "$WORK/es.err"
expect_rc $? "killed in the middle of the move: the restarted oracle finds the job blocked, and chanter train says so"
job_down es
job_up es && job_train es --resume
expect_rc $? "local down, local up with the job file of before the scale, train --resume: the job completes"
job_down es
C2=$(grep -o "scale requested from=2 to=3 checkpoint=[^ ]*" "$W/logs/oracle-0.log" | head -1 | sed 's/.*checkpoint=//')
[ -n "$C2" ] && grep -q "resumed job_id=.* from checkpoint=$C2:" "$W/logs/oracle-0.log"
expect "  it resumed from the scale's checkpoint $C2"
run_job ref2 && same es ref2
expect_rc $? "the digest and test loss of the job never scaled ($(field "$WORK/ref2/summary.json" digest | cut -c1-16)...)"
finish
