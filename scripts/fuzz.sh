#!/usr/bin/env bash
# Fuzzes the wire decoder, the engine round trip and the compact payload's
# expander with libFuzzer (tests/fuzz/): builds the targets with clang, ASan
# and UBSan, then runs each for a bounded time on a scratch copy of its seed
# corpus (the corpus in the repo is never changed). Exits non-zero, naming the
# target, when any finds a crash, a failed check, a leak, a sanitizer report,
# a timeout or runs out of memory; the input that did it is kept under the
# build dir.
#
# Usage: scripts/fuzz.sh [seconds]     seconds per target: the argument, else
#        FUZZ_SECONDS, else 30. FUZZ_BUILD_DIR overrides build-fuzz.
# Takes about 3 x seconds plus the build (under a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${FUZZ_SECONDS:-30}}
build=${FUZZ_BUILD_DIR:-build-fuzz}
case $secs in '' | *[!0-9]* | 0) echo "fuzz.sh: seconds must be a positive integer, not '$secs'" >&2; exit 2 ;; esac

# Missing tools fail loudly: a fuzz run that skips would read as a pass.
need="apt-get install clang libclang-rt-14-dev"
if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang not found; install it: $need" >&2
  exit 2
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/probe.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }
EOF
if ! clang -fsanitize=fuzzer,address,undefined "$scratch/probe.c" -o "$scratch/probe" 2>"$scratch/probe.log"; then
  cat "$scratch/probe.log" >&2
  echo "fuzz.sh: clang cannot link libFuzzer (-fsanitize=fuzzer); install: $need" >&2
  exit 2
fi

echo "== building fuzz targets in $build =="
CC=clang cmake -S tests/fuzz -B "$build" >/dev/null
cmake --build "$build" -j "$(nproc)"

# The largest input each target reads: 8 payloads of 64 slots; 2048 gradient
# floats (bytes are read cyclically, so larger buffers need no more); a
# compact payload of up to 1024 slots (256 fit in 1896 bytes for any n; 4096
# bytes hold 1024 for the small n that most inputs pick).
declare -A max_len=([decode]=4608 [engine]=8192 [compact]=4096)
failed=()
for t in decode engine compact; do
  dir="$scratch/$t"
  mkdir -p "$dir/corpus" "$dir/crash"
  cp tests/fuzz/corpus/"$t"/* "$dir/corpus/"
  echo "== fuzz_$t: $secs s =="
  rc=0
  "$build/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len="${max_len[$t]}" \
    -print_final_stats=1 -artifact_prefix="$dir/crash/" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  # The run's summary: executions, coverage, corpus, exec/s.
  grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs|^stat::(number_of_executed|average_exec|peak_rss)' \
    "$dir/log" || true
  reports='ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|check failed'
  reported=$(grep -cE "$reports" "$dir/log" || true)
  if [ "$rc" -ne 0 ] || [ "$reported" -ne 0 ] || [ -n "$(ls -A "$dir/crash")" ]; then
    echo "-- fuzz_$t FAILED (exit $rc); the end of its log:" >&2
    { grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$dir/log" || true; } | tail -n 60 >&2
    mkdir -p "$build/artifacts/$t"
    cp "$dir/crash/"* "$build/artifacts/$t/" 2>/dev/null || true
    cp "$dir/log" "$build/artifacts/$t/log"
    echo "-- fuzz_$t: inputs kept in $build/artifacts/$t/; rerun one with: $build/fuzz_$t <file>" >&2
    failed+=("fuzz_$t")
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "== FAILED: ${failed[*]} ==" >&2
  exit 1
fi
echo "== all fuzz targets ran $secs s each without a finding =="
