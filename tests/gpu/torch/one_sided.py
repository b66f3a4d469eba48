"""ddp.shim_on_one_rank's trainer: a small DDP model on random data, under a
60 s process-group timeout. Prints one line: FINISHED, or RAISED with the
error PyTorch raised. The launcher (one_sided.sh) preloads the shim on rank 0
only."""
import datetime
import os

import torch
import torch.distributed as dist
from outcome import run_reported


def main():
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)

    def train():
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for _ in range(200):
            x = torch.randn(64, 512, device=dev)
            y = torch.randint(0, 10, (64,), device=dev)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
        return "200 steps"

    run_reported(rank, train)


if __name__ == "__main__":
    main()
