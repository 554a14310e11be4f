#!/usr/bin/env bash
# Integration: the oracle's live status page on its metrics port
# (services/oracle/oracle_page.c), on a local cluster (`chanter local up`:
# a data processor, two embedding servers, the oracle, two trainers):
#   - once the cluster is up (the job starts as soon as both trainers have
#     joined), GET /status.json answers JSON with the job (its id as the
#     oracle's ready file says, waiting or training, an iteration within the
#     job's iterations), every daemon of the cluster (the oracle, the
#     two trainers with the pids `local status` shows, the embedding servers
#     and the data processor at the job file's addresses) and the summary;
#     GET / and /status answer one self-contained HTML page (no script,
#     style or image from anywhere else) that polls /status.json; the page
#     is read-only (POST is refused 405), other paths 404, and /metrics is
#     still served as before, in plain HTTP;
#   - while the job trains: state training, the iteration within the job,
#     every trainer alive with its last heartbeat, a history that grows;
#     trainer 1 killed (kill -9) past the first checkpoint: once the
#     supervisor restarted it and the oracle recovered, /status.json lists
#     the recovery (who, when, its moments), trainer 1's new pid, one
#     recovery on the trainer it names, and a new generation; every
#     embedding server's incarnation (hex) and a probe answer seconds ago;
#     embedding server 1 killed (kill -9): once the supervisor restarted
#     it, /status.json shows it with another incarnation and one restart
#     (the job recovers from its loss: sync_writes = false);
#   - after it: state done at the last iteration, and the JSON agrees with
#     summary.json (job id, iterations, test AUC and logloss, the tables and
#     their strategies, the checkpoints, the evaluations, the recovery), the history's
#     last point is the last iteration and every point has the phases; the
#     traffic floor of the cached tables is > 0 beside the rows fetched (the
#     summary's, and on the history's points); the checkpoints listed, each
#     complete, in progress or incomplete (then with what is missing and
#     why), the summary's last one complete with its start and end;
#   - when chromium is installed: the page opened headless (after its JS
#     ran) shows the state and iteration that /status.json shows, during
#     and after training, and the recovery, the floor and the rows fetched
#     (as /status.json has them), the last checkpoint complete, the
#     restarted server's incarnation; its screenshot is kept in $WORK
#     (with CHANTER_UPDATE_DOCS=1 also copied to docs/status-page.png)
#     (skipped, one line, without chromium);
#   - metrics.tls = true: the page and /metrics over HTTPS with the
#     daemon's certificate (plain HTTP refused), prometheus-config says
#     https and the CA; without a certificate the cluster does not start;
#   - the admin's actions: POST /action/checkpoint and /action/recover are
#     refused (403, saying why) over plain HTTP, with a trainer's
#     certificate and with none; with the admin's they ask for a
#     checkpoint and take a trainer for lost (the job recovers and ends
#     done), and every try is in the oracle's log with the caller's role.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=2000 eval_every=500 checkpoint_every=250 table_strategy=cache
W=$WORK/st
PY=/usr/bin/python3
CHROMIUM=$(command -v chromium || true)
on_exit() { job_down st; cleanup; }
trap on_exit EXIT

# get PATH OUT [METHOD]: the oracle's metrics port, PATH; the body in OUT,
# "STATUS CONTENT-TYPE" on stdout
get() {
  $PY - "$MPORT" "$1" "$2" "${3:-GET}" <<'PY'
import sys, urllib.request, urllib.error
port, path, out, method = sys.argv[1:5]
req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None)
try:
    r = urllib.request.urlopen(req, timeout=5)
    status, ctype, body = r.status, r.headers.get("Content-Type", ""), r.read()
except urllib.error.HTTPError as e:
    status, ctype, body = e.code, e.headers.get("Content-Type", ""), e.read()
open(out, "wb").write(body)
print(status, ctype)
PY
}
# sj EXPR [FILE]: a Python expression of d, the status JSON (default $WORK/s.json)
sj() { jf "${2:-$WORK/s.json}" "$1"; }
# until_state STATE N: /status.json says STATE within N tenths of a second
until_state() {
  for _ in $(seq 1 "$2"); do
    get /status.json "$WORK/s.json" >/dev/null 2>&1 && [ "$(sj "d['job']['state']")" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
# rendered NAME: the page opened headless after its JS ran (5 s of virtual
# time: three polls); its text in $WORK/NAME.dom, its screenshot in $WORK/NAME.png
rendered() {
  local url="http://127.0.0.1:$MPORT/"
  timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 --dump-dom "$url" \
    >"$WORK/$1.dom" 2>"$WORK/$1.chromium.log" &&
    timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 \
      --window-size=1280,1800 --screenshot="$WORK/$1.png" "$url" >>"$WORK/$1.chromium.log" 2>&1
}
# dom NAME ID: the text of the element with that id in $WORK/NAME.dom
dom() { sed -n "s|.*id=\"$2\"[^>]*>\([^<]*\)<.*|\1|p" "$WORK/$1.dom" | head -1; }

# ---- once the cluster is up
if ! job_up st; then nok "local up starts the cluster"; finish; exit 1; fi
MPORT=$(field "$W/run/oracle-0.ready" metrics_port)
JOB_ID=$(field "$W/run/oracle-0.ready" job_id)
read -r code ctype < <(get /status.json "$WORK/s.json")
[ "$code" = 200 ] && [ "$ctype" = application/json ] && [ "$(sj "d['job']['job_id']")" = "$JOB_ID" ] &&
  [ "$(sj "d['job']['state'] in ('waiting', 'training')")" = True ] &&
  [ "$(sj "0 <= d['job']['iteration'] <= d['job']['iterations'] == d['summary']['target_iterations'] == 2000")" = True ]
expect_rc $? "once the cluster is up: GET /status.json on the oracle's metrics port ($MPORT) is JSON: job $JOB_ID $(sj "d['job']['state']"), iteration $(sj "d['job']['iteration']") of 2000"

# (the page's snapshot is refreshed once a second: the oracle's address and
# the trainers' joins may come after the first fetch on a loaded machine)
check_daemons() {
  get /status.json "$WORK/s.json" >/dev/null 2>&1 &&
  $PY - "$WORK/s.json" "$W/job.ini" "$(pid_of "$W" trainer-0)" "$(pid_of "$W" trainer-1)" "$(pid_of "$W" oracle-0)" <<'PY'
import configparser, json, sys
d = json.load(open(sys.argv[1]))
ini = configparser.ConfigParser(); ini.read_string("[top]\n" + open(sys.argv[2]).read())
by = {}
for x in d["daemons"]: by.setdefault(x["role"], []).append(x)
assert [x["pid"] for x in by["oracle"]] == [int(sys.argv[5])], by["oracle"]
assert by["oracle"][0]["address"].startswith("127.0.0.1:") and not by["oracle"][0]["address"].endswith(":0"), by
assert sorted((x["rank"], x["pid"]) for x in by["trainer"]) == [(0, int(sys.argv[3])), (1, int(sys.argv[4]))], by
assert all(x["alive"] and x["seconds_since_heartbeat"] < 10 for x in by["trainer"]), by["trainer"]
emb = [a.strip() for a in ini["cluster"]["embedding"].split(",")]
dp = [a.strip() for a in ini["cluster"]["dataproc"].split(",")]
assert [x["address"] for x in by["embedding"]] == emb and [x["address"] for x in by["dataproc"]] == dp, (by, emb, dp)
PY
}
until_ok 100 check_daemons
expect "the daemons: the oracle (its pid, its address), both trainers with the pids local status shows, alive, and the embedding servers and data processor at the job file's addresses"

for path in / /status; do
  read -r code ctype < <(get "$path" "$WORK/page.html")
  [ "$code" = 200 ] && [ "$ctype" = "text/html; charset=utf-8" ] && grep -q 'fetch("/status.json"' "$WORK/page.html" &&
    ! grep -Eq '(src|href)=|@import|https?://|url\([^#]' "$WORK/page.html"
  expect "GET $path is one self-contained HTML page (no src, href, @import or url() but to its own #ids) that polls /status.json"
done
read -r code _ < <(get /status.json "$WORK/post.out" POST)
[ "$code" = 405 ]; expect "the page is read-only: POST /status.json is refused (405)"
read -r code _ < <(get /nope "$WORK/nope.out")
[ "$code" = 404 ]; expect "another path answers 404"
read -r code ctype < <(get /metrics "$WORK/metrics.txt")
[ "$code" = 200 ] && grep -q '^chanter_oracle_job_state [01]$' "$WORK/metrics.txt" && [ "${ctype%%;*}" = text/plain ]
expect "/metrics is served as before, in plain HTTP"

# ---- while it trains
job_train st &
TRAIN=$!
until_state training 300
expect "while the job trains, /status.json says training"
cp "$WORK/s.json" "$WORK/during.json"
$PY - "$WORK/during.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); j = d["job"]
assert 0 <= j["iteration"] <= j["iterations"] == 2000, j
assert j["generation"] > 0 and j["trainers"] == 2 and j["batch_size"] == 256, j
assert all(x["alive"] for x in d["daemons"] if x["role"] == "trainer"), d["daemons"]
assert set(d["cache"]) >= {"hit_rate", "lookahead", "slots_used", "rows_fetched", "rows_synced", "rows_written_back"}, d["cache"]
PY
expect "during training: the iteration within the job, generation, trainers alive, the cache's fields"
# a trainer lost mid-job (kill -9 past the first checkpoint): the supervisor
# restarts it and the oracle recovers the job in a new generation
until_iteration() { for _ in $(seq 1 "$2"); do
  get /status.json "$WORK/s.json" >/dev/null 2>&1 && [ "$(sj "d['job']['iteration'] >= $1")" = True ] && return 0
  sleep 0.1; done; return 1; }
until_iteration 300 300
GEN0=$(sj "d['job']['generation']")
KILLED=$(pid_of "$W" trainer-1)
kill -9 "$KILLED"
for _ in $(seq 1 600); do
  get /status.json "$WORK/s.json" >/dev/null 2>&1 &&
    [ "$(sj "len(d['summary']['recoveries']) == 1 and d['job']['state'] == 'training' and d['job']['generation'] != $GEN0")" = True ] && break
  sleep 0.1
done
# (the recovery names the trainer whose Work stream the oracle saw break
# first: the one killed, or its peer, whose collective broke with it)
$PY - "$WORK/s.json" "$KILLED" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); r = d["summary"]["recoveries"]
assert len(r) == 1 and r[0]["who"] in ("trainer-0", "trainer-1") and r[0]["detected_unix"] > 0 and r[0]["resumed_s"] >= 0, r
t = {x["rank"]: x for x in d["daemons"] if x["role"] == "trainer"}
assert t[int(r[0]["who"][-1])]["recoveries"] == 1 and t[1]["pid"] != int(sys.argv[2]), t
assert d["job"]["state"] == "training", d["job"]
PY
expect_rc $? "trainer-1 killed at iteration $(sj "d['summary']['recoveries'][0]['iterations_done']"): /status.json lists the recovery with its moments (resumed after $(sj "d['summary']['recoveries'][0]['resumed_s']") s), trainer 1's new pid and its recovery, generation $GEN0 -> $(sj "d['job']['generation']"), training again"

# embedding server 1 killed: the supervisor restarts it (another incarnation),
# the oracle's probe sees it and the job recovers (sync_writes = false)
# emb EXPR: a Python expression of e, embedding server 1 in $WORK/s.json
emb() { sj "[x for x in d['daemons'] if x['role'] == 'embedding' and x['rank'] == 1][0]$1"; }
incs_known() {
  get /status.json "$WORK/s.json" >/dev/null 2>&1 &&
    [ "$(sj "all(len(x['incarnation']) == 16 and x['seconds_since_answer'] < 10 for x in d['daemons'] if x['role'] == 'embedding')")" = True ]
}
until_ok 100 incs_known
expect_rc $? "every embedding server has its incarnation on /status.json (server 1: $(emb "['incarnation']"), $(emb "['restarts']") restarts, answered the probe $(emb "['seconds_since_answer']") s ago)"
INC0=$(emb "['incarnation']")
GEN1=$(sj "d['job']['generation']")
kill -9 "$(pid_of "$W" embedding-1)"
inc_changed() {
  get /status.json "$WORK/s.json" >/dev/null 2>&1 &&
    [ "$(sj "[x['incarnation'] not in ('', '$INC0') and x['restarts'] == 1 and x['seconds_since_answer'] < 10 for x in d['daemons'] if x['role'] == 'embedding' and x['rank'] == 1][0]")" = True ] &&
    [ "$(sj "d['job']['state'] == 'training' and d['job']['generation'] != $GEN1")" = True ]
}
until_ok 600 inc_changed
expect_rc $? "embedding server 1 killed: /status.json shows it restarted, incarnation $INC0 -> $(emb "['incarnation']"), $(emb "['restarts']") restart, answering the probe again, and the job training again (generation $GEN1 -> $(sj "d['job']['generation']"), recovered from the loss of $(sj "d['summary']['recoveries'][-1]['who']"))"
INC1=$(emb "['incarnation']")
sleep 1
get /status.json "$WORK/s.json" >/dev/null
before=$(sj "d['job']['iteration']")
if [ -n "$CHROMIUM" ] && [ "$(sj "d['job']['state']")" = training ]; then
  rendered during
  get /status.json "$WORK/s.json" >/dev/null
  after=$(sj "d['job']['iteration']")
  st=$(dom during state); it=$(dom during iteration)
  { [ "$st" = training ] || [ "$st" = done ]; } && [ -n "$it" ] && [ "$it" -ge "$before" ] && [ "$it" -le "$after" ]
  expect "the page in headless chromium, during training, shows state $st and iteration $it (/status.json: $before..$after)"
elif [ -z "$CHROMIUM" ]; then
  skip "chromium is not installed: the rendered page is not checked"
fi
wait $TRAIN
expect_rc $? "the job trains to the end"

# ---- after it
until_state done 50
expect "after the job, /status.json says done"
$PY - "$WORK/s.json" "$W/summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2])); j = d["job"]; m = d["summary"]
assert j["iteration"] == j["iterations"] == s["iterations"] == 2000, (j, s["iterations"])
assert j["job_id"] == s["job_id"] and j["state"] == s["state"] == "done", (j, s["state"])
assert j["test_auc"] == s["test_auc"] and j["test_logloss"] == s["test_logloss"], (j, s["test_auc"])
for k in ("tables", "checkpoints", "checkpoint", "evals", "recoveries", "iterations", "dense_sha256"):
    assert m[k] == s[k], (k, m[k], s[k])
assert [t["strategy"] for t in m["tables"]] and all(t["why"] for t in m["tables"]), m["tables"]
assert s["checkpoints"] >= 1 and m["checkpoint"]["iteration"] >= 1999, m["checkpoint"]
assert len(m["evals"]) == 4, m["evals"]
pts = d["history"]["points"]
assert 2 <= len(pts) <= d["history"]["max_points"] and pts[-1]["iteration"] == 2000, pts[-3:]
assert all(p2["t"] > p1["t"] for p1, p2 in zip(pts, pts[1:])), "history not in time order"
assert any(p["phases"]["total"] and p["phases"]["total"] > 0 for p in pts), pts
c = d["cache"]
assert c["floor_rows"] > 0 and c["rows_fetched"] >= 0 and c["floor_rows"] == s["floor_rows"], (c, s["floor_rows"])
assert abs(c["floor_first_use"] + c["floor_shared"] - c["floor_rows"]) < 1e-6 * c["floor_rows"], c
assert 0 < c["floor_iterations"] <= 2000 and "cached tables only" in c["floor_of"], c
assert any(p["floor_rows"] and p["floor_rows"] > 0 for p in pts), [p["floor_rows"] for p in pts]
ck = d["checkpoints"]
assert ck and all(k["state"] in ("complete", "in_progress", "incomplete") for k in ck), ck
assert all(k["missing"] and k["note"] for k in ck if k["state"] == "incomplete"), ck
assert all(not k["missing"] and k["started"] <= k["finished"] for k in ck if k["state"] == "complete" and k["finished"]), ck
last = [k for k in ck if k["id"] == s["checkpoint"]["id"] and k["state"] == "complete"]
assert last and last[-1]["iteration"] == s["checkpoint"]["iteration"] and last[-1]["started"] > 0 and last[-1]["finished"] > 0, (ck, s["checkpoint"])
assert not [k for k in ck if k["state"] == "in_progress"], ck
PY
expect "after the job /status.json agrees with summary.json (job id, 2000 iterations, test AUC, tables, checkpoints, evaluations, the traffic floor) and its history ends at the last iteration"
n_ck() { sj "'%d complete, %d incomplete' % (sum(k['state'] == 'complete' for k in d['checkpoints']), sum(k['state'] == 'incomplete' for k in d['checkpoints']))"; }
echo "# after the job: floor $(sj "round(d['cache']['floor_rows'], 1)") rows per iteration (cached tables) beside $(sj "round(d['cache']['rows_fetched'], 1)") fetched; checkpoints listed: $(n_ck); embedding server 1: incarnation $(emb "['incarnation']"), $(emb "['restarts']") restart"
sj "'\n'.join('#   incomplete: %s after iteration %d: missing %s; %s' % (k['id'], k['iteration'], k['missing'], k['note']) for k in d['checkpoints'] if k['state'] == 'incomplete')"

if [ -n "$CHROMIUM" ]; then
  rendered after
  st=$(dom after state); it=$(dom after iteration); its=$(dom after iterations)
  [ "$st" = done ] && [ "$it" = 2000 ] && [ "$its" = 2000 ] && [ -s "$WORK/after.png" ] &&
    [ "$(dom after job_id)" = "$JOB_ID" ] && grep -q '<path d="M' "$WORK/after.dom" &&
    grep -Eq '<td>trainer-[01]</td>' "$WORK/after.dom"
  rc=$?
  expect_rc $rc "the page in headless chromium after the job shows state $st, iteration $it / $its, job $JOB_ID, its charts and the recovery (screenshot $WORK/after.png)"
  # the floor and the rows fetched as the page formats them (fmt: 1234 -> 1234, 12345 -> 12.3k)
  $PY - "$WORK/s.json" "$(dom after floor_rows)" "$(dom after rows_fetched)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); c = d["cache"]
def val(t):
    return float(t[:-1]) * 1e3 if t.endswith("k") else float(t[:-1]) * 1e6 if t.endswith("M") else float(t)
for k, t in (("floor_rows", sys.argv[2]), ("rows_fetched", sys.argv[3])):
    assert abs(val(t) - c[k]) <= max(0.5, 0.006 * c[k]), (k, t, c[k])
PY
  expect_rc $? "the page shows the traffic floor $(dom after floor_rows) beside the rows fetched $(dom after rows_fetched) per iteration, as /status.json has them"
  grep -q "<td>$(sj "d['summary']['checkpoint']['id']")</td><td class=\"num\">[0-9]*</td><td class=\"alive\">complete</td>" "$WORK/after.dom" &&
    grep -q "<td>$INC1</td>" "$WORK/after.dom" && grep -q 'stroke-dasharray' "$WORK/after.dom"
  expect_rc $? "the page lists the last checkpoint complete, embedding server 1's new incarnation $INC1, and draws the floor (dashed)"
  [ $rc -eq 0 ] || tail -5 "$WORK/after.chromium.log" | sed 's/^/#   /'
  # CHANTER_UPDATE_DOCS=1 refreshes the README's screenshot; otherwise the test leaves the tree as it was
  if [ "${CHANTER_UPDATE_DOCS:-0}" = 1 ] && [ -s "$WORK/after.png" ]; then cp "$WORK/after.png" "$ROOT/docs/status-page.png"; fi
else
  skip "chromium is not installed: the rendered page is not checked"
fi

# ---- metrics.tls: the page and every /metrics over HTTPS with the
# daemon's own certificate (the cluster's mutual-TLS certificates); the
# admin's actions
read -r code _ < <(get /action/checkpoint "$WORK/plain-action.out" POST)
[ "$code" = 403 ] && grep -q "no verified client certificate" "$WORK/plain-action.out"
expect_rc $? "over plain HTTP an action is refused (403): $(head -1 "$WORK/plain-action.out")"
job_down st
if job_up tls --set metrics.tls=true --set iterations=1500 --set checkpoint_every=0; then
  WT=$WORK/tls
  CA=$WT/certs/ca.pem
  TPORT=$(field "$WT/run/oracle-0.ready" metrics_port)
  EPORT=$(field "$WT/run/embedding-0.ready" metrics_port)
  curl -sf --cacert "$CA" "https://127.0.0.1:$TPORT/status.json" -o "$WORK/tls.json" &&
    [ -n "$(jf "$WORK/tls.json" "d['job']['job_id']")" ] &&
    curl -sf --cacert "$CA" "https://127.0.0.1:$EPORT/metrics" | grep -q '^chanter_embedding_up 1' &&
    ! curl -sf --max-time 5 "http://127.0.0.1:$TPORT/status.json" -o /dev/null &&
    ! curl -sf --max-time 5 "https://127.0.0.1:$TPORT/status.json" -o /dev/null
  expect "metrics.tls = true: /status.json and /metrics answer over HTTPS with the daemon's certificate (the job's CA verifies it); plain HTTP and an unverified client get nothing"
  "$CHANTER" prometheus-config --workdir "$WT" >"$WORK/tls.yml" &&
    grep -q "scheme: https" "$WORK/tls.yml" && grep -q "ca_file: '.*ca.pem'" "$WORK/tls.yml"
  expect "prometheus-config of a metrics.tls cluster scrapes with https and the job's CA"
  # post ACTION ROLE|none OUT: the HTTP status of POST /action/ACTION
  post() {
    local certs=()
    [ "$2" != none ] && certs=(--cert "$WT/certs/$2.pem" --key "$WT/certs/$2.key")
    curl -s --cacert "$CA" "${certs[@]}" -X POST -o "$3" -w '%{http_code}' "https://127.0.0.1:$TPORT/action/$1"
  }
  until_ok 200 bash -c "curl -s --cacert '$CA' https://127.0.0.1:$TPORT/status.json | grep -q '\"state\": \"training\"'"
  c1=$(post checkpoint trainer "$WORK/a1.out"); c2=$(post checkpoint none "$WORK/a2.out")
  [ "$c1" = 403 ] && grep -q "the caller's certificate says trainer" "$WORK/a1.out" &&
    [ "$c2" = 403 ] && grep -q "no verified client certificate" "$WORK/a2.out"
  expect_rc $? "an action without the admin role is refused (403): trainer's certificate: $(head -1 "$WORK/a1.out"); none: $(head -1 "$WORK/a2.out")"
  c3=$(post checkpoint admin "$WORK/a3.out")
  [ "$c3" = 202 ] && until_ok 100 grep -q "status page (admin): checkpoint .* requested" "$WT/logs/oracle-0.log" &&
    grep -q "metrics http action path=/action/checkpoint arg= role=admin status=202" "$WT/logs/oracle-0.log" &&
    grep -q "metrics http action refused path=/action/checkpoint role=trainer" "$WT/logs/oracle-0.log"
  expect_rc $? "the admin's checkpoint button (202) asks the oracle for a checkpoint, and every try is logged with the caller's role: $(grep -o 'status page (admin): checkpoint[^(]*' "$WT/logs/oracle-0.log" | head -1)"
  until_ok 300 grep -q "checkpoint complete" "$WT/logs/oracle-0.log"   # the button's checkpoint first
  c4=$(post "recover?arg=1" admin "$WORK/a4.out")
  [ "$c4" = 202 ] && job_train tls && python3 - "$WT/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["state"] == "done" and s["checkpoints"] >= 2, (s["state"], s["checkpoints"])
assert any("drill" in json.dumps(r) for r in s["recoveries"]), s["recoveries"]
assert s["checkpoint"]["iteration"] == 1499, s["checkpoint"]
PY
  expect_rc $? "the admin's drill button (202) takes trainer 1 for lost: the job recovers (from the button's checkpoint: $(grep -o 'rolled back to checkpoint [^ ]*' "$WT/logs/oracle-0.log" | head -1)) and ends done"
  job_down tls
else
  nok "local up with metrics.tls = true: $(tail -3 "$WORK/tls.up" | tr '\n' ' ')"
fi
C --set metrics.tls=true --set tls.cert_file= --set tls.key_file= --set tls.ca_file= local up --insecure --workdir "$WORK/notls" >"$WORK/notls.up" 2>&1
rc=$?
C local down --workdir "$WORK/notls" >/dev/null 2>&1
[ $rc -ne 0 ] && grep -q "metrics.tls = true" "$WORK/notls.up"
expect_rc $? "metrics.tls without a certificate: the cluster does not come up, and says why: $(grep -m1 -o 'metrics.tls = true[^;]*' "$WORK/notls.up" | head -1)"

finish
