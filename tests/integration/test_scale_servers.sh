#!/usr/bin/env bash
# Integration: `chanter scale --embedding-servers N` on a running job, on a
# real local cluster (a data processor, RocksDB embedding servers, the
# oracle, two trainers; lookahead auto up to 16, allocation = laia) under
# `chanter local`'s supervisor.
#
# The guarantee: a job scaled 2 -> 3 -> 1 embedding servers during one run
# ends with the digest and test loss BIT-identical to the same job that
# never scaled (which server holds a row never changes its value, and a
# scale goes on from its checkpoint as a resume does).  The rows whose
# owner changes move server to server (the servers' logs; the counts in
# summary.json's scales), the supervisor starts server 2 at the address
# the scale gave it and stops servers 1 and 2 once they are drained, the
# trainers are the same processes throughout (they make a new client of
# the servers); and the refusals, each with its sentence.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=800 eval_every=0 oracle.max_lookahead=16 allocation=laia checkpoint_every=0 checkpoint_seconds=0 checkpoint_keep=1000
W=$WORK/sc
SC() { CW sc scale --workdir "$W" "$@"; }

job_up sc || { nok "the cluster came up"; finish; exit 1; }
job_train sc &
tp=$!
until_ok 600 grep -qs "first Step" "$W/logs/trainer-0.log"
SC --embedding-servers 3 --wait --json >"$WORK/s1.json" 2>"$WORK/s1.err"; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/s1.err" | tail -3
expect_rc $rc "chanter scale --embedding-servers 3 --wait: the job trains on 3 servers ($(cat "$WORK/s1.json"))"
[ "$(awk '$1 == "embedding-2"' "$W/pids" | wc -l)" = 1 ] && grep -q "^embedding_servers = 3" "$W/job.ini"
expect "  the supervisor started embedding server 2 and the job file says embedding_servers = 3"
grep -q "reshape: moved rows=" "$W/logs/embedding-0.log" && grep -q "reshape: moved rows=" "$W/logs/embedding-1.log" &&
  grep -q "tls=on" "$W/logs/embedding-0.log" && ! grep -q "rpc_denied\|PERMISSION_DENIED" "$W/logs/embedding-2.log"
expect_rc $? "  the old servers sent the rows whose owner changed themselves, over mutual TLS with their own certificates"
# the refusals, while the job trains on 3 (the scale first: it lands early in the job)
SC --embedding-servers 0 >/dev/null 2>"$WORK/zero.err"
[ $? -ne 0 ] && grep -q "outside 1..4096" "$WORK/zero.err"
expect_rc $? "a scale to 0 servers is refused: $(head -c 160 "$WORK/zero.err")"
SC --embedding-servers 3 >/dev/null 2>"$WORK/same.err"
[ $? -ne 0 ] && grep -q "has embedding_servers = 3 already" "$WORK/same.err"
expect_rc $? "a scale to the count the job has is refused: $(head -c 160 "$WORK/same.err")"
SC --embedding-servers 4 --trainers 3 >/dev/null 2>"$WORK/both.err"
[ $? -eq 2 ] && grep -q "give one of --trainers N and --embedding-servers N" "$WORK/both.err"
expect_rc $? "two counts at once are refused: $(head -c 160 "$WORK/both.err")"
CW sc scale --embedding-servers 4 >/dev/null 2>"$WORK/noaddr.err"
[ $? -ne 0 ] && grep -q "3 embedding server addresses for 3 servers now and 4 after" "$WORK/noaddr.err"
expect_rc $? "without an address for a new server (no --workdir, the job file's three) it is refused: $(head -c 160 "$WORK/noaddr.err")"

SC --embedding-servers 1 --wait --json >"$WORK/s2.json" 2>"$WORK/s2.err"; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/s2.err" | tail -3
expect_rc $rc "chanter scale --embedding-servers 1 --wait: down to 1 server ($(cat "$WORK/s2.json"))"
wait $tp; rc=$?
[ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/sc.err" | tail -3
expect_rc $rc "the scaled job completes (digest $(field "$W/summary.json" digest | cut -c1-16)...)"
grep -q "^embedding_servers = 1" "$W/job.ini" &&
  grep -q '"event": *"exit", "name": *"embedding-1"' "$W/run/events" &&
  grep -q '"event": *"exit", "name": *"embedding-2"' "$W/run/events" && ! grep -q '"event": *"restart"' "$W/run/events"
expect_rc $? "the job file says 1 server; servers 1 and 2 were stopped once drained, not restarted"
mport=$(field "$W/run/oracle-0.ready" metrics_port)
curl -s "http://127.0.0.1:$mport/metrics" >"$WORK/metrics.txt"
grep -Eq '^chanter_oracle_scales_total 2' "$WORK/metrics.txt" && grep -Eq '^chanter_oracle_scale_rows_moved [1-9]' "$WORK/metrics.txt" &&
  grep -Eq '^chanter_oracle_scale_bytes_moved [1-9]' "$WORK/metrics.txt"
expect_rc $? "the oracle's metrics: $(grep -E '^chanter_oracle_scale(s_total|_rows_moved|_bytes_moved)' "$WORK/metrics.txt" | tr '\n' ' ')"
job_down sc
[ "$(grep -c ' started rank=0 ' "$W/logs/trainer-0.log")" = 1 ] && [ "$(grep -c ' started rank=1 ' "$W/logs/trainer-1.log")" = 1 ] &&
  grep -q "embedding servers went from 2 to 3" "$W/logs/trainer-0.log" && grep -q "embedding servers went from 3 to 1" "$W/logs/trainer-1.log"
expect "the trainers are the same processes throughout, each with a new client of the servers"
python3 -c "
import json; d=json.load(open('$W/summary.json'))
s=d['scales']
assert [(x['what'], x['from'], x['to']) for x in s] == [('embedding_servers', 2, 3), ('embedding_servers', 3, 1)], s
assert all(x['rows_moved'] > 0 and x['bytes_moved'] > 0 and x['seconds'] >= x['pause_seconds'] >= 0 for x in s), s
assert len(d['recoveries']) == 0, d['recoveries']"
expect_rc $? "summary.json lists both scales with the rows moved ($(jf "$W/summary.json" "', '.join('%d rows, %d bytes, pause %.2f s' % (s['rows_moved'], s['bytes_moved'], s['pause_seconds']) for s in d['scales'])")), and no recovery"
grep -q "scaled from 2 to 3 embedding servers" "$WORK/sc.err" && grep -q "scaled from 3 to 1 embedding servers" "$WORK/sc.err"
expect_rc $? "chanter train says each scale: $(grep -m1 -o 'scaled from 2 to 3.*' "$WORK/sc.err")"

grep -o "scale: checkpoint .*" "$W/logs/oracle-0.log" | sed 's/^/# /'
run_job ref && same ref sc
expect_rc $? "the same job never scaled: the same digest and test loss ($(field "$WORK/ref/summary.json" digest | cut -c1-16)...)"
finish
