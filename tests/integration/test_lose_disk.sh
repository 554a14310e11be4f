#!/usr/bin/env bash
# Integration: checkpoints that survive a lost disk (checkpoint.backup_dir),
# on a real local cluster under `chanter local`'s supervisor.
#
#   - every sealed checkpoint is backed up on each server (RocksDB
#     BackupEngine, incremental: a later backup copies fewer bytes than it
#     holds) and `chanter checkpoints` says so; old backups go with the
#     checkpoints the oracle prunes;
#   - `chanter drill lose-disk`: an embedding server is killed with its
#     data dir deleted; the supervisor restarts it on the empty dir, it
#     restores its checkpoints from the backup dir, says so, and the oracle
#     rolls the job back to the newest checkpoint complete on every server:
#     the job ends with the digest of the job that never failed;
#   - the same with embedding.sync_writes = true, where a plain restart
#     rolls nothing back: a lost disk still does.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" table_strategy=cache iterations=160 eval_every=80 checkpoint_every=20 checkpoint_seconds=0 \
  checkpoint_keep=3 oracle.heartbeat_timeout_ms=2000 "checkpoint.backup_dir=$WORK/backup"
drill() { # dir [args]: the drill's JSON in dir.json, its stderr in dir.err; rc of the drill
  local d=$1; shift
  C "$@" --workdir "$WORK/$d" --json >"$WORK/$d.json" 2>"$WORK/$d.err"
}

# ---- backups of a job's checkpoints, listed
run_job() { job_up "$1" && job_train "$1"; }
run_job plain; rc=$?
expect_rc $rc "a job with checkpoint.backup_dir completes"
CW plain checkpoints --workdir "$WORK/plain" --json >"$WORK/plain.cps" 2>&1
[ "$(jf "$WORK/plain.cps" "len(d['checkpoints']) == 3 and all(c['backed_up'] and c['backed_up_servers'] == 2 for c in d['checkpoints'])")" = True ]
expect "chanter checkpoints: the 3 kept checkpoints are backed up on both servers"
job_down plain
ls "$WORK/backup/embedding-0/"*.checkpoint "$WORK/backup/embedding-1/"*.checkpoint 2>/dev/null | wc -l | grep -qx 6
expect "the backup dir holds one sidecar per kept checkpoint and server (embedding-%i by default): the pruned ones went"
grep -a "checkpoint backed up" "$WORK/plain/logs/embedding-0.log" | tail -1 | sed 's/.*INFO: /# /'
python3 - "$WORK/plain/logs/embedding-0.log" <<'PY'
import re, sys
rows = [dict(re.findall(r"(\w+)=(\S+)", l)) for l in open(sys.argv[1], errors="replace") if "checkpoint backed up" in l]
later = rows[1:]
sys.exit(0 if len(rows) >= 8 and later and all(int(r["bytes_copied"]) < int(r["bytes"]) for r in later) else 1)
PY
expect "every backup after the first is incremental: it copies fewer bytes than it holds"

# ---- lose-disk: restored from the backups, rolled back, same digest as the reference
drill lose drill lose-disk --rank 1 --at 70; rc=$?
REF=$(jf "$WORK/lose.json" "d['reference']")
expect_rc $rc "drill lose-disk of server 1 at iteration 70: the job completes with the reference digest (${REF:0:16}...)"
[ "$(jf "$WORK/lose.json" "d['kills'][0]['recovery'] == 'embedding' and 'lost disk' in d['kills'][0]['why'] and d['kills'][0]['rollback_to'] >= 19")" = True ]
expect "  the oracle rolled the job back to a checkpoint, for the server's lost disk"
L=$WORK/lose/drill/logs
grep -aq "checkpoint restored from backup id=" "$L/embedding-1.log" && grep -aq "started on a lost disk" "$L/embedding-1.log" &&
  grep -aq "the lost disk is behind this server" "$L/embedding-1.log"
expect "  the server logged the checkpoints it restored, its lost disk, and the rollback that ended it"
grep -aq "recovery 1 started: embedding-1 lost (embedding server 1 started on a lost disk .* restored checkpoint " "$L/oracle-0.log"
expect "  the oracle's log names the server and the checkpoint it restored"

# ---- lose-disk with durable writes: still a rollback (a plain restart would have none)
drill lose_sync --set embedding.sync_writes=true drill lose-disk --rank 0 --at 70 --reference "$REF"; rc=$?
expect_rc $rc "drill lose-disk of server 0 with embedding.sync_writes = true: same digest"
[ "$(jf "$WORK/lose_sync.json" "d['recoveries'] >= 1 and d['kills'][0]['recovery'] == 'embedding'")" = True ] &&
  ! grep -aq "no rollback" "$WORK/lose_sync/drill/logs/oracle-0.log"
expect "  the job rolled back although writes are durable: the disk that held them is gone"
finish
