#!/usr/bin/env bash
# FP8 block-quantized weights through the CLI: `afd make-model --dtype fp8` and `afd quantize
# --fp8` write checkpoints that load and run; every AFD wiring (in-process xAyF, EP, FFN tensor
# parallelism with slices on and off the 128 block grid, FFN worker processes over UCX) gives
# exactly the greedy tokens of mono with the same --afd-rounding; `afd quantize --dequantize`
# gives a checkpoint with the same greedy tokens in reference precision; bad input is a clear
# error. Usage: cli_fp8.sh AFD_BIN
set -uo pipefail
AFD=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1"; echo " want: $2"; echo " got:  $3"; fails=$((fails+1)); fi; }

# qwen2_moe (shared expert): hidden 192 and experts of 136 rows span two blocks with a partial
# last one; the tiny preset itself (every block partial) too.
"$AFD" --log-level error make-model --arch qwen2_moe --preset tiny --hidden 192 --head-dim 48 --moe-inter 136 \
  --shared-inter 160 --vocab 300 --dtype fp8 --out "$TMP/m" >/dev/null || { echo "make-model --dtype fp8 failed"; exit 1; }
"$AFD" --log-level error make-model --arch qwen3_moe --preset tiny --dtype fp8 --out "$TMP/tiny" >/dev/null ||
  { echo "make-model tiny --dtype fp8 failed"; exit 1; }
grep -q '"quant_method": "fp8"' "$TMP/m/config.json" && echo "ok   config.json has quantization_config" ||
  { echo "FAIL no quantization_config"; fails=$((fails+1)); }

for M in "$TMP/m" "$TMP/tiny"; do
  P=(--model "$M" --precision reference --max-tokens 16 --ignore-eos --threads 1
     --prompt-ids 3,14,15,92,65 --prompt-ids 35 --prompt-ids 89,79,32,38,46,26,43)
  name=$(basename "$M")
  want1=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 1) || { echo "mono run failed"; exit 1; }
  want2=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2) || { echo "mono run failed"; exit 1; }
  for t in 1A1F 2A2F EP2; do
    want=$want1; case $t in *2F|EP2) want=$want2;; esac
    got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology $t --microbatches 1)
    check "$name in-process $t" "$want" "$got"
  done
  # TP: I = 136 (or 32) split in two: rank 1 starts off the block grid (a block-aligned superset).
  want_tp=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2 --ffn-tp 2) || { echo "mono TP run failed"; exit 1; }
  got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology 1A2F --ffn-tp 2 --microbatches 1)
  check "$name in-process 1A2F --ffn-tp 2" "$want_tp" "$got"
done

# FFN worker processes over UCX (the FP8 weights loaded by each worker process).
P=(--model "$TMP/m" --precision reference --max-tokens 16 --ignore-eos --threads 1
   --prompt-ids 3,14,15,92,65 --prompt-ids 35 --prompt-ids 89,79,32,38,46,26,43)
want2=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2 --microbatches 3)
got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology 2A2F --microbatches 3 --spawn-ffn 2>/dev/null)
check "2A2F with --spawn-ffn (FFN worker processes)" "$want2" "$got"

# quantize --fp8 of a bf16 checkpoint, and --dequantize back: same model in reference precision.
"$AFD" --log-level error make-model --arch qwen3_moe --preset tiny --hidden 192 --head-dim 48 --moe-inter 136 \
  --vocab 300 --out "$TMP/b" >/dev/null
out=$("$AFD" --log-level error quantize --fp8 --model "$TMP/b" --out "$TMP/q") && grep -q "quantized to FP8 blocks" <<<"$out" &&
  echo "ok   quantize --fp8: $out" || { echo "FAIL quantize --fp8: $out"; fails=$((fails+1)); }
"$AFD" --log-level error quantize --dequantize --dtype f32 --model "$TMP/q" --out "$TMP/d" >/dev/null ||
  { echo "FAIL quantize --dequantize"; fails=$((fails+1)); }
Q=(--precision reference --max-tokens 24 --ignore-eos --threads 1 --prompt-ids 3,14,15,92,65 --prompt-ids 35)
check "quantized vs dequantized greedy tokens" "$("$AFD" --log-level error generate --model "$TMP/d" "${Q[@]}")" \
  "$("$AFD" --log-level error generate --model "$TMP/q" "${Q[@]}")"
[ -f "$TMP/q/tokenizer.json" ] && echo "ok   quantize copies the tokenizer" || { echo "FAIL tokenizer not copied"; fails=$((fails+1)); }

# Bad input: clear errors, exit 1.
expect_err() {  # name, expected substring, command...
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -q -- "$want" <<<"$out"; then echo "ok   $name"; else echo "FAIL $name: rc=$rc $out"; fails=$((fails+1)); fi
}
expect_err "quantize an FP8 checkpoint again" "already FP8" "$AFD" quantize --fp8 --model "$TMP/q" --out "$TMP/x"
expect_err "quantize into its own directory" "must differ" "$AFD" quantize --fp8 --model "$TMP/b" --out "$TMP/b"
expect_err "quantize without a mode" "exactly one of" "$AFD" quantize --model "$TMP/b" --out "$TMP/x"
expect_err "make-model bad dtype" "expected bf16, f16, f32 or fp8" "$AFD" make-model --dtype fp4 --out "$TMP/x"
cp -r "$TMP/q" "$TMP/noqc"
/usr/bin/python3 - "$TMP/noqc/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); del c["quantization_config"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect_err "FP8 tensors without quantization_config" "is F8_E4M3 but config.json has no quantization_config" \
  "$AFD" generate --model "$TMP/noqc" --prompt-ids 1 --max-tokens 1

[ $fails -eq 0 ] && echo "all FP8 CLI checks passed" || echo "$fails FP8 CLI check(s) failed"
exit $fails
