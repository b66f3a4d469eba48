# The NCCL front end: ncclAllReduce and the group and communicator calls
# around it, over the CUDA engine (kernels/, dgcshim_cuda). Included by the
# top-level CMakeLists.txt when the GPU path is on, after the dgcshim target
# exists; it sets DGC_NCCL_SOURCES, which that file adds to the target.
set(DGC_NCCL_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/agree.c
  ${CMAKE_CURRENT_LIST_DIR}/allreduce.c
  ${CMAKE_CURRENT_LIST_DIR}/call.c
  ${CMAKE_CURRENT_LIST_DIR}/children.c
  ${CMAKE_CURRENT_LIST_DIR}/comm.c
  ${CMAKE_CURRENT_LIST_DIR}/destroy.c
  ${CMAKE_CURRENT_LIST_DIR}/device.c
  ${CMAKE_CURRENT_LIST_DIR}/wait.c
  ${CMAKE_CURRENT_LIST_DIR}/exit.c
  ${CMAKE_CURRENT_LIST_DIR}/group.c
  ${CMAKE_CURRENT_LIST_DIR}/init.c
  ${CMAKE_CURRENT_LIST_DIR}/memory.c
  ${CMAKE_CURRENT_LIST_DIR}/node.c
  ${CMAKE_CURRENT_LIST_DIR}/resolve.c
  ${CMAKE_CURRENT_LIST_DIR}/rules.c
  ${CMAKE_CURRENT_LIST_DIR}/setup.c
  ${CMAKE_CURRENT_LIST_DIR}/state.c
  ${CMAKE_CURRENT_LIST_DIR}/vote.c)

# The front end calls the CUDA runtime itself (devices, capture, the
# check's copies): the static one, never libcudart.so (tests/gpu/needed.sh).
# A static runtime inside a preloaded library must not export its symbols:
# they would take the place of the application's own libcudart for every
# cuda* call in the process. --exclude-libs hides whatever the archives
# linked into libdgcshim.so define, as NCCL's own build does.
target_include_directories(dgcshim PRIVATE ${DGC_CUDA_INCLUDE_DIRS})
if(DGC_EMULATED)
  # The emulated device (cmake/emulated.cmake): the same C code, its cuda*
  # calls served by the test-only adapter over chipStar, the engine's C++
  # objects linked in.
  target_link_libraries(dgcshim PRIVATE dgc_emu_cudart)
  set_target_properties(dgcshim PROPERTIES LINKER_LANGUAGE CXX)
else()
  target_link_libraries(dgcshim PRIVATE CUDA::cudart_static)
endif()
target_link_options(dgcshim PRIVATE "LINKER:--exclude-libs,ALL")
