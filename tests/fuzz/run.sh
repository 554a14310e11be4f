#!/usr/bin/env bash
# Runs every libFuzzer target of `make fuzz` (FUZZ_BUILD/bin/fuzz_*) for
# SECONDS each (-max_total_time), starting from its seeds
# tests/fuzz/corpus/<target>/; inputs it finds go to FUZZ_BUILD/corpus/
# (the tree's corpora stay small), a crash to FUZZ_BUILD/crashes/ and its
# log to FUZZ_BUILD/logs/.  Prints one line per target (executions,
# exec/s, coverage) and exits non-zero if any target crashed.
#   tests/fuzz/run.sh FUZZ_BUILD [SECONDS]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FB=${1:?usage: run.sh FUZZ_BUILD [SECONDS]}
SECS=${2:-60}
case "$FB" in /*) ;; *) FB=$ROOT/$FB ;; esac
mkdir -p "$FB/corpus" "$FB/crashes" "$FB/logs"
failed=()
for t in "$FB"/bin/fuzz_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  mkdir -p "$FB/corpus/$n"
  log=$FB/logs/$n.log
  "$t" -max_total_time="$SECS" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$FB/crashes/$n-" "$FB/corpus/$n" "$ROOT/tests/fuzz/corpus/$n" >"$log" 2>&1
  rc=$?
  runs=$(grep -Eo '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
  eps=$(grep -Eo '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    printf 'ok    %-26s %10s execs  %7s exec/s  %s\n' "$n" "${runs:-?}" "${eps:-?}" "$cov"
  else
    printf 'CRASH %-26s %10s execs  %7s exec/s  (log: %s)\n' "$n" "${runs:-?}" "${eps:-?}" "$log"
    grep -E '^==[0-9]+==ERROR|fuzz check failed|^SUMMARY|Test unit written to' "$log" | head -5 | sed 's/^/      /'
    failed+=("$n")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "fuzz: crashed: ${failed[*]}"; exit 1; fi
echo "fuzz: no crash"
