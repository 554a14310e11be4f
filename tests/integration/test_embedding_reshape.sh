#!/usr/bin/env bash
# Integration: Reshape (embedding.proto) on running chanter-embedding
# daemons, driven by `chanter embedding reshape N`: two servers holding
# written rows go onto three (a third, empty one started), then onto one.
# Each time every row is on its owner under the new map and nowhere else
# (the new map's client reads every row back, each server's rows are
# only its own), the set digest and the rows are those written, the rows
# went server to server (the servers' logs, the counts), a second call
# moves nothing; a count of 0 or past the listed servers is refused.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" --daemons seed=42 "table_rows=1000, 50000, 300" embedding_dim=4 embedding_optimizer=rowwise_adagrad \
  embedding_servers=2 shard.table_wise_max_rows=500

start_embedding 0 "$JOB" || { nok "start shard 0"; finish; exit 1; }
start_embedding 1 "$JOB" || { nok "start shard 1"; finish; exit 1; }
addr() { echo "127.0.0.1:${EMB_PORT[$1]}"; }
on() { # on N ADDR... -- CLI ARGS: the CLI as a client of those N servers
  local n=$1; shift; local a=$1; shift
  while [ "$1" != "--" ]; do a="$a,$1"; shift; done; shift
  C --set embedding_servers="$n" --set cluster.embedding="$a" "$@"
}

# rows of the three tables (table 2 is placed whole, 0 and 1 row-wise)
python3 - >"$WORK/rows.args" <<'PY'
import random
r = random.Random(7)
keys = sorted({(0, r.randrange(1000)) for _ in range(800)} | {(1, r.randrange(50000)) for _ in range(2500)} |
              {(2, r.randrange(300)) for _ in range(200)})
for t, row in keys:
    print(f"{t}:{row}=" + ",".join("%.6g" % r.uniform(-1, 1) for _ in range(5)))
PY
mapfile -t ROWS <"$WORK/rows.args"
KEYS=("${ROWS[@]%%=*}")
on 2 "$(addr 0)" "$(addr 1)" -- embedding write "${ROWS[@]}" >/dev/null
expect_rc $? "wrote ${#ROWS[@]} rows through a client of two servers"
on 2 "$(addr 0)" "$(addr 1)" -- embedding lookup "${KEYS[@]}" 0:999 1:7 >"$WORK/ref.rows"
REF=$(on 2 "$(addr 0)" "$(addr 1)" -- embedding digest | tail -1)
REFSET=${REF##* set=}
case $REF in "combined: rows=${#ROWS[@]} "*) true ;; *) false ;; esac
expect_rc $? "the two servers hold the rows: $REF"

# --- 2 -> 3: a third server, empty, then Reshape
start_embedding 2 "$JOB" --set embedding_servers=3 || { nok "start shard 2"; finish; exit 1; }
THREE=("$(addr 0)" "$(addr 1)" "$(addr 2)")
out=$(on 3 "${THREE[@]}" -- --json embedding reshape 3 2>&1)
expect_rc $? "reshape 3: $(echo "$out" | cut -c1-150)"
moved=$(echo "$out" | field - rows_moved)
[ "${moved:-0}" -gt 0 ] && [ "$moved" -lt "${#ROWS[@]}" ]
expect_rc $? "  $moved of ${#ROWS[@]} rows moved (only those whose owner changed)"
dig=$(on 3 "${THREE[@]}" -- embedding digest)
[ "${dig##* set=}" = "$REFSET" ] && grep -q "^combined: rows=${#ROWS[@]} " <<<"$dig"
expect_rc $? "three servers: the set digest and the row count are the written ones"
for s in 0 1 2; do
  r=$(grep "^server $s " <<<"$dig" | sed 's/.* rows=\([0-9]*\) .*/\1/')
  [ "${r:-0}" -gt 0 ]; expect_rc $? "  server $s holds $r rows"
done
on 3 "${THREE[@]}" -- embedding lookup "${KEYS[@]}" 0:999 1:7 >"$WORK/three.rows"
cmp -s "$WORK/ref.rows" "$WORK/three.rows"
expect_rc $? "every row reads back unchanged through the three servers' map (each server answers only its own keys)"
grep -q "reshape: moved rows=" "$WORK/emb-0.log" && grep -q "reshape: moved rows=" "$WORK/emb-1.log"
expect_rc $? "the old servers sent the rows themselves (their logs)"
grep -q "method=WriteBack" "$WORK/emb-2.log"; [ $? -ne 0 ]
expect_rc $? "  no refused write-back on the new server"
err=$(on 2 "$(addr 0)" "$(addr 1)" -- embedding lookup "${KEYS[@]}" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ $err == *"belongs to embedding server"* ]]
expect_rc $? "a client of the old map is refused: $(echo "$err" | grep -o 'belongs to embedding server.*' | cut -c1-70)"
again=$(on 3 "${THREE[@]}" -- --json embedding reshape 3 | field - rows_moved)
[ "$again" = 0 ]; expect_rc $? "reshape 3 again moves nothing ($again rows)"

# --- 3 -> 1: every row onto server 0, servers 1 and 2 drained
out=$(on 3 "${THREE[@]}" -- embedding reshape 1 2>&1)
expect_rc $? "reshape 1: $(echo "$out" | tail -1)"
dig=$(on 3 "${THREE[@]}" -- embedding digest)
grep -q "^server 0 .* rows=${#ROWS[@]} " <<<"$dig" && grep -q "^server 1 .* rows=0 " <<<"$dig" &&
  grep -q "^server 2 .* rows=0 " <<<"$dig" && [ "${dig##* set=}" = "$REFSET" ]
expect_rc $? "server 0 holds every row, servers 1 and 2 none, the set digest unchanged"
on 1 "$(addr 0)" -- embedding lookup "${KEYS[@]}" 0:999 1:7 >"$WORK/one.rows"
cmp -s "$WORK/ref.rows" "$WORK/one.rows"
expect_rc $? "every row reads back unchanged from the one server"

# --- refusals
err=$(on 3 "${THREE[@]}" -- embedding reshape 0 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $err == *"not a server count from 1 to 3"* ]]
expect_rc $? "reshape 0 is refused: $err"
err=$(on 3 "${THREE[@]}" -- embedding reshape 4 2>&1); rc=$?
[ $rc -eq 2 ] && [[ $err == *"not a server count from 1 to 3"* ]]
expect_rc $? "reshape past the listed servers is refused"
finish
