"""CUDA tensors in and out on a real GPU (skipped without one; a failure instead under
ECT_REQUIRE_GPU=1, as `make test-gpu` and scripts/gpu-check.sh run it):

    ECT_PYTHON=python3 tests/python/run.sh test_cuda.py      # or: ctest -R gpu_python

A CUDA tensor pushed is borrowed by the library and read on the device (no host copy
in Python); a consumer with ec_buffer_device "cuda" has its pool on the GPU and take /
load return zero-copy CUDA tensors; the vLLM connector core puts them straight into the
encoder cache. The stand-in driver runs the same binding paths in the CPU suite
(test_device.py).
"""

import gc
import os

import pytest

import ectransfer
from ectransfer import _device
from conftest import wait_for

REQUIRED = os.environ.get("ECT_REQUIRE_GPU") == "1"
try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
if torch is None or not torch.cuda.is_available():
    if REQUIRED:
        raise RuntimeError("ECT_REQUIRE_GPU=1 but this interpreter's torch has no CUDA "
                           f"device ({'no torch' if torch is None else torch.__version__}); "
                           "set ECT_PYTHON to one that has")
    pytest.skip("no CUDA device", allow_module_level=True)
pytestmark = pytest.mark.cuda
MiB = 1 << 20
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int64]


def test_the_library_sees_the_gpu_torch_uses():
    info = ectransfer.cuda_info()
    assert info["available"], info["why"]
    x = torch.ones(16, device="cuda")
    assert _device.kind_of(x.data_ptr()) == (_device.MEM_CUDA, x.device.index)


def instance(transport="tcp", device="cpu", pool=128 * MiB):
    shard = ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": pool,
                                     "ec_buffer_device": device, "transport": transport})
    sched = ectransfer.PushScheduler({"ec_port": shard.port, "push_wait_timeout_s": 120})
    prod = ectransfer.PushProducer({"ec_buffer_size": 64 * MiB, "control_timeout_s": 60})
    wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
    return shard, sched, prod


def close(inst):
    for h in reversed(inst):
        h.close()


def push_all(inst, xs: dict, hashes=None):
    shard, sched, prod = inst
    for tid, x in xs.items():
        sched.expect(tid)
        prod.push(tid, shard.address, (hashes or {}).get(tid, f"h-{tid}"), x)
    prod.flush()
    res = []
    wait_for(lambda: res.extend(prod.poll(0)) or len(res) == len(xs), "results")
    assert all(r.ok for r in res), res
    arrived = set()
    wait_for(lambda: arrived.update(sched.poll()) or arrived >= set(xs), "arrivals")
    return res


def cuda_tensors(prefix):
    out = {}
    for i, dtype in enumerate(DTYPES):
        x = torch.randn(576, 1024, device="cuda")
        x = (x * 1000).to(dtype) if not dtype.is_floating_point else (x * 2).to(dtype)
        out[f"{prefix}{i}"] = x  # queued on the stream: the push must wait for it
    return out


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_cuda_tensors_into_a_host_pool(transport):
    inst = instance(transport)
    shard = inst[0]
    try:
        xs = cuda_tensors("hp")
        res = push_all(inst, xs)
        assert {r.transport for r in res} == {transport}
        wait_for(lambda: _device.borrowed() == 0,
                 "every borrowed tensor given back")
        for tid, x in xs.items():
            t = shard.take(tid)
            assert t.device.type == "cpu" and t.dtype == x.dtype
            assert torch.equal(t.cuda(), x)
            shard.release(tid)
    finally:
        close(inst)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_cuda_tensors_into_a_gpu_pool_zero_copy(transport):
    inst = instance(transport, device="cuda")
    shard = inst[0]
    try:
        pool = shard._map
        assert shard.device == f"cuda:{torch.cuda.current_device()}"
        xs = cuda_tensors("gp")
        xs["host"] = torch.arange(4096, dtype=torch.int32)  # a host source: copied up
        push_all(inst, xs)
        for tid, x in xs.items():
            t = shard.take(tid)
            assert t.device.type == "cuda" and t.dtype == x.dtype and t.shape == x.shape
            # a view of the pool itself, not a copy
            assert pool.base <= t.data_ptr() < pool.base + pool.capacity
            assert torch.equal(t, x.cuda())
            shard.release(tid)
            assert t.numel() == 0  # emptied in place, as on the host
        assert shard.stats()["finished"] == len(xs)
    finally:
        close(inst)


def test_gpu_pool_views_keep_their_bytes_and_outlive_the_consumer():
    inst = instance("tcp", device="cuda", pool=16 * MiB)
    shard, sched, prod = inst
    x = torch.randn(1024, 1024, device="cuda")  # 4 MiB
    push_all(inst, {"keep": x})
    t = shard.take("keep")
    part = t[10:20]  # shares the bytes
    shard.release("keep")
    # many items through the 16 MiB pool: the leased bytes are never reused
    for i in range(12):
        y = torch.full((1024, 1024), float(i), device="cuda")
        push_all(inst, {f"f{i}": y})
        shard.take(f"f{i}")
        shard.release(f"f{i}")
    assert torch.equal(part, x[10:20])
    close(inst)
    torch.cuda.synchronize()
    assert torch.equal(part, x[10:20])  # the pool's memory outlives the consumer
    del part, t
    gc.collect()


def test_pull_with_gpu_pool_and_cuda_source():
    with ectransfer.PullProducer({"ec_port": 0, "ec_buffer_size": 32 * MiB}) as p:
        with ectransfer.PullScheduler({"ec_port": p.port}) as s, \
                ectransfer.PullConsumer({"ec_port": p.port, "ec_buffer_size": 32 * MiB,
                                         "ec_buffer_device": "cuda"}) as c:
            x = torch.arange(1 << 20, device="cuda", dtype=torch.int32) * 3
            p.save("gpu", x)
            p.flush()
            wait_for(lambda: _device.borrowed() == 0,
                     "the library to give the sources back")
            meta = wait_for(lambda: s.has("gpu"), "the notification")
            t = c.load("gpu", meta)
            assert t.device.type == "cuda" and torch.equal(t, x)
            c.release("gpu")


def test_connector_loads_zero_copy_into_the_encoder_cache():
    from ectransfer.connector import (ConnectorConfig, LoadSpec, PushSpec, StepMetadata,
                                      WorkerCore)

    cons = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                  ec_buffer_size=32 * MiB,
                                                  ec_buffer_device="cuda"))
    prod = WorkerCore(ConnectorConfig.from_values("ec_producer", ec_buffer_size=32 * MiB))
    try:
        shard = cons._shard
        assert shard.device.startswith("cuda") and cons._copy_to is None
        with ectransfer.PushScheduler({"ec_port": shard.port}) as sched:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            x = torch.randn(100, 256, device="cuda").to(torch.bfloat16)
            sched.expect("g1")
            meta = StepMetadata(pushes=[PushSpec("g1", "hg1", cons.address, "req", (100, 256),
                                                 "bfloat16")])
            cache = {}
            prod.start_save_caches(meta, cache)
            cache["hg1"] = x  # the encoder's output, on the GPU: pushed from there
            prod.save_caches(cache, "hg1")
            wait_for(lambda: prod.build_connector_worker_meta() is not None
                     and prod.counters["done"] == 1, "the push")
            wait_for(lambda: "g1" in sched.poll(), "arrival")
            st = sched.state("g1")
            ccache = {}
            cons.start_load_caches(StepMetadata(loads=[LoadSpec("g1", "hg1", st.shape,
                                                                st.dtype, st.nbytes)]), ccache)
            t = ccache["hg1"]
            pool = shard._map
            assert t.device.type == "cuda" and torch.equal(t, x)
            assert pool.base <= t.data_ptr() < pool.base + pool.capacity  # zero-copy
            y = (t.float() * 2).sum()  # the engine computes on it
            cons.start_load_caches(StepMetadata(freed=["hg1"]), ccache)  # engine freed it
            assert shard.stats()["finished"] == 1
            assert torch.isclose(y, (x.float() * 2).sum())
    finally:
        cons.shutdown()
        prod.shutdown()
