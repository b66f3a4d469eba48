# Sourced by the scripts that bring an emulated cluster up for one job
# (smoke.sh, sweep.sh, train_step.sh): the checks, the teardown and the
# single-rank engine measurement they share. Expects HERE (this folder) and
# PREFIX (the namespace prefix, dgc) to be set.

# True when any namespace of ours exists: another benchmark owns the cluster.
netns_cluster_up() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qE "^(${PREFIX}[0-9]+|${PREFIX}br)$"
}

# Tears the cluster down however the script ends (exit, error, INT, TERM),
# keeping the script's exit status; CLEANUP, if set, runs after (e.g. rm -rf).
netns_down_on_exit() { # script name
    NETNS_SCRIPT=$1
    trap netns_teardown EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

netns_teardown() {
    local rc=$?
    trap - EXIT INT TERM
    "$HERE/cluster.sh" down >/dev/null 2>&1 ||
        echo "$NETNS_SCRIPT: teardown failed; run '$HERE/cluster.sh down'" >&2
    [ -z "${CLEANUP:-}" ] || eval "$CLEANUP"
    exit "$rc"
}

# The shim's engine on one rank with a core of its own (what each real host
# has): np 1, no network, DGC_MIN_RANKS=1 so the shim compresses a 1-rank
# all-reduce (the all-gather is a local copy). Prints the whole call's mean time
# in us over 30 timed calls after 3 untimed ones, so the first call's allocation
# and first touch are not in it. (A difference of DGC_STATS totals between a
# long and a short job is not steadier: the first call's page faults alone vary
# by 100 ms.) Expects BENCH, SHIM and die(); more mpirun options after LOG.
netns_engine_call_us() { # BYTES LOG [mpirun options...]
    local bytes=$1 log=$2
    shift 2
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "${JOB_TIMEOUT:-900}" \
        mpirun --allow-run-as-root -np 1 --mca btl self --mca pml ob1 \
        -x "LD_PRELOAD=$SHIM" -x DGC_STATS=1 -x DGC_MIN_RANKS=1 "$@" \
        "$BENCH" --min-bytes "$bytes" --max-bytes "$bytes" --iters 30 --warmup 3 >"$log" 2>&1 ||
        { cat "$log" >&2; die "the 1-rank engine run failed (log $log)"; }
    grep -q "STATS total" "$log" || die "the 1-rank run did not compress (log $log)"
    awk '!/^#/ && NF >= 6 && $3 == "float" {t = $4} END {print t}' "$log"
}
