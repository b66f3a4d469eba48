#!/usr/bin/env python3
"""Runs Horovod's own TF2 Keras benchmark (horovod_upstream/, unmodified) with
groups=1 for its DistributedOptimizer: the one-argument change that makes every
step's gradients travel in ONE fused buffer of a fixed layout.

  mpirun -np 2 -x LD_PRELOAD=$PWD/build/libdgcshim.so -x DGC_STATS=1 \\
      .venv/horovod-tf/bin/python ld_preload_examples/horovod_tf_groups1.py \\
      --no-cuda --num-iters 3 --num-batches-per-iter 2 --model MobileNetV2 --batch-size 8

Why: TensorFlow allocates new gradient tensors every step, so with Horovod's
tensor fusion off (HOROVOD_FUSION_THRESHOLD=0) no gradient keeps its address,
and with fusion on (the default) the fusion buffer packs a different set of
tensors each step; either way the shim's residuals would not follow their
tensors (it warns). groups=1 puts all gradients in one group, all-reduced
together, in the same order, into Horovod's persistent fusion buffer.

The arguments are the upstream script's. Rather than editing that file, this
wrapper binds groups=1 into hvd.DistributedOptimizer and runs it as
__main__; in your own script, write
hvd.DistributedOptimizer(opt, ..., groups=1).
"""
import functools
import os
import runpy
import sys

import horovod.tensorflow.keras as hvd

hvd.DistributedOptimizer = functools.partial(hvd.DistributedOptimizer, groups=1)
upstream = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_upstream",
                        "tensorflow2_keras_synthetic_benchmark.py")
sys.argv[0] = upstream
runpy.run_path(upstream, run_name="__main__")
