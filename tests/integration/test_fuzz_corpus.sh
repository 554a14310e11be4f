#!/usr/bin/env bash
# The fuzz targets' seed corpora replayed once (tests/fuzz/: `make fuzz`
# runs them for real): builds the libFuzzer targets with clang into
# BUILD/fuzz (`make fuzz-targets`; cached, so a second run only links what
# changed) and runs each over tests/fuzz/corpus/<target>/ with -runs=0,
# which executes every input once.  Fails on a crash or a sanitizer report,
# and when clang is missing.
. "$(dirname "$0")/lib.sh"

if ! command -v clang >/dev/null; then
  nok "clang is not installed: the fuzz targets need it; 'make deps' (tools/install-deps.sh) installs it"
  finish; exit 1
fi
if make -C "$ROOT" -s BUILD="$BUILD" fuzz-targets >"$WORK/build.log" 2>&1; then
  ok "fuzz targets build (clang, -fsanitize=fuzzer,address)"
else
  nok "fuzz targets build (log: $WORK/build.log)"; tail -20 "$WORK/build.log" | sed 's/^/#   /'
  finish; exit 1
fi
n=0
for src in "$ROOT"/tests/fuzz/fuzz_*.c; do
  t=$(basename "$src" .c)
  bin=$BUILD/fuzz/bin/$t corpus=$ROOT/tests/fuzz/corpus/$t
  n=$((n + 1))
  if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then nok "$t has a seed corpus ($corpus)"; continue; fi
  seeds=$(ls "$corpus" | wc -l)
  if "$bin" -runs=0 -timeout=10 -artifact_prefix="$WORK/$t-" "$corpus" >"$WORK/$t.out" 2>&1; then
    ok "$t replays its $seeds seeds"
  else
    nok "$t replays its $seeds seeds (crash; log kept in $WORK/$t.out)"
    grep -E '^==[0-9]+==ERROR|fuzz check failed|^SUMMARY' "$WORK/$t.out" | head -5 | sed 's/^/#   /'
  fi
done
[ "$n" -gt 0 ]; expect "tests/fuzz has fuzz targets ($n)"
finish
