#!/usr/bin/env bash
# Runs one gpu.nccl case: nccl_check under a real mpirun, every rank on GPU 0,
# with libdgcshim.so preloaded (and, when set, a newer NCCL after it), then
# checks the exit status, one PASS line per rank, and the output.
#
#   run_nccl_case.sh NP CASE [--grep REGEX]... [--times N REGEX]...
#
# Environment: SHIM, CHECK (paths); DGC_NCCL_TEST_LIB or NCCL_PRELOAD: a
# libnccl.so.2 to preload after the shim. Two ranks on one GPU need NCCL
# 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1 (copied to .gpu/nccl by
# scripts/gpu-carry.sh --nccl DIR); looked for there when neither is set.
# Without a CUDA device: prints SKIPPED and exits 77. DGC_EMULATED_DEVICE=1:
# the emulated device, where the program links the NCCL stand-in itself.
set -u
np=${1:?NP}; name=${2:?CASE}; shift 2
greps=(); times=()
while [ $# -gt 0 ]; do
  case "$1" in
    --grep) greps+=("$2"); shift 2 ;;
    --times) times+=("$2" "$3"); shift 3 ;;
    *) echo "run_nccl_case.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
nccl=${DGC_NCCL_TEST_LIB:-${NCCL_PRELOAD:-}}
if [ -n "${DGC_EMULATED_DEVICE:-}" ]; then
  # The emulated device (docs/emulated-device.md): the CPU through chipStar,
  # and the program's own NCCL, the stand-in over MPI; nothing to preload.
  nccl=""
elif ! nvidia-smi -L >/dev/null 2>&1 || ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  echo "SKIPPED gpu.nccl.$name: no CUDA device"
  exit 77
elif [ -z "$nccl" ]; then
  [ -f "$root/.gpu/nccl/libnccl.so.2" ] && nccl=$root/.gpu/nccl/libnccl.so.2
fi
if [ "$np" -gt 1 ] && [ -z "$nccl" ] && [ -z "${DGC_EMULATED_DEVICE:-}" ]; then
  echo "CASE FAILED: $np ranks on one GPU need NCCL 2.30+ (set DGC_NCCL_TEST_LIB, or run scripts/gpu-carry.sh)"
  exit 1
fi
preload="${SHIM:?SHIM unset}${nccl:+:$nccl}"

# One node, in a container: the ob1 PML over shared memory (UCX, which
# Open MPI prefers when present, probes GPUs and network devices a container
# may not have), and no single-copy mechanism (CMA needs ptrace rights that
# containers often lack; vader would abort on its first large message).
# plm isolated: one node, no ssh or rsh needed (a bare GPU machine may have
# neither, and Open MPI 4 refuses to start without one otherwise).
cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca plm isolated
     --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np "$np"
     env "LD_PRELOAD=$preload" NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
     "${CHECK:?CHECK unset}" "$name")
out=$(mktemp); trap 'rm -f "$out"' EXIT
echo "+ ${cmd[*]}"
unset LD_PRELOAD
# Every case takes seconds; a hang must not eat the GPU session's minutes.
limit=${DGC_NCCL_CASE_TIMEOUT:-90}
timeout --kill-after=10 "$limit" "${cmd[@]}" >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "CASE FAILED: timed out after $limit s (a hang)"; exit 1; fi
[ $rc -eq 0 ] || { echo "CASE FAILED: exit status $rc"; exit 1; }
got=$(grep -c "^PASS gpu.nccl.$name rank" "$out")
[ "$got" -eq "$np" ] || { echo "CASE FAILED: $got PASS lines, want $np"; exit 1; }
for re in "${greps[@]}"; do
  grep -Eq -- "$re" "$out" || { echo "CASE FAILED: output lacks /$re/"; exit 1; }
done
for ((i = 0; i < ${#times[@]}; i += 2)); do
  got=$(grep -Ec -- "${times[i+1]}" "$out")
  [ "$got" -eq "${times[i]}" ] || { echo "CASE FAILED: /${times[i+1]}/ matches $got lines, want ${times[i]}"; exit 1; }
done
echo "CASE PASSED gpu.nccl.$name"
