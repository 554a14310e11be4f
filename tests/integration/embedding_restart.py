#!/usr/bin/python3
"""The client side of test_embedding_restart.sh: one chanter-embedding
server, driven over gRPC (Python grpcio, stubs generated from
proto/embedding.proto at test time) by a client that retries UNAVAILABLE
with backoff, as the project's own clients do (rpc_unary_retry), so that a
call made while the server is killed and restarted goes on by itself.

usage: embedding_restart.py STUB_DIR ADDR MODE ARGS...
  write-loop ACKS BATCHES ROWS  WriteBack batch b = 0..BATCHES-1 (ROWS rows
                                of table 0, keys b*ROWS...); appends "b" to
                                ACKS once acknowledged; prints retries=N
  verify ACKS ROWS              Lookup every row of every batch in ACKS;
                                fails unless each is bit-identical to what
                                write-loop wrote
  stats                         one JSON line: incarnation, fence_id,
                                fence_iteration, fence_held (Stats, brief)
  wait-held N                   until Stats says N write-backs are held
  write KEY VER DONE [OUT]      one WriteBack of row KEY at version VER tagged
                                done=DONE; then "retries=N" into OUT
  row KEY                       prints the version whose bytes row KEY holds
                                (or "other")
  fence ID ITERATION            Fence; prints the incarnation it answered
                                (checked against Stats')
  checkpoint ID [OUT]           Checkpoint; then "retries=N" into OUT
  restore ID | delete ID | list | seal ID TEXT | manifest ID
Exit status 0, 1 on a failed check or an error, 3 for NOT_FOUND.
"""
import json
import struct
import sys
import time

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
import embedding_pb2 as pb  # noqa: E402
import embedding_pb2_grpc as pbg  # noqa: E402

DIM = 16  # the test's layout: one table, dim 16, SGD (no optimizer state)
mode, args = sys.argv[3], sys.argv[4:]


def connect():
    global stub
    stub = pbg.EmbeddingStub(grpc.insecure_channel(sys.argv[2]))


connect()


def retrying(call, budget_s=30.0):
    """(result, retries): call() again while the server is unavailable.  Each
    retry gets a new channel: grpcio (1.51) keeps failing a channel whose
    connection was refused for seconds after the server is back."""
    retries, back, end = 0, 0.02, time.time() + budget_s
    while True:
        try:
            return call(), retries
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() > end:
                raise
        retries += 1
        time.sleep(back)
        back = min(back * 2, 0.5)
        connect()


def row_bytes(key, ver):
    return struct.pack(f"<{DIM}f", *[key * 0.001 + ver * 10.0 + j * 0.5 for j in range(DIM)])


def keys_bytes(keys):
    return struct.pack(f"<{len(keys)}Q", *keys)


_layout = None


def layout():
    """The server's layout fingerprint (every Lookup and WriteBack carries it)."""
    global _layout
    if _layout is None:
        _layout = retrying(lambda: stub.Stats(pb.StatsRequest(brief=True), timeout=10))[0].layout_hash
    return _layout


def lookup(keys):
    return stub.Lookup(pb.LookupRequest(keys=keys_bytes(keys), layout_hash=layout()), timeout=30).rows


def brief():
    return stub.Stats(pb.StatsRequest(brief=True), timeout=10)


def note(path, text):
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def main():
    if mode == "write-loop":
        acks, batches, rows = args[0], int(args[1]), int(args[2])
        total = 0
        with open(acks, "a") as out:
            for b in range(batches):
                keys = list(range(b * rows, (b + 1) * rows))
                req = pb.WriteBackRequest(keys=keys_bytes(keys), rows=b"".join(row_bytes(k, 1) for k in keys),
                                          layout_hash=layout())
                _, r = retrying(lambda: stub.WriteBack(req, timeout=10))
                total += r
                out.write(f"{b}\n")
                out.flush()
        print(f"retries={total}")
    elif mode == "verify":
        acks, rows = args[0], int(args[1])
        batches = sorted({int(x) for x in open(acks).read().split()})
        bad = 0
        for i in range(0, len(batches), 20):
            keys = [k for b in batches[i:i + 20] for k in range(b * rows, (b + 1) * rows)]
            got = lookup(keys)
            want = b"".join(row_bytes(k, 1) for k in keys)
            if got != want:
                bad += sum(got[j * DIM * 4:(j + 1) * DIM * 4] != want[j * DIM * 4:(j + 1) * DIM * 4]
                           for j in range(len(keys)))
        print(f"batches={len(batches)} rows={len(batches) * rows} differing={bad}")
        return 1 if bad or not batches else 0
    elif mode == "stats":
        s = brief()
        print(json.dumps({"incarnation": s.incarnation, "fence_id": s.fence_id,
                          "fence_iteration": s.fence_iteration, "fence_held": s.fence_held}))
    elif mode == "wait-held":
        end = time.time() + 20
        while brief().fence_held != int(args[0]):
            if time.time() > end:
                print(f"fence_held={brief().fence_held}, not {args[0]}")
                return 1
            time.sleep(0.05)
    elif mode == "write":
        key, ver, done = int(args[0]), int(args[1]), int(args[2])
        req = pb.WriteBackRequest(keys=keys_bytes([key]), rows=row_bytes(key, ver), done=done, layout_hash=layout())
        _, r = retrying(lambda: stub.WriteBack(req, timeout=60), budget_s=60)
        note(args[3] if len(args) > 3 else None, f"retries={r}")
    elif mode == "row":
        got = lookup([int(args[0])])
        print(next((str(v) for v in range(10) if row_bytes(int(args[0]), v) == got), "other"))
    elif mode == "fence":
        r = stub.Fence(pb.FenceRequest(id=args[0], iteration=int(args[1])), timeout=10)
        s = stub.Stats(pb.StatsRequest(), timeout=10)
        if r.incarnation == 0 or r.incarnation != s.incarnation:
            print(f"Fence answered incarnation {r.incarnation}, Stats {s.incarnation}")
            return 1
        print(r.incarnation)
    elif mode == "checkpoint":
        r, n = retrying(lambda: stub.Checkpoint(pb.CheckpointRequest(id=args[0]), timeout=30))
        note(args[1] if len(args) > 1 else None, f"retries={n}")
        print(r.checkpoint.path)
    elif mode == "restore":
        stub.Restore(pb.RestoreRequest(id=args[0]), timeout=30)
    elif mode == "delete":
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(id=args[0]), timeout=30)
    elif mode == "list":
        for c in stub.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=10).checkpoints:
            print(c.id, "sealed" if c.sealed else "unsealed")
    elif mode == "seal":
        stub.SealCheckpoint(pb.SealCheckpointRequest(id=args[0], manifest=args[1].encode()), timeout=10)
    elif mode == "manifest":
        sys.stdout.write(stub.GetManifest(pb.GetManifestRequest(id=args[0]), timeout=10).manifest.decode())
    else:
        print(f"unknown mode {mode}")
        return 1
    return 0


try:
    sys.exit(main())
except grpc.RpcError as e:
    print(f"error {e.code().name}: {e.details()}")
    sys.exit(3 if e.code() == grpc.StatusCode.NOT_FOUND else 1)
