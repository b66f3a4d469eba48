#!/usr/bin/env bash
# The full 1 Gbit/s all-reduce sweep on the emulated cluster: dense Open MPI and
# the same binary under LD_PRELOAD=libdgcshim.so, N hosts, sizes doubling from
# --min-bytes to --max-bytes, plus extra single sizes (default: exactly 100 MiB
# on 4 hosts), and the engine's time on one rank with no network (the
# "per-host compute" projection). Bytes on the wire come from every host's own
# eth0 counters around each job.
#
#   bench/netns/sweep.sh [--hosts "2 4 8"] [--min-bytes 1M] [--max-bytes 256M]
#                        [--iters K] [--warmup W] [--cap N:BYTES]... [--extra N:BYTES]...
#                        [--only-extra] [--mpi-opts "OPTS"] [--no-engine] [--out DIR]
#
#   --iters K      timed calls per size (default: auto = 10 up to 8 MiB, 5 up to
#                  64 MiB, 3 above); --warmup W untimed calls first (default 1)
#   --cap N:BYTES  largest size on N hosts (e.g. --cap 8:64M when memory or time
#                  is short); default none
#   --extra N:BYTES  one more job of exactly BYTES per rank on N hosts (repeatable;
#                  default 4:104857600, i.e. 100 MiB = 26,214,400 floats);
#                  --extra none drops the default
#   --only-extra   run the --extra sizes only (no doubling sweep)
#   --mpi-opts "OPTS"  more mpirun options for every cluster job, both modes
#                  (e.g. "--mca mpi_yield_when_idle 1": idle ranks yield the shared
#                  cores instead of spinning; on real hosts spinning costs nothing)
#   --no-engine    skip the single-rank engine measurement; --engine-only: only it
#   --out DIR      results (default <repo>/bench/results/netns)
#
# Writes DIR/allreduce.csv, DIR/engine_1host.csv and DIR/logs/*.out (every job's
# output). Environment: BUILD_DIR (default <repo>/build), JOB_TIMEOUT (900 s).
# Needs root and `ip netns` (exit 77 = skipped, as smoke.sh); the cluster is
# always taken down at the end, also on failure or interrupt.
#
# How bytes are counted, and why this way. Every (N, size, mode) is a job of
# its own (one mpirun, one size): the counters then frame exactly that size's
# calls, and the shim holds the state of one size only (so N = 8 at 256 MiB fits
# in memory and DGC_STATS reports that size alone). Around each job the script
# reads every host's eth0 tx bytes (`ip -s link`) and its root qdisc's `Sent`
# bytes (`tc -s qdisc`: the same traffic with one set of headers per MTU-sized
# segment, which is what tbf meters). What the job puts on the wire besides the
# all-reduce (mpirun's launch and modex, the barrier before every call, the final
# MPI_Reduce of the timings, the shim's configuration check at MPI_Init) is
# measured by a job of the same mode with the same number of calls on a 4-byte
# buffer (which the shim passes through), and subtracted. The remainder divided
# by the calls (warm-up + timed) is the all-reduce's bytes per rank per call; the
# CSV shows the busiest host's (the bound on time), the per-host mean is in the
# logs. It includes the TCP ACKs a host sends for what it receives (small with
# GRO; part of what a real wire carries too).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build}
BENCH=$BUILD_DIR/bench/allreduce_bench
SHIM=$BUILD_DIR/libdgcshim.so
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
PREFIX=dgc

HOSTS="2 4 8"; MIN=1M; MAX=256M; ITERS=auto; WARMUP=1; OUT=$REPO/bench/results/netns
CAPS=(); EXTRAS=(); EXTRA_SET=0; ENGINE=1; ONLY_EXTRA=0; MPI_OPTS=""

usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "sweep.sh: $*" >&2; exit 1; }

to_bytes() { # 1M -> 1048576 (K, M, G = powers of 1024), plain integers as they are
    local s=$1 n m=1
    [[ $s =~ ^([0-9]+)([kKmMgG]?)[bB]?$ ]] || die "bad byte count '$s'"
    n=${BASH_REMATCH[1]}
    case "${BASH_REMATCH[2]}" in k|K) m=1024 ;; m|M) m=1048576 ;; g|G) m=1073741824 ;; esac
    echo $((n * m))
}

while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --min-bytes) MIN=$2; shift 2 ;;
    --max-bytes) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --cap) CAPS+=("$2"); shift 2 ;;
    --extra) EXTRA_SET=1; [ "$2" = none ] || EXTRAS+=("$2"); shift 2 ;;
    --no-engine) ENGINE=0; shift ;;
    --only-extra) ONLY_EXTRA=1; shift ;;
    --engine-only) HOSTS=""; ENGINE=1; shift ;;
    --mpi-opts) MPI_OPTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "sweep.sh: unknown option '$1'" >&2; usage ;;
    esac
done
[ "$EXTRA_SET" = 1 ] || EXTRAS=("4:104857600")
if [ "$ONLY_EXTRA" = 1 ]; then # only the hosts that have an extra size
    HOSTS=$(for e in "${EXTRAS[@]+"${EXTRAS[@]}"}"; do echo "${e%%:*}"; done | sort -un | tr '\n' ' ')
fi
MIN=$(to_bytes "$MIN"); MAX=$(to_bytes "$MAX")
[[ $ITERS = auto || $ITERS =~ ^[1-9][0-9]*$ ]] || die "--iters takes a positive integer or 'auto'"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "--warmup takes an integer >= 0"

skip() { echo "SKIPPED: the netns sweep needs root and ip netns ($*)"; exit 77; }
# shellcheck source=common.sh
. "$HERE/common.sh"
netns_preflight

mkdir -p "$OUT/logs"
CSV=$OUT/allreduce.csv
netns_down_on_exit sweep.sh

iters_for() { # bytes -> timed calls
    if [ "$ITERS" != auto ]; then echo "$ITERS"
    elif [ "$1" -le $((8 << 20)) ]; then echo 10
    elif [ "$1" -le $((64 << 20)) ]; then echo 5
    else echo 3; fi
}
cap_for() { # hosts -> largest size
    local c m=$MAX
    for c in "${CAPS[@]+"${CAPS[@]}"}"; do
        [ "${c%%:*}" = "$1" ] && m=$(to_bytes "${c#*:}")
    done
    echo "$m"
}

# delta of two snaps -> "max_tx mean_tx max_q mean_q" over hosts
delta() { # N "before" "after"
    awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        for (i = 0; i < n; i++) {
            t = y[2*i+1] - x[2*i+1]; q = y[2*i+2] - x[2*i+2]
            st += t; sq += q; if (t > mt) mt = t; if (q > mq) mq = q
        }
        printf "%d %.0f %d %.0f\n", mt, st / n, mq, sq / n }'
}

# job N MODE BYTES ITERS WARMUP LOG -> runs one job, echoes "max_tx mean_tx max_q mean_q"
job() {
    local n=$1 mode=$2 bytes=$3 it=$4 wu=$5 log=$6 s0 s1 opts=()
    # shellcheck disable=SC2206
    [ -n "$MPI_OPTS" ] && opts=($MPI_OPTS)
    [ "$mode" = shim ] && opts+=(-x "LD_PRELOAD=$SHIM" -x DGC_STATS=1)
    s0=$(netns_snap "$n")
    if ! timeout "$JOB_TIMEOUT" "$HERE/run.sh" "$n" "${opts[@]+"${opts[@]}"}" -- "$BENCH" \
        --min-bytes "$bytes" --max-bytes "$bytes" --iters "$it" --warmup "$wu" >"$log" 2>&1; then
        cat "$log" >&2
        die "job failed: $n hosts, $mode, $bytes bytes (log $log)"
    fi
    s1=$(netns_snap "$n")
    delta "$n" "$s0" "$s1"
}

# Baseline (launch + barriers + final reduce) per (N, mode, calls): a 4-byte job, the
# smaller of two runs (what is certainly not the all-reduce).
declare -A BASE
baseline() { # N MODE ITERS WARMUP -> "max_tx mean_tx max_q mean_q"
    local key="$1/$2/$3/$4" a b
    if [ -z "${BASE[$key]:-}" ]; then
        a=$(job "$1" "$2" 4 "$3" "$4" "$OUT/logs/N$1_$2_base_$3+$4.out")
        b=$(job "$1" "$2" 4 "$3" "$4" "$OUT/logs/N$1_$2_base_$3+$4.out")
        BASE[$key]=$(awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
            for (i = 1; i <= 4; i++) printf "%s%.0f", (i > 1 ? " " : ""), (x[i] < y[i] ? x[i] : y[i]); print "" }')
    fi
    echo "${BASE[$key]}"
}

[ -z "$HOSTS" ] || echo "hosts,bytes,mode,iters,warmup,time_us,algbw_GBps,busbw_GBps,wire_bytes_per_rank_per_call,wire_bytes_mean_rank_per_call,l2_bytes_per_rank_per_call,expected_bytes_per_rank_per_call,shim_counted_bytes,engine_us_per_call,ideal_us,frac_ideal,speedup" >"$CSV"

declare -A DENSE_T
measure() { # N BYTES
    local n=$1 bytes=$2 it wu calls mode log d base row t algbw busbw stats payload engine expect shimc eng_us
    it=$(iters_for "$bytes"); wu=$WARMUP; calls=$((it + wu))
    for mode in dense shim; do
        log=$OUT/logs/N${n}_${mode}_${bytes}.out
        base=$(baseline "$n" "$mode" "$it" "$wu")
        d=$(job "$n" "$mode" "$bytes" "$it" "$wu" "$log")
        read -r t algbw busbw < <(awk '!/^#/ && NF >= 6 && $3 == "float" {print $4, $5, $6}' "$log" | tail -1)
        [ -n "$t" ] || die "no result row in $log"
        shimc=""; eng_us=""
        if [ "$mode" = shim ]; then
            # STATS total row: total count calls nonfinite dense_bytes wire_bytes ratio last_ratio engine_ms
            stats=$(awk '/STATS total/ {for (i = 1; i <= NF; i++) if ($i == "total") {print $(i + 2), $(i + 5), $(i + 8); exit}}' "$log")
            read -r scalls payload engine <<<"$stats"
            [ -n "${scalls:-}" ] && [ "$scalls" -gt 0 ] || die "no DGC_STATS total in $log (did the shim compress?)"
            shimc=$((payload / scalls))
            eng_us=$(awk -v e="$engine" -v c="$scalls" 'BEGIN {printf "%.1f", e * 1000 / c}')
            expect=$((shimc * (n - 1)))            # all-gather: N-1 payloads out of every rank
        else
            expect=$((bytes * 2 * (n - 1) / n))    # ring all-reduce: 2(N-1)/N of the buffer
        fi
        row=$(awk -v d="$d" -v b="$base" -v c="$calls" -v t="$t" 'BEGIN {
            split(d, x, " "); split(b, y, " ")
            w = (x[1] - y[1]) / c; wm = (x[2] - y[2]) / c; q = (x[3] - y[3]) / c
            ideal = w / 125e6 * 1e6
            printf "%.0f,%.0f,%.0f,%.1f,%.4f", w, wm, q, ideal, (t > 0 ? ideal / t : 0) }')
        local sp=""
        if [ "$mode" = dense ]; then DENSE_T[$n/$bytes]=$t
        else sp=$(awk -v a="${DENSE_T[$n/$bytes]}" -v b="$t" 'BEGIN {printf "%.2f", a / b}'); fi
        IFS=, read -r w wm q ideal frac <<<"$row"
        echo "$n,$bytes,$mode,$it,$wu,$t,$algbw,$busbw,$w,$wm,$q,$expect,$shimc,$eng_us,$ideal,$frac,$sp" >>"$CSV"
        printf '  N=%d %10d B %-5s time %11s us  wire/rank/call %11s B (expect %11s)  ideal %11s us  frac %s %s\n' \
            "$n" "$bytes" "$mode" "$t" "$w" "$expect" "$ideal" "$frac" "${sp:+ speedup ${sp}x}"
    done
}

t_start=$(date +%s)
for n in $HOSTS; do
    echo "== $n hosts: cluster up ($(($(date +%s) - t_start)) s) =="
    "$HERE/cluster.sh" up "$n" >"$OUT/logs/cluster_up_$n.log" 2>&1 || { rc=$?; cat "$OUT/logs/cluster_up_$n.log" >&2;
        [ "$rc" -eq 4 ] && skip "$(tail -1 "$OUT/logs/cluster_up_$n.log")"; die "cluster.sh up $n failed"; }
    cap=$(cap_for "$n")
    if [ "$ONLY_EXTRA" = 0 ]; then
        for ((b = MIN; b <= MAX && b <= cap; b *= 2)); do measure "$n" "$b"; done
    fi
    for e in "${EXTRAS[@]+"${EXTRAS[@]}"}"; do
        [ "${e%%:*}" = "$n" ] && measure "$n" "$(to_bytes "${e#*:}")"
    done
done
"$HERE/cluster.sh" down >/dev/null
echo "== sweep done in $(($(date +%s) - t_start)) s: $CSV =="

# The engine on one rank with a core of its own (common.sh), for the extras'
# sizes. --engine-only: this alone.
if [ "$ENGINE" = 1 ]; then
    ECSV=$OUT/engine_1host.csv
    echo "bytes,timed_calls,engine_us_per_call" >"$ECSV"
    sizes=$(for e in "${EXTRAS[@]+"${EXTRAS[@]}"}"; do to_bytes "${e#*:}"; done | sort -un)
    for bytes in $sizes; do
        t=$(netns_engine_call_us "$bytes" "$OUT/logs/engine_1host_${bytes}.out")
        echo "$bytes,30,$t" >>"$ECSV"
        echo "  engine, 1 rank, $bytes B: $t us per call (whole call, steady state, mean of 30)"
    done
fi
