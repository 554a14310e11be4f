#!/usr/bin/env bash
# Integration: partition and heal on emulated hosts (`chanter local up
# --hosts auto --link 200mbit,0`, tools/chanter/hosts.c).  Needs root and
# `ip netns`; skipped (said, with one passing check) without them.
#
# A job of 300 iterations (1 data processor, 2 embedding servers, 2
# trainers on 5 hosts) three times, each on a cluster of its own:
#   - the reference: no cut; its digest and its train_seconds;
#   - a short cut: once trainer 1 has checkpointed iteration 99, its host's
#     bridge port (vh<k> in ch<tag>-br) goes down for 3 s, well below
#     oracle.heartbeat_timeout_ms (10000, set explicitly) and the trainer's
#     own heartbeat limit (3 failed heartbeats over >= 2.5 s: ~6 s): the
#     job pauses (trainer 0's iterations 100..199 take at least the cut
#     longer than the reference's), records no recovery, restarts
#     nothing, ends with the reference digest;
#   - a long cut: 6 s with oracle.heartbeat_timeout_ms = 3000 (and
#     rpc.timeout_ms = 10000, so that a call stuck on the cut link gives up
#     within the test's time): the oracle takes trainer 1 for lost (a
#     recovery "hang"/"trainer" of trainer-1 in summary.json), the job
#     rolls back and still ends with the reference digest.
# After the heal the link is as before (tbf still on vh<k>); `local down`
# leaves none of the clusters' namespaces.
source "$(dirname "$0")/lib.sh"

need_netns test_partition

SHORT=3 # s: the short cut
LONG=6  # s: the long cut (oracle.heartbeat_timeout_ms = 3000 for it)
TRAIN_LIMIT=100 # s: a job that has not ended by then is killed (and fails its checks)

WS=("$WORK/ref" "$WORK/short" "$WORK/long")
TAGS=()
down_all() { clusters_down "$BIN/chanter" "${WS[@]}"; cleanup; }
trap down_all EXIT

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=300 eval_every=300 cache_rows=200000 checkpoint_every=50 checkpoint_seconds=0
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }
tails() { # W: the logs that say what happened, for a failure
  local w=$1
  echo "# ---- $w: chanter train"; tail -5 "$w.train" 2>/dev/null | sed 's/^/#   /'
  for f in oracle-0 trainer-0 trainer-1 supervisor; do
    echo "# ---- $w/logs/$f.log"; tail -12 "$w/logs/$f.log" 2>/dev/null | cut -c1-260 | sed 's/^/#   /'
  done
}

# up W [--set ...]: a cluster on emulated hosts; sets TAG, BRNS, HOST (trainer 1's host k), VH
up() {
  local w=$1; shift
  C "$@" local up --workdir "$w" --hosts auto --link 200mbit,0 >"$w.up" 2>&1 || return 1
  local ops
  ops=$(cat "$w/run/netns-ops" 2>/dev/null) || return 1
  TAG=${ops%-ops}
  TAGS+=("$TAG")
  BRNS=$TAG-br
  HOST=$(awk '$1 == "trainer-1" {print $2}' "$w/run/hosts")
  VH=vh$HOST
  [ -n "$TAG" ] && [ -n "$HOST" ] && ip -n "$BRNS" link show "$VH" >/dev/null 2>&1
}

# train_cut W SECONDS: `chanter train` in the background; once trainer 1
# has checkpointed iteration 99 its host is cut off for SECONDS (0: never
# cut), then healed; waits for the job.  Sets TRAIN_RC, WALL (s), CUT_AT
# (s after the start), MIDJOB (1: the job was still running at the heal).
train_cut() {
  local w=$1 secs=$2 t0 tp
  t0=$(now)
  "$BIN/chanter" train --workdir "$w" --quiet >"$w.train" 2>&1 &
  tp=$!
  CUT_AT=- MIDJOB=0
  if [ "$secs" != 0 ]; then
    for _ in $(seq 1 600); do
      grep -qs "checkpoint part done rank=1 .*iteration=99 " "$w/logs/trainer-1.log" && break
      running "$tp" || break
      sleep 0.05
    done
    CUT_AT=$(since "$t0")
    ip -n "$BRNS" link set "$VH" down
    sleep "$secs"
    ip -n "$BRNS" link set "$VH" up
    running "$tp" && MIDJOB=1
  fi
  for _ in $(seq 1 $((TRAIN_LIMIT * 10))); do running "$tp" || break; sleep 0.1; done
  running "$tp" && { echo "# chanter train still running after $TRAIN_LIMIT s: killed"; kill -9 "$tp"; }
  wait "$tp"
  TRAIN_RC=$?
  WALL=$(since "$t0")
}
# span W: seconds between trainer 0's progress lines of iterations 99 and 199 (the cut falls between them)
span() {
  python3 - "$1/logs/trainer-0.log" <<'PY' 2>/dev/null
import re, sys, datetime
t = {}
for line in open(sys.argv[1]):
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .* progress rank=0 iteration=(99|199) ", line)
    if m: t[m.group(2)] = datetime.datetime.fromisoformat(m.group(1))
print("%.2f" % (t["199"] - t["99"]).total_seconds())
PY
}
restarts() { grep -c '"event": *"restart"' "$1/run/events" 2>/dev/null; }

# ---- the reference: the same job, no cut
W=$WORK/ref
up "$W" --set oracle.heartbeat_timeout_ms=10000
expect_rc $? "local up --hosts auto (the reference): 5 hosts, trainer 1 on host $HOST ($TAG)"
train_cut "$W" 0
REF=$(jf "$W/summary.json" "d['digest']")
REF_S=$(jf "$W/summary.json" "d['train_seconds']")
[ "$TRAIN_RC" -eq 0 ] && [ -n "$REF" ] && [ "$(jf "$W/summary.json" "len(d['recoveries'])")" = 0 ]
expect_rc $? "the reference job (no cut): ${REF:0:16}... in ${REF_S:-?} s of training (${WALL} s wall)"
[ -n "$REF" ] || tails "$W"
"$BIN/chanter" local down --workdir "$W" >/dev/null 2>&1

# ---- a short cut: the job pauses, nothing recovers
W=$WORK/short
up "$W" --set oracle.heartbeat_timeout_ms=10000
expect_rc $? "local up for the short cut: trainer 1 on host $HOST, its bridge port $BRNS/$VH"
train_cut "$W" "$SHORT"
D=$(jf "$W/summary.json" "d['digest']")
S=$(jf "$W/summary.json" "d['train_seconds']")
NREC=$(jf "$W/summary.json" "len(d['recoveries'])")
[ "$TRAIN_RC" -eq 0 ] && [ "$MIDJOB" = 1 ] && [ -n "$REF" ] && [ "$D" = "$REF" ]
ok_short=$?
expect_rc $ok_short "trainer 1's host cut off for $SHORT s at +$CUT_AT s (mid-job) and healed: the reference digest (${D:-none} vs ${REF:-none})"
[ "$NREC" = 0 ] && [ "$(restarts "$W")" = 0 ]
expect_rc $? "  no recovery recorded (summary.json recoveries: ${NREC:-?}), no daemon restarted ($(restarts "$W") restarts)"
P=$(span "$W") P0=$(span "$WORK/ref")
[ -n "$P" ] && [ -n "$P0" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) - float(sys.argv[2]) >= float(sys.argv[3]) - 0.2 else 1)" "$P" "$P0" "$SHORT"
expect_rc $? "  the job paused: iterations 100..199 (the cut's) took ${P:-?} s vs ${P0:-?} s without it; the whole job ${S:-?} s vs ${REF_S:-?} s of training"
grep -q "heartbeat failed rank=1" "$W/logs/trainer-1.log" && grep -q "heartbeat answered again rank=1" "$W/logs/trainer-1.log"
expect "  trainer 1 felt the cut (a heartbeat failed) and the heal (answered again)"
tc -n "$BRNS" qdisc show dev "$VH" | grep -q "tbf .*rate 200Mbit" && ip -n "$BRNS" link show "$VH" | grep -q "state UP"
expect_rc $? "  after the heal $VH is up and still shaped: $(tc -n "$BRNS" qdisc show dev "$VH" | head -1 | cut -c1-60)"
[ "$ok_short" -eq 0 ] && [ "$NREC" = 0 ] || tails "$W"
"$BIN/chanter" local down --workdir "$W" >/dev/null 2>&1

# ---- a long cut: past the heartbeat timeout, the failover path
W=$WORK/long
up "$W" --set oracle.heartbeat_timeout_ms=3000 --set rpc.timeout_ms=10000
expect_rc $? "local up for the long cut (oracle.heartbeat_timeout_ms = 3000, rpc.timeout_ms = 10000): trainer 1 on host $HOST"
train_cut "$W" "$LONG"
D=$(jf "$W/summary.json" "d['digest']")
[ "$TRAIN_RC" -eq 0 ] && [ "$MIDJOB" = 1 ] && [ -n "$REF" ] && [ "$D" = "$REF" ]
ok_long=$?
expect_rc $ok_long "trainer 1's host cut off for $LONG s at +$CUT_AT s and healed: the job ends in $WALL s with the reference digest (${D:-none})"
KINDS=$(jf "$W/summary.json" "' '.join('%s:%s' % (r['kind'], r['who']) for r in d['recoveries'])")
case "${KINDS%% *}" in hang:trainer-1 | trainer:trainer-1) true ;; *) false ;; esac
expect_rc $? "  the failover path ran: recoveries ${KINDS:-none} (the first: trainer 1 silent past the heartbeat timeout, or its stream lost)"
echo "# long cut: $(jf "$W/summary.json" "'; '.join('%s %s: %s, rolled back to %d, resumed +%.1f s' % (r['kind'], r['who'], r['why'][:70], r['rollback_to'], r['resumed_s']) for r in d['recoveries'])")"
echo "# long cut: $(restarts "$W") restart(s) by the supervisor (0: trainer 1 rejoined as the same process)"
[ "$ok_long" -eq 0 ] && [ -n "$KINDS" ] || tails "$W"
"$BIN/chanter" local down --workdir "$W" >/dev/null 2>&1

# ---- nothing left
left=""
for t in "${TAGS[@]}"; do left="$left$(ip netns list | awk -v t="$t-" 'index($1, t) == 1 {printf " %s", $1}')"; done
[ "${#TAGS[@]}" -eq 3 ] && [ -z "$left" ]
expect_rc $? "local down left none of the 3 clusters' namespaces (left:${left:- none})"

finish
