#!/usr/bin/env bash
# Integration: a scale under fault leaves the job recoverable to the same
# digest, on a real local cluster under `chanter local`'s supervisor.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=${IT:-800} checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000 rpc.timeout_ms=4000 local.restart_ms=6000
W=$WORK/sc
SC() { CW sc scale --workdir "$W" "$@"; }

# ---- an embedding server killed in the middle of the move (server 0 pauses 3 s after its first batch)
CHANTER_FAULT_RESHAPE_PAUSE=1500 job_up sc || { nok "the cluster came up"; finish; exit 1; }
job_train sc &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
SC --embedding-servers 3 --wait --json >"$WORK/s1.json" 2>"$WORK/s1.err" &
sp=$!
until_ok 600 grep -qs "CHANTER_FAULT_RESHAPE_PAUSE" "$W/logs/embedding-${KILL:-0}.log" "$W/logs/embedding-0.log"
kill -9 "$(pid_of "$W" embedding-${KILL:-0})"
wait $sp; echo "scale rc=$?"
wait $tp; echo "train rc=$?"
tail -3 "$WORK/sc.err"
job_down sc
grep -E "reshape|scale|lost|recover|fail" "$W/logs/oracle-0.log" | cut -c1-400
cat "$W/run/events" | tail -5
jf "$W/summary.json" "d['recoveries'], d['scales'], d['digest']"
N_FAIL=1; finish
