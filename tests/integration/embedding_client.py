#!/usr/bin/python3
"""A second-language client of chanter-embedding: Python grpcio with stubs
generated from proto/embedding.proto at test time.  Prints TAP-style lines.

usage: embedding_client.py STUB_DIR ADDR0 ADDR1 [checkpoints ID | clear SET_HEX_FILE]
The job layout is the one test_embedding_daemon.sh writes: tables of 1000
and 50000 rows, dim 4, row-wise Adagrad (5 floats per row), 2 servers.
Without a mode: Lookup, WriteBack, Digest, blobs and bad requests.
checkpoints ID: seals checkpoint ID (taken by the shell) on both servers and
  checks GetManifest, ListCheckpoints' sealed, DeleteCheckpoint and their errors.
clear SET_HEX_FILE: Clear on both servers, then writes known rows and checks
  that the servers' set digests add up to the one computed here; writes that
  sum (hex) to SET_HEX_FILE for the shell to compare with the CLI's.
"""
import hashlib
import struct
import sys

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
import embedding_pb2 as pb  # noqa: E402
import embedding_pb2_grpc as pbg  # noqa: E402

ADDR = sys.argv[2:4]
FLOATS = 5
failed = 0


def check(name, cond, detail=""):
    global failed
    if cond:
        print(f"ok - python: {name}")
    else:
        failed += 1
        print(f"not ok - python: {name} {detail}")


def key(table, row):
    return (table << 48) | row


def pack_keys(keys):
    return struct.pack(f"<{len(keys)}Q", *keys)


def expect_error(name, fn, code, needle):
    try:
        fn()
    except grpc.RpcError as e:
        check(name, e.code() == code and needle in e.details(), f"got {e.code()} '{e.details()}'")
        return
    check(name, False, "call succeeded")


def checkpoint_tests(cp_id):
    NF = grpc.StatusCode.NOT_FOUND
    INV = grpc.StatusCode.INVALID_ARGUMENT

    def listed(stub):
        return {c.id: c for c in stub.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=10).checkpoints}

    before = [listed(s).get(cp_id) for s in stubs]
    check(f"{cp_id} is listed unsealed on both servers", all(c is not None and not c.sealed for c in before))
    expect_error("GetManifest of an unsealed checkpoint -> NOT_FOUND", lambda: stubs[0].GetManifest(
        pb.GetManifestRequest(id=cp_id), timeout=10), NF, cp_id)
    for i, s in enumerate(stubs):
        s.SealCheckpoint(pb.SealCheckpointRequest(id=cp_id, manifest=b"first"), timeout=10)
        s.SealCheckpoint(pb.SealCheckpointRequest(id=cp_id, manifest=b"job manifest %d\0\xff" % i), timeout=10)
    got = [s.GetManifest(pb.GetManifestRequest(id=cp_id), timeout=10).manifest for s in stubs]
    check("GetManifest returns the last manifest sealed, byte for byte",
          got == [b"job manifest 0\0\xff", b"job manifest 1\0\xff"], str(got))
    check(f"{cp_id} is listed sealed on both servers", all(listed(s)[cp_id].sealed for s in stubs))
    expect_error("SealCheckpoint of an unknown checkpoint -> NOT_FOUND", lambda: stubs[0].SealCheckpoint(
        pb.SealCheckpointRequest(id="nosuch", manifest=b"m"), timeout=10), NF, "nosuch")
    for name, call in (("SealCheckpoint", lambda: stubs[0].SealCheckpoint(
                           pb.SealCheckpointRequest(id="../x", manifest=b"m"), timeout=10)),
                       ("GetManifest", lambda: stubs[0].GetManifest(pb.GetManifestRequest(id="../x"), timeout=10)),
                       ("DeleteCheckpoint", lambda: stubs[0].DeleteCheckpoint(
                           pb.DeleteCheckpointRequest(id=""), timeout=10))):
        expect_error(f"{name} with a bad id -> INVALID_ARGUMENT", call, INV, "not valid")
    # a checkpoint to delete: taken, sealed, deleted, gone
    s0.Checkpoint(pb.CheckpointRequest(id="py-del"), timeout=30)
    s0.SealCheckpoint(pb.SealCheckpointRequest(id="py-del", manifest=b"m"), timeout=10)
    s0.DeleteCheckpoint(pb.DeleteCheckpointRequest(id="py-del"), timeout=10)
    check("a deleted checkpoint is not listed", "py-del" not in listed(s0) and cp_id in listed(s0))
    expect_error("GetManifest of a deleted checkpoint -> NOT_FOUND", lambda: s0.GetManifest(
        pb.GetManifestRequest(id="py-del"), timeout=10), NF, "py-del")
    expect_error("DeleteCheckpoint of a deleted checkpoint -> NOT_FOUND", lambda: s0.DeleteCheckpoint(
        pb.DeleteCheckpointRequest(id="py-del"), timeout=10), NF, "py-del")
    expect_error("Restore of a deleted checkpoint -> NOT_FOUND", lambda: s0.Restore(
        pb.RestoreRequest(id="py-del"), timeout=10), NF, "py-del")


def lanes(b):
    return struct.unpack("<4Q", b)


def clear_tests(hex_file):
    for s in stubs:
        s.PutBlob(pb.PutBlobRequest(name="before-clear", data=b"x"), timeout=10)
    st = [s.Stats(pb.StatsRequest(), timeout=10) for s in stubs]
    check("Stats says rows and blobs are stored before Clear", st[0].has_rows and all(x.has_blobs for x in st),
          str([(x.has_rows, x.has_blobs) for x in st]))
    for s in stubs:
        s.Clear(pb.ClearRequest(), timeout=60)
    st = [s.Stats(pb.StatsRequest(), timeout=10) for s in stubs]
    check("Stats says nothing is stored after Clear", not any(x.has_rows or x.has_blobs for x in st))
    check("Clear deletes every checkpoint", all(len(s.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=10)
                                                   .checkpoints) == 0 for s in stubs))
    d = [s.Digest(pb.DigestRequest(), timeout=10) for s in stubs]
    check("after Clear: no rows, a zero set digest", all(x.rows == 0 and x.set_sha256 == bytes(32) for x in d))
    expect_error("after Clear: blobs are gone", lambda: s0.GetBlob(pb.GetBlobRequest(name="before-clear"),
                                                                  timeout=10), grpc.StatusCode.NOT_FOUND, "before-clear")
    # known rows on both servers: each key goes to the server that owns it
    want = [0, 0, 0, 0]
    per_server = [0, 0]
    keys = [key(0, r) for r in range(10)] + [key(1, r) for r in range(100, 140)]
    for k in keys:
        vals = struct.pack("<5f", *[(k & 0xffff) * 0.25 + j for j in range(FLOATS)])
        req = pb.WriteBackRequest(keys=pack_keys([k]), rows=vals, layout_hash=layout)
        try:
            s0.WriteBack(req, timeout=10)
            per_server[0] += 1
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            stubs[1].WriteBack(req, timeout=10)
            per_server[1] += 1
        h = lanes(hashlib.sha256(struct.pack("<Q", k) + vals).digest())
        want = [(a + b) % 2**64 for a, b in zip(want, h)]
    d = [s.Digest(pb.DigestRequest(), timeout=10) for s in stubs]
    got = [0, 0, 0, 0]
    for x in d:
        got = [(a + b) % 2**64 for a, b in zip(got, lanes(x.set_sha256))]
    check("both servers hold some of the rows", min(per_server) > 0 and [x.rows for x in d] == per_server,
          f"{per_server} {[x.rows for x in d]}")
    check("the servers' set digests add up to the set digest of the rows", got == want, f"{got} != {want}")
    with open(hex_file, "w") as f:
        f.write(struct.pack("<4Q", *want).hex())


stubs = [pbg.EmbeddingStub(grpc.insecure_channel(a)) for a in ADDR]
s0 = stubs[0]
if len(sys.argv) > 5 and sys.argv[4] in ("checkpoints", "clear"):
    layout = s0.Stats(pb.StatsRequest(), timeout=10).layout_hash
    (checkpoint_tests if sys.argv[4] == "checkpoints" else clear_tests)(sys.argv[5])
    sys.exit(1 if failed else 0)
stats = s0.Stats(pb.StatsRequest(), timeout=10)
check("Stats answers shard 0 of 2", stats.shard == 0 and stats.shards == 2, str(stats))
layout = stats.layout_hash

# table 0 (1000 rows) is small: placed whole on server 0
keys = [key(0, r) for r in range(10)]
r1 = s0.Lookup(pb.LookupRequest(keys=pack_keys(keys), layout_hash=layout), timeout=10)
r2 = s0.Lookup(pb.LookupRequest(keys=pack_keys(keys), layout_hash=layout), timeout=10)
check("Lookup returns 10 rows of 5 floats", len(r1.rows) == 10 * FLOATS * 4, str(len(r1.rows)))
check("lazy init is deterministic across calls", r1.rows == r2.rows)
row5 = struct.unpack_from("<5f", r1.rows, 5 * FLOATS * 4)
check("row 0:5 holds what the CLI wrote", row5 == (1.0, 2.0, 3.0, 4.0, 0.5), str(row5))

# cross-language write: the shell test reads 0:6 back through the CLI
vals = (0.25, -0.5, 0.75, -1.0, 2.0)
w = s0.WriteBack(pb.WriteBackRequest(keys=pack_keys([key(0, 6)]), rows=struct.pack("<5f", *vals),
                                     layout_hash=layout), timeout=10)
check("WriteBack acknowledges 1 row", w.rows_written == 1)

before = s0.Digest(pb.DigestRequest(), timeout=10)
INV = grpc.StatusCode.INVALID_ARGUMENT
expect_error("rows of the wrong length -> INVALID_ARGUMENT", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(0, 7), key(0, 8)]), rows=struct.pack("<9f", *range(9)),
                       layout_hash=layout), timeout=10),
    INV, "rows")
expect_error("truncated keys -> INVALID_ARGUMENT", lambda: s0.Lookup(
    pb.LookupRequest(keys=b"\x01" * 12, layout_hash=layout), timeout=10), INV, "multiple of 8")
expect_error("truncated rows -> INVALID_ARGUMENT", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(0, 7)]), rows=b"\0" * 19, layout_hash=layout), timeout=10), INV, "multiple of 4")
expect_error("unknown table -> INVALID_ARGUMENT", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(0, 7), key(9, 1)]), rows=b"\0" * 40, layout_hash=layout), timeout=10), INV, "table 9")
expect_error("row past the table -> INVALID_ARGUMENT", lambda: s0.Lookup(
    pb.LookupRequest(keys=pack_keys([key(0, 1000)]), layout_hash=layout), timeout=10), INV, "row 1000")
expect_error("layout mismatch -> FAILED_PRECONDITION", lambda: s0.Lookup(
    pb.LookupRequest(keys=pack_keys(keys), layout_hash=12345), timeout=10),
    grpc.StatusCode.FAILED_PRECONDITION, "layout")
# a table-1 key owned by server 1, sent to server 0
wrong = None
for r in range(100):
    try:
        stubs[1].Lookup(pb.LookupRequest(keys=pack_keys([key(1, r)]), layout_hash=layout), timeout=10)
        wrong = r
        break
    except grpc.RpcError:
        pass
expect_error("key of another shard -> FAILED_PRECONDITION", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(1, wrong)]), rows=b"\0" * 20, layout_hash=layout), timeout=10),
    grpc.StatusCode.FAILED_PRECONDITION, "shard")
raw = grpc.insecure_channel(ADDR[0]).unary_unary("/chanter.embedding.v1.Embedding/Lookup",
                                                   request_serializer=lambda b: b,
                                                   response_deserializer=lambda b: b)
expect_error("garbage bytes -> INVALID_ARGUMENT", lambda: raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10),
             INV, "Lookup")
after = s0.Digest(pb.DigestRequest(), timeout=10)
check("rejected requests wrote nothing", before.sha256 == after.sha256 and before.rows == after.rows)
check("Digest is a 32-byte SHA-256 with hex", len(after.sha256) == 32 and after.hex == after.sha256.hex())
check("Digest has a 32-byte set digest", len(after.set_sha256) == 32 and after.set_sha256 != bytes(32))
s0.PutBlob(pb.PutBlobRequest(name="dense-0", data=b"x" * 100000), timeout=10)
check("PutBlob/GetBlob round trip", s0.GetBlob(pb.GetBlobRequest(name="dense-0"), timeout=10).data == b"x" * 100000)
expect_error("GetBlob of a missing blob -> NOT_FOUND", lambda: s0.GetBlob(pb.GetBlobRequest(name="nope"), timeout=10),
             grpc.StatusCode.NOT_FOUND, "nope")
sys.exit(1 if failed else 0)
