#!/usr/bin/env bash
# Installs the Debian packages dgcshim builds, tests and demos with. Idempotent:
# does nothing when they are all present. Needs root (or sudo) to install.
set -euo pipefail
pkgs=(build-essential cmake openmpi-bin libopenmpi-dev libcriterion-dev zlib1g-dev pkg-config
      python3-numpy iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
echo "deps.sh: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
