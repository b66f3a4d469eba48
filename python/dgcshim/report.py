"""`dgcshim report FILE...`: the DGC_STATS exit report again, from the JSON
lines DGC_STATS_FILE made (each file's last line), and with --plot a picture
of the run: bytes per call and the compression ratio against the calls.

The table is the one the library prints (core/stats.c and core/report.c),
figure for figure: the same columns, widths and rounding."""
import argparse
import json
import os

# The report's words for each cause of a failed call (core/registry.c).
CAUSES = (("memory", "for memory"), ("misalignment", "for misalignment"), ("engine", "for the engine"),
          ("peer", "for a peer's failure"), ("bad_payload", "for a bad payload"))
SUMMED = ("calls", "nonfinite", "dense_bytes", "wire_bytes", "engine_seconds", "dense_transport", "reduce_transport")


def rank_files(prefix):
    """PATH.0, PATH.1, ... (then PATH.pidN) that DGC_STATS_FILE=PATH made, in rank order."""
    folder, stem = os.path.split(prefix)
    ranks, pids = [], []
    for name in os.listdir(folder or "."):
        if not name.startswith(stem + "."):
            continue
        tail = name[len(stem) + 1:]
        if tail.isdigit():
            ranks.append((int(tail), os.path.join(folder, name)))
        elif tail.startswith("pid") and tail[3:].isdigit():
            pids.append((int(tail[3:]), os.path.join(folder, name)))
    return [p for _, p in sorted(ranks)] + [p for _, p in sorted(pids)]


def expand(paths):
    """The files to read: each path as given, or, for the --stats-file prefix
    given in place of its files, the files it made."""
    out = []
    for path in paths:
        if os.path.exists(path):
            out.append(path)
            continue
        try:
            found = rank_files(path)
        except OSError:
            found = []
        if not found:
            raise SystemExit("dgcshim report: no file %s, nor %s.0, %s.1, ... (DGC_STATS_FILE=PATH writes PATH.RANK)"
                             % (path, path, path))
        out += found
    return out


def load(path):
    out = []
    try:
        f = open(path)
    except OSError as e:
        raise SystemExit("dgcshim report: cannot read %s: %s" % (path, e.strerror))
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise SystemExit("dgcshim report: %s line %d is not JSON (%s)" % (path, n, e))
    if not out:
        raise SystemExit("dgcshim report: %s has no lines" % path)
    return out


def ratio(s):
    return s["dense_bytes"] / s["wire_bytes"] if s["wire_bytes"] else 0.0


def last_ratio(s):
    if not s.get("last_wire_bytes") or not s["calls"]:
        return 0.0
    return s["dense_bytes"] / s["calls"] / s["last_wire_bytes"]


def header():
    return "%-18s %12s %8s %9s %14s %12s %9s %10s %11s %12s %15s" % (
        "buffer", "count", "calls", "nonfinite", "dense_bytes", "wire_bytes", "ratio", "last_ratio", "engine_ms",
        "state_bytes", "transport")


def row(label, count, s, held=None):
    """held: the live state's bytes now, None for a freed one ("-"); files
    written before they were kept say nothing of them."""
    last = "%.1fx" % last_ratio(s) if count else "-"
    reduce = s.get("reduce_transport", 0)
    transport = "s%d/d%d" % (s["calls"] - s["dense_transport"] - reduce, s["dense_transport"])
    if reduce:
        transport += "/r%d" % reduce
    return "%-18s %12d %8d %9d %14d %12d %8.1fx %10s %11.3f %12s %15s" % (
        label, count, s["calls"], s["nonfinite"], s["dense_bytes"], s["wire_bytes"], ratio(s), last,
        s["engine_seconds"] * 1e3, "-" if held is None else "%d" % held, transport)


def table(rec):
    """The exit report's STATS lines for one line of a stats file."""
    lines = [header()]
    total = {k: 0 for k in SUMMED}
    freed = held = 0
    for b in rec["buffers"]:
        live = b["live"] and "state_bytes" in b
        lines.append(row(b["buffer"] + ("" if b["live"] else "*"), b["count"], b, b["state_bytes"] if live else None))
        held += b["state_bytes"] if live else 0
        for k in SUMMED:
            total[k] += b.get(k, 0)
        freed += not b["live"]
    u = rec["freed_unkeyed"]
    if u["states"]:
        lines.append(row("freed(%d)" % u["states"], 0, u))
        for k in SUMMED:
            total[k] += u.get(k, 0)
    lines.append(row("total", 0, total, held))
    if freed:
        lines.append("*: %d buffer%s whose states were freed before this report (communicator freed, or idle for "
                     "DGC_STATE_IDLE_CALLS calls)" % (freed, "" if freed == 1 else "s"))
    failed = ", ".join("%s %d" % (words, rec["failed"][key]) for key, words in CAUSES)
    lines.append("pass-through calls %d, compressed calls %d, summed densely over budget %d, failed %s; steps with "
                 "a saturated residual %d" % (rec["passthrough_calls"], total["calls"], rec["over_budget"], failed,
                                              rec["saturated"]))
    # The reasons in the library's order (the file keeps it); files written
    # before they were counted have none.
    why = ", ".join("%s %d" % (k, v) for k, v in rec.get("passthrough_by", {}).items() if v)
    if rec["passthrough_calls"] and why:
        lines.append("pass-through calls by reason: " + why)
    m = rec["memory"]
    lines.append("memory: %d bytes in %d live states (released %d), peak %d bytes" % (
        m["bytes"], m["live_states"], m["released_states"], m["peak_bytes"]))
    if m.get("device_peak_bytes"):
        lines.append("device memory of the GPU states: %d bytes now, peak %d bytes" % (
            m["device_bytes"], m["device_peak_bytes"]))
    return lines


def series(recs):
    """Per interval between successive lines: (calls at its end, wire bytes per call, dense bytes per call)."""
    out, prev = [], {"calls": 0, "wire": 0, "dense": 0}
    for r in recs:
        now = {"calls": sum(b["calls"] for b in r["buffers"]) + r["freed_unkeyed"]["calls"],
               "wire": sum(b["wire_bytes"] for b in r["buffers"]) + r["freed_unkeyed"]["wire_bytes"],
               "dense": sum(b["dense_bytes"] for b in r["buffers"]) + r["freed_unkeyed"]["dense_bytes"]}
        dc = now["calls"] - prev["calls"]
        if dc > 0:
            out.append((now["calls"], (now["wire"] - prev["wire"]) / dc, (now["dense"] - prev["dense"]) / dc))
        prev = now
    return out


def plot(files, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("dgcshim report: --plot needs matplotlib (pip install matplotlib, or Debian's "
                         "python3-matplotlib in a venv made with --system-site-packages)")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    drew = 0
    for path, recs in files:
        s = series(recs)
        name = "rank %s" % recs[-1].get("rank", "?")
        if s:
            x = [p[0] for p in s]
            top.step(x, [p[1] for p in s], where="pre", label="dgcshim, %s (%s)" % (name, os.path.basename(path)))
            top.step(x, [p[2] for p in s], where="pre", linestyle=":", color="gray",
                     label="dense all-reduce of the same buffers" if not drew else None)
            bottom.step(x, [p[2] / p[1] if p[1] else 0 for p in s], where="pre", label=name)
            drew += 1
        elif recs[-1]["passthrough_calls"]:  # a dense run: what it really sent
            r = recs[-1]
            top.axhline(r["passthrough_bytes"] / r["passthrough_calls"], linestyle="--", color="black",
                        label="dense run, measured: %s bytes per call, mean of its %d calls (%s)" % (
                            format(r["passthrough_bytes"] // r["passthrough_calls"], ","), r["passthrough_calls"],
                            os.path.basename(path)))
    top.set_yscale("log")
    top.set_ylabel("bytes sent per call, per rank")
    top.legend(fontsize=8)
    top.set_title("dgcshim: bytes per call (warm-up stages as steps)")
    bottom.set_yscale("log")
    bottom.set_ylabel("compression ratio (dense / sent)")
    bottom.set_xlabel("compressed calls")
    if drew:
        bottom.legend(fontsize=8)
    fig.tight_layout()
    folder = os.path.dirname(out)
    try:
        if folder:
            os.makedirs(folder, exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as e:
        where = "" if e.filename in (None, out) else "%s: " % e.filename
        raise SystemExit("dgcshim report: cannot write %s: %s%s" % (out, where, e.strerror or e))
    except ValueError as e:  # a suffix matplotlib has no format for
        raise SystemExit("dgcshim report: cannot write %s: %s" % (out, e))


def main(argv):
    p = argparse.ArgumentParser(prog="dgcshim report", description=__doc__)
    p.add_argument("files", nargs="+", metavar="FILE", help="stats files (DGC_STATS_FILE=PATH writes PATH.RANK); "
                   "PATH itself reads every PATH.RANK there is")
    p.add_argument("--plot", metavar="OUT.png", help="draw bytes per call and the ratio against the calls")
    args = p.parse_args(argv)
    files = [(f, load(f)) for f in expand(args.files)]
    for i, (path, recs) in enumerate(files):
        last = recs[-1]
        if i:
            print()
        print("== %s: rank %s, %s line (%d line%s) ==" % (path, last.get("rank"), last.get("event"), len(recs),
                                                          "" if len(recs) == 1 else "s"))
        for line in table(last):
            print(line)
    if args.plot:
        plot(files, args.plot)
        print("\nwrote %s" % args.plot)
    return 0
