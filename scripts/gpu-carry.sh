#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for a run on the GPU machine, which sees only
# the checkout: an NCCL 2.30+ libnccl.so.2 (the first release that lets two
# ranks share one GPU, with NCCL_MULTI_RANK_GPU_ENABLE=1) and Fashion-MNIST
# for the DDP trainer, the official DGC compressor for the benchmark's
# baseline (scripts/fetch-upstream.sh official-dgc), and this machine's Open
# MPI (scripts/carry-openmpi.sh: the gpu.nccl cases are NCCL + MPI programs,
# and the GPU machine has no MPI). Name .gpu in the device tool's carry.
#
#   scripts/gpu-carry.sh --nccl DIR [--data DIR] [--dgc-from DIR] [--no-mpi]
#   scripts/gpu-carry.sh --mpi-only     Open MPI alone (scripts/gpu-rehearsal.sh)
#     --nccl DIR   a directory with libnccl.so.2 (and LICENSE.txt) of NCCL 2.30+
#                  built for the GPU (sm_90 for an H200): NVIDIA's release from
#                  https://developer.nvidia.com/nccl, or a build of
#                  https://github.com/NVIDIA/nccl (make src.build NVCC_GENCODE=...)
#     --data DIR   Fashion-MNIST's IDX .gz files (default /usr/share/datasets/fashion-mnist,
#                  Debian's dataset-fashion-mnist)
#     --dgc-from DIR   a clone of synxlin/deep-gradient-compression, for a machine without
#                  GitHub (fetch-upstream.sh --from)
#     --no-mpi     leave Open MPI out (a GPU machine that has MPI)
set -euo pipefail
cd "$(dirname "$0")/.."
nccl="" data=/usr/share/datasets/fashion-mnist dgc_from="" mpi=1 mpi_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nccl) nccl=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --dgc-from) dgc_from=$2; shift 2 ;;
    --no-mpi) mpi=0; shift ;;
    --mpi-only) mpi_only=1; shift ;;
    *) echo "gpu-carry.sh: unknown argument $1 (--nccl DIR [--data DIR] [--dgc-from DIR] [--no-mpi], or --mpi-only)" >&2; exit 2 ;;
  esac
done
if [ "$mpi" = 1 ] || [ "$mpi_only" = 1 ]; then scripts/carry-openmpi.sh .gpu/openmpi; fi
if [ "$mpi_only" = 1 ]; then du -sh .gpu; exit 0; fi
[ -n "$nccl" ] || { echo "gpu-carry.sh: give --nccl DIR: a directory holding NCCL 2.30+'s libnccl.so.2 (see the script's header)" >&2; exit 2; }
[ -f "$nccl/libnccl.so.2" ] || { echo "gpu-carry.sh: no libnccl.so.2 in $nccl" >&2; exit 2; }
mkdir -p .gpu/nccl .gpu/data
cp -f "$nccl/libnccl.so.2" .gpu/nccl/
[ -f "$nccl/LICENSE.txt" ] && cp -f "$nccl/LICENSE.txt" .gpu/nccl/
cp -f "$data"/*.gz .gpu/data/
if scripts/fetch-upstream.sh official-dgc ${dgc_from:+--from "$dgc_from"} >/dev/null; then
  rm -rf .gpu/official-dgc && cp -r .upstream/official-dgc .gpu/official-dgc
else
  echo "gpu-carry.sh: no official DGC compressor: the GPU benchmark will report its baseline skipped (--dgc-from DIR)" >&2
fi
# The device tool carries the checkout and .gpu, 64 MiB in all: Fashion-MNIST
# is the largest part (31 MB); without it the DDP run takes synthetic data.
kib=$(( $(du -sk .gpu | cut -f1) + $(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n 1 | cut -f1) ))
echo "gpu-carry.sh: .gpu and the checkout: $((kib / 1024)) MiB of the carry's 64"
[ "$kib" -le $((64 * 1024)) ] || { echo "gpu-carry.sh: over 64 MiB: leave the data out (rm -r .gpu/data)" >&2; exit 1; }
