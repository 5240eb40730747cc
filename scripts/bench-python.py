#!/usr/bin/env python3
"""bench-python.py: what the Python binding costs a producer, against the C producer,
in the same run and into the same consumer.

    /usr/bin/python3 scripts/bench-python.py [--count 160] [--step 8] [--rounds 3]
        [--shape 576x4096] [--dtype bfloat16] [--transport tcp] [--device cpu|cuda]
        [--pool-device cpu|cuda] [--build build] [--json]

A consumer instance (one shard and its scheduler, in a child process) receives every
item and finishes it at once (no reads), so the producer side sets the pace. Rounds
alternate: the C producer (build/tests/push_items, a process of its own: ect_push_producer
opened from the same JSON configuration, sources in plain buffers) and the Python one
(ectransfer.PushProducer.push of torch tensors), the same count, step (one flush per
step) and shape, each item's bytes copied into the staging pool during the call in both
(with --device cuda the Python producer's CUDA tensors are borrowed instead: read on the
device by the library, staged device to host over tcp, none over shm into a CUDA pool).
--pool-device cuda puts the consumer's pool on the GPU (ec_buffer_device).
Both producers stay open for the whole run. Each round pushes one untimed warm-up step,
then is timed from its first push to its last result. Prints items/s and GB/s per
producer (median of the rounds, min..max) and the ratio Python / C, the binding's cost.
No pass/fail on speed: the figure is read, not asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))


def consumer_main(pipe, pool_bytes: int, transport: str, pool_device: str = "cpu") -> None:
    import ectransfer

    with ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": pool_bytes,
                                  "transport": transport,
                                  "ec_buffer_device": pool_device}) as shard:
        with ectransfer.PushScheduler({"ec_port": shard.port, "accept_any": True}) as sched:
            while not sched.stats()["shards"]:
                time.sleep(0.001)
            pipe.send(shard.address)
            seen, expected, deadline = 0, None, None
            while expected is None or (seen < expected and time.monotonic() < deadline):
                if expected is None and pipe.poll(0):
                    expected = pipe.recv()  # every push ended: wait for their events
                    deadline = time.monotonic() + 60
                ids = sched.poll()
                for tid in ids:  # arrived on every shard: finish it (frees its memory)
                    sched.cancel(tid)
                seen += len(ids)
                if not ids:
                    time.sleep(0.0005)
            pipe.send(seen)


def python_round(prod, to: str, tensors: list, count: int, step: int, prefix: str) -> dict:
    """Like push_items: one untimed warm-up step, then count items timed."""
    import ectransfer

    done = failed = 0
    t0 = 0.0
    for i in range(-step, count):
        if i == 0:
            while done < step:
                res = prod.poll(0.1)
                done += len(res)
                failed += sum(not r.ok for r in res)
            done = 0
            t0 = time.monotonic()
        while True:
            try:
                prod.push(f"{prefix}-{i}", to, f"{prefix}-h{i}", tensors[(i + step) % step])
                break
            except ectransfer.Error as e:
                if e.code != ectransfer.ECT_EFULL:
                    raise
                prod.flush()  # staging full: the step so far goes out, room comes back
                res = prod.poll(0.1)
                done += len(res)
                failed += sum(not r.ok for r in res)
        if (i + step + 1) % step == 0 or i + 1 == count:
            prod.flush()
        res = prod.poll(0)
        done += len(res)
        failed += sum(not r.ok for r in res)
    while done < count:
        res = prod.poll(0.1)
        done += len(res)
        failed += sum(not r.ok for r in res)
    secs = time.monotonic() - t0
    nbytes = tensors[0].numel() * tensors[0].element_size()
    return {"items": count, "bytes": nbytes * count, "seconds": secs, "failed": failed}


def call_cost(tensor, blocks: int = 5, calls: int = 100) -> dict:
    """Microseconds per call, in this process, on one producer (its staging memory warm):
    PushProducer.push(tensor) against ect_push_producer_reserve called through ctypes
    with a prepared item (the same bytes copied, no binding work), each followed by a
    cancel that frees the staging copy at once; blocks alternate, median of blocks."""
    import ctypes

    import ectransfer
    from ectransfer import _lib

    prod = ectransfer.PushProducer({"ec_buffer_size": 256 << 20})
    shape = tuple(tensor.shape)
    dims = (_lib.U64 * len(shape))(*shape)
    nbytes = tensor.numel() * tensor.element_size()
    dtype = ectransfer.dtype_name(tensor.dtype).encode()
    addr = "127.0.0.1:9"  # nothing is sent: every item is cancelled before a flush

    def c_block(k):
        t = time.perf_counter()
        for i in range(calls):
            tid = f"c{k}-{i}".encode()
            it = _lib.PushItem(transfer_id=tid, consumer=addr.encode(), mm_hash=tid, shape=dims,
                               ndim=len(shape), dtype=dtype, nbytes=nbytes,
                               data=tensor.data_ptr())
            _lib.check(_lib.lib.ect_push_producer_reserve(prod._h, ctypes.byref(it)))
            _lib.lib.ect_push_producer_cancel(prod._h, tid)
        return (time.perf_counter() - t) / calls * 1e6

    def py_block(k):
        t = time.perf_counter()
        for i in range(calls):
            prod.push(f"p{k}-{i}", addr, f"p{k}-{i}", tensor)
            prod.cancel(f"p{k}-{i}")
        return (time.perf_counter() - t) / calls * 1e6

    c_block(-1), py_block(-1)  # staging pages touched once
    cs, ps = [], []
    for k in range(blocks):
        cs.append(c_block(k))
        ps.append(py_block(k))
        prod.poll(0)
    prod.close()
    return {"c_us": statistics.median(cs), "python_us": statistics.median(ps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=160, help="items per round (default 160)")
    ap.add_argument("--step", type=int, default=8, help="items per flush (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per producer (default 3)")
    ap.add_argument("--shape", default="576x4096", help="tensor shape (default 576x4096)")
    ap.add_argument("--dtype", default="bfloat16", help="torch dtype (default bfloat16)")
    ap.add_argument("--transport", default="tcp", help="tcp, shm or ucx (default tcp)")
    ap.add_argument("--device", default="cpu",
                    help="where the Python producer's tensors live (cpu, or cuda: read on the "
                         "device by the library; the C producer's are host buffers)")
    ap.add_argument("--pool-device", default="cpu",
                    help="where the consumer's pool lives (cpu, or cuda: GPU memory)")
    ap.add_argument("--build", default=str(ROOT / "build"), help="the build tree")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()
    os.environ.setdefault("ECT_LIBRARY", str(Path(a.build) / "libectransfer.so"))
    import torch

    import ectransfer

    shape = tuple(int(d) for d in a.shape.split("x"))
    dtype = getattr(torch, a.dtype)
    tensors = [torch.randn(shape).to(dtype).to(a.device) for _ in range(a.step)]
    nbytes = tensors[0].numel() * tensors[0].element_size()
    driver = Path(a.build) / "tests" / "push_items"
    if not driver.exists():
        print(f"bench-python: {driver} is missing (build the tests)", file=sys.stderr)
        return 2
    cfg = {"ec_buffer_size": 256 << 20, "control_timeout_s": 60}
    ctx = mp.get_context("spawn")
    pipe, child = ctx.Pipe()
    cons = ctx.Process(target=consumer_main, args=(child, 1 << 30, a.transport, a.pool_device),
                       daemon=True)
    cons.start()
    if not pipe.poll(120):
        print("bench-python: the consumer did not start", file=sys.stderr)
        return 1
    to = pipe.recv()
    runs = {"C": [], "Python": []}
    run_id = f"b{os.getpid()}"
    # Both producers live for the whole run (staging memory warm in both), one round
    # each in turn.
    c = subprocess.Popen([str(driver), to, str(a.step), str(nbytes), a.dtype,
                          "x".join(map(str, shape)), json.dumps(cfg)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with ectransfer.PushProducer(cfg) as prod:
        for r in range(a.rounds):
            c.stdin.write(f"{a.count} {run_id}-c{r}\n")
            c.stdin.flush()
            line = c.stdout.readline()
            if not line:
                print("bench-python: push_items failed", file=sys.stderr)
                return 1
            runs["C"].append(json.loads(line))
            runs["Python"].append(python_round(prod, to, tensors, a.count, a.step,
                                               f"{run_id}-p{r}"))
    c.stdin.close()
    if c.wait(120) != 0:
        return 1
    pipe.send(2 * a.rounds * (a.count + a.step))  # what both producers pushed
    seen = pipe.recv() if pipe.poll(120) else None
    cons.join(60)
    summary = {}
    for who, rs in runs.items():
        if any(x["failed"] for x in rs):
            print(f"bench-python: {who} rounds had failures: {rs}", file=sys.stderr)
            return 1
        ips = [x["items"] / x["seconds"] for x in rs]
        gbs = [x["bytes"] / x["seconds"] / 1e9 for x in rs]
        summary[who] = {"items_per_s": statistics.median(ips), "gb_per_s": statistics.median(gbs),
                        "items_per_s_range": [min(ips), max(ips)],
                        "gb_per_s_range": [min(gbs), max(gbs)]}
    ratio = summary["Python"]["items_per_s"] / summary["C"]["items_per_s"]
    cost = call_cost(tensors[0].cpu())
    if a.json:
        print(json.dumps({"shape": shape, "dtype": a.dtype, "count": a.count, "step": a.step,
                          "rounds": a.rounds, "transport": a.transport, "device": a.device,
                          "pool_device": a.pool_device, "consumer_seen": seen,
                          "results": summary, "python_over_c": ratio, "call_cost": cost}))
        return 0
    mib = nbytes / (1 << 20)
    print(f"Python binding vs C producer: push of {a.shape} {a.dtype} ({mib:.2f} MiB), "
          f"{a.transport}, steps of {a.step}, {a.rounds} rounds of {a.count} items each"
          + (f", Python tensors on {a.device}" if a.device != "cpu" else "")
          + (f", consumer pool on {a.pool_device}" if a.pool_device != "cpu" else ""))
    print(f"  {'producer':<9} {'items/s':>9} {'GB/s':>7}   (median; min..max items/s)")
    for who in ("C", "Python"):
        s = summary[who]
        lo, hi = s["items_per_s_range"]
        print(f"  {who:<9} {s['items_per_s']:9.1f} {s['gb_per_s']:7.2f}   ({lo:.1f}..{hi:.1f})")
    print(f"  ratio Python / C: {ratio:.3f} (binding cost {100 * (1 - ratio):+.1f} %)")
    print(f"  per call, one process: push {cost['python_us']:.0f} us, C reserve through ctypes "
          f"{cost['c_us']:.0f} us (each copying {mib:.2f} MiB into staging): the binding adds "
          f"{cost['python_us'] - cost['c_us']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
