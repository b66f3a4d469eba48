#!/usr/bin/env bash
# The same job under Open MPI and under MPICH gives the same bits: 300 steps
# of SGD with momentum over the shim's sparse output (fp32 values, the
# all-gather transport, DGC momentum 0.9 and warm-up, same seeds), each
# build under its own launcher; the final weights must be identical, byte
# for byte. (The dense transport sums in the MPI library's own order, so it
# is left out: its sums agree to rounding, not bit for bit.)
#
#   same_bits.sh OPEN_MPI_BUILD MPICH_BUILD
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ompi=$(cd "$1" && pwd) mpich=$(cd "$2" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
args=(-e DGC_VALUE_BITS=32 -e DGC_TRANSPORT=sparse -e DGC_MOMENTUM=0.9 -e DGC_WARMUP_STEPS=20 -e DGC_SPARSITY=0.99
      -- optimizer --n 50000 --steps 300 --momentum 0.9)
SHIM=$ompi/libdgcshim.so CHECK=$ompi/tests/allreduce_check MPI_FAMILY=openmpi MPIEXEC=mpirun.openmpi \
  "$here/run_case.sh" "${args[@]}" --dump "$dir/openmpi"
SHIM=$mpich/libdgcshim-mpich.so CHECK=$mpich/tests/allreduce_check MPI_FAMILY=mpich MPIEXEC=mpiexec.mpich \
  "$here/run_case.sh" "${args[@]}" --dump "$dir/mpich"
if cmp "$dir/openmpi" "$dir/mpich"; then
  echo "PASS same_bits: 50000 weights after 300 steps identical under Open MPI and MPICH ($(sha256sum <"$dir/mpich" | cut -c1-16))"
else
  echo "FAIL same_bits: the weights differ between Open MPI and MPICH"; exit 1
fi
