#!/usr/bin/env bash
# Whole decode steps of a bf16 checkpoint and its FP8 block-quantized twin, interleaved:
# each run is one `afd bench --steps 5` per model (one warm-up step, then five timed steps, of
# which the run keeps the median of the last three: in some processes on the shared VM the
# first one to three steps after start-up ran up to 2x slower, docs/bench-log/
# 2026-11-26-fp8-prefetch.md), the two models alternating which goes first, so both see the
# same machine conditions. Prints per
# batch the median and p90 step time of each model over the runs and the FP8 / bf16 ratio of
# tokens/s (median over the interleaved pairs of each pair's ratio); in wall-time mode also the
# FFN half's time (afd bench's ffn_ms of the run's median step: the expert, shared-expert and
# dense products).
# With CPU_TIME=1, a "step" is instead the CPU time of one decode step: perf stat's task-clock
# of `afd bench --steps 11` minus that of `--steps 1`, over 10 — on a machine shared with other
# tenants this excludes the time the process waits for a core (use THREADS=1: a pool thread
# that spins for a preempted peer would count its spin).
#   bench/fp8_decode_compare.sh AFD BF16_DIR FP8_DIR [RUNS=15] [BATCHES=1,64] [CONTEXT=512] [THREADS=2]
set -euo pipefail
AFD=$1 BF=$2 F8=$3
RUNS=${4:-15} BATCHES=${5:-1,64} CTX=${6:-512} THREADS=${7:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cpu_ms() {  # model batch steps -> task-clock ms of the whole afd bench run
  perf stat -x, -e task-clock -o "$TMP/perf" "$AFD" --log-level error bench --model "$1" --batch "$2" --context "$CTX" \
    --steps "$3" --skip-limits --threads "$THREADS" >/dev/null 2>&1
  grep task-clock "$TMP/perf" | cut -d, -f1
}
step_ms() {  # model batch -> ms of one timed step (wall, or CPU with CPU_TIME=1)
  if [ "${CPU_TIME:-0}" = 1 ]; then
    local a b; a=$(cpu_ms "$1" "$2" 11); b=$(cpu_ms "$1" "$2" 1)
    /usr/bin/python3 -c "print(($a - $b) / 10, 0)"
    return
  fi
  "$AFD" --log-level error bench --model "$1" --batch "$2" --context "$CTX" --steps 5 --skip-limits --json \
    --threads "$THREADS" 2>/dev/null |
    /usr/bin/python3 -c 'import json, statistics, sys; r = json.load(sys.stdin)["rows"][0]
print(statistics.median(r["step_times_ms"][2:]), r["ffn_ms"])'
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%F %H:%M UTC'); runs $RUNS, context $CTX, threads $THREADS, $([ "${CPU_TIME:-0}" = 1 ] && echo 'CPU time per step' || echo 'wall time per step')"
for b in ${BATCHES//,/ }; do
  for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then
      x=$(step_ms "$BF" "$b"); y=$(step_ms "$F8" "$b")
    else
      y=$(step_ms "$F8" "$b"); x=$(step_ms "$BF" "$b")
    fi
    echo "$b $x $y" >>"$TMP/steps"
  done
done
/usr/bin/python3 - "$TMP/steps" <<'PY'
import sys, statistics
rows, ffn = {}, {}
for line in open(sys.argv[1]):
    b, x, fx, y, fy = line.split()
    rows.setdefault(int(b), []).append((float(x), float(y)))
    ffn.setdefault(int(b), []).append((float(fx), float(fy)))
def p90(v):
    v = sorted(v); return v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
print("| batch | bf16 step ms median (p90) | fp8 step ms median (p90) | bf16 tok/s (median step) | fp8 tok/s (median step) | fp8 / bf16 tok/s, median of pairs [min, max] | FFN ms bf16 / fp8 (median) | FFN fp8 / bf16 rate, median of pairs |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for b, v in sorted(rows.items()):
    xs = [x for x, _ in v]; ys = [y for _, y in v]; r = [x / y for x, y in v]
    mx, my = statistics.median(xs), statistics.median(ys)
    f = ffn[b]; fr = [x / y for x, y in f if y > 0]
    fcol = (f"{statistics.median([x for x, _ in f]):.2f} / {statistics.median([y for _, y in f]):.2f} | "
            f"{statistics.median(fr):.2f} |") if fr else "- | - |"
    print(f"| {b} | {mx:.2f} ({p90(xs):.2f}) | {my:.2f} ({p90(ys):.2f}) | {1000 * b / mx:.1f} | {1000 * b / my:.1f} | "
          f"{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}] | {fcol}")
PY
