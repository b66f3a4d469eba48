#!/usr/bin/env python3
"""Horovod + PyTorch CNN on Fashion-MNIST: ordinary Horovod usage, no dgcshim code.

The training loop is Horovod's documented recipe (hvd.init, the optimizer wrapped
in hvd.DistributedOptimizer, parameters broadcast from rank 0, each rank on its
own shard); Horovod all-reduces the gradients with MPI_Allreduce (a Horovod built
with HOROVOD_CPU_OPERATIONS=MPI). Run it with and without the shim:

  mpirun -np 4 .venv/horovod-torch/bin/python ld_preload_examples/horovod_torch_fashion.py --epochs 1
  mpirun -np 4 -x HOROVOD_FUSION_THRESHOLD=0 -x LD_PRELOAD=$PWD/build/libdgcshim.so -x DGC_STATS=1 \\
      -x DGC_MIN_ELEMENTS=1 -x DGC_WARMUP_STEPS=468 -x DGC_MOMENTUM=0.9 \\
      .venv/horovod-torch/bin/python ld_preload_examples/horovod_torch_fashion.py --epochs 1

HOROVOD_FUSION_THRESHOLD=0 matters: with Horovod's default tensor fusion the
gradients travel packed in one fusion buffer whose contents change from step
to step, so the shim's residual at an offset would belong to another tensor
the next step (the shim warns when it sees this). With fusion off each
gradient is all-reduced in place, at its own address, every step, and
DGC_MIN_ELEMENTS=1 compresses the biases too (safe here: this script's metrics
are float64, which the shim passes through). The script itself is the same
either way (scripts/horovod_side_by_side.sh runs it dense
and compressed).

The model, data and output lines are torch_mpi_cnn.py's (same CNN, same
shards rank, rank+N, ..., same seeds), so the two can be compared:

  epoch 1 loss 0.5123 test_acc 0.8512 epoch_s 30.1
  ranks_identical yes
  final test_acc 0.8801 params N steps S wall_s W

--groups 1 passes groups=1 to hvd.DistributedOptimizer (all gradients in one
fused all-reduce of a stable layout): the other way to keep residuals apart,
at the cost of a one-argument change to the script.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import horovod
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_mpi_cnn import CNN, DEFAULT_DATA, load_split, params_crc  # noqa: E402


def evaluate(model, x, y, rank, size):
    model.eval()
    xs, ys = x[rank::size], y[rank::size]
    correct = 0
    with torch.no_grad():
        for i in range(0, xs.shape[0], 1000):
            correct += int((model(xs[i:i + 1000]).argmax(dim=1) == ys[i:i + 1000]).sum())
    model.train()
    totals = hvd.allreduce(torch.tensor([correct, xs.shape[0]], dtype=torch.float64), op=hvd.Sum, name="eval")
    return float(totals[0] / totals[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--groups", type=int, default=0, help="groups= of DistributedOptimizer (0: Horovod's default)")
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--data", default=DEFAULT_DATA)
    args = ap.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # see torch_mpi_cnn.py: sparse updates leave denormal momentum

    x_train, y_train = load_split(args.data, "train", args.train_limit)
    x_test, y_test = load_split(args.data, "t10k", 0)
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    steps_per_epoch = (x_train.shape[0] // size) // args.batch

    torch.manual_seed(args.seed)
    model = CNN()
    nparams = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    extra = {"groups": args.groups} if args.groups else {}
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **extra)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if rank == 0:
        print(f"horovod_torch_fashion: {size} ranks, horovod {horovod.__version__}, params {nparams}, "
              f"batch {args.batch}/rank, {steps_per_epoch} steps/epoch, lr {args.lr}, momentum {args.momentum}, "
              f"groups {args.groups or 'default'}, HOROVOD_FUSION_THRESHOLD="
              f"{os.environ.get('HOROVOD_FUSION_THRESHOLD', '(default)')}, "
              f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}", flush=True)

    total_steps, wall_s, acc = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        gen = torch.Generator()
        gen.manual_seed(args.seed + rank + epoch)
        perm = torch.randperm(x_shard.shape[0], generator=gen)
        loss_sum = 0.0
        t_epoch = time.perf_counter()
        for step in range(steps_per_epoch):
            idx = perm[step * args.batch:(step + 1) * args.batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        epoch_s = time.perf_counter() - t_epoch
        total_steps += steps_per_epoch
        wall_s += epoch_s
        mean_loss = float(hvd.allreduce(torch.tensor([loss_sum / steps_per_epoch], dtype=torch.float64),
                                        name="loss"))
        acc = evaluate(model, x_test, y_test, rank, size)
        if rank == 0:
            print(f"epoch {epoch} loss {mean_loss:.4f} test_acc {acc:.4f} epoch_s {epoch_s:.1f}", flush=True)

    crcs = hvd.allgather_object(params_crc(model))
    if rank == 0:
        same = len(set(crcs)) == 1
        print(f"ranks_identical {'yes' if same else 'NO: ' + ' '.join(f'{c:08x}' for c in crcs)}", flush=True)
        print(f"final test_acc {acc:.4f} params {nparams} steps {total_steps} wall_s {wall_s:.1f}", flush=True)


if __name__ == "__main__":
    main()
