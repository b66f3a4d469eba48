#!/usr/bin/env bash
# frameworks.horovod_torch: ld_preload_examples/horovod_torch_fashion.py, an
# ordinary Horovod + PyTorch script, on 4 ranks under the shim for 100 steps
# (all of them warm-up), the two ways docs/frameworks.md gives to keep residuals with
# their tensors:
#   groups=1 (--groups 1): one buffer row in STATS, the 215,370 gradients, a
#     call every step (100 compressed calls);
#   HOROVOD_FUSION_THRESHOLD=0 with DGC_MIN_ELEMENTS=1: one row per gradient
#     tensor (8), each with a call every step (800 compressed calls).
# Each run must end with every rank's weights identical, learn (test accuracy
# of at least 0.5 after 100 steps; dense reaches about 0.74) and draw no
# fusion warning.
#
# Needs .venv/horovod-torch (scripts/deps.sh horovod-torch); without it the
# test reports itself skipped, by name. Not run in the sanitizer build (the
# ASan runtime under Python and PyTorch): skipped there, by name.
# Environment: SHIM (the library), DGC_SANITIZE (ON in the sanitizer build).
set -u
name=frameworks.horovod_torch
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$root/.venv/horovod-torch/bin/python
skip() { echo "SKIPPED $name: $*"; exit 77; }
[ "${DGC_SANITIZE:-OFF}" = ON ] && skip "not run in the sanitizer build (ASan under Python and PyTorch)"
[ -x "$py" ] && "$py" -c 'import horovod.torch as h; assert h.mpi_built()' >/dev/null 2>&1 ||
  skip "Horovod with MPI not installed (scripts/deps.sh horovod-torch)"
[ -s /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "Fashion-MNIST not installed (scripts/deps.sh train)"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { cat "$out"; echo "FAIL $name ($how): $*"; exit 1; }

check() { # how, rows wanted, compressed calls wanted, then mpirun arguments
  how=$1 want_rows=$2 want_calls=$3; shift 3
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 4 \
    -x LD_PRELOAD="${SHIM:?SHIM unset}" -x DGC_STATS=1 -x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=100 "$@" >"$out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || fail "the job exited with $rc"
  grep -q "^ranks_identical yes" "$out" || fail "ranks ended with different weights"
  local acc rows nrows bad
  acc=$(awk '/^final/ {print $3}' "$out")
  [ -n "$acc" ] || fail "no 'final' line"
  awk -v a="$acc" 'BEGIN {exit !(a >= 0.5)}' || fail "test accuracy $acc after 100 steps, below 0.5: it did not learn"
  rows=$(grep -E "rank 0 dgcshim STATS 0x" "$out")
  nrows=$(printf '%s\n' "$rows" | grep -c .)
  [ "$nrows" -eq "$want_rows" ] || fail "$nrows buffer rows in STATS, want $want_rows"
  bad=$(printf '%s\n' "$rows" | awk '$8 != 100 {print}')
  [ -z "$bad" ] || fail "buffers not compressed at every one of the 100 steps: $bad"
  grep -q "STATS pass-through calls [0-9]*, compressed calls $want_calls," "$out" ||
    fail "not $want_calls compressed calls"
  if grep -q "a fusion buffer" "$out"; then fail "a fusion warning"; fi
  echo "$how: test_acc $acc, $want_rows buffer(s) compressed at each of 100 steps"
}

script=("$py" "$root/ld_preload_examples/horovod_torch_fashion.py" --epochs 1 --train-limit 12800)
check "groups=1" 1 100 "${script[@]}" --groups 1
grep -qE "rank 0 dgcshim STATS 0x[0-9a-f]+[*]? +215370 " "$out" || fail "the one buffer is not all 215370 gradients"
check "fusion off" 8 800 -x DGC_MIN_ELEMENTS=1 -x HOROVOD_FUSION_THRESHOLD=0 "${script[@]}"
echo "PASS $name"
