#!/usr/bin/env bash
# The DGC_TOPOLOGY=node convergence matrix (8 ranks, Fashion-MNIST), run with bench/convergence.sh's NODE_SIZE/SEED/BUILD_DIR/TAG:
#   MLP: dense and flat once per seed (they do not depend on the layout), node
#        per layout (NODE_SIZE=2: 4 nodes x 2 ranks; NODE_SIZE=4: 2 nodes x 4),
#        seeds $SEEDS; plus flat with NODE_SIZE=2 and =4 at seed 1 (must equal
#        flat without it)
#   CNN: dense, flat, node at NODE_SIZE=4 (2 x 4), seed 1; node at NODE_SIZE=2 last
#   (SKIP_TORCH, SKIP_FLAT_CHECK, SKIP_TORCH_L2 leave parts out)
# Every run has a time limit ($LIMIT s); a failed or timed-out run is recorded in
# matrix.log and the matrix goes on. Then convergence_node_summary.py writes
# results.csv and summary.txt into bench/results/convergence_node/ (OUT).
# WARMUP=234 is one epoch at 8 ranks (as docs/benchmarks.md's 8-rank runs).
# SRC: the checkout to run (default: this one); BUILD: its build folder for
# the runs (default build-conv, configured with -DDGC_CUDA=OFF). About 50
# minutes on 2 cores:
#   bench/convergence_node.sh
set -uo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
here=${OUT:-$bench/results/convergence_node}; mkdir -p "$here"
src=${SRC:-$(dirname "$bench")}; build=${BUILD:-$src/build-conv}
runs=$here/runs; mkdir -p "$runs"
seeds=${SEEDS:-1 2 3 4}; limit=${LIMIT:-900}
common=(NP=8 WARMUP=234 "C_EPOCHS=${C_EPOCHS:-5}" "TORCH_EPOCHS=${TORCH_EPOCHS:-3}"
        "BUILD_DIR=$build" CMAKE_ARGS=-DDGC_CUDA=OFF "RESULTS=$runs")
one() { # label, then env assignments for bench/convergence.sh
  local label=$1; shift
  local t0=$SECONDS
  echo "### $(date -u +%H:%M:%S) $label: env ${common[*]} $* $src/bench/convergence.sh" | tee -a "$here/matrix.log"
  (cd "$src" && timeout "$limit" env "${common[@]}" "$@" bench/convergence.sh) 2>&1 | tee -a "$here/matrix.log"
  local rc=${PIPESTATUS[0]}
  echo "### $label rc $rc wall $((SECONDS - t0)) s" | tee -a "$here/matrix.log"
}
T0=$SECONDS
for s in $seeds; do
  one "mlp dense+flat seed $s" ONLY=c CONFIGS="dense flat" SEED="$s" TAG="_s$s"
  for L in 2 4; do one "mlp node L=$L seed $s" ONLY=c CONFIGS=node NODE_SIZE="$L" SEED="$s" TAG="_n${L}_s$s"; done
done
if [ -z "${SKIP_TORCH:-}" ]; then
  one "cnn dense+flat seed 1" ONLY=torch CONFIGS="dense flat" SEED=1 TAG=_s1
  one "cnn node L=4 seed 1" ONLY=torch CONFIGS=node NODE_SIZE=4 SEED=1 TAG=_n4_s1
fi
[ -n "${SKIP_FLAT_CHECK:-}" ] ||
  for L in 2 4; do one "mlp flat L=$L seed 1" ONLY=c CONFIGS=flat NODE_SIZE=$L SEED=1 TAG=_n${L}_s1; done
[ -n "${SKIP_TORCH:-}${SKIP_TORCH_L2:-}" ] || one "cnn node L=2 seed 1" ONLY=torch CONFIGS=node NODE_SIZE=2 SEED=1 TAG=_n2_s1
echo "### matrix wall $((SECONDS - T0)) s" | tee -a "$here/matrix.log"
/usr/bin/python3 "$bench/convergence_node_summary.py" "$runs/convergence_logs" "$here" | tee "$here/summary.txt"
