#!/usr/bin/env bash
# Installs the Debian packages dgcshim needs. Idempotent: does nothing when
# they are all present. Needs root (or sudo) to install.
#
#   scripts/deps.sh          build and test: compilers (gcc, gfortran, clang for the fuzz
#                            targets), CMake, Open MPI, Criterion, zlib
#   scripts/deps.sh train    also Fashion-MNIST (the C trainer's data)
#   scripts/deps.sh torch    also PyTorch, mpi4py, numpy and matplotlib for /usr/bin/python3
set -euo pipefail
pkgs=(build-essential gfortran clang libclang-rt-14-dev cmake openmpi-bin libopenmpi-dev libcriterion-dev zlib1g-dev
      pkg-config iproute2)
case "${1:-}" in
  "") ;;
  train) pkgs+=(dataset-fashion-mnist) ;;
  torch) pkgs+=(dataset-fashion-mnist python3-torch python3-mpi4py python3-numpy python3-matplotlib) ;;
  *) echo "deps.sh: unknown group '$1' (use train or torch)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
echo "deps.sh: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
