#!/usr/bin/env python3
"""Data-parallel PyTorch training on GPUs with DistributedDataParallel (NCCL).

An ordinary DDP script that knows nothing of dgcshim: an MLP (784-2048-2048-10,
5,824,522 parameters) on Fashion-MNIST, torch.optim.SGD with momentum 0.9,
gradients averaged by DDP's own bucketed ncclAllReduce. Launch it with torchrun
(it reads LOCAL_RANK, RANK and WORLD_SIZE), plainly or under LD_PRELOAD:

  torchrun --nproc_per_node=2 ld_preload_examples/ddp_train.py
  LD_PRELOAD=$PWD/build/libdgcshim.so DGC_MOMENTUM=0.9 DGC_WARMUP_STEPS=468 DGC_STATS=1 \\
      torchrun --nproc_per_node=2 ld_preload_examples/ddp_train.py

Devices: rank r uses cuda:LOCAL_RANK when the node has a GPU per local rank;
when it has fewer, every rank uses cuda:0 (--device-per-rank on/off forces one
or the other). Two ranks of one NCCL communicator on one GPU need NCCL 2.30 or
later with NCCL_MULTI_RANK_GPU_ENABLE=1. Without CUDA it runs on the CPU with
the gloo backend (slowly).

Data: the IDX .gz files of Fashion-MNIST (Debian's dataset-fashion-mnist, or
--data DIR), read with gzip and numpy, kept on the device; or --synthetic, a
fixed random data set of the same shape (learnable: labels from a random
linear map). Rank r trains on samples r, r+N, ..., reshuffled every epoch; all
ranks run the same number of steps. Every rank builds the model from the same
seed, and DDP broadcasts rank 0's parameters at start anyway.

Output on rank 0 (per epoch, then at the end), and one line per rank:

  epoch 1 loss 0.5321 test_acc 0.8512 epoch_s 1.9 step_ms 1.210
  final test_acc 0.8801 params 5824522 steps 1404 step_ms 1.234 world 2 device cuda:0
  rank 0 params_sha256 9f2c...
  ranks_identical yes

step_ms is the mean wall time of a training step (forward, backward with
DDP's all-reduces, optimizer step), on the epoch line over that epoch's
steps, on the final line over the whole run, both leaving out the first
--skip-steps steps of the run (device synchronised at both ends, evaluation
excluded).
params_sha256 is the SHA-256 of all parameters' bytes, concatenated in
model.parameters() order: equal on every rank when their weights are
bitwise identical.
"""
import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics


def read_idx(path, ndim):
    """A gzip'd IDX file of unsigned bytes (magic 0x08 type, ndim dimensions) as a numpy array."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    if magic != 0x0800 | ndim:
        raise ValueError(f"{path}: IDX magic 0x{magic:08x}, expected 0x{0x0800 | ndim:08x}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} data bytes, header says {dims}")
    return data.reshape(dims)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 1)
    x = (torch.from_numpy(images.reshape(len(images), -1).astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def synthetic_split(n, seed):
    """n random 784-pixel inputs, labelled by a fixed random linear map (the same for both splits)."""
    w = torch.randn(784, 10, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, 784, generator=torch.Generator().manual_seed(seed))
    return x, (x @ w).argmax(dim=1)


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        sizes = [784] + hidden + [10]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def evaluate(model, x, y, batch=2000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(dim=1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def params_sha256(model):
    h = hashlib.sha256()
    with torch.no_grad():
        for p in model.parameters():
            h.update(p.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def pick_device(mode, local_rank, local_world):
    if not torch.cuda.is_available():
        return torch.device("cpu")
    per_rank = {"on": True, "off": False}.get(mode, local_world <= torch.cuda.device_count())
    return torch.device("cuda", local_rank if per_rank else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64, help="per-rank batch size (default 64)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", default="2048,2048", help="hidden layer widths (default 2048,2048)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DEFAULT_DATA, help=f"directory of the IDX .gz files (default {DEFAULT_DATA})")
    ap.add_argument("--synthetic", action="store_true", help="random data of Fashion-MNIST's shape, no files")
    ap.add_argument("--device-per-rank", choices=["auto", "on", "off"], default="auto",
                    help="on: cuda:LOCAL_RANK; off: every rank on cuda:0; auto (default): on when the node "
                         "has a GPU per local rank")
    ap.add_argument("--skip-steps", type=int, default=20, help="steps left out of step_ms (default 20)")
    args = ap.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = pick_device(args.device_per_rank, local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    try:
        if args.synthetic:
            (x_train, y_train), (x_test, y_test) = synthetic_split(60000, 1), synthetic_split(10000, 2)
        else:
            (x_train, y_train), (x_test, y_test) = load_split(args.data, "train"), load_split(args.data, "t10k")
    except (OSError, ValueError) as e:
        print(f"rank {rank}: cannot read Fashion-MNIST ({e}); give --data DIR or --synthetic",
              file=sys.stderr, flush=True)
        sys.exit(2)
    x_shard, y_shard = x_train[rank::world].to(device), y_train[rank::world].to(device)
    x_test, y_test = x_test.to(device), y_test.to(device)
    steps_per_epoch = (len(x_train) // world) // args.batch_size

    torch.manual_seed(args.seed)
    model = DDP(MLP([int(h) for h in args.hidden.split(",")]).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        gpu, nccl = "cpu", "-"
        if device.type == "cuda":
            gpu, nccl = torch.cuda.get_device_name(device), torch.cuda.nccl.version()
            nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        print(f"ddp_train: world {world}, device {device} ({gpu}), torch {torch.__version__}, nccl {nccl}, "
              f"params {nparams}, batch {args.batch_size}/rank, {steps_per_epoch} steps/epoch, lr {args.lr}, "
              f"momentum {args.momentum}, data {'synthetic' if args.synthetic else args.data}", flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step, timed_steps, timed_s, acc = 0, 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(len(x_shard), generator=torch.Generator().manual_seed(args.seed + 1000 * epoch + rank))
        perm = perm.to(device)
        loss_sum = torch.zeros((), device=device)
        sync()
        t_epoch = t0 = time.perf_counter()
        for i in range(steps_per_epoch):
            if step == args.skip_steps:
                sync()
                t0 = time.perf_counter()
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            step += 1
        sync()
        t1 = time.perf_counter()
        epoch_steps = step - max(args.skip_steps, step - steps_per_epoch)  # timed steps of this epoch
        if epoch_steps > 0:
            timed_steps += epoch_steps
            timed_s += t1 - t0
        acc = evaluate(model, x_test, y_test)
        if rank == 0:
            epoch_ms = f"{1000.0 * (t1 - t0) / epoch_steps:.3f}" if epoch_steps > 0 else "nan"
            print(f"epoch {epoch} loss {loss_sum.item() / steps_per_epoch:.4f} test_acc {acc:.4f} "
                  f"epoch_s {t1 - t_epoch:.1f} step_ms {epoch_ms}", flush=True)

    step_ms = 1000.0 * timed_s / timed_steps if timed_steps else float("nan")
    digest = params_sha256(model.module)
    print(f"rank {rank} params_sha256 {digest}", flush=True)
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    if rank == 0:
        print(f"final test_acc {acc:.4f} params {nparams} steps {step} step_ms {step_ms:.3f} world {world} "
              f"device {device}", flush=True)
        print(f"ranks_identical {'yes' if len(set(digests)) == 1 else 'NO'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
