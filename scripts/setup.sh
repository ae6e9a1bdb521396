#!/usr/bin/env bash
# Installs every dependency of tessera's build, tests, benchmarks and examples from
# Debian packages. Idempotent: does nothing when all of them are installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build python3
  xtensor-dev libxtensor-blas-dev libopenblas-dev
  libopenmpi-dev openmpi-bin
  doctest-dev libbenchmark-dev nlohmann-json3-dev
  libscalapack-openmpi-dev
  libdnnl-dev libgloo-dev
  libssl-dev openssl
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} Debian packages are installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "setup.sh: not root and no sudo; install as root: ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
echo "setup.sh: missing packages: ${missing[*]}"
echo "setup.sh: apt-get update"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
echo "setup.sh: apt-get install ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
echo "setup.sh: done"
