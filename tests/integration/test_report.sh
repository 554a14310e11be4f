#!/usr/bin/env bash
# Integration: `chanter report` on a real job, and the oracle's timeline
# it reads (oracle.state_dir/timeline.jsonl).  A drill (kill -9 of a
# trainer mid-job on a `local up` cluster, which the job survives) gives a
# job with evaluations, checkpoints and a recovery; then:
#   - the timeline has the job's iterations up to the last, every
#     evaluation, every checkpoint the oracle saw complete, the recovery, and a
#     recovered job appends to it (two generations in one file);
#   - `chanter report --workdir W` writes loss, throughput, phases and
#     traffic as PNG (real PNG files) and SVG (well-formed XML), the data
#     they were drawn from and index.html with the four SVGs inline and the
#     summary's job id and digest;
#   - the data match summary.json: the last iteration, the evaluations'
#     AUC, the checkpoints, the recovery marked, the traffic floor (the
#     tables cached: over the last run's lines, the summary's floor_rows;
#     the floor drawn on the traffic plot);
#   - a job without oracle.state_dir gets one line saying why there is no
#     timeline; --out writes elsewhere.
# Skipped with one line without gnuplot (tools/install-deps.sh installs it).
source "$(dirname "$0")/lib.sh"

if ! command -v gnuplot >/dev/null; then
  skip "gnuplot is not installed (tools/install-deps.sh installs gnuplot-nox)"
  finish
  exit 0
fi

JOB=$WORK/job.ini
# (the tables cached: table_strategy = auto may partition them, and a partitioned table has no floor)
job_preamble "$JOB" iterations=400 eval_every=100 checkpoint_every=100 table_strategy=cache
C drill kill-trainer --at 150 --workdir "$WORK/d" >"$WORK/drill.out" 2>&1
expect_rc $? "the drill (kill -9 of a trainer at iteration 150) passes: $(grep -E '^(PASS|FAIL)' "$WORK/drill.out")"

D=$WORK/d/drill
TL=$D/oracle/timeline.jsonl
python3 - "$TL" "$D/summary.json" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
s = json.load(open(sys.argv[2]))
it = [l for l in lines if l["kind"] == "iter"]
assert it and it[-1]["iteration"] == s["iterations"], (it[-1:], s["iterations"])
ev = [l for l in lines if l["kind"] == "eval"]
assert [round(e["auc"], 6) for e in ev][-1] == round(s["test_auc"], 6), (ev, s["test_auc"])
assert len({e["after_iteration"] for e in ev}) == len(s["evals"]), (ev, s["evals"])
cp = [l for l in lines if l["kind"] == "checkpoint"]
assert cp and cp[-1]["id"] == s["checkpoint"]["id"], (cp[-1:], s["checkpoint"])
st = [l["state"] for l in lines if l["kind"] == "state"]
assert "recovering" in st and st[-1] == "done", st
assert len({l["generation"] for l in lines}) == 2, "one recovery: two generations"
assert all(l["job_id"] == s["job_id"] for l in lines)
PY
expect "the timeline holds every iteration up to the last, the evaluations, the checkpoints and the recovery (two generations, one job id)"

"$CHANTER" report --workdir "$D" >"$WORK/report.out" 2>"$WORK/report.err"
expect_rc $? "chanter report --workdir: $(cat "$WORK/report.out") $(head -2 "$WORK/report.err")"
R=$D/report
python3 - "$R" "$D/summary.json" <<'PY'
import json, os, sys, xml.dom.minidom
r, s = sys.argv[1], json.load(open(sys.argv[2]))
for p in ("loss", "throughput", "phases", "traffic"):
    png = open(os.path.join(r, p + ".png"), "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, p
    xml.dom.minidom.parse(os.path.join(r, p + ".svg"))
html = open(os.path.join(r, "index.html")).read()
assert s["job_id"] in html and s["digest"] in html
assert html.count("<svg") == 4
rows = [l.split("\t") for l in open(os.path.join(r, "iter.tsv"))]
assert int(rows[-1][1]) == s["iterations"] and len(rows[0]) == 16
# the floor: every line has one; the last run's lines (from its start_iteration), weighted by their
# iterations, give the summary's floor_rows (each line rounded to 0.1)
assert all(float(l[15]) > 0 for l in rows), [l[15] for l in rows[:3]]
tl_iter = [json.loads(l) for l in open(os.path.join(os.path.dirname(r), "oracle", "timeline.jsonl"))]
gen = max(l["generation"] for l in tl_iter)
last = [l for l in tl_iter if l["kind"] == "iter" and l["generation"] == gen]
prev, tot = s["start_iteration"], 0.0
for l in last:
    tot += l["rows"]["floor"] * (l["iteration"] - prev)
    prev = l["iteration"]
n = s["iterations"] - s["start_iteration"]
assert s["floor_iterations"] == n and abs(tot / n - s["floor_rows"]) < 0.06, (tot / n, s["floor_rows"], n)
assert "floor (cached tables)" in open(os.path.join(r, "traffic.svg")).read()
ev = [l.split("\t") for l in open(os.path.join(r, "eval.tsv"))]
assert abs(float(ev[-1][2]) - s["test_auc"]) < 1e-6
marks = [l.rstrip("\n").split("\t")[1] for l in open(os.path.join(r, "marks.tsv"))]
tl = [json.loads(l) for l in open(os.path.join(os.path.dirname(r), "oracle", "timeline.jsonl"))]
assert "recovering" in marks and marks.count("checkpoint") == sum(l["kind"] == "checkpoint" for l in tl) >= 1, marks
PY
expect "the report: four plots as real PNG and well-formed SVG, index.html with them inline and the job's id and digest, data that match summary.json (last iteration, AUC, checkpoints, the recovery, the traffic floor on the traffic plot)"

"$CHANTER" report --workdir "$D" --out "$WORK/elsewhere" >/dev/null 2>&1 && [ -s "$WORK/elsewhere/index.html" ] && [ ! -e "$WORK/elsewhere/../d/drill/elsewhere" ]
expect "--out puts the report where it says"

C --set oracle.state_dir= report >"$WORK/nodir.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "no oracle.state_dir" "$WORK/nodir.out"
expect_rc $? "a job without oracle.state_dir: exit 1, saying there is no timeline: $(head -1 "$WORK/nodir.out")"

finish
