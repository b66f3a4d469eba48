# Stand-in for Horovod, written for dgcshim's benchmark (not part of the
# official DGC repository): see ../README.md. The vendored dgc/ files import
# horovod.torch; only hvd.size() and hvd.rank() are called on the path the
# benchmark times (DGCCompressor.__init__/initialize, compress, decompress).
