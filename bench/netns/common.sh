# Sourced by the scripts that bring an emulated cluster up for one job
# (smoke.sh, sweep.sh, train_step.sh): the checks and the teardown they share.
# Expects HERE (this folder) and PREFIX (the namespace prefix, dgc) to be set.

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
