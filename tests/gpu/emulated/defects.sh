#!/usr/bin/env bash
# emulated.defects: are the emulated device's defects still there, and do
# compat.h's workarounds give CUDA's results? One line per defect:
#   present <name>   the defect shows; its workaround in compat.h is needed
#   GONE <name>      this chipStar fixed it: drop the workaround (the test fails,
#                    so that the dead workaround is noticed)
#   BROKEN <name>    the workaround does not give CUDA's result (the test fails)
#
#   defects.sh CUCC DEFECTS_RAW DEFECTS_COMPAT BALLOT_RAW SOURCE_DIR
# The run-time programs are built by CMake; the compile- and link-time
# defects are compiled here, plainly (no compat.h, no CUB stand-in).
set -u
cucc=$1 raw=$2 compat=$3 ballot=$4 dir=$5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad=0
say() { printf '%-8s %s\n' "$1" "$2"; case $1 in GONE|BROKEN) bad=$((bad + 1)) ;; esac; }

# Facilities chipStar lacks: the section must not compile.
for d in ANY_SYNC MATCH_ANY_SYNC LDCG_PLAIN BF16_RN BF16_RAW CUB; do
  name=missing_$(echo "$d" | tr 'A-Z' 'a-z')
  if "$cucc" -std=c++17 -DMISSING_$d -c "$dir/defects/missing.cu" -o "$tmp/m.o" >"$tmp/m.log" 2>&1; then
    say GONE "$name: compiles now"
  else
    say present "$name: $(grep -m1 -o 'error: .*' "$tmp/m.log" | cut -c1-110)"
  fi
done

# Two objects that include cuda_bf16.h: the link must fail without the flag.
"$cucc" -std=c++17 -DBF16_TWICE=1 -c "$dir/defects/missing.cu" -o "$tmp/a.o" >/dev/null 2>&1 &&
  "$cucc" -std=c++17 -DBF16_TWICE=2 -c "$dir/defects/missing.cu" -o "$tmp/b.o" >/dev/null 2>&1 ||
  { echo "FAIL emulated.defects: cannot compile defects/missing.cu (BF16_TWICE)"; exit 1; }
if "$cucc" "$tmp/a.o" "$tmp/b.o" -o "$tmp/ab" >"$tmp/ab.log" 2>&1; then
  say GONE "bf16_multiple_definitions: two objects with cuda_bf16.h link"
else
  say present "bf16_multiple_definitions: $(grep -m1 -o 'multiple definition of .*' "$tmp/ab.log" | cut -c1-90)"
fi

# The JIT's abort on __ballot_sync.
# (in a shell of its own, whose "Aborted" line goes nowhere)
rc=$(bash -c '"$0" >"$1" 2>&1; echo $?' "$ballot" "$tmp/ballot.log" 2>/dev/null)
if [ $rc -eq 0 ]; then
  say GONE "ballot_crashes_jit: $(cat "$tmp/ballot.log")"
elif grep -q "sub_group_ballot" "$tmp/ballot.log"; then
  say present "ballot_crashes_jit: exit $rc, $(grep -m1 -o 'Scalar sub_group_ballot.*' "$tmp/ballot.log")"
else
  echo "FAIL emulated.defects: the ballot program failed (exit $rc) in another way:"; cat "$tmp/ballot.log"; exit 1
fi

# Run-time defects, plain and with compat.h.
"$raw" >"$tmp/raw.log" 2>&1 || { echo "FAIL emulated.defects: defects_raw failed:"; cat "$tmp/raw.log"; exit 1; }
"$compat" >"$tmp/compat.log" 2>&1 || { echo "FAIL emulated.defects: defects_compat failed:"; cat "$tmp/compat.log"; exit 1; }
while read -r verdict rest; do
  case $verdict in
    wrong) say present "$rest" ;;
    right) say GONE "$rest" ;;
  esac
done <"$tmp/raw.log"
while read -r verdict rest; do
  case $verdict in
    right) say ok "with compat.h: $rest" ;;
    wrong) say BROKEN "with compat.h: $rest" ;;
  esac
done <"$tmp/compat.log"

if [ $bad -gt 0 ]; then
  echo "FAIL emulated.defects: $bad line(s) GONE or BROKEN (see compat.h, each block under the defect's name)"
  exit 1
fi
echo "PASS emulated.defects: every defect compat.h covers is still there, and each workaround gives CUDA's result"
