#!/usr/bin/env bash
# Integration: request limits.  A real chanter-embedding and chanter-dataproc
# on loopback, with the job's default limits, driven by a Python grpcio
# client (stubs generated now): a 20M-key Lookup (160 MB) is refused by gRPC
# from its length, a Lookup / WriteBack / PutBlob past its key or size limit
# and a GetBatch of 4,194,304 samples by the handler, each before the server
# allocates anything in proportion (its VmRSS before and after is printed;
# for the 20M-key Lookup it grows by the message: gRPC core 1.51 reads a
# message whole before it checks its length);
# NaN / Inf rows and a layout_hash or schema_hash of 0 are refused and
# nothing is stored.  The CLI cuts a call into calls within
# embedding.max_write_keys / max_lookup_keys and reads and writes the same
# rows; both daemons survive every refusal, the server logs it with the limit.
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
job_preamble "$JOB" --daemons seed=42 batch_size=512 "table_rows=1000, 50000" "table_hotness=1, 1" n_dense=4 \
  embedding_dim=4 embedding_optimizer=rowwise_adagrad embedding_servers=1 synthetic.samples=20000 \
  dataproc.metrics_port_offset=0 dataproc.drain_ms=2000

STUBS=$WORK/py
mkdir -p "$STUBS"
if ! protoc -I "$ROOT/proto" --python_out="$STUBS" --grpc_python_out="$STUBS" \
     --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "$ROOT/proto/embedding.proto" \
     "$ROOT/proto/dataproc.proto" 2>"$WORK/protoc.err"; then
  skip "python grpcio stubs cannot be generated: $(head -c 200 "$WORK/protoc.err")"
  finish; exit 0
fi

start_embedding 0 "$JOB" || { nok "start the embedding server"; finish; exit 1; }
start_dataproc 0 "$JOB" || { nok "start the data processor"; finish; exit 1; }
ok "embedding server and data processor ready (ports ${EMB_PORT[0]} ${DP_PORT[0]})"

# The client prints TAP lines itself; its exit status counts the failures.
/usr/bin/python3 - "$STUBS" "127.0.0.1:${EMB_PORT[0]}" "${EMB_PID[0]}" "127.0.0.1:${DP_PORT[0]}" "${DP_PID[0]}" \
  >"$WORK/client.out" 2>"$WORK/client.err" <<'PY'
import struct
import sys

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
import embedding_pb2 as pb  # noqa: E402
import embedding_pb2_grpc as pbg  # noqa: E402
import dataproc_pb2 as dp  # noqa: E402
import dataproc_pb2_grpc as dpg  # noqa: E402

EMB, EMB_PID, DPA, DP_PID = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
FLOATS = 5  # dim 4 + row-wise Adagrad's 1
failed = 0


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def tap(good, name):
    global failed
    print(("ok - " if good else "not ok - ") + name, flush=True)
    failed += not good


def refused(name, call, code, needles, pid=None, max_growth_kb=None):
    """call() fails with code and a message holding every needle; with pid,
    the server's VmRSS grows by less than max_growth_kb (printed)."""
    before = rss_kb(pid) if pid else 0
    try:
        call()
        got, msg = None, "succeeded"
    except grpc.RpcError as e:
        got, msg = e.code(), e.details() or ""
    good = got == code and all(n in msg for n in needles)
    extra = ""
    if pid:
        growth = rss_kb(pid) - before
        extra = f" (server VmRSS {before} kB -> {before + growth} kB, growth {growth} kB)"
        good = good and growth < max_growth_kb
    if not good:
        print(f"# got {got}: {msg[:300]}", flush=True)
    tap(good, name + extra)
    return msg


def key(t, r):
    return (t << 48) | r


def keys_bytes(ks):
    return struct.pack(f"<{len(ks)}Q", *ks)


opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
emb = pbg.EmbeddingStub(grpc.insecure_channel(EMB, options=opts))
layout = emb.Stats(pb.StatsRequest(brief=True), timeout=10).layout_hash
INV, BIG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED

# warm up: the first calls allocate the server's own buffers
emb.Lookup(pb.LookupRequest(keys=keys_bytes([key(0, 1), key(1, 2)]), layout_hash=layout), timeout=10)

# 20M keys = 160 MB: larger than the server's receive limit (68 MB here),
# refused by gRPC before our handler or protobuf-c sees it.  gRPC core 1.51
# (grpcio 1.51 / core 29) reads the whole message before it compares its
# length with the limit, so the server's memory does grow
# by the message's size while it arrives: measured and printed, not asserted.
huge = bytes(8 * 20_000_000)
st0 = emb.Stats(pb.StatsRequest(), timeout=10)
rss0 = rss_kb(EMB_PID)
msg = refused("a 20M-key Lookup (160 MB) is refused by gRPC (RESOURCE_EXHAUSTED), naming the receive limit",
              lambda: emb.Lookup(pb.LookupRequest(keys=huge, layout_hash=layout), timeout=60), BIG,
              ["larger than max", "vs. 68157440"])
growth = rss_kb(EMB_PID) - rss0
print(f"# gRPC said: {msg}", flush=True)
st = emb.Stats(pb.StatsRequest(), timeout=10)
tap(st.rejected_calls == st0.rejected_calls and st.lookup_calls == st0.lookup_calls,
    f"the 20M-key Lookup never reached the handler (server VmRSS growth {growth} kB: gRPC 1.51 buffers the whole "
    "message before refusing it)")
del huge

# within the receive limit but past the key limit: refused by the handler
n = 1048576 + 1
refused(f"a Lookup of {n} keys is refused naming embedding.max_lookup_keys",
        lambda: emb.Lookup(pb.LookupRequest(keys=bytes(8 * n), layout_hash=layout), timeout=60), INV,
        ["embedding.max_lookup_keys = 1048576", f"{n} keys"])
n = 262144 + 1
refused(f"a WriteBack of {n} keys is refused naming embedding.max_write_keys",
        lambda: emb.WriteBack(pb.WriteBackRequest(keys=bytes(8 * n), rows=bytes(4 * FLOATS * n),
                                                  layout_hash=layout), timeout=60), INV,
        ["embedding.max_write_keys = 262144"])
refused("a PutBlob of 64 MiB + 1 byte is refused naming embedding.max_blob_mb",
        lambda: emb.PutBlob(pb.PutBlobRequest(name="too-big", data=bytes((64 << 20) + 1)), timeout=60), INV,
        ["65 MiB of blob (rounded up), more than embedding.max_blob_mb = 64"])

# NaN and Inf rows: refused naming the first bad key and position; nothing stored
d0 = emb.Digest(pb.DigestRequest(), timeout=10)
ks = [key(0, 3), key(0, 4), key(1, 9)]
l0 = emb.Lookup(pb.LookupRequest(keys=keys_bytes(ks), layout_hash=layout), timeout=10).rows
for bad, label, pos, word in ((float("nan"), "NaN", 7, "vector"), (float("inf"), "+Inf", 14, "optimizer state"),
                              (float("-inf"), "-Inf", 0, "vector")):
    vals = [0.5] * (FLOATS * len(ks))
    vals[pos] = bad
    i, j = divmod(pos, FLOATS)
    refused(f"a WriteBack with {label} in key {i}'s row is refused naming it",
            lambda: emb.WriteBack(pb.WriteBackRequest(keys=keys_bytes(ks), rows=struct.pack(f"<{len(vals)}f", *vals),
                                                      layout_hash=layout), timeout=10), INV,
            [f"{label} at key index {i} (key {ks[i] >> 48}:{ks[i] & 0xffffffffffff}), float {j}", word,
             "nothing was written"])
d1 = emb.Digest(pb.DigestRequest(), timeout=10)
l1 = emb.Lookup(pb.LookupRequest(keys=keys_bytes(ks), layout_hash=layout), timeout=10).rows
tap(d0.rows == d1.rows == 0 and d0.sha256 == d1.sha256 and l0 == l1,
    "refused NaN / Inf write-backs stored nothing (digest and rows unchanged)")

# layout_hash 0
refused("a Lookup with layout_hash 0 is refused",
        lambda: emb.Lookup(pb.LookupRequest(keys=keys_bytes(ks)), timeout=10), INV,
        ["layout_hash 0: every client sends its table layout's fingerprint"])
refused("a WriteBack with layout_hash 0 is refused",
        lambda: emb.WriteBack(pb.WriteBackRequest(keys=keys_bytes(ks[:1]), rows=bytes(4 * FLOATS)), timeout=10), INV,
        ["layout_hash 0"])
tap(emb.Digest(pb.DigestRequest(), timeout=10).rows == 0, "the refused write-backs stored nothing")
w = emb.WriteBack(pb.WriteBackRequest(keys=keys_bytes(ks[:1]), rows=struct.pack("<5f", 1, 2, 3, 4, 0.5),
                                      layout_hash=layout), timeout=10)
tap(w.rows_written == 1, "a finite write-back with the layout's fingerprint is still accepted")

# the data processor
dpx = dpg.DataProcStub(grpc.insecure_channel(DPA, options=opts))
schema = dpx.Info(dp.InfoRequest(), timeout=10).schema_hash
b = dpx.GetBatch(dp.GetBatchRequest(iteration=0, batch_size=512, schema_hash=schema), timeout=30)
refused("a GetBatch of 4,194,304 samples is refused naming dataproc.max_batch_samples",
        lambda: dpx.GetBatch(dp.GetBatchRequest(iteration=0, batch_size=4194304, schema_hash=schema), timeout=60),
        INV, ["batch_size 4194304", "dataproc.max_batch_samples = 16384"], DP_PID, 4096)
refused("a GetBatch of 16,385 samples is refused (the limit is max(batch_size, 16384))",
        lambda: dpx.GetBatch(dp.GetBatchRequest(iteration=0, batch_size=16385, schema_hash=schema), timeout=60),
        INV, ["dataproc.max_batch_samples"])
tap(len(dpx.GetBatch(dp.GetBatchRequest(iteration=0, batch_size=16384, schema_hash=schema), timeout=60).labels) > 0,
    "a GetBatch of 16,384 samples is served")
refused("a StreamBatches of 4,194,304-sample batches is refused",
        lambda: list(dpx.StreamBatches(iter([dp.StreamRequest(first=0, count=2, batch_size=4194304,
                                                              schema_hash=schema)]), timeout=60)),
        INV, ["dataproc.max_batch_samples"], DP_PID, 4096)
refused("a GetBatch with schema_hash 0 is refused",
        lambda: dpx.GetBatch(dp.GetBatchRequest(iteration=0, batch_size=512), timeout=10), INV,
        ["schema_hash 0: every client sends its data schema's fingerprint"])
refused("a StreamBatches with schema_hash 0 is refused",
        lambda: list(dpx.StreamBatches(iter([dp.StreamRequest(first=0, count=1, batch_size=512)]), timeout=10)), INV,
        ["schema_hash 0"])
raw = grpc.insecure_channel(DPA, options=opts).unary_unary("/chanter.dataproc.v1.DataProc/GetBatch",
                                                            request_serializer=lambda x: x,
                                                            response_deserializer=lambda x: x)
refused("a 2 MB GetBatch request (past the processor's 1 MiB receive limit) is refused by gRPC",
        lambda: raw(bytes(2 << 20), timeout=30), BIG, ["larger than max"], DP_PID, 4096)
sys.exit(1 if failed else 0)
PY
rc=$?
cat "$WORK/client.out"
[ $rc -eq 0 ] || sed 's/^/# /' "$WORK/client.err" | tail -20
grep -q '^ok - ' "$WORK/client.out" && ! grep -q '^not ok' "$WORK/client.out" && [ $rc -eq 0 ]
expect "every limit check passed"
N_OK=$((N_OK + $(grep -c '^ok - ' "$WORK/client.out")))
N_FAIL=$((N_FAIL + $(grep -c '^not ok' "$WORK/client.out")))

# common/embc.c cuts a call into calls within the limits: the CLI with a
# limit of 2 keys per call reads and writes the same rows as with one call
cli() { C --set "cluster.embedding=127.0.0.1:${EMB_PORT[0]}" "$@"; }
keys="0:1 0:2 0:3 1:4 1:5"
cli --set embedding.max_write_keys=2 embedding write 0:11=1,2,3,4,0.5 0:12=5,6,7,8,0.25 1:13=-1,-2,-3,-4,1 \
  >/dev/null 2>"$WORK/w.err"
expect "a write of 3 keys with embedding.max_write_keys = 2 is accepted (in 2 calls)"
a=$(cli embedding lookup $keys 0:11 0:12 1:13) && b=$(cli --set embedding.max_lookup_keys=2 embedding lookup $keys 0:11 0:12 1:13)
[ -n "$a" ] && [ "$a" = "$b" ] && [[ "$b" == *$'1:13\t-1 -2 -3 -4 1'* ]]
expect "a lookup of 8 keys in calls of 2 returns what one call does, the written rows included"

# the daemons are still serving
kill -0 "${EMB_PID[0]}" && kill -0 "${DP_PID[0]}"; expect "both daemons survived every refused request"
grep -q "reason=limit keys=1048577 embedding.max_lookup_keys=1048576" "$WORK/emb-0.log"
expect "the server logs the refused call with the limit"
finish
