#!/usr/bin/env bash
# Runs one integration case: allreduce_check under a real mpirun with
# libdgcshim.so preloaded, and checks its exit status and output.
#
#   run_case.sh [-n NP] [-e VAR=VALUE]... [--split VAR=A,B] [--fail REGEX]
#               [--grep REGEX] [--times N REGEX] [--check PROGRAM] [--btl LIST]
#               [--asan OPTIONS] -- ARGS...
#
# -e exports a variable to every rank (mpirun -x). --split gives the first
# half of the ranks VAR=A and the second half VAR=B (two app contexts).
# --fail: the job must fail, within the time limit, with REGEX in its output
# (and --times, if given, holds as well).
# --grep: the job must pass with REGEX in its output (extended regex; may be
# given several times, each must match). --times: exactly N lines of the
# output match REGEX. --btl: Open MPI's transports (default self,vader;
# spawned jobs reach their parents over tcp only). --asan: more ASan options
# for the sanitizer build (e.g. quarantine_size_mb=0 where a case needs
# freed memory back at once); ignored otherwise.
# Environment: SHIM and CHECK (paths), DGC_SANITIZE (ON: preload ASan first),
# MPI_FAMILY (openmpi, the default, or mpich: the launcher's dialect) and
# MPIEXEC (the launcher: mpirun for Open MPI, mpiexec.mpich for MPICH),
# CASE_TIMEOUT (seconds before a job counts as hung, 120).
set -u
np=4; envs=(); split=""; fail_re=""; greps=(); times=(); btl=self,vader; asan_extra=""; check="${CHECK:?CHECK unset}"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) np=$2; shift 2 ;;
    -e) envs+=("$2"); shift 2 ;;
    --split) split=$2; shift 2 ;;
    --fail) fail_re=$2; shift 2 ;;
    --grep) greps+=("$2"); shift 2 ;;
    --times) times+=("$2" "$3"); shift 3 ;;
    --check) check=$2; shift 2 ;;
    --btl) btl=$2; shift 2 ;;
    --asan) asan_extra=":$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run_case.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

preload="${SHIM:?SHIM unset}"
if [ "${DGC_SANITIZE:-OFF}" = "ON" ]; then
  # An instrumented library under an uninstrumented program: the ASan runtime
  # must come first. Open MPI's own allocations are not ours to leak-check.
  preload="$(gcc -print-file-name=libasan.so) $preload"
  envs+=("ASAN_OPTIONS=detect_leaks=0:abort_on_error=1$asan_extra" "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
fi
envs+=("LD_PRELOAD=$preload")

# Each variable goes to every rank: Open MPI's mpirun -x VAR=VALUE, MPICH's
# hydra -genv VAR VALUE (-env within one app context). --btl is Open MPI's.
family=${MPI_FAMILY:-openmpi}
case "$family" in
  openmpi)
    mpi=("${MPIEXEC:-mpirun}" --allow-run-as-root --oversubscribe --bind-to none --mca btl "$btl"
         --mca rmaps_base_oversubscribe 1)
    ctx() { echo -x "$1"; } ;;
  mpich)
    mpi=("${MPIEXEC:-mpiexec.mpich}")
    ctx() { echo -env "${1%%=*}" "${1#*=}"; } ;;
  *) echo "run_case.sh: MPI_FAMILY=$family: openmpi or mpich" >&2; exit 2 ;;
esac
xs=()
for e in "${envs[@]}"; do
  if [ "$family" = openmpi ]; then xs+=(-x "$e"); else xs+=(-genv "${e%%=*}" "${e#*=}"); fi
done
# mpirun -x VAR=VALUE sets and exports; it must see the value in its own env too
for e in "${envs[@]}"; do export "${e?}"; done
unset LD_PRELOAD  # the launcher itself runs without the shim; it hands it to the ranks

if [ -n "$split" ]; then
  var=${split%%=*}; vals=${split#*=}; a=${vals%%,*}; b=${vals#*,}
  half=$((np / 2))
  read -ra ca <<<"$(ctx "$var=$a")"; read -ra cb <<<"$(ctx "$var=$b")"
  if [ "$family" = openmpi ]; then
    # -x belongs to an app context: each context gets the common ones again
    cmd=("${mpi[@]}" "${xs[@]}" -np "$half" "${ca[@]}" "$check" "$@"
         : "${xs[@]}" -np "$((np - half))" "${cb[@]}" "$check" "$@")
  else
    # hydra: -genv is global, -env belongs to the context it is in
    cmd=("${mpi[@]}" "${xs[@]}" -n "$half" "${ca[@]}" "$check" "$@"
         : -n "$((np - half))" "${cb[@]}" "$check" "$@")
  fi
else
  cmd=("${mpi[@]}" "${xs[@]}" -n "$np" "$check" "$@")
fi

out=$(mktemp); trap 'rm -f "$out"' EXIT
echo "+ ${cmd[*]}"
timeout "${CASE_TIMEOUT:-120}" "${cmd[@]}" >"$out" 2>&1
rc=$?
cat "$out"
# What the job said, by rank, so that a failure tells a lost line (a rank
# that printed nothing) from a wrong one: the shim tags each of its lines
# "rank R[ job J| spawned] dgcshim LEVEL".
echo "+ job exit status $rc; the shim's lines by rank:"
for ((r = 0; r < np; r++)); do
  tags=$(grep -Eo -- " rank $r( job [0-9]+| spawned)? dgcshim [A-Z]+" "$out" | awk '{print $NF}' | sort | uniq -c |
         awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')
  echo "+   rank $r: ${tags:-nothing}"
done
echo "+   other lines: $(grep -Evc -- " rank [0-9]+( job [0-9]+| spawned)? dgcshim [A-Z]+" "$out")"
if [ $rc -eq 124 ]; then echo "CASE FAILED: timed out (a hang)"; exit 1; fi
check_times() {
  for ((i = 0; i < ${#times[@]}; i += 2)); do
    got=$(grep -Ec -- "${times[i+1]}" "$out")
    [ "$got" -eq "${times[i]}" ] || { echo "CASE FAILED: /${times[i+1]}/ matches $got lines, want ${times[i]}"; exit 1; }
  done
}
if [ -n "$fail_re" ]; then
  [ $rc -ne 0 ] || { echo "CASE FAILED: the job succeeded but should have failed"; exit 1; }
  grep -Eq -- "$fail_re" "$out" || { echo "CASE FAILED: output lacks /$fail_re/"; exit 1; }
  check_times
  echo "CASE PASSED: failed as expected with /$fail_re/"; exit 0
fi
[ $rc -eq 0 ] || { echo "CASE FAILED: exit status $rc"; exit 1; }
for re in "${greps[@]}"; do
  grep -Eq -- "$re" "$out" || { echo "CASE FAILED: output lacks /$re/"; exit 1; }
done
check_times
echo "CASE PASSED"
