#!/usr/bin/env bash
# Turns one training run (scripts/train/train.py's WORK directory) into a shipped model
# directory: the checkpoint written by `afd make-model --config --weights --tokenizer` (bf16),
# the held-out text, the chat check's words, the training curve and metrics, `afd eval` in
# reference and fast precision and on the FP8 twin (`afd quantize --fp8`, not kept), the chat
# check against `afd serve`, and the model card (README.md) with those numbers.
# Usage: scripts/train/package.sh AFD_BIN WORK OUT
set -euo pipefail
AFD=$1
WORK=$2
OUT=$3
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
mkdir -p "$OUT"
"$AFD" make-model --config "$WORK/config.json" --weights "$WORK/trained.safetensors" --tokenizer "$WORK" \
    --dtype bf16 --out "$OUT"
cp "$WORK/eval.txt" "$WORK/chat_eval.json" "$WORK/curve.svg" "$OUT/"
cp "$WORK/metrics.json" "$OUT/training.json"
# The first 300 held-out documents: the tests' sample (tokenizer ids, afd eval golden).
$PY -c 'import sys; d = open(sys.argv[1]).read().split("\n\n"); open(sys.argv[2], "w").write("\n\n".join(d[:300]).strip() + "\n")' \
    "$OUT/eval.txt" "$OUT/eval-sample.txt"
sed -n '/^License: WordNet3.0/,/^Files: debian/p' /usr/share/doc/wordnet-base/copyright | sed '$d' |
    sed 's/^ \.$//; s/^ //' > "$OUT/LICENSE-WordNet"
MTP=()
grep -q '"num_nextn_predict_layers": [1-9]' "$OUT/config.json" && MTP=(--mtp)
R="$WORK/results"
mkdir -p "$R"
"$AFD" --log-level error eval --model "$OUT" --text "$OUT/eval.txt" --precision reference "${MTP[@]}" --json > "$R/eval_reference.json"
"$AFD" --log-level error eval --model "$OUT" --text "$OUT/eval.txt" --precision fast "${MTP[@]}" --json > "$R/eval_fast.json"
rm -rf "$WORK/fp8"
"$AFD" --log-level error quantize --fp8 --model "$OUT" --out "$WORK/fp8" >/dev/null
"$AFD" --log-level error eval --model "$WORK/fp8" --text "$OUT/eval.txt" --precision fast --json > "$R/eval_fp8.json"
PORT=${AFD_PACKAGE_PORT:-8731}
"$AFD" --log-level error serve --model "$OUT" --port "$PORT" > "$R/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
$PY "$HERE/chat_check.py" --url "http://127.0.0.1:$PORT" --words "$OUT/chat_eval.json" --json "$R/chat.json"
kill $SERVER
$PY "$HERE/model_card.py" --model "$OUT" --results "$R" > "$OUT/README.md"
echo "package: $OUT"
