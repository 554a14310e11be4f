#!/usr/bin/env bash
# Integration: the embedding servers' placement of the tables from the cost
# model (shard.table_servers, common/shard.h) on a real cluster (two
# servers, two trainers, the default cached strategy so every row goes
# through the servers):
#   - `chanter shard plan --json` prints autoshard's server placement as a
#     shard.table_servers value, another map than the rows-greedy default;
#   - the job with that value trains to the default map's digest and test
#     loss (which server holds a row never changes its value);
#   - another length than table_rows, a server past embedding_servers and a
#     word that is neither are refused at start, naming the key and entry.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" table_strategy=cache
UP_ARGS=--insecure

TS=$(C --json shard plan 2>"$WORK/plan.err" | python3 -c "import json,sys; print(json.load(sys.stdin)['table_servers'])")
DEF=$(C --json shard plan 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)['servers']['plans']['current']['owner']
print(','.join('rows' if o < 0 else str(o) for o in d))")
[ -n "$TS" ] && [ "$TS" != "$DEF" ]
expect_rc $? "shard plan --json: autoshard's server placement ($TS) is another map than the default ($DEF)"

run_job ref
expect_rc $? "the default map: trains (digest $(field "$WORK/ref/summary.json" digest | cut -c1-16)...)"
run_job ap --set "shard.table_servers=$TS" && same ref ap
expect_rc $? "shard.table_servers = autoshard's placement: the default map's digest and test loss"
grep -q "table_servers = ${TS:0:20}" "$WORK/ap/job.ini"
expect_rc $? "  the job file local up wrote carries it (every daemon and client reads the same)"

# wrong values: refused at start, naming the key and the entry
N=$(python3 -c "print(len('$TS'.split(',')))")
BAD=$(python3 -c "v='$TS'.split(','); v[1]='9'; print(','.join(v))")
out=$(job_stderr bad1 --set "shard.table_servers=$BAD")
case $out in *"shard.table_servers"*"entry 2 is '9'"*) true ;; *) false ;; esac
expect_rc $? "a server past embedding_servers is refused: $(echo "$out" | grep -m1 -o "shard.table_servers.*" | cut -c1-110)"
out=$(job_stderr bad2 --set "shard.table_servers=0,1")
case $out in *"shard.table_servers"*"2 entries for $N tables"*) true ;; *) false ;; esac
expect_rc $? "a list of another length is refused: $(echo "$out" | grep -m1 -o "shard.table_servers.*" | cut -c1-110)"
WORD=$(python3 -c "v='$TS'.split(','); v[0]='row'; print(','.join(v))")
out=$(job_stderr bad3 --set "shard.table_servers=$WORD")
case $out in *"entry 1 is 'row'"*) true ;; *) false ;; esac
expect_rc $? "a word that is neither an index nor rows is refused: $(echo "$out" | grep -m1 -o "entry 1.*" | cut -c1-80)"

finish
