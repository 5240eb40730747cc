"""The engine-neutral connector core in one process: what makes a request unavailable,
how transfer ids are matched, and the configuration it accepts."""

import pytest

import epd
from conftest import wait_for
from ectransfer.connector import (ConnectorConfig, LoadSpec, SchedulerCore, StepMetadata,
                                  WorkerCore, WorkerReport, request_transfer_id)

pytest.importorskip("torch")
MiB = 1 << 20


def test_transfer_ids_match_by_position_or_hash():
    r = epd.make_request("r", ["a", "b"], transfer_ids=["ta", "tb"])
    assert request_transfer_id(r, 0) == "ta" and request_transfer_id(r, 1) == "tb"
    r.ec_transfer_params = {"ec_items": [{"mm_hash": "b", "transfer_id": "tb"},
                                         {"mm_hash": "a", "transfer_id": "ta"}]}
    assert request_transfer_id(r, 0) == "ta" and request_transfer_id(r, 1) == "tb"
    r.ec_transfer_params = {"ec_items": [{"transfer_id": "only"}]}
    assert request_transfer_id(r, 0) == "only" and request_transfer_id(r, 1) is None
    r.ec_transfer_params = None
    assert request_transfer_id(r, 0) is None


def test_config_defaults_and_refusals(caplog):
    c = ConnectorConfig.from_values("ec_both")
    assert c.is_producer and c.is_consumer
    assert (c.ec_ip, c.ec_port, c.ec_buffer_size, c.buffer_device) == ("127.0.0.1", 14579,
                                                                       1_000_000_000, "cuda")
    assert (c.control_timeout_s, c.push_wait_timeout_s) == (30.0, 60.0)
    c = ConnectorConfig.from_values("ec_consumer", ec_buffer_size=1e9,
                                    extra={"transport": "shm", "mooncake_protocol": "rdma"})
    assert c.ec_buffer_size == 10**9 and c.library("consumer") == {"transport": "shm"}
    assert "mooncake_protocol" in caplog.text  # an extra key we do not read: said, not fatal
    for bad in ({"ec_buffer_size": 0}, {"ec_buffer_size": 1.5}):
        with pytest.raises(ValueError, match="ec_buffer_size"):
            ConnectorConfig.from_values("ec_consumer", **bad)
    with pytest.raises(ValueError, match="control_timeout_s"):
        ConnectorConfig.from_values("ec_producer", extra={"control_timeout_s": "soon"})


def test_an_item_that_never_arrives_fails_its_request_retryably():
    worker = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                    ec_buffer_size=8 * MiB,
                                                    ec_buffer_device="cpu"))
    try:
        port = worker._shard.port
        cfg = ConnectorConfig.from_values("ec_consumer", ec_port=port,
                                          extra={"push_wait_timeout_s": 0.2})
        sched = SchedulerCore(cfg)
        try:
            req = epd.make_request("late", ["img"], transfer_ids=["t-late"])
            assert not sched.ensure_cache_available(req, 0)
            got = wait_for(lambda: sched.ensure_cache_available(req, 0) is False
                           and sched.take_unavailable_requests(), "the push wait to expire")
            assert got == {"late"}
            assert not sched.has_cache_item("img")
            sched.request_finished(req)
        finally:
            sched.shutdown()
    finally:
        worker.shutdown()


def test_a_load_a_worker_cannot_take_fails_its_request():
    worker = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                    ec_buffer_size=8 * MiB,
                                                    ec_buffer_device="cpu"))
    try:
        # a load the shard never received: the take fails, the report says so
        cache = {}
        worker.start_load_caches(StepMetadata(loads=[LoadSpec("ghost", "h", (4,), "uint8", 4)]),
                                 cache)
        report = worker.build_connector_worker_meta()
        assert report.failed_loads == {"ghost"} and not report.loaded and cache == {}
        # the scheduler side turns a failed load into an unavailable request
        cfg = ConnectorConfig.from_values("ec_consumer", ec_port=worker._shard.port)
        sched = SchedulerCore(cfg)
        try:
            req = epd.make_request("rq", ["h"], transfer_ids=["ghost"])
            sched.ensure_cache_available(req, 0)
            sched._waits["ghost"].state = "dispatched"  # as if it had arrived and been sent
            sched.update_connector_output(WorkerReport(failed_loads={"ghost"}))
            assert sched.take_unavailable_requests() == {"rq"}
            assert sched.take_unavailable_requests() == set()
        finally:
            sched.shutdown()
    finally:
        worker.shutdown()


def test_worker_ends_transfers_promptly():
    """The consumer worker ends each transfer on its shard as soon as the engine is done
    with it: when the engine frees the item (zero-copy in the cache until then), and at
    once for an item whose content the cache already holds (never taken)."""
    import torch

    import ectransfer

    worker = WorkerCore(ConnectorConfig.from_values("ec_consumer", ec_port=0,
                                                    ec_buffer_size=8 * MiB,
                                                    ec_buffer_device="cpu"))
    shard = worker._shard
    try:
        with ectransfer.PushScheduler({"ec_port": shard.port}) as sched, \
                ectransfer.PushProducer({"ec_buffer_size": 8 * MiB}) as prod:
            wait_for(lambda: sched.stats()["shards"] == 1, "discovery")
            x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
            for tid, h in (("w1", "hw"), ("w2", "hw")):
                sched.expect(tid)
                prod.push(tid, shard.address, h, x)
            prod.flush()
            res = []
            wait_for(lambda: res.extend(prod.poll(0)) or len(res) == 2, "the pushes")
            assert all(r.ok for r in res), res
            arrived = set()
            wait_for(lambda: arrived.update(sched.poll()) or len(arrived) == 2, "arrivals")
            cache = {}
            spec = LoadSpec("w1", "hw", (8, 8), "float32", 256)
            worker.start_load_caches(StepMetadata(loads=[spec]), cache)
            assert torch.equal(cache["hw"], x) and shard.stats()["finished"] == 0
            # the same content again: nothing taken, the transfer ends now
            worker.start_load_caches(StepMetadata(loads=[LoadSpec("w2", "hw", (8, 8),
                                                                  "float32", 256)]), cache)
            assert shard.stats()["finished"] == 1 and shard.stats()["live"] == 1
            kept = cache["hw"]
            # the engine frees it: released, the transfer ends although a tensor lives
            worker.start_load_caches(StepMetadata(freed=["hw"]), cache)
            assert shard.stats()["finished"] == 2 and shard.stats()["live"] == 0
            assert kept.numel() == 0  # emptied: the engine said it was done with it
    finally:
        worker.shutdown()
