#!/usr/bin/env bash
# Runs one gpu.nccl case that prints a hash of its NCCL outputs
# ("hash gpu.nccl.CASE rank R: H") under two libraries, each through
# run_nccl_case.sh with its checks, and requires the same hashes, rank by
# rank: the NCCL-only library against the full one, on the same program.
#
#   same_output.sh NP CASE SHIM_A SHIM_B [run_nccl_case.sh's --grep/--times]...
set -u
np=${1:?NP}; name=${2:?CASE}; a=${3:?SHIM_A}; b=${4:?SHIM_B}; shift 4
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in a b; do
  lib=${!i}
  echo "=== $(basename "$lib")"
  SHIM=$lib "$here/run_nccl_case.sh" "$np" "$name" "$@" >"$tmp/$i.log" 2>&1
  rc=$?
  cat "$tmp/$i.log"
  [ $rc -eq 0 ] || { echo "CASE FAILED: the case failed under $lib"; exit 1; }
  grep -E "^hash gpu\.nccl\.$name rank [0-9]+: [0-9a-f]+$" "$tmp/$i.log" | sort >"$tmp/$i.hash"
  got=$(wc -l <"$tmp/$i.hash")
  [ "$got" -eq "$np" ] || { echo "CASE FAILED: $got hash lines under $lib, want $np"; exit 1; }
done
if ! cmp -s "$tmp/a.hash" "$tmp/b.hash"; then
  echo "CASE FAILED: the outputs differ between the libraries:"; paste "$tmp/a.hash" "$tmp/b.hash"; exit 1
fi
echo "CASE PASSED gpu.nccl.$name: $(basename "$a") and $(basename "$b") gave the same outputs, bit for bit"
