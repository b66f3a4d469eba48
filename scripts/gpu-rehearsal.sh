#!/usr/bin/env bash
# shellcheck disable=SC2317 # env_check and nccl_cases run through bash -c (export -f)
# Rehearses, on this machine (no GPU), what the GPU session does on a machine
# without MPI: with every MPI of this machine hidden (a private mount
# namespace: unshare --mount, as root; the system is untouched outside it),
#   env     the Open MPI that scripts/gpu-carry.sh carries (.gpu/openmpi)
#           starts 2 ranks of a program built with its mpicc;
#   build   scripts/test-gpu.sh --build-only (in build-rehearsal, from
#           scratch): the GPU build with MPI hidden
#           (the NCCL front end alone, libdgcshim-nccl.so, which the DDP and
#           engine checks preload) and the second build, against the carried
#           Open MPI, of what the gpu.nccl cases need;
#   plan    scripts/gpu-session.sh --list: each phase's checks, in order;
#   nccl    gpu.nccl cases on the emulated device (scripts/test-emulated.sh's
#           build, default build-emulated), launched by the carried mpirun
#           with the carried libraries;
# each step under a cap, all under one deadline (540 s, as the session's).
# What needs a GPU (the engine's cases on a GPU, DDP under torchrun, the
# benchmark, compute-sanitizer) is not rehearsed, and it says so.
#
#   scripts/gpu-rehearsal.sh [--emulated DIR] [--deadline S] [--cases REGEX]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
emulated=build-emulated deadline=540
cases='^gpu\.nccl\.(ddp_shape_bf16|ddp_shape_fresh_auto|abort_thread|nonblocking_late)$'
inside=0
while [ $# -gt 0 ]; do
  case "$1" in
    --emulated) emulated=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --inside) inside=1; shift ;;
    *) echo "gpu-rehearsal.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ "$inside" = 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "gpu-rehearsal.sh: needs root (a mount namespace hides MPI)"; exit 2; }
  scripts/gpu-carry.sh --mpi-only || exit 1
  exec unshare --mount --propagation private "$0" --inside --emulated "$emulated" --deadline "$deadline" --cases "$cases"
fi

# Every MPI of this machine out of sight: its directories emptied, its
# libraries and commands read as empty files.
empty=$(mktemp -d)
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/mpich /usr/share/openmpi /usr/share/mpich \
         /etc/openmpi /etc/mpich /usr/lib/x86_64-linux-gnu/pmix2 /usr/include/x86_64-linux-gnu/mpich \
         /usr/include/x86_64-linux-gnu/openmpi; do
  [ -d "$d" ] && mount --bind "$empty" "$d"
done
for f in /usr/lib/x86_64-linux-gnu/libmpi.so.* /usr/lib/x86_64-linux-gnu/libmpich*.so.* \
         /usr/lib/x86_64-linux-gnu/libopen-rte.so.* /usr/lib/x86_64-linux-gnu/libopen-pal.so.* \
         /usr/lib/x86_64-linux-gnu/libpmix.so.* /usr/bin/mpi* /usr/bin/orte* /usr/bin/orted /usr/bin/ompi* \
         /usr/bin/opal* /usr/bin/hydra*; do
  [ -f "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"
done
start=$SECONDS status=0 summary=()
left() { echo $((deadline - (SECONDS - start))); }
step() { # name cap command...: under the smaller of its cap and what the deadline leaves
  local name=$1 cap=$2; shift 2
  local limit; limit=$(left); [ "$limit" -lt "$cap" ] || limit=$cap
  if [ "$limit" -lt 10 ]; then summary+=("$name: NOT RUN (deadline)"); status=1; return; fi
  echo "=== $name (up to $limit s; $((SECONDS - start)) s gone)"
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@"; local rc=$?
  local v="passed"; [ "$rc" = 0 ] || { v="FAILED (exit $rc)"; status=1; }
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && v="CUT at $limit s"
  summary+=("$name: $v after $((SECONDS - t0)) s")
}

env_check() {
  if mpirun --version >/dev/null 2>&1 || mpicc --version >/dev/null 2>&1; then echo "an MPI still runs"; return 1; fi
  echo "no MPI runs here; $(ldd --version | head -n 1)"
  # shellcheck disable=SC1091
  . .gpu/openmpi/env.sh
  mpirun --version | head -n 1
  local d; d=$(mktemp -d)
  printf '%s\n' '#include <mpi.h>' '#include <stdio.h>' \
    'int main(int c, char **v) { int r, n, s; MPI_Init(&c, &v); MPI_Comm_rank(MPI_COMM_WORLD, &r);' \
    '  MPI_Comm_size(MPI_COMM_WORLD, &n); MPI_Allreduce(&r, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);' \
    '  printf("rank %d of %d: sum %d\n", r, n, s); MPI_Finalize(); return s != n * (n - 1) / 2; }' >"$d/hello.c"
  mpicc "$d/hello.c" -o "$d/hello" &&
    mpirun --allow-run-as-root --oversubscribe --mca plm isolated --mca pml ob1 --mca btl self,vader \
      --mca btl_vader_single_copy_mechanism none -np 2 "$d/hello"
}

# The emulated cases with the carried Open MPI: each case's own command and
# environment from ctest, its LD_LIBRARY_PATH after the carried libraries.
nccl_cases() {
  [ -f "$emulated/CTestTestfile.cmake" ] || { echo "no emulated build in $emulated (scripts/test-emulated.sh)"; return 1; }
  # shellcheck disable=SC1091
  . .gpu/openmpi/env.sh
  (cd "$emulated" && ctest --show-only=json-v1) | CASES=$cases /usr/bin/python3 -c '
import json, os, re, subprocess, sys
tests = [t for t in json.load(sys.stdin)["tests"] if re.search(os.environ["CASES"], t["name"])]
bad = 0
for t in tests:
    env = dict(os.environ)
    for p in t.get("properties", []):
        if p["name"] == "ENVIRONMENT":
            for kv in p["value"]:
                k, v = kv.split("=", 1)
                env[k] = v + ":" + os.environ["LD_LIBRARY_PATH"] if k == "LD_LIBRARY_PATH" else v
    r = subprocess.run(t["command"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = [l for l in r.stdout.splitlines() if l.startswith("CASE ")]
    print(("PASS " if r.returncode == 0 else "FAIL ") + t["name"] + ": " + (last[-1] if last else "exit %d" % r.returncode))
    if r.returncode:
        bad += 1
        print("\n".join(r.stdout.splitlines()[-20:]))
print("%d of %d cases passed with the carried Open MPI" % (len(tests) - bad, len(tests)))
sys.exit(1 if bad or not tests else 0)'
}

export -f env_check nccl_cases
export cases emulated
step env 60 bash -c env_check
rm -rf build-rehearsal build-rehearsal-mpi # from scratch, as on a bare machine
step build 420 env DGC_GPU_BUILD=build-rehearsal scripts/test-gpu.sh --build-only
step plan 60 env DGC_GPU_BUILD=build-rehearsal scripts/gpu-session.sh --list --out build-rehearsal/session \
  env engine ddp nccl bench nccl_rest watchdog sanitizers
step nccl 300 bash -c nccl_cases
echo "=== rehearsal ($((SECONDS - start)) s of $deadline)"
printf '%s\n' "${summary[@]}"
echo "not rehearsed (they need a GPU): the engine's cases on a GPU, DDP under torchrun, the benchmark, compute-sanitizer"
exit "$status"
