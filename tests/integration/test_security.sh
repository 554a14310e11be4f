#!/usr/bin/env bash
# Integration: a cluster started with the defaults (`chanter local up`)
# speaks mutual TLS and checks roles.  `local up` makes a CA and a
# certificate per role in W/certs and names them in job.ini; every daemon
# logs tls=on authz=roles.  authz_probe.py calls every method of every
# service in proto/*.proto on every daemon that serves it: plaintext,
# TLS without a client certificate and a certificate of another CA are
# refused by the transport on all of them; a certificate of the job's CA
# with the wrong role gets PERMISSION_DENIED on each method that role may
# not reach, naming the roles needed and the caller's; harmless methods a
# role may call are answered; a certificate of the job's CA that names no
# role gets PERMISSION_DENIED everywhere.  Each daemon counts its refusals
# (chanter_<daemon>_rpc_denied_total = what the probe got) and logs them;
# no trainer and not the CLI is refused.  A 20M-key Lookup (160 MB) without
# a certificate, or from a role that may not call Lookup, is refused before
# the server reads it (its memory grows by less than 8 MB).  The job's own
# daemons train as before: the digest equals a plaintext run's (`local up
# --insecure`, no certificates) bit for bit; `local down` stops each
# cluster.  Configurations that would listen off loopback in plaintext (a
# daemon's --listen, a job's cluster addresses) are refused unless
# tls.insecure or TLS certificates are given.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
# (learning_rate, eval_every and embedding.hot_mb: chanter's defaults)
job_preamble "$JOB" iterations=300 batch_size=128 eval_batches=4 synthetic.samples=60000 model.bottom_mlp=16 \
  model.top_mlp=16 -learning_rate -eval_every -embedding.hot_mb
S=$WORK/sec     # the cluster with the defaults (mutual TLS)
P=$WORK/plain   # the same job, plaintext: the reference
TRAIN_ARGS=     # chanter train without --quiet
PY=/usr/bin/python3
down_all() {
  for d in "$S" "$P"; do [ -f "$d/pids" ] && "$BIN/chanter" local down --workdir "$d" >/dev/null 2>&1; done
}
on_exit() { down_all; cleanup; }
trap on_exit EXIT
# show FILE [N]: the last N lines of FILE, indented, for a failure
show() { [ -f "$1" ] && tail -n "${2:-15}" "$1" | sed "s|^|#   $(basename "$1"): |"; }
# denied_total READY_FILE: the daemon's chanter_*_rpc_denied_total ("missing" if absent)
denied_total() {
  $PY - "$1" <<'PY'
import json, re, sys, urllib.request
port = json.load(open(sys.argv[1]))["metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
m = re.search(r"^chanter_\w+_rpc_denied_total(?:\{[^}]*\})? (\d+)", text, re.M)
print(m.group(1) if m else "missing")
PY
}
# verdict STATUS NAME: expect_rc, and returns STATUS (for "|| show ...")
verdict() { expect_rc "$1" "$2"; return "$1"; }

# ---- the cluster with the defaults
job_up sec
verdict $? "local up with the defaults starts the cluster" || show "$WORK/sec.up"
ls "$S"/certs/{ca,trainer,oracle,embedding,dataproc,admin}.pem >/dev/null 2>&1 &&
  grep -q "^ca_file = $S/certs/ca.pem" "$S/job.ini" &&
  grep -q "^cert_file = $S/certs/{role}.pem" "$S/job.ini" &&
  grep -q "^key_file = $S/certs/{role}.key" "$S/job.ini"
verdict $? "it made a CA and a certificate per role in W/certs and named them in job.ini ({role})" ||
  { ls -l "$S/certs"; grep -A4 '^\[tls\]' "$S/job.ini"; }
nosec=""
for l in "$S"/logs/{oracle,embedding,dataproc}-*.log; do
  grep -q "rpc server listening .*tls=on authz=roles" "$l" || nosec="$nosec $(basename "$l")"
done
[ -z "$nosec" ]; expect "every daemon serves mutual TLS with roles checked (log: tls=on authz=roles)${nosec:+; not:$nosec}"

# another CA and an admin certificate of it: must open nothing
"$BIN/chanter" certs init --dir "$WORK/other" >/dev/null 2>&1 &&
  "$BIN/chanter" certs issue --dir "$WORK/other" --role admin --name admin >/dev/null 2>&1
expect "another CA with an admin certificate (chanter certs)"
# a certificate of the job's own CA that names no role (no chanter://role/ URI)
NR=$WORK/norole
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$NR.key" -subj "/O=chanter/CN=norole" \
  -out "$NR.csr" >"$WORK/openssl.log" 2>&1 &&
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=clientAuth,serverAuth\n' >"$NR.ext" &&
  openssl x509 -req -in "$NR.csr" -CA "$S/certs/ca.pem" -CAkey "$S/certs/ca.key" -CAcreateserial -CAserial "$WORK/ca.srl" \
    -days 1 -extfile "$NR.ext" -out "$NR.pem" >>"$WORK/openssl.log" 2>&1
verdict $? "a certificate of the job's CA without a role (openssl)" || show "$WORK/openssl.log"

# ---- the probe, while the job trains
t0=$SECONDS
$PY "$ROOT/tests/integration/authz_probe.py" "$S" "$WORK/other" "$WORK/denied.json" "$NR" >"$WORK/probe.out" 2>"$WORK/probe.err"
prc=$?
grep -qs "job done" "$S/logs/oracle-0.log" && echo "# note: the job had ended before the probe did (it ran alongside part of it only)"
n_tap=0 n_bad=0
while IFS= read -r line; do
  case "$line" in
    "ok - "*) ok "probe: ${line#ok - }"; n_tap=$((n_tap + 1)) ;;
    "not ok - "*) nok "probe: ${line#not ok - }"; n_tap=$((n_tap + 1)) n_bad=$((n_bad + 1)) ;;
    *) echo "$line" ;;
  esac
done <"$WORK/probe.out"
# it ran to its end: exit 0, or 1 having said which checks failed (else it crashed)
{ [ $prc -eq 0 ] && [ $n_bad -eq 0 ] || { [ $prc -eq 1 ] && [ $n_bad -gt 0 ]; }; } && [ $n_tap -gt 20 ] && [ -s "$WORK/denied.json" ]
verdict $? "the probe ran to its end ($n_tap checks, $((SECONDS - t0)) s, exit $prc)" || show "$WORK/probe.err" 30

# ---- the job's own daemons work as before: the job trains to its end
job_train sec
rc=$?
[ $rc -eq 0 ] && [ "$(field "$S/summary.json" iterations 2>/dev/null)" = 300 ]
verdict $? "the job trains to its end on the mutual-TLS cluster while the probe runs (exit $rc)" ||
  { show "$WORK/sec.err"; show "$S/logs/oracle-0.log"; show "$S/logs/trainer-0.log"; }

# ---- every refusal counted and logged by the daemon that made it (after the
# job, so the job's own calls count too: none of them may be refused)
for ready in "$S"/run/{oracle,embedding,dataproc}-*.ready; do
  name=$(basename "$ready" .ready)
  want=$($PY -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 'none'))" "$WORK/denied.json" "$name" 2>/dev/null)
  got=$(denied_total "$ready" 2>&1 | tail -1)
  [ -n "$want" ] && [ "$want" != none ] && [ "$got" = "$want" ]
  expect "$name: rpc_denied_total = $got, the PERMISSION_DENIED answers the probe got: $want"
  log=$S/logs/$name.log
  if [ "${want:-0}" != 0 ] && [ "$want" != none ]; then
    grep -Eq "WARN: refused a call \(PERMISSION_DENIED\) method=/chanter\.[a-z]+\.v1\.[A-Za-z]+/[A-Za-z]+ .*role=(trainer|oracle|embedding|dataproc|admin|none)\b" "$log"
    verdict $? "  and its log says so, naming the method and the role: $(grep -m1 -o 'refused a call.*role=[a-z]*' "$log" | sed 's/ peer=[^ ]*//')"
  else
    ! grep -q "refused a call" "$log"
    expect "  and its log has no refusal"
  fi
done
# the trainers and the CLI were never refused either
! grep -l "PERMISSION_DENIED" "$S"/logs/trainer-*.log "$WORK/sec.err" 2>/dev/null | grep -q .
expect "no trainer and not the CLI (admin) was refused PERMISSION_DENIED"

# ---- amplification: a 20M-key Lookup (160 MB) from a client without a job
# certificate, or with a role that may not call Lookup, is refused before
# the server reads it: its resident memory grows by less than 8 MB (each
# case sent twice; the first TLS refusal warms gRPC's own buffers).  A
# role that may call Lookup still makes gRPC 1.51 buffer the message
# before its length is checked: printed, not asserted.
$PY - "$S" >"$WORK/big.out" 2>&1 <<'PY'
import grpc, json, sys
W = sys.argv[1]
r = json.load(open(f"{W}/run/embedding-0.ready"))
pid, addr = r["pid"], f"127.0.0.1:{r['rpc_port']}"
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
def rd(p):
    return open(p, "rb").read()
ca = rd(f"{W}/certs/ca.pem")
big = bytes(8 * 20_000_000)
for who in ("none", "none", "dataproc", "dataproc", "embedding", "trainer"):
    cr = grpc.ssl_channel_credentials(ca) if who == "none" else \
        grpc.ssl_channel_credentials(ca, rd(f"{W}/certs/{who}.key"), rd(f"{W}/certs/{who}.pem"))
    ch = grpc.secure_channel(addr, cr, options=[("grpc.max_send_message_length", -1)])
    r0 = rss()
    try:
        ch.unary_unary("/chanter.embedding.v1.Embedding/Lookup")(big, timeout=60)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    print(who, code, rss() - r0, flush=True)
    ch.close()
PY
cat "$WORK/big.out" | sed 's/^/# 20M-key Lookup: role, answer, server VmRSS growth (kB): /'
awk '$1=="none" && $2=="UNAVAILABLE" {n++; g=$3} END {exit !(n==2 && g<8192)}' "$WORK/big.out"
expect_rc $? "a 20M-key Lookup (160 MB) without a certificate is refused at the handshake, the server growing < 8 MB: $(awk '$1=="none"{g=$3} END{print g}' "$WORK/big.out") kB"
awk '$1=="dataproc" && $2=="PERMISSION_DENIED" {n++; g=$3} END {exit !(n==2 && g<8192)}' "$WORK/big.out"
expect_rc $? "a 20M-key Lookup (160 MB) from a role that may not call it is refused before it is read, the server growing < 8 MB: $(awk '$1=="dataproc"{g=$3} END{print g}' "$WORK/big.out") kB"
echo "# a trainer's 20M-key Lookup (gRPC 1.51 reads it whole before refusing it): $(awk '$1=="trainer"{print $2", +"$3" kB"}' "$WORK/big.out")"

job_down sec
none_alive "$WORK/sec.pids"; expect "local down stops the mutual-TLS cluster"

# ---- the same job in plaintext: the reference
UP_ARGS=--insecure job_up plain
verdict $? "local up --insecure starts the same job in plaintext" || show "$WORK/plain.up"
[ ! -e "$P/certs" ] && ! grep -Eq '^(cert_file|ca_file) = .' "$P/job.ini" && grep -q "tls=off authz=off" "$P/logs/oracle-0.log"
expect "  without certificates: no W/certs, no tls.* files, the daemons serve plaintext"
job_train plain
verdict $? "  and trains to its end" || { show "$WORK/plain.err"; show "$P/logs/oracle-0.log"; }
job_down plain
none_alive "$WORK/plain.pids"; expect "  local down stops it"
dsec=$(field "$S/summary.json" digest 2>/dev/null); dplain=$(field "$P/summary.json" digest 2>/dev/null)
[ -n "$dsec" ] && [ "$dsec" = "$dplain" ] &&
  [ "$(field "$S/summary.json" dense_sha256)" = "$(field "$P/summary.json" dense_sha256)" ]
expect "the job on mutual TLS (probed meanwhile) ends with the plaintext run's digest bit for bit: ${dsec:0:16} = ${dplain:0:16}"

# ---- configurations that would listen off loopback in plaintext
DJ=$WORK/dp.ini
printf 'dataprocs = 1\n[synthetic]\nsamples = 2000\n' >"$DJ"
timeout 20 "$BIN/chanter-dataproc" --config "$DJ" --index 0 --listen 0.0.0.0:0 --ready-file "$WORK/dp0.ready" \
  >"$WORK/dp0.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e "$WORK/dp0.ready" ] && grep -q "not a loopback address" "$WORK/dp0.log" &&
  grep -q "tls.insecure" "$WORK/dp0.log"
verdict $? "a daemon asked to listen on 0.0.0.0 without TLS exits (status $rc): $(grep -m1 -o 'refusing.*loopback address' "$WORK/dp0.log")" ||
  show "$WORK/dp0.log"
"$BIN/chanter-dataproc" --config "$DJ" --index 0 --listen 0.0.0.0:0 --set tls.insecure=true \
  --ready-file "$WORK/dp1.ready" >"$WORK/dp1.log" 2>&1 &
dpid=$!
PIDS+=("$dpid")
for _ in $(seq 1 200); do [ -f "$WORK/dp1.ready" ] || ! running $dpid && break; sleep 0.05; done
[ -f "$WORK/dp1.ready" ] && running $dpid && grep -q "rpc server listening addr=0.0.0.0:0 .*tls=off" "$WORK/dp1.log"
verdict $? "  with --set tls.insecure=true it starts, plaintext on 0.0.0.0" || show "$WORK/dp1.log"
kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
"$BIN/chanter" --set cluster.embedding=127.0.0.1:7100,10.0.0.2:7100 config show >/dev/null 2>"$WORK/cfg.err"
rc=$?
[ $rc -ne 0 ] && grep -q "cluster.embedding" "$WORK/cfg.err" && grep -q "entry 1 '10.0.0.2:7100'" "$WORK/cfg.err" &&
  grep -q "not a loopback address" "$WORK/cfg.err" && grep -q "tls.insecure" "$WORK/cfg.err"
verdict $? "a job naming a non-loopback address without TLS is refused naming the key and the entry: $(head -1 "$WORK/cfg.err" | cut -c1-120)" ||
  show "$WORK/cfg.err"
"$BIN/chanter" --set cluster.embedding=127.0.0.1:7100,10.0.0.2:7100 --set tls.insecure=true config show >/dev/null 2>"$WORK/cfg2.err"
verdict $? "  accepted with tls.insecure = true" || show "$WORK/cfg2.err"
"$BIN/chanter" --set cluster.embedding=127.0.0.1:7100,10.0.0.2:7100 --set tls.ca_file="$S/certs/ca.pem" \
  --set "tls.cert_file=$S/certs/{role}.pem" --set "tls.key_file=$S/certs/{role}.key" config show >/dev/null 2>"$WORK/cfg3.err"
verdict $? "  and accepted with TLS certificates" || show "$WORK/cfg3.err"
finish
