#!/usr/bin/env bash
# Momentum compensation end to end: the same data-parallel least-squares job
# twice under the shim with DGC_MOMENTUM=0.9, once with DGC_COMPENSATE=1 and
# SGD momentum 0.9 (the unmodified-optimizer way), once with DGC_COMPENSATE=0
# and SGD momentum 0 (the DGC paper's way); the final weights must agree to
# rounding over 300 steps.
set -euo pipefail
run_case=$1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common=(-e DGC_MOMENTUM=0.9 -e DGC_SPARSITY=0.99 -e DGC_WARMUP_STEPS=20)
"$run_case" "${common[@]}" -e DGC_COMPENSATE=1 -- optimizer --n 50000 --steps 300 --momentum 0.9 --dump "$dir/compensated"
"$run_case" "${common[@]}" -e DGC_COMPENSATE=0 -- optimizer --n 50000 --steps 300 --momentum 0 --dump "$dir/plain"
"$run_case" -n 1 -- compare "$dir/compensated" "$dir/plain"
