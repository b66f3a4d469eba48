#!/usr/bin/env bash
# The device session's one prepared command. First, on this side:
# scripts/gpu-carry.sh --nccl DIR, then give the device tool carry [".gpu"]. There it
# runs scripts/test-gpu.sh in phases, the most telling first, each under a
# time cap and all under one deadline, so that a hang costs one phase and
# not the session's device time; and it leaves in $OUT what the device tool
# brings back (at most 8 files): console.txt (everything printed),
# summary.txt (each phase's verdict) and logs.tgz (every log, the build's
# and the benchmark's included).
#
#   scripts/gpu-session.sh [--deadline S] [--out DIR] [PHASE...]
#     PHASE       env engine nccl nccl_rest ddp watchdog memory bench sanitizers (default:
#                 env engine ddp nccl, caps 30 + 150 + 180 + 150 s; nccl: a dozen telling
#                 cases, below (2 ranks; ddp_shape_node 4); a second call on the warm machine: memory bench
#                 nccl_rest watchdog sanitizers, whose builds are then incremental)
#     --deadline  seconds for the whole command (default 540, under the tool's 600)
#     --out       what comes back (default $OUT, else build-gpu/session)
#     --list      each phase's builds and the checks it would run, in order; nothing run
#                 (scripts/gpu-rehearsal.sh)
#
# Exit status: 0 when every phase that ran passed and none was cut or left
# out for want of time.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
deadline=540 out=${OUT:-build-gpu/session} phases=() list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) deadline=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --list) list=1; shift ;;
    env|engine|nccl|nccl_rest|ddp|watchdog|memory|bench|sanitizers) phases+=("$1"); shift ;;
    *) echo "gpu-session.sh: unknown argument $1 (phases: env engine nccl nccl_rest ddp watchdog memory bench sanitizers)" >&2; exit 2 ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(env engine ddp nccl)
mkdir -p "$out" build-gpu/logs
out=$(cd "$out" && pwd)
logs=$PWD/build-gpu/logs
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
start=$SECONDS status=0

# The seconds a phase may take: its cap, or what the deadline leaves after
# 15 s for packing the logs; 0 when under 30 s remain.
budget() {
  local left=$((deadline - (SECONDS - start) - 15))
  [ "$left" -ge 30 ] || { echo 0; return; }
  echo $(($1 < left ? $1 : left))
}

preflight() {
  for c in nvidia-smi nvcc gcc cmake mpicc mpirun ssh rsh compute-sanitizer torchrun "$PYTHON"; do
    printf '%-18s %s\n' "$c" "$(command -v "$c" || echo 'not found')"
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -n 1
  gcc --version | head -n 1
  mpirun --version 2>&1 | head -n 1
  ldd --version | head -n 1
  # No MPI here: the Open MPI scripts/gpu-carry.sh carried, which needs a
  # glibc as new as the machine it came from (2.36): the gpu.nccl cases run
  # with it (scripts/test-gpu.sh), the rest without MPI.
  if ! mpirun --version >/dev/null 2>&1 && [ -f .gpu/openmpi/env.sh ]; then
    ( . .gpu/openmpi/env.sh
      echo "carried: $(mpirun --version 2>&1 | head -n 1)"
      mpirun --allow-run-as-root --oversubscribe --mca plm isolated --mca pml ob1 --mca btl self,vader -np 2 hostname 2>&1 |
        head -n 6 | sed 's/^/  2 ranks: /' )
  fi
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  ls -l /usr/local/cuda/include/nccl.h .gpu/nccl/libnccl.so.2 .gpu/data 2>&1
  df -h . | tail -n 1
  nproc
}

T=scripts/test-gpu.sh
# The most telling NCCL cases, in this order: DDP's pattern against the MPI
# path, flat on 2 ranks and in node layout on 4 ranks as 2 x 2 sharing the
# GPU (issue 47), a comm hook's new tensors, bf16; calls inside a group; both
# transports; a peer that never calls (non-blocking); abort from another
# thread and from a thread with no context; capture elsewhere; fp16/bf16;
# a buffer that moves. nccl_rest: the others, in a later call.
TELLING="ddp_shape ddp_shape_node ddp_shape_fresh_auto ddp_shape_bf16 in_group two_ranks_sparse two_ranks_dense nonblocking_late
  abort_thread abort_no_context capture_elsewhere fp16_bf16 moved"
telling_re="^gpu\\.nccl\\.($(echo $TELLING | tr ' ' '|'))\$"
telling_first=$(for c in $TELLING; do printf 'gpu.nccl.%s ' "$c"; done)
phase_cmd() { # phase -> the command and its cap in seconds (env: preflight, a function, run as is)
  case "$1" in
    engine) cap=150 cmd=("$T" --out "$logs" --no-ddp --only '^gpu\.engine\.') ;;
    nccl) cap=150 cmd=("$T" --out "$logs" --no-ddp --only "$telling_re" --first "$telling_first") ;;
    nccl_rest) cap=300 cmd=("$T" --out "$logs" --no-ddp --only '^gpu\.nccl\.' --skip "$telling_re") ;;
    ddp) cap=180 cmd=("$T" --out "$logs" --only '^ddp\.two_ranks$') ;;
    watchdog) cap=150 cmd=("$T" --out "$logs" --only '^ddp\.shim_on_one_rank$') ;;
    memory) cap=170 cmd=("$T" --out "$logs" --only '^ddp\.memory_fit$') ;;
    bench) cap=200 cmd=("$T" --out "$logs" --no-checks --bench) ;;
    sanitizers) cap=300 cmd=("$T" --out "$logs" --no-ddp --only '^sanitizer\.') ;;
    env) cap=30 cmd=() ;;
  esac
}

main() {
  : >"$out/summary.txt"
  for ph in "${phases[@]}"; do
    phase_cmd "$ph"
    limit=$(budget "$cap")
    if [ "$limit" = 0 ]; then
      echo "$ph: NOT RUN (deadline)" | tee -a "$out/summary.txt"; status=1; continue
    fi
    echo "=== phase $ph (up to $limit s; $((SECONDS - start)) s gone) ==="
    t0=$SECONDS
    if [ "$list" = 1 ]; then
      if [ "$ph" = env ]; then rc=0; : >"$logs/phase.env.txt"; else "${cmd[@]}" --list 2>&1 | grep -E '^would run|^FAIL|^built' | tee "$logs/phase.$ph.txt"; rc=${PIPESTATUS[0]}; fi
    elif [ "$ph" = env ]; then
      preflight 2>&1 | tee "$logs/phase.env.txt"; rc=${PIPESTATUS[0]}
    else
      timeout --kill-after=10 "$limit" "${cmd[@]}" 2>&1 | tee "$logs/phase.$ph.txt"; rc=${PIPESTATUS[0]}
    fi
    verdict="exit $rc"
    { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && verdict="CUT at $limit s"
    [ "$rc" = 0 ] || status=1
    { echo "$ph: $verdict after $((SECONDS - t0)) s"
      grep -E '^[0-9]+ passed, [0-9]+ failed|^FAIL |^SKIPPED ' "$logs/phase.$ph.txt" | sed 's/^/  /'
    } >>"$out/summary.txt"
  done
  [ -f build-gpu/libdgcshim.so ] && { echo "--- ldd build-gpu/libdgcshim.so"; ldd build-gpu/libdgcshim.so; } \
    >>"$logs/phase.env.txt" 2>&1
  tar czf "$out/logs.tgz" -C build-gpu logs
  echo "=== summary ($((SECONDS - start)) s) ==="
  cat "$out/summary.txt"
  return "$status"
}

main 2>&1 | tee "$out/console.txt"
exit "${PIPESTATUS[0]}"
