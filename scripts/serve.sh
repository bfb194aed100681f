#!/usr/bin/env bash
# Installs dependencies, builds afd, writes the built-in default model (once), and starts
# the OpenAI-compatible server on 127.0.0.1:8000. Extra arguments go to `afd serve`
# (e.g. --port 9000 --topology 2A1F).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${AFD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target afd
MODEL=${AFD_MODEL:-models/default}
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/apps/afd" make-model --arch qwen3_moe --preset small --seed 1 --out "$MODEL"
fi
exec "$BUILD/apps/afd" serve --model "$MODEL" "$@"
