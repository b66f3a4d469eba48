#!/usr/bin/env bash
# ddp.shim_on_one_rank: PyTorch DDP on two ranks with the shim preloaded on
# rank 0 only, under a 60 s process-group timeout. Ranks with and without
# the shim issue different collectives (the shim's configuration check and
# first-call votes), so the job cannot work: a deployment error. What must
# hold is that it ends with PyTorch's own timeout error within about 90 s,
# instead of hanging in a wait of the shim's that PyTorch cannot see
# (docs/design.md, "What a call may wait for"), and that the rank with the
# shim (rank 0) is the one that shows it: it raises in Python. A timeout
# logged by the rank without the shim proves nothing of the shim's waits:
# torchrun kills the other worker when one fails, however stuck it was.
# TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (unless set): on an error or timeout the
# watchdog aborts the communicators and the training thread raises, rather
# than the watchdog ending the process, so rank 0's RAISED line can show.
#
#   tests/gpu/torch/one_sided.sh [--out DIR]
# Environment: DGC_SHIM (default build-gpu/libdgcshim.so), NCCL_PRELOAD
# (default .gpu/nccl/libnccl.so.2 when it exists, preloaded on both ranks),
# PYTHON (default python3).
# Exit 0 when the job ended within 120 s, a rank reported PyTorch's timeout
# and rank 0 (the shim's) raised; 1 otherwise (the log says which).
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
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-2}
python=${PYTHON:-python3}
start=$SECONDS
timeout --kill-after=10 180 "$python" -m torch.distributed.run --nproc-per-node 2 --no-python \
  "$here/one_sided.sh" --rank >"$out/run.log" 2>&1
rc=$? took=$((SECONDS - start))
echo "torchrun exit $rc after $took s" >>"$out/run.log"
grep -E "RAISED|FINISHED|collective operation timeout|dgcshim (WARN|ERROR)" "$out/run.log" | head -n 20
timeout_seen=0 shim_raised=0
grep -qE "collective operation timeout|timed out|Timeout" "$out/run.log" && timeout_seen=1
grep -q "rank 0: RAISED" "$out/run.log" && shim_raised=1
if [ "$took" -le 120 ] && [ "$timeout_seen" = 1 ] && [ "$shim_raised" = 1 ]; then
  echo "PASS ddp.shim_on_one_rank: the job ended after $took s with PyTorch's timeout, and rank 0 (the shim's) raised"
  exit 0
fi
why=""
[ "$took" -le 120 ] || why="$why, took over 120 s"
[ "$timeout_seen" = 1 ] || why="$why, no PyTorch timeout"
[ "$shim_raised" = 1 ] || why="$why, rank 0 (the shim's) did not raise (stuck until killed, or ended otherwise)"
echo "FAIL ddp.shim_on_one_rank: torchrun exit $rc after $took s${why} (log: $out/run.log)"
exit 1
