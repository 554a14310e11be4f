#!/usr/bin/env bash
# Integration: the end-of-job write-back of the partitioned rows overlapped
# with the last iterations (services/trainer/trainer_partition_retire.c:
# once the feeder has read the last Step, a writer thread writes each row
# back as soon as its last use is trained; the last flush writes the rest).
# 60 iterations, evaluations every 20 (their flushes between the writer's
# hand-overs).  The digest hashes every stored row, so a changed row the
# writer skipped, or wrote before its last update, changes it:
#   - one trainer, every table partitioned, lookahead = auto (L = 64 > 60:
#     the last Step is read at the start, the writer runs from iteration 0
#     on) and lookahead = 0 (the last Step read a dispatch window before the
#     end): the bits of the same trainer with every table cached, where no
#     writer exists -- a reference independent of it; the trainer logs rows
#     written during the last iterations, and fewer at the end;
#   - two trainers, partitioned: lookahead = auto, and with checkpoints every
#     7 iterations (their flushes too), the bits of lookahead = 0;
#   - partition_rows (rows spread over both trainers: local indices),
#     lookahead = 16 (the writer from about iteration 43): the bits of L = 0.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" eval_every=20 table_strategy=partition
UP_ARGS=--insecure

# retired NAME RANK: the rows trainer RANK wrote during the last iterations (0: none said)
retired() {
  local n
  n=$(sed -n 's/.*rank '"$2"' wrote back \([0-9]*\) rows during the last iterations.*/\1/p' \
    "$WORK/$1/logs/trainer-$2.log" | tail -1)
  echo "${n:-0}"
}
# at_end NAME RANK: the rows trainer RANK wrote at the end (-1: not said)
at_end() {
  local n
  n=$(sed -n 's/.*rank '"$2"' wrote back \([0-9]*\) rows at the end.*/\1/p' "$WORK/$1/logs/trainer-$2.log" | tail -1)
  echo "${n:--1}"
}

run_job c1 --set trainers=1 --set table_strategy=cache && run_job p1 --set trainers=1 --set lookahead=auto &&
  run_job p1z --set trainers=1 --set lookahead=0 && same c1 p1 && same c1 p1z
rc=$?
r=$(retired p1 0) e=$(at_end p1 0)
if [ $rc -eq 0 ] && [ "$r" -gt 0 ] && [ "$e" -ge 0 ] && [ "$e" -lt "$r" ]; then
  ok "one trainer, partitioned, lookahead = auto and 0: the bits of every table cached ($r rows written during the last iterations, $e at the end)"
else
  nok "one trainer, partitioned: not the cached bits, or the writer did not run (rc $rc, retired $r, at the end $e)"
fi

run_job ref --set lookahead=0 && run_job auto --set lookahead=auto && same ref auto &&
  [ "$(retired auto 0)" -gt 0 ] && [ "$(retired auto 1)" -gt 0 ]
expect_rc $? "two trainers, partitioned: lookahead = auto (rows written during the last iterations on both) gives the bits of L = 0"

run_job ckpt --set lookahead=auto --set checkpoint_every=7 --set checkpoint_seconds=0 && same ref ckpt &&
  [ "$(field "$WORK/ckpt/summary.json" checkpoints)" -ge 8 ] && [ "$(retired ckpt 0)" -gt 0 ]
expect_rc $? "two trainers, lookahead = auto with checkpoints every 7 iterations: the bits of L = 0"

run_job rows0 --set lookahead=0 --set table_strategy=partition_rows &&
  run_job rows16 --set lookahead=16 --set table_strategy=partition_rows && same rows0 rows16 &&
  [ "$(retired rows16 1)" -gt 0 ]
expect_rc $? "partition_rows: lookahead = 16 (rows written during the last iterations) gives the bits of L = 0"
finish
