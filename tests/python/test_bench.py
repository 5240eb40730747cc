"""scripts/bench-python.py runs end to end (a smoke test: no speed is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_bench_python_smoke():
    build = os.environ.get("ECT_BUILD_DIR", str(ROOT / "build"))
    if not (Path(build) / "tests" / "push_items").exists():
        pytest.skip("push_items is not built")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-python.py"), "--count", "6",
                        "--step", "3", "--rounds", "1", "--shape", "64x256", "--build", build,
                        "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # each producer pushed one warm-up step and its items, and the consumer saw them all
    assert out["consumer_seen"] == 2 * (6 + 3)
    for who in ("C", "Python"):
        assert out["results"][who]["items_per_s"] > 0 and out["results"][who]["gb_per_s"] > 0
    assert out["python_over_c"] > 0
