#!/usr/bin/python3
"""Probes every method of every daemon of a `chanter local up` cluster for
who may call it.  Prints TAP-style lines; exits 1 if any check failed.

usage: authz_probe.py WORKDIR OTHER_DIR COUNTS_JSON [NOROLE]
  WORKDIR      the cluster's work directory: run/*.ready (ports) and certs/
               (ca.pem and one certificate per role, as `local up` makes them)
  OTHER_DIR    a CA of its own with admin.pem/admin.key (`chanter certs`):
               a certificate the job's daemons must not accept
  COUNTS_JSON  written: {daemon name: PERMISSION_DENIED answers it gave}
  NOROLE       optional: NOROLE.pem/NOROLE.key, a certificate of the job's CA
               that names no role (no chanter://role/ URI)

The methods come from proto/*.proto (all but testing.proto): `rpc Name(`
lines, `stream` marking streaming sides.  Calls are raw (no stubs): an
empty message, or an empty request stream.  Each method is called on each
daemon serving it:
  (a) plaintext, (b) TLS without a client certificate, (c) a certificate of
      another CA: each must be refused by the transport (UNAVAILABLE or
      UNAUTHENTICATED), never answered;
  (d) with each role's certificate of the job's CA: a method the role may
      not call -> PERMISSION_DENIED naming the method, the roles it needs
      and the caller's role.  Methods the role may call are called only if
      harmless (reads; HARMLESS below) and must not be refused;
  (e) with NOROLE: every method -> PERMISSION_DENIED naming the method.
The table of who may call what is written here on purpose, independently
of common/authz.c: the two must agree.
"""
import glob
import json
import os
import re
import sys

import grpc

W, OTHER, COUNTS = sys.argv[1], sys.argv[2], sys.argv[3]
NOROLE = sys.argv[4] if len(sys.argv) > 4 else None
PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
ROLES = ("trainer", "oracle", "embedding", "dataproc", "admin")
ANY = frozenset(ROLES)
TIMEOUT = 5.0

# Who may call what: service (the proto package's middle name, which is the
# daemon's kind) -> method -> roles.
ALLOWED = {
    "embedding": {
        # admin: resharding on resume, `chanter embedding write`; embedding: a Reshape's rows to their new owners
        "WriteBack": {"trainer", "admin", "embedding"},
        "Lookup": {"trainer", "oracle", "admin"},
        **{m: {"oracle", "admin"} for m in
           ("Checkpoint", "Restore", "Clear", "Fence", "SealCheckpoint", "DeleteCheckpoint", "Reshape")},
        "PutBlob": {"oracle", "admin", "trainer"},
        "GetBlob": {"oracle", "admin", "trainer"},
        **{m: ANY for m in ("ListCheckpoints", "GetManifest", "Digest", "Stats")},
    },
    "oracle": {
        **{m: {"trainer"} for m in ("Join", "Heartbeat", "KvSet", "KvGet", "Work")},
        "Status": ANY,
        **{m: {"admin"} for m in ("Stop", "Start", "Checkpoint", "Scale")},
    },
    "dataproc": {m: ANY for m in ("GetBatch", "StreamBatches", "Info")},
}
# Methods safe to call with an allowed role on a live job: reads.  "ok": the
# empty request must be answered OK; "handler": the handler may refuse the
# empty request (INVALID_ARGUMENT, NOT_FOUND, ...) but the call got past
# authorization.  Everything else allowed (WriteBack, Clear, Restore, Stop,
# Join, Work, ...) is not called with a role that may call it.
HARMLESS = {
    ("embedding", "Stats"): "ok", ("embedding", "Digest"): "ok", ("embedding", "ListCheckpoints"): "ok",
    ("embedding", "GetManifest"): "handler", ("embedding", "Lookup"): "handler",
    ("embedding", "GetBlob"): "handler",
    ("oracle", "Status"): "ok",
    ("dataproc", "Info"): "ok", ("dataproc", "GetBatch"): "handler", ("dataproc", "StreamBatches"): "ok",
}
HANDLER_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE}
TRANSPORT_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED}

n_failed = 0


def tap(name, cond, detail=""):
    global n_failed
    if cond:
        print(f"ok - {name}", flush=True)
    else:
        n_failed += 1
        print(f"not ok - {name}", flush=True)
        for line in str(detail).splitlines():
            print(f"#   {line}", flush=True)


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- the methods, from the protos
def parse_protos():
    """[(service kind, full service name, method, req_stream, resp_stream)]"""
    out = []
    files = sorted(p for p in glob.glob(os.path.join(PROTO_DIR, "*.proto"))
                   if os.path.basename(p) != "testing.proto")
    rpc_re = re.compile(r"^\s*rpc\s+(\w+)\s*\(\s*(stream\s+)?[\w.]+\s*\)\s*returns\s*\(\s*(stream\s+)?[\w.]+\s*\)")
    for path in files:
        pkg, svc = None, None
        for line in open(path):
            line = line.split("//")[0]
            m = re.match(r"^\s*package\s+([\w.]+)\s*;", line)
            if m:
                pkg = m.group(1)
            m = re.match(r"^\s*service\s+(\w+)", line)
            if m:
                svc = m.group(1)
            m = rpc_re.match(line)
            if m:
                kind = pkg.split(".")[1]  # chanter.<kind>.v1
                out.append((kind, f"{pkg}.{svc}", m.group(1), bool(m.group(2)), bool(m.group(3))))
            elif re.match(r"^\s*rpc\s", line):
                out.append((None, path, line.strip(), False, False))  # a line the pattern misses
    return out


def call(channel, full_service, method, req_stream, resp_stream):
    """(code, details, response) of an empty call."""
    path = f"/{full_service}/{method}"
    try:
        if not req_stream and not resp_stream:
            r = channel.unary_unary(path)(b"", timeout=TIMEOUT)
        elif not req_stream:
            r = list(channel.unary_stream(path)(b"", timeout=TIMEOUT))
        elif not resp_stream:
            r = channel.stream_unary(path)(iter(()), timeout=TIMEOUT)
        else:
            r = list(channel.stream_stream(path)(iter(()), timeout=TIMEOUT))
        return grpc.StatusCode.OK, "", r
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


def roles_named(text):
    return [w for w in re.findall(r"[a-z]+", text) if w in ROLES]


def main():
    methods = parse_protos()
    bad = [m for m in methods if m[0] is None]
    tap(f"every rpc line of proto/*.proto parsed ({len(methods)} methods)", not bad,
        "\n".join(f"{p}: {l}" for _, p, l, _, _ in bad))
    methods = [m for m in methods if m[0]]
    # the table and the protos name the same methods
    in_proto = {(k, m) for k, _, m, _, _ in methods}
    in_table = {(k, m) for k, t in ALLOWED.items() for m in t}
    tap("the probe's role table covers exactly the methods of the protos",
        in_proto == in_table,
        f"in the protos only: {sorted(in_proto - in_table)}\nin the table only: {sorted(in_table - in_proto)}")

    # the daemons that serve RPCs: run/<name>.ready with an rpc_port
    daemons = {}
    for path in sorted(glob.glob(os.path.join(W, "run", "*.ready"))):
        name = os.path.basename(path)[:-len(".ready")]
        info = json.load(open(path))
        if info.get("rpc_port"):
            daemons[name] = info["rpc_port"]
    kinds = {k for k, _, _, _, _ in methods}
    for k in sorted(kinds):
        tap(f"a daemon serving {k} is running", any(n.split("-")[0] == k for n in daemons), f"ready files: {daemons}")
    print(f"# daemons: {' '.join(f'{n}=127.0.0.1:{p}' for n, p in daemons.items())}", flush=True)
    targets = [(n, p, [m for m in methods if m[0] == n.split("-")[0]]) for n, p in daemons.items()]
    denied = {n: 0 for n in daemons}

    def note(name, code):
        if code == grpc.StatusCode.PERMISSION_DENIED:
            denied[name] += 1

    ca = read(os.path.join(W, "certs", "ca.pem"))
    other = (read(os.path.join(OTHER, "admin.key")), read(os.path.join(OTHER, "admin.pem")))
    transports = [
        ("plaintext", lambda addr: grpc.insecure_channel(addr)),
        ("TLS without a client certificate", lambda addr: grpc.secure_channel(addr, grpc.ssl_channel_credentials(ca))),
        ("an admin certificate of another CA",
         lambda addr: grpc.secure_channel(addr, grpc.ssl_channel_credentials(ca, other[0], other[1]))),
    ]
    # (a)-(c): a new channel per call, so each call makes its own handshake
    for what, mk in transports:
        for name, port, ms in targets:
            wrong = []
            for _, svc, m, rs, ss in ms:
                ch = mk(f"127.0.0.1:{port}")
                code, details, resp = call(ch, svc, m, rs, ss)
                ch.close()
                note(name, code)
                if code not in TRANSPORT_CODES:
                    wrong.append(f"{m}: {code.name} '{details}'" + (f" answer={resp!r:.80}" if resp is not None else ""))
            tap(f"{what}: {name} refuses all {len(ms)} methods at the transport", not wrong and ms,
                "\n".join(wrong) or "no methods")

    # (d): each role's certificate of the job's CA
    for role in ROLES:
        creds = grpc.ssl_channel_credentials(ca, read(os.path.join(W, "certs", f"{role}.key")),
                                             read(os.path.join(W, "certs", f"{role}.pem")))
        for name, port, ms in targets:
            kind = name.split("-")[0]
            ch = grpc.secure_channel(f"127.0.0.1:{port}", creds)
            wrong, n_denied, called_ok = [], 0, []
            for _, svc, m, rs, ss in ms:
                allowed = ALLOWED[kind].get(m, set())
                if role in allowed:
                    want = HARMLESS.get((kind, m))
                    if not want:
                        continue  # allowed and not harmless: not called
                    code, details, _ = call(ch, svc, m, rs, ss)
                    note(name, code)
                    good = code == grpc.StatusCode.OK if want == "ok" else code in HANDLER_CODES
                    if good:
                        called_ok.append(m)
                    else:
                        wrong.append(f"{m} (allowed, harmless): {code.name} '{details}', expected "
                                     f"{'OK' if want == 'ok' else 'an answer of its handler'}")
                    continue
                code, details, resp = call(ch, svc, m, rs, ss)
                note(name, code)
                if code != grpc.StatusCode.PERMISSION_DENIED:
                    wrong.append(f"{m} (not for {role}): {code.name} '{details}'"
                                 + (f" answer={resp!r:.80}" if resp is not None else ""))
                    continue
                n_denied += 1
                named = roles_named(details)
                if m not in details or set(named) != set(allowed) | {role} or named[-1] != role:
                    wrong.append(f"{m}: PERMISSION_DENIED '{details}' should name the method, the roles it needs "
                                 f"({', '.join(sorted(allowed))}) and last the caller's ({role})")
            ch.close()
            tap(f"role {role}: {name} refuses the {n_denied} methods it may not call PERMISSION_DENIED naming "
                f"the roles; answers the harmless ones it may ({', '.join(called_ok) or 'none'})", not wrong,
                "\n".join(wrong))
    # (e): a certificate of the job's CA without a role reaches nothing
    if NOROLE:
        creds = grpc.ssl_channel_credentials(ca, read(NOROLE + ".key"), read(NOROLE + ".pem"))
        for name, port, ms in targets:
            ch = grpc.secure_channel(f"127.0.0.1:{port}", creds)
            wrong = []
            for _, svc, m, rs, ss in ms:
                code, details, resp = call(ch, svc, m, rs, ss)
                note(name, code)
                if (code != grpc.StatusCode.PERMISSION_DENIED or m not in details or
                        "names no chanter role" not in details or "needs the role any role" in details):
                    wrong.append(f"{m}: {code.name} '{details}'" + (f" answer={resp!r:.80}" if resp is not None else ""))
            ch.close()
            tap(f"a certificate of the job's CA naming no role: {name} refuses all {len(ms)} methods "
                f"PERMISSION_DENIED", not wrong, "\n".join(wrong))
    with open(COUNTS, "w") as f:
        json.dump(denied, f)
    print(f"# PERMISSION_DENIED answers per daemon: {json.dumps(denied)}", flush=True)
    return 1 if n_failed else 0


if __name__ == "__main__":
    sys.exit(main())
