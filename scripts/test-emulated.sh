#!/usr/bin/env bash
# The emulated device tier: the CUDA engine's tests (gpu.engine.*) and the
# emulator's own self-tests (emulated.defects) run on the CPU. The project's
# kernels are compiled by chipStar (CUDA -> clang 15 -> SPIR-V) and run by
# Intel's OpenCL CPU runtime. What passes here "passes on the emulated
# device": it has not run on a GPU (docs/emulated-device.md says what this
# tier proves and what it cannot).
#
#   scripts/test-emulated.sh [--small] [--chipstar-tarball PATH] [--build DIR] [--repeat N]
#
#   --small              the cases' small sizes (gpu_engine_check --small)
#   --chipstar-tarball   chipStar v1.2.1's source with its submodules, as a
#                        .tar.xz that unpacks to chipStar/ (its sha256 is
#                        checked); also DGC_CHIPSTAR_TARBALL. Without one the
#                        pinned tag is cloned from GitHub (and the script says so).
#   --build DIR          the build folder (default build-emulated): chipStar,
#                        the OpenCL runtime's venv and the project's build all
#                        go there; a second run reuses what is built
#   --repeat N           run the cases N times (stops at the first failure)
#
# Installs what it needs: Debian's clang/LLVM 15 and llvm-spirv (scripts/deps.sh emulated),
# Intel's OpenCL CPU runtime from PyPI into a venv (about 830 MB). Prints
# ctest's line per case; exits non-zero when any case fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# chipStar v1.2.1 (CHIP-SPV/chipStar, MIT) and the submodules it builds with.
CHIPSTAR_TAG=v1.2.1
CHIPSTAR_COMMIT=3bd6515ebe2a84f2f6d17bee53ed14a5d19a0856
CHIPSTAR_SUBMODULES="HIP:a3670d2b094606bf000cea3503756d45d5feaaf7 HIPCC:5885607ac632a0165bddbe6aca1507e7629abdb9
  bitcode/ROCm-Device-Libs:f5ad181fd97ede7973466b292219ebe9d0a7f4d6"
CHIPSTAR_TARBALL_SHA256=c7177515d048a6cfcb5c560e543208f2e96c12540d3180ca34097f489fac532c
# Intel's OpenCL runtime for x86 CPUs (Debian's PoCL 3.1 takes no SPIR-V).
INTEL_RUNTIME="intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0"

small="" tarball=${DGC_CHIPSTAR_TARBALL:-} build=build-emulated repeat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --small) small=--small; shift ;;
    --chipstar-tarball) tarball=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    *) echo "test-emulated.sh: unknown option $1 (see the comment at its top)" >&2; exit 2 ;;
  esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
deps=$build/deps
mkdir -p "$deps"
t0=$(date +%s)
step() { echo "== [$(($(date +%s) - t0)) s] $*"; }

step "packages"
scripts/deps.sh emulated

step "OpenCL CPU runtime ($INTEL_RUNTIME)"
if [ ! -f "$deps/venv/lib/libintelocl.so" ]; then
  /usr/bin/python3 -m venv "$deps/venv"
  # shellcheck disable=SC2086
  "$deps/venv/bin/pip" install -q $INTEL_RUNTIME
fi
mkdir -p "$deps/vendors"
echo "$deps/venv/lib/libintelocl.so" > "$deps/vendors/intel-cpu.icd"

step "chipStar $CHIPSTAR_TAG"
install=$deps/chipstar
stamp=$install/.dgc-source
if [ -n "$tarball" ]; then
  [ -f "$tarball" ] || { echo "test-emulated.sh: no chipStar tarball at $tarball" >&2; exit 1; }
  sum=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$sum" != "$CHIPSTAR_TARBALL_SHA256" ]; then
    echo "test-emulated.sh: $tarball has sha256 $sum, not the pinned $CHIPSTAR_TARBALL_SHA256" >&2
    exit 1
  fi
  source_id="tarball $sum"
else
  source_id="git $CHIPSTAR_COMMIT"
fi
# clang looks for llvm-spirv on PATH, under that name; Debian names it llvm-spirv-15.
mkdir -p "$deps/bin"
ln -sf /usr/bin/llvm-spirv-15 "$deps/bin/llvm-spirv"
if [ ! -x "$install/bin/cucc" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$source_id" ]; then
  rm -rf "$install"
  [ "$(cat "$deps/chipStar/.dgc-source" 2>/dev/null)" = "$source_id" ] || rm -rf "$deps/chipStar" "$deps/chipStar-build"
fi
if [ ! -x "$install/bin/cucc" ] && [ ! -d "$deps/chipStar" ]; then
  if [ -n "$tarball" ]; then
    tar -xJf "$tarball" -C "$deps"
  else
    echo "test-emulated.sh: no chipStar tarball given: cloning $CHIPSTAR_TAG from GitHub"
    git clone -q --depth 1 --branch "$CHIPSTAR_TAG" https://github.com/CHIP-SPV/chipStar.git "$deps/chipStar"
    [ "$(git -C "$deps/chipStar" rev-parse HEAD)" = "$CHIPSTAR_COMMIT" ] ||
      { echo "test-emulated.sh: $CHIPSTAR_TAG is not commit $CHIPSTAR_COMMIT" >&2; exit 1; }
    for s in $CHIPSTAR_SUBMODULES; do
      git -C "$deps/chipStar" submodule update -q --init --depth 1 "${s%%:*}" 2>/dev/null ||
        git -C "$deps/chipStar" submodule update -q --init "${s%%:*}"
      [ "$(git -C "$deps/chipStar/${s%%:*}" rev-parse HEAD)" = "${s#*:}" ] ||
        { echo "test-emulated.sh: submodule ${s%%:*} is not at ${s#*:}" >&2; exit 1; }
    done
  fi
  echo "$source_id" > "$deps/chipStar/.dgc-source"
fi
if [ ! -x "$install/bin/cucc" ]; then
  export PATH="$deps/bin:$PATH"
  # From inside deps/: chipStar's configuration leaves an a.out (a SPIR-V
  # probe) in the directory it runs from.
  (cd "$deps" && cmake -S "$deps/chipStar" -B "$deps/chipStar-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$install" -DLLVM_CONFIG_BIN=/usr/lib/llvm-15/bin/llvm-config \
    -DCHIP_BUILD_SAMPLES=OFF -DCHIP_BUILD_TESTS=OFF \
    -DCMAKE_C_COMPILER=/usr/lib/llvm-15/bin/clang -DCMAKE_CXX_COMPILER=/usr/lib/llvm-15/bin/clang++ \
    -DOpenCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libOpenCL.so > "$deps/chipstar-cmake.log" 2>&1) ||
    { tail -30 "$deps/chipstar-cmake.log"; exit 1; }
  ninja -C "$deps/chipStar-build" -j "$(nproc)" install > "$deps/chipstar-build.log" 2>&1 ||
    { tail -30 "$deps/chipstar-build.log"; exit 1; }
  echo "$source_id" > "$stamp"
  rm -rf "$deps/chipStar-build" # 0.5 GB of objects; the install is what is used
fi

step "dgcshim for the emulated device (DGC_CUDA=EMULATED)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDGC_CUDA=EMULATED -DDGC_CHIPSTAR_ROOT="$install" \
  -DDGC_OPENCL_VENDORS="$deps/vendors" -DDGC_OPENCL_LIBDIR="$deps/venv/lib" \
  -DDGC_EMULATED_CASE_ARGS="$small" > "$build/cmake.log" 2>&1 || { tail -30 "$build/cmake.log"; exit 1; }
cmake --build "$build" --target emulated_tier -j "$(nproc)" > "$build/build.log" 2>&1 ||
  { grep -E "error|Error" "$build/build.log" | head -30; exit 1; }

for ((i = 1; i <= repeat; i++)); do
  step "the emulated cases${small:+ ($small)}$( [ "$repeat" -gt 1 ] && echo ", run $i of $repeat")"
  (cd "$build" && ctest -L emulated --output-on-failure -j 1)
done
step "all emulated cases passed: the CUDA engine passes on the emulated device (not run on a GPU)"
