#!/usr/bin/env bash
# Horovod + PyTorch (MPI) on Fashion-MNIST, dense and under the shim, side by
# side: ld_preload_examples/horovod_torch_fashion.py, unmodified, 4 ranks,
# same seed and epochs. Prints the table of scripts/horovod_report.py and
# keeps the logs in bench/results/horovod/.
#
#   dense            the shim loaded with DGC_ENABLE=0; Horovod's defaults
#   dgc_groups1      Horovod's default fusion with groups=1 (--groups 1, the
#                    one-argument change): all gradients in one fused buffer of
#                    a fixed layout, one top-k over all of them
#   dgc_nofusion     HOROVOD_FUSION_THRESHOLD=0: every gradient all-reduced in
#                    place at its own address; DGC_MIN_ELEMENTS=1, so every
#                    tensor, biases (10 to 128 elements) too, is compressed on
#                    its own
#   dgc_nofusion_big the same with DGC_MIN_ELEMENTS at its default (16384): the
#                    large tensor compressed, the small ones summed densely
#   dgc_fused        Horovod's defaults, unchanged: tensor fusion packs a
#                    different set of tensors each step; the shim warns (for
#                    comparison)
# Every DGC run: 99.9% sparsity, DGC_MOMENTUM=0.9 with compensation (the
# script's SGD keeps momentum 0.9), one epoch of warm-up.
# Then Horovod's own examples/pytorch/pytorch_mnist.py (v0.28.1, byte for
# byte: scripts/fetch-upstream.sh horovod-examples puts it in
# .upstream/horovod-examples; HOROVOD_EXAMPLES=DIR, a clone of horovod/horovod,
# for a machine without GitHub) on Fashion-MNIST, which it reads as
# MNIST from .data/fashion-as-mnist/MNIST/raw/ (no download), its defaults
# (batch 64, lr 0.01 x ranks, momentum 0.5) but the epochs:
#   mnist_dense         the shim loaded with DGC_ENABLE=0; Horovod's defaults
#   mnist_dgc_groups1   run through python/dgcshim/horovod_groups1.py
#                       (groups=1 bound in; the script itself unmodified)
#   mnist_dgc_nofusion  HOROVOD_FUSION_THRESHOLD=0, DGC_MIN_ELEMENTS=128 (its
#                       four weight tensors compressed, its biases of 10 to 50
#                       elements and its float32 metric averages passed through)
# both DGC runs with DGC_MOMENTUM=0.5 (the script's SGD momentum) and one epoch
# of warm-up.
#
# Environment: NP (4), EPOCHS (3), WARMUP (468 steps: one epoch at 4 ranks,
# batch 32), MNIST_EPOCHS (10, its default), MNIST_WARMUP (235 steps: its
# epoch at 4 ranks, batch 64), RUNS (default: all of the above, in that
# order), TRAIN_LIMIT
# (0: all 60000 samples), SHIM (a libdgcshim.so to use instead of building
# build/libdgcshim.so). Needs scripts/deps.sh horovod-torch (run here).
# Takes about 35 minutes on 2 cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh horovod-torch
if [ -z "${SHIM:-}" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" --target dgcshim >/dev/null
fi
shim=${SHIM:-$PWD/build/libdgcshim.so}
py=.venv/horovod-torch/bin/python
np=${NP:-4}; warmup=${WARMUP:-468}; epochs=${EPOCHS:-3}
out=bench/results/horovod; mkdir -p "$out"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np"
     -x LD_PRELOAD="$shim" -x DGC_STATS=1)
dgc=(-x DGC_MOMENTUM=0.9 -x DGC_WARMUP_STEPS="$warmup")
args=(ld_preload_examples/horovod_torch_fashion.py --epochs "$epochs" --train-limit "${TRAIN_LIMIT:-0}")
# Fashion-MNIST under MNIST's file names, gunzipped, as torchvision's MNIST
# looks for them before it would download.
raw=.data/fashion-as-mnist/MNIST/raw; mkdir -p "$raw"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -s "$raw/$f" ] || gunzip -c "/usr/share/datasets/fashion-mnist/$f.gz" > "$raw/$f"
done
mnist_epochs=${MNIST_EPOCHS:-10}
mnist_steps=$(( mnist_epochs * ( (60000 / np + 63) / 64 ) ))  # its DistributedSampler, batch 64
mnist=(.upstream/horovod-examples/pytorch_mnist.py --no-cuda --epochs "$mnist_epochs"
       --data-dir "$PWD/.data/fashion-as-mnist")
logs=()
all_runs="dense dgc_groups1 dgc_nofusion dgc_nofusion_big dgc_fused mnist_dense mnist_dgc_groups1 mnist_dgc_nofusion"
if [[ " ${RUNS:-$all_runs} " == *" mnist_"* ]] &&
   ! scripts/fetch-upstream.sh horovod-examples ${HOROVOD_EXAMPLES:+--from "$HOROVOD_EXAMPLES"} >/dev/null; then
  echo "horovod_side_by_side.sh: Horovod's pytorch_mnist.py is not here: the mnist_* runs need" \
       "scripts/fetch-upstream.sh horovod-examples (HOROVOD_EXAMPLES=DIR: a clone of horovod/horovod)" >&2
  exit 1
fi
mdgc=(-x DGC_MOMENTUM=0.5 -x DGC_WARMUP_STEPS="${MNIST_WARMUP:-235}")
for run in ${RUNS:-$all_runs}; do
  script=("${args[@]}")
  case $run in
    dense) cfg=(-x DGC_ENABLE=0); extra=() ;;
    dgc_groups1) cfg=("${dgc[@]}"); extra=(--groups 1) ;;
    dgc_nofusion) cfg=("${dgc[@]}" -x HOROVOD_FUSION_THRESHOLD=0 -x DGC_MIN_ELEMENTS=1); extra=() ;;
    dgc_nofusion_big) cfg=("${dgc[@]}" -x HOROVOD_FUSION_THRESHOLD=0); extra=() ;;
    dgc_fused) cfg=("${dgc[@]}"); extra=() ;;
    mnist_dense) cfg=(-x DGC_ENABLE=0); extra=(); script=("${mnist[@]}") ;;
    mnist_dgc_groups1) cfg=("${mdgc[@]}"); extra=(); script=(python/dgcshim/horovod_groups1.py "${mnist[@]}") ;;
    mnist_dgc_nofusion) cfg=("${mdgc[@]}" -x HOROVOD_FUSION_THRESHOLD=0 -x DGC_MIN_ELEMENTS=128); extra=()
                        script=("${mnist[@]}") ;;
    *) echo "horovod_side_by_side.sh: unknown run '$run'" >&2; exit 2 ;;
  esac
  echo "== $run =="
  "${mpi[@]}" "${cfg[@]}" "$py" "${script[@]}" "${extra[@]}" 2>&1 | tee "$out/$run.log" |
    grep -E '^(epoch|final|ranks|Test set)'
  case $run in
    mnist_*) logs+=("$out/$run.log:21840:$mnist_steps") ;;  # pytorch_mnist.py's Net: 21,840 parameters
    *) logs+=("$out/$run.log") ;;
  esac
done
/usr/bin/python3 scripts/horovod_report.py "${logs[@]}" | tee "$out/table.txt"
