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
# is unknown") cannot delay packets in the qdisc. The script then joins the namespaces with
# bench/tun_delay instead of the veth pair: two TUN devices and a user-space delay line that
# holds every packet DELAY_US before passing it on (build it with `ninja -C build tun_delay`;
# TUN_DELAY names another binary). The delay line adds its own per-packet forwarding cost,
# so its no-delay rows are runs through it with DELAY_US 0, and the FFN worker is restarted
# with each delay line. Without /dev/net/tun or that binary, the script falls back to afd's
# own delay injection (`--delay-us`, comm::FaultTransport) over the namespaced veth path.
# Every mode labels its rows.
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
TUN_DELAY=${TUN_DELAY:-$(dirname "$AFD")/../bench/tun_delay}

NA=afdffn$$ NB=afdattn$$ VA=vafd$$ VB=vbafd$$
ADDR_A=10.231.0.1 ADDR_B=10.231.0.2 PORT=7100
WORKER="" LINE=""
cleanup() {
  [ -n "$WORKER" ] && kill "$WORKER" 2>/dev/null && wait "$WORKER" 2>/dev/null || true
  [ -n "$LINE" ] && kill "$LINE" 2>/dev/null && wait "$LINE" 2>/dev/null || true
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
for ns in "$NA" "$NB"; do
  ip -n "$ns" link set lo up
  # Request/response traffic with pauses: do not fall back to slow start after each pause.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
done
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up
ip -n "$NA" route replace 10.231.0.0/24 dev "$VA" initcwnd 64 initrwnd 64
ip -n "$NB" route replace 10.231.0.0/24 dev "$VB" initcwnd 64 initrwnd 64

export UCX_TLS=tcp UCX_NET_DEVICES=all
# Eager messages over TCP: UCX's rendezvous adds round trips per message (request, reply,
# data), which a network delay multiplies (docs/BENCHMARKS.md "AFD pipeline"). TCP copies
# either way, so rendezvous buys nothing here. Override by exporting UCX_RNDV_THRESH.
export UCX_RNDV_THRESH=${UCX_RNDV_THRESH:-inf}
start_worker() {
  ip netns exec "$NA" "$AFD" worker --role ffn --model "$MODEL" --listen "$ADDR_A:$PORT" --attention 1 \
    >"/tmp/netns_ucx_worker.$$.log" 2>&1 &
  WORKER=$!
}
stop_worker() {
  kill "$WORKER" 2>/dev/null && wait "$WORKER" 2>/dev/null || true
  WORKER=""
}

mode=netem
if ! tc -n "$NA" qdisc add dev "$VA" root netem delay 0us 2>/tmp/netns_ucx_tc.$$; then
  why=$(cat /tmp/netns_ucx_tc.$$)
  if [ -x "$TUN_DELAY" ] && [ -c /dev/net/tun ]; then
    echo "netns_ucx.sh: tc netem unavailable on this kernel ($why): the namespaces are joined by a user-space delay line ($TUN_DELAY) instead"
    mode=tun
    ip -n "$NA" link del "$VA"  # the delay line's TUN devices replace the veth pair
  else
    echo "netns_ucx.sh: tc netem unavailable on this kernel ($why) and no delay line ($TUN_DELAY, /dev/net/tun): the delay is injected by afd's transport wrapper (--delay-us) over the same namespaced TCP path instead"
    mode=inject
  fi
fi
rm -f /tmp/netns_ucx_tc.$$
[ $mode = tun ] || start_worker

# Delay line mode: TUN devices joined with a one-way delay of $1 us, then a fresh FFN worker.
TA=tafd$$ TB=tbafd$$
start_line() {
  "$TUN_DELAY" "$NA" "$TA" "$NB" "$TB" "$1" >"/tmp/netns_ucx_line.$$" 2>&1 &
  LINE=$!
  for _ in $(seq 50); do grep -q ready "/tmp/netns_ucx_line.$$" && break; sleep 0.1; done
  grep -q ready "/tmp/netns_ucx_line.$$" || { echo "netns_ucx.sh: delay line failed: $(cat /tmp/netns_ucx_line.$$)"; exit 1; }
  ip -n "$NA" addr add "$ADDR_A" peer "$ADDR_B" dev "$TA"
  ip -n "$NB" addr add "$ADDR_B" peer "$ADDR_A" dev "$TB"
  ip -n "$NA" link set "$TA" up mtu 9000
  ip -n "$NB" link set "$TB" up mtu 9000
  # An f2a frame (batch x hidden x 2 B) can exceed TCP's initial window of 10 segments,
  # which would cost every such frame an extra round trip; data-centre hosts raise it.
  ip -n "$NA" route replace "$ADDR_B" dev "$TA" initcwnd 64 initrwnd 64
  ip -n "$NB" route replace "$ADDR_A" dev "$TB" initcwnd 64 initrwnd 64
  start_worker
}
stop_line() {
  stop_worker
  kill "$LINE" 2>/dev/null && wait "$LINE" 2>/dev/null || true
  LINE=""
  rm -f "/tmp/netns_ucx_line.$$"
}

bench() {  # bench DELAY_FLAG_ARGS...
  ip netns exec "$NB" "$AFD" bench --model "$MODEL" --mode afd --topology 1A1F --ffn "$ADDR_A:$PORT" \
    --microbatches 1,3 --batch "$BATCH" --context "$CONTEXT" --skip-limits ${AFD_BENCH_ARGS:-} "$@"
}

# Half the per-layer attention time of the no-delay 1-micro-batch run (DELAY auto).
auto_delay() {
  bench --json | /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin)['rows']; a=[x for x in r if x['wiring']!='mono'][0]; print(max(1,int(a['attention_ms']*1e3/len(a['layers'])/2)))"
}

case $mode in
netem)
  echo "== AFD 1A1F over UCX/TCP between network namespaces (veth), batch $BATCH, context $CONTEXT, UCX_RNDV_THRESH=$UCX_RNDV_THRESH"
  echo "-- no delay"
  bench
  d=$DELAY
  [ "$d" = auto ] && d=$(auto_delay)
  echo "-- netem one-way delay ${d} us on both veth ends"
  tc -n "$NA" qdisc change dev "$VA" root netem delay "${d}us"
  tc -n "$NB" qdisc add dev "$VB" root netem delay "${d}us"
  bench
  ;;
tun)
  echo "== AFD 1A1F over UCX/TCP between network namespaces (TUN delay line), batch $BATCH, context $CONTEXT, UCX_RNDV_THRESH=$UCX_RNDV_THRESH"
  echo "-- delay line, no delay"
  start_line 0
  bench
  d=$DELAY
  [ "$d" = auto ] && d=$(auto_delay)
  stop_line
  echo "-- delay line, one-way delay ${d} us each way"
  start_line "$d"
  bench
  stop_line
  ;;
inject)
  echo "== AFD 1A1F over UCX/TCP between network namespaces (veth), batch $BATCH, context $CONTEXT"
  echo "-- transport-injected one-way delay ($DELAY) on the namespaced TCP path"
  bench --delay-us "$DELAY"
  ;;
esac
