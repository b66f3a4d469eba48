#!/usr/bin/env bash
# An Open MPI launch agent (--mca plm_rsh_agent) for the emulated cluster of
# cluster.sh: `rsh_netns.sh [ssh-style options] HOST command...` runs the
# command inside the network namespace of HOST, the way ssh runs it on a
# remote machine.
#
# HOST is 10.77.0.(10+i), dgc<i> or user@either; it maps to namespace dgc<i>.
# Anything else is refused (exit 255, as ssh does for an unknown host): the
# agent never runs a command outside the cluster's namespaces.
#
# How Open MPI 4.1's rsh launcher calls it (plm_rsh_module.c): the agent's
# argv, then any plm_rsh_args (and `-x` only when the agent is called
# "ssh"), then the node name exactly as in the hostfile, then the orted
# command line as separate words that were quoted for a remote shell, e.g.
#   rsh_netns.sh 10.77.0.11 PATH=/usr/bin:$PATH ; export PATH ; ... /usr/bin/orted -mca ess "env" ...
# So, like ssh, the words are joined with spaces and run by the user's login
# shell (Open MPI builds the prefix for that shell: plm_rsh_assume_same_shell).
#
# The command runs in its own UTS namespace with hostname dgc<i>: every
# "host" then has its own name, as real hosts do; Open MPI's session
# directories (/tmp/ompi.<hostname>.<uid>) and log lines (the shim's
# "host:pid rank") stay apart.
#
# DGC_NETNS_AGENT_LOG=<file> appends each invocation's argv to that file.
set -euo pipefail

PREFIX=dgc
SUBNET=10.77.0
HOST_BASE=10

[ -n "${DGC_NETNS_AGENT_LOG:-}" ] && printf '%s\n' "$(date +%T.%N) rsh_netns.sh $*" >>"$DGC_NETNS_AGENT_LOG"

# ssh-style options before the host: flags, and options that take an argument.
while [ $# -gt 0 ]; do
    case "$1" in
    --) shift; break ;;
    -[bcDEeFIiJLlmOopQRSWw]) shift; [ $# -gt 0 ] && shift ;;  # option with an argument
    -[bcDEeFIiJLlmOopQRSWw]?*) shift ;;                     # ... attached (-p22, -oFoo=bar)
    -*) shift ;;                                            # flags: -x -X -T -t -n -q -4 -6 ...
    *) break ;;
    esac
done
[ $# -ge 1 ] || { echo "rsh_netns.sh: usage: rsh_netns.sh [options] HOST command..." >&2; exit 255; }
host=${1#*@}; shift

idx=""
if [[ $host =~ ^${PREFIX}([0-9]+)$ ]]; then
    idx=${BASH_REMATCH[1]}
elif [[ $host =~ ^${SUBNET//./\\.}\.([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge "$HOST_BASE" ]; then
    idx=$((BASH_REMATCH[1] - HOST_BASE))
fi
ns=$PREFIX${idx}
if [ -z "$idx" ] || [ ! -e "/run/netns/$ns" ]; then
    echo "rsh_netns.sh: $host is not a host of the emulated cluster (no namespace ${ns:-for it}; is 'cluster.sh up' done?)" >&2
    exit 255
fi
[ $# -ge 1 ] || { echo "rsh_netns.sh: no command for $host (interactive logins are not supported)" >&2; exit 255; }

shell=$(getent passwd "$(id -un)" 2>/dev/null | cut -d: -f7)
[ -x "${shell:-}" ] || shell=/bin/sh

# ip netns exec: network namespace (and /sys) of the host; unshare --uts: its own
# hostname; then the login shell parses the joined command, as sshd would do.
exec ip netns exec "$ns" unshare --uts /bin/sh -c \
    'echo "$1" > /proc/sys/kernel/hostname && shell=$2 && shift 2 && exec "$shell" -c "$*"' \
    rsh_netns "$ns" "$shell" "$@"
