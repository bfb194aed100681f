#!/bin/bash
# Speculative decoding side by side with llama.cpp (docs/BENCHMARKS.md "Speculative decoding"):
# batch 1, greedy, 256 tokens, EOS ignored, 2 threads, on the first 8 held-out headword prompts
# of the default model ("space (noun):" ...), two passes. llama.cpp: llama-lookup (its n-gram
# prompt-lookup decoding) with --spec-draft-n-max 0 (no drafts) and 3, on the model's GGUF twin
# from bench/gguf_convert.py; afd: `afd generate` without speculation and with
# `--speculative ngram --draft-tokens 3`, on the same prompts' ids (IDS: one line per prompt, as
# `afd eval --dump-tokens` writes them for the same text). Prints one line per run: setting,
# prompt, decode tokens/s. llama.cpp is built by hand outside the repository.
#   bench/spec_vs_llama_lookup.sh LLAMA_BIN_DIR MODEL.gguf IDS > out.txt
set -e
B=${1:?llama.cpp bin dir}
GGUF=${2:?gguf}
IDS=${3:?prompt ids file}
A=${AFD:-build/apps/afd}
M=${MODEL:-assets/models/wordnet-dsv3}
grep -E "^[a-z][^:]{0,40} \((noun|verb|adjective|adverb)\):" $M/eval.txt | head -8 | sed -E 's/^(.*\)):.*/\1:/' > ${TMPDIR:-/tmp}/afd_headwords.txt
for pass in 1 2; do
i=0
while IFS= read -r P; do
  i=$((i+1))
  ids=$(sed -n "${i}p" $IDS)
  for n in 0 3; do
    r=$($B/llama-lookup -m $GGUF -p "$P" -n 256 --temp 0 -t 2 -c 2048 --ignore-eos --spec-draft-n-max $n 2>&1 | grep "decoded" | sed -E 's/.*speed: ([0-9.]+).*/\1/')
    echo "llama k=$n prompt=$i $r"
  done
  for s in "none" "ngram --draft-tokens 3"; do
    r=$($A generate --model $M --prompt-ids $ids --max-tokens 257 --ignore-eos --threads 2 --speculative $s 2>&1 | grep "tok/s" | sed -E 's/.*steps, ([0-9.]+) tok\/s.*/\1/')
    echo "afd $s prompt=$i $r"
  done
done < ${TMPDIR:-/tmp}/afd_headwords.txt
done
