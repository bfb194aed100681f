#!/usr/bin/env bash
# End to end through the CLI: `afd generate --dump-logits` on a golden case, checked by the
# independent reference's check_logits.py (which re-runs the f64 reference on the engine's
# own tokens). Usage: cli_generate_golden.sh AFD_BIN CASE_DIR
set -euo pipefail
AFD=$1; CASE=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
PROMPTS=$(/usr/bin/python3 -c "import json,sys; g=json.load(open('$CASE/golden.json')); print(' '.join(','.join(map(str,p)) for p in g['prompts']))")
MAXTOK=$(/usr/bin/python3 -c "import json; print(json.load(open('$CASE/golden.json')).get('max_new_tokens', 32))")
ARGS=()
for p in $PROMPTS; do ARGS+=(--prompt-ids "$p"); done
"$AFD" generate --model "$CASE" --precision reference --max-tokens "$MAXTOK" --ignore-eos "${ARGS[@]}" \
  --dump-logits "$TMP/logits.f32" > "$TMP/tokens.txt"
/usr/bin/python3 "$ROOT/tests/reference/check_logits.py" "$CASE" "$TMP/logits.f32" $PROMPTS --tol 1e-4
# The printed tokens must be the golden greedy continuations.
/usr/bin/python3 - "$CASE" "$TMP/tokens.txt" <<'PY'
import json, sys
g = json.load(open(sys.argv[1] + "/golden.json"))
got = [list(map(int, l.split(","))) for l in open(sys.argv[2]).read().split()]
assert got == g["greedy_tokens"], f"tokens differ:\n{got}\n{g['greedy_tokens']}"
print("tokens match")
PY
