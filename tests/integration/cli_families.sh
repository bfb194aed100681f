#!/usr/bin/env bash
# The DeepSeek and Step-3 families through the CLI: `afd make-model` -> `afd quantize` ->
# `afd generate` for step3_text (bf16 and fp8), make-model'd checkpoints (Step-3 with head_dim
# 64 and 256; DeepSeek v3/v2) against the float64 oracle; every AFD wiring of a Step-3 checkpoint
# (in-process xAyF and EP, FFN tensor parallelism, FFN worker processes over UCX) gives
# exactly the greedy tokens of the monolithic engine with the same wire rounding; likewise
# DeepSeek v3/v2 (FFN TP, FFN worker processes). Usage: cli_families.sh AFD_BIN
set -uo pipefail
AFD=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails+1)); }
check() {  # check WHAT WANT GOT: equal and not empty
  if [ -n "$2" ] && [ "$2" = "$3" ]; then ok "$1"; else bad "$1"; echo " want: $2"; echo " got:  $3"; fi; }
ntok() { tr ',' '\n' <<<"$1" | grep -c .; }

# make-model -> generate, and make-model bf16 -> quantize --fp8 -> generate.
for dt in bf16 fp8; do
  "$AFD" --log-level error make-model --arch step3_text --preset tiny --dtype $dt --seed 3 --out "$TMP/s3_$dt" >/dev/null ||
    { bad "make-model step3_text $dt"; continue; }
  got=$("$AFD" --log-level error generate --model "$TMP/s3_$dt" --precision reference --max-tokens 12 --ignore-eos \
        --prompt-ids 5,17,300,2 2>"$TMP/err") && [ "$(ntok "$got")" = 12 ] && ok "step3_text $dt generates: $got" ||
    bad "step3_text $dt generate: $got $(cat "$TMP/err")"
done
"$AFD" --log-level error quantize --fp8 --model "$TMP/s3_bf16" --out "$TMP/s3_q" >/dev/null && \
  got=$("$AFD" --log-level error generate --model "$TMP/s3_q" --precision reference --max-tokens 12 --ignore-eos \
        --prompt-ids 5,17,300,2 2>"$TMP/err") && [ "$(ntok "$got")" = 12 ] && ok "step3_text quantized generates: $got" ||
  bad "step3_text quantize --fp8 -> generate: $got $(cat "$TMP/err")"

# make-model's checkpoints against the independent float64 oracle (which reads the HF layout
# itself): Step-3 with head_dim 64 (bf16) and 256 (fp8, the real model's head).
oracle() {  # oracle NAME DIR: afd generate --dump-logits, then check_logits.py
  "$AFD" --log-level error generate --model "$2" --precision reference --max-tokens 6 --ignore-eos \
    --prompt-ids 5,17,300,2 --prompt-ids 7 --dump-logits "$TMP/$1.f32" >/dev/null 2>"$TMP/err" &&
  /usr/bin/python3 "$ROOT/tests/reference/check_logits.py" "$2" "$TMP/$1.f32" 5,17,300,2 7 --max-new-tokens 6 \
    --tol 1e-4 >"$TMP/$1.check" 2>&1 && ok "$1 matches the reference: $(tail -1 "$TMP/$1.check")" ||
  bad "$1 vs reference: $(cat "$TMP/err" "$TMP/$1.check" 2>/dev/null | tail -3)"
}
oracle step3_bf16 "$TMP/s3_bf16"
oracle step3_quantized "$TMP/s3_q"
"$AFD" --log-level error make-model --arch step3_text --preset tiny --head-dim 256 --dtype fp8 --seed 5 \
  --out "$TMP/s3_hd256" >/dev/null && oracle step3_fp8_head256 "$TMP/s3_hd256" || bad "make-model step3 head 256"

# AFD wirings of the Step-3 golden checkpoint (FP8, one K/V head, low-rank query, stacked experts).
M=$ROOT/tests/reference/data/step3_tiny_fp8
P=(--model "$M" --precision reference --max-tokens 16 --ignore-eos --threads 1
   --prompt-ids 3,14,15,92,65 --prompt-ids 35 --prompt-ids 89,79,32,38,46,26,43)
want1=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 1) || { echo "mono run failed"; exit 1; }
want2=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2) || { echo "mono run failed"; exit 1; }
for t in 1A1F 2A1F 1A2F 2A2F EP2; do
  want=$want1; case $t in *2F|EP2) want=$want2;; esac
  for mb in 1 3; do
    got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology $t --microbatches $mb)
    check "step3 in-process $t, $mb micro-batch(es)" "$want" "$got"
  done
done
want_tp=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2 --ffn-tp 2) || { echo "mono TP run failed"; exit 1; }
got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology 1A2F --ffn-tp 2)
check "step3 in-process 1A2F --ffn-tp 2" "$want_tp" "$got"
# FFN TP over FP8 experts whose halves (80 of 160 rows) do not start on a 128-block.
Q=(--model "$TMP/s3_fp8" --precision reference --max-tokens 12 --ignore-eos --threads 1 --prompt-ids 5,17,300,2 --prompt-ids 9)
want_q=$("$AFD" --log-level error generate "${Q[@]}" --afd-rounding 2 --ffn-tp 2) || { echo "mono TP run failed"; exit 1; }
got=$(timeout 120 "$AFD" --log-level error generate "${Q[@]}" --topology 1A2F --ffn-tp 2)
check "step3 fp8 (partial blocks) 1A2F --ffn-tp 2" "$want_q" "$got"
# FFN workers as separate processes (UCX): they load the same checkpoint and pass the
# attention side's model-fingerprint handshake.
got=$(timeout 180 "$AFD" --log-level error generate "${P[@]}" --topology 1A2F --spawn-ffn 2>"$TMP/spawn.err") || cat "$TMP/spawn.err"
check "step3 1A2F with spawned FFN worker processes" "$want2" "$got"

# DeepSeek (MLA): make-model (FP8, partial edge blocks) -> generate -> the oracle.
for a in deepseek_v3 deepseek_v2; do
  "$AFD" --log-level error make-model --arch $a --preset tiny --dtype fp8 --seed 3 --out "$TMP/$a" >/dev/null ||
    { bad "make-model $a"; continue; }
  out=$("$AFD" --log-level error generate --model "$TMP/$a" --precision reference --max-tokens 8 --ignore-eos \
        --prompt-ids 5,17,300,2 2>"$TMP/err"); rc=$?
  err=$(cat "$TMP/err")
  if [ $rc = 0 ] && [ "$(ntok "$out")" = 8 ]; then
    ok "$a generates: $out"
    oracle "$a" "$TMP/$a"
    # make-model bf16 -> quantize --fp8 -> the oracle (it dequantizes the stored blocks itself).
    "$AFD" --log-level error make-model --arch $a --preset tiny --seed 4 --out "$TMP/${a}_bf16" >/dev/null &&
      "$AFD" --log-level error quantize --fp8 --model "$TMP/${a}_bf16" --out "$TMP/${a}_q" >/dev/null &&
      oracle "${a}_quantized" "$TMP/${a}_q" || bad "$a make-model bf16 -> quantize --fp8"
    # FFN TP over FP8 experts with partial blocks, and FFN worker processes (the in-process
    # wirings of the DeepSeek goldens: cli_afd_deepseek.sh).
    D=(--model "$TMP/$a" --precision reference --max-tokens 8 --ignore-eos --threads 1 --prompt-ids 5,17,300,2 --prompt-ids 9)
    want_tp=$("$AFD" --log-level error generate "${D[@]}" --afd-rounding 2 --ffn-tp 2 2>"$TMP/err")
    got=$(timeout 120 "$AFD" --log-level error generate "${D[@]}" --topology 1A2F --ffn-tp 2 2>"$TMP/err")
    check "$a 1A2F --ffn-tp 2" "$want_tp" "$got"
    want2=$("$AFD" --log-level error generate "${D[@]}" --afd-rounding 2 2>"$TMP/err")
    got=$(timeout 180 "$AFD" --log-level error generate "${D[@]}" --topology 1A2F --spawn-ffn 2>"$TMP/err")
    check "$a 1A2F with spawned FFN worker processes" "$want2" "$got"
  else bad "$a generate: rc=$rc $out $err"; fi
done

[ $fails = 0 ] && echo "all family checks passed" || { echo "$fails check(s) failed"; exit 1; }
