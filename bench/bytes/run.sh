#!/usr/bin/env bash
# Bytes each rank sends per compressed call against the number of ranks, for
# the sparse all-gather and the reduce transport, beside the dense ring
# (2 (N-1)/N 4n bytes), counted by bench/bytes/pmpi_bytes.c (a PMPI byte
# counter preloaded before the shim: ring and pairwise algorithms' bytes).
# Ranks are oversubscribed on this machine: bytes, not time.
#
#   bench/bytes/run.sh [RANKS...]     (default 2 4 8 16 32 64)
# Environment: N (floats, 2000000), SPARSITY (0.999), STEPS (3 counted after
# 2 warm), BUILD (build), OUT (bench/results/bytes).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}; n=${N:-2000000}; sparsity=${SPARSITY:-0.999}; steps=${STEPS:-3}
out=${OUT:-bench/results/bytes}; mkdir -p "$out"
ranks=("$@"); [ ${#ranks[@]} -gt 0 ] || ranks=(2 4 8 16 32 64)
cmake --build "$build" --target dgcshim bytes_driver pmpi_bytes >/dev/null
preload="$PWD/$build/bench/libpmpi_bytes.so:$PWD/$build/libdgcshim.so"
table="$out/bytes.txt"
{
  echo "# bytes a rank sends per call: $n floats, sparsity $sparsity, $steps calls counted ($(date -u +%F), $(nproc) cores)"
  printf '%6s %14s %12s %9s %12s %9s %10s %14s\n' ranks dense_ring sparse ratio reduce ratio msgs_red ok_topk_3k
} >"$table"
for np in "${ranks[@]}"; do
  line=()
  for t in sparse reduce; do
    got=$(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np" \
            -x LD_PRELOAD="$preload" -x DGC_TRANSPORT=$t -x DGC_SPARSITY="$sparsity" \
            "$build/bench/bytes_driver" "$n" 2 "$steps" 2>&1 | grep '^BYTES')
    line+=("$(awk -v s="$steps" '{for (i = 1; i < NF; i++) if ($i == "max_bytes") b = $(i+1); else if ($i == "messages") m = $(i+1); print b / s, m / s}' <<<"$got")")
  done
  read -r sp _ <<<"${line[0]}"; read -r rd rm <<<"${line[1]}"
  awk -v np="$np" -v n="$n" -v sp="$sp" -v rd="$rd" -v rm="$rm" -v sparsity="$sparsity" 'BEGIN {
    dense = 2 * (np - 1) / np * 4 * n; k = int((1 - sparsity) * n + 0.999999)
    bound = 3 * k * (np - 1) / np * 8   # Ok-Topk: 3k(N-1)/N pairs of 8 bytes
    printf "%6d %14.0f %12.0f %8.1fx %12.0f %8.1fx %10.0f %14.0f\n", np, dense, sp, dense / sp, rd, dense / rd, rm, bound }' >>"$table"
  tail -n 1 "$table"
done
echo "table: $table"
