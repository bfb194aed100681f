"""FFN worker loss that persists, end to end (docs/FAILOVER.md, "FFN failover").

`afd serve --topology 1A2F --ffn-takeover-s 1 --worker-restarts 0`: FFN worker 1 is killed
(SIGKILL) while greedy requests stream, and not restarted. The requests in flight are held and
retried (--step-retry-s); after the takeover time the surviving FFN worker holds both parts,
the request finishes with exactly the unfaulted text and new requests get it too. Then a
new FFN worker is added through the attention worker's POST /admin/ffn (it takes part 1), the
old one is started again by hand (a standby: both parts are held) and the added one is killed
under load (the standby takes over): no request fails. Every answer is the unfaulted text (a
1500-token stream in flight at the kill included), and /metrics and the log say what happened.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest tests/integration/test_ffn_failover.py
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from afd_bundle import AFD, free_port, http, make_model, read_completion_stream, start_ffn_worker, wait_until

PROMPTS = [[3, 14, 15, 92, 65], [35], [89, 79, 32, 38, 46, 26, 43], [7, 7, 7, 1]]


def complete(port, prompt, n, stream, on_first=None):
    """Greedy completion: (text, finish_reason, completion_tokens or None). on_first() runs when a
    stream's first text arrives."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        if not stream:
            j = json.load(r)
            return j["choices"][0]["text"], j["choices"][0]["finish_reason"], j["usage"]["completion_tokens"]
        text, fin, usage, done, error = read_completion_stream(r, on_first)
        if error:
            raise RuntimeError("error event: " + error)
        assert done, "stream ended without [DONE]"
        return text, fin, usage


def complete_retrying(port, prompt, n, stream, budget_s=30):
    """As a client honouring Retry-After does: a 503 (nothing can serve right now) is retried."""
    deadline = time.time() + budget_s
    while True:
        try:
            return complete(port, prompt, n, stream)
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.time() > deadline:
                raise
            time.sleep(float(e.headers.get("Retry-After", "1")) / 4)


def wait_for(pred, timeout_s, what):
    wait_until(pred, what, timeout_s, interval=0.05)


def membership(attn_port):
    return json.loads(http(attn_port, "/admin/ffn")[1])["engines"][0]


def metric(port, name):
    _, text = http(port, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = {}
    for c in out:
        try:
            args = open(f"/proc/{c}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        args = [a.decode() for a in args if a]
        found[int(c)] = args
    return found


def arg(args, flag):
    return args[args.index(flag) + 1]


@pytest.fixture
def bundle(tmp_path):
    model = tmp_path / "model"
    make_model(model)
    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen([AFD, "serve", "--model", str(model), "--topology", "1A2F", "--port", "0",
                              "--threads", "1", "--precision", "reference", "--ffn-takeover-s", "1",
                              "--worker-restarts", "0", "--step-retry-s", "30", "--ffn-timeout-ms", "3000"],
                             stdout=subprocess.PIPE, stderr=log, text=True)
    extra = []
    try:
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            line = serve.stdout.readline()
            if not line:
                break
            m = re.search(r"bundle complete: .* on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        assert port, "afd serve did not come up: " + open(tmp_path / "serve.log").read()[-3000:]
        yield {"serve": serve, "port": port, "model": str(model), "extra": extra, "log": tmp_path / "serve.log",
               "tmp": tmp_path}
    finally:
        for p in extra:
            p.kill()
            p.wait()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        log.close()


def in_flight(port, jobs, n, fault):
    """Greedy requests `jobs` ([(prompt, stream)]) of n tokens at once; `fault()` runs once a
    stream is under way. Every one must still be in flight then and finish without an error,
    with all n tokens. Returns their (text, finish_reason, usage) in job order."""
    results, errors, finished = {}, [], {}
    streaming = threading.Event()

    def one(k):
        prompt, stream = jobs[k]
        try:
            results[k] = complete(port, prompt, n, stream, on_first=streaming.set)
        except Exception as e:  # noqa: BLE001 -- any failure of a request in flight is the bug
            errors.append(f"request {k}: {e!r}")
        finished[k] = time.time()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    assert streaming.wait(60), "no stream started"
    t_fault = time.time()
    fault()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert min(finished.values()) > t_fault, "a request finished before the fault: raise n"
    out = [results[k] for k in range(len(jobs))]
    for text, fin, usage in out:
        assert fin == "length" and usage in (None, n), (fin, usage)
    return out


def start_ffn(bundle, port, shard, name):
    p = start_ffn_worker(bundle["model"], port, shard, 1, bundle["tmp"] / f"{name}.log")
    bundle["extra"].append(p)
    return p


def test_ffn_worker_lost_for_good_then_workers_added(bundle):
    port = bundle["port"]
    kids = children(bundle["serve"].pid)
    ffn = {arg(a, "--shard"): (pid, arg(a, "--listen")) for pid, a in kids.items()
           if "--role" in a and arg(a, "--role") == "ffn"}
    attn = [arg(a, "--listen") for a in kids.values() if "--role" in a and arg(a, "--role") == "attention"]
    assert set(ffn) == {"0/2", "1/2"} and len(attn) == 1, kids
    attn_port = int(attn[0].rsplit(":", 1)[1])
    n_long, n_short = 1500, 24

    # The unfaulted answers (non-streaming and streaming agree). One request at a time: a
    # sequence decoded alone always meets the same batches, so its text is reproducible to the
    # bit; batched with others it depends on who shares its micro-batches (1500 tokens in, that
    # changed a greedy token here even without a fault).
    want_long = complete(port, PROMPTS[2], n_long, True)
    want = {i: complete(port, p, n_short, False) for i, p in enumerate(PROMPTS)}
    for i, p in enumerate(PROMPTS):
        assert complete(port, p, n_short, True) == want[i]
    assert membership(attn_port)["epoch"] == 0

    # FFN worker 1 dies mid-stream and stays dead: the request is held, retried once FFN worker
    # 0 holds both parts, and finishes with the unfaulted text, to the byte (every part is still
    # rounded on its own, so the logits are the same bits).
    t_kill = []
    got = in_flight(port, [(PROMPTS[2], True)], n_long,
                    lambda: (t_kill.append(time.time()), os.kill(ffn["1/2"][0], signal.SIGKILL)))
    assert got[0] == want_long, "the request in flight at the kill differs from the unfaulted run"
    wait_for(lambda: membership(attn_port)["epoch"] == 1, 30, "the takeover")
    assert time.time() - t_kill[0] >= 1.0
    m = membership(attn_port)
    assert m["live"] == 1 and m["takeovers"] == 1
    assert m["members"][0]["experts"] == [0, 8] and m["members"][0]["shared"]
    assert not m["members"][1]["assigned"] and not m["members"][1]["connected"]
    for i, p in enumerate(PROMPTS):
        assert complete_retrying(port, p, n_short, i % 2 == 0) == want[i]

    # A new FFN worker (another name: shard 2/3) added on the attention worker takes part 1.
    p2 = free_port()
    start_ffn(bundle, p2, "2/3", "ffn2")
    status, body = http(attn_port, "/admin/ffn", {"add": f"127.0.0.1:{p2}"})
    assert status == 200, body
    wait_for(lambda: membership(attn_port)["live"] == 2, 30, "the added worker to join")
    for i, p in enumerate(PROMPTS):
        assert complete_retrying(port, p, n_short, i % 2 == 1) == want[i]
    m = membership(attn_port)
    assert m["applied_epoch"] == m["epoch"] == 2
    assert [x.get("experts") for x in m["members"]] == [[0, 4], None, [4, 8]]

    # The old worker, started again by hand at its address, is a standby: both parts are held.
    old = start_ffn(bundle, int(ffn["1/2"][1].rsplit(":", 1)[1]), "1/2", "ffn1")
    wait_for(lambda: membership(attn_port)["members"][1]["connected"], 30, "the old worker to connect")
    time.sleep(0.2)
    m = membership(attn_port)
    assert m["epoch"] == 2 and not m["members"][1]["assigned"]

    # The added worker dies under load (six requests, streaming and not): the standby takes its
    # part over; none fails, and requests for one prompt, batched together, agree.
    got = in_flight(port, [(PROMPTS[k % 4], k % 2 == 1) for k in range(6)], n_long,
                    lambda: os.kill(bundle["extra"][0].pid, signal.SIGKILL))
    assert got[0][0] == got[4][0] and got[1][0] == got[5][0]
    wait_for(lambda: membership(attn_port)["epoch"] == 3, 30, "the standby to take over")
    m = membership(attn_port)
    assert [x.get("experts") for x in m["members"]] == [[0, 4], [4, 8], None]
    assert m["takeovers"] == 2 and m["rejoins"] == 2
    for i, p in enumerate(PROMPTS):
        assert complete_retrying(port, p, n_short, i % 2 == 0) == want[i]
    assert old.poll() is None

    # Bad admin requests are clear errors.
    assert http(attn_port, "/admin/ffn", {"remove": "127.0.0.1:1"})[0] == 404
    assert http(attn_port, "/admin/ffn", {"frobnicate": 1})[0] == 400
    status, body = http(attn_port, "/admin/ffn", {"add": "nohost"})
    assert status == 400 and "nohost" in body
    assert all(x["removed"] for x in membership(attn_port)["members"][3:])  # the refused address is no member

    # What changed, on the front end's federated /metrics and in the log.
    assert metric(port, "afd_ffn_takeovers_total") == 2
    assert metric(port, "afd_ffn_epoch") == 3
    assert metric(port, "afd_ffn_live_workers") == 2
    log = open(bundle["log"]).read()
    assert "FFN worker 'ffn1' unreachable for" in log and "the others take over its experts [4, 8)" in log
    assert "FFN expert assignment epoch 3 in effect" in log
    assert "retrying the forward pass" in log  # the requests in flight were held, not failed


def test_ffn_parts_logits_are_mono_with_that_rounding(tmp_path):
    """`--ffn-parts P` cuts the experts into P parts rounded on their own, whoever holds them: an
    in-process 1A2F bundle with 4 parts (each FFN worker replying two partials) gives logits
    bit-identical to mono --afd-rounding 4, and different from --afd-rounding 2."""
    model = tmp_path / "model"
    make_model(model)
    common = [AFD, "--log-level", "error", "generate", "--model", str(model), "--precision", "reference",
              "--max-tokens", "16", "--ignore-eos", "--threads", "1", "--microbatches", "3",
              "--prompt-ids", "3,14,15,92,65", "--prompt-ids", "35"]

    def logits(name, *extra):
        path = tmp_path / name
        subprocess.run(common + list(extra) + ["--dump-logits", str(path)], check=True, capture_output=True,
                       timeout=120)
        return path.read_bytes()

    afd4 = logits("afd4.bin", "--topology", "1A2F", "--ffn-parts", "4")
    assert afd4 == logits("mono4.bin", "--afd-rounding", "4")
    assert afd4 != logits("mono2.bin", "--afd-rounding", "2")


def test_admin_refuses_an_ffn_worker_of_another_precision_and_a_removed_one_is_not_dialled(bundle):
    """An FFN worker started with another --precision than the bundle's is not added: the
    attention worker's POST /admin/ffn answers 400 naming the field and both values, and the FFN
    worker logs its refusal. A removed FFN worker that dies is not dialled again (no "waiting for
    peer" lines for its address, which the transport would log every 2 s)."""
    kids = children(bundle["serve"].pid)
    attn = [arg(a, "--listen") for a in kids.values() if "--role" in a and arg(a, "--role") == "attention"]
    attn_port = int(attn[0].rsplit(":", 1)[1])

    p_fast = free_port()
    fast = start_ffn_worker(bundle["model"], p_fast, "2/3", 1, bundle["tmp"] / "fast.log", precision="fast")
    bundle["extra"].append(fast)
    # Up before the add, so that the attention worker can say hello to it before it answers.
    wait_for(lambda: "on transport 'ffn2'" in open(bundle["tmp"] / "fast.log").read(), 60, "the FFN worker to start")
    status, body = http(attn_port, "/admin/ffn", {"add": f"127.0.0.1:{p_fast}"})
    assert status == 400, body
    assert ("precision differs: the attention worker runs --precision reference (f32 activations), the FFN worker "
            "--precision fast (bf16 activations)") in body, body
    assert f"127.0.0.1:{p_fast}" in body
    m = membership(attn_port)
    assert m["live"] == 2 and m["members"][2]["removed"] and not m["members"][2]["assigned"]
    assert "refusing attention peer 'attn0': handshake mismatch: precision differs" in open(bundle["tmp"] / "fast.log").read()

    # A standby of the same precision (both parts are held), removed, then killed.
    p_std = free_port()
    std = start_ffn_worker(bundle["model"], p_std, "3/4", 1, bundle["tmp"] / "standby.log")
    bundle["extra"].append(std)
    status, body = http(attn_port, "/admin/ffn", {"add": f"127.0.0.1:{p_std}", "name": "ffn3"})
    assert status == 200, body
    wait_for(lambda: membership(attn_port)["members"][3]["connected"], 30, "the standby to connect")
    status, body = http(attn_port, "/admin/ffn", {"remove": "ffn3"})
    assert status == 200, body
    std.kill()
    std.wait()
    waiting = f"waiting for peer at 127.0.0.1:{p_std}"
    wait_for(lambda: f"no longer dials 127.0.0.1:{p_std}" in open(bundle["log"]).read(), 30, "the dialling to stop")
    before = open(bundle["log"]).read().count(waiting)
    time.sleep(5)  # the transport retries (and logs) at least every 2 s while it dials
    assert open(bundle["log"]).read().count(waiting) == before, "the removed worker's address is still dialled"
    assert membership(attn_port)["live"] == 2
