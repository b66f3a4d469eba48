# The install of `pip install .` (DGC_PACKAGE=ON): the library and
# dgcshim-options into the Python package's lib/ and bin/, where
# python/dgcshim/paths.py looks. The MPICH family has an ABI of its own, so
# where the main build is for Open MPI and MPICH's compiler wrapper is also
# here (mpicc.mpich), a second build of the same sources makes
# libdgcshim-mpich.so beside it (MPI path only); `dgcshim run` preloads the
# one the launcher's family needs. DGC_PACKAGE_MPICH=OFF leaves it out.
# Without MPI the package has libdgcshim-nccl.so alone.
install(TARGETS dgcshim LIBRARY DESTINATION dgcshim/lib)
install(TARGETS dgcshim-options RUNTIME DESTINATION dgcshim/bin)
if(NOT DGC_WITH_MPI)
  # Where CMake finds no MPI (a GPU machine with PyTorch alone): the package
  # carries the NCCL front end alone, and `dgcshim doctor` says so.
  message(STATUS "dgcshim: the package carries lib${DGC_LIBRARY_NAME}.so, the NCCL front end alone (no MPI "
                 "front end: MPI_Allreduce is not compressed; install MPI's development files and reinstall for it)")
endif()

find_program(DGC_MPICC_MPICH mpicc.mpich)
set(want_mpich OFF)
if(DGC_MPI_FAMILY STREQUAL "openmpi" AND DGC_MPICC_MPICH)
  set(want_mpich ON)
endif()
option(DGC_PACKAGE_MPICH "Also build libdgcshim-mpich.so into the package" ${want_mpich})
if(DGC_PACKAGE_MPICH)
  include(ExternalProject)
  set(mpich_stage ${CMAKE_CURRENT_BINARY_DIR}/mpich-stage)
  ExternalProject_Add(dgcshim_mpich
    SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}
    BINARY_DIR ${CMAKE_CURRENT_BINARY_DIR}/mpich-build
    CMAKE_ARGS -DMPI_C_COMPILER=${DGC_MPICC_MPICH} -DDGC_CUDA=OFF -DDGC_BUILD_TESTS=OFF -DDGC_PACKAGE=ON
               -DDGC_PACKAGE_MPICH=OFF -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE} -DDGC_WERROR=${DGC_WERROR}
               -DCMAKE_INSTALL_PREFIX=${mpich_stage}
    BUILD_ALWAYS ON)
  install(FILES ${mpich_stage}/dgcshim/lib/libdgcshim-mpich.so DESTINATION dgcshim/lib)
  message(STATUS "dgcshim: the package also carries libdgcshim-mpich.so (${DGC_MPICC_MPICH})")
endif()
