#!/usr/bin/python3
"""Hostile inputs against a running `afd serve`, as an attacker would send them.

Starts `afd serve --model DIR [extra serve flags]` on a free loopback port, then:

1. sends each hostile input of the list below COUNT times (default 100) and checks that
   every answer is a 4xx (or, where the input is not a request at all, that the server closed
   the connection), that the server process is alive afterwards, and that its resident memory
   (the whole process tree: a bundle's workers included) is back within 10 % of where it
   started;
2. measures the decode throughput of N well-behaved streaming clients alone and while 8
   attackers send worst-case bodies at the size limit continuously, and prints the drop.

Prints one table row per input and the throughput comparison; exits non-zero when an input
got a non-4xx answer, the server died, or memory did not come back. Standard library only.

Usage: bench/hostile_inputs.py --afd build/apps/afd --model DIR [--count 100] [--seconds 20]
       [--clients 4] [--attackers 8] [--rounds 3] [-- extra afd serve flags, e.g. --topology 2A1F]
"""
import argparse
import json
import multiprocessing
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

MIB = 1 << 20


def deep(n, leaf="0"):
    return "[" * n + leaf + "]" * n


def chat(extra="", content='"hi"', max_tokens=4):
    return ('{"messages":[{"role":"user","content":%s%s}],"max_tokens":%d,"temperature":0%s}'
            % (content, "", max_tokens, extra))


def http_post(path, body, headers=None, chunked=False):
    h = {"Host": "127.0.0.1", "Content-Type": "application/json"}
    h.update(headers or {})
    if chunked:
        h["Transfer-Encoding"] = "chunked"
    elif body is not None:
        h["Content-Length"] = str(len(body))
    head = "POST %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n"
    return head.encode()


def inputs(body_limit):
    """(name, function(port) -> (status or None, note)) for each hostile input."""
    out = []

    def simple(name, body, path="/v1/chat/completions"):
        out.append((name, lambda port: exchange(port, http_post(path, body.encode()) + body.encode())))

    simple("array 130k deep in tools", chat(extra=',"tools":' + deep(130000)))
    simple("array 130k deep in a message field", chat(content='"hi","x":' + deep(130000)))
    simple("array 130k deep in a content part",
           chat(content='[{"type":"text","text":"a","x":%s}]' % deep(130000)))
    simple("array 100k deep (completions)", '{"prompt":"a","max_tokens":1,"x":%s}' % deep(100000),
           "/v1/completions")
    keys = ",".join('"k%d":0' % i for i in range(80000))
    simple("object with 80k keys", '{"prompt":"a","max_tokens":1,"x":{%s}}' % keys, "/v1/completions")
    simple("max_tokens 2^63", '{"prompt":"a","max_tokens":9223372036854775808}', "/v1/completions")
    simple("response_format json_object", chat(extra=',"response_format":{"type":"json_object"}'))
    simple("tool_choice required", chat(extra=',"tool_choice":"required","tools":[{"type":"function",'
                                              '"function":{"name":"f"}}]'))
    simple("tools [1]", chat(extra=',"tools":[1]'))

    def chunked_big(port, total=50 * MIB):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            s.sendall(http_post("/v1/completions", None, chunked=True))
            piece = b"a" * 65536
            chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
            sent = 0
            try:
                while sent < total:
                    s.sendall(chunk)
                    sent += len(piece)
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server stopped reading: its answer should be waiting
            return read_status(s)
        finally:
            s.close()

    out.append(("chunked body of 50 MB", chunked_big))

    def no_length(port):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
                      b'{"prompt":"a","max_tokens":1}')
            t0 = time.time()
            st = read_status(s)
            return st[0], st[1] + " after %.1f s" % (time.time() - t0)
        finally:
            s.close()

    out.append(("POST without Content-Length", no_length))

    def big_headers(port):
        body = b'{"prompt":"a","max_tokens":1}'
        extra = {"X-Pad-%d" % i: "v" * 1000 for i in range(200)}
        return exchange(port, http_post("/v1/completions", body, extra) + body)

    out.append(("200 headers of 1 KB", big_headers))

    def pipelined(port):
        body = b'{"prompt":"a","max_tokens":1,"temperature":0}'
        one = http_post("/v1/completions", body) + body
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            s.sendall(one + one)
            statuses = read_statuses(s, 2)
            if len(statuses) == 2:
                return 200 if all(x == 200 for x in statuses) else statuses[0], "both answered %s" % statuses
            return None, "answers: %s" % statuses
        finally:
            s.close()

    out.append(("two pipelined requests", pipelined))
    return out


def read_status(s):
    """Reads until the status line is known; returns (status or None, note)."""
    buf = b""
    try:
        while b"\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    except OSError as e:
        return None, "read failed: %s" % e
    m = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
    if not m:
        return None, "connection closed without an answer" if not buf else "garbage: %r" % buf[:60]
    body = buf.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in buf else b""
    return int(m.group(1)), body[:100].decode(errors="replace")


def read_statuses(s, n, deadline_s=60):
    """Status codes of up to n answers on one connection (Content-Length or chunked bodies)."""
    buf, out = b"", []
    s.settimeout(deadline_s)
    try:
        while len(out) < n:
            while b"\r\n\r\n" not in buf:
                d = s.recv(65536)
                if not d:
                    return out
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
            if not m:
                return out
            out.append(int(m.group(1)))
            cl = re.search(rb"(?i)content-length: *(\d+)", head)
            if cl:
                need = int(cl.group(1))
                while len(buf) < need:
                    d = s.recv(65536)
                    if not d:
                        return out
                    buf += d
                buf = buf[need:]
            elif re.search(rb"(?i)transfer-encoding: *chunked", head):
                while b"\r\n0\r\n\r\n" not in b"\r\n" + buf:
                    d = s.recv(65536)
                    if not d:
                        return out
                    buf += d
                buf = (b"\r\n" + buf).split(b"\r\n0\r\n\r\n", 1)[1]
    except OSError:
        pass
    return out


def exchange(port, raw):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        try:
            s.sendall(raw)
        except OSError:
            pass
        return read_status(s)
    finally:
        s.close()


def tree_rss_kb(pid):
    """Resident KiB of pid and all its descendants."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open("/proc/%d/status" % p) as f:
                total += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        except (OSError, AttributeError):
            pass
    return total


def stream_tokens(port, stop_at, counter, lock, max_tokens):
    body = json.dumps({"prompt": "hello there", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0}).encode()
    while time.time() < stop_at:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(http_post("/v1/completions", body) + body)
            buf = b""
            while time.time() < stop_at + 30:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
                n = buf.count(b"data: {")
                if n:
                    with lock:
                        counter[0] += n
                    buf = buf[buf.rfind(b"data: {") + 7:]
                if b"[DONE]" in buf:
                    break
            s.close()
        except OSError:
            time.sleep(0.05)


def attack(port, stop_at, body_limit, sent):
    # The worst shape under the limits that is still well-formed JSON: as many small keys as
    # the body allows, spread over objects nested to a moderate depth.
    inner = ",".join('"k%d":[0]' % i for i in range(1000))
    parts = []
    size = 0
    while size < body_limit - 20000:
        p = '{"a":{"b":{"c":{%s}}}}' % inner
        parts.append(p)
        size += len(p) + 1
    body = ('{"prompt":"a","max_tokens":1,"x":[%s]}' % ",".join(parts)).encode()[: body_limit]
    while time.time() < stop_at:
        try:
            exchange(port, http_post("/v1/completions", body) + body)
            sent[0] += 1
        except OSError:
            time.sleep(0.01)


def attack_process(port, stop_at, body_limit, attackers, out):
    """Runs the attackers in their own process, so that the load generator's interpreter lock
    does not slow the measured clients: only the server's behaviour shows in the drop."""
    sent = [0]
    ts = [threading.Thread(target=attack, args=(port, stop_at, body_limit, sent)) for _ in range(attackers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(sent[0])


def throughput(port, seconds, clients, attackers, body_limit, client_tokens=32):
    counter, lock = [0], threading.Lock()
    stop_at = time.time() + seconds
    ts = [threading.Thread(target=stream_tokens, args=(port, stop_at, counter, lock, client_tokens)) for _ in range(clients)]
    proc, out = None, multiprocessing.Queue()
    if attackers:
        proc = multiprocessing.Process(target=attack_process, args=(port, stop_at, body_limit, attackers, out))
        proc.start()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    sent = 0
    if proc:
        sent = out.get(timeout=120)
        proc.join()
    return counter[0] / seconds, sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--afd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--attackers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client-tokens", type=int, default=32,
                    help="max_tokens of each measured streaming request")
    ap.add_argument("--body-limit", type=int, default=MIB)
    ap.add_argument("--only", default="", help="run only the inputs whose name contains this")
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()

    log = open("/tmp/hostile_inputs_serve.log", "w+")
    proc = subprocess.Popen([a.afd, "serve", "--model", a.model, "--port", "0", "--max-body", str(a.body_limit)]
                            + a.serve_args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    port = None
    for _ in range(600):
        log.seek(0)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", log.read())
        if m:
            port = int(m.group(1))
            break
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if port is None:
        log.seek(0)
        sys.exit("afd serve did not start:\n" + log.read()[-2000:])
    failed = False
    try:
        exchange(port, http_post("/v1/completions", b'{"prompt":"a","max_tokens":2}') + b'{"prompt":"a","max_tokens":2}')
        rss0 = tree_rss_kb(proc.pid)
        print("afd serve pid %d port %d; RSS at start %.0f MB (process tree)" % (proc.pid, port, rss0 / 1024))
        print("%-38s %6s %10s %10s %8s  %s" % ("input", "sent", "4xx", "other", "ms/each", "one answer"))
        for name, fn in inputs(a.body_limit):
            if a.only and a.only not in name:
                continue
            n = a.count if "50 MB" not in name else max(1, a.count // 10)
            fours, other, note = 0, 0, ""
            t0 = time.time()
            for _ in range(n):
                try:
                    st, why = fn(port)
                except OSError as e:
                    st, why = None, "cannot connect: %s" % e
                if proc.poll() is not None:
                    other += 1
                    note = "the server exited"
                    break
                ok = st is not None and (400 <= st < 500 or (name == "two pipelined requests" and st == 200))
                fours += ok
                other += not ok
                if not note or not ok:
                    note = "%s %s" % (st, why)
            ms = (time.time() - t0) * 1e3 / n
            alive = proc.poll() is None
            print("%-38s %6d %10d %10d %8.1f  %s" % (name, n, fours, other, ms, note.replace("\n", " ")[:90]))
            if other or not alive:
                failed = True
            if not alive:
                print("SERVER DIED (exit %s)" % proc.returncode)
                break
        time.sleep(1.0)
        rss1 = tree_rss_kb(proc.pid)
        grew = (rss1 - rss0) / max(1, rss0)
        print("RSS after: %.0f MB (%+.1f %% of the start)" % (rss1 / 1024, 100 * grew))
        if grew > 0.10:
            failed = True
        if proc.poll() is None and a.seconds > 0:
            # Alternating rounds (alone, attacked, alone, ...) so that slow drifts of a shared
            # machine hit both; the drop is 1 - median(attacked) / median(alone).
            alone, attacked, sent = [], [], 0
            for _ in range(a.rounds):
                alone.append(throughput(port, a.seconds, a.clients, 0, a.body_limit, a.client_tokens)[0])
                tps, n = throughput(port, a.seconds, a.clients, a.attackers, a.body_limit, a.client_tokens)
                attacked.append(tps)
                sent += n
            base, hit = statistics.median(alone), statistics.median(attacked)
            drop = 1 - hit / base if base > 0 else 1.0
            print("decode stream tokens/s, %d clients, %d rounds of %.0f s: alone %s (median %.1f); with %d attackers "
                  "(%d worst-case bodies of %d B) %s (median %.1f): drop %.1f %%"
                  % (a.clients, a.rounds, a.seconds, " ".join("%.0f" % x for x in alone), base, a.attackers, sent,
                     a.body_limit, " ".join("%.0f" % x for x in attacked), hit, 100 * drop))
    finally:
        alive = proc.poll() is None
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    print("server alive at the end:", alive)
    sys.exit(1 if failed or not alive else 0)


if __name__ == "__main__":
    main()
