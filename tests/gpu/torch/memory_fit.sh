#!/usr/bin/env bash
# ddp.memory_fit (issue 46, GPU memory beside PyTorch): PyTorch DDP on two
# ranks sharing the GPU, the shim preloaded on both, whose own memory
# (parameters, gradients, SGD momentum, DDP's buckets) takes about 60% of
# the GPU, for 3 steps. The shim's states are made in the first backward
# pass, before the optimizer's momentum exists: what must hold is that no
# step fails, because the states fit beside PyTorch's memory or, where they
# would not, the shim sums those buckets densely (DGC_MAX_STATE_MB=auto).
# The log shows PyTorch's reserved memory at each step and the shim's state
# bytes (its STATS memory line) for the record.
#
#   tests/gpu/torch/memory_fit.sh [--out DIR] [--fraction F]
# Environment: DGC_SHIM (default build-gpu/libdgcshim.so), NCCL_PRELOAD
# (default .gpu/nccl/libnccl.so.2 when it exists), PYTHON (default python3).
# Exit 0 when both ranks finished every step; 1 otherwise (the log says why).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --rank ]; then # torchrun's worker
  shift
  export LD_PRELOAD=$DGC_SHIM${NCCL_PRELOAD:+:$NCCL_PRELOAD}
  exec "${PYTHON:-python3}" "$here/memory_fit.py" "$@"
fi
cd "$here/../../.." || exit 2
out=build-gpu/logs/memory_fit fraction=0.6
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --fraction) fraction=$2; shift 2 ;;
    *) echo "memory_fit.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
export DGC_SHIM=$(realpath "${DGC_SHIM:-build-gpu/libdgcshim.so}")
if [ -z "${NCCL_PRELOAD+x}" ] && [ -f .gpu/nccl/libnccl.so.2 ]; then export NCCL_PRELOAD=$PWD/.gpu/nccl/libnccl.so.2; fi
export NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE:-1} DGC_STATS=1 DGC_LOG_LEVEL=info
start=$SECONDS
timeout --kill-after=10 150 "${PYTHON:-python3}" -m torch.distributed.run --nproc-per-node 2 --no-python \
  "$here/memory_fit.sh" --rank --fraction "$fraction" >"$out/run.log" 2>&1
rc=$? took=$((SECONDS - start))
echo "torchrun exit $rc after $took s" >>"$out/run.log"
grep -E "rank [01]: |STATS memory|STATS device memory|over budget|dgcshim (WARN|ERROR)" "$out/run.log" | head -n 30
finished=$(grep -c "FINISHED" "$out/run.log")
if [ "$rc" = 0 ] && [ "$finished" = 2 ]; then
  echo "PASS ddp.memory_fit: both ranks finished every step with PyTorch's memory at $fraction of the GPU ($took s)"
  exit 0
fi
echo "FAIL ddp.memory_fit: torchrun exit $rc after $took s, $finished of 2 ranks finished (log: $out/run.log)"
exit 1
