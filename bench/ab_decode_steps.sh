#!/usr/bin/env bash
# Two afd builds (or two models) on whole decode steps, interleaved: each pair runs
# `afd bench --steps 6` once with A and once with B (alternating which goes first), keeps the
# median of each run's steps 3-6 (the first steps of a process can run slow on a shared VM),
# and prints the medians of A and B and the median [min, max] of the pairs' A / B time ratios.
#   bench/ab_decode_steps.sh AFD_A AFD_B MODEL_A [MODEL_B=MODEL_A] [PAIRS=5] [BATCH=1] [CONTEXT=512]
set -euo pipefail
A=$1 B=$2 MA=$3 MB=${4:-$3} N=${5:-5} BATCH=${6:-1} CTX=${7:-512}
run() {  # afd model -> the median of steps 3-6, ms
  "$1" --log-level error bench --model "$2" --batch "$BATCH" --context "$CTX" --steps 6 --skip-limits --json \
    2>/dev/null | /usr/bin/python3 -c 'import json, statistics, sys
print(statistics.median(json.load(sys.stdin)["rows"][0]["step_times_ms"][2:]))'
}
for i in $(seq "$N"); do
  if [ $((i % 2)) = 1 ]; then a=$(run "$A" "$MA"); b=$(run "$B" "$MB"); else b=$(run "$B" "$MB"); a=$(run "$A" "$MA"); fi
  echo "$a $b"
done | /usr/bin/python3 -c '
import statistics as st, sys
p = [tuple(map(float, l.split())) for l in sys.stdin]
r = sorted(a / b for a, b in p)
print("A median %.2f ms, B median %.2f ms, A / B time: median %.3f [%.3f, %.3f] over %d pairs"
      % (st.median(a for a, _ in p), st.median(b for _, b in p), st.median(r), r[0], r[-1], len(p)))'
