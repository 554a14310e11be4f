#!/usr/bin/env python3
"""The TorchRec baseline of docs/cpu.md: chanter's default job trained by
TorchRec on the same cores, to compare samples/s.

The job: DLRM (bottom 13-512-256-64-16, top 367-512-256-1, dot
interaction), batch 2048, 26 tables of ROWS rows, dim 16, SGD (lr 0.05) on
the MLPs and on the embeddings (FBGEMM's fused table-batched embedding
with its fused SGD, as DistributedModelParallel plans on the CPU), ids
uniform or Zipf(ALPHA) per table, drawn once before timing.

  python3 torchrec_dlrm.py [--rows 100000] [--alpha 0] [--iterations 150]
  torchrun --nproc-per-node 2 torchrec_dlrm.py ...   # two processes, gloo

Prints one JSON line: samples/s over the steady iterations (the 21st on),
and the whole run's wall time.  Not part of the product: TorchRec is not a
dependency; install it in a virtual environment (docs/cpu.md says how).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.models.dlrm import DLRM
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.distributed.fused_params import FUSED_PARAM_REGISTER_TBE_BOOL  # noqa: F401  (version check)
from fbgemm_gpu.split_embedding_configs import EmbOptimType


def zipf_ids(rows, alpha, n, gen):
    if alpha == 0:
        return torch.randint(0, rows, (n,), generator=gen)
    w = torch.arange(1, rows + 1, dtype=torch.float64).pow(-alpha)
    return torch.multinomial(w, n, replacement=True, generator=gen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2048, help="global batch")
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--batches", type=int, default=20, help="distinct batches drawn, cycled")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / processes)")
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    threads = a.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    torch.manual_seed(42)

    tables = [EmbeddingBagConfig(name=f"t{t}", embedding_dim=a.dim, num_embeddings=a.rows,
                                 feature_names=[f"f{t}"]) for t in range(a.tables)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13,
                 dense_arch_layer_sizes=[512, 256, 64, a.dim], over_arch_layer_sizes=[512, 256, 1])
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.05}
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"))
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense = KeyedOptimizerWrapper(dict(p for p in dmp.named_parameters() if "embedding_bags" not in p[0]),
                                  lambda ps: torch.optim.SGD(ps, lr=0.05))
    loss_fn = torch.nn.BCEWithLogitsLoss()

    local = a.batch // world
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = []
    for _ in range(a.batches):
        ids = torch.cat([zipf_ids(a.rows, a.alpha, local, gen) for _ in range(a.tables)])
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{t}" for t in range(a.tables)], values=ids,
                                                  lengths=torch.ones(a.tables * local, dtype=torch.int32))
        batches.append((torch.rand(local, 13, generator=gen), kjt,
                        torch.randint(0, 2, (local,), generator=gen).float()))

    dist.barrier()
    t0 = time.perf_counter()
    steady = None
    for it in range(a.iterations):
        if it == 20:
            dist.barrier()
            steady = time.perf_counter()
        d, kjt, y = batches[it % a.batches]
        logits = dmp(d, kjt).squeeze(-1)
        loss = loss_fn(logits, y)
        dense.zero_grad()
        loss.backward()
        dense.step()
    dist.barrier()
    t1 = time.perf_counter()
    if rank == 0:
        n = a.iterations - 20
        print(json.dumps({"torch": torch.__version__, "processes": world, "threads": threads, "rows": a.rows,
                          "alpha": a.alpha, "iterations": a.iterations,
                          "steady_samples_per_sec": round(n * a.batch / (t1 - steady), 1),
                          "wall_seconds": round(t1 - t0, 3), "loss": round(float(loss), 5)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
