#!/usr/bin/env bash
# The node layout's spec (issue 45), as a test: DGC_TOPOLOGY=node on M nodes
# of L ranks (DGC_NODE_SIZE=L) equals, bit for bit, flat DGC on M ranks
# where rank m all-reduces node m's sum shard by shard (node_check.c).
#
#   node_spec.sh RUN_CASE L M [-e VAR=VALUE]... [-- node_check options]
#
# Both jobs get the same -e settings, and DGC_MIN_ELEMENTS=1 so that the
# reference's shard calls are compressed as the node layout's whole call is.
set -euo pipefail
run_case=$1 L=$2 M=$3
shift 3
envs=(-e DGC_MIN_ELEMENTS=1)
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
[ $# -gt 0 ] && shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check=${NODE_CHECK:?NODE_CHECK unset}
"$run_case" -n $((L * M)) --check "$check" "${envs[@]}" -e DGC_TOPOLOGY=node -e DGC_NODE_SIZE="$L" -e DGC_STATS=1 \
  --grep "STATS node layout \\(DGC_TOPOLOGY\\): [0-9]+ of the compressed calls, $M nodes x $L ranks" \
  -- node "$@" --out "$dir/node"
"$run_case" -n "$M" --check "$check" "${envs[@]}" -e DGC_TOPOLOGY=flat -- reference "$@" --node-size "$L" \
  --out "$dir/reference"
"$run_case" -n 1 --check "$check" -- compare "$dir/node" "$dir/reference"
