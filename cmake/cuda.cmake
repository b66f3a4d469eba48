# Finds what the GPU path needs: nvcc (the CUDA language), the CUDA toolkit's
# static runtime, and nccl.h (headers only: libnccl is never linked). Sets
# DGC_WITH_CUDA (the NCCL front end goes into libdgcshim.so),
# DGC_WITH_CUDA_ENGINE (the CUDA engine and its tests are built),
# DGC_NCCL_INCLUDE_DIR, DGC_CUDA_INCLUDE_DIRS (the runtime's C headers),
# adds kernels/ (dgcshim_cuda) and defines
# dgc_cuda_executable(NAME SOURCES...) for the programs built on the engine.
#
# DGC_CUDA=EMULATED builds the engine for the emulated device instead
# (cmake/emulated.cmake): tests only.
set(DGC_WITH_CUDA OFF)
set(DGC_WITH_CUDA_ENGINE OFF)
set(DGC_EMULATED OFF)
if(DGC_CUDA STREQUAL "EMULATED")
  include(${CMAKE_CURRENT_LIST_DIR}/emulated.cmake)
  return()
endif()
if(NOT DGC_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(DGC_NCCL_INCLUDE_DIR nccl.h
            HINTS ENV NCCL_HOME ENV CUDA_HOME /usr/local/cuda
            PATH_SUFFIXES include)
  if(CMAKE_CUDA_COMPILER AND DGC_NCCL_INCLUDE_DIR)
    set(DGC_WITH_CUDA ON)
    set(DGC_WITH_CUDA_ENGINE ON)
  elseif(DGC_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DGC_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or nccl.h (${DGC_NCCL_INCLUDE_DIR}) "
                        "was not found: set CMAKE_CUDA_COMPILER and NCCL_HOME, or DGC_CUDA=OFF")
  endif()
endif()
if(DGC_WITH_CUDA)
  # sm_90 (H100/H200) unless told otherwise: each architecture costs a
  # compile of every kernel.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(DGC_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_VISIBILITY_PRESET hidden)
  add_subdirectory(kernels)
  function(dgc_cuda_executable name)
    add_executable(${name} ${ARGN})
    target_link_libraries(${name} PRIVATE dgcshim_cuda dgcshim_core)
    target_compile_options(${name} PRIVATE ${DGC_CUDA_WARNINGS})
  endfunction()
  message(STATUS "dgcshim: GPU path on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, nccl.h in ${DGC_NCCL_INCLUDE_DIR}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
elseif(DGC_WITH_MPI)
  message(STATUS "dgcshim: GPU path off (DGC_CUDA=${DGC_CUDA}; nvcc or nccl.h not found): MPI path only")
endif()
