#!/usr/bin/python3
"""Summarizes bench/convergence_node.sh's logs: results.csv (one row per run) and a table
of mean final test accuracy per trainer x config x layout, with each seed.

  convergence_node_summary.py LOG_DIR OUT_DIR

Log names are TRAINER_CONFIG_sSEED.log (layout-independent: dense, and flat
without DGC_NODE_SIZE) or TRAINER_CONFIG_nL_sSEED.log (DGC_NODE_SIZE=L: 8/L
nodes of L ranks).
"""
import csv
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from convergence_report import parse  # noqa: E402

NAME = re.compile(r"^(c|torch)_(dense|flat|node)(?:_n(\d+))?_s(\d+)\.log$")


def main():
    logs, out = sys.argv[1], sys.argv[2]
    rows = []
    for name in sorted(os.listdir(logs)):
        m = NAME.match(name)
        if not m:
            continue
        trainer, cfg, L, seed = m.group(1), m.group(2), m.group(3), int(m.group(4))
        try:
            epochs, final, stats, ranks = parse(os.path.join(logs, name))
        except SystemExit as e:
            print(f"skipped: {e}")
            continue
        layout = f"{ranks // int(L)}x{L}" if L else "-"
        rows.append({"trainer": trainer, "config": cfg, "layout": layout, "node_size": L or "",
                     "seed": seed, "ranks": ranks, "epochs": len(epochs), "steps": final["steps"],
                     "test_acc": f"{float(final['test_acc']):.4f}",
                     "weights_identical": final.get("weights_identical", ""),
                     "bytes_per_rank": stats["wire"] if stats else "",
                     "ratio_after_warmup": stats["last_ratio"] if stats else "", "wall_s": final["wall_s"]})
    order = {"dense": 0, "flat": 1, "node": 2}
    rows.sort(key=lambda r: (r["trainer"] != "c", order[r["config"]], r["layout"], r["seed"]))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    groups = {}
    for r in rows:
        groups.setdefault((r["trainer"], r["config"], r["layout"]), {})[r["seed"]] = float(r["test_acc"])
    print(f"{'model':<6} {'config':<6} {'layout':<6} {'mean %':>7} {'sd':>5}  per seed (%)")
    means = {}
    for (t, c, lay), accs in groups.items():
        means[(t, c, lay)] = statistics.mean(accs.values())
        each = "  ".join(f"s{s} {100 * a:.2f}" for s, a in sorted(accs.items()))
        sd = 100 * statistics.stdev(accs.values()) if len(accs) > 1 else 0.0
        print(f"{t:<6} {c:<6} {lay:<6} {100 * means[(t, c, lay)]:>7.3f} {sd:>5.2f}  {each}")
    print()
    for (t, c, lay), accs in groups.items():
        if c not in ("node", "flat") or (c, lay) == ("flat", "-"):
            refs = ("dense",) if c == "flat" else ()
        else:
            refs = ("flat", "dense") if c == "node" else ("flat",)
        for ref in refs:
            base = groups.get((t, ref, "-"))
            if not base:
                continue
            common = sorted(set(base) & set(accs))
            d = [100 * (accs[s] - base[s]) for s in common]
            verdict = "within" if abs(statistics.mean(d)) <= 0.3 else "NOT within"
            print(f"{t} {c} {lay} - {ref}: mean {statistics.mean(d):+.3f} points over seeds {common} "
                  f"(per seed {' '.join(f'{x:+.2f}' for x in d)}): {verdict} 0.3")
    print(f"wrote {os.path.join(out, 'results.csv')}")


if __name__ == "__main__":
    main()
