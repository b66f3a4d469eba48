#!/usr/bin/env bash
# ddp.shim_on_one_rank: PyTorch DDP on two ranks with the shim preloaded on
# rank 0 only, under a 60 s process-group timeout. Ranks with and without
# the shim issue different collectives (the shim's configuration check and
# first-call votes), so the job cannot work: a deployment error. What must
# hold is that it ends with PyTorch's own timeout error within about 90 s,
# instead of hanging in a wait of the shim's that PyTorch cannot see
# (docs/design.md, "What a call may wait for").
#
#   tests/gpu/torch/one_sided.sh [--out DIR]
# Environment: DGC_SHIM (default build-gpu/libdgcshim.so), NCCL_PRELOAD
# (default .gpu/nccl/libnccl.so.2 when it exists, preloaded on both ranks),
# PYTHON (default python3).
# Exit 0 when the job ended within 120 s and a rank reported PyTorch's
# timeout; 1 otherwise (the log says which).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --rank ]; then # torchrun's worker: the shim on local rank 0 only
  pre=${NCCL_PRELOAD:-}
  [ "${LOCAL_RANK:-0}" = 0 ] && pre=$DGC_SHIM${pre:+:$pre}
  [ -n "$pre" ] && export LD_PRELOAD=$pre
  exec "${PYTHON:-python3}" "$here/one_sided.py"
fi
cd "$here/../../.." || exit 2
out=build-gpu/logs/one_sided
[ "${1:-}" = --out ] && out=$2
mkdir -p "$out"
export DGC_SHIM=$(realpath "${DGC_SHIM:-build-gpu/libdgcshim.so}")
if [ -z "${NCCL_PRELOAD+x}" ] && [ -f .gpu/nccl/libnccl.so.2 ]; then export NCCL_PRELOAD=$PWD/.gpu/nccl/libnccl.so.2; fi
export NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE:-1} DGC_LOG_LEVEL=info
python=${PYTHON:-python3}
start=$SECONDS
timeout --kill-after=10 180 "$python" -m torch.distributed.run --nproc-per-node 2 --no-python \
  "$here/one_sided.sh" --rank >"$out/run.log" 2>&1
rc=$? took=$((SECONDS - start))
echo "torchrun exit $rc after $took s" >>"$out/run.log"
grep -E "RAISED|FINISHED|collective operation timeout|dgcshim (WARN|ERROR)" "$out/run.log" | head -n 20
if [ "$took" -le 120 ] && grep -qE "collective operation timeout|timed out|Timeout" "$out/run.log"; then
  echo "PASS ddp.shim_on_one_rank: the job ended after $took s with PyTorch's timeout"
  exit 0
fi
echo "FAIL ddp.shim_on_one_rank: torchrun exit $rc after $took s, no PyTorch timeout within 120 s (log: $out/run.log)"
exit 1
