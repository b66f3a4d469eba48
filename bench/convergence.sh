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
# (default "dense dgc gd"; "reduce": dgc's settings with DGC_TRANSPORT=reduce),
# RESULTS (default bench/results: where the CSV, the PNG and the logs go).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh torch
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target dgcshim mlp_trainer >/dev/null
np=${NP:-4}; warmup=${WARMUP:-468}
res=${RESULTS:-bench/results}; logs=$res/convergence_logs; mkdir -p "$logs"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np"
     -x LD_PRELOAD="$PWD/build/libdgcshim.so" -x DGC_STATS=1)
declare -A config=(
  [dense]="-x DGC_ENABLE=0"
  [dgc]="-x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=$warmup"
  [gd]="-x DGC_MOMENTUM=0 -x DGC_WARMUP_STEPS=$warmup"
  [reduce]="-x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=$warmup -x DGC_TRANSPORT=reduce"
)
run() { # trainer name, then its command
  local trainer=$1; shift
  for c in ${CONFIGS:-dense dgc gd}; do
    echo "== $trainer $c =="
    # shellcheck disable=SC2086
    "${mpi[@]}" ${config[$c]} "$@" 2>&1 | tee "$logs/${trainer}_$c.log" | grep -E '^(epoch|final)'
  done
}
[ "${ONLY:-c}" = torch ] || run c build/ld_preload_examples/mlp_trainer --epochs "${C_EPOCHS:-5}"
[ "${ONLY:-torch}" = c ] || run torch /usr/bin/python3 ld_preload_examples/torch_mpi_cnn.py --epochs "${TORCH_EPOCHS:-3}"
/usr/bin/python3 bench/convergence_report.py "$logs" "$res"
