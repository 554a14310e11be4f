#!/usr/bin/env bash
# Integration: Prometheus and the Grafana dashboard against a real local
# cluster.  Debian's `prometheus` (skipped with one line where it is not
# installed) scrapes, every second, the cluster `chanter prometheus-config
# --workdir` describes, while it trains a job (lookahead cache, a
# checkpoint); then, through Prometheus's HTTP API:
#   - prometheus-config's output is a valid configuration (promtool) with a
#     target per daemon, each up, labelled job, role and instance; from a
#     job file, each daemon is at its RPC port + <role>.metrics_port_offset
#     (a trainer at trainer.metrics_port), one whose port is picked at start
#     said in a comment; deploy/prometheus/prometheus.yml is what it writes
#     for deploy/job.example.ini;
#   - every metric deploy/grafana/chanter-job.json names has series
#     (/api/v1/series), and every expression of its panels returns series
#     over the training (/api/v1/query_range, with the dashboard's
#     variables $job, $__rate_interval and $__range filled in);
#   - their values make sense: the job's iteration rises to the end and
#     each trainer's rises, samples/s and the trainers' samples rate are
#     > 0, the loss and AUC lie in range, every phase has its time (total
#     and forward > 0), the cache
#     hit rate is in (0, 1], rows are fetched, written back and
#     synchronized, the traffic floor rises (the tables are cached), a
#     checkpoint is counted, the job state goes training then done;
#   - a drill (`chanter drill kill-trainer`, its cluster scraped as job
#     chanter-drill after a configuration reload) passes, and Prometheus
#     saw it: chanter_oracle_recoveries_total{kind="trainer"} >= 1, and the
#     dashboard's restarts expression counts trainer-1's restart.
source "$(dirname "$0")/lib.sh"

PROM=$(command -v prometheus || true)
if [ -z "$PROM" ]; then
  skip "prometheus is not installed (tools/install-deps.sh installs Debian's)"
  finish
  exit $?
fi
DASH=$ROOT/deploy/grafana/chanter-job.json
down_all() { clusters_down "$CHANTER" "$WORK/c" "$WORK/d/drill"; cleanup; }
trap down_all EXIT

JOB=$WORK/job.ini
job_preamble "$JOB" table_strategy=cache iterations=1000 eval_every=250 cache_rows=200000 checkpoint_every=250 \
  checkpoint_seconds=0 oracle.heartbeat_timeout_ms=2000 local.watchdog_ms=2000
UP_ARGS=--insecure
now() { date +%s.%N; }

# ---- Prometheus, then a cluster it scrapes (its job starts training as soon
# as it is up: the configuration is reloaded at once)
# reload_for W JOBNAME: prometheus-config of the local cluster in W as $WORK/prom.yml, Prometheus told (SIGHUP)
reload_for() {
  "$CHANTER" prometheus-config --workdir "$1" --job-name "$2" --scrape-interval 1s >"$WORK/prom.yml.new" 2>>"$WORK/promcfg.err" &&
    mv "$WORK/prom.yml.new" "$WORK/prom.yml" && kill -HUP "$PROM_PID"
}
C prometheus-config --scrape-interval 1s >"$WORK/prom.yml" 2>"$WORK/promcfg.err" &&
  grep -q "targets: \[\]" "$WORK/prom.yml"
expect "prometheus-config of a job file without addresses: no target, each daemon said"
# from a job file's addresses: RPC port + <role>.metrics_port_offset, trainer.metrics_port
C --set tls.insecure=true --set cluster.oracle=o.x:7000 --set "cluster.embedding=e0.x:7100,[::1]:7101" \
  --set cluster.dataproc=d0.x:7200 --set cluster.trainers=t0.x,t1.x --set trainer.metrics_port=7300 \
  --set dataproc.metrics_port_offset=0 prometheus-config --job-name j1 >"$WORK/prom-job.yml" 2>>"$WORK/promcfg.err"
python3 - "$WORK/prom-job.yml" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
got = re.findall(r"targets: \['([^']+)'\]\n\s+labels: \{role: '(\w+)', instance: '([\w-]+)'\}", t)
assert got == [("e0.x:8100", "embedding", "embedding-0"), ("[::1]:8101", "embedding", "embedding-1"),
               ("o.x:8000", "oracle", "oracle-0"), ("t0.x:7300", "trainer", "trainer-0"),
               ("t1.x:7300", "trainer", "trainer-1")], got
assert "job_name: 'j1'" in t and "# dataproc-0: not scraped: dataproc.metrics_port_offset = 0" in t, t
PY
expect "prometheus-config of a job file: each daemon at its RPC port + offset (trainers: trainer.metrics_port), one without a port said"
(cd "$ROOT" && "$CHANTER" --config deploy/job.example.ini --set metrics.listen=0.0.0.0 --set trainer.metrics_port=7300 \
  prometheus-config | cmp -s - deploy/prometheus/prometheus.yml)
expect "deploy/prometheus/prometheus.yml is what prometheus-config writes for deploy/job.example.ini"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
"$PROM" --config.file="$WORK/prom.yml" --storage.tsdb.path="$WORK/tsdb" --web.listen-address="127.0.0.1:$PORT" \
  --log.level=warn >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
PIDS+=("$PROM_PID")
until_ok 300 curl -sf "$URL/-/ready" -o /dev/null
expect "prometheus ready on 127.0.0.1:$PORT"

T0=$(now)
job_up c
expect_rc $? "local up: a cluster of $(wc -l <"$WORK/c/pids" 2>/dev/null) daemons"
reload_for "$WORK/c" chanter
expect "prometheus-config --workdir, prometheus reloads it"
if command -v promtool >/dev/null; then
  promtool check config "$WORK/prom.yml" >"$WORK/promtool.out" 2>&1
  expect "promtool check config: valid"
fi
[ "$(grep -c "targets: \['127.0.0.1:[0-9]*'\]" "$WORK/prom.yml")" = "$(wc -l <"$WORK/c/pids")" ] &&
  ! grep -q "not scraped" "$WORK/prom.yml"
expect "a target per daemon W/pids lists, each at its ready file's metrics port"

# promq value|count|labels EXPR: an instant query's first value, its number of series, or each one's labels
promq() { python3 "$WORK/promq.py" "$URL" "$@"; }
cat >"$WORK/promq.py" <<'PY'
import json, sys, urllib.parse, urllib.request
url, op = sys.argv[1], sys.argv[2]
def get(path, **params):
    with urllib.request.urlopen(url + path + "?" + urllib.parse.urlencode(params, doseq=True), timeout=10) as r:
        d = json.load(r)
    if d.get("status") != "success":
        raise SystemExit("query failed: %s" % d)
    return d["data"]
if op == "value":  # value EXPR: the first series' value of an instant query (nothing when empty)
    res = get("/api/v1/query", query=sys.argv[3])["result"]
    if res:
        print(res[0]["value"][1])
elif op == "count":  # count EXPR: how many series an instant query returns
    print(len(get("/api/v1/query", query=sys.argv[3])["result"]))
elif op == "labels":  # labels EXPR: each series' labels, one JSON object a line
    for s in get("/api/v1/query", query=sys.argv[3])["result"]:
        print(json.dumps(s["metric"], sort_keys=True))
PY
# all_up JOB N: N targets of JOB scraped and up
all_up() { [ "$(promq count "up{job=\"$1\"} == 1" 2>/dev/null)" = "$2" ]; }
until_ok 100 all_up chanter "$(wc -l <"$WORK/c/pids")"
expect "every daemon scraped and up"
promq labels 'up{job="chanter"}' >"$WORK/up.labels"
python3 - "$WORK/up.labels" "$WORK/c/pids" <<'PY'
import json, sys
got = {json.loads(l)["instance"]: json.loads(l) for l in open(sys.argv[1])}
names = [l.split()[0] for l in open(sys.argv[2])]
assert sorted(got) == sorted(names), (sorted(got), names)
for n, l in got.items():
    assert l["role"] == n.rsplit("-", 1)[0] and l["job"] == "chanter", l
PY
expect "labels: job chanter, role and instance as W/pids names each daemon"

# ---- the job, scraped while it trains
job_train c; rc=$?
expect_rc $rc "the job trains to the end"
REF=$(field "$WORK/c/summary.json" digest)
sleep 2 # a last scrape of the oracle with the job done
T1=$(now)
job_down c

# every metric the dashboard names, every expression of its panels, and
# what their values should be: PASS/FAIL lines
python3 - "$URL" "$DASH" "$T0" "$T1" 1000 >"$WORK/dash.out" 2>&1 <<'PY'
import json, math, re, sys, urllib.parse, urllib.request
url, dash, t0, t1, iterations = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
def get(path, **params):
    with urllib.request.urlopen(url + path + "?" + urllib.parse.urlencode(params, doseq=True), timeout=20) as r:
        return json.load(r)["data"]
span = "%ds" % (int(t1 - t0) + 2)
def fill(e):
    return e.replace("$job", "chanter").replace("$__rate_interval", "5s").replace("$__range", span)
def series(e):  # {label-string: [values]} over the training
    res = get("/api/v1/query_range", query=fill(e), start=t0, end=t1, step=1)["result"]
    return {json.dumps(s["metric"], sort_keys=True): [float(v) for _, v in s["values"]] for s in res}
def say(ok, what):
    print("%s %s" % ("PASS" if ok else "FAIL", what))
d = json.load(open(dash))
exprs = []
for p in d["panels"]:
    for t in p.get("targets", []):
        exprs.append((p["title"], t["expr"]))
names = set()
for _, e in exprs:
    names |= set(re.findall(r"\b(chanter_[a-z_]+|process_start_time_seconds|up)\b(?=\s*[{\[(])", e))
    names |= set(re.findall(r'__name__=~"([^"]+)"', e))
missing = []
for n in sorted(names):
    m = '{__name__=~"%s",job="chanter"}' % n
    if not get("/api/v1/series", **{"match[]": m, "start": t0, "end": t1}):
        missing.append(n)
say(not missing and len(names) > 30, "the %d metrics the dashboard names all have series%s" % (len(names), ": missing " + ", ".join(missing) if missing else ""))
empty = [(t, e) for t, e in exprs if not series(e)]
say(not empty, "the %d expressions of its panels all return series over the training%s" % (len(exprs), "".join("\n#   empty: %s: %s" % te for te in empty)))
def vals(e):
    return [v for vs in series(e).values() for v in vs if not math.isnan(v)]
def one(e):
    s = series(e)
    return list(s.values())[0] if len(s) == 1 else []
it = one('chanter_oracle_iteration{job="chanter"}')
say(it and it[-1] == iterations and max(it) == iterations and any(a < b for a, b in zip(it, it[1:])) and all(a <= b for a, b in zip(it, it[1:])),
    "chanter_oracle_iteration rises to %d (seen %s)" % (iterations, sorted(set(int(v) for v in it))[:3] + ["..."] + [int(max(it or [0]))]))
tr = series('chanter_trainer_iteration{job="chanter"}')
# (a trainer exits at the job's end, maybe before a last scrape)
say(len(tr) == 2 and all(max(v) >= iterations / 2 and v[0] < max(v) for v in tr.values()),
    "each trainer's chanter_trainer_iteration rises (to %s)" % [int(max(v)) for v in tr.values()])
sps = vals('chanter_oracle_samples_per_second{job="chanter"}')
say(sps and max(sps) > 0, "chanter_oracle_samples_per_second > 0 (max %.0f)" % max(sps or [0]))
trs = vals('sum(rate(chanter_trainer_samples_total{job="chanter"}[5s]))')
say(trs and max(trs) > 0, "the trainers' samples rate > 0 (max %.0f/s)" % max(trs or [0]))
loss = vals('chanter_oracle_train_loss{job="chanter"}')
say(loss and 0 < loss[-1] < 1.5 and all(0 <= v < 1.5 for v in loss), "training loss in (0, 1.5) (last %.3f)" % (loss or [0])[-1])
auc = vals('chanter_oracle_test_auc{job="chanter"}')
say(auc and 0.5 < auc[-1] <= 1, "test AUC in (0.5, 1] (last %.3f)" % (auc or [0])[-1])
ll = vals('chanter_oracle_test_logloss{job="chanter"}')
say(ll and 0 < ll[-1] < 1.5, "test logloss in (0, 1.5) (last %.3f)" % (ll or [0])[-1])
ph = series('sum by (phase) (rate(chanter_oracle_phase_seconds_sum{job="chanter"}[5s])) / sum by (phase) (rate(chanter_oracle_phase_seconds_count{job="chanter"}[5s]))')
phases = {json.loads(k).get("phase"): max([v for v in vs if not math.isnan(v)] or [0]) for k, vs in ph.items()}
say(len(phases) >= 8 and phases.get("total", 0) > 0 and phases.get("forward", 0) > 0, "time per iteration by phase: %d phases, total %.4f s" % (len(phases), phases.get("total", 0)))
hit = [v for v in vals('sum(rate(chanter_trainer_cache_hits_total{job="chanter"}[5s])) / (sum(rate(chanter_trainer_cache_hits_total{job="chanter"}[5s])) + sum(rate(chanter_trainer_rows_fetched_total{job="chanter"}[5s])))')]
say(hit and all(0 <= v <= 1 for v in hit) and max(hit) > 0, "cache hit rate in (0, 1] (max %.2f)" % max(hit or [0]))
for m in ("rows_fetched_total", "rows_written_back_total", "rows_synced_total", "floor_rows_total"):
    r = vals('sum(rate(chanter_oracle_%s{job="chanter"}[5s]))' % m)
    say(r and max(r) > 0, "chanter_oracle_%s rises (max %.0f rows/s)" % (m, max(r or [0])))
cp = vals('chanter_oracle_checkpoints_total{job="chanter"}')
say(cp and cp[-1] >= 1, "chanter_oracle_checkpoints_total counts the checkpoint (%d)" % (cp or [0])[-1])
st = vals('chanter_oracle_job_state{job="chanter"}')
say(1 in st and st[-1] == 2, "chanter_oracle_job_state: training (1), then done (2): %s" % sorted(set(st)))
rec = vals('sum(chanter_oracle_recoveries_total{job="chanter"})')
say(rec and max(rec) == 0, "no recovery counted in a job without faults")
PY
while read -r verdict what; do
  if [ "$verdict" = PASS ]; then ok "$what"; elif [ "$verdict" = FAIL ]; then nok "$what"; else echo "# $verdict $what"; fi
done <"$WORK/dash.out"

# ---- a drill: its cluster scraped as job chanter-drill (configuration reloaded)
C drill kill-trainer --rank 1 --at 700 --reference "$REF" --workdir "$WORK/d" --json >"$WORK/d.json" 2>"$WORK/d.err" &
DRILL_PID=$!
PIDS+=("$DRILL_PID")
# up: W/pids lists every daemon and each has its ready file
drill_up() {
  local w=$WORK/d/drill
  [ -f "$w/pids" ] && [ "$(wc -l <"$w/pids")" -ge 6 ] &&
    [ "$(compgen -G "$w/run/*.ready" | wc -l)" -ge "$(wc -l <"$w/pids")" ]
}
until_ok 600 drill_up
expect "the drill's cluster is up"
reload_for "$WORK/d/drill" chanter-drill
expect "prometheus-config --job-name chanter-drill, prometheus reloads it"
until_ok 100 all_up chanter-drill "$(wc -l <"$WORK/d/drill/pids")"
expect "the drill's daemons scraped"
wait "$DRILL_PID"; rc=$?
expect_rc $rc "the drill passes: $(jf "$WORK/d.json" "'%s %s' % (d['kind'], 'PASS' if d['pass'] else 'FAIL')")"
REC=$(promq value 'max_over_time(chanter_oracle_recoveries_total{job="chanter-drill",kind="trainer"}[5m])')
[ -n "$REC" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 1 else 1)" "$REC"
expect_rc $? "the drill's recovery counted: chanter_oracle_recoveries_total{kind=\"trainer\"} = ${REC:-none}"
RESTARTS=$(python3 -c "import json,sys; print([t['expr'] for p in json.load(open(sys.argv[1]))['panels'] if p['title'] == 'Restarts' for t in p['targets']][0])" "$DASH")
RESTARTS=${RESTARTS//\$job/chanter-drill}
RESTARTS=${RESTARTS//\$__range/5m}
N1=$(promq labels "${RESTARTS} > 0")
echo "$N1" | grep -q '"instance": "trainer-1"'
expect_rc $? "the dashboard's restarts expression counts trainer-1's restart: $(echo "$N1" | tr '\n' ' ')"

finish
