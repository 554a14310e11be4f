#!/usr/bin/env bash
# The one test runner behind `make test`: every unit test binary
# (build/tests/test_*, cmocka), then every integration test
# (tests/integration/test_*.sh), each in its own log under build/test-logs/.
# Prints a line per test and ends with "N passed, N failed".
#   tests/run.sh BUILD_DIR [unit|integration] [NAME-FILTER]
set -u
BUILD=${1:-build}
WHAT=${2:-all}
FILTER=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOGS="$ROOT/$BUILD/test-logs"
mkdir -p "$LOGS"
export CHANTER_BUILD="$ROOT/$BUILD"
passed=0; failed=0; failed_names=()

count_cmocka() { # log -> sets p f from cmocka's summary lines
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$1" | awk '{s+=$NF} END {print s+0}')
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$1" | awk '{s+=$(NF-1)} END {print s+0}')
}
count_tap() { # log -> p f from "ok - " / "not ok - " lines
  p=$(grep -c '^ok - ' "$1"); f=$(grep -c '^not ok - ' "$1")
}

run_one() { # kind name cmd...
  local kind=$1 name=$2; shift 2
  local log="$LOGS/$name.log" t0=$SECONDS rc
  "$@" >"$log" 2>&1; rc=$?
  if [ "$kind" = unit ]; then count_cmocka "$log"; else count_tap "$log"; fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or exited non-zero without a count
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -eq 0 ]; then
    printf 'PASS  %-34s %3d passed  %3ds\n' "$name" "$p" $((SECONDS - t0))
  else
    printf 'FAIL  %-34s %3d passed %3d failed  %3ds  (log: %s)\n' "$name" "$p" "$f" $((SECONDS - t0)) "$log"
    failed_names+=("$name")
    grep -E '^\[  (ERROR|FAILED) \]|^not ok|Assertion|ERROR|error:' "$log" | head -15 | sed 's/^/      /'
  fi
}

if [ "$WHAT" = all ] || [ "$WHAT" = unit ]; then
  for t in "$ROOT/$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t"); [ -n "$FILTER" ] && [[ "$n" != *"$FILTER"* ]] && continue
    run_one unit "$n" "$t"
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = integration ]; then
  for t in "$ROOT"/tests/integration/test_*.sh; do
    [ -f "$t" ] || continue
    n=$(basename "$t" .sh); [ -n "$FILTER" ] && [[ "$n" != *"$FILTER"* ]] && continue
    run_one integration "$n" bash "$t"
  done
fi
echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
