#!/usr/bin/env bash
# Integration: one chanter-embedding daemon killed with kill -9 and restarted
# on the same port and data dir loses nothing acknowledged, and its
# checkpoint protocol survives (README "The embedding server", Durability):
#  - sync_writes = true, then false: a client writing in a loop while the
#    server is killed; every row acknowledged before the kill reads back
#    bit-identical, the client's retries carry it across the restart, and a
#    CLI write made during the outage completes; the restarted server logs
#    that the previous one was killed (after SIGTERM: that it stopped clean);
#  - the fence: a write-back parked by Fence(id, c) is retried across the
#    restart and parks again (Stats shows the fence back, a new
#    incarnation), Checkpoint(id) releases it, and the checkpoint does not
#    hold the parked value while the live store does;
#  - a checkpoint killed half-way (CHANTER_FAULT_STORE_CHECKPOINT=staged:
#    before its marker; =complete: before its fence is lifted) is redone,
#    or answered, by the call retried across the restart; a second
#    Checkpoint of an id taken without a fence is still refused;
#  - SealCheckpoint and DeleteCheckpoint retried after a restart; start-up
#    removes a half-made checkpoint dir and refuses a damaged FENCE file
#    with a message that names it.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" --daemons seed=11 table_rows=1000000 embedding_dim=16 embedding_servers=1 embedding.drain_ms=1000
DATA=$WORK/data-0
LOG=$WORK/emb-0.log
ROWS=256 # rows per write-back of the writer

STUBS=$WORK/py
mkdir -p "$STUBS"
protoc -I "$ROOT/proto" --python_out="$STUBS" --grpc_python_out="$STUBS" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "$ROOT/proto/embedding.proto" 2>"$WORK/protoc.err" ||
  { nok "python stubs generated: $(cat "$WORK/protoc.err")"; finish; exit 1; }

MARK=0
start_embedding 0 "$JOB" || { nok "start the server"; finish; exit 1; }
PORT=${EMB_PORT[0]}
ok "server ready on port $PORT"

py() { /usr/bin/python3 "$ROOT/tests/integration/embedding_restart.py" "$STUBS" "127.0.0.1:$PORT" "$@"; }
cli() { C --set "cluster.embedding=127.0.0.1:$PORT" --set rpc.timeout_ms=20000 "$@"; }
kill9() { kill -9 "${EMB_PID[0]}"; wait "${EMB_PID[0]}" 2>/dev/null; return 0; }
# restart [args]: the server again, same port and data dir; MARK: where its log starts
restart() { MARK=$(wc -l <"$LOG"); EMB_LISTEN_PORT=$PORT start_embedding 0 "$JOB" "$@"; }
since_restart() { tail -n +$((MARK + 1)) "$LOG"; }

# --- acknowledged write-backs survive kill -9 in the middle of a stream of them
# mid_stream TAG [server args]: a writer of 300 batches, killed under it after 40
mid_stream() {
  local tag=$1 acks=$WORK/acks-$1; shift
  : >"$acks"
  py write-loop "$acks" 300 $ROWS >"$WORK/writer-$tag.out" 2>&1 &
  local wp=$!
  for _ in $(seq 1 500); do [ "$(wc -l <"$acks")" -ge 40 ] && break; sleep 0.01; done
  kill9
  cp "$acks" "$acks.before"
  local before; before=$(wc -l <"$acks.before")
  sleep 0.3 # the writer meets a dead server meanwhile
  restart "$@" || { nok "$tag: restart on the same port and data dir after kill -9"; return; }
  [ "$before" -ge 40 ] && [ "$before" -lt 300 ]
  expect "$tag: the server was killed in the middle of the writes ($before of 300 batches acknowledged)"
  since_restart | grep -q "was not closed by its previous server (pid" && since_restart | grep -q "previous_stop=unclean"
  expect "$tag: the restarted server says the previous one was killed and what the dir holds"
  py verify "$acks.before" $ROWS >"$WORK/verify-$tag.out" 2>&1
  expect_rc $? "$tag: every row acknowledged before the kill reads back bit-identical ($(cat "$WORK/verify-$tag.out"))"
  wait $wp
  local rc=$? retries; retries=$(sed -n 's/^retries=//p' "$WORK/writer-$tag.out")
  [ $rc -eq 0 ] && [ "${retries:-0}" -ge 1 ] && [ "$(wc -l <"$acks")" -eq 300 ]
  expect "$tag: the writer retried across the restart (retries=${retries:-?}) and all 300 write-backs succeeded"
  py verify "$acks" $ROWS >"$WORK/verify-$tag.out" 2>&1
  expect_rc $? "$tag: all of them read back bit-identical ($(cat "$WORK/verify-$tag.out"))"
}
mid_stream sync_writes=true
grep -q "sync_writes=1" "$LOG"; expect "the server ran with sync_writes = true"

# a CLI write made while the server is down completes once it is back
kill9
( cli embedding write 0:999999=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16.5 >"$WORK/cliw.out" 2>&1; echo $? >"$WORK/cliw.rc" ) &
cw=$!
sleep 0.3
restart
wait $cw
[ "$(cat "$WORK/cliw.rc")" = 0 ] && [ "$(cli embedding lookup 0:999999)" = "$(printf '0:999999\t1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16.5')" ]
expect "a chanter embedding write made during the outage retried, succeeded and reads back"

# --- the fence survives the restart
K=900001
py write $K 1 0 && inc1=$(py fence fx-1 10)
expect "Fence(fx-1, 10) answered with the server's incarnation"
( py write $K 2 12 "$WORK/parked1.done" >"$WORK/parked1.out" 2>&1 ) &
pw=$!
py wait-held 1
expect "a write-back of iteration c + 2 is held by the fence"
sleep 0.3
[ ! -f "$WORK/parked1.done" ]; expect "and not answered"
kill9
restart || nok "restart with a fence set"
s=$(py stats)
[ "$(field - fence_id <<<"$s")" = fx-1 ] && [ "$(field - fence_iteration <<<"$s")" = 10 ]
expect "the restarted server holds the fence again (Stats: $s)"
inc2=$(field - incarnation <<<"$s")
[ -n "$inc1" ] && [ "$inc2" != 0 ] && [ "$inc2" != "$inc1" ]; expect "Stats gives a new incarnation after the restart ($inc1 -> $inc2)"
since_restart | grep -q "fence restored id=fx-1 iteration=10" && since_restart | grep -q "fence=fx-1@10"
expect "its log says the fence was restored"
py wait-held 1
expect "the write-back retried across the restart is held again"
[ "$(py row $K)" = 1 ] && [ ! -f "$WORK/parked1.done" ]; expect "the parked value is not in the live store before the checkpoint"
py checkpoint fx-1 >/dev/null
expect "Checkpoint(fx-1) is taken"
wait $pw
[ $? -eq 0 ] && grep -q "retries=[1-9]" "$WORK/parked1.done"; expect "the checkpoint released the retried write-back ($(cat "$WORK/parked1.done" 2>/dev/null))"
[ "$(py row $K)" = 2 ]; expect "the live store holds the released value"
[ "$(py stats | field - fence_id)" = "" ]; expect "the fence is lifted (Stats)"
[ ! -e "$DATA/FENCE" ]; expect "and its file removed"
py restore fx-1 && [ "$(py row $K)" = 1 ]
expect "checkpoint fx-1 holds the row as of iteration 10, not the parked value"

# --- a checkpoint killed before it is complete is redone by the retried call
kill9
CHANTER_FAULT_STORE_CHECKPOINT=staged restart
K=900002
py write $K 1 0 && py fence fx-2 20 >/dev/null
( py write $K 2 22 "$WORK/parked2.done" >"$WORK/parked2.out" 2>&1 ) &
pw=$!
py wait-held 1
( py checkpoint fx-2 "$WORK/ckpt2.done" >"$WORK/ckpt2.out" 2>&1; echo $? >"$WORK/ckpt2.rc" ) &
cp=$!
wait "${EMB_PID[0]}" 2>/dev/null
[ $? -eq 137 ] && [ -d "$DATA/checkpoints.tmp/fx-2" ] && [ ! -e "$DATA/checkpoints.tmp/fx-2/CHANTER_CHECKPOINT" ] &&
  [ ! -e "$DATA/checkpoints/fx-2" ]
expect "killed inside Checkpoint(fx-2): a half-made directory without its marker, nothing in checkpoints/"
restart
since_restart | grep -q "removing checkpoints that were being taken"; expect "start-up removes the half-made checkpoint"
wait $cp
[ "$(cat "$WORK/ckpt2.rc")" = 0 ] && grep -q "retries=[1-9]" "$WORK/ckpt2.done"
expect_rc $? "the Checkpoint call retried across the restart took it anew ($(cat "$WORK/ckpt2.done" 2>/dev/null))"
wait $pw
[ $? -eq 0 ] && [ "$(py row $K)" = 2 ]; expect "the parked write-back went through after it"
[ "$(py list | grep -c '^fx-2 ')" = 1 ] && py restore fx-2 && [ "$(py row $K)" = 1 ]
expect "checkpoint fx-2 is listed once and holds the row as of iteration 20"

# --- killed after the checkpoint is complete, before its fence is lifted
kill9
CHANTER_FAULT_STORE_CHECKPOINT=complete restart
py fence fx-3 30 >/dev/null
( py checkpoint fx-3 "$WORK/ckpt3.done" >"$WORK/ckpt3.out" 2>&1; echo $? >"$WORK/ckpt3.rc" ) &
cp=$!
wait "${EMB_PID[0]}" 2>/dev/null
[ $? -eq 137 ] && [ -f "$DATA/checkpoints/fx-3/CHANTER_CHECKPOINT" ] && [ -f "$DATA/FENCE" ]
expect "killed between completing checkpoint fx-3 and lifting its fence"
restart
since_restart | grep -q "fence lifted at start id=fx-3"; expect "start-up sees the checkpoint of the fence and lifts it"
wait $cp
[ "$(cat "$WORK/ckpt3.rc")" = 0 ] && grep -q "checkpoint already taken id=fx-3" "$LOG"
expect "the retried Checkpoint(fx-3) is answered with the checkpoint taken, not ALREADY_EXISTS"
[ "$(py stats | field - fence_id)" = "" ] && [ "$(py list | grep -c '^fx-3 ')" = 1 ]; expect "no fence, fx-3 listed once"
cli embedding checkpoint plain-1 >/dev/null && err=$(cli embedding checkpoint plain-1 2>&1)
[ $? -ne 0 ] && [[ "$err" == *"already exists"* ]]; expect "a second Checkpoint of an id taken without a fence is still refused"

# --- SealCheckpoint and DeleteCheckpoint retried after a restart
py seal fx-3 "manifest of fx-3" && kill9 && restart && py seal fx-3 "manifest of fx-3" &&
  [ "$(py manifest fx-3)" = "manifest of fx-3" ] && [ "$(py list | grep -c '^fx-3 sealed')" = 1 ]
expect "SealCheckpoint retried after a restart: sealed once, the same manifest"
py delete fx-3 && kill9 && restart && { py delete fx-3 >"$WORK/del.out"; [ $? -eq 3 ]; } &&
  grep -q NOT_FOUND "$WORK/del.out" && [ "$(py list | grep -c '^fx-3 ')" = 0 ]
expect "DeleteCheckpoint retried after a restart: NOT_FOUND, the checkpoint is gone"

# --- start-up: a half-made checkpoint dir, a damaged FENCE file
kill9
mkdir -p "$DATA/checkpoints/half-1" && echo x >"$DATA/checkpoints/half-1/000009.sst"
printf 'format=1\nid=fx-9\nitera' >"$DATA/FENCE"
restart 2>/dev/null
[ $? -ne 0 ] && since_restart | grep -q "fence file $DATA/FENCE is damaged" && since_restart | grep -q "remove the file"
expect "a damaged FENCE file stops the server with a message naming it and what to do"
rm -f "$DATA/FENCE"
restart && [ ! -e "$DATA/checkpoints/half-1" ] && ! py list | grep -q half-1
expect "without it the server starts; a checkpoint dir without its marker is removed, never listed"

# --- sync_writes = false: a process kill loses nothing either (the WAL reached the OS)
kill9
restart --set embedding.sync_writes=false
since_restart | grep -q "sync_writes=0"; expect "the server runs with sync_writes = false"
mid_stream sync_writes=false --set embedding.sync_writes=false

# --- a clean stop is told apart
kill -TERM "${EMB_PID[0]}"; wait "${EMB_PID[0]}"
restart && since_restart | grep -q "previous_stop=clean"; expect "after SIGTERM the next start says the previous stop was clean"
finish
