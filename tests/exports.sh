#!/usr/bin/env bash
# shim.exports: the built library exports every function it interposes, by
# name, and nothing else. The build hides every symbol by default; an
# interposer that is not exported is never called, and the shim is then
# silently inert (under MPICH, whose mpi.h declares no visibility, that was
# every MPI entry point).
#
#   exports.sh LIBRARY MPI_VERSION_MAJOR WITH_NCCL(0|1)
#
# MPI_VERSION_MAJOR 0: a library without the MPI front end (the NCCL-only
# build, libdgcshim-nccl.so), which exports the NCCL entry points alone.
set -u
lib=$1 mpi_major=$2 nccl=$3
want=()
if [ "$mpi_major" -gt 0 ]; then
  want+=(MPI_Init MPI_Init_thread MPI_Allreduce)
  [ "$mpi_major" -ge 4 ] && want+=(MPI_Allreduce_c) # the large-count binding (MPI 4)
  for f in init init_thread allreduce; do
    up=$(tr a-z A-Z <<<"$f")
    want+=("mpi_${f}_" "mpi_${f}__" "mpi_$f" "MPI_$up" "ompi_${f}_f") # every Fortran spelling
  done
  want+=(mpi_init_f08_ mpi_init_thread_f08_) # MPICH's mpi_f08, which calls PMPI_Init
fi
[ "$nccl" = 1 ] && want+=(ncclAllReduce ncclGroupStart ncclGroupEnd ncclGroupSimulateEnd ncclCommInitRank
                          ncclCommInitRankConfig ncclCommInitAll ncclCommSplit ncclCommDestroy ncclCommAbort
                          ncclCommFinalize)
have=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWw]$/ {print $3}' | sort -u) || {
  echo "FAIL shim.exports: cannot read $lib's dynamic symbols"; exit 1; }
bad=0
for s in "${want[@]}"; do
  grep -qx -- "$s" <<<"$have" || { echo "FAIL shim.exports: $lib does not export $s"; bad=1; }
done
extra=$(comm -23 <(echo "$have") <(printf '%s\n' "${want[@]}" | sort -u))
[ -z "$extra" ] || { echo "FAIL shim.exports: $lib exports more than it interposes:" $extra; bad=1; }
[ $bad = 0 ] && echo "PASS shim.exports: $lib exports the ${#want[@]} functions it interposes, nothing else"
exit $bad
