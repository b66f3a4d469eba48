#!/usr/bin/env python3
"""What the CUDA engine is measured against, on the same GPU: torch.topk, a naive
torch momentum + residual update, the official DGC compressor, and the device
copy bandwidth (the roofline).

For each n (default 25M and 100M fp32) at --sparsity (0.999: k = ceil(0.001 n)):

  topk          torch.topk(v.abs(), k, sorted=False): exact top-k selection alone
  naive_update  u.mul_(m).add_(g); v.add_(u): the momentum correction and
                residual accumulation alone, as two torch kernels (24 B/elem)
  official_dgc  DGCCompressor.compress + decompress of synxlin/deep-gradient-
                compression (fetched unmodified at a pinned commit by
                scripts/fetch-upstream.sh official-dgc; --official-dgc DIR),
                momentum 0.9 (DGCSGDMemory), sample ratio 0.01: momentum
                correction, residual, sampled threshold with its adaptation
                loop, masking; decompress of --ranks gathered payloads (this
                rank's, repeated: the all-gather itself is not timed)
  roofline_24B  24 bytes per element (read g, u, v; write u, v; zero the
                output) at the copy bandwidth: the least time any engine step
                can take; the engine's goal is at least half of it

copy: torch.clone of a --copy-mb tensor, 2 x bytes / time (read + write); the
roofline uses the best rep, the table also shows the median.

Every figure is the median (and min) of --reps CUDA-event timings after
--warmup untimed ones; inputs are refreshed outside the timed region. The
gradient is synthetic: normal values whose scale changes every 64K elements
over three decades, as from layer to layer.

  python3 bench/gpu/torch_baselines.py [--sizes 25000000,100000000] [--csv FILE]
"""
import argparse
import contextlib
import io
import math
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOFLINE_BYTES_PER_ELEM = 24


def cuda_times(fn, reps, warmup, before=None):
    """Milliseconds of fn() per rep, by CUDA events; before() runs untimed ahead of each call."""
    times = []
    for i in range(warmup + reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return times


def gradient(n, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    g = torch.randn(n, device=device, generator=gen)
    blocks = (n + 65535) // 65536
    scale = torch.pow(10.0, -3.0 * torch.rand(blocks, device=device, generator=gen))
    return g.mul_(scale.repeat_interleave(65536)[:n])


def copy_bandwidth(mb, reps, warmup, device):
    """(best, median) GB/s of x.clone(), counting read + write."""
    x = torch.empty(mb * (1 << 20) // 4, dtype=torch.float32, device=device).uniform_()
    holder = []

    def clone():
        holder.clear()
        holder.append(x.clone())

    ms = cuda_times(clone, reps, warmup)
    nbytes = 2 * x.numel() * 4
    return nbytes / min(ms) / 1e6, nbytes / statistics.median(ms) / 1e6


def torch_ops(n, k, momentum, reps, warmup, device):
    """Rows for torch.topk(|v|, k) and the naive two-kernel momentum + residual update."""
    g, u, v = gradient(n, device, 1), gradient(n, device, 2), gradient(n, device, 3)
    t = cuda_times(lambda: torch.topk(v.abs(), k, sorted=False), reps, warmup)
    rows = [("topk", n, k, statistics.median(t), min(t), "torch.topk(|v|, k, sorted=False)")]
    u0, v0 = u.clone(), v.clone()

    def reset():
        u.copy_(u0)
        v.copy_(v0)

    def naive():
        u.mul_(momentum).add_(g)
        v.add_(u)

    t = cuda_times(naive, reps, warmup, before=reset)
    rows.append(("naive_update", n, k, statistics.median(t), min(t), "u = m*u + g; v += u (torch ops)"))
    return rows


def official_dgc_dir(given):
    """Where the official DGC compressor's files are: given, else the copy the device session carries
    (.gpu/official-dgc), else scripts/fetch-upstream.sh's (.upstream/official-dgc); None when none holds them."""
    root = os.path.dirname(os.path.dirname(HERE))
    for d in [given] if given else [os.path.join(root, ".gpu", "official-dgc"), os.path.join(root, ".upstream", "official-dgc")]:
        if d and os.path.isfile(os.path.join(d, "dgc", "compression.py")):
            return d
    return None


def official_dgc(where, n, k_ratio, momentum, ranks, reps, warmup, device, seed):
    """Times of DGCCompressor.compress + decompress (CUDA events around each, gather in between untimed)."""
    stub = os.path.join(HERE, "horovod_stub")
    for d in (where, stub):  # the stand-in first: before any real Horovod
        if d in sys.path:
            sys.path.remove(d)
        sys.path.insert(0, d)
    import horovod.torch as hvd_stub  # the stand-in in horovod_stub/ (see its README)
    from dgc.compression import DGCCompressor
    from dgc.memory import DGCSGDMemory

    hvd_stub.set_size(ranks)
    memory = DGCSGDMemory(momentum=momentum)
    compressor = DGCCompressor(compress_ratio=k_ratio, memory=memory, sample_ratio=0.01)
    name = "grad"
    g0 = gradient(n, device, seed)
    grad = torch.empty_like(g0)
    with contextlib.redirect_stdout(io.StringIO()):  # its set-up lines
        memory.initialize([(name, grad)])
        compressor.initialize([(name, grad)])
    times = []
    for i in range(warmup + reps):
        grad.copy_(g0)  # decompress writes the result into the gradient tensor
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        e[0].record()
        (values, indices), ctx = compressor.compress(grad, name)
        e[1].record()
        gathered = (torch.cat([values] * ranks), torch.cat([indices] * ranks))  # what the all-gather returns
        e[2].record()
        compressor.decompress(gathered, ctx)
        e[3].record()
        e[3].synchronize()
        if i >= warmup:
            times.append(e[0].elapsed_time(e[1]) + e[2].elapsed_time(e[3]))
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="25000000,100000000", help="element counts, comma-separated")
    ap.add_argument("--sparsity", type=float, default=0.999)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--ranks", type=int, default=1, help="payloads official_dgc decompresses (default 1)")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--copy-mb", type=int, default=1024, help="size of the copy-bandwidth tensor (MiB)")
    ap.add_argument("--skip-official", action="store_true", help="leave out the official DGC compressor")
    ap.add_argument("--official-dgc", metavar="DIR",
                    help="the official DGC compressor's files (default .gpu/official-dgc, else .upstream/official-dgc: "
                         "scripts/fetch-upstream.sh official-dgc)")
    ap.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout)")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_baselines.py: no CUDA device (this benchmark runs on the GPU)")
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    sizes = [int(s) for s in args.sizes.split(",")]
    density = round(1.0 - args.sparsity, 12)  # 0.001, not 0.0010000000000000009 (k = 25001 at 25M)
    official = None if args.skip_official else official_dgc_dir(args.official_dgc)
    if not args.skip_official and official is None:
        print("SKIPPED official_dgc: the official DGC compressor is not here (fetch it with "
              "scripts/fetch-upstream.sh official-dgc, or give --official-dgc DIR)", flush=True)

    rows = []  # (name, n, k, median_ms, min_ms, note)
    best_gbps, med_gbps = copy_bandwidth(args.copy_mb, args.reps, args.warmup, device)
    rows.append(("copy_clone", args.copy_mb * (1 << 20) // 4, 0, 2 * args.copy_mb * (1 << 20) / med_gbps / 1e6,
                 2 * args.copy_mb * (1 << 20) / best_gbps / 1e6,
                 f"{best_gbps:.0f} GB/s best, {med_gbps:.0f} GB/s median (read + write)"))
    for n in sizes:
        k = math.ceil(density * n)
        rows += torch_ops(n, k, args.momentum, args.reps, args.warmup, device)
        torch.cuda.empty_cache()

        if official:
            t = official_dgc(official, n, density, args.momentum, args.ranks, args.reps, args.warmup, device, 4)
            rows.append(("official_dgc", n, k, statistics.median(t), min(t),
                         f"compress + decompress of {args.ranks} payload(s), momentum {args.momentum}"))
            torch.cuda.empty_cache()

        roof = ROOFLINE_BYTES_PER_ELEM * n / best_gbps / 1e6
        rows.append(("roofline_24B", n, k, roof, roof, f"{ROOFLINE_BYTES_PER_ELEM} B/elem at {best_gbps:.0f} GB/s"))

    print(f"# torch_baselines: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, sparsity {args.sparsity}, momentum {args.momentum}, "
          f"median and min of {args.reps} reps (CUDA events) after {args.warmup} warm-up")
    print(f"{'name':<14} {'n':>11} {'k':>8} {'median ms':>10} {'min ms':>9}  note")
    for name, n, k, med, mn, note in rows:
        print(f"{name:<14} {n:>11} {k:>8} {med:>10.4f} {mn:>9.4f}  {note}")
    if args.csv:
        lines = ["name,n,k,median_ms,min_ms,copy_gbps_best,copy_gbps_median"]
        lines += [f"{name},{n},{k},{med:.6f},{mn:.6f},{best_gbps:.1f},{med_gbps:.1f}" for name, n, k, med, mn, _ in rows]
        text = "\n".join(lines) + "\n"
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            with open(args.csv, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
