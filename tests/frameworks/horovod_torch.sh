#!/usr/bin/env bash
# frameworks.horovod_torch: ld_preload_examples/horovod_torch_fashion.py, an
# ordinary Horovod + PyTorch script, on 4 ranks under the shim for 100 steps
# with Horovod's tensor fusion off (HOROVOD_FUSION_THRESHOLD=0, as the README
# advises). Checks: the job ends with every rank's weights identical, it
# learned (test accuracy of at least 0.5 after 100 steps, all of them warm-up;
# dense reaches about 0.74), every one of the CNN's 8 gradient tensors has exactly one buffer row
# in STATS with a call every step (stable addresses: residuals follow their
# tensors), 800 compressed calls in all, and no fusion warning.
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
mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 4 \
  -x LD_PRELOAD="${SHIM:?SHIM unset}" -x DGC_STATS=1 -x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS=100 \
  -x DGC_MIN_ELEMENTS=1 -x HOROVOD_FUSION_THRESHOLD=0 \
  "$py" "$root/ld_preload_examples/horovod_torch_fashion.py" --epochs 1 --train-limit 12800 >"$out" 2>&1
rc=$?
fail() { cat "$out"; echo "FAIL $name: $*"; exit 1; }
[ $rc -eq 0 ] || fail "the job exited with $rc"
grep -q "^ranks_identical yes" "$out" || fail "ranks ended with different weights"
acc=$(awk '/^final/ {print $3}' "$out")
[ -n "$acc" ] || fail "no 'final' line"
awk -v a="$acc" 'BEGIN {exit !(a >= 0.5)}' || fail "test accuracy $acc after 100 steps, below 0.5: it did not learn"
rows=$(grep -E "rank 0 dgcshim STATS 0x" "$out")
nrows=$(printf '%s\n' "$rows" | grep -c .)
[ "$nrows" -eq 8 ] || fail "$nrows buffer rows in STATS, want 8 (one per gradient tensor)"
bad=$(printf '%s\n' "$rows" | awk '$8 != 100 {print}')
[ -z "$bad" ] || fail "buffers not compressed at every one of the 100 steps: $bad"
grep -q "STATS pass-through calls [0-9]*, compressed calls 800," "$out" || fail "not 800 compressed calls"
grep -q "a fusion buffer" "$out" && fail "the fusion warning, with tensor fusion off"
echo "PASS $name: test_acc $acc, 8 gradient tensors compressed at each of 100 steps"
