"""The README's Python example runs as written (on a free port instead of 14579)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_ports

pytest.importorskip("torch")
README = Path(__file__).resolve().parent.parent.parent / "README.md"


def test_readme_python_block_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "shard.take" in block and len(block.strip().splitlines()) <= 16
    code = block.replace('"ec_port": 14579', f'"ec_port": {free_ports(1)}')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
