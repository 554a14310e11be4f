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
nok()  { echo "not ok - $*"; N_FAIL=$((N_FAIL + 1)); }
# check NAME CMD...: runs CMD, ok if it exits 0
check() { local n=$1; shift; if "$@"; then ok "$n"; else nok "$n"; fi; }
# expect NAME: ok if the previous command (or && chain) succeeded
expect() { if [ $? -eq 0 ]; then ok "$1"; else nok "$1"; fi; }
finish() { echo "# $N_OK passed, $N_FAIL failed"; [ "$N_FAIL" -eq 0 ]; }

# json_get FILE KEY -> value of a top-level integer/string key in a one-line JSON file
json_get() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# start_embedding SHARD JOB [extra args...]: starts shard SHARD, waits until
# ready, sets EMB_PID[SHARD] and EMB_PORT[SHARD]; log in $WORK/emb-SHARD.log
declare -A EMB_PID EMB_PORT EMB_MPORT
start_embedding() {
  local shard=$1 job=$2; shift 2
  local ready=$WORK/emb-$shard.ready
  rm -f "$ready"
  "$BIN/chanter-embedding" --config "$job" --shard "$shard" --listen 127.0.0.1:${EMB_LISTEN_PORT:-0} \
      --ready-file "$ready" "$@" >>"$WORK/emb-$shard.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 200); do
    if [ -f "$ready" ]; then
      EMB_PID[$shard]=$pid
      EMB_PORT[$shard]=$(json_get "$ready" rpc_port)
      EMB_MPORT[$shard]=$(json_get "$ready" metrics_port)
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "# chanter-embedding shard $shard exited; log:"; sed 's/^/#   /' "$WORK/emb-$shard.log" | tail -20; return 1; }
    sleep 0.05
  done
  echo "# chanter-embedding shard $shard not ready after 10 s"; return 1
}

# start_dataproc INDEX JOB [extra args...]: like start_embedding, for data
# processors; sets DP_PID[INDEX], DP_PORT[INDEX], DP_MPORT[INDEX].
declare -A DP_PID DP_PORT DP_MPORT
start_dataproc() {
  local idx=$1 job=$2; shift 2
  local ready=$WORK/dp-$idx.ready
  rm -f "$ready"
  "$BIN/chanter-dataproc" --config "$job" --index "$idx" --listen 127.0.0.1:${DP_LISTEN_PORT:-0} \
      --ready-file "$ready" "$@" >>"$WORK/dp-$idx.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 400); do
    if [ -f "$ready" ]; then
      DP_PID[$idx]=$pid
      DP_PORT[$idx]=$(json_get "$ready" rpc_port)
      DP_MPORT[$idx]=$(json_get "$ready" metrics_port)
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "# chanter-dataproc $idx exited; log:"; sed 's/^/#   /' "$WORK/dp-$idx.log" | tail -20; return 1; }
    sleep 0.05
  done
  echo "# chanter-dataproc $idx not ready after 20 s"; return 1
}
