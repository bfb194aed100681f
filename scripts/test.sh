#!/usr/bin/env bash
# Installs dependencies, builds afd (Release), and runs the whole test suite (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${AFD_BUILD_DIR:-build}
JOBS=${AFD_JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAFD_BUILD_TESTS=ON -DAFD_BUILD_FUZZ=ON
cmake --build "$BUILD" -j "$JOBS"
cd "$BUILD"
ctest --output-on-failure -LE gpu -j "$JOBS" --timeout 900
