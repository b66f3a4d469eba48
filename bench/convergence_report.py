#!/usr/bin/python3
"""Reads bench/convergence.sh's logs; prints the table, writes a CSV and a PNG.

  convergence_report.py LOG_DIR OUT_DIR [TAG]

Per run (trainer x config): the final test accuracy and its difference from
dense, bytes each rank contributed to the gradient exchange (4n per step
dense; the shim's payloads, from its DGC_STATS report), the compression ratio
over the run (warm-up included) and after warm-up (the last step's), and wall
time. The PNG has one panel per trainer: test accuracy per epoch. With TAG
(bench/convergence.sh's TAG), it reads TRAINER_CONFIG{TAG}.log and writes
convergence{TAG}.csv and convergence{TAG}.png.
"""
import csv
import os
import re
import sys

CONFIGS = [("dense", "dense (DGC_ENABLE=0)"), ("dgc", "DGC 99.9%, momentum 0.9, compensated"),
           ("gd", "gradient dropping 99.9% (DGC_MOMENTUM=0)"),
           ("reduce", "DGC as dgc, DGC_TRANSPORT=reduce"),
           ("flat", "DGC as dgc, DGC_TOPOLOGY=flat"), ("node", "DGC as dgc, DGC_TOPOLOGY=node")]
TRAINERS = [("c", "C MLP 784-512-512-10"), ("torch", "PyTorch CNN (mpi4py)")]


def fields(line):
    words = line.split()
    return {words[i]: words[i + 1] for i in range(len(words) - 1)}


def parse(path):
    epochs, final, stats, ranks = [], None, None, None
    with open(path) as f:
        for line in f:
            m = re.match(r"(?:mlp_trainer ranks|torch_mpi_cnn:) (\d+)", line)
            if m and ranks is None:
                ranks = int(m.group(1))
            if line.startswith("epoch "):
                epochs.append(fields(line))
            elif line.startswith("final "):
                final = fields(line)
            elif re.search(r"dgcshim STATS 0x", line):
                cols = line.split()
                at = next(i for i, c in enumerate(cols) if c.startswith("0x"))  # buffer count calls nonfinite dense wire ...
                stats = {"wire": int(cols[at + 5]), "ratio": cols[at + 6], "last_ratio": cols[at + 7]}
    if final is None:
        raise SystemExit(f"{path}: no 'final' line: the run failed, see the log")
    return epochs, final, stats, ranks


def main():
    logs, out = sys.argv[1], sys.argv[2]
    tag = sys.argv[3] if len(sys.argv) > 3 else ""
    rows, curves, ranks = [], {}, {}
    for trainer, tname in TRAINERS:
        dense_acc = None
        for cfg, cname in CONFIGS:
            path = os.path.join(logs, f"{trainer}_{cfg}{tag}.log")
            if not os.path.exists(path):
                continue
            epochs, final, stats, ranks[trainer] = parse(path)
            acc = float(final["test_acc"])
            n, steps = int(final["params"]), int(final["steps"])
            dense_bytes = 4 * n * steps
            if cfg == "dense":
                dense_acc = acc
                wire, ratio, last = dense_bytes, "1.0x", "1.0x"
            else:
                if stats is None:
                    raise SystemExit(f"{path}: no DGC_STATS buffer row: was the buffer compressed?")
                wire, ratio, last = stats["wire"], stats["ratio"], stats["last_ratio"]
            delta = "" if dense_acc is None else f"{100 * (acc - dense_acc):+.2f}"
            rows.append({"trainer": trainer, "config": cfg, "epochs": len(epochs), "params": n, "steps": steps,
                         "test_acc": f"{acc:.4f}", "delta_points": delta, "bytes_per_rank": wire,
                         "ratio": ratio, "ratio_after_warmup": last, "wall_s": final["wall_s"]})
            curves[(trainer, cfg)] = [float(e["test_acc"]) for e in epochs]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"convergence{tag}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    fmt = "{:<6} {:<6} {:>6} {:>9} {:>8} {:>15} {:>9} {:>12} {:>8}"
    print(fmt.format("model", "run", "epochs", "test_acc", "vs dense", "bytes/rank", "ratio", "after warmup",
                     "wall_s"))
    for r in rows:
        print(fmt.format(r["trainer"], r["config"], r["epochs"], r["test_acc"], r["delta_points"] or "-",
                         r["bytes_per_rank"], r["ratio"], r["ratio_after_warmup"], r["wall_s"]))
    plot(curves, ranks, os.path.join(out, f"convergence{tag}.png"))


def plot(curves, ranks, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    trainers = [t for t in TRAINERS if any((t[0], c) in curves for c, _ in CONFIGS)]
    fig, axes = plt.subplots(1, len(trainers), figsize=(6 * len(trainers), 4.2), squeeze=False)
    for ax, (trainer, tname) in zip(axes[0], trainers):
        for cfg, cname in CONFIGS:
            acc = curves.get((trainer, cfg))
            if acc:
                ax.plot(range(1, len(acc) + 1), [100 * a for a in acc], marker="o", label=cname)
        ax.set_title(f"{tname}, {ranks.get(trainer) or '?'} ranks, Fashion-MNIST")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
