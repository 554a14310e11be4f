#!/usr/bin/env bash
# Integration: `chanter certs` makes a job CA and role certificates that
# OpenSSL verifies and that our mutual TLS accepts: a real embedding server
# with tls.* answers a client holding a certificate of the job's CA, and
# refuses one without a certificate and one whose certificate comes from
# another CA.  Bad input is refused with a sentence; nothing is overwritten.
source "$(dirname "$0")/lib.sh"

CT=$WORK/ca
C certs init --dir "$CT" >"$WORK/init.out" 2>&1
check "certs init makes ca.pem and ca.key" [ -s "$CT/ca.pem" ] && [ -s "$CT/ca.key" ]
check "  the CA key is readable by its owner only (0600)" [ "$(stat -c %a "$CT/ca.key")" = 600 ]
openssl x509 -in "$CT/ca.pem" -noout -ext basicConstraints 2>/dev/null | grep -q "CA:TRUE"
expect "  it is a CA (basicConstraints CA:TRUE)"
C certs init --dir "$CT" >/dev/null 2>"$WORK/init2.err"; rc=$?
[ $rc -ne 0 ] && grep -q "already holds a CA" "$WORK/init2.err"
expect_rc $? "certs init refuses to overwrite an existing CA: $(head -1 "$WORK/init2.err" | cut -c1-90)"

for r in trainer oracle embedding dataproc admin; do
  C certs issue --dir "$CT" --role $r --name "$r-0" --host "10.0.0.7,$r.example.internal" >/dev/null 2>&1 &&
    openssl verify -CAfile "$CT/ca.pem" "$CT/$r-0.pem" >/dev/null 2>&1 &&
    openssl x509 -in "$CT/$r-0.pem" -noout -ext subjectAltName | grep -q "URI:chanter://role/$r" &&
    openssl x509 -in "$CT/$r-0.pem" -noout -ext subjectAltName | grep -q "IP Address:10.0.0.7" &&
    openssl x509 -in "$CT/$r-0.pem" -noout -ext subjectAltName | grep -q "DNS:$r.example.internal" &&
    openssl x509 -in "$CT/$r-0.pem" -noout -ext extendedKeyUsage | grep -q "Client Authentication"
  expect "certs issue --role $r: OpenSSL verifies it against the CA; the role is its SAN URI chanter://role/$r, with the hosts"
done
check "  its key is 0600" [ "$(stat -c %a "$CT/trainer-0.key")" = 600 ]

bad() { # name expected-text args...
  local n=$1 want=$2; shift 2
  C certs "$@" >/dev/null 2>"$WORK/bad.err"; local rc=$?
  [ $rc -ne 0 ] && grep -q "$want" "$WORK/bad.err"
  expect_rc $? "$n: $(head -1 "$WORK/bad.err" | cut -c1-100)"
}
bad "an unknown role is refused" "one of trainer, oracle" issue --dir "$CT" --role root --name x
bad "a name that is not a host or tool name is refused" "use a host or tool name" issue --dir "$CT" --role admin --name "../x"
bad "issuing without a CA says to run init" "certs init --dir" issue --dir "$WORK/none" --role admin --name x
bad "an existing certificate is not overwritten" "remove it first" issue --dir "$CT" --role admin --name admin-0
bad "a missing subcommand is a usage error" "expected init or issue"

# ---- the certificates with our mutual TLS: an embedding server and the CLI
C certs issue --dir "$CT" --role embedding --name emb >/dev/null 2>&1
C certs init --dir "$WORK/other" >/dev/null 2>&1 && C certs issue --dir "$WORK/other" --role admin --name cli >/dev/null 2>&1
cat >"$WORK/job.ini" <<INI
embedding_servers = 1
[tls]
ca_file = $CT/ca.pem
cert_file = $CT/emb.pem
key_file = $CT/emb.key
INI
start_embedding 0 "$WORK/job.ini" --data-dir "$WORK/emb" || nok "the TLS embedding server did not start"
P=${EMB_PORT[0]}
TLS=(--set tls.ca_file="$CT/ca.pem")
E() { C --set cluster.embedding=127.0.0.1:$P --set embedding_servers=1 --set rpc.timeout_ms=2000 "$@"; }
E "${TLS[@]}" --set tls.cert_file="$CT/admin-0.pem" --set tls.key_file="$CT/admin-0.key" embedding stats >"$WORK/ok.out" 2>&1
expect_rc $? "a server with the job's certificates answers a client holding an admin certificate of the job's CA"
E embedding stats >/dev/null 2>"$WORK/nocert.err"; rc=$?
[ $rc -ne 0 ]; expect "  and refuses a client without TLS: $(tail -1 "$WORK/nocert.err" | cut -c1-90)"
E "${TLS[@]}" --set tls.cert_file="$WORK/other/cli.pem" --set tls.key_file="$WORK/other/cli.key" embedding stats \
  >/dev/null 2>"$WORK/other.err"; rc=$?
[ $rc -ne 0 ]; expect "  and refuses a client whose certificate comes from another CA"
finish
