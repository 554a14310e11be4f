#!/usr/bin/env bash
# Integration: real chanter-dataproc daemons on loopback serving a generated
# Criteo-shaped dataset (TSV and its binary conversion): the same batch
# from every daemon and format (train and test split; info reports the
# shape); a stream arrives whole and equals the batches fetched alone, and
# is the same, in order, with 1, 4 or the default count of build threads; a
# client that goes away mid-stream leaves no build and no thread behind;
# kill -9 mid-stream: the processor restarts on its port and the client
# resumes with nothing lost or duplicated; with one of two processors down
# every batch is still served; bad requests and bad configuration are
# refused saying why; metrics count the batches; SIGTERM exits 0.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
cat >"$JOB" <<INI
seed = 7
batch_size = 512
table_rows = 1000,2000,50,7,100000,300,30,1000,1000,1000,1000,1000,1000,
    1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000,1000
[synthetic]
samples = 60000
[dataproc]
metrics_port_offset = 0
drain_ms = 2000
INI

C data gen --out "$WORK/d.tsv" --format tsv --samples 60000 >/dev/null 2>"$WORK/gen.err"
expect "chanter data gen writes a Criteo-shaped TSV"
C data convert "$WORK/d.tsv" "$WORK/d.bin" >/dev/null 2>"$WORK/conv.err"
expect "chanter data convert writes the binary form"

start_dataproc 0 "$JOB" --set dataset="$WORK/d.bin" || { nok "start processor 0 (binary)"; finish; exit 1; }
start_dataproc 1 "$JOB" --set dataset="$WORK/d.bin" || { nok "start processor 1 (binary)"; finish; exit 1; }
start_dataproc 2 "$JOB" --set dataset="$WORK/d.tsv" || { nok "start processor 2 (tsv)"; finish; exit 1; }
ok "three processors ready (binary, binary, tsv)"
only() { echo "cluster.dataproc=127.0.0.1:${DP_PORT[$1]}"; }

# --- the same batch, whichever processor serves it, from text or binary
for x in 0 7 81; do
  a=$(C --set "$(only 0)" dataproc batch $x) && b=$(C --set "$(only 1)" dataproc batch $x) && \
    c=$(C --set "$(only 2)" dataproc batch $x)
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; expect "batch $x is identical from both binary processors and the TSV one"
done
a=$(C --set "$(only 0)" dataproc batch 3 --test) && c=$(C --set "$(only 2)" dataproc batch 3 --test)
[ "$a" = "$c" ] && [[ "$a" == *"test samples=512"* ]]; expect "test-split batches agree too"
b=$(C --set "$(only 0)" dataproc batch 3)
[ "$a" != "$b" ]; expect "the test split is not the train split"
C --json --set "$(only 0)" dataproc info >"$WORK/info.json"
python3 -c "
import json; d=json.load(open('$WORK/info.json'))['processors'][0]
assert d['samples']==60000 and d['train_samples']+d['test_samples']==60000 and d['n_tables']==26 and d['n_dense']==13, d
assert d['format']=='binary', d"; expect "info reports the dataset's shape"

# --- a clean stream, the reference
C --set "$(only 0)" dataproc stream 0 120 >"$WORK/ref.txt" 2>"$WORK/ref.err"
[ "$(grep -c '^batch ' "$WORK/ref.txt")" = 120 ]; expect "a stream of 120 batches arrives whole"
[ "$(sed -n 50p "$WORK/ref.txt")" = "$(C --set "$(only 1)" dataproc batch 49)" ]; expect "a streamed batch equals the same batch fetched alone"

# --- several build threads: the same batches, byte for byte and in order, as one
start_dataproc 3 "$JOB" --set dataset="$WORK/d.bin" --set dataproc.build_threads=1 || nok "start processor 3 (1 build thread)"
start_dataproc 4 "$JOB" --set dataset="$WORK/d.bin" --set dataproc.build_threads=4 || nok "start processor 4 (4 build threads)"
for bs in 512 16; do
  C --set "$(only 3)" --set batch_size=$bs dataproc stream 0 300 >"$WORK/t1.txt" 2>/dev/null
  C --set "$(only 4)" --set batch_size=$bs dataproc stream 0 300 >"$WORK/t4.txt" 2>/dev/null
  [ "$(grep -c '^batch ' "$WORK/t1.txt")" = 300 ] && cmp -s "$WORK/t1.txt" "$WORK/t4.txt"
  expect "batch size $bs: 300 batches streamed with 4 build threads equal, in order, those with 1"
done
cmp -s <(C --set "$(only 4)" dataproc stream 0 120 | grep '^batch ') <(grep '^batch ' "$WORK/ref.txt")
expect "and equal those of a processor with the default count"
grep -q "build_threads=4" "$WORK/dp-4.log"; expect "the processor logs its build threads"

# --- a client that goes away mid-stream leaves no thread and no build behind
# our threads: the loop (the process's name), the poller (rpc-server-cq), the
# build pool (dataproc-build once it has built, the process's name before);
# gRPC's own (event_engine, default-executor, timers) come and go as it likes
tasks() { cat /proc/"${DP_PID[$P]}"/task/*/comm | grep -cE '^(chanter-datapro|rpc-server-cq|dataproc-build)$'; }
cpu() { awk '{print $14 + $15}' "/proc/${DP_PID[$P]}/stat"; }
gauge() { python3 - "${DP_MPORT[$P]}" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(int(float([l for l in body.splitlines() if l.startswith("chanter_dataproc_open_streams")][0].split()[-1])))
PY
}
for P in 3 4; do # 1 builder (3 builds queued behind it: cancelled) and 4 (all running)
before=$(tasks)
C --set "$(only $P)" --set batch_size=16384 dataproc stream 0 1000 >"$WORK/c.txt" 2>/dev/null &
bg=$!
for _ in $(seq 1 300); do [ "$(grep -c '^batch ' "$WORK/c.txt" 2>/dev/null)" -ge 3 ] && break; sleep 0.02; done
mid=$(gauge)
kill -9 $bg; wait $bg 2>/dev/null
got=$(grep -c '^batch ' "$WORK/c.txt")
open=1
for _ in $(seq 1 100); do open=$(gauge); [ "$open" = 0 ] && break; sleep 0.05; done
[ "$mid" = 1 ] && [ "$open" = 0 ] && [ "$got" -lt 1000 ]; expect "processor $P: a stream killed after $got of 1000 batches is closed"
c0=$(cpu); sleep 0.5; c1=$(cpu)
[ $((c1 - c0)) -le 5 ]; expect "and nothing builds for it any more (cpu ticks in 0.5 s: $((c1 - c0)))"
after=$(tasks)
[ "$after" -le "$before" ] && [ "$before" -ge $((P == 3 ? 3 : 6)) ]
expect "and no thread is left behind (threads: $before before, $after after: loop, poller, builders)"
C --set "$(only $P)" dataproc batch 81 >/dev/null; expect "the processor serves on after the cancel"
done
kill -TERM "${DP_PID[3]}" "${DP_PID[4]}"; wait "${DP_PID[3]}"; r3=$?; wait "${DP_PID[4]}"; r4=$?
[ $r3 -eq 0 ] && [ $r4 -eq 0 ] && grep -q "stopped cleanly" "$WORK/dp-4.log"; expect "both stop cleanly on SIGTERM"

# --- kill -9 mid-stream; the client resumes from where it was once the processor is back
C --set "$(only 0)" --set batch_size=64 dataproc stream 0 3000 >"$WORK/s.txt" 2>"$WORK/s.err" &
bg=$!
for _ in $(seq 1 200); do [ "$(grep -c '^batch ' "$WORK/s.txt" 2>/dev/null)" -ge 200 ] && break; sleep 0.02; done
kill -9 "${DP_PID[0]}"; wait "${DP_PID[0]}" 2>/dev/null
got_at_kill=$(grep -c '^batch ' "$WORK/s.txt")
sleep 0.3
DP_LISTEN_PORT=${DP_PORT[0]} start_dataproc 0 "$JOB" --set dataset="$WORK/d.bin"
expect "processor 0 restarts on its port"
wait $bg; rc=$?
[ $rc -eq 0 ] && [ "$got_at_kill" -lt 3000 ]; expect "the stream that lost its processor completed (killed after $got_at_kill of 3000)"
C --set "$(only 1)" --set batch_size=64 dataproc stream 0 3000 >"$WORK/s_ref.txt" 2>/dev/null
diff <(grep '^batch ' "$WORK/s.txt") <(grep '^batch ' "$WORK/s_ref.txt") >/dev/null
expect "nothing lost or duplicated: the resumed stream equals a clean one from another processor"
grep -q "1 stream restarts" "$WORK/s.txt"; expect "the client reports the stream restart"

# --- failover: one of two processors down, every batch still served
kill -9 "${DP_PID[1]}"; wait "${DP_PID[1]}" 2>/dev/null
both="cluster.dataproc=127.0.0.1:${DP_PORT[0]},127.0.0.1:${DP_PORT[1]}"
out=$(C --set "$both" dataproc batch 5) && [ "$out" = "$(C --set "$(only 2)" dataproc batch 5)" ]
expect "batch 5 (owner: the dead processor 1) is served by processor 0"

# --- bad requests and bad configuration
err=$(C --set "$(only 0)" --set table_rows=5,5 dataproc batch 1 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"data schema"* ]]; expect "a client of another schema is refused, saying why"
err=$(C --set "$(only 0)" dataproc batch 1 --batch-size 0 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"batch_size 0"* ]]; expect "batch size 0 is refused"
"$BIN/chanter-dataproc" --config "$JOB" --listen 127.0.0.1:0 --set dataset="$WORK/nope.tsv" >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "nope.tsv" "$WORK/bad.log"; expect "a missing dataset stops the processor, naming the file"
"$BIN/chanter-dataproc" --config "$JOB" --listen 127.0.0.1:0 --set dataset="$WORK/d.bin" --set n_dense=3 >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "d.bin" "$WORK/bad.log"; expect "a binary file of another schema is refused at start"
"$BIN/chanter-dataproc" --config "$JOB" --listen "127.0.0.1:${DP_PORT[2]}" --set dataset="$WORK/d.bin" >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "cannot listen on 127.0.0.1:${DP_PORT[2]}" "$WORK/bad.log"; expect "a port in use is a clear error"
err=$(C --set cluster.dataproc=127.0.0.1:1 --set rpc.timeout_ms=1000 dataproc batch 1 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"data processor 0 (127.0.0.1:1)"* ]]; expect "a processor that is down is a clear error, no hang"

# --- metrics and SIGTERM
python3 - "${DP_MPORT[2]}" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
line = [l for l in body.splitlines() if l.startswith("chanter_dataproc_batches_served_total")][0]
assert int(float(line.split()[-1])) >= 4, line
PY
expect "metrics count the batches served"
kill -TERM "${DP_PID[2]}"; wait "${DP_PID[2]}"; rc=$?
[ $rc -eq 0 ] && grep -q "stopped cleanly" "$WORK/dp-2.log"; expect "SIGTERM stops the processor with exit 0"
finish
