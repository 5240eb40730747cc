"""The CUDA checks of test_cuda.py without pytest (for an interpreter that has a CUDA
torch but no pytest): exits 0 when CUDA tensors go through bit-exact, 1 otherwise,
2 without a CUDA device. Run by scripts/gpu-check.sh."""

import sys
import time

import torch

import ectransfer
from ectransfer.connector import ConnectorConfig, LoadSpec, PushSpec, StepMetadata, WorkerCore

MiB = 1 << 20


def wait(cond, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            raise SystemExit(f"cuda_smoke: timed out waiting for {what}")
        time.sleep(0.002)
    return v


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_smoke: no CUDA device")
        return 2
    with ectransfer.PushConsumer({"ec_port": 0, "ec_buffer_size": 64 * MiB}) as shard, \
            ectransfer.PushProducer({"ec_buffer_size": 64 * MiB}) as prod, \
            ectransfer.PushScheduler({"ec_port": shard.port}) as sched:
        wait(lambda: sched.stats()["shards"], "discovery")
        for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            x = torch.randn(576, 4096, device="cuda").to(dtype) * 2
            sched.expect(f"c{i}")
            prod.push(f"c{i}", shard.address, f"h{i}", x)
            prod.flush()
            (r,) = wait(lambda: prod.poll(0), "the result")
            assert r.ok, r
            wait(lambda: f"c{i}" in sched.poll(), "arrival")
            t = shard.take(f"c{i}")
            assert torch.equal(t.cuda(), x), dtype
            shard.release(f"c{i}")
            print(f"cuda_smoke: push of a CUDA {dtype} tensor: bit-exact")
    cons = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                  ec_buffer_size=32 * MiB, ec_buffer_device="cuda"))
    prod = WorkerCore(ConnectorConfig.from_values("ec_producer", ec_buffer_size=32 * MiB))
    try:
        with ectransfer.PushScheduler({"ec_port": cons._shard.port}) as sched:
            wait(lambda: sched.stats()["shards"], "discovery")
            x = torch.randn(100, 256, device="cuda").to(torch.bfloat16)
            sched.expect("g1")
            prod.start_save_caches(StepMetadata(pushes=[PushSpec("g1", "hg", cons.address, "r",
                                                                 (100, 256), "bfloat16")]), {})
            prod.save_caches({"hg": x}, "hg")
            wait(lambda: prod.build_connector_worker_meta() is not None
                 and prod.counters["done"] == 1, "the push")
            wait(lambda: "g1" in sched.poll(), "arrival")
            st = sched.state("g1")
            cache = {}
            cons.start_load_caches(StepMetadata(loads=[LoadSpec("g1", "hg", st.shape, st.dtype,
                                                                st.nbytes)]), cache)
            assert cache["hg"].device.type == "cuda" and torch.equal(cache["hg"], x)
            print("cuda_smoke: connector save from CUDA, load into CUDA: bit-exact")
    finally:
        cons.shutdown()
        prod.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
