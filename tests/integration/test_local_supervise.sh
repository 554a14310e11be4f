#!/usr/bin/env bash
# Integration: the supervisor of `chanter local up` (tools/chanter/
# supervise.c), which restarts the daemons of a local cluster as systemd's
# Restart=on-failure, RestartPreventExitStatus=3, StartLimitBurst= and
# WatchdogSec= do for the units.
#
# On one small cluster (2 data processors, 2 embedding servers, the oracle,
# 1 trainer whose 20-iteration job ends first): `local up` names its
# supervisor, with a notify socket, and a second `local up` on the same
# work dir is refused; `local status` shows each daemon's last STATUS=; the
# trainer's exit 0 is not restarted; a data processor killed with SIGKILL
# is restarted on its port (job.ini unchanged, it serves there again) and
# `local status` (JSON and text) says restarts 1 and why, supervisor.log
# has a timestamped line for it; a daemon that exits 3 stays down; one that
# keeps failing is given up after local.restart_burst restarts while the
# rest run on; a stopped one (SIGSTOP) is killed by the watchdog (SIGABRT,
# logged with why) and restarted on its port; W/run/events has a line for
# each, with its fields, in order; `local down` stops every daemon in order
# with SIGTERM and leaves no process and no zombie (the supervisor reaps
# the daemons).  Then, on a second cluster whose supervisor is killed:
# `local status` and `local down` still work from W/pids.  On two more, a
# `chanter train` watching the job returns, saying why, when the oracle
# stops with no trainer attached, and when the oracle is killed and the
# cluster taken down.
#
# chanter-dataproc and chanter-embedding run behind a wrapper (in a copy
# of the bin directory: the supervisor starts the daemons beside its own
# binary) that exits at once with the status in $WORK/force/<binary> when
# that file exists: a daemon that exits 3, or fails on every restart.
source "$(dirname "$0")/lib.sh"

W=$WORK/w
W2=$WORK/w2
SB=$WORK/bin
mkdir -p "$SB" "$WORK/force"
cp "$BIN/chanter" "$SB/chanter"
for d in oracle trainer; do ln -s "$BIN/chanter-$d" "$SB/chanter-$d"; done
for d in dataproc embedding; do
  cat >"$SB/chanter-$d" <<SH
#!/bin/sh
[ -f "$WORK/force/chanter-$d" ] && exit "\$(cat "$WORK/force/chanter-$d")"
exec "$BIN/chanter-$d" "\$@"
SH
  chmod +x "$SB/chanter-$d"
done

down_all() { clusters_down "$SB/chanter" "$W" "$W2"; cleanup; }
trap down_all EXIT

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=20 trainers=1 dataprocs=2 synthetic.samples=20000
CHANTER=$SB/chanter
state_is() { [ "$(st "$W" "$1" state)" = "$2" ]; }
# events NAME EVENT: how many lines of W/run/events say EVENT of NAME
events() { grep -c "\"event\": \"$2\", \"name\": \"$1\"" "$W/run/events" 2>/dev/null; }
ALL_PIDS=()

# ---- up: the supervisor starts the cluster
C --set local.restart_ms=200 --set local.restart_burst=2 --set local.watchdog_ms=2000 \
  local up --workdir "$W" >"$WORK/up.out" 2>&1
rc=$?
SUP=$(cat "$W/run/supervisor.pid" 2>/dev/null)
[ $rc -eq 0 ] && grep -q "^cluster up: 2 data processor(s), 2 embedding server(s), oracle, 1 trainer(s)" "$WORK/up.out" &&
  [ "$(wc -l <"$W/pids")" -eq 6 ] && running "$SUP" && [ -S "$W/run/notify" ]
expect_rc $? "local up starts 6 daemons under a supervisor (pid ${SUP:-none}), with a notify socket: $(tail -1 "$WORK/up.out")"
for p in $(awk '{print $2}' "$W/pids"); do ALL_PIDS+=("$p"); done
grep -q "^supervisor: pid $SUP" "$WORK/up.out"
expect "local up names the supervisor and its log"
C local up --workdir "$W" >"$WORK/up2.out" 2>&1
[ $? -ne 0 ] && grep -q "already runs a cluster" "$WORK/up2.out"
expect "a second local up on the same work dir is refused"

# ---- exit 0 is not restarted: the trainer's job ends
until_ok 300 state_is trainer-0 done
[ "$(st "$W" trainer-0 last_exit)" = "exit 0" ] && [ "$(st "$W" trainer-0 restarts)" = 0 ] &&
  [ "$(events trainer-0 exit)" = 1 ] && [ "$(events trainer-0 restart)" = 0 ]
expect_rc $? "the trainer exits 0 when its job ends and stays down (state $(st "$W" trainer-0 state), last exit '$(st "$W" trainer-0 last_exit)')"
[ -n "$(st "$W" oracle-0 status)" ] && [ -n "$(st "$W" embedding-1 status)" ]
expect_rc $? "local status shows each daemon's last STATUS= (oracle: '$(st "$W" oracle-0 status | cut -c1-60)')"

# ---- kill -9 of a data processor: restarted on its port
old=$(pid_of "$W" dataproc-0); port=$(port_of "$W" dataproc-0)
kill -9 "$old"
until_ok 100 eval '[ "$(pid_of "$W" dataproc-0)" != "$old" ] && state_is dataproc-0 up'
new=$(pid_of "$W" dataproc-0)
ALL_PIDS+=("$new")
[ "$new" != "$old" ] && running "$new" && [ "$(port_of "$W" dataproc-0)" = "$port" ] &&
  [ "$(field "$W/run/dataproc-0.ready" rpc_port)" = "$port" ]
expect_rc $? "a data processor killed with SIGKILL is restarted (pid $old -> $new) on its port $port"
[ "$(st "$W" dataproc-0 restarts)" = 1 ] && [ "$(st "$W" dataproc-0 last_exit)" = "killed by signal 9 (SIGKILL)" ]
expect_rc $? "local status --json: restarts 1, last_exit '$(st "$W" dataproc-0 last_exit)'"
"$SB/chanter" local status --workdir "$W" >"$WORK/status.txt"
grep -E "^dataproc-0 +pid $new +up +127.0.0.1:$port +restarts 1 .*last exit: killed by signal 9 \(SIGKILL\)" "$WORK/status.txt" >/dev/null &&
  grep -q "^supervisor: pid $SUP" "$WORK/status.txt"
expect "local status (text): the restarted data processor's line and the supervisor"
grep -Eq "restart name=dataproc-0 old_pid=$old how=\"killed by signal 9 \(SIGKILL\)\" new_pid=$new restarts=1 after_ms=[0-9]+" \
  "$W/logs/supervisor.log" && grep -q '^<6>[0-9-]*T[0-9:.]*Z chanter-supervisor INFO: restart name=dataproc-0' "$W/logs/supervisor.log"
expect_rc $? "supervisor.log: one timestamped line for the restart ($(grep -o 'restart name=dataproc-0.*' "$W/logs/supervisor.log" | head -1))"
"$BIN/chanter" --config "$W/job.ini" dataproc batch 0 >"$WORK/batch.out" 2>&1
expect_rc $? "the restarted data processor serves at the address in job.ini: $(head -1 "$WORK/batch.out" | cut -c1-60)"

# ---- exit 3 is not restarted
echo 3 >"$WORK/force/chanter-dataproc"
old=$(pid_of "$W" dataproc-1)
kill -9 "$old"
until_ok 100 state_is dataproc-1 done
sleep 1 # five restart delays: nothing more happens
[ "$(st "$W" dataproc-1 last_exit)" = "exit 3" ] && [ "$(st "$W" dataproc-1 restarts)" = 1 ] &&
  [ "$(events dataproc-1 restart)" = 1 ] && [ "$(st "$W" dataproc-1 alive)" = False ] &&
  grep -q "exit name=dataproc-1 .*how=\"exit 3\" action=none" "$W/logs/supervisor.log"
expect_rc $? "a daemon that exits 3 stays down (restarts $(st "$W" dataproc-1 restarts), last exit '$(st "$W" dataproc-1 last_exit)')"
rm -f "$WORK/force/chanter-dataproc"

# ---- a daemon that keeps failing: given up after local.restart_burst = 2 restarts
echo 1 >"$WORK/force/chanter-embedding"
kill -9 "$(pid_of "$W" embedding-0)"
until_ok 100 state_is embedding-0 gave_up
rm -f "$WORK/force/chanter-embedding"
[ "$(st "$W" embedding-0 restarts)" = 2 ] && [ "$(st "$W" embedding-0 last_exit)" = "exit 1" ] &&
  [ "$(events embedding-0 give_up)" = 1 ] && grep -q "ERROR: give_up name=embedding-0 .*restarts=2" "$W/logs/supervisor.log"
expect_rc $? "a daemon failing on every restart is given up after 2 restarts: $(grep -o 'give_up name=embedding-0.*' "$W/logs/supervisor.log" | cut -c1-150)"
sleep 0.5
[ "$(st "$W" embedding-0 alive)" = False ] && [ "$(events embedding-0 restart)" = 2 ] &&
  running "$(pid_of "$W" embedding-1)" && running "$(pid_of "$W" oracle-0)" && running "$(pid_of "$W" dataproc-0)"
expect "it stays down; the other daemons run on"

# ---- kill -STOP: the watchdog kills it (SIGABRT) and it is restarted
old=$(pid_of "$W" embedding-1); port=$(port_of "$W" embedding-1)
kill -STOP "$old"
until_ok 100 eval '[ "$(pid_of "$W" embedding-1)" != "$old" ] && state_is embedding-1 up'
new=$(pid_of "$W" embedding-1)
ALL_PIDS+=("$new")
[ "$new" != "$old" ] && running "$new" && [ ! -e "/proc/$old" ] && [ "$(port_of "$W" embedding-1)" = "$port" ] &&
  [ "$(events embedding-1 watchdog)" = 1 ] && [ "$(events embedding-1 restart)" = 1 ] &&
  [[ "$(st "$W" embedding-1 last_exit)" == "watchdog, killed by signal 6 (SIGABRT)" ]]
expect_rc $? "a stopped daemon (SIGSTOP) is killed by the watchdog and restarted on its port (last exit '$(st "$W" embedding-1 last_exit)')"
grep -q "WARN: watchdog name=embedding-1 pid=$old: no WATCHDOG=1 for [0-9]* ms (local.watchdog_ms = 2000)" "$W/logs/supervisor.log"
expect_rc $? "supervisor.log says why ($(grep -o 'watchdog name=embedding-1.*' "$W/logs/supervisor.log" | head -1 | cut -c1-100))"

# ---- W/run/events: JSON lines, in order, each with its fields
python3 - "$W/run/events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
for e in ev:
    assert set(e) >= {"t", "event", "name", "pid", "new_pid", "how", "restarts"}, e
    assert isinstance(e["t"], float) and e["t"] > 1.5e9, e
seq = [(e["event"], e["name"]) for e in ev if e["name"] in ("dataproc-0", "embedding-1")]
assert seq == [("exit", "dataproc-0"), ("restart", "dataproc-0"), ("ready", "dataproc-0"),
               ("watchdog", "embedding-1"), ("exit", "embedding-1"), ("restart", "embedding-1"),
               ("ready", "embedding-1")], seq
r = [e for e in ev if e["event"] == "restart" and e["name"] == "dataproc-0"][0]
x = [e for e in ev if e["event"] == "exit" and e["name"] == "dataproc-0"][0]
assert r["pid"] == x["pid"] and r["new_pid"] > 0 and r["how"] == "killed by signal 9 (SIGKILL)" and r["restarts"] == 1, r
assert 0.15 <= r["t"] - x["t"] < 2, (x, r)  # local.restart_ms = 200
g = [e for e in ev if e["event"] == "give_up"]
assert [e["name"] for e in g] == ["embedding-0"] and g[0]["restarts"] == 2 and g[0]["how"] == "exit 1", g
PY
expect "W/run/events: exit, restart, ready, watchdog, give_up lines with their fields; the restart 200 ms after the kill"

# ---- local down: nothing left, no zombie
"$SB/chanter" local down --workdir "$W" >"$WORK/down.out" 2>&1
rc=$?
for p in $(awk '{print $2}' "$W/pids" 2>/dev/null); do ALL_PIDS+=("$p"); done
left=""
for p in "${ALL_PIDS[@]}"; do [ -e "/proc/$p" ] && left="$left $p($(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null))"; done
[ $rc -eq 0 ] && [ -z "$left" ] && ! running "$SUP" && [ ! -e "$W/run/supervisor.pid" ] && [ ! -e "$W/pids" ] &&
  [ -z "$(pgrep -f "$W/" 2>/dev/null)" ]
expect_rc $? "local down: every daemon stopped and reaped (no process, no zombie${left:+: left$left}), the supervisor gone: $(cat "$WORK/down.out")"
grep -q "stopped daemons=6 killed=0" "$W/logs/supervisor.log"
expect "the supervisor stopped them in order with SIGTERM, none needed SIGKILL"

# ---- a cluster whose supervisor is gone: status and down work from W/pids
C --set dataprocs=1 --set embedding_servers=1 --set iterations=1 local up --workdir "$W2" >"$WORK/up3.out" 2>&1
expect_rc $? "a second cluster comes up"
kill -9 "$(cat "$W2/run/supervisor.pid")"
sleep 0.2
"$SB/chanter" local status --workdir "$W2" >"$WORK/status2.txt" 2>&1
grep -q "^supervisor: not running" "$WORK/status2.txt" && running "$(pid_of "$W2" oracle-0)" &&
  grep -Eq "^oracle-0 +pid [0-9]+ +up " "$WORK/status2.txt"
expect "without its supervisor, local status still reads W/pids and says the supervisor is not running"
pids2=$(awk '{print $2}' "$W2/pids")
"$SB/chanter" local down --workdir "$W2" >"$WORK/down2.out" 2>&1
rc=$?
alive2=0; for p in $pids2; do running "$p" && alive2=$((alive2 + 1)); done
[ $rc -eq 0 ] && [ $alive2 -eq 0 ]
expect_rc $? "and local down stops its daemons itself: $(cat "$WORK/down2.out")"

# watched W NAME: a cluster of one trainer in W, its job long, `chanter train` watching it (stderr in
# $WORK/NAME.err, its pid in $watcher) once the trainer has reported; its supervisor then killed, so that
# nothing restarts what the caller stops
watched() {
  C --set dataprocs=1 --set embedding_servers=1 --set trainers=1 --set iterations=100000 local up --workdir "$1" \
    >"$WORK/$2.up" 2>&1 || return 1
  "$SB/chanter" --config "$1/job.ini" train --workdir "$1" --quiet >/dev/null 2>"$WORK/$2.err" &
  watcher=$!
  until_ok 100 grep -q "progress rank=0" "$1/logs/trainer-0.log" && kill -9 "$(cat "$1/run/supervisor.pid")"
}

# ---- the oracle stopped while `chanter train` watches and no trainer is attached any more (local down
# stops them all at once, and the trainers can be gone first): it still tells train the job stopped
W3=$WORK/w3
watched "$W3" train3
expect_rc $? "a third cluster comes up, its job long, watched by chanter train"
t3=$(pid_of "$W3" trainer-0)
kill -TERM "$t3"
until_ok 100 eval '! running "$t3"'
kill -TERM "$(pid_of "$W3" oracle-0)"
until_ok 100 eval '! running "$watcher"' && grep -q "the job stopped: the oracle is shutting down (SIGTERM)" "$WORK/train3.err"
expect_rc $? "the oracle stopped with no trainer attached: chanter train, which was watching, says the job stopped and returns ($(head -c 160 "$WORK/train3.err"))"
kill -9 "$watcher" 2>/dev/null
"$SB/chanter" local down --workdir "$W3" >/dev/null 2>&1

# ---- the oracle killed (no word to anyone), then the cluster taken down: a watching train does not wait
# trainer.rejoin_timeout_ms for an oracle nothing will restart
W4=$WORK/w4
watched "$W4" train4
expect_rc $? "a fourth cluster comes up, its job long, watched by chanter train"
kill -9 "$(pid_of "$W4" oracle-0)"
"$SB/chanter" local down --workdir "$W4" >/dev/null 2>&1
until_ok 100 eval '! running "$watcher"' && grep -q "and the local cluster in .* is down: nothing will restart it" "$WORK/train4.err"
expect_rc $? "the oracle killed and the cluster down: chanter train says so and returns ($(tail -c 200 "$WORK/train4.err" | tr '\n' ' '))"
kill -9 "$watcher" 2>/dev/null
grep -q "stopped cleanly" "$W4/logs/trainer-0.log" && ! grep -q "did not stop within" "$W4/logs/trainer-0.log"
expect "the trainer, SIGTERMed while its oracle is gone, gives up the oracle's calls it retries and stops cleanly"
finish
