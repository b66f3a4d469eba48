#!/usr/bin/env python3
"""Runs a Horovod training script, unmodified, with groups=1 for its
hvd.DistributedOptimizer: the one-argument change that makes every step's
gradients travel in ONE fused buffer of a fixed layout.

  horovod_groups1.py SCRIPT [ARGS...]

  mpirun -np 2 -x LD_PRELOAD=$PWD/build/libdgcshim.so -x DGC_STATS=1 \\
      .venv/horovod-tf/bin/python ld_preload_examples/horovod_groups1.py \\
      .upstream/horovod-examples/tensorflow2_keras_synthetic_benchmark.py \\
      --no-cuda --num-iters 3 --num-batches-per-iter 2 --model MobileNetV2 --batch-size 8

Why: with Horovod's default tensor fusion the fusion buffer packs a different
set of tensors each step, so the shim's residuals would not follow their
tensors (it warns); TensorFlow allocates new gradient tensors every step, so
turning fusion off (HOROVOD_FUSION_THRESHOLD=0) gives it no stable address
either. groups=1 puts all gradients in one group, all-reduced together, in
the same order, into Horovod's persistent fusion buffer: one buffer state,
and one top-k over all gradients, as for a flat gradient buffer.

Rather than editing the script, this wrapper binds groups=1 into the
DistributedOptimizer of whichever Horovod framework modules are installed
(horovod.torch, horovod.tensorflow, horovod.tensorflow.keras) and runs the
script as __main__. In your own script, write
hvd.DistributedOptimizer(opt, ..., groups=1).
"""
import functools
import importlib
import runpy
import sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
for name in ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras"):
    try:
        mod = importlib.import_module(name)
    except ImportError:
        continue
    mod.DistributedOptimizer = functools.partial(mod.DistributedOptimizer, groups=1)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
