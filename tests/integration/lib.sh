# Helpers shared by the integration tests (sourced).  Each test gets a
# temporary work directory, starts real daemons on 127.0.0.1 with ports the
# kernel picks (reported through --ready-file), and stops them on exit.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${CHANTER_BUILD:-$ROOT/build}
BIN=$BUILD/bin
WORK=$(mktemp -d /tmp/chanter-it-XXXXXX)
PIDS=()
N_OK=0; N_FAIL=0

cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  if grep -qs "Sanitizer" "$WORK"/*.log; then echo "not ok - a sanitizer reported (logs in $WORK)"; grep -h -A5 "Sanitizer" "$WORK"/*.log | head -40; N_FAIL=$((N_FAIL + 1)); fi
  if [ "$N_FAIL" -eq 0 ]; then rm -rf "$WORK"; else echo "# work dir kept: $WORK"; exit 1; fi
}
trap cleanup EXIT

ok()   { echo "ok - $*"; N_OK=$((N_OK + 1)); }
# running PID: the process exists and is not a zombie (where init does not
# reap orphans, a daemon that exited stays a zombie until it does)
running() { [ -r "/proc/$1/stat" ] && ! sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | grep -q '^Z'; }
nok()  { echo "not ok - $*"; N_FAIL=$((N_FAIL + 1)); }
# skip NAME: a check this machine cannot make (said, not counted)
skip() { echo "ok - # SKIP $*"; }
# clusters_down CHANTER W...: whatever a failed check left of the local
# clusters in these work dirs: `local down`, then kill -9 of the supervisor
# and of every daemon W/pids names, and the network namespaces W/run/netns
# lists (emulated hosts)
clusters_down() {
  local c=$1 w ns
  shift
  for w in "$@"; do
    "$c" local down --workdir "$w" >/dev/null 2>&1
    [ -f "$w/run/supervisor.pid" ] && kill -9 "$(cat "$w/run/supervisor.pid")" 2>/dev/null
    [ -f "$w/pids" ] && awk '{print $2}' "$w/pids" | xargs -r kill -9 2>/dev/null
    [ -f "$w/run/netns" ] && while read -r ns; do ip netns del "$ns" 2>/dev/null; done <"$w/run/netns"
  done
  return 0
}
# need_netns NAME: emulated hosts need root and `ip netns`; without them say
# so (one skip, one passing check) and end the test here
need_netns() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then
    why="emulated hosts need root (network namespaces, veth, tc)"
  elif ! ip netns add "chanter-probe-$$" 2>"$WORK/probe.err"; then
    why="ip netns add fails here: $(head -1 "$WORK/probe.err")"
  else
    ip netns del "chanter-probe-$$"
    return 0
  fi
  skip "$why"
  ok "$1: nothing to check without root and network namespaces"
  finish
  exit $?
}
# The job file $JOB on local clusters (tests that compare whole jobs):
# field FILE KEY: a top-level key of a summary.json;
# run_job NAME [--set k=v ...]: `local up` ($UP_ARGS, e.g. --insecure) in
# $WORK/NAME, `train --quiet`, `local down`; the summary in
# $WORK/NAME/summary.json, the tail of the error said when it fails;
# same A B: runs A and B ended with the same digest and test loss.
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
run_job() {
  local name=$1; shift
  # shellcheck disable=SC2086 # UP_ARGS: words
  "$BIN/chanter" --config "$JOB" "$@" local up ${UP_ARGS:-} --workdir "$WORK/$name" >"$WORK/$name.up" 2>&1 ||
    { tail -5 "$WORK/$name.up"; return 1; }
  "$BIN/chanter" --config "$WORK/$name/job.ini" train --workdir "$WORK/$name" --quiet >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  "$BIN/chanter" local down --workdir "$WORK/$name" >/dev/null 2>&1
  [ $rc -eq 0 ] || tail -3 "$WORK/$name.err"
  return $rc
}
same() {
  [ "$(field "$WORK/$1/summary.json" digest)" = "$(field "$WORK/$2/summary.json" digest)" ] &&
    [ "$(field "$WORK/$1/summary.json" test_logloss)" = "$(field "$WORK/$2/summary.json" test_logloss)" ]
}
# check NAME CMD...: runs CMD, ok if it exits 0
check() { local n=$1; shift; if "$@"; then ok "$n"; else nok "$n"; fi; }
# expect NAME: ok if the previous command (or && chain) succeeded.  NAME
# must not contain a command substitution: bash runs it before the call and
# $? would be ITS status -- use expect_rc $? "... $(...)" for that.
expect() { if [ $? -eq 0 ]; then ok "$1"; else nok "$1"; fi; }
# expect_rc STATUS NAME: ok if STATUS is 0 ($? is expanded before NAME's
# command substitutions run)
expect_rc() { if [ "$1" -eq 0 ]; then ok "$2"; else nok "$2"; fi; }
finish() { echo "# $N_OK passed, $N_FAIL failed"; [ "$N_FAIL" -eq 0 ]; }

# json_get FILE KEY -> value of a top-level integer/string key in a one-line JSON file
json_get() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# spawn_ready TAG BINARY INDEX_FLAG INDEX LISTEN_PORT JOB [extra args...]:
# starts BINARY on 127.0.0.1:LISTEN_PORT (0 = the kernel picks) with its
# --ready-file, waits up to 20 s until ready; sets R_PID, R_PORT, R_MPORT.
# Log in $WORK/TAG-INDEX.log.
spawn_ready() {
  local tag=$1 bin=$2 flag=$3 idx=$4 port=$5 job=$6; shift 6
  local ready=$WORK/$tag-$idx.ready log=$WORK/$tag-$idx.log
  rm -f "$ready"
  "$BIN/$bin" --config "$job" "$flag" "$idx" --listen "127.0.0.1:$port" --ready-file "$ready" "$@" >>"$log" 2>&1 &
  R_PID=$!
  PIDS+=("$R_PID")
  for _ in $(seq 1 400); do
    if [ -f "$ready" ]; then
      R_PORT=$(json_get "$ready" rpc_port)
      R_MPORT=$(json_get "$ready" metrics_port)
      return 0
    fi
    kill -0 "$R_PID" 2>/dev/null || { echo "# $bin $idx exited; log:"; sed 's/^/#   /' "$log" | tail -20; return 1; }
    sleep 0.05
  done
  echo "# $bin $idx not ready after 20 s"; return 1
}

# start_embedding SHARD JOB [extra args...]: sets EMB_PID/EMB_PORT/EMB_MPORT[SHARD]
# (EMB_LISTEN_PORT: restart on a known port)
declare -A EMB_PID EMB_PORT EMB_MPORT
start_embedding() {
  local shard=$1 job=$2; shift 2
  spawn_ready emb chanter-embedding --shard "$shard" "${EMB_LISTEN_PORT:-0}" "$job" "$@" || return 1
  EMB_PID[$shard]=$R_PID; EMB_PORT[$shard]=$R_PORT; EMB_MPORT[$shard]=$R_MPORT
}

# start_dataproc INDEX JOB [extra args...]: sets DP_PID/DP_PORT/DP_MPORT[INDEX]
# (DP_LISTEN_PORT: restart on a known port)
declare -A DP_PID DP_PORT DP_MPORT
start_dataproc() {
  local idx=$1 job=$2; shift 2
  spawn_ready dp chanter-dataproc --index "$idx" "${DP_LISTEN_PORT:-0}" "$job" "$@" || return 1
  DP_PID[$idx]=$R_PID; DP_PORT[$idx]=$R_PORT; DP_MPORT[$idx]=$R_MPORT
}
