#!/usr/bin/env python3
"""Plain-PyTorch baseline of chanter's default DLRM, for tools/gpu/check.sh.

The same model and shape as `chanter train --local` with the default
model keys (common/cfg_keys.h): 26 tables of ROWS rows, dim 16, one id per
table, sum pooling (nn.EmbeddingBag); 13 dense features; bottom MLP
13-512-256-64-16 (ReLU after every layer, as chanter appends the embedding
dim as a hidden layer); dot interaction of the 27 vectors (the 351 pairs
below the diagonal) concatenated with the bottom output: 367 wide; top MLP
367-512-256-1 (ReLU but on the last); BCE with logits; plain SGD on dense
and embedding parameters; FP32 (TF32 off, as chanter's cuBLAS is FP32).
Ids are uniform over each table, dense features uniform, labels coin
flips; all batches are made on the GPU before timing, so the figure is
the model's step alone (chanter's includes its input pipeline).

Eager mode, no torch.compile, no fused optimizer: the baseline a user
gets from the obvious code.  Prints one JSON line per batch size:
{"batch": B, "samples_per_sec": ..., "ms_per_iter": ...}.
"""
import argparse
import json
import time

import torch
import torch.nn as nn


class DLRM(nn.Module):
    def __init__(self, tables, rows, dim, n_dense, bottom, top):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        layers, d = [], n_dense
        for h in bottom + [dim]:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.bottom = nn.Sequential(*layers)
        f = tables + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)
        layers, d = [], dim + f * (f - 1) // 2
        for h in top:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self.top = nn.Sequential(*layers)

    def forward(self, dense, ids, offsets):
        x = self.bottom(dense)
        e = [bag(ids[:, t], offsets) for t, bag in enumerate(self.emb)]
        z = torch.stack([x] + e, dim=1)                      # B x 27 x dim
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]  # B x 351
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def run(batch, args, dev):
    torch.manual_seed(1)
    m = DLRM(args.tables, args.rows, args.dim, args.dense, args.bottom, args.top).to(dev)
    m.li, m.lj = m.li.to(dev), m.lj.to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    nb = 8  # distinct batches, cycled
    data = [(torch.rand(batch, args.dense, device=dev),
             torch.randint(0, args.rows, (batch, args.tables), device=dev),
             torch.randint(0, 2, (batch,), device=dev).float()) for _ in range(nb)]
    offsets = torch.arange(batch, device=dev)

    def step(i):
        dense, ids, y = data[i % nb]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m(dense, ids, offsets), y)
        loss.backward()
        opt.step()
        return loss.detach()

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.iters):
        loss = step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"batch": batch, "samples_per_sec": round(batch * args.iters / dt, 1),
            "ms_per_iter": round(1e3 * dt / args.iters, 3), "last_loss": round(loss.item(), 5),
            "iters": args.iters, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[2048, 16384])
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--bottom", type=lambda s: [int(x) for x in s.split(",")], default=[512, 256, 64])
    p.add_argument("--top", type=lambda s: [int(x) for x in s.split(",")], default=[512, 256])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    for b in args.batch:
        print(json.dumps(run(b, args, dev)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
