#!/usr/bin/env bash
# Integration: small hand-made files of the shapes public Criteo/Avazu
# samples come in, through `chanter data stats`, `chanter data convert`,
# `chanter train --local` and a data processor:
#  - a file where most lines are malformed is refused (exit 1) with the
#    count, the fraction, data.max_bad_fraction and the first bad line as
#    file:line and why; under the limit (or with the limit raised) it runs,
#    strict = true stops at the first bad line, and a lone label or a cut
#    last line stays malformed;
#  - a Criteo copy with its trailing empty fields stripped (48% of its lines
#    with 38 fields) reads as the same samples as the original: counted as
#    short lines, converted to the same bytes, trained to the same digest;
#  - a table whose table_rows is too small for its raw values: data stats
#    shows raw values and the merged share (its --json too), and warns once
#    for that table; its binary conversion gives the same figures; with
#    enough rows, no warning.
source "$(dirname "$0")/lib.sh"


# --- a Criteo file, and its copy with trailing empty fields stripped
C data gen --out "$WORK/g.tsv" --samples 2000 >/dev/null 2>&1; expect "data gen writes 2000 Criteo lines"
# lines with NR % 25 < 12 (48%) get C25 and C26 empty, then the copy drops them
awk -F'\t' -v OFS='\t' 'NR % 25 < 12 { $39 = ""; $40 = "" } { print }' "$WORK/g.tsv" >"$WORK/full.tsv"
sed 's/\t*$//' "$WORK/full.tsv" >"$WORK/cut.tsv"
n38=$(awk -F'\t' 'NF == 38' "$WORK/cut.tsv" | wc -l)
[ "$n38" -eq 960 ]; expect_rc $? "the stripped copy has 960 of 2000 lines with 38 fields"

C data stats "$WORK/cut.tsv" >"$WORK/cut.stats" 2>"$WORK/cut.stats.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^samples  2000 (train 1800, test 200), bad records skipped 0, 960 short lines read with empty trailing fields$" "$WORK/cut.stats"
expect "data stats accepts the stripped copy: 2000 samples, 0 bad, 960 short lines"
C --json data stats "$WORK/cut.tsv" >"$WORK/cut.json" 2>/dev/null && C --json data stats "$WORK/full.tsv" >"$WORK/full.json" 2>/dev/null
[ "$(field "$WORK/cut.json" short_lines)" = 960 ] && [ "$(field "$WORK/full.json" short_lines)" = 0 ] && \
  [ "$(field "$WORK/cut.json" bad_records)" = 0 ]
expect "data stats --json: short_lines 960 (0 for the file with its tabs)"
python3 - "$WORK/cut.json" "$WORK/full.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tables"] == b["tables"] and a["overall"] == b["overall"], "profiles differ"
PY
expect "the stripped copy profiles exactly as the original (rows, raw values, merged shares)"

C data convert "$WORK/cut.tsv" "$WORK/cut.bin" >"$WORK/cut.conv" 2>&1 && C data convert "$WORK/full.tsv" "$WORK/full.bin" >/dev/null 2>&1
grep -q "converted .*cut.tsv (criteo) to .*cut.bin: 2000 samples, 0 bad records skipped, 960 short lines read with empty trailing fields" "$WORK/cut.conv"
expect_rc $? "data convert reports the short lines: $(cut -c1-150 "$WORK/cut.conv")"
cmp -s "$WORK/cut.bin" "$WORK/full.bin"; expect "and writes the same bytes as from the file with its tabs"
[ "$(C --json data convert "$WORK/cut.tsv" "$WORK/cut2.bin" 2>/dev/null | field - short_lines)" = 960 ]
expect "data convert --json: short_lines 960"

TRAIN=(--set iterations=4 --set batch_size=64 --set eval_batches=1)
C --json --set dataset="$WORK/cut.tsv" "${TRAIN[@]}" train --local --quiet >"$WORK/cut.train" 2>"$WORK/cut.train.err" && \
  C --json --set dataset="$WORK/full.tsv" "${TRAIN[@]}" train --local --quiet >"$WORK/full.train" 2>/dev/null
[ -n "$(field "$WORK/cut.train" digest)" ] && [ "$(field "$WORK/cut.train" digest)" = "$(field "$WORK/full.train" digest)" ]
expect "train --local on the stripped copy: same model digest as on the original"

# --- too many malformed lines: 41 fields on every other line
awk 'NR % 2 == 0 { print $0 "\t7"; next } { print }' "$WORK/g.tsv" >"$WORK/bad.tsv"
want="bad.tsv: 1000 of 2000 records are malformed (50.0%, more than data.max_bad_fraction = 1.0%); first at $WORK/bad.tsv:2: 41 fields, expected 40"
C data stats "$WORK/bad.tsv" >/dev/null 2>"$WORK/bad.stats.err"; rc=$?
[ $rc -eq 1 ] && grep -qF "chanter data stats: $WORK/$want" "$WORK/bad.stats.err"
expect_rc $? "data stats refuses a file with 50% bad lines (exit $rc): $(tail -1 "$WORK/bad.stats.err" | cut -c1-200)"
C data convert "$WORK/bad.tsv" "$WORK/bad.bin" >/dev/null 2>"$WORK/bad.conv.err"; rc=$?
[ $rc -eq 1 ] && grep -qF "chanter data convert: $WORK/$want" "$WORK/bad.conv.err" && [ ! -e "$WORK/bad.bin" ] && [ ! -e "$WORK/bad.bin.tmp" ]
expect_rc $? "data convert refuses it too (exit $rc) and writes nothing"
C --set dataset="$WORK/bad.tsv" "${TRAIN[@]}" train --local --quiet >/dev/null 2>"$WORK/bad.train.err"; rc=$?
[ $rc -ne 0 ] && grep -qF "$WORK/$want" "$WORK/bad.train.err"
expect_rc $? "train --local refuses it (exit $rc), with the same message"
cat >"$WORK/job.ini" <<INI
dataset = $WORK/bad.tsv
INI
timeout 20 "$BIN/chanter-dataproc" --config "$WORK/job.ini" --listen 127.0.0.1:0 >"$WORK/dp.log" 2>&1; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF "$WORK/$want" "$WORK/dp.log"
expect_rc $? "a data processor refuses to start on it (exit $rc), with the same message"
C --set data.max_bad_fraction=0.6 data stats "$WORK/bad.tsv" >"$WORK/bad.stats" 2>/dev/null && \
  grep -q "^samples  1000 (train 900, test 100), bad records skipped 1000 (fields 1000)$" "$WORK/bad.stats"
expect "data.max_bad_fraction = 0.6 lets it through: 1000 samples, 1000 bad records skipped"
# 10 bad lines in 2000 (0.5%): under the default limit
awk 'NR % 200 == 7 { print $0 "\t7"; next } { print }' "$WORK/g.tsv" >"$WORK/few.tsv"
C --set dataset="$WORK/few.tsv" "${TRAIN[@]}" train --local --quiet >/dev/null 2>&1 && \
  C data stats "$WORK/few.tsv" 2>/dev/null | grep -q "bad records skipped 10 (fields 10)"
expect "0.5% bad lines: under the default 1%, counted and skipped"
C --set strict=true data stats "$WORK/few.tsv" >/dev/null 2>"$WORK/strict.err"; rc=$?
[ $rc -eq 1 ] && grep -qF "$WORK/few.tsv:7: 41 fields, expected 40 (label, 13 integers, 26 categoricals, tab-separated) (strict = true)" "$WORK/strict.err"
expect_rc $? "strict = true still stops at the first bad line: $(tail -1 "$WORK/strict.err" | cut -c1-160)"
printf '1\n' >>"$WORK/few.tsv"  # a lone label is no short line; neither is a cut last line
printf '0\t1\t2' >>"$WORK/few.tsv"
C --set data.max_reports=100 data stats "$WORK/few.tsv" >"$WORK/few.stats" 2>"$WORK/few.err"
grep -q "few.tsv:2001 why=\"1 field, expected 40" "$WORK/few.err" && \
  grep -q "few.tsv:2002 why=\"truncated last record (no newline at end of file): 3 fields, expected 40\"" "$WORK/few.err" && \
  grep -q "bad records skipped 12 (fields 11, truncated 1)" "$WORK/few.stats"
expect "a lone label and a short last line without newline stay malformed"

# --- table_rows too small: raw values merged into shared rows
{ echo "id,click,site,app"
  for i in $(seq 1 40); do echo "$i,$((i % 2)),s$((i % 4)),a$i"; done; } >"$WORK/av.csv"
AV=(--set n_dense=0 --set table_rows=1,1000000 --set test_fraction=0)
C "${AV[@]}" data stats "$WORK/av.csv" >"$WORK/av.stats" 2>"$WORK/av.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "warning" "$WORK/av.err")" -eq 1 ] && \
  grep -qF "chanter data stats: warning: table 0: 100.0% of accesses land on rows that several raw values share (4 distinct raw values hashed into table_rows[0] = 1 row); raise table_rows[0]: about 29 rows (9.5x the raw values) would bring it near 10%" "$WORK/av.err"
expect_rc $? "4 values in 1 row: one warning, for table 0, with the share, the rows and what to do: $(head -1 "$WORK/av.err" | cut -c1-120)"
grep -Eq "^0 +1 +1 +40 +1 +4 +100\.0%" "$WORK/av.stats" && grep -Eq "^1 +1000000 +1 +40 +40 +40 +0\.0%" "$WORK/av.stats"
expect "the table shows raw values and merged % per table"
C --json "${AV[@]}" data stats "$WORK/av.csv" >"$WORK/av.json" 2>/dev/null
[ "$(field "$WORK/av.json" tables 0 raw_values)" = 4 ] && [ "$(field "$WORK/av.json" tables 0 merged_share)" = 1.0 ] && \
  [ "$(field "$WORK/av.json" tables 1 raw_values)" = 40 ] && [ "$(field "$WORK/av.json" tables 1 merged_rows)" = 0 ] && \
  [ "$(field "$WORK/av.json" tables 0 raw_values_exact)" = True ] && [ "$(field "$WORK/av.json" overall merged_share)" = 0.5 ]
expect "data stats --json: raw_values, merged_rows, merged_share per table and overall"
C "${AV[@]}" data convert "$WORK/av.csv" "$WORK/av.bin" >/dev/null 2>&1 && \
  C "${AV[@]}" data stats "$WORK/av.bin" 2>"$WORK/avbin.err" | grep -Eq "^0 +1 +1 +40 +1 +4 +100\.0%" && \
  [ "$(grep -c "warning: table 0: 100.0%" "$WORK/avbin.err")" -eq 1 ]
expect "the binary conversion keeps the 64-bit hashes: same figures, same warning"
C --set n_dense=0 --set table_rows=1000,1000000 --set test_fraction=0 data stats "$WORK/av.csv" >/dev/null 2>"$WORK/av2.err"
[ ! -s "$WORK/av2.err" ]; expect "enough rows: no warning"
finish
