#!/usr/bin/env bash
# The test command: installs what is missing, builds dgcshim twice (optimised,
# and with AddressSanitizer + UndefinedBehaviorSanitizer), runs the whole
# suite (Criterion unit tests, mpirun integration tests, Fortran programs) in
# both builds; builds both again for MPICH (libdgcshim-mpich.so, the MPICH
# family's ABI) and runs the MPI suite (mpi.*, shim.*, netns.*) under mpiexec.mpich,
# then checks that both MPIs give the same bits (tests/mpi/same_bits.sh;
# DGC_TEST_MPICH=0 leaves MPICH out, said by name); then the NCCL front end
# alone with MPI hidden from CMake (libdgcshim-nccl.so, its unit.* and
# shim.* tests; skipped, by name, without nvcc); then the Python package
# (scripts/test-python.sh: a venv, pip install ., the dgcshim command against
# real mpirun jobs and a TensorFlow-only Horovod; DGC_TEST_PYTHON=0 leaves it
# out); then the two libFuzzer
# targets for FUZZ_SECONDS each (default
# 30), then the emulated device tier (scripts/test-emulated.sh: the CUDA
# engine's cases on the CPU through chipStar; DGC_EMULATED_ARGS are its
# options, DGC_CHIPSTAR_TARBALL its source, DGC_TEST_EMULATED=0 leaves it
# out). Every phase runs even when an earlier one failed; the script then
# exits non-zero and its last line names each phase that failed.
#
# It also installs Horovod 0.28.1 for PyTorch in .venv/horovod-torch
# (scripts/deps.sh horovod-torch: about 3 minutes the first time, seconds
# after) for frameworks.horovod_torch; DGC_TEST_HOROVOD=0 leaves it out (the
# test then reports itself skipped, by name).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh train  # the trainer case reads Fashion-MNIST
[ "${DGC_TEST_HOROVOD:-1}" = 0 ] || scripts/deps.sh horovod-torch
jobs=$(nproc)
build() { # build-dir, cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >/dev/null && cmake --build "$dir" -j "$jobs"
}
run() { # build-dir, cmake args... [-- ctest args...]: builds, then runs the suite
  local dir=$1; shift
  local args=() tests=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; tests=("$@"); }
  build "$dir" "${args[@]}" && (cd "$dir" && ctest --output-on-failure -j 1 "${tests[@]}")
}
# Every phase runs whatever an earlier one did, so one run shows all that is
# wrong; the exit status and the last line name each phase that failed.
failed=()
phase() { # name, command...
  local name=$1; shift
  echo "== $name =="
  local start=$SECONDS
  if "$@"; then
    echo "== $name: passed ($((SECONDS - start)) s) =="
  else
    echo "== $name: FAILED ($((SECONDS - start)) s) =="
    failed+=("$name")
  fi
}
skipped() { echo "== $1 == SKIPPED: $2"; }

phase "optimised build" run build -DCMAKE_BUILD_TYPE=Release
phase "sanitizer build (ASan + UBSan)" run build-san -DCMAKE_BUILD_TYPE=Debug -DDGC_SANITIZE=ON
if [ "${DGC_TEST_MPICH:-1}" = 0 ]; then
  skipped "MPICH builds" "mpi.*, shim.*, netns.* under mpiexec.mpich, same_bits: DGC_TEST_MPICH=0"
else
  mpich=(-DMPI_C_COMPILER=mpicc.mpich -DDGC_CUDA=OFF)
  phase "MPICH build (mpi.*, shim.*, netns.* under mpiexec.mpich)" \
    run build-mpich -DCMAKE_BUILD_TYPE=Release "${mpich[@]}" -- -R '^(mpi|shim|netns)[.]'
  phase "MPICH sanitizer build (ASan + UBSan)" \
    run build-mpich-san -DCMAKE_BUILD_TYPE=Debug -DDGC_SANITIZE=ON "${mpich[@]}" -- -R '^(mpi|shim|netns)[.]'
  phase "the same bits under Open MPI and MPICH" tests/mpi/same_bits.sh build build-mpich
fi
# The NCCL front end alone (issue 46): MPI hidden from CMake, as on a GPU
# machine with PyTorch and no MPI. Only the library, dgcshim-options and the
# unit tests are built (the CUDA kernels are most of the time); shim.no_mpi
# checks that no MPI header, library or symbol went into libdgcshim-nccl.so,
# shim.exports that it exports the NCCL entry points alone.
nccl_only() {
  local dir=build-nompi out
  out=$(cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON) || return 1
  grep -F "dgcshim: no MPI (DGC_MPI=AUTO): the NCCL front end alone -> libdgcshim-nccl.so" <<<"$out" || {
    echo "the configuration did not say it builds the NCCL front end alone:"; echo "$out"; return 1; }
  cmake --build "$dir" -j "$jobs" --target dgcshim dgcshim-options unit_tests &&
    (cd "$dir" && ctest --output-on-failure -j 1 -R '^(unit|shim)[.]')
}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  skipped "NCCL only" "no nvcc (the NCCL front end needs the CUDA toolkit)"
else
  phase "NCCL only: MPI hidden from CMake (libdgcshim-nccl.so: unit.*, shim.*)" nccl_only
fi
if [ "${DGC_TEST_PYTHON:-1}" = 0 ]; then
  skipped "the Python package" "tests/python/test_cli.py: DGC_TEST_PYTHON=0"
else
  phase "the Python package: pip install . and the dgcshim command (tests/python)" scripts/test-python.sh
fi
phase "fuzzing (libFuzzer, clang)" scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
if [ "${DGC_TEST_EMULATED:-1}" = 0 ]; then
  skipped "the emulated device" "gpu.engine.*, emulated.defects: DGC_TEST_EMULATED=0"
else
  # shellcheck disable=SC2086 # DGC_EMULATED_ARGS is a list of options
  phase "the emulated device (the CUDA engine on the CPU: docs/emulated-device.md)" \
    scripts/test-emulated.sh ${DGC_EMULATED_ARGS:-}
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf '== FAILED phases (%d): %s ==\n' "${#failed[@]}" "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
  exit 1
fi
echo "== all tests passed in both builds and under MPICH, fuzz targets clean, emulated device passed =="
