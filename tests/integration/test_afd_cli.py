"""AFD end to end through the CLI, each check its own test: every in-process topology (and FFN
tensor parallelism) and multi-process UCX bundles (FFN workers started after the attention
side) produce exactly the greedy tokens of the monolithic engine with the same wire rounding;
--trace, afd bench --json / --e2e, afd calibrate, afd trace merge; a lost FFN worker is a clear
error, not a hang.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_afd_cli.py
"""
import functools
import json
import re
import signal
import statistics
import time

import pytest

from afd_bundle import TIMEOUT, Proc, free_ports, wait_until
from afd_cli import DATA, PROMPTS, afd, processes_with, spans

MODEL = DATA / "qwen2moe_shared"


def P(model=MODEL):
    return ["--model", str(model), "--precision", "reference", "--max-tokens", "24", "--ignore-eos", "--threads", "1",
            *PROMPTS]


def generate(*args, model=MODEL, quiet=True):
    """The tokens `afd generate` prints (stdout); fails the test if it fails."""
    r = afd(*(["--log-level", "error"] if quiet else []), "generate", *P(model), *args)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@functools.lru_cache(maxsize=None)
def mono(*args):
    """Monolithic generate with extra args (the AFD wire's rounding emulated)."""
    return generate(*args)


# ---- in process ------------------------------------------------------------------------------

@pytest.mark.parametrize("mb", [1, 3])
@pytest.mark.parametrize("topology", ["1A1F", "2A1F", "1A2F", "2A2F", "EP2"])
def test_in_process_topology_equals_mono(topology, mb):
    rounding = "2" if topology.endswith("2F") or topology == "EP2" else "1"
    assert generate("--topology", topology, "--microbatches", mb) == mono("--afd-rounding", rounding)


@pytest.mark.parametrize("mb", [1, 3])
@pytest.mark.parametrize("topology,rounding", [("1A2F", "2"), ("1A4F", "4")])
def test_in_process_ffn_tp_equals_mono(topology, rounding, mb):
    """Pure TP (1A2F, t=2) and hybrid TP+EP (1A4F: two EP groups of two TP ranks)."""
    want = mono("--afd-rounding", rounding, "--ffn-tp", "2")
    assert generate("--topology", topology, "--ffn-tp", "2", "--microbatches", mb) == want


def test_hybrid_tp_logits_bit_identical(tmp_path):
    """At the same micro-batch count (3, the xAyF default), bit-identical to mono's TP emulation
    and different from the EP one (so the emulation is the TP one)."""
    generate("--afd-rounding", "4", "--ffn-tp", "2", "--microbatches", "3", "--dump-logits", tmp_path / "m_tp.bin")
    generate("--afd-rounding", "4", "--microbatches", "3", "--dump-logits", tmp_path / "m_ep.bin")
    generate("--topology", "1A4F", "--ffn-tp", "2", "--dump-logits", tmp_path / "a_tp.bin")
    a = (tmp_path / "a_tp.bin").read_bytes()
    assert a and a == (tmp_path / "m_tp.bin").read_bytes()
    assert a != (tmp_path / "m_ep.bin").read_bytes()


def test_ffn_tp_not_dividing_refused():
    r = afd("--log-level", "error", "generate", *P(), "--topology", "1A2F", "--ffn-tp", "3")
    assert r.returncode == 1 and "ffn-tp 3 does not divide" in r.stdout + r.stderr, r


def test_trace_has_both_sides(tmp_path):
    generate("--topology", "2A1F", "--microbatches", "3", "--trace", tmp_path / "trace.json")
    c = spans(tmp_path / "trace.json")
    assert c.get((1, "attention")) and c.get((2, "attention")), c
    assert c.get((1, "wait FFN")) and c.get((100, "ffn")), c


# ---- afd bench / calibrate -------------------------------------------------------------------

@pytest.mark.parametrize("spawn", [[], ["--spawn-ffn"]], ids=["in-process", "spawn-ffn"])
def test_bench_json_rows(spawn, tmp_path):
    """A mono baseline and one row per micro-batch count, each with stage times, idle ratios
    and tokens/s per worker (attention shares add up to the row's; each FFN worker saw a routed
    share, at most every token; every token's top-k experts computed once)."""
    r = afd("--log-level", "error", "bench", "--model", MODEL, "--precision", "reference", "--threads", "1",
            "--mode", "afd", "--topology", "2A2F", "--microbatches", "1,3", "--batch", "8", "--context", "16",
            "--steps", "1", "--json", *spawn, timeout=3 * TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    top_k = json.load(open(MODEL / "config.json"))["num_experts_per_tok"]
    assert [(x["wiring"], x["microbatches"]) for x in rows] == [("mono", 1), ("2A2F", 1), ("2A2F", 3)], rows
    for x in rows[1:]:
        tps = x["tokens_per_s"]
        assert tps > 0 and 0 <= x["eta_attention"] <= 1 and 0 <= x["eta_ffn"] <= 1, x
        a, f = x["attention_tokens_per_s"], x["ffn_tokens_per_s"]
        assert len(a) == 2 and abs(sum(a) - tps) < 1e-6 * tps, (a, tps)
        assert len(f) == 2 and all(0 < v <= tps * (1 + 1e-9) for v in f), (f, tps)
        pairs = x["ffn_expert_rows_per_s"]
        assert len(pairs) == 2 and abs(sum(pairs) - tps * top_k) < 1e-6 * tps * top_k, (pairs, tps, top_k)
        assert len(x["layers"]) > 0 and all(l["ffn_ms"] >= 0 for l in x["layers"]), x["layers"]
    assert rows[0]["attention_tokens_per_s"] == [] and rows[0]["ffn_tokens_per_s"] == []
    for x in rows:  # --steps 1: one timed step, which is the median, p90 and p99
        assert len(x["step_times_ms"]) == 1 and x["step_ms"] == x["step_times_ms"][0] == x["step_ms_p99"], x


def test_bench_verification_steps():
    """--query-tokens q: each timed step forwards every sequence's last token and q - 1 drafts
    (all rejected), so the KV holds up to context + steps + q positions at the last step."""
    r = afd("--log-level", "error", "bench", "--model", MODEL, "--threads", "1", "--batch", "2", "--context", "16",
            "--steps", "14", "--query-tokens", "9", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 1 and len(rows[0]["step_times_ms"]) == 14, rows


def test_bench_e2e_rows():
    """The real generate loop: every decode step timed, the summary consistent with them. An
    xAyF --topology alone means --mode afd; with an explicit --mode mono it is refused."""
    r = afd("--log-level", "error", "bench", "--model", MODEL, "--threads", "1", "--topology",
            "1A1F", "--batch", "1,3", "--e2e", "--tokens", "6", "--prompt-len", "5", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    assert [(x["wiring"], x["batch"]) for x in rows] == [("1A1F", 1), ("1A1F", 3)], rows
    for x in rows:
        t = x["step_times_ms"]
        assert len(t) == 5, t  # 6 new tokens: the first from the prefill, then 5 decode steps
        assert abs(x["step_ms"] - statistics.median(t)) < 1e-9 and max(t) == x["step_ms_max"], x
        assert x["step_ms"] <= x["step_ms_p90"] <= x["step_ms_p99"] <= x["step_ms_max"], x
        assert x["decode_tokens_per_s"] > 0 and x["prefill_tokens_per_s"] > 0, x
    r = afd("--log-level", "error", "bench", "--model", MODEL, "--mode", "mono", "--topology", "1A1F", "--e2e")
    assert r.returncode == 1 and "--mode mono with --topology 1A1F" in r.stderr, r.stderr[-2000:]


def test_calibrate_trace_and_profile(tmp_path):
    """Batches 1 and 32: with 1 and 2 this tiny model's FFN times differ by less than the
    timing noise and the fit refuses the samples."""
    r = afd("--log-level", "error", "calibrate", "--model", MODEL, "--batches", "1,32", "--contexts", "8",
            "--threads", "1", "--trace", tmp_path / "cal_trace.json", "--out", tmp_path / "profile.json",
            timeout=3 * TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sum(n for (pid, name), n in spans(tmp_path / "cal_trace.json").items() if name == "attention") > 0
    assert "ffn" in json.load(open(tmp_path / "profile.json"))


# ---- --spawn-ffn: FFN workers as child processes over UCX ------------------------------------

@pytest.fixture(scope="module")
def spawn_model(tmp_path_factory):
    """The model under a path of this test's own, so that its worker processes are told apart
    from any other afd on the machine by their command line."""
    link = tmp_path_factory.mktemp("spawn") / "model"
    link.symlink_to(MODEL)
    return link


def test_spawn_ffn_2a2f_equals_mono(spawn_model, tmp_path):
    got = generate("--topology", "2A2F", "--microbatches", "3", "--spawn-ffn", "--trace", tmp_path / "sp_trace.json",
                   model=spawn_model)
    assert got == mono("--afd-rounding", "2")
    # --trace with --spawn-ffn: the FFN worker processes' spans (pid 100, 101) merged in, parts removed.
    c = spans(tmp_path / "sp_trace.json")
    assert all(c.get(k) for k in [(1, "attention"), (2, "attention"), (100, "ffn"), (101, "ffn")]), c
    assert not list(tmp_path.glob("sp_trace.ffn*.json"))


def test_spawn_ffn_hybrid_tp_equals_mono(spawn_model):
    got = generate("--topology", "1A4F", "--ffn-tp", "2", "--spawn-ffn", model=spawn_model)
    assert got == mono("--afd-rounding", "4", "--ffn-tp", "2")


def test_spawned_workers_stopped(spawn_model):
    assert processes_with(f"worker\0--role\0ffn\0--model\0{spawn_model}") == []


# ---- multi-process over UCX ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ucx(tmp_path_factory):
    """Hand-started FFN workers (tests add them); closed at the end."""
    tmp = tmp_path_factory.mktemp("ucx")
    s = {"tmp": tmp, "procs": {}}

    def worker(name, port, *args):
        p = Proc(["worker", "--role", "ffn", "--model", MODEL, "--listen", f"127.0.0.1:{port}", "--threads", "1",
                  "--precision", "reference", *args], tmp, name)
        s["procs"][name] = p
        return p
    s["worker"] = worker
    yield s
    for p in s["procs"].values():
        p.close()


def test_ucx_1a2f_across_processes(ucx):
    """The attention side starts first, says what it waits for, then the FFN workers come."""
    port0, port1 = free_ports(2)
    ucx["ports"] = (port0, port1)
    g = Proc(["generate", *P(), "--microbatches", "3", "--ffn", f"127.0.0.1:{port0},127.0.0.1:{port1}"], ucx["tmp"],
             "g")
    try:
        waited = g.wait_for("waiting for FFN worker")
        ucx["worker"]("w0", port0, "--shard", "0/2")
        ucx["worker"]("w1", port1, "--shard", "1/2")
        assert g.stopped() and g.proc.returncode == 0, g.text()[-2000:]
    finally:
        g.close()
    assert g.text("out") == mono("--afd-rounding", "2")
    ucx["waited"] = bool(waited)


def test_ucx_attention_side_said_what_it_waited_for(ucx):
    assert ucx.get("waited")


def test_ucx_1a2f_ffn_tp_across_processes(ucx):
    port2, port3 = free_ports(2)
    for k, port in enumerate((port2, port3)):
        ucx["worker"](f"tp{k}", port, "--shard", f"{k}/2", "--ffn-tp", "2")
    got = generate("--microbatches", "3", "--ffn", f"127.0.0.1:{port2},127.0.0.1:{port3}", "--ffn-tp", "2")
    assert got == mono("--afd-rounding", "2", "--ffn-tp", "2")


def test_killed_worker_trace_completed_by_merge(ucx):
    """The --trace file of a SIGKILLed worker holds its spans up to the kill (no closing line);
    `afd trace merge` completes it."""
    tmp = ucx["tmp"]
    (port4,) = free_ports(1)
    w = ucx["worker"]("killed", port4, "--trace", tmp / "killed.json")
    generate("--ffn", f"127.0.0.1:{port4}")
    # Past a flush (every 200 ms): an FFN span is in the streamed file.
    wait_until(lambda: re.search(rb'"name":\s*"ffn"', (tmp / "killed.json").read_bytes()), "an FFN span flushed",
               interval=0.1)
    time.sleep(0.6)
    w.signal(signal.SIGKILL)
    w.stopped()
    r = afd("trace", "merge", "-o", tmp / "completed.json", tmp / "killed.json")
    assert r.returncode == 0, r
    assert not (tmp / "killed.json").read_bytes().rstrip().endswith(b"]}")
    assert f"merged {tmp / 'killed.json'}: cut short" in r.stdout + r.stderr, r
    c = spans(tmp / "completed.json")
    assert c.get((100, "ffn")), c


def test_trace_merge_of_non_trace_leaves_output(ucx):
    tmp = ucx["tmp"]
    keep = tmp / "keep.json"
    keep.write_bytes(b'{"traceEvents": []}')
    r = afd("trace", "merge", "-o", keep, tmp / "w0.err", tmp / "missing.json")
    assert r.returncode == 1 and "not a trace written by afd" in r.stdout + r.stderr, r
    assert keep.read_bytes() == b'{"traceEvents": []}'


def test_lost_ffn_worker_clear_error(ucx):
    """FFN worker 1 dies; the attention side gives up after its connect timeout with a clear
    error naming what it waited for (mid-step losses: tests/unit/runtime, comm)."""
    port0, port1 = ucx["ports"]
    ucx["procs"]["w1"].signal(signal.SIGTERM)
    assert ucx["procs"]["w1"].stopped()
    r = afd("generate", "--model", MODEL, "--precision", "reference", "--max-tokens", "100", "--ignore-eos",
            "--threads", "1", "--prompt-ids", "1,2,3", "--ffn", f"127.0.0.1:{port0},127.0.0.1:{port1}",
            "--ffn-timeout-ms", "2000", "--ffn-connect-timeout-ms", "3000")
    assert r.returncode == 1, r
    assert any(w in r.stderr.lower() for w in ("ffn", "unavailable", "timeout", "waiting")), r.stderr[-2000:]
