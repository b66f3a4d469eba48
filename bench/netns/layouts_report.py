#!/usr/bin/env python3
"""layouts.sh's summary: medians over rounds per (layout, mode), expected bytes.

    layouts_report.py DIR        reads DIR/runs.csv (and DIR/meta.txt), writes
                                 DIR/layouts.csv and DIR/layouts.txt, prints the text

Expected bytes per host per call (what leaves each host's card), N = M*L ranks:
  flat   L (N - L) P        every rank's payload of the whole buffer to the N - L
                            ranks on other hosts (all-gather)
  node   L (M - 1) P_shard  each local rank's payload of its 1/L shard to the M - 1
                            ranks with its local rank on other hosts
  dense  2 (M - 1) / M S  for S bytes per rank, what Open MPI 4.1's tuned choice
                         at these sizes (recursive halving reduce-scatter then
                         recursive doubling all-gather, nearest partner first)
                         puts through a host's card with consecutive ranks per
                         host: only the steps at distance >= L cross, L
                         ranks x 2 phases x S (1/L - 1/N); a ring over
                         consecutive ranks would give 2 (N - 1) / N S instead
Goals checked: node within 15% of its formula (busiest host and mean); node
faster than flat (median time) in every layout. Exit 1 when a measured goal is
missed (a goal that could not be measured says NOT MEASURED).
"""
import csv
import os
import statistics
import sys


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    with open(os.path.join(out, "runs.csv")) as f:
        rows = list(csv.DictReader(f))
    meta = ""
    if os.path.exists(os.path.join(out, "meta.txt")):
        with open(os.path.join(out, "meta.txt")) as f:
            meta = f.read()

    layouts, modes = [], []
    for r in rows:
        if r["layout"] not in layouts:
            layouts.append(r["layout"])
        if r["mode"] not in modes:
            modes.append(r["mode"])
    order = ["dense", "shim", "flat", "auto", "node"]
    modes.sort(key=lambda m: order.index(m) if m in order else len(order))

    summary = []
    for lay in layouts:
        for mode in modes:
            rs = [r for r in rows if r["layout"] == lay and r["mode"] == mode]
            if not rs:
                continue
            ok = [r for r in rs if r["status"] == "ok"]
            bad = [r["status"] for r in rs if r["status"] != "ok"]
            m, l, n = int(rs[0]["hosts"]), int(rs[0]["ppn"]), int(rs[0]["ranks"])
            size = int(rs[0]["bytes"]) if rs[0]["bytes"] != "4" else None
            p = num(rs[0]["payload_P"])
            ps = num(rs[0]["payload_P_shard"])
            if mode in ("flat", "shim"):
                expect, formula = (l * (n - l) * p if p else None), f"L(N-L)P = {l * (n - l)} x {p:.0f}" if p else ""
            elif mode == "node":
                expect, formula = (l * (m - 1) * ps if ps else None), f"L(M-1)P_shard = {l * (m - 1)} x {ps:.0f}" if ps else ""
            elif mode == "dense" and size:
                expect, formula = 2 * (m - 1) * size / m, f"2(M-1)/M S = {2 * (m - 1)}/{m} x {size}"
            else:
                expect, formula = None, ""
            times = [num(r["time_us"]) for r in ok]
            s = {
                "layout": lay, "hosts": m, "ppn": l, "ranks": n, "mode": mode,
                "runs_ok": len(ok), "failures": ";".join(bad),
                "time_us_median": med(times),
                "time_us_min": min([t for t in times if t is not None], default=None),
                "time_us_max": max([t for t in times if t is not None], default=None),
                "wire_max_median": med([num(r["wire_max"]) for r in ok]),
                "wire_mean_median": med([num(r["wire_mean"]) for r in ok]),
                "l2_max_median": med([num(r["l2_max"]) for r in ok]),
                "expected": expect, "formula": formula,
                "stats_payload": med([num(r["shim_wire_bytes_per_call"]) for r in ok]),
                "card_estimate": med([num(r.get("shim_card_bytes_est")) for r in ok]),
                "transport": ";".join(sorted({r["shim_transport"] for r in ok if r["shim_transport"]})),
                "per_host_last": ok[-1]["wire_per_host"] if ok else "",
            }
            s["max_over_expected"] = (s["wire_max_median"] / expect) if expect and s["wire_max_median"] else None
            s["mean_over_expected"] = (s["wire_mean_median"] / expect) if expect and s["wire_mean_median"] else None
            summary.append(s)

    def get(lay, mode, key):
        for s in summary:
            if s["layout"] == lay and s["mode"] == mode:
                return s[key]
        return None

    for s in summary:
        t = s["time_us_median"]
        d = get(s["layout"], "dense", "time_us_median")
        f = get(s["layout"], "flat", "time_us_median")
        s["speedup_vs_dense"] = d / t if d and t else None
        s["speedup_vs_flat"] = f / t if f and t else None

    cols = ["layout", "hosts", "ppn", "ranks", "mode", "runs_ok", "failures", "time_us_median", "time_us_min",
            "time_us_max", "speedup_vs_dense", "speedup_vs_flat", "wire_max_median", "wire_mean_median",
            "l2_max_median", "expected", "max_over_expected", "mean_over_expected", "formula", "stats_payload",
            "card_estimate", "transport", "per_host_last"]
    with open(os.path.join(out, "layouts.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for s in summary:
            w.writerow([("" if s[c] is None else
                         "%.4f" % s[c] if c.endswith(("over_expected", "vs_dense", "vs_flat")) else
                         "%.0f" % s[c] if isinstance(s[c], float) else s[c]) for c in cols])

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-"

    lines = [meta.rstrip("\n"), "",
             "# per call: time = median over rounds of the slowest rank's mean; bytes = each host's eth0 tx",
             "# (launch etc. subtracted), median over rounds; busiest host and mean over hosts",
             "%-6s %-5s %4s %10s %17s %8s %8s %11s %11s %11s %7s %7s  %s" % (
                 "layout", "mode", "ok", "ms", "min-max ms", "x dense", "x flat", "B busiest", "B mean",
                 "B expected", "max/exp", "mean/exp", "formula; STATS payload, transport")]
    for s in summary:
        extra = s["formula"]
        if s["stats_payload"]:
            extra += f"; STATS {s['stats_payload']:.0f} B, {s['transport']}"
        if s["card_estimate"]:
            extra += f", shim's card estimate {s['card_estimate']:.0f} B"
        if s["failures"]:
            extra += f"; FAILED: {s['failures']}"
        lines.append("%-6s %-5s %4d %10s %17s %8s %8s %11s %11s %11s %7s %7s  %s" % (
            s["layout"], s["mode"], s["runs_ok"],
            fmt(s["time_us_median"] and s["time_us_median"] / 1e3, ".1f"),
            (fmt(s["time_us_min"] and s["time_us_min"] / 1e3, ".1f") + "-" +
             fmt(s["time_us_max"] and s["time_us_max"] / 1e3, ".1f")),
            fmt(s["speedup_vs_dense"], ".2f"), fmt(s["speedup_vs_flat"], ".2f"),
            fmt(s["wire_max_median"], ",.0f"), fmt(s["wire_mean_median"], ",.0f"), fmt(s["expected"], ",.0f"),
            fmt(s["max_over_expected"], ".3f"), fmt(s["mean_over_expected"], ".3f"), extra))

    goals_ok = True
    lines.append("")
    for lay in layouts:
        mx, mn = get(lay, "node", "max_over_expected"), get(lay, "node", "mean_over_expected")
        if mx is None:
            lines.append(f"goal {lay}: node bytes within 15% of L(M-1)P_shard: NOT MEASURED")
        else:
            good = abs(mx - 1) <= 0.15 and abs(mn - 1) <= 0.15
            goals_ok &= good
            lines.append(f"goal {lay}: node bytes within 15% of L(M-1)P_shard: {'yes' if good else 'NO'}"
                         f" (busiest {mx:.3f}, mean {mn:.3f} of the formula)")
        tn, tf = get(lay, "node", "time_us_median"), get(lay, "flat", "time_us_median")
        if tn is None or tf is None:
            lines.append(f"goal {lay}: node faster than flat: NOT MEASURED")
        else:
            goals_ok &= tn < tf
            lines.append(f"goal {lay}: node faster than flat: {'yes' if tn < tf else 'NO'}"
                         f" ({tn / 1e3:.1f} ms against {tf / 1e3:.1f} ms, {tf / tn:.2f}x)")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "layouts.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0 if goals_ok else 1


if __name__ == "__main__":
    sys.exit(main())
