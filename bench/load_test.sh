#!/usr/bin/env bash
# Bounded serving load test: builds a model dir (afd make-model + tokenizer files), starts
# `afd serve` on a free loopback port and runs bench/load_test.mjs against it.
# Usage: bench/load_test.sh BUILD_DIR [PRESET=tiny] [CLIENTS=128] [SECONDS=60] [MAX_TOKENS=32] [extra serve flags...]
set -euo pipefail
BUILD=${1:?build dir}
PRESET=${2:-tiny}
CLIENTS=${3:-128}
SECS=${4:-60}
MAXTOK=${5:-32}
shift $(( $# < 5 ? $# : 5 ))
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
PID=
trap '[[ -n "$PID" ]] && kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$WORK"' EXIT
"$BUILD/apps/afd" make-model --preset "$PRESET" --seed 1 --out "$WORK/m" >/dev/null
if [[ ! -f "$WORK/m/tokenizer.json" ]]; then
  "$BUILD/tests/integration/serve/afd_test_write_tokenizer" "$WORK/m" \
    "$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$WORK/m/config.json")" >/dev/null
fi
"$BUILD/apps/afd" serve --model "$WORK/m" --port 0 --max-running "$CLIENTS" "$@" >"$WORK/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 300); do
  PORT=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.log" | head -1)
  [[ -n "${PORT:-}" ]] && break
  kill -0 $PID || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
node "$ROOT/bench/load_test.mjs" --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --seconds "$SECS" --max-tokens "$MAXTOK"
rc=$?
curl -s "http://127.0.0.1:$PORT/metrics" > "$WORK/metrics.txt" 2>/dev/null || true
grep -E '^afd_(generation_tokens_total|requests_total|preemptions_total|worker_idle_ratio|engine_steps_total)' "$WORK/metrics.txt" || true
exit $rc
