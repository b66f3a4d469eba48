#!/usr/bin/env bash
# libdgcshim.so must load where there is no GPU driver and no NCCL: an
# MPI-only job on a CPU machine preloads the same library. So neither
# libnccl, libcudart nor libcuda may be NEEDED (NCCL is found among the
# loaded objects at the first NCCL call; the CUDA runtime is linked in
# statically, and libcuda is opened by it on first use), and the static
# runtime's symbols must not be exported (they would stand in for the
# application's own libcudart).
#
#   needed.sh path/to/libdgcshim.so
set -u
lib=${1:?usage: needed.sh libdgcshim.so}
[ -f "$lib" ] || { echo "FAIL: no $lib"; exit 1; }
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo $needed)"
bad=$(echo "$needed" | grep -E '^lib(nccl|cudart|cuda)\.so' || true)
[ -z "$bad" ] || { echo "FAIL: $lib needs $(echo $bad)"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -E '^(cuda|__cuda|cu[A-Z]|_Z.*cuda)' || true)
[ -z "$exported" ] || { echo "FAIL: $lib exports CUDA runtime symbols: $(echo $exported | head -c 300)"; exit 1; }
echo "PASS: no libnccl, libcudart or libcuda among the NEEDED libraries; no CUDA symbols exported"
