# The CUDA engine's sources, read by kernels/CMakeLists.txt (nvcc) and by
# cmake/emulated.cmake (chipStar's cucc, the emulated device): one list, so
# that a kernel file added here is built by both.
set(DGC_ENGINE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/state.cu
  ${CMAKE_CURRENT_LIST_DIR}/sample_select.cu
  ${CMAKE_CURRENT_LIST_DIR}/compress.cu
  ${CMAKE_CURRENT_LIST_DIR}/decode.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense.cu
  ${CMAKE_CURRENT_LIST_DIR}/compact.cu
  ${CMAKE_CURRENT_LIST_DIR}/commit.cu
  ${CMAKE_CURRENT_LIST_DIR}/node.cu)
