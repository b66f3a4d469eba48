"""ddp.memory_fit's trainer: PyTorch DDP whose own memory (parameters,
gradients, SGD momentum, DDP's buckets: about 16 bytes a parameter) takes
--fraction of the GPU's memory over all ranks sharing it, for --steps steps
with SGD momentum under the shim. Prints, per rank, PyTorch's reserved
memory (now and at its peak) and one line: FINISHED, or RAISED with what
PyTorch raised (an out-of-memory error among them). The shim's own state
bytes are in its STATS lines at exit (DGC_STATS=1, set by memory_fit.sh).
"""
import argparse
import os

import torch
import torch.distributed as dist
from outcome import run_reported


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fraction", type=float, default=0.6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--width", type=int, default=8192)
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    gib = 1 << 30

    def train():
        dist.init_process_group("nccl")
        free, total = torch.cuda.mem_get_info(dev)
        sharing = world // max(1, torch.cuda.device_count())  # ranks on this GPU
        params = int(a.fraction * total / max(1, sharing) / 16)
        layers = max(1, params // (a.width * a.width))
        model = torch.nn.Sequential(
            *[torch.nn.Linear(a.width, a.width, device=dev) for _ in range(layers)]
        )
        n = sum(p.numel() for p in model.parameters())
        print(f"rank {rank}: {layers} layers, {n} parameters ({16 * n / gib:.1f} GiB with gradients, momentum and "
              f"DDP's buckets) on a GPU of {total / gib:.1f} GiB shared by {sharing} ranks", flush=True)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-4, momentum=0.9)
        for step in range(a.steps):
            x = torch.randn(8, a.width, device=dev)
            loss = ddp(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            print(f"rank {rank}: step {step} reserved {torch.cuda.memory_reserved(dev) / gib:.2f} GiB, peak "
                  f"{torch.cuda.max_memory_reserved(dev) / gib:.2f} GiB, device free "
                  f"{torch.cuda.mem_get_info(dev)[0] / gib:.2f} GiB", flush=True)
        dist.destroy_process_group()
        return f"{a.steps} steps"

    run_reported(rank, train)


if __name__ == "__main__":
    main()
