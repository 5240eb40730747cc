"""scripts/goal-bounds.py: its ceilings' arithmetic on made-up rows, then the script end to end
on short rows (structure only: no speed is asserted), then its refusals."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "goal-bounds.py"


def load():
    spec = importlib.util.spec_from_file_location("goal_bounds", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ect_bin():
    b = os.environ.get("ECT_BIN") or str(Path(os.environ.get("ECT_BUILD_DIR", ROOT / "build"))
                                         / "ect")
    if not os.access(b, os.X_OK):
        pytest.skip("no ect binary at %s" % b)
    return b


def test_ceilings_arithmetic():
    gb = load()
    # limit 10,000 items/s; 2 CPUs; 100 cpu us an item; thread a at half a CPU at 5,000 items/s
    c, name = gb.ceilings(10000.0, 2, 100.0, {"a": 0.5, "b": 0.2}, 5000.0, (0.5, 2, 0.05))
    assert math.isclose(c["round_trips"], 0.5 / 0.6)  # raw p50 / (raw p50 + 2 rtt)
    assert math.isclose(c["cpus"], 2.0)  # 2 CPUs / 100 us = 20,000 items/s of 10,000
    assert math.isclose(c["one_thread"], 1.0)  # a: 100 us an item -> 10,000 items/s
    assert name == "a"
    # nothing measured: no ceiling, no thread
    c, name = gb.ceilings(10000.0, 2, None, None, 5000.0)
    assert c == {"round_trips": None, "cpus": None, "one_thread": None} and name is None
    # a serial step whose rtt is missing has no round-trip ceiling
    c, _ = gb.ceilings(10000.0, 1, 50.0, {}, 1.0, (0.5, 2, None))
    assert c["round_trips"] is None and math.isclose(c["cpus"], 2.0)


def test_binding_skips_a_ceiling_the_ratio_beats():
    gb = load()
    ceil = {"round_trips": 0.9, "cpus": 0.4, "one_thread": 0.7}
    assert gb.binding(ceil, 0.3) == ("cpus", 0.4)
    # the row measured 0.5: a "ceiling" of 0.4 is no ceiling, the next one binds
    assert gb.binding(ceil, 0.5) == ("one_thread", 0.7)
    assert gb.binding({"round_trips": None, "cpus": None, "one_thread": None}, 0.1) == (None, None)


def test_script_end_to_end():
    ect = ect_bin()
    r = subprocess.run([sys.executable, str(SCRIPT), "--ect", ect, "--seconds", "0.05",
                        "--pull-ms", "50", "--demo-items", "200", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    kinds = [(x["bench"], x["transport"], x["size"], x["step"], x["inflight"]) for x in rows]
    # every goal row of issue 13, once: push (8), pull (2), the demo
    assert sorted(kinds) == sorted(
        [("push", t, s, k, 1) for t in ("tcp", "shm") for s, k in
         ((65536, 32), (4718592, 1), (4718592, 32))] +
        [("push", t, 65536, 32, 4) for t in ("tcp", "shm")] +
        [("pull", t, 65536, 32, 32) for t in ("tcp", "shm")] +
        [("demo", "tcp", 131072, 8, 4)])
    for x in rows:
        assert x["ratio"] > 0 and x["goal"] in (0.5, 0.8, 0.9)
        for name, v in x["ceilings"].items():
            assert v is None or (v > 0 and math.isfinite(v)), (x, name)
        if x["binding"] is not None:
            assert x["ceiling"] == x["ceilings"][x["binding"]] and x["ceiling"] >= x["ratio"]
            assert x["goal_above_ceiling"] == (x["goal"] > x["ceiling"])
        if x["bench"] == "push" and x["inflight"] == 1:
            assert x["ceilings"]["round_trips"] is not None  # every serial row has its rtt
    # the text form of the same: a header and one line a row
    r = subprocess.run([sys.executable, str(SCRIPT), "--ect", ect, "--seconds", "0.05",
                        "--pull-ms", "50", "--no-demo"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:3] == ["bench", "xprt", "size"]
    assert len([ln for ln in lines if ln.startswith(("push ", "pull "))]) == 10


@pytest.mark.parametrize("args,text", [
    (["--seconds", "0"], "must be positive"),
    (["--cpus", "0"], "--cpus at least 1"),
    (["--demo-items", "10"], "--demo-items at least 200"),
    (["--ect", "/nonexistent/ect"], "no ect binary at /nonexistent/ect"),
    (["--bogus"], "unrecognized arguments"),
])
def test_script_refuses_bad_arguments(args, text):
    r = subprocess.run([sys.executable, str(SCRIPT)] + args, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and text in r.stderr


def test_script_says_which_bench_failed():
    r = subprocess.run([sys.executable, str(SCRIPT), "--ect", "/bin/false", "--no-demo"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "goal-bounds.py: /bin/false bench push" in r.stderr and "failed (exit 1)" in r.stderr
