#!/usr/bin/env bash
# Runs every --fail case of tests/mpi/cases.cmake (the cases where the job
# must stop with a message) REPEAT times in a row in each build directory
# given, while a loop of short Open MPI jobs and a busy build run beside it:
# the load under which MPICH's hydra once lost every rank's line (issue 43).
# Not part of scripts/test.sh: it takes about 10 to 20 minutes.
#
#   scripts/stress-fail-cases.sh [--repeat N] BUILD_DIR...
#     e.g. scripts/stress-fail-cases.sh build build-mpich
#
# Prints, per build directory, the cases, the runs and the time taken; exits
# non-zero at the first failure (ctest --repeat until-fail), whose output
# ctest shows.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=200
[ "${1:-}" = --repeat ] && { repeat=$2; shift 2; }
[ $# -gt 0 ] || { echo "usage: $0 [--repeat N] BUILD_DIR..." >&2; exit 2; }

# The --fail cases by name: mpi_case(NAME ...) blocks that hold --fail.
cases=$(awk '/^mpi_case\(/ { name = substr($1, 10) } /--fail/ && name { print name; name = "" }
             /\)$/ { name = "" }' tests/mpi/cases.cmake | sort -u | paste -sd'|')
[ -n "$cases" ] || { echo "no --fail case found in tests/mpi/cases.cmake" >&2; exit 1; }
regex="^mpi[.]($cases)\$"

noise_dir=$(mktemp -d)
pids=()
stop_noise() { for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done; rm -rf "$noise_dir"; }
trap stop_noise EXIT
# Short Open MPI jobs, one after another, for as long as the stress runs.
setsid bash -c 'while :; do mpirun --allow-run-as-root --oversubscribe -np 2 true >/dev/null 2>&1; done' &
pids+=($!)
# A busy build: the library rebuilt from scratch, over and over, on every core.
setsid bash -c "while :; do cmake -S . -B '$noise_dir/b' -DDGC_CUDA=OFF -DDGC_BUILD_TESTS=OFF >/dev/null 2>&1;
                cmake --build '$noise_dir/b' --clean-first -j \"\$(nproc)\" >/dev/null 2>&1; done" &
pids+=($!)

for dir in "$@"; do
  start=$SECONDS
  echo "== $dir: $regex, $repeat runs each, beside short Open MPI jobs and a build =="
  (cd "$dir" && ctest -R "$regex" --repeat "until-fail:$repeat" --output-on-failure | tail -4)
  echo "== $dir: passed, $((SECONDS - start)) s =="
done
