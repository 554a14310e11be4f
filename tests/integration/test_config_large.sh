#!/usr/bin/env bash
# Integration: a job too wide for one short line -- 26 tables of 40,000,000
# rows, 8-digit table_dims, long cluster.* lists -- goes through every file
# chanter writes and every reader: `config show` prints the lists over
# continuation lines and reads them back; `local up` writes W/job.ini the
# same way and every daemon (2 data processors, 6 embedding servers, the
# oracle, 2 trainers) starts on it and trains a few iterations.  table_rows
# comes as one long --set value (the report of issue 18), table_dims and
# cluster.trainers as a user's job file splits them (a trailing comma before
# each continuation).  table_strategy = auto keeps the tables too big for
# strategy.partition_mb out of partition; `local down` leaves no daemon.  A
# malformed list is refused by the CLI and a daemon alike, naming the file,
# the line and the entry.
#
# Memory: nothing may size itself by table_rows (rows are initialized on
# first read, stored when written back; trainers cache cache_rows rows).  26
# x 40M rows of 16 floats would be 66 GB; each daemon's peak resident size
# must stay under 512 MB.
source "$(dirname "$0")/lib.sh"

ROWS=$(python3 -c 'print(",".join(["40000000"] * 26))')
JOB=$WORK/job.ini
python3 - "$JOB" <<'PY'
import sys
def wrapped(key, items, per_line):
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return key + " = " + ",\n    ".join(lines) + "\n"
with open(sys.argv[1], "w") as f:
    f.write("""; issue 18: a job with large tables
iterations = 20
batch_size = 64
eval_batches = 1
trainers = 2
embedding_servers = 6
dataprocs = 2
cache_rows = 20000
lookahead = 2
""")
    f.write(wrapped("table_dims", ["%08d" % 16] * 26, 9))
    f.write("""[synthetic]
samples = 20000
[model]
bottom_mlp = 16
top_mlp = 16
[embedding]
hot_mb = 16
block_cache_mb = 8
sync_writes = false
[cluster]
; the address each trainer binds to, in rank order (entries past the trainer count are not used)
""")
    f.write(wrapped("trainers", ["127.0.0.1"] * 32, 8))
PY
C_ARGS=(--set table_rows="$ROWS") # every C call: the rows as one long --set
# longest FILE: length of the longest line that is not a comment
longest() { awk '!/^[;#]/ { if (length($0) > m) m = length($0) } END { print m + 0 }' "$1"; }
# values FILE: the effective configuration the CLI reads from FILE
values() { "$BIN/chanter" --config "$1" config show; }
peak_kb() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null; }

# --- config show: continuation form, read back to the same values
C config show >"$WORK/shown.ini" 2>"$WORK/shown.err"
expect_rc $? "config show accepts a 26 x 40M-row job given as one long --set and a split job file"
[ "$(longest "$WORK/shown.ini")" -le 80 ] && grep -q '^table_rows = 40000000,' "$WORK/shown.ini" &&
  grep -q '^    40000000,' "$WORK/shown.ini" && grep -q '^    00000016,' "$WORK/shown.ini"
expect_rc $? "config show prints the long lists over continuation lines (longest line $(longest "$WORK/shown.ini"))"
values "$WORK/shown.ini" 2>&1 | cmp -s - "$WORK/shown.ini"
expect "what config show prints reads back to the same configuration"

# --- local up: W/job.ini is read by every daemon, which train on it
W=$WORK/w
C local up --workdir "$W" >"$WORK/up.out" 2>&1
rc=$?
for p in $(awk '{print $2}' "$W/pids" 2>/dev/null); do PIDS+=("$p"); done # killed on exit if a check fails
[ $rc -eq 0 ]; expect_rc $? "local up starts 2 data processors, 6 embedding servers, the oracle and 2 trainers$([ $rc -ne 0 ] && tail -3 "$WORK/up.out" | tr '\n' ' ')"
declare -A PEAK
sample_peaks() { # the trainers finish the job soon after local up: sample while they run
  local p k
  for p in $(awk '{print $2}' "$W/pids" 2>/dev/null); do
    k=$(peak_kb "$p"); [ -n "$k" ] && [ "$k" -gt "${PEAK[$p]:-0}" ] && PEAK[$p]=$k
  done
}
for _ in $(seq 1 20); do sample_peaks; sleep 0.02; done
[ "$(longest "$W/job.ini")" -le 80 ] && ! grep -q ',,' "$W/job.ini" && grep -q '^    127.0.0.1:[0-9]*,' "$W/job.ini"
expect_rc $? "W/job.ini has every list over continuation lines, no doubled comma (longest line $(longest "$W/job.ini"))"
tail -n +2 "$W/job.ini" | cmp -s - <(values "$W/job.ini" 2>&1)
expect "the CLI reads W/job.ini back to the same configuration"
timeout 60 "$BIN/chanter" --config "$W/job.ini" --json train --workdir "$W" >"$WORK/train.out" 2>"$WORK/train.err"
rc=$?
sample_peaks
python3 -c "
import json; d = json.load(open('$W/summary.json'))
assert d['iterations'] == 20, d
assert d['rows_fetched'] > 0 and d['rows_written_back'] > 0, d" 2>/dev/null
expect_rc $((rc + $?)) "the cluster trains 20 iterations on it$([ $rc -ne 0 ] && tail -2 "$WORK/train.err" | tr '\n' ' ')"
# table_strategy = auto (the default) on tables too big for strategy.partition_mb (2048 MiB; a table
# is 2.4 GiB of rows): none is partitioned whole, at most what fits is spread, the rest stays cached
python3 -c "
import json, collections; t = json.load(open('$W/summary.json'))['tables']
assert len(t) == 26 and not any(x['strategy'] == 'partition' for x in t), t
assert any(x['strategy'] == 'cache' and 'partition_mb' in x['why'] for x in t), t
print(dict(collections.Counter(x['strategy'] for x in t)), [x['why'] for x in t if x['strategy'] == 'cache'][0][:160])" \
  >"$WORK/tables.out" 2>&1
expect_rc $? "table_strategy = auto keeps tables over strategy.partition_mb out of partition: $(tail -1 "$WORK/tables.out" | cut -c1-220)"
n=0; big=""
for p in "${!PEAK[@]}"; do n=$((n + 1)); [ "${PEAK[$p]}" -gt 524288 ] && big="$big $(awk -v p="$p" '$2 == p {print $1}' "$W/pids")=${PEAK[$p]}kB"; done
[ "$n" -ge 9 ] && [ -z "$big" ]
expect_rc $? "no daemon holds memory for the 26 x 40M rows ($n daemons measured, peak $(printf '%s\n' "${PEAK[@]}" | sort -n | tail -1) kB$big)"
grep -qs "tables=26" "$W/logs/embedding-5.log"; expect "embedding servers lay out the 26 tables from W/job.ini"
"$BIN/chanter" local down --workdir "$W" >/dev/null 2>&1
left=0; for p in $(awk '{print $2}' "$W/pids" 2>/dev/null); do running "$p" && left=$((left + 1)); done
[ "$left" -eq 0 ]; expect_rc $? "local down leaves no daemon running"

# --- strict lists: the CLI and a daemon name the file, the line and the entry
BAD=$WORK/bad.ini
printf 'model = dlrm\ntable_rows = 40000000, 40000000,\n    40000000,, 40000000\n' >"$BAD"
err=$("$BIN/chanter" --config "$BAD" config show 2>&1 >/dev/null)
[[ "$err" == *"bad.ini:3: table_rows: entry 3 is empty"* ]]; expect_rc $? "the CLI names an empty entry: $err"
err=$("$BIN/chanter-dataproc" --config "$BAD" --index 0 --listen 127.0.0.1:0 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"bad.ini:3: table_rows: entry 3 is empty"* ]]
expect_rc $? "a daemon refuses it the same way"
err=$(C --set 'table_dims=16,16,' config show 2>&1 >/dev/null)
[[ "$err" == *"--set table_dims=16,16,: table_dims: entry 2 is empty (the list ends with a comma)"* ]]
expect_rc $? "a trailing comma in --set is named: $err"
err=$(C --set 'table_rows=1,2,three' config show 2>&1 >/dev/null)
[[ "$err" == *"--set table_rows=1,2,three: table_rows: entry 2 'three' must be an integer"* ]]
expect_rc $? "a non-number is named: $err"
finish
