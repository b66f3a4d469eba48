# The MPI front end's integration tests (included by tests/CMakeLists.txt in
# a build with MPI): mpirun cases, the emulated cluster, Horovod, Fortran.
# The integration program knows nothing of the shim: it is an ordinary MPI
# program, run under mpirun with LD_PRELOAD=libdgcshim.so.
add_library(mpi_test_common STATIC mpi/test_common.c)
target_link_libraries(mpi_test_common PUBLIC MPI::MPI_C m)
foreach(p allreduce_check lifetime_check failure_check node_check)
  add_executable(${p} mpi/${p}.c)
  target_link_libraries(${p} PRIVATE mpi_test_common Threads::Threads)
endforeach()
# The reduce transport's reference (mpi/reduce_check.c) asks the policy only
# which transport a step takes.
add_executable(reduce_check mpi/reduce_check.c)
target_link_libraries(reduce_check PRIVATE mpi_test_common dgcshim_core)

set(RUN_CASE ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_case.sh)
# The launcher of the build's MPI family: Debian's mpiexec and mpirun name
# whichever MPI is the system's default, so the family's own comes first.
if(DGC_MPI_FAMILY STREQUAL mpich)
  find_program(DGC_MPIEXEC NAMES mpiexec.mpich mpiexec.hydra mpiexec REQUIRED)
else()
  find_program(DGC_MPIEXEC NAMES mpirun.openmpi mpirun REQUIRED)
endif()
# MPICH over UCX polls while it waits: with 4 ranks on 2 cores its jobs run
# several times longer than Open MPI's, which yield, so a job counts as hung
# later there (CASE_TIMEOUT, and ctest's own limit above it).
if(DGC_MPI_FAMILY STREQUAL mpich)
  set(DGC_CASE_TIMEOUT 300)
else()
  set(DGC_CASE_TIMEOUT 120)
endif()
math(EXPR DGC_CTEST_TIMEOUT "${DGC_CASE_TIMEOUT} + 60")
set(CASE_ENV "SHIM=$<TARGET_FILE:dgcshim>;CHECK=$<TARGET_FILE:allreduce_check>;DGC_SANITIZE=${DGC_SANITIZE}"
    "MPI_FAMILY=${DGC_MPI_FAMILY};MPIEXEC=${DGC_MPIEXEC};CASE_TIMEOUT=${DGC_CASE_TIMEOUT}")
include(${CMAKE_CURRENT_SOURCE_DIR}/mpi/cases.cmake)
# DGC_STATS_FILE and DGC_STATS_EVERY: each rank's JSON lines (tests/mpi/stats_file.sh).
add_test(NAME mpi.stats_file COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi/stats_file.sh ${RUN_CASE})
set_tests_properties(mpi.stats_file PROPERTIES ENVIRONMENT "${CASE_ENV}" TIMEOUT ${DGC_CTEST_TIMEOUT})
# DGC_MAX_STATE_MB holds at the peak: the exact top-k fallback's ties and the
# reduce transport's scratch (tests/mpi/budget_peak.sh).
add_test(NAME mpi.budget_peak COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi/budget_peak.sh ${RUN_CASE})
set_tests_properties(mpi.budget_peak PROPERTIES ENVIRONMENT "${CASE_ENV};REDUCE_CHECK=$<TARGET_FILE:reduce_check>"
                     TIMEOUT ${DGC_CTEST_TIMEOUT})

# The shim preloaded into a program of the other MPI family stops it, at
# load or at MPI_Init, naming both (tests/mpi/abi_mismatch.sh); it needs the
# other family's mpicc, else it reports itself skipped, by name.
if(DGC_MPI_FAMILY STREQUAL mpich)
  find_program(DGC_FOREIGN_MPICC NAMES mpicc.openmpi)
else()
  find_program(DGC_FOREIGN_MPICC NAMES mpicc.mpich)
endif()
if(DGC_FOREIGN_MPICC)
  add_test(NAME mpi.abi_mismatch COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi/abi_mismatch.sh $<TARGET_FILE:dgcshim>
           ${DGC_FOREIGN_MPICC})
  set_tests_properties(mpi.abi_mismatch PROPERTIES ENVIRONMENT "DGC_SANITIZE=${DGC_SANITIZE}" TIMEOUT 120)
else()
  add_test(NAME mpi.abi_mismatch COMMAND sh -c
           "echo 'SKIPPED mpi.abi_mismatch: no mpicc of the other MPI family (apt-get install mpich libmpich-dev)'; exit 77")
  set_tests_properties(mpi.abi_mismatch PROPERTIES SKIP_RETURN_CODE 77)
endif()

# The 1 Gbit/s emulated cluster, short version: 2 network-namespace hosts, one
# size, dense against the shim; checks the harness works and the shim moves
# fewer bytes. Needs root and ip netns: otherwise it reports itself skipped
# (exit 77), by name.
add_test(NAME netns.smoke COMMAND ${CMAKE_SOURCE_DIR}/bench/netns/smoke.sh)
set(SMOKE_ENV "BUILD_DIR=${CMAKE_BINARY_DIR}" "SHIM=$<TARGET_FILE:dgcshim>" "MPI_FAMILY=${DGC_MPI_FAMILY}"
    "MPIEXEC=${DGC_MPIEXEC}")
if(DGC_SANITIZE)
  # The instrumented shim under LD_PRELOAD needs the ASan runtime ahead of it.
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE ASAN_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
  list(APPEND SMOKE_ENV "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
       "PRELOAD_FIRST=${ASAN_RUNTIME}")
endif()
set_tests_properties(netns.smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 ENVIRONMENT "${SMOKE_ENV}")

# Horovod + PyTorch (MPI) under the shim: an ordinary Horovod script, each
# gradient tensor compressed at its own address. Without Horovod, and in the
# sanitizer build, it reports itself skipped, by name.
add_test(NAME frameworks.horovod_torch COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/frameworks/horovod_torch.sh)
set_tests_properties(frameworks.horovod_torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                     ENVIRONMENT "SHIM=$<TARGET_FILE:dgcshim>;DGC_SANITIZE=${DGC_SANITIZE}")

# Fortran programs (mpif.h, use mpi, use mpi_f08) under the shim. Without
# gfortran or Open MPI's Fortran bindings the cases report themselves
# skipped, by name.
include(CheckLanguage)
check_language(Fortran)
if(CMAKE_Fortran_COMPILER)
  enable_language(Fortran)
  if(DGC_MPI_FAMILY STREQUAL mpich AND NOT MPI_Fortran_COMPILER)
    # the family's own wrapper: Debian's mpifort names the system's default MPI
    find_program(MPI_Fortran_COMPILER NAMES mpifort.mpich mpif90.mpich)
  endif()
  find_package(MPI COMPONENTS Fortran)
endif()
foreach(binding mpifh mpi f08)
  string(TOUPPER ${binding} upper)
  if(MPI_Fortran_FOUND)
    add_executable(fcheck_${binding} fortran/fcheck.F90)
    target_compile_definitions(fcheck_${binding} PRIVATE USE_${upper})
    target_link_libraries(fcheck_${binding} PRIVATE MPI::MPI_Fortran)
    # Exact comparisons are the point (bit-exact expectations); mpif.h has no
    # interfaces, so MPI_IN_PLACE (an integer) meets a real argument, and
    # MPICH's `use mpi` module declares MPI_Allreduce's buffers without
    # TYPE(*), so gfortran rejects MPI_IN_PLACE there too: the flag gfortran
    # documents for such MPI modules.
    target_compile_options(fcheck_${binding} PRIVATE -Wall ${DGC_C_WERROR} -Wno-compare-reals)
    if(binding STREQUAL mpifh OR (binding STREQUAL mpi AND DGC_MPI_FAMILY STREQUAL mpich))
      target_compile_options(fcheck_${binding} PRIVATE -fallow-argument-mismatch -Wno-error)
    endif()
    set_target_properties(fcheck_${binding} PROPERTIES Fortran_MODULE_DIRECTORY
                          ${CMAKE_CURRENT_BINARY_DIR}/fmod_${binding})
    add_test(NAME mpi.fortran_${binding} COMMAND ${RUN_CASE} --check $<TARGET_FILE:fcheck_${binding}>
             -e DGC_SPARSITY=0.99 -e DGC_SAMPLE_RATIO=1 -e DGC_STATS=1 -e DGC_LOG_LEVEL=info
             --grep "^PASS fortran"
             --grep "rank 0 dgcshim INFO dgcshim active"
             --grep "STATS pass-through calls [0-9]+, compressed calls 4,")
  else()
    add_test(NAME mpi.fortran_${binding} COMMAND sh -c
             "echo 'SKIPPED mpi.fortran_${binding}: no Fortran compiler or MPI Fortran bindings (apt-get install gfortran)'; exit 77")
  endif()
  set_tests_properties(mpi.fortran_${binding} PROPERTIES ENVIRONMENT "${CASE_ENV}" TIMEOUT ${DGC_CTEST_TIMEOUT}
                       SKIP_RETURN_CODE 77)
endforeach()

