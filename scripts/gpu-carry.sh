#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for a run on the GPU machine, which sees only
# the checkout: NCCL 2.30.7 (two ranks on one GPU) from ../shared/nccl, and
# Fashion-MNIST for the DDP trainer. Name .gpu in the device tool's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHARED:-../shared}
mkdir -p .gpu/nccl .gpu/data
cp -f "$shared/nccl/libnccl.so.2" "$shared/nccl/LICENSE.txt" .gpu/nccl/
cp -f /usr/share/datasets/fashion-mnist/*.gz .gpu/data/
du -sh .gpu
