#!/usr/bin/env bash
# The test command: installs what is missing, builds dgcshim twice (optimised,
# and with AddressSanitizer + UndefinedBehaviorSanitizer), and runs the whole
# suite (Criterion unit tests and mpirun integration tests) in both builds.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh train  # the trainer case reads Fashion-MNIST
jobs=$(nproc)
run() { # build-dir, cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest --output-on-failure -j 1)
}
echo "== optimised build =="
run build -DCMAKE_BUILD_TYPE=Release
echo "== sanitizer build (ASan + UBSan) =="
run build-san -DCMAKE_BUILD_TYPE=Debug -DDGC_SANITIZE=ON
echo "== all tests passed in both builds =="
