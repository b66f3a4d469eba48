#!/usr/bin/env bash
# shim.no_mpi: the NCCL-only library (a build without the MPI front end)
# owes nothing to MPI. No MPI library among its NEEDED ones, no MPI symbol
# left for the loader to find, and no MPI header in what was compiled for it
# (the compilers' dependency files of the library's own objects: mpi.h may
# sit on the default include path, where a stray #include would compile
# unnoticed; test programs may use MPI, the library may not).
#
#   no_mpi.sh path/to/libdgcshim-nccl.so BUILD_DIR
set -u
lib=${1:?usage: no_mpi.sh LIBRARY BUILD_DIR} build=${2:?usage: no_mpi.sh LIBRARY BUILD_DIR}
[ -f "$lib" ] || { echo "FAIL shim.no_mpi: no $lib"; exit 1; }
bad=0
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo $needed)"
mpi_needed=$(grep -E '^lib(p?mpi|open-pal|open-rte|pmix|mpich)' <<<"$needed" || true)
[ -z "$mpi_needed" ] || { echo "FAIL shim.no_mpi: $lib needs $(echo $mpi_needed)"; bad=1; }
symbols=$(nm -D "$lib" | awk '{print $NF}' | grep -E '^(P?MPI_|P?MPIX_|ompi_|mpi_|pmpi_|MPIR_)' || true)
[ -z "$symbols" ] || { echo "FAIL shim.no_mpi: $lib names MPI symbols: $(echo $symbols | head -c 300)"; bad=1; }
dirs=("$build"/CMakeFiles/dgcshim.dir "$build"/CMakeFiles/dgcshim_core.dir "$build"/CMakeFiles/dgc_stream_*.dir)
[ -d "$build/kernels" ] && dirs+=("$build/kernels")
deps=$(find "${dirs[@]}" -name '*.o.d' 2>/dev/null | wc -l)
[ "$deps" -gt 0 ] || { echo "FAIL shim.no_mpi: no dependency files (*.o.d) under $build"; bad=1; }
mpi_h='(^|[ /])(mpi|mpio|mpif)\.h([ :\\]|$)'
headers=$(find "${dirs[@]}" -name '*.o.d' -print0 2>/dev/null | xargs -0 grep -lE "$mpi_h" || true)
[ -z "$headers" ] || { echo "FAIL shim.no_mpi: MPI headers compiled into: $(echo $headers | head -c 300)"; bad=1; }
[ $bad = 0 ] && echo "PASS shim.no_mpi: $lib needs no MPI library, names no MPI symbol, and none of the" \
  "$deps objects compiled for it includes an MPI header"
exit $bad
