#!/usr/bin/env bash
# Integration: two real chanter-embedding daemons on loopback, driven by the
# chanter CLI and by a Python grpcio client: never-written rows read
# deterministically, written rows read back (from either client); bad CLI
# input fails naming it and writes nothing; the metrics endpoint (loopback
# only by default, Prometheus text); kill -9 after an acknowledged write
# loses nothing, a client calling during the outage gets its rows after the
# restart; checkpoint/restore; the whole-job checkpoint calls (seal,
# manifest, delete, clear, the set digest); bad configuration stops the
# daemon naming it; SIGTERM drains and exits 0; a data dir of another
# layout is refused; a client of a stopped server gets a clear error;
# sd_notify READY=1 and STATUS=.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" --daemons seed=42 "table_rows=1000, 50000" embedding_dim=4 embedding_optimizer=rowwise_adagrad \
  embedding_servers=2 shard.table_wise_max_rows=10000

start_embedding 0 "$JOB" || { nok "start shard 0"; finish; exit 1; }
start_embedding 1 "$JOB" || { nok "start shard 1"; finish; exit 1; }
ok "two daemons ready (ports ${EMB_PORT[0]} ${EMB_PORT[1]})"

cluster() { echo "cluster.embedding=127.0.0.1:${EMB_PORT[0]},127.0.0.1:${EMB_PORT[1]}"; }
cli() { C --set "$(cluster)" "$@"; }

# --- lazy init: deterministic, nothing stored
a=$(cli embedding lookup 0:5 1:7 1:49999) && b=$(cli embedding lookup 0:5 1:7 1:49999)
[ -n "$a" ] && [ "$a" = "$b" ]; expect "lookup of never-written rows is deterministic"
check "lookup prints one line per key, 5 floats each" [ "$(echo "$a" | awk '{print NF}' | sort -u)" = "6" ]
out=$(cli embedding digest)
check "digest counts no stored rows before any write" grep -q 'combined: rows=0 ' <<<"$out"

# --- write-back then lookup
cli embedding write 0:5=1,2,3,4,0.5 1:7=-1,-2,-3,-4,9 >/dev/null
check "write acknowledged" [ $? -eq 0 ]
out=$(cli embedding lookup 0:5 1:7)
check "lookup returns the written rows" [ "$out" = "$(printf '0:5\t1 2 3 4 0.5\n1:7\t-1 -2 -3 -4 9')" ]
cli --json embedding lookup 0:5 >"$WORK/l.json"
check "--json lookup parses and carries the values" python3 -c "
import json; d=json.load(open('$WORK/l.json')); r=d['rows'][0]
assert r['table']==0 and r['row']==5 and r['values']==[1,2,3,4,0.5] and r['dim']==4, d"

# --- bad input through the CLI: clear errors, nothing written
d_before=$(cli embedding digest | tail -1)
err=$(cli embedding lookup 0:1000 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"row 1000 of table 0, which has 1000 rows"* ]]; expect "lookup of a row past the table fails naming it"
err=$(cli embedding write 0:9=1,2,3 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"rows have 5 floats (dim 4 + 1 optimizer state), got 3"* ]]; expect "write of a short row fails naming the row size"
err=$(cli embedding lookup 7:1 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"table 7 but the layout has 2 tables"* ]]; expect "lookup in an unknown table fails naming it"
check "rejected CLI calls wrote nothing" [ "$(cli embedding digest | tail -1)" = "$d_before" ]

# --- a client in another language: Python grpcio, stubs generated now
STUBS=$WORK/py
mkdir -p "$STUBS"
if protoc -I "$ROOT/proto" --python_out="$STUBS" --grpc_python_out="$STUBS" \
     --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "$ROOT/proto/embedding.proto" 2>"$WORK/protoc.err"; then
  ok "python stubs generated from proto/embedding.proto"
  /usr/bin/python3 "$ROOT/tests/integration/embedding_client.py" "$STUBS" "127.0.0.1:${EMB_PORT[0]}" "127.0.0.1:${EMB_PORT[1]}"
  check "python client exits 0" [ $? -eq 0 ]
  out=$(cli embedding lookup 0:6)
  check "a row written from Python reads back through the CLI" [ "$out" = "$(printf '0:6\t0.25 -0.5 0.75 -1 2')" ]
else
  nok "python stubs generated: $(cat "$WORK/protoc.err")"
fi

# --- metrics endpoint
# loopback by default (metrics.listen): nothing listens on the port on another address
ss -ltnH "sport = :${EMB_MPORT[0]}" >"$WORK/ss.out" 2>&1
check "the metrics endpoint listens on 127.0.0.1 only by default: $(awk '{print $4}' "$WORK/ss.out" | tr '\n' ' ')" \
  [ "$(awk '{print $4}' "$WORK/ss.out")" = "127.0.0.1:${EMB_MPORT[0]}" ]
check "metrics endpoint serves Prometheus text with Lookup counts" python3 - "${EMB_MPORT[0]}" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
assert '# TYPE chanter_embedding_rpc_calls_total counter' in body, body[:500]
line = [l for l in body.splitlines() if l.startswith('chanter_embedding_rpc_calls_total{method="Lookup"}')][0]
assert int(float(line.split()[-1])) > 0, line
assert 'chanter_embedding_rows_written_total' in body
PY

# --- kill -9 right after an acknowledged write-back: nothing lost
cli embedding write 1:11=5,6,7,8,1 1:12=9,10,11,12,2 0:13=1,1,1,1,1 >/dev/null && \
  kill -9 "${EMB_PID[0]}" "${EMB_PID[1]}"
wait "${EMB_PID[0]}" "${EMB_PID[1]}" 2>/dev/null
# a client calls while both servers are down; it retries until they are back
( cli --set rpc.timeout_ms=20000 embedding lookup 1:11 1:12 0:13 0:5 >"$WORK/retry.out" 2>&1; echo $? >"$WORK/retry.rc" ) &
bg=$!
sleep 0.5
EMB_LISTEN_PORT=${EMB_PORT[0]} start_embedding 0 "$JOB" && EMB_LISTEN_PORT=${EMB_PORT[1]} start_embedding 1 "$JOB"
check "daemons restart on the same data and ports after kill -9" [ $? -eq 0 ]
wait $bg
want=$(printf '1:11\t5 6 7 8 1\n1:12\t9 10 11 12 2\n0:13\t1 1 1 1 1\n0:5\t1 2 3 4 0.5')
[ "$(cat "$WORK/retry.rc")" = 0 ] && [ "$(cat "$WORK/retry.out")" = "$want" ]; expect "a client that called during the outage got its rows after the restart"
out=$(cli embedding lookup 1:11 1:12 0:13 0:5)
check "acknowledged rows survived kill -9" [ "$out" = "$want" ]

# --- checkpoint -> more writes -> restore
cli embedding checkpoint cp1 >/dev/null
check "checkpoint on every server" [ $? -eq 0 ]
d_cp=$(cli embedding digest | tail -1)
cli embedding write 0:5=9,9,9,9,9 1:40000=3,3,3,3,3 >/dev/null
check "writes after the checkpoint change the digest" [ "$(cli embedding digest | tail -1)" != "$d_cp" ]
check "checkpoints lists cp1 on both servers" [ "$(cli embedding checkpoints | grep -c ': cp1')" = 2 ]
err=$(cli embedding checkpoint cp1 2>&1)
check "a duplicate checkpoint id is refused" [ $? -ne 0 ]
cli embedding restore cp1 >/dev/null
check "restore on every server" [ $? -eq 0 ]
check "restore brings back the checkpointed digest" [ "$(cli embedding digest | tail -1)" = "$d_cp" ]
out=$(cli embedding lookup 0:5)
check "an overwritten row is back to its checkpointed value" [ "$out" = "$(printf '0:5\t1 2 3 4 0.5')" ]
err=$(cli embedding restore nosuch 2>&1)
[ $? -ne 0 ] && [[ "$err" == *"nosuch"* ]]; expect "restoring an unknown checkpoint fails clearly"

# --- the server side of whole-job checkpoints: seal, manifest, delete, clear, set digest
py_client() { /usr/bin/python3 "$ROOT/tests/integration/embedding_client.py" "$STUBS" \
                "127.0.0.1:${EMB_PORT[0]}" "127.0.0.1:${EMB_PORT[1]}" "$@"; }
if [ -f "$STUBS/embedding_pb2.py" ]; then
  cli embedding checkpoint job-7 >/dev/null
  check "checkpoints lists job-7 unsealed on both servers" [ "$(cli embedding checkpoints | grep ': job-7' | grep -c unsealed)" = 2 ]
  py_client checkpoints job-7
  check "python SealCheckpoint/GetManifest/DeleteCheckpoint client exits 0" [ $? -eq 0 ]
  check "checkpoints lists job-7 sealed on both servers" [ "$(cli embedding checkpoints | grep ': job-7' | grep -cw sealed)" = 2 ]
  cli embedding restore job-7 >/dev/null
  check "a sealed checkpoint restores and stays sealed" [ "$(cli embedding checkpoints | grep ': job-7' | grep -cw sealed)" = 2 ]
  py_client clear "$WORK/set.hex"
  check "python Clear/set digest client exits 0" [ $? -eq 0 ]
  out=$(cli embedding digest | tail -1)
  check "the CLI's combined set digest is the sum the python client computed" \
    grep -q "^combined: rows=50 .* set=$(cat "$WORK/set.hex")\$" <<<"$out"
  check "checkpoints lists nothing after Clear" [ -z "$(cli embedding checkpoints)" ]
  check "stats says rows but no blobs after Clear and new writes" [ "$(cli embedding stats | grep -c 'stored: rows, no blobs')" -ge 1 ]
  err=$(cli embedding restore job-7 2>&1)
  [ $? -ne 0 ] && [[ "$err" == *"job-7"* ]]; expect "a checkpoint removed by Clear cannot be restored"
  grep -q "sealed checkpoint id=job-7" "$WORK/emb-0.log" && grep -q "cleared every row, blob and checkpoint" "$WORK/emb-1.log"
  expect "the daemons log SealCheckpoint and Clear"
else
  nok "python stubs for the checkpoint RPCs (see above)"
fi

# --- configuration errors are clear and stop the daemon
"$BIN/chanter-embedding" --config "$JOB" --shard 0 --listen 127.0.0.1:0 --set batch_size=lots >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "batch_size = 'lots' is not an integer" "$WORK/bad.log"; expect "a bad --set value stops the daemon and is named"
"$BIN/chanter-embedding" --config "$WORK/missing.ini" --shard 0 >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "missing.ini: cannot open" "$WORK/bad.log"; expect "a missing job file is named"
"$BIN/chanter-embedding" --config "$JOB" --shard 0 --listen 127.0.0.1:0 --data-dir "$WORK/data-0" >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -qi "lock\|in use\|cannot open the store" "$WORK/bad.log"; expect "a second daemon on the same data dir is refused"
"$BIN/chanter-embedding" --config "$JOB" --shard 0 --listen "127.0.0.1:${EMB_PORT[1]}" --data-dir "$WORK/data-x" >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "cannot listen on 127.0.0.1:${EMB_PORT[1]}" "$WORK/bad.log"; expect "a port in use is a clear error"
"$BIN/chanter-embedding" --config "$JOB" --shard 5 >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "shard must be given and in \[0, 2)" "$WORK/bad.log"; expect "a shard outside embedding_servers is refused"

# --- SIGTERM: drain and exit 0
kill -TERM "${EMB_PID[1]}"
wait "${EMB_PID[1]}"; rc=$?
[ $rc -eq 0 ] && grep -q "stopped cleanly" "$WORK/emb-1.log"; expect "SIGTERM stops the daemon with exit 0"
# shard 1 is stopped: its data dir is free, and was made with seed 42
"$BIN/chanter-embedding" --config "$JOB" --shard 0 --listen 127.0.0.1:0 --set seed=7 --data-dir "$WORK/data-1" >"$WORK/bad.log" 2>&1
[ $? -ne 0 ] && grep -q "layout" "$WORK/bad.log"; expect "a data dir of another layout is refused"
# table 1 is split row-wise: some of these rows live on the stopped server 1
err=$(cli --set rpc.timeout_ms=1500 embedding lookup 1:1 1:2 1:3 1:4 1:5 1:6 1:7 1:8 1:9 1:10 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"embedding server"* ]]; expect "a client of a stopped server gets a clear error, no hang"

# --- systemd readiness: READY=1 and STATUS= over NOTIFY_SOCKET
check "sd_notify READY=1 and STATUS sent when serving" /usr/bin/python3 - "$BIN" "$JOB" "$WORK" <<'PY'
import os, socket, subprocess, sys, time
binp, job, work = sys.argv[1:4]
path = os.path.join(work, "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(path); s.settimeout(10)
env = dict(os.environ, NOTIFY_SOCKET=path)
p = subprocess.Popen([binp + "/chanter-embedding", "--config", job, "--shard", "1", "--listen", "127.0.0.1:0"],
                     env=env, stderr=open(os.path.join(work, "notify.log"), "w"))
got = []
try:
    while not any(m.startswith("STATUS=serving") for m in got):
        got.append(s.recv(4096).decode())
    assert "READY=1" in got, got
finally:
    p.terminate(); rc = p.wait(timeout=20)
got.append(s.recv(4096).decode())
assert "STOPPING=1" in got, got
assert rc == 0, rc
PY
finish
