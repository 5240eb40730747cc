"""CUDA memory through the binding, on the stand-in driver (tests/fakecuda, selected
by ECT_CUDA_LIBRARY; ctest sets it): consumer pools in device memory the binding owns,
zero-copy device views with the host pools' lease rules, device sources borrowed by
the library (no copy in Python), over tcp and shm, push and pull. The stand-in's
device addresses are PROT_NONE: every check reads device bytes back through the
library's copy (DeviceArray.tobytes / numpy), so a host access by mistake crashes.
Real GPUs: test_cuda.py (torch CUDA tensors), `make test-gpu`."""

import gc
import os
import subprocess
import sys

import pytest

import ectransfer
from ectransfer import _device
from conftest import wait_for

np = pytest.importorskip("numpy")
if "fakecuda" not in os.environ.get("ECT_CUDA_LIBRARY", ""):
    pytest.skip("needs the stand-in CUDA driver (ECT_CUDA_LIBRARY=.../libfakecuda.so; ctest "
                "sets it)", allow_module_level=True)
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
if torch is not None and torch.cuda.is_available():
    pytest.skip("a real GPU is here: the stand-in driver and a CUDA torch do not mix in one "
                "process (test_cuda.py covers the GPU)", allow_module_level=True)
DEVICE = "device"
MiB = 1 << 20


def open_inst(transport="tcp", device="cuda", pool=16 * MiB):
    shard = ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": pool,
                                     "ec_buffer_device": device, "transport": transport})
    sched = ectransfer.PushScheduler({"ec_port": shard.port, "push_wait_timeout_s": 120})
    prod = ectransfer.PushProducer({"ec_buffer_size": 16 * MiB, "control_timeout_s": 60})
    wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
    return shard, sched, prod


def close_inst(inst):
    for h in reversed(inst):
        h.close()


def move(inst, tid, src, mm_hash=None, **kw):
    shard, sched, prod = inst
    sched.expect(tid)
    prod.push(tid, shard.address, mm_hash or f"h-{tid}", src, **kw)
    assert prod.flush() == 1
    (r,) = wait_for(lambda: prod.poll(0), "the result")
    assert r.ok, r
    wait_for(lambda: tid in sched.poll() or sched.state(tid).state == "LOADING", "arrival")
    return r


def test_the_stand_in_is_a_cuda_driver():
    info = ectransfer.cuda_info()
    assert info["available"] and info["devices"] >= 1 and "fakecuda" in info["library"]
    assert info["why"] == ""


def test_device_arrays_round_trip_through_copies():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = ectransfer.DeviceArray.from_host(a)
    assert d.shape == (4, 6) and d.dtype == "float32" and d.nbytes == 96 and d.device == 0
    cai = d.__cuda_array_interface__
    assert cai["shape"] == (4, 6) and cai["typestr"] == "<f4" and cai["data"][0] == d.ptr
    assert _device.kind_of(d.ptr) == (_device.MEM_CUDA, 0)
    assert d.tobytes() == a.tobytes()
    assert np.array_equal(d.numpy(), a)
    # numpy has no bfloat16: the interface carries its elements as uint16
    b = ectransfer.DeviceArray.from_host(bytearray(range(12)), dtype="bfloat16", shape=(2, 3))
    assert b.__cuda_array_interface__["typestr"] == "<u2"
    assert b.numpy().shape == (2, 3, 2) and b.tobytes() == bytes(range(12))
    with pytest.raises(ectransfer.Error, match="device memory already"):
        ectransfer.DeviceArray.from_host(d)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_push_into_a_device_pool(transport):
    inst = open_inst(transport)
    shard, sched, prod = inst
    try:
        assert shard.device == "cuda:0"
        x = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
        r = move(inst, "d1", x)  # a host source, copied host to device
        assert r.transport == transport
        v = shard.take("d1")
        if torch is None or not torch.cuda.is_available():
            assert isinstance(v, ectransfer.DeviceArray)  # no CUDA torch: the plain view
        w = shard.take("d1", out=DEVICE)
        assert w.shape == (64, 32) and w.dtype == "float32"
        assert np.array_equal(w.numpy(), x)
        assert w.__cuda_array_interface__["data"][0] != 0
        shard.release("d1")
        with pytest.raises(ValueError, match="released"):
            w.tobytes()
        # a device source: borrowed by the library, read on the device
        src = ectransfer.DeviceArray.from_host(np.arange(4096, dtype=np.int32))
        sched.expect("d2")
        prod.push("d2", shard.address, "h-d2", src)
        assert _device.borrowed() == 1  # not copied: the library holds the device pointer
        del src  # the binding keeps it alive for the library
        gc.collect()
        prod.flush()
        (r,) = wait_for(lambda: prod.poll(0), "the result")
        assert r.ok and r.transport == transport, r
        wait_for(lambda: _device.borrowed() == 0,
                 "the source given back")
        wait_for(lambda: "d2" in sched.poll(), "arrival")
        got = shard.take("d2", out=DEVICE)
        assert got.dtype == "int32" and np.array_equal(got.numpy(), np.arange(4096))
        shard.release("d2")
        assert shard.stats()["finished"] == 2
    finally:
        close_inst(inst)


def test_device_views_keep_the_lease_rules():
    inst = open_inst("tcp", pool=4 * MiB)
    shard, sched, prod = inst
    try:
        x = np.arange(256 * 1024, dtype=np.uint8).reshape(512, 512)  # 256 KiB
        move(inst, "k1", x)
        for out in ("numpy", "memoryview"):  # not for device memory: refused, lease back
            with pytest.raises(ectransfer.Error) as ei:
                shard.take("k1", out=out)
            assert ei.value.code == ectransfer.ECT_ENOTSUP and "out='device'" in str(ei.value)
        with pytest.raises(ectransfer.Error, match="out="):
            shard.take("k1", out="pandas")
        if torch is None or not torch.cuda.is_available():
            with pytest.raises(ectransfer.Error, match="torch with CUDA"):
                shard.take("k1", out="torch")
        a = shard.take("k1", out=DEVICE)  # the refusals ended nothing
        raw = shard.take("k1", out=DEVICE, raw=True)
        assert raw.shape == (x.nbytes,) and raw.dtype == "uint8"
        del raw
        gc.collect()
        # what a cupy array or torch tensor made from `a` is: another view owning a
        derived = ectransfer.DeviceArray(a.ptr, a.nbytes, a.shape, "uint8", 0, keep=a)
        shard.release("k1")  # the transfer ends now; a (held by derived) keeps the bytes
        with pytest.raises(ValueError):
            a.numpy()
        assert shard.stats()["finished"] == 1 and shard.evict() == 0
        # many more items through the 4 MiB pool: the leased bytes are never reused
        for i in range(40):
            y = np.full((512, 512), i, dtype=np.uint8)
            move(inst, f"f{i}", y)
            shard.take(f"f{i}", out=DEVICE)
            shard.release(f"f{i}")
        assert derived.tobytes() == x.tobytes()
        shard.evict()
        assert shard.stats()["resident"] == 1
        del a
        gc.collect()
        assert shard.evict() == 0  # derived still holds it
        del derived
        gc.collect()
        assert shard.evict() == 1
    finally:
        close_inst(inst)


def test_device_views_outlive_the_consumer():
    inst = open_inst("tcp")
    shard, sched, prod = inst
    x = np.arange(1000, dtype=np.float64)
    move(inst, "o1", x)
    v = shard.take("o1", out=DEVICE)
    derived = ectransfer.DeviceArray(v.ptr, v.nbytes, v.shape, v.dtype, 0, keep=v)
    close_inst(inst)
    assert shard.closed
    with pytest.raises(ValueError):  # closing released the view, as release does...
        v.tobytes()
    # ...but the pool's memory is the binding's: it lives while a view refers to it
    # (the stand-in refuses a copy from memory that was freed)
    assert np.array_equal(np.frombuffer(derived.tobytes(), dtype=np.float64), x)
    with pytest.raises(ectransfer.Error) as ei:
        shard.take("o1")
    assert ei.value.code == ectransfer.ECT_ECLOSED


def test_pull_with_device_pool_and_device_source():
    with ectransfer.PullProducer({"ec_port": 0, "ec_buffer_size": 8 * MiB}) as p:
        with ectransfer.PullScheduler({"ec_port": p.port}) as s, \
                ectransfer.PullConsumer({"ec_port": p.port, "ec_buffer_size": 8 * MiB,
                                         "ec_buffer_device": "cuda:0"}) as c:
            assert c.device == "cuda:0"
            x = np.arange(3000, dtype=np.int16)
            p.save("dev", ectransfer.DeviceArray.from_host(x))  # borrowed until stored
            p.save("host", x[::-1].copy())
            p.flush()
            wait_for(lambda: _device.borrowed() == 0,
                     "the library to give the sources back")
            for h, want in (("dev", x), ("host", x[::-1])):
                meta = wait_for(lambda: s.has(h), "the notification")
                v = c.load(h, meta, out=DEVICE)
                assert np.array_equal(v.numpy(), want)
                c.release(h)
                with pytest.raises(ValueError):
                    v.numpy()


def test_without_cuda_every_gpu_option_fails_clearly(tmp_path):
    code = """
import ectransfer
info = ectransfer.cuda_info()
assert not info["available"] and info["why"], info
for make in (lambda: ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": 1 << 20,
                                              "ec_buffer_device": "cuda"}),
             lambda: ectransfer.DeviceArray.from_host(b"abc")):
    try:
        make()
    except ectransfer.Error as e:
        assert e.code == ectransfer.ECT_ENOTSUP and "CUDA" in str(e), e
    else:
        raise AssertionError("no error")
print("ok")
"""
    env = dict(os.environ, ECT_CUDA_LIBRARY=str(tmp_path / "no-such-libcuda.so.1"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_device_source_into_a_host_pool(transport):
    inst = open_inst(transport, device="cpu")
    shard, sched, prod = inst
    try:
        assert shard.device == "cpu"
        x = np.random.default_rng(5).integers(0, 255, (300, 7), dtype=np.uint8)
        move(inst, "h1", ectransfer.DeviceArray.from_host(x))  # device -> host by the library
        wait_for(lambda: _device.borrowed() == 0,
                 "the library to give the sources back")
        v = shard.take("h1", out="numpy")
        assert np.array_equal(v, x)
        shard.release("h1")
    finally:
        close_inst(inst)


def test_connector_worker_takes_into_the_gpu_pool(monkeypatch):
    """ec_buffer_device "cuda": the worker's shard pool is on the device and the encoder
    cache gets zero-copy device views (here DeviceArrays: the stand-in is no GPU torch
    can use), released when the engine frees them."""
    torch_ = pytest.importorskip("torch")
    from ectransfer.connector import ConnectorConfig, LoadSpec, StepMetadata, WorkerCore

    monkeypatch.setattr(WorkerCore, "_engine_device",
                        staticmethod(lambda name: torch_.device("cuda", 0)))
    worker = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                    ec_buffer_size=8 * MiB,
                                                    ec_buffer_device="cuda"))
    shard = worker._shard
    try:
        assert shard.device == "cuda:0" and worker._copy_to is None
        with ectransfer.PushScheduler({"ec_port": shard.port}) as sched, \
                ectransfer.PushProducer({"ec_buffer_size": 8 * MiB}) as prod:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            x = np.arange(96, dtype=np.float32).reshape(8, 12)
            move((shard, sched, prod), "g1", x, mm_hash="hg")
            cache = {}
            worker.start_load_caches(StepMetadata(loads=[LoadSpec("g1", "hg", (8, 12),
                                                                  "float32", x.nbytes)]), cache)
            v = cache["hg"]
            assert isinstance(v, ectransfer.DeviceArray) and np.array_equal(v.numpy(), x)
            assert v._keep is shard._map  # a view of the shard's device pool, not a copy
            worker.start_load_caches(StepMetadata(freed=["hg"]), cache)
            assert shard.stats()["finished"] == 1
            with pytest.raises(ValueError):
                v.numpy()
    finally:
        worker.shutdown()
