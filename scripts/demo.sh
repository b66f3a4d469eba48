#!/usr/bin/env bash
# The main job: the same unmodified MPI program on 4 ranks, dense (plain
# Open MPI) and then under LD_PRELOAD=libdgcshim.so, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target dgcshim allreduce_loop >/dev/null
np=${NP:-4}; n=${ELEMENTS:-1048576}; steps=${STEPS:-50}
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np")
prog=build/ld_preload_examples/allreduce_loop
echo "== dense: Open MPI MPI_Allreduce =="
"${mpi[@]}" "$prog" "$n" "$steps"
echo "== dgcshim: LD_PRELOAD=build/libdgcshim.so DGC_STATS=1 (default 99.9% sparsity) =="
"${mpi[@]}" -x LD_PRELOAD="$PWD/build/libdgcshim.so" -x DGC_STATS=1 -x DGC_LOG_LEVEL=info "$prog" "$n" "$steps"
