#!/usr/bin/env python3
"""Runs a Horovod training script, unmodified, with groups=1 for its
hvd.DistributedOptimizer: the one-argument change that makes every step's
gradients travel in ONE fused buffer of a fixed layout.

  horovod_groups1.py SCRIPT [ARGS...]
  horovod_groups1.py -m MODULE [ARGS...]

`dgcshim run --horovod-groups1 -- COMMAND` puts it in front of the script
of every Python rank of COMMAND; by hand:

  mpirun -np 2 -x LD_PRELOAD=$PWD/build/libdgcshim.so -x DGC_STATS=1 \\
      .venv/horovod-tf/bin/python python/dgcshim/horovod_groups1.py \\
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
DistributedOptimizer of whichever Horovod framework modules are really there
(horovod.torch, horovod.tensorflow, horovod.tensorflow.keras: in a
TensorFlow-only Horovod, horovod.torch imports but holds no
DistributedOptimizer) and runs the script as __main__. In your own script,
write hvd.DistributedOptimizer(opt, ..., groups=1).

Standard library only, and standalone: it runs under whatever Python the
rank runs, with or without the dgcshim package installed there.
"""
import functools
import importlib
import runpy
import sys
import warnings

FRAMEWORKS = ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras")


def bind_groups1():
    """Binds groups=1 where a DistributedOptimizer exists; returns the module names."""
    bound = []
    for name in FRAMEWORKS:
        try:
            with warnings.catch_warnings():  # a framework's missing extension only warns
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception:  # not installed, or its framework is absent (ImportError and others)
            continue
        opt = getattr(mod, "DistributedOptimizer", None)
        if opt is None or isinstance(opt, functools.partial):
            continue
        mod.DistributedOptimizer = functools.partial(opt, groups=1)
        bound.append(name)
    return bound


def main(argv):
    if len(argv) < 1 or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(__doc__)
    bound = bind_groups1()
    if not bound:
        print("horovod_groups1: no Horovod DistributedOptimizer found (is Horovod installed for this Python?); "
              "running the script unchanged", file=sys.stderr)
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
