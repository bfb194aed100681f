#!/usr/bin/env bash
# Retrains afd's shipped WordNet models from scratch on CPU (Debian's python3-torch) and
# writes them where the repository keeps them (assets/models/, or OUT_DIR):
#   wordnet-dsv3   DeepSeek-V3 layout (MLA, sigmoid + bias grouped routing, shared expert,
#                  a dense first layer, one MTP layer), the default model of scripts/serve.sh
#   wordnet-step3  Step-3 layout (MFA, step3_vl config with text_config)
# Both share one byte-level BPE tokenizer trained first. The two trainings run side by side,
# one thread each (deterministic for the seed and thread count). Then each checkpoint is
# written by `afd make-model --config --weights --tokenizer` (bf16), evaluated with
# `afd eval` on the held-out text, and given a model card (README.md) with its numbers.
# Usage: scripts/train-model.sh [OUT_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-assets/models}
STEPS=${2:-1400}
SEED=${AFD_TRAIN_SEED:-1}
bash scripts/install-deps.sh
for p in wordnet-base wamerican; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p"; }
done
BUILD=${AFD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target afd
AFD="$BUILD/apps/afd"
WORK=out/train
mkdir -p "$WORK"
PY=/usr/bin/python3
$PY scripts/train/train.py --tokenizer-only --out "$WORK/tokenizer" --seed "$SEED"
for arch in deepseek_v3 step3; do
  $PY scripts/train/train.py --arch $arch --out "$WORK/$arch" --tokenizer "$WORK/tokenizer" --steps "$STEPS" \
      --seed "$SEED" --threads 1 > "$WORK/$arch.log" 2>&1 &
done
wait
for pair in deepseek_v3:wordnet-dsv3 step3:wordnet-step3; do
  arch=${pair%%:*}
  name=${pair##*:}
  bash scripts/train/package.sh "$AFD" "$WORK/$arch" "$OUT/$name"
done
