"""`afd serve|worker --print-config`, each check its own test: the effective settings as JSON,
each with its source (default, topology file, env AFD_X, flag --x), in the order file < env <
flag; exit 0; a bad value is an error (exit 1..69) naming where it came from.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_print_config.py
"""
import json
import os

import pytest

from afd_cli import afd

TOPOLOGY = {"model": "m", "precision": "reference", "threads": 2, "scheduler": {"max_running": 8, "kv_block": 32},
            "frontend": {"listen": "127.0.0.1:8123", "api_key": "s3cret"},
            "attention": [{"address": "127.0.0.1:8101", "microbatches": 2}],
            "ffn": [{"address": "127.0.0.1:7100", "threads": 3, "metrics": "127.0.0.1:9100"}]}


def env(**kv):
    e = {k: v for k, v in os.environ.items() if not k.startswith("AFD_") or k == "AFD_BIN"}
    e.update(kv)
    return e


def config(*args, **kv):
    """(exit status, parsed stdout) of `afd args --print-config` with env kv."""
    r = afd(*args, "--print-config", env=env(**kv))
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)


@pytest.fixture(scope="module")
def topo(tmp_path_factory):
    p = tmp_path_factory.mktemp("print_config") / "t.json"
    p.write_text(json.dumps(TOPOLOGY))
    return p


def src(topo, what):
    return f"topology file {topo}: {what}"


def entry(c, key):
    return c[key]["value"], c[key]["source"]


@pytest.fixture(scope="module")
def defaults():
    return config("serve")


@pytest.fixture(scope="module")
def flags_env():
    return config("serve", "--port", "9002", "--kv-dtype", "fp8", AFD_PORT="9001", AFD_MAX_RUNNING="7")


@pytest.fixture(scope="module")
def from_file(topo):
    return config("serve", "--topology-file", topo)


@pytest.fixture(scope="module")
def attention(topo):
    return config("worker", "--topology-file", topo, "--role", "attention", "--index", "0", "--threads", "4",
                  AFD_KV_BLOCK="64")


@pytest.fixture(scope="module")
def ffn(topo):
    return config("worker", "--topology-file", topo, "--role", "ffn", "--index", "0")


def test_serve_print_config_exits_0(defaults):
    assert defaults[0] == 0, defaults[1]


@pytest.mark.parametrize("key,value", [("port", 8000), ("model", "models/tiny"), ("kv_dtype", "bf16"),
                                       ("spawn_workers", False)])
def test_default(defaults, key, value):
    assert entry(defaults[1], key) == (value, "default")


@pytest.mark.parametrize("key,value,source", [("port", 9002, "flag --port"),
                                              ("max_running", 7, "env AFD_MAX_RUNNING"),
                                              ("kv_dtype", "fp8", "flag --kv-dtype")], ids=["flag over env", "env", "flag"])
def test_flag_and_env(flags_env, key, value, source):
    assert entry(flags_env[1], key) == (value, source)


def test_serve_topology_file_exits_0(from_file):
    assert from_file[0] == 0, from_file[1]


def test_front_end_port_from_file(from_file, topo):
    assert entry(from_file[1], "port") == (8123, src(topo, "frontend.listen"))


def test_model_resolved_against_file(from_file, topo):
    assert entry(from_file[1], "model") == (str(topo.parent / "m"), src(topo, "frontend.model (or the top level's)"))


def test_api_key_hidden(from_file, topo):
    assert entry(from_file[1], "api_key") == ("(set)", src(topo, "frontend.api_key"))
    assert "s3cret" not in json.dumps(from_file[1])


def test_env_over_file(topo):
    rc, c = config("serve", "--topology-file", topo, AFD_PORT="9005")
    assert rc == 0 and entry(c, "port") == (9005, "env AFD_PORT"), c


def test_worker_print_config_exits_0(attention):
    assert attention[0] == 0, attention[1]


@pytest.mark.parametrize("key,value,source", [
    ("threads", 4, "flag --threads"), ("kv_block", 64, "env AFD_KV_BLOCK"),
    ("max_running", 8, "FILE: scheduler.max_running"), ("microbatches", "2", "FILE: attention[0].microbatches"),
    ("ffn", "127.0.0.1:7100", "FILE: ffn[*].address"), ("precision", "reference", "FILE: precision")],
    ids=["flag over file", "env over file", "scheduler value", "its own value", "its FFN peers", "precision"])
def test_attention_worker(attention, topo, key, value, source):
    assert entry(attention[1], key) == (value, source.replace("FILE", f"topology file {topo}"))


@pytest.mark.parametrize("key,value,source", [
    ("threads", 3, "ffn[0].threads"), ("shard", "0/1", "ffn[0] (its place in the list)"),
    ("metrics_listen", "127.0.0.1:9100", "ffn[0].metrics")], ids=["own threads", "shard", "metrics"])
def test_ffn_worker(ffn, topo, key, value, source):
    assert ffn[0] == 0, ffn[1]
    assert entry(ffn[1], key) == (value, src(topo, source))


# ---- validation: the whole is checked before printing; a bad value names its flag / source ----

def refused(r):
    return 0 < r.returncode < 70


def test_invalid_flag_value_refused():
    r = afd("serve", "--max-running", "0", "--print-config", env=env())
    assert refused(r) and "--max-running" in r.stdout + r.stderr, r


def test_invalid_env_value_refused_naming_source():
    r = afd("serve", "--print-config", env=env(AFD_MAX_RUNNING="0"))
    assert refused(r) and "--max-running: env AFD_MAX_RUNNING" in r.stdout + r.stderr, r


def test_inconsistent_file_values_refused(tmp_path):
    tp = tmp_path / "tp.json"
    tp.write_text(json.dumps({"model": "m", "ffn_parts": 2, "ffn_tp": 2, "attention": [{"address": "127.0.0.1:8101"}],
                              "ffn": [{"address": "127.0.0.1:7100"}, {"address": "127.0.0.1:7101"}]}))
    r = afd("worker", "--topology-file", tp, "--role", "attention", "--index", "0", env=env())
    assert refused(r) and f"--ffn-parts: topology file {tp}: ffn_parts" in r.stdout + r.stderr, r


def test_invalid_env_device_refused():
    r = afd("serve", "--print-config", env=env(AFD_FFN_DEVICE="gpu"))
    out = r.stdout + r.stderr
    assert refused(r) and ("AFD_FFN_DEVICE" in out or "--ffn-device" in out), r


def test_inconsistent_settings_refused_with_sources(topo):
    r = afd("worker", "--topology-file", topo, "--role", "attention", "--index", "0", "--ffn-parts", "2", "--ffn-tp",
            "2", "--print-config", env=env())
    out = r.stdout + r.stderr
    assert refused(r) and "--ffn-parts: flag --ffn-parts" in out and "--ffn-tp: flag --ffn-tp" in out, r
