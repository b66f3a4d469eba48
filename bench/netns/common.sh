# Sourced by the scripts that bring an emulated cluster up for one job
# (smoke.sh, sweep.sh, train_step.sh, layouts.sh): the checks, the teardown and the
# single-rank engine measurement they share. Expects HERE (this folder) and
# PREFIX (the namespace prefix, dgc) to be set.

# The checks before a cluster comes up, for a script whose hosts run BENCH
# with SHIM preloaded: root and ip netns (else the script's skip(): exit
# 77), Open MPI's mpirun, the benchmark and the shim built (else die()), no
# cluster of another benchmark up. Makes BENCH and SHIM absolute.
netns_preflight() {
    [ "$(id -u)" -eq 0 ] || skip "running as uid $(id -u), not root"
    ip netns list >/dev/null 2>&1 || skip "'ip netns' not supported"
    command -v mpirun >/dev/null 2>&1 || die "mpirun (Open MPI) is not installed"
    [ -x "$BENCH" ] || die "no benchmark at $BENCH (build first)"
    [ -f "$SHIM" ] || die "no shim at $SHIM (build first)"
    BENCH=$(realpath "$BENCH"); SHIM=$(realpath "$SHIM")
    ! netns_cluster_up || die "an emulated cluster is already up (another benchmark running?); '$HERE/cluster.sh down' removes it"
}

# Per-host counters of hosts 0..M-1, "tx0 q0 tx1 q1 ...": eth0 tx bytes
# (ip -s link) and the root qdisc's Sent bytes (tc -s qdisc).
netns_snap() { # M
    local i out=""
    for ((i = 0; i < $1; i++)); do
        out+="$(ip -n "$PREFIX$i" -s link show dev eth0 | awk 'f {print $1; exit} $1 == "TX:" {f = 1}') "
        out+="$(tc -n "$PREFIX$i" -s qdisc show dev eth0 | awk '$1 == "Sent" {print $2; exit}') "
    done
    echo "$out"
}

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
