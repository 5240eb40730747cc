"""CUDA tensors in and out (skipped without a CUDA device). On a GPU machine:

    ECT_PYTHON=python3 tests/python/run.sh test_cuda.py      # or: ctest -R py_cuda

CUDA sources are copied to host memory in one place (_tensors.host_source) until the
library writes from device memory; loads into a CUDA engine are copied host -> device
by the connector (ec_buffer_device="cuda").
"""

import pytest

import ectransfer
from conftest import wait_for

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
MiB = 1 << 20


def test_push_cuda_tensors_bit_exact():
    with ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": 64 * MiB}) as shard, \
            ectransfer.PushProducer({"ec_buffer_size": 64 * MiB}) as prod:
        with ectransfer.PushScheduler({"ec_port": shard.port}) as sched:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            xs = {}
            for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
                x = torch.randn(576, 1024, device="cuda").to(dtype)
                x = x * 2  # queued on the stream: the copy must wait for it
                tid = f"cuda-{i}"
                sched.expect(tid)
                prod.push(tid, shard.address, f"hc{i}", x)
                xs[tid] = x
            prod.flush()
            res = []
            wait_for(lambda: res.extend(prod.poll(0)) or len(res) == 3, "results")
            assert all(r.ok for r in res), res
            arrived = set()
            wait_for(lambda: arrived.update(sched.poll()) or len(arrived) == 3, "arrivals")
            for tid, x in xs.items():
                t = shard.take(tid)
                assert t.device.type == "cpu" and t.dtype == x.dtype
                assert torch.equal(t.cuda(), x)
                shard.release(tid)


def test_connector_loads_into_cuda_and_saves_from_cuda():
    from ectransfer.connector import (ConnectorConfig, LoadSpec, PushSpec, StepMetadata,
                                      WorkerCore)

    cfg_c = ConnectorConfig.from_values("ec_consumer", ec_port=0, ec_buffer_size=32 * MiB,
                                        ec_buffer_device="cuda")
    cons = WorkerCore(cfg_c)
    prod = WorkerCore(ConnectorConfig.from_values("ec_producer", ec_buffer_size=32 * MiB))
    try:
        with ectransfer.PushScheduler({"ec_port": cons._shard.port}) as sched:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            x = torch.randn(100, 256, device="cuda").to(torch.bfloat16)
            sched.expect("g1")
            meta = StepMetadata(pushes=[PushSpec("g1", "hg1", cons.address, "req", (100, 256),
                                                 "bfloat16")])
            cache = {}
            prod.start_save_caches(meta, cache)
            cache["hg1"] = x
            prod.save_caches(cache, "hg1")
            wait_for(lambda: prod.build_connector_worker_meta() is not None
                     and prod.counters["done"] == 1, "the push")
            wait_for(lambda: "g1" in sched.poll(), "arrival")
            st = sched.state("g1")
            ccache = {}
            cons.start_load_caches(StepMetadata(loads=[LoadSpec("g1", "hg1", st.shape, st.dtype,
                                                                st.nbytes)]), ccache)
            t = ccache["hg1"]
            assert t.device.type == "cuda" and torch.equal(t, x)
    finally:
        cons.shutdown()
        prod.shutdown()


def test_pull_save_cuda():
    with ectransfer.PullProducer({"ec_port": 0, "ec_buffer_size": 16 * MiB}) as p:
        with ectransfer.PullScheduler({"ec_port": p.port}) as s, \
                ectransfer.PullConsumer({"ec_port": p.port, "ec_buffer_size": 16 * MiB}) as c:
            x = torch.arange(4096, device="cuda", dtype=torch.int32)
            p.save("gpu", x)
            p.flush()
            meta = wait_for(lambda: s.has("gpu"), "the notification")
            assert torch.equal(c.load("gpu", meta).cuda(), x)
            c.release("gpu")
