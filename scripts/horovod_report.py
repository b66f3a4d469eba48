#!/usr/bin/env python3
"""Table of scripts/horovod_side_by_side.sh's runs: accuracy, bytes, ratio.

  horovod_report.py LOG[:PARAMS:STEPS]...

Each log is one run (rank 0's output, DGC_STATS=1) of
ld_preload_examples/horovod_torch_fashion.py, whose 'final' line gives the
accuracy, parameters and steps, or of Horovod's own pytorch_mnist.py, whose
last 'Accuracy: x%' line gives the accuracy; PARAMS and STEPS then come with
the path. The first run without DGC_STATS rows is the dense baseline of the
runs after it. Bytes are what rank 0 put into the gradient exchange:
dense, 4 bytes per parameter per step; under the shim, the payloads of the
buffers it compressed (DGC_STATS rows, freed ones included) plus 4 bytes per
element of every gradient it passed through (the parameters no row covers).
"after warmup" is one step at the end: each row's last payload plus the
passed-through gradients, against 4 bytes per parameter ("-" when a fusion
buffer changed its layout from step to step).
"""
import os
import re
import sys


def fields(line):
    w = line.split()
    return {w[i]: w[i + 1] for i in range(len(w) - 1)}


def parse(arg):
    path, *given = arg.split(":")
    final, rows, warned = None, [], False
    with open(path) as f:
        for line in f:
            m = re.search(r"Test set: .*Accuracy: ([0-9.]+)%", line)
            if m and given:
                final = {"test_acc": float(m.group(1)) / 100, "params": given[0], "steps": given[1]}
            if line.startswith("final "):
                final = fields(line)
            elif "a fusion buffer that packs" in line:
                warned = True
            m = re.search(r"dgcshim STATS (0x[0-9a-f<x*]+)\s+(\d+)\s+(\d+)\s+\d+\s+(\d+)\s+(\d+)\s+\S+\s+([0-9.]+)x", line)
            if m:
                label, count, calls, dense, wire, last = m.groups()
                rows.append((label, int(count), int(calls), int(dense), int(wire), float(last)))
    if final is None:
        raise SystemExit(f"{path}: no 'final' (or 'Accuracy:') line: the run failed, see the log")
    return path, final, rows, warned


def main():
    fmt = "{:<18} {:>9} {:>8} {:>13} {:>8} {:>12} {:>8} {:>7}  {}"
    print(fmt.format("run", "test_acc", "vs dense", "bytes/rank", "ratio", "after warmup", "buffers", "warned",
                     "counts compressed"))
    dense_acc = None
    for arg in sys.argv[1:]:
        path, final, rows, warned = parse(arg)
        name = os.path.basename(path).rsplit(".", 1)[0]
        acc, n, steps = float(final["test_acc"]), int(final["params"]), int(final["steps"])
        dense = 4 * n * steps
        if not rows:
            dense_acc = acc
            wire, ratio, last = dense, 1.0, 1.0
            counts = "-"
        else:
            # Elements that went through compressed calls; the rest of each step's
            # gradient went through whole (small tensors under DGC_MIN_ELEMENTS).
            squeezed = sum(count * calls for _, count, calls, *_ in rows)
            wire = sum(r[4] for r in rows) + 4 * max(n * steps - squeezed, 0)
            ratio = dense / wire
            if all(calls == steps for _, _, calls, *_ in rows):  # one buffer per tensor, every step
                last_wire = sum(d / calls / lr for _, _, calls, d, _, lr in rows if lr > 0)
                last = 4 * n / (last_wire + 4 * max(n - sum(r[1] for r in rows), 0))
            else:  # a fusion buffer of changing layout: no steady step to speak of
                last = None
            counts = " ".join(str(r[1]) for r in sorted(rows, key=lambda r: -r[1]))
        delta = "-" if dense_acc is None or not rows else f"{100 * (acc - dense_acc):+.2f}"
        print(fmt.format(name, f"{acc:.4f}", delta, wire, f"{ratio:.1f}x", "-" if last is None else f"{last:.1f}x", len(rows),
                         "yes" if warned else "no", counts))


if __name__ == "__main__":
    main()
