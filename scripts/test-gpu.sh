#!/usr/bin/env bash
# The GPU test command: builds dgcshim with the CUDA path and runs every check
# that needs a GPU, printing "N passed, N failed, N skipped" at the end (exit 1 when any
# failed):
#   - the CUDA engine against the host engine, decode determinism, bad
#     payloads, non-finite steps, fp16/bf16 (ctest -L gpu, gpu.engine.*);
#   - compute-sanitizer memcheck and racecheck on the engine checks;
#   - NCCL with 1 rank, and 2 ranks sharing the one GPU (gpu.nccl.*; on a
#     machine without MPI, from a second build against the Open MPI that
#     scripts/gpu-carry.sh carries);
#   - the PyTorch DDP trainer on 2 ranks under the shim: it learns, both
#     ranks end with identical parameters, every bucket compressed;
#   - DDP with the shim on one rank only: PyTorch's timeout ends the job.
# Two ranks on one GPU need NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1:
# point NCCL_PRELOAD at such a libnccl.so.2 (default .gpu/nccl/libnccl.so.2,
# which scripts/gpu-carry.sh --nccl DIR copies there).
#
#   scripts/test-gpu.sh [--out DIR] [--bench] [--no-ddp] [--no-checks] [--only REGEX] [--skip REGEX] [--first LIST]
#                        [--build-only | --list]
#     --out DIR     logs (default build-gpu/logs)
#     --bench       also run bench/gpu/run.sh (engine, torch.topk, official DGC), in DIR/bench
#     --no-checks   no checks at all (with --bench: the build and the benchmark alone)
#     --only REGEX  only the checks whose names match (extended regex: gpu.engine.*,
#                   gpu.nccl.*, sanitizer.memcheck, sanitizer.racecheck, ddp.two_ranks,
#                   ddp.shim_on_one_rank, ddp.memory_fit);
#                   the build always runs (incremental): lets a session split the run
#                   over several device calls of limited length
#     --build-only  the builds alone, no GPU needed (scripts/gpu-rehearsal.sh)
#     --first LIST  these ctest cases (space-separated names) first, in this order
#     --skip REGEX  not the checks whose names match
#     --list        the builds, then the ctest cases it would run, in order (no GPU needed)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# DGC_GPU_BUILD: the build folder (default build-gpu; the MPI build beside it, with -mpi)
gb=${DGC_GPU_BUILD:-build-gpu}
out=$gb/logs bench=0 ddp=1 only="" checks=1 build_only=0 first="" list=0 skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --bench) bench=1; shift ;;
    --no-ddp) ddp=0; shift ;;
    --only) only=$2; shift 2 ;;
    --no-checks) checks=0; shift ;;
    --build-only) build_only=1; shift ;;
    --first) first=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --list) list=1; build_only=1; shift ;;
    *) echo "test-gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
wanted() { { [ -z "$only" ] || grep -Eq -- "$only" <<<"$1"; } && { [ -z "$skip" ] || ! grep -Eq -- "$skip" <<<"$1"; }; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_PRELOAD=${NCCL_PRELOAD:-$root/.gpu/nccl/libnccl.so.2}
[ -f "$NCCL_PRELOAD" ] || { echo "test-gpu.sh: no NCCL 2.30+ at $NCCL_PRELOAD: 2-rank cases will fail (see scripts/gpu-carry.sh)"; NCCL_PRELOAD=; }
export DGC_NCCL_TEST_LIB=$NCCL_PRELOAD NCCL_MULTI_RANK_GPU_ENABLE=1
export PATH=/usr/local/cuda/bin:$PATH

passed=0 failed=0 skipped=0 names=()
check() { # name, command...: runs it, logs to $out/name.log, counts it (a ctest skip: the caller's)
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    grep -q '\*\*\*Skipped' "$out/$name.log" && return 0
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); names+=("$name"); echo "FAIL $name ($((SECONDS - t0)) s): tail of $out/$name.log"
    tail -n 30 "$out/$name.log" | sed 's/^/    /'
    return 1
  fi
}

if [ "$build_only" = 0 ]; then
  nvidia-smi -L >"$out/nvidia-smi.log" 2>&1 || { echo "test-gpu.sh: no GPU (nvidia-smi failed)"; exit 1; }
  cat "$out/nvidia-smi.log"
fi

# nccl.h: the toolkit's when it has one (CMake looks there itself), else
# NCCL_HOME's, else the copy beside the carried libnccl.so.2 (.gpu/nccl),
# else the one pip's nvidia-nccl wheel (PyTorch's NCCL) installs.
nccl_include() {
  local d
  for d in /usr/local/cuda/include ${NCCL_HOME:+"$NCCL_HOME/include"}; do
    [ -f "$d/nccl.h" ] && return 0
  done
  for d in "$root/.gpu/nccl" "$root/.gpu/nccl/include"; do
    [ -f "$d/nccl.h" ] && { echo "-DDGC_NCCL_INCLUDE_DIR=$d"; return 0; }
  done
  d=$(python3 - 2>/dev/null <<'PY'
import importlib.util, os
try:
    spec = importlib.util.find_spec("nvidia.nccl")
except ImportError:
    spec = None
for base in (spec.submodule_search_locations or []) if spec else []:
    if os.path.isfile(os.path.join(base, "include", "nccl.h")):
        print(os.path.join(base, "include"))
        break
PY
)
  [ -n "$d" ] && echo "-DDGC_NCCL_INCLUDE_DIR=$d"
  return 0
}
# configure DIR [CMAKE ARGS...]: the GPU build's configuration in DIR.
# DGC_WERROR=OFF: this machine's compiler may warn where CI's does not; the
# warnings stay in the build's log, and the run goes on.
configure() {
  local dir=$1 inc; shift
  inc=$(nccl_include)
  echo "nccl.h: ${inc:-found by CMake}"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDGC_CUDA=ON -DDGC_REQUIRE_CRITERION=OFF -DDGC_WERROR=OFF \
    ${inc:+"$inc"} "$@"
}
build() {
  configure "$gb" && cmake --build "$gb" -j "$(nproc)"
}
# The build is not a test: a failed one ends the run, a good one counts nothing.
if ! build >"$out/build.log" 2>&1; then
  echo "FAIL build: tail of $out/build.log"; tail -n 40 "$out/build.log" | sed 's/^/    /'
  echo "0 passed, 1 failed (build)"; exit 1
fi
echo "built $gb ($(grep -c 'warning' "$out/build.log") warning lines in $out/build.log)"
# ptxas's register spills (kernels/CMakeLists.txt: --warn-on-spills), so the
# first GPU run shows whether update_kernel's 32-register cap costs a spill.
if grep -qi "spill" "$out/build.log"; then
  echo "ptxas register spills in the build:"; grep -i "spill" "$out/build.log" | sed 's/^/    /' | head -n 20
else
  echo "ptxas: no register spills in the engine's kernels"
fi
# The library the build made: libdgcshim.so, or without MPI on this machine
# the NCCL front end alone, libdgcshim-nccl.so (what a user without MPI gets).
DGC_SHIM=$root/$gb/libdgcshim.so
[ -f "$DGC_SHIM" ] || DGC_SHIM=$root/$gb/libdgcshim-nccl.so
export DGC_SHIM
echo "the shim: $DGC_SHIM"
[ "$checks" = 1 ] || { only='^$'; }

# The gpu.nccl cases are NCCL + MPI programs (mpirun starts the ranks). On a
# machine without MPI they run from a second build against the Open MPI that
# scripts/gpu-carry.sh copied into .gpu/openmpi (its env.sh: PATH,
# LD_LIBRARY_PATH, OPAL_PREFIX), with only the targets they need; the other
# checks keep the MPI-free library above. nccl_dir: where they run from.
nccl_dir=$gb nccl_env=/dev/null
carried_mpi_build() {
  # shellcheck disable=SC1091
  . "$root/.gpu/openmpi/env.sh" &&
    configure "$gb-mpi" -DDGC_MPI=ON -DMPI_C_COMPILER="$(command -v mpicc)" &&
    cmake --build "$gb-mpi" -j "$(nproc)" --target dgcshim nccl_check ddp_shape
}
listed=$(cd "$gb" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: *//p')
wants_nccl=0
for t in $(grep '^gpu\.nccl\.' <<<"$listed"); do wanted "$t" && wants_nccl=1; done
if ! mpirun --version >/dev/null 2>&1 && [ -f "$root/.gpu/openmpi/env.sh" ] && [ "$wants_nccl" = 1 ]; then
  if (carried_mpi_build) >"$out/build-mpi.log" 2>&1; then
    nccl_dir=$gb-mpi nccl_env=$root/.gpu/openmpi/env.sh
    echo "built $gb-mpi for the gpu.nccl cases, against the carried Open MPI (.gpu/openmpi)"
  else
    echo "no build against the carried Open MPI (tail of $out/build-mpi.log): the gpu.nccl cases report why"
    tail -n 20 "$out/build-mpi.log" | sed 's/^/    /'
  fi
fi

# not_run NAME WHY: a check that should have run on this GPU and did not
not_run() { failed=$((failed + 1)); names+=("$1"); echo "FAIL $1: $2"; }

# Every GPU-labelled ctest case, one check each, so the count says which.
# nvidia-smi found a GPU above, so a case that reports itself skipped (exit
# 77: no usable CUDA device, no libnccl at build time) did not run where it
# must: a failure, with its reason. Two gpu.nccl cases in a row that hang
# (each is cut at DGC_NCCL_CASE_TIMEOUT) stop the rest of them: the same
# hang would eat the device session's minutes.
export DGC_NCCL_CASE_TIMEOUT=${DGC_NCCL_CASE_TIMEOUT:-60}
hangs=0
# The cases in ctest's order, or FIRST's names first, in its order (a
# session puts the most telling where a deadline cannot cut them).
ordered=$(for t in $first; do grep -qx -- "$t" <<<"$listed" && echo "$t"; done
          grep -vxF -f <(printf '%s\n' $first) <<<"$listed")
if [ "$build_only" = 1 ]; then
  if [ "$list" = 1 ]; then
    for t in $ordered; do wanted "$t" && echo "would run $t (from $([[ $t == gpu.nccl.* ]] && echo "$nccl_dir" || echo "$gb"))"; done
    for t in ddp.two_ranks ddp.shim_on_one_rank ddp.memory_fit; do [ "$ddp" = 1 ] && wanted "$t" && echo "would run $t"; done
    for t in sanitizer.memcheck sanitizer.racecheck; do wanted "$t" && echo "would run $t"; done
    [ "$bench" = 0 ] || echo "would run bench (bench/gpu/run.sh)"
  fi
  echo "builds done (--build-only)"; exit 0
fi
for t in $ordered; do
  wanted "$t" || continue
  if [ "$hangs" -ge 2 ] && [[ $t == gpu.nccl.* ]]; then not_run "$t" "not run: two gpu.nccl cases in a row hung"; continue; fi
  dir=$gb env=/dev/null
  [[ $t == gpu.nccl.* ]] && dir=$nccl_dir env=$nccl_env
  if check "$t" bash -c ". '$env' && cd $dir && ctest -V -R '^${t//./\\.}\$'" &&
     grep -q '\*\*\*Skipped' "$out/$t.log"; then
    not_run "$t" "skipped on a machine with a GPU: $(grep -m1 -o 'SKIPPED.*' "$out/$t.log")"
  fi
  if [[ $t == gpu.nccl.* ]] && grep -q 'timed out after' "$out/$t.log"; then hangs=$((hangs + 1)); else hangs=0; fi
done

# Fashion-MNIST from FASHION_MNIST, .gpu/data (scripts/gpu-carry.sh) or
# Debian's package; without any, the trainer's synthetic data of the same
# shape, so that the shim's DDP run is still tested. Each run is bounded
# well under the device tool's per-call limit (a hang costs device time).
# Before the sanitizers, which may be slow: the DDP run is the user's job.
if [ "$ddp" = 1 ] && wanted ddp.two_ranks; then
  data_args=(--synthetic)
  for d in ${FASHION_MNIST:+"$FASHION_MNIST"} "$root/.gpu/data" /usr/share/datasets/fashion-mnist; do
    [ -f "$d/train-images-idx3-ubyte.gz" ] && { data_args=(--data "$d"); break; }
  done
  echo "DDP data: ${data_args[*]}"
  PYTHON=${PYTHON:-python3} RUN_TIMEOUT=${RUN_TIMEOUT:-120} \
    check ddp.two_ranks scripts/ddp_side_by_side.sh --out "$out/ddp" "${data_args[@]}"
fi
# The shim on one rank only: the job must end with PyTorch's timeout (60 s)
# within about 90 s, not hang in a wait of the shim's.
if [ "$ddp" = 1 ] && wanted ddp.shim_on_one_rank; then
  check ddp.shim_on_one_rank tests/gpu/torch/one_sided.sh --out "$out/one_sided"
fi
# GPU memory beside PyTorch's: DDP whose own memory takes 60% of the GPU,
# 3 steps with SGD momentum; no step may fail for the shim's states.
if [ "$ddp" = 1 ] && wanted ddp.memory_fit; then
  check ddp.memory_fit tests/gpu/torch/memory_fit.sh --out "$out/memory_fit"
fi

engine=$gb/tests/gpu/engine/gpu_engine_check
# compute-sanitizer reads the GPU through the driver's debugger interface,
# which the gVisor runtime lacks ("Device not supported"): reported skipped,
# by name, not passed. Each tool run is cut at SANITIZER_TIMEOUT seconds.
sanitize() { # tool
  wanted "sanitizer.$1" || return 0
  if ! command -v compute-sanitizer >/dev/null; then
    skipped=$((skipped + 1)); echo "SKIPPED sanitizer.$1: compute-sanitizer not on PATH"; return
  fi
  local limit=${SANITIZER_TIMEOUT:-240} rc
  timeout --kill-after=10 "$limit" compute-sanitizer --tool "$1" --error-exitcode 1 "$engine" all --small \
    >"$out/sanitizer.$1.log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); echo "PASS sanitizer.$1"
  elif grep -q "Device not supported" "$out/sanitizer.$1.log"; then
    skipped=$((skipped + 1)); echo "SKIPPED sanitizer.$1: compute-sanitizer does not support this device here (gVisor runtime)"
  else
    failed=$((failed + 1)); names+=("sanitizer.$1")
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "(sanitizer.$1 cut at $limit s)" >>"$out/sanitizer.$1.log"
    echo "FAIL sanitizer.$1: tail of $out/sanitizer.$1.log"
    tail -n 30 "$out/sanitizer.$1.log" | sed 's/^/    /'
  fi
}
sanitize memcheck
sanitize racecheck

# The benchmark's figures are not a test, but a benchmark that did not run
# is a failure (engine_bench reports a GPU it cannot use, say).
if [ "$bench" = 1 ]; then
  PYTHON=${PYTHON:-python3} bash bench/gpu/run.sh --out "$out/bench" --build $gb 2>&1 | tee "$out/bench.log"
  if [ "${PIPESTATUS[0]}" != 0 ] || grep -q '^SKIPPED' "$out/bench.log"; then
    failed=$((failed + 1)); names+=(bench); echo "FAIL bench: bench/gpu/run.sh did not run every part (log: $out/bench.log)"
  fi
fi

echo "$passed passed, $failed failed, $skipped skipped${names[*]:+ (failed: ${names[*]})}"
[ "$failed" -eq 0 ]
