#!/usr/bin/env bash
# Installs dependencies, builds afd, and starts the OpenAI-compatible server on 127.0.0.1:8000
# with the built-in default model: assets/models/wordnet-dsv3, a tiny DeepSeek-V3-layout model
# trained on WordNet that ships with the repository (its README.md says what it is and is not).
# AFD_MODEL=DIR serves another checkpoint. Extra arguments go to `afd serve`
# (e.g. --port 9000 --topology 2A1F).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${AFD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target afd
MODEL=${AFD_MODEL:-assets/models/wordnet-dsv3}
exec "$BUILD/apps/afd" serve --model "$MODEL" "$@"
