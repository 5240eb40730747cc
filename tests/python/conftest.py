"""Shared helpers of the Python tests: ports, waiting by state, the cuda marker."""

import os
import random
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


def _ephemeral_range():
    """The kernel's range for ports it picks itself (bind to 0, a connect's source)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n):
    """A base port P with P .. P+n-1 free on 127.0.0.1 right now, chosen outside the
    kernel's ephemeral range: a port from inside it can be taken between this check and
    the caller's bind by any connection's source port (tests run in parallel, and the
    processes a test starts connect before others bind), which made a bind fail
    'address in use'. Outside it (and above the project's default ports, 145xx) only
    another fixed choice can collide."""
    lo, hi = _ephemeral_range()
    spans = [(s, e) for s, e in ((20000, lo), (hi + 1, 65536)) if e - s > n]
    rng = random.Random()
    for _ in range(200):
        s, e = rng.choice(spans)
        base = rng.randrange(s, e - n)
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
