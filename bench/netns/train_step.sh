#!/usr/bin/env bash
# Training step on the emulated 1 Gbit/s cluster: the C trainer
# (ld_preload_examples/mlp_trainer) with about 25M parameters (ResNet-50's size),
# dense Open MPI against the same binary under LD_PRELOAD=libdgcshim.so on N
# hosts, and the same per-rank batch on 1 host (np 1, no network) for the weak
# scaling efficiency = (1-host time per step) / (N-host time per step).
#
#   bench/netns/train_step.sh [--hosts 4] [--hidden 4096,4096,1280] [--batch 32]
#                             [--steps 30] [--mpi-opts "OPTS"] [--out DIR]
#
#   --hidden   hidden layers (default 4096,4096,1280: 784-4096-4096-1280-10 =
#              25,253,642 parameters)
#   --batch    minibatch per rank (default 32), the same on 1 and N hosts
#   --steps    steps per rank: --train-limit is batch x steps x ranks, one epoch
#   --mpi-opts more mpirun options for the N-host runs, both modes (e.g. "--mca
#              mpi_yield_when_idle 1": idle ranks yield the shared cores)
#   --out DIR  results (default <repo>/bench/results/netns): train_step.csv,
#              train_step.txt (summary), logs/train_*.out
#
# Shim settings: DGC_MOMENTUM=0.9 (momentum correction + compensation, the
# trainer keeps its SGD momentum 0.9), DGC_WARMUP_STEPS=0 (99.9% sparsity from
# the first step: right for timing a step, not what a real run from scratch
# would use), DGC_STATS=1 (payload bytes, engine time). --test-limit 100 keeps
# the evaluation (not timed in the step) short. The time per step is the epoch's
# training time (epoch_s) / steps; compute and communication are rank 0's time
# outside and inside the gradient MPI_Allreduce (comm includes waiting for the
# slowest rank). The first step includes first-touch of buffers (and the shim's
# state allocation): one step in --steps.
#
# Also measures the shim's engine on one rank with a core of its own (np 1,
# DGC_MIN_RANKS=1, allreduce_bench at the model's size) for the projection "with
# per-host compute": compute (1 host) + comm, where the shim's comm is
# (comm here - engine time here) + engine time on its own core.
# Environment: BUILD_DIR (default <repo>/build). Exit 77 = skipped (no root/netns).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build}
TRAINER=$BUILD_DIR/ld_preload_examples/mlp_trainer
BENCH=$BUILD_DIR/bench/allreduce_bench
SHIM=$BUILD_DIR/libdgcshim.so
PREFIX=dgc
N=4; HIDDEN=4096,4096,1280; BATCH=32; STEPS=30; OUT=$REPO/bench/results/netns; MPI_OPTS=""

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "train_step.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) N=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --mpi-opts) MPI_OPTS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "train_step.sh: unknown option '$1'" >&2; usage ;;
    esac
done
skip() { echo "SKIPPED: train_step.sh needs root and ip netns ($*)"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "running as uid $(id -u), not root"
ip netns list >/dev/null 2>&1 || skip "'ip netns' not supported"
for f in "$TRAINER" "$BENCH" "$SHIM"; do [ -e "$f" ] || die "missing $f (build first)"; done
TRAINER=$(realpath "$TRAINER"); BENCH=$(realpath "$BENCH"); SHIM=$(realpath "$SHIM")
# shellcheck source=common.sh
. "$HERE/common.sh"
! netns_cluster_up || die "an emulated cluster is already up; '$HERE/cluster.sh down' removes it"
mkdir -p "$OUT/logs"
netns_down_on_exit train_step.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

targs() { # ranks -> trainer arguments (same per-rank batch and steps)
    echo --hidden "$HIDDEN" --batch "$BATCH" --epochs 1 --train-limit $((BATCH * STEPS * $1)) --test-limit 100
}
SHIM_ENV=(-x "LD_PRELOAD=$SHIM" -x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=0 -x DGC_STATS=1)

tx_sum() { # N -> max over hosts of eth0 tx bytes ... printed per host
    local i
    for ((i = 0; i < $1; i++)); do
        ip -n "$PREFIX$i" -s link show dev eth0 | awk 'f {printf "%s ", $1; exit} $1 == "TX:" {f = 1}'
    done
    echo
}
max_delta() { awk -v a="$1" -v b="$2" 'BEGIN {n = split(a, x, " "); split(b, y, " "); m = 0;
    for (i = 1; i <= n; i++) if (y[i] - x[i] > m) m = y[i] - x[i]; print m}'; }

# Parse a trainer log: epoch 1 line (epoch_s comm_s compute_s), final line (params steps test_acc).
parse() { # log -> "params steps epoch_s comm_s compute_s test_acc"
    awk '$1 == "epoch" && $2 == 1 {for (i = 1; i < NF; i++) v[$i] = $(i + 1)}
         $1 == "final" {for (i = 1; i < NF; i++) f[$i] = $(i + 1)}
         END {print f["params"], f["steps"], v["epoch_s"], v["comm_s"], v["compute_s"], f["test_acc"]}' "$1"
}

t0=$(date +%s)
echo "== 1 host (np 1, no network): $(targs 1) =="
log1=$OUT/logs/train_1host.out
# shellcheck disable=SC2046
timeout 900 mpirun --allow-run-as-root -np 1 --mca btl self --mca pml ob1 "$TRAINER" $(targs 1) >"$log1" 2>&1 ||
    { cat "$log1" >&2; die "1-host run failed"; }
cat "$log1"
read -r PARAMS _ _ _ _ _ < <(parse "$log1")

echo "== engine on one rank with a core of its own: $PARAMS floats ($(($(date +%s) - t0)) s) =="
eng_us=$(netns_engine_call_us $((PARAMS * 4)) "$OUT/logs/train_engine_1host.out" -x DGC_MOMENTUM=0.9)
ENG1=$(awk -v t="$eng_us" 'BEGIN {printf "%.6f", t / 1e6}')
echo "  engine: $ENG1 s per call (momentum 0.9)"

echo "== cluster up $N ($(($(date +%s) - t0)) s) =="
"$HERE/cluster.sh" up "$N"
declare -A WIRE
for mode in dense shim; do
    echo "== $N hosts, $mode: $(targs "$N") ($(($(date +%s) - t0)) s) =="
    log=$OUT/logs/train_${N}hosts_${mode}.out
    # shellcheck disable=SC2206
    opts=($MPI_OPTS); [ "$mode" = shim ] && opts+=("${SHIM_ENV[@]}")
    s0=$(tx_sum "$N")
    # shellcheck disable=SC2046
    timeout 1800 "$HERE/run.sh" "$N" "${opts[@]+"${opts[@]}"}" -- "$TRAINER" $(targs "$N") >"$log" 2>&1 ||
        { cat "$log" >&2; die "$N-host $mode run failed"; }
    s1=$(tx_sum "$N")
    WIRE[$mode]=$(max_delta "$s0" "$s1")
    cat "$log"
done
"$HERE/cluster.sh" down >/dev/null

CSV=$OUT/train_step.csv
TXT=$OUT/train_step.txt
echo "run,hosts,params,batch_per_rank,steps,step_s,compute_s_per_step,comm_s_per_step,engine_s_per_step,wire_bytes_per_rank_per_step,scaling_eff,proj_step_s,proj_scaling_eff,test_acc" >"$CSV"
read -r _ S1 E1 C1 P1 A1 < <(parse "$log1")
step1=$(awk -v e="$E1" -v s="$S1" 'BEGIN {printf "%.4f", e / s}')
comp1=$(awk -v e="$P1" -v s="$S1" 'BEGIN {printf "%.4f", e / s}')
echo "1host,1,$PARAMS,$BATCH,$S1,$step1,$comp1,$(awk -v e="$C1" -v s="$S1" 'BEGIN {printf "%.4f", e / s}'),,0,1.000,$step1,1.000,$A1" >>"$CSV"
for mode in dense shim; do
    log=$OUT/logs/train_${N}hosts_${mode}.out
    read -r _ S E C P A < <(parse "$log")
    eng=""
    if [ "$mode" = shim ]; then
        eng=$(awk '/STATS total/ {for (i = 1; i <= NF; i++) if ($i == "total") {printf "%.4f", $(i + 8) / 1000 / $(i + 2); exit}}' "$log")
    fi
    # Projection with per-host compute: 1-host compute per step + comm per step, the shim's
    # engine share replaced by the engine's time on a core of its own.
    awk -v m="$mode" -v n="$N" -v p="$PARAMS" -v b="$BATCH" -v s="$S" -v e="$E" -v c="$C" -v q="$P" -v a="$A" \
        -v eng="$eng" -v eng1="$ENG1" -v w="${WIRE[$mode]}" -v st1="$step1" -v cp1="$comp1" 'BEGIN {
        step = e / s; comm = c / s; comp = q / s
        pcomm = (eng != "") ? comm - eng + eng1 : comm
        proj = cp1 + pcomm
        printf "%s,%d,%d,%d,%d,%.4f,%.4f,%.4f,%s,%.0f,%.3f,%.4f,%.3f,%s\n", m, n, p, b, s, step, comp, comm,
            eng, w / s, st1 / step, proj, st1 / proj, a }' >>"$CSV"
done

{
    echo "# training step on the emulated 1 Gbit/s cluster ($N hosts), $(date -u +%F)"
    echo "# mlp_trainer 784-${HIDDEN//,/-}-10, $PARAMS parameters, batch $BATCH per rank, one MPI_Allreduce of all gradients per step"
    echo "# shim: DGC_MOMENTUM=0.9 DGC_WARMUP_STEPS=0 (99.9% sparsity from step 1); all hosts share 2 CPU cores"
    echo "# step_s = training time / steps; scaling_eff = 1-host step / N-host step (same per-rank batch, weak scaling)"
    echo "# proj = 'with per-host compute': 1-host compute per step + comm per step, the shim's engine time replaced by"
    echo "#        the engine on a core of its own ($ENG1 s per call, np 1)"
    echo "# wire_B/step: busiest host's eth0 tx bytes over the whole job (launch, data broadcast, evaluation included) / steps"
    echo "# engine_s: the shim's engine time per call on rank 0 (DGC_STATS), 4 ranks on 2 cores, first call included"
    printf '%-6s %5s %7s %10s %10s %10s %10s %14s %8s %9s %9s %8s\n' run hosts steps step_s compute_s comm_s engine_s \
        wire_B/step eff proj_s proj_eff acc
    tail -n +2 "$CSV" | awk -F, '{printf "%-6s %5s %7s %10s %10s %10s %10s %14s %8s %9s %9s %8s\n",
        $1, $2, $5, $6, $7, $8, ($9 == "" ? "-" : $9), $10, $11, $12, $13, $14}'
    awk -F, '$1 == "dense" {d = $6; dp = $12} $1 == "shim" {s = $6; sp = $12}
        END {printf "step time dense / shim: %.2fx here, %.2fx projected with per-host compute\n", d / s, dp / sp}' "$CSV"
} | tee "$TXT"
echo "== done in $(($(date +%s) - t0)) s: $CSV, $TXT =="
