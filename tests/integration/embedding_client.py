#!/usr/bin/python3
"""A second-language client of chanter-embedding: Python grpcio with stubs
generated from proto/embedding.proto at test time.  Prints TAP-style lines.

usage: embedding_client.py STUB_DIR ADDR0 ADDR1
The job layout is the one test_embedding_daemon.sh writes: tables of 1000
and 50000 rows, dim 4, row-wise Adagrad (5 floats per row), 2 servers.
"""
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


stubs = [pbg.EmbeddingStub(grpc.insecure_channel(a)) for a in ADDR]
s0 = stubs[0]
stats = s0.Stats(pb.StatsRequest(), timeout=10)
check("Stats answers shard 0 of 2", stats.shard == 0 and stats.shards == 2, str(stats))
layout = stats.layout_hash

# table 0 (1000 rows) is small: placed whole on server 0
keys = [key(0, r) for r in range(10)]
r1 = s0.Lookup(pb.LookupRequest(keys=pack_keys(keys), layout_hash=layout), timeout=10)
r2 = s0.Lookup(pb.LookupRequest(keys=pack_keys(keys)), timeout=10)
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
    pb.WriteBackRequest(keys=pack_keys([key(0, 7), key(0, 8)]), rows=struct.pack("<9f", *range(9))), timeout=10),
    INV, "rows")
expect_error("truncated keys -> INVALID_ARGUMENT", lambda: s0.Lookup(
    pb.LookupRequest(keys=b"\x01" * 12), timeout=10), INV, "multiple of 8")
expect_error("truncated rows -> INVALID_ARGUMENT", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(0, 7)]), rows=b"\0" * 19), timeout=10), INV, "multiple of 4")
expect_error("unknown table -> INVALID_ARGUMENT", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(0, 7), key(9, 1)]), rows=b"\0" * 40), timeout=10), INV, "table 9")
expect_error("row past the table -> INVALID_ARGUMENT", lambda: s0.Lookup(
    pb.LookupRequest(keys=pack_keys([key(0, 1000)])), timeout=10), INV, "row 1000")
expect_error("layout mismatch -> FAILED_PRECONDITION", lambda: s0.Lookup(
    pb.LookupRequest(keys=pack_keys(keys), layout_hash=12345), timeout=10),
    grpc.StatusCode.FAILED_PRECONDITION, "layout")
# a table-1 key owned by server 1, sent to server 0
wrong = None
for r in range(100):
    try:
        stubs[1].Lookup(pb.LookupRequest(keys=pack_keys([key(1, r)])), timeout=10)
        wrong = r
        break
    except grpc.RpcError:
        pass
expect_error("key of another shard -> FAILED_PRECONDITION", lambda: s0.WriteBack(
    pb.WriteBackRequest(keys=pack_keys([key(1, wrong)]), rows=b"\0" * 20), timeout=10),
    grpc.StatusCode.FAILED_PRECONDITION, "shard")
raw = grpc.insecure_channel(ADDR[0]).unary_unary("/chanter.embedding.v1.Embedding/Lookup",
                                                   request_serializer=lambda b: b,
                                                   response_deserializer=lambda b: b)
expect_error("garbage bytes -> INVALID_ARGUMENT", lambda: raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10),
             INV, "Lookup")
after = s0.Digest(pb.DigestRequest(), timeout=10)
check("rejected requests wrote nothing", before.sha256 == after.sha256 and before.rows == after.rows)
check("Digest is a 32-byte SHA-256 with hex", len(after.sha256) == 32 and after.hex == after.sha256.hex())
s0.PutBlob(pb.PutBlobRequest(name="dense-0", data=b"x" * 100000), timeout=10)
check("PutBlob/GetBlob round trip", s0.GetBlob(pb.GetBlobRequest(name="dense-0"), timeout=10).data == b"x" * 100000)
expect_error("GetBlob of a missing blob -> NOT_FOUND", lambda: s0.GetBlob(pb.GetBlobRequest(name="nope"), timeout=10),
             grpc.StatusCode.NOT_FOUND, "nope")
sys.exit(1 if failed else 0)
