#!/usr/bin/env bash
# Integration: a full disk under one embedding server is that server's
# condition, not a lost daemon, and the job waits for it (DESIGN.md 5;
# docs/reference.md, "A full disk").  On a local cluster whose
# embedding-1 data dir is a small tmpfs, filled by a filler file before
# the job starts so that its write-backs meet "No space left on device"
# within the first iterations:
#   - the job pauses: status.json's job.paused names the server, its
#     data dir and the free space, chanter_oracle_embedding_disk_full{server="1"}
#     is 1, the server's own gauge too, and the iteration stands still;
#   - nothing is taken for lost: no recovery, no daemon restarted;
#   - once the filler is removed the job goes on by itself (the server
#     reopens its store) and ends with the digest of the same job run
#     without a full disk, bit for bit;
#   - with embedding.disk_full_timeout_s = 4 and the filler left in place
#     the job fails, and chanter train says why, naming the server and its
#     data dir.
# Mounting needs root: without it the test says so and skips.
source "$(dirname "$0")/lib.sh"

MNT=()
disk_cleanup() {
  clusters_down "$CHANTER" "$WORK/ref" "$WORK/full" "$WORK/fail"
  for m in "${MNT[@]:-}"; do [ -n "$m" ] && umount -l "$m" 2>/dev/null; done
  cleanup
}
trap disk_cleanup EXIT

JOB=$WORK/job.ini
# the cache strategy writes rows back every iteration; a checkpoint at 40 flushes the caches
job_preamble "$JOB" table_strategy=cache iterations=120 eval_every=40 checkpoint_every=40 checkpoint_seconds=0

# small_disk NAME: W=$WORK/NAME with its embedding-1 data dir on a 32 MiB
# tmpfs holding a filler that leaves 2 MiB (the servers start; the job's
# write-backs fill it); 1 when mounting is not permitted
small_disk() {
  local d=$WORK/$1/embedding-1
  mkdir -p "$d"
  mount -t tmpfs -o size=32m tmpfs "$d" 2>"$WORK/mount.err" || return 1
  MNT+=("$d")
  dd if=/dev/zero of="$d/filler" bs=1M count=30 status=none
}
if [ "$(id -u)" -ne 0 ] || ! small_disk probe; then
  skip "mounting a tmpfs needs root: $(head -1 "$WORK/mount.err" 2>/dev/null)"
  ok "a full disk: nothing to check without root"
  finish
  exit $?
fi
umount "$WORK/probe/embedding-1"

# ---- the reference: the same job, no full disk
run_job ref; expect "the job without a full disk completes (the reference)"
REF=$(field "$WORK/ref/summary.json" digest)

# ---- the job on a full disk: it pauses, then goes on once space is freed
small_disk full
job_up full; expect "a cluster whose embedding server 1 has 2 MiB free starts"
CW full train --workdir "$WORK/full" >"$WORK/full.out" 2>"$WORK/full.err" &
TRAIN=$!
MPORT=$(field "$WORK/full/run/oracle-0.ready" metrics_port)
status() { python3 - "$MPORT" "$1" <<'PY'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen("http://127.0.0.1:%s/status.json" % sys.argv[1], timeout=5))
print(eval(sys.argv[2]))
PY
}
paused() { [ -n "$(status "d['job']['paused']" 2>/dev/null)" ]; }
# no_restart NAME: the supervisor of $WORK/NAME restarted nothing (its events file
# has a line per exit and restart; none is written while nothing happened)
no_restart() { [ ! -e "$WORK/$1/run/events" ] || ! grep -q '"event": *"restart"' "$WORK/$1/run/events"; }
until_ok 300 paused; expect "the job pauses within 30 s: status.json's job.paused says why"
P=$(status "d['job']['paused']")
echo "# paused: $P"
case "$P" in *"embedding server 1 "*"$WORK/full/embedding-1"*"MiB free"*) true ;; *) false ;; esac
expect "  it names embedding server 1, its data dir and the free space"
[ "$(status "d['job']['state']")" = training ]; expect "  the job's state stays training (paused, not failed or recovering)"
IT1=$(status "d['job']['iteration']")
sleep 4
IT2=$(status "d['job']['iteration']")
[ "$IT1" = "$IT2" ] && [ "$IT2" -lt 120 ]; expect_rc $? "  the iteration stands still while the disk is full (at $IT2)"
metric() { python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
metric "http://127.0.0.1:$MPORT/metrics" | grep -q '^chanter_oracle_embedding_disk_full{server="1"} 1'
expect "  chanter_oracle_embedding_disk_full{server=\"1\"} is 1"
EPORT=$(field "$WORK/full/run/embedding-1.ready" metrics_port)
metric "http://127.0.0.1:$EPORT/metrics" | grep -q '^chanter_embedding_disk_full{shard="1"} 1'
expect "  the server's chanter_embedding_disk_full is 1"
grep -q "the job is paused: embedding server 1 " "$WORK/full/logs/oracle-0.log"; expect "  the oracle's log says the job is paused"
T0=$(date +%s.%N)
rm -f "$WORK/full/embedding-1/filler"
wait $TRAIN; rc=$?
T1=$(date +%s.%N)
expect_rc $rc "once the filler is removed the job goes on by itself and completes"
echo "# the job ended $(python3 -c "print('%.1f' % ($T1 - $T0))") s after the filler was removed"
[ "$(field "$WORK/full/summary.json" digest)" = "$REF" ]
expect "  with the reference's digest, bit for bit (${REF:0:16}...)"
[ "$(jf "$WORK/full/summary.json" "len(d['recoveries'])")" = 0 ] && no_restart full &&
  ! grep -q "recovery 1 started" "$WORK/full/logs/oracle-0.log"
expect "  no recovery, no daemon restarted"
grep -q "embedding store reopened after a full disk" "$WORK/full/logs/embedding-1.log" &&
  grep -q "the job goes on: embedding server 1" "$WORK/full/logs/oracle-0.log"
expect "  the server reopened its store, the oracle logged that the job goes on"
grep -q "^paused at iteration .*embedding server 1 .*$WORK/full/embedding-1" "$WORK/full.err"
expect "  chanter train's progress line said it was paused and why"
job_down full

# ---- the disk stays full: after embedding.disk_full_timeout_s the job fails, saying why
small_disk fail
job_up fail --set embedding.disk_full_timeout_s=4; expect "a second cluster on a full disk starts"
CW fail train --workdir "$WORK/fail" --quiet >"$WORK/fail.out" 2>"$WORK/fail.err"; rc=$?
[ $rc -ne 0 ]; expect_rc $? "with embedding.disk_full_timeout_s = 4 and the filler in place the job fails"
sed 's/^/#   /' "$WORK/fail.err" | tail -2
grep -q "the job failed: embedding server 1 .*$WORK/fail/embedding-1.*embedding.disk_full_timeout_s = 4" "$WORK/fail.err"
expect "  chanter train says why: embedding server 1, its data dir, the timeout"
no_restart fail && ! grep -q "recovery 1 started" "$WORK/fail/logs/oracle-0.log"
expect "  no recovery started, no daemon restarted"
job_down fail

finish
