#!/usr/bin/python3
"""Hostile HTTP clients against a running `afd serve` while well-formed clients use it.

    afd make-model --arch qwen3_moe --preset tiny --out /tmp/tiny
    afd serve --model /tmp/tiny --port 8123 &
    bench/http_abuse.py --port 8123 --pid $!

For --seconds, at the same time:
  * --slowloris connections each send part of a request header and then one more byte every
    --trickle-s seconds, never finishing it; a connection the server closes (408 after its
    header deadline) is opened again at once;
  * --pipelined connections each send --depth requests in one segment (GET /health,
    GET /v1/models, POST /v1/completions alternating) and check that all --depth answers come
    back, in order; then again on the same connection;
  * --clients well-formed clients send POST /v1/completions (max_tokens --max-tokens) one
    after the other, each on its own connection.
Prints what each group got (answers by status, connections closed by the server, latency of
the well-formed requests) and the server's resident memory (VmRSS of --pid) before, at its
peak during, and --settle-s seconds after the run (by then the handler threads of the burst
have been idle for 60 s and are given back with their memory). Exit status 1 if a well-formed or a
pipelined request went unanswered.
Standard library only.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return float("nan")
    return float("nan")


def completion_request(host, max_tokens, prompt_id):
    body = json.dumps({"prompt": [1 + prompt_id % 50, 2, 3], "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def read_answer(reader):
    """One HTTP/1.1 answer (Content-Length or chunked body): (status, body)."""
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed")
    status = int(line.split()[1])
    length, chunked = None, False
    while True:
        h = await reader.readline()
        if not h:
            raise ConnectionError("closed in header")
        if h in (b"\r\n", b"\n"):
            break
        k, _, v = h.decode("latin-1").partition(":")
        k, v = k.strip().lower(), v.strip()
        if k == "content-length":
            length = int(v)
        elif k == "transfer-encoding" and v.lower() == "chunked":
            chunked = True
    if chunked:
        body = b""
        while True:
            n = int((await reader.readline()).strip().split(b";")[0], 16)
            body += await reader.readexactly(n + 2)
            if n == 0:
                break
        return status, body
    return status, (await reader.readexactly(length)) if length else b""


class Stats:
    def __init__(self):
        self.status = {}
        self.errors = {}
        self.latencies = []
        self.closed_by_server = 0
        self.sent = 0
        self.answered = 0

    def count(self, st):
        self.status[st] = self.status.get(st, 0) + 1

    def error(self, e):
        k = type(e).__name__
        self.errors[k] = self.errors.get(k, 0) + 1


async def slowloris(args, stop, st):
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection(args.host, args.port)
        except OSError as e:
            st.error(e)
            await asyncio.sleep(0.5)
            continue
        try:
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            await w.drain()
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(r.read(4096), timeout=args.trickle_s)
                    if not data:
                        st.closed_by_server += 1
                        break
                    if data.startswith(b"HTTP/1.1 "):
                        st.count(int(data.split()[1]))
                except asyncio.TimeoutError:
                    w.write(b"x")
                    await w.drain()
        except (OSError, ConnectionError) as e:
            st.closed_by_server += 1
            st.error(e)
        finally:
            w.close()


async def pipelined(args, stop, st, idx):
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection(args.host, args.port)
        except OSError as e:
            st.error(e)
            await asyncio.sleep(0.5)
            continue
        try:
            while not stop.is_set():
                kinds = []
                seg = b""
                for i in range(args.depth):
                    k = i % 3
                    kinds.append(k)
                    if k == 0:
                        seg += b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                    elif k == 1:
                        seg += b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                    else:
                        seg += completion_request(args.host, 2, idx + i)
                w.write(seg)
                await w.drain()
                st.sent += len(kinds)
                for k in kinds:
                    status, body = await asyncio.wait_for(read_answer(r), timeout=args.timeout_s)
                    st.count(status)
                    # In order: each answer is the one its request asks for.
                    ok = ((k == 0 and b'"status"' in body) or (k == 1 and b'"object":"list"' in body) or
                          (k == 2 and b'"text_completion"' in body))
                    if not ok:
                        st.error(ValueError("answer out of order or wrong: " + body[:80].decode("latin-1")))
                    else:
                        st.answered += 1
        except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            st.error(e)
        finally:
            w.close()


async def well_formed(args, stop, st, idx):
    n = 0
    while not stop.is_set():
        t0 = time.monotonic()
        st.sent += 1
        try:
            r, w = await asyncio.open_connection(args.host, args.port)
            try:
                w.write(completion_request(args.host, args.max_tokens, idx * 1000 + n))
                await w.drain()
                status, body = await asyncio.wait_for(read_answer(r), timeout=args.timeout_s)
            finally:
                w.close()
            st.count(status)
            if status == 200:
                st.answered += 1
                st.latencies.append(time.monotonic() - t0)
        except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            st.error(e)
        n += 1


async def main_async(args):
    stop = asyncio.Event()
    slow, pipe, good = Stats(), Stats(), Stats()
    peak = [rss_mib(args.pid) if args.pid else float("nan")]

    async def sample():
        while not stop.is_set():
            if args.pid:
                peak[0] = max(peak[0], rss_mib(args.pid))
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(slowloris(args, stop, slow)) for _ in range(args.slowloris)]
    await asyncio.sleep(1.0)  # the slow connections are in place before the others start
    tasks += [asyncio.create_task(pipelined(args, stop, pipe, i)) for i in range(args.pipelined)]
    tasks += [asyncio.create_task(well_formed(args, stop, good, i)) for i in range(args.clients)]
    tasks.append(asyncio.create_task(sample()))
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.wait(tasks, timeout=args.timeout_s + args.trickle_s + 5)
    for t in tasks:
        t.cancel()
    return slow, pipe, good, peak[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--pid", type=int, default=0, help="the server's process id (for its RSS)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--slowloris", type=int, default=600)
    ap.add_argument("--trickle-s", type=float, default=2.0)
    ap.add_argument("--pipelined", type=int, default=200)
    ap.add_argument("--depth", type=int, default=6, help="requests per pipelined segment")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=60)
    ap.add_argument("--settle-s", type=float, default=75,
                    help="wait before the last RSS reading (idle handler threads end after 60 s)")
    args = ap.parse_args()

    before = rss_mib(args.pid) if args.pid else float("nan")
    t0 = time.monotonic()
    slow, pipe, good, peak = asyncio.run(main_async(args))
    ran = time.monotonic() - t0
    time.sleep(args.settle_s)
    after = rss_mib(args.pid) if args.pid else float("nan")

    def fmt(d):
        return ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) or "-"

    print(f"ran {ran:.1f} s: {args.slowloris} slowloris, {args.pipelined} pipelined x {args.depth}, "
          f"{args.clients} well-formed clients")
    print(f"well-formed:  sent {good.sent}, answered 200: {good.answered}, statuses {{{fmt(good.status)}}}, "
          f"errors {{{fmt(good.errors)}}}")
    if good.latencies:
        lat = sorted(good.latencies)
        print(f"              latency p50 {statistics.median(lat) * 1e3:.1f} ms, "
              f"p99 {lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms")
    print(f"pipelined:    sent {pipe.sent}, answered in order: {pipe.answered}, statuses {{{fmt(pipe.status)}}}, "
          f"errors {{{fmt(pipe.errors)}}}")
    print(f"slowloris:    closed by the server {slow.closed_by_server}, statuses {{{fmt(slow.status)}}}, "
          f"errors {{{fmt(slow.errors)}}}")
    print(f"server RSS:   before {before:.1f} MiB, peak {peak:.1f} MiB, {args.settle_s:.0f} s after {after:.1f} MiB")
    # Requests in flight when the run ends are waited for (up to --timeout-s), so every one
    # sent must have been answered.
    lost_good = good.sent - good.answered
    lost_pipe = pipe.sent - pipe.answered
    ok = good.answered > 0 and lost_good == 0 and lost_pipe == 0
    print("OK" if ok else f"FAILED: {lost_good} well-formed and {lost_pipe} pipelined exchanges failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
