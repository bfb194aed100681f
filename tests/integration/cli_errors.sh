#!/usr/bin/env bash
# Bad input to the CLI: a clear error naming the problem, a non-zero exit, never a crash
# (exit codes >= 128 are signals; 70 is an internal error). Usage: cli_errors.sh AFD_BIN
set -uo pipefail
AFD=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M=$ROOT/tests/reference/data/qwen3_gqa2_top2_untied
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
expect_error() {  # expect_error "what" "pattern" cmd...
  local what=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 70 ]; then echo "FAIL $what: exit $rc"; fails=$((fails+1)); return; fi
  if ! grep -qiE "$pat" <<<"$out"; then echo "FAIL $what: message '$out' lacks /$pat/"; fails=$((fails+1)); return; fi
  echo "ok   $what: $out"
}
expect_error "token outside vocab" "outside the vocabulary" "$AFD" generate --model "$M" --prompt-ids 1,2,99999
expect_error "negative token" "not a valid token" "$AFD" generate --model "$M" --prompt-ids 1,-5
expect_error "non-integer id" "not an integer" "$AFD" generate --model "$M" --prompt-ids 1,x
expect_error "missing model dir" "no such file" "$AFD" generate --model "$TMP/none" --prompt-ids 1
expect_error "context too long" "max_position_embeddings" "$AFD" generate --model "$M" --prompt-ids 1 --max-tokens 600
expect_error "bad temperature" "temperature" "$AFD" generate --model "$M" --prompt-ids 1 --temperature -1
expect_error "bad top_p" "top_p" "$AFD" generate --model "$M" --prompt-ids 1 --temperature 1 --top-p 0
expect_error "bad precision" "precision" "$AFD" generate --model "$M" --prompt-ids 1 --precision fp4
expect_error "bad micro-batches" "micro-batches" "$AFD" generate --model "$M" --prompt-ids 1 --microbatches 9
expect_error "an FFN worker listed twice" "listed twice" "$AFD" generate --model "$M" --prompt-ids 1 --ffn 127.0.0.1:5,127.0.0.1:5
expect_error "an attention worker listed twice" "listed twice" "$AFD" serve --model "$M" --attention-workers 127.0.0.1:5,127.0.0.1:5
expect_error "no attention worker named" "names no attention worker" "$AFD" serve --model "$M" --attention-workers ""
echo '{}' >"$TMP/topo.json"
expect_error "a topology file and another topology" "excludes" "$AFD" serve --topology-file "$TMP/topo.json" --topology 2A1F
expect_error "a topology file without --role" "requires --role" "$AFD" worker --topology-file "$TMP/topo.json" --index 0
expect_error "bench --mode afd on mono" "mono has no FFN workers" "$AFD" bench --model "$M" --mode afd --topology mono --batch 1 --context 8 --steps 1 --skip-limits
expect_error "bench without timed steps" "steps" "$AFD" bench --model "$M" --batch 1 --context 8 --steps 0 --skip-limits
# Corrupt checkpoints.
cp -r "$M" "$TMP/trunc"; truncate -s 1000 "$TMP/trunc/model.safetensors"
expect_error "truncated safetensors" "model.safetensors" "$AFD" generate --model "$TMP/trunc" --prompt-ids 1
# A multi-process bundle whose workers cannot load the model fails as a whole, with the
# worker's reason, instead of restarting them forever; no worker is left behind.
"$AFD" --log-level error make-model --preset tiny --seed 1 --out "$TMP/bundle" >/dev/null
for f in "$TMP"/bundle/*.safetensors; do truncate -s 1000 "$f"; done
expect_error "bundle with a corrupt model" "before the bundle came up" \
  timeout 60 "$AFD" serve --model "$TMP/bundle" --topology 1A1F --threads 1 --port 0
sleep 0.3
if pgrep -f -- "--model $TMP/bundle" >/dev/null; then echo "FAIL workers of the failed bundle left running"; fails=$((fails+1)); fi
cp -r "$M" "$TMP/noconf"; rm "$TMP/noconf/config.json"
expect_error "missing config" "config.json" "$AFD" generate --model "$TMP/noconf" --prompt-ids 1
cp -r "$M" "$TMP/arch"; sed -i 's/"qwen3_moe"/"llama4_text"/' "$TMP/arch/config.json"
expect_error "unknown architecture" "llama4_text|model_type" "$AFD" generate --model "$TMP/arch" --prompt-ids 1
cp -r "$M" "$TMP/shape"; sed -i 's/"hidden_size": 64/"hidden_size": 96/' "$TMP/shape/config.json"
expect_error "shape disagrees with config" "shape|hidden" "$AFD" generate --model "$TMP/shape" --prompt-ids 1
cp -r "$M" "$TMP/garbage"; head -c 4096 /dev/urandom > "$TMP/garbage/model.safetensors"
expect_error "garbage safetensors" "model.safetensors" "$AFD" generate --model "$TMP/garbage" --prompt-ids 1
expect_error "unknown FFN device" "ffn-device|cpu, cuda" "$AFD" generate --model "$M" --prompt-ids 1 --ffn-device tpu
if ! command -v nvidia-smi >/dev/null 2>&1; then  # no GPU: the cuda device is a clear error, not a crash
  expect_error "cuda without a GPU" "unavailable" "$AFD" generate --model "$M" --prompt-ids 1 --ffn-device cuda
  expect_error "cuda FFN worker without a GPU" "unavailable" "$AFD" worker --role ffn --model "$M" --ffn-device cuda --listen 127.0.0.1:0
fi
echo "$fails failed"
[ $fails -eq 0 ]
