#!/usr/bin/env bash
# mpi.stats_file: DGC_STATS_FILE=PATH with DGC_STATS_EVERY=10 on 4 ranks of
# a drain run (50 steps of gradients, then zero gradients until the residual
# is sent; run_case.sh, so under Open MPI or MPICH and in the sanitizer
# builds): each rank's PATH.RANK holds one "every" line per 10 compressed
# calls and one "exit" line, every line is one JSON object, the exit line
# counts the buffer's calls with its density, and the first line started the
# file afresh (a stale line from an earlier run is gone). Once for each
# DGC_TRANSPORT that picks one (sparse, dense, reduce): last_transport names
# it, and its count (dense_transport, reduce_transport, or neither) is every
# call's.
#
#   stats_file.sh RUN_CASE
set -u
run_case=${1:?RUN_CASE}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
for transport in sparse dense reduce; do
for r in 0 1 2 3; do echo '{"event":"stale"}' >"$dir/s.$r"; done
"$run_case" -e "DGC_STATS_FILE=$dir/s" -e DGC_STATS_EVERY=10 -e DGC_SPARSITY=0.99 -e "DGC_TRANSPORT=$transport" \
  -- drain --n 20000 --steps 50 --sparsity 0.99 || { echo "FAIL mpi.stats_file: the job failed ($transport)"; exit 1; }
python3 - "$dir/s" "$transport" <<'PY' || exit 1
import json, sys
stem, transport = sys.argv[1:]
for r in range(4):
    with open("%s.%d" % (stem, r)) as f:
        lines = [json.loads(l) for l in f]
    calls = lines[-1]["compressed_calls"]
    assert calls >= 50, "rank %d: %d calls" % (r, calls)
    events = [l["event"] for l in lines]
    assert events == ["every"] * (calls // 10) + ["exit"], "rank %d: events %s" % (r, events)
    assert [l["compressed_calls"] for l in lines] == list(range(10, calls + 1, 10)) + [calls], "rank %d" % r
    (b,) = lines[-1]["buffers"]
    assert (b["count"], b["calls"], lines[-1]["rank"]) == (20000, calls, r), (r, b)
    assert b["last_density"] == 0.01 and b["last_transport"] == transport, (transport, b)
    counts = {"sparse": (0, 0), "dense": (calls, 0), "reduce": (0, calls)}[transport]
    assert (b["dense_transport"], b["reduce_transport"]) == counts, (transport, b)
    assert b["wire_bytes"] > 0 and b["dense_bytes"] == calls * 4 * 20000, b
print("PASS mpi.stats_file (%s): 4 ranks, a line every 10 calls and one at exit each, %d calls counted" % (transport, calls))
PY
done
