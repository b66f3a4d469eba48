#!/usr/bin/env bash
# PyTorch DDP on GPUs, dense against dgcshim: runs ld_preload_examples/ddp_train.py
# twice with torchrun on the same ranks, data and seed, first with no shim, then
# under LD_PRELOAD=build/libdgcshim.so (DGC_STATS=1, DGC_LOG_LEVEL=info), and
# prints a table: test accuracy, time per step, whether every rank ended with
# the same parameters (SHA-256), and the shim's DGC_STATS lines (one per bucket).
#
#   scripts/ddp_side_by_side.sh [--nproc N] [--epochs E] [--batch-size B] [--out DIR]
#                               [--data DIR | --synthetic] [--skip-dense] [-- more trainer options]
#
#   --nproc N       ranks on this node (default 2; with fewer GPUs than ranks they share cuda:0)
#   --epochs E      epochs (default 3)
#   --batch-size B  per-rank batch (default 64)
#   --out DIR       logs and the table (default bench/results/ddp)
#   --data DIR      Fashion-MNIST IDX .gz files (default /usr/share/datasets/fashion-mnist)
#   --synthetic     random data of the same shape instead
#   --skip-dense    only the run under the shim
#
# Environment:
#   PYTHON          interpreter with PyTorch (default python3); the launcher is torchrun when
#                   PYTHON is unset and torchrun is on PATH, else $PYTHON -m torch.distributed.run
#   DGC_SHIM        the shim (default build/libdgcshim.so)
#   NCCL_PRELOAD    a libnccl.so.2 to preload in both runs, after the shim (default
#                   .gpu/nccl/libnccl.so.2 when it exists: NCCL 2.30+ lets two ranks share one
#                   GPU with NCCL_MULTI_RANK_GPU_ENABLE=1, which this script sets unless given)
#   DGC_MOMENTUM    (default 0.9, the trainer's SGD momentum), DGC_WARMUP_STEPS (default one
#                   epoch of steps), and any other DGC_* variable: passed to the shim run
#   RUN_TIMEOUT     seconds allowed per run (default 300)
#
# Exit status: 0 when both runs finished and each ended with identical parameters on
# every rank, and the shim compressed calls and logged no error; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

nproc=2 epochs=3 batch=64 out=bench/results/ddp data="" synthetic=0 skip_dense=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) nproc=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --synthetic) synthetic=1; shift ;;
    --skip-dense) skip_dense=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ddp_side_by_side.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
for v in nproc epochs batch; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "ddp_side_by_side.sh: --${v/batch/batch-size} wants a positive integer" >&2; exit 2; }
done

python=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && command -v torchrun >/dev/null; then launcher=(torchrun)
else launcher=("$python" -m torch.distributed.run); fi
shim=${DGC_SHIM:-$PWD/build/libdgcshim.so}
[ -f "$shim" ] || { echo "ddp_side_by_side.sh: no shim at $shim (build it: cmake -S . -B build && cmake --build build -j)" >&2; exit 2; }
shim=$(realpath "$shim")
if [ -z "${NCCL_PRELOAD+x}" ] && [ -f .gpu/nccl/libnccl.so.2 ]; then NCCL_PRELOAD=$PWD/.gpu/nccl/libnccl.so.2; fi
nccl_preload=${NCCL_PRELOAD:-}
[ -z "$nccl_preload" ] && [ "$nproc" -gt 1 ] &&
  echo "note: no NCCL_PRELOAD: if the ranks share a GPU, PyTorch's own NCCL (before 2.30) refuses (see --help)"

trainer=(ld_preload_examples/ddp_train.py --epochs "$epochs" --batch-size "$batch")
if [ "$synthetic" = 1 ]; then trainer+=(--synthetic)
else
  dir=${data:-/usr/share/datasets/fashion-mnist}
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -f "$dir/$f.gz" ] || { echo "ddp_side_by_side.sh: no $dir/$f.gz (--data DIR, or --synthetic)" >&2; exit 2; }
  done
  [ -n "$data" ] && trainer+=(--data "$data")
fi
trainer+=("${extra[@]}")
run=("${launcher[@]}" --standalone --nproc_per_node="$nproc" "${trainer[@]}")

# One epoch of warm-up: DDP all-reduces each bucket once per step, and the shim
# counts warm-up steps per buffer size, so steps = calls per bucket.
warmup=${DGC_WARMUP_STEPS:-$(( (60000 / nproc) / batch ))}
common=(NCCL_MULTI_RANK_GPU_ENABLE="${NCCL_MULTI_RANK_GPU_ENABLE:-1}")
dense_env=("${common[@]}")
[ -n "$nccl_preload" ] && dense_env+=(LD_PRELOAD="$nccl_preload")
shim_env=("${common[@]}" LD_PRELOAD="$shim${nccl_preload:+:$nccl_preload}" DGC_STATS=1 DGC_LOG_LEVEL=info
          DGC_MOMENTUM="${DGC_MOMENTUM:-0.9}" DGC_WARMUP_STEPS="$warmup")
while IFS='=' read -r name _; do  # every other DGC_* the caller set goes to the shim run
  case "$name" in DGC_STATS|DGC_LOG_LEVEL|DGC_MOMENTUM|DGC_WARMUP_STEPS|DGC_SHIM) ;; *) shim_env+=("$name=${!name}") ;; esac
done < <(env | grep -E '^DGC_[A-Z0-9_]+=' || true)

mkdir -p "$out"
# run NAME ENV...: runs the trainer with that environment, logs to $out/NAME.log; returns its status
run_one() {
  local name=$1; shift
  local cmd=(env "$@" "${run[@]}")
  local line; line=$(printf '%q ' "$@" "${run[@]}"); echo "${line% }" > "$out/$name.cmd"
  echo "== $name: $(cat "$out/$name.cmd")"
  timeout --kill-after=15 "${RUN_TIMEOUT:-300}" "${cmd[@]}" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "== $name: timed out after ${RUN_TIMEOUT:-300} s" | tee -a "$out/$name.log"
  echo "== $name: exit $rc"
  return "$rc"
}

dense_rc=skipped
if [ "$skip_dense" = 0 ]; then run_one dense "${dense_env[@]}"; dense_rc=$?; fi
run_one dgcshim "${shim_env[@]}"; shim_rc=$?

# clean LOG: the trainer's lines, without any "[rank]:" prefix a launcher adds
clean() { sed -E 's/^\[[^]]*\]:? ?//' "$1"; }
# field NAME LINE: the value after NAME in a "name value name value" line
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) {print $(i + 1); exit}}' <<<"$2"; }
# same LOG: yes when every one of the $nproc ranks printed one and the same params_sha256
same() {
  local lines ranks hashes
  lines=$(clean "$1" | grep -E '^rank [0-9]+ params_sha256 [0-9a-f]{64}$' | sort -u)
  ranks=$(awk '{print $2}' <<<"$lines" | grep -c . || true)
  hashes=$(awk '{print $4}' <<<"$lines" | sort -u | grep -c . || true)
  if [ "$ranks" = "$nproc" ] && [ "$hashes" = 1 ]; then echo yes; else echo no; fi
}
# ratio A B: A / B as "1.23x", or - when either is missing
ratio() { if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2fx", a / b}'; else echo -; fi; }
hash12() { clean "$1" | awk '/^rank 0 params_sha256 /{print substr($4, 1, 12); exit}'; }

{
  echo
  echo "== DDP side by side: $nproc ranks, $epochs epochs, batch $batch/rank, DGC_WARMUP_STEPS=$warmup =="
  printf '%-9s %5s %9s %9s %9s %11s %9s  %-15s  %-12s\n' run exit test_acc step_ms vs_dense last_ep_ms vs_dense \
    ranks_identical params_sha256
  dense_ms="" dense_last=""
  for name in dense dgcshim; do
    [ "$name" = dense ] && [ "$skip_dense" = 1 ] && continue
    rc=$dense_rc; [ "$name" = dgcshim ] && rc=$shim_rc
    final=$(clean "$out/$name.log" | grep -m1 '^final ' || true)
    last=$(clean "$out/$name.log" | grep '^epoch ' | tail -n 1 || true)
    ms=$(field step_ms "$final"); last_ms=$(field step_ms "$last")
    [ "$name" = dense ] && { dense_ms=$ms; dense_last=$last_ms; }
    printf '%-9s %5s %9s %9s %9s %11s %9s  %-15s  %-12s\n' "$name" "$rc" "$(field test_acc "$final")" "${ms:--}" \
      "$(ratio "$ms" "$dense_ms")" "${last_ms:--}" "$(ratio "$last_ms" "$dense_last")" \
      "$(same "$out/$name.log")" "$(hash12 "$out/$name.log")"
  done
  echo "(step_ms: mean time of a training step over the run, after its first 20, rank 0; last_ep_ms: the same over"
  echo " the last epoch, after the one-epoch warm-up; vs_dense: shim step / dense step;"
  echo " ranks_identical: all $nproc ranks printed the same SHA-256 of their parameters)"
  echo
  echo "DGC_STATS of the shim run (one row per buffer: DDP's buckets, and its step-0 all-parameter bucket):"
  grep -E 'dgcshim (STATS|WARN|ERROR)' "$out/dgcshim.log" || echo "(none: the shim printed no STATS lines)"
} | tee "$out/table.txt"

ok=1
[ "$shim_rc" = 0 ] || { echo "FAIL: the shim run exited $shim_rc (log: $out/dgcshim.log)"; ok=0; }
# A shim that was not loaded (a NEEDED library missing: ld.so only warns) or
# never reached NCCL trains densely and would pass the checks above.
grep -Eq 'dgcshim STATS pass-through calls [0-9]+, compressed calls [1-9]' "$out/dgcshim.log" ||
  { echo "FAIL: the shim compressed no call (loaded? 'NCCL path active' in $out/dgcshim.log says so)"; ok=0; }
! grep -q 'dgcshim ERROR' "$out/dgcshim.log" || { echo "FAIL: the shim logged errors (see $out/dgcshim.log)"; ok=0; }
[ "$(same "$out/dgcshim.log")" = yes ] || { echo "FAIL: ranks' parameters differ under the shim (or some rank printed none)"; ok=0; }
if [ "$skip_dense" = 0 ]; then
  [ "$dense_rc" = 0 ] || { echo "FAIL: the dense run exited $dense_rc (log: $out/dense.log)"; ok=0; }
  [ "$(same "$out/dense.log")" = yes ] || { echo "FAIL: ranks' parameters differ in the dense run"; ok=0; }
fi
echo "logs, commands and the table: $out/"
[ "$ok" = 1 ]
