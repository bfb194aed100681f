#!/usr/bin/env bash
# Installs every Debian package afd needs to build, test and serve. Idempotent.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libboost-dev libcli11-dev libspdlog-dev libfmt-dev
      libopenblas-dev libucx-dev ucx-utils
      libpcre2-dev libutf8proc-dev
      clang libclang-rt-14-dev
      python3 python3-numpy python3-torch python3-pytest python3-jinja2
      curl iproute2
      wamerican wordnet-base)
# Node.js + npm (for the OpenAI-client e2e test): Debian's packages unless a node with
# npm is already installed (e.g. a distribution that bundles npm into nodejs).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then PKGS+=(nodejs npm); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
