#!/usr/bin/python3
"""Tables and a plot from bench/netns/sweep.sh's CSV.

    /usr/bin/python3 bench/netns/sweep_report.py [--csv bench/results/netns/allreduce.csv]
                                                 [--engine bench/results/netns/engine_1host.csv]
                                                 [--png bench/results/netns/allreduce.png] [--probe CSV]...

Per N, an nccl-tests-like table: size, time dense and shim (us), speedup, bytes
on the wire per rank per call (busiest host, launch traffic subtracted), the
ideal time of those bytes at 1 Gbit/s (125e6 B/s) and the fraction of it each
side reaches. Then, for every size that has a single-rank engine figure
(engine_1host.csv), the projection "with per-host compute": the engine time of a
rank with a core of its own plus the all-gather's time (ideal, and as measured by
probe runs that send the same payload from a small buffer: --probe), against dense.
The PNG: time per call against size, log-log, dense and shim per N, with the
ideal lines (measured bytes / 125e6 B/s).
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

LINK = 125e6  # bytes per second at 1 Gbit/s


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fsize(b):
    b = int(b)
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    if b >= 1 << 20:
        return "%.1fM" % (b / (1 << 20))
    return str(b)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    res = os.path.normpath(os.path.join(here, "..", "results", "netns"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", default=os.path.join(res, "allreduce.csv"))
    ap.add_argument("--engine", default=os.path.join(res, "engine_1host.csv"))
    ap.add_argument("--png", default=os.path.join(res, "allreduce.png"))
    ap.add_argument("--probe", action="append",
                    default=[os.path.join(res, "allgather_probe", "allreduce.csv"),
                             os.path.join(res, "allgather_probe_yield", "allreduce.csv")],
                    help="CSV of an all-gather probe run (repeatable)")
    a = ap.parse_args()

    rows = load(a.csv)
    if not rows:
        sys.exit("sweep_report.py: %s has no rows" % a.csv)
    by = defaultdict(dict)  # (hosts, bytes) -> mode -> row
    for r in rows:
        by[(int(r["hosts"]), int(r["bytes"]))][r["mode"]] = r
    hosts = sorted({h for h, _ in by})

    for n in hosts:
        sizes = sorted(b for h, b in by if h == n)
        print("\n# %d hosts, 1 Gbit/s each way; time per call (slowest rank's mean); bytes = per rank per call on "
              "eth0 (busiest host, launch traffic subtracted); ideal = bytes / 125e6 B/s" % n)
        hdr = ("size", "count", "dense_us", "shim_us", "speedup", "dense_wire", "shim_wire", "shim_counted",
               "ideal_dense", "ideal_shim", "frac_dense", "frac_shim", "busbw_dense", "engine_us")
        # engine_us: DGC_STATS engine time per call on rank 0, the warm-up call (allocation) included
        fmt = "%8s %10s %11s %10s %8s %12s %10s %12s %11s %10s %10s %9s %11s %10s"
        print(fmt % hdr)
        for b in sizes:
            d = by[(n, b)].get("dense")
            s = by[(n, b)].get("shim")
            if not d or not s:
                continue
            counted = int(s["shim_counted_bytes"]) * (n - 1)
            print(fmt % (fsize(b), b // 4, d["time_us"], s["time_us"], "%.1fx" % (float(d["time_us"]) / float(s["time_us"])),
                         d["wire_bytes_per_rank_per_call"], s["wire_bytes_per_rank_per_call"], counted,
                         d["ideal_us"], s["ideal_us"], "%.3f" % float(d["frac_ideal"]), "%.3f" % float(s["frac_ideal"]),
                         d["busbw_GBps"], s["engine_us_per_call"]))
        print("shim_counted = DGC_STATS payload per call x (N-1): what the all-gather must send from every rank; "
              "engine_us = DGC_STATS engine time per call, rank 0, warm-up call included")

    # Projection with per-host compute.
    eng = {}
    if os.path.exists(a.engine):
        for r in load(a.engine):
            eng[int(r["bytes"])] = float(r["engine_us_per_call"])
    # All-gather probes: shim runs with the same payload (same k) on a small buffer, so the
    # engine is small; all-gather time = call time - engine time (rank 0's, DGC_STATS).
    probes = {}  # (hosts, payload) -> [(label, us)]
    for pc in a.probe:
        if not os.path.exists(pc):
            continue
        for r in load(pc):
            if r["mode"] == "shim" and r["shim_counted_bytes"]:
                key = (int(r["hosts"]), int(r["shim_counted_bytes"]))
                probes.setdefault(key, []).append(
                    (os.path.basename(os.path.dirname(os.path.abspath(pc))), float(r["time_us"]) - float(r["engine_us_per_call"])))
    if eng:
        print("\n# projection with per-host compute: shim = engine time of one rank on a core of its own "
              "(np 1, no network, steady state) + the all-gather's time on the wire")
        print("#   ag_ideal = measured shim bytes per rank / 125e6 B/s; ag_probe = all-gather of the same payload "
              "measured on the cluster (probe run: time - engine)")
        fmt = "%5s %8s %11s %11s %10s %9s %9s %9s %10s %10s %9s %9s"
        print(fmt % ("hosts", "size", "dense_us", "dense_ideal", "shim_us", "engine_1", "ag_ideal", "ag_probe",
                     "proj_us", "x_dense", "x_ideal", "x_here"))
        for (n, b), m in sorted(by.items()):
            if b not in eng or "dense" not in m or "shim" not in m:
                continue
            d, s = m["dense"], m["shim"]
            ag_ideal = float(s["ideal_us"])
            cands = [("ideal", ag_ideal)] + probes.get((n, int(s["shim_counted_bytes"])), [])
            for label, ag in cands:
                proj = eng[b] + ag
                print(fmt % (n, fsize(b), d["time_us"], d["ideal_us"], s["time_us"], "%.1f" % eng[b], "%.1f" % ag_ideal,
                             "-" if label == "ideal" else "%.1f" % ag, "%.1f" % proj,
                             "%.1fx" % (float(d["time_us"]) / proj), "%.1fx" % (float(d["ideal_us"]) / proj),
                             "%.1fx" % (float(d["time_us"]) / float(s["time_us"]))) + ("  (%s)" % label))
        print("x_dense = measured dense / projected shim; x_ideal = dense at its own 1 Gbit/s ideal / projected shim; "
              "x_here = measured speedup on this machine")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 6))
    colors = {2: "tab:blue", 4: "tab:orange", 8: "tab:green", 16: "tab:red"}
    for n in hosts:
        c = colors.get(n, None)
        for mode, style, mk in (("dense", "-", "o"), ("shim", "--", "s")):
            pts = sorted((b, float(m[mode]["time_us"]), float(m[mode]["ideal_us"]))
                         for (h, b), m in by.items() if h == n and mode in m)
            if not pts:
                continue
            xs = [p[0] / (1 << 20) for p in pts]
            ax.plot(xs, [p[1] / 1e3 for p in pts], style, marker=mk, color=c, label="%s, %d hosts" % (mode, n))
            ax.plot(xs, [p[2] / 1e3 for p in pts], ":", color=c, alpha=0.6, linewidth=1,
                    label="ideal %s, %d hosts" % (mode, n))
    ax.set_xscale("log", basex=2) if matplotlib.__version__ < "3.3" else ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce size per rank (MiB, fp32)")
    ax.set_ylabel("time per call (ms)")
    ax.set_title("MPI_Allreduce over emulated 1 Gbit/s Ethernet: dense Open MPI vs dgcshim (99.9% sparsity)\n"
                 "dotted: measured bytes per rank / 125e6 B/s; all hosts share 2 CPU cores", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    print("\nwrote %s" % a.png)


if __name__ == "__main__":
    main()
