"""Stand-in for horovod.torch (dgcshim benchmark; see ../../README.md, in bench/gpu/horovod_stub).

DGCCompressor reads hvd.size() once (its world size: decompress divides the
summed gradient by it) and hvd.rank() (rank 0 prints its set-up lines).
set_size() lets the benchmark choose the world size it emulates.
"""
_size = 1


def set_size(n):
    global _size
    _size = int(n)


def size():
    return _size


def rank():
    return 0
