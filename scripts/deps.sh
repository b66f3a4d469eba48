#!/usr/bin/env bash
# Installs the Debian packages dgcshim needs (and, for the horovod groups, two
# Python venvs). Idempotent: does nothing when they are all present. Needs root
# (or sudo) to install.
#
#   scripts/deps.sh          build and test: compilers (gcc, gfortran, clang for the fuzz
#                            targets), CMake, Open MPI, MPICH (the second MPI family the
#                            tests run under; Open MPI stays the system's default mpirun),
#                            Criterion, zlib
#   scripts/deps.sh train    also Fashion-MNIST (the C trainer's data)
#   scripts/deps.sh torch    also PyTorch, mpi4py, numpy and matplotlib for /usr/bin/python3
#   scripts/deps.sh python   what torch installs, and python3-venv: `pip install .` into a
#                            venv made with --system-site-packages (scripts/test-python.sh)
#   scripts/deps.sh horovod-torch
#                            what torch installs, plus libtorch-dev, pybind11-dev,
#                            torchvision, filelock (pytorch_mnist.py), and the venv .venv/horovod-torch (Debian's
#                            python3 with --system-site-packages, so it uses Debian's
#                            torch 1.13/mpi4py/numpy) with Horovod 0.28.1 built from
#                            PyPI's sdist for PyTorch over Open MPI (no Gloo): ~3 min
#   scripts/deps.sh horovod-tf
#                            the venv .venv/horovod-tf (Debian's python3, no system
#                            site packages) with tensorflow-cpu 2.15.1, numpy<2 and
#                            Horovod 0.28.1 built for TensorFlow over Open MPI: ~4 min
#   scripts/deps.sh horovod  both horovod groups (~7 min on 2 cores, more on a slow mirror)
#   scripts/deps.sh emulated the emulated device tier's toolchain (scripts/test-emulated.sh):
#                            clang/LLVM 15 with llvm-spirv for chipStar, the OpenCL ICD
#                            loader, ninja, python3-venv (Intel's OpenCL CPU runtime), git
#
# A venv is skipped when `<venv>/bin/python -c 'import horovod.torch'` (resp.
# horovod.tensorflow) already works with Horovod's MPI library built in. Run them
# with plain mpirun (horovodrun is not needed):
#   mpirun --allow-run-as-root --oversubscribe -np 2 .venv/horovod-torch/bin/python train.py
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkgs=(build-essential gfortran clang libclang-rt-14-dev cmake openmpi-bin libopenmpi-dev mpich libmpich-dev
      libcriterion-dev zlib1g-dev pkg-config iproute2)
torch_pkgs=(dataset-fashion-mnist python3-torch python3-mpi4py python3-numpy python3-matplotlib)
# Horovod compiles a C++ extension: Python.h (python3-dev), venv, and for PyTorch the
# libtorch headers and CMake config (libtorch-dev) and pybind11 headers.
hvd_pkgs=(python3-dev python3-venv python3-wheel)
hvd_torch_pkgs=(libtorch-dev pybind11-dev python3-torchvision python3-filelock)
emulated_pkgs=(clang-15 llvm-15-dev libclang-15-dev clang-tools-15 llvm-spirv-15 spirv-tools ocl-icd-opencl-dev
               ocl-icd-libopencl1 ninja-build python3-venv git xz-utils)
venvs=()
case "${1:-}" in
  "") ;;
  train) pkgs+=(dataset-fashion-mnist) ;;
  torch) pkgs+=("${torch_pkgs[@]}") ;;
  python) pkgs+=("${torch_pkgs[@]}" python3-venv) ;; # pip install . into a venv (scripts/test-python.sh)
  horovod-torch) pkgs+=("${torch_pkgs[@]}" "${hvd_pkgs[@]}" "${hvd_torch_pkgs[@]}"); venvs=(torch) ;;
  horovod-tf) pkgs+=("${hvd_pkgs[@]}"); venvs=(tf) ;;
  horovod) pkgs+=("${torch_pkgs[@]}" "${hvd_pkgs[@]}" "${hvd_torch_pkgs[@]}"); venvs=(torch tf) ;;
  emulated) pkgs+=("${emulated_pkgs[@]}") ;;
  *) echo "deps.sh: unknown group '$1' (use train, torch, python, horovod, horovod-torch, horovod-tf or emulated)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "deps.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Horovod 0.28.1 from PyPI's sdist, over Open MPI only. Its setup.py defaults to make -j8:
# MAKEFLAGS=-j2 fits the 2-core machines. --no-build-isolation: Horovod's build imports
# the framework, which must be the venv's (Debian's torch for the torch venv); the sdist
# has no pyproject.toml, so pip builds it with the venv's setuptools and wheel.
HOROVOD_VERSION=0.28.1
hvd_env=(HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=MPI HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_MXNET=1
         MAKEFLAGS=-j2)
hvd_venv() {  # hvd_venv torch|tf
  local kind=$1 dir mod check
  case $kind in
    torch) dir="$root/.venv/horovod-torch" mod=horovod.torch ;;
    tf)    dir="$root/.venv/horovod-tf"    mod=horovod.tensorflow ;;
  esac
  # horovod.torch imports even when its mpi_lib_v2 was not built (it only prints a
  # warning, and `horovodrun --check-build` then still ticks PyTorch): ask for MPI too.
  check="import $mod as h; assert h.mpi_built()"
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
    return 0
  fi
  echo "deps.sh: building $dir (Horovod $HOROVOD_VERSION for $kind; several minutes)"
  local pip=("$dir/bin/python" -m pip install --no-cache-dir --disable-pip-version-check -q)
  case $kind in
    torch)
      /usr/bin/python3 -m venv --system-site-packages "$dir"
      env "${hvd_env[@]}" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        "${pip[@]}" --no-build-isolation "horovod==$HOROVOD_VERSION"
      ;;
    tf)
      /usr/bin/python3 -m venv "$dir"
      "${pip[@]}" 'setuptools<70' wheel 'numpy<2' tensorflow-cpu==2.15.1
      env "${hvd_env[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
        "${pip[@]}" --no-build-isolation "horovod==$HOROVOD_VERSION" 'numpy<2'
      ;;
  esac
  "$dir/bin/python" -c "$check" >/dev/null
}
for v in "${venvs[@]}"; do hvd_venv "$v"; done
