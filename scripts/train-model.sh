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
# wordnet-dsv3 then goes through a second phase (the copy stages and the MTP stage below) and
# is packaged again.
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
# The default model's second phase: a copy that matches ids (docs/TRAINING.md "Teaching the
# default model to copy"), three stages from the packaged first phase, 2 threads (deterministic
# for that count), each stopped early on the schedule of a longer run, as when it was found.
COPY=(--arch deepseek_v3 --tokenizer "$WORK/tokenizer" --seed "$SEED" --threads 2 --seq 128
      --induction-words 4 --attend-prev 0:0,1:0 --attend-copy 2:1)
$PY scripts/train/train.py "${COPY[@]}" --init "$OUT/wordnet-dsv3" --out "$WORK/copy1" --batch 16 \
    --induction-rows 6 --induction-len 512 --induction-max 160 --induction-gap 128 --lr 1e-3 \
    --steps 800 --stop-at 300 > "$WORK/copy1.log" 2>&1
$PY scripts/train/train.py "${COPY[@]}" --init "$WORK/copy1" --out "$WORK/copy2" --batch 32 \
    --induction-rows 3 --induction-len 1024 --induction-max 400 --induction-gap 256 --lr 5e-4 \
    --steps 300 --stop-at 100 > "$WORK/copy2.log" 2>&1
$PY scripts/train/train.py "${COPY[@]}" --init "$WORK/copy2" --out "$WORK/copy3" --batch 32 \
    --induction-rows 3 --induction-len 1024 --induction-max 400 --induction-gap 256 --doc-rows 32 \
    --lr 5e-4 --steps 250 --stop-at 150 > "$WORK/copy3.log" 2>&1
# The MTP module alone, the main model frozen: the copy stages cost it some top-1.
$PY scripts/train/train.py --arch deepseek_v3 --tokenizer "$WORK/tokenizer" --seed "$SEED" --threads 2 --seq 128 \
    --init "$WORK/copy3" --out "$WORK/copy4" --batch 32 --mtp-only --lr 1e-3 --steps 300 > "$WORK/copy4.log" 2>&1
bash scripts/train/package.sh "$AFD" "$WORK/copy4" "$OUT/wordnet-dsv3"
