#!/usr/bin/env bash
# `afd serve|worker --print-config`: the effective settings as JSON, each with its source
# (default, topology file, env AFD_X, flag --x), in the order file < env < flag; exit 0;
# a bad value is an error naming where it came from. Usage: cli_print_config.sh AFD_BIN
set -uo pipefail
AFD=$1
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails+1)); }
# check "what" JSON_FILE KEY VALUE SOURCE: .KEY.value == VALUE (as JSON) and .KEY.source == SOURCE
check() {
  local what=$1 file=$2 key=$3 value=$4 source=$5
  if /usr/bin/python3 - "$file" "$key" "$value" "$source" <<'PY'
import json, sys
f, key, value, source = sys.argv[1:]
c = json.load(open(f))
e = c[key]
sys.exit(0 if e["value"] == json.loads(value) and e["source"] == source else 1)
PY
  then ok "$what"; else bad "$what: $key = $(/usr/bin/python3 -c "import json,sys; print(json.load(open('$file')).get('$key'))")"; fi
}

"$AFD" serve --print-config >"$TMP/d.json"; rc=$?
[ $rc = 0 ] && ok "serve --print-config exits 0" || bad "serve --print-config: exit $rc"
check "default port" "$TMP/d.json" port 8000 default
check "default model" "$TMP/d.json" model '"models/tiny"' default
check "default kv_dtype" "$TMP/d.json" kv_dtype '"bf16"' default
check "a flag is a bool" "$TMP/d.json" spawn_workers false default

AFD_PORT=9001 AFD_MAX_RUNNING=7 "$AFD" serve --port 9002 --kv-dtype fp8 --print-config >"$TMP/e.json"
check "flag over env" "$TMP/e.json" port 9002 "flag --port"
check "env" "$TMP/e.json" max_running 7 "env AFD_MAX_RUNNING"
check "flag" "$TMP/e.json" kv_dtype '"fp8"' "flag --kv-dtype"

cat >"$TMP/t.json" <<'JSON'
{"model": "m", "precision": "reference", "threads": 2, "scheduler": {"max_running": 8, "kv_block": 32},
 "frontend": {"listen": "127.0.0.1:8123", "api_key": "s3cret"},
 "attention": [{"address": "127.0.0.1:8101", "microbatches": 2}],
 "ffn": [{"address": "127.0.0.1:7100", "threads": 3, "metrics": "127.0.0.1:9100"}]}
JSON
"$AFD" serve --topology-file "$TMP/t.json" --print-config >"$TMP/f.json"; rc=$?
[ $rc = 0 ] && ok "serve --topology-file --print-config exits 0" || bad "serve --topology-file --print-config: exit $rc"
check "front end port from the file" "$TMP/f.json" port 8123 "topology file $TMP/t.json: frontend.listen"
check "model resolved against the file" "$TMP/f.json" model "\"$TMP/m\"" "topology file $TMP/t.json: frontend.model (or the top level's)"
check "api key hidden" "$TMP/f.json" api_key '"(set)"' "topology file $TMP/t.json: frontend.api_key"
grep -q s3cret "$TMP/f.json" && bad "the API key is printed" || ok "the API key is not printed"
AFD_PORT=9005 "$AFD" serve --topology-file "$TMP/t.json" --print-config >"$TMP/g.json"
check "env over file" "$TMP/g.json" port 9005 "env AFD_PORT"

AFD_KV_BLOCK=64 "$AFD" worker --topology-file "$TMP/t.json" --role attention --index 0 --threads 4 --print-config >"$TMP/a.json"; rc=$?
[ $rc = 0 ] && ok "worker --print-config exits 0" || bad "worker --print-config: exit $rc"
check "worker: flag over file" "$TMP/a.json" threads 4 "flag --threads"
check "worker: env over file" "$TMP/a.json" kv_block 64 "env AFD_KV_BLOCK"
check "worker: scheduler value" "$TMP/a.json" max_running 8 "topology file $TMP/t.json: scheduler.max_running"
check "worker: its own value" "$TMP/a.json" microbatches '"2"' "topology file $TMP/t.json: attention[0].microbatches"
check "worker: its FFN peers" "$TMP/a.json" ffn '"127.0.0.1:7100"' "topology file $TMP/t.json: ffn[*].address"
check "worker: precision" "$TMP/a.json" precision '"reference"' "topology file $TMP/t.json: precision"
"$AFD" worker --topology-file "$TMP/t.json" --role ffn --index 0 --print-config >"$TMP/b.json"
check "ffn worker: own threads over the file's" "$TMP/b.json" threads 3 "topology file $TMP/t.json: ffn[0].threads"
check "ffn worker: shard" "$TMP/b.json" shard '"0/1"' "topology file $TMP/t.json: ffn[0] (its place in the list)"
check "ffn worker: metrics" "$TMP/b.json" metrics_listen '"127.0.0.1:9100"' "topology file $TMP/t.json: ffn[0].metrics"

# Validation: the whole is checked before printing; a bad value names its flag / source.
out=$("$AFD" serve --max-running 0 --print-config 2>&1); rc=$?
[ $rc != 0 ] && [ $rc -lt 70 ] && grep -q -- "--max-running" <<<"$out" && ok "invalid flag value refused: $out" ||
  bad "--max-running 0 --print-config: rc $rc: $out"
out=$(AFD_MAX_RUNNING=0 "$AFD" serve --print-config 2>&1); rc=$?
[ $rc != 0 ] && [ $rc -lt 70 ] && grep -q -- "--max-running: env AFD_MAX_RUNNING" <<<"$out" &&
  ok "invalid env value refused, naming its source: $out" || bad "AFD_MAX_RUNNING=0: rc $rc: $out"
cat >"$TMP/tp.json" <<'JSON'
{"model": "m", "ffn_parts": 2, "ffn_tp": 2,
 "attention": [{"address": "127.0.0.1:8101"}], "ffn": [{"address": "127.0.0.1:7100"}, {"address": "127.0.0.1:7101"}]}
JSON
out=$("$AFD" worker --topology-file "$TMP/tp.json" --role attention --index 0 2>&1); rc=$?
[ $rc != 0 ] && [ $rc -lt 70 ] && grep -q -- "--ffn-parts: topology file $TMP/tp.json: ffn_parts" <<<"$out" &&
  ok "inconsistent file values refused before the worker starts, naming the file: $out" || bad "tp.json: rc $rc: $out"
out=$(AFD_FFN_DEVICE=gpu "$AFD" serve --print-config 2>&1); rc=$?
[ $rc != 0 ] && [ $rc -lt 70 ] && grep -q "AFD_FFN_DEVICE\|--ffn-device" <<<"$out" && ok "invalid env value refused: $out" ||
  bad "AFD_FFN_DEVICE=gpu: rc $rc: $out"
out=$("$AFD" worker --topology-file "$TMP/t.json" --role attention --index 0 --ffn-parts 2 --ffn-tp 2 --print-config 2>&1); rc=$?
[ $rc != 0 ] && [ $rc -lt 70 ] && grep -q -- "--ffn-parts: flag --ffn-parts" <<<"$out" && grep -q -- "--ffn-tp: flag --ffn-tp" <<<"$out" &&
  ok "inconsistent settings refused, with their sources: $out" ||
  bad "--ffn-parts 2 --ffn-tp 2: rc $rc: $out"

[ $fails = 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
