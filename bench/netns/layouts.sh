#!/usr/bin/env bash
# Several ranks per emulated host: dense Open MPI against the shim's flat and
# node topologies, per layout (hosts x ranks per host), on the emulated 1 Gbit/s
# cluster. Bytes through each host's eth0 per call and time per call, the modes
# alternating round by round (dense, flat, node, dense, flat, node, ...) so a
# slow stretch of the shared machine hits every mode alike; medians over rounds.
#
#   bench/netns/layouts.sh [--layouts "4x2 2x4"] [--bytes 33554432] [--rounds 3]
#                          [--iters 5] [--warmup 1] [--modes "dense flat node"]
#                          [--sparsity 0.999] [--mpi-opts "OPTS"] [--out DIR]
#
#   --layouts "MxL ..."  M hosts (namespaces), L ranks on each (run.sh --ppn L),
#                  M*L ranks, consecutive ranks on one host
#   --bytes B      bytes per rank (default 32 MiB = 8,388,608 floats)
#   --rounds R     rounds of one job per mode (default 5); --iters K timed calls
#                  per job (default 5) after --warmup W untimed ones (default 1)
#   --modes "..."  any of: dense (no LD_PRELOAD), flat (DGC_TOPOLOGY=flat),
#                  node (DGC_TOPOLOGY=node), auto (DGC_TOPOLOGY=auto), shim (the
#                  shim without DGC_TOPOLOGY, for builds that predate it)
#   --sparsity S   DGC_SPARSITY for the shim's modes (default 0.999), always with
#                  DGC_WARMUP_STEPS=0 and DGC_STATS=1
#   --mpi-opts "OPTS"  more mpirun options for every job
#   --btl LIST     Open MPI's btl list for the jobs (run.sh's NETNS_BTL; default
#                  tcp,self: the ranks of a host talk TCP over its lo; tcp,vader,self
#                  gives them shared memory, an experiment: see run.sh)
#   --out DIR      results (default <repo>/bench/results/netns/layouts)
#
# Writes DIR/runs.csv (one row per job), DIR/layouts.csv (medians per layout
# and mode, with the expected bytes), DIR/layouts.txt (the table) and
# DIR/logs/. Environment: BUILD_DIR (default <repo>/build: libdgcshim.so and
# bench/allreduce_bench), JOB_TIMEOUT (default 240 s per job). A job that fails
# or times out is logged (DIR/logs, its row in runs.csv says failed/timeout),
# its mode is skipped for the rest of that layout, and the script goes on and
# exits 1 at the end. Needs root and `ip netns` (exit 77 = skipped); the
# cluster is taken down at the end, also on failure or interrupt.
#
# How bytes are counted (as sweep.sh does, per host): around each job every
# host's eth0 tx bytes (ip -s link) and root qdisc Sent bytes (tc -s qdisc) are
# read. Launch, modex, the barrier before every call, the final reduce of the
# timings and the shim's checks at MPI_Init are measured per host by a 4-byte
# job of the same mode and the same number of calls (two runs, the smaller per
# host) and subtracted; the rest over the calls (warm-up + timed) is that
# host's bytes per call. Ranks on one host talk over the namespace's lo, which
# is neither shaped nor counted: only what crosses a host's card is. Expected
# bytes: P = one compact payload of the whole buffer and P_shard = one of a
# 1/L shard, both from single-rank jobs without network (DGC_MIN_RANKS=1,
# DGC_STATS' wire_bytes per call); flat = L(N-L) P per host (every rank sends
# its payload to the N-L ranks of other hosts, N = M*L), node = L(M-1) P_shard.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build}
BENCH=$BUILD_DIR/bench/allreduce_bench
SHIM=$BUILD_DIR/libdgcshim.so
JOB_TIMEOUT=${JOB_TIMEOUT:-240}
PREFIX=dgc

LAYOUTS="4x2 2x4"; BYTES=33554432; ROUNDS=5; ITERS=5; WARMUP=1; MODES="dense flat node"
SPARSITY=0.999; MPI_OPTS=""; OUT=$REPO/bench/results/netns/layouts

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "layouts.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
    --layouts) LAYOUTS=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --sparsity) SPARSITY=$2; shift 2 ;;
    --mpi-opts) MPI_OPTS=$2; shift 2 ;;
    --btl) export NETNS_BTL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "layouts.sh: unknown option '$1'" >&2; usage ;;
    esac
done
[[ $BYTES =~ ^[0-9]+$ ]] && [ $((BYTES % 4)) -eq 0 ] && [ "$BYTES" -ge 4 ] || die "--bytes takes a multiple of 4"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds takes a positive integer"
[[ $ITERS =~ ^[1-9][0-9]*$ ]] || die "--iters takes a positive integer"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "--warmup takes an integer >= 0"
for l in $LAYOUTS; do [[ $l =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "bad layout '$l' (MxL, e.g. 4x2)"; done
for m in $MODES; do case "$m" in dense|flat|node|auto|shim) ;; *) die "unknown mode '$m'" ;; esac; done

skip() { echo "SKIPPED: layouts.sh needs root and ip netns ($*)"; exit 77; }
# shellcheck source=common.sh
. "$HERE/common.sh"
netns_preflight

mkdir -p "$OUT/logs"
RUNS=$OUT/runs.csv
netns_down_on_exit layouts.sh

mode_opts() { # MODE -> mpirun options, one a line
    local m=$1
    [ "$m" = dense ] && return 0
    printf '%s\n' -x "LD_PRELOAD=$SHIM" -x DGC_STATS=1 -x "DGC_SPARSITY=$SPARSITY" -x DGC_WARMUP_STEPS=0
    case "$m" in flat|node|auto) printf '%s\n' -x "DGC_TOPOLOGY=$m" ;; esac
}

sub() { # "a..." "b..." -> b - a, element-wise
    awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
        for (i = 1; i <= n; i++) printf "%s%.0f", (i > 1 ? " " : ""), y[i] - x[i]; print "" }'
}

# What a failed or killed job may leave in the namespaces (ranks, orteds: all
# started by this script's jobs): ended by pid.
reap() { # M
    local i p
    for ((i = 0; i < $1; i++)); do
        for p in $(ip netns pids "$PREFIX$i" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done
}

JOB_RC=0; JOB_DELTA=""
job() { # M L MODE BYTES LOG: JOB_DELTA = per-host deltas "tx0 q0 tx1 q1 ...", JOB_RC = run.sh's status
    local m=$1 l=$2 mode=$3 bytes=$4 log=$5 s0 s1 opts=()
    # shellcheck disable=SC2206
    [ -n "$MPI_OPTS" ] && opts=($MPI_OPTS)
    mapfile -t -O "${#opts[@]}" opts < <(mode_opts "$mode")
    s0=$(netns_snap "$m")
    JOB_RC=0
    timeout "$JOB_TIMEOUT" "$HERE/run.sh" --ppn "$l" "$m" "${opts[@]+"${opts[@]}"}" -- "$BENCH" \
        --min-bytes "$bytes" --max-bytes "$bytes" --iters "$ITERS" --warmup "$WARMUP" >"$log" 2>&1 || JOB_RC=$?
    [ "$JOB_RC" = 0 ] || reap "$m"
    s1=$(netns_snap "$m")
    JOB_DELTA=$(sub "$s0" "$s1")
}

# One compact payload's bytes (rank 0's DGC_STATS wire_bytes per call) for a buffer
# of BYTES on one rank without network.
payload_of() { # BYTES LOG
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$JOB_TIMEOUT" \
        mpirun --allow-run-as-root -np 1 --mca btl self --mca pml ob1 \
        -x "LD_PRELOAD=$SHIM" -x DGC_STATS=1 -x DGC_MIN_RANKS=1 -x "DGC_SPARSITY=$SPARSITY" -x DGC_WARMUP_STEPS=0 \
        "$BENCH" --min-bytes "$1" --max-bytes "$1" --iters 2 --warmup 0 >"$2" 2>&1 ||
        { cat "$2" >&2; die "the 1-rank payload run failed (log $2)"; }
    awk '/STATS total/ {for (i = 1; i <= NF; i++) if ($i == "total") {printf "%d\n", $(i + 5) / $(i + 2); exit}}' "$2"
}

echo "layout,hosts,ppn,ranks,mode,round,bytes,iters,warmup,status,time_us,wire_max,wire_mean,l2_max,l2_mean,wire_per_host,shim_wire_bytes_per_call,shim_transport,shim_compressed_calls,shim_card_bytes_est,payload_P,payload_P_shard" >"$RUNS"

t_start=$(date +%s)
failed=0
{
    echo "# layouts.sh $(date -u '+%Y-%m-%d %H:%M UTC'), repository HEAD $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)"
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
    echo "# BUILD_DIR=$BUILD_DIR, built from ${src:-?} at commit $(git -C "${src:-/nonexistent}" rev-parse --short HEAD 2>/dev/null || echo '?')$(
        [ -n "$src" ] && [ -n "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ] && echo ' (with uncommitted changes)')"
    echo "# layouts '$LAYOUTS', $BYTES B per rank, $ROUNDS rounds, $ITERS timed + $WARMUP warm-up calls per job, modes '$MODES', DGC_SPARSITY=$SPARSITY, mpi-opts '$MPI_OPTS', btl ${NETNS_BTL:-tcp,self}"
    echo "# $(nproc) cores, $(uname -r), $(mpirun --version 2>/dev/null | head -1)"
} >"$OUT/meta.txt"
cat "$OUT/meta.txt"

declare -A PAYLOAD
PAYLOAD[1]=$(payload_of "$BYTES" "$OUT/logs/payload_$BYTES.out")
echo "P (whole buffer, $BYTES B): ${PAYLOAD[1]} B"

for layout in $LAYOUTS; do
    M=${layout%x*}; L=${layout#*x}; N=$((M * L)); calls=$((ITERS + WARMUP))
    if [ -z "${PAYLOAD[$L]:-}" ]; then
        [ $((BYTES / 4 % L)) -eq 0 ] || echo "layouts.sh: note: $((BYTES / 4)) floats do not split evenly into $L shards" >&2
        PAYLOAD[$L]=$(payload_of $((BYTES / L / 4 * 4)) "$OUT/logs/payload_$((BYTES / L / 4 * 4)).out")
        echo "P_shard (1/$L of the buffer): ${PAYLOAD[$L]} B"
    fi
    echo "== $layout: $M hosts x $L ranks = $N ranks; cluster up ($(($(date +%s) - t_start)) s) =="
    "$HERE/cluster.sh" up "$M" >"$OUT/logs/cluster_up_$layout.log" 2>&1 || { rc=$?; cat "$OUT/logs/cluster_up_$layout.log" >&2;
        [ "$rc" -eq 4 ] && skip "$(tail -1 "$OUT/logs/cluster_up_$layout.log")"; die "cluster.sh up $M failed"; }
    declare -A BASE=() DEAD=()
    # Baselines: per mode, a 4-byte job twice, the smaller count per host.
    for mode in $MODES; do
        job "$M" "$L" "$mode" 4 "$OUT/logs/${layout}_${mode}_base1.out"; a=$JOB_DELTA; ra=$JOB_RC
        job "$M" "$L" "$mode" 4 "$OUT/logs/${layout}_${mode}_base2.out"; b=$JOB_DELTA; rb=$JOB_RC
        if [ "$ra" != 0 ] || [ "$rb" != 0 ]; then
            echo "  $layout $mode: the 4-byte baseline job failed (rc $ra / $rb); mode skipped. Log:" >&2
            tail -n 30 "$OUT/logs/${layout}_${mode}_base$([ "$ra" != 0 ] && echo 1 || echo 2).out" | sed 's/^/    | /' >&2
            DEAD[$mode]="base rc $ra/$rb"; failed=1
            echo "$layout,$M,$L,$N,$mode,0,4,$ITERS,$WARMUP,baseline_rc_${ra}_${rb},,,,,,,,,,,," >>"$RUNS"
            continue
        fi
        BASE[$mode]=$(awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
            for (i = 1; i <= n; i++) printf "%s%.0f", (i > 1 ? " " : ""), (x[i] < y[i] ? x[i] : y[i]); print "" }')
        echo "  baseline $mode (4 B, $calls calls): per host tx/qdisc ${BASE[$mode]}"
    done
    for ((r = 1; r <= ROUNDS; r++)); do
        for mode in $MODES; do
            [ -z "${DEAD[$mode]:-}" ] || continue
            log=$OUT/logs/${layout}_${mode}_r$r.out
            job "$M" "$L" "$mode" "$BYTES" "$log"; d=$JOB_DELTA; rc=$JOB_RC
            if [ "$rc" != 0 ]; then
                st=$([ "$rc" = 124 ] && echo timeout || echo "failed_rc_$rc")
                echo "  $layout $mode round $r: job $st (rc $rc, log $log); mode skipped for the rest of $layout. Last lines:" >&2
                tail -n 30 "$log" | sed 's/^/    | /' >&2
                DEAD[$mode]=$st; failed=1
                echo "$layout,$M,$L,$N,$mode,$r,$BYTES,$ITERS,$WARMUP,$st,,,,,,,,,,,${PAYLOAD[1]},${PAYLOAD[$L]}" >>"$RUNS"
                continue
            fi
            t=$(awk '!/^#/ && NF >= 6 && $3 == "float" {print $4}' "$log" | tail -1)
            st=ok; [ -n "$t" ] || st=no_result_row
            sw=""; stt=""; scc=""; card=""
            if [ "$mode" != dense ]; then
                # STATS total: total count calls nonfinite dense_bytes wire_bytes ratio last_ratio engine_ms transport
                read -r sw stt < <(awk '/STATS total/ {for (i = 1; i <= NF; i++) if ($i == "total") {printf "%d %s\n", $(i + 5) / $(i + 2), $NF; exit}}' "$log") || true
                scc=$(sed -n 's/.*STATS pass-through calls [0-9]*, compressed calls \([0-9]*\).*/\1/p' "$log" | head -1)
                [ "${scc:-0}" -gt 0 ] 2>/dev/null || st=not_compressed
                # node layout: the shim's own estimate of a node's card bytes in the latest call
                card=$(sed -n "s/.*estimated bytes through a node's card: [0-9]* in all, \([0-9]*\) in the latest call.*/\1/p" "$log" | head -1)
            fi
            row=$(awk -v d="$d" -v b="${BASE[$mode]}" -v c="$calls" -v m="$M" 'BEGIN {
                split(d, x, " "); split(b, y, " "); mt = mq = -1e18; st = sq = 0; per = ""
                for (i = 0; i < m; i++) {
                    t = (x[2*i+1] - y[2*i+1]) / c; q = (x[2*i+2] - y[2*i+2]) / c
                    st += t; sq += q; if (t > mt) mt = t; if (q > mq) mq = q
                    per = per (i ? ";" : "") sprintf("%.0f", t)
                }
                printf "%.0f,%.0f,%.0f,%.0f,%s", mt, st / m, mq, sq / m, per }')
            echo "$layout,$M,$L,$N,$mode,$r,$BYTES,$ITERS,$WARMUP,$st,$t,$row,$sw,$stt,$scc,$card,${PAYLOAD[1]},${PAYLOAD[$L]}" >>"$RUNS"
            IFS=, read -r wmax wmean _ <<<"$row"
            printf '  %s round %d %-5s %-6s time %11s us  eth0 B/call busiest %9s mean %9s%s\n' \
                "$layout" "$r" "$mode" "$st" "${t:--}" "$wmax" "$wmean" "${sw:+  (STATS payload $sw B, $stt${card:+, card estimate $card B})}"
            [ "$st" = ok ] || failed=1
        done
    done
    unset BASE DEAD
done
"$HERE/cluster.sh" down >/dev/null
echo "== done in $(($(date +%s) - t_start)) s =="
/usr/bin/python3 "$HERE/layouts_report.py" "$OUT" || failed=1
exit "$failed"
