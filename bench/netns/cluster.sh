#!/usr/bin/env bash
# An emulated 1 Gbit/s Ethernet cluster on one machine, made of network namespaces.
#
#   cluster.sh up N [--latency MS] [--rate RATE]   N hosts (1..64), default rate 1gbit
#   cluster.sh down                                removes everything this script made
#   cluster.sh status                              what exists now (exit 0 up, 3 down)
#
# Layout (nothing touches the root namespace's interfaces, routes or files):
#
#   namespace dgcbr:  bridge br0, and the bridge end p<i> of every host's veth
#   namespace dgc<i>: eth0 = 10.77.0.(10+i)/24 (the other end of p<i>), lo up
#
# Every link is shaped in both directions with a token bucket:
#   host -> switch: tbf on eth0 (egress of dgc<i>)
#   switch -> host: tbf on p<i> (egress of the bridge port)
# so each host has 1 Gbit/s up and 1 Gbit/s down through a non-blocking switch.
# tbf counts L2 bytes (Ethernet header + IP + TCP + payload; not the preamble,
# inter-frame gap or FCS of a real wire, about 1.6% more at MTU 1500).
# --latency MS adds a netem delay of MS milliseconds on each host's egress
# (one way host to host = MS, round trip = 2 MS); it needs sch_netem in the kernel.
#
# There is no default route in any namespace: packets can only go to
# 10.77.0.0/24 on the bridge, or to the namespace's own loopback.
#
# Exit status: 0 ok; 2 usage; 4 not root / no netns support / missing kernel
# feature (the message says which); 1 other failure. `up` removes everything
# again when it fails or is interrupted.
set -euo pipefail

PREFIX=dgc                # host namespaces dgc0, dgc1, ...
BRNS=dgcbr                # the switch's namespace
SUBNET=10.77.0            # /24
HOST_BASE=10              # host i is $SUBNET.(HOST_BASE+i)
MAX_HOSTS=64
LOCK=/run/dgcnetns.lock

die() { local rc=$1; shift; echo "cluster.sh: $*" >&2; exit "$rc"; }
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Root and working `ip netns`: the only preconditions. Exit 4 with the reason.
preflight() {
    [ "$(id -u)" -eq 0 ] || die 4 "needs root (network namespaces, veth, tc); running as uid $(id -u)"
    command -v ip >/dev/null 2>&1 || die 4 "the 'ip' command (iproute2) is not installed"
    command -v tc >/dev/null 2>&1 || die 4 "the 'tc' command (iproute2) is not installed"
    ip netns list >/dev/null 2>&1 || die 4 "'ip netns' is not supported here: $(ip netns list 2>&1 | head -1)"
    command -v unshare >/dev/null 2>&1 || die 4 "the 'unshare' command (util-linux) is not installed"
}

host_ns() { echo "$PREFIX$1"; }
host_ip() { echo "$SUBNET.$((HOST_BASE + $1))"; }

ns_exists() { [ -e "/run/netns/$1" ]; }

# Our host namespaces that exist now, sorted by index.
existing_hosts() {
    local n
    for n in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        if [[ $n =~ ^${PREFIX}([0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}"; fi
    done | sort -n
}

# Kill what still runs in a namespace we made (processes we started there, by pid),
# then delete the namespace. Deleting dgc<i> destroys eth0 and with it p<i>.
remove_ns() {
    local ns=$1 pids p i
    ns_exists "$ns" || return 0
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
        for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
        for i in 1 2 3 4 5 6 7 8 9 10; do
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [ -z "$pids" ] && break
            sleep 0.2
        done
        for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
    fi
    ip netns delete "$ns" 2>/dev/null || true
}

do_down() {
    local i
    for i in $(existing_hosts); do remove_ns "$(host_ns "$i")"; done
    remove_ns "$BRNS"
}

# Quiet namespaces: no IPv6 (no router solicitations, DAD or MLD in the counters).
quiet_ns() {
    ip netns exec "$1" sh -c 'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 > "$f"; done' \
        2>/dev/null || true
}

# The qdisc for one end of a link: tbf, optionally under a netem delay.
# tbf burst: 256 KiB (>= 4 x 64 KiB GSO segments, so TSO/GSO frames are not split
# and a 1 Gbit/s rate holds with timer slack); latency 20 ms of queue (2.5 MB at
# 1 Gbit/s, about a switch port buffer) before tail drop.
shape() { # ns dev delay_ms
    local ns=$1 dev=$2 delay=$3
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    if [ -n "$delay" ] && [ "$delay" != 0 ]; then
        tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "${delay}ms" limit 100000 \
            || die 4 "cannot add a netem qdisc on $dev in $ns: the kernel lacks sch_netem, so --latency is not available here"
        tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$RATE" burst 256kb latency 20ms
    else
        tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$RATE" burst 256kb latency 20ms \
            || die 4 "cannot add a tbf qdisc on $dev in $ns: the kernel lacks sch_tbf"
    fi
}

do_up() {
    local n=$1 delay=$2 i ns ip
    ip netns add "$BRNS" 2>/dev/null || ns_exists "$BRNS" || die 4 "cannot create namespace $BRNS: $(ip netns add "$BRNS" 2>&1)"
    ip netns exec "$BRNS" true 2>/dev/null || die 4 "'ip netns exec' does not work here: $(ip netns exec "$BRNS" true 2>&1 | head -1)"
    unshare --uts true 2>/dev/null || die 4 "'unshare --uts' does not work here (needs CAP_SYS_ADMIN): $(unshare --uts true 2>&1 | head -1)"
    ip -n "$BRNS" link set lo up
    quiet_ns "$BRNS"
    if ! ip -n "$BRNS" link show br0 >/dev/null 2>&1; then
        ip -n "$BRNS" link add br0 type bridge stp_state 0 2>/dev/null \
            || die 4 "cannot create a bridge in $BRNS: $(ip -n "$BRNS" link add br0 type bridge 2>&1)"
    fi
    ip -n "$BRNS" link set br0 type bridge forward_delay 0 2>/dev/null || true
    ip -n "$BRNS" link set br0 up

    # Hosts beyond N from an earlier, bigger `up` go away: the cluster is exactly N.
    for i in $(existing_hosts); do
        if [ "$i" -ge "$n" ]; then remove_ns "$(host_ns "$i")"; fi
    done

    for ((i = 0; i < n; i++)); do
        ns=$(host_ns "$i"); ip=$(host_ip "$i")
        ns_exists "$ns" || ip netns add "$ns"
        ip -n "$ns" link set lo up
        quiet_ns "$ns"
        if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
            ip -n "$BRNS" link del "p$i" 2>/dev/null || true
            ip -n "$BRNS" link add "p$i" type veth peer name eth0 netns "$ns" 2>/dev/null \
                || die 4 "cannot create a veth pair: $(ip -n "$BRNS" link add "p$i" type veth peer name eth0 netns "$ns" 2>&1)"
        fi
        ip -n "$BRNS" link set "p$i" master br0
        ip -n "$BRNS" link set "p$i" up
        ip -n "$ns" addr flush dev eth0
        ip -n "$ns" addr add "$ip/24" dev eth0
        ip -n "$ns" link set eth0 up
        shape "$ns" eth0 "$delay"
        shape "$BRNS" "p$i" ""
    done

    # Every link is up at both ends (and, where ping exists, host 0 reaches every host).
    local ok ns0
    ns0=$(host_ns 0)
    for ((i = 0; i < n; i++)); do
        ok=0
        for _ in $(seq 1 20); do
            if [ "$(ip netns exec "$(host_ns "$i")" cat /sys/class/net/eth0/operstate 2>/dev/null)" = up ] &&
               [ "$(ip netns exec "$BRNS" cat "/sys/class/net/p$i/operstate" 2>/dev/null)" = up ]; then
                if ! command -v ping >/dev/null 2>&1 || [ "$i" -eq 0 ] ||
                   ip netns exec "$ns0" ping -c 1 -W 1 "$(host_ip "$i")" >/dev/null 2>&1; then
                    ok=1; break
                fi
            fi
            sleep 0.2
        done
        [ "$ok" = 1 ] || die 1 "link of $(host_ns "$i") ($(host_ip "$i")) did not come up on the bridge"
    done
}

do_status() {
    local hosts i ns
    hosts=$(existing_hosts)
    if [ -z "$hosts" ] && ! ns_exists "$BRNS"; then
        echo "down: no ${PREFIX}* namespaces"
        return 3
    fi
    echo "switch: namespace $BRNS $(ns_exists "$BRNS" && echo present || echo MISSING)"
    for i in $hosts; do
        ns=$(host_ns "$i")
        printf '%-6s %-12s ' "$ns" "$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | head -1)"
        printf 'tx %s rx %s bytes; ' \
            "$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null || echo ?)" \
            "$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null || echo ?)"
        printf 'up: %s; down: %s\n' \
            "$(tc -n "$ns" qdisc show dev eth0 2>/dev/null | grep -Eo '(tbf|netem) .*' | tr '\n' ' ' | sed 's/ *$//')" \
            "$(tc -n "$BRNS" qdisc show dev "p$i" 2>/dev/null | grep -Eo 'tbf .*' | head -1)"
    done
    echo "hosts: $(echo "$hosts" | wc -w)"
}

[ $# -ge 1 ] || usage
cmd=$1; shift
case "$cmd" in
up)
    [ $# -ge 1 ] || usage
    N=$1; shift
    [[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le "$MAX_HOSTS" ] || die 2 "N must be an integer in [1, $MAX_HOSTS], got '$N'"
    DELAY=""; RATE=1gbit
    while [ $# -gt 0 ]; do
        case "$1" in
        --latency) [ $# -ge 2 ] || usage; DELAY=$2; shift 2 ;;
        --latency=*) DELAY=${1#*=}; shift ;;
        --rate) [ $# -ge 2 ] || usage; RATE=$2; shift 2 ;;
        --rate=*) RATE=${1#*=}; shift ;;
        *) usage ;;
        esac
    done
    if [ -n "$DELAY" ]; then
        [[ $DELAY =~ ^[0-9]+([.][0-9]+)?$ ]] || die 2 "--latency takes milliseconds (a number >= 0), got '$DELAY'"
    fi
    preflight
    exec 9>"$LOCK"; flock 9
    # On failure or interrupt, take down everything (a half-made cluster is no use).
    trap 'rc=$?; trap - EXIT INT TERM; if [ $rc -ne 0 ]; then echo "cluster.sh: up failed, removing the cluster" >&2; do_down; fi; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    do_up "$N" "$DELAY"
    trap - EXIT INT TERM
    echo "up: $N hosts ${PREFIX}0..${PREFIX}$((N - 1)) at $(host_ip 0)..$(host_ip $((N - 1))), $RATE each way${DELAY:+, +${DELAY} ms one-way delay}"
    ;;
down)
    [ $# -eq 0 ] || usage
    preflight
    exec 9>"$LOCK"; flock 9
    trap '' INT TERM   # finish the teardown
    do_down
    rm -f "$LOCK"
    echo "down"
    ;;
status)
    [ $# -eq 0 ] || usage
    preflight
    do_status
    ;;
*) usage ;;
esac
