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
# The chanter CLI: $CHANTER (a test may point it at a copy of the bin dir).
CHANTER=$BIN/chanter
# C ARGS...: the CLI on the test's job file $JOB (when the test has one),
# with the words of the array C_ARGS (e.g. a --set every call takes) first
C_ARGS=()
C() { "$CHANTER" ${JOB:+--config "$JOB"} "${C_ARGS[@]}" "$@"; }
# CW NAME ARGS...: the CLI on the job file `local up` wrote in $WORK/NAME
CW() { local name=$1; shift; "$CHANTER" --config "$WORK/$name/job.ini" "$@"; }
# field FILE KEY...: the value at that path in the JSON of FILE ("-": stdin;
# a list takes an index); no output, and a failure, where there is none
field() {
  python3 -c 'import json,sys
d = json.load(sys.stdin if sys.argv[1] == "-" else open(sys.argv[1]))
for k in sys.argv[2:]: d = d[int(k)] if isinstance(d, list) else d[k]
print(d)' "$@"
}
# jf FILE EXPR: a Python expression of d, the JSON of FILE (nothing where it fails)
jf() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2" 2>/dev/null; }

# job_preamble FILE [--daemons] [KEY=VALUE | SECTION.KEY=VALUE | -KEY | -SECTION.KEY ...]:
# writes a job file to FILE: that of a small job on a local cluster, or
# with --daemons the [embedding] section of servers a test starts itself
# (start_embedding: a data dir per shard under $WORK, small caches,
# metrics_port_offset = 0, a 2 s drain) -- the lines below -- with these
# changes: a key set (added where it is not below), or removed (-KEY:
# chanter's default then holds); a section left empty is not written.  Keys
# as --set names them.
job_preamble() {
  python3 - "$WORK" "$@" <<'PY'
import sys
work, path, changes = sys.argv[1], sys.argv[2], sys.argv[3:]
if changes[:1] == ["--daemons"]:
    changes = changes[1:]
    job = {"": {},
           "embedding": {"data_dir": work + "/data-%i", "hot_mb": "16", "block_cache_mb": "8",
                         "metrics_port_offset": "0", "drain_ms": "2000"}}
else:
    job = {"": {"iterations": "60", "batch_size": "256", "learning_rate": "0.1", "eval_batches": "2",
                "eval_every": "20", "trainers": "2", "embedding_servers": "2", "dataprocs": "1"},
           "synthetic": {"samples": "100000"},
           "model": {"bottom_mlp": "32", "top_mlp": "32"},
           "embedding": {"hot_mb": "32", "sync_writes": "false"}}
for change in changes:
    if change.startswith("-"):
        section, _, key = change[1:].rpartition(".")
        del job[section][key]
    else:
        name, _, value = change.partition("=")
        section, _, key = name.rpartition(".")
        job.setdefault(section, {})[key] = value
with open(path, "w") as f:
    for section, keys in job.items():
        if section and not keys:
            continue
        if section:
            f.write("[%s]\n" % section)
        for key, value in keys.items():
            f.write("%s = %s\n" % (key, value))
PY
}

# The job file $JOB on local clusters, each in $WORK/NAME:
# job_up NAME [--set k=v ...]: `local up` ($UP_ARGS, e.g. --insecure); its
# output in $WORK/NAME.up (the tail said when it fails), a copy of its pids
# file in $WORK/NAME.pids (for none_alive after the cluster is gone);
# job_train NAME [ARGS...]: `chanter train` on it ($TRAIN_ARGS, by default
# --quiet, then ARGS), stdout in $WORK/NAME.out, stderr in $WORK/NAME.err;
# job_down NAME: `local down`;
# run_job NAME [--set k=v ...]: up, train, down: the train's status (99: the
# cluster did not come up), the tail of its errors said when it fails; the
# summary in $WORK/NAME/summary.json.
job_up() {
  local name=$1; shift
  # shellcheck disable=SC2086 # UP_ARGS: words
  C "$@" local up ${UP_ARGS:-} --workdir "$WORK/$name" >"$WORK/$name.up" 2>&1 ||
    { sed 's/^/#   /' "$WORK/$name.up" | tail -5; return 1; }
  cp "$WORK/$name/pids" "$WORK/$name.pids"
}
job_train() {
  local name=$1; shift
  # shellcheck disable=SC2086 # TRAIN_ARGS: words
  CW "$name" train --workdir "$WORK/$name" ${TRAIN_ARGS---quiet} "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
}
job_down() { "$CHANTER" local down --workdir "$WORK/$1" >/dev/null 2>&1; }
# resume_legs NAME TRAINERS:ITERATIONS ...: a scaled job's reference, the job
# stopped and resumed: each leg a cluster up with that many trainers and
# iterations (empty: the job's), trained (from the start, then --resume) and
# down; stops at a failed leg: its status, the tail of its errors said.
resume_legs() {
  local name=$1 rc=0 first=1 leg; shift
  for leg in "$@"; do
    local p=${leg%%:*} it=${leg#*:}
    if [ $first = 1 ]; then job_up "$name" --set trainers="$p" ${it:+--set iterations=$it} && job_train "$name"
    else job_up "$name" --set trainers="$p" ${it:+--set iterations=$it} && job_train "$name" --resume; fi
    rc=$?
    job_down "$name"
    first=0
    [ $rc -eq 0 ] || break
  done
  [ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/$name.err" | tail -3
  return $rc
}
run_job() {
  local name=$1 rc; shift
  job_up "$name" "$@" || return 99
  job_train "$name"; rc=$?
  job_down "$name"
  [ $rc -eq 0 ] || sed 's/^/#   /' "$WORK/$name.err" | tail -3
  return $rc
}
# job_stderr NAME [--set k=v ...]: up, train (--quiet) and down of a job
# meant to fail: prints what up and train wrote on stderr; the train's status
job_stderr() {
  local name=$1 rc; shift
  # shellcheck disable=SC2086,SC2069 # UP_ARGS: words; stderr to the caller, stdout dropped
  C "$@" local up ${UP_ARGS:-} --workdir "$WORK/$name" 2>&1 >/dev/null
  # shellcheck disable=SC2069 # the same
  CW "$name" train --workdir "$WORK/$name" --quiet 2>&1 >/dev/null; rc=$?
  job_down "$name"
  return $rc
}
# same A B: runs A and B ended with the same digest and test loss
same() {
  [ "$(field "$WORK/$1/summary.json" digest)" = "$(field "$WORK/$2/summary.json" digest)" ] &&
    [ "$(field "$WORK/$1/summary.json" test_logloss)" = "$(field "$WORK/$2/summary.json" test_logloss)" ]
}
# train_local [--set k=v ...]: `chanter train --local` of $JOB, its JSON on stdout
train_local() { C --json "$@" train --local --quiet; }
# none_alive PIDS: no daemon of that pids file (name pid port lines) runs
none_alive() { for p in $(awk '{print $2}' "$1"); do running "$p" && return 1; done; return 0; }
# pid_of W NAME, port_of W NAME: the daemon NAME's pid and port in W/pids
pid_of() { awk -v n="$2" '$1 == n {print $2}' "$1/pids"; }
port_of() { awk -v n="$2" '$1 == n {print $3}' "$1/pids"; }
# st W NAME FIELD: a field of NAME in `local status --json`
st() {
  "$CHANTER" local status --workdir "$1" --json 2>/dev/null |
    python3 -c "import json,sys; d={x['name']: x for x in json.load(sys.stdin)['daemons']}; print(d[sys.argv[1]][sys.argv[2]])" "$2" "$3" 2>/dev/null
}
# until_ok N CMD...: CMD succeeds within N tenths of a second
until_ok() { local n=$1; shift; for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done; "$@"; }
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
      R_PORT=$(field "$ready" rpc_port)
      R_MPORT=$(field "$ready" metrics_port)
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
