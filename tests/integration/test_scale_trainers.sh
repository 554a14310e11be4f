#!/usr/bin/env bash
# Integration: `chanter scale --trainers N` on a running job, on a real
# local cluster (a data processor, two RocksDB embedding servers, the
# oracle, trainers over loopback gRPC and Gloo) under `chanter local`'s
# supervisor, which starts the new trainers and lets the surplus ones go.
#
# The guarantee: a job scaled 2 -> 3 -> 2 during one run ends with the
# digest (and test loss) BIT-identical to the same job stopped at the same
# checkpoints and resumed with --resume on 3 and then 2 trainers.  The
# scale iterations c1, c2 come from the scaled run's summary.json
# ("scales"); the reference stops at c by running iterations = c + 1 (the
# job's end takes a checkpoint of its last iteration) and resumes with more
# (a job may be resumed with other iterations and trainers: test_checkpoint.sh).
#
# Also: trainers 0 and 1 are the same processes throughout (they adopt the
# count in the new group), trainer 2 is started by the scale and leaves
# with exit 0 when the job goes back to 2; the scales are in summary.json,
# the metrics and chanter train's output; and the refusals, each with its
# sentence: a scale while one is under way (its checkpoint held 3 s by
# CHANTER_FAULT_CHECKPOINT_PAUSE), to the count the job has, to 0, above
# the key's bound, and on a job that is not training.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=400 eval_every=0 oracle.max_lookahead=8 checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000
W=$WORK/sc
SC() { CW sc scale --workdir "$W" "$@"; }

CHANTER_FAULT_CHECKPOINT_PAUSE=1:3000 job_up sc || { nok "the cluster came up"; finish; exit 1; }
job_train sc &
tp=$!
# once the job trains (trainer 0 has its first Step), the first scale; its checkpoint is held 3 s
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
SC --trainers 3 --wait --json >"$WORK/s1.json" 2>"$WORK/s1.err" &
sp=$!
until_ok 100 grep -qs "scale requested from=2 to=3" "$W/logs/oracle-0.log"
SC --trainers 4 >/dev/null 2>"$WORK/busy.err"; rc=$?
[ $rc -ne 0 ] && grep -q "a scale to 3 trainers is under way" "$WORK/busy.err"
expect_rc $? "a second scale while the first waits for its checkpoint is refused: $(head -c 160 "$WORK/busy.err")"
wait $sp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/s1.err" | tail -3
expect_rc $rc "chanter scale --trainers 3 --wait: the job trains on 3 trainers ($(cat "$WORK/s1.json"))"
[ "$(awk '$1 == "trainer-2"' "$W/pids" | wc -l)" = 1 ] && grep -q "^trainers = 3" "$W/job.ini"
expect "  the supervisor started trainer 2 and the job file says trainers = 3"
SC --trainers 3 >/dev/null 2>"$WORK/same.err"
[ $? -ne 0 ] && grep -q "has trainers = 3 already" "$WORK/same.err"
expect_rc $? "a scale to the count the job has is refused: $(head -c 160 "$WORK/same.err")"
SC --trainers 0 >/dev/null 2>"$WORK/zero.err"
[ $? -ne 0 ] && grep -q "outside 1..4096" "$WORK/zero.err"
expect_rc $? "a scale to 0 trainers is refused: $(head -c 160 "$WORK/zero.err")"
SC --trainers 5000 >/dev/null 2>"$WORK/big.err"
[ $? -ne 0 ] && grep -q "outside 1..4096" "$WORK/big.err"
expect_rc $? "a scale above the key's bound is refused: $(head -c 160 "$WORK/big.err")"
SC --trainers 2 --wait --json >"$WORK/s2.json" 2>"$WORK/s2.err"; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/s2.err" | tail -3
expect_rc $rc "chanter scale --trainers 2 --wait: back to 2 trainers ($(cat "$WORK/s2.json"))"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/sc.err" | tail -3
expect_rc $rc "the scaled job completes (digest $(field "$W/summary.json" digest | cut -c1-16)...)"
SC --trainers 3 >/dev/null 2>"$WORK/done.err"
[ $? -ne 0 ] && grep -q "the job is done; a job is scaled while it trains" "$WORK/done.err"
expect_rc $? "a scale of a job that is not training is refused: $(head -c 160 "$WORK/done.err")"
mport=$(field "$W/run/oracle-0.ready" metrics_port)
curl -s "http://127.0.0.1:$mport/metrics" | grep -Eq '^chanter_oracle_scales_total 2'
expect_rc $? "the oracle's metrics: chanter_oracle_scales_total 2"
job_down sc
grep -q '"event": *"exit", "name": *"trainer-2".*"how": *"exit 0"' "$W/run/events" &&
  ! grep -q '"event": *"restart"' "$W/run/events" &&
  [ "$(grep -c ' started rank=0 ' "$W/logs/trainer-0.log")" = 1 ] && [ "$(grep -c ' started rank=1 ' "$W/logs/trainer-1.log")" = 1 ]
expect "trainers 0 and 1 are the same processes throughout; trainer 2 left with exit 0 and was not restarted"
grep -q "scaled from 2 to 3 trainers" "$WORK/sc.err" && grep -q "scaled from 3 to 2 trainers" "$WORK/sc.err"
expect_rc $? "chanter train says each scale: $(grep -m1 -o 'scaled from 2 to 3.*' "$WORK/sc.err")"
C1=$(jf "$W/summary.json" "d['scales'][0]['at_iteration']")
C2=$(jf "$W/summary.json" "d['scales'][1]['at_iteration']")
python3 -c "
import json; d=json.load(open('$W/summary.json'))['scales']
assert [(s['from'], s['to']) for s in d] == [(2, 3), (3, 2)], d
assert all(s['pause_seconds'] >= 0 and s['seconds'] >= s['pause_seconds'] for s in d), d
assert d[0]['at_iteration'] < d[1]['at_iteration'] < 799, d" &&
  [ "$(jf "$W/summary.json" "len(d['recoveries'])")" = 0 ]
expect_rc $? "summary.json lists both scales, at iterations $C1 and $C2 (pauses $(jf "$W/summary.json" "', '.join('%.2f s' % s['pause_seconds'] for s in d['scales'])")), and no recovery"

# ---- the reference: stopped at c1 on 2, resumed on 3 to c2, resumed on 2 to the end
resume_legs ref "2:$((C1 + 1))" "3:$((C2 + 1))" "2:"
expect_rc $? "the reference: stopped after $C1 on 2 trainers, resumed on 3 to $C2, resumed on 2 to the end"
same sc ref
expect_rc $? "the scaled job's digest and test loss are BIT-identical to the reference's ($(field "$WORK/ref/summary.json" digest | cut -c1-16)...)"
finish
