"""Shared helpers of the Python tests: ports, waiting by state, the cuda marker."""

import os
import socket
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "python"))

# Generous: CI runs on 2 shared cores under sanitizers. Waits end on state, never sleep.
DEADLINE_S = float(os.environ.get("ECT_TEST_DEADLINE_S", "120"))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def wait_for(cond, what, timeout=DEADLINE_S, step=0.002):
    """Polls cond() until it returns something true; fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def free_ports(n):
    """A base port P with P .. P+n-1 free on 127.0.0.1 right now (a later bind may
    still race with another process: callers retry on 'address in use')."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                t.bind(("127.0.0.1", p))
                socks.append(t)
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free port range")
