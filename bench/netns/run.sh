#!/usr/bin/env bash
# Run an MPI job on the emulated cluster, one rank per host (network namespace)
# by default, or L ranks per host.
#
#   run.sh [--ppn L] N [mpirun options...] -- command [args...]
#
# --ppn L (or RANKS_PER_HOST=L in the environment; also accepted among the
# options after N; the option wins over the variable): L ranks on each of the
# N hosts, N*L ranks in all, consecutive ranks on one host (ranks 0..L-1 on
# dgc0, L..2L-1 on dgc1, ...: hostfile slots=L, --map-by slot). The ranks of one
# host talk to each other over TCP on their namespace's lo (btl tcp,self, no
# vader: shared memory between ranks of several namespaces, which share one
# /dev/shm, was seen to crash), so that traffic is neither shaped nor counted
# in eth0's counters, like traffic inside a real node that never reaches its
# card. MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) gives one node per host
# (each namespace has its own orted). NETNS_BTL=tcp,vader,self (Open MPI only;
# default tcp,self) lets the ranks of one host use shared memory instead, for
# experiments: vader then connects only the ranks of one namespace (one orted),
# eth0's counters stay the same, and it ran cleanly here at 4x2 and 2x4 with
# one hostname per namespace, but it was seen to crash before, so it is not
# the default. Under MPICH: -ppn L; MPICH with L > 1 is refused: its ranks of
# one host hung in MPI_Finalize with UCX_TLS=tcp,self, and UCX_TLS with sm let
# ranks of different hosts talk through /dev/shm (no bytes on eth0).
#
# Needs `cluster.sh up M` with M >= N first. Options before `--` go to mpirun
# (e.g. -x LD_PRELOAD=/abs/libdgcshim.so -x DGC_STATS=1); the command must be
# an absolute path or on PATH (it runs from the current directory, which all
# "hosts" share). MPI_FAMILY=mpich runs it with MPICH's hydra instead
# (MPIEXEC, default mpiexec.mpich), through the same agent; its options then
# are -x VAR=VALUE only, passed on as -genv.
#
# How it launches, and why:
#  * mpirun itself runs inside dgc0 (host 0), not in the root namespace. Its
#    out-of-band channel (oob_tcp_if_include 10.77.0.0/24) must listen on an
#    address the orteds can reach, and the root namespace has no address on the
#    cluster's bridge (by design: nothing touches the host's interfaces). In
#    dgc0, mpirun owns 10.77.0.10, sees that this hostfile entry is local, and
#    starts rank 0 itself, like mpirun on the first node of a real cluster.
#  * Every other host gets its orted through rsh_netns.sh (plm_rsh_agent),
#    which runs it under `ip netns exec dgc<i>` (this works from inside dgc0:
#    ip netns exec switches by the /run/netns/<name> handle, not relative to the
#    caller's namespace). plm_rsh_no_tree_spawn: mpirun launches every orted
#    itself, instead of orteds launching orteds.
#  * The hostfile names hosts by IP address (10.77.0.1x), so no name needs
#    resolving and /etc/hosts stays as it is; orte_keep_fqdn_hostnames keeps
#    Open MPI from cutting "10.77.0.11" at the first dot into "10".
#  * Every namespace has its own hostname (dgc<i>, set in a private UTS
#    namespace), so each orted has its own session directory in /tmp.
#  * pml ob1 + btl tcp,self: MPI traffic goes over TCP on eth0 only (UCX would
#    use shared memory between the "hosts", which are on one machine).
#  * --bind-to none: each orted sees the whole machine as its own node and would
#    bind every rank to core 0.
#
# The job's exit status is mpirun's. Ctrl-C stops mpirun, which stops the job.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
AGENT=$HERE/rsh_netns.sh
PREFIX=dgc
SUBNET=10.77.0
HOST_BASE=10

die() { local rc=$1; shift; echo "run.sh: $*" >&2; exit "$rc"; }
USAGE="usage: run.sh [--ppn L] N [mpirun options...] -- command [args...]"
PPN=${RANKS_PER_HOST:-1}
while [ $# -gt 0 ]; do
    case "$1" in
    --ppn) [ $# -ge 2 ] || die 2 "$USAGE"; PPN=$2; shift 2 ;;
    --ppn=*) PPN=${1#*=}; shift ;;
    *) break ;;
    esac
done
[ $# -ge 3 ] || die 2 "$USAGE"
N=$1; shift
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] || die 2 "N must be a positive integer, got '$N'"
mpi_opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
    --ppn) [ $# -ge 2 ] && [ "$2" != "--" ] || die 2 "$USAGE"; PPN=$2; shift 2 ;;
    --ppn=*) PPN=${1#*=}; shift ;;
    *) mpi_opts+=("$1"); shift ;;
    esac
done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || die 2 "$USAGE"
shift
[[ $PPN =~ ^[0-9]+$ ]] && [ "$PPN" -ge 1 ] || die 2 "ranks per host (--ppn / RANKS_PER_HOST) must be a positive integer, got '$PPN'"
NP=$((N * PPN))

[ "$(id -u)" -eq 0 ] || die 4 "needs root (ip netns exec)"
for ((i = 0; i < N; i++)); do
    [ -e "/run/netns/$PREFIX$i" ] || die 4 "host $PREFIX$i does not exist: run '$HERE/cluster.sh up $N' first"
done
family=${MPI_FAMILY:-openmpi}
case "$family" in
  openmpi) command -v mpirun >/dev/null 2>&1 || die 4 "mpirun (Open MPI) is not installed" ;;
  mpich) command -v "${MPIEXEC:-mpiexec.mpich}" >/dev/null 2>&1 || die 4 "${MPIEXEC:-mpiexec.mpich} (MPICH) is not installed"
         [ "$PPN" -eq 1 ] || die 2 "MPI_FAMILY=mpich runs one rank per host only (--ppn $PPN: its ranks of one host hung in MPI_Finalize over TCP, and UCX's sm transport crosses the namespaces)" ;;
  *) die 2 "MPI_FAMILY=$family: openmpi or mpich" ;;
esac

tmp=$(mktemp -d /tmp/dgcnetns-run.XXXXXX)
mpipid=""
cleanup() {
    [ -n "$mpipid" ] && kill -TERM "$mpipid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

hostfile=$tmp/hostfile
hosts=""
for ((i = 0; i < N; i++)); do
    echo "$SUBNET.$((HOST_BASE + i)) slots=$PPN"
    hosts+="${hosts:+,}$SUBNET.$((HOST_BASE + i))"
done >"$hostfile"

if [ "$family" = openmpi ]; then
    # Run as root inside the namespaces: allow it for mpirun and the orteds.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # One rank a host: --map-by node as always. L ranks a host: fill each host's
    # L slots before the next (consecutive ranks per host).
    map_by=node
    [ "$PPN" -eq 1 ] || map_by=slot
    launcher=(mpirun --allow-run-as-root
        --hostfile "$hostfile" -np "$NP" --map-by "$map_by" --bind-to none
        --mca plm rsh
        --mca plm_rsh_agent "$AGENT"
        --mca plm_rsh_no_tree_spawn 1
        --mca orte_keep_fqdn_hostnames 1
        --mca oob_tcp_if_include "$SUBNET.0/24"
        --mca pml ob1 --mca btl "${NETNS_BTL:-tcp,self}"
        --mca btl_tcp_if_include "$SUBNET.0/24"
        --mca osc '^ucx'
        "${mpi_opts[@]}")
else
    # MPICH's hydra: the same agent as its rsh launcher, PPN ranks a host; UCX
    # over TCP on the hosts' eth0 (the shaped veth), never shared memory
    # between the namespaces. mpirun's -x VAR=VALUE options become -genv.
    genv=()
    for ((i = 0; i < ${#mpi_opts[@]}; i++)); do
        case "${mpi_opts[i]}" in
          -x) kv=${mpi_opts[i + 1]}; genv+=(-genv "${kv%%=*}" "${kv#*=}"); i=$((i + 1)) ;;
          *) die 2 "under MPICH only -x VAR=VALUE options are understood, not '${mpi_opts[i]}'" ;;
        esac
    done
    launcher=("${MPIEXEC:-mpiexec.mpich}" -launcher rsh -launcher-exec "$AGENT" -hosts "$hosts" -ppn "$PPN" -n "$NP"
        -genv UCX_NET_DEVICES eth0 -genv UCX_TLS tcp,self ${genv[@]+"${genv[@]}"})
fi

set +e
ip netns exec "${PREFIX}0" unshare --uts /bin/sh -c 'echo "$1" > /proc/sys/kernel/hostname && shift && exec "$@"' \
    run "${PREFIX}0" "${launcher[@]}" "$@" &
mpipid=$!
wait "$mpipid"
rc=$?
mpipid=""
set -e
exit "$rc"
