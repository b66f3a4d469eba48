# Integration cases: each is a real mpirun of allreduce_check under the shim.
# Variables handed to the shim (-e) and to the program's own reference (--x)
# are written side by side so they cannot drift apart.
function(mpi_case name)
  add_test(NAME mpi.${name} COMMAND ${RUN_CASE} ${ARGN})
  set_tests_properties(mpi.${name} PROPERTIES ENVIRONMENT "${CASE_ENV}" TIMEOUT 180)
endfunction()

set(EXACT -e DGC_SAMPLE_RATIO=1 -e DGC_SPARSITY=0.99)

mpi_case(reference_plain ${EXACT} -- reference --sparsity 0.99)
mpi_case(reference_inplace ${EXACT} -- reference --sparsity 0.99 --inplace 1)
mpi_case(reference_warmup ${EXACT} -e DGC_WARMUP_STEPS=8 -- reference --sparsity 0.99 --warmup 8)
# With DGC_MOMENTUM > 0 the output is S_t - m S_{t-1} (DGC_COMPENSATE=1, the
# default) or S_t (DGC_COMPENSATE=0); the reference computes either.
mpi_case(reference_momentum ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_WARMUP_STEPS=6 -e DGC_COMPENSATE=0
         -- reference --sparsity 0.99 --momentum 0.9 --warmup 6)
mpi_case(reference_momentum_compensated ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_WARMUP_STEPS=6
         -- reference --sparsity 0.99 --momentum 0.9 --warmup 6 --compensate 1)
mpi_case(reference_nesterov ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_NESTEROV=1 -e DGC_COMPENSATE=0
         -- reference --sparsity 0.99 --momentum 0.9 --nesterov 1)
mpi_case(reference_no_masking ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_MOMENTUM_MASKING=0
         -- reference --sparsity 0.99 --momentum 0.9 --masking 0 --compensate 1)
mpi_case(reference_clipping ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_CLIP_NORM=5 -e DGC_COMPENSATE=0
         -- reference --sparsity 0.99 --momentum 0.9 --clip 5)
mpi_case(nan_on_one_rank ${EXACT} -e DGC_MOMENTUM=0.9
         -- reference --sparsity 0.99 --momentum 0.9 --nonfinite-step 4 --steps 12 --compensate 1)
mpi_case(inf_on_one_rank ${EXACT} -e DGC_MOMENTUM=0.9 -e DGC_COMPENSATE=0
         -- reference --sparsity 0.99 --momentum 0.9 --nonfinite-step 0 --inf 1 --steps 10)

# An unmodified SGD with momentum 0.9 over the compensated output ends with
# the same weights as plain SGD over S_t (DGC_COMPENSATE=0).
add_test(NAME mpi.compensation_matches_plain_sgd
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi/compensation.sh ${RUN_CASE})
set_tests_properties(mpi.compensation_matches_plain_sgd PROPERTIES ENVIRONMENT "${CASE_ENV}" TIMEOUT 300)
mpi_case(drain_many_steps -e DGC_SPARSITY=0.99 -- drain --n 20000 --steps 200 --sparsity 0.99)
mpi_case(passthrough -- passthrough --expect-compressed 1)
mpi_case(passthrough_disabled -e DGC_ENABLE=0 -- passthrough --expect-compressed 0)
mpi_case(passthrough_min_elements -e DGC_MIN_ELEMENTS=200000 -- passthrough --expect-compressed 0)
mpi_case(passthrough_min_ranks -e DGC_MIN_RANKS=8 -- passthrough --expect-compressed 0)
mpi_case(stats_ratio -e DGC_STATS=1 --grep "STATS +0x[0-9a-f]+ +1048576 +5 +0 +20971520 +42120 +497[.]9x +497[.]9x"
         -- stats)
mpi_case(banner -e DGC_LOG_LEVEL=info --grep "rank 0 dgcshim INFO dgcshim active \\(host engine: (avx512|avx2|generic)\\): DGC_ENABLE=1 DGC_SPARSITY=0.999"
         -- passthrough)
mpi_case(mismatched_sparsity --split DGC_SPARSITY=0.99,0.9
         --fail "rank [0-9] dgcshim ERROR DGC_SPARSITY differs between ranks" -- passthrough)
mpi_case(bad_sparsity -e DGC_SPARSITY=1.5
         --fail "dgcshim ERROR invalid DGC_SPARSITY='1.5': accepted .0, 1. " -- passthrough)
mpi_case(bad_min_elements_on_one_rank --split DGC_MIN_ELEMENTS=1000,-3
         --fail "invalid DGC_MIN_ELEMENTS='-3'" -- passthrough)

# A real training run under the shim: the C trainer on a slice of
# Fashion-MNIST (needs Debian's dataset-fashion-mnist; without it the case
# fails with the trainer's message naming the missing file). It must learn,
# end with identical weights on every rank, and have been compressed.
mpi_case(mlp_trainer_under_shim --check $<TARGET_FILE:mlp_trainer>
         -e DGC_MOMENTUM=0.9 -e DGC_WARMUP_STEPS=40 -e DGC_STATS=1
         --grep "^final test_acc 0[.][7-9].* weights_identical 1"
         --grep "STATS 0x[0-9a-f]+ +669706 +.* 496[.]8x"
         -- --epochs 2 --train-limit 8192 --test-limit 2000)
