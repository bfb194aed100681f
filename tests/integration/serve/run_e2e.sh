#!/usr/bin/env bash
# End to end: a tiny random-weight model (afd make-model + the serving tokenizer writer),
# `afd serve` on a free loopback port with an API key, and the official `openai` npm
# client (node/e2e.mjs) against it. Usage: run_e2e.sh AFD_BIN WRITE_TOKENIZER_BIN
set -euo pipefail
AFD=$1
WRITE_TOK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

command -v node >/dev/null || { echo "node is required (scripts/install-deps.sh installs it)"; exit 1; }
# The client comes from the committed lock file.
(cd "$HERE/node" && npm ci --no-audit --no-fund --loglevel=error)

"$AFD" make-model --preset tiny --seed 3 --out "$WORK/tiny" >/dev/null
"$WRITE_TOK" "$WORK/tiny" "$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$WORK/tiny/config.json")" >/dev/null

"$AFD" serve --model "$WORK/tiny" --model-name tiny --port 0 --api-key e2e-key >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
PORT=
for _ in $(seq 1 200); do
  PORT=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.log" | head -1)
  [[ -n "$PORT" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
[[ -n "$PORT" ]] || { echo "server did not start"; cat "$WORK/serve.log"; exit 1; }

# Without the key: 401.
code=$(node -e "fetch('http://127.0.0.1:$PORT/v1/models').then(r => console.log(r.status))")
[[ "$code" == 401 ]] || { echo "expected 401 without the API key, got $code"; exit 1; }

node "$HERE/node/e2e.mjs" "http://127.0.0.1:$PORT/v1" tiny e2e-key
