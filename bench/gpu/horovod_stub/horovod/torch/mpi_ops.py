"""Stand-in for horovod.torch.mpi_ops (dgcshim benchmark; see ../../README.md).

Average is the reduction op DGCCompressor compares with in decompress(). The
collectives are used only by DGCCompressor.communicate()/synchronize(), which
the benchmark never calls (it times compress + decompress on one GPU and
builds the gathered tensors itself): calling them is an error.
"""
Average = "Average"
Sum = "Sum"


def _not_here(*args, **kwargs):
    raise NotImplementedError("horovod stub: no collectives in the single-GPU compressor benchmark")


allreduce_async_ = _not_here
allgather_async = _not_here
synchronize = _not_here
