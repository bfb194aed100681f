#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEED_DIR WORK_DIR SECONDS [extra libFuzzer flags...]
# Runs a libFuzzer binary for a bounded time on a copy of the seed corpus; new inputs go to
# WORK_DIR (wiped first), so the committed seeds never change. Exit status is the fuzzer's.
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 secs=$4
shift 4
rm -rf "$work"
mkdir -p "$work"
exec "$fuzzer" -max_total_time="$secs" -runs=5000000 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$@" "$work" "$seeds"
