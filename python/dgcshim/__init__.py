"""dgcshim: Deep Gradient Compression behind unmodified MPI_Allreduce and
ncclAllReduce calls, as an LD_PRELOAD library.

The package carries the library (lib/libdgcshim.so, and lib/libdgcshim-mpich.so
where MPICH was found at build time) and the `dgcshim` command: run, doctor,
config and report. Standard library only; matplotlib for `report --plot`.
"""
__version__ = "0.1.0"
