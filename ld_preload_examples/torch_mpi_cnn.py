#!/usr/bin/python3
"""Data-parallel PyTorch CNN on Fashion-MNIST, averaged with mpi4py's MPI_Allreduce.

An ordinary training script that knows nothing of dgcshim: every step it
flattens all gradients into ONE preallocated float32 buffer, sums it across
ranks with comm.Allreduce(MPI.IN_PLACE, ..., op=MPI.SUM), divides by the number
of ranks and hands the average to an unmodified torch.optim.SGD. Run it with
and without LD_PRELOAD=libdgcshim.so to compare:

  mpirun -np 4 /usr/bin/python3 ld_preload_examples/torch_mpi_cnn.py --epochs 1
  mpirun -np 4 -x LD_PRELOAD=$PWD/build/libdgcshim.so -x DGC_STATS=1 \\
      -x DGC_WARMUP_STEPS=400 -x DGC_MOMENTUM=0.9 \\
      /usr/bin/python3 ld_preload_examples/torch_mpi_cnn.py --epochs 1

(With DGC_MOMENTUM = 0.9 the shim applies DGC's momentum correction itself and,
with DGC_COMPENSATE=1, its default, returns an update that this unmodified
SGD(momentum=0.9) turns into exactly the DGC step. With DGC_COMPENSATE=0 pass
--momentum 0 instead, as in the DGC paper.)

The flat gradient buffer is allocated once and the same memory is passed to
MPI every step: the shim keeps its residual per buffer address, so a fresh
allocation per step would start from an empty residual each time.

Rank r of N trains on its own shard of the training set (samples r, r+N, ...),
the same number of steps per epoch on every rank (from the smallest shard),
shuffled each epoch with a generator seeded by seed + rank + epoch. Every rank
builds the model after torch.manual_seed(seed), so all start identical.

Output on rank 0, per epoch and at the end:

  epoch 1 loss 0.5123 test_acc 0.8512 epoch_s 30.1 comm_s 1.2 compute_s 28.9
  ranks_identical yes
  final test_acc 0.8801 params N steps S wall_s W comm_s C compute_s X

loss is the mean training loss of the epoch averaged over ranks. Times are
rank 0's: comm_s is the time inside the gradient Allreduce (with the shim this
includes compression and decoding; on an oversubscribed machine it also
includes waiting for slower ranks), compute_s is the rest of the training loop
(batching, forward, backward, flatten, optimizer step), epoch_s = comm_s +
compute_s. Evaluation (test set split across ranks, batch 1000, no_grad) is
not included in epoch_s; wall_s is the sum of epoch_s. ranks_identical checks
that every rank ends with bitwise identical weights (CRC32 of the parameters).
The reductions of statistics use float64 Allreduce (MPI_DOUBLE), which the
shim passes through untouched.

Data: the IDX files of Debian's dataset-fashion-mnist package (gzip), read
with gzip and numpy; no torchvision, no downloads. Torch runs on the CPU with
one thread per rank.
"""
import argparse
import gzip
import os
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
IDX_MAGIC_IMAGES = 0x00000803  # unsigned byte, 3 dimensions
IDX_MAGIC_LABELS = 0x00000801  # unsigned byte, 1 dimension
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics


def read_idx(path, magic, ndim):
    """Read a gzip'd IDX file of unsigned bytes; check its magic number and size."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: too short for an IDX header")
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise ValueError(f"{path}: IDX magic 0x{got:08x}, expected 0x{magic:08x}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(raw) - offset != expected:
        raise ValueError(f"{path}: {len(raw) - offset} data bytes, header says {dims} = {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def load_split(data_dir, prefix, limit):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), IDX_MAGIC_IMAGES, 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), IDX_MAGIC_LABELS, 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{prefix}: {images.shape[0]} images but {labels.shape[0]} labels")
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(((images.astype(np.float32) / 255.0 - MEAN) / STD)[:, None, :, :].copy())
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def allreduce_sum(comm, values):
    """Sum a few float64 values over ranks (MPI_DOUBLE: passes through the shim)."""
    buf = np.array(values, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


def evaluate(model, comm, x, y, rank, size):
    """Accuracy on the test set; each rank scores samples rank, rank+N, ... in batches of 1000."""
    model.eval()
    xs, ys = x[rank::size], y[rank::size]
    correct = 0
    with torch.no_grad():
        for i in range(0, xs.shape[0], 1000):
            pred = model(xs[i:i + 1000]).argmax(dim=1)
            correct += int((pred == ys[i:i + 1000]).sum())
    model.train()
    correct_all, count_all = allreduce_sum(comm, [correct, xs.shape[0]])
    return correct_all / count_all


def params_crc(model):
    crc = 0
    with torch.no_grad():
        for p in model.parameters():
            crc = zlib.crc32(p.detach().contiguous().numpy().tobytes(), crc)
    return crc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9,
                    help="SGD momentum (default 0.9; keep it equal to DGC_MOMENTUM, or 0 with DGC_COMPENSATE=0)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-limit", type=int, default=0, help="use the first N training samples (0 = all)")
    ap.add_argument("--test-limit", type=int, default=0, help="use the first N test samples (0 = all)")
    ap.add_argument("--data", default=DEFAULT_DATA, help=f"directory of the IDX .gz files (default {DEFAULT_DATA})")
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    # Sparse updates leave most of SGD's momentum buffer decaying by m each
    # step with no new gradient: within a few hundred steps those entries are
    # denormal floats, which x86 computes on many times more slowly.
    torch.set_flush_denormal(True)

    try:
        x_train, y_train = load_split(args.data, "train", args.train_limit)
        x_test, y_test = load_split(args.data, "t10k", args.test_limit)
    except (OSError, ValueError) as e:
        print(f"rank {rank}: cannot read Fashion-MNIST: {e}", file=sys.stderr, flush=True)
        comm.Abort(2)

    # Shard: samples rank, rank+N, ...; every rank runs the steps the smallest shard allows.
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    steps_per_epoch = (x_train.shape[0] // size) // args.batch
    if steps_per_epoch < 1:
        if rank == 0:
            print(f"error: {x_train.shape[0]} training samples over {size} ranks is under one batch of "
                  f"{args.batch} per rank", file=sys.stderr, flush=True)
        comm.Abort(2)

    torch.manual_seed(args.seed)
    model = CNN()
    params = [p for p in model.parameters() if p.requires_grad]
    nparams = sum(p.numel() for p in params)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    # One contiguous float32 gradient buffer, allocated once; flat_np is a zero-copy
    # view of the same memory, passed to MPI every step (same address every step).
    flat = torch.zeros(nparams, dtype=torch.float32)
    flat_np = flat.numpy()
    flat_addr = flat_np.ctypes.data
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()

    crcs = comm.allgather(params_crc(model))
    if len(set(crcs)) != 1:
        if rank == 0:
            print(f"error: initial models differ between ranks: {crcs}", file=sys.stderr, flush=True)
        comm.Abort(3)

    if rank == 0:
        print(f"torch_mpi_cnn: {size} ranks, {x_train.shape[0]} train ({x_shard.shape[0]} on rank 0), "
              f"{x_test.shape[0]} test, params {nparams}, batch {args.batch}/rank, "
              f"{steps_per_epoch} steps/epoch, lr {args.lr}, momentum {args.momentum}, seed {args.seed}, "
              f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}", flush=True)

    total_steps, wall_s, comm_total, compute_total = 0, 0.0, 0.0, 0.0
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        gen = torch.Generator()
        gen.manual_seed(args.seed + rank + epoch)
        perm = torch.randperm(x_shard.shape[0], generator=gen)
        loss_sum, comm_s = 0.0, 0.0
        comm.Barrier()
        t_epoch = time.perf_counter()
        for step in range(steps_per_epoch):
            idx = perm[step * args.batch:(step + 1) * args.batch]
            xb, yb = x_shard[idx], y_shard[idx]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            for v, p in zip(views, params):
                v.copy_(p.grad)
            assert flat_np.ctypes.data == flat_addr
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, flat_np, op=MPI.SUM)
            comm_s += time.perf_counter() - t0
            flat.div_(size)
            for v, p in zip(views, params):
                p.grad.copy_(v)
            optimizer.step()
            loss_sum += loss.item()
        epoch_s = time.perf_counter() - t_epoch
        total_steps += steps_per_epoch
        wall_s += epoch_s
        comm_total += comm_s
        compute_total += epoch_s - comm_s
        mean_loss = allreduce_sum(comm, [loss_sum / steps_per_epoch])[0] / size
        acc = evaluate(model, comm, x_test, y_test, rank, size)
        if rank == 0:
            print(f"epoch {epoch} loss {mean_loss:.4f} test_acc {acc:.4f} epoch_s {epoch_s:.1f} "
                  f"comm_s {comm_s:.1f} compute_s {epoch_s - comm_s:.1f}", flush=True)

    crcs = comm.allgather(params_crc(model))
    if rank == 0:
        same = len(set(crcs)) == 1
        print(f"ranks_identical {'yes' if same else 'NO: ' + ' '.join(f'{c:08x}' for c in crcs)}", flush=True)
        print(f"final test_acc {acc:.4f} params {nparams} steps {total_steps} wall_s {wall_s:.1f} "
              f"comm_s {comm_total:.1f} compute_s {compute_total:.1f}", flush=True)


if __name__ == "__main__":
    main()
