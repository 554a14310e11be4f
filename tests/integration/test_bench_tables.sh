#!/usr/bin/env bash
# Integration: `chanter bench tables` (the cost model's micro-benchmark,
# docs/autoshard.md) with --quick and a few sets of each kind:
#  - it writes the dataset: the header comments (`# chanter bench tables
#    v1`, cpu, threads, date), then one line per set, each with its kind,
#    the batch asked for, a positive cost, n in 1..8 and n groups of
#    <rows> <dim> <hotness> <alpha> <opt> in their ranges (a trainer set
#    has one dim and one optimizer);
#  - the collectives (coll lines): the all-reduce and the AlltoAll over 2
#    ranks at the quick sizes, each with a positive cost; --kind coll
#    writes only those, --coll-ranks 0 none of them;
#  - the same seed draws the same sets (every field but the cost), another
#    seed other ones;
#  - bad options are refused naming the option, and no file is written.
source "$(dirname "$0")/lib.sh"

C=$BIN/chanter
OUT=$WORK/t.dataset
"$C" bench tables --quick --sets 3 --server-sets 2 --batch 128 --seed 5 --out "$OUT" >"$WORK/bench.log" 2>&1
expect "bench tables --quick --sets 3 --server-sets 2 exits 0"
grep -q "written to $OUT" "$WORK/bench.log"; expect "the summary names the dataset"

# the format, checked field by field; prints what is wrong, nothing when right
check_format() {
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import sys
path, batch, nt, ns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lines = open(path).read().splitlines()
bad = []
head = [l for l in lines if l.startswith('#')]
body = [l for l in lines if not l.startswith('#') and not l.startswith('coll ')]
coll = [l.split() for l in lines if l.startswith('coll ')]
want = {(op, b) for op in ('allreduce', 'alltoall') for b in ('4096', '262144', '1048576')}
if {(f[1], f[3]) for f in coll if len(f) == 5} != want or len(coll) != 6: bad.append('coll lines %s' % coll)
for f in coll:
    if len(f) != 5 or f[2] != '2' or not float(f[4]) > 0: bad.append('coll line %s' % f)
if not lines or lines[0] != '# chanter bench tables v1': bad.append('first line: %r' % (lines[:1],))
for key in ('# cpu: ', '# threads: ', '# date: '):
    if not any(l.startswith(key) and len(l) > len(key) for l in head): bad.append('no %r line' % key)
if lines and any(not l.startswith('#') for l in lines[:len(head)]) : bad.append('comments after data')
kinds = [l.split()[0] for l in body if l.split()]
if kinds != ['trainer'] * nt + ['server'] * ns: bad.append('kinds %s' % kinds)
for l in body:
    f = l.split()
    try:
        n = int(f[3])
        if f[1] != batch: bad.append('batch %s' % f[1])
        if not float(f[2]) > 0: bad.append('cost %s' % f[2])
        if not 1 <= n <= 8 or len(f) != 4 + 5 * n: bad.append('n=%d with %d fields' % (n, len(f)))
        groups = [f[4 + 5 * k: 9 + 5 * k] for k in range(n)]
        for rows, dim, hot, alpha, opt in groups:
            if int(rows) < 1000 or int(dim) not in (8, 16, 32, 64, 128) or not 1 <= int(hot) <= 100 \
               or not 0 <= float(alpha) <= 1.2 or opt not in ('sgd', 'adagrad', 'rowwise_adagrad'):
                bad.append('group %s' % [rows, dim, hot, alpha, opt])
        if f[0] == 'trainer' and len({(g[1], g[4]) for g in groups}) != 1: bad.append('trainer dims/opts %s' % groups)
    except (ValueError, IndexError) as e:
        bad.append('%r: %s' % (l, e))
print('\n'.join(bad))
PY
}
WHAT=$(check_format "$OUT" 128 3 2)
[ -z "$WHAT" ]; expect "the dataset's header and every set's fields (${WHAT:0:300})"

sets_of() { grep -v '^#' "$1" | grep -v '^coll ' | awk '{$3 = ""; print}'; }
"$C" bench tables --quick --sets 3 --server-sets 2 --batch 128 --seed 5 --out "$WORK/again.dataset" >/dev/null 2>&1
[ "$(sets_of "$OUT")" = "$(sets_of "$WORK/again.dataset")" ]; expect "the same seed draws the same sets"
"$C" bench tables --quick --kind trainer --sets 3 --batch 128 --seed 6 --out "$WORK/other.dataset" >/dev/null 2>&1
expect "--kind trainer --seed 6 exits 0"
[ "$(grep -c '^server' "$WORK/other.dataset")" = 0 ] && [ "$(grep -c '^trainer' "$WORK/other.dataset")" = 3 ]
expect "--kind trainer measures trainer sets only"
[ "$(sets_of "$OUT" | head -3)" != "$(sets_of "$WORK/other.dataset")" ]; expect "another seed draws other sets"

"$C" bench tables --quick --kind coll --out "$WORK/coll.dataset" >/dev/null 2>&1 &&
  [ "$(grep -vc '^#' "$WORK/coll.dataset")" = 6 ] && [ "$(grep -c '^coll ' "$WORK/coll.dataset")" = 6 ]
expect "--kind coll times the collectives only (6 coll lines)"
[ "$(grep -c '^coll ' "$WORK/other.dataset")" = 6 ] &&
  "$C" bench tables --quick --kind trainer --sets 1 --coll-ranks 0 --out "$WORK/nocoll.dataset" >/dev/null 2>&1 &&
  [ "$(grep -c '^coll ' "$WORK/nocoll.dataset")" = 0 ]
expect "--coll-ranks 0 times no collective"

for a in "--kind gpu" "--sets 0" "--batch x" "--server-sets -1" "--coll-ranks 1"; do
  # shellcheck disable=SC2086
  "$C" bench tables --quick $a --out "$WORK/bad.dataset" >/dev/null 2>"$WORK/bad.err"
  rc=$?
  [ "$rc" = 2 ] && grep -q -- "${a%% *}" "$WORK/bad.err" && [ ! -e "$WORK/bad.dataset" ]
  expect "bench tables $a is refused naming the option, nothing written"
done
finish
