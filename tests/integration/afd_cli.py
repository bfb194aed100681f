"""Shared helpers of the pytest tests that run the afd CLI (test_afd_cli.py, test_cli_*.py):
afd() runs one command, generate() returns the tokens `afd generate` prints, spans() counts a
trace file's complete events, processes_with() finds processes by command line. AFD_BIN
names the afd executable (default build/apps/afd)."""
import functools
import json
import os
import pathlib
import subprocess

from afd_bundle import AFD, TIMEOUT

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/reference/data"
PROMPTS = ["--prompt-ids", "3,14,15,92,65", "--prompt-ids", "35", "--prompt-ids", "89,79,32,38,46,26,43"]


def afd(*args, timeout=TIMEOUT, env=None):
    """The finished process (stdout, stderr as text) of `afd args`."""
    return subprocess.run([AFD, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


@functools.lru_cache(maxsize=None)
def made(tmp, name, *args):
    """`afd make-model ARGS --out tmp/name`, made once per (tmp, name, args); the directory."""
    r = afd("--log-level", "error", "make-model", *args, "--out", tmp / name)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp / name


def generate(*args, timeout=TIMEOUT):
    """The tokens `afd --log-level error generate args` prints; fails the test if it fails."""
    r = afd("--log-level", "error", "generate", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def spans(path):
    """{(pid, name): count} of a trace file's complete events (each with a duration >= 0)."""
    c = {}
    for e in json.load(open(path))["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            c[(e["pid"], e["name"])] = c.get((e["pid"], e["name"]), 0) + 1
    return c


def processes_with(text):
    """The pids of the processes whose command line (arguments joined by NUL) contains text."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(p))
            except OSError:
                pass
    return out
