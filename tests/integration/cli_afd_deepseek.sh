#!/usr/bin/env bash
# AFD equivalence for DeepSeek MLA models through the CLI: every in-process topology gives
# exactly the greedy tokens of the monolithic engine with the wire's rounding
# (--afd-rounding y), on the dsv3-tiny FP8 and V2-style bf16 goldens, in reference precision
# (f32 latent cache) and in fast precision (bf16 latent cache, the bf16 absorbed-decode
# kernel). Usage: cli_afd_deepseek.sh AFD_BIN
set -uo pipefail
AFD=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
fails=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1"; echo " want: $2"; echo " got:  $3"; fails=$((fails+1)); fi; }

for model in dsv3_tiny_fp8 dsv2_style_bf16; do
  for prec in reference fast; do
    P=(--model "$ROOT/tests/reference/data/$model" --precision $prec --max-tokens 12 --ignore-eos --threads 1
       --prompt-ids 3,14,15,92,65 --prompt-ids 35 --prompt-ids 89,79,32,38,46,26,43,17,18,19,20,21,22,23,24,25,26,27)
    want1=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 1) || { echo "FAIL mono run ($model $prec)"; exit 1; }
    want2=$("$AFD" --log-level error generate "${P[@]}" --afd-rounding 2) || { echo "FAIL mono run ($model $prec)"; exit 1; }
    [ -n "$want1" ] || { echo "FAIL mono produced no tokens ($model $prec)"; exit 1; }
    for t in 1A1F 2A1F 1A2F EP2; do
      want=$want1; case $t in *2F|EP2) want=$want2;; esac
      for mb in 1 3; do
        got=$(timeout 120 "$AFD" --log-level error generate "${P[@]}" --topology $t --microbatches $mb)
        check "$model $prec in-process $t, $mb micro-batch(es)" "$want" "$got"
      done
    done
  done
done
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all ok"
