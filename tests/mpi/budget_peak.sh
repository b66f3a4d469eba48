#!/usr/bin/env bash
# mpi.budget_peak: a 200,000-float buffer on 4 ranks under DGC_MAX_STATE_MB;
# every rank's memory peak, from its DGC_STATS_FILE exit line, must stay
# within the budget, and the buffer must still be compressed on every call:
#   - DGC_MAX_STATE_MB=2 (a state of about 1.9 MB) and gradients of ties (all
#     1.0 but one element), which overflow the candidate room into the exact
#     top-k fallback (its n-float copy once took the peak to 2.7 MB, 29% over);
#   - DGC_MAX_STATE_MB=11 and the reduce transport's warm-up, whose scratch
#     the state's footprint counts (a peak of 9.3 MB).
# Both also check their output (allreduce_check's reference; drain's
# conservation). run_case.sh: under Open MPI or MPICH, and the sanitizer build.
#
#   REDUCE_CHECK=reduce_check budget_peak.sh RUN_CASE
set -u
run_case=${1:?RUN_CASE}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
steps=6
"$run_case" -e DGC_MAX_STATE_MB=2 -e "DGC_STATS_FILE=$dir/ties" -e DGC_SPARSITY=0.999 \
  -- reference --n 200000 --ties 1 --sparsity 0.999 --steps $steps ||
  { echo "FAIL mpi.budget_peak: the ties job failed"; exit 1; }
# The reduce transport's warm-up (k = n/4 first, its largest scratch: 2.4 MB,
# which the page allocator rounds to 4 MiB) against the reference.
CHECK=${REDUCE_CHECK:?REDUCE_CHECK unset} "$run_case" -e DGC_MAX_STATE_MB=11 -e "DGC_STATS_FILE=$dir/reduce" \
  -e DGC_SPARSITY=0.99 -e DGC_SAMPLE_RATIO=1 -e DGC_VALUE_BITS=32 -e DGC_TRANSPORT=reduce -e DGC_WARMUP_STEPS=4 \
  -- --n 200000 --warmup 4 --steps $steps --sparsity 0.99 ||
  { echo "FAIL mpi.budget_peak: the reduce job failed"; exit 1; }
python3 - "$dir" $steps <<'PY' || exit 1
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
for job, budget in (("ties", 2 << 20), ("reduce", 11 << 20)):
    for r in range(4):
        with open("%s/%s.%d" % (d, job, r)) as f:
            last = [json.loads(l) for l in f][-1]
        peak, calls = last["memory"]["peak_bytes"], last["compressed_calls"]
        assert 0 < peak <= budget, "%s rank %d: peak %d bytes, over DGC_MAX_STATE_MB (%d)" % (job, r, peak, budget)
        assert calls >= steps and last["passthrough_calls"] == 0, "%s rank %d: %d compressed calls" % (job, r, calls)
        (b,) = last["buffers"]
        assert b["count"] == 200000 and b["calls"] == calls, (job, r, b)
    print("mpi.budget_peak %s: peak %d bytes of %d, %d compressed calls" % (job, peak, budget, calls))
print("PASS mpi.budget_peak: within DGC_MAX_STATE_MB with ties (2) and with the reduce transport's warm-up (11)")
PY
