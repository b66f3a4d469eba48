#!/usr/bin/env bash
# Copies this Debian machine's Open MPI (runtime, mpicc and mpi.h: about
# 16 MB) into DIR as a relocatable tree, for a machine that has none (the GPU
# machine: scripts/gpu-carry.sh), and writes DIR/env.sh, which a shell sources
# to use it: PATH, LD_LIBRARY_PATH, OPAL_PREFIX (Open MPI finds its
# components, help files and wrapper data under it) and PMIx's component path.
# The files keep their Debian paths under DIR/root. Open MPI's Fortran, C++,
# Java and OpenSHMEM parts are left out. The tree needs a glibc at least as new
# as this machine's (libevent calls arc4random, glibc 2.36): env.sh's users
# check by running it (scripts/gpu-session.sh's env phase).
#
#   scripts/carry-openmpi.sh DIR
set -euo pipefail
dir=${1:?usage: carry-openmpi.sh DIR}
pkgs="openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7"
# shellcheck disable=SC2086
dpkg -s $pkgs >/dev/null 2>&1 || { echo "carry-openmpi.sh: needs Debian's $pkgs (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir/root"
dir=$(cd "$dir" && pwd)
# shellcheck disable=SC2086
dpkg -L $pkgs | grep -Ev '/man/|/doc/|lintian|\.a$|java|fortran|\.mod$|/cmake/|/pkgconfig|oshmem|/mca_spml|/mca_sshmem|/mca_scoll|/mca_atomic|/osh|mpif|usempi|mpi_cxx|mpic\+\+|mpiCC|mpicxx' |
  while read -r f; do
    if [ -L "$f" ] || [ -f "$f" ]; then
      mkdir -p "$dir/root$(dirname "$f")"
      cp -a "$f" "$dir/root$f"
    fi
  done
# Debian reaches the commands through /etc/alternatives: plain names here.
for c in mpicc mpirun mpiexec; do ln -sf "$c.openmpi" "$dir/root/usr/bin/$c"; done
cat >"$dir/env.sh" <<'ENV'
# Sourced to use the Open MPI copied here by scripts/carry-openmpi.sh.
_dgc_ompi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/root
export OPAL_PREFIX=$_dgc_ompi/usr
export PATH=$_dgc_ompi/usr/bin:$PATH
export LD_LIBRARY_PATH=$_dgc_ompi/usr/lib/x86_64-linux-gnu:$_dgc_ompi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PMIX_MCA_mca_base_component_path=$_dgc_ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
unset _dgc_ompi
ENV
echo "carry-openmpi.sh: $(du -sh "$dir" | cut -f1) in $dir (source $dir/env.sh to use it)"
