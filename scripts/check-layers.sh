#!/usr/bin/env bash
# layout.includes: each folder of shim/ includes only its own files, the
# layers below it and include/dgcshim (docs/design.md, "Layers"):
#   mpi, nccl      their own, core, engine, wire (never each other)
#   engine, wire   their own, core
#   core           its own
# A quoted include without a folder must name a file of the includer's own
# folder. Prints each offending line; exit 1 when there is one.
set -u
cd "$(dirname "$0")/.." || exit 2
allowed() { # folder -> the folders it may include from
  case $1 in
    mpi|nccl) echo "core engine wire" ;;
    engine|wire) echo "core" ;;
    core) echo "" ;;
    *) echo "?" ;;
  esac
}
bad=0 n=0
for f in shim/*/*.c shim/*/*.h; do
  dir=$(basename "$(dirname "$f")")
  ok=$(allowed "$dir")
  [ "$ok" = "?" ] && { echo "$f: shim/$dir is not a known layer (check-layers.sh lists them)"; bad=$((bad + 1)); continue; }
  while IFS= read -r line; do
    inc=${line#*\"}; inc=${inc%%\"*}
    n=$((n + 1))
    case $inc in
      dgcshim/*) continue ;;
      */*)
        top=${inc%%/*}
        if [[ " $ok " != *" $top "* ]]; then
          echo "$f: includes $inc: shim/$dir may include from $([ -n "$ok" ] && echo "$ok and ")its own folder only"
          bad=$((bad + 1))
        elif [ ! -f "shim/$inc" ]; then
          echo "$f: includes $inc, which does not exist"; bad=$((bad + 1))
        fi ;;
      *)
        [ -f "shim/$dir/$inc" ] || { echo "$f: includes \"$inc\", not a file of shim/$dir"; bad=$((bad + 1)); } ;;
    esac
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f")
done
if [ "$bad" -gt 0 ]; then echo "FAIL layout.includes: $bad include(s) break the layers"; exit 1; fi
echo "PASS layout.includes: $n quoted includes in shim/ keep the layers"
