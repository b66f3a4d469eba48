#!/usr/bin/env bash
# The GPU benchmark, in one command for the device session: the CUDA engine
# (build/bench/gpu/engine_bench), the torch baselines on the same GPU
# (bench/gpu/torch_baselines.py: torch.topk, a naive torch update, the official
# DGC compressor, the copy bandwidth), one combined table with the ratios the
# goal is stated in, and with --ddp the DDP step on 2 ranks, dense against the
# shim (scripts/ddp_side_by_side.sh).
#
#   bench/gpu/run.sh [--out DIR] [--build DIR] [--ddp] [--ranks N] [--reps N]
#                    [--engine-args "ARGS"] [--baseline-args "ARGS"] [--ddp-args "ARGS"]
#
#   --out DIR            where everything goes (default bench/results/gpu)
#   --build DIR          the CMake build (default: the folder of $DGC_SHIM when set, else build)
#   --ddp                also run scripts/ddp_side_by_side.sh (logs in DIR/ddp)
#   --ranks N            payloads each call decodes: the official compressor's and, given,
#                        engine_bench's (--ranks N; without it the compressor decodes 1 and
#                        the engine 2, and the combined table notes the difference)
#   --reps N             timed reps of each baseline (default 25)
#   --momentum M         the configuration compared (default 0.9)
#   --engine-args, --baseline-args, --ddp-args   more options for each part
#
# Environment: PYTHON (default python3), and what scripts/ddp_side_by_side.sh reads (DGC_SHIM,
# NCCL_PRELOAD, ...).
#
# Files in DIR: gpu.txt (the device), engine_bench.txt, torch_baselines.txt and .csv,
# summary.txt (the combined table), ddp/ (with --ddp). Exit status: 0 when every part ran
# (whether the goals were met is in the table), 1 otherwise.
#
# The combined table reads the engine's figures from engine_bench's CSV lines: a header
# "# csv,name,name,..." (or "csv,name,..." with the word n among the names) then rows
# "csv,value,...", as compressor_bench prints them, with columns n and a time in ms (the
# first present of $ENGINE_COLUMN, total_median_ms, median_ms, engine_median_ms, total_ms,
# engine_ms); momentum, sparsity, dtype and ranks columns are used when present.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

build=build; [ -n "${DGC_SHIM:-}" ] && build=$(dirname "$DGC_SHIM")
out=bench/results/gpu ddp=0 ranks=1 ranks_given=0 reps=25 momentum=0.9
engine_args="" baseline_args="" ddp_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --ddp) ddp=1; shift ;;
    --ranks) ranks=$2; ranks_given=1; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --momentum) momentum=$2; shift 2 ;;
    --engine-args) engine_args=$2; shift 2 ;;
    --baseline-args) baseline_args=$2; shift 2 ;;
    --ddp-args) ddp_args=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/gpu/run.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
mkdir -p "$out"
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  git log -1 --format='dgcshim commit %h %s' 2>/dev/null; git status --short 2>/dev/null | sed 's/^/  /'
} > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

engine=$build/bench/gpu/engine_bench
[ "$ranks_given" = 1 ] && engine_args="--ranks $ranks $engine_args"
echo "== engine: $engine $engine_args"
if [ -x "$engine" ]; then
  # shellcheck disable=SC2086 # the extra arguments are split on purpose
  "$engine" $engine_args 2>&1 | tee "$out/engine_bench.txt"
  rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { echo "== engine_bench exited $rc"; status=1; }
else
  echo "no $engine (build with cmake -S . -B $build -DDGC_CUDA=ON && cmake --build $build -j)" | tee "$out/engine_bench.txt"
  status=1
fi

echo "== torch baselines"
# shellcheck disable=SC2086
"$python" bench/gpu/torch_baselines.py --ranks "$ranks" --reps "$reps" --momentum "$momentum" \
  --csv "$out/torch_baselines.csv" $baseline_args 2>&1 | tee "$out/torch_baselines.txt"
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { echo "== torch_baselines.py exited $rc"; status=1; }

if [ "$ddp" = 1 ]; then
  echo "== DDP step: scripts/ddp_side_by_side.sh --out $out/ddp $ddp_args"
  # shellcheck disable=SC2086
  scripts/ddp_side_by_side.sh --out "$out/ddp" $ddp_args
  rc=$?; [ "$rc" = 0 ] || { echo "== ddp_side_by_side.sh exited $rc"; status=1; }
fi

"$python" - "$out" "$momentum" "$ranks" "$ddp" <<'EOF' | tee "$out/summary.txt"
import csv, os, sys

out, momentum, ranks, with_ddp = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"

def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None

# torch baselines: name -> n -> median ms
base, copy_gbps = {}, None
try:
    with open(os.path.join(out, "torch_baselines.csv")) as f:
        for r in csv.DictReader(f):
            base.setdefault(r["name"], {})[int(r["n"])] = float(r["median_ms"])
            copy_gbps = float(r["copy_gbps_best"])
except (OSError, KeyError, ValueError) as e:
    print(f"(no torch baselines: {e})")

# engine: its CSV lines
cols, rows = None, []
try:
    for line in open(os.path.join(out, "engine_bench.txt")):
        line = line.strip()
        if line.startswith("#") and "csv," in line:
            names = line[line.index("csv,"):].split(",")[1:]
            if "n" in names:
                cols = names
        elif line.startswith("csv,"):
            vals = line.split(",")[1:]
            if cols is None and "n" in vals:
                cols = vals  # an unprefixed header
            elif cols is not None and len(vals) == len(cols):
                rows.append(dict(zip(cols, vals)))
except OSError:
    pass
tcol = next((c for c in [os.environ.get("ENGINE_COLUMN"), "total_median_ms", "median_ms", "engine_median_ms",
                         "total_ms", "engine_ms"] if c and cols and c in cols), None)
engine, engine_roof, engine_ranks = {}, {}, set()
for r in rows:
    if "momentum" in r and num(r["momentum"]) is not None and abs(num(r["momentum"]) - momentum) > 1e-9:
        continue
    if "sparsity" in r and num(r["sparsity"]) is not None and abs(num(r["sparsity"]) - 0.999) > 1e-9:
        continue
    if "dtype" in r and r["dtype"].lower() not in ("f32", "fp32", "float32", "float"):
        continue
    n = num(r.get("n"))
    if n is None or tcol is None or num(r.get(tcol)) is None or int(n) in engine:
        continue
    engine[int(n)] = num(r[tcol])
    if num(r.get("roofline_ms")):
        engine_roof[int(n)] = num(r["roofline_ms"])
    if "ranks" in r:
        engine_ranks.add(r["ranks"])

sizes = sorted(set(engine) | set(base.get("topk", {})))
print()
print(f"== GPU compressor benchmark: fp32, 99.9% sparsity, momentum {momentum}, medians (ms) ==")
if copy_gbps:
    print(f"copy bandwidth (torch clone, read + write, best): {copy_gbps:.0f} GB/s; roofline = 24 B/elem at it")
hdr = ["n", "engine", "topk", "official", "naive_upd", "roofline", "frac_roof", "vs_topk", "vs_official"]
print(" ".join(f"{h:>11}" for h in hdr))
fmt = lambda x, spec: "-" if x is None else format(x, spec)
verdicts = []
for n in sizes:
    e = engine.get(n)
    tk, of, nv = (base.get(k, {}).get(n) for k in ("topk", "official_dgc", "naive_update"))
    roof = base.get("roofline_24B", {}).get(n)
    frac = roof / e if e and roof else None
    vt = tk / e if e and tk else None
    vo = of / e if e and of else None
    print(" ".join(f"{x:>11}" for x in [n, fmt(e, ".4f"), fmt(tk, ".4f"), fmt(of, ".4f"), fmt(nv, ".4f"),
                                        fmt(roof, ".4f"), fmt(frac, ".2f"), fmt(vt, ".2f") + ("x" if vt else ""),
                                        fmt(vo, ".2f") + ("x" if vo else "")]))
    if e:
        ok = frac is not None and frac >= 0.5 and vt is not None and vt >= 2 and vo is not None and vo >= 2
        verdicts.append(f"n {n}: {'goal met' if ok else 'goal NOT met'}")
    if n in engine_roof and e:
        print(f"{'':>11} engine's own roofline {engine_roof[n]:.4f} ms: {engine_roof[n] / e:.2f} of it")
print("goal: frac_roof >= 0.5, vs_topk >= 2x and vs_official >= 2x (engine = compress + decode + commit)")
if engine_ranks and engine_ranks != {str(ranks)}:
    print(f"note: the engine decoded {','.join(sorted(engine_ranks))} payloads, the official compressor {ranks} "
          f"(bench/gpu/run.sh --ranks)")
if not engine:
    why = "no engine_bench output" if not rows else f"no time column ({', '.join(cols or [])})"
    print(f"engine: not parsed ({why}); its output is in {out}/engine_bench.txt")
for v in verdicts:
    print(v)
ddp = os.path.join(out, "ddp", "table.txt")
if with_ddp and os.path.exists(ddp):
    print()
    print(open(ddp).read().rstrip())
EOF
echo "everything in $out/"
exit "$status"
