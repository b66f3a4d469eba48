#!/usr/bin/env bash
# Convergence under the shim: both trainers in ld_preload_examples/ on 4 ranks,
# same seed and epochs, three ways:
#   dense    DGC_ENABLE=0 (the shim loaded, every call passed through)
#   dgc      99.9% sparsity, warm-up, DGC_MOMENTUM=0.9 with compensation
#            (the optimizer keeps its momentum 0.9, unmodified)
#   gd       gradient dropping: the same, DGC_MOMENTUM=0 (residual only)
# Writes logs, bench/results/convergence.csv and bench/results/convergence.png,
# and prints the table (bench/convergence_report.py).
#
# Environment: NP (4), C_EPOCHS (5), TORCH_EPOCHS (3), WARMUP (468 steps = one
# epoch at 4 ranks and batch 32), ONLY (c or torch: one trainer), CONFIGS
# (default "dense dgc gd"; "reduce": dgc's settings with DGC_TRANSPORT=reduce;
# "flat" and "node": dgc's settings with DGC_TOPOLOGY=flat or =node),
# RESULTS (default bench/results: where the CSV, the PNG and the logs go).
#   NODE_SIZE  L: node gets DGC_NODE_SIZE=L (nodes of L consecutive ranks, so one
#              machine emulates NP/L nodes), and so does flat, so that the two
#              differ only in DGC_TOPOLOGY; unset: neither gets it (nodes from MPI)
#   SEED       passed to both trainers as --seed (unset: their default, 1)
#   BUILD_DIR  the build directory that is configured (plus CMAKE_ARGS, default
#              none) and built, and whose libdgcshim.so and mlp_trainer run
#              (default build)
#   TAG        a suffix for the log, CSV and PNG names (default none), e.g.
#              TAG=_n4_s2 writes c_node_n4_s2.log and convergence_n4_s2.csv, so
#              runs at other layouts or seeds keep their own files
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh torch
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" --target dgcshim mlp_trainer >/dev/null
build=$(cd "$build" && pwd)
np=${NP:-4}; warmup=${WARMUP:-468}; tag=${TAG:-}
res=${RESULTS:-bench/results}; logs=$res/convergence_logs; mkdir -p "$logs"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np"
     -x LD_PRELOAD="$build/libdgcshim.so" -x DGC_STATS=1)
seed=(); [ -z "${SEED:-}" ] || seed=(--seed "$SEED")
node_size=""; [ -z "${NODE_SIZE:-}" ] || node_size="-x DGC_NODE_SIZE=$NODE_SIZE"
dgc="-x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=$warmup"
declare -A config=(
  [dense]="-x DGC_ENABLE=0"
  [dgc]="$dgc"
  [gd]="-x DGC_MOMENTUM=0 -x DGC_WARMUP_STEPS=$warmup"
  [reduce]="$dgc -x DGC_TRANSPORT=reduce"
  [flat]="$dgc -x DGC_TOPOLOGY=flat $node_size"
  [node]="$dgc -x DGC_TOPOLOGY=node $node_size"
)
run() { # trainer name, then its command
  local trainer=$1; shift
  for c in ${CONFIGS:-dense dgc gd}; do
    echo "== $trainer $c$tag =="
    # shellcheck disable=SC2086
    "${mpi[@]}" ${config[$c]} "$@" "${seed[@]}" 2>&1 | tee "$logs/${trainer}_$c$tag.log" | grep -E '^(epoch|final)'
  done
}
[ "${ONLY:-c}" = torch ] || run c "$build/ld_preload_examples/mlp_trainer" --epochs "${C_EPOCHS:-5}"
[ "${ONLY:-torch}" = c ] || run torch /usr/bin/python3 ld_preload_examples/torch_mpi_cnn.py --epochs "${TORCH_EPOCHS:-3}"
/usr/bin/python3 bench/convergence_report.py "$logs" "$res" "$tag"
