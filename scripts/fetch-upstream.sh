#!/usr/bin/env bash
# Other projects' files that a benchmark or a side-by-side run uses, which
# the project does not hold: fetched at a pinned commit into .upstream/NAME
# (git-ignored), every file checked against its sha256.
#
#   scripts/fetch-upstream.sh NAME [--from DIR]
#     official-dgc      synxlin/deep-gradient-compression at 24673d45 (Apache-2.0):
#                       dgc/__init__.py, dgc/compression.py, dgc/memory.py, LICENSE
#                       (bench/gpu/torch_baselines.py's official DGC compressor)
#     horovod-examples  horovod/horovod at v0.28.1, 1d217b59 (Apache-2.0):
#                       examples/pytorch/pytorch_mnist.py,
#                       examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py, LICENSE
#                       (scripts/horovod_side_by_side.sh, python/dgcshim/horovod_groups1.py)
#     --from DIR        a clone of that repository (a git repository with the pinned
#                       commit, or a plain copy of its files) instead of GitHub, for
#                       machines without access to it
# Prints the folder. Exit 1, saying which file, when one cannot be had or its
# sha256 differs (a copy fetched before stays as it was).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-} from=""
[ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from=$2; shift 2 ;;
    *) echo "fetch-upstream.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$name" in
  official-dgc)
    repo=synxlin/deep-gradient-compression commit=24673d45d11bba08bd4554b4585cae65e3dcf6f1
    files=(
      "dgc/__init__.py dgc/__init__.py e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
      "dgc/compression.py dgc/compression.py 87d652f2e38551a0578dadb6efe1744a54f81b5146d9c028eb6c76b97aaad508"
      "dgc/memory.py dgc/memory.py ad3972051e4ed41243d49a1b1fd384178bbae979a1775499d6625b4798173ad9"
      "LICENSE LICENSE 3543aeeec243040789572e198c157000c82ca04338e073c46d1c1b309b96eea1") ;;
  horovod-examples)
    repo=horovod/horovod commit=1d217b59949986d025f6db93c49943fb6b6cc78f
    files=(
      "examples/pytorch/pytorch_mnist.py pytorch_mnist.py 60092fbb844fcdb83cf894f6be6d91caa61a596797b19f143e4b1625bf0f07f8"
      "examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py tensorflow2_keras_synthetic_benchmark.py 01c441525291036ef7ce596bb9c3b4ca9faab96da94b52e8a97729b9d28705fd"
      "LICENSE LICENSE a6e008935baefc04230afe344cea6c809530e78a25d64575176e0b22336e2311") ;;
  *) echo "fetch-upstream.sh: NAME is official-dgc or horovod-examples" >&2; exit 2 ;;
esac
dest=.upstream/$name
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for entry in "${files[@]}"; do
  read -r path here sum <<<"$entry"
  mkdir -p "$(dirname "$tmp/$here")"
  if [ -n "$from" ] && git -C "$from" rev-parse -q --verify "$commit^{commit}" >/dev/null 2>&1; then
    git -C "$from" show "$commit:$path" >"$tmp/$here" || { echo "fetch-upstream.sh: $from has no $path at $commit" >&2; exit 1; }
  elif [ -n "$from" ]; then
    cp "$from/$path" "$tmp/$here" 2>/dev/null || { echo "fetch-upstream.sh: no $from/$path" >&2; exit 1; }
  else
    curl -fsSL "https://raw.githubusercontent.com/$repo/$commit/$path" -o "$tmp/$here" ||
      { echo "fetch-upstream.sh: cannot download $path of $repo (no access to GitHub? give --from DIR)" >&2; exit 1; }
  fi
  got=$(sha256sum "$tmp/$here" | cut -c1-64)
  [ "$got" = "$sum" ] || { echo "fetch-upstream.sh: $path of $repo has sha256 $got, not $sum" >&2; exit 1; }
done
rm -rf "$dest"; mkdir -p "$(dirname "$dest")"; mv "$tmp" "$dest"; trap - EXIT
echo "$dest"
