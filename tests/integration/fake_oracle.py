#!/usr/bin/python3
"""A fake chanter-oracle (Python grpcio, stubs generated from
proto/oracle.proto at test time) that sends one trainer a malformed Step,
to check that chanter-trainer refuses it with an error naming the field.

usage: fake_oracle.py STUB_DIR PORT_FILE CASE
Serves on 127.0.0.1 (a free port, written to PORT_FILE), a job of one
trainer.  CASE names what is wrong in Step 0 (see CASES).  Runs until killed.
"""
import struct
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
import oracle_pb2 as pb  # noqa: E402
import oracle_pb2_grpc as pbg  # noqa: E402

CASE = sys.argv[3]
# the job of test_trainer_bad_steps.sh: n_dense 2, tables of 50 and 40 rows,
# one-hot, batch 4, cache_rows 100
N, N_DENSE, TABLES = 4, 2, 2


def u32(*v):
    return struct.pack(f"<{len(v)}I", *v)


def u64(*v):
    return struct.pack(f"<{len(v)}Q", *v)


def good_step():
    s = pb.Step(iteration=0, global_batch=N)
    s.samples.n = N
    s.samples.n_dense = N_DENSE
    s.samples.n_tables = TABLES
    s.samples.hotness.extend([1, 1])
    s.samples.labels = struct.pack(f"<{N}f", *([1.0, 0.0] * (N // 2)))
    s.samples.dense = struct.pack(f"<{N * N_DENSE}f", *([0.5] * (N * N_DENSE)))
    s.samples.ids = u64(1, 2, 3, 1, 4, 5, 6, 4)  # table 0 then table 1
    s.slots = u32(0, 1, 2, 0, 3, 4, 5, 3)
    s.fetch_keys = b""  # the rows are "cached" already: nothing to fetch
    s.fetch_slots = b""
    s.prefetch_gate = 0
    return s


def bad_step():
    s = good_step()
    if CASE == "slots_short":
        s.slots = u32(0, 1, 2)
    elif CASE == "slot_beyond_cache":
        s.slots = u32(0, 1, 2, 0, 3, 4, 5, 100)
    elif CASE == "fetch_slots_mismatch":
        s.fetch_keys = u64(7, 8)
        s.fetch_slots = u32(6)
    elif CASE == "replicate_owner":
        s.replicate_slots = u32(1)
        s.replicate_owners = u32(5)
        s.replicate_keys = u64(2)
    elif CASE == "write_back_slots":
        s.write_back_keys = u64(1, 2)
        s.write_back_slots = u32(0, 1, 2)
    elif CASE == "samples_bytes":
        s.samples.ids = u64(1, 2, 3)
    elif CASE.startswith("part_"):  # table 1 partitioned (table_strategy), on rank 0
        # the only trainer: its samples are the whole batch, so partition_ids
        # carries nothing (the trainer takes table 1's ids from its samples),
        # and slots covers table 0's ids alone
        s.partition_owner = u32(0xFFFFFFFF, 0)
        s.partition_counts = u32(N)
        s.partition_ids = b""
        s.slots = u32(0, 1, 2, 0)
        if CASE == "part_owner_rank":
            s.partition_owner = u32(0xFFFFFFFF, 5)
        elif CASE == "part_ids_short":
            s.partition_ids = u64(4, 5)
        elif CASE == "part_id_beyond":
            s.samples.ids = u64(1, 2, 3, 1, 4, 5, 6, 40)
        elif CASE == "part_slot":
            s.slots = u32(0, 1, 2, 0, 3, 4, 5, 3)
        elif CASE == "part_counts":
            s.partition_counts = u32(N - 1)
        else:
            raise SystemExit(f"unknown case {CASE}")
    else:
        raise SystemExit(f"unknown case {CASE}")
    return s


class Oracle(pbg.OracleServicer):
    def __init__(self):
        self.kv = {}
        self.cv = threading.Condition()

    def Join(self, req, ctx):
        return pb.JoinResponse(job_id="fake", generation=1, trainers=1, start_iteration=0)

    def Heartbeat(self, req, ctx):
        return pb.HeartbeatResponse(stop=False)

    def KvSet(self, req, ctx):
        with self.cv:
            self.kv[req.key] = req.value
            self.cv.notify_all()
        return pb.KvSetResponse()

    def KvGet(self, req, ctx):
        deadline = time.time() + req.timeout_ms / 1000.0
        with self.cv:
            while req.key not in self.kv and time.time() < deadline:
                self.cv.wait(0.05)
            if req.key not in self.kv:
                ctx.abort(grpc.StatusCode.NOT_FOUND, "no such key")
            return pb.KvGetResponse(value=self.kv[req.key])

    def Work(self, it, ctx):
        next(it)  # Hello
        yield pb.WorkItem(step=bad_step())
        while ctx.is_active():
            time.sleep(0.1)


server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
pbg.add_OracleServicer_to_server(Oracle(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(port))
import os  # noqa: E402

os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.wait_for_termination()
