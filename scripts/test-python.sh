#!/usr/bin/env bash
# The Python package's tests (tests/python/test_cli.py): a fresh venv
# (Debian's python3 with --system-site-packages, so that Debian's torch,
# mpi4py, numpy and matplotlib are seen), `pip install .` of this checkout,
# then the `dgcshim` command tried as a user would: run (against the
# LD_PRELOAD form, bit for bit; an MPMD line; a bad value), doctor, config,
# report and --horovod-groups1 on a TensorFlow-only Horovod
# (.venv/horovod-tf, scripts/deps.sh horovod-tf; DGC_TEST_HOROVOD=0 leaves it
# out, and its test says so by name). Needs the optimised CMake build in
# build/ (mlp_trainer, libdgcshim.so: the LD_PRELOAD form to compare with).
# Where scripts/test.sh's NCCL-only phase left build-nompi/libdgcshim-nccl.so
# (or DGC_TEST_NCCL_ONLY names one), the command is tried on it too.
#
#   scripts/test-python.sh [unittest args, e.g. -k report]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh python
[ "${DGC_TEST_HOROVOD:-1}" = 0 ] || scripts/deps.sh horovod-tf
[ -x build/ld_preload_examples/mlp_trainer ] && [ -f build/libdgcshim.so ] || {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" --target dgcshim mlp_trainer >/dev/null; }
venv=build/py-venv
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
echo "== pip install . (into $venv) =="
"$venv/bin/pip" install -q --disable-pip-version-check .
echo "== pip wheel . =="
rm -rf build/py-wheel
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w build/py-wheel .
ls build/py-wheel/dgcshim-*.whl
echo "== tests/python/test_cli.py =="
nccl_only=${DGC_TEST_NCCL_ONLY:-$PWD/build-nompi/libdgcshim-nccl.so}
DGC_TEST_VENV=$PWD/$venv DGC_TEST_BUILD=$PWD/build DGC_TEST_NCCL_ONLY=$nccl_only \
  "$venv/bin/python" -m unittest -v tests/python/test_cli.py "$@"
