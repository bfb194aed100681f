#!/usr/bin/env bash
# Multi-process serving end to end: a 2A1F bundle started from one topology file as four
# separate processes (front end first, FFN worker last: any start order), whose greedy
# completions (streaming and not) equal an in-process `afd serve` with the same wire
# rounding (--afd-rounding 1); requests spread over both attention workers; a killed
# attention worker leaves the other serving; then `afd serve --topology 2A1F
# --spawn-workers` announces the complete bundle, serves, and stops its children.
# Usage: cli_afd_processes.sh AFD_BIN
set -uo pipefail
AFD=$1
TMP=$(mktemp -d)
M=$TMP/model
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; sleep 0.2; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails+1)); }
"$AFD" --log-level error make-model --preset tiny --seed 1 --out "$M" >/dev/null || { echo "make-model failed"; exit 1; }

# Bad invocations are clear errors (exit 1), not hangs.
out=$(timeout 20 "$AFD" worker --role attention --model "$M" --listen 127.0.0.1:1 2>&1); rc=$?
[ $rc = 1 ] && grep -q "needs --ffn" <<<"$out" && ok "attention worker without --ffn: $out" || bad "no --ffn: rc=$rc $out"
echo '{"model": "model", "attention": [{"address": "nohost"}], "ffn": [{"address": "127.0.0.1:2"}]}' >"$TMP/bad.json"
out=$(timeout 20 "$AFD" worker --topology-file "$TMP/bad.json" --role ffn --index 0 2>&1); rc=$?
[ $rc = 1 ] && grep -q "attention\[0\].address" <<<"$out" && ok "bad topology file: $out" || bad "bad topology file: rc=$rc $out"

# Waits (up to $3 s) for a line matching $2 in file $1.
wait_for() { for _ in $(seq 1 $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
port_of() { sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1" | head -1; }
# Prints $1 distinct TCP ports free on 127.0.0.1, drawn at random below the kernel's
# ephemeral range: the kernel never hands out a port there by itself (bind to port 0, an
# outgoing connection), so between this pick and a worker's bind only another explicit
# pick could take one (a port found free inside the range and released was once taken so
# by a parallel test's connection, and its bundle never started).
free_ports() {
  /usr/bin/python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
pool = range(10000, lo) if lo - 10000 >= 1000 else range(1024, 65536)
got = []
for port in random.sample(pool, min(len(pool), 200)):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT is not taken either
        got.append(port)
    except OSError:
        pass
    finally:
        s.close()
    if len(got) == n:
        break
if len(got) < n:
    sys.exit("free_ports: found only %d of %d free ports" % (len(got), n))
print(*got)
PY
}

# HTTP client: prints one line per prompt (greedy, prompt as token ids), non-streaming then
# streaming texts joined by '|'. Usage: client PORT MODE [ARGS]
client() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys, time, urllib.request, threading
port, mode = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
PROMPTS = [[3, 14, 15, 92, 65], [35], [89, 79, 32, 38, 46, 26, 43]]
def post(body, timeout=30):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)
def complete(p, n=12):
    with post({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}) as r:
        c = json.load(r)["choices"][0]
        return c["text"] + "#" + c["finish_reason"]
def stream(p, n=12):
    text, fin = "", None
    with post({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers["content-type"]
        done = False
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "): continue
            if line == "data: [DONE]": done = True; break
            c = json.loads(line[6:])["choices"][0]
            text += c["text"]; fin = c["finish_reason"] or fin
        assert done, "stream ended without [DONE]"
    return text + "#" + str(fin)
if mode == "compare":
    for p in PROMPTS:
        print(json.dumps(complete(p)) + "|" + json.dumps(stream(p)))
elif mode == "parallel":  # 6 concurrent requests; prints how many succeeded
    res = []
    def one(i):
        try: res.append(complete(PROMPTS[i % 3], 24))
        except Exception as e: print("error:", e, file=sys.stderr)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(len(res))
elif mode == "load":  # 8 clients x 4 requests (JSON and SSE, 1500 tokens); prints "ok refused failed [first failure]"
    import urllib.error
    res, refused, errs = [], [], []
    texts = {}  # prompt -> the answers it got (greedy: all must be the same)
    def one(i):
        for k in range(4):
            try:
                out = (complete if (i + k) % 2 else stream)(PROMPTS[(i + k) % 3], 1500)
                (res if out.endswith("#length") else errs).append(out)
                texts.setdefault((i + k) % 3, set()).add(out)
            except urllib.error.HTTPError as e:  # refused before any work: 503 "draining", or
                # "shutting down" for one that came after the drain ended, before the listener closed
                m = e.read().decode()
                (refused if e.code == 503 and ("draining" in m or "shutting down" in m) else errs).append(m)
            except urllib.error.URLError as e:  # the server has gone: refused too
                # urllib wraps in URLError only what fails while the request is sent: a
                # connection that sat in the listen backlog when the server stopped is reset
                # before any answer (an answer cut later raises outside URLError: an error).
                gone = (ConnectionRefusedError, ConnectionResetError)
                (refused if isinstance(e.reason, gone) else errs).append(repr(e))
            except Exception as e:  # cut mid-answer, error event, ...
                errs.append(repr(e))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    for p, v in texts.items():
        if len(v) > 1: errs.append("prompt %d got %d different answers" % (p, len(v)))
    print(len(res), len(refused), len(errs), *(errs[:1]))
elif mode == "disconnect":  # reads 3 events of a long stream, then hangs up
    r = post({"prompt": [5, 6, 7], "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True})
    n = 0
    for line in r:
        if line.startswith(b"data: "): n += 1
        if n == 3: break
    r.close()
    print(n)
elif mode == "disconnect_json":  # a long non-streaming request whose client hangs up after 0.3 s
    # 4000 tokens (the tiny model's context is 4096) take ~1 s on an idle machine: well past
    # the hang-up. (It was 3000 tokens and 1 s, which only held while an idle attention worker
    # slowed every step of the other by an FFN gather window.)
    import socket
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 4000, "temperature": 0, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    s.close()
    print("closed")
elif mode == "exposition":  # checks /metrics is one valid exposition: each family's TYPE once, no series twice
    body = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    types, series, errors = set(), set(), []
    for l in body.splitlines():
        if l.startswith("# TYPE "):
            name = l.split()[2]
            if name in types: errors.append("TYPE twice: " + name)
            types.add(name)
        elif l and not l.startswith("#"):
            key = l.rsplit(" ", 1)[0]
            if key in series: errors.append("series twice: " + key)
            series.add(key)
    print("valid" if not errors else "; ".join(errors[:3]))
elif mode == "metric":  # value of the series named in argv[3]
    body = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    print(sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith(sys.argv[3])))
PY
}

# trace_summary FILE PIDS...: a valid trace with complete events of (one of) each PIDS
# ("1,2": attention worker 0 or 1, whichever the router placed requests on); prints the counts.
trace_summary() {
  /usr/bin/python3 - "$@" <<'PY' 2>&1
import json, sys, collections
ev = json.load(open(sys.argv[1]))["traceEvents"]
c = collections.Counter(e["pid"] for e in ev if e["ph"] == "X")
want = [[int(p) for p in a.split(",")] for a in sys.argv[2:]]
assert all(any(c[p] > 0 for p in alt) for alt in want) and all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev if e["ph"] == "X"), dict(c)
print("spans by pid " + ", ".join("%d: %d" % (p, c[p]) for p in sorted(c)))
PY
}

# Starts `client PORT load` in the background (LOAD = its pid, output in FILE) and returns
# once the bundle has generated 200 more tokens (so requests are in flight), at most 30 s:
# a fixed sleep raced a slow start of the clients on a loaded machine.
start_load() {
  local port=$1 out=$2 base now
  base=$(timeout 10 bash -c "$(declare -f client); client $port metric afd_generation_tokens_total")
  timeout 120 bash -c "$(declare -f client); client $port load" >"$out" 2>&1 & LOAD=$!
  for _ in $(seq 1 300); do
    now=$(timeout 10 bash -c "$(declare -f client); client $port metric afd_generation_tokens_total")
    [ "${now%.*}" -ge $(( ${base%.*} + 200 )) ] && return 0
    sleep 0.1
  done
  echo "load never started on $port"
}

# Reference: in-process monolithic serving with the 1-FFN-worker wire rounding.
"$AFD" serve --model "$M" --precision reference --afd-rounding 1 --threads 1 --port 0 >"$TMP/ref.out" 2>"$TMP/ref.err" &
REF=$!; PIDS+=($REF)
wait_for "$TMP/ref.out" "on http" 30 || { echo "reference server did not start"; cat "$TMP/ref.err"; exit 1; }
want=$(timeout 60 bash -c "$(declare -f client); client $(port_of "$TMP/ref.out") compare") || { echo "reference requests failed"; exit 1; }
kill $REF; wait $REF 2>/dev/null
echo "reference: $want" | head -1

# The topology file, with free ports.
read -r PF PA0 PA1 PFFN PM < <(free_ports 5)
[ -n "$PM" ] || { echo "no free ports for the topology"; exit 1; }
cat >"$TMP/topology.json" <<JSON
{
  "model": "model", "precision": "reference", "threads": 1, "microbatches": 2,
  "peer_timeout_ms": 2000, "ffn_connect_timeout_ms": 60000,
  "frontend": {"listen": "127.0.0.1:$PF"},
  "attention": [{"address": "127.0.0.1:$PA0"}, {"address": "127.0.0.1:$PA1", "microbatches": 1}],
  "ffn": [{"address": "127.0.0.1:$PFFN", "metrics": "127.0.0.1:$PM"}]
}
JSON
# Any start order: front end, attention workers, then the FFN worker.
"$AFD" serve --topology-file "$TMP/topology.json" >"$TMP/fe.out" 2>"$TMP/fe.err" & FE=$!; PIDS+=($FE)
"$AFD" worker --topology-file "$TMP/topology.json" --role attention --index 0 >"$TMP/a0.out" 2>"$TMP/a0.err" & A0=$!; PIDS+=($A0)
"$AFD" worker --topology-file "$TMP/topology.json" --role attention --index 1 >"$TMP/a1.out" 2>"$TMP/a1.err" & A1=$!; PIDS+=($A1)
wait_for "$TMP/fe.err" "waiting for attention worker" 20 && ok "front end logs what it waits for" || bad "front end waiting log"
wait_for "$TMP/a0.err" "waiting for FFN worker" 20 && ok "attention worker logs what it waits for" || bad "attention waiting log"
"$AFD" worker --topology-file "$TMP/topology.json" --role ffn --index 0 >"$TMP/f0.out" 2>"$TMP/f0.err" & F0=$!; PIDS+=($F0)
if wait_for "$TMP/fe.out" "bundle complete: 2 attention workers + 1 FFN worker up" 40; then ok "topology-file bundle complete"
else bad "topology-file bundle never completed"; tail -5 "$TMP"/*.err; exit 1; fi

got=$(timeout 60 bash -c "$(declare -f client); client $PF compare")
[ "$got" = "$want" ] && ok "bundle completions (JSON and SSE) equal in-process serve" || { bad "bundle != in-process"; echo " want: $want"; echo " got:  $got"; }
n=$(timeout 60 bash -c "$(declare -f client); client $PF parallel")
[ "$n" = 6 ] && ok "6 concurrent requests through the front end" || bad "concurrent requests: $n of 6"
r0=$(timeout 10 bash -c "$(declare -f client); client $PF metric 'afd_frontend_worker_requests_total{worker=\"0\"'")
r1=$(timeout 10 bash -c "$(declare -f client); client $PF metric 'afd_frontend_worker_requests_total{worker=\"1\"'")
if [ "${r0%.*}" -gt 0 ] && [ "${r1%.*}" -gt 0 ]; then ok "requests placed on both attention workers ($r0, $r1)"; else bad "placement: worker 0 got $r0, worker 1 got $r1"; fi
# The FFN worker's own /metrics ("metrics" in the topology file): both attention workers
# served, tokens computed, every batch in the size histogram.
fs=$(timeout 10 bash -c "$(declare -f client); client $PM metric 'afd_ffn_attention_workers{ffn=\"0\",state=\"serving\"'")
ft=$(timeout 10 bash -c "$(declare -f client); client $PM metric afd_ffn_tokens_total")
fb=$(timeout 10 bash -c "$(declare -f client); client $PM metric afd_ffn_batches_total")
fh=$(timeout 10 bash -c "$(declare -f client); client $PM metric 'afd_ffn_batch_tokens_bucket{ffn=\"0\",le=\"+Inf\"'")
if [ "${fs%.*}" = 2 ] && [ "${ft%.*}" -gt 0 ] && [ "${fb%.*}" -gt 0 ] && [ "${fh%.*}" -ge "${fb%.*}" ]; then
  ok "FFN worker /metrics: 2 attention workers served, $ft tokens in $fb batches"
else bad "FFN worker /metrics: serving=$fs tokens=$ft batches=$fb histogram=$fh"; fi

# The front end's /metrics carries the whole bundle: each attention worker's series (label
# attention="i") and the FFN worker's (ffn="0"), as one valid exposition.
fa0=$(timeout 10 bash -c "$(declare -f client); client $PF metric 'afd_generation_tokens_total{attention=\"0\"'")
fa1=$(timeout 10 bash -c "$(declare -f client); client $PF metric 'afd_generation_tokens_total{attention=\"1\"'")
ff=$(timeout 10 bash -c "$(declare -f client); client $PF metric 'afd_ffn_tokens_total{ffn=\"0\"'")
fu=$(timeout 10 bash -c "$(declare -f client); client $PF metric afd_federation_target_up")
fv=$(timeout 10 bash -c "$(declare -f client); client $PF exposition")
if [ "${fa0%.*}" -gt 0 ] && [ "${fa1%.*}" -gt 0 ] && [ "${ff%.*}" -ge "${ft%.*}" ] && [ "${fu%.*}" = 3 ] && [ "$fv" = valid ]; then
  ok "front end /metrics federates both attention workers ($fa0, $fa1 tokens) and the FFN worker ($ff tokens)"
else bad "front end federation: attention $fa0/$fa1, ffn $ff (own $ft), targets up $fu, exposition: $fv"; fi

# A client hanging up mid-stream cancels the sequence on its attention worker.
timeout 30 bash -c "$(declare -f client); client $PF disconnect" >/dev/null
cancelled=0
for _ in $(seq 1 100); do
  c0=$(timeout 5 bash -c "$(declare -f client); client $PA0 metric afd_requests_cancelled_total")
  c1=$(timeout 5 bash -c "$(declare -f client); client $PA1 metric afd_requests_cancelled_total")
  if [ "${c0%.*}" -ge 1 ] || [ "${c1%.*}" -ge 1 ]; then cancelled=1; break; fi
  sleep 0.1
done
[ $cancelled = 1 ] && ok "client disconnect mid-stream cancels the worker's sequence" || bad "disconnect not propagated ($c0, $c1)"

# A non-streaming client hanging up before its answer: the front end notices, closes the
# upstream exchange, and the worker cancels the sequence.
before=$(( ${c0%.*} + ${c1%.*} ))
timeout 30 bash -c "$(declare -f client); client $PF disconnect_json" >/dev/null
cancelled=0
for _ in $(seq 1 100); do
  c0=$(timeout 5 bash -c "$(declare -f client); client $PA0 metric afd_requests_cancelled_total")
  c1=$(timeout 5 bash -c "$(declare -f client); client $PA1 metric afd_requests_cancelled_total")
  if [ $(( ${c0%.*} + ${c1%.*} )) -gt $before ]; then cancelled=1; break; fi
  sleep 0.1
done
c499=$(timeout 5 bash -c "$(declare -f client); client $PF metric 'afd_frontend_responses_total{code=\"499\"'")
[ $cancelled = 1 ] && ok "non-streaming client disconnect cancels the worker's sequence (front end 499s: $c499)" || bad "non-streaming disconnect not propagated ($c0, $c1)"

# Rolling restart: SIGTERM to attention worker 0 under load. It drains (no new requests,
# /health 503 "draining"), finishes what it accepted and exits; the front end places new
# requests on worker 1 (and retries a request worker 0 refused with 503), so no client sees
# an error. Started again, worker 0 rejoins.
start_load $PF "$TMP/load.out"
kill -TERM $A0
wait $LOAD
timeout 90 bash -c "while kill -0 $A0 2>/dev/null; do sleep 0.1; done"; a0_alive=$?
read -r lok lref lfail lerr <"$TMP/load.out"
dt=$(grep -o "drained in [0-9.]* s" "$TMP/a0.err")
if [ "$lok" = 32 ] && [ "$lref" = 0 ] && [ "$lfail" = 0 ] && [ $a0_alive = 0 ] && [ -n "$dt" ] && [ "$dt" != "drained in 0.0 s" ]; then
  ok "rolling restart: attention worker 0 $dt under load and exited; 32 of 32 requests answered in full, the same for each prompt"
else bad "rolling restart: $(cat "$TMP/load.out"); worker 0 stopped: $a0_alive; $(grep -E "drain|signal" "$TMP/a0.err" | tail -2)"; fi
"$AFD" worker --topology-file "$TMP/topology.json" --role attention --index 0 >"$TMP/a0.out" 2>"$TMP/a0b.err" & A0=$!; PIDS+=($A0)
up=""
for _ in $(seq 1 150); do up=$(curl -s "127.0.0.1:$PF/health" | grep -o '"workers_up":[0-9]*'); [ "$up" = '"workers_up":2' ] && break; sleep 0.1; done
[ "$up" = '"workers_up":2' ] && ok "attention worker 0 started again and rejoined" || bad "worker 0 did not rejoin: $up"

# An attention worker dies: requests go to the other one, nothing hangs.
kill -9 $A0; wait $A0 2>/dev/null
got=$(timeout 60 bash -c "$(declare -f client); client $PF compare")
[ "$got" = "$want" ] && ok "after killing attention worker 0, worker 1 answers" || { bad "after kill"; echo " got: $got"; tail -3 "$TMP/fe.err"; }
n=$(timeout 60 bash -c "$(declare -f client); client $PF parallel")
[ "$n" = 6 ] && ok "concurrent requests after the kill" || bad "concurrent requests after kill: $n of 6"
up=$(timeout 10 bash -c "$(declare -f client); client $PF metric afd_frontend_worker_up")
[ "${up%.*}" = 1 ] && ok "/metrics shows one worker up" || bad "worker_up sum $up"
fu=$(timeout 10 bash -c "$(declare -f client); client $PF metric afd_federation_target_up")
fv=$(timeout 10 bash -c "$(declare -f client); client $PF exposition")
[ "${fu%.*}" = 2 ] && [ "$fv" = valid ] && ok "/metrics after the kill: 2 of 3 workers scraped, still valid" || bad "after kill: targets up $fu, $fv"
kill $A1; wait $A1 2>/dev/null
sleep 1.5
code=$(/usr/bin/python3 -c "
import urllib.request, urllib.error, json
try:
    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$PF/v1/completions', data=b'{\"prompt\":[1],\"max_tokens\":2}', headers={'content-type':'application/json'}), timeout=10)
    print(200)
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get('Retry-After'))")
[ "$code" = "503 1" ] && ok "no attention worker: 503 + Retry-After" || bad "no worker: got '$code'"
kill $FE $F0
timeout 15 bash -c "while kill -0 $FE 2>/dev/null || kill -0 $F0 2>/dev/null; do sleep 0.1; done" && ok "front end and FFN worker stop on SIGTERM" || bad "processes did not stop"

# An FFN worker dies: its attention worker's /health turns 503 naming it, the front end stops
# placing requests there and answers 503 + Retry-After with the reason; when the FFN worker
# is back, everything serves again.
read -r QF QA QFFN < <(free_ports 3)
[ -n "$QFFN" ] || { echo "no free ports for the topology"; exit 1; }
"$AFD" worker --role ffn --model "$M" --listen 127.0.0.1:$QFFN --precision reference --threads 1 >"$TMP/q_f.log" 2>&1 & QF0=$!; PIDS+=($QF0)
"$AFD" worker --role attention --model "$M" --ffn 127.0.0.1:$QFFN --listen 127.0.0.1:$QA --precision reference --threads 1 \
  --ffn-timeout-ms 2000 --step-retry-s 0 >"$TMP/q_a.log" 2>&1 & QA0=$!; PIDS+=($QA0)
"$AFD" serve --model "$M" --attention-workers 127.0.0.1:$QA --port $QF >"$TMP/q_fe.out" 2>"$TMP/q_fe.err" & QFE=$!; PIDS+=($QFE)
wait_for "$TMP/q_fe.out" "bundle complete" 40 || bad "FFN-loss bundle never completed"
health() { /usr/bin/python3 -c "
import urllib.request, urllib.error, json
try:
    r = urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=5); print(r.status)
except urllib.error.HTTPError as e:
    print(e.code, json.load(e)['error']['message'])
except Exception as e: print('error', e)"; }
# First a stall: the FFN worker is stopped (SIGSTOP), connected but silent. The request in
# flight fails after --ffn-timeout-ms; for the next seconds the attention worker reports
# the stall on /health, so once the front end has polled it, further requests fail at once; after SIGCONT
# traffic resumes.
timed_code() { /usr/bin/python3 -c "
import urllib.request, urllib.error, json, time
t = time.time()
try:
    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$QF/v1/completions', data=b'{\"prompt\":[1],\"max_tokens\":2}', headers={'content-type':'application/json'}), timeout=30)
    print(200, round(time.time() - t, 1))
except urllib.error.HTTPError as e:
    m = json.load(e)['error']['message']
    print(e.code, round(time.time() - t, 1), 'no reply within' in m, 'ffn0' in m)"; }
kill -STOP $QF0
c1=$(timed_code)
for _ in $(seq 1 30); do case "$(health $QF)" in 503*ffn0*) break;; esac; sleep 0.1; done  # next health poll
c2=$(timed_code)
read -r c1code c1t c1why _ <<<"$c1"; read -r c2code c2t _ c2why <<<"$c2"
if [ "$c1code" = 503 ] && [ "$c1why" = True ] && [ "$c2code" = 503 ] && [ "$c2why" = True ] &&
   /usr/bin/python3 -c "import sys; sys.exit(0 if $c2t < 1.0 else 1)"; then
  ok "stalled FFN worker: 503 after the timeout ($c1t s), then 503 at once ($c2t s) naming the stall"
else bad "stalled FFN worker: first '$c1', then '$c2'"; fi
kill -CONT $QF0
fh=""; for _ in $(seq 1 100); do fh=$(health $QF); [ "$fh" = 200 ] && break; sleep 0.1; done
got=$(timeout 60 bash -c "$(declare -f client); client $QF compare")
[ "$fh" = 200 ] && [ "$got" = "$want" ] && ok "after SIGCONT the bundle serves the same answers" || bad "after the stall: health '$fh'"
# A stall while idle: no request has to time out first. The attention worker pings its FFN
# worker after a second without traffic (--ffn-probe-ms, default 1000); the pong overdue past
# --ffn-timeout-ms (2 s) turns its /health 503, the front end follows; SIGCONT heals both.
kill -STOP $QF0
t0=$(date +%s.%N); ah=""
for _ in $(seq 1 150); do ah=$(health $QA); case "$ah" in 503*) break;; esac; sleep 0.1; done
idle_s=$(/usr/bin/python3 -c "import time; print(round(time.time() - $t0, 1))")
for _ in $(seq 1 30); do fh=$(health $QF); case "$fh" in 503*"liveness probe"*) break;; esac; sleep 0.1; done
case "$ah" in
  "503 FFN worker 'ffn0' has not answered a liveness probe for "*)
    /usr/bin/python3 -c "import sys; sys.exit(0 if 1.5 <= $idle_s <= 8 else 1)" &&
      ok "idle stall seen without traffic in $idle_s s: $ah" || bad "idle stall took $idle_s s: $ah";;
  *) bad "attention worker /health during an idle stall: '$ah'";;
esac
case "$fh" in 503*"worker 0: FFN worker 'ffn0' has not answered a liveness probe"*) ok "front end /health names the idle stall";;
  *) bad "front end /health during an idle stall: '$fh'";; esac
kill -CONT $QF0
ah=""; for _ in $(seq 1 100); do ah=$(health $QA); fh=$(health $QF); [ "$ah" = 200 ] && [ "$fh" = 200 ] && break; sleep 0.1; done
[ "$ah" = 200 ] && [ "$fh" = 200 ] && ok "after SIGCONT the probe answers: healthy again" || bad "after the idle stall: '$ah' / '$fh'"
grep -q "FFN worker 'ffn0' has not answered a liveness probe within 2000 ms" "$TMP/q_a.log" &&
  grep -q "FFN worker 'ffn0' answered its liveness probe again after" "$TMP/q_a.log" &&
  ok "the attention worker logged the idle stall and its end" || bad "idle stall log lines: $(grep -i probe "$TMP/q_a.log" | tail -2)"
kill -9 $QF0; wait $QF0 2>/dev/null
ah=""; fh=""
for _ in $(seq 1 50); do
  ah=$(health $QA); fh=$(health $QF)
  case "$fh" in 503*ffn0*) break;; esac
  sleep 0.1
done
case "$ah" in "503 FFN worker 'ffn0' is not connected") ok "attention worker /health: $ah";; *) bad "attention worker /health after FFN loss: '$ah'";; esac
case "$fh" in 503*"worker 0: FFN worker 'ffn0' is not connected"*) ok "front end /health names the lost FFN worker: $fh";; *) bad "front end /health after FFN loss: '$fh'";; esac
code=$(/usr/bin/python3 -c "
import urllib.request, urllib.error, json
try:
    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$QF/v1/completions', data=b'{\"prompt\":[1],\"max_tokens\":2}', headers={'content-type':'application/json'}), timeout=10)
    print(200)
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get('Retry-After'), 'ffn0' in json.load(e)['error']['message'])")
[ "$code" = "503 1 True" ] && ok "request while the FFN worker is down: 503 + Retry-After naming it" || bad "request during FFN loss: '$code'"
"$AFD" worker --role ffn --model "$M" --listen 127.0.0.1:$QFFN --precision reference --threads 1 >"$TMP/q_f2.log" 2>&1 & QF0=$!; PIDS+=($QF0)
for _ in $(seq 1 100); do fh=$(health $QF); [ "$fh" = 200 ] && break; sleep 0.1; done
got=$(timeout 60 bash -c "$(declare -f client); client $QF compare")
[ "$fh" = 200 ] && [ "$got" = "$want" ] && ok "FFN worker back: healthy and serving the same answers" || bad "after the FFN worker came back: health '$fh'"
kill $QFE $QA0 $QF0; wait $QFE $QA0 $QF0 2>/dev/null

# One command on one machine: every worker a child process behind the front end (the default
# for an xAyF topology; --spawn-workers says the same explicitly). Started from a copy of the
# binary, which is replaced on disk below (as a rebuild or upgrade would) before a restart.
mkdir -p "$TMP/bin" && cp "$AFD" "$TMP/bin/afd"
"$TMP/bin/afd" serve --model "$M" --topology 2A1F --precision reference --threads 1 --port 0 --trace "$TMP/sp_trace.json" >"$TMP/sp.out" 2>"$TMP/sp.err" &
SP=$!; PIDS+=($SP)
if wait_for "$TMP/sp.out" "bundle complete: 2 attention workers + 1 FFN worker up" 40; then ok "--spawn-workers prints the bundle-complete line"
else bad "--spawn-workers bundle never completed"; tail -5 "$TMP/sp.err"; fi
got=$(timeout 60 bash -c "$(declare -f client); client $(port_of "$TMP/sp.out") compare")
[ "$got" = "$want" ] && ok "--spawn-workers completions equal in-process serve" || { bad "--spawn-workers output"; echo " got: $got"; }
# The spawned FFN worker gets a metrics port; the front end's /metrics carries its series.
st=$(timeout 10 bash -c "$(declare -f client); client $(port_of "$TMP/sp.out") metric 'afd_ffn_tokens_total{ffn=\"0\"'")
su=$(timeout 10 bash -c "$(declare -f client); client $(port_of "$TMP/sp.out") metric afd_federation_target_up")
[ "${st%.*}" -gt 0 ] && [ "${su%.*}" = 3 ] && ok "--spawn-workers /metrics has the FFN worker's tokens ($st) and 3 workers up" || bad "--spawn-workers federation: ffn tokens '$st', targets up '$su'"
# A spawned worker that dies is started again (--worker-restarts, default 5 a minute) and the
# bundle heals: the attention workers reconnect to the new FFN worker process. Under load:
# the forward passes that failed on the lost FFN worker are retried once it is back
# (--step-retry-s, default 30), so every request in flight still completes, with the
# same answer as without the crash.
SPP=$(port_of "$TMP/sp.out")
start_load $SPP "$TMP/load0.out"
FP=$(pgrep -f -- "worker --role ffn --model $M" | head -1)
kill -9 "$FP"
healed=0
for _ in $(seq 1 100); do
  if grep -q "restarted FFN worker 0/1 as process" "$TMP/sp.err" &&
     [ "$(curl -s "127.0.0.1:$SPP/health" | grep -o '"workers_up":[0-9]*')" = '"workers_up":2' ]; then healed=1; break; fi
  sleep 0.1
done
wait $LOAD
read -r lok lref lfail lerr <"$TMP/load0.out"
retries=$(timeout 10 bash -c "$(declare -f client); client $SPP metric afd_step_retries_total")
[ "$lok" = 32 ] && [ "$lfail" = 0 ] && [ "${retries%.*}" -ge 1 ] &&
  ok "SIGKILL of the FFN worker under load: 32 of 32 requests answered in full, the same per prompt ($retries forward passes retried)" ||
  bad "FFN worker crash under load: $(cat "$TMP/load0.out"); step retries '$retries'"
got=$(timeout 60 bash -c "$(declare -f client); client $SPP compare")
[ $healed = 1 ] && [ "$got" = "$want" ] && ok "a killed FFN worker process is restarted and the bundle serves the same answers" ||
  { bad "FFN worker restart: healed=$healed"; grep -E "restart|exited" "$TMP/sp.err" | tail -3; }
pe=$(timeout 10 bash -c "$(declare -f client); client $SPP metric 'afd_frontend_process_exits_total{process=\"FFN worker 0/1\"'")
pr=$(timeout 10 bash -c "$(declare -f client); client $SPP metric 'afd_frontend_process_restarts_total{process=\"FFN worker 0/1\"'")
pu=$(timeout 10 bash -c "$(declare -f client); client $SPP metric afd_frontend_process_up")
[ "${pe%.*}" = 1 ] && [ "${pr%.*}" = 1 ] && [ "${pu%.*}" = 3 ] && ok "/metrics counts the FFN worker's exit and restart; 3 processes up" ||
  bad "process metrics: exits '$pe' restarts '$pr' up '$pu'"
# Its second life ends with SIGTERM: it writes its trace part as it stops, is started a third
# time, and both traced lives end up in the merged trace (checked below: 4 parts). Before
# that, the bundle's binary is replaced on disk: the restart still runs (the running version).
mv "$TMP/bin/afd" "$TMP/bin/afd.old" && cp "$TMP/bin/afd.old" "$TMP/bin/afd" && rm "$TMP/bin/afd.old"
FP=$(pgrep -f -- "worker --role ffn --model $M" | head -1)
kill -TERM "$FP"
healed=0
for _ in $(seq 1 100); do
  if [ "$(grep -c "restarted FFN worker 0/1 as process" "$TMP/sp.err")" = 2 ] &&
     [ "$(curl -s "127.0.0.1:$SPP/health" | grep -o '"workers_up":[0-9]*')" = '"workers_up":2' ]; then healed=1; break; fi
  sleep 0.1
done
got=$(timeout 60 bash -c "$(declare -f client); client $SPP compare")
[ $healed = 1 ] && [ "$got" = "$want" ] && grep -q "was replaced on disk: workers are restarted from the running version" "$TMP/sp.err" &&
  ok "an FFN worker stopped with SIGTERM is restarted too, after the binary was replaced on disk (logged); same answers" ||
  { bad "FFN worker SIGTERM restart (binary replaced on disk): healed=$healed"; grep -E "restart|exited|replaced|cannot start" "$TMP/sp.err" | tail -3; }
# SIGTERM to the whole bundle under load: the front end drains first (its in-flight requests
# finish on the workers; new ones get 503 "draining"), then stops the workers.
start_load $SPP "$TMP/load2.out"
kill $SP
sleep 0.1
dr=$(/usr/bin/python3 -c "
import urllib.request, urllib.error, json
try:
    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$SPP/v1/completions', data=b'{\"prompt\":[1],\"max_tokens\":2}', headers={'content-type':'application/json'}), timeout=10)
    print(200)
except urllib.error.HTTPError as e: print(e.code, json.load(e)['error']['message'])
except Exception as e: print('error', e)")
wait $LOAD
read -r lok lref lfail lerr <"$TMP/load2.out"
timeout 90 bash -c "while kill -0 $SP 2>/dev/null; do sleep 0.1; done" || bad "--spawn-workers front end did not stop"  # drains first
dt=$(grep -o "drained in [0-9.]* s" "$TMP/sp.err" | head -1)  # the front end's: it drains before it stops the workers
# Every request in flight at the signal is answered in full; the later ones are refused.
case "$dr" in "503 the server is draining"*)
  [ "$lok" -ge 8 ] && [ "$lref" -ge 1 ] && [ "$lfail" = 0 ] && [ -n "$dt" ] && [ "$dt" != "drained in 0.0 s" ] &&
    ok "SIGTERM under load: the front end $dt ($lok requests answered in full, $lref refused with 503 draining or shutting down, none cut)" ||
    bad "bundle drain: $(cat "$TMP/load2.out"); $dt";;
  *) bad "a request during the drain: '$dr' (load: $(cat "$TMP/load2.out"))";; esac
sleep 0.3
if pgrep -f -- "--model $M" >/dev/null; then bad "spawned workers left running"; pgrep -af -- "--model $M"; else ok "spawned workers stopped"; fi
# --trace: each worker process streamed its part and completed it when it stopped; the front
# end merged them into one timeline (attention workers pid 1 and 2, the FFN worker pid 100)
# and removed them. The FFN worker's first life was SIGKILLed under load: its part is cut
# short but holds its spans up to its last flush, and is merged too (5 parts in all).
cut=$(grep -o "trace part merged: [^ ]*ffn0.life0.json: cut short[^;]*; merged its [0-9]* complete events" "$TMP/sp.err")
ncut=$(grep -o '[0-9]* complete' <<<"$cut" | cut -d' ' -f1)
if tr=$(trace_summary "$TMP/sp_trace.json" 1,2 100) && ! ls "$TMP"/sp_trace.*.json >/dev/null 2>&1 &&
   grep -q "merged 5 worker process traces" "$TMP/sp.err" && [ "${ncut:-0}" -gt 1 ]; then
  ok "--spawn-workers --trace: one merged timeline, all three lives of the restarted FFN worker, the SIGKILLed one up to its kill ($tr; $ncut events from the killed life)"
else bad "--spawn-workers --trace: $tr; cut part: '$cut'; files: $(ls "$TMP" | grep trace | tr '\n' ' ')"; grep "trace" "$TMP/sp.err" | tail -5; fi

# --spawn-workers --topology-file: the file's workers as children of the front end; with
# --trace each writes its part and the front end merges them (without --spawn-workers the
# front end has no engine to trace: a clear error, not a silently missing file).
read -r TF TA0 TA1 TFFN < <(free_ports 4)
[ -n "$TFFN" ] || { echo "no free ports for the topology"; exit 1; }
sed -e "s/:$PF\"/:$TF\"/; s/:$PA0\"/:$TA0\"/; s/:$PA1\"/:$TA1\"/; s/:$PFFN\", \"metrics\": \"127.0.0.1:$PM\"/:$TFFN\"/" \
  "$TMP/topology.json" >"$TMP/topology2.json"
out=$(timeout 20 "$AFD" serve --topology-file "$TMP/topology2.json" --trace "$TMP/x.json" 2>&1); rc=$?
[ $rc != 0 ] && grep -q "needs --spawn-workers" <<<"$out" && ok "--topology-file --trace without --spawn-workers: $(tail -1 <<<"$out")" ||
  bad "--topology-file --trace without --spawn-workers: rc $rc: $out"
"$AFD" serve --topology-file "$TMP/topology2.json" --spawn-workers --trace "$TMP/tf_trace.json" >"$TMP/tf.out" 2>"$TMP/tf.err" & TFE=$!; PIDS+=($TFE)
if wait_for "$TMP/tf.out" "bundle complete: 2 attention workers + 1 FFN worker up" 40; then
  got=$(timeout 60 bash -c "$(declare -f client); client $TF compare")
  [ "$got" = "$want" ] && ok "--topology-file --spawn-workers completions equal in-process serve" || bad "--topology-file --spawn-workers output: $got"
else bad "--topology-file --spawn-workers never completed"; tail -5 "$TMP/tf.err"; fi
kill $TFE; timeout 15 bash -c "while kill -0 $TFE 2>/dev/null; do sleep 0.1; done" || bad "--topology-file --spawn-workers did not stop"
if tr=$(trace_summary "$TMP/tf_trace.json" 1,2 100) && ! ls "$TMP"/tf_trace.*.json >/dev/null 2>&1; then
  ok "--topology-file --spawn-workers --trace: one merged timeline ($tr)"
else bad "--topology-file --spawn-workers --trace: $tr"; fi

# The ports a bundle gives its worker processes stay reserved by the front end while it runs
# (a bound socket that never listens): a worker down for a moment gets its port back, as
# nothing else can bind it meanwhile (a port merely found free was once taken by another
# process before the worker bound it, and the bundle failed to start).
"$AFD" serve --model "$M" --topology 1A1F --precision reference --threads 1 --port 0 --worker-restarts 0 >"$TMP/rp.out" 2>"$TMP/rp.err" &
RP=$!; PIDS+=($RP)
if wait_for "$TMP/rp.out" "bundle complete" 40; then
  # The FFN worker's metrics port: nothing has connected to it yet, so no TIME_WAIT
  # connection holds it once the worker is gone (its other ports have them).
  line=$(grep -o "started FFN worker 0/1 as process [0-9]* on 127.0.0.1:[0-9]*, metrics on 127.0.0.1:[0-9]*" "$TMP/rp.err")
  AW=$(awk '{print $7}' <<<"$line"); AWP=${line##*:}
  kill -9 "$AW"; timeout 5 bash -c "while kill -0 $AW 2>/dev/null; do sleep 0.05; done"
  b=$(/usr/bin/python3 -c "
import socket, sys
s = socket.socket()
try: s.bind(('127.0.0.1', int(sys.argv[1]))); print('bound')
except OSError as e: print('refused' if e.errno == 98 else e)" "$AWP")
  [ "$b" = refused ] && ok "a killed FFN worker's metrics port stays reserved by the front end (bind: address in use)" ||
    bad "a killed FFN worker's metrics port ($AWP, process $AW): bind $b"
else bad "1A1F bundle for the port check never completed"; tail -5 "$TMP/rp.err"; fi
kill $RP; wait $RP 2>/dev/null

# --in-process: the same topology as threads of one process, same answers, no children.
"$AFD" serve --model "$M" --topology 2A1F --in-process --precision reference --threads 1 --port 0 --trace "$TMP/ip_trace.json" >"$TMP/ip.out" 2>"$TMP/ip.err" &
IP=$!; PIDS+=($IP)
wait_for "$TMP/ip.out" "on http://" 40 || { bad "--in-process server never started"; tail -5 "$TMP/ip.err"; }
got=$(timeout 60 bash -c "$(declare -f client); client $(port_of "$TMP/ip.out") compare")
[ "$got" = "$want" ] && ok "--in-process 2A1F completions equal in-process mono serve" || { bad "--in-process output"; echo " got: $got"; }
if pgrep -f -- "worker --role" >/dev/null && pgrep -af -- "worker --role" | grep -q -- "$M"; then bad "--in-process started worker processes"; else ok "--in-process starts no worker process"; fi
# The in-process FFN worker's series are part of the service's /metrics (ffn="<engine>.<shard>").
ipt=$(timeout 10 bash -c "$(declare -f client); client $(port_of "$TMP/ip.out") metric 'afd_ffn_tokens_total{ffn=\"0.0\"'")
[ "${ipt%.*}" -gt 0 ] && ok "--in-process /metrics has the FFN worker's tokens ($ipt)" || bad "--in-process afd_ffn_tokens_total: '$ipt'"
kill $IP; wait $IP 2>/dev/null
tr=$(trace_summary "$TMP/ip_trace.json" 1,2 100) && ok "--in-process serve --trace written when it stops ($tr)" || bad "--in-process --trace: $tr"
echo "$fails failed"
[ $fails -eq 0 ]
