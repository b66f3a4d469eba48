#!/usr/bin/env bash
# mpi.abi_mismatch: the shim preloaded into a program of the other MPI
# family (Open MPI's ABI against MPICH's) stops it with a message naming
# both libraries and the build that fits, instead of letting its MPI calls
# go wrong: at load when the program is linked with that MPI, at MPI_Init
# when it loads it later (as mpi4py does).
#
#   abi_mismatch.sh SHIM FOREIGN_MPICC
# Environment: DGC_SANITIZE (ON: the ASan runtime preloaded first).
set -u
shim=$1 mpicc=$2
preload=$shim
if [ "${DGC_SANITIZE:-OFF}" = ON ]; then
  preload="$(gcc -print-file-name=libasan.so) $shim"
  export ASAN_OPTIONS=detect_leaks=0
fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
src=$(dirname "$0")/abi_probe.c
"$mpicc" -DPROBE_LINKED -o "$dir/linked" "$src" || { echo "FAIL: $mpicc cannot build the probe"; exit 1; }
cc -o "$dir/late" "$src" -ldl || { echo "FAIL: cc cannot build the probe"; exit 1; }
lib=$(ldd "$dir/linked" | awk '/lib(mpi|mpich)\.so/ {print $3; exit}')
[ -n "$lib" ] || { echo "FAIL: the probe links no libmpi/libmpich"; exit 1; }
want='dgcshim ERROR this process uses .* but this libdgcshim was built for .*: two MPI ABIs in one process cannot work'
bad=0
check() { # label, command...
  local label=$1; shift
  local out rc
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LD_PRELOAD="$preload" timeout 60 "$@" 2>&1); rc=$?
  echo "+ LD_PRELOAD=$shim $* (exit $rc)"; echo "$out" | head -5
  if [ $rc -ne 0 ] && grep -Eq -- "$want" <<<"$out" && grep -q -- "Stopping at $label" <<<"$out" &&
     ! grep -q REACHED <<<"$out"; then
    echo "ok: stopped at $label with the message"
  else
    echo "FAIL: the $label case did not stop with /$want/ at $label"; bad=1
  fi
}
check load "$dir/linked"
check MPI_Init "$dir/late" dlopen "$lib"
[ $bad = 0 ] && echo "PASS mpi.abi_mismatch ($mpicc's $lib)"
exit $bad
