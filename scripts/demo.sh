#!/usr/bin/env bash
# The main job: the C data-parallel trainer (784-512-512-10 MLP, Fashion-MNIST,
# SGD with momentum 0.9, one MPI_Allreduce of all 669,706 gradients per step)
# on 4 ranks, first with plain Open MPI, then unmodified under
# LD_PRELOAD=libdgcshim.so (99.9% sparsity, one epoch of warm-up, DGC momentum
# 0.9 with compensation), and a side-by-side table.
#
# Environment: NP (4), EPOCHS (5), WARMUP (steps, 468 = one epoch at 4 ranks),
# MPI (openmpi, the default; mpich: built in build-mpich against MPICH,
# libdgcshim-mpich.so under mpiexec.mpich).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh train
np=${NP:-4}; epochs=${EPOCHS:-5}; warmup=${WARMUP:-468}
case "${MPI:-openmpi}" in
  openmpi)
    build=build; lib=libdgcshim.so; name="Open MPI"; cmake_mpi=()
    mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)
    env_of() { echo -x "$1=$2"; } ;;
  mpich)
    build=build-mpich; lib=libdgcshim-mpich.so; name=MPICH; cmake_mpi=(-DMPI_C_COMPILER=mpicc.mpich -DDGC_CUDA=OFF)
    mpi=(mpiexec.mpich)
    env_of() { echo -genv "$1" "$2"; } ;;
  *) echo "demo.sh: MPI=${MPI}: openmpi or mpich" >&2; exit 2 ;;
esac
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${cmake_mpi[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target dgcshim mlp_trainer >/dev/null
out=${OUT:-$build/demo}; mkdir -p "$out"
trainer=("$build/ld_preload_examples/mlp_trainer" --epochs "$epochs")
shim=()
for kv in "LD_PRELOAD=$PWD/$build/$lib" DGC_MOMENTUM=0.9 "DGC_WARMUP_STEPS=$warmup" DGC_STATS=1 DGC_LOG_LEVEL=info; do
  read -ra e <<<"$(env_of "${kv%%=*}" "${kv#*=}")"; shim+=("${e[@]}")
done

echo "== dense: plain $name, $np ranks, $epochs epochs =="
"${mpi[@]}" -n "$np" "${trainer[@]}" 2>&1 | tee "$out/dense.log"
echo "== dgcshim: LD_PRELOAD=$build/$lib DGC_MOMENTUM=0.9 DGC_WARMUP_STEPS=$warmup =="
"${mpi[@]}" "${shim[@]}" -n "$np" "${trainer[@]}" 2>&1 | tee "$out/dgc.log"  # launcher-wide env first (hydra)

# field NAME LINE: the value after NAME in a "name value name value" line
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) {print $(i + 1); exit}}' <<<"$2"; }
dense=$(grep '^final ' "$out/dense.log"); dgc=$(grep '^final ' "$out/dgc.log")
stats=$(grep -E 'dgcshim STATS 0x' "$out/dgc.log" | head -n 1)
params=$(field params "$dense"); steps=$(field steps "$dense")
dense_bytes=$((4 * params * steps))
read -r dgc_bytes ratio last_ratio < <(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^0x/) {print $(i + 5), $(i + 6), $(i + 7); exit}}' <<<"$stats")
echo
echo "== side by side: $np ranks, $epochs epochs, $params parameters, $steps steps =="
printf '%-10s %9s %18s %12s %12s %10s\n' run test_acc "bytes sent/rank" ratio after_warmup wall_s
printf '%-10s %9s %18s %12s %12s %10s\n' dense "$(field test_acc "$dense")" "$dense_bytes" 1.0x 1.0x \
  "$(field wall_s "$dense")"
printf '%-10s %9s %18s %12s %12s %10s\n' dgcshim "$(field test_acc "$dgc")" "$dgc_bytes" "$ratio" "$last_ratio" \
  "$(field wall_s "$dgc")"
echo "(bytes: what each rank contributes per all-reduce, 4n dense and one payload under the shim, summed over"
echo " the run; ratio counts the warm-up, after_warmup is the last step's; logs in $out/)"
