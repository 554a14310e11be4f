#!/usr/bin/env python3
"""Protobuf seeds for the fuzz targets (run by make_seeds.sh, which puts
protoc's Python stubs on PYTHONPATH).  Each seed is the target's selector
byte (fuzz_util.h: which RPC; the targets' own first-byte modes) followed
by a packed valid message.  Also the manifest seeds (fuzz_manifest)."""
import hashlib
import os
import struct
import sys

import dataproc_pb2 as dp
import embedding_pb2 as em
import oracle_pb2 as orc

OUT = sys.argv[1]


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def u64s(*v):
    return struct.pack("<%dQ" % len(v), *v)


def u32s(*v):
    return struct.pack("<%dI" % len(v), *v)


def f32s(*v):
    return struct.pack("<%df" % len(v), *v)


def requests(target, module, service, examples):
    methods = module.DESCRIPTOR.services_by_name[service].methods
    for i, m in enumerate(methods):
        msg = examples.get(m.input_type.name)
        if msg is None:
            msg = getattr(module, m.input_type.name)()
        put(target, m.name, bytes([i]) + msg.SerializeToString())


key = lambda t, r: (t << 48) | r
requests("fuzz_requests_embedding", em, "Embedding", {
    "LookupRequest": em.LookupRequest(keys=u64s(key(0, 1), key(1, 7)), layout_hash=0x1234),
    "WriteBackRequest": em.WriteBackRequest(keys=u64s(key(0, 1)), rows=f32s(0.5, -1.0, 2.0, 0.0), layout_hash=0x1234,
                                            done=3, epoch=1),
    "CheckpointRequest": em.CheckpointRequest(id="ck-1"),
    "RestoreRequest": em.RestoreRequest(id="ck-1"),
    "PutBlobRequest": em.PutBlobRequest(name="dense", data=b"\x00\x01\x02"),
    "GetBlobRequest": em.GetBlobRequest(name="dense"),
    "SealCheckpointRequest": em.SealCheckpointRequest(id="ck-1"),
    "GetManifestRequest": em.GetManifestRequest(id="ck-1"),
    "DeleteCheckpointRequest": em.DeleteCheckpointRequest(id="ck-1"),
    "FenceRequest": em.FenceRequest(id="ck-1", iteration=4),
})

requests("fuzz_requests_oracle", orc, "Oracle", {
    "JoinRequest": orc.JoinRequest(role=orc.TRAINER, rank=1, address="127.0.0.1", schema_hash=5, layout_hash=6, pid=42),
    "HeartbeatRequest": orc.HeartbeatRequest(role=orc.DATAPROC, rank=0, iteration=3),
    "KvSetRequest": orc.KvSetRequest(key="gloo/0", value=b"addr"),
    "KvGetRequest": orc.KvGetRequest(key="gloo/0", timeout_ms=100),
    "TrainerMessage": orc.TrainerMessage(report=orc.Report(iteration=3, loss_sum=1.5, samples=4, t_total=0.01)),
    "StartRequest": orc.StartRequest(resume="latest"),
})
put("fuzz_requests_oracle", "Work_hello", bytes([4]) + orc.TrainerMessage(hello=orc.Hello(rank=1, next_iteration=2)).SerializeToString())
put("fuzz_requests_oracle", "Work_eval", bytes([4]) + orc.TrainerMessage(
    eval=orc.EvalResult(round=1, logits=f32s(0.1, 0.9), labels=f32s(0, 1))).SerializeToString())

# dataproc: even first byte = request (byte / 2 picks the RPC), odd = a Batch
for i, m in enumerate(dp.DESCRIPTOR.services_by_name["DataProc"].methods):
    ex = {"GetBatchRequest": dp.GetBatchRequest(iteration=5, batch_size=4, split=dp.TEST, schema_hash=9),
          "StreamRequest": dp.StreamRequest(first=2, count=3, batch_size=4)}.get(m.input_type.name)
    if ex is None:
        ex = getattr(dp, m.input_type.name)()
    put("fuzz_requests_dataproc", m.name, bytes([2 * i]) + ex.SerializeToString())
n, hot = 2, [1, 2, 1]
batch = dp.Batch(iteration=7, n=n, n_dense=2, n_tables=3, hotness=hot, labels=f32s(0, 1), dense=f32s(0.1, 0.2, 0.3, 0.4),
                 ids=u64s(*range(n * sum(hot))))
put("fuzz_requests_dataproc", "batch", b"\x01" + batch.SerializeToString())

# trainer WorkItems for the fuzz_trainer_work job: 2 dense, hotness 1,2,1, 256 slots, 2 trainers
samples = orc.Samples(n=n, n_dense=2, n_tables=3, hotness=hot, labels=f32s(1, 0), dense=f32s(0.5, 0.25, 0, 1),
                      ids=u64s(3, 4, 10, 11, 12, 13, 99, 98))
nid = n * sum(hot)
step = orc.Step(iteration=1, global_batch=4, samples=samples, fetch_keys=u64s(key(0, 3), key(0, 4)),
                fetch_slots=u32s(0, 1), slots=u32s(*range(nid)), write_back_keys=u64s(key(0, 3)), write_back_slots=u32s(0),
                sync_critical=u32s(0, 1), sync_delayed=u32s(2), evict_slots=u32s(5), prefetch_gate=1, lookahead=2,
                replicate_slots=u32s(6), replicate_owners=u32s(1), replicate_keys=u64s(key(2, 99)), owned_slots=u32s(7),
                stale_slots=u32s(3), epoch=1)
put("fuzz_trainer_work", "step_cache", b"\x00" + orc.WorkItem(step=step).SerializeToString())
ideal = orc.Step(iteration=1, global_batch=2, samples=samples, epoch=1)
put("fuzz_trainer_work", "step_ideal", b"\x01" + orc.WorkItem(step=ideal).SerializeToString())
put("fuzz_trainer_work", "eval", b"\x00" + orc.WorkItem(eval=orc.Eval(round=1, after_iteration=4, samples=samples,
                                                                     fetch_keys=u64s(key(0, 3)))).SerializeToString())
put("fuzz_trainer_work", "stop", b"\x00" + orc.WorkItem(stop=orc.StopWork(reason="done", job_state="done")).SerializeToString())
put("fuzz_trainer_work", "checkpoint", b"\x00" + orc.WorkItem(checkpoint=orc.CheckpointWork(
    id="ck-1", iteration=4, flush_keys=u64s(key(0, 3), key(1, 4)), flush_slots=u32s(0, 1), dense_blob="ck-1/dense",
    dense_server=0)).SerializeToString())
put("fuzz_trainer_work", "resume", b"\x00" + orc.WorkItem(resume=orc.ResumeWork(
    id="ck-1", start_iteration=5, dense_blob="ck-1/dense", dense_server=1, epoch=2)).SerializeToString())

# manifests (first byte odd: the target fixes the sha256 line)
body = "".join("%s=%s\n" % kv for kv in [
    ("chanter_checkpoint", "1"), ("id", "ck-1"), ("job_id", "job-1"), ("iteration", "4"), ("created_unix", "1700000000"),
    ("model", "dlrm"), ("model_shape", "dense=2 tables=3"), ("optimizer", "sgd"), ("embedding_optimizer", "sgd"),
    ("layout_hash", "00000000000000ab"), ("schema_hash", "00000000000000cd"), ("dataset", "synthetic"), ("seed", "7"),
    ("batch_size", "64"), ("iterations", "10"), ("trainers", "2"), ("embedding_servers", "2"), ("allocation", "hash"),
    ("lookahead", "2"), ("cache_rows", "256"), ("dense_server", "0"), ("dense_blob", "ck-1/dense"),
    ("oracle_blob", "ck-1/oracle"), ("oracle_sha256", "0" * 64), ("rows_flushed", "12"), ("server.0.bytes", "100"),
    ("server.1.bytes", "200")])
text = body + "sha256=" + hashlib.sha256(body.encode()).hexdigest() + "\n"
put("fuzz_manifest", "valid", b"\x00" + text.encode())
put("fuzz_manifest", "fixed_sha", b"\x01" + text.encode())
