#!/usr/bin/env bash
# AFD over a real network path: one FFN worker and one attention host in two network
# namespaces joined by a veth pair, UCX forced onto TCP (shared memory would bypass the
# network), and a one-way delay on every packet from `tc netem` on both veth ends. Prints
# `afd bench --mode afd` rows for 1 and 3 micro-batches at delay 0 and at DELAY_US, so the
# 3-micro-batch pipeline can be compared with 1 micro-batch under the same network delay.
#
# Usage (root, iproute2): bench/netns_ucx.sh MODEL_DIR [DELAY_US|auto] [BATCH] [CONTEXT]
#   DELAY_US: one-way delay per message; auto (default) = half the per-layer attention time
#   measured without delay (the issue's set-up).
# Environment: AFD (binary, default build/apps/afd), AFD_BENCH_ARGS (extra bench flags).
#
# Kernels without the sch_netem module (`tc qdisc add ... netem` answers "Specified qdisc kind
# is unknown") cannot delay packets; the script says so and falls back to afd's own delay
# injection (`--delay-us`, comm::FaultTransport) over the same namespaced TCP path, and labels
# the rows accordingly.
set -euo pipefail
MODEL=${1:?usage: bench/netns_ucx.sh MODEL_DIR [DELAY_US|auto] [BATCH] [CONTEXT]}
DELAY=${2:-auto}
BATCH=${3:-32}
CONTEXT=${4:-512}
AFD=${AFD:-build/apps/afd}
[ "$(id -u)" = 0 ] || { echo "netns_ucx.sh: needs root (ip netns, tc)"; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "netns_ucx.sh: needs iproute2 (ip, tc)"; exit 2; }
[ -x "$AFD" ] || { echo "netns_ucx.sh: $AFD not built"; exit 2; }
MODEL=$(cd "$MODEL" && pwd)
AFD=$(cd "$(dirname "$AFD")" && pwd)/$(basename "$AFD")

NA=afdffn$$ NB=afdattn$$ VA=vafd$$ VB=vbafd$$
ADDR_A=10.231.0.1 ADDR_B=10.231.0.2 PORT=7100
WORKER=""
cleanup() {
  [ -n "$WORKER" ] && kill "$WORKER" 2>/dev/null && wait "$WORKER" 2>/dev/null || true
  ip netns del "$NA" 2>/dev/null || true
  ip netns del "$NB" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$NA"
ip netns add "$NB"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$NA"
ip link set "$VB" netns "$NB"
ip -n "$NA" addr add "$ADDR_A/24" dev "$VA"
ip -n "$NB" addr add "$ADDR_B/24" dev "$VB"
for ns in "$NA" "$NB"; do ip -n "$ns" link set lo up; done
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up

export UCX_TLS=tcp UCX_NET_DEVICES=all
ip netns exec "$NA" "$AFD" worker --role ffn --model "$MODEL" --listen "$ADDR_A:$PORT" --attention 1 \
  >"/tmp/netns_ucx_worker.$$.log" 2>&1 &
WORKER=$!

netem=1
if ! tc -n "$NA" qdisc add dev "$VA" root netem delay 0us 2>/tmp/netns_ucx_tc.$$; then
  echo "netns_ucx.sh: tc netem unavailable on this kernel ($(cat /tmp/netns_ucx_tc.$$)): the delay is injected by afd's transport wrapper (--delay-us) over the same namespaced TCP path instead"
  netem=0
fi
rm -f /tmp/netns_ucx_tc.$$

bench() {  # bench DELAY_FLAG_ARGS...
  ip netns exec "$NB" "$AFD" bench --model "$MODEL" --mode afd --topology 1A1F --ffn "$ADDR_A:$PORT" \
    --microbatches 1,3 --batch "$BATCH" --context "$CONTEXT" --skip-limits ${AFD_BENCH_ARGS:-} "$@"
}

echo "== AFD 1A1F over UCX/TCP between network namespaces (veth), batch $BATCH, context $CONTEXT"
if [ $netem = 1 ]; then
  echo "-- no delay"
  bench
  d=$DELAY
  if [ "$d" = auto ]; then
    # Half the per-layer attention time of the no-delay 1-micro-batch run.
    d=$(bench --json | /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin)['rows']; a=[x for x in r if x['wiring']!='mono'][0]; print(max(1,int(a['attention_ms']*1e3/len(a['layers'])/2)))")
  fi
  echo "-- netem one-way delay ${d} us on both veth ends"
  tc -n "$NA" qdisc change dev "$VA" root netem delay "${d}us"
  tc -n "$NB" qdisc add dev "$VB" root netem delay "${d}us"
  bench
else
  echo "-- transport-injected one-way delay ($DELAY) on the namespaced TCP path"
  bench --delay-us "$DELAY"
fi
