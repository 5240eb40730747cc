"""ectransfer.vllm: loaded as vLLM loads it, driven by vLLM's per-step call order across
separate processes: an encoder instance (TP 1: a scheduler process and a worker process)
and a prefill/decode instance (TP 2: a scheduler process and two worker processes), real
torch tensors compared bit-exact on both ranks, with dedup, cancel and a consumer restart.
vLLM itself is absent: tests/python/stand_in/vllm is a labelled stand-in."""

import pickle
import subprocess
import sys
import time

import pytest

import epd
from conftest import DEADLINE_S, free_ports

pytest.importorskip("torch")
sys.path.insert(0, str(epd.STAND_IN))


def test_importing_the_module_needs_no_vllm():
    code = ("import sys, ectransfer.vllm as m; assert 'vllm' not in sys.modules; "
            "print(m.config_from_vllm.__name__)\n"
            "try:\n    m.ECTransferConnector\nexcept ImportError as e:\n    print('IE', e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "IE ectransfer.vllm.ECTransferConnector needs vLLM" in r.stdout


def _ec(role, port, extra=None, device="cpu"):
    return epd.ECTransferConfig(
        ec_connector="ECTransferConnector", ec_connector_module_path="ectransfer.vllm",
        ec_role=role, ec_ip="127.0.0.1", ec_port=port, ec_buffer_size=64 << 20,
        ec_buffer_device=device,
        ec_connector_extra_config=dict({"control_timeout_s": 30, "push_wait_timeout_s": 120},
                                       **(extra or {})))


def test_class_shape_and_receive_addresses():
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

    cls = ECConnectorFactory.get_connector_class(_ec("ec_consumer", 15000))
    assert issubclass(cls, ECConnectorBase) and cls.__module__ == "ectransfer.vllm"
    cfg = epd.VllmConfig(_ec("ec_consumer", 15000), epd.ParallelConfig(4, 2, 0))
    assert cls.receive_addresses(cfg) == ["tcp://127.0.0.1:15000", "tcp://127.0.0.1:15004"]
    assert cls.receive_addresses(epd.VllmConfig(_ec("ec_producer", 15000))) == []
    import ectransfer.vllm as m

    meta = m.ECTransferConnectorMetadata(pushes=[m.PushSpec("t", "h", "a:1", "r")])
    assert pickle.loads(pickle.dumps(meta)) == meta  # crosses vLLM's process boundary
    a = m.ECTransferWorkerMetadata(loaded={"x", "y"}, failed_saves={"r1"})
    b = m.ECTransferWorkerMetadata(loaded={"y"}, pending_saves=True)
    agg = a.aggregate(b)
    assert agg.loaded == {"y"} and agg.failed_saves == {"r1"} and agg.pending_saves
    with pytest.raises(ValueError, match="ec_role"):
        cls(epd.VllmConfig(_ec(None, 15000)), 0)
    with pytest.raises(ValueError, match="push_wait_timeout_s"):
        m.config_from_vllm(epd.VllmConfig(_ec("ec_consumer", 1, {"push_wait_timeout_s": 0})))
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        import torch

        if torch.cuda.is_available():
            raise RuntimeError("CUDA is not available (skipped: there is CUDA)")
        from ectransfer.connector import WorkerCore

        WorkerCore(m.config_from_vllm(epd.VllmConfig(_ec("ec_consumer", 1, device="cuda"))))


class Instance:
    """An engine instance: its scheduler process and one worker process per TP rank."""

    def __init__(self, role, port, tp):
        ec = _ec(role, port)
        par = epd.ParallelConfig(tensor_parallel_size=tp)
        self.sched = epd.Proc("scheduler", ec, par)
        self.workers = [epd.Proc("worker", ec, par, r) for r in range(tp)]
        for p in [self.sched] + self.workers:
            p.ready()
        self.freed, self.finished = [], set()

    def step(self, encode=()):
        meta = self.sched.call("build_connector_meta", epd.SchedulerOutput(self.freed))
        outs = [w.step(meta, encode, self.finished, self.freed) for w in self.workers]
        self.freed, self.finished = [], set()
        report = outs[0][0]
        for o in outs[1:]:
            report = report.aggregate(o[0])
        self.sched.call("update_connector_output", epd.ECConnectorOutput(report))
        return meta, [o[1] for o in outs]

    def close(self):
        for p in self.workers + [self.sched]:
            p.close()


def test_epd_replay_across_processes():
    base = free_ports(2)
    enc = Instance("ec_producer", base, 1)  # the producer binds nothing at ec_port
    pd = Instance("ec_consumer", base, 2)
    consumer = "tcp://127.0.0.1:%d" % base
    loaded = {}  # mm_hash -> per-rank bit-exact checks
    deadline = time.monotonic() + DEADLINE_S * 2

    def encode(req):
        """The encoder instance serves req: pushes its items, finishes it."""
        for i in range(len(req.mm_features)):
            assert enc.sched.call("ensure_cache_available", req, 0)
            enc.sched.call("update_state_after_alloc", req, i)
        enc.step(encode=[f.identifier for f in req.mm_features])
        done, items = enc.sched.call("request_finished", req)
        assert done is False and [it["mm_hash"] for it in items["ec_items"]] == \
            [f.identifier for f in req.mm_features]
        enc.freed += [f.identifier for f in req.mm_features]
        enc.finished.add(req.request_id)

    def settle_encoder():
        while enc.sched.call("has_pending_push_work"):
            assert time.monotonic() < deadline, "encoder pushes never settled"
            enc.step()

    def serve_pd(reqs, until_loaded=True):
        """The prefill/decode instance steps until every request's items are loaded."""
        waiting = list(reqs)
        while waiting:
            assert time.monotonic() < deadline, f"never loaded: {[r.request_id for r in waiting]}"
            for req in list(waiting):
                if pd.sched.call("ensure_cache_available", req, 0):
                    for i in range(len(req.mm_features)):
                        pd.sched.call("update_state_after_alloc", req, i)
                    waiting.remove(req)
            meta, checks = pd.step()
            for spec in meta.loads:
                loaded[spec.mm_hash] = [c[spec.mm_hash] for c in checks]
            assert not pd.sched.call("take_unavailable_requests")
            if waiting:
                time.sleep(0.005)

    def finish_pd(req):
        pd.sched.call("request_finished", req)
        pd.freed += [f.identifier for f in req.mm_features]

    try:
        # --- phase 1: three images in two requests, then one repeated image (dedup)
        r1 = epd.make_request("r1", ["img-a"], consumer=consumer)
        r2 = epd.make_request("r2", ["img-b", "img-c"], consumer=consumer)
        p1 = epd.make_request("r1", ["img-a"], transfer_ids=r1.ec_transfer_params["ec_items"][0:1]
                              and [r1.ec_transfer_params["ec_items"][0]["transfer_id"]])
        p2 = epd.make_request("r2", ["img-b", "img-c"],
                              transfer_ids=[it["transfer_id"] for it in r2.ec_transfer_params["ec_items"]])
        # the consumer learns of its requests first (the proxy sends both at once)
        for p in (p1, p2):
            assert not pd.sched.call("ensure_cache_available", p, 0)
        encode(r1)
        encode(r2)
        settle_encoder()
        serve_pd([p1, p2])
        for h in ("img-a", "img-b", "img-c"):
            assert loaded[h] == [True, True], (h, loaded[h])
        assert pd.sched.call("has_cache_item", "img-a")
        finish_pd(p1)
        finish_pd(p2)
        pd.step()  # the workers free and release what the finished requests held

        r3 = epd.make_request("r3", ["img-a"], consumer=consumer)
        p3 = epd.make_request("r3", ["img-a"], transfer_ids=["r3-x0"])
        assert not pd.sched.call("ensure_cache_available", p3, 0)
        encode(r3)
        settle_encoder()
        serve_pd([p3])
        assert loaded["img-a"] == [True, True]
        c = enc.workers[0].inspect("_worker.counters")
        assert c["done"] == 4 and c["cached"] == 1 and c["failed"] == 0, c
        finish_pd(p3)

        # --- phase 2: the consumer's request ends before the encoder pushes (cancel)
        pc = epd.make_request("rc", ["img-d"], transfer_ids=["rc-x0"])
        rc = epd.make_request("rc", ["img-d"], consumer=consumer)
        assert not pd.sched.call("ensure_cache_available", pc, 0)
        pd.sched.inspect("_scheduler._sched.poll")
        sent = pd.sched.inspect("_scheduler._sched.stats")["cancels_sent"]
        finish_pd(pc)
        while pd.sched.inspect("_scheduler._sched.stats")["cancels_sent"] < sent + 2:  # 2 shards
            assert time.monotonic() < deadline
            pd.sched.inspect("_scheduler._sched.poll")
            time.sleep(0.005)
        encode(rc)
        settle_encoder()
        c = enc.workers[0].inspect("_worker.counters")
        assert c["cancelled"] == 1 and c["failed"] == 0, c
        assert not enc.sched.call("take_unavailable_requests")
        pd.step()

        # --- phase 3: the consumer instance restarts
        pd.close()
        rx = epd.make_request("rx", ["img-x"], consumer=consumer)
        encode(rx)
        settle_encoder()
        assert enc.sched.call("take_unavailable_requests") == {"rx"}  # retryable failure
        assert enc.workers[0].inspect("_worker.counters")["failed"] == 1
        pd = Instance("ec_consumer", base, 2)  # same ports, empty pools
        n = 0
        while True:  # a proxy retries the request under a new transfer id until it lands
            n += 1
            tid_y, tid_b = f"ry{n}-x0", f"ry{n}-x1"
            ry = epd.make_request(f"ry{n}", ["img-y", "img-b"], consumer=consumer,
                                  transfer_ids=[tid_y, tid_b])
            py = epd.make_request(f"ry{n}", ["img-y", "img-b"], transfer_ids=[tid_y, tid_b])
            pd.sched.call("ensure_cache_available", py, 0)
            encode(ry)
            settle_encoder()
            if not enc.sched.call("take_unavailable_requests"):
                break
            finish_pd(py)  # the attempt failed (the producer held the address down)
            assert time.monotonic() < deadline, "the restarted consumer never took a push"
            time.sleep(0.05)
        loaded.pop("img-b")
        serve_pd([py])
        assert loaded["img-y"] == [True, True] and loaded["img-b"] == [True, True]
        c = enc.workers[0].inspect("_worker.counters")
        assert c["cached"] == 1, c  # img-b moved again: the new pools were empty
        finish_pd(py)
        pd.step()
        assert pd.workers[0].inspect("_worker.counters")["released"] == 2
    finally:
        enc.close()
        pd.close()
