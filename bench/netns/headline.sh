#!/usr/bin/env bash
# The headline figure, repeated: 100 MiB per rank (26,214,400 floats) on 4
# emulated hosts, dense Open MPI against the shim, --runs times with Open MPI's
# defaults (waiting ranks spin) and as many with `--mca mpi_yield_when_idle 1`
# (waiting ranks yield the cores the emulated hosts share), alternating. Each
# run is one `sweep.sh --only-extra` job pair of 10 timed calls per mode. One
# run says little on this machine (the shim's time moves by +-20% between
# runs), so this prints every run and the median, min and max speedup.
#
#   bench/netns/headline.sh [--runs 5] [--bytes 104857600] [--hosts 4] [--out DIR]
#
# Writes DIR/{spin,yield}/runI/ (sweep.sh's CSV and logs) and DIR/headline.txt
# (default DIR: <repo>/bench/results/netns/headline_100M). Needs root and
# `ip netns` (exit 77 = skipped). Environment: BUILD_DIR, as sweep.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RUNS=5; BYTES=104857600; HOSTS=4; OUT=$REPO/bench/results/netns/headline_100M

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "headline.sh: unknown option '$1'" >&2; usage ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "headline.sh: --runs takes a positive integer" >&2; exit 2; }

mkdir -p "$OUT"
for ((i = 1; i <= RUNS; i++)); do
    for mode in spin yield; do
        opts=(); [ "$mode" = yield ] && opts=(--mpi-opts "--mca mpi_yield_when_idle 1")
        dir=$OUT/$mode/run$i
        rc=0
        "$HERE/sweep.sh" --only-extra --extra "$HOSTS:$BYTES" --no-engine --iters 10 "${opts[@]}" \
            --out "$dir" >"$OUT/$mode.run$i.log" 2>&1 || rc=$?
        [ "$rc" = 77 ] && { cat "$OUT/$mode.run$i.log"; exit 77; }
        [ "$rc" = 0 ] || { cat "$OUT/$mode.run$i.log" >&2; echo "headline.sh: run $i ($mode) failed" >&2; exit 1; }
        echo "run $i $mode: $(grep -E "N=$HOSTS .* shim " "$OUT/$mode.run$i.log" | grep -o 'speedup.*')"
    done
done

# Every run's dense and shim time and speedup, then the summary per mode.
/usr/bin/python3 - "$OUT" "$RUNS" <<'EOF' | tee "$OUT/headline.txt"
import csv, os, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
print("# %s: dense Open MPI vs the shim, time per call (slowest rank's mean of 10), ms" % os.path.basename(out))
print("%-6s %4s %10s %10s %9s" % ("mode", "run", "dense_ms", "shim_ms", "speedup"))
for mode in ("spin", "yield"):
    xs = []
    for i in range(1, runs + 1):
        rows = {r["mode"]: r for r in csv.DictReader(open(os.path.join(out, mode, "run%d" % i, "allreduce.csv")))}
        d, s = float(rows["dense"]["time_us"]) / 1e3, float(rows["shim"]["time_us"]) / 1e3
        xs.append(d / s)
        print("%-6s %4d %10.1f %10.1f %8.1fx" % (mode, i, d, s, d / s))
    print("%-6s  median %.1fx  min %.1fx  max %.1fx  (%d runs)" % (mode, statistics.median(xs), min(xs), max(xs), runs))
EOF
