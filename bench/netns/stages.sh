#!/usr/bin/env bash
# One row per warm-up stage on the emulated 1 Gbit/s cluster: dense Open MPI
# against the shim at each density the warm-up goes through (25%, 6.25%,
# 1.5625%, 0.390625%, then the 0.1% target), every call of a job at that
# density (DGC_SPARSITY = 1 - density, no warm-up). Time per call (slowest
# rank) and bytes on the wire per rank per call (the busiest host's eth0,
# sweep.sh's accounting), and the transport the shim picked (its STATS
# column). The claim it checks: no stage is slower than dense or moves more
# bytes.
#
#   bench/netns/stages.sh [--hosts 8] [--bytes 33554432] [--out DIR]
#
# Writes DIR/dNNN/ (sweep.sh's CSV and logs per stage) and DIR/stages.txt
# (default DIR: <repo>/bench/results/netns/stages). Needs root and `ip netns`
# (exit 77 = skipped). Environment: BUILD_DIR, as sweep.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
HOSTS=8; BYTES=33554432; OUT=$REPO/bench/results/netns/stages
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "stages.sh: unknown option '$1'" >&2; usage ;;
    esac
done
mkdir -p "$OUT"
table=$OUT/stages.txt
{
    echo "# warm-up stages on $HOSTS emulated 1 Gbit/s hosts, $BYTES bytes per rank: per call, slowest rank's time, busiest host's bytes"
    printf '%-10s %10s %10s %9s %14s %14s %10s %9s\n' density dense_ms shim_ms speedup dense_bytes shim_bytes bytes_x transport
} >"$table"
for sparsity in 0.75 0.9375 0.984375 0.99609375 0.999; do
    density=$(awk -v s="$sparsity" 'BEGIN {printf "%.6g", 1 - s}')
    dir=$OUT/d$density
    "$HERE/sweep.sh" --hosts "$HOSTS" --only-extra --extra "$HOSTS:$BYTES" --no-engine --out "$dir" \
        --mpi-opts "-x DGC_SPARSITY=$sparsity -x DGC_WARMUP_STEPS=0" >"$dir.log" 2>&1 ||
        { rc=$?; [ "$rc" = 77 ] && exit 77; echo "stages.sh: sweep.sh failed for density $density (see $dir.log)" >&2; exit 1; }
    csv=$dir/allreduce.csv
    # hosts,bytes,mode,iters,warmup,time_us,...,wire_bytes_per_rank_per_call (9th)
    read -r dt db < <(awk -F, '$3 == "dense" {print $6, $9}' "$csv")
    read -r st sb < <(awk -F, '$3 == "shim" {print $6, $9}' "$csv")
    transport=$(grep -h "dgcshim STATS total" "$dir"/logs/*shim_"$BYTES".out | awk '{print $NF}' | head -n 1)
    awk -v d="$density" -v dt="$dt" -v st="$st" -v db="$db" -v sb="$sb" -v tr="${transport:--}" \
        'BEGIN {printf "%-10s %10.1f %10.1f %8.1fx %14d %14d %9.1fx %9s\n", d, dt / 1e3, st / 1e3, dt / st, db, sb, db / sb, tr}' \
        >>"$table"
done
cat "$table"
