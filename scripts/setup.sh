#!/usr/bin/env bash
# Installs what moecore needs on a Debian 12 machine, as root, and only what is missing:
#   system   Debian packages for the C++ build and the default corpus
#   python   the pinned reference oracles (tests/reference/requirements.txt) in a virtualenv
#   fuzz     clang and libFuzzer for `make fuzz` (tests/fuzz/README.md)
# Idempotent and fast when everything is present (one dpkg query, one stamp comparison).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libfmt-dev
  libgtest-dev libbenchmark-dev libpcre2-dev libutf8proc-dev libisal-dev
  bible-kjv bible-kjv-text
  iproute2
  chromium  # headless, renders `moecore plan --html` pages in their test
  python3 python3-venv python3-pip
)
# libFuzzer's runtime (libclang_rt.fuzzer-x86_64.a) comes with libclang-rt-14-dev, only a
# Recommends of clang-14, so --no-install-recommends would leave it out; clang's OpenMP runtime
# (libomp-14-dev) is not even that, and CMake's OpenMP check needs it.
FUZZ_PACKAGES=(clang libclang-rt-14-dev libomp-14-dev)
VENV="${MOECORE_VENV:-/opt/moecore/venv}"
REQUIREMENTS=tests/reference/requirements.txt

install_missing() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

setup_system() { install_missing "${APT_PACKAGES[@]}"; }
setup_fuzz() { install_missing "${APT_PACKAGES[@]}" "${FUZZ_PACKAGES[@]}"; }

setup_python() {
  local stamp="$VENV/.moecore-requirements"
  if [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS"; then return 0; fi
  echo "setup: creating the reference virtualenv at $VENV (pinned: $REQUIREMENTS)"
  local python=python3
  [ -x /usr/bin/python3 ] && python=/usr/bin/python3
  [ -x "$VENV/bin/python" ] || "$python" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$stamp"
}

case "${1:-all}" in
  system) setup_system ;;
  python) setup_python ;;
  fuzz) setup_fuzz ;;
  all) setup_system; setup_python ;;
  *) echo "usage: $0 [system|python|fuzz|all]" >&2; exit 2 ;;
esac
