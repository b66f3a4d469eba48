#!/usr/bin/env bash
# Runs an emulated-device check under mpirun and passes when it exits 0 with
# one "PASS <name> rank" line per rank.
#   run_mpi.sh NP NAME PROGRAM [ARGS...]
set -u
np=$1 name=$2; shift 2
out=$(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca plm isolated --mca pml ob1 \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np "$np" "$@" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAILED $name: exit status $rc"; exit 1; }
got=$(echo "$out" | grep -c "^PASS $name rank")
[ "$got" -eq "$np" ] || { echo "FAILED $name: $got PASS lines, want $np"; exit 1; }
